"""Tool use against the official Qwen3 chat template: ids and masks, token for token.

The reference is what Megatron-Bridge and ``transformers`` do with a Qwen3 checkpoint: the ``chat_template``
of ``Qwen/Qwen3-8B`` (``tests/data/chat_templates/qwen3_official.jinja``, source in the README there)
rendered by jinja2 in the sandboxed environment ``apply_chat_template`` uses (``trim_blocks``,
``lstrip_blocks``, its ``tojson``), tokenized by the ``tokenizers`` library with a Qwen3 ``tokenizer.json``
(built offline in ``conftest.py``), assistant tokens found by Bridge's ChatML boundary markers
(``<|im_start|>assistant\\n`` ... ``<|im_end|>``; the template has no ``{% generation %}`` block).

Checked against it: the built-in ``qwen3`` (its own renderer, tiktoken), and an HF model folder whose
``tokenizer_config.json`` carries the same template (longpack's jinja path, with ``tools`` passed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from longpack.text import TextConfig, load_tokenizer
from longpack.text.rows import RowError, chat_messages, row_to_sample

pytestmark = pytest.mark.slow

TEMPLATE = (Path(__file__).parents[1] / "data" / "chat_templates" / "qwen3_official.jinja").read_text()

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city. Température en °C; 天气.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 北京 or Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web <b>fast</b> & well",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}}},
    },
}


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


ROWS: list[dict[str, Any]] = [
    {  # system + tools, a call with dict arguments, its result, the final answer
        "tools": [WEATHER],
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the weather in Paris? 😀"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
            {"role": "tool", "content": '{"temp": 21, "sky": "clear"}', "tool_call_id": "call_get_weather"},
            {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        ],
    },
    {  # no system prompt, two tools, parallel calls (string arguments), two results in one user turn
        "tools": [WEATHER, SEARCH],
        "messages": [
            {"role": "user", "content": "Weather in 北京 and news about it"},
            {
                "role": "assistant",
                "content": "Let me check both.",
                "tool_calls": [
                    call("get_weather", '{"city": "北京", "unit": "celsius"}'),
                    call("search", {"q": "北京 news", "k": 3}),
                ],
            },
            {"role": "tool", "content": "sunny, 30"},
            {"role": "tool", "content": "[1] ... [2] ... [3] ..."},
            {"role": "assistant", "content": "Sunny and 30 °C; the news: ..."},
            {"role": "user", "content": "thanks!"},
            {"role": "assistant", "content": "You're welcome."},
        ],
    },
    {  # flat calls ({"name", "arguments"}), reasoning on a turn after the last query, multi-step
        "tools": [SEARCH],
        "messages": [
            {"role": "user", "content": "find x"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "\nI should search.\n",
                "tool_calls": [{"name": "search", "arguments": {"q": "x"}}],
            },
            {"role": "tool", "content": "x is 42"},
            {"role": "assistant", "content": "<think>\nfound it\n</think>\n\nx is 42."},
        ],
    },
    {  # no tools column but a tool call anyway; system not first; a user turn that looks like a result
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "tool_calls": [call("search", {})]},
            {"role": "system", "content": "Mid-conversation system note."},
            {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"},
            {"role": "assistant", "content": "ok"},
        ],
    },
    {  # empty tools list: no tools block; earlier turns keep their think blocks out
        "tools": [],
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "<think>r1</think>b"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d", "reasoning_content": "r2"},
        ],
    },
    {  # tools as a JSON string column (Parquet exports), a tool result as the last message
        "tools": json.dumps([WEATHER], ensure_ascii=False),
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Zürich"})]},
            {"role": "tool", "content": "rain"},
        ],
    },
]


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' chat-template tojson (json.dumps; not jinja2's HTML-escaping, key-sorting filter)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_official(messages: list[dict[str, Any]], tools: Any) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    return env.from_string(TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=False)


def reference(rust: Any, messages: list[dict[str, Any]], tools: Any) -> tuple[list[int], list[int]]:
    """ids and the assistant-marker mask, the way Bridge infers it for a template without generation blocks."""
    text = render_official(messages, tools)
    enc = rust.encode(text, add_special_tokens=False)
    spans, pos = [], 0
    while (s := text.find("<|im_start|>assistant\n", pos)) >= 0:
        body = s + len("<|im_start|>assistant\n")
        end = text.index("<|im_end|>", body) + len("<|im_end|>")
        spans.append((body, end))
        pos = end
    mask = [int(any(a < hi and b > lo for lo, hi in spans)) for a, b in enc.offsets]
    return list(enc.ids), mask


@pytest.fixture(scope="module")
def rust(qwen3_tokenizer_json: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(qwen3_tokenizer_json))


@pytest.fixture(scope="module")
def hf_official(qwen3_tokenizer_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3-official")
    shutil.copy(qwen3_tokenizer_json, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": TEMPLATE})
    )
    return folder


def _tools(row: dict[str, Any]) -> Any:
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


@pytest.mark.parametrize("index", range(len(ROWS)))
@pytest.mark.parametrize("spec", ["qwen3", "hf"])
def test_ids_and_masks_equal_the_official_template(
    index: int, spec: str, rust: Any, hf_official: Path
) -> None:
    row = ROWS[index]
    tok = load_tokenizer("qwen3" if spec == "qwen3" else str(hf_official))
    ids, mask = reference(rust, row["messages"], _tools(row))
    got_ids, got_mask = row_to_sample(row, "chat", TextConfig(), tok)
    assert got_ids == ids
    assert got_mask == mask
    # last_turn keeps the last assistant turn's tokens only; full trains on all but <|im_start|>
    _, last = row_to_sample(row, "chat", TextConfig(chat_loss="last_turn"), tok)
    last_start = len(ids) - 1 - ids[::-1].index(77091)  # the last "assistant" header token
    assert last == [m if k > last_start else 0 for k, m in enumerate(mask)]
    _, full = row_to_sample(row, "chat", TextConfig(chat_loss="full"), tok)
    assert full == [0 if t == 151644 else 1 for t in ids]


def test_tool_results_are_never_trained_on_and_calls_follow_the_loss(rust: Any) -> None:
    q = load_tokenizer("qwen3")
    row = ROWS[1]
    ids, mask = row_to_sample(row, "chat", TextConfig(), q)
    text_of = q.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京", "unit": "celsius"}}' in text_of
    assert "sunny, 30" not in text_of and "<tool_response>" not in text_of
    untrained = q.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    assert "<tool_response>\nsunny, 30\n</tool_response>" in untrained
    assert "# Tools" in untrained  # the tool definitions are context, not targets


def test_sharegpt_llama_factory_function_call_and_observation(rust: Any) -> None:
    q = load_tokenizer("qwen3")
    row = {
        "tools": json.dumps([WEATHER]),
        "system": "You are a helpful assistant.",
        "conversations": [
            {"from": "human", "value": "What's the weather in Paris? 😀"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}),
            },
            {"from": "observation", "value": '{"temp": 21, "sky": "clear"}'},
            {"from": "gpt", "value": "It is 21 °C and clear in Paris."},
        ],
    }
    msgs = chat_messages(row, "sharegpt", TextConfig())
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    ids, mask = reference(rust, msgs, [WEATHER])
    assert row_to_sample(row, "sharegpt", TextConfig(), q) == (ids, mask)
    bad = {
        "conversations": [
            {"from": "human", "value": "q"},
            {"from": "function_call", "value": "get_weather(x)"},
        ]
    }
    with pytest.raises(RowError, match=r"conversations\[1\]: a function_call turn's value must be JSON"):
        row_to_sample(bad, "sharegpt", TextConfig(), q)


def test_many_random_tool_rows_match(rust: Any, hf_official: Path) -> None:
    """A seeded mix of shapes (calls per turn, string/dict arguments, reasoning, systems, results)."""
    rng = np.random.default_rng(7)
    q, hf = load_tokenizer("qwen3"), load_tokenizer(str(hf_official))
    words = ["alpha", "β", "東京", "🙂", "x\ny", " spaced  out ", "<b>&amp;</b>", '"quoted"', "\\back"]
    for _ in range(40):
        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": str(rng.choice(words))})
        for _turn in range(int(rng.integers(1, 4))):
            msgs.append({"role": "user", "content": " ".join(rng.choice(words, 3))})
            n_calls = int(rng.integers(0, 3))
            if n_calls:
                calls = [
                    call("search", {"q": str(rng.choice(words))} if rng.random() < 0.5 else '{"q": "s"}')
                    for _ in range(n_calls)
                ]
                content = str(rng.choice(["", "ok, calling", "<think>plan</think>calling"]))
                msgs.append({"role": "assistant", "content": content, "tool_calls": calls})
                msgs += [{"role": "tool", "content": str(rng.choice(words))} for _ in range(n_calls)]
            msgs.append({"role": "assistant", "content": " ".join(rng.choice(words, 2))})
        tools = [WEATHER, SEARCH][: int(rng.integers(0, 3))]
        row = {"messages": msgs, "tools": tools}
        expected = reference(rust, msgs, tools)
        assert row_to_sample(row, "chat", TextConfig(), q) == expected
        assert row_to_sample(row, "chat", TextConfig(), hf) == expected
