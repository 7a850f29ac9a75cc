"""``tokenize_inputs``: input files -> ``TokenizedSamples`` in flat buffers, in parallel processes.

The main process reads the files sequentially and cuts them into chunks (raw JSONL bytes with their first
line number, or Arrow record batches of Parquet rows); worker processes parse and tokenize each chunk and
send back flat numpy arrays (tokens, loss mask, lengths, rows). Results are joined in chunk order, so the
output does not depend on the worker count.

The workers are :class:`longpack.text.workers.WorkerPool` processes: plain interpreters that import only
longpack, so a script calling this without an ``if __name__ == "__main__":`` guard works under every
multiprocessing start method (``spawn`` and ``forkserver`` would run such a script again in each child).
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import mmap
import os
import re
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack.samples import TokenizedSamples
from longpack.text import inputs as _inputs
from longpack.text import workers as _workers
from longpack.text.errors import InputError
from longpack.text.inputs import (
    first_jsonl_rows,
    input_kind,
    jsonl_chunks,
    resolve_inputs,
    sha256_file,
)
from longpack.text.rows import RowError, TextConfig, detect_format, sample_from_row
from longpack.text.tokenizers import Tokenizer, as_tokenizer, load_tokenizer, register_tokenizer

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
    tokenizer: str  # spec: loaded (or registered) in the process that runs the job


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


def _list_parts(col: Any) -> tuple[np.ndarray, Any] | None:
    """``(lengths int64, flat values)`` of a null-free list column without per-row work, else ``None``."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or arr.null_count:
        return None
    offsets = np.asarray(arr.offsets)  # zero-copy view (int32 or int64), sliced with the array
    values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if values.null_count:
        return None
    return np.diff(offsets).astype(np.int64, copy=False), values


def _arrow_pretokenized(table: Any, vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Vectorized pretokenized rows from Arrow columns, or ``None`` if any row needs the per-row path.

    Tokens and mask come back as zero-copy views of the Arrow buffers where the types allow (the caller
    copies them once into the joined buffers).
    """
    import pyarrow as pa

    names = table.schema.names
    if "input_ids" not in names or table.num_rows == 0:
        return None
    ids = _list_parts(table.column("input_ids"))
    if ids is None or not pa.types.is_integer(ids[1].type):
        return None
    lengths, values = ids
    if (lengths < 2).any():
        return None
    tokens = values.to_numpy(zero_copy_only=False)
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        return None
    mask: np.ndarray
    if "loss_mask" in names and table.column("loss_mask").null_count < table.num_rows:
        got = _list_parts(table.column("loss_mask"))
        if got is None:
            return None
        mlen, mvals = got
        vt = mvals.type
        if not (pa.types.is_integer(vt) or pa.types.is_boolean(vt)) or not np.array_equal(mlen, lengths):
            return None
        mask = mvals.to_numpy(zero_copy_only=False)
        if mask.dtype.itemsize == 1 and mask.dtype != np.bool_:
            mask = mask.view(np.uint8)  # int8 -1 reads as 255 and fails the range check below
        if len(mask) and (int(mask.min()) < 0 or int(mask.max()) > 1):
            return None
        mask = mask.astype(np.uint8, copy=False)
    else:
        mask = np.ones(len(tokens), dtype=np.uint8)
    return tokens, mask, lengths


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
            ids, mask = sample_from_row(row, job.fmt, job.config, tok)
        except RowError as e:
            _malformed(job, row_no, str(e), malformed)
            return
        flat_ids.fromlist(ids)
        if isinstance(mask, bytearray):
            flat_mask.frombytes(mask)
        else:
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


def _plain_pages(n: int, dtype: Any) -> np.ndarray:
    """An uninitialized 1-D array on private anonymous pages: committed only as they are written.

    Not ``np.empty``: numpy advises the kernel to back large arrays with huge pages, and faulting in GiBs of
    those (zeroing 2 MiB pages, compacting memory for them) made reading 1M samples take 2x as long here.
    """
    itemsize = np.dtype(dtype).itemsize
    pages = mmap.mmap(-1, max(n * itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype=dtype, count=n)


class _Growable:
    """A 1-D buffer filled chunk by chunk in place.

    With an upper bound on the final size (``reserve``) it is mapped once and only the pages written are
    ever committed, so the joined data costs 1x its size; ``finish`` returns the filled prefix. Without
    one it grows by doubling into fresh, untouched pages.
    """

    def __init__(self, dtype: Any, reserve: int | None = None) -> None:
        self._arr = np.empty(0, dtype=dtype)
        if reserve:
            with contextlib.suppress(MemoryError, OSError):  # the bound is loose; else grow as without one
                self._arr = _plain_pages(reserve, dtype)
        if len(self._arr) == 0:
            self._arr = _plain_pages(1 << 16, dtype)
        self._n = 0

    def extend(self, values: np.ndarray) -> None:
        need = self._n + len(values)
        if need > len(self._arr):
            grown = _plain_pages(max(need, 2 * len(self._arr)), self._arr.dtype)
            grown[: self._n] = self._arr[: self._n]
            self._arr = grown
        self._arr[self._n : need] = values
        self._n = need

    def finish(self) -> np.ndarray:
        return self._arr[: self._n]


class _Collector:
    """Joins chunk results in order as they arrive, then forgets them."""

    def __init__(self, n_files: int, token_dtype: Any, reserve: int | None = None) -> None:
        self.tokens = _Growable(token_dtype, reserve)
        self.loss_mask = _Growable(np.uint8, reserve)
        self.lengths: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []
        self.file_of: list[np.ndarray] = []
        self.malformed: list[tuple[int, int, str]] = []
        self.rows_per_file = [0] * n_files

    def add(self, file_index: int, out: _ChunkOut) -> None:
        self.tokens.extend(out.tokens)
        self.loss_mask.extend(out.loss_mask)
        self.lengths.append(out.lengths)
        self.rows.append(out.rows)
        self.file_of.append(np.full(len(out.lengths), file_index, dtype=np.int32))
        self.malformed += [(file_index, r, reason) for r, reason in out.malformed]
        self.rows_per_file[file_index] += out.rows_read


# A pretokenized JSONL row in its plain form: {"input_ids": [ints], "loss_mask": [ints]?} and nothing else.
# Such lines are parsed by numpy without a Python int per token; any other line sends its whole chunk down
# the per-row json path, which also reports errors with their line.
_PRETOKENIZED_LINE = re.compile(
    rb'\s*\{\s*"input_ids"\s*:\s*\[([^\]"]*)\]\s*(?:,\s*"loss_mask"\s*:\s*\[([^\]"]*)\]\s*)?\}\s*'
)


def _parse_int_lists(groups: list[bytes]) -> tuple[np.ndarray, np.ndarray] | None:
    """Values and per-group lengths of comma-separated integer groups, or ``None`` if any is irregular."""
    lengths = np.array([g.count(b",") + 1 if g.strip() else 0 for g in groups], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            values = np.fromstring(
                b",".join(g for g in groups if g.strip()).decode("ascii"), dtype=np.int64, sep=","
            )
        except (ValueError, DeprecationWarning):
            return None
    if len(values) != int(lengths.sum()):
        return None
    return values, lengths


def _fast_pretokenized(job: _Job, tok: Tokenizer) -> _ChunkOut | None:
    """Clean pretokenized chunks without a Python object per token (Arrow columns, or numpy text parsing)."""
    if job.kind == "parquet":
        got = _arrow_pretokenized(job.payload, tok.vocab_size)
        row_numbers = np.arange(job.first_row, job.first_row + job.payload.num_rows, dtype=np.int64)
    else:
        id_groups: list[bytes] = []
        mask_groups: list[bytes | None] = []
        rows: list[int] = []
        for k, line in enumerate(job.payload.split(b"\n")):
            if not line.strip():
                continue
            m = _PRETOKENIZED_LINE.fullmatch(line)
            if m is None:
                return None
            id_groups.append(m.group(1))
            mask_groups.append(m.group(2))
            rows.append(job.first_row + k)
        if not rows:
            return None
        parsed = _parse_int_lists(id_groups)
        if parsed is None:
            return None
        tokens, lengths = parsed
        if all(g is None for g in mask_groups):
            mask = np.ones(len(tokens), dtype=np.uint8)
        elif all(g is not None for g in mask_groups):
            parsed_mask = _parse_int_lists([g for g in mask_groups if g is not None])
            if parsed_mask is None or not np.array_equal(parsed_mask[1], lengths):
                return None
            if len(parsed_mask[0]) and (parsed_mask[0].min() < 0 or parsed_mask[0].max() > 1):
                return None
            mask = parsed_mask[0].astype(np.uint8)
        else:
            return None
        if (lengths < 2).any() or (
            len(tokens) and (int(tokens.max()) >= tok.vocab_size or int(tokens.min()) < 0)
        ):
            return None
        got = (tokens, mask, lengths)
        row_numbers = np.array(rows, dtype=np.int64)
    if got is None:
        return None
    tokens, mask, lengths = got
    # No cast here: the range check above passed, and the collector casts while it copies into its buffer.
    return _ChunkOut(
        tokens=tokens,
        loss_mask=mask,
        lengths=lengths,
        rows=row_numbers,
        malformed=[],
        rows_read=len(row_numbers),
    )


def _inline_file(kind: str, fmt: str | None) -> bool:
    # Pretokenized Parquet is a few vectorized Arrow calls per batch: shipping it to a worker costs more.
    return fmt is None or (kind == "parquet" and fmt == "pretokenized")


def _inline(job: _Job) -> bool:
    return _inline_file(job.kind, job.fmt)


def _parquet_batches(path: Path, fmt: str | None = None) -> Iterator[tuple[int, Any]]:
    """``(first_row, record batch)`` pieces of a Parquet file, in row order."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable Parquet file ({e}); check the file") from e
    names = pf.schema_arrow.names
    columns = None
    if fmt == "pretokenized" and "input_ids" in names:
        # Only the columns a pretokenized row uses (a text column next to them would cost more than the
        # tokens). Batches stay small: measured, 2048-row batches decode faster than 16k-row batches or whole
        # row groups on threads, and hold far less memory.
        columns = [c for c in ("input_ids", "loss_mask") if c in names]
    first = 0
    for batch in pf.iter_batches(batch_size=_inputs.PARQUET_CHUNK_ROWS, columns=columns):
        yield first, batch
        first += batch.num_rows


def _token_bound(path: Path, kind: str, fmt: str | None) -> int | None:
    """An upper bound on the tokens a pretokenized file holds, from its metadata or size (else ``None``).

    Parquet: the ``input_ids`` leaf values of every row group (null and empty lists count there too, so it
    is never less). JSONL: a token needs a digit and a separator, so at most ``(size + 1) // 2`` tokens.
    """
    if fmt is None:
        return 0
    if fmt != "pretokenized":
        return None
    if kind == "jsonl":
        return (path.stat().st_size + 1) // 2
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception:
        return None
    leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == "input_ids"]
    if len(leaf) != 1:
        return None
    return sum(meta.row_group(g).column(leaf[0]).num_values for g in range(meta.num_row_groups))


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
        raise InputError(
            f"{path}: none of the first {seen} non-blank lines is a JSON object, so the format cannot be detected; "
            "fix the file (the line errors come with --format set) or pass the format explicitly"
        )
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
    tokenizer: str | Tokenizer | Any,
    config: TextConfig,
    workers: int | None = None,
    progress: bool = False,
) -> TokenizeResult:
    """Read and tokenize every row of ``inputs`` (files, folders, globs) into flat buffers.

    ``tokenizer`` is a spec string (``"qwen3"``, ``"bytes"``, a ``tokenizer.json`` or a model folder) or a
    loaded tokenizer (see :func:`longpack.text.tokenizers.as_tokenizer`). ``workers`` processes (default:
    all cores; 1 runs inline) tokenize chunks of rows; the result is byte-identical for any worker count. Bad rows raise ``InputError`` naming ``file:line`` (unless
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
    tok = register_tokenizer(as_tokenizer(tokenizer))
    paths = resolve_inputs(inputs)
    n_workers = default_workers() if workers is None else int(workers)
    if n_workers < 1:
        raise InputError(f"workers={workers} must be >= 1 (or None for all cores)", fields="workers")
    kinds = [input_kind(p) for p in paths]
    formats = [_file_format(p, k, config) for p, k in zip(paths, kinds, strict=True)]
    hashers = [hashlib.sha256() for _ in paths]
    # Parquet inputs are hashed on a thread while they are read (hashlib releases the GIL).
    hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longpack-sha256")
    parquet_digests = {
        i: hash_pool.submit(sha256_file, p) for i, p in enumerate(paths) if kinds[i] == "parquet"
    }
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
                for first, batch in _parquet_batches(path, fmt):
                    nbytes = size * batch.num_rows // total_rows
                    yield i, _Job(kind, files[i], first, batch, fmt, config, tok.spec), nbytes

    token_dtype = np.int32 if tok.vocab_size <= np.iinfo(np.int32).max else np.int64
    bounds = [_token_bound(p, k, f) for p, k, f in zip(paths, kinds, formats, strict=True)]
    # With a bound for every file the joined buffers are allocated once and filled in place.
    reserve = None if any(b is None for b in bounds) else sum(b or 0 for b in bounds)
    sink = _Collector(len(paths), token_dtype, reserve)
    total_bytes = sum(p.stat().st_size for p in paths)
    bar = _Bar(progress, total=total_bytes)
    # Starting worker processes costs about a second; inputs of one or two chunks are faster inline.
    inline = (
        n_workers == 1
        or total_bytes <= 2 * _inputs.JSONL_CHUNK_BYTES
        or all(_inline_file(k, f) for k, f in zip(kinds, formats, strict=True))
    )
    try:
        if inline:
            for i, job, nbytes in jobs():
                sink.add(i, _process(job))
                bar.advance(nbytes)
        else:
            # Fresh interpreters, not forks of this process (no fork of a parent holding threads or a used
            # Rust tokenizer) and not multiprocessing children (which would run the caller's __main__ again);
            # each loads the tokenizer as it starts.
            with _workers.WorkerPool(
                n_workers,
                target="longpack.text.pipeline:_process",
                initializer="longpack.text.tokenizers:register_tokenizer",
                initargs=(tok.portable(),),
            ) as pool:
                pending: deque[tuple[int, Future[_ChunkOut], int]] = deque()
                try:
                    for i, job, nbytes in jobs():
                        if _inline(job):
                            while pending:
                                fi, fut, nb = pending.popleft()
                                sink.add(fi, fut.result())
                                bar.advance(nb)
                            sink.add(i, _process(job))
                            bar.advance(nbytes)
                            continue
                        pending.append((i, pool.submit(job), nbytes))
                        while len(pending) > 2 * n_workers + 2:
                            fi, fut, nb = pending.popleft()
                            sink.add(fi, fut.result())
                            bar.advance(nb)
                    while pending:
                        fi, fut, nb = pending.popleft()
                        sink.add(fi, fut.result())
                        bar.advance(nb)
                except BaseException:
                    pool.shutdown(cancel=True)
                    raise
    except BaseException:
        # Queued hashes are only worth finishing when the run succeeds; on success they are awaited below.
        hash_pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        bar.close()

    rows_read = sum(sink.rows_per_file)
    malformed = tuple((f"{files[i]}:{r}", reason) for i, r, reason in sink.malformed)
    if rows_read == 0:
        raise InputError(f"no rows in the inputs ({', '.join(files)}): every file is empty; check the inputs")
    lengths = np.concatenate(sink.lengths) if sink.lengths else np.zeros(0, np.int64)
    if len(lengths) == 0:
        first = f" (first: {malformed[0][0]}: {malformed[0][1]})" if malformed else ""
        raise InputError(f"all {rows_read} rows were malformed and skipped{first}; check the format and keys")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    samples = TokenizedSamples(
        tokens=sink.tokens.finish(),
        loss_mask=sink.loss_mask.finish(),
        offsets=offsets,
        source_file=np.concatenate(sink.file_of),
        source_row=np.concatenate(sink.rows),
        files=files,
    )
    per_file_rows = sink.rows_per_file
    input_info = []
    for i, (path, kind) in enumerate(zip(paths, kinds, strict=True)):
        digest = hashers[i].hexdigest() if kind == "jsonl" else parquet_digests[i].result()
        input_info.append(
            {
                "path": files[i],
                "size_bytes": path.stat().st_size,
                "sha256": digest,
                "format": formats[i],
                "rows": per_file_rows[i],
            }
        )
    hash_pool.shutdown(wait=True)
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


# Per-chunk entry points for other executors (the Ray backend, ``longpack.cluster``): the same code the
# local pool runs, so a chunk's samples do not depend on where it was tokenized.
ChunkTokens = _ChunkOut


def detect_file_format(path: Path, config: TextConfig) -> str | None:
    """Format of one input file as ``tokenize_inputs`` decides it (``None`` for an empty file).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "a.jsonl"; _ = p.write_text('{"prompt": "a", "completion": "b"}\\n')
    >>> detect_file_format(p, TextConfig())
    'prompt_completion'
    """
    return _file_format(path, input_kind(path), config)


def tokenize_chunk(
    *,
    kind: str,
    file: str,
    first_row: int,
    payload: Any,
    fmt: str,
    config: TextConfig,
    tokenizer: str | Tokenizer,
) -> ChunkTokens:
    """Parse and tokenize one chunk of rows (JSONL bytes starting at 1-based line ``first_row``, or an Arrow
    record batch whose first row is 0-based row ``first_row``), exactly as ``tokenize_inputs`` does.
    ``tokenizer``: a spec string or what :meth:`~longpack.text.tokenizers.Tokenizer.portable` gave.

    >>> c = tokenize_chunk(kind="jsonl", file="x.jsonl", first_row=1, payload=b'{"input_ids": [4, 5]}\\n',
    ...     fmt="pretokenized", config=TextConfig(), tokenizer="bytes")
    >>> c.tokens.tolist(), c.lengths.tolist(), c.rows.tolist()
    ([4, 5], [2], [1])
    """
    spec = register_tokenizer(tokenizer).spec
    return _process(_Job(kind, file, first_row, payload, fmt, config, spec))
