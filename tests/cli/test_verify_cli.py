"""``longpack verify``: one-line verdict, JSON certificate, exit 1 naming row/sample/rank, exit 2 on what is missing."""

from __future__ import annotations

import json

import pytest
from tests.runtime.verify_helpers import QWEN3, pack
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.jobs.verify import megatron_backend_missing

runner = CliRunner()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return pack(tmp_path_factory.mktemp("verify-cli"), "p", cp=2)


def test_verify_passes_and_writes_the_certificate(folder, tmp_path):
    cert = tmp_path / "c.json"
    args = [
        "verify",
        str(folder),
        "--model",
        str(QWEN3),
        "--max-rows",
        "2",
        "--dist-rows",
        "0",
        "--time-budget",
        "0",
        "--certificate",
        str(cert),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("PASS: 2 of ")
    assert json.loads(cert.read_text())["rows_checked"]["training"]
    as_json = runner.invoke(app, [*args, "--json"])
    assert json.loads(as_json.output)["verdict"] == "pass"


def test_injected_fault_exits_1_naming_row_sample_and_rank(folder):
    result = runner.invoke(
        app,
        [
            "verify",
            str(folder),
            "--model",
            str(QWEN3),
            "--max-rows",
            "1",
            "--dist-rows",
            "0",
            "--inject-fault",
            "token-across-boundary",
        ],
    )
    assert result.exit_code == 1, result.output
    first = result.output.splitlines()[0]
    assert (
        first.startswith("FAIL:") and " row " in first and "sample" in first and "(single process)" in first
    )


@pytest.mark.skipif(not megatron_backend_missing(), reason="this machine can run the megatron backend")
def test_megatron_backend_on_cpu_exits_2_saying_what_is_missing(folder):
    result = runner.invoke(app, ["verify", str(folder), "--model", str(QWEN3), "--backend", "megatron"])
    assert result.exit_code == 2
    assert "--backend megatron needs" in result.output and "gpu_verify.py" in result.output
