"""PackedFolder, the one reader of packed output: opening a folder / file / glob, split separation, unfinished
and damaged folders, manifest mismatches, and the readers built on it (runtime dataset, check, inspect,
thd-batch, collate metadata)."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.errors import PackedDataError
from longpack.packed import (
    MANIFEST_NAME,
    PackedFolder,
    PackSettings,
    Provenance,
    inspect_output,
    plan_splits,
    resolve_packed_parquet_paths,
    validate_row,
    validate_rows,
    write_packed_output,
)
from longpack.rules.packed_data import inspect_packed_dir
from longpack.runtime.collate import load_pack_metadata
from longpack.runtime.dataset import PackedDataset
from packed_helpers import random_samples, spec_read_rows


def folder_files(out: Path, split: str) -> tuple[Path, ...]:
    return PackedFolder.open(out).files(split)


EOS = 2
runner = CliRunner()


def pack(out: Path, n: int = 300, *, seed: int = 0, max_len: int = 30, **kw) -> dict:
    samples, _, _ = random_samples(n, seed=seed, max_len=max_len, eos=EOS)
    s = PackSettings(**kw)
    return write_packed_output(
        out, plan_splits(samples, s, eos_id=EOS), s, Provenance(tokenizer={"eos_id": EOS})
    )


@pytest.fixture(scope="module")
def two_splits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two") / "out"
    pack(
        out, 400, seq_length=32, pad_seq_to_mult=4, overlength="truncate", val_fraction=0.1, rows_per_shard=40
    )
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    return target


# ---------------------------------------------------------------------------------------------------
# Opening and split separation.


def test_folder_with_both_splits_never_mixes_them(two_splits: Path) -> None:
    manifest = json.loads((two_splits / MANIFEST_NAME).read_text())
    folder = PackedFolder.open(two_splits)
    assert folder.format == "parquet" and folder.kind == "folder" and folder.finished
    assert folder.split_names == ("training", "validation")
    train, val = folder.files("training"), folder.files("validation")
    assert all(p.name.startswith("training_") for p in train) and len(train) > 1
    assert [folder.rel(p) for p in val] == [f["name"] for f in manifest["splits"]["validation"]["files"]]
    assert all(p.parent.name == "validation" for p in val)
    assert folder.pack_size == 32 and folder.pad_seq_to_mult == 4 and folder.eos_id == EOS
    assert folder.splits["validation"].metadata == manifest["splits"]["validation"]["metadata"]
    with pytest.raises(PackedDataError, match=r"pass split='training' or split='validation'"):
        folder.files()
    with pytest.raises(PackedDataError, match="pass split="):
        PackedDataset(two_splits)
    rows = {s: manifest["splits"][s]["rows"] for s in ("training", "validation")}
    assert len(PackedDataset(two_splits, split="training")) == rows["training"]
    assert len(PackedDataset(two_splits, split="validation")) == rows["validation"]
    only = PackedFolder.open(two_splits, split="validation")
    assert only.split_names == ("validation",) and only.files() == val
    # Megatron-Bridge's own rule, given the folder, reads every *.parquet directly in it: the training
    # split only, since the validation split has its own folder.
    assert [Path(p) for p in resolve_packed_parquet_paths(two_splits)] == list(train)
    assert [Path(p) for p in resolve_packed_parquet_paths(two_splits / "validation")] == list(val)
    with pytest.raises(PackedDataError, match="no 'test' split"):
        PackedFolder.open(two_splits, split="test")


def test_file_and_glob_are_read_as_named(two_splits: Path) -> None:
    one = sorted(two_splits.glob("training_*.idx.parquet"))[1]
    folder = PackedFolder.open(one)
    assert folder.kind == "files" and folder.split_names == ("training",) and folder.files() == (one,)
    assert folder.eos_id == EOS and folder.pack_size == 32  # the manifest next to the file still counts
    glob = str(two_splits / "training_32.part-*")
    named = PackedFolder.open(glob)
    assert [str(p) for p in named.files()] == resolve_packed_parquet_paths(glob)
    ds = PackedDataset(glob)
    assert [ds[i]["input_ids"].tolist() for i in range(len(ds))] == [
        r["input_ids"] for r in spec_read_rows(glob)
    ]
    # As Bridge reads them, the output folder and its *.parquet glob hold the training split only: the
    # validation split is in its own folder, so no path spec of the folder mixes the splits.
    for spec in (str(two_splits / "*.idx.parquet"), str(two_splits)):
        assert [os.path.basename(p) for p in resolve_packed_parquet_paths(spec)] == [
            p.name for p in folder_files(two_splits, "training")
        ]
    assert len(PackedDataset(str(two_splits / "*.idx.parquet"))) == len(
        PackedDataset(two_splits, split="training")
    )
    val_only = PackedFolder.open(two_splits / "validation")
    assert val_only.split_names == ("validation",) and val_only.finished
    assert len(PackedDataset(two_splits / "validation")) == len(PackedDataset(two_splits, split="validation"))
    listed = PackedFolder.open([one, one.with_name(one.name)])
    assert listed.files() == (one, one)


def test_bridge_folder_without_manifest_and_split_free_names(tmp_path: Path) -> None:
    rows = {
        "input_ids": [[5, 6, 2]],
        "loss_mask": pa.array([[1, 1, 0]], pa.list_(pa.int8())),
        "seq_start_id": [[0]],
    }
    bridge = tmp_path / "tok_pad_seq_to_mult2_sft_abcdefabcdef"
    bridge.mkdir()
    for n in (8, 16):
        pq.write_table(pa.table(rows), bridge / f"training_{n}.idx.parquet")
        (bridge / f"{n}_metadata.jsonl").write_text(json.dumps([{"pack_size": n, "max_samples_per_bin": 1}]))
    with pytest.raises(PackedDataError, match="several pack sizes"):
        PackedFolder.open(bridge, allow_unfinished=True)
    folder = PackedFolder.open(bridge, allow_unfinished=True, pack_size=16)
    assert [p.name for p in folder.files()] == ["training_16.idx.parquet"]
    assert folder.pack_size == 16 and folder.metadata_path.name == "16_metadata.jsonl"
    assert folder.pad_seq_to_mult == 2  # Bridge's folder name records it
    named = PackedFolder.open(bridge / "training_8.idx.parquet")
    assert named.pack_size == 8 and named.metadata_path.name == "8_metadata.jsonl"
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table(rows), other / "shard_0.parquet")
    with pytest.raises(
        PackedDataError, match=r"--no-manifest-ok .*name its files with a glob such as .*/\*\.parquet"
    ):
        PackedFolder.open(other)
    assert PackedFolder.open(str(other / "*.parquet")).split_names == ("files",)


# ---------------------------------------------------------------------------------------------------
# Unfinished and damaged folders.


def test_unfinished_folder_is_refused_by_readers_and_reported_by_inspect(
    two_splits: Path, tmp_path: Path
) -> None:
    out = copy_of(two_splits, tmp_path)
    (out / MANIFEST_NAME).unlink()
    with pytest.raises(PackedDataError, match="unfinished"):
        PackedFolder.open(out)
    with pytest.raises(PackedDataError, match="unfinished"):
        PackedDataset(out, split="training")
    with pytest.raises(PackedDataError, match="unfinished"):
        inspect_packed_dir(out)
    folder = PackedFolder.open(out, allow_unfinished=True)
    assert not folder.finished and folder.split_names == ("training", "validation")
    assert folder.pack_size == 32  # from the metadata file without a manifest
    assert "unfinished" in folder.validate()[0]
    report = inspect_output(out)
    assert not report["finished"] and not report["ok"] and "unfinished" in report["problems"][0]


def test_missing_shard(two_splits: Path, tmp_path: Path) -> None:
    out = copy_of(two_splits, tmp_path)
    gone = sorted(out.glob("training_32.part-*"))[1]
    gone.unlink()
    with pytest.raises(PackedDataError, match=f"lists {gone.name} but it is missing"):
        PackedFolder.open(out)
    with pytest.raises(PackedDataError, match=f"shard {gone.name} is missing from the files named"):
        PackedDataset(str(out / "training_32.part-*"))
    problems = PackedFolder.open(out, allow_unfinished=True).validate()
    assert any(gone.name in p for p in problems)
    assert not inspect_output(out)["ok"]
    # The case `check --packed` once passed: a missing shard and no manifest.
    (out / MANIFEST_NAME).unlink()
    problems = PackedFolder.open(out, allow_unfinished=True).validate()
    assert "unfinished" in problems[0] and f"training: shard {gone.name} is missing" in problems
    result = runner.invoke(app, ["check", "dataset.seq_length=32", "--packed", str(out), "--json"])
    assert result.exit_code == 2 and "unfinished" in json.loads(result.output)["input_error"]


def _corrupt_group_page(path: Path, group: int) -> None:
    offset = pq.ParquetFile(path).metadata.row_group(group).column(0).data_page_offset
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * 16)


def test_corrupt_page_and_unreadable_file_give_packed_data_errors(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack(out, 1500, max_len=6, seq_length=8)
    path = out / "training_8.idx.parquet"
    assert pq.ParquetFile(path).metadata.num_row_groups >= 2
    damaged = copy_of(out, tmp_path / "damaged")
    _corrupt_group_page(damaged / path.name, 1)
    folder = PackedFolder.open(damaged)  # the footer is intact
    ds = PackedDataset(damaged)
    assert len(ds[0]["input_ids"]) > 0  # row group 0 still reads
    with pytest.raises(PackedDataError, match=r"training_8\.idx\.parquet: row group 1 \(rows 500-"):
        ds[500]
    with pytest.raises(PackedDataError, match=r"row group 1 .*copy it again, or pack again"):
        folder.scan("training", verify=True)  # lengths alone never decode input_ids; verify does
    result = runner.invoke(app, ["inspect", str(damaged), "--verify"])
    # a damaged file is a failed check (exit 1, as a changed sha256 is), with the file and row group named
    assert result.exit_code == 1 and "row group 1" in result.output and "Traceback" not in result.output
    truncated = copy_of(out, tmp_path / "truncated")
    data = (truncated / path.name).read_bytes()
    (truncated / path.name).write_bytes(data[: len(data) // 2])
    with pytest.raises(PackedDataError, match="cannot open as Parquet"):
        PackedFolder.open(truncated)
    not_parquet = tmp_path / "x.idx.parquet"
    not_parquet.write_text("hello")
    with pytest.raises(PackedDataError, match=r"x\.idx\.parquet: cannot open as Parquet"):
        PackedDataset(not_parquet)


def test_manifest_mismatch(two_splits: Path, tmp_path: Path) -> None:
    out = copy_of(two_splits, tmp_path)
    assert PackedFolder.open(out).validate(verify=True) == []
    victim = out / "validation" / "validation_32.idx.parquet"
    table = pq.read_table(victim)
    pq.write_table(table, victim, row_group_size=7)  # same rows, other bytes
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["splits"]["training"]["rows"] += 1
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    stray = out / "training_32.part-00099-of-00100.idx.parquet"
    shutil.copy(sorted(out.glob("training_32.part-*"))[0], stray)
    folder = PackedFolder.open(out)
    assert stray not in folder.files("training")  # the manifest says which files are the split
    assert folder.validate() == []  # nothing is hashed without verify
    problems = " | ".join(folder.validate(verify=True))
    assert (
        "validation: validation/validation_32.idx.parquet differs from the manifest (size or sha256)"
        in problems
    )
    assert "training: manifest says" in problems and "rows, files hold" in problems
    assert "manifest lists files" in problems and stray.name in problems
    manifest["splits"]["test"] = {"files": []}
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "test: the manifest lists this split but no files are present" in PackedFolder.open(out).validate(
        verify=True
    )


# ---------------------------------------------------------------------------------------------------
# Rows: lengths from list offsets, and Megatron-Bridge's row checks.


def _write(path: Path, rows: list[list[int]], group: int) -> None:
    ids, starts = [], []
    for segs in rows:
        ids.append([7] * sum(segs))
        starts.append(list(itertools.accumulate([0, *segs[:-1]])))
    table = {
        "input_ids": ids,
        "loss_mask": pa.array([[0] * len(r) for r in ids], pa.list_(pa.int8())),
        "seq_start_id": starts,
    }
    pq.write_table(pa.table(table), path, row_group_size=group)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(1, 30), min_size=1, max_size=6), min_size=1, max_size=40),
    shards=st.integers(1, 3),
    group=st.integers(1, 9),
)
def test_lengths_match_a_plain_scan(tmp_path_factory: pytest.TempPathFactory, rows, shards, group) -> None:
    d = tmp_path_factory.mktemp("scan")
    parts = [rows[i::shards] for i in range(shards) if rows[i::shards]]
    for i, part in enumerate(parts):
        _write(d / f"training_64.part-{i:05d}-of-{len(parts):05d}.idx.parquet", part, group)
    folder = PackedFolder.open(str(d / "training_64.part-*"))
    ordered = [r for part in parts for r in part]
    assert folder.row_lengths("training").tolist() == [sum(r) for r in ordered]
    assert folder.sample_lengths("training").tolist() == [s - 1 for r in ordered for s in r]
    scan = folder.scan("training", verify=True)
    assert scan.samples_per_row.tolist() == [len(r) for r in ordered]
    assert scan.rows == len(ordered) and scan.file_rows == tuple(len(p) for p in parts)
    index = int(np.argmax(scan.sample_runtime))
    file, row, seg = scan.locate_sample(index)
    part = int(file.split("part-")[1][:5])
    assert parts[part][row][seg] - 1 == scan.sample_runtime[index]


def _plain_row_ok(ids: list[int], mask: list[int], starts: list[int]) -> bool:
    return (
        len(mask) == len(ids)
        and bool(starts)
        and starts[0] == 0
        and all(s < len(ids) for s in starts)
        and all(b >= a for a, b in itertools.pairwise(starts))
    )


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 8), st.integers(0, 9), st.lists(st.integers(0, 9), max_size=4)),
        min_size=1,
        max_size=12,
    )
)
def test_row_checks_agree_with_a_plain_reading(rows) -> None:
    table = pa.table(
        {
            "input_ids": [[1] * n for n, _, _ in rows],
            "loss_mask": pa.array([[0] * m for _, m, _ in rows], pa.list_(pa.int8())),
            "seq_start_id": [s for _, _, s in rows],
        }
    )
    bad_rows = [i for i, (n, m, s) in enumerate(rows) if not _plain_row_ok([1] * n, [0] * m, s)]
    problems = validate_rows(table)
    assert bool(problems) == bool(bad_rows)
    if bad_rows:
        assert min(int(p.split(":")[0].removeprefix("row ")) for p in problems) == bad_rows[0]
    for i, (n, m, s) in enumerate(rows):
        row = {"input_ids": [1] * n, "loss_mask": [0] * m, "seq_start_id": s}
        if i in bad_rows:
            with pytest.raises(PackedDataError):
                validate_row(row)
        else:
            validate_row(row)


# ---------------------------------------------------------------------------------------------------
# The readers built on it.


def test_dataset_pickles_and_reads_like_a_fresh_one(two_splits: Path) -> None:
    ds = PackedDataset(two_splits, split="training", max_num_samples=10, seed=3)
    first = ds[4]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.cached_row_group is None
    for key in first:
        np.testing.assert_array_equal(clone[4][key], first[key])
    assert clone.folder.split_names == ("training",)


def test_check_inspect_and_collate_metadata_read_the_folder(two_splits: Path) -> None:
    summary = inspect_packed_dir(two_splits, multiple=4)
    manifest = json.loads((two_splits / MANIFEST_NAME).read_text())
    assert summary.rows == sum(s["rows"] for s in manifest["splits"].values())
    assert summary.misaligned_segments == 0 and summary.recorded_pad_seq_to_mult == 4
    report = inspect_output(two_splits, verify=True)
    assert report["ok"], report["problems"]
    assert report["splits"]["validation"]["rows"] == manifest["splits"]["validation"]["rows"]
    from_folder = load_pack_metadata(two_splits)
    assert from_folder == load_pack_metadata(two_splits / "32_metadata.jsonl")
    assert from_folder.max_samples_per_bin == max(
        s["metadata"]["max_samples_per_bin"] for s in manifest["splits"].values()
    )


def test_thd_batch_takes_eos_and_alignment_from_the_manifest(two_splits: Path) -> None:
    base = ["thd-batch", str(two_splits), "--pack-size", "32", "--pad-to-max-length", "--json"]
    result = runner.invoke(app, base)
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert all(name.rsplit("/", 1)[1].startswith("training_") for name in info["files"])
    assert "cu_seqlens_q_padded" in info  # pad_seq_to_mult=4 from the manifest
    val = json.loads(runner.invoke(app, [*base, "--split", "validation"]).output)
    assert all(name.rsplit("/", 1)[1].startswith("validation_") for name in val["files"])
    wrong = runner.invoke(app, [*base, "--pad-seq-to-mult", "2"])
    assert wrong.exit_code == 2 and "packed with pad_seq_to_mult=4" in wrong.output
    wrong = runner.invoke(app, [*base, "--eos-id", "5"])
    assert wrong.exit_code == 2 and f"packed with eos_id={EOS}" in wrong.output
    same = runner.invoke(app, [*base, "--eos-id", str(EOS), "--pad-seq-to-mult", "4"])
    assert same.exit_code == 0 and json.loads(same.output) == info
