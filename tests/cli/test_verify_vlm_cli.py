"""``longpack verify --vlm``: Qwen-VL samples from a JSONL (generated PNGs beside it) prepared, packed first fit
in file order and checked with a tiny Qwen2.5-VL; an injected fault fails naming the row; exactly one input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.vlm_helpers import conversation, png_bytes
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.errors import ConfigError
from longpack.jobs.verify import VerifyConfig

runner = CliRunner()
QWEN25_VL = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "qwen2_5_vl_7b.json"


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    """5 samples with 0-2 small generated images each, and on line 3 one whose image is longer than a row."""
    folder = tmp_path_factory.mktemp("verify-vlm")
    rng = np.random.default_rng(7)
    lines = []
    for i in range(5):
        images = []
        for j in range(i % 3):
            name = f"img{i}_{j}.png"
            (folder / name).write_bytes(
                png_bytes(int(rng.integers(30, 90)), int(rng.integers(30, 90)), i * 10 + j)
            )
            images.append(name)
        lines.append({"messages": conversation(rng, len(images)), "images": images})
    big = "big.png"
    (folder / big).write_bytes(png_bytes(600, 600, 99))  # ~460 visual tokens: longer than a row
    lines.insert(2, {"messages": conversation(rng, 1), "images": [big]})
    path = folder / "samples.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def verdict_line(output: str) -> str:
    """The verdict line (transformers may warn first that torchvision is missing)."""
    return next((line for line in output.splitlines() if line.startswith(("PASS: ", "FAIL: "))), "")


def args(samples: Path, *more: str) -> list[str]:
    return ["verify", "--vlm", str(samples), "--model", str(QWEN25_VL), "--pack-size", "100", *more]


def test_vlm_rows_pass_with_certificate_and_refusals_named(samples, tmp_path):
    cert = tmp_path / "c.json"
    result = runner.invoke(app, args(samples, "--pad-seq-to-mult", "4", "--certificate", str(cert)))
    assert result.exit_code == 0, result.output
    verdict = verdict_line(result.output)
    assert verdict.startswith("PASS: ") and "1 refused" in verdict, result.output
    data = json.loads(cert.read_text())
    assert data["verdict"] == "pass" and data["model"]["model_type"] == "qwen2_5_vl"
    assert data["data"]["skipped"] == [{"key": "samples.jsonl:3", "reason": "too_long"}]
    assert data["data"]["samples_checked"] == data["data"]["samples"] == 5
    assert len(data["rows_checked"]["vlm"]) == data["rows_total"] == 3
    rows = list(data["row_samples"].values())
    assert sorted(k for keys in rows for k in keys) == sorted(f"samples.jsonl:{n}" for n in (1, 2, 4, 5, 6))
    assert any(len(keys) > 1 for keys in rows)
    assert data["worst"]["loss_rel_diff"] <= 1e-12 and data["worst"]["cross_sample_gradient"] == 0.0


def test_vlm_injected_fault_fails_naming_the_row(samples):
    result = runner.invoke(app, args(samples, "--inject-fault", "positions-not-restarted", "--max-rows", "1"))
    assert result.exit_code == 1, result.output
    verdict = verdict_line(result.output)
    assert verdict.startswith("FAIL: ") and "vlm samples.jsonl row 0" in verdict, result.output


@pytest.mark.parametrize("both", [False, True])
def test_vlm_and_packed_both_or_neither_exit_2(samples, both, tmp_path):
    given = [str(tmp_path), *args(samples)[1:]] if both else ["--model", str(QWEN25_VL)]
    result = runner.invoke(app, ["verify", *given])
    assert result.exit_code == 2, result.output
    assert "exactly one input" in result.output
    with pytest.raises(ConfigError, match="exactly one input"):
        VerifyConfig(model="qwen3_8b")
    with pytest.raises(ConfigError, match="--pack-size"):
        VerifyConfig(vlm=samples, model=str(QWEN25_VL))
