"""``tokenize_inputs``: input files -> ``TokenizedSamples`` in flat buffers, in parallel processes.

The main process reads the files sequentially and cuts them into chunks (raw JSONL bytes with their first
line number, or Arrow record batches of Parquet rows); worker processes parse and tokenize each chunk and
send back flat numpy arrays (tokens, loss mask, lengths, rows). Results are joined in chunk order, so the
output does not depend on the worker count.
"""

from __future__ import annotations

import array
import hashlib
import io
import json
import multiprocessing as mp
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack.samples import TokenizedSamples
from longpack.text import inputs as _inputs
from longpack.text.errors import InputError
from longpack.text.inputs import (
    first_jsonl_rows,
    input_kind,
    jsonl_chunks,
    resolve_inputs,
    sha256_file,
)
from longpack.text.rows import RowError, TextConfig, detect_format, row_to_sample
from longpack.text.tokenizers import Tokenizer, load_tokenizer

_SKIP_HINT = "fix the row or pass --skip-malformed (TextConfig.skip_malformed=True) to skip and count it"


@dataclass(frozen=True, kw_only=True)
class TokenizeResult:
    """What ``tokenize_inputs`` returns.

    - ``samples``: the stored samples (flat buffers, provenance per sample).
    - ``format``: the format used; with ``format="auto"`` what was detected. When different input files were
      detected as different formats it is their names joined with ``","`` (e.g. ``"chat,prompt_completion"``);
      each ``inputs`` entry says its own.
    - ``rows_read``: non-blank rows read (including malformed ones).
    - ``malformed``: ``(file:line, reason)`` of every skipped row (only with ``skip_malformed``).
    - ``tokenizer``: identity for the manifest (kind, name/path, file sha256s, eos_id, vocab_size).
    - ``inputs``: one dict per input file: ``path``, ``size_bytes``, ``sha256``, ``format``, ``rows``.
    """

    samples: TokenizedSamples
    format: str
    rows_read: int
    malformed: tuple[tuple[str, str], ...]
    tokenizer: dict[str, Any]
    inputs: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class _Job:
    kind: str  # "jsonl" | "parquet"
    file: str
    first_row: int  # 1-based line (JSONL) or 0-based row (Parquet) of the chunk's first row
    payload: Any  # bytes | pyarrow.RecordBatch
    fmt: str
    config: TextConfig
    tokenizer: str


@dataclass(frozen=True)
class _ChunkOut:
    tokens: np.ndarray
    loss_mask: np.ndarray
    lengths: np.ndarray
    rows: np.ndarray
    malformed: list[tuple[int, str]]
    rows_read: int


def _malformed(job: _Job, row: int, reason: str, sink: list[tuple[int, str]]) -> None:
    if not job.config.skip_malformed:
        raise InputError(f"{job.file}:{row}: {reason}; {_SKIP_HINT}")
    sink.append((row, reason))


def _arrow_pretokenized(table: Any, vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Vectorized pretokenized rows from Arrow columns, or ``None`` if any row needs the per-row path."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.schema.names
    if "input_ids" not in names or table.num_rows == 0:
        return None
    ids_col = table.column("input_ids")
    ids_col = ids_col.combine_chunks() if isinstance(ids_col, pa.ChunkedArray) else ids_col
    if not (pa.types.is_list(ids_col.type) or pa.types.is_large_list(ids_col.type)):
        return None
    if not pa.types.is_integer(ids_col.type.value_type) or ids_col.null_count:
        return None
    lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False).astype(np.int64)
    if (lengths < 2).any():
        return None
    values = pc.list_flatten(ids_col)
    if values.null_count:
        return None
    tokens = values.to_numpy(zero_copy_only=False)
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        return None
    mask: np.ndarray
    if "loss_mask" in names and table.column("loss_mask").null_count < table.num_rows:
        mcol = table.column("loss_mask")
        mcol = mcol.combine_chunks() if isinstance(mcol, pa.ChunkedArray) else mcol
        if not (pa.types.is_list(mcol.type) or pa.types.is_large_list(mcol.type)) or mcol.null_count:
            return None
        vt = mcol.type.value_type
        if not (pa.types.is_integer(vt) or pa.types.is_boolean(vt)):
            return None
        mlen = pc.list_value_length(mcol).to_numpy(zero_copy_only=False)
        if not np.array_equal(mlen, lengths):
            return None
        mvals = pc.list_flatten(mcol)
        if mvals.null_count:
            return None
        mask = mvals.to_numpy(zero_copy_only=False).astype(np.int64)
        if len(mask) and (mask.min() < 0 or mask.max() > 1):
            return None
        mask = mask.astype(np.uint8)
    else:
        mask = np.ones(len(tokens), dtype=np.uint8)
    return tokens.astype(np.int64), mask, lengths


def _process(job: _Job) -> _ChunkOut:
    """Parse and tokenize one chunk (runs in a worker process, or inline with one worker)."""
    tok = load_tokenizer(job.tokenizer)
    malformed: list[tuple[int, str]] = []
    if job.fmt == "pretokenized":
        fast = _fast_pretokenized(job, tok)
        if fast is not None:
            return fast
    # array.fromlist converts a row's Python ints in one C loop, about twice as fast as np.array(list).
    wide = tok.vocab_size > 2**31 - 1
    flat_ids = array.array("q" if wide else "i")
    flat_mask = array.array("B")
    lengths: list[int] = []
    rows: list[int] = []
    rows_read = 0

    def add(row_no: int, row: Any) -> None:
        try:
            ids, mask = row_to_sample(row, job.fmt, job.config, tok)
        except RowError as e:
            _malformed(job, row_no, str(e), malformed)
            return
        flat_ids.fromlist(ids)
        flat_mask.fromlist(mask)
        lengths.append(len(ids))
        rows.append(row_no)

    if job.kind == "jsonl":
        for k, line in enumerate(job.payload.split(b"\n")):
            if not line.strip():
                continue
            rows_read += 1
            row_no = job.first_row + k
            try:
                row = json.loads(line)
            except UnicodeDecodeError as e:
                _malformed(job, row_no, f"not UTF-8 ({e.reason} at byte {e.start})", malformed)
                continue
            except json.JSONDecodeError as e:
                _malformed(job, row_no, f"invalid JSON ({e.msg} at column {e.colno})", malformed)
                continue
            add(row_no, row)
    else:
        for k, row in enumerate(job.payload.to_pylist()):
            rows_read += 1
            add(job.first_row + k, row)
    return _ChunkOut(
        tokens=np.frombuffer(flat_ids, dtype=np.int64 if wide else np.int32),
        loss_mask=np.frombuffer(flat_mask, dtype=np.uint8),
        lengths=np.array(lengths, dtype=np.int64),
        rows=np.array(rows, dtype=np.int64),
        malformed=malformed,
        rows_read=rows_read,
    )


def _fast_pretokenized(job: _Job, tok: Tokenizer) -> _ChunkOut | None:
    """Clean pretokenized chunks go through Arrow without a Python object per token."""
    if job.kind == "parquet":
        table = job.payload
        first = job.first_row
        row_numbers = np.arange(first, first + table.num_rows, dtype=np.int64)
    else:
        blob: bytes = job.payload
        # Line numbers stay exact only if every line is a row: no blank lines, no CR.
        if not blob or b"\n\n" in blob or blob.startswith(b"\n") or b"\r" in blob:
            return None
        import pyarrow.json as pajson

        try:
            table = pajson.read_json(
                io.BytesIO(blob), read_options=pajson.ReadOptions(use_threads=False, block_size=len(blob) + 1)
            )
        except Exception:
            return None  # the per-row path finds and reports the exact line
        n_lines = blob.count(b"\n") + (0 if blob.endswith(b"\n") else 1)
        if table.num_rows != n_lines:
            return None
        row_numbers = np.arange(job.first_row, job.first_row + n_lines, dtype=np.int64)
    got = _arrow_pretokenized(table, tok.vocab_size)
    if got is None:
        return None
    tokens, mask, lengths = got
    return _ChunkOut(
        tokens=tokens,
        loss_mask=mask,
        lengths=lengths,
        rows=row_numbers,
        malformed=[],
        rows_read=len(row_numbers),
    )


def _parquet_batches(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable Parquet file ({e}); check the file") from e
    first = 0
    for batch in pf.iter_batches(batch_size=_inputs.PARQUET_CHUNK_ROWS):
        yield first, batch
        first += batch.num_rows


def _file_format(path: Path, kind: str, config: TextConfig) -> str | None:
    """Format of one file (``None`` for an empty file)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as e:
            raise InputError(f"{path}: not a readable Parquet file ({e}); check the file") from e
        if pf.metadata.num_rows == 0:
            return None
        if config.format != "auto":
            return config.format
        try:
            return detect_format([dict.fromkeys(pf.schema_arrow.names)], config)
        except RowError as e:
            raise InputError(f"{path}: {e}; or pass format=... (--format)") from e
    rows, seen = first_jsonl_rows(path)
    if seen == 0:
        return None
    if config.format != "auto":
        return config.format
    if not rows:
        return "prompt_completion"  # nothing parseable up front: the workers report the bad lines
    try:
        return detect_format(rows, config)
    except RowError as e:
        raise InputError(f"{path}: {e}; or pass format=... (--format)") from e


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def tokenize_inputs(
    inputs: Sequence[str],
    *,
    tokenizer: str,
    config: TextConfig,
    workers: int | None = None,
    progress: bool = False,
) -> TokenizeResult:
    """Read and tokenize every row of ``inputs`` (files, folders, globs) into flat buffers.

    ``workers`` processes (default: all cores; 1 runs inline) tokenize chunks of rows; the result is
    byte-identical for any worker count. Bad rows raise ``InputError`` naming ``file:line`` (unless
    ``config.skip_malformed``); no rows at all, or no usable sample, is an ``InputError`` too.

        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.jsonl"
        >>> _ = p.write_text('{"prompt": "a", "completion": "b"}\\n{"input_ids": [1]}\\n')
        >>> tokenize_inputs([str(p)], tokenizer="bytes", config=TextConfig(), workers=1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        longpack.text.errors.InputError: ...d.jsonl:2: missing key 'prompt' (prompt); the row has keys ['input_ids']; fix the row or pass --skip-malformed (TextConfig.skip_malformed=True) to skip and count it
        >>> r = tokenize_inputs([str(p)], tokenizer="bytes", config=TextConfig(skip_malformed=True), workers=1)
        >>> r.format, r.rows_read, r.samples.tokens.tolist(), r.samples.loss_mask.tolist(), len(r.malformed)
        ('prompt_completion', 2, [97, 98, 258], [0, 1, 1], 1)
    """
    tok = load_tokenizer(tokenizer)
    paths = resolve_inputs(inputs)
    n_workers = default_workers() if workers is None else int(workers)
    if n_workers < 1:
        raise InputError(f"workers={workers} must be >= 1 (or None for all cores)")
    kinds = [input_kind(p) for p in paths]
    formats = [_file_format(p, k, config) for p, k in zip(paths, kinds, strict=True)]
    hashers = [hashlib.sha256() for _ in paths]
    files = tuple(str(p) for p in paths)

    def jobs() -> Iterator[tuple[int, _Job, int]]:
        for i, (path, kind, fmt) in enumerate(zip(paths, kinds, formats, strict=True)):
            if fmt is None:
                if kind == "jsonl":  # still hash it
                    for _ in jsonl_chunks(path, hashers[i]):
                        pass
                continue
            if kind == "jsonl":
                for first, blob in jsonl_chunks(path, hashers[i], _inputs.JSONL_CHUNK_BYTES):
                    yield i, _Job(kind, files[i], first, blob, fmt, config, tok.spec), len(blob)
            else:
                size = path.stat().st_size
                import pyarrow.parquet as pq

                total_rows = max(pq.ParquetFile(path).metadata.num_rows, 1)
                for first, batch in _parquet_batches(path):
                    nbytes = size * batch.num_rows // total_rows
                    yield i, _Job(kind, files[i], first, batch, fmt, config, tok.spec), nbytes

    outs: list[tuple[int, _ChunkOut]] = []
    bar = _Bar(progress, total=sum(p.stat().st_size for p in paths))
    try:
        if n_workers == 1:
            for i, job, nbytes in jobs():
                outs.append((i, _process(job)))
                bar.advance(nbytes)
        else:
            # forkserver: workers start from a clean process that imported this module once (no fork of a
            # parent holding threads or a used Rust tokenizer); each loads the tokenizer as it starts.
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["longpack.text.pipeline"])
            with ProcessPoolExecutor(
                max_workers=n_workers, mp_context=ctx, initializer=load_tokenizer, initargs=(tok.spec,)
            ) as pool:
                pending: deque[tuple[int, Future[_ChunkOut], int]] = deque()
                try:
                    for i, job, nbytes in jobs():
                        pending.append((i, pool.submit(_process, job), nbytes))
                        while len(pending) > 2 * n_workers + 2:
                            fi, fut, nb = pending.popleft()
                            outs.append((fi, fut.result()))
                            bar.advance(nb)
                    while pending:
                        fi, fut, nb = pending.popleft()
                        outs.append((fi, fut.result()))
                        bar.advance(nb)
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        bar.close()

    rows_read = sum(o.rows_read for _, o in outs)
    malformed = tuple((f"{files[i]}:{r}", reason) for i, o in outs for r, reason in o.malformed)
    if rows_read == 0:
        raise InputError(f"no rows in the inputs ({', '.join(files)}): every file is empty; check the inputs")
    lengths = np.concatenate([o.lengths for _, o in outs])
    if len(lengths) == 0:
        first = f" (first: {malformed[0][0]}: {malformed[0][1]})" if malformed else ""
        raise InputError(f"all {rows_read} rows were malformed and skipped{first}; check the format and keys")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    dtype = np.int32 if tok.vocab_size <= np.iinfo(np.int32).max else np.int64
    tokens = np.empty(int(offsets[-1]), dtype=dtype)
    loss_mask = np.empty(int(offsets[-1]), dtype=np.uint8)
    pos = 0
    for _, o in outs:
        n = len(o.tokens)
        tokens[pos : pos + n] = o.tokens
        loss_mask[pos : pos + n] = o.loss_mask
        pos += n
    samples = TokenizedSamples(
        tokens=tokens,
        loss_mask=loss_mask,
        offsets=offsets,
        source_file=np.concatenate([np.full(len(o.lengths), i, dtype=np.int32) for i, o in outs]),
        source_row=np.concatenate([o.rows for _, o in outs]),
        files=files,
    )
    per_file_rows = [0] * len(paths)
    for i, o in outs:
        per_file_rows[i] += o.rows_read
    input_info = []
    for i, (path, kind) in enumerate(zip(paths, kinds, strict=True)):
        digest = hashers[i].hexdigest() if kind == "jsonl" else sha256_file(path)
        input_info.append(
            {
                "path": files[i],
                "size_bytes": path.stat().st_size,
                "sha256": digest,
                "format": formats[i],
                "rows": per_file_rows[i],
            }
        )
    used = sorted({f for f in formats if f is not None})
    return TokenizeResult(
        samples=samples,
        format=",".join(used),
        rows_read=rows_read,
        malformed=malformed,
        tokenizer=tok.identity(),
        inputs=tuple(input_info),
    )


class _Bar:
    """A rich progress bar over input bytes, only on a terminal and only when asked."""

    def __init__(self, enabled: bool, total: int) -> None:
        self._progress: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            console = Console(stderr=True)
            if console.is_terminal:
                self._progress = Progress(
                    TextColumn("tokenizing"),
                    BarColumn(),
                    DownloadColumn(),
                    TimeRemainingColumn(),
                    console=console,
                )
                self._progress.start()
                self._task = self._progress.add_task("tokenize", total=total)

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
