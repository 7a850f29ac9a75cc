"""One row without its row group (``longpack.packed.pages``): the same values as pyarrow's row-group read,
for every row, with every encoding and codec the writers produce; anything else is declined (``None``) and
read by pyarrow instead. The compiled page-header walk and the Python one agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.packed import pages
from longpack.packed.files import ONE_ROW_PAGES_KEY, ParquetWriterOptions, one_row_pages, open_parquet_writer
from longpack.packed.folder import ParquetRowSource
from longpack.packed.rows import arrow_schema

COLUMNS = ("input_ids", "loss_mask", "seq_start_id")


def _table(rng: np.random.Generator, n_rows: int, ids_dtype: str, vocab: int) -> pa.Table:
    ids, masks, starts = [], [], []
    for _ in range(n_rows):
        length = int(rng.integers(1, 300))
        ids.append(rng.integers(0, vocab, length).tolist())
        cut = int(rng.integers(0, length))
        masks.append([0] * cut + [1] * (length - cut - 1) + [0])
        starts.append(sorted({0, *rng.integers(0, length, int(rng.integers(0, 4))).tolist()}))
    schema = arrow_schema(ids_dtype)
    return pa.table(
        {
            "input_ids": pa.array(ids, schema.field("input_ids").type),
            "loss_mask": pa.array(masks, pa.list_(pa.int8())),
            "seq_start_id": pa.array(starts, pa.list_(pa.int64())),
        },
        schema=schema,
    )


def _every_row_matches(path: Path) -> tuple[int, int]:
    """(rows read page by page, rows declined); every value compared with pyarrow's group read."""
    pf = pq.ParquetFile(path)
    md = pf.metadata
    index = {md.schema.column(i).path.split(".")[0]: i for i in range(md.num_columns)}
    reader = pages.ChunkReader(path)
    read = declined = 0
    for g in range(md.num_row_groups):
        table = pf.read_row_group(g, columns=list(COLUMNS))
        meta = md.row_group(g)
        for k in range(meta.num_rows):
            for name in COLUMNS:
                got = pages.read_row(reader, meta.column(index[name]), k, meta.num_rows)
                if got is None:
                    declined += 1
                    continue
                read += 1
                assert got.tolist() == table.column(name)[k].as_py(), (path.name, g, k, name)
    reader.close()
    return read, declined


@pytest.mark.parametrize("ids_dtype", ["int64", "int32"])
@pytest.mark.parametrize(
    "options",
    [
        ParquetWriterOptions(row_group_size=7, **one_row_pages(256)),  # type: ignore[arg-type]
        ParquetWriterOptions(row_group_size=1, **one_row_pages(256)),  # type: ignore[arg-type]
        # Bridge's encoding (dictionaries on every column, statistics in page headers), one row per page
        ParquetWriterOptions(
            row_group_size=9,
            use_dictionary=True,
            write_statistics=True,
            max_rows_per_page=1,
            data_page_size=2**20,
        ),
    ],
    ids=["longpack", "longpack-1-row-groups", "dictionaries-and-statistics"],
)
def test_one_row_pages_read_alone_give_pyarrows_values(tmp_path: Path, ids_dtype: str, options: Any) -> None:
    table = _table(
        np.random.default_rng(0), 40, ids_dtype, vocab=50 if options.use_dictionary is True else 151_669
    )
    path = tmp_path / "p.idx.parquet"
    with open_parquet_writer(path, ids_dtype=ids_dtype, options=options) as writer:
        writer.write_table(table, row_group_size=options.row_group_size)
    assert pq.ParquetFile(path).schema_arrow.metadata[ONE_ROW_PAGES_KEY] == b"1"
    read, declined = _every_row_matches(path)
    assert read == 3 * 40 and declined == 0
    source = ParquetRowSource(path)
    assert source.one_row_pages
    k = min(3, options.row_group_size - 1)
    row = source.read_row(2, k)
    assert row["input_ids"].tolist() == table.column("input_ids")[2 * options.row_group_size + k].as_py()


@pytest.mark.parametrize("codec", ["zstd", "none", "gzip"])
def test_other_codecs(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(
        _table(np.random.default_rng(1), 12, "int64", 1000),
        path,
        row_group_size=5,
        max_rows_per_page=1,
        compression=codec,
    )
    assert _every_row_matches(path) == (36, 0)


def test_pages_of_several_rows_are_declined_not_misread(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(
        _table(np.random.default_rng(2), 30, "int64", 1000), path, row_group_size=10
    )  # 1 MiB pages
    assert _every_row_matches(path) == (0, 90)
    assert not ParquetRowSource(path).one_row_pages  # no key in the file: the row-group read is used
    two = tmp_path / "two.parquet"
    pq.write_table(
        _table(np.random.default_rng(3), 30, "int64", 1000), two, row_group_size=10, max_rows_per_page=2
    )
    assert _every_row_matches(two)[0] == 0


def test_data_page_v2_and_nulls_are_declined(tmp_path: Path) -> None:
    path = tmp_path / "v2.parquet"
    pq.write_table(
        _table(np.random.default_rng(4), 6, "int64", 1000), path, max_rows_per_page=1, data_page_version="2.0"
    )
    assert _every_row_matches(path) == (0, 18)
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(
        pa.table({"input_ids": pa.array([[1, None], [], [3]], pa.list_(pa.int64()))}),
        nulls,
        max_rows_per_page=1,
    )
    md = pq.ParquetFile(nulls).metadata
    reader = pages.ChunkReader(nulls)
    got = [pages.read_row(reader, md.row_group(0).column(0), k, 3) for k in range(3)]
    assert got[0] is None and got[1] is None and got[2].tolist() == [3]


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=200))
def test_the_compiled_and_python_header_walks_agree(data: bytes) -> None:
    from longpack._optional import native

    module = native("longpack.packed._native")
    if module is None:
        pytest.skip("C extension not built")
    try:
        compiled: Any = module.page_headers(data)
    except ValueError:
        compiled = None
    try:
        walked: Any = [
            (h.kind, h.size, h.compressed, h.uncompressed, h.num_values, h.encoding)
            for h in _python_walk(data)
        ]
    except pages._Bad:
        walked = None
    assert compiled == walked


def test_the_compiled_and_python_header_walks_agree_on_real_chunks(tmp_path: Path) -> None:
    from longpack._optional import native

    module = native("longpack.packed._native")
    if module is None:
        pytest.skip("C extension not built")
    path = tmp_path / "w.parquet"
    pq.write_table(
        _table(np.random.default_rng(5), 20, "int64", 90), path, row_group_size=20, max_rows_per_page=1
    )
    md = pq.ParquetFile(path).metadata
    for i in range(md.num_columns):
        col = md.row_group(0).column(i)
        start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        chunk = path.read_bytes()[start : start + col.total_compressed_size]
        walked = [
            (h.kind, h.size, h.compressed, h.uncompressed, h.num_values, h.encoding)
            for h in _python_walk(chunk)
        ]
        assert module.page_headers(chunk) == walked and len(walked) >= 20


def _python_walk(data: bytes) -> list[Any]:
    out, pos = [], 0
    while pos < len(data):
        h = pages._page_header(data, pos)
        if pos + h.size + h.compressed > len(data):
            raise pages._Bad("page past the chunk")
        out.append(h)
        pos += h.size + h.compressed
    return out
