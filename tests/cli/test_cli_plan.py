"""``longpack plan`` CLI: the chosen layout and its numbers, overrides that parse back (also through a
real shell), estimate, evaluate by context band, errors that name the problem, and the plot."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.planner.catalog import load_gpu, load_model
from longpack.planner.overrides import parse_overrides
from longpack.planner.search import SearchRequest, search

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


def _shell_words(shell_text: str) -> list[str]:
    script = f"{sys.executable} -c 'import sys; print(\"\\0\".join(sys.argv[1:]))' {shell_text}"
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout
    return out.rstrip("\n").split("\0")


def test_plan_json_ranks_layouts_and_emits_overrides() -> None:
    res = runner.invoke(app, [*BASE, "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    cands = doc["candidates"]
    assert 1 <= len(cands) <= 3
    steps = [c["time"]["step_time"] for c in cands]
    assert steps == sorted(steps)
    best = cands[0]
    # the same choice as the library search, with the same numbers
    req = SearchRequest(
        model=load_model("qwen3_30b_a3b"), gpu=load_gpu("H100"), num_gpus=16, seq_length=8192, gbs=64
    )
    lib = search(req, top_k=1).candidates[0]
    assert best["layout"]["label"] == lib.plan.label
    assert best["time"]["step_time"] == pytest.approx(lib.time.step_time, rel=1e-5)
    assert best["memory"]["total_gib"] == pytest.approx(lib.memory.total_gib, abs=1e-3)
    assert best["memory"]["total_gib"] <= doc["request"]["memory_budget_gib"]
    tokens = 64 * 8192
    assert best["time"]["tflops_per_gpu"] == pytest.approx(
        tokens * best["time"]["flops_per_token"] / (16 * best["time"]["step_time"]) / 1e12, rel=1e-4
    )
    plan, options, values = parse_overrides(best["overrides"], world_size=16)
    lay = best["layout"]
    assert (plan.layout.tp, plan.layout.cp, plan.layout.ep, plan.layout.pp, plan.mbs) == (
        lay["tp"],
        lay["cp"],
        lay["ep"],
        lay["pp"],
        lay["mbs"],
    )
    assert list(options.recompute) == best["options"]["recompute"]
    assert options.dispatcher == best["options"]["dispatcher"]
    assert values["train.global_batch_size"] == 64 and doc["request"]["gbs_default"] is False
    assert doc["notes"] == []


def test_plan_table_prints_the_best_layout_and_shell_ready_overrides() -> None:
    res = runner.invoke(app, [*BASE, "--top", "2"])
    assert res.exit_code == 0, res.output
    doc = json.loads(runner.invoke(app, [*BASE, "--top", "2", "--json"]).output)
    best = doc["recommended"]  # the layout to run: printed with its reasons and overrides
    lines = res.output.splitlines()
    assert f"Recommended: {best['layout']['label']}" in lines
    start = lines.index("Megatron-Bridge overrides (shell-quoted; paste after run_recipe.py ...):") + 1
    end = lines.index("As YAML (longpack check FILE / --config-file):")
    words = _shell_words(" ".join(line.rstrip("\\").strip() for line in lines[start:end]))
    assert words == best["overrides"]
    python_start = lines.index("Python (on a recipe's cfg):") + 1
    assert lines[python_start].startswith("cfg.model.tensor_model_parallel_size = ")
    yaml_doc = yaml.safe_load("\n".join(lines[end + 1 : python_start - 1]))
    assert yaml_doc["model"]["tensor_model_parallel_size"] == best["layout"]["tp"]


def test_plan_without_gbs_uses_and_states_the_default() -> None:
    args = ["plan", "--model", "llama3_1_8b", "--gpu", "H100", "--gpus", "8", "--seq-length", "131072"]
    doc = json.loads(runner.invoke(app, [*args, "--top", "1", "--json"]).output)
    assert doc["request"]["gbs"] == 32 and doc["request"]["gbs_default"] is True
    assert doc["request"]["tokens_per_step"] == 4 * 2**20
    assert "default of 4M tokens per step" in doc["notes"][0]
    res = runner.invoke(app, [*args, "--top", "1"])
    assert "GBS 32 (default: 4M tokens/step)" in res.output
    assert "note: GBS 32 sequences = 4,194,304 tokens per step" in res.output


def test_plan_explains_cp_against_the_rule_of_thumb() -> None:
    args = ["plan", "--model", "deepseek_v3", "--gpu", "H100", "--gpus", "256", "--seq-length", "131072"]
    doc = json.loads(runner.invoke(app, [*args, "--precision", "fp8", "--top", "1", "--json"]).output)
    rule = doc["rule_of_thumb"]
    best = doc["candidates"][0]
    assert rule["cp"] == 32
    reasons = best["reasons"]
    assert any(
        r.startswith(f"CP {best['layout']['cp']}: ") and "rule of thumb s/4096 = 32" in r for r in reasons
    )
    if best["layout"]["cp"] != 32:
        assert rule["layout"] is not None and rule["slower"] >= 0
        assert any(r.startswith(f"the best rule-of-thumb layout ({rule['layout']})") for r in reasons)
    assert any(r.startswith("selective, not full recompute") for r in reasons) or best["options"][
        "recompute"
    ] == ["full"]


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
            "--cp-comm-type",
            "p2p",
            "--gbs",
            "480",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["fits"] is True and doc["memory"]["rank"] == 0
    assert doc["layout"]["cp"] == 32 and doc["options"]["optimizer_offload"] == 1.0
    assert 'model.pipeline_model_parallel_layout="Et|(tt|)*30mL"' in doc["overrides"]
    assert "model.cp_comm_type=p2p" in doc["overrides"]
    assert doc["memory"]["host_optimizer_gib"] > 0
    # the published ~300 TFLOP/s/GPU of this recipe (NVIDIA/skills moe-long-context card)
    assert doc["time"]["tflops_per_gpu"] == pytest.approx(300, rel=0.15)
    words = _shell_words(doc["overrides_shell"].replace("\\\n", " "))
    assert parse_overrides(words, world_size=256)[0].layout.cp == 32


def test_plan_evaluate_reports_errors_by_context_band() -> None:
    res = runner.invoke(app, ["plan", "evaluate", "--no-lomo", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["tflops"]["n"] >= 50 and 0 < doc["tflops"]["median_ape"] < 0.1
    bands = doc["bands"]
    assert bands["<=8K"]["n"] >= 40 and bands["16-32K"]["n"] >= 4 and bands["64K+"]["n"] >= 6
    # in-sample; 64K+ rests on catalog CP-ring bandwidths, not constants fitted to its points (planner-model.md#errors)
    assert bands["16-32K"]["median_ape"] < 0.10 and bands["64K+"]["median_ape"] < 0.15
    by_id = {p["id"]: p for p in doc["points"]}
    # Bridge-logged memory is the last pipeline stage's; the rank-0 GiB figure is rank 0's
    assert by_id["cp238"]["memory_rank"] == 3 and by_id["cp213"]["memory_rank"] == 0
    assert by_id["cp238"]["tflops_error"] is not None and by_id["cp239"]["memory_rank"] == 3
    assert {"cp317", "cp324", "cp325"}.isdisjoint(by_id)  # NeMo's long-sequence page is held out
    assert "lomo" not in doc
    res = runner.invoke(app, ["plan", "evaluate", "--no-lomo"])
    assert "16-32K" in res.output and "64K+" in res.output and "median APE" in res.output


def test_plan_evaluate_leave_one_model_out(tmp_path: Path) -> None:
    from longpack.planner.calibration import read_calibration

    raw = [p for p in read_calibration() if p.get("model") in ("deepseek_v3", "qwen3_235b_a22b")][:40]
    small = tmp_path / "cal.yaml"
    small.write_text(yaml.safe_dump({"points": raw}))
    res = runner.invoke(
        app, ["plan", "evaluate", "--calibration", str(small), "--lomo-rounds", "1", "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    lomo = doc["lomo"]
    assert {p["model"] for p in lomo["points"]} == {"deepseek_v3", "qwen3_235b_a22b"}
    assert sum(b["n"] for b in lomo["bands"].values()) == len(lomo["points"])
    insample = {p["id"]: p["tflops_error"] for p in doc["points"] if p["tflops_error"] is not None}
    # predictions made without the model's own points differ from the in-sample ones
    assert any(abs(p["tflops_error"] - insample[p["id"]]) > 1e-6 for p in lomo["points"])


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


DENSE = ["plan", "--model", "llama3_1_8b", "--gpu", "H100", "--gpus", "8", "--seq-length", "8192"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--imbalance", "nan"], "imbalance must be a finite number"),
        (["--imbalance", "inf"], "imbalance must be a finite number"),
        (["--ep", "8"], "ep=8 pins expert parallelism, but llama3_1_8b is a dense model"),
        (["--tp", "0"], "tp must be a positive integer"),
        (["--mbs", "0"], "mbs must be a positive integer"),
        (["--gbs", "0"], "gbs must be a positive integer"),
        (["--tp", "3"], "pinned TP*CP*PP = 3 does not divide 8 GPUs"),
        (["--headroom", "0"], "headroom must be in (0, 1]"),
    ],
)
def test_plan_refuses_bad_requests_with_the_reason(extra: list[str], message: str) -> None:
    res = runner.invoke(app, [*DENSE, *extra])
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_plan_refuses_absurd_cluster_sizes_quickly() -> None:
    start = time.process_time()
    res = runner.invoke(app, [*DENSE[:6], "1000000000", *DENSE[7:]])
    assert res.exit_code == 2 and "more than the planner searches" in res.output
    res = runner.invoke(app, [*DENSE[:6], "0", *DENSE[7:]])
    assert res.exit_code == 2 and "must be positive" in res.output
    assert time.process_time() - start < 30  # a refusal, not a search


def test_no_layout_fits_says_why_per_group() -> None:
    res = runner.invoke(
        app,
        ["plan", "--model", "deepseek_v3", "--gpu", "H100", "--gpus", "8", "--seq-length", "4096", "--json"],
    )
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["candidates"] == []
    why = doc["why_nothing_fits"]
    assert why and all(line.split(" ", 1)[0].isdigit() for line in why)
    assert any("does not fit even with full recompute and offload" in line for line in why)
    res = runner.invoke(
        app, ["plan", "--model", "deepseek_v3", "--gpu", "H100", "--gpus", "8", "--seq-length", "4096"]
    )
    assert "No layout fits. Why, by group of rejected layouts:" in res.output
    # a pin that removes every layout still says which constraint did it
    res = runner.invoke(app, [*DENSE[:8], "8200", "--cp", "8", "--json"])
    assert res.exit_code == 1
    why = json.loads(res.output)["why_nothing_fits"]
    assert any("not enumerated: CP 8: seq_length 8200 is not a multiple of 2*CP = 16" in line for line in why)


def test_plan_plot_writes_png_with_budget_line_and_zero_based_axes(tmp_path: Path) -> None:
    from longpack.jobs.plots import plot_figure

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
    points = doc["plot"]["points"]
    assert [p["seq_length"] for p in points] == [4096, 8192]
    assert all(p["short_label"].startswith("TP") for p in points)
    fig = plot_figure(points, 175.0, "t")
    tflops_ax, memory_ax = fig.axes
    assert tflops_ax.get_ylim()[0] == 0 and memory_ax.get_ylim()[0] == 0
    assert memory_ax.get_ylim()[1] >= 175.0
    budget = [line for line in memory_ax.get_lines() if list(line.get_ydata()) == [175.0, 175.0]]
    assert budget, "budget line"
    assert [t.get_text() for t in tflops_ax.texts] == [p["short_label"] for p in points]
