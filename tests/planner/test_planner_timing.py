"""Time model properties (docs/reference/planner-model.md#time)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.planner.catalog import load_gpu, load_model
from longpack.planner.options import PlanError, PlanLayout, TrainingOptions
from longpack.planner.search import SearchRequest
from longpack.planner.timing import cp_comm_candidates, estimate_time
from longpack.topology import ParallelLayout

MODELS = ["deepseek_v3", "qwen3_235b_a22b", "qwen3_30b_a3b", "llama3_1_70b", "qwen3_next_80b_a3b"]


def _time(model, gpu="H100", *, n=256, tp=1, cp=4, pp=4, vpp=2, ep=8, s=32768, gbs=256, **opts):
    lay = ParallelLayout(world_size=n, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=1, sp=tp > 1)
    return estimate_time(
        load_model(model),
        load_gpu(gpu),
        PlanLayout(layout=lay),
        seq_length=s,
        gbs=gbs,
        options=TrainingOptions(**opts),
    )


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(MODELS), st.sampled_from([(), ("moe_act",), ("layernorm",), ("mlp",), ("mla_up_proj",)])
)
def test_recompute_never_makes_a_step_faster(model, modules) -> None:
    base = _time(model)
    more = _time(model, recompute=modules)
    full = _time(model, recompute=("full",))
    assert more.step_time >= base.step_time
    assert full.step_time >= more.step_time
    assert full.recompute == pytest.approx(full.compute / 3)


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from(MODELS), st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.sampled_from([0.0, 0.25, 0.5, 1.0])
)
def test_offload_costs_time_proportionally(model, x, y) -> None:
    lo, hi = sorted((x, y))
    a, b = _time(model, optimizer_offload=lo), _time(model, optimizer_offload=hi)
    assert b.step_time >= a.step_time
    assert b.offload * lo == pytest.approx(a.offload * hi, rel=1e-9, abs=1e-12)


def test_throughput_is_consistent_with_flops() -> None:
    t = _time("deepseek_v3", precision="fp8")
    tokens = 256 * 32768
    assert t.tflops_per_gpu * 1e12 * 256 * t.step_time == pytest.approx(tokens * t.flops_per_token)
    assert t.mfu_vs_precision_peak == pytest.approx(t.tflops_per_gpu / 1979)


def test_packed_sequences_are_cheaper_than_one_long_row() -> None:
    lay = ParallelLayout(world_size=16, ep=16, etp=1)
    args = (load_model("qwen3_30b_a3b"), load_gpu("H100"), PlanLayout(layout=lay))
    full = estimate_time(*args, seq_length=32768, gbs=64, options=TrainingOptions())
    packed = estimate_time(
        *args, seq_length=32768, gbs=64, options=TrainingOptions(), sub_lengths=(4096,) * 8
    )
    assert packed.step_time < full.step_time
    assert packed.flops_per_token < full.flops_per_token


def test_cp_comm_candidates_respect_kv_heads() -> None:
    assert cp_comm_candidates(load_model("qwen3_30b_a3b"), t=1, c=8) == ("p2p", "a2a+p2p")
    assert "a2a" in cp_comm_candidates(load_model("qwen3_30b_a3b"), t=1, c=4)


def test_blackwell_only_precisions_are_rejected_on_hopper() -> None:
    with pytest.raises(PlanError, match="needs a Blackwell GPU"):
        SearchRequest(
            model=load_model("qwen3_30b_a3b"),
            gpu=load_gpu("H100"),
            num_gpus=8,
            seq_length=4096,
            precision="mxfp8",
        )
