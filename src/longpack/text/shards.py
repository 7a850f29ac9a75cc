"""Tokenizing in shards: the inputs cut into shards of consecutive chunks (about ``shard_bytes`` of input
each, cut where ``tokenize_inputs`` cuts its chunks: JSON Lines at a newline, Parquet at a row group), each
shard tokenized on its own (any process, Ray task or machine), and the shards' reports joined into the one
``tokenize_inputs`` gives. The plan is a pure function of the inputs and ``shard_bytes``, so a resumed run
redoes exactly the unfinished shards, and the joined samples and report are the same as
``tokenize_inputs``'s (same chunks, same per-chunk code, same order) for any shard size or writer count.

JSON Lines (plain, ``.gz`` / ``.zst``, or one JSON array) and Parquet files; plain-text files and
``datasets`` folders go through ``tokenize_inputs``. A plain JSON Lines chunk is a byte range of its file;
a compressed or JSON-array file cannot be entered in the middle, so its chunks are ranges of its
decompressed rows (as ``jsonl_chunks`` gives them) and a shard streams the file from its start to its
last chunk (decompressing, not parsing, what comes before its first one).

>>> import tempfile
>>> d = Path(tempfile.mkdtemp()); _ = (d / "a.jsonl").write_text('{"text": "hi"}\\n{"text": ""}\\n')
>>> plan = plan_shards([str(d / "a.jsonl")], TextConfig(), shard_bytes=1 << 20)
>>> len(plan.shards), plan.formats
(1, ('text',))
>>> samples, meta = tokenize_shard(plan, 0, tokenizer="bytes", config=TextConfig())
>>> samples.tokens.tolist(), meta["empty"]
([104, 105, 258], [[0, 2, 1]])
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack.samples import TokenizedSamples
from longpack.text import inputs as text_inputs
from longpack.text.errors import InputError
from longpack.text.rows import TextConfig

__all__ = ["Chunk", "ShardPlan", "join_reports", "plan_shards", "tokenize_shard"]

#: Input bytes per shard by default (a shard's tokens are held in memory while it is tokenized).
SHARD_BYTES = 1 << 28


@dataclass(frozen=True)
class Chunk:
    """One chunk: a byte range of a JSON Lines file (``offset``, ``size``; of its decompressed rows where
    the file is streamed) or one Parquet row group."""

    file_index: int
    first_row: int
    offset: int = 0
    size: int = 0
    row_group: int = -1


@dataclass(frozen=True)
class ShardPlan:
    """The inputs (as ``tokenize_inputs`` names them), how each is read, its sha256 and size, and the
    chunks of every shard, in order."""

    files: tuple[str, ...]
    kinds: tuple[str, ...]
    formats: tuple[str | None, ...]
    digests: tuple[str, ...]
    sizes: tuple[int, ...]
    shards: tuple[tuple[Chunk, ...], ...]
    skipped: tuple[tuple[str, str], ...] = ()
    skipped_warning: tuple[str, ...] = ()
    #: per file: read from its start (``.gz`` / ``.zst`` or a JSON array), not entered at a chunk's offset
    streamed: tuple[bool, ...] = ()
    #: the JSON Lines chunk size the plan was cut with (a streamed file is cut the same way again)
    chunk_bytes: int = text_inputs.JSONL_CHUNK_BYTES

    def only(self, k: int) -> ShardPlan:
        """This plan with only shard ``k``'s chunks (what a worker of shard ``k`` is sent: small, whatever
        the number of shards)."""
        from dataclasses import replace

        return replace(self, shards=tuple(s if i == k else () for i, s in enumerate(self.shards)))

    def shard_key(self, k: int) -> str:
        """What shard ``k`` is made of (its chunks and their files' hashes): a resumed run keeps a written
        shard only when its key is the same."""
        chunks = [c.__dict__ for c in self.shards[k]]
        used = sorted({c.file_index for c in self.shards[k]})
        blob = json.dumps([chunks, [(self.files[i], self.digests[i]) for i in used]], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


def plan_shards(inputs: Sequence[str], config: TextConfig, *, shard_bytes: int = SHARD_BYTES) -> ShardPlan:
    """Cut ``inputs`` into shards (reads every input once, hashing it; holds one chunk at a time). JSON Lines
    chunks are at most ``shard_bytes`` (and ``tokenize_inputs``'s 1 MiB): rows are tokenized one by one, so
    where chunks are cut changes nothing but the shard boundaries."""
    import pyarrow.parquet as pq

    from longpack.outputs import sha256_file
    from longpack.text.inputs import find_inputs, input_kind, resolve_inputs
    from longpack.text.pipeline import detect_file_format, is_json_array

    listing = find_inputs(inputs)
    for f in listing.files:
        if f.kind not in ("jsonl", "parquet"):
            raise InputError(
                f"{f.label}: sharded tokenizing reads JSON Lines (also .gz / .zst, JSON arrays) and Parquet "
                "files; tokenize plain-text files and datasets folders without shards, or convert them first"
            )
    paths = resolve_inputs(inputs)
    kinds = [input_kind(p) for p in paths]
    streamed = [
        k == "jsonl" and (text_inputs.compression_of(p) is not None or is_json_array(p))
        for p, k in zip(paths, kinds, strict=True)
    ]
    formats = [detect_file_format(p, config) for p in paths]
    chunk_bytes = max(1, min(shard_bytes, text_inputs.JSONL_CHUNK_BYTES))
    shards: list[tuple[Chunk, ...]] = []
    current: list[Chunk] = []
    filled = 0
    digests = []

    def add(chunk: Chunk, nbytes: int) -> None:
        nonlocal current, filled
        if current and filled + nbytes > shard_bytes:
            shards.append(tuple(current))
            current, filled = [], 0
        current.append(chunk)
        filled += nbytes

    for i, (path, kind, fmt) in enumerate(zip(paths, kinds, formats, strict=True)):
        if kind == "jsonl":
            hasher = hashlib.sha256()
            offset = 0
            for first, blob in text_inputs.jsonl_chunks(path, hasher, chunk_bytes):
                if fmt is not None:
                    add(Chunk(file_index=i, first_row=first, offset=offset, size=len(blob)), len(blob))
                offset += len(blob)
            digests.append(hasher.hexdigest())
        else:
            digests.append(sha256_file(path))
            if fmt is None:
                continue
            meta = pq.ParquetFile(path).metadata
            first = 0
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                add(Chunk(file_index=i, first_row=first, row_group=g), int(group.total_byte_size))
                first += group.num_rows
    if current or not shards:
        shards.append(tuple(current))
    counts = listing.skipped_summary() if listing.skipped else {}
    warning = (
        (
            "not read: "
            + ", ".join(f"{n} {why}" for why, n in counts.items())
            + " (each listed under skipped_inputs)",
        )
        if counts
        else ()
    )
    return ShardPlan(
        files=tuple(str(p) for p in paths),
        kinds=tuple(kinds),
        formats=tuple(formats),
        digests=tuple(digests),
        sizes=tuple(p.stat().st_size for p in paths),
        shards=tuple(shards),
        skipped=tuple(listing.skipped),
        skipped_warning=warning,
        streamed=tuple(streamed),
        chunk_bytes=chunk_bytes,
    )


class _NoHash:
    def update(self, data: bytes) -> None:  # the plan hashed the file already
        return None


class _Streams:
    """The open streams of a shard's streamed files: each file's ``jsonl_chunks`` read forward once, its
    chunks handed out as the shard asks for them (in order)."""

    def __init__(self, plan: ShardPlan) -> None:
        self.plan = plan
        self.open: dict[int, tuple[Iterator[tuple[int, bytes]], list[int]]] = {}

    def chunk(self, chunk: Chunk) -> tuple[int, bytes]:
        i = chunk.file_index
        path = Path(self.plan.files[i])
        if i not in self.open:
            self.open[i] = (text_inputs.jsonl_chunks(path, _NoHash(), self.plan.chunk_bytes), [0])
        stream, at = self.open[i]
        for first, blob in stream:
            offset = at[0]
            at[0] += len(blob)
            if offset == chunk.offset:
                if len(blob) != chunk.size or first != chunk.first_row:
                    break
                return first, blob
            if offset > chunk.offset:
                break
        raise InputError(
            f"{path}: its rows changed since the shards were planned (chunk at row {chunk.first_row} is not "
            "there); tokenize it again"
        )


def _payloads(plan: ShardPlan, chunk: Chunk, streams: _Streams | None = None) -> Iterator[tuple[int, Any]]:
    path = plan.files[chunk.file_index]
    if plan.streamed and plan.streamed[chunk.file_index]:
        yield (streams or _Streams(plan)).chunk(chunk)
        return
    if plan.kinds[chunk.file_index] == "jsonl":
        with open(path, "rb") as fh:
            fh.seek(chunk.offset)
            yield chunk.first_row, fh.read(chunk.size)
        return
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path).read_row_group(chunk.row_group)
    first = chunk.first_row
    for batch in table.to_batches(max_chunksize=text_inputs.PARQUET_CHUNK_ROWS):
        yield first, batch
        first += batch.num_rows


def tokenize_shard(
    plan: ShardPlan, k: int, *, tokenizer: Any, config: TextConfig
) -> tuple[TokenizedSamples, dict[str, Any]]:
    """The samples of shard ``k`` (``files`` = every input, so shards join into one store) and its part of
    the report (JSON values): ``malformed`` ``[file, row, reason]``, ``empty`` ``[file, row, samples of the
    shard before it]``, ``rows_read`` and ``columns`` per file index."""
    from longpack.text.pipeline import tokenize_chunk
    from longpack.text.tokenizers import as_tokenizer

    tok = as_tokenizer(tokenizer)
    dtype = np.int64 if tok.vocab_size > np.iinfo(np.int32).max else np.int32
    tokens, masks, lengths, rows, file_of = [], [], [], [], []
    malformed: list[list[Any]] = []
    empty: list[list[int]] = []
    rows_read: dict[str, int] = {}
    columns: dict[str, dict[str, int]] = {}
    before = 0
    streams = _Streams(plan)
    for chunk in plan.shards[k]:
        i = chunk.file_index
        fmt = plan.formats[i]
        assert fmt is not None  # empty files have no chunks
        for first, payload in _payloads(plan, chunk, streams):
            part = tokenize_chunk(
                kind=plan.kinds[i], file=plan.files[i], first_row=first, payload=payload, fmt=fmt,
                config=config, tokenizer=tok,
            )  # fmt: skip
            tokens.append(part.tokens.astype(dtype, copy=False))
            masks.append(part.loss_mask)
            lengths.append(part.lengths.astype(np.int64))
            rows.append(part.rows.astype(np.int64))
            file_of.append(np.full(len(part.lengths), i, dtype=np.int32))
            malformed += [[i, int(r), reason] for r, reason in part.malformed]
            empty += [[i, int(r), before + int(b)] for r, b in part.empty]
            before += len(part.lengths)
            rows_read[str(i)] = rows_read.get(str(i), 0) + part.rows_read
            seen = columns.setdefault(str(i), {})
            for name, n in part.columns.items():
                seen[name] = seen.get(name, 0) + n
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    samples = TokenizedSamples(
        tokens=np.concatenate(tokens) if tokens else np.zeros(0, dtype),
        loss_mask=np.concatenate(masks) if masks else np.zeros(0, np.uint8),
        offsets=offsets,
        source_file=np.concatenate(file_of) if file_of else np.zeros(0, np.int32),
        source_row=np.concatenate(rows) if rows else np.zeros(0, np.int64),
        files=plan.files,
    )
    meta = {"malformed": malformed, "empty": empty, "rows_read": rows_read, "columns": columns}
    return samples, meta


def join_reports(
    plan: ShardPlan,
    metas: Sequence[Mapping[str, Any]],
    shard_samples: Sequence[int],
    *,
    tokenizer: Any,
    config: TextConfig,
) -> dict[str, Any]:
    """The fields of ``tokenize_inputs``'s ``TokenizeResult`` (all but ``samples``) from every shard's
    report (``metas``, in shard order) and sample count; the same checks and messages."""
    from longpack.text.documents import eod_id
    from longpack.text.inputs import input_file
    from longpack.text.pipeline import arrow_schema, column_report, no_samples_message, report_kind
    from longpack.text.tokenizers import as_tokenizer

    tok = as_tokenizer(tokenizer)
    n = len(plan.files)
    rows_per_file = [0] * n
    malformed_per_file = [0] * n
    columns_per_file: list[dict[str, int]] = [{} for _ in range(n)]
    malformed: list[tuple[str, str]] = []
    empty: list[str] = []
    empty_before: list[int] = []
    start = 0
    for meta, count in zip(metas, shard_samples, strict=True):
        for i, r, reason in meta["malformed"]:
            malformed.append((f"{plan.files[i]}:{r}", reason))
            malformed_per_file[i] += 1
        for i, r, b in meta["empty"]:
            empty.append(f"{plan.files[i]}:{r}")
            empty_before.append(start + int(b))
        for i, rows in meta["rows_read"].items():
            rows_per_file[int(i)] += int(rows)
        for i, cols in meta["columns"].items():
            seen = columns_per_file[int(i)]
            for name, c in cols.items():
                seen[name] = seen.get(name, 0) + int(c)
        start += int(count)
    rows_read = sum(rows_per_file)
    if rows_read == 0:
        raise InputError(
            f"no rows in the inputs ({', '.join(plan.files)}): every file is empty; check the inputs"
        )
    if start == 0:
        raise InputError(no_samples_message(rows_read, malformed, len(empty)))
    infos, warnings = [], []
    for i in range(n):
        counts = columns_per_file[i]
        if plan.kinds[i] == "parquet":
            names, num_rows = arrow_schema(input_file(Path(plan.files[i])))
            counts = dict.fromkeys(names, num_rows)
        cols, col_warnings = column_report(plan.files[i], plan.formats[i], config, counts, rows_per_file[i])
        warnings += col_warnings
        infos.append(
            {
                "path": plan.files[i],
                "size_bytes": plan.sizes[i],
                "sha256": plan.digests[i],
                "format": plan.formats[i],
                "rows": rows_per_file[i],
                "malformed": malformed_per_file[i],
                "kind": report_kind(plan.kinds[i], plan.formats[i], Path(plan.files[i])),
                "compression": text_inputs.compression_of(Path(plan.files[i])),
                "columns": cols,
            }
        )
    return {
        "format": ",".join(sorted({f for f in plan.formats if f is not None})),
        "rows_read": rows_read,
        "malformed": tuple(malformed),
        "tokenizer": tok.identity(),
        "inputs": tuple(infos),
        "skipped_inputs": plan.skipped,
        "warnings": (*warnings, *plan.skipped_warning),
        "empty": tuple(empty),
        "empty_before": tuple(empty_before),
        "eod_id": eod_id(tok, config.eod),
    }
