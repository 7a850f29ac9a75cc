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

from longpack import _optional
from longpack.samples import TokenizedSamples
from longpack.text import inputs as _inputs
from longpack.text import workers as _workers
from longpack.text.errors import InputError
from longpack.text.inputs import (
    MAX_JSON_DEPTH,
    InputFile,
    find_inputs,
    first_jsonl_rows,
    json_too_deep,
    jsonl_chunks,
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


@dataclass(frozen=True)
class _Job:
    kind: str  # "jsonl" | "parquet" (Arrow batches: Parquet files and datasets folders)
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
    turn_keys: dict[str, int] = {}  # conversation turn keys nothing reads, e.g. "messages[].weight"

    def add(row_no: int, row: Any) -> None:
        try:
            ids, mask = sample_from_row(row, job.fmt, job.config, tok, turn_keys)
        except RowError as e:
            _malformed(job, row_no, str(e), malformed)
            return
        except RecursionError:
            _malformed(job, row_no, f"a value nested deeper than {MAX_JSON_DEPTH} levels", malformed)
            return
        flat_ids.fromlist(ids)
        if isinstance(mask, bytearray):
            flat_mask.frombytes(mask)
        else:
            flat_mask.fromlist(mask)
        lengths.append(len(ids))
        rows.append(row_no)

    columns: dict[str, int] = {}
    if job.kind == "jsonl":
        for k, line in enumerate(job.payload.split(b"\n")):
            if not line.strip():
                continue
            rows_read += 1
            row_no = job.first_row + k
            if json_too_deep(line):
                _malformed(job, row_no, f"JSON nested deeper than {MAX_JSON_DEPTH} levels", malformed)
                continue
            try:
                row = json.loads(line)
            except UnicodeDecodeError as e:
                _malformed(job, row_no, f"not UTF-8 ({e.reason} at byte {e.start})", malformed)
                continue
            except json.JSONDecodeError as e:
                _malformed(job, row_no, f"invalid JSON ({e.msg} at column {e.colno})", malformed)
                continue
            except RecursionError:
                _malformed(job, row_no, f"JSON nested deeper than {MAX_JSON_DEPTH} levels", malformed)
                continue
            if isinstance(row, dict):
                for key in row:
                    columns[key] = columns.get(key, 0) + 1
            add(row_no, row)
    else:  # Arrow sources: columns are counted from the file's schema
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
        columns={**columns, **turn_keys},
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
        self.columns: list[dict[str, int]] = [{} for _ in range(n_files)]

    def add(self, file_index: int, out: _ChunkOut) -> None:
        self.tokens.extend(out.tokens)
        self.loss_mask.extend(out.loss_mask)
        self.lengths.append(out.lengths)
        self.rows.append(out.rows)
        self.file_of.append(np.full(len(out.lengths), file_index, dtype=np.int32))
        self.malformed += [(file_index, r, reason) for r, reason in out.malformed]
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


def _inline_file(kind: str, fmt: str | None) -> bool:
    # Pretokenized Parquet is a few vectorized Arrow calls per batch: shipping it to a worker costs more.
    return fmt is None or (kind == "parquet" and fmt == "pretokenized")


def _inline(job: _Job) -> bool:
    return _inline_file(job.kind, job.fmt)


def _parquet_file(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
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
    if fmt == "pretokenized" and "input_ids" in names:
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
    if fmt != "pretokenized" or source.kind == "hf" or source.compression is not None:
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
    if source.kind in ("parquet", "hf"):
        names, num_rows = _arrow_schema(source)
        if num_rows == 0:
            return None
        if config.format != "auto":
            return config.format
        try:
            return detect_format([dict.fromkeys(names)], config)
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

    token_dtype = np.int32 if tok.vocab_size <= np.iinfo(np.int32).max else np.int64
    bounds = [_token_bound(f, fmt) for f, fmt in zip(sources, formats, strict=True)]
    # With a bound for every file the joined buffers are allocated once and filled in place.
    reserve = None if any(b is None for b in bounds) else sum(b or 0 for b in bounds)
    sink = _Collector(len(paths), token_dtype, reserve)
    total_bytes = sum(sizes)
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
    malformed_per_file = [0] * len(paths)
    for i, _, _ in sink.malformed:
        malformed_per_file[i] += 1
    input_info = []
    warnings_out: list[str] = []
    for i, (source, kind) in enumerate(zip(sources, kinds, strict=True)):
        digest = hashers[i].hexdigest() if kind == "jsonl" else arrow_digests[i].result()
        if kind in ("parquet", "hf"):
            names, num_rows = _arrow_schema(source)
            counts = dict.fromkeys(names, num_rows)
        else:
            counts = sink.columns[i]
        columns, col_warnings = column_report(files[i], formats[i], config, counts, per_file_rows[i])
        warnings_out += col_warnings
        shown_kind = (
            "json_array"
            if kind == "jsonl" and formats[i] is not None and _starts_array(source.path)
            else kind
        )
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
                    yield first + k, None, f"invalid JSON ({e.msg} at column {e.colno})"
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
    n = 0
    for _, blob in jsonl_chunks(source.path, hashlib.sha256()):
        n += sum(1 for line in blob.split(b"\n") if line.strip())
    return n
