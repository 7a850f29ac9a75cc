"""The seam between the pack job and token stores (``longpack.store``): read a store instead of tokenizing,
or keep a run's tokens as a store. The pack job calls :func:`tokenized_or_stored`; ``longpack tokenize``
(:mod:`longpack.jobs.tokenize`) calls :func:`save_store`.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from longpack.errors import ConfigError, InputError
from longpack.text import TextConfig

__all__ = ["check_store_text", "open_store", "save_store", "store_text", "tokenized_or_stored"]


def _record(result: Any, text: TextConfig) -> dict[str, Any]:
    """The tokenization report a store keeps: everything a pack's manifest takes from tokenizing."""
    return {
        "format": result.format,
        "rows_read": result.rows_read,
        "malformed": [list(m) for m in result.malformed],
        "tokenizer": result.tokenizer,
        "inputs": list(result.inputs),
        "skipped_inputs": [list(s) for s in result.skipped_inputs],
        "warnings": list(result.warnings),
        "text": {f.name: getattr(text, f.name) for f in fields(text)},
        "empty": [[e, int(k)] for e, k in zip(result.empty, result.empty_before, strict=True)],
        "eod_id": result.eod_id,
    }


#: The tokenization report a store keeps (public: the sharded tokenize writes the same record).
record_of = _record


def store_identities(result: Any) -> list[dict[str, Any]]:
    """:func:`longpack.store.file_identity` of every input of ``result`` that is a file."""
    from longpack.store import file_identity

    identities = []
    for info in result.inputs:
        path_ = Path(info["path"])
        if path_.is_file():
            identities.append(file_identity(path_, sha256=info.get("sha256")))
    return identities


def save_store(
    path: str | os.PathLike[str],
    result: Any,
    text: TextConfig,
    *,
    overwrite: bool = False,
    field: str = "out",
) -> dict[str, Any]:
    """Write a ``TokenizeResult`` (of ``tokenize_inputs`` with ``text``) as a store; return its manifest.
    Every input that is a file is recorded with its size, time and sha256, to be checked when it is used."""
    from longpack.store import write_store

    return write_store(
        path,
        result.samples,
        _record(result, text),
        input_files=store_identities(result),
        overwrite=overwrite,
        field=field,
    )


def store_text(
    path: str | os.PathLike[str], text: TextConfig, implied: dict[str, tuple[str, str]] | None = None
) -> TextConfig:
    """The text options of the store at ``path`` (see :func:`check_store_text`); reads ``store.json`` only."""
    import json

    from longpack.remote import is_url, read_text
    from longpack.store import STORE_MANIFEST

    try:
        where = f"{str(path).rstrip('/')}/{STORE_MANIFEST}" if is_url(path) else Path(path) / STORE_MANIFEST
        manifest = json.loads(read_text(where))
        recorded = manifest["record"]["text"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"token store {path}: no readable {STORE_MANIFEST} ({exc}); point at a folder `longpack tokenize` "
            "wrote",
            fields="store",
        ) from exc
    return check_store_text(recorded, text, implied)


def check_store_text(
    store_text: dict[str, Any], text: TextConfig, implied: dict[str, tuple[str, str]] | None = None
) -> TextConfig:
    """The text options a pack from a store uses: the store's. ``text`` may be the default (nothing given)
    or the same options; anything else is a :class:`ConfigError` naming the options that differ.

    >>> check_store_text({"min_tokens": 2}, TextConfig()).min_tokens
    2
    >>> check_store_text({"min_tokens": 2}, TextConfig(min_tokens=1))
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: the store was tokenized with min_tokens=2; this run asks for min_tokens=1: tokenize again with these options (longpack tokenize), or drop them
    """
    known = {f.name for f in fields(TextConfig)}
    stored = TextConfig(**{k: v for k, v in store_text.items() if k in known})
    if text == TextConfig() or text == stored:
        return stored
    differ = [f.name for f in fields(TextConfig) if getattr(text, f.name) != getattr(stored, f.name)]
    implied = implied or {}
    if differ and all(n in implied for n in differ):  # set by another setting, not by the user
        name = differ[0]
        reason, setting = implied[name]
        raise ConfigError(
            f"{reason} ({name}={getattr(text, name)!r}), but the store was tokenized with {name}="
            f"{getattr(stored, name)!r}: tokenize again with {name} {getattr(text, name)!r} (longpack tokenize), "
            "or pack the inputs instead of the store",
            fields=(setting, "store"),
        )
    was = ", ".join(f"{n}={getattr(stored, n)!r}" for n in differ)
    now = ", ".join(f"{n}={getattr(text, n)!r}" for n in differ)
    raise ConfigError(
        f"the store was tokenized with {was}; this run asks for {now}: tokenize again with "
        "these options (longpack tokenize), or drop them",
        fields="text",
    )


def open_store(
    path: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    text: TextConfig | None = None,
    join: bool = True,
    join_into: Path | None = None,
    implied: dict[str, tuple[str, str]] | None = None,
) -> tuple[Any, TextConfig, dict[str, Any]]:
    """``(TokenizeResult, text options, store record for the manifest)`` of a store, refused
    (:class:`InputError`) if what decided its tokens changed; ``tokenizer``, if given, must be the one
    the store was tokenized with. ``join=False``: the result's samples are not read (``None``; a writer
    reads the store shard by shard); ``join_into``: a scratch folder where a sharded store's shards are
    joined into memory maps instead of memory."""
    from longpack.store import TokenStore, check_record
    from longpack.text.pipeline import TokenizeResult

    store = TokenStore.open(path, join=join, join_into=join_into)
    changes = store.changes()
    if changes:
        raise InputError(
            f"token store {store.path} no longer matches what it was tokenized from: "
            + "; ".join(changes)
            + ". Tokenize again (longpack tokenize ... --overwrite)",
            fields="store",
        )
    record = store.record
    check_record(store.path, record)
    if tokenizer is not None:
        from longpack.text.tokenizers import as_tokenizer

        given = as_tokenizer(tokenizer).identity()
        if given != record.get("tokenizer"):
            raise ConfigError(
                f"tokenizer {given.get('name')!r} is not the one the store was tokenized with "
                f"({(record.get('tokenizer') or {}).get('name')!r}, files {(record.get('tokenizer') or {}).get('files')}); "
                "drop tokenizer to use the store's, or tokenize again",
                fields=("tokenizer", "store"),
            )
    used_text = check_store_text(record.get("text", {}), text or TextConfig(), implied)
    result = TokenizeResult(
        samples=store.samples,
        format=record["format"],
        rows_read=record["rows_read"],
        malformed=tuple(tuple(m) for m in record["malformed"]),  # type: ignore[misc]
        tokenizer=record["tokenizer"],
        inputs=tuple(record["inputs"]),
        skipped_inputs=tuple(tuple(s) for s in record["skipped_inputs"]),  # type: ignore[misc]
        warnings=tuple(record["warnings"]),
        empty=tuple(str(e) for e, _ in record.get("empty", ())),
        empty_before=tuple(int(k) for _, k in record.get("empty", ())),
        eod_id=record.get("eod_id"),
    )
    info = {
        "path": str(store.path.resolve()),
        "samples": store.manifest["samples"],
        "tokens": store.manifest["tokens"],
        "longpack_version": store.manifest["longpack_version"],
    }
    return result, used_text, info


def tokenized_or_stored(
    job: Any, executor: Any, inputs: list[str], tokenizer: Any
) -> tuple[Any, Any, dict[str, Any] | None]:
    """The pack job's training samples: tokenized by ``executor`` from ``inputs``, or read from
    ``job.store``. Returns ``(TokenizeResult, handle, store record or None)``; with ``job.keep_store`` the
    tokenized samples are also written as a store."""
    if job.store is not None:
        scratch = getattr(executor, "spill_dir", None)  # a sharded store joined there, not in memory
        implied = job.text_implied() if hasattr(job, "text_implied") else None
        result, _, info = open_store(
            job.store,
            tokenizer=job.resolved.tokenizer,
            text=job.resolved.text,
            join_into=None if scratch is None else Path(scratch) / "store",
            implied=implied,
        )
        return result, result.samples, info
    text = job.resolved.text
    result, handle = executor.tokenize(inputs, tokenizer=tokenizer, config=text, progress=job.progress)
    if job.keep_store is not None:
        save_store(job.keep_store, result, text, overwrite=job.overwrite, field="keep_store")
    return result, handle, None
