"""The ``.npy`` format (released Megatron-Bridge / NeMo 2) and folders Megatron-Bridge wrote (no manifest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.errors import PackedDataError
from longpack.packed import PackSettings, Provenance, plan_splits, write_packed_output
from longpack.packed.folder import PackedFolder
from longpack.packed.manifest import MANIFEST_NAME
from longpack.runtime.dataset import PackedDataset
from packed_helpers import random_samples

EOS = 2
runner = CliRunner()


def _pack(out: Path, fmt: str) -> None:
    samples, _, _ = random_samples(400, seed=4, max_len=40, eos=EOS)
    s = PackSettings(seq_length=48, pack_size=64, pad_seq_to_mult=2, val_fraction=0.1, output_format=fmt)
    write_packed_output(out, plan_splits(samples, s, eos_id=EOS), s, Provenance(tokenizer={"eos_id": EOS}))


def test_npy_holds_the_parquet_rows_and_reads_as_bridge_03_does(tmp_path: Path) -> None:
    _pack(tmp_path / "pq", "parquet")
    _pack(tmp_path / "npy", "npy")
    assert sorted(p.name for p in (tmp_path / "npy").rglob("*.npy")) == [
        "training_64.npy",
        "validation_64.npy",
    ]
    folder = PackedFolder.open(tmp_path / "npy")
    assert folder.format == "npy" and folder.validate(verify=True) == []
    for split in ("training", "validation"):
        a, b = PackedDataset(tmp_path / "pq", split=split), PackedDataset(tmp_path / "npy", split=split)
        assert len(a) == len(b) > 0
        for i in range(len(a)):
            assert all(np.array_equal(a[i][k], b[i][k]) for k in ("input_ids", "loss_mask", "seq_boundaries"))
    # Bridge 0.3.1 GPTSFTPackedDataset: np.load(allow_pickle=True), then list + [len] on the row's lists.
    rows = np.load(tmp_path / "npy" / "training_64.npy", allow_pickle=True)
    assert rows.dtype == object and rows.ndim == 1
    first = rows[0]
    assert all(type(first[k]) is list for k in ("input_ids", "loss_mask", "seq_start_id"))
    assert (
        first["seq_start_id"] + [len(first["input_ids"])]
        == PackedDataset(tmp_path / "npy", split="training")[0]["seq_boundaries"].tolist()
    )
    result = runner.invoke(app, ["inspect", str(tmp_path / "npy"), "--verify", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["format"] == "npy"


def test_npy_loader_refuses_foreign_pickles(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (shutil.rmtree, (str(tmp_path / "victim"),))

    (tmp_path / "victim").mkdir()
    bad = np.empty(1, dtype=object)
    bad[0] = Payload()
    np.save(tmp_path / "training_8.npy", bad, allow_pickle=True)
    with pytest.raises(PackedDataError, match="refused global"):
        PackedFolder.open(tmp_path / "training_8.npy")
    assert (tmp_path / "victim").is_dir()


def test_bridge_folder_needs_the_explicit_flag(tmp_path: Path) -> None:
    """A folder as Bridge's prepare step leaves it: shards and metadata, no manifest."""
    _pack(tmp_path / "lp", "parquet")
    bridge = tmp_path / "bridge"
    bridge.mkdir()
    for p in (tmp_path / "lp").rglob("*"):
        if p.is_file() and p.name not in (MANIFEST_NAME, "bridge_config.yaml"):
            shutil.copy(p, bridge / p.name)  # Bridge writes both splits next to each other
    with pytest.raises(PackedDataError, match="--no-manifest-ok"):
        PackedFolder.open(bridge)
    folder = PackedFolder.open(bridge, allow_no_manifest=True)
    assert folder.split_names == ("training", "validation") and folder.validate(verify=True) == []
    assert folder.alignment(eos_id=EOS).pack_size == 64
    with pytest.raises(PackedDataError, match="records no eos_id"):
        folder.alignment()
    assert len(PackedDataset(bridge, split="training", allow_no_manifest=True)) == len(
        PackedDataset(tmp_path / "lp", split="training")
    )
    args = [
        "check",
        "dataset.enable_offline_packing=true",
        "dataset.seq_length=64",
        "model.seq_length=64",
        "++dataset.offline_packing_specs.packed_sequence_size=64",
        "++dataset.offline_packing_specs.pad_seq_to_mult=2",
        "--packed",
        str(bridge),
    ]
    assert runner.invoke(app, args).exit_code == 2
    ok = runner.invoke(app, [*args, "--no-manifest-ok"])
    assert ok.exit_code == 0, ok.output
    assert runner.invoke(app, ["inspect", str(bridge)]).exit_code == 1
    assert runner.invoke(app, ["inspect", str(bridge), "--no-manifest-ok", "--verify"]).exit_code == 0
    thd = runner.invoke(app, ["thd-batch", str(bridge), "--no-manifest-ok", "--eos-id", str(EOS), "--json"])
    assert thd.exit_code == 0, thd.output
    assert json.loads(thd.output)["tokens"]["shape"][1] <= 64


def test_thd_batch_takes_the_recorded_alignment_and_refuses_a_contradiction(tmp_path: Path) -> None:
    _pack(tmp_path / "o", "parquet")
    got = runner.invoke(app, ["thd-batch", str(tmp_path / "o"), "--json"])
    assert got.exit_code == 0, got.output
    assert "cu_seqlens_q_padded" in json.loads(got.output)  # pad_seq_to_mult 2 came from the manifest
    bad = runner.invoke(app, ["thd-batch", str(tmp_path / "o"), "--pad-seq-to-mult", "1"])
    assert bad.exit_code == 2 and "packed with pad_seq_to_mult=2" in bad.output
