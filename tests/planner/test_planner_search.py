"""Layout search validity, overrides round trip, representative long-context recipes (issue 6)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.jobs.plan import parse_layout
from longpack.planner.catalog import load_gpu, load_model
from longpack.planner.options import PlanLayout, TrainingOptions, normalize_recompute
from longpack.planner.overrides import parse_overrides, to_overrides, to_python_snippet
from longpack.planner.search import (
    SearchRequest,
    _options_for,
    enumerate_layouts,
    evaluate_layout,
    recompute_ladder,
    rule_of_thumb_cp,
    search,
)
from longpack.rules.versions import UpstreamVersions
from longpack.topology import ParallelLayout


def _assert_valid(req: SearchRequest, plan: PlanLayout) -> None:
    lay, model = plan.layout, req.model
    n = req.num_gpus
    assert lay.world_size == n
    assert lay.tp * lay.cp * lay.pp * lay.dp == n
    assert lay.expert_tp * lay.ep * lay.pp * lay.edp == n
    assert model.attention.num_heads % lay.tp == 0
    assert lay.tp <= req.gpu.nvlink_domain
    if model.moe is not None:
        assert model.moe.num_experts % lay.ep == 0
    assert req.seq_length % lay.pad_seq_to_mult == 0
    assert req.global_batch % (plan.mbs * lay.dp) == 0
    m = req.global_batch // (plan.mbs * lay.dp)
    if plan.vpp > 1:
        assert lay.pp > 1 and m >= lay.pp
    assert lay.sp == (lay.tp > 1)


@settings(max_examples=4, deadline=None)
@given(
    st.sampled_from(["qwen3_30b_a3b", "mixtral_8x7b", "llama3_1_8b", "qwen3_next_80b_a3b"]),
    st.sampled_from(["H100", "GB200", "B200"]),
    st.sampled_from([8, 16, 32]),
    st.sampled_from([4096, 16384, 65536]),
)
def test_search_returns_only_valid_fitting_layouts(model, gpu, n, s) -> None:
    req = SearchRequest(model=load_model(model), gpu=load_gpu(gpu), num_gpus=n, seq_length=s)
    result = search(req, top_k=8)
    times = [c.time.step_time for c in result.candidates]
    assert times and times == sorted(times)
    for cand in result.candidates:
        _assert_valid(req, cand.plan)
        assert cand.memory.total_gib <= req.memory_budget_gib
        assert cand.time.tflops_per_gpu > 0 and math.isfinite(cand.time.step_time)
        opts = cand.options
        if opts.ep_overlap:
            assert cand.plan.layout.ep > 1 and "moe" not in opts.recompute and not opts.full_recompute
            assert cand.plan.layout.pp == 1 or cand.plan.vpp > 1
        # the reasons describe this candidate: its DP split, CP shard, bubble and memory
        reasons = " | ".join(cand.reasons)
        lay = cand.plan.layout
        assert (f"DP {lay.dp}: GBS" if lay.dp > 1 else "DP is 1: GBS") in reasons
        explained = f"CP {lay.cp}: {req.seq_length // lay.cp} tokens per CP rank" in reasons
        assert explained == (lay.cp > 1 or rule_of_thumb_cp(req.seq_length) > 1)
        assert ("pipeline bubble" in reasons) == (lay.pp > 1)
        assert f"memory {cand.memory.total_gib:.1f} GiB (rank {cand.memory.rank})" in reasons
        assert cand.memory.total_gib * (1 + req.memory_margin) <= req.memory_budget_gib + 1e-9


def test_every_enumerated_layout_is_valid() -> None:
    req = SearchRequest(
        model=load_model("deepseek_v3"), gpu=load_gpu("H100"), num_gpus=256, seq_length=131072
    )
    layouts = enumerate_layouts(req)
    assert len(layouts) > 100
    for plan in layouts:
        _assert_valid(req, plan)


def test_pinned_sizes_are_respected() -> None:
    req = SearchRequest(
        model=load_model("qwen3_30b_a3b"),
        gpu=load_gpu("H100"),
        num_gpus=16,
        seq_length=8192,
        tp=1,
        ep=8,
        pp=1,
    )
    result = search(req, top_k=5)
    assert result.candidates
    for c in result.candidates:
        assert (c.plan.layout.tp, c.plan.layout.ep, c.plan.layout.pp) == (1, 8, 1)


def test_recompute_ladder_is_ordered_and_never_recomputes_core_attention() -> None:
    ladder = recompute_ladder(load_model("deepseek_v3"))
    assert ladder[0] == () and ladder[-1] == ("full",)
    assert all("core_attn" not in r for r in ladder)


def test_nothing_fits_reports_why() -> None:
    req = SearchRequest(model=load_model("deepseek_v3"), gpu=load_gpu("H100"), num_gpus=8, seq_length=4096)
    result = search(req, top_k=3)
    assert result.candidates == ()
    built = {k: v for k, v in result.rejected.items() if not k.startswith("not enumerated")}
    assert sum(built.values()) == result.layouts_considered
    assert built == {"does not fit even with full recompute and offload": result.layouts_considered}


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([(1, 1, 1), (2, 2, 2), (4, 1, 4), (1, 8, 2), (8, 2, 1)]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([None, 2, 4]),
    st.sampled_from([(), ("moe_act", "layernorm"), ("full",), ("mla_up_proj", "mlp", "moe")]),
    st.sampled_from([0.0, 0.5, 1.0]),
    st.sampled_from(["alltoall", "deepep", "hybridep", "allgather"]),
    st.sampled_from(["bf16", "fp8", "mxfp8"]),
)
def test_overrides_round_trip(sizes, ep, vpp, recompute, offload, dispatcher, precision) -> None:
    tp, cp, pp = sizes
    if pp == 1:
        vpp = None
    lay = ParallelLayout(world_size=256, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=1, sp=tp > 1)
    plan = PlanLayout(layout=lay, mbs=2)
    opts = TrainingOptions(
        precision=precision,
        recompute=recompute,
        optimizer_offload=offload,
        dispatcher=dispatcher,
        ep_overlap=ep > 1,
        cp_comm_type="a2a" if cp > 1 else "p2p",
    )
    lines = to_overrides(
        plan, opts, seq_length=32768, gbs=512, pipeline_layout="Et|t*2|mL" if pp > 1 else None
    )
    back_plan, back_opts, values = parse_overrides(lines, world_size=256)
    assert back_plan == plan
    for field in ("precision", "recompute", "optimizer_offload", "dispatcher", "ep_overlap", "cp_comm_type"):
        assert getattr(back_opts, field) == getattr(opts, field), field
    assert values["train.global_batch_size"] == 512 and values["model.seq_length"] == 32768
    snippet = to_python_snippet(lines)
    assert "cfg.model.tensor_model_parallel_size = " in snippet


# The published long-context recipes (NVIDIA/skills moe-long-context card, yanring/Megatron-MoE-ModelZoo):
# feasible, predicted near their published TFLOP/s/GPU with their own GBS, and the planner's choice
# explains itself against the CP ≈ s/4096 rule of thumb.
REPRESENTATIVE = [
    ("deepseek_v3", "H100", 256, 131072, "fp8", "tp=1,cp=32,ep=32,pp=8,vpp=4", "mla_up_proj,layernorm,moe,mlp",
     1.0, "deepep", 480, 300.0),
    ("deepseek_v3", "H100", 512, 262144, "fp8", "tp=1,cp=64,ep=32,pp=8,vpp=4", "mla_up_proj,layernorm,moe,mlp",
     1.0, "deepep", 240, 300.0),
    pytest.param(
        "qwen3_235b_a22b", "GB200", 128, 131072, "mxfp8", "tp=4,cp=4,ep=32,pp=4,vpp=12", "moe_act,layernorm",
        0.0, "hybridep", 1024, 1150.0,
        # a missed target, kept as it was: fitted without the performance-summary rows (issue 34's held-out
        # set) the Blackwell MXFP8 constants come mostly from DeepSeek-V3's GB200 ablation ladder, and
        # this run is predicted at 840 TFLOP/s/GPU (-27 %); strict, so meeting it again fails here
        marks=pytest.mark.xfail(strict=True, reason="Qwen3-235B GB200 128K predicted 840 of 1150 TFLOP/s/GPU"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    (
        "model",
        "gpu",
        "n",
        "s",
        "precision",
        "layout",
        "recompute",
        "offload",
        "dispatcher",
        "gbs",
        "published",
    ),
    REPRESENTATIVE,
)
def test_representative_long_context_recipes_are_feasible_and_predicted(
    model, gpu, n, s, precision, layout, recompute, offload, dispatcher, gbs, published
) -> None:
    req = SearchRequest(
        model=load_model(model), gpu=load_gpu(gpu), num_gpus=n, seq_length=s, precision=precision, gbs=gbs
    )
    plan, _ = parse_layout(layout, world_size=n)
    base = _options_for(req, plan, normalize_recompute(recompute), offload)
    opts = TrainingOptions(**{**base.__dict__, "dispatcher": dispatcher, "cp_comm_type": "p2p"})
    recipe = evaluate_layout(req, plan, opts)
    # the estimate (CUDA context, NCCL, dispatcher buffers and fragmentation included) stays under the
    # GPU's usable memory (Qwen3-235B: ~178 GiB of 184, above the search's 95 % headroom)
    assert recipe.memory.total_gib <= req.gpu.usable_memory_gib
    assert recipe.time.tflops_per_gpu == pytest.approx(published, rel=0.15)
    result = search(req, top_k=1)
    best = result.candidates[0]
    assert (
        best.time.step_time <= recipe.time.step_time * 1.0001 or best.memory.total_gib > req.memory_budget_gib
    )
    rule = result.rule_of_thumb
    assert rule is not None and rule.cp == max(1, s // 4096)
    if best.plan.layout.cp != rule.cp:
        assert any("rule-of-thumb" in r for r in best.reasons), best.reasons
        assert rule.candidate is None or rule.slower >= 0


def test_every_recommended_layout_passes_longpack_check() -> None:
    from longpack.planner.search import layout_findings
    from longpack.rules import has_errors

    req = SearchRequest(
        model=load_model("qwen3_30b_a3b"), gpu=load_gpu("h100"), num_gpus=32, seq_length=32768, keep_all=True
    )
    result = search(req)
    assert result.candidates
    for cand in result.candidates:
        assert not has_errors(layout_findings(req, cand))
    assert not any(key.startswith("refused by longpack check") for key in result.rejected)


def test_layout_findings_catch_a_layout_megatron_refuses() -> None:
    from longpack.planner.search import layout_findings
    from longpack.rules import has_errors

    model = load_model("qwen3_30b_a3b")  # 4 KV heads
    strict = UpstreamVersions.resolve(bridge="main", mcore="0.15.3")
    req = SearchRequest(
        model=model, gpu=load_gpu("h100"), num_gpus=16, seq_length=32768, gbs=16, rule_versions=strict
    )
    # TP 8 does not divide 4 query groups: Megatron-Core before 0.16 refuses this at start-up.
    plan = PlanLayout(layout=ParallelLayout(world_size=16, tp=8, ep=2, etp=1, sp=True), mbs=1)
    cand = evaluate_layout(req, plan, _options_for(req, plan, (), 0.0))
    findings = layout_findings(req, cand)
    assert has_errors(findings)
    assert "LP-TOPO-005" in {f.rule_id for f in findings if f.severity == "error"}
