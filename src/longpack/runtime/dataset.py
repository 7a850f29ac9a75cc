"""Random access to packed Parquet rows in Megatron-Bridge's format, for training loops and ``DataLoader``.

Columns ``input_ids`` (``list<int>``), ``loss_mask`` (``list<int8>``, label-aligned) and ``seq_start_id``
(``list<int64>``); extra columns are ignored. The files come from :class:`longpack.packed.PackedFolder`: a
folder is read one split at a time (``split="training"`` / ``"validation"``; Megatron-Bridge, given a folder,
would read both splits together), a file or a glob is read as named, exactly as Bridge reads it. Readers are
opened lazily, once per process, so a dataset built in the parent survives ``DataLoader`` worker forks.

Reading in any order: decoded row groups are kept in a per-process LRU cache (``cache_bytes``), and while
indices are read one after another (``ds[i]``, ``ds[i + 1]``, ...: how Megatron's samplers walk a dataset,
whose ``samples_mapping`` makes the rows random) the row groups of the next ``prefetch`` indices are
decoded on a background thread (pyarrow decodes without the GIL) while the caller works on the current
one; a batch (``__getitems__``, what ``torch.utils.data.DataLoader`` calls with a batch of indices) reads
its groups in one go. ``longpack pack`` writes one row per row group from pack size 4,096 up
(``longpack.packed.files.default_row_group_size``), so a random access decodes exactly the row it needs,
with this reader and with Megatron-Bridge's; files with large groups (Bridge's 500 rows) decode a whole
group for a random row, cached here for the next rows that fall in it.

This module does I/O with pyarrow and numpy only; it does not import torch, and its items feed
:func:`longpack.runtime.collate.collate_packed` directly.

Example::

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> tmp = tempfile.TemporaryDirectory(); folder = tmp.name
    >>> table = pa.table({"input_ids": [[5, 6, 2, 7, 2]], "loss_mask": pa.array([[1, 1, 0, 1, 0]],
    ...                   pa.list_(pa.int8())), "seq_start_id": [[0, 3]]})
    >>> pq.write_table(table, f"{folder}/training_4.idx.parquet", row_group_size=500)
    >>> ds = PackedDataset(f"{folder}/training_*.idx.parquet")
    >>> len(ds), ds[0]["seq_boundaries"].tolist(), ds[-1]["loss_mask"].tolist()
    (1, [0, 3, 5], [0, 0, 0, 0, 0])
    >>> ds.close(); tmp.cleanup()
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from longpack.errors import PackedDataError
from longpack.packed.files import (
    REQUIRED_COLUMNS,
    is_packed_parquet_file,
    is_packed_parquet_spec,
    resolve_packed_parquet_paths,
    resolve_packed_parquet_paths_with_retry,
)
from longpack.packed.folder import ListColumn, PackedFolder, validate_row


def _take(values: Any, row: int, key_len: int) -> dict[str, np.ndarray]:
    """A row's values from a cached entry: a whole group (``ListColumn`` per column) or one row."""
    if key_len == 3:
        return values  # type: ignore[no-any-return]
    return {name: c.values[c.offsets[row] : c.offsets[row + 1]] for name, c in values.items()}


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

#: The name this module used for packed-data errors; they are :class:`longpack.errors.PackedDataError`.
PackedParquetError = PackedDataError


class PackedDataset:
    """Map-style dataset over packed Parquet rows; ``ds[i]`` is a dict ready for ``collate_packed``.

    - ``path``: the output folder (with ``split`` when it holds both splits), one file, a glob of shards, a
      list of files, or an opened :class:`~longpack.packed.PackedFolder`. A folder without ``manifest.json``
      (an unfinished ``longpack pack``) is refused unless ``allow_unfinished=True``; a folder Megatron-Bridge
      wrote (no manifest) is read with ``allow_no_manifest=True`` or by naming its files (a glob). The
      ``.npy`` files of released Bridge / NeMo 2 are read too.
    - ``max_num_samples``: if set, items go through an epoch-level ``samples_mapping``
      (``ceil(max_num_samples / rows)`` independent shuffles of ``arange(rows)``, concatenated, truncated),
      drawn from ``numpy.random.RandomState(seed)``: the same permutation Megatron-Bridge draws after
      ``np.random.seed(seed)``, without touching the global RNG.
    - A negative index is a **padding row** (the batch sampler's ``-1``): it reads a real row (counting from
      the end) and returns an all-zero ``loss_mask``, also after remapping (Megatron-Bridge
      ``GPTSFTPackedDataset.__getitem__``).

    Items: ``{"input_ids": int64[n], "loss_mask": int64[n], "seq_boundaries": int64[k+1]}`` (numpy).

    - ``cache_bytes``: decoded row groups kept per process (least recently used dropped first; the group
      being read always stays).
    - ``prefetch``: while indices come one after another, how many indices ahead to decode on a background
      thread (0: never).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | PackedFolder,
        *,
        split: str | None = None,
        allow_unfinished: bool = False,
        allow_no_manifest: bool = False,
        max_num_samples: int | None = None,
        seed: int | None = 1234,
        validate_rows: bool = False,
        cache_bytes: int = 256 * 2**20,
        prefetch: int = 32,
    ) -> None:
        if isinstance(path, PackedFolder):
            self.folder = path
        else:
            self.folder = PackedFolder.open(
                path, split=split, allow_unfinished=allow_unfinished, allow_no_manifest=allow_no_manifest
            )
        self._sources = self.folder.sources(split)
        self.files: tuple[str, ...] = tuple(str(s.path) for s in self._sources)
        for source in self._sources:
            if source.num_rows == 0:
                raise PackedDataError(f"{source.path}: the packed Parquet file is empty (0 rows)")
        from longpack.validate import non_negative_int

        self.validate_rows = validate_rows
        self.cache_bytes = non_negative_int(cache_bytes, "cache_bytes")
        self.prefetch = non_negative_int(prefetch, "prefetch")
        self._row_group_offsets = [[0, *itertools.accumulate(source.group_rows)] for source in self._sources]
        self._file_offsets = [0, *itertools.accumulate(source.num_rows for source in self._sources)]
        self.num_rows = self._file_offsets[-1]
        self.seed = 1234 if seed is None else seed
        self.samples_mapping: np.ndarray | None = None
        if max_num_samples is not None:
            if max_num_samples < 1:
                raise PackedDataError(f"max_num_samples must be >= 1, got {max_num_samples}")
            rng = np.random.RandomState(self.seed)
            epochs = math.ceil(max_num_samples / self.num_rows)
            parts = []
            for _ in range(epochs):
                order = np.arange(self.num_rows)
                rng.shuffle(order)
                parts.append(order)
            self.samples_mapping = np.concatenate(parts)[:max_num_samples]
        self._reset()
        self.row_group_reads = 0

    def _reset(self) -> None:
        """Per-process state: the cache, the prefetch thread and what it was asked to read."""
        self._pid: int | None = os.getpid()
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[int, ...], tuple[Any, int]] = OrderedDict()
        self._cached_bytes = 0
        self._cache_key: tuple[int, int] | None = None
        self._pending: dict[tuple[int, ...], Future[Any]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._last_index: int | None = None
        self._last_row = -2
        self._scheduled_to = -1  # indices up to here were handed to the prefetch thread

    def __len__(self) -> int:
        return len(self.samples_mapping) if self.samples_mapping is not None else self.num_rows

    @property
    def cached_row_group(self) -> tuple[int, int] | None:
        """``(file index, row group index)`` of the row group read last, or ``None``."""
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

    def _row_of(self, idx: int) -> int:
        """The file row of dataset index ``idx`` (negative: a padding row, counted from the end)."""
        if self.samples_mapping is not None:
            if not -len(self.samples_mapping) <= idx < len(self.samples_mapping):
                raise IndexError(f"index {idx} out of range for a dataset of {len(self)} samples")
            idx = int(self.samples_mapping[idx])
        return idx + self.num_rows if idx < 0 else idx

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        idx = int(idx)
        self._check_process()
        if self.prefetch and self._last_index is not None and idx == self._last_index + 1:
            self._schedule(
                range(max(idx + 1, self._scheduled_to + 1), min(len(self), idx + 1 + self.prefetch))
            )
        self._last_index = idx
        return self._item(idx)

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """A batch: its row groups are decoded together (on the prefetch thread and this one), then the rows
        are taken in order. ``torch.utils.data.DataLoader`` calls this with each batch's indices."""
        self._check_process()
        wanted = [int(i) for i in indices]
        if self.prefetch:
            self._schedule(wanted[1:])
        return [self._item(i) for i in wanted]

    def _item(self, idx: int) -> dict[str, np.ndarray]:
        is_padding = idx < 0
        row = self._row_of(idx)
        file_index, group, row_in_group = self.locate(row)
        # Uncompressed one-row pages (longpack's layout): the row's values are in the memory-mapped file.
        item = self._sources[file_index].direct_row(group, row_in_group, REQUIRED_COLUMNS)
        if item is None:
            item = self._values(file_index, group, row_in_group, follows=row == self._last_row + 1)
        self._last_row = row
        if self.validate_rows:
            try:
                validate_row(item)
            except PackedDataError as exc:
                raise PackedDataError(
                    f"{self.files[file_index]}: row {row - self._file_offsets[file_index]}: {exc} (Megatron-Bridge's "
                    "validate_row refuses this row); pack the data again"
                ) from exc
        ids = item["input_ids"].astype(np.int64, copy=False)
        loss = np.zeros(ids.size, np.int64) if is_padding else item["loss_mask"].astype(np.int64, copy=False)
        boundaries = np.append(item["seq_start_id"].astype(np.int64), ids.size)
        return {"input_ids": ids, "seq_boundaries": boundaries, "loss_mask": loss}

    # -- the row-group cache and the prefetch thread ----------------------------------------------------

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            # A forked worker must not use the parent's cache or threads (the row sources reopen files too).
            self._reset()

    def _schedule(self, indices: Iterable[int]) -> None:
        """Hand what ``indices`` need (not cached, not under way) to the prefetch thread: their rows alone
        where the files allow it and the rows do not follow each other, else their row groups."""
        previous = -2
        for idx in indices:
            self._scheduled_to = max(self._scheduled_to, idx)
            try:
                row = self._row_of(idx)
                file_index, group, row_in_group = self.locate(row)
            except IndexError:
                continue
            key: tuple[int, ...] = (file_index, group)
            if self._sources[file_index].direct(group):
                continue  # read from the memory map when asked: nothing to decode ahead
            if self._sources[file_index].one_row_pages and row != previous + 1:
                key = (file_index, group, row_in_group)
            previous = row
            with self._lock:
                if key in self._cache or key in self._pending or key[:2] in self._cache:
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longpack-prefetch")
                self._pending[key] = self._pool.submit(self._decode, key)

    def _decode(self, key: tuple[int, ...]) -> Any:
        source = self._sources[key[0]]
        if len(key) == 3:
            values: Any = source.read_row(key[1], key[2], REQUIRED_COLUMNS)
        else:
            values = source.read_group(key[1], REQUIRED_COLUMNS)
        self._store(key, values)
        return values

    def _store(self, key: tuple[int, ...], columns: Any) -> None:
        size = sum(
            (c.values.nbytes + c.offsets.nbytes) if isinstance(c, ListColumn) else c.nbytes
            for c in columns.values()
        )
        with self._lock:
            self.row_group_reads += 1
            self._pending.pop(key, None)
            if key in self._cache:
                return
            self._cache[key] = (columns, size)
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
                _, (_, dropped) = self._cache.popitem(last=False)
                self._cached_bytes -= dropped

    def _values(self, file_index: int, group: int, row: int, *, follows: bool) -> dict[str, np.ndarray]:
        """The row's column values: from a cached or prefetched group or row; else, when the row does not
        follow the last one read and the file has one row per page, decoded alone; else its group."""
        group_key, row_key = (file_index, group), (file_index, group, row)
        self._cache_key = group_key
        with self._lock:
            for key in (group_key, row_key):
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    return _take(hit[0], row, len(key))
            future = self._pending.get(group_key) or self._pending.get(row_key)
            key_of_future = group_key if group_key in self._pending else row_key
        if future is not None:
            if not future.cancel():  # under way on the prefetch thread: wait for it
                return _take(future.result(), row, len(key_of_future))
            with self._lock:
                self._pending.pop(key_of_future, None)
        source = self._sources[file_index]
        if source.one_row_pages and not follows:
            values = source.read_row(group, row, REQUIRED_COLUMNS)
            self._store(row_key, values)
            self._trim_if_uncached()
            return values
        columns = source.read_group(group, REQUIRED_COLUMNS)
        self._store(group_key, columns)
        self._trim_if_uncached()
        return _take(columns, row, 2)

    def _row_group(self, file_index: int, group: int) -> dict[str, ListColumn]:
        """A whole row group's columns (cached)."""
        key = (file_index, group)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit[0]  # type: ignore[no-any-return]
        columns = self._sources[file_index].read_group(group, REQUIRED_COLUMNS)
        self._store(key, columns)
        return columns

    def _trim_if_uncached(self) -> None:
        if self.cache_bytes == 0:
            with self._lock:
                self._cache.clear()
                self._cached_bytes = 0

    def close(self) -> None:
        """Stop the prefetch thread, close the readers and drop the cache; safe to call twice."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True, cancel_futures=True)
        for source in self._sources:
            source.close()
        self._reset()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_cache", "_pending", "_pool", "_cache_key", "_cached_bytes"):
            state.pop(name, None)
        state["_pid"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
