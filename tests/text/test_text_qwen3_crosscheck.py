"""Cross-check: built-in ``qwen3`` (tiktoken) vs an HF ``tokenizer.json`` built from the same vocabulary.

The HF tokenizer is assembled here the way Qwen's own tokenizer.json is laid out (byte-level BPE, merges
recovered from the BPE ranks, NFC normalizer, the Qwen split regex, the 26 added tokens) and run by the
``tokenizers`` library: a second, independent implementation. Ids must agree on real text, and chat masks
from the built-in Qwen3 template must agree with the HF path (a jinja ChatML template with Qwen3's empty think
block on the last turn, assistant spans found by markers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from longpack.text import TextConfig, load_tokenizer, write_demo_dataset
from longpack.text.rows import row_to_sample

pytestmark = pytest.mark.slow

QWEN3_LIKE_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% if loop.last %}{{ '<think>\\n\\n</think>\\n\\n' + m['content'].lstrip('\\n') }}"
    "{% else %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
)


@pytest.fixture(scope="module")
def hf_qwen(qwen3_tokenizer_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3-hf")
    shutil.copy(qwen3_tokenizer_json, folder / "tokenizer.json")
    config = {"eos_token": "<|im_end|>", "chat_template": QWEN3_LIKE_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_ids_agree_on_real_and_tricky_text(hf_qwen: Path, tmp_path: Path) -> None:
    q, hf = load_tokenizer("qwen3"), load_tokenizer(str(hf_qwen))
    assert hf.vocab_size == q.vocab_size and hf.eos_id == q.eos_id == 151645
    demo = write_demo_dataset(tmp_path / "demo", n=400, seed=0)
    texts = [
        "I'LL be there; we've 12345 items:\t\t tabs,   spaces\n\n\nnewlines",
        "e\u0301 café 北京欢迎你 😀 <think>x</think> <|im_start|>user",
        "    def f(x):\n        return x  # trailing   \n",
    ]
    for line in (demo / "prompt_completion.jsonl").read_text().splitlines():
        row = json.loads(line)
        texts += [row["prompt"], row["completion"]]
    mismatched = [t for t in texts if q.encode(t) != hf.encode(t)]
    assert mismatched == []


def test_chat_masks_agree(hf_qwen: Path) -> None:
    q, hf = load_tokenizer("qwen3"), load_tokenizer(str(hf_qwen))
    conversations = [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3 + 3 ?"},
            {"role": "assistant", "content": "\n 6, of course.\n"},
        ],
    ]
    for msgs in conversations:
        for loss in ("assistant", "last_turn", "full"):
            cfg = TextConfig(chat_loss=loss)
            assert row_to_sample({"messages": msgs}, "chat", cfg, q) == row_to_sample(
                {"messages": msgs}, "chat", cfg, hf
            )
