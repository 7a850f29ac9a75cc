"""`longpack pack --ids-dtype int32`: the same packs with ``input_ids`` stored as ``list<int32>``, and every
reader in longpack (inspect --verify, check --packed, the runtime dataset and collate, the reader in tests)
gives the same answer as on the default int64 output. The Ray backend's int32 case is in test_ray_backend."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.packed import PackSettings
from longpack.packed.pipeline import check_ids_dtype
from packed_helpers import spec_read_rows

runner = CliRunner()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ids")
    rows = [
        json.dumps({"prompt": f"question {i} " * (1 + i % 7), "completion": f"answer {i} " * (1 + i % 11)})
        for i in range(700)
    ]
    (d / "a.jsonl").write_text("\n".join(rows) + "\n")
    out = {}
    for dtype in ("int64", "int32"):
        out[dtype] = d / dtype
        args = ["pack", str(d / "a.jsonl"), "--out", str(out[dtype]), "--tokenizer", "bytes"]
        args += ["--seq-length", "512", "--pad-seq-to-mult", "4", "--rows-per-shard", "40", "--workers", "1"]
        args += ["--val-fraction", "0.1", "--json", "--ids-dtype", dtype]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return out


def parquet_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.idx.parquet"))


def test_int32_output_has_int32_ids_and_the_same_rows(outputs: dict[str, Path]) -> None:
    wide, narrow = parquet_files(outputs["int64"]), parquet_files(outputs["int32"])
    assert [p.name for p in wide] == [p.name for p in narrow] and len(wide) > 2
    for a, b in zip(wide, narrow, strict=True):
        ta, tb = pq.read_table(a), pq.read_table(b)
        assert ta.schema.field("input_ids").type == pa.list_(pa.int64())
        assert tb.schema.field("input_ids").type == pa.list_(pa.int32())
        assert tb.schema.field("loss_mask").type == pa.list_(pa.int8())
        assert tb.column("input_ids").to_pylist() == ta.column("input_ids").to_pylist()
        assert tb.select(["loss_mask", "seq_start_id"]).equals(ta.select(["loss_mask", "seq_start_id"]))
        assert (
            pq.ParquetFile(b).metadata.row_group(0).num_rows
            == pq.ParquetFile(a).metadata.row_group(0).num_rows
        )
    manifest = json.loads((outputs["int32"] / "manifest.json").read_text())
    assert manifest["settings"]["ids_dtype"] == "int32"
    assert json.loads((outputs["int64"] / "manifest.json").read_text())["settings"]["ids_dtype"] == "int64"
    meta = sorted(outputs["int32"].glob("*_metadata.jsonl"))[0].name
    assert (outputs["int32"] / meta).read_bytes() == (outputs["int64"] / meta).read_bytes()


def test_inspect_verify_accepts_int32(outputs: dict[str, Path]) -> None:
    got = {}
    for dtype, folder in outputs.items():
        result = runner.invoke(app, ["inspect", str(folder), "--verify", "--json"])
        assert result.exit_code == 0, result.output
        got[dtype] = json.loads(result.output)
        assert got[dtype]["ok"] and got[dtype]["verified"] and not got[dtype]["problems"]
    assert got["int32"]["splits"] == got["int64"]["splits"]


def test_check_packed_reads_int32(outputs: dict[str, Path]) -> None:
    from longpack.rules.packed_data import inspect_packed_dir

    wide = inspect_packed_dir(outputs["int64"], multiple=4)
    narrow = inspect_packed_dir(outputs["int32"], multiple=4)
    same = (
        "path",
        "metadata_path",
        "parquet_files",
        "manifest",
        "split_files",
        "root",
    )  # folder names differ
    assert replace(narrow, **{k: getattr(wide, k) for k in same}) == wide and narrow.rows > 0
    assert narrow.manifest is not None and narrow.manifest["settings"]["ids_dtype"] == "int32"


def test_runtime_dataset_and_collate_read_int32(outputs: dict[str, Path]) -> None:
    from longpack.runtime import PackedDataset, collate_packed

    wide = PackedDataset(str(outputs["int64"] / "training_512.part-*"))
    narrow = PackedDataset(str(outputs["int32"] / "training_512.part-*"))
    assert len(wide) == len(narrow) > 0
    for i in (0, len(narrow) // 2, len(narrow) - 1, -1):
        a, b = wide[i], narrow[i]
        assert b["input_ids"].dtype == np.int64
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    items = [narrow[i] for i in range(4)]
    batch_b = collate_packed(items, max_seq_length=512, eos_id=0, pad_seq_to_mult=4)
    batch_a = collate_packed([wide[i] for i in range(4)], max_seq_length=512, eos_id=0, pad_seq_to_mult=4)
    assert batch_a.keys() == batch_b.keys()
    for key in batch_a:
        np.testing.assert_array_equal(np.asarray(batch_a[key]), np.asarray(batch_b[key]))


def test_spec_reader_reads_int32(outputs: dict[str, Path]) -> None:
    assert spec_read_rows(str(outputs["int32"] / "training_512.part-*")) == spec_read_rows(
        str(outputs["int64"] / "training_512.part-*")
    )


def test_bad_ids_dtype_and_too_large_vocab_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ids_dtype must be one of"):
        PackSettings(seq_length=8, ids_dtype="int16")
    with pytest.raises(ValueError, match="use ids_dtype int64"):
        check_ids_dtype("int32", 2**31 + 1)
    check_ids_dtype("int64", 2**40)
    (tmp_path / "a.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    args = ["pack", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "o"), "--tokenizer", "bytes"]
    result = runner.invoke(app, [*args, "--seq-length", "8", "--ids-dtype", "uint8"])
    assert result.exit_code == 2 and "'uint8' is not one of" in result.output and "'int32'" in result.output
    assert not (tmp_path / "o").exists()
