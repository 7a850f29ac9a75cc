"""Documents in (``format="text"``): one row (a ``text`` column, or one plain-text file) is one document of
pretraining data, as Megatron-LM's ``tools/preprocess_data.py`` reads a ``--json-keys text`` JSON Lines file.

A document is tokenized as it is (no template, no BOS), trains on every token, and gets the tokenizer's EOS
appended when ``TextConfig.append_eod`` is set (Megatron's ``--append-eod``; the default here, because
packing and inter-document masking need the boundary token). Every document is accounted like any other
sample: malformed, dropped, truncated, fragmented or packed, with ``file:line``.

    >>> from longpack.text.rows import TextConfig
    >>> from longpack.text.tokenizers import load_tokenizer
    >>> document_sample({"text": "Hi!"}, TextConfig(format="text"), load_tokenizer("bytes"))
    ([72, 105, 33, 258], bytearray(b'\\x01\\x01\\x01\\x01'))
    >>> document_sample({"text": "Hi!"}, TextConfig(format="text", append_eod=False), load_tokenizer("bytes"))[0]
    [72, 105, 33]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longpack.text.errors import RowError
from longpack.text.tokenizers import Tokenizer

__all__ = ["document_sample"]


def document_sample(row: Mapping[str, Any], config: Any, tok: Tokenizer) -> tuple[list[int], bytearray]:
    """``(input_ids, loss_mask)`` of one document row (``config``: a ``longpack.text.TextConfig``): its
    ``config.text_key`` text, tokenized, EOS appended with ``append_eod``; loss on every token. ``RowError`` when the column is missing or not a string, or the
    document has fewer than ``config.min_tokens`` tokens."""
    key = config.text_key
    if key not in row:
        raise RowError(f"missing key {key!r} (the document's text); the row has keys {sorted(row)}")
    text = row[key]
    if not isinstance(text, str):
        raise RowError(f"key {key!r} must be a string, got {type(text).__name__}")
    ids = tok.encode(text) if text else []
    if config.append_eod:
        ids.append(tok.eos_id)
    if len(ids) < config.min_tokens:
        raise RowError(
            f"the document has {len(ids)} token(s); a stored sample needs at least {config.min_tokens}"
        )
    return ids, bytearray(b"\x01") * len(ids)
