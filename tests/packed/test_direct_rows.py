"""Rows straight from a memory map (uncompressed one-row pages, longpack's layout): the same values as
pyarrow's row-group read for every row, with int32/int64 ids, dictionary or plain columns and any row-group
size; files of other kinds (compressed, several rows per page, version-2 pages, nulls, damage) are declined
(``None``) and read as before. The dataset gives the same items either way, and imports no torch."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack._optional import native
from longpack.packed import pages
from longpack.packed.files import ParquetWriterOptions, one_row_pages, open_parquet_writer
from longpack.packed.folder import ParquetRowSource
from longpack.packed.rows import arrow_schema

COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
NATIVE = native("longpack.packed._native")
needs_native = pytest.mark.skipif(NATIVE is None, reason="C extension not built")


def _table(rows: list[tuple[list[int], list[int], list[int]]], ids_dtype: str) -> pa.Table:
    schema = arrow_schema(ids_dtype)
    return pa.table(
        {
            "input_ids": pa.array([r[0] for r in rows], schema.field("input_ids").type),
            "loss_mask": pa.array([r[1] for r in rows], pa.list_(pa.int8())),
            "seq_start_id": pa.array([r[2] for r in rows], pa.list_(pa.int64())),
        },
        schema=schema,
    )


def _random_rows(
    rng: np.random.Generator, n: int, vocab: int
) -> list[tuple[list[int], list[int], list[int]]]:
    out = []
    for _ in range(n):
        length = int(rng.integers(1, 400))
        mask = (rng.random(length) < rng.random()).astype(int).tolist()  # runs and isolated flips
        starts = sorted({0, *rng.integers(0, length, int(rng.integers(0, 5))).tolist()})
        out.append((rng.integers(0, vocab, length).tolist(), mask, starts))
    return out


def _write(path: Path, table: pa.Table, ids_dtype: str, options: ParquetWriterOptions) -> None:
    with open_parquet_writer(path, ids_dtype=ids_dtype, options=options) as writer:
        writer.write_table(table, row_group_size=options.row_group_size)


def _direct_matches(path: Path) -> tuple[int, int]:
    """(rows read from the map, rows declined); each compared with pyarrow's values."""
    source = ParquetRowSource(path)
    table = pq.read_table(path, columns=list(COLUMNS))
    read = declined = row = 0
    for group, size in enumerate(source.group_rows):
        for k in range(size):
            got = source.direct_row(group, k, COLUMNS)
            if got is None:
                declined += 1
            else:
                read += 1
                for name in COLUMNS:
                    assert got[name].tolist() == table.column(name)[row].as_py(), (path.name, row, name)
            row += 1
    source.close()
    return read, declined


@needs_native
@pytest.mark.parametrize("ids_dtype", ["int64", "int32"])
@pytest.mark.parametrize("group", [1, 7])
@pytest.mark.parametrize("dictionaries", [False, True])
def test_direct_rows_give_pyarrows_values(
    tmp_path: Path, ids_dtype: str, group: int, dictionaries: bool
) -> None:
    rows = _random_rows(np.random.default_rng(group), 30, 40 if dictionaries else 151_669)
    options = ParquetWriterOptions(
        row_group_size=group,
        use_dictionary=True if dictionaries else ("loss_mask.list.element",),
        **one_row_pages(512),  # type: ignore[arg-type]
    )
    path = tmp_path / "d.idx.parquet"
    _write(path, _table(rows, ids_dtype), ids_dtype, options)
    assert _direct_matches(path) == (30, 0)


@needs_native
@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 300), st.integers(0, 2**31 - 1), st.sampled_from(["runs", "flips", "ones"])),
        min_size=1,
        max_size=12,
    ),
    group=st.integers(1, 5),
)
def test_direct_rows_property(tmp_path_factory: Any, rows: list[tuple[int, int, str]], group: int) -> None:
    built = []
    for length, seed, kind in rows:
        rng = np.random.default_rng(seed)
        if kind == "ones":
            mask = [1] * length
        elif kind == "flips":
            mask = rng.integers(0, 2, length).tolist()
        else:
            cut = int(rng.integers(0, length + 1))
            mask = [0] * cut + [1] * (length - cut)
        built.append((rng.integers(0, 2**40, length).tolist(), mask, [0]))
    path = tmp_path_factory.mktemp("p") / "p.idx.parquet"
    _write(
        path, _table(built, "int64"), "int64", ParquetWriterOptions(row_group_size=group, **one_row_pages(64))
    )  # type: ignore[arg-type]
    assert _direct_matches(path) == (len(built), 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"compression": "snappy", "max_rows_per_page": 1},  # compressed pages: decoded as before
        {"compression": "none"},  # several rows per page
        {"compression": "none", "max_rows_per_page": 1, "data_page_version": "2.0"},
    ],
    ids=["snappy", "several-rows-per-page", "v2-pages"],
)
def test_other_files_are_declined_and_read_as_before(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    from longpack.packed.files import ONE_ROW_PAGES_KEY

    rows = _random_rows(np.random.default_rng(3), 20, 1000)
    table = _table(rows, "int64").replace_schema_metadata({ONE_ROW_PAGES_KEY: b"1"})  # even when it claims
    path = tmp_path / "o.idx.parquet"
    pq.write_table(table, path, row_group_size=10, **kwargs)
    assert _direct_matches(path) == (0, 20)
    source = ParquetRowSource(path)
    assert source.read_row(1, 3)["input_ids"].tolist() == rows[13][0]


@needs_native
def test_nulls_are_declined(tmp_path: Path) -> None:
    path = tmp_path / "n.parquet"
    pq.write_table(
        pa.table({"input_ids": pa.array([[1, None], [], [3]], pa.list_(pa.int64()))}),
        path,
        max_rows_per_page=1,
        compression="none",
        use_dictionary=False,
    )
    md = pq.ParquetFile(path).metadata.row_group(0).column(0)
    chunk = path.read_bytes()[md.data_page_offset : md.data_page_offset + md.total_compressed_size]
    got = [pages.row_values(chunk, "INT64", k, 3) for k in range(3)]
    assert got[0] is None and got[1] is None and got[2] is not None and got[2].tolist() == [3]


@needs_native
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300), row=st.integers(0, 3), max_def=st.integers(0, 3))
def test_any_bytes_give_values_or_none(data: bytes, row: int, max_def: int) -> None:
    got = pages.row_values(data, "INT64", row, 4, max_def=max_def)
    assert got is None or got.dtype == np.int64
    rows = pages.chunk_rows(data, "INT64", 4, max_def=max_def)
    if rows is not None:
        for k in range(len(rows)):
            with contextlib.suppress(ValueError):  # damaged dictionary indices: the caller reads another way
                rows.values(k)


@needs_native
def test_damaged_pages_are_declined(tmp_path: Path) -> None:
    rows = _random_rows(np.random.default_rng(4), 6, 1000)
    path = tmp_path / "x.idx.parquet"
    _write(path, _table(rows, "int64"), "int64", ParquetWriterOptions(row_group_size=6, **one_row_pages(512)))  # type: ignore[arg-type]
    md = pq.ParquetFile(path).metadata.row_group(0).column(0)
    chunk = bytearray(path.read_bytes()[md.data_page_offset : md.data_page_offset + md.total_compressed_size])
    assert pages.row_values(bytes(chunk), "INT64", 2, 6) is not None
    for cut in (1, len(chunk) // 2, len(chunk) - 1):  # truncated chunks: pages missing or cut short
        assert pages.row_values(bytes(chunk[:cut]), "INT64", 2, 6) is None


def test_the_dataset_imports_no_torch(tmp_path: Path) -> None:
    rows = _random_rows(np.random.default_rng(5), 4, 1000)
    path = tmp_path / "training_512.idx.parquet"
    _write(path, _table(rows, "int64"), "int64", ParquetWriterOptions(row_group_size=2, **one_row_pages(512)))  # type: ignore[arg-type]
    code = (
        "import sys; from longpack.runtime import PackedDataset; "
        f"ds = PackedDataset({str(path)!r}); item = ds[3]; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "from longpack.runtime import collate_packed; batch = collate_packed([item], max_seq_length=512, eos_id=2); "
        "assert 'torch' in sys.modules; print(len(ds))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4"
