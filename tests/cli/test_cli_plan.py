"""``longpack plan`` CLI: ranked table, JSON, estimate, evaluate, errors, plot."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.planner.overrides import parse_overrides

runner = CliRunner()
BASE = [
    "plan",
    "--model",
    "qwen3_30b_a3b",
    "--gpu",
    "H100",
    "--gpus",
    "16",
    "--seq-length",
    "8192",
    "--gbs",
    "64",
]


def test_plan_json_ranks_layouts_and_emits_overrides() -> None:
    res = runner.invoke(app, [*BASE, "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    cands = doc["candidates"]
    assert 1 <= len(cands) <= 3
    steps = [c["time"]["step_time"] for c in cands]
    assert steps == sorted(steps)
    best = cands[0]
    assert best["memory"]["total_gib"] <= doc["request"]["memory_budget_gib"]
    plan, _, values = parse_overrides(best["overrides"], world_size=16)
    assert plan.layout.tp == best["layout"]["tp"] and plan.layout.ep == best["layout"]["ep"]
    assert values["train.global_batch_size"] == 64


def test_plan_table_shows_overrides_and_python() -> None:
    res = runner.invoke(app, [*BASE, "--top", "2"])
    assert res.exit_code == 0, res.output
    assert "model.tensor_model_parallel_size=" in res.output
    assert "cfg.model.expert_model_parallel_size = " in res.output
    assert "Best:" in res.output


def test_plan_estimate_one_layout() -> None:
    res = runner.invoke(
        app,
        [
            "plan",
            "estimate",
            "--model",
            "deepseek_v3",
            "--gpu",
            "H100",
            "--gpus",
            "256",
            "--seq-length",
            "131072",
            "--layout",
            "tp=1,cp=32,ep=32,pp=8,vpp=4",
            "--precision",
            "fp8",
            "--recompute",
            "up_proj,norm,moe,mlp",
            "--offload",
            "1.0",
            "--dispatcher",
            "deepep",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["fits"] is True
    assert doc["layout"]["cp"] == 32 and doc["options"]["optimizer_offload"] == 1.0
    assert "model.pipeline_model_parallel_layout='Et|(tt|)*30mL'" in doc["overrides"]
    assert doc["memory"]["host_optimizer_gib"] > 0


def test_plan_evaluate_reports_error_distribution() -> None:
    res = runner.invoke(app, ["plan", "evaluate", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["tflops"]["n"] > 100 and 0 < doc["tflops"]["median_ape"] < 1
    by_id = {p["id"]: p for p in doc["points"]}
    # Bridge-logged memory is the last pipeline stage's; the rank-0 GiB figure is rank 0's
    assert by_id["cp238"]["memory_rank"] == 3 and by_id["cp213"]["memory_rank"] == 0
    assert by_id["cp238"]["tflops_error"] is not None and by_id["cp239"]["memory_rank"] == 3
    res = runner.invoke(app, ["plan", "evaluate"])
    assert "median APE" in res.output


def test_plan_errors_are_clear(tmp_path: Path) -> None:
    res = runner.invoke(app, ["plan", "--model", "qwen3_30b_a3b"])
    assert res.exit_code == 2 and "missing --gpu, --gpus, --seq-length" in res.output
    res = runner.invoke(app, [*BASE[:2], "nope", *BASE[3:]])
    assert res.exit_code == 2 and "unknown model 'nope'" in res.output
    res = runner.invoke(
        app,
        [
            "plan",
            "estimate",
            "--model",
            "qwen3_30b_a3b",
            "--gpu",
            "H100",
            "--gpus",
            "16",
            "--seq-length",
            "4096",
            "--layout",
            "tp=3",
        ],
    )
    assert res.exit_code == 2 and "TP*CP*PP" in res.output
    bad = tmp_path / "cal.yaml"
    bad.write_text("[]\n")
    res = runner.invoke(app, ["plan", "evaluate", "--calibration", str(bad)])
    assert res.exit_code == 2 and "points" in res.output


def test_plan_plot_writes_png(tmp_path: Path) -> None:
    out = tmp_path / "plan.png"
    res = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "qwen3_30b_a3b",
            "--gpu",
            "GB200",
            "--gpus",
            "8",
            "--seq-length",
            "8192",
            "--top",
            "1",
            "--json",
            "--plot",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(res.output)
    assert [p["seq_length"] for p in doc["plot"]["points"]] == [4096, 8192]
