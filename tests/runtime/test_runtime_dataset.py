"""PackedDataset over packed Parquet (docs/reference/thd-batch.md#reading-rows, packed-format.md#path-rules)
and the behaviours Megatron-Bridge's ``test_parquet.py`` / ``test_paths.py`` assert.

The test files are written here with pyarrow straight from the format (not with longpack's writer), so the
reader is checked against the format, not against our own writer.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from longpack.runtime.collate import PackedCollator
from longpack.runtime.dataset import (
    PackedDataset,
    PackedParquetError,
    is_packed_parquet_file,
    is_packed_parquet_spec,
    resolve_packed_parquet_paths,
    validate_row,
)


def write_packed(path, rows, row_group_size=500, *, drop=()):
    columns = {
        "input_ids": pa.array([r["input_ids"] for r in rows], pa.list_(pa.int64())),
        "loss_mask": pa.array([[int(v) for v in r["loss_mask"]] for r in rows], pa.list_(pa.int8())),
        "seq_start_id": pa.array([r["seq_start_id"] for r in rows], pa.list_(pa.int64())),
        "source": pa.array([f"row{i}" for i in range(len(rows))]),  # extra columns are ignored
    }
    for name in drop:
        columns.pop(name)
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
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
    import numpy as np

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
