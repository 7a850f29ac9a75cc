"""The level anchored on a published run of the same model and GPU (longpack.planner.level): which run is
the anchor, that leave-one-source-out never anchors on the held-out source, and what plan shows."""

from __future__ import annotations

import pytest

from longpack.planner.calibration import (
    anchored_band_stats,
    leave_one_source_out,
    packaged_points,
    predict_time,
    step_error,
)
from longpack.planner.level import choose_anchor, level_for


def test_the_anchor_is_the_same_model_and_gpu_nearest_in_length_same_precision_first() -> None:
    pts = packaged_points()
    a = choose_anchor(pts, model="deepseek_v3", gpu="H100_SXM", seq_length=32768, precision="fp8")
    assert (a.model, a.gpu, a.seq_length) == ("deepseek_v3", "H100_SXM", 32768)
    # from another source: the nearest length of the others
    b = choose_anchor(
        pts, model="deepseek_v3", gpu="H100_SXM", seq_length=32768, precision="fp8", exclude_source=a.source
    )
    assert b.source != a.source and b.model == "deepseek_v3" and b.gpu == "H100_SXM"
    assert choose_anchor(pts, model="deepseek_v3", gpu="H100_SXM", seq_length=4096, precision="fp8").tflops


def test_the_factor_is_measured_over_predicted_step_time_of_the_anchor() -> None:
    lv = level_for("deepseek_v3", "H100_SXM", seq_length=131072, precision="fp8")
    assert lv is not None
    point = next(p for p in packaged_points() if p.id == lv.point_id)
    assert lv.factor == pytest.approx(1 + step_error(point, predict_time(point)))
    assert lv.apply(10.0) == pytest.approx(10.0 * lv.factor)


def test_loso_anchors_come_from_another_source_and_cancel_the_anchor_error() -> None:
    subset = [p for p in packaged_points() if p.model == "deepseek_v3" and p.gpu == "H100_SXM" and p.tflops]
    assert len({p.source for p in subset}) >= 2
    results = leave_one_source_out(subset, rounds=1)
    by_id = {p.id: p for p in subset}
    anchored = [r for r in results if r.anchored_step_error is not None]
    assert anchored
    for r in anchored:
        assert by_id[r.anchor].source != r.source
        assert r.anchored_step_error > -1 and r.step_error is not None
    assert sum(s.n for s in anchored_band_stats(results).values()) == len(anchored)


def test_plan_shows_the_level_and_does_not_apply_it() -> None:
    from longpack.jobs import PlanConfig

    result = PlanConfig(
        model="deepseek_v3", gpu="H100", gpus=256, seq_length=131072, precision="fp8", top=1
    ).run()
    level = result.to_dict()["reference"]["level"]
    assert level["point"] == "cp405" and level["applied"] is False
    ref_time = result.reference.candidate.time.step_time
    assert level["anchored_step_time"] == pytest.approx(ref_time * level["factor"], rel=1e-5)
    from longpack.jobs.plan import reference_lines

    text = "\n".join(reference_lines(result))
    assert "level: published run cp405" in text and "Not applied" in text
