"""The seed's long-context patterns as issue 34 states them, each against its published figures, in
step-time terms (TFLOP/s/GPU ratios at fixed layouts are step-time ratios: the FLOPs per step do not change
with the planner's estimate). A target the planner misses is a strict ``xfail`` whose reason gives the
figures: it fails the day the target is met, so the miss cannot go stale.

Published figures:

* DeepSeek-V3, 256 H100, FP8, CP = s/4096: ~320 TFLOP/s/GPU at 16K (CP 4), ~300 at 128K (CP 32), the
  NVIDIA/skills moe-long-context card (calibration points cp402 and cp405): -6.25 %.
* Qwen3-Next-80B-A3B, 32 GB200, BF16 at the card's CP 1 / 4 / 16: ~270 / ~230 / ~100 TFLOP/s/GPU at
  8K / 32K / 64K (the same card), a drop of 63 % from 8K to 64K.
* Qwen3-235B-A22B, 128 GB200, MXFP8, 128K: 1,150 TFLOP/s/GPU at TP4 CP4 EP32 PP4 VPP12
  (yanring/Megatron-MoE-ModelZoo, calibration point cp415).
"""

from __future__ import annotations

import pytest

from longpack.planner.calibration import packaged_points, predict_time
from longpack.planner.catalog import load_gpu, load_model
from longpack.planner.options import TrainingOptions
from longpack.planner.search import SearchRequest, evaluate_layout, search
from longpack.rules.versions import UpstreamVersions

QWEN3_NEXT = "qwen3_next_80b_a3b"
#: the card's Qwen3-Next runs use CP 4 and 16: Megatron-Core from 0.18.0 runs Gated DeltaNet with CP > 1
GDN_CP = UpstreamVersions.resolve(mcore="0.18.0")
CARD = {8192: (1, 270.0), 32768: (4, 230.0), 65536: (16, 100.0)}


def _point(point_id: str):  # type: ignore[no-untyped-def]
    return next(p for p in packaged_points() if p.id == point_id)


def _predicted(point_id: str) -> float:
    tim = predict_time(_point(point_id))
    assert tim is not None
    return float(tim.tflops_per_gpu)


def test_deepseek_v3_on_h100_at_cp_s_over_4096_falls_gently_like_the_published_runs() -> None:
    published = 300.0 / 320.0 - 1  # -6.25 %
    predicted = _predicted("cp405") / _predicted("cp402") - 1
    assert predicted < 0, predicted  # falls, as published (it rose before issue 34: +4.6 %)
    assert abs(predicted - published) <= 0.05, (predicted, published)


def _qwen3_next_at_card_cp() -> dict[int, float]:
    m, g = load_model(QWEN3_NEXT), load_gpu("GB200")
    out = {}
    for s, (cp, _) in CARD.items():
        req = SearchRequest(model=m, gpu=g, num_gpus=32, seq_length=s, cp=cp, rule_versions=GDN_CP)
        out[s] = search(req, top_k=1).candidates[0].time.tflops_per_gpu
    return out


@pytest.mark.xfail(
    strict=True,
    reason="missed: predicted ~565 / ~477 / ~339 TFLOP/s/GPU at 8K / 32K / 64K against the card's "
    "270 / 230 / 100 (+109 %, +108 %, +239 %); the Gated DeltaNet and long-context attention level of "
    "Qwen3-Next on GB200 is not calibrated (no point with a full layout at 32K or 64K)",
)
def test_qwen3_next_on_gb200_at_the_cards_cp_is_within_25_percent_of_its_level() -> None:
    got = _qwen3_next_at_card_cp()
    for s, (_, published) in CARD.items():
        assert abs(got[s] / published - 1) <= 0.25, (s, got[s], published)


@pytest.mark.xfail(
    strict=True,
    reason="missed: predicted drop from 8K (CP 1) to 64K (CP 16) is ~40 % (565 -> 339 TFLOP/s/GPU); the "
    "card's is 63 % and the target >= 45 %",
)
def test_qwen3_next_on_gb200_drops_at_least_45_percent_from_8k_to_64k() -> None:
    got = _qwen3_next_at_card_cp()
    assert got[65536] / got[8192] - 1 <= -0.45, got


def test_qwen3_next_on_gb200_falls_from_8k_to_64k_at_the_cards_cp() -> None:
    """The part of the drop the planner does show: monotone, and more than a quarter."""
    got = _qwen3_next_at_card_cp()
    assert got[8192] > got[32768] > got[65536]
    assert got[65536] / got[8192] - 1 < -0.25, got


@pytest.mark.parametrize(
    ("model", "gpu", "n", "s", "precision"),
    [
        ("deepseek_v3", "H100", 256, 16384, "fp8"),
        ("deepseek_v3", "H100", 256, 131072, "fp8"),
        ("qwen3_235b_a22b", "GB200", 128, 131072, "mxfp8"),
        ("llama3_1_70b", "H100", 64, 32768, "bf16"),
        ("qwen3_30b_a3b", "H100", 16, 65536, "bf16"),
    ],
)
def test_full_recompute_never_beats_selective_past_8k(
    model: str, gpu: str, n: int, s: int, precision: str
) -> None:
    req = SearchRequest(
        model=load_model(model),
        gpu=load_gpu(gpu),
        num_gpus=n,
        seq_length=s,
        precision=precision,
    )
    found = search(req, top_k=8)
    assert found.candidates
    compared = 0
    for cand in found.candidates:
        if cand.options.recompute == ("full",):
            continue
        full = evaluate_layout(
            req, cand.plan, TrainingOptions(**{**cand.options.__dict__, "recompute": ("full",)})
        )
        assert full.time.step_time >= cand.time.step_time, (cand.plan.label, cand.options.recompute)
        compared += 1
    assert compared
    best = found.candidates[0]
    fits_selective = [c for c in found.candidates if c.options.recompute != ("full",)]
    if fits_selective:
        assert best.options.recompute != ("full",)


@pytest.mark.xfail(
    strict=True,
    reason="missed: the published run (cp415) is predicted at ~815 TFLOP/s/GPU against 1,150 (-29 %) with the "
    "fit on the public points (Blackwell MXFP8 constants mostly from DeepSeek-V3's GB200 ablation ladder)",
)
def test_qwen3_235b_on_gb200_at_128k_is_as_efficient_as_published() -> None:
    assert _predicted("cp415") == pytest.approx(1150.0, rel=0.15)


def test_qwen3_235b_on_gb200_at_128k_keeps_its_published_efficiency_relative_to_4k() -> None:
    """What does hold, as a ratio (the family's level cancels): 128K at the published layout against the
    Bridge verification card's 4K run on 256 GB200 (cp251, 1,083.66 TFLOP/s/GPU) is 1.06 published; the
    planner's ratio is within 15 % of that (0.96)."""
    published = 1150.0 / 1083.66
    assert _predicted("cp415") / _predicted("cp251") == pytest.approx(published, rel=0.15)
