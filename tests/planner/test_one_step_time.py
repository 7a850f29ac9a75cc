"""One step-time model: ``plan estimate``, ``sweep`` and the balanced packer's cost model all agree.

- sweep's step time for a pinned layout equals ``plan estimate``'s when every pack is one full-length
  sample, and is never above it when shorter samples share packs (hypothesis over pack contents);
- the balance cost model's ratios between packs are the planner's micro-batch time ratios.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.jobs.sweep import Candidate, PlannerSetup, estimate_candidate
from longpack.planner.balance_costs import pack_cost_model
from longpack.planner.catalog import load_gpu, load_model
from longpack.planner.options import PlanLayout, TrainingOptions
from longpack.planner.timing import RowWork, estimate_time
from longpack.topology import ParallelLayout

CASES = [
    # (model, gpu, gpus, pins, pack length)
    ("llama3_1_8b", "H100_SXM", 8, {"tp": 1, "cp": 1, "pp": 2, "vpp": 16}, 8192),
    ("qwen3_30b_a3b", "H100", 16, {"tp": 1, "cp": 2, "pp": 1, "ep": 8, "etp": 1}, 16384),
    ("llama3_1_8b", "H100", 16, {"tp": 2, "cp": 4, "pp": 1}, 32768),
]


def _candidate(lengths: list[int], pack_length: int, gbs: int, packs: int) -> Candidate:
    arr = np.asarray(lengths, dtype=np.int64)
    return Candidate(
        pack_length=pack_length,
        gbs=gbs,
        pad_seq_to_mult=1,
        cap=pack_length,
        read=len(arr),
        kept=len(arr),
        truncated=0,
        truncated_tokens_lost=0,
        dropped=0,
        dropped_tokens=0,
        packs=packs,
        fill=float(arr.sum()) / (packs * pack_length),
        real_fill=float(arr.sum()) / (packs * pack_length),
        real_tokens=int(arr.sum()),
        steps_per_epoch=packs // gbs,
        leftover_packs=packs % gbs,
        attention_work_per_step=0.0,
        linear_work_per_step=0.0,
        sub_lengths=arr,
    )


def _plan_estimate(model: str, gpu: str, gpus: int, pins: dict[str, int], s: int, gbs: int, est) -> float:
    """``longpack plan estimate --json`` of the layout and recompute / offload sweep chose."""
    text = ",".join(f"{k}={v}" for k, v in pins.items())
    args = ["plan", "estimate", "--model", model, "--gpu", gpu, "--gpus", str(gpus), "--seq-length", str(s)]
    args += ["--layout", text, "--gbs", str(gbs), "--recompute", ",".join(est.recompute)]
    args += ["--offload", str(est.optimizer_offload), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    lay = est.plan.layout
    shown = doc["layout"]
    assert (shown["tp"], shown["cp"], shown["pp"], shown["vpp"], shown["dp"], shown["ep"]) == (
        lay.tp,
        lay.cp,
        lay.pp,
        est.plan.vpp,
        lay.dp,
        lay.ep,
    )
    return float(doc["time"]["step_time"])


@pytest.mark.parametrize(("model", "gpu", "gpus", "pins", "s"), CASES)
def test_sweep_equals_plan_estimate_for_full_length_packs(model, gpu, gpus, pins, s) -> None:
    gbs, packs = 16, 32
    planner = PlannerSetup(model=load_model(model), gpu=load_gpu(gpu), num_gpus=gpus, pins=pins)
    est = estimate_candidate(_candidate([s] * packs, s, gbs, packs), planner)
    assert est.fits, est.reason
    assert est.step_time_s == pytest.approx(_plan_estimate(model, gpu, gpus, pins, s, gbs, est), rel=2e-6)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(CASES), st.data())
def test_packed_samples_never_cost_more_than_full_rows(case, data) -> None:
    model, gpu, gpus, pins, s = case
    packs = data.draw(st.integers(1, 6))
    lengths: list[int] = []
    for _ in range(packs):
        weights = data.draw(st.lists(st.integers(1, 64), min_size=1, max_size=12))
        fill = data.draw(st.sampled_from([1.0, 0.9, 0.5]))  # below 1: the pack ends in padding
        total = sum(weights)
        lengths += [max(1, int(s * fill * w / total)) for w in weights]
    planner = PlannerSetup(model=load_model(model), gpu=load_gpu(gpu), num_gpus=gpus, pins=pins)
    full = estimate_candidate(_candidate([s] * packs, s, 16, packs), planner)
    packed = estimate_candidate(_candidate(lengths, s, 16, packs), planner)
    assert packed.layout == full.layout
    assert packed.step_time_s <= full.step_time_s * (1 + 1e-12)


def test_the_10x_sweep_bug_is_gone() -> None:
    """Every sample of the data set used to be charged to each micro-batch (sweep 7.74 s vs plan 0.77 s)."""
    s, packs = 8192, 256
    rng = np.random.default_rng(0)
    lengths = []
    for _ in range(packs):
        a = int(rng.integers(1, s))
        lengths += [a, s - a]
    planner = PlannerSetup(
        model=load_model("llama3_1_8b"), gpu=load_gpu("H100_SXM"), num_gpus=8, pins={"pp": 2, "vpp": 16}
    )
    est = estimate_candidate(_candidate(lengths, s, 8, packs), planner)
    full = estimate_candidate(_candidate([s] * packs, s, 8, packs), planner)
    assert 0.7 * full.step_time_s < est.step_time_s <= full.step_time_s


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from(
        [("llama3_1_8b", "h100", 1, 1), ("qwen3_30b_a3b", "h100", 1, 1), ("llama3_1_70b", "b200", 2, 1)]
    ),
    st.lists(st.integers(16, 8192), min_size=1, max_size=8),
    st.lists(st.integers(16, 8192), min_size=1, max_size=8),
)
def test_balance_cost_ratios_are_the_planners(case, a, b) -> None:
    model, gpu, tp, cp = case
    width = 8192
    a = [min(x, width // len(a)) for x in a]
    b = [min(x, width // len(b)) for x in b]
    cost = pack_cost_model(model=model, gpu=gpu, tp=tp, cp=cp, seq_length=width)
    plan = PlanLayout(layout=ParallelLayout(world_size=tp * cp, tp=tp, cp=cp, sp=tp > 1))
    opts = TrainingOptions(tp_comm_overlap=tp > 1)

    def planner(lengths: list[int]) -> float:
        counts: dict[int, float] = {}
        for x in lengths:
            counts[x] = counts.get(x, 0.0) + 1.0
        rows = RowWork(row_length=width, sequences=tuple(sorted(counts.items())))
        return estimate_time(
            load_model(model), load_gpu(gpu), plan, seq_length=width, gbs=1, options=opts, rows=rows
        ).microbatch

    assert cost.pack_cost(a) / cost.pack_cost(b) == pytest.approx(planner(a) / planner(b), rel=5e-3)


def test_cp_modes_are_timed_with_the_planners_micro_batch_model() -> None:
    from longpack.balance.cp_modes import compare_cp_modes
    from longpack.planner.balance_costs import microbatch_seconds

    seconds = microbatch_seconds(model="llama3_1_8b", gpu="h100")
    # a full-length row is exactly the planner's micro-batch on that CP size
    plan = PlanLayout(layout=ParallelLayout(world_size=2, cp=2))
    full = estimate_time(
        load_model("llama3_1_8b"),
        load_gpu("h100"),
        plan,
        seq_length=16384,
        gbs=1,
        options=TrainingOptions(tp_comm_overlap=False),
    )
    assert seconds([16384], 2) == pytest.approx(full.microbatch, rel=1e-12)
    packs = [[16384], [2048] * 8, [12000, 4384], [1024] * 16]
    c = compare_cp_modes(packs, dp=2, cp=2, gbs=4, max_seqlen_per_rank=8192, seconds=seconds)
    assert set(c.times) == {"static", "hybrid", "dp_balanced", "dynamic_cp"} and all(
        t > 0 for t in c.times.values()
    )
