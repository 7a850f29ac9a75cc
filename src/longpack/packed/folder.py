"""The one reader of packed output: :class:`PackedFolder` opens a folder, a file or a glob and answers what is
in it (splits, files, ``<N>_metadata.jsonl``, ``manifest.json``, pack size, row and sample lengths) and what
is wrong with it (:meth:`PackedFolder.validate`). ``longpack inspect``, ``longpack check --packed``, the
runtime dataset and the THD collate all read through it. numpy + pyarrow only (no torch).

How a spec is opened:

- **A folder** is read split by split: ``training_<N>*`` and ``validation_<N>*`` files (directly in the
  folder, or in its ``validation/`` folder where ``longpack pack`` puts them) are never mixed
  (Megatron-Bridge, given a folder, reads every ``*.parquet`` directly in it). The files of a split are the
  ones ``manifest.json`` lists. A folder without a manifest is an unfinished ``longpack pack`` (the manifest
  is written last) and is refused, unless ``allow_no_manifest=True`` (a folder Megatron-Bridge's prepare
  step wrote: it writes no manifest) or ``allow_unfinished=True`` (read it and report what is missing).
  The ``validation/`` folder itself opens as the validation split of its output folder.
- **A file or a glob** names the files: they are resolved with Megatron-Bridge's own rule
  (:func:`~longpack.packed.files.resolve_packed_parquet_paths`: sorted glob, literal ``[``, missing = error) and
  read as named, so a glob reads what Bridge would read. Files Megatron-Bridge wrote carry no manifest; named
  this way they are read without one. A manifest next to them still gives the pack size, ``pad_seq_to_mult``
  and the EOS id.

Reading rows goes through a small per-format row source (:class:`ParquetRowSource`: whole row groups as
flat Arrow offsets + values; :class:`NpyRowSource`: the ``.npy`` rows of released Bridge / NeMo 2 in
groups of 500), chosen by ``PackedFolder.format`` (``parquet`` | ``npy``).

>>> import tempfile
>>> from longpack.packed.pipeline import PackSettings, Provenance, plan_splits, write_packed_output
>>> from longpack.samples import TokenizedSamples
>>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2, 8, 8, 2], np.int32),
...     loss_mask=np.ones(8, np.uint8), offsets=np.array([0, 3, 5, 8]),
...     source_file=np.zeros(3, np.int32), source_row=np.array([1, 2, 3]), files=("a.jsonl",))
>>> out = Path(tempfile.mkdtemp()) / "packed"
>>> settings = PackSettings(seq_length=4, val_fraction=0.34)
>>> _ = write_packed_output(out, plan_splits(s, settings, eos_id=2), settings,
...                         Provenance(tokenizer={"eos_id": 2}))
>>> folder = PackedFolder.open(out)
>>> folder.split_names, folder.pack_size, folder.eos_id, [p.name for p in folder.files("validation")]
(('training', 'validation'), 4, 2, ['validation_4.idx.parquet'])
>>> PackedFolder.open(out / "validation").split_names
('validation',)
>>> folder.sample_lengths("training").tolist(), folder.validate(verify=True)
([2, 1], [])
>>> PackedFolder.open(out, split="training").split_names
('training',)
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from longpack.errors import DamagedDataError, PackedDataError
from longpack.outputs import sha256_file
from longpack.packed.files import (
    ONE_ROW_PAGES_KEY,
    REQUIRED_COLUMNS,
    ROW_GROUP_SIZE,
    SPLITS,
    VALIDATION_DIR,
    is_parquet_name,
    local_path,
    metadata_name,
    resolve_packed_parquet_paths,
)
from longpack.packed.manifest import MANIFEST_NAME, ManifestSettings, PackManifest, SplitRecord
from longpack.packed.plan import PackPlan, pack_metadata

__all__ = [
    "Alignment",
    "ListColumn",
    "NpyRowSource",
    "PackedFolder",
    "PackedSplit",
    "ParquetRowSource",
    "SplitScan",
    "list_column",
    "read_metadata_file",
    "validate_row",
    "validate_rows",
]

_SHARD_RE = re.compile(
    r"^(?P<split>[^_]+)_(?P<n>\d+)(?:\.part-(?P<part>\d+)-of-(?P<parts>\d+))?(?:\.idx\.(?:parquet|pq)|\.npy)$",
    re.I,
)
_META_RE = re.compile(r"^(\d+)_metadata\.jsonl$")
# Megatron-Bridge's default folder: <tok>_pad_seq_to_mult<P>_sft_<fp12>.
_DIR_MULT_RE = re.compile(r"_pad_seq_to_mult(\d+|None)_")
_DAMAGED = "the file is damaged or incompletely copied: copy it again, or pack again"
#: The largest pack size or alignment multiple a manifest may record: no pack holds 2**40 tokens, so a larger
#: recorded value is damage, not a setting.
MAX_RECORDED_SIZE = 2**40
_INCOMPLETE = "the folder is incomplete (a failed copy or a deleted file): copy it again, or pack again"
#: Split name of named files whose names carry no split (``shard_0.parquet``).
UNSPLIT = "files"


# ---------------------------------------------------------------------------------------------------
# Flat list columns and the row checks of Megatron-Bridge's ``validate_row``.


class ListColumn(NamedTuple):
    """A list column as ``offsets`` (int64 ``[R+1]``, starting at 0) and the flat ``values`` of its rows."""

    offsets: np.ndarray
    values: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def list_column(
    column: pa.ChunkedArray | pa.Array, where: str = "column", *, integers: bool = True
) -> ListColumn:
    """Offsets and values of a list column without per-row Python objects; a clear error for anything else
    (``integers``: the values must be integers; else any number or bool, as a loss mask may be).

    >>> c = list_column(pa.array([[1, 2], [], [3]]))
    >>> c.offsets.tolist(), c.values.tolist(), c.lengths.tolist()
    ([0, 2, 2, 3], [1, 2, 3], [2, 0, 1])
    >>> list_column(pa.array([["a"]]), "input_ids")
    Traceback (most recent call last):
    ...
    longpack.errors.PackedDataError: input_ids holds string values, expected integers; write it with `longpack pack`
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise PackedDataError(
            f"{where} has type {arr.type}, expected a list column; write it with `longpack pack`"
        )
    value_type = arr.type.value_type
    # (a column of only empty lists has null-typed values: nothing to read)
    numeric = (
        pa.types.is_integer(value_type)
        or pa.types.is_null(value_type)
        or (not integers and (pa.types.is_boolean(value_type) or pa.types.is_floating(value_type)))
    )
    if not numeric:
        raise PackedDataError(
            f"{where} holds {value_type} values, expected {'integers' if integers else 'numbers'}; write it "
            "with `longpack pack`"
        )
    if arr.null_count or arr.values.null_count:
        raise PackedDataError(f"{where} holds nulls; a packed row needs a value at every position")
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    base, end = int(offsets[0]), int(offsets[-1])
    values = arr.values.to_numpy(zero_copy_only=False)[base:end]
    return ListColumn(offsets - base, values)


def _preview(values: np.ndarray) -> str:
    shown = [int(v) for v in values[:8]]
    return str(shown) if len(values) <= 8 else f"{str(shown)[:-1]}, ...]"


def _row_checks(
    ids_len: np.ndarray, mask_len: np.ndarray, start_offsets: np.ndarray, starts: np.ndarray
) -> list[tuple[int, str]]:
    """(first offending row, message) for each broken rule of Megatron-Bridge's ``validate_row``."""
    problems: list[tuple[int, str]] = []
    bad = np.flatnonzero(ids_len != mask_len)
    if bad.size:
        r = int(bad[0])
        problems.append((r, f"loss_mask length {int(mask_len[r])} != input_ids length {int(ids_len[r])}"))
    n_starts = np.diff(start_offsets)
    first = np.full(len(n_starts), -1, dtype=np.int64)
    has = n_starts > 0
    first[has] = starts[start_offsets[:-1][has]]
    bad = np.flatnonzero(first != 0)
    if bad.size:
        r = int(bad[0])
        row_starts = starts[start_offsets[r] : start_offsets[r + 1]]
        problems.append((r, f"seq_start_id must start with 0, got {_preview(row_starts)}"))
    if starts.size:
        row_of = np.repeat(np.arange(len(n_starts)), n_starts)
        bad = np.flatnonzero(starts >= ids_len[row_of])
        if bad.size:
            r = int(row_of[bad[0]])
            problems.append(
                (r, f"seq_start_id value {int(starts[bad[0]])} is >= len(input_ids)={int(ids_len[r])}")
            )
        bad = np.flatnonzero((row_of[1:] == row_of[:-1]) & (np.diff(starts) < 0))
        if bad.size:
            r = int(row_of[bad[0]])
            row_starts = starts[start_offsets[r] : start_offsets[r + 1]]
            problems.append((r, f"seq_start_id {_preview(row_starts)} is not non-decreasing"))
    return problems


def validate_rows(table: pa.Table) -> list[str]:
    """The row invariants of Megatron-Bridge's ``validate_row``, checked for every row of a table at once.

    One message per broken rule, naming the first offending row (empty list = all rows valid).

    >>> t = pa.table({"input_ids": [[1, 2, 3], [4, 5]], "loss_mask": [[0, 1, 0], [1]],
    ...               "seq_start_id": [[0, 1], [1]]})
    >>> validate_rows(t)
    ['row 1: loss_mask length 1 != input_ids length 2', 'row 1: seq_start_id must start with 0, got [1]']
    """
    ids = list_column(table.column("input_ids"), "input_ids")
    mask = list_column(table.column("loss_mask"), "loss_mask", integers=False)
    starts = list_column(table.column("seq_start_id"), "seq_start_id")
    checks = _row_checks(ids.lengths, mask.lengths, starts.offsets, starts.values.astype(np.int64))
    return [f"row {r}: {message}" for r, message in checks]


def validate_row(row: Mapping[str, Any]) -> None:
    """Check one stored row (Megatron-Bridge ``validate_row``); raise :class:`PackedDataError` on the first
    broken rule.

    >>> validate_row({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "seq_start_id": [0, 2]})
    >>> validate_row({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "seq_start_id": [0, 5]})
    Traceback (most recent call last):
    ...
    longpack.errors.PackedDataError: seq_start_id value 5 is >= len(input_ids)=3
    """
    starts = np.asarray(row["seq_start_id"], dtype=np.int64).reshape(-1)
    checks = _row_checks(
        np.array([len(row["input_ids"])]),
        np.array([len(row["loss_mask"])]),
        np.array([0, starts.size]),
        starts,
    )
    if checks:
        raise PackedDataError(checks[0][1])


def _sample_runtime(row_len: np.ndarray, start_offsets: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Runtime length (stored - 1) of every sample: each ends where the next starts, the last at the row end."""
    n_starts = np.diff(start_offsets)
    ends = np.empty_like(starts)
    if starts.size:
        ends[:-1] = starts[1:]
        ends[start_offsets[1:][n_starts > 0] - 1] = row_len[n_starts > 0]
    return ends - starts - 1


def read_metadata_file(path: str | Path) -> tuple[dict[str, Any], ...]:
    """The entries of a ``<N>_metadata.jsonl`` file: one JSON array of per-split dicts (training first).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "8_metadata.jsonl"
    >>> _ = p.write_text('[{"pack_size": 8, "max_samples_per_bin": 2}]')
    >>> read_metadata_file(p)
    ({'pack_size': 8, 'max_samples_per_bin': 2},)
    """
    p = Path(path)
    try:
        loaded = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PackedDataError(
            f"{p}: no such metadata file; pack again so <N>_metadata.jsonl is written (or point at it)"
        ) from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PackedDataError(f"{p}: not a JSON array of metadata dicts ({exc}); pack again") from exc
    if not isinstance(loaded, list) or not all(isinstance(x, dict) for x in loaded):
        raise PackedDataError(
            f"{p}: must hold one JSON array of dicts (Bridge: 'invalid packing_metadata_file!'); pack again"
        )
    return tuple(loaded)


# ---------------------------------------------------------------------------------------------------
# Row sources: one per on-disk format.


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class ParquetRowSource:
    """One packed Parquet file: rows per row group (from the footer) and reads of whole row groups.

    File handles are opened lazily, one per process and thread (a ``DataLoader`` worker forked from a parent
    that read rows opens its own; a prefetch thread reads with its own handle), and are not pickled.
    """

    format: ClassVar[str] = "parquet"
    #: Its row groups are the file's own: a scan reads small ones together, and checks their size against
    #: the writer's (an ``.npy`` file's groups are cut by the reader).
    file_row_groups: ClassVar[bool] = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with pq.ParquetFile(local_path(self.path)) as reader:
                names = set(reader.schema_arrow.names)
                meta = reader.metadata
                self.group_rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
                one_row_pages = (reader.schema_arrow.metadata or {}).get(ONE_ROW_PAGES_KEY) == b"1"
        except FileNotFoundError as exc:
            raise PackedDataError(f"{self.path}: no such file") from exc
        # (ValueError: a damaged footer can hold names that are not UTF-8)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DamagedDataError(
                f"{self.path}: cannot open as Parquet ({_one_line(exc)}); {_DAMAGED}"
            ) from exc
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise PackedDataError(
                f"{self.path}: missing required columns {missing}; a packed file needs "
                f"{list(REQUIRED_COLUMNS)} (write it with `longpack pack`)"
            )
        self.num_rows = sum(self.group_rows)
        self._pid: int | None = None
        self._readers: dict[int, pq.ParquetFile] = {}
        #: Written with one row per data page (the file's metadata says so; longpack writes it): :meth:`read_row`
        #: decodes a row alone (``longpack.packed.pages``); else it reads the row's whole group.
        self.one_row_pages = one_row_pages
        self._chunks: Any = None  # longpack.packed.pages.ChunkReader of this process
        self._leaves: dict[str, tuple[int, int, int]] | None = None
        # Uncompressed one-row pages: rows are read from a memory map of the file (this process's), with
        # each row group's column chunks located once (``_direct_chunks``).
        self._map: Any = None
        self._direct: dict[int, dict[str, Any] | None] = {}
        self._native: Any = None

    def group_start(self, group: int) -> int:
        """The file row number of a row group's first row."""
        return sum(self.group_rows[:group])

    def _reader(self) -> pq.ParquetFile:
        if self._pid != os.getpid():  # a forked child never shares its parent's handles
            self._readers = {}
            self._pid = os.getpid()
        thread = threading.get_ident()
        reader = self._readers.get(thread)
        if reader is None:
            reader = self._readers[thread] = pq.ParquetFile(local_path(self.path))
        return reader

    def read_group(self, group: int, columns: Sequence[str] = REQUIRED_COLUMNS) -> dict[str, ListColumn]:
        """One row group's ``columns``; a damaged page is a :class:`PackedDataError` naming file and rows."""
        return self.read_groups([group], columns)

    def read_groups(
        self, groups: Sequence[int], columns: Sequence[str] = REQUIRED_COLUMNS
    ) -> dict[str, ListColumn]:
        """Consecutive row groups' ``columns`` in one read (many small groups cost one call, not many)."""
        try:
            # One thread: the groups are small, and the DataLoader's workers and longpack's prefetch thread
            # are the parallelism (pyarrow's pool costs more than it gives here: measured 0.38 -> 0.25 ms for
            # a one-row 8K group, 204 -> 159 ms for a 500-row group).
            table = self._reader().read_row_groups(list(groups), columns=list(columns), use_threads=False)
        except (OSError, ValueError, pa.ArrowException) as exc:
            first = self.group_start(groups[0])
            last = self.group_start(groups[-1]) + self.group_rows[groups[-1]] - 1
            which = f"row group {groups[0]}" if len(groups) == 1 else f"row groups {groups[0]}-{groups[-1]}"
            raise DamagedDataError(
                f"{self.path}: {which} (rows {first}-{last}) cannot be read ({_one_line(exc)}); {_DAMAGED}"
            ) from exc
        where = f"row group {groups[0]}" if len(groups) == 1 else f"row groups {groups[0]}-{groups[-1]}"
        return {
            name: list_column(
                table.column(name), f"{self.path}: {where}: column {name!r}", integers=name != "loss_mask"
            )
            for name in columns
        }

    def read_row(
        self, group: int, row: int, columns: Sequence[str] = REQUIRED_COLUMNS
    ) -> dict[str, np.ndarray]:
        """One row's ``columns`` (values; the row ``row`` of row group ``group``): decoded from its own pages
        when the file has one row per page, else from its group (same values either way)."""
        if self.one_row_pages:
            direct = self._direct_row(group, row, columns)
            if direct is not None:
                return direct
            from longpack.packed import pages

            reader = self._reader()  # also resets this process's handles after a fork
            if self._chunks is None:
                self._chunks = pages.ChunkReader(self.path)
            leaves = self._leaves
            if leaves is None:
                schema = reader.metadata.schema
                leaves = self._leaves = {}
                for i in range(len(schema)):
                    col = schema.column(i)
                    leaves[col.path.split(".")[0]] = (i, col.max_repetition_level, col.max_definition_level)
            meta = reader.metadata.row_group(group)
            out: dict[str, np.ndarray] = {}
            for name in columns:
                index, max_rep, max_def = leaves[name]
                values = pages.read_row(
                    self._chunks, meta.column(index), row, meta.num_rows, max_rep=max_rep, max_def=max_def
                )
                if values is None:
                    break
                out[name] = values
            else:
                return out
        cols = self.read_group(group, columns)
        return {name: c.values[c.offsets[row] : c.offsets[row + 1]] for name, c in cols.items()}

    def direct(self, group: int) -> bool:
        """Whether the rows of row group ``group`` are read straight from a memory map of the file (one
        uncompressed page per row and column: no decoding, no cache needed)."""
        if not self.one_row_pages:
            return False
        chunks = self._direct.get(group, False)
        if chunks is False or self._pid != os.getpid():
            chunks = self._direct_chunks(group)
        return chunks is not None

    def direct_row(self, group: int, row: int, columns: Sequence[str]) -> dict[str, np.ndarray] | None:
        """A row's values straight from the memory map (uncompressed one-row pages; PLAIN values are
        read-only views of the map), or ``None`` where the file's pages are not of that kind."""
        if not self.one_row_pages:
            return None
        return self._direct_row(group, row, columns)

    def _direct_row(self, group: int, row: int, columns: Sequence[str]) -> dict[str, np.ndarray] | None:
        """A row's values straight from the memory map (uncompressed one-row pages), or ``None``."""
        chunks = self._direct.get(group, False)
        if chunks is False or self._pid != os.getpid():
            chunks = self._direct_chunks(group)
        if chunks is None:
            return None
        out: dict[str, np.ndarray] = {}
        for name in columns:
            rows = chunks.get(name)  # type: ignore[union-attr]
            if rows is None:
                return None
            try:
                out[name] = rows.values(row)
            except ValueError:  # damaged dictionary indices: the row-group read reports it
                return None
        return out

    def _direct_chunks(self, group: int) -> dict[str, Any] | None:
        """Each column chunk of a row group walked once in the memory map (``longpack.packed.pages.ChunkRows``),
        if every one is uncompressed with one row per page; else ``None``."""
        import mmap

        from longpack._optional import native
        from longpack.packed.pages import chunk_rows

        reader = self._reader()  # also resets this process's handles after a fork
        if self._map is None or self._map[0] != os.getpid():
            self._direct = {}
            self._native = native("longpack.packed._native")
            if self._native is None:
                self._map = (os.getpid(), None)
            else:
                with open(self.path, "rb") as fh:
                    self._map = (os.getpid(), memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)))
        view = self._map[1]
        chunks: dict[str, Any] | None = None
        if view is not None:
            meta = reader.metadata
            chunks = {}
            rg = meta.row_group(group)
            for i in range(rg.num_columns):
                col = rg.column(i)
                leaf = meta.schema.column(i)
                start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
                end = start + col.total_compressed_size
                if (
                    col.compression != "UNCOMPRESSED"
                    or start < 0
                    or end > len(view)
                    or leaf.max_repetition_level != 1
                ):
                    chunks = None
                    break
                rows = chunk_rows(
                    view[start:end],
                    col.physical_type,
                    rg.num_rows,
                    max_def=leaf.max_definition_level,
                    module=self._native,
                )
                if rows is None:
                    chunks = None
                    break
                chunks[col.path_in_schema.split(".")[0]] = rows
        self._direct[group] = chunks
        return chunks

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers = {}
        self._pid = None
        if self._chunks is not None:
            self._chunks.close()
            self._chunks = None
        # The map is dropped, not closed: rows handed out are views of it and keep it alive.
        self._map = None
        self._direct = {}

    def __getstate__(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "_readers": {},
            "_pid": None,
            "_chunks": None,
            "_map": None,
            "_direct": {},
            "_native": None,
        }


class NpyRowSource:
    """One packed ``.npy`` file (released Megatron-Bridge / NeMo 2): the whole file is loaded once per
    process (a pickled array cannot be read in part), then served in groups of :data:`ROW_GROUP_SIZE` rows
    with the interface of :class:`ParquetRowSource`."""

    format: ClassVar[str] = "npy"
    file_row_groups: ClassVar[bool] = False
    one_row_pages: ClassVar[bool] = False

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        rows = self._load()
        self.num_rows = len(rows)
        self.group_rows = tuple(
            min(ROW_GROUP_SIZE, self.num_rows - g) for g in range(0, self.num_rows, ROW_GROUP_SIZE)
        )

    def _load(self) -> list[dict[str, Any]]:
        from longpack.packed.npy import load_rows

        rows = load_rows(self.path)
        self._rows: list[dict[str, Any]] | None = rows
        self._pid: int | None = os.getpid()
        return rows

    def group_start(self, group: int) -> int:
        return group * ROW_GROUP_SIZE

    def read_group(self, group: int, columns: Sequence[str] = REQUIRED_COLUMNS) -> dict[str, ListColumn]:
        rows = self._rows if self._pid == os.getpid() and self._rows is not None else self._load()
        first = self.group_start(group)
        part = rows[first : first + self.group_rows[group]]
        out = {}
        for name in columns:
            lists = [row[name] for row in part]
            offsets = np.zeros(len(lists) + 1, dtype=np.int64)
            np.cumsum([len(x) for x in lists], out=offsets[1:])
            flat = [v for x in lists for v in x]
            try:
                values = np.asarray(flat, dtype=np.int64) if flat else np.zeros(0, np.int64)
            except (TypeError, ValueError, OverflowError) as exc:
                raise DamagedDataError(
                    f"{self.path}: rows {first}-{first + len(part) - 1}: column {name!r} holds values that "
                    f"are not integers ({exc}); {_DAMAGED}"
                ) from exc
            out[name] = ListColumn(offsets, values)
        return out

    def direct(self, group: int) -> bool:
        """Never: a pickled array has no rows to map (see :meth:`ParquetRowSource.direct`)."""
        return False

    def direct_row(self, group: int, row: int, columns: Sequence[str]) -> dict[str, np.ndarray] | None:
        return None

    def read_row(
        self, group: int, row: int, columns: Sequence[str] = REQUIRED_COLUMNS
    ) -> dict[str, np.ndarray]:
        """One row's ``columns`` (from its group, as :meth:`ParquetRowSource.read_row` gives them)."""
        cols = self.read_group(group, columns)
        return {name: c.values[c.offsets[row] : c.offsets[row + 1]] for name, c in cols.items()}

    def close(self) -> None:
        self._rows = None
        self._pid = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rows": None, "_pid": None}


RowSource = ParquetRowSource | NpyRowSource
#: Row-source class of each on-disk format.
ROW_SOURCES: dict[str, type[ParquetRowSource] | type[NpyRowSource]] = {
    "parquet": ParquetRowSource,
    "npy": NpyRowSource,
}


def is_data_name(name: str) -> bool:
    """A packed data file name: Parquet (``.parquet``/``.pq``) or ``.npy``.

    >>> [is_data_name(n) for n in ("a.idx.parquet", "b.npy", "8_metadata.jsonl")]
    [True, True, False]
    """
    return is_parquet_name(name) or name.lower().endswith(".npy")


def _format_of(name: str) -> str:
    return "npy" if name.lower().endswith(".npy") else "parquet"


# ---------------------------------------------------------------------------------------------------
# Splits and what a scan of their rows gives.


@dataclass(frozen=True, kw_only=True)
class PackedSplit:
    """One split as opened: its data files in row order, its manifest record and metadata entry."""

    name: str
    files: tuple[Path, ...]
    #: The manifest's record of this split (``None`` without a manifest).
    record: SplitRecord | None = None
    #: This split's entry of ``<N>_metadata.jsonl`` (``None`` if there is no file or no entry).
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class SplitScan:
    """Lengths of every row and sample of a split, read from the list offsets (tokens never become Python
    objects); with ``verified``, also every row check that failed."""

    name: str
    files: tuple[str, ...]
    #: Rows in each file, in file order.
    file_rows: tuple[int, ...]
    #: Stored tokens of each row (int64 ``[R]``).
    row_stored: np.ndarray
    #: Samples of each row (int64 ``[R]``).
    samples_per_row: np.ndarray
    #: Runtime length (stored - 1) of each sample, row after row (int64 ``[S]``).
    sample_runtime: np.ndarray
    supervised_tokens: int
    verified: bool
    problems: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return len(self.row_stored)

    @property
    def samples(self) -> int:
        return len(self.sample_runtime)

    @property
    def stored_tokens(self) -> int:
        return int(self.row_stored.sum())

    @property
    def row_runtime(self) -> np.ndarray:
        """Runtime tokens of each row (stored minus one per sample)."""
        return self.row_stored - self.samples_per_row

    def locate_sample(self, index: int) -> tuple[str, int, int]:
        """``(file name, row in that file, sample in that row)`` of a sample number."""
        row = int(np.searchsorted(np.cumsum(self.samples_per_row), index, side="right"))
        sample = index - int(self.samples_per_row[:row].sum())
        file_ends = np.cumsum(self.file_rows)
        file_index = int(np.searchsorted(file_ends, row, side="right"))
        return self.files[file_index], row - int(file_ends[file_index] - self.file_rows[file_index]), sample


# ---------------------------------------------------------------------------------------------------
# The folder.


def _base(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _split_of(name: str, known: Sequence[str]) -> str | None:
    base = _base(name)
    prefix = base.split("_", 1)[0]
    return prefix if prefix in known and "_" in base else None


def _pack_size_of(name: str) -> int | None:
    m = _SHARD_RE.match(_base(name))
    return int(m.group("n")) if m else None


def _missing_parts(paths: Sequence[Path]) -> list[str]:
    """Shard names ``<split>_<N>.part-i-of-k`` absent from a set that holds some shard of that series."""
    have: dict[tuple[str, str, int], set[int]] = {}
    suffix: dict[tuple[str, str, int], str] = {}
    for p in paths:
        m = _SHARD_RE.match(p.name)
        if m and m.group("parts"):
            key = (m.group("split"), m.group("n"), int(m.group("parts")))
            have.setdefault(key, set()).add(int(m.group("part")))
            lowered = p.name.lower()
            suffix[key] = (
                p.name[lowered.rindex(".idx.") :] if ".idx." in lowered else p.name[lowered.rindex(".") :]
            )
    missing = []
    for (split, n, parts), found in sorted(have.items()):
        for i in range(parts):
            if i not in found:
                missing.append(f"{split}_{n}.part-{i:05d}-of-{parts:05d}{suffix[(split, n, parts)]}")
    return missing


@dataclass(frozen=True, kw_only=True)
class Alignment:
    """What rows must be collated with: pack size (the collate's ``max_seq_length``), ``pad_seq_to_mult`` and
    the EOS id (also the pad id). Recorded with the data (``manifest.json``, ``bridge_config.yaml``)."""

    pack_size: int
    pad_seq_to_mult: int
    eos_id: int


def _storage_errors_name_the_spec(open_: Callable[..., Any]) -> Callable[..., Any]:
    """An ``OSError`` while looking at the spec (a name too long for the file system, a folder that cannot
    be listed) becomes a :class:`PackedDataError` naming the spec."""

    @functools.wraps(open_)
    def wrapped(cls: Any, spec: Any, **kwargs: Any) -> Any:
        try:
            return open_(cls, spec, **kwargs)
        except PackedDataError:
            raise
        except OSError as exc:
            shown = str(spec) if len(str(spec)) <= 120 else str(spec)[:117] + "..."
            raise PackedDataError(f"packed data {shown}: cannot be read ({exc.strerror or exc})") from exc

    return wrapped


class PackedFolder:
    """Packed data opened from a folder, a file or a glob; see the module docstring. Use :meth:`open`."""

    #: The on-disk format of the data files (``"parquet"``: Megatron-Bridge's main format).
    format: str
    #: What was opened: ``"folder"`` (split by split) or ``"files"`` (a file, a glob or a list, as named).
    kind: str
    spec: str
    #: The folder holding the files (and the manifest and metadata); ``None`` for files in several folders.
    root: Path | None
    manifest: PackManifest | None
    metadata_path: Path | None
    #: Entries of ``<N>_metadata.jsonl`` (empty without one).
    metadata: tuple[dict[str, Any], ...]
    splits: dict[str, PackedSplit]

    def __init__(self) -> None:  # use open()
        self.format = "parquet"
        self.kind = "files"
        self.spec = ""
        self.root = None
        self.manifest = None
        self.metadata_path = None
        self.metadata = ()
        self.splits = {}
        self._named: tuple[Path, ...] = ()
        self._known: list[str] = list(SPLITS)
        self._names: list[str] = []
        self._on_disk: dict[str, list[str]] = {}
        self._pack_size_from_names: int | None = None
        self._allow_unfinished = False
        self._allow_no_manifest = False
        self._problems: list[str] = []
        self._sources: dict[Path, RowSource] = {}
        self._scans: dict[str, SplitScan] = {}

    # -- opening ------------------------------------------------------------------------------------
    @classmethod
    @_storage_errors_name_the_spec
    def open(
        cls,
        spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        split: str | None = None,
        allow_unfinished: bool = False,
        allow_no_manifest: bool = False,
        pack_size: int | None = None,
    ) -> PackedFolder:
        """Open packed data; raise :class:`PackedDataError` if it cannot be read.

        - ``spec``: the output folder, one file, a glob of shards, or a list of files (read in that order).
        - ``split``: expose only this split (``"training"`` / ``"validation"``); ``None`` exposes every split.
          Named files whose names carry no split form the split ``"files"``.
        - ``allow_unfinished``: open a folder without ``manifest.json``, or with missing shards, and report
          that in :meth:`validate` instead of refusing it (``longpack inspect`` does).
        - ``allow_no_manifest``: read a folder without ``manifest.json`` as Megatron-Bridge wrote it (its
          prepare step writes none): no complaint about the manifest; missing shards are still refused.
        - ``pack_size``: the pack size expected; picks among several ``<N>_metadata.jsonl`` (and shard sets
          ``<split>_<N>*``) in a Megatron-Bridge folder that holds more than one.
        """
        self = cls()
        self._allow_unfinished = allow_unfinished
        self._allow_no_manifest = allow_no_manifest
        globbed = False
        if isinstance(spec, str | os.PathLike):
            self.spec = os.fspath(spec)
            spec_path = Path(self.spec)
            if (
                spec_path.is_dir()
                and spec_path.name == VALIDATION_DIR
                and (spec_path.parent / MANIFEST_NAME).is_file()
                and split in (None, "validation")
            ):
                # <out>/validation: the validation split of that output folder.
                parent = cls.open(
                    spec_path.parent,
                    split="validation",
                    allow_unfinished=allow_unfinished,
                    allow_no_manifest=allow_no_manifest,
                    pack_size=pack_size,
                )
                parent.spec = self.spec
                return parent
            if os.path.isdir(self.spec):
                self.kind, self.root = "folder", Path(self.spec)
            else:
                self._named = tuple(Path(p) for p in self._resolve_named(self.spec))
                globbed = not os.path.isfile(self.spec)
        else:
            self._named = tuple(Path(p) for p in spec)
            self.spec = ", ".join(map(str, self._named))
            if not self._named:
                raise PackedDataError("no packed files given: name at least one Parquet file")
        if self.kind == "files":
            parents = {p.parent for p in self._named}
            self.root = parents.pop() if len(parents) == 1 else None
            if (
                self.root is not None
                and self.root.name == VALIDATION_DIR
                and (self.root.parent / MANIFEST_NAME).is_file()
            ):
                self.root = self.root.parent  # files of <out>/validation: the manifest is one level up
        self.manifest = self._read_manifest()
        if self.manifest is not None:
            self._known = list(dict.fromkeys([*self.manifest.split_names, *SPLITS]))
        if self.root is not None:
            self._names = sorted(p.name for p in self.root.iterdir() if p.is_file())
            sub = self.root / VALIDATION_DIR
            if sub.is_dir():
                self._names += sorted(f"{VALIDATION_DIR}/{p.name}" for p in sub.iterdir() if p.is_file())
        for name in self._names:
            if is_data_name(name) and not _base(name).startswith(".") and (s := _split_of(name, self._known)):
                self._on_disk.setdefault(s, []).append(name)
        self.format = self._detect_format()
        if self.kind == "folder":
            self._open_folder(pack_size)
        else:
            self._open_named(globbed)
        self._read_metadata(pack_size)
        if split is not None:
            if split not in self.splits:
                held = ", ".join(self.splits) or "no split"
                raise PackedDataError(
                    f"{self.spec}: no {split!r} split here (it holds {held}); pass one of those as split"
                )
            self.splits = {split: self.splits[split]}
        for opened in self.splits.values():
            for path in opened.files:
                self._sources.setdefault(path, ROW_SOURCES[_format_of(path.name)](path))
        return self

    def _detect_format(self) -> str:
        if self.manifest is not None:
            return self.manifest.output_format
        names = (
            [p.name for p in self._named] if self.kind == "files" else list(self._on_disk.get("training", ()))
        )
        names = names or [n for ns in self._on_disk.values() for n in ns]
        formats = {_format_of(n) for n in names}
        return formats.pop() if len(formats) == 1 else "parquet"

    def rel(self, path: Path) -> str:
        """A data file's name relative to the output folder (how the manifest names it)."""
        if self.root is not None:
            try:
                return path.relative_to(self.root).as_posix()
            except ValueError:
                pass
        return path.name

    def _resolve_named(self, text: str) -> list[str]:
        if text.lower().endswith(".npy"):
            if not os.path.isfile(text):
                raise PackedDataError(f"packed data {text}: no such file")
            return [text]
        if not os.path.exists(text) and not any(ch in text for ch in "*?[") and not is_parquet_name(text):
            raise PackedDataError(
                f"packed data {text}: no such file or folder; point at the folder `longpack pack` wrote, "
                "one of its .idx.parquet / .npy files, or a glob of shards"
            )
        found = resolve_packed_parquet_paths(text)
        if not found:
            raise PackedDataError(
                f"{text}: not packed Parquet data (expected a .parquet/.pq file, a folder or a glob of shards)"
            )
        return found

    def _read_manifest(self) -> PackManifest | None:
        if self.root is None or not (self.root / MANIFEST_NAME).is_file():
            return None
        try:
            return PackManifest.read(self.root / MANIFEST_NAME)
        except PackedDataError as exc:
            if not self._allow_unfinished:
                raise
            self._problems.append(str(exc))
            return None

    def _refuse_or_note(self, problem: str, fix: str) -> None:
        if not self._allow_unfinished:
            raise PackedDataError(f"{self.spec}: {problem}; {fix}")
        self._problems.append(problem)

    def _open_folder(self, pack_size_hint: int | None) -> None:
        assert self.root is not None
        root, manifest = self.root, self.manifest
        parquet = [n for n in self._names if is_data_name(n) and not _base(n).startswith(".")]
        if manifest is None and not parquet:
            raise PackedDataError(
                f"packed data {root}: no *.parquet / *.npy files and no {MANIFEST_NAME}; point at the folder "
                "`longpack pack` (or Megatron-Bridge) wrote"
            )
        if manifest is not None:
            for name, record in manifest.splits.items():
                listed = [root / f.name for f in record.files]
                for path in listed:
                    if not path.is_file():
                        self._refuse_or_note(
                            f"{name}: the manifest lists {self.rel(path)} but it is missing", _DAMAGED
                        )
                if present := tuple(p for p in listed if p.is_file()):
                    self.splits[name] = PackedSplit(name=name, files=present, record=record)
            for name in self._on_disk:
                if name not in manifest.splits:
                    self._refuse_or_note(
                        f"{name}: files present but the manifest lists no such split",
                        "the folder mixes outputs: pack again into a fresh folder",
                    )
        else:
            example = f"{root}/training_*.idx.parquet" if "training" in self._on_disk else f"{root}/*.parquet"
            if (root / MANIFEST_NAME).is_file():
                pass  # there, but unreadable: _read_manifest noted why (or raised)
            elif not self._allow_no_manifest:
                self._refuse_or_note(
                    f"no {MANIFEST_NAME}: this output is unfinished (an interrupted or still-running `longpack "
                    "pack`)",
                    "pack it again into a fresh folder; a folder Megatron-Bridge's prepare step wrote has no "
                    "manifest: pass --no-manifest-ok (allow_no_manifest=True) to read it, or name its files "
                    f"with a glob such as {example}",
                )
            # A Megatron-Bridge folder holds one shard set per pack size: read one of them.
            sizes = sorted({n for names in self._on_disk.values() for x in names if (n := _pack_size_of(x))})
            if pack_size_hint in sizes or len(sizes) == 1:
                self._pack_size_from_names = pack_size_hint if pack_size_hint in sizes else sizes[0]
            elif sizes:
                raise PackedDataError(
                    f"{root}: holds packs of several pack sizes ({', '.join(map(str, sizes))}); pass the one "
                    "you mean as pack_size"
                )
            for name in self._known:
                files = [root / x for x in self._on_disk.get(name, ()) if self._same_pack_size(x)]
                if files:
                    self.splits[name] = PackedSplit(name=name, files=tuple(files))
                for missing in _missing_parts(files):
                    self._refuse_or_note(f"{name}: shard {missing} is missing", _INCOMPLETE)
        if not self.splits:
            others = [n for n in parquet if _split_of(n, self._known) is None]
            shown = (
                f" (it holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''})" if others else ""
            )
            self._refuse_or_note(
                f"no training_*/validation_* packed files here{shown}",
                f"name the files with a glob such as {root}/*.parquet to read them as Megatron-Bridge does",
            )

    def _same_pack_size(self, name: str) -> bool:
        return _pack_size_of(name) in (None, self._pack_size_from_names)

    def _open_named(self, globbed: bool) -> None:
        records = self.manifest.splits if self.manifest is not None else {}
        groups: dict[str, list[Path]] = {}
        for path in self._named:
            groups.setdefault(_split_of(path.name, self._known) or UNSPLIT, []).append(path)
        self.splits = {
            name: PackedSplit(name=name, files=tuple(paths), record=records.get(name))
            for name, paths in groups.items()
        }
        if globbed:  # a glob that matches part of a shard series missed the rest
            for missing in _missing_parts(self._named):
                self._refuse_or_note(f"shard {missing} is missing from the files named", _INCOMPLETE)
        sizes = {n for p in self._named if (n := _pack_size_of(p.name))}
        self._pack_size_from_names = sizes.pop() if len(sizes) == 1 else None

    def _read_metadata(self, pack_size_hint: int | None) -> None:
        if self.root is None:
            return
        wanted = self.manifest.metadata_file.get("name") if self.manifest is not None else None
        n = (
            pack_size_hint
            or (self.manifest.pack_size if self.manifest else None)
            or self._pack_size_from_names
        )
        by_n = sorted((int(m.group(1)), x) for x in self._names if (m := _META_RE.match(x)))
        names = [x for _, x in by_n]
        for candidate in (wanted, metadata_name(n) if n else None, names[0] if names else None):
            if candidate in names:
                self.metadata_path = self.root / candidate
                break
        if self.metadata_path is not None:
            try:
                self.metadata = read_metadata_file(self.metadata_path)
            except PackedDataError as exc:
                if not self._allow_unfinished:
                    raise
                self._problems.append(str(exc))
        # Entries follow the splits the folder holds, in writing order (training first).
        if self.manifest is not None:
            order = [s for s in self._known if s in self.manifest.splits]
        else:
            order = [s for s in self._known if any(map(self._same_pack_size, self._on_disk.get(s, ())))]
        for name, s in self.splits.items():
            if name in order and order.index(name) < len(self.metadata):
                self.splits[name] = PackedSplit(
                    name=name, files=s.files, record=s.record, metadata=self.metadata[order.index(name)]
                )

    # -- what the data is ---------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether a manifest vouches for the files (``longpack pack`` writes it last)."""
        return self.manifest is not None

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(self.splits)

    @property
    def all_files(self) -> tuple[Path, ...]:
        """Every data file opened: as named for a file or glob, split after split for a folder."""
        if self.kind == "files":
            kept = {p for s in self.splits.values() for p in s.files}
            return tuple(p for p in self._named if p in kept)
        return tuple(p for s in self.splits.values() for p in s.files)

    def files(self, split: str | None = None) -> tuple[Path, ...]:
        """The data files of ``split`` in row order. ``split`` may be left out for named files (all of them,
        as Megatron-Bridge reads them) or a folder holding one split; a folder holding both needs it."""
        if split is not None:
            return self._split(split).files
        if self.kind == "files" or len(self.splits) == 1:
            return self.all_files
        held = ", ".join(f"{n} ({self.source_rows(n)} rows)" for n in self.splits)
        raise PackedDataError(
            f"{self.spec} holds {held}; a reader takes one split: pass split='training' or split='validation'"
        )

    def sources(self, split: str | None = None) -> list[RowSource]:
        """The row source of each file of :meth:`files` (footers already read)."""
        return [self._sources[p] for p in self.files(split)]

    def source_rows(self, split: str) -> int:
        """Rows of a split, from the file footers."""
        return sum(self._sources[p].num_rows for p in self._split(split).files)

    @property
    def pack_size(self) -> int | None:
        """N: from the manifest, else the metadata entries, else the metadata file name, else shard names."""
        if self.manifest is not None and self.manifest.pack_size:
            return self.manifest.pack_size
        for entry in self.metadata:
            value = entry.get("pack_size")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        if self.metadata_path is not None:
            m = _META_RE.match(self.metadata_path.name)
            assert m is not None
            return int(m.group(1))
        return self._pack_size_from_names

    @property
    def pad_seq_to_mult(self) -> int | None:
        """From the manifest, else from a Megatron-Bridge folder name (``..._pad_seq_to_mult<P>_sft_...``)."""
        if self.manifest is not None and self.manifest.pad_seq_to_mult is not None:
            return self.manifest.pad_seq_to_mult
        if self.root is not None:
            m = _DIR_MULT_RE.search(self.root.name + "_")
            if m and m.group(1) != "None":
                return int(m.group(1))
        return None

    @property
    def eos_id(self) -> int | None:
        """The tokenizer's EOS id (also the pad id), from the manifest."""
        return None if self.manifest is None else self.manifest.eos_id

    def alignment(
        self, *, pack_size: int | None = None, pad_seq_to_mult: int | None = None, eos_id: int | None = None
    ) -> Alignment:
        """The alignment to collate with: what the data records, a given value where nothing is recorded;
        a given value that contradicts the record is refused (the batch would not be the one Bridge builds
        from these files, or Bridge would read them with the wrong layout).

        >>> import tempfile
        >>> from longpack.packed.pipeline import PackSettings, Provenance, plan_splits, write_packed_output
        >>> from longpack.samples import TokenizedSamples
        >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2]), loss_mask=np.ones(5, np.uint8),
        ...     offsets=np.array([0, 3, 5]), source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]),
        ...     files=("a",))
        >>> out = Path(tempfile.mkdtemp()) / "p"
        >>> _ = write_packed_output(out, plan_splits(s, PackSettings(seq_length=4, pad_seq_to_mult=2), eos_id=2),
        ...                         PackSettings(seq_length=4, pad_seq_to_mult=2), Provenance())
        >>> PackedFolder.open(out).alignment()
        Alignment(pack_size=4, pad_seq_to_mult=2, eos_id=2)
        >>> PackedFolder.open(out).alignment(pad_seq_to_mult=1)
        Traceback (most recent call last):
        ...
        longpack.errors.PackedDataError: pad_seq_to_mult 1 given, but the data was packed with pad_seq_to_mult=2 (manifest.json); drop it or pass 2
        """
        values: dict[str, int | None] = {}
        for name, given, recorded in (
            ("pack_size", pack_size, self.pack_size),
            ("pad_seq_to_mult", pad_seq_to_mult, self.pad_seq_to_mult),
            ("eos_id", eos_id, self.eos_id),
        ):
            if given is not None and recorded is not None and given != recorded:
                where = "manifest.json" if self.manifest is not None else "the file and folder names"
                raise PackedDataError(
                    f"{name} {given} given, but the data was packed with {name}={recorded} ({where}); drop it "
                    f"or pass {recorded}",
                    fields=name,
                )
            values[name] = recorded if given is None else given
        if values["pad_seq_to_mult"] is None:
            values["pad_seq_to_mult"] = 1
        missing = [k for k in ("pack_size", "eos_id") if values[k] is None]
        if missing:
            raise PackedDataError(
                f"{self.spec}: the data records no {' and no '.join(missing)} (no manifest.json); pass "
                f"{' and '.join(missing)}",
                fields=tuple(missing),
            )
        return Alignment(
            pack_size=int(values["pack_size"] or 0),
            pad_seq_to_mult=int(values["pad_seq_to_mult"] or 1),
            eos_id=int(values["eos_id"] or 0),
        )

    def _split(self, name: str) -> PackedSplit:
        if name not in self.splits:
            raise PackedDataError(
                f"{self.spec}: no {name!r} split (it holds {', '.join(self.splits) or 'none'})"
            )
        return self.splits[name]

    # -- rows ---------------------------------------------------------------------------------------
    def scan(self, split: str, *, verify: bool = False) -> SplitScan:
        """Read every row group of a split once (``loss_mask`` and ``seq_start_id``; with ``verify`` also
        ``input_ids`` and every row check). Cached: a verified scan also answers unverified requests."""
        cached = self._scans.get(split)
        if cached is not None and (cached.verified or not verify):
            return cached
        s = self._split(split)
        pack_size, multiple = self.pack_size, self.pad_seq_to_mult or 1
        settings = self.manifest.settings if self.manifest is not None else ManifestSettings()
        group_limit = settings.row_group_size or ROW_GROUP_SIZE
        # One-token samples (runtime length 0) are Bridge's: its prepare step keeps them, and so does
        # ``longpack pack --compat megatron-bridge``; elsewhere one is a packing bug.
        allow_empty = self.manifest is None or bool(settings.keep_single_token)
        columns = REQUIRED_COLUMNS if verify else ("loss_mask", "seq_start_id")
        stored, per_row, runtime, problems = [], [], [], []
        supervised = 0
        for path in s.files:
            source = self._sources[path]
            first = 0
            for batch in _group_batches(source.group_rows, source.file_row_groups):
                group, n = batch[0], sum(source.group_rows[g] for g in batch)
                if len(batch) == 1:
                    cols = source.read_group(group, columns)
                else:  # many small row groups: read together
                    assert isinstance(source, ParquetRowSource)
                    cols = source.read_groups(batch, columns)
                mask, starts_col = cols["loss_mask"], cols["seq_start_id"]
                row_len = cols["input_ids"].lengths if verify else mask.lengths
                starts = starts_col.values.astype(np.int64, copy=False)
                n_starts = starts_col.lengths
                seg = _sample_runtime(row_len, starts_col.offsets, starts)
                stored.append(row_len)
                per_row.append(n_starts)
                runtime.append(seg)
                supervised += int(np.count_nonzero(mask.values))  # positions that train (0/1 mask)
                if verify:
                    where = f"{self.rel(path)} row group {group}"
                    if len(batch) > 1:
                        where = f"{self.rel(path)} row groups {group}-{batch[-1]}"
                    problems += _group_problems(
                        where,
                        first,
                        row_len,
                        mask,
                        starts_col.offsets,
                        starts,
                        seg,
                        pack_size,
                        multiple,
                        allow_empty=allow_empty,
                    )
                    for g in batch:
                        rows_g = source.group_rows[g]
                        if rows_g > group_limit and source.file_row_groups:
                            problems.append(
                                f"{self.rel(path)} row group {g}: {rows_g} rows > row group size {group_limit}"
                            )
                first += n
        empty = np.zeros(0, np.int64)
        scan = SplitScan(
            name=split,
            files=tuple(self.rel(p) for p in s.files),
            file_rows=tuple(self._sources[p].num_rows for p in s.files),
            row_stored=np.concatenate(stored).astype(np.int64) if stored else empty,
            samples_per_row=np.concatenate(per_row).astype(np.int64) if per_row else empty,
            sample_runtime=np.concatenate(runtime).astype(np.int64) if runtime else empty,
            supervised_tokens=supervised,
            verified=verify,
            problems=tuple(problems),
        )
        self._scans[split] = scan
        return scan

    def row_lengths(self, split: str) -> np.ndarray:
        """Stored tokens of every row of a split (int64)."""
        return self.scan(split).row_stored

    def sample_lengths(self, split: str) -> np.ndarray:
        """Runtime length of every packed sample of a split, row after row (int64)."""
        return self.scan(split).sample_runtime

    # -- checks -------------------------------------------------------------------------------------
    def validate(self, *, verify: bool = False) -> list[str]:
        """What is wrong with the data, one message each (empty = nothing found).

        Always: an unreadable or missing manifest, missing shards, files the manifest does not know. With
        ``verify`` (what ``longpack inspect --verify`` checks): every row (Megatron-Bridge's ``validate_row``,
        alignment to ``pad_seq_to_mult``, pack size, 0/1 loss mask ending in 0 per sample), the metadata entry
        recomputed from the rows, and the manifest against the files (sizes, sha256, counts, metadata).
        """
        problems = list(self._problems)
        if not verify:
            return problems
        problems += self._pack_size_problems()
        for name, s in self.splits.items():
            scan = self.scan(name, verify=True)
            problems += [f"{name}: {e}" for e in scan.problems]
            size = self.pack_size or (int(scan.row_runtime.max()) if scan.rows else 1)
            if scan.samples and s.metadata is not None and (scan.samples_per_row > 0).all():
                plan = PackPlan(
                    order=np.arange(scan.samples, dtype=np.int64),
                    row_offsets=np.concatenate([[0], np.cumsum(scan.samples_per_row)]).astype(np.int64),
                )
                recomputed = pack_metadata(scan.sample_runtime, plan, size)
                if s.metadata != recomputed:
                    problems.append(f"{name}: metadata file entry {s.metadata} != files give {recomputed}")
            if s.record is not None:
                problems += self._check_record(s, scan)
        if self.manifest is not None and self.kind == "folder":
            problems += self._check_manifest_files()
        return problems

    def _pack_size_problems(self) -> list[str]:
        """Every place that states the pack size N (manifest, metadata entries, metadata and shard file
        names) must state the same N: a reader takes whichever it finds first."""
        said, problems = self._manifest_states(
            (
                ("alignment", "pack_size"),
                ("settings", "pack_size"),
                ("megatron_bridge", "packed_sequence_size"),
            )
        )
        multiples, problems_m = self._manifest_states(
            (
                ("alignment", "pad_seq_to_mult"),
                ("settings", "pad_seq_to_mult"),
                ("megatron_bridge", "pad_seq_to_mult"),
            )
        )
        problems += problems_m
        if len(set(multiples.values())) > 1:
            listed = ", ".join(f"{where} {value}" for where, value in multiples.items())
            problems.append(f"pad_seq_to_mult is stated differently: {listed}")
        entries: set[int] = set()
        for e in self.metadata:
            stated = e.get("pack_size")
            if isinstance(stated, int) and not isinstance(stated, bool):
                entries.add(stated)
        for value in sorted(entries):
            said[f"{self.metadata_path.name if self.metadata_path else 'metadata'} entries"] = int(value)
        if self.metadata_path is not None and (m := _META_RE.match(self.metadata_path.name)):
            said[f"the metadata file name {self.metadata_path.name}"] = int(m.group(1))
        for value in sorted(
            {n for s in self.splits.values() for f in s.files if (n := _pack_size_of(f.name))}
        ):
            said[
                f"shard file names ({value})" if "the shard file names" in said else "the shard file names"
            ] = value
        if len(set(said.values())) <= 1:
            return problems
        listed = ", ".join(f"{where} {value}" for where, value in said.items())
        return [f"the pack size is stated differently: {listed}", *problems]

    def _manifest_states(self, places: Sequence[tuple[str, str]]) -> tuple[dict[str, int], list[str]]:
        """What the manifest states at ``places`` (``(section, key)``): the positive integers, by place, and
        a problem for each place that holds something else (a damaged record: ``"abc"``, 0, null, 10**30)."""
        said: dict[str, int] = {}
        problems: list[str] = []
        if self.manifest is None:
            return said, problems
        record = self.manifest.to_dict()
        for section, key in places:
            part = record.get(section)
            if not isinstance(part, dict) or part.get(key) is None:  # not stated there
                continue
            value = part[key]
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_RECORDED_SIZE:
                said[f"manifest.json {section}.{key}"] = value
            else:
                problems.append(
                    f"manifest.json {section}.{key} is {str(value)[:40]!r}, not a positive integer of at most "
                    f"{MAX_RECORDED_SIZE}: the manifest is damaged; pack the folder again"
                )
        return said, problems

    def _check_record(self, s: PackedSplit, scan: SplitScan) -> list[str]:
        record, problems = s.record, []
        assert record is not None
        if self.kind == "folder":
            listed, held = list(record.file_names), self._on_disk.get(s.name, [])
            if listed != held:
                problems.append(f"{s.name}: manifest lists files {listed}, folder holds {held}")
        by_name = {f.name: f for f in record.files}
        for path in s.files:
            entry = by_name.get(self.rel(path))
            if entry is None:
                problems.append(f"{s.name}: {self.rel(path)} is not listed in the manifest")
            elif path.stat().st_size != entry.size_bytes or sha256_file(path) != entry.sha256:
                problems.append(f"{s.name}: {self.rel(path)} differs from the manifest (size or sha256)")
        if self.kind == "files" and set(by_name) != {self.rel(p) for p in s.files}:
            return problems  # a subset of the split was named: its counts are not the split's
        for what, expected, found in (
            ("rows", record.rows, scan.rows),
            ("samples", record.samples_packed, scan.samples),
            ("stored tokens", record.stored_tokens, scan.stored_tokens),
        ):
            if expected != found:
                problems.append(f"{s.name}: manifest says {expected} {what}, files hold {found}")
        return problems

    def _check_manifest_files(self) -> list[str]:
        assert self.manifest is not None and self.root is not None
        problems = []
        for split, record in self.manifest.splits.items():
            if not any((self.root / f.name).is_file() for f in record.files) and not self._on_disk.get(split):
                problems.append(f"{split}: the manifest lists this split but no files are present")
        meta_record = self.manifest.metadata_file
        pack_size = self.manifest.pack_size
        name: str | None = meta_record.get("name") or (metadata_name(pack_size) if pack_size else None)
        if name is None or not (self.root / name).is_file():
            problems.append(f"metadata file {name} is missing")
        elif sha256_file(self.root / name) != meta_record.get("sha256"):
            problems.append(f"{name} differs from the manifest (sha256)")
        elif self.metadata_path is not None and self.metadata_path.name == name:
            expected = [self.manifest.splits[s].metadata for s in SPLITS if s in self.manifest.splits]
            if list(self.metadata) != expected:
                problems.append(f"{name} does not match the manifest's per-split metadata")
        return problems

    def close(self) -> None:
        """Close every open file handle (reading again reopens them)."""
        for source in self._sources.values():
            source.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_scans": {}}

    def __repr__(self) -> str:
        splits = ", ".join(f"{n}: {len(s.files)} file(s)" for n, s in self.splits.items())
        return f"PackedFolder({self.spec!r}, format={self.format!r}, {splits}, finished={self.finished})"


def _group_batches(group_rows: Sequence[int], batched: bool, rows: int = ROW_GROUP_SIZE) -> list[list[int]]:
    """Consecutive row groups read together by a scan: up to ``rows`` rows per read (a group larger than
    that alone).

    >>> _group_batches([1, 1, 1, 500, 2], True, rows=2)
    [[0, 1], [2], [3], [4]]
    """
    if not batched:
        return [[g] for g in range(len(group_rows))]
    out: list[list[int]] = []
    total = 0
    for g, n in enumerate(group_rows):
        if out and total + n <= rows:
            out[-1].append(g)
            total += n
        else:
            out.append([g])
            total = n
    return out


def _group_problems(
    where: str,
    first_row: int,
    row_len: np.ndarray,
    mask: ListColumn,
    start_offsets: np.ndarray,
    starts: np.ndarray,
    seg_runtime: np.ndarray,
    pack_size: int | None,
    multiple: int,
    *,
    allow_empty: bool = False,
) -> list[str]:
    """Every check ``inspect --verify`` runs on one row group; rows are numbered within the file.
    ``allow_empty``: a one-token sample (runtime length 0) is not a problem (Megatron-Bridge keeps them)."""
    problems = [
        f"{where}: row {first_row + r}: {message}"
        for r, message in _row_checks(row_len, mask.lengths, start_offsets, starts)
    ]
    if not starts.size:
        return problems
    n_starts = np.diff(start_offsets)
    row_of = np.repeat(np.arange(len(n_starts)), n_starts)
    lowest = 0 if allow_empty else 1
    if (seg_runtime < lowest).any():
        r = int(row_of[np.flatnonzero(seg_runtime < lowest)[0]])
        problems.append(f"{where}: row {first_row + r} has a sample whose runtime length is < {lowest}")
    if multiple > 1 and (seg_runtime % multiple).any():
        r = int(row_of[np.flatnonzero(seg_runtime % multiple)[0]])
        problems.append(
            f"{where}: row {first_row + r} has a sample whose runtime length is not a multiple of "
            f"pad_seq_to_mult={multiple}"
        )
    over = row_len - n_starts > pack_size if pack_size is not None else np.zeros(0, bool)
    if over.any():
        r = int(np.flatnonzero(over)[0])
        problems.append(f"{where}: row {first_row + r} holds more than pack_size={pack_size} runtime tokens")
    values = mask.values
    if values.size and ((values != 0) & (values != 1)).any():
        problems.append(f"{where}: loss_mask holds values other than 0/1")
    if values.size and np.array_equal(mask.lengths, row_len):
        last_pos = mask.offsets[:-1][row_of] + starts + seg_runtime  # each sample's last stored position
        inside = (last_pos >= 0) & (last_pos < values.size)
        if values[last_pos[inside]].any():
            r = int(row_of[np.flatnonzero(inside)[np.flatnonzero(values[last_pos[inside]])[0]]])
            problems.append(f"{where}: row {first_row + r}: a sample's last loss_mask position is not 0")
    return problems
