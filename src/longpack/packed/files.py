"""Packed Parquet files on disk: names, atomic writes, path specs, row checks (spec §2.7). No torch.

Layout of one output folder (``N`` = pack size, in runtime tokens)::

    training_<N>.idx.parquet                 one file when the split fits in one shard, else
    training_<N>.part-00000-of-00003.idx.parquet, ...   (sorted name order = row order)
    validation_<N>.idx.parquet               same naming, only with a validation split
    <N>_metadata.jsonl                       one JSON array, one dict per split (train first)
    manifest.json                            written last; its absence marks an unfinished output

The glob ``training_<N>*.idx.parquet`` matches both forms, and Megatron-Bridge's reader sorts a glob, so it
is always a valid ``packed_train_data_path``.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import io
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP_SIZE = 500
SPLITS = ("training", "validation")
REQUIRED_COLUMNS = ("input_ids", "loss_mask", "seq_start_id")


def default_rows_per_shard(pack_size: int) -> int:
    """Rows per shard: about 2**27 runtime tokens (~0.5-1 GB on disk), a multiple of 500, at least 500.

    >>> default_rows_per_shard(4096), default_rows_per_shard(131072)
    (32500, 1000)
    """
    return max(ROW_GROUP_SIZE, (2**27 // pack_size) // ROW_GROUP_SIZE * ROW_GROUP_SIZE)


def shard_names(split: str, pack_size: int, num_shards: int) -> list[str]:
    """File names of a split's shards.

    >>> shard_names("training", 4096, 1)
    ['training_4096.idx.parquet']
    >>> shard_names("validation", 8, 2)
    ['validation_8.part-00000-of-00002.idx.parquet', 'validation_8.part-00001-of-00002.idx.parquet']
    """
    if num_shards <= 1:
        return [f"{split}_{pack_size}.idx.parquet"]
    return [f"{split}_{pack_size}.part-{i:05d}-of-{num_shards:05d}.idx.parquet" for i in range(num_shards)]


def split_spec(split: str, pack_size: int, num_shards: int) -> str:
    """The path spec (relative to the output folder) a Megatron-Bridge config should use for a split.

    >>> split_spec("training", 4096, 1), split_spec("training", 4096, 3)
    ('training_4096.idx.parquet', 'training_4096.part-*.idx.parquet')
    """
    return (
        shard_names(split, pack_size, 1)[0] if num_shards <= 1 else f"{split}_{pack_size}.part-*.idx.parquet"
    )


def metadata_name(pack_size: int) -> str:
    """``<N>_metadata.jsonl``.

    >>> metadata_name(4096)
    '4096_metadata.jsonl'
    """
    return f"{pack_size}_metadata.jsonl"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """Temporary sibling of ``path`` (same folder, so the final rename is atomic)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def commit_file(tmp: Path, path: Path) -> None:
    """fsync ``tmp``, rename it onto ``path``, fsync the folder."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "x.json"
    >>> atomic_write_bytes(p, b"[]"); p.read_bytes(), sorted(q.name for q in p.parent.iterdir())
    (b'[]', ['x.json'])
    """
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        commit_file(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class HashingWriter(io.RawIOBase):
    """A binary file wrapper that feeds every byte written to a sha256 (a written file need not be re-read).

    With ``background=True`` the hashing and the file write run on one helper thread, in write order, so
    they overlap with whatever produces the bytes (Parquet encoding): ``write`` returns at once. The bytes
    and the digest are the same either way; :meth:`flush` and :meth:`hexdigest` wait for the queue (and
    raise a write error from it).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "x.bin"
    >>> with open(p, "wb") as raw:
    ...     w = HashingWriter(raw, background=True); _ = w.write(b"abc"); _ = w.write(b"de"); w.flush()
    >>> w.hexdigest() == hashlib.sha256(p.read_bytes()).hexdigest(), p.read_bytes(), w.tell()
    (True, b'abcde', 5)
    """

    # Writes queued at most (each one Parquet page or footer piece), so a slow disk holds back the encoder
    # instead of letting encoded bytes pile up in memory.
    MAX_QUEUED = 64

    def __init__(self, raw: Any, *, background: bool = False) -> None:
        super().__init__()
        self._raw = raw
        self._digest = hashlib.sha256()
        self._pos = int(raw.tell())
        self._pool: ThreadPoolExecutor | None = None
        self._queued: deque[Future[None]] = deque()
        if background:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longpack-hash-write")

    def writable(self) -> bool:
        return True

    def _consume(self, data: Any) -> None:
        self._digest.update(data)
        self._raw.write(data)

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if self._pool is None:
            self._consume(data)
        else:
            # pyarrow hands over immutable ``bytes``; anything else is copied before it is queued.
            self._queued.append(
                self._pool.submit(self._consume, data if isinstance(data, bytes) else bytes(data))
            )
            while len(self._queued) > self.MAX_QUEUED:
                self._queued.popleft().result()
        self._pos += n
        return n

    def _drain(self) -> None:
        while self._queued:
            self._queued.popleft().result()

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        self._drain()
        self._raw.flush()

    def close(self) -> None:
        try:
            self._drain()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            super().close()

    def hexdigest(self) -> str:
        self._drain()
        return self._digest.hexdigest()


def open_parquet_writer(path: Path | Any, *, ids_dtype: str = "int64") -> pq.ParquetWriter:
    """A writer with fixed options, so the same rows give the same bytes (``path``: a path or a binary file)."""
    from longpack.packed.rows import arrow_schema

    # Dictionary pages only pay off for the 0/1 mask; token ids mostly fall back to plain after 1 MB anyway.
    return pq.ParquetWriter(
        path,
        arrow_schema(ids_dtype),
        compression="snappy",
        use_dictionary=["loss_mask"],
        write_statistics=False,
    )


def resolve_parquet_spec(spec: str | Path) -> list[Path]:
    """Resolve a packed-Parquet path spec as Megatron-Bridge's reader does (spec §2.7).

    A file is returned as is, a folder yields its sorted ``*.parquet``/``*.pq`` files, a glob is expanded,
    filtered to Parquet names and sorted. Nothing found raises ``ValueError``.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> for name in ("b.idx.parquet", "a.idx.parquet", "notes.txt"):
    ...     _ = (d / name).write_bytes(b"")
    >>> [p.name for p in resolve_parquet_spec(d)], [p.name for p in resolve_parquet_spec(f"{d}/*.idx.parquet")]
    (['a.idx.parquet', 'b.idx.parquet'], ['a.idx.parquet', 'b.idx.parquet'])
    """
    text = str(spec)
    path = Path(text)
    is_parquet = text.lower().endswith((".parquet", ".pq"))
    if path.is_file() and is_parquet:
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.name.lower().endswith((".parquet", ".pq")))
        if not found:
            raise ValueError(f"No Parquet files found in directory {text}")
        return found
    if globlib.has_magic(text):
        found = sorted(Path(p) for p in globlib.glob(text) if p.lower().endswith((".parquet", ".pq")))
        if not found:
            raise ValueError(f"No Parquet files found matching pattern {text}")
        return found
    if not is_parquet:
        return []
    raise ValueError(f"Packed Parquet file not found: {text}")


def iter_row_groups(path: Path, columns: tuple[str, ...] = REQUIRED_COLUMNS) -> Iterator[pa.Table]:
    """Yield each row group of a packed Parquet file as a table of ``columns``."""
    reader = pq.ParquetFile(path)
    missing = [c for c in columns if c not in reader.schema_arrow.names]
    if missing:
        raise ValueError(f"{path}: missing required columns {missing}")
    for i in range(reader.num_row_groups):
        yield reader.read_row_group(i, columns=list(columns))


def list_offsets_values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 ``[R+1]`` starting at 0, flat values) of a list column.

    >>> offsets, values = list_offsets_values(pa.array([[1, 2], [], [3]]))
    >>> offsets.tolist(), values.tolist()
    ([0, 2, 2, 3], [1, 2, 3])
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.flatten())
    return offsets - offsets[0], values


def validate_rows(table: pa.Table) -> list[str]:
    """Row invariants of Megatron-Bridge's ``validate_row`` (spec §2.7), checked for every row at once.

    Returns one message per broken rule with the first offending row (empty list = all rows valid).

    >>> t = pa.table({"input_ids": [[1, 2, 3], [4, 5]], "loss_mask": [[0, 1, 0], [1]],
    ...               "seq_start_id": [[0, 1], [1]]})
    >>> validate_rows(t)  # doctest: +NORMALIZE_WHITESPACE
    ['row 1: loss_mask length 1 != input_ids length 2', 'row 1: seq_start_id must start with 0']
    """
    ids_off, _ = list_offsets_values(table.column("input_ids"))
    mask_off, _ = list_offsets_values(table.column("loss_mask"))
    start_off, starts = list_offsets_values(table.column("seq_start_id"))
    ids_len = np.diff(ids_off)
    mask_len = np.diff(mask_off)
    start_len = np.diff(start_off)
    errors = []
    bad = np.flatnonzero(ids_len != mask_len)
    if len(bad):
        r = int(bad[0])
        errors.append(f"row {r}: loss_mask length {int(mask_len[r])} != input_ids length {int(ids_len[r])}")
    first = np.full(len(start_len), -1, dtype=np.int64)
    has = start_len > 0
    first[has] = starts[start_off[:-1][has]]
    bad = np.flatnonzero(first != 0)
    if len(bad):
        errors.append(f"row {int(bad[0])}: seq_start_id must start with 0")
    if len(starts):
        row_of = np.repeat(np.arange(len(start_len)), start_len)
        bad = np.flatnonzero(starts >= ids_len[row_of])
        if len(bad):
            r = int(row_of[bad[0]])
            errors.append(f"row {r}: seq_start_id {int(starts[bad[0]])} >= len(input_ids) {int(ids_len[r])}")
        step = np.diff(starts)
        same_row = row_of[1:] == row_of[:-1]
        bad = np.flatnonzero(same_row & (step < 0))
        if len(bad):
            errors.append(f"row {int(row_of[bad[0]])}: seq_start_id is not non-decreasing")
    return errors
