"""``longpack rollouts``: the table for a length file, its JSON, the planner's seconds, and clear refusals."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.jobs import RolloutsConfig

runner = CliRunner()


def _lengths(tmp_path, values):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(v) for v in values) + "\n")
    return path


def test_table_and_json_from_a_length_file(tmp_path):
    rng = np.random.default_rng(0)
    path = _lengths(tmp_path, np.clip(rng.lognormal(7, 0.9, 300).astype(int), 8, 4000))
    result = runner.invoke(app, ["rollouts", str(path), "--bin-size", "4096", "--dp", "4", "--cp", "2"])
    assert result.exit_code == 0, result.output
    assert "slots aligned to 4" in result.output
    assert "best_fit_decreasing  balanced" in result.output
    result = runner.invoke(app, ["rollouts", str(path), "--bin-size", "4096", "--dp", "4", "--json"])
    data = json.loads(result.output)
    rows = {(r["fill_algorithm"], r["distribution"]): r for r in data["rows"]}
    assert len(rows) == 6 and data["cost_unit"] == "work"
    for fill in ("next_fit_decreasing", "best_fit_decreasing"):
        busiest = {d: rows[(fill, d)]["busiest_rank"] for d in ("fifo", "round-robin", "balanced")}
        assert busiest["balanced"] <= min(busiest["fifo"], busiest["round-robin"])
    assert rows[("best_fit_decreasing", "fifo")]["fill"] >= rows[("next_fit_decreasing", "fifo")]["fill"]


def test_planner_seconds_with_model_and_gpu(tmp_path):
    path = _lengths(tmp_path, [4000, 3000, 200, 100, 50, 3900, 20, 1000])
    result = RolloutsConfig(lengths_file=path, bin_size=4096, dp=2, model="llama3_1_8b", gpu="H100_SXM").run()
    assert result.cost_unit == "s"
    assert all(0 < row["busiest_rank"] < 60 for row in result.rows)


def test_refusals_name_the_setting(tmp_path):
    path = _lengths(tmp_path, [5000, 10])
    result = runner.invoke(app, ["rollouts", str(path), "--bin-size", "4096"])
    assert result.exit_code == 2
    assert "1 of 2 rollouts" in result.output and "raise --bin-size" in result.output
    result = runner.invoke(app, ["rollouts", str(path), "--bin-size", "4096", "--model", "llama3_1_8b"])
    assert result.exit_code == 2 and "give both --model and --gpu" in result.output
    result = runner.invoke(app, ["rollouts", str(path), "--bin-size", "4098", "--cp", "2"])
    assert result.exit_code == 2 and "use a bin size such as 4100" in result.output


def test_a_bin_narrower_than_the_cost_model_takes_is_refused_by_its_flag(tmp_path):
    # rollouts (bin_size) and balance (pack_size) both build the planner's cost model at their row width
    path = _lengths(tmp_path, [8, 3, 5, 2])
    rollouts = runner.invoke(
        app, ["rollouts", str(path), "--bin-size", "8", "--model", "llama3_1_8b", "--gpu", "h100"]
    )
    balance = runner.invoke(
        app, ["balance", str(path), "--pack-size", "8", "--dp", "1", "--gbs", "2", "--model", "llama3_1_8b"]
    )
    for result, flag in ((rollouts, "--bin-size"), (balance, "--pack-size")):
        assert result.exit_code == 2, result.output
        assert f"error: {flag} must be an integer >= 16 for the planner's cost model" in result.output
        assert "internal error" not in result.output and "Traceback" not in result.output
