"""Documents in (``format="text"``): one row (a ``text`` column, or one plain-text file) is one document of
pretraining data, as Megatron-LM's ``tools/preprocess_data.py`` reads a ``--json-keys text`` JSON Lines file.

A document is tokenized as it is (no template, no BOS), trains on every token, and gets the tokenizer's EOS
appended when ``TextConfig.append_eod`` is set (Megatron's ``--append-eod``; the default here, because
packing and inter-document masking need the boundary token). The EOD token is the tokenizer's EOS unless
``TextConfig.eod`` names another (a Qwen base model's preprocessing ends documents with ``<|endoftext|>``).
A row whose text tokenizes to nothing is no document, as in ``preprocess_data.py`` (which appends EOD only
to a document that has ids): :class:`~longpack.text.errors.EmptyDocument`, counted as an empty document.
Every document is accounted like any other sample: empty, malformed, dropped, truncated, fragmented or
packed, with ``file:line``.

    >>> from longpack.text.rows import TextConfig
    >>> from longpack.text.tokenizers import load_tokenizer
    >>> document_sample({"text": "Hi!"}, TextConfig(format="text"), load_tokenizer("bytes"))
    ([72, 105, 33, 258], bytearray(b'\\x01\\x01\\x01\\x01'))
    >>> document_sample({"text": "Hi!"}, TextConfig(format="text", append_eod=False), load_tokenizer("bytes"))[0]
    [72, 105, 33]
    >>> document_sample({"text": "Hi!"}, TextConfig(format="text", eod="<|im_start|>"), load_tokenizer("qwen3"))[0]
    [13048, 0, 151644]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longpack.errors import ConfigError
from longpack.text.errors import EmptyDocument, RowError
from longpack.text.tokenizers import Tokenizer

__all__ = ["document_sample", "eod_id"]


def eod_id(tok: Tokenizer, eod: str | int | None) -> int:
    """The id that ends documents: the tokenizer's EOS when ``eod`` is ``None``, else the special token
    whose text ``eod`` is (``"<|endoftext|>"``), a text that encodes to exactly one id, or an id
    (an int, or its decimal digits) below the vocabulary size. Anything else is a :class:`ConfigError`.

    >>> from longpack.text.tokenizers import load_tokenizer
    >>> tok = load_tokenizer("qwen3")
    >>> eod_id(tok, None), eod_id(tok, "<|endoftext|>"), eod_id(tok, "151643")
    (151645, 151643, 151643)
    >>> eod_id(tok, "two words")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: text.eod='two words' is not one token of qwen3 (it encodes to 2 ids); give a special token such as '<|endoftext|>' or an id below 151669
    """
    if eod is None:
        return int(tok.eos_id)
    if isinstance(eod, int) or (isinstance(eod, str) and eod.isdigit()):
        value = int(eod)
        if not 0 <= value < tok.vocab_size:
            raise ConfigError(
                f"text.eod={eod!r} is outside the vocabulary of {tok.name} (0..{tok.vocab_size - 1})",
                fields="text.eod",
            )
        return value
    special = tok.special_tokens.get(eod)
    if special is not None:
        return int(special)
    ids = tok.encode(eod)
    if len(ids) == 1:
        return int(ids[0])
    raise ConfigError(
        f"text.eod={eod!r} is not one token of {tok.name} (it encodes to {len(ids)} ids); give a special token "
        f"such as '<|endoftext|>' or an id below {tok.vocab_size}",
        fields="text.eod",
    )


def document_sample(row: Mapping[str, Any], config: Any, tok: Tokenizer) -> tuple[list[int], bytearray]:
    """``(input_ids, loss_mask)`` of one document row (``config``: a ``longpack.text.TextConfig``): its
    ``config.text_key`` text, tokenized, EOD (:func:`eod_id`) appended with ``append_eod``; loss on every
    token. :class:`EmptyDocument` when the text tokenizes to no token; ``RowError`` when the column is
    missing or not a string, or the document has fewer than ``config.min_tokens`` tokens."""
    key = config.text_key
    if key not in row:
        raise RowError(f"missing key {key!r} (the document's text); the row has keys {sorted(row)}")
    text = row[key]
    if not isinstance(text, str):
        raise RowError(f"key {key!r} must be a string, got {type(text).__name__}")
    ids = tok.encode(text) if text else []
    if not ids:
        raise EmptyDocument(
            f"key {key!r} is {'empty' if not text else 'text that tokenizes to no token'}: no document "
            "(as Megatron-LM's preprocess_data.py)"
        )
    if config.append_eod:
        ids.append(tok.eos_id if config.eod is None else eod_id(tok, config.eod))
    if len(ids) < config.min_tokens:
        raise RowError(
            f"the document has {len(ids)} token(s); a stored sample needs at least {config.min_tokens}"
        )
    return ids, bytearray(b"\x01") * len(ids)
