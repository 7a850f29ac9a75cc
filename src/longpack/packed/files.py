"""Packed files on disk: names, Parquet writer options, and Megatron-Bridge's path rule. No torch.

Layout of one output folder (``N`` = pack size, in runtime tokens)::

    training_<N>.idx.parquet                 one file when the split fits in one shard, else
    training_<N>.part-00000-of-00003.idx.parquet, ...   (sorted name order = row order)
    validation/validation_<N>.idx.parquet    same naming, only with a validation split, in its own folder
    <N>_metadata.jsonl                       one JSON array, one dict per split (train first)
    bridge_config.yaml                       the Megatron-Bridge dataset config of this output
    manifest.json                            written last; its absence marks an unfinished output

With ``output_format="npy"`` each split is one ``training_<N>.npy`` / ``validation/validation_<N>.npy``.

The validation split lives in its own folder so that no path spec mixes the splits: Megatron-Bridge reads a
folder as every ``*.parquet`` directly in it, so the output folder itself reads the training split only (and
``<out>/validation`` the validation split). The glob ``training_<N>*.idx.parquet`` matches both shard forms,
and Bridge's reader sorts a glob, so it is always a valid ``packed_train_data_path``. Reading a folder back
is :class:`longpack.packed.folder.PackedFolder`'s job.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from longpack.choices import DEFAULT_IDS_DTYPE, DEFAULT_OUTPUT_FORMAT
from longpack.choices import SPLITS as SPLITS
from longpack.errors import PackedDataError

# The atomic writes and the file digest live in ``longpack.outputs`` (one set for every layer); these names
# stay importable from here for the packed writers' callers.
from longpack.outputs import atomic_write_bytes as atomic_write_bytes
from longpack.outputs import commit_file as commit_file
from longpack.outputs import sha256_file as sha256_file
from longpack.outputs import temp_path as temp_path
from longpack.packed.formats import OUTPUT_FORMAT
from longpack.validate import one_of

#: Rows per Parquet row group Megatron-Bridge's own writer uses (``write_packed_parquet``).
BRIDGE_ROW_GROUP_SIZE = 500
#: At most this many rows per row group (Bridge's own size); also the group size of legacy outputs.
ROW_GROUP_SIZE = 500
#: Tokens per row group longpack aims at by default. Bridge's reader decodes a whole row group for every
#: random access (its sampler shuffles rows, so nearly every access misses its one-group cache): with
#: 8,192-token rows, 500-row groups read ~3 random rows/s and 8-row groups ~300 (``benchmarks/row_groups.py``),
#: at the same file size (+0.2 %) and a footer of ~0.3 KiB per group.
ROW_GROUP_TOKENS = 2**16


def default_row_group_size(pack_size: int) -> int:
    """Rows per row group by default: about :data:`ROW_GROUP_TOKENS` runtime tokens, 1 to 500 rows.

    >>> [default_row_group_size(n) for n in (128, 1024, 4096, 8192, 131072)]
    [500, 64, 16, 8, 1]
    """
    return max(1, min(ROW_GROUP_SIZE, ROW_GROUP_TOKENS // max(1, pack_size)))


#: Folder (inside the output folder) that holds the validation split, so that no folder path or glob of
#: the output folder reads training and validation rows together.
VALIDATION_DIR = "validation"
#: The columns Megatron-Bridge reads; any other column is ignored.
REQUIRED_COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
PARQUET_SUFFIXES = (".parquet", ".pq")


def default_rows_per_shard(pack_size: int) -> int:
    """Rows per shard: about 2**27 runtime tokens (~0.5-1 GB on disk), a multiple of 500, at least 500.

    >>> default_rows_per_shard(4096), default_rows_per_shard(131072)
    (32500, 1000)
    """
    return max(ROW_GROUP_SIZE, (2**27 // pack_size) // ROW_GROUP_SIZE * ROW_GROUP_SIZE)


#: File suffix of each output format written as shard files (Bridge's default names: ``training_<N>.idx.parquet``,
#: ``training_<N>.npy``), from the format records (``longpack.packed.formats``).
FORMAT_SUFFIXES = {name: f.suffix for name, f in OUTPUT_FORMAT.items() if f.suffix is not None}


def shard_names(
    split: str, pack_size: int, num_shards: int, *, output_format: str = DEFAULT_OUTPUT_FORMAT
) -> list[str]:
    """File names of a split's shards (base names; see :func:`split_folder` for where they go).

    >>> shard_names("training", 4096, 1), shard_names("training", 8, 1, output_format="npy")
    (['training_4096.idx.parquet'], ['training_8.npy'])
    >>> shard_names("validation", 8, 2)
    ['validation_8.part-00000-of-00002.idx.parquet', 'validation_8.part-00001-of-00002.idx.parquet']
    """
    suffix = FORMAT_SUFFIXES[output_format]
    if num_shards <= 1:
        return [f"{split}_{pack_size}{suffix}"]
    return [f"{split}_{pack_size}.part-{i:05d}-of-{num_shards:05d}{suffix}" for i in range(num_shards)]


def split_folder(split: str) -> str:
    """The folder (relative to the output folder, ``""`` = the folder itself) that holds a split's files.

    >>> split_folder("training"), split_folder("validation")
    ('', 'validation')
    """
    return "" if split == "training" else split


def split_relpath(split: str, name: str) -> str:
    """A split's file name relative to the output folder (what the manifest records).

    >>> split_relpath("training", "training_8.idx.parquet"), split_relpath("validation", "validation_8.npy")
    ('training_8.idx.parquet', 'validation/validation_8.npy')
    """
    folder = split_folder(split)
    return f"{folder}/{name}" if folder else name


def split_spec(
    split: str, pack_size: int, num_shards: int, *, output_format: str = DEFAULT_OUTPUT_FORMAT
) -> str:
    """The path spec (relative to the output folder) a Megatron-Bridge config should use for a split.

    >>> split_spec("training", 4096, 1), split_spec("training", 4096, 3), split_spec("validation", 8, 1)
    ('training_4096.idx.parquet', 'training_4096.part-*.idx.parquet', 'validation/validation_8.idx.parquet')
    """
    if num_shards <= 1:
        name = shard_names(split, pack_size, 1, output_format=output_format)[0]
    else:
        name = f"{split}_{pack_size}.part-*{FORMAT_SUFFIXES[output_format]}"
    return split_relpath(split, name)


def metadata_name(pack_size: int) -> str:
    """``<N>_metadata.jsonl``.

    >>> metadata_name(4096)
    '4096_metadata.jsonl'
    """
    return f"{pack_size}_metadata.jsonl"


#: The Parquet leaf path of the ``loss_mask`` list column. pyarrow's ``use_dictionary`` names leaf columns:
#: ``["loss_mask"]`` matches nothing in a list column and silently writes the mask plain.
LOSS_MASK_LEAF = "loss_mask.list.element"


@dataclass(frozen=True, kw_only=True)
class ParquetWriterOptions:
    """How packed rows are encoded; fixed per output so the same rows give the same bytes.

    - ``row_group_size``: rows per row group. Megatron-Bridge's reader decodes a whole row group for a
      random access (and caches one), so smaller groups read faster at random and cost some file size.
    - ``use_dictionary``: ``True`` (every column, pyarrow's default and what Bridge writes) or the leaf
      paths that get dictionary pages.
    - ``write_statistics``: min/max page statistics (Bridge writes them; no packed reader uses them).
    - ``max_rows_per_page``: ``1`` writes every row as its own data page, so a reader can decode one row
      without its group (``longpack.packed.pages``: longpack's reader does; pyarrow and Bridge read groups
      as before). ``None``: pyarrow's pages (what Bridge writes).
    - ``data_page_size``: the page size pyarrow aims at, in bytes (``None``: its 1 MiB); one-row pages need
      it above a row's size, so that no row is split over two pages.
    - ``compression``: the pages' codec, one of :data:`COMPRESSIONS` (``"snappy"``: pyarrow's default and
      what Bridge writes; ``"none"``: longpack's layout, whose rows a reader takes straight from a memory
      map of the file, at about 1.7x the file size of snappy for token ids).

    >>> ParquetWriterOptions().writer_kwargs()["use_dictionary"]
    ['loss_mask.list.element']
    >>> ParquetWriterOptions(row_group_size=0)
    Traceback (most recent call last):
    ...
    longpack.errors.PackedDataError: row_group_size must be a positive integer, got 0
    """

    row_group_size: int = BRIDGE_ROW_GROUP_SIZE
    use_dictionary: bool | tuple[str, ...] = (LOSS_MASK_LEAF,)
    write_statistics: bool = False
    max_rows_per_page: int | None = None
    data_page_size: int | None = None
    compression: str = "snappy"

    def __post_init__(self) -> None:
        one_of(self.compression, COMPRESSIONS, "compression", error=PackedDataError)
        if not isinstance(self.row_group_size, int) or self.row_group_size < 1:
            raise PackedDataError(f"row_group_size must be a positive integer, got {self.row_group_size!r}")
        for name in ("max_rows_per_page", "data_page_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise PackedDataError(f"{name} must be a positive integer or None, got {value!r}")

    def writer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.parquet.ParquetWriter`` (besides the schema)."""
        use_dictionary: bool | list[str] = (
            self.use_dictionary if isinstance(self.use_dictionary, bool) else list(self.use_dictionary)
        )
        kwargs: dict[str, Any] = {
            "compression": self.compression,
            "use_dictionary": use_dictionary,
            "write_statistics": self.write_statistics,
        }
        if self.max_rows_per_page is not None:
            kwargs["max_rows_per_page"] = self.max_rows_per_page
        if self.data_page_size is not None:
            kwargs["data_page_size"] = self.data_page_size
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        """The options as the manifest records them."""
        return {
            "row_group_size": self.row_group_size,
            "use_dictionary": self.use_dictionary
            if isinstance(self.use_dictionary, bool)
            else list(self.use_dictionary),
            "write_statistics": self.write_statistics,
            "compression": self.compression,
            "max_rows_per_page": self.max_rows_per_page,
            "data_page_size": self.data_page_size,
        }


def one_row_pages(pack_size: int) -> dict[str, Any]:
    """The page options longpack writes with: one row per data page, pages larger than any row (a row of
    ``pack_size`` int64 ids takes 8 bytes a token; twice that and at least 1 MiB), uncompressed, so that a
    reader finds a row's values in the file's bytes (``longpack.packed.pages.row_values``: a memory map,
    no decoding of token ids).

    >>> one_row_pages(8192)
    {'max_rows_per_page': 1, 'data_page_size': 1048576, 'compression': 'none'}
    """
    return {"max_rows_per_page": 1, "data_page_size": max(2**20, 16 * pack_size), "compression": "none"}


#: Page codecs a packed Parquet file may be written with (pyarrow's names).
COMPRESSIONS = ("snappy", "none")


#: What Megatron-Bridge's ``write_packed_parquet`` writes: ``pq.write_table(table, path, row_group_size=500)``
#: with pyarrow's defaults (dictionary pages for every column, statistics, snappy).
BRIDGE_WRITER_OPTIONS = ParquetWriterOptions(
    row_group_size=BRIDGE_ROW_GROUP_SIZE, use_dictionary=True, write_statistics=True
)


def local_path(path: str | os.PathLike[str]) -> str:
    """``path`` as pyarrow must be given a local file: absolute (pyarrow reads a relative ``s3:x/y.parquet``,
    a folder named ``s3:x``, as a URI of scheme ``s3``).

    >>> local_path("/data/s3:x/training_8.idx.parquet")
    '/data/s3:x/training_8.idx.parquet'
    """
    return os.path.abspath(os.fspath(path))


def open_parquet_writer(
    path: Path | Any, *, ids_dtype: str = DEFAULT_IDS_DTYPE, options: ParquetWriterOptions | None = None
) -> pq.ParquetWriter:
    """A writer with fixed options, so the same rows give the same bytes (``path``: a path or a binary file)."""
    from longpack.packed.rows import arrow_schema

    # By default dictionary pages only for the 0/1 mask: token ids mostly fall back to plain after 1 MB.
    opts = options or ParquetWriterOptions()
    schema = arrow_schema(ids_dtype)
    if opts.max_rows_per_page == 1:  # said in the file, so a reader of the file alone knows it
        schema = schema.with_metadata({ONE_ROW_PAGES_KEY: b"1"})
    if isinstance(path, str | os.PathLike):
        # A local path, always: given a string, pyarrow reads "s3:x/y.parquet" as a URI.
        from pyarrow.fs import LocalFileSystem

        return pq.ParquetWriter(
            local_path(path), schema, filesystem=LocalFileSystem(), **opts.writer_kwargs()
        )
    return pq.ParquetWriter(path, schema, **opts.writer_kwargs())


#: Key of the Parquet file's (Arrow schema) metadata that says every row is its own data page.
ONE_ROW_PAGES_KEY = b"longpack.one_row_per_page"


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
