"""The rule predicates the planner prunes with decide exactly when their rules fire, and the planner's
layout enumerator keeps exactly the layouts those rules accept."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longpack.catalog import ModelFamily, load_gpu, load_model
from longpack.planner.search import MIN_TOKENS_PER_CP_RANK, SearchRequest, enumerate_layouts, vpp_choices
from longpack.rules import DatasetKind, DatasetSettings, ModelSettings, TrainingSetup, run_rules
from longpack.rules.checks.batch import gbs_covers_dp, gbs_divisible
from longpack.rules.checks.cp import cp_divides_seq_length
from longpack.rules.checks.pipeline import vpp_has_pp
from longpack.rules.checks.topology import (
    ep_divides_experts,
    expert_grid_fits,
    kv_heads_fit_tp,
    mp_divides_world,
    sp_splits_cp_shard,
    tp_divides,
)
from longpack.rules.versions import UpstreamVersions

# The planner proposes only a TP that divides the KV heads (its memory model splits them over TP): the
# rule of Megatron-Core before 0.16.0 (LP-TOPO-005). Later versions also accept a multiple of them
# (LP-TOPO-007), which the planner does not propose; the enumerator is compared with the strict rule.
STRICT_KV = UpstreamVersions.resolve(bridge="main", mcore="0.15.3")

# The Megatron rules the enumerator applies through the predicates.
MIRRORED = {
    "LP-TOPO-001",
    "LP-TOPO-002",
    "LP-TOPO-003",
    "LP-TOPO-004",
    "LP-TOPO-005",
    "LP-SP-001",
    "LP-CP-001",
    "LP-PP-006",
    "LP-BATCH-001",
    "LP-BATCH-002",
}

size = st.sampled_from([1, 2, 3, 4, 6, 8, 16])


def _setup(world, tp, cp, pp, vpp, ep, etp, sp, seq, mbs, gbs, heads, kv, experts) -> TrainingSetup:
    return TrainingSetup(
        world_size=world,
        model=ModelSettings(
            tensor_model_parallel_size=tp,
            context_parallel_size=cp,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            sequence_parallel=sp,
            seq_length=seq,
            num_attention_heads=heads,
            num_query_groups=kv,
            num_moe_experts=experts,
        ),
        micro_batch_size=mbs,
        global_batch_size=gbs,
        dataset=DatasetSettings(kind=DatasetKind.PRETRAINING, seq_length=seq),
    )


@given(
    world=st.integers(1, 128),
    tp=size,
    cp=size,
    pp=size,
    vpp=st.sampled_from([None, 1, 2, 3]),
    ep=size,
    etp=st.sampled_from([None, 1, 2]),
    sp=st.booleans(),
    seq=st.sampled_from([1000, 4096, 8190, 8192, 12288]),
    mbs=st.sampled_from([1, 2, 4]),
    gbs=st.integers(1, 64),
    heads=st.sampled_from([12, 16, 32, 96]),
    kv=st.sampled_from([2, 4, 8, 12]),
    experts=st.sampled_from([None, 8, 64, 160]),
)
def test_each_predicate_is_its_rule(
    world, tp, cp, pp, vpp, ep, etp, sp, seq, mbs, gbs, heads, kv, experts
) -> None:
    s = _setup(world, tp, cp, pp, vpp, ep, etp, sp, seq, mbs, gbs, heads, kv, experts)
    fired = {f.rule_id for f in run_rules(s, select=MIRRORED | {"LP-TOPO-007"})}
    fired_strict = {f.rule_id for f in run_rules(s, select={"LP-TOPO-005"}, versions=STRICT_KV)}
    dp = world // (tp * cp * pp) if world % (tp * cp * pp) == 0 else None
    expected = {
        "LP-TOPO-001": not mp_divides_world(world, tp=tp, cp=cp, pp=pp),
        "LP-TOPO-002": not expert_grid_fits(world, pp=pp, ep=ep, etp=tp if etp is None else etp),
        "LP-TOPO-003": (ep > 1 if experts is None else not ep_divides_experts(experts, ep=ep)),
        "LP-TOPO-004": not tp_divides(heads, tp=tp),
        "LP-TOPO-007": not kv_heads_fit_tp(kv, tp=tp),
        "LP-SP-001": not sp_splits_cp_shard(seq, tp=tp, cp=cp, sp=sp),
        "LP-CP-001": not cp_divides_seq_length(seq, cp=cp),
        "LP-PP-006": not vpp_has_pp(vpp, pp=pp),
        "LP-BATCH-001": dp is not None and not gbs_divisible(gbs, mbs=mbs, dp=dp),
        "LP-BATCH-002": dp is not None and not gbs_covers_dp(gbs, mbs=mbs, dp=dp),
    }
    assert fired == {rule_id for rule_id, fires in expected.items() if fires}
    assert fired_strict == ({"LP-TOPO-005"} if not tp_divides(kv, tp=tp) else set())


def _reference_layouts(req: SearchRequest) -> set[tuple[int, ...]]:
    """The enumerator's candidate grid filtered by running the rules themselves (not the predicates).

    Each rule reads only its own sizes, so the grid is filtered one dimension at a time (TP/CP/PP, then
    MBS, VPP, EP/ETP) with the rules about that dimension; the survivors are then checked once more
    against all of them together.
    """
    model, n, s, gbs = req.model, req.num_gpus, req.seq_length, req.global_batch
    att = model.attention
    kv = None if att.kind == "mla" else att.num_kv_heads
    experts = model.moe.num_experts if model.moe else None
    assert ModelFamily.of_model(model).num_layers == model.num_layers

    def fires(rules: set[str], **sizes: int | None) -> bool:
        base = {"world": n, "vpp": None, "ep": 1, "etp": 1, "mbs": 1, "gbs": None}
        v = {**base, **sizes}
        setup = _setup(
            v["world"], v["tp"], v["cp"], v["pp"], v["vpp"], v["ep"], v["etp"], v["tp"] > 1, s, v["mbs"],
            v["gbs"], att.num_heads, kv, experts if v["ep"] > 1 or experts else None,
        )  # fmt: skip
        return bool(run_rules(setup, select=rules, versions=STRICT_KV))

    pow2 = [2**i for i in range(int(math.log2(n)) + 1)]
    grid = [
        (t, c, p)
        for t, c, p in itertools.product(pow2, pow2, range(1, n + 1))
        if t <= min(req.max_tp, req.gpu.nvlink_domain) and s // c >= MIN_TOKENS_PER_CP_RANK
        and p <= model.num_layers
    ]  # fmt: skip
    dense_rules = {"LP-TOPO-001", "LP-TOPO-004", "LP-TOPO-005", "LP-SP-001", "LP-CP-001"}
    kept: set[tuple[int, ...]] = set()
    for t, c, p in grid:
        if fires(dense_rules, tp=t, cp=c, pp=p):
            continue
        for b in [1, 2, 4] if s <= 8192 else [1]:
            if fires({"LP-BATCH-001", "LP-BATCH-002"}, tp=t, cp=c, pp=p, mbs=b, gbs=gbs):
                continue
            m = gbs // (b * (n // (t * c * p)))
            for v in vpp_choices(model.num_layers, p):
                if p * v > model.num_layers + 2 or fires({"LP-PP-006"}, tp=t, cp=c, pp=p, vpp=v):
                    continue
                if v > 1 and m < p:  # Megatron's interleaved schedule (a planner constraint)
                    continue
                # EP above N can never fit the expert grid; below it the rules decide
                eus = [(1, t)] if experts is None else [(e, u) for e in range(1, n + 1) for u in {1, t}]
                for e, u in eus:
                    if experts is not None and fires(
                        {"LP-TOPO-002", "LP-TOPO-003"}, tp=t, cp=c, pp=p, ep=e, etp=u
                    ):
                        continue
                    kept.add((t, c, p, v, e, u, b))
    for t, c, p, v, e, u, b in kept:
        assert not fires(MIRRORED, tp=t, cp=c, pp=p, vpp=v, ep=e, etp=u, mbs=b, gbs=gbs)
    return kept


@pytest.mark.parametrize(
    ("model", "n", "s", "gbs"),
    [
        ("qwen3_30b_a3b", 16, 4096, 64),
        ("deepseek_v3", 16, 4096, 32),
        ("llama3_1_8b", 16, 16384, 32),
        ("qwen3_8b", 8, 2048, 24),
    ],
)
def test_enumerator_keeps_exactly_the_layouts_the_rules_accept(model: str, n: int, s: int, gbs: int) -> None:
    req = SearchRequest(model=load_model(model), gpu=load_gpu("H100"), num_gpus=n, seq_length=s, gbs=gbs)
    got = {
        (p.layout.tp, p.layout.cp, p.layout.pp, p.vpp, p.layout.ep, p.layout.expert_tp, p.mbs)
        for p in enumerate_layouts(req)
    }
    assert got == _reference_layouts(req)
