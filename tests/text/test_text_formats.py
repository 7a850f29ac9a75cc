"""Golden token ids and loss masks for every row format, with the bytes, qwen3 and HF tokenizers."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.text import InputError, TextConfig, load_tokenizer
from longpack.text.rows import RowError, chat_messages, detect_format, row_to_sample

IM_START, IM_END, NL = 257, 258, 10  # bytes tokenizer
B = load_tokenizer("bytes")


def b(text: str) -> list[int]:
    return list(text.encode())


def sample(row: dict, fmt: str, tok=B, **cfg) -> tuple[list[int], list[int]]:
    return row_to_sample(row, fmt, TextConfig(**cfg), tok)


# --- prompt / completion --------------------------------------------------------------------------------


def test_prompt_completion_default_strips_spaces_appends_eos_completion_loss() -> None:
    ids, mask = sample({"prompt": " Hi ", "completion": " there "}, "prompt_completion")
    assert ids == [*b("Hi"), *b("there"), IM_END]
    assert mask == [0, 0] + [1] * 5 + [1]


def test_prompt_completion_full_loss_and_template_with_other_keys() -> None:
    row = {"question": "2+2?", "ctx": "math", "answer": "4"}
    ids, mask = sample(
        row,
        "prompt_completion",
        prompt_key="question",
        completion_key="answer",
        prompt_template="[{ctx}] Q: {question}\nA:",
        separator="\n",
        prompt_completion_loss="full",
    )
    assert ids == [*b("[math] Q: 2+2?\nA:"), *b("\n4"), IM_END]
    assert mask == [1] * len(ids)


def test_separator_leading_space_kept_for_space_sensitive_tokenizers() -> None:
    # NeMo/Bridge: "x y" != "x" + "y" -> space-sensitive -> the separator's leading space stays.
    assert B.space_sensitive and Q.space_sensitive
    ids, mask = sample({"prompt": "a", "completion": "b"}, "prompt_completion", separator=" =")
    assert ids == [*b("a"), *b(" =b"), IM_END]
    assert mask == [0, 1, 1, 1, 1]


def test_separator_leading_space_dropped_for_space_insensitive_tokenizer(tmp_path: Path) -> None:
    # A whitespace-splitting word-level tokenizer: "x y" == "x" + "y" -> one leading space is dropped.
    tok = load_tokenizer(str(_hf_folder(tmp_path / "m", None)))
    assert not tok.space_sensitive
    ids, _ = row_to_sample(
        {"prompt": "hi", "completion": "yo"}, "prompt_completion", TextConfig(separator=" hi "), tok
    )
    assert ids == [3, 3, 4, 9]


def test_missing_template_key_and_missing_column_errors_name_keys() -> None:
    with pytest.raises(RowError, match=r"prompt_template needs \{ctx\} but the row has keys \['completion'"):
        sample({"prompt": "a", "completion": "b"}, "prompt_completion", prompt_template="{ctx} {prompt}")
    with pytest.raises(RowError, match=r"missing key 'completion' .*keys \['answer', 'prompt'\]"):
        sample({"prompt": "a", "answer": "b"}, "prompt_completion")
    with pytest.raises(RowError, match="must be a str"):
        sample({"prompt": 3, "completion": "b"}, "prompt_completion")


def test_too_short_sample_is_malformed() -> None:
    with pytest.raises(RowError, match="1 token"):
        sample({"prompt": "", "completion": ""}, "prompt_completion")


def test_textconfig_validation() -> None:
    from longpack.errors import ConfigError

    with pytest.raises(ConfigError, match="chat_loss") as info:
        TextConfig(chat_loss="assistant_only")
    assert info.value.fields == ("text.chat_loss",)
    with pytest.raises(ConfigError, match="literal braces") as info:
        TextConfig(prompt_template="{}")
    assert info.value.fields == ("text.prompt_template",)
    with pytest.raises(ConfigError, match="non-empty column name"):
        TextConfig(tools_key="")


# --- chat / sharegpt ------------------------------------------------------------------------------------

CONV = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U1"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "U2"},
    {"role": "assistant", "content": "A2"},
]
CONV_IDS = [
    *[IM_START, *b("system\nS"), IM_END, NL],
    *[IM_START, *b("user\nU1"), IM_END, NL],
    *[IM_START, *b("assistant\n"), *b("A1"), IM_END, NL],
    *[IM_START, *b("user\nU2"), IM_END, NL],
    *[IM_START, *b("assistant\n"), *b("A2"), IM_END, NL],
]


def _mask_of(spans: list[tuple[int, int]]) -> list[int]:
    mask = [0] * len(CONV_IDS)
    for lo, hi in spans:
        mask[lo:hi] = [1] * (hi - lo)
    return mask


A1_SPAN = (32, 35)  # "A1" + <|im_end|>: after 11 system, 10 user and 11 assistant-header tokens
A2_SPAN = (len(CONV_IDS) - 4, len(CONV_IDS) - 1)  # "A2" + <|im_end|> (the final "\n" is not trained)


def test_conversation_layout() -> None:
    assert bytes(CONV_IDS[A1_SPAN[0] : A1_SPAN[1] - 1]) == b"A1" and CONV_IDS[A1_SPAN[1] - 1] == IM_END


@pytest.mark.parametrize(
    ("loss", "expected"),
    [
        ("assistant", _mask_of([A1_SPAN, A2_SPAN])),
        ("last_turn", _mask_of([A2_SPAN])),
        ("full", [0 if t == IM_START else 1 for t in CONV_IDS]),  # <|im_start|> is a skipped token
    ],
)
def test_chat_golden_masks(loss: str, expected: list[int]) -> None:
    ids, mask = sample({"messages": CONV}, "chat", chat_loss=loss)
    assert ids == CONV_IDS
    assert mask == expected


def test_sharegpt_equals_chat_with_system_prepended() -> None:
    row = {
        "system": "S",
        "conversations": [
            {"from": "human", "value": "U1"},
            {"from": "gpt", "value": "A1"},
            {"from": "human", "value": "U2"},
            {"from": "gpt", "value": "A2"},
        ],
    }
    assert sample(row, "sharegpt") == sample({"messages": CONV}, "chat")


def test_chat_errors() -> None:
    with pytest.raises(RowError, match="unknown role 'bot'"):
        sample({"messages": [{"role": "bot", "content": "x"}]}, "chat")
    with pytest.raises(RowError, match="no assistant message"):
        sample({"messages": [{"role": "user", "content": "x"}]}, "chat")
    with pytest.raises(RowError, match=r"conversations\[0\] needs keys 'from' and 'value'"):
        sample({"conversations": [{"role": "user"}]}, "sharegpt")
    with pytest.raises(RowError, match="conversation is empty"):
        sample({"messages": []}, "chat", chat_loss="full")
    # Text parts are joined; a user-only chat is fine with full loss.
    msgs = chat_messages(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]},
        "chat",
        TextConfig(),
    )
    assert msgs == [{"role": "user", "content": "ab"}]
    as_string = {"messages": json.dumps(CONV)}  # a JSON-encoded conversation column
    assert sample(as_string, "chat") == sample({"messages": CONV}, "chat")
    calls = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]},
    ]
    with pytest.raises(RowError, match=r"messages\[1\]\.tool_calls\[0\] needs a function name"):
        sample({"messages": calls}, "chat", tok=Q)
    with pytest.raises(RowError, match=r"key 'tools' must be a list of tool definitions"):
        sample({"messages": CONV, "tools": {"name": "f"}}, "chat")
    with pytest.raises(RowError, match=r"only assistant messages carry tool_calls"):
        sample({"messages": [{"role": "user", "content": "u", "tool_calls": [{"name": "f"}]}]}, "chat")
    with pytest.raises(RowError, match="key 'messages' must be a list or tuple or ndarray, got int"):
        sample({"messages": 3}, "chat")


# --- qwen3 ----------------------------------------------------------------------------------------------

Q = load_tokenizer("qwen3")
Q_START, Q_END, Q_NL, Q_NL2, THINK, UNTHINK = 151644, 151645, 198, 271, 151667, 151668
Q_USER, Q_ASSISTANT, Q_SYSTEM = 872, 77091, 8948
HELLO, THERE, HI = 9707, 1052, 13048  # "Hello", " there", "Hi"


def test_qwen3_ids_match_the_qwen_vocabulary() -> None:
    assert Q.encode("Hello there") == [HELLO, THERE]
    assert Q.encode("<|im_start|>user\nHi<|im_end|>") == [Q_START, Q_USER, Q_NL, HI, Q_END]
    assert Q.eos_id == Q_END and Q.vocab_size == 151669
    assert Q.encode("<think></think>") == [THINK, UNTHINK]


def test_qwen3_chat_golden_with_empty_think_block_on_last_turn() -> None:
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"},
    ]
    ids, mask = sample({"messages": msgs}, "chat", tok=Q)
    turn1 = [Q_START, Q_USER, Q_NL, HI, Q_END, Q_NL]
    asst1 = [Q_START, Q_ASSISTANT, Q_NL, HELLO, Q_END, Q_NL]  # before the last query: no think block
    asst2 = [Q_START, Q_ASSISTANT, Q_NL, THINK, Q_NL2, UNTHINK, Q_NL2, HELLO, THERE, Q_END, Q_NL]
    assert ids == turn1 + asst1 + turn1 + asst2
    assert mask == [0] * 6 + [0, 0, 0, 1, 1, 0] + [0] * 6 + [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]
    _, last = sample({"messages": msgs}, "chat", tok=Q, chat_loss="last_turn")
    assert last == [0] * 18 + [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]
    _, full = sample({"messages": msgs}, "chat", tok=Q, chat_loss="full")
    assert full == [0 if t == Q_START else 1 for t in ids]


def test_qwen3_reasoning_in_content_is_moved_into_the_think_block() -> None:
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nHello\n</think>\n\nHello there"},
    ]
    ids, _ = sample({"messages": msgs}, "chat", tok=Q)
    assert ids[6:] == [
        Q_START,
        Q_ASSISTANT,
        Q_NL,
        THINK,
        Q_NL,
        HELLO,
        Q_NL,
        UNTHINK,
        Q_NL2,
        HELLO,
        THERE,
        Q_END,
        Q_NL,
    ]


def test_qwen3_prompt_completion() -> None:
    ids, mask = sample({"prompt": "Hi", "completion": "Hello there"}, "prompt_completion", tok=Q)
    assert ids == [HI, HELLO, THERE, Q_END]
    assert mask == [0, 1, 1, 1]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(max_size=12), st.text(min_size=0, max_size=12)),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from(["bytes", "qwen3"]),
)
def test_property_assistant_tokens_decode_to_assistant_turns(turns: list[tuple[str, str]], spec: str) -> None:
    """Whatever the text, the masked tokens are exactly each assistant body + <|im_end|> (ChatML)."""
    tok = load_tokenizer(spec)
    # Keep texts free of special-token strings and of the newlines that BPE could merge across the header.
    clean = [(u.replace("<|", "").replace("\n", " "), a.replace("<|", "").lstrip("\n")) for u, a in turns]
    msgs = []
    for u, a in clean:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    ids, mask = row_to_sample({"messages": msgs}, "chat", TextConfig(), tok)
    masked = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    if spec == "bytes":
        expected = "".join(a + "<|im_end|>" for _, a in clean)
    else:
        # the last turn also carries the empty think block
        bodies = [a for _, a in clean]
        bodies[-1] = "<think>\n\n</think>\n\n" + bodies[-1]
        expected = "".join(x + "<|im_end|>" for x in bodies)
    if spec == "qwen3":
        expected = unicodedata.normalize("NFC", expected)  # Qwen's normalizer
    assert masked == expected


# --- pretokenized ---------------------------------------------------------------------------------------


def test_pretokenized_taken_as_is() -> None:
    assert sample({"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, "pretokenized") == ([5, 6, 7], [0, 1, 1])
    assert sample({"input_ids": [5, 6]}, "pretokenized") == ([5, 6], [1, 1])
    assert sample({"input_ids": [5, 6], "loss_mask": [False, True]}, "pretokenized") == ([5, 6], [0, 1])
    with pytest.raises(RowError, match="loss_mask has 1 entries but input_ids has 2"):
        sample({"input_ids": [5, 6], "loss_mask": [1]}, "pretokenized")
    with pytest.raises(RowError, match="outside the tokenizer's vocabulary"):
        sample({"input_ids": [5, 600]}, "pretokenized")
    with pytest.raises(RowError, match="at least 2"):
        sample({"input_ids": [5]}, "pretokenized")
    with pytest.raises(RowError, match="must hold integers"):
        sample({"input_ids": [5, "6"]}, "pretokenized")


def test_detect_format() -> None:
    cfg = TextConfig()
    assert detect_format([{"input_ids": [1]}], cfg) == "pretokenized"
    assert detect_format([{"conversations": []}], cfg) == "sharegpt"
    assert detect_format([{"prompt": "a", "completion": "b", "x": 1}], cfg) == "prompt_completion"
    assert (
        detect_format([{"q": "a", "a": "b"}], TextConfig(prompt_key="q", completion_key="a"))
        == "prompt_completion"
    )
    assert detect_format([{"junk": 1}, {"messages": []}], cfg) == "chat"


# --- HF tokenizer.json / folder -------------------------------------------------------------------------

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
)
GENERATION = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
)


def _hf_folder(tmp: Path, template: str | None) -> Path:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "user": 1, "assistant": 2, "hi": 3, "yo": 4, "system": 5, "be": 6, "nice": 7}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    config: dict = {"eos_token": "<|im_end|>"}
    if template is not None:
        config["chat_template"] = template
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp


@pytest.mark.parametrize("template", [CHATML, GENERATION])
def test_hf_folder_chat_masks(tmp_path: Path, template: str) -> None:
    tok = load_tokenizer(str(_hf_folder(tmp_path / "m", template)))
    assert tok.special_tokens == {"<|im_start|>": 8, "<|im_end|>": 9} and tok.eos_id == 9
    msgs = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo yo"},
    ]
    ids, mask = row_to_sample({"messages": msgs}, "chat", TextConfig(), tok)
    assert ids == [8, 5, 6, 7, 9, 8, 1, 3, 9, 8, 2, 4, 9, 8, 1, 3, 9, 8, 2, 4, 4, 9]
    assert mask == [0] * 11 + [1, 1] + [0] * 6 + [1, 1, 1]
    _, last = row_to_sample({"messages": msgs}, "chat", TextConfig(chat_loss="last_turn"), tok)
    assert last == [0] * 19 + [1, 1, 1]
    ident = tok.identity()
    assert (
        ident["kind"] == "hf"
        and ident["eos_id"] == 9
        and set(ident["files"]) == {"tokenizer.json", "tokenizer_config.json"}
    )


def test_hf_tokenizer_json_file_prompt_completion(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m", None)
    tok = load_tokenizer(str(folder / "tokenizer.json"))  # config beside it is used
    ids, mask = row_to_sample({"prompt": "hi", "completion": "yo"}, "prompt_completion", TextConfig(), tok)
    assert (ids, mask) == ([3, 4, 9], [0, 1, 1])
    with pytest.raises(InputError, match="no chat_template"):
        row_to_sample({"messages": [{"role": "assistant", "content": "yo"}]}, "chat", TextConfig(), tok)


def test_load_tokenizer_errors_list_what_was_tried(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"tried: built-in names 'bytes', 'qwen3'; file .*does not exist"):
        load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "empty_model").mkdir()
    with pytest.raises(InputError, match=r"tokenizer.json \(folder exists, file missing\)"):
        load_tokenizer(str(tmp_path / "empty_model"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match=r"not a valid HF tokenizer\.json"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_hf_template_raise_exception_is_a_malformed_row(tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        + CHATML
    )
    tok = load_tokenizer(str(_hf_folder(tmp_path / "m", template)))
    with pytest.raises(
        RowError, match=r"chat template rejected this conversation \(System role not supported\)"
    ):
        row_to_sample(
            {"messages": [{"role": "system", "content": "be"}]}, "chat", TextConfig(chat_loss="full"), tok
        )
    ids, _ = row_to_sample(
        {"messages": [{"role": "user", "content": "hi"}]}, "chat", TextConfig(chat_loss="full"), tok
    )
    assert ids == [8, 1, 3, 9]


def test_hf_byte_level_bpe_assistant_mask_is_exact(tmp_path: Path) -> None:
    """A GPT-2/Qwen-style byte-level BPE whose ByteLevel post-processor trims offsets (a lone "Ġ" gets none)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.train_from_iterator(
        ["hello world\n\n this is a test of the user and the assistant"] * 20, trainer=trainer
    )
    folder = tmp_path / "bpe"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML})
    )
    hf = load_tokenizer(str(folder))
    msgs = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": " hello world"},
        {"role": "user", "content": "test"},
        {"role": "assistant", "content": "  this  is\tthe test "},
    ]
    ids, mask = row_to_sample({"messages": msgs}, "chat", TextConfig(), hf)
    assert hf.decode(ids) == "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    picked = [i for i, m in zip(ids, mask, strict=True) if m]
    assert hf.decode(picked) == " hello world<|im_end|>  this  is\tthe test <|im_end|>"
