"""Random access to packed Parquet rows in Megatron-Bridge's format, for training loops and ``DataLoader``.

Columns ``input_ids`` (``list<int>``), ``loss_mask`` (``list<int8>``, label-aligned) and ``seq_start_id``
(``list<int64>``); extra columns are ignored. The files come from :class:`longpack.packed.PackedFolder`: a
folder is read one split at a time (``split="training"`` / ``"validation"``; Megatron-Bridge, given a folder,
would read both splits together), a file or a glob is read as named, exactly as Bridge reads it. Readers are
opened lazily, once per process, so a dataset built in the parent survives ``DataLoader`` worker forks;
exactly one row group (the last one read) is cached, as Megatron-Bridge does.

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
from collections.abc import Sequence
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
        self.validate_rows = validate_rows
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
        self._pid: int | None = None
        self._cache_key: tuple[int, int] | None = None
        self._cache: dict[str, ListColumn] | None = None
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
            except PackedDataError as exc:
                raise PackedDataError(
                    f"{self.files[file_index]}: row {idx - self._file_offsets[file_index]}: {exc} (Megatron-Bridge's "
                    "validate_row refuses this row); pack the data again"
                ) from exc
        ids = item["input_ids"].astype(np.int64, copy=False)
        loss = np.zeros(ids.size, np.int64) if is_padding else item["loss_mask"].astype(np.int64)
        boundaries = np.append(item["seq_start_id"].astype(np.int64), ids.size)
        return {"input_ids": ids, "seq_boundaries": boundaries, "loss_mask": loss}

    def _row_group(self, file_index: int, group: int) -> dict[str, ListColumn]:
        pid = os.getpid()
        if self._pid != pid:
            # A forked worker must not use the parent's cache (the row sources reopen their files too).
            self._cache_key = None
            self._cache = None
            self._pid = pid
        if self._cache_key == (file_index, group) and self._cache is not None:
            return self._cache
        columns = self._sources[file_index].read_group(group, REQUIRED_COLUMNS)
        self._cache_key = (file_index, group)
        self._cache = columns
        self.row_group_reads += 1
        return columns

    def close(self) -> None:
        """Close the readers and drop the cache; safe to call twice."""
        for source in self._sources:
            source.close()
        self._cache_key = None
        self._cache = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache_key"] = None
        state["_cache"] = None
        state["_pid"] = None
        return state
