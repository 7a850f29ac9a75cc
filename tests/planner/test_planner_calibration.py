"""Calibration: points load, error metrics by context band (in-sample and leave-one-model-out), the fit
runs, the shipped fit meets the bounds, memory matches on the rank each measurement describes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from longpack.planner.calibration import (
    band_stats,
    evaluate,
    fit_params,
    leave_one_model_out,
    load_points,
    read_calibration,
    write_fit,
)
from longpack.planner.timing import TimeModelParams, fitted_params


@pytest.fixture(scope="module")
def points():
    return load_points()


def test_points_load_and_skips_name_a_reason(points) -> None:
    pts, skipped = points
    assert len(pts) >= 50
    assert all(reason for _, reason in skipped)
    # models outside the catalog are skipped, never guessed
    assert any("moonlight" in reason for _, reason in skipped)
    ids = [p.id for p in pts]
    assert len(ids) == len(set(ids))


def test_evaluation_metrics_are_computed(points) -> None:
    pts, skipped = points
    summary = evaluate(pts, skipped)
    assert summary.tflops_n >= 50
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


#: What issue 34 holds out to score the planner: no point may come from these (any version, any release).
HELD_OUT_SOURCES = (
    "performance-summary",
    "performance_summary",
    "performance_long_sequence",
    "dgx-cloud",
    "dgxc",
)


def test_the_held_out_publications_are_not_in_the_calibration_file() -> None:
    raw = read_calibration()
    assert len(raw) >= 80
    for point in raw:
        text = " ".join(str(point.get(k, "")) for k in ("source", "notes", "recipe_at_head")).lower()
        assert not any(h in text for h in HELD_OUT_SOURCES), (point["id"], point.get("source"))


def test_shipped_constants_are_loaded() -> None:
    assert fitted_params() != TimeModelParams()


def test_context_bands_in_sample(points) -> None:
    summary = evaluate(*points)
    bands = summary.bands
    assert bands["16-32K"].n >= 4 and bands["64K+"].n >= 6
    assert bands["16-32K"].median_ape <= 0.10 and bands["<=8K"].median_ape <= 0.10
    # 64K+: 11.9 % since the CP ring's bandwidths come from the hardware catalog instead of two constants
    # fitted to DeepSeek-V3's three points there (2.1 % in-sample, 39 % leave-one-model-out before)
    assert bands["64K+"].median_ape <= 0.15


def test_cp_ring_bandwidth_is_not_a_fitted_constant() -> None:
    names = set(TimeModelParams().as_dict())
    assert not any(n.startswith("cp_") and ("eff" in n or "scale" in n) for n in names), names


@pytest.mark.slow
def test_deepseek_v3_long_context_is_predicted_without_its_own_points(points) -> None:
    """Leaving DeepSeek-V3 out used to leave the cross-node ring unconstrained (its >= 64K points were
    then predicted at ~100 of ~300 TFLOP/s); with catalog bandwidths it lands within 20 %."""
    pts, _ = points
    lomo = leave_one_model_out([p for p in pts if p.tflops and p.model in ("deepseek_v3", "qwen3_235b_a22b")])
    long_dsv3 = [r for r in lomo if r.model == "deepseek_v3" and r.seq_length >= 65536]
    assert len(long_dsv3) == 3
    assert all(abs(r.tflops_error) <= 0.20 for r in long_dsv3), [(r.id, r.tflops_error) for r in long_dsv3]


def test_measured_memory_is_within_ten_percent_on_the_rank_it_describes(points) -> None:
    summary = evaluate(*points)
    raw = {p["id"]: p for p in read_calibration()}
    measured = [
        r
        for r in summary.results
        if r.memory_error is not None and "measured" in str(raw[r.id].get("quality", ""))
    ]
    assert len(measured) >= 7
    assert all(abs(r.memory_error) <= 0.10 for r in measured), [(r.id, r.memory_error) for r in measured]
    assert all(r.memory_rank is not None for r in measured)


def test_held_out_and_excluded_points_are_not_fitted(points) -> None:
    _, skipped = points
    sources = " ".join(str(p.get("source", "")) for p in read_calibration())
    assert "performance_long_sequence" not in sources  # NeMo's long-sequence page is the held-out check
    reasons = dict(skipped)
    assert "dropless" in reasons["cp408"]  # natural-routing twin of a force-balanced point


def test_shipped_fit_records_the_kernel_curves_it_was_made_with() -> None:
    from importlib import resources

    from longpack.planner.attention import kernel_curves

    doc = yaml.safe_load(resources.files("longpack").joinpath("data", "planner_fit.yaml").read_text())
    assert doc["attention_kernel_curves"] == kernel_curves().as_dict()


def test_leave_one_model_out_predicts_each_model_without_its_points(points) -> None:
    pts, _ = points
    few = [p for p in pts if p.tflops and p.model in ("qwen3_30b_a3b", "llama3_1_70b")][:16]
    results = leave_one_model_out(few, rounds=1)
    assert [r.id for r in results] == [p.id for p in few]
    own = {r.id: r.predicted_tflops for r in evaluate(few).results}
    assert any(r.predicted_tflops != pytest.approx(own[r.id]) for r in results)
    assert set(band_stats(results)) == {"<=8K", "16-32K", "64K+"}
