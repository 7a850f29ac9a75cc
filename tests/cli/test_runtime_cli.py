"""The runtime CLI commands: thd-batch (collate + CP view of packed Parquet) and cp-check."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from longpack.cli.app import app

runner = CliRunner()


@pytest.fixture
def packed_file(tmp_path):
    # Two samples per row, aligned for CP=2 (runtime lengths multiples of 4), EOS 2.
    ids = [10, 11, 12, 2, 2, 20, 21, 22, 23, 24, 25, 26, 2, 2]
    rows = {
        "input_ids": pa.array([ids, ids], pa.list_(pa.int64())),
        "loss_mask": pa.array([[0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0]] * 2, pa.list_(pa.int8())),
        "seq_start_id": pa.array([[0, 5], [0, 5]], pa.list_(pa.int64())),
    }
    path = tmp_path / "train.idx.parquet"
    pq.write_table(pa.table(rows), path, row_group_size=500)
    return path


def test_thd_batch_json_with_cp(packed_file):
    result = runner.invoke(
        app,
        ["thd-batch", str(packed_file), "--pack-size", "16", "--eos-id", "2", "--pad-seq-to-mult", "4",
         "--pad-to-max-length", "--cp", "2", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["cu_seqlens_q"]["value"] == [[0, 3, 10, 10]]
    assert info["cu_seqlens_q_padded"]["value"] == [[0, 4, 12, 16]]
    assert info["tokens"]["shape"] == [1, 16]
    assert [r["tokens"] for r in info["cp_ranks"]] == [8, 8]
    assert info["required_multiple"] == 4
    assert sum(r["real_tokens"] for r in info["cp_ranks"]) == 10
    assert sum(r["supervised_tokens"] for r in info["cp_ranks"]) == 9


def test_thd_batch_table_and_errors(packed_file):
    result = runner.invoke(app, ["thd-batch", str(packed_file), "--pack-size", "16", "--eos-id", "2"])
    assert result.exit_code == 0 and "cu_seqlens_q" in result.output
    bad = runner.invoke(
        app,
        [
            "thd-batch",
            str(packed_file),
            "--pack-size",
            "16",
            "--eos-id",
            "2",
            "--pad-to-max-length",
            "--cp",
            "4",
        ],
    )
    assert bad.exit_code == 2 and "sequence 0 has padded length 4, not a multiple of 8" in bad.output
    sp = runner.invoke(
        app,
        ["thd-batch", str(packed_file), "--pack-size", "16", "--eos-id", "2", "--pad-seq-to-mult", "4",
         "--pad-to-max-length", "--cp", "2", "--tp", "4", "--sp"],
    )  # fmt: skip
    assert sp.exit_code == 2 and "not a multiple of 8 = lcm(2*CP, CP*TP)" in sp.output
    missing = runner.invoke(app, ["thd-batch", "nowhere.idx.parquet", "--pack-size", "16", "--eos-id", "2"])
    assert missing.exit_code == 2 and "not found" in missing.output


@pytest.mark.distributed
def test_cp_check_command():
    result = runner.invoke(app, ["cp-check", "--cp", "1", "--dtype", "float64", "--json"])
    assert result.exit_code == 0, result.output
    cases = json.loads(result.output)["cases"]  # one JSON object per command (was a bare list)
    assert len(cases) == 3 and all(c["ok"] for c in cases)
