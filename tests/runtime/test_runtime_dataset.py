"""PackedDataset over packed Parquet (docs/reference/thd-batch.md#reading-rows, packed-format.md#path-rules)
and the behaviours Megatron-Bridge's ``test_parquet.py`` / ``test_paths.py`` assert.

The test files are written here with pyarrow straight from the format (not with longpack's writer), so the
reader is checked against the format, not against our own writer.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.runtime.collate import PackedCollator
from longpack.runtime.dataset import (
    PackedDataset,
    PackedParquetError,
    is_packed_parquet_file,
    is_packed_parquet_spec,
    resolve_packed_parquet_paths,
    validate_row,
)


def write_packed(path, rows, row_group_size=500, *, drop=(), one_row_pages=False):
    columns = {
        "input_ids": pa.array([r["input_ids"] for r in rows], pa.list_(pa.int64())),
        "loss_mask": pa.array([[int(v) for v in r["loss_mask"]] for r in rows], pa.list_(pa.int8())),
        "seq_start_id": pa.array([r["seq_start_id"] for r in rows], pa.list_(pa.int64())),
        "source": pa.array([f"row{i}" for i in range(len(rows))]),  # extra columns are ignored
    }
    for name in drop:
        columns.pop(name)
    table = pa.table(columns)
    if one_row_pages:  # as longpack's writer lays rows out: one data page each, said in the metadata
        from longpack.packed.files import ONE_ROW_PAGES_KEY

        table = table.replace_schema_metadata({ONE_ROW_PAGES_KEY: b"1"})
        pq.write_table(table, path, row_group_size=row_group_size, max_rows_per_page=1)
        return path
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def rows_of(n, tokens=64, first=0):
    return [
        {"input_ids": [first + i] * tokens, "loss_mask": [1] * tokens, "seq_start_id": [0, tokens // 2]}
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [("data.idx.parquet", True), ("data.idx.pq", True), ("shard_0001.idx.parquet", True),
     ("DATA.IDX.PARQUET", True), ("data.parquet", False)],
)  # fmt: skip
def test_is_packed_parquet_file(name, expected):
    assert is_packed_parquet_file(name) is expected


def test_resolver(tmp_path):
    single = write_packed(tmp_path / "one.idx.parquet", rows_of(1))
    assert resolve_packed_parquet_paths(str(single)) == [str(single)]
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in (2, 0, 1):
        write_packed(shards / f"shard_{i}.idx.parquet", rows_of(1))
    globbed = resolve_packed_parquet_paths(str(shards / "shard_*.idx.parquet"))
    assert globbed == sorted(globbed) and len(globbed) == 3
    two = tmp_path / "two"
    two.mkdir()
    write_packed(two / "a.parquet", rows_of(1))
    write_packed(two / "b.pq", rows_of(1))
    assert [p.rsplit("/", 1)[1] for p in resolve_packed_parquet_paths(str(two))] == ["a.parquet", "b.pq"]
    with pytest.raises(PackedParquetError, match="not found"):
        resolve_packed_parquet_paths(str(tmp_path / "missing.idx.parquet"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PackedParquetError, match="No Parquet files found"):
        resolve_packed_parquet_paths(str(empty))
    with pytest.raises(PackedParquetError, match="No Parquet files found matching pattern"):
        resolve_packed_parquet_paths(str(tmp_path / "nothing_*.parquet"))
    assert resolve_packed_parquet_paths(str(tmp_path / "data.npy")) == []
    assert is_packed_parquet_spec(str(two)) and not is_packed_parquet_spec(str(tmp_path / "data.npy"))


def test_paths_bracket_glob_and_literal(tmp_path):
    for i in (0, 1):
        write_packed(tmp_path / f"shard_{i}.idx.parquet", rows_of(1))
    assert [
        p.rsplit("/", 1)[1] for p in resolve_packed_parquet_paths(str(tmp_path / "shard_[01].idx.parquet"))
    ] == [
        "shard_0.idx.parquet",
        "shard_1.idx.parquet",
    ]
    literal = write_packed(tmp_path / "shard_[01].idx.parquet", rows_of(1))
    assert resolve_packed_parquet_paths(str(literal)) == [str(literal)]


def test_ten_rows_items_and_padding(tmp_path):
    path = write_packed(tmp_path / "d.idx.parquet", rows_of(10), row_group_size=5)
    ds = PackedDataset(str(path))
    assert len(ds) == 10
    item = ds[3]
    assert set(item) == {"input_ids", "loss_mask", "seq_boundaries"}
    assert item["seq_boundaries"].tolist() == [0, 32, 64]
    assert item["input_ids"].tolist() == [3] * 64 and item["loss_mask"].sum() == 64
    assert all(len(ds[i]["input_ids"]) == 64 for i in range(10))
    assert ds[-1]["loss_mask"].tolist() == [0] * 64
    assert ds[-1]["input_ids"].tolist() == [9] * 64  # a real row, counted from the end


def test_samples_mapping_keeps_padding_rows_masked(tmp_path):
    path = write_packed(tmp_path / "d.idx.parquet", rows_of(10), row_group_size=5)
    ds = PackedDataset(str(path), max_num_samples=5)
    assert len(ds) == 5
    assert ds[-1]["loss_mask"].sum() == 0
    assert ds[0]["loss_mask"].sum() == 64
    over = PackedDataset(str(path), max_num_samples=25, seed=7)
    assert len(over) == 25
    seen = [int(over[i]["input_ids"][0]) for i in range(25)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(
        range(10)
    )  # per-epoch permutations
    again = PackedDataset(str(path), max_num_samples=25, seed=7)
    assert again.samples_mapping.tolist() == over.samples_mapping.tolist()


def test_samples_mapping_matches_megatron_global_rng_and_leaves_it_alone(tmp_path):
    path = write_packed(tmp_path / "d.idx.parquet", rows_of(10), row_group_size=5)
    state = np.random.get_state()
    ds = PackedDataset(str(path), max_num_samples=25, seed=1234)
    after = np.random.get_state()
    assert all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for a, b in zip(state, after, strict=True)
    )
    # Megatron-Bridge: np.random.seed(seed); one np.random.shuffle(arange(rows)) per epoch.
    np.random.seed(1234)
    expected = []
    for _ in range(3):
        order = np.arange(10)
        np.random.shuffle(order)
        expected.append(order)
    np.random.set_state(state)
    assert ds.samples_mapping.tolist() == np.concatenate(expected)[:25].tolist()


def test_shards_and_locate(tmp_path):
    for i, (n, first) in enumerate([(5, 0), (10, 100), (7, 200)]):
        write_packed(tmp_path / f"shard_{i}.idx.parquet", rows_of(n, tokens=8, first=first), row_group_size=4)
    ds = PackedDataset(str(tmp_path / "shard_*.idx.parquet"))
    assert len(ds) == 22
    assert ds.locate(0)[0] == 0 and ds.locate(4)[0] == 0 and ds.locate(5)[0] == 1 and ds.locate(15)[0] == 2
    assert ds.locate(9) == (1, 1, 0)
    assert int(ds[15]["input_ids"][0]) == 200 and int(ds[21]["input_ids"][0]) == 206
    with pytest.raises(IndexError):
        ds[22]


def test_row_group_cache(tmp_path):
    path = write_packed(tmp_path / "d.idx.parquet", rows_of(10), row_group_size=5)
    ds = PackedDataset(str(path))
    ds[0]
    assert ds.cached_row_group == (0, 0) and ds.row_group_reads == 1
    ds[1]
    assert ds.cached_row_group == (0, 0) and ds.row_group_reads == 1
    ds[5]
    assert ds.cached_row_group == (0, 1) and ds.row_group_reads == 2
    ds.close()
    assert ds.cached_row_group is None
    ds.close()
    assert ds[6]["input_ids"][0] == 6


def test_bad_files(tmp_path):
    path = write_packed(tmp_path / "d.idx.parquet", rows_of(2), drop=("loss_mask",))
    with pytest.raises(PackedParquetError, match="missing required columns"):
        PackedDataset(str(path))
    empty = write_packed(tmp_path / "e.idx.parquet", [])
    with pytest.raises(PackedParquetError, match="empty"):
        PackedDataset(str(empty))


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"input_ids": [1, 2, 3], "loss_mask": [1, 1], "seq_start_id": [0]}, "loss_mask length"),
        ({"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1], "seq_start_id": [1]}, "must start with 0"),
        ({"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1], "seq_start_id": []}, "must start with 0"),
        ({"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1], "seq_start_id": [0, 5]}, ">="),
        ({"input_ids": [1, 2, 3, 4], "loss_mask": [1] * 4, "seq_start_id": [0, 3, 1]}, "not non-decreasing"),
    ],
)
def test_validate_row(row, match):
    with pytest.raises(PackedParquetError, match=match):
        validate_row(row)


def test_validate_rows_names_the_file(tmp_path):
    bad = [{"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1], "seq_start_id": [0, 5]}]
    path = write_packed(tmp_path / "bad.idx.parquet", bad)
    with pytest.raises(PackedParquetError, match=r"bad.idx.parquet: row 0: seq_start_id value 5"):
        PackedDataset(str(path), validate_rows=True)[0]


def test_dataloader_with_two_workers(tmp_path):
    eos = 2
    rows = []
    for i in range(12):
        a, b = 3 + i % 4, 2 + i % 3
        ids = [*list(range(10, 10 + a)), eos, *list(range(50, 50 + b)), eos]
        rows.append({"input_ids": ids, "loss_mask": [0] + [1] * (len(ids) - 1), "seq_start_id": [0, a + 1]})
    write_packed(tmp_path / "shard_0.idx.parquet", rows[:7], row_group_size=3)
    write_packed(tmp_path / "shard_1.idx.parquet", rows[7:], row_group_size=3)
    ds = PackedDataset(str(tmp_path / "shard_*.idx.parquet"))  # Bridge-written shards: named by a glob
    ds[0]  # open a reader in the parent before the fork: workers must not reuse it
    collate = PackedCollator(max_seq_length=16, eos_id=eos, pad_to_max_length=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate)
    batches = list(loader)
    assert len(batches) == 4
    tokens = torch.cat([b["tokens"] for b in batches])
    serial = collate([ds[i] for i in range(12)])
    assert torch.equal(tokens, serial["tokens"])
    assert torch.equal(torch.cat([b["cu_seqlens_q"] for b in batches]), serial["cu_seqlens_q"])
    assert [c for b in batches for c in b["token_count"]] == [len(r["input_ids"]) - 2 for r in rows]


def test_reads_what_longpack_pack_writes(tmp_path):
    """Interop with the `longpack pack` command (feat/packed); skipped where that command is not present."""
    import json

    from typer.testing import CliRunner

    from longpack.cli.app import app
    from longpack.runtime.collate import load_pack_metadata
    from longpack.runtime.context_parallel import physical_cu_seqlens, thd_partition_indices

    runner = CliRunner()
    if runner.invoke(app, ["pack", "--help"]).exit_code != 0:
        pytest.skip("`longpack pack` is not part of this build")
    source = tmp_path / "sft.jsonl"
    with source.open("w") as handle:
        for i in range(60):
            handle.write(
                json.dumps({"prompt": "q" * (1 + i % 23), "completion": "a" * (2 + (7 * i) % 41)}) + "\n"
            )
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["pack", str(source), "--out", str(out), "--tokenizer", "bytes", "--seq-length", "128", "--cp", "2",
         "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    eos = manifest["tokenizer"]["eos_id"]
    metadata = load_pack_metadata(next(out.glob("*_metadata.jsonl")))
    ds = PackedDataset(str(out), validate_rows=True)
    collate = PackedCollator(
        max_seq_length=128, eos_id=eos, pad_seq_to_mult=4, pad_to_max_length=True, pad_cu_seqlens=True,
        pack_metadata=metadata,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)
    runtime_tokens = 0
    for batch in loader:
        runtime_tokens += sum(batch["token_count"])
        for r in range(batch["tokens"].shape[0]):
            row = {k: (v[r : r + 1] if v is not None else None) for k, v in batch.items()}
            for rank in range(2):  # every pack splits over CP=2
                thd_partition_indices(physical_cu_seqlens(row), 128, cp_size=2, cp_rank=rank)
    assert runtime_tokens == manifest["splits"]["training"]["runtime_tokens"]


# -- any order: the LRU cache, the prefetch thread and batches return the same rows ------------------------


def _varied_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(3, 40))
        cut = int(rng.integers(1, length))
        rows.append(
            {
                "input_ids": rng.integers(0, 1000, length).tolist(),
                "loss_mask": rng.integers(0, 2, length).tolist(),
                "seq_start_id": [0, cut],
                "i": i,
            }
        )
    return rows


def _reference(rows, row):
    r = rows[row]
    return {
        "input_ids": np.array(r["input_ids"], np.int64),
        "loss_mask": np.array(r["loss_mask"], np.int64),
        "seq_boundaries": np.array([*r["seq_start_id"], len(r["input_ids"])], np.int64),
    }


def _same_item(got, want, padding=False):
    assert set(got) == set(want)
    np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
    np.testing.assert_array_equal(got["seq_boundaries"], want["seq_boundaries"])
    np.testing.assert_array_equal(
        got["loss_mask"], np.zeros_like(want["loss_mask"]) if padding else want["loss_mask"]
    )
    assert got["input_ids"].dtype == got["loss_mask"].dtype == got["seq_boundaries"].dtype == np.int64


@settings(max_examples=80, deadline=None)
@given(
    group=st.sampled_from([1, 3, 7, 500]),
    cache=st.sampled_from([0, 1, 10_000, 256 * 2**20]),
    prefetch=st.sampled_from([0, 1, 4, 32]),
    mapped=st.booleans(),
    order=st.sampled_from(["sequential", "random", "reversed", "batches", "padding"]),
    seed=st.integers(0, 2**16),
    pages=st.booleans(),
)
def test_rows_are_the_same_in_any_order(tmp_path_factory, group, cache, prefetch, mapped, order, seed, pages):
    folder = tmp_path_factory.mktemp("order")
    rows = _varied_rows(37, seed)
    a = write_packed(folder / "a.idx.parquet", rows[:20], row_group_size=group, one_row_pages=pages)
    write_packed(folder / "b.idx.parquet", rows[20:], row_group_size=group, one_row_pages=pages)
    ds = PackedDataset(
        str(folder / "*.idx.parquet"),
        cache_bytes=cache,
        prefetch=prefetch,
        max_num_samples=60 if mapped else None,
        seed=seed,
    )
    assert str(a) in ds.files
    assert all(source.one_row_pages == pages for source in ds._sources)
    n = len(ds)
    rng = np.random.default_rng(seed)
    indices = {
        "sequential": np.arange(n),
        "random": rng.permutation(n),
        "reversed": np.arange(n)[::-1],
        "batches": rng.permutation(n),
        "padding": -1 - rng.permutation(n),
    }[order].tolist()

    def row_of(i):
        mapped_i = int(ds.samples_mapping[i]) if ds.samples_mapping is not None else i
        return mapped_i % len(rows)

    if order == "batches":
        got = [item for lo in range(0, n, 5) for item in ds.__getitems__(indices[lo : lo + 5])]
    else:
        got = [ds[i] for i in indices]
    for i, item in zip(indices, got, strict=True):
        _same_item(item, _reference(rows, row_of(i)), padding=i < 0)
    ds.close()


def test_prefetch_reads_ahead_on_a_thread_and_the_cache_is_bounded(tmp_path):
    rows = _varied_rows(60)
    path = write_packed(tmp_path / "d.idx.parquet", rows, row_group_size=1)
    ds = PackedDataset(str(path), prefetch=8, cache_bytes=10**9)
    ds[0]
    ds[1]  # one after the other: the next 8 indices are read ahead
    deadline = time.monotonic() + 10
    while ds.row_group_reads < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ds.row_group_reads == 10 and len(ds._cache) == 10
    reads = ds.row_group_reads
    for i in range(2, 10):
        _same_item(ds[i], _reference(rows, i))
    assert ds.row_group_reads >= reads  # rows 2..9 came from the cache (more were read ahead meanwhile)
    small = PackedDataset(str(path), prefetch=0, cache_bytes=1)
    for i in range(20):
        small[i]
    assert len(small._cache) == 1 and small.row_group_reads == 20  # the group in use stays, no more
    ds.close()
    small.close()


def test_random_rows_of_one_row_page_files_are_read_alone(tmp_path, monkeypatch):
    from longpack.packed.folder import ParquetRowSource

    rows = _varied_rows(48, seed=5)
    path = write_packed(tmp_path / "p.idx.parquet", rows, row_group_size=8, one_row_pages=True)
    groups = []
    real = ParquetRowSource.read_group
    monkeypatch.setattr(
        ParquetRowSource, "read_group", lambda self, g, cols=None: groups.append(g) or real(self, g, cols)
    )
    ds = PackedDataset(str(path), prefetch=0)
    order = np.random.default_rng(0).permutation(48)
    order = order[np.abs(np.diff(order, prepend=-5)) != 1]  # no row right after the one before it
    for i in order.tolist():
        _same_item(ds[i], _reference(rows, i))
    assert groups == []  # every row decoded from its own pages, no row group read
    fresh = PackedDataset(str(path), prefetch=0)
    for i in range(8):  # rows in file order: their group is read once
        _same_item(fresh[i], _reference(rows, i))
    assert groups == [0]
