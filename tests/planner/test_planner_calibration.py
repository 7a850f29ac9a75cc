"""Calibration: points load, error metrics are computed, the fit runs, the shipped fit meets issue 6."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from longpack.planner.calibration import evaluate, fit_params, load_points, write_fit
from longpack.planner.timing import TimeModelParams, fitted_params


@pytest.fixture(scope="module")
def points():
    return load_points()


def test_points_load_and_skips_name_a_reason(points) -> None:
    pts, skipped = points
    assert len(pts) >= 150
    assert all(reason for _, reason in skipped)
    # models outside the catalog are skipped, never guessed
    assert any("moonlight" in reason for _, reason in skipped)
    ids = [p.id for p in pts]
    assert len(ids) == len(set(ids))


def test_evaluation_metrics_are_computed(points) -> None:
    pts, skipped = points
    summary = evaluate(pts, skipped)
    assert summary.tflops_n >= 150
    assert 0 <= summary.tflops_median_ape <= summary.tflops_p90_ape
    assert summary.memory_n >= 5 and math.isfinite(summary.memory_median_ape)
    doc = summary.as_dict()
    assert doc["tflops"]["n"] == summary.tflops_n and len(doc["points"]) == len(pts)


def test_shipped_fit_meets_the_issue_bounds(points) -> None:
    # issue 6: in-sample median |error| <= 10 % on TFLOP/s/GPU (met).
    summary = evaluate(*points)
    assert summary.tflops_median_ape <= 0.10
    # Memory: the issue asks for 15 % where measured. Each measurement is compared with the rank it
    # describes (Bridge logs: last pipeline stage; "GiB_rank0": rank 0; paper per-GPU: hottest).
    assert summary.memory_median_ape <= 0.15


def test_memory_measurements_are_compared_with_the_rank_they_describe(points) -> None:
    from longpack.planner.calibration import _measured_memory, evaluate_point
    from longpack.planner.catalog import load_model
    from longpack.planner.memory import estimate_memory

    assert _measured_memory({"mem_peak_GB": 1.0})[1] == "last"
    assert _measured_memory({"mem_peak_allocated_GiB_rank0": 1.0}) == (1.0, "first")
    assert _measured_memory({"mem_per_gpu_GB": 1.0})[1] == "hot"
    assert _measured_memory({"tflops_per_gpu": 1.0}) == (None, "hot")
    by_id = {p.id: p for p in points[0]}
    llama = by_id["cp238"]  # Bridge-logged "58.8 GB (OOM on rank 0)": the logging rank is the last stage
    assert llama.memory_rank == "last" and llama.plan.layout.pp == 4
    model = load_model(llama.model)
    kw = dict(seq_length=llama.seq_length, gbs=llama.gbs, options=llama.options)
    last = estimate_memory(model, llama.plan, ranks=(3,), **kw)
    hottest = estimate_memory(model, llama.plan, **kw)
    assert last.rank == 3 and hottest.total > last.total
    assert evaluate_point(llama).predicted_memory_gib == pytest.approx(last.total_gib)


def test_fit_runs_and_does_not_worsen_the_loss(points, tmp_path: Path) -> None:
    pts, _ = points
    subset = [p for p in pts if p.tflops][:12]
    start = TimeModelParams()
    params, loss = fit_params(subset, start=start, rounds=1)
    from longpack.planner.calibration import _loss

    assert loss <= _loss(start, subset) + 1e-12
    out = tmp_path / "fit.yaml"
    write_fit(params, out, loss=loss, source="test subset")
    doc = yaml.safe_load(out.read_text())
    assert doc["params"]["eta_gemm"] == pytest.approx(params.eta_gemm, rel=1e-5)
    assert "longpack plan fit" in doc["refit_command"]


def test_bad_calibration_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "cal.yaml"
    bad.write_text("just: a mapping\n")
    with pytest.raises(ValueError, match=r"cal\.yaml.*points"):
        load_points(bad)


def test_shipped_constants_are_loaded() -> None:
    assert fitted_params() != TimeModelParams()
