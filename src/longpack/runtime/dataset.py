"""Random access to packed Parquet files in Megatron-Bridge's format (spec ``megatron-packing.md`` §2.7, §3.2).

Columns ``input_ids`` (``list<int>``), ``loss_mask`` (``list<int8>``, label-aligned) and ``seq_start_id``
(``list<int64>``); extra columns are ignored. A dataset spans one file, a folder or a sorted glob of shards.
Readers are opened lazily, once per process, so a dataset built in the parent survives ``DataLoader`` worker
forks; exactly one row group (the last one read) is cached, as Megatron-Bridge does.

This module does I/O with pyarrow and numpy only; it does not import torch, and its items feed
:func:`longpack.runtime.collate.collate_packed` directly.

Example::

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> tmp = tempfile.TemporaryDirectory(); folder = tmp.name
    >>> table = pa.table({"input_ids": [[5, 6, 2, 7, 2]], "loss_mask": pa.array([[1, 1, 0, 1, 0]],
    ...                   pa.list_(pa.int8())), "seq_start_id": [[0, 3]]})
    >>> pq.write_table(table, f"{folder}/train.idx.parquet", row_group_size=500)
    >>> ds = PackedDataset(folder)
    >>> len(ds), ds[0]["seq_boundaries"].tolist(), ds[-1]["loss_mask"].tolist()
    (1, [0, 3, 5], [0, 0, 0, 0, 0])
    >>> ds.close(); tmp.cleanup()
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import itertools
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from longpack.errors import PackedDataError

__all__ = [
    "REQUIRED_COLUMNS",
    "PackedDataset",
    "PackedParquetError",
    "is_packed_parquet_file",
    "is_packed_parquet_spec",
    "resolve_packed_parquet_paths",
    "resolve_packed_parquet_paths_with_retry",
    "validate_row",
]

REQUIRED_COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_GLOB_MAGIC = ("*", "?", "[")


class PackedParquetError(PackedDataError):
    """A packed Parquet path, file or row that Megatron-Bridge could not read."""


def is_packed_parquet_file(path: str | os.PathLike[str]) -> bool:
    """True for Megatron-Bridge packed Parquet names: ``*.idx.parquet`` or ``*.idx.pq``, any case.

    >>> [is_packed_parquet_file(p) for p in ("data.idx.parquet", "DATA.IDX.PQ", "data.parquet")]
    [True, True, False]
    """
    name = str(path).lower()
    return name.endswith(".idx.parquet") or name.endswith(".idx.pq")


def _has_parquet_suffix(path: str) -> bool:
    return path.lower().endswith(_PARQUET_SUFFIXES)


def _has_glob_magic(spec: str) -> bool:
    return any(ch in spec for ch in _GLOB_MAGIC)


def is_packed_parquet_spec(spec: str | os.PathLike[str]) -> bool:
    """Whether a path spec names packed Parquet data: a Parquet name, a Parquet glob, or a directory.

    >>> is_packed_parquet_spec("shards/part_*.parquet"), is_packed_parquet_spec("train.npy")
    (True, False)
    """
    text = str(spec)
    lowered = text.lower()
    if _has_parquet_suffix(text):
        return True
    if _has_glob_magic(text) and (".parquet" in lowered or ".pq" in lowered):
        return True
    if os.path.isdir(text):
        return True
    try:
        return bool(resolve_packed_parquet_paths(text))
    except PackedParquetError:
        return False


def resolve_packed_parquet_paths(spec: str | os.PathLike[str]) -> list[str]:
    """The Parquet files a spec names, following Megatron-Bridge's rules (spec §2.7).

    - A literal path whose only glob character is ``[`` and that is an existing Parquet file: itself.
    - A glob: the matches ending ``.parquet``/``.pq``, **sorted**; none is an error.
    - A directory: the sorted union of its ``*.parquet`` and ``*.pq`` files; none is an error.
    - A single file: ``[]`` without a Parquet extension; an error if it does not exist.

    >>> resolve_packed_parquet_paths("notes.txt")
    []
    """
    text = os.fspath(spec)
    if (
        "[" in text
        and not any(ch in text for ch in "*?")
        and os.path.isfile(text)
        and _has_parquet_suffix(text)
    ):
        return [text]
    if _has_glob_magic(text):
        matches = sorted(p for p in glob.glob(text) if _has_parquet_suffix(p))
        if not matches:
            raise PackedParquetError(f"No Parquet files found matching pattern: {text}")
        return matches
    if os.path.isdir(text):
        found = sorted(
            set(glob.glob(os.path.join(glob.escape(text), "*.parquet")))
            | set(glob.glob(os.path.join(glob.escape(text), "*.pq")))
        )
        if not found:
            raise PackedParquetError(f"No Parquet files found in directory: {text}")
        return found
    if not _has_parquet_suffix(text):
        return []
    if not os.path.isfile(text):
        raise PackedParquetError(f"Packed Parquet file not found: {text}")
    return [text]


def resolve_packed_parquet_paths_with_retry(
    spec: str | os.PathLike[str], *, attempts: int = 10, sleep_s: float = 1.0
) -> list[str]:
    """:func:`resolve_packed_parquet_paths` with retries for NFS caches (Megatron-Bridge issue #4207).

    Before each retry (sleeping ``attempt * sleep_s``) it lists the nearest existing ancestor directory,
    which refreshes NFS attribute caches.
    """
    last: PackedParquetError | None = None
    for attempt in range(attempts):
        try:
            return resolve_packed_parquet_paths(spec)
        except PackedParquetError as exc:
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


def validate_row(row: Mapping[str, Any]) -> None:
    """Check one stored row's invariants (Megatron-Bridge ``validate_row``); raise ``PackedParquetError``.

    >>> validate_row({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "seq_start_id": [0, 2]})
    >>> validate_row({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "seq_start_id": [0, 5]})
    Traceback (most recent call last):
    ...
    longpack.runtime.dataset.PackedParquetError: seq_start_id value 5 is >= len(input_ids)=3
    """
    ids = row["input_ids"]
    mask = row["loss_mask"]
    starts = [int(s) for s in row["seq_start_id"]]
    if len(mask) != len(ids):
        raise PackedParquetError(f"loss_mask length {len(mask)} != input_ids length {len(ids)}")
    if not starts or starts[0] != 0:
        raise PackedParquetError(f"seq_start_id must start with 0, got {starts}")
    for start in starts:
        if start >= len(ids):
            raise PackedParquetError(f"seq_start_id value {start} is >= len(input_ids)={len(ids)}")
    for a, b in itertools.pairwise(starts):
        if b < a:
            raise PackedParquetError(f"seq_start_id {starts} is not non-decreasing")


class PackedDataset:
    """Map-style dataset over packed Parquet rows; ``ds[i]`` is a dict ready for ``collate_packed``.

    - ``path``: a file, a folder or a glob (see :func:`resolve_packed_parquet_paths`).
    - ``max_num_samples``: if set, items go through an epoch-level ``samples_mapping``
      (``ceil(max_num_samples / rows)`` independent shuffles of ``arange(rows)``, concatenated, truncated),
      drawn from ``numpy.random.RandomState(seed)``: the same permutation Megatron-Bridge draws after
      ``np.random.seed(seed)``, without touching the global RNG.
    - A negative index is a **padding row** (the batch sampler's ``-1``): it reads a real row (counting from
      the end) and returns an all-zero ``loss_mask``, also after remapping (spec §3.2).

    Items: ``{"input_ids": int64[n], "loss_mask": int64[n], "seq_boundaries": int64[k+1]}`` (numpy).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        max_num_samples: int | None = None,
        seed: int | None = 1234,
        validate_rows: bool = False,
    ) -> None:
        if isinstance(path, str | os.PathLike):
            spec = os.fspath(path)
            files = resolve_packed_parquet_paths(spec)
            if not files:
                raise PackedParquetError(
                    f"{spec}: not a Parquet path (expected a .parquet/.pq file, a folder or a glob of shards)"
                )
        else:
            files = [os.fspath(p) for p in path]
            if not files:
                raise PackedParquetError("PackedDataset needs at least one Parquet file")
        self.files: tuple[str, ...] = tuple(files)
        self.validate_rows = validate_rows
        self._row_group_offsets: list[list[int]] = []
        file_offsets = [0]
        for file in self.files:
            try:
                meta = pq.ParquetFile(file)
            except (OSError, pa.ArrowInvalid) as exc:
                raise PackedParquetError(f"{file}: cannot open as Parquet ({exc})") from exc
            with meta:
                names = set(meta.schema_arrow.names)
                missing = [c for c in REQUIRED_COLUMNS if c not in names]
                if missing:
                    raise PackedParquetError(
                        f"{file}: missing required columns {missing}; a packed file needs "
                        f"{list(REQUIRED_COLUMNS)} (write it with `longpack pack`)"
                    )
                rows = meta.metadata.num_rows
                if rows == 0:
                    raise PackedParquetError(f"{file}: the packed Parquet file is empty (0 rows)")
                offsets = [0]
                for rg in range(meta.metadata.num_row_groups):
                    offsets.append(offsets[-1] + meta.metadata.row_group(rg).num_rows)
            self._row_group_offsets.append(offsets)
            file_offsets.append(file_offsets[-1] + rows)
        self._file_offsets = file_offsets
        self.num_rows = file_offsets[-1]
        self.seed = 1234 if seed is None else seed
        self.samples_mapping: np.ndarray | None = None
        if max_num_samples is not None:
            if max_num_samples < 1:
                raise PackedParquetError(f"max_num_samples must be >= 1, got {max_num_samples}")
            rng = np.random.RandomState(self.seed)
            epochs = math.ceil(max_num_samples / self.num_rows)
            parts = []
            for _ in range(epochs):
                order = np.arange(self.num_rows)
                rng.shuffle(order)
                parts.append(order)
            self.samples_mapping = np.concatenate(parts)[:max_num_samples]
        self._pid: int | None = None
        self._readers: dict[int, pq.ParquetFile] = {}
        self._cache_key: tuple[int, int] | None = None
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self.row_group_reads = 0

    def __len__(self) -> int:
        return len(self.samples_mapping) if self.samples_mapping is not None else self.num_rows

    @property
    def cached_row_group(self) -> tuple[int, int] | None:
        """``(file index, row group index)`` of the cached row group, or ``None``."""
        return self._cache_key

    def locate(self, row: int) -> tuple[int, int, int]:
        """``(file index, row group index, row within the group)`` of a global row number.

        Bisects the cumulative file offsets, then the file's cumulative row-group offsets.
        """
        if not 0 <= row < self.num_rows:
            raise IndexError(f"row {row} out of range for {self.num_rows} packed rows")
        file_index = bisect.bisect_right(self._file_offsets, row) - 1
        local = row - self._file_offsets[file_index]
        offsets = self._row_group_offsets[file_index]
        group = bisect.bisect_right(offsets, local) - 1
        return file_index, group, local - offsets[group]

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        idx = int(idx)
        is_padding = idx < 0
        if self.samples_mapping is not None:
            if not -len(self.samples_mapping) <= idx < len(self.samples_mapping):
                raise IndexError(f"index {idx} out of range for a dataset of {len(self)} samples")
            idx = int(self.samples_mapping[idx])
        if idx < 0:
            idx += self.num_rows
        file_index, group, row_in_group = self.locate(idx)
        columns = self._row_group(file_index, group)
        item = {}
        for name in REQUIRED_COLUMNS:
            offsets, values = columns[name]
            item[name] = values[offsets[row_in_group] : offsets[row_in_group + 1]]
        if self.validate_rows:
            try:
                validate_row(item)
            except PackedParquetError as exc:
                raise PackedParquetError(
                    f"{self.files[file_index]}: row {idx - self._file_offsets[file_index]}: {exc}"
                ) from exc
        ids = item["input_ids"].astype(np.int64, copy=False)
        loss = np.zeros(ids.size, np.int64) if is_padding else item["loss_mask"].astype(np.int64)
        boundaries = np.append(item["seq_start_id"].astype(np.int64), ids.size)
        return {"input_ids": ids, "seq_boundaries": boundaries, "loss_mask": loss}

    def _reader(self, file_index: int) -> pq.ParquetFile:
        pid = os.getpid()
        if self._pid != pid:
            # A forked worker must not share the parent's file handles or cache.
            self._readers = {}
            self._cache_key = None
            self._cache = None
            self._pid = pid
        reader = self._readers.get(file_index)
        if reader is None:
            reader = pq.ParquetFile(self.files[file_index])
            self._readers[file_index] = reader
        return reader

    def _row_group(self, file_index: int, group: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        reader = self._reader(file_index)
        if self._cache_key == (file_index, group) and self._cache is not None:
            return self._cache
        table = reader.read_row_group(group, columns=list(REQUIRED_COLUMNS))
        columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name in REQUIRED_COLUMNS:
            array = table.column(name).combine_chunks()
            if array.null_count:
                raise PackedParquetError(
                    f"{self.files[file_index]}: row group {group}: column {name!r} has null rows"
                )
            if pa.types.is_large_list(array.type) or pa.types.is_list(array.type):
                offsets = array.offsets.to_numpy()
                values = array.values.to_numpy(zero_copy_only=False)
                base = int(offsets[0])
                columns[name] = (offsets - base, values[base:])
            else:
                raise PackedParquetError(
                    f"{self.files[file_index]}: column {name!r} has type {array.type}, expected a list column"
                )
        self._cache_key = (file_index, group)
        self._cache = columns
        self.row_group_reads += 1
        return columns

    def close(self) -> None:
        """Close the readers and drop the cache; safe to call twice."""
        for reader in self._readers.values():
            reader.close()
        self._readers = {}
        self._cache_key = None
        self._cache = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"] = {}
        state["_cache_key"] = None
        state["_cache"] = None
        state["_pid"] = None
        return state
