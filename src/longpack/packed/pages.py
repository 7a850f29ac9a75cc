"""Read one row of a packed Parquet file without decoding its whole row group: page by page.

pyarrow reads row groups, not rows: a random access to a row decodes every row of its group. longpack writes
each packed row as its own data page (``max_rows_per_page=1`` and pages larger than a row,
``longpack.packed.files.ParquetWriterOptions``), so the row ``k`` of a row group is the ``k``-th data page of
each column chunk. This module walks the page
headers of a column chunk (Parquet's Thrift compact encoding: a few bytes per page, the payloads skipped),
decompresses the page that holds the row and decodes it: ``PLAIN`` or dictionary-encoded (``RLE_DICTIONARY``)
``INT32``/``INT64`` values of a ``list<int>`` column without nulls, in version-1 data pages.

Anything else (nulls, other encodings, version-2 pages, several rows in one page where the row boundaries
are needed, a damaged header) makes :func:`read_row` return ``None`` and the caller falls back to pyarrow's
row-group read, which gives the same values; the tests compare the two on every row of files written with
either writer.

>>> import pyarrow as pa, pyarrow.parquet as pq, io
>>> buf = io.BytesIO()
>>> table = pa.table({"input_ids": [[5, 6, 2], [7, 2]], "loss_mask": pa.array([[1, 1, 0], [1, 0]], pa.list_(pa.int8()))})
>>> pq.write_table(table, buf, row_group_size=2, max_rows_per_page=1, use_dictionary=["loss_mask.list.element"])
>>> reader = ChunkReader(buf.getvalue())
>>> md = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata
>>> [read_row(reader, md.row_group(0).column(c), 1, 2).tolist() for c in range(2)]
[[7, 2], [1, 0]]
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["ChunkReader", "ChunkRows", "chunk_rows", "read_row", "row_values"]

# Parquet enums (parquet.thrift)
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8
_CODECS = {"SNAPPY": "snappy", "ZSTD": "zstd", "GZIP": "gzip", "LZ4_RAW": "lz4_raw", "BROTLI": "brotli"}
_DTYPES: dict[str, np.dtype[Any]] = {"INT32": np.dtype("<i4"), "INT64": np.dtype("<i8")}
Buf = bytes | memoryview  # page bytes: read, or decompressed (a view of a pyarrow Buffer)


class _Bad(Exception):
    """Something this reader does not decode: the caller falls back to a row-group read."""


class ChunkReader:
    """Byte ranges of one Parquet file (a path, read with ``os.pread``, or the file's bytes)."""

    def __init__(self, source: str | os.PathLike[str] | bytes) -> None:
        if isinstance(source, bytes):
            self._data: bytes | None = source
            self._fd: int | None = None
        else:
            self._data = None
            self._fd = os.open(source, os.O_RDONLY)

    def read(self, offset: int, size: int) -> bytes:
        if self._data is not None:
            return self._data[offset : offset + size]
        assert self._fd is not None
        return os.pread(self._fd, size, offset)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- Thrift compact protocol: just enough for PageHeader -------------------------------------------------


class _Compact:
    def __init__(self, data: Buf, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Bad("truncated page header")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise _Bad("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int) -> None:
        if kind in (1, 2):  # bool, in the field header
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.pos += 8
        elif kind == 8:
            size = self.varint()  # (not `self.pos += self.varint()`: that adds to the position before it)
            self.pos += size
        elif kind in (9, 10):
            head = self.byte()
            count = head >> 4
            if count == 15:
                count = self.varint()
            for _ in range(count):
                self.skip(head & 0x0F)
        elif kind == 12:
            self.struct(lambda fid, kind: False)
        else:
            raise _Bad(f"thrift type {kind}")

    def struct(self, field: Any) -> None:
        """Read a struct's fields; ``field(id, kind)`` reads a field it wants and returns True."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            kind = head & 0x0F
            if not field(fid, kind):
                self.skip(kind)
            last = fid


class _PageHeader:
    __slots__ = ("compressed", "encoding", "kind", "num_values", "size", "uncompressed")

    def __init__(self) -> None:
        self.kind = self.uncompressed = self.compressed = self.num_values = self.encoding = -1
        self.size = 0  # bytes of the header itself


def _page_header(data: Buf, pos: int) -> _PageHeader:
    r = _Compact(data, pos)
    h = _PageHeader()

    def sub(fid: int, kind: int) -> bool:
        if fid == 1 and kind == 5:
            h.num_values = r.zigzag()
        elif fid == 2 and kind == 5:
            h.encoding = r.zigzag()
        else:
            return False
        return True

    def top(fid: int, kind: int) -> bool:
        if kind == 5 and fid in (1, 2, 3):
            value = r.zigzag()
            if fid == 1:
                h.kind = value
            elif fid == 2:
                h.uncompressed = value
            else:
                h.compressed = value
            return True
        if kind == 12 and fid in (5, 7):  # data_page_header / dictionary_page_header
            r.struct(sub)
            return True
        return False

    r.struct(top)
    h.size = r.pos - pos
    if min(h.kind, h.uncompressed, h.compressed) < 0:
        raise _Bad("incomplete page header")
    return h


# -- levels and dictionary indices: the RLE / bit-packed hybrid ----------------------------------------


def _hybrid(data: Buf, pos: int, end: int, bit_width: int, count: int) -> np.ndarray:
    """``count`` values of an RLE / bit-packed hybrid run sequence in ``data[pos:end]``."""
    out = np.empty(count, dtype=np.int64)
    n = 0
    r = _Compact(data, pos)
    byte_width = (bit_width + 7) // 8
    while n < count:
        if r.pos >= end:
            raise _Bad("hybrid runs end early")
        head = r.varint()
        if head & 1:  # bit-packed: (head >> 1) groups of 8 values
            groups = head >> 1
            nbytes = groups * bit_width
            raw = np.frombuffer(data, dtype=np.uint8, count=nbytes, offset=r.pos)
            r.pos += nbytes
            bits = np.unpackbits(raw, bitorder="little").reshape(-1, bit_width) if bit_width else None
            take = min(groups * 8, count - n)
            if bit_width == 0:
                out[n : n + take] = 0
            else:
                assert bits is not None
                weights = 1 << np.arange(bit_width, dtype=np.int64)
                out[n : n + take] = (bits[:take].astype(np.int64) * weights).sum(axis=1)
            n += take
        else:  # RLE: (head >> 1) repeats of one value
            run = head >> 1
            value = int.from_bytes(data[r.pos : r.pos + byte_width], "little")
            r.pos += byte_width
            take = min(run, count - n)
            out[n : n + take] = value
            n += take
    return out


def _levels(body: Buf, pos: int, max_level: int, count: int) -> tuple[np.ndarray | None, int]:
    """A version-1 page's levels (4-byte length + hybrid runs): ``(levels, position after them)``."""
    if max_level == 0:
        return None, pos
    size = int.from_bytes(body[pos : pos + 4], "little")
    start, end = pos + 4, pos + 4 + size
    if end > len(body):
        raise _Bad("levels past the page")
    return _hybrid(body, start, end, max_level.bit_length(), count), end


# -- one row --------------------------------------------------------------------------------------------


def _decompress(raw: Any, codec: str, size: int) -> Any:
    """The page body (a buffer: bytes or a pyarrow Buffer, never copied again)."""
    if codec == "UNCOMPRESSED":
        return raw
    name = _CODECS.get(codec)
    if name is None:
        raise _Bad(f"codec {codec}")
    return memoryview(pa.decompress(raw, decompressed_size=size, codec=name))


def _values(
    body: Buf, pos: int, encoding: int, dtype: np.dtype[Any], count: int, dictionary: np.ndarray | None
) -> np.ndarray:
    if encoding == _PLAIN:
        if pos + count * dtype.itemsize > len(body):
            raise _Bad("values past the page")
        return np.frombuffer(body, dtype=dtype, count=count, offset=pos)
    if encoding in (_RLE_DICTIONARY, _PLAIN_DICTIONARY):
        if dictionary is None:
            raise _Bad("dictionary indices without a dictionary page")
        bit_width = body[pos]
        indices = _hybrid(body, pos + 1, len(body), bit_width, count)
        if count and (indices.min() < 0 or indices.max() >= len(dictionary)):
            raise _Bad("dictionary index out of range")
        return dictionary[indices]
    raise _Bad(f"encoding {encoding}")


def read_row(
    reader: ChunkReader, column: Any, row: int, num_rows: int, *, max_rep: int = 1, max_def: int = 3
) -> np.ndarray | None:
    """The values of row ``row`` of a row group (``num_rows`` rows) in one ``list<int>`` column
    (``column``: pyarrow's ``ColumnChunkMetaData``), or ``None`` if this reader cannot decode it here (see
    the module docstring).

    Only for files written with at most one row per page (pyarrow's ``max_rows_per_page=1``, what longpack
    writes): then a chunk with exactly ``num_rows`` data pages (checked from the page headers) holds row
    ``k`` in its ``k``-th data page, which must start with that row. ``max_rep`` / ``max_def`` are the column's maximum
    repetition and definition levels (1 and 3 for pyarrow's nullable ``list<int>``); every value's
    definition level must be ``max_def`` (no nulls, no empty lists).
    """
    try:
        return _read_row(reader, column, row, num_rows, max_rep, max_def)
    except (_Bad, ValueError, OSError, pa.ArrowException):
        return None


def _headers(chunk: Buf) -> list[tuple[int, int, int, int, int, int]]:
    """``(type, header size, compressed size, uncompressed size, num_values, encoding)`` of every page in a
    column chunk's bytes: the compiled walk (``longpack.packed._native``), else this module's."""
    from longpack._optional import native

    module = native("longpack.packed._native")
    if module is not None:
        try:
            return module.page_headers(chunk)  # type: ignore[no-any-return]
        except ValueError as e:
            raise _Bad(str(e)) from e
    out = []
    pos = 0
    while pos < len(chunk):
        h = _page_header(chunk, pos)
        out.append((h.kind, h.size, h.compressed, h.uncompressed, h.num_values, h.encoding))
        pos += h.size + h.compressed
        if pos > len(chunk):
            raise _Bad("page past the column chunk")
    return out


def _only_value(body: Buf, pos: int, end: int, count: int) -> int | None:
    """The value of hybrid runs that are one RLE run covering ``count`` values, else ``None``."""
    r = _Compact(body, pos)
    head = r.varint()
    if head & 1 or (head >> 1) < count or r.pos >= end:
        return None
    return body[r.pos]


def _read_row(
    reader: ChunkReader, column: Any, row: int, num_rows: int, max_rep: int, max_def: int
) -> np.ndarray | None:
    dtype = _DTYPES.get(column.physical_type)
    if dtype is None or not 0 <= row < num_rows or max_rep != 1:
        return None
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    chunk = memoryview(reader.read(start, column.total_compressed_size))
    codec = column.compression
    pos, pages, dictionary, target = 0, 0, None, None
    for kind, hsize, csize, usize, nvalues, encoding in _headers(chunk):
        body_at = pos + hsize
        pos = body_at + csize
        if kind == _DICTIONARY_PAGE:
            if encoding not in (_PLAIN, _PLAIN_DICTIONARY):
                raise _Bad("dictionary page encoding")
            body = _decompress(chunk[body_at:pos], codec, usize)
            dictionary = np.frombuffer(body, dtype=dtype, count=nvalues)  # type: ignore[call-overload]
            continue
        if kind != _DATA_PAGE:
            raise _Bad(f"page type {kind}")  # version-2 pages: pyarrow reads them
        if pages == row:
            target = (body_at, csize, usize, nvalues, encoding)
        pages += 1
    if pages != num_rows or target is None:
        raise _Bad(f"{pages} data pages for {num_rows} rows: not one row per page")
    body_at, csize, usize, nvalues, encoding = target
    body = _decompress(chunk[body_at : body_at + csize], codec, usize)
    # version-1 page: repetition levels, definition levels (each: 4-byte length + hybrid runs), values
    rep_len = int.from_bytes(body[0:4], "little")
    body = body if isinstance(body, memoryview) else memoryview(body)
    reps = _hybrid(body, 4, 4 + rep_len, 1, min(nvalues, 8))  # the row starts here...
    if nvalues <= 0 or reps[0] != 0 or (reps[1:] == 0).any():
        raise _Bad("the page does not start one row")
    at = 4 + rep_len
    def_len = int.from_bytes(body[at : at + 4], "little")
    defs_at, at = at + 4, at + 4 + def_len
    if at > len(body):
        raise _Bad("levels past the page")
    if _only_value(body, defs_at, at, nvalues) != max_def:
        defs = _hybrid(body, defs_at, at, max_def.bit_length(), nvalues)
        if (defs != max_def).any():
            raise _Bad("nulls or empty lists")
    return _values(body, at, encoding, dtype, nvalues, dictionary)


def row_values(
    chunk: Buf, physical_type: str, row: int, num_rows: int, *, max_def: int = 3, module: Any = None
) -> np.ndarray | None:
    """The values of row ``row`` of an **uncompressed** one-row-per-page column chunk (``chunk``: its bytes,
    e.g. a slice of a memory map of the file), or ``None`` where this path does not apply (no compiled
    walk, other page kinds or encodings, nulls; the caller then reads as :func:`read_row` does).

    PLAIN values come back as a read-only view of ``chunk`` (no copy: the bytes of the file are the
    values); dictionary-encoded ones (the 0/1 ``loss_mask``) as a new ``int64`` array.

    >>> import pyarrow as pa, pyarrow.parquet as pq, io
    >>> buf = io.BytesIO()
    >>> table = pa.table({"input_ids": [[5, 6, 2], [7, 2]]})
    >>> pq.write_table(table, buf, max_rows_per_page=1, compression="none", use_dictionary=False)
    >>> col = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata.row_group(0).column(0)
    >>> data = buf.getvalue()[col.data_page_offset : col.data_page_offset + col.total_compressed_size]
    >>> got = row_values(data, "INT64", 1, 2)
    >>> got is None or got.tolist() == [7, 2]
    True
    """
    if module is None:
        from longpack._optional import native

        module = native("longpack.packed._native")
    dtype = _DTYPES.get(physical_type)
    if module is None or dtype is None or not 0 <= row < num_rows:
        return None
    where = module.row_page(chunk, row, num_rows, max_def)
    if where is None:
        return None
    encoding, at, count, dict_at, dict_count, end = where
    if encoding == _PLAIN:
        if at + count * dtype.itemsize > end:
            return None  # a page shorter than its values say: damaged; the caller's read reports it
        return np.frombuffer(chunk, dtype=dtype, count=count, offset=at)
    if dict_at + dict_count * dtype.itemsize > len(chunk):
        return None
    dictionary = np.frombuffer(chunk, dtype=dtype, count=dict_count, offset=dict_at)
    out = np.empty(count, np.int64)
    try:
        module.dict_values(chunk, at, end, dictionary, out)
    except ValueError:
        return None
    return out


class ChunkRows:
    """Where every row's values lie in one uncompressed one-row-per-page column chunk (walked once, by
    :func:`chunk_rows`); :meth:`values` reads a row as :func:`row_values` does, without walking again."""

    __slots__ = ("_chunk", "_dictionary", "_dtype", "_module", "_rows")

    def __init__(
        self, chunk: Buf, dtype: np.dtype[Any], dictionary: np.ndarray | None, rows: list[Any], module: Any
    ) -> None:
        self._chunk, self._dtype, self._dictionary, self._rows, self._module = (
            chunk,
            dtype,
            dictionary,
            rows,
            module,
        )

    def __len__(self) -> int:
        return len(self._rows)

    def values(self, row: int) -> np.ndarray:
        encoding, at, count, end = self._rows[row]
        if encoding == _PLAIN:
            return np.frombuffer(self._chunk, dtype=self._dtype, count=count, offset=at)
        out = np.empty(count, np.int64)
        self._module.dict_values(self._chunk, at, end, self._dictionary, out)
        return out


def chunk_rows(
    chunk: Buf, physical_type: str, num_rows: int, *, max_def: int = 3, module: Any = None
) -> ChunkRows | None:
    """Walk an uncompressed one-row-per-page column chunk once: a :class:`ChunkRows`, or ``None`` where
    :func:`row_values` would decline (checked for every page here: levels, encodings, bounds).

    >>> import pyarrow as pa, pyarrow.parquet as pq, io
    >>> buf = io.BytesIO()
    >>> pq.write_table(pa.table({"ids": [[5, 6, 2], [7, 2]]}), buf, max_rows_per_page=1, compression="none",
    ...                use_dictionary=False)
    >>> col = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata.row_group(0).column(0)
    >>> data = buf.getvalue()[col.data_page_offset : col.data_page_offset + col.total_compressed_size]
    >>> rows = chunk_rows(data, "INT64", 2)
    >>> rows is None or [rows.values(k).tolist() for k in range(2)] == [[5, 6, 2], [7, 2]]
    True
    """
    if module is None:
        from longpack._optional import native

        module = native("longpack.packed._native")
    dtype = _DTYPES.get(physical_type)
    if module is None or dtype is None or not hasattr(module, "chunk_rows"):
        return None
    walked = module.chunk_rows(chunk, num_rows, max_def)
    if walked is None:
        return None
    dict_at, dict_count, rows = walked
    dictionary = None
    if dict_at >= 0:
        if dict_at + dict_count * dtype.itemsize > len(chunk):
            return None
        dictionary = np.frombuffer(chunk, dtype=dtype, count=dict_count, offset=dict_at)
    for encoding, at, count, end in rows:
        if encoding == _PLAIN and at + count * dtype.itemsize > end:
            return None  # a page shorter than its values say: damaged; the caller's read reports it
    return ChunkRows(chunk, dtype, dictionary, rows, module)
