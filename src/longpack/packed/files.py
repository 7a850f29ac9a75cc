"""Packed Parquet files on disk: names, atomic writes, and Megatron-Bridge's path rule. No torch.

Layout of one output folder (``N`` = pack size, in runtime tokens)::

    training_<N>.idx.parquet                 one file when the split fits in one shard, else
    training_<N>.part-00000-of-00003.idx.parquet, ...   (sorted name order = row order)
    validation_<N>.idx.parquet               same naming, only with a validation split
    <N>_metadata.jsonl                       one JSON array, one dict per split (train first)
    manifest.json                            written last; its absence marks an unfinished output

The glob ``training_<N>*.idx.parquet`` matches both forms, and Megatron-Bridge's reader sorts a glob, so it
is always a valid ``packed_train_data_path``. Reading a folder back is
:class:`longpack.packed.folder.PackedFolder`'s job.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import hashlib
import io
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from longpack.errors import PackedDataError

ROW_GROUP_SIZE = 500
SPLITS = ("training", "validation")
#: The columns Megatron-Bridge reads; any other column is ignored.
REQUIRED_COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
PARQUET_SUFFIXES = (".parquet", ".pq")


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


# -- Megatron-Bridge's path rule ---------------------------------------------------------------------
# Bridge (``data/packing/paths.py``) reads every Parquet file a spec names: a folder gives all its
# ``*.parquet``/``*.pq`` files, so training and validation shards in one folder are read together. longpack's
# own reader (:class:`longpack.packed.folder.PackedFolder`) opens a folder per split instead and uses this
# rule only for what a user names explicitly (a file or a glob), where it must read what Bridge would read.


def is_parquet_name(path: str | os.PathLike[str]) -> bool:
    """True for a name ending ``.parquet`` or ``.pq``, any case.

    >>> [is_parquet_name(p) for p in ("a.idx.parquet", "B.PQ", "a.npy")]
    [True, True, False]
    """
    return str(path).lower().endswith(PARQUET_SUFFIXES)


def is_packed_parquet_file(path: str | os.PathLike[str]) -> bool:
    """True for Megatron-Bridge packed Parquet names: ``*.idx.parquet`` or ``*.idx.pq``, any case.

    >>> [is_packed_parquet_file(p) for p in ("data.idx.parquet", "DATA.IDX.PQ", "data.parquet")]
    [True, True, False]
    """
    return str(path).lower().endswith((".idx.parquet", ".idx.pq"))


def _has_glob_magic(spec: str) -> bool:
    return any(ch in spec for ch in "*?[")


def is_packed_parquet_spec(spec: str | os.PathLike[str]) -> bool:
    """Whether a path spec names packed Parquet data (Bridge's test): a Parquet name, a Parquet glob, a folder,
    or anything that resolves to Parquet files.

    >>> is_packed_parquet_spec("shards/part_*.parquet"), is_packed_parquet_spec("train.npy")
    (True, False)
    """
    text = os.fspath(spec)
    lowered = text.lower()
    if is_parquet_name(text) or os.path.isdir(text):
        return True
    if _has_glob_magic(text) and (".parquet" in lowered or ".pq" in lowered):
        return True
    try:
        return bool(resolve_packed_parquet_paths(text))
    except PackedDataError:
        return False


def resolve_packed_parquet_paths(spec: str | os.PathLike[str]) -> list[str]:
    """The Parquet files a spec names, exactly as Megatron-Bridge resolves ``packed_train_data_path``.

    - A literal path whose only glob character is ``[`` and that is an existing Parquet file: itself.
    - A glob: the matches ending ``.parquet``/``.pq``, **sorted**; none is an error.
    - A folder: the sorted union of its ``*.parquet`` and ``*.pq`` files (every split!); none is an error.
    - A single file: ``[]`` without a Parquet extension; an error if it does not exist.

    Errors are :class:`~longpack.errors.PackedDataError` with Bridge's wording.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> for name in ("b.idx.parquet", "a.idx.parquet", "notes.txt"):
    ...     _ = open(os.path.join(d, name), "wb").close()
    >>> [os.path.basename(p) for p in resolve_packed_parquet_paths(d)], resolve_packed_parquet_paths("x.npy")
    (['a.idx.parquet', 'b.idx.parquet'], [])
    """
    text = os.fspath(spec)
    if "[" in text and not any(ch in text for ch in "*?") and os.path.isfile(text) and is_parquet_name(text):
        return [text]
    if _has_glob_magic(text):
        matches = sorted(p for p in globlib.glob(text) if is_parquet_name(p))
        if not matches:
            raise PackedDataError(f"No Parquet files found matching pattern: {text}")
        return matches
    if os.path.isdir(text):
        base = globlib.escape(text)
        found = sorted(
            set(globlib.glob(os.path.join(base, "*.parquet"))) | set(globlib.glob(os.path.join(base, "*.pq")))
        )
        if not found:
            raise PackedDataError(f"No Parquet files found in directory: {text}")
        return found
    if not is_parquet_name(text):
        return []
    if not os.path.isfile(text):
        raise PackedDataError(f"Packed Parquet file not found: {text}")
    return [text]


def resolve_packed_parquet_paths_with_retry(
    spec: str | os.PathLike[str], *, attempts: int = 10, sleep_s: float = 1.0
) -> list[str]:
    """:func:`resolve_packed_parquet_paths` with retries for NFS caches (Megatron-Bridge issue #4207).

    Before each retry (sleeping ``attempt * sleep_s``) it lists the nearest existing ancestor folder, which
    refreshes NFS attribute caches, as Bridge does at dataset build time.
    """
    last: PackedDataError | None = None
    for attempt in range(attempts):
        try:
            return resolve_packed_parquet_paths(spec)
        except PackedDataError as exc:
            last = exc
            if attempt + 1 == attempts:
                break
            ancestor = Path(os.fspath(spec)).parent
            while not ancestor.exists() and ancestor != ancestor.parent:
                ancestor = ancestor.parent
            with contextlib.suppress(OSError):
                os.listdir(ancestor)
            time.sleep((attempt + 1) * sleep_s)
    assert last is not None
    raise last
