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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from longpack import _optional, choices
from longpack.errors import OutputError
from longpack.outputs import map_scratch, new_scratch_file, sha256_file, write_array
from longpack.progress import ProgressBar
from longpack.samples import TokenizedSamples
from longpack.text import inputs as _inputs
from longpack.text import workers as _workers
from longpack.text.errors import EmptyDocument, InputError
from longpack.text.inputs import (
    MAX_JSON_DEPTH,
    InputFile,
    find_inputs,
    first_jsonl_rows,
    json_too_deep,
    jsonl_chunks,
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
    - ``inputs``: one dict per input file: ``path``, ``size_bytes``, ``sha256``, ``format``, ``rows``,
      ``malformed`` (rows of this file), ``kind`` (``jsonl``, ``json_array``, ``parquet``, ``hf``),
      ``compression`` and ``columns``: ``{"used": [...], "ignored": {column: rows that have it}}``.
    - ``skipped_inputs``: ``(path, reason)`` of every path found in folders and globs but not read.
    - ``warnings``: what the run report should show (an ignored column that carries meaning, e.g. ``tools``
      next to prompt/completion rows, ``images``, per-sample ``weight``), with counts.
    """

    samples: TokenizedSamples
    format: str
    rows_read: int
    malformed: tuple[tuple[str, str], ...]
    tokenizer: dict[str, Any]
    inputs: tuple[dict[str, Any], ...]
    skipped_inputs: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    #: Tokens kept in ``spill_dir`` files instead of memory (``tokenize_inputs(memory_budget=...)``); 0 if none.
    spilled_tokens: int = 0
    #: ``format="text"`` rows whose text tokenizes to no token (``file:line``): no document, as in
    #: Megatron-LM's ``preprocess_data.py`` (:class:`~longpack.text.errors.EmptyDocument`).
    empty: tuple[str, ...] = ()
    #: For each of ``empty``: how many samples come before it (where ``preprocess_data.py``'s index holds
    #: the empty document: a document index entry with no sequence).
    empty_before: tuple[int, ...] = ()
    #: The id that ends documents (``format="text"`` with ``append_eod``): ``TextConfig.eod`` resolved, or
    #: the tokenizer's EOS (``None`` in results made before it was recorded: the EOS).
    eod_id: int | None = None


@dataclass(frozen=True)
class _Job:
    kind: (
        str  # "jsonl" | "parquet" (Arrow batches: Parquet files and datasets folders) | "txt" (one document)
    )
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
    columns: dict[str, int] = field(default_factory=dict)  # column -> rows of the chunk that have it
    #: empty documents: (row, samples of the chunk before it)
    empty: list[tuple[int, int]] = field(default_factory=list)


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
    if job.fmt == choices.PRETOKENIZED_FORMAT:
        if job.kind == "jsonl" and _scanner() is not None:
            token_dtype = np.int64 if tok.vocab_size > 2**31 - 1 else np.int32
            return _scanned_chunk(job, tok, _scan(job.payload, tok.vocab_size, token_dtype), job.first_row)
        fast = _fast_pretokenized(job, tok)
        if fast is not None:
            return fast
    rows = _Rows(job, tok)
    if job.kind == "txt":
        _document_row(job, rows)
    elif job.kind == "jsonl":
        for k, line in enumerate(job.payload.split(b"\n")):
            if line.strip():
                rows.add_line(job.first_row + k, line)
    else:  # Arrow sources: columns are counted from the file's schema
        for k, row in enumerate(job.payload.to_pylist()):
            rows.rows_read += 1
            rows.add(job.first_row + k, row)
    return rows.finish()


class _Rows:
    """Rows of one chunk parsed one by one (``json.loads`` + ``sample_from_row``), in flat buffers."""

    def __init__(self, job: _Job, tok: Tokenizer) -> None:
        self.job = job
        self.tok = tok
        # array.fromlist converts a row's Python ints in one C loop, about twice as fast as np.array(list).
        self.wide = tok.vocab_size > 2**31 - 1
        self.flat_ids = array.array("q" if self.wide else "i")
        self.flat_mask = array.array("B")
        self.lengths: list[int] = []
        self.rows: list[int] = []
        self.rows_read = 0
        self.malformed: list[tuple[int, str]] = []
        self.empty: list[tuple[int, int]] = []
        self.columns: dict[str, int] = {}
        self.turn_keys: dict[str, int] = {}  # conversation turn keys nothing reads, e.g. "messages[].weight"

    def add_line(self, row_no: int, line: bytes) -> bool:
        """One non-blank JSON Lines line; ``False`` if it is malformed (recorded, or raised)."""
        job, malformed = self.job, self.malformed
        self.rows_read += 1
        if json_too_deep(line):
            _malformed(job, row_no, f"JSON nested deeper than {MAX_JSON_DEPTH} levels", malformed)
            return False
        try:
            row = json.loads(line)
        except UnicodeDecodeError as e:
            _malformed(job, row_no, f"not UTF-8 ({e.reason} at byte {e.start})", malformed)
            return False
        except json.JSONDecodeError as e:
            _malformed(job, row_no, f"invalid JSON ({json_error_text(e)})", malformed)
            return False
        except RecursionError:
            _malformed(job, row_no, f"JSON nested deeper than {MAX_JSON_DEPTH} levels", malformed)
            return False
        if isinstance(row, dict):
            columns = self.columns
            for key in row:
                columns[key] = columns.get(key, 0) + 1
        return self.add(row_no, row)

    def add(self, row_no: int, row: Any) -> bool:
        job = self.job
        try:
            ids, mask = sample_from_row(row, job.fmt, job.config, self.tok, self.turn_keys)
        except EmptyDocument:
            self.empty.append((row_no, len(self.lengths)))
            return False
        except RowError as e:
            _malformed(job, row_no, str(e), self.malformed)
            return False
        except RecursionError:
            _malformed(job, row_no, f"a value nested deeper than {MAX_JSON_DEPTH} levels", self.malformed)
            return False
        self.flat_ids.fromlist(ids)
        if isinstance(mask, bytearray):
            self.flat_mask.frombytes(mask)
        else:
            self.flat_mask.fromlist(mask)
        self.lengths.append(len(ids))
        self.rows.append(row_no)
        return True

    def finish(self) -> _ChunkOut:
        return _ChunkOut(
            tokens=np.frombuffer(self.flat_ids, dtype=np.int64 if self.wide else np.int32),
            loss_mask=np.frombuffer(self.flat_mask, dtype=np.uint8),
            lengths=np.array(self.lengths, dtype=np.int64),
            rows=np.array(self.rows, dtype=np.int64),
            malformed=self.malformed,
            rows_read=self.rows_read,
            columns={**self.columns, **self.turn_keys},
            empty=self.empty,
        )


# -- the compiled pre-tokenized scanner (text/_native.c) ---------------------------------------------------


def _scanner() -> Any:
    """``longpack.text._native`` (built with the package), or ``None``: then pre-tokenized JSON Lines go
    through the numpy text fast path below and the per-row path."""
    return _optional.native("longpack.text._native")


@dataclass
class _Scan:
    """What the compiled scanner found in one chunk: accepted rows in buffers (``tokens``, ``mask``,
    ``lengths``, 0-based ``lines`` within the chunk), the lines it left to ``json.loads`` (``declined``:
    ``(start, end, line)``), other keys of accepted rows (``keys``: ``(row, start, end)``) and how many
    newlines the chunk holds."""

    data: Any
    tokens: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    lines: np.ndarray
    newlines: int
    with_mask: int
    declined: list[tuple[int, int, int]]
    keys: list[tuple[int, int, int]]


class _ScanBuffers:
    """Output buffers the scanner fills for chunks of up to ``size`` bytes (reused chunk after chunk)."""

    def __init__(self, size: int, token_dtype: Any) -> None:
        cap_tokens, cap_rows = (size + 1) // 2, size // 19 + 2
        self.size = size
        self.tokens = np.empty(cap_tokens, dtype=token_dtype)
        self.mask = np.empty(cap_tokens, dtype=np.uint8)
        self.lengths = np.empty(cap_rows, dtype=np.int64)
        self.lines = np.empty(cap_rows, dtype=np.int64)


def _scan(data: Any, vocab_size: int, token_dtype: Any, buffers: _ScanBuffers | None = None) -> _Scan:
    """Run the compiled scanner over one chunk (no GIL: chunks scan in parallel on threads)."""
    size = memoryview(data).nbytes
    if buffers is None or buffers.size < size:
        buffers = _ScanBuffers(size, token_dtype)
    rows, ntok, newlines, with_mask, declined, keys = _scanner().scan_pretokenized(
        data, vocab_size, buffers.tokens, buffers.mask, buffers.lengths, buffers.lines
    )
    return _Scan(
        data=data,
        tokens=buffers.tokens[:ntok],
        mask=buffers.mask[:ntok],
        lengths=buffers.lengths[:rows],
        lines=buffers.lines[:rows],
        newlines=newlines,
        with_mask=with_mask,
        declined=declined,
        keys=keys,
    )


def _scanned_chunk(job: _Job, tok: Tokenizer, scan: _Scan, first_row: int) -> _ChunkOut:
    """A chunk's samples from a scan: accepted rows as they are, declined lines through the per-row
    ``json.loads`` path (which reads them, or reports them with ``file:line``), all in line order.

    ``tokens`` and ``loss_mask`` may be views of the scan's buffers: use them before the buffers scan the
    next chunk (``_Collector.add`` copies them); the other arrays are the result's own."""
    n = len(scan.lengths)
    columns: dict[str, int] = {}
    if n:
        columns["input_ids"] = n
        if scan.with_mask:
            columns["loss_mask"] = scan.with_mask
    if scan.keys:
        data = bytes(memoryview(scan.data))
        for _, start, end in scan.keys:
            name = data[start:end].decode("utf-8")
            columns[name] = columns.get(name, 0) + 1
    rows = scan.lines + first_row
    if not scan.declined:
        return _ChunkOut(
            tokens=scan.tokens,
            loss_mask=scan.mask,
            lengths=scan.lengths.copy(),
            rows=rows,
            malformed=[],
            rows_read=n,
            columns=columns,
        )
    # Declined lines are read one by one; their samples go between the accepted rows, in line order.
    slow = _Rows(job, tok)
    view = memoryview(scan.data)
    ends = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(scan.lengths, out=ends[1:])
    pieces_tok: list[np.ndarray] = []
    pieces_mask: list[np.ndarray] = []
    pieces_len: list[np.ndarray] = []
    pieces_row: list[np.ndarray] = []
    done = 0  # accepted rows placed so far
    for start, end, line in scan.declined:
        upto = int(np.searchsorted(scan.lines, line))
        if upto > done:
            pieces_tok.append(scan.tokens[ends[done] : ends[upto]])
            pieces_mask.append(scan.mask[ends[done] : ends[upto]])
            pieces_len.append(scan.lengths[done:upto])
            pieces_row.append(rows[done:upto])
            done = upto
        before = len(slow.lengths)
        got = len(slow.flat_ids)
        if slow.add_line(first_row + line, bytes(view[start:end])):
            # slices of the array.array are copies: no buffer export that would pin its size
            pieces_tok.append(np.frombuffer(slow.flat_ids[got:], dtype=scan.tokens.dtype))
            pieces_mask.append(np.frombuffer(slow.flat_mask[got:], dtype=np.uint8))
            pieces_len.append(np.array(slow.lengths[before:], dtype=np.int64))
            pieces_row.append(np.array(slow.rows[before:], dtype=np.int64))
    if done < n:
        pieces_tok.append(scan.tokens[ends[done] :])
        pieces_mask.append(scan.mask[ends[done] :])
        pieces_len.append(scan.lengths[done:])
        pieces_row.append(rows[done:])
    for name, count in {**slow.columns, **slow.turn_keys}.items():
        columns[name] = columns.get(name, 0) + count

    def joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

    return _ChunkOut(
        tokens=joined(pieces_tok, scan.tokens.dtype),
        loss_mask=joined(pieces_mask, np.uint8),
        lengths=joined(pieces_len, np.int64),
        rows=joined(pieces_row, np.int64),
        malformed=slow.malformed,
        rows_read=n + len(scan.declined),
        columns=columns,
    )


#: Inputs up to this size (bytes as stored) are tokenized in this process, without worker processes.
INLINE_BYTES = 16 << 20

#: Bytes per chunk of the threaded pre-tokenized reader (the scanner's buffers hold ~3.5x this).
SCAN_CHUNK_BYTES = 4 << 20


def _scan_jsonl_file(
    path: Path,
    label: str,
    hasher: Any,
    tok: Tokenizer,
    config: TextConfig,
    threads: int,
    on_chunk: Any,
) -> None:
    """A plain (uncompressed) pre-tokenized JSON Lines file, read in order, scanned on ``threads`` threads.

    The main thread reads blocks into reused buffers and cuts them at the last newline; a helper thread
    feeds them to ``hasher`` (the input's sha256) while the compiled scanner parses them on the other
    threads, without the GIL, straight into reused token buffers. Chunks are then joined in file order
    (``on_chunk(chunk, nbytes)``), which is also where line numbers become known (each scan counts its
    newlines) and where declined lines go through ``json.loads``, so errors name ``file:line`` as before.
    """
    token_dtype = np.int64 if tok.vocab_size > 2**31 - 1 else np.int32
    size = path.stat().st_size
    block = max(1, min(SCAN_CHUNK_BYTES, size + 1))
    job = _Job("jsonl", label, 1, b"", choices.PRETOKENIZED_FORMAT, config, tok.spec)
    n_slots = 2 * threads + 2
    free: list[list[Any]] = [[bytearray(block), _ScanBuffers(block, token_dtype)] for _ in range(n_slots)]
    pending: deque[tuple[list[Any], Future[_Scan], Future[None], int]] = deque()
    line = 1

    def collect() -> None:
        nonlocal line
        slot, scanned, hashed, nbytes = pending.popleft()
        scan = scanned.result()
        hashed.result()
        on_chunk(_scanned_chunk(job, tok, scan, line), nbytes)
        line += scan.newlines
        free.append(slot)

    scan_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="longpack-scan")
    hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longpack-sha256")
    try:
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in finally
        except OSError as e:
            raise InputError(
                f"{path}: cannot open ({e.strerror or e}); check the path and its permissions"
            ) from e
        try:
            carry = b""
            offset = 0  # bytes of the file read so far
            start = 0  # where the first chunk's text starts (past a UTF-8 BOM)
            while True:
                if not free:
                    collect()
                slot = free.pop()
                buf = slot[0]
                c = len(carry)
                if c * 2 > len(buf):  # a line longer than half a buffer: grow this slot
                    buf = slot[0] = bytearray(2 * c + block)
                view = memoryview(buf)
                view[:c] = carry
                got = c
                try:
                    while got < len(buf):
                        n = f.readinto(view[got:])
                        if not n:
                            break
                        got += n
                except OSError as e:
                    raise InputError(
                        f"{path}: read error near byte {offset} ({e.strerror or e}); check the disk or copy the "
                        "file again"
                    ) from e
                fresh = got - c
                hashed = hash_pool.submit(hasher.update, view[c:got])
                if offset == 0 and buf.startswith(_inputs._BOM):
                    start = len(_inputs._BOM)
                offset += fresh
                at_end = got < len(buf)  # a short read: the end of the file
                if at_end:
                    end = got
                else:
                    cut = buf.rfind(b"\n", 0, got)
                    if cut < 0:  # no line ends in this buffer yet: keep reading into a larger one
                        hashed.result()
                        carry = bytes(view[:got])
                        free.append(slot)
                        continue
                    end = cut + 1
                carry = bytes(view[end:got])
                if slot[1].size < end - start:
                    slot[1] = _ScanBuffers(len(buf), token_dtype)
                scanned = scan_pool.submit(_scan, view[start:end], tok.vocab_size, token_dtype, slot[1])
                pending.append((slot, scanned, hashed, fresh))
                start = 0
                if at_end:
                    break
            while pending:
                collect()
        finally:
            f.close()
    finally:
        scan_pool.shutdown(wait=True, cancel_futures=True)
        hash_pool.shutdown(wait=True, cancel_futures=True)


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


def json_error_text(exc: json.JSONDecodeError) -> str:
    """``msg at column N`` of a JSON error (``json``'s own messages may end in "at": "Unterminated string
    starting at" gives "... starting at column 5", not "at at").

    >>> import json
    >>> try: json.loads('{"a": "x')
    ... except json.JSONDecodeError as e: json_error_text(e)
    'Unterminated string starting at column 7'
    """
    msg = exc.msg[: -len(" at")] if exc.msg.endswith(" at") else exc.msg
    return f"{msg} at column {exc.colno}"


class _TokenStore:
    """Tokens and loss mask of the samples read so far, in order: in memory, or, once they would take more
    than ``budget`` bytes, appended to two files in ``spill_dir`` (what was in memory is moved there first).

    ``finish`` returns the two arrays: in memory, or read-only memory maps of the files (pages come from
    the page cache as the packer reads them and are never the process's own memory).
    """

    def __init__(
        self, token_dtype: Any, reserve: int | None, budget: int | None = None, spill_dir: Path | None = None
    ) -> None:
        self.dtype = np.dtype(token_dtype)
        self.tokens = _Growable(token_dtype, reserve)
        self.mask = _Growable(np.uint8, reserve)
        self.budget = budget if spill_dir is not None else None
        self.spill_dir = spill_dir
        self.files: tuple[Any, Any] | None = None
        self.paths: tuple[Path, Path] | None = None
        self.n = 0

    @property
    def spilled(self) -> bool:
        return self.files is not None

    def extend(self, tokens: np.ndarray, mask: np.ndarray) -> None:
        need = (self.n + len(tokens)) * (self.dtype.itemsize + 1)
        if self.files is None and self.budget is not None and need > self.budget:
            with self._scratch_errors():
                self._spill()
        if self.files is not None:
            with self._scratch_errors():
                write_array(self.files[0], np.ascontiguousarray(tokens, dtype=self.dtype))
                write_array(self.files[1], np.ascontiguousarray(mask, dtype=np.uint8))
        else:
            self.tokens.extend(tokens)
            self.mask.extend(mask)
        self.n += len(tokens)

    @contextlib.contextmanager
    def _scratch_errors(self) -> Iterator[None]:
        # A full disk or a read-only folder while spilling is about the output's place, not the inputs.
        try:
            yield
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise OutputError(
                f"{self.spill_dir}: cannot write the scratch copy of the tokens ({reason}); free space "
                "there or raise --memory-budget"
            ) from exc

    def _spill(self) -> None:
        assert self.spill_dir is not None
        # New files, created exclusively: never one a live memory map still reads (longpack.outputs).
        (tokens_path, tokens_file), (mask_path, mask_file) = (
            new_scratch_file(self.spill_dir, "tokens"),
            new_scratch_file(self.spill_dir, "loss_mask"),
        )
        self.paths = (tokens_path, mask_path)
        self.files = (tokens_file, mask_file)
        write_array(self.files[0], self.tokens.finish())  # fh.write: a full disk keeps its errno
        write_array(self.files[1], self.mask.finish())
        self.tokens = _Growable(self.dtype)  # the in-memory copy is released
        self.mask = _Growable(np.uint8)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        if self.files is None:
            return self.tokens.finish(), self.mask.finish()
        assert self.paths is not None
        with self._scratch_errors():  # the last buffered bytes are written here: a full disk shows now
            for f in self.files:
                f.close()
        # Mapped only once written whole and closed, and only at the size written (a short file would
        # end the process by SIGBUS when the rows are filled).
        return map_scratch(self.paths[0], self.dtype, self.n), map_scratch(self.paths[1], np.uint8, self.n)

    def close(self) -> None:
        if self.files is not None:
            for f in self.files:
                f.close()


class _Collector:
    """Joins chunk results in order as they arrive, then forgets them."""

    def __init__(
        self,
        n_files: int,
        token_dtype: Any,
        reserve: int | None = None,
        *,
        budget: int | None = None,
        spill_dir: Path | None = None,
    ) -> None:
        self.store = _TokenStore(token_dtype, reserve, budget, spill_dir)
        self.lengths: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []
        self.file_of: list[np.ndarray] = []
        self.malformed: list[tuple[int, int, str]] = []
        self.empty: list[tuple[int, int, int]] = []  # (file, row, samples before it)
        self.samples = 0
        self.rows_per_file = [0] * n_files
        self.columns: list[dict[str, int]] = [{} for _ in range(n_files)]

    def add(self, file_index: int, out: _ChunkOut) -> None:
        self.store.extend(out.tokens, out.loss_mask)
        self.lengths.append(out.lengths)
        self.rows.append(out.rows)
        self.file_of.append(np.full(len(out.lengths), file_index, dtype=np.int32))
        self.malformed += [(file_index, r, reason) for r, reason in out.malformed]
        self.empty += [(file_index, r, self.samples + k) for r, k in out.empty]
        self.samples += len(out.lengths)
        self.rows_per_file[file_index] += out.rows_read
        seen = self.columns[file_index]
        for name, n in out.columns.items():
            seen[name] = seen.get(name, 0) + n


# A pretokenized JSONL row in its plain form: {"input_ids": [ints], "loss_mask": [ints]?} and nothing else,
# written in exactly the JSON grammar (JSON whitespace is space, tab, CR, LF; an integer has no "+", no
# leading zero, no fraction or exponent). Such lines are parsed by numpy without a Python int per token; any
# other line sends its whole chunk down the per-row json path, which accepts exactly what json.loads accepts
# and reports the rest with its line. Integers of 19+ digits also go that way (int64 cannot hold them all).
_JWS = rb"[ \t\r\n]*"
_JINT = rb"-?(?:0|[1-9][0-9]{0,17})"
_JINTS = rb"(?:" + _JWS + _JINT + _JWS + rb"(?:," + _JWS + _JINT + _JWS + rb")*|" + _JWS + rb")"
_PRETOKENIZED_LINE = re.compile(
    _JWS
    + rb"\{"
    + _JWS
    + rb'"input_ids"'
    + _JWS
    + rb":"
    + _JWS
    + rb"\[("
    + _JINTS
    + rb")\]"
    + _JWS
    + rb"(?:,"
    + _JWS
    + rb'"loss_mask"'
    + _JWS
    + rb":"
    + _JWS
    + rb"\[("
    + _JINTS
    + rb")\]"
    + _JWS
    + rb")?\}"
    + _JWS
)


def _parse_int_lists(groups: list[bytes]) -> tuple[np.ndarray, np.ndarray] | None:
    """Values and per-group lengths of comma-separated integer groups (already checked against the JSON
    grammar by ``_PRETOKENIZED_LINE``), or ``None`` if numpy reads them differently."""
    lengths = np.array([g.count(b",") + 1 if g.strip(b" \t\r\n") else 0 for g in groups], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            values = np.fromstring(
                b",".join(g for g in groups if g.strip(b" \t\r\n")).decode("ascii"), dtype=np.int64, sep=","
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
    if job.kind == "jsonl":
        columns = {"input_ids": len(row_numbers)}
        with_mask = sum(g is not None for g in mask_groups)
        if with_mask:
            columns["loss_mask"] = with_mask
    else:
        columns = {}  # Arrow sources: counted from the file's schema (the fast path reads 2 columns)
    # No cast here: the range check above passed, and the collector casts while it copies into its buffer.
    return _ChunkOut(
        tokens=tokens,
        loss_mask=mask,
        lengths=lengths,
        rows=row_numbers,
        malformed=[],
        rows_read=len(row_numbers),
        columns=columns,
    )


#: Marks a file ``tokenize_inputs`` reads with ``_scan_jsonl_file`` instead of in chunk jobs.
_SCAN_FILE: Any = _Job("scan", "", 0, b"", choices.PRETOKENIZED_FORMAT, TextConfig(), "")


def _inline_file(kind: str, fmt: str | None) -> bool:
    # Pretokenized Parquet is a few vectorized Arrow calls per batch: shipping it to a worker costs more.
    return fmt is None or (kind == "parquet" and fmt == choices.PRETOKENIZED_FORMAT)


def _inline(job: _Job) -> bool:
    return _inline_file(job.kind, job.fmt)


def _parquet_file(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(os.path.abspath(path))  # relative 's3:x.parquet' would be a URI
    except OSError as e:
        raise InputError(
            f"{path}: cannot read ({e.strerror or e}); check the path and its permissions"
        ) from e
    except Exception as e:
        raise InputError(f"{path}: not a readable Parquet file ({e}); check the file") from e


def _arrow_columns(fmt: str | None, names: Sequence[str]) -> list[str] | None:
    # Only the columns a pretokenized row uses (a text column next to them would cost more than the
    # tokens). Batches stay small: measured, 2048-row batches decode faster than 16k-row batches or whole
    # row groups on threads, and hold far less memory.
    if fmt == choices.PRETOKENIZED_FORMAT and "input_ids" in names:
        return [c for c in ("input_ids", "loss_mask") if c in names]
    return None


def _parquet_batches(path: Path, fmt: str | None = None) -> Iterator[tuple[int, Any]]:
    """``(first_row, record batch)`` pieces of a Parquet file, in row order, row group by row group (a
    damaged page is reported with its row group)."""
    import pyarrow as pa

    pf = _parquet_file(path)
    columns = _arrow_columns(fmt, pf.schema_arrow.names)
    first = 0
    for g in range(pf.metadata.num_row_groups):
        start = first
        try:
            for batch in pf.iter_batches(
                batch_size=_inputs.PARQUET_CHUNK_ROWS, row_groups=[g], columns=columns
            ):
                yield first, batch
                first += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            rows = pf.metadata.row_group(g).num_rows
            raise InputError(
                f"{path}: row group {g} (rows {start}-{start + rows - 1}) cannot be read ({e}); the file is "
                "damaged: re-create or re-download it"
            ) from e


def _hf_dataset(path: Path) -> Any:
    """The ``datasets.Dataset`` saved in a ``save_to_disk`` folder (memory-mapped, nothing copied)."""
    datasets = _optional.require("datasets", "hf", purpose=f"reading the datasets folder {path}")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise InputError(
            f"{path}: datasets cannot load this save_to_disk folder ({e}); check the folder"
        ) from e
    if isinstance(ds, datasets.DatasetDict):
        raise InputError(
            f"{path}: a DatasetDict folder with splits {sorted(ds)}; pass one split's folder ({path}/SPLIT)"
        )
    return ds


def _hf_batches(path: Path, fmt: str | None = None) -> Iterator[tuple[int, Any]]:
    """``(first_row, Arrow table)`` pieces of a ``datasets`` folder, in row order."""
    ds = _hf_dataset(path)
    columns = _arrow_columns(fmt, ds.column_names)
    if columns is not None:
        ds = ds.select_columns(columns)
    first = 0
    for batch in ds.with_format("arrow").iter(batch_size=_inputs.PARQUET_CHUNK_ROWS):
        yield first, batch
        first += batch.num_rows


def _hf_files(path: Path) -> list[Path]:
    """The Arrow data files of a ``datasets`` folder, in order (from its ``state.json``)."""
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        return [path / f["filename"] for f in state.get("_data_files", [])]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}/state.json: cannot read the datasets folder's file list ({e})") from e


def _hf_digest(path: Path) -> tuple[str, int]:
    """sha256 over the folder's data files in order, and their total size."""
    h = hashlib.sha256()
    size = 0
    for f in _hf_files(path):
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
                size += len(block)
    return h.hexdigest(), size


def _arrow_schema(source: InputFile) -> tuple[list[str], int]:
    """Column names and row count of an Arrow source (Parquet file or datasets folder)."""
    if source.kind == "hf":
        ds = _hf_dataset(source.path)
        return list(ds.column_names), len(ds)
    pf = _parquet_file(source.path)
    return list(pf.schema_arrow.names), pf.metadata.num_rows


def _token_bound(source: InputFile, fmt: str | None) -> int | None:
    """An upper bound on the tokens a pretokenized file holds, from its metadata or size (else ``None``).

    Parquet: the ``input_ids`` leaf values of every row group (null and empty lists count there too, so it
    is never less). JSONL: a token needs a digit and a separator, so at most ``(size + 1) // 2`` tokens (not
    known for compressed files).
    """
    if fmt is None:
        return 0
    if fmt != choices.PRETOKENIZED_FORMAT or source.kind == "hf" or source.compression is not None:
        return None
    if source.kind == "jsonl":
        return (source.path.stat().st_size + 1) // 2
    try:
        meta = _parquet_file(source.path).metadata
    except InputError:
        return None
    leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == "input_ids"]
    if len(leaf) != 1:
        return None
    return sum(meta.row_group(g).column(leaf[0]).num_values for g in range(meta.num_row_groups))


def _file_format(source: InputFile | Path, kind: str | None, config: TextConfig) -> str | None:
    """Format of one input (``None`` for an empty one)."""
    if isinstance(source, Path):
        source = _inputs._input_file(source)
    path = source.path
    if source.kind == "txt":  # one plain-text document
        if config.format not in (choices.AUTO_FORMAT, choices.TEXT_FORMAT):
            raise InputError(
                f"{path}: a plain-text file is one document; read it with format text (--format text)"
            )
        return choices.TEXT_FORMAT if path.stat().st_size else None
    if source.kind in ("parquet", "hf"):
        names, num_rows = _arrow_schema(source)
        if num_rows == 0:
            return None
        if config.format != choices.AUTO_FORMAT:
            return config.format
        try:
            return detect_format([dict.fromkeys(names)], config)
        except RowError as e:
            raise InputError(f"{path}: {e}; or pass format=... (--format)", fields=e.fields) from e
    rows, seen = first_jsonl_rows(path)
    if seen == 0:
        return None
    if config.format != choices.AUTO_FORMAT:
        return config.format
    if not rows:
        raise InputError(
            f"{path}: none of the first {seen} non-blank lines is a JSON object, so the format cannot be detected; "
            "fix the file (the line errors come with --format set) or pass the format explicitly"
        )
    try:
        return detect_format(rows, config)
    except RowError as e:
        raise InputError(f"{path}: {e}; or pass format=... (--format)", fields=e.fields) from e


def _document_bytes(path: Path, hasher: Any) -> bytes:
    """A plain-text file's bytes, hashed as read (the whole file is one document)."""
    raw = path.read_bytes()
    hasher.update(raw)
    return raw


def _document_row(job: _Job, rows: _Rows) -> None:
    """Row 1 of a plain-text file: ``{text_key: its text}``, or malformed when it is not UTF-8."""
    rows.rows_read += 1
    try:
        text = bytes(job.payload).decode("utf-8")
    except UnicodeDecodeError as e:
        _malformed(job, 1, f"not UTF-8 ({e.reason} at byte {e.start})", rows.malformed)
        return
    key = job.config.text_key
    rows.columns[key] = 1
    rows.add(1, {key: text})


def _starts_array(path: Path) -> bool:
    """Whether a JSON file's text is one JSON array (its first non-blank byte is ``[``)."""
    for block in _inputs._blocks(path, hashlib.sha256(), 1 << 12, [1]):
        head = block[3:] if block.startswith(b"\xef\xbb\xbf") else block
        stripped = head.lstrip(b" \t\r\n")
        if stripped:
            return stripped.startswith(b"[")
    return False


#: Columns that carry meaning for training when a format ignores them: a warning names them with counts.
MEANINGFUL_COLUMNS = {
    "tools": "tool definitions (read by the chat and sharegpt formats)",
    "functions": "function definitions (name the column with tools_key / --tools-key to use them)",
    "images": "images (text formats do not read them; use the VLM pipeline)",
    "image": "an image (text formats do not read it; use the VLM pipeline)",
    "videos": "videos (text formats do not read them)",
    "audio": "audio (text formats do not read it)",
    "weight": "a per-sample weight (longpack does not weight samples; filter or repeat them with mixing)",
    "weights": "per-sample weights (longpack does not weight samples)",
    "sample_weight": "a per-sample weight (longpack does not weight samples)",
    "loss_weight": "a per-sample loss weight (longpack does not weight samples)",
    "loss_mask": "a loss mask (only the pretokenized format reads it)",
    "labels": "labels (only input_ids/loss_mask are read by the pretokenized format)",
    "system": "a system prompt (read by the sharegpt format; put it into messages for chat)",
    "messages": "a conversation (read by the chat format)",
    "conversations": "a conversation (read by the sharegpt format)",
    "chosen": "a preferred answer (preference data: SFT reads prompt/completion or messages only)",
    "rejected": "a rejected answer (preference data: SFT does not train on it)",
}


def column_report(
    path: str, fmt: str | None, config: TextConfig, counts: dict[str, int], rows: int
) -> tuple[dict[str, Any], list[str]]:
    """``{"used": [...], "ignored": {column: rows}}`` of one input and the warnings for ignored columns that
    carry meaning.

    >>> report, warnings = column_report("a.jsonl", "prompt_completion", TextConfig(),
    ...     {"prompt": 3, "completion": 3, "tools": 2, "id": 3}, 3)
    >>> report
    {'used': ['completion', 'prompt'], 'ignored': {'id': 3, 'tools': 2}}
    >>> warnings
    ["a.jsonl: column 'tools' (tool definitions (read by the chat and sharegpt formats)) is ignored in 2 of 3 rows by the prompt_completion format"]
    """
    used_names = set(config.used_columns(fmt)) if fmt else set()
    used = sorted(c for c in counts if c in used_names)
    ignored = {c: counts[c] for c in sorted(counts) if c not in used_names}
    warnings = []
    for c, n in ignored.items():
        base = c.rsplit("].", 1)[-1]  # "messages[].weight": a key of the conversation's turns
        if base in TURN_KEYS_OF_NOTE and "[]." in c:
            warnings.append(
                f"{path}: turn key {c!r} ({TURN_KEYS_OF_NOTE[base]}) is ignored in {n} of {rows} rows"
            )
        elif c in MEANINGFUL_COLUMNS:
            warnings.append(
                f"{path}: column {c!r} ({MEANINGFUL_COLUMNS[c]}) is ignored in {n} of {rows} rows by the {fmt} format"
            )
    return {"used": used, "ignored": ignored}, warnings


#: Keys of conversation turns that carry meaning for training but are not read: warned about with counts.
TURN_KEYS_OF_NOTE = {
    "weight": "a per-turn loss weight (axolotl style); the loss follows chat_loss instead",
    "train": "a per-turn train flag; the loss follows chat_loss instead",
    "loss": "a per-turn loss flag; the loss follows chat_loss instead",
    "images": "images (text formats do not read them; use the VLM pipeline)",
    "image": "an image (text formats do not read it; use the VLM pipeline)",
}


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
    memory_budget: int | None = None,
    spill_dir: str | Path | None = None,
) -> TokenizeResult:
    """Read and tokenize every row of ``inputs`` (files, folders, globs) into flat buffers.

    ``tokenizer`` is a spec string (``"qwen3"``, ``"bytes"``, a ``tokenizer.json`` or a model folder) or a
    loaded tokenizer (see :func:`longpack.text.tokenizers.as_tokenizer`). ``workers`` processes (default:
    all cores; 1 runs inline) tokenize chunks of rows; the result is byte-identical for any worker count.
    Bad rows raise ``InputError`` naming ``file:line`` (unless ``config.skip_malformed``); no rows at all, or
    no usable sample, is an ``InputError`` too.

    With ``memory_budget`` (bytes) and ``spill_dir``, tokens and masks stay in memory only up to that size:
    past it they go to files in ``spill_dir`` and the samples' ``tokens`` / ``loss_mask`` are read-only
    memory maps of them (``spilled_tokens`` says how many); the caller removes ``spill_dir`` when done. The
    values are the same either way.

        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.jsonl"
        >>> _ = p.write_text('{"prompt": "a", "completion": "b"}\\n{"input_ids": [1]}\\n')
        >>> tokenize_inputs([str(p)], tokenizer="bytes", config=TextConfig(), workers=1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        longpack.errors.InputError: ...d.jsonl:2: missing key 'prompt' (prompt); the row has keys ['input_ids']; fix the row or pass --skip-malformed (TextConfig.skip_malformed=True) to skip and count it
        >>> r = tokenize_inputs([str(p)], tokenizer="bytes", config=TextConfig(skip_malformed=True), workers=1)
        >>> r.format, r.rows_read, r.samples.tokens.tolist(), r.samples.loss_mask.tolist(), len(r.malformed)
        ('prompt_completion', 2, [97, 98, 258], [0, 1, 1], 1)
    """
    tok = register_tokenizer(as_tokenizer(tokenizer))
    from longpack.text.documents import eod_id

    eod = eod_id(tok, config.eod)  # a bad text.eod fails now, not in every worker
    listing = find_inputs(inputs)
    sources = list(listing.files)
    paths = [f.path for f in sources]
    n_workers = default_workers() if workers is None else int(workers)
    if n_workers < 1:
        raise InputError(f"workers={workers} must be >= 1 (or None for all cores)", fields="workers")
    kinds = [f.kind for f in sources]
    formats = [_file_format(f, f.kind, config) for f in sources]
    hashers = [hashlib.sha256() for _ in paths]
    # Parquet inputs are hashed on a thread while they are read (hashlib releases the GIL).
    hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longpack-sha256")
    arrow_digests = {
        i: hash_pool.submit(sha256_file if kinds[i] == "parquet" else _hf_digest, p)
        for i, p in enumerate(paths)
        if kinds[i] in ("parquet", "hf")
    }
    files = tuple(f.label for f in sources)
    sizes = [
        p.stat().st_size if k != "hf" else sum(f.stat().st_size for f in _hf_files(p))
        for p, k in zip(paths, kinds, strict=True)
    ]

    def jobs() -> Iterator[tuple[int, _Job, int]]:
        for i, (path, kind, fmt) in enumerate(zip(paths, kinds, formats, strict=True)):
            if fmt is None:
                if kind == "jsonl":  # still hash it
                    for _ in jsonl_chunks(path, hashers[i]):
                        pass
                continue
            if scanned[i]:
                yield i, _SCAN_FILE, sizes[i]  # read, hashed and scanned on threads by _scan_jsonl_file
                continue
            if kind == "txt":  # the whole file is row 1 of the text column
                yield (
                    i,
                    _Job("txt", files[i], 1, _document_bytes(path, hashers[i]), fmt, config, tok.spec),
                    sizes[i],
                )
                continue
            if kind == "jsonl":
                # Progress counts bytes of the file as stored: a compressed file's (unknown) text size is
                # not that, so it advances once, when the file is done (the -1 entry carries no job).
                plain = sources[i].compression is None
                for first, blob in jsonl_chunks(path, hashers[i], _inputs.JSONL_CHUNK_BYTES):
                    yield (
                        i,
                        _Job("jsonl", files[i], first, blob, fmt, config, tok.spec),
                        len(blob) if plain else 0,
                    )
                if not plain:
                    yield -1, None, sizes[i]  # type: ignore[misc]
            else:
                batches = _hf_batches(path, fmt) if kind == "hf" else _parquet_batches(path, fmt)
                total_rows = max(_arrow_schema(sources[i])[1], 1)
                for first, batch in batches:
                    nbytes = sizes[i] * batch.num_rows // total_rows
                    yield i, _Job("parquet", files[i], first, batch, fmt, config, tok.spec), nbytes

    # Plain pre-tokenized JSON Lines files: the compiled scanner on threads (no worker processes, no copies
    # of the text through pipes); compressed files and JSON arrays take the chunk path below.
    scanned = [
        fmt == choices.PRETOKENIZED_FORMAT
        and f.kind == "jsonl"
        and f.compression is None
        and _scanner() is not None
        and not _starts_array(f.path)
        for f, fmt in zip(sources, formats, strict=True)
    ]

    def scan_file(i: int) -> None:
        def on_chunk(out: _ChunkOut, nbytes: int) -> None:
            sink.add(i, out)
            bar.advance(nbytes)

        _scan_jsonl_file(paths[i], files[i], hashers[i], tok, config, max(1, n_workers), on_chunk)

    token_dtype = np.int32 if tok.vocab_size <= np.iinfo(np.int32).max else np.int64
    bounds = [_token_bound(f, fmt) for f, fmt in zip(sources, formats, strict=True)]
    # With a bound for every file the joined buffers are allocated once and filled in place.
    reserve = None if any(b is None for b in bounds) else sum(b or 0 for b in bounds)
    sink = _Collector(
        len(paths),
        token_dtype,
        reserve,
        budget=memory_budget,
        spill_dir=None if spill_dir is None else Path(spill_dir),
    )
    total_bytes = sum(sizes)
    bar = ProgressBar("tokenizing", total_bytes, enabled=progress, in_bytes=True)
    bar.start()
    # Starting a worker process costs ~0.5 CPU-s (an interpreter, numpy, the tokenizer's vocabulary); below
    # INLINE_BYTES one process is as fast in wall time and much cheaper in CPU (the demo: 1.0 CPU-s inline,
    # 2.6 with two workers, for the same ~1 s).
    inline = (
        n_workers == 1
        or total_bytes <= max(INLINE_BYTES, 2 * _inputs.JSONL_CHUNK_BYTES)
        or all(_inline_file(k, f) or fast for k, f, fast in zip(kinds, formats, scanned, strict=True))
    )
    try:
        if inline:
            for i, job, nbytes in jobs():
                if job is _SCAN_FILE:
                    scan_file(i)
                    continue
                if i >= 0:
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
                pending: deque[tuple[int, Future[_ChunkOut] | None, int]] = deque()

                def drain(limit: int) -> None:
                    while len(pending) > limit:
                        fi, fut, nb = pending.popleft()
                        if fut is not None:
                            sink.add(fi, fut.result())
                        bar.advance(nb)

                try:
                    for i, job, nbytes in jobs():
                        if i < 0:
                            pending.append((i, None, nbytes))
                            continue
                        if job is _SCAN_FILE:
                            drain(0)
                            scan_file(i)
                            continue
                        if _inline(job):
                            drain(0)
                            sink.add(i, _process(job))
                            bar.advance(nbytes)
                            continue
                        pending.append((i, pool.submit(job), nbytes))
                        drain(2 * n_workers + 2)
                    drain(0)
                except BaseException:
                    pool.shutdown(cancel=True)
                    raise
    except BaseException:
        # Queued hashes are only worth finishing when the run succeeds; on success they are awaited below.
        hash_pool.shutdown(wait=False, cancel_futures=True)
        sink.store.close()
        raise
    finally:
        bar.close()

    rows_read = sum(sink.rows_per_file)
    malformed = tuple((f"{files[i]}:{r}", reason) for i, r, reason in sink.malformed)
    if rows_read == 0:
        raise InputError(f"no rows in the inputs ({', '.join(files)}): every file is empty; check the inputs")
    lengths = np.concatenate(sink.lengths) if sink.lengths else np.zeros(0, np.int64)
    if len(lengths) == 0:
        raise InputError(no_samples_message(rows_read, malformed, len(sink.empty)))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens, loss_mask = sink.store.finish()
    samples = TokenizedSamples(
        tokens=tokens,
        loss_mask=loss_mask,
        offsets=offsets,
        source_file=np.concatenate(sink.file_of),
        source_row=np.concatenate(sink.rows),
        files=files,
    )
    per_file_rows = sink.rows_per_file
    malformed_per_file = [0] * len(paths)
    for i, _, _ in sink.malformed:
        malformed_per_file[i] += 1
    input_info = []
    warnings_out: list[str] = []
    for i, (source, kind) in enumerate(zip(sources, kinds, strict=True)):
        digest = hashers[i].hexdigest() if kind in ("jsonl", "txt") else arrow_digests[i].result()
        if kind in ("parquet", "hf"):
            names, num_rows = _arrow_schema(source)
            counts = dict.fromkeys(names, num_rows)
        else:
            counts = sink.columns[i]
        columns, col_warnings = column_report(files[i], formats[i], config, counts, per_file_rows[i])
        warnings_out += col_warnings
        shown_kind = report_kind(kind, formats[i], source.path)
        input_info.append(
            {
                "path": files[i],
                "size_bytes": sizes[i],
                "sha256": digest,
                "format": formats[i],
                "rows": per_file_rows[i],
                "malformed": malformed_per_file[i],
                "kind": shown_kind,
                "compression": source.compression,
                "columns": columns,
            }
        )
    hash_pool.shutdown(wait=True)
    if listing.skipped:
        counts_skipped = listing.skipped_summary()
        warnings_out.append(
            "not read: "
            + ", ".join(f"{n} {why}" for why, n in counts_skipped.items())
            + " (each listed under skipped_inputs)"
        )
    used = sorted({f for f in formats if f is not None})
    return TokenizeResult(
        samples=samples,
        format=",".join(used),
        rows_read=rows_read,
        malformed=malformed,
        tokenizer=tok.identity(),
        inputs=tuple(input_info),
        skipped_inputs=listing.skipped,
        warnings=tuple(warnings_out),
        spilled_tokens=sink.store.n if sink.store.spilled else 0,
        empty=tuple(f"{files[i]}:{r}" for i, r, _ in sink.empty),
        empty_before=tuple(k for _, _, k in sink.empty),
        eod_id=eod,
    )


def no_samples_message(rows_read: int, malformed: Sequence[tuple[str, str]], empty: int) -> str:
    """The error when no row gave a sample (every row malformed and skipped, or an empty document).

    >>> no_samples_message(3, [], 3)
    'all 3 rows were empty documents (text that tokenizes to no token); check the text column (text.text_key)'
    """
    if empty and not malformed:
        return (
            f"all {rows_read} rows were empty documents (text that tokenizes to no token); check the text "
            "column (text.text_key)"
        )
    first = f" (first: {malformed[0][0]}: {malformed[0][1]})" if malformed else ""
    also = f", {empty} were empty documents" if empty else ""
    return f"all {rows_read} rows were malformed and skipped{first}{also}; check the format and keys"


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
    return _file_format(path, None, config)


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


def read_rows(source: InputFile, fmt: str | None) -> Iterator[tuple[int, Any, str | None]]:
    """``(row number, row, None)`` or ``(row number, None, why it is malformed)`` for every non-blank row of
    one input, in order, numbered as ``tokenize_inputs`` numbers them (JSONL: 1-based line; JSON array:
    1-based element; Parquet and datasets folders: 0-based row). For previews: one process, no tokens.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "r.jsonl"; _ = p.write_text('{"a": 1}\\n\\n{"a": \\n')
    >>> list(read_rows(_inputs._input_file(p), None))
    [(1, {'a': 1}, None), (3, None, 'invalid JSON (Expecting value at column 7)')]
    """
    if source.kind == "txt":
        try:
            yield 1, {TextConfig().text_key: source.path.read_bytes().decode("utf-8")}, None
        except UnicodeDecodeError as e:
            yield 1, None, f"not UTF-8 ({e.reason} at byte {e.start})"
        return
    if source.kind == "jsonl":
        for first, blob in jsonl_chunks(source.path, hashlib.sha256()):
            for k, line in enumerate(blob.split(b"\n")):
                if not line.strip():
                    continue
                if json_too_deep(line):
                    yield first + k, None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
                    continue
                try:
                    yield first + k, json.loads(line), None
                except UnicodeDecodeError as e:
                    yield first + k, None, f"not UTF-8 ({e.reason} at byte {e.start})"
                except json.JSONDecodeError as e:
                    yield first + k, None, f"invalid JSON ({json_error_text(e)})"
                except RecursionError:
                    yield first + k, None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
        return
    batches = _hf_batches(source.path) if source.kind == "hf" else _parquet_batches(source.path)
    for first, batch in batches:
        for k, row in enumerate(batch.to_pylist()):
            yield first + k, row, None


def count_rows(source: InputFile) -> int:
    """Non-blank rows of one input (Arrow sources: from the metadata)."""
    if source.kind in ("parquet", "hf"):
        return _arrow_schema(source)[1]
    if source.kind == "txt":
        return 1
    n = 0
    for _, blob in jsonl_chunks(source.path, hashlib.sha256()):
        n += sum(1 for line in blob.split(b"\n") if line.strip())
    return n


def report_kind(kind: str, fmt: str | None, path: Path) -> str:
    """An input's ``kind`` as the tokenization report names it: ``json_array`` for a JSON file holding one
    array (read as rows), else its kind (``jsonl``, ``parquet``, ...)."""
    return "json_array" if kind == "jsonl" and fmt is not None and _starts_array(path) else kind


def is_json_array(path: Path) -> bool:
    """Whether a JSON file holds one JSON array (its first non-blank byte is ``[``) rather than JSON Lines.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "rows.json"
    >>> _ = p.write_text(' [{"prompt": "q", "completion": "a"}]')
    >>> is_json_array(p)
    True
    """
    return _starts_array(path)


def arrow_schema(source: InputFile) -> tuple[list[str], int]:
    """Column names and row count of an Arrow source (a Parquet file or a ``datasets`` folder).

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> p = Path(tempfile.mkdtemp()) / "rows.parquet"
    >>> pq.write_table(pa.table({"prompt": ["q"], "completion": ["a"]}), p)
    >>> arrow_schema(InputFile(p, "parquet"))
    (['prompt', 'completion'], 1)
    """
    return _arrow_schema(source)
