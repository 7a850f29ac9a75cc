"""Balanced packing wired through plan_rows, the planner's spec parser and planner-derived cost model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.balance import BalanceTarget, PackCostModel, balanced_pack, simulate_schedule
from longpack.binpack import BinContents, pack_lengths, packing_stats
from longpack.errors import ConfigError
from longpack.packed import PackSettings, plan_rows
from longpack.planner.balance_costs import pack_cost_model, parse_balance_spec


def _target(**kw: object) -> BalanceTarget:
    base: dict[str, object] = {"cost_model": PackCostModel(linear=1.0, quadratic=0.002), "dp": 2, "gbs": 4}
    base.update(kw)
    return BalanceTarget(**base)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 512), min_size=1, max_size=200),
    seed=st.integers(0, 2**16),
)
def test_balanced_rows_respect_capacity_and_place_every_item_once(lengths: list[int], seed: int) -> None:
    plan = plan_rows(np.array(lengths), 512, algorithm="balanced", seed=seed, balance=_target())
    assert sorted(plan.order.tolist()) == list(range(len(lengths)))  # every item exactly once
    row_sums = np.add.reduceat(np.array(lengths)[plan.order], plan.row_offsets[:-1])
    assert row_sums.max() <= 512 and np.all(np.diff(plan.row_offsets) > 0)
    # rows are balanced_pack's bins in bin-id (training) order, items in input order inside a row
    bins = balanced_pack(lengths, 512, _target(), seed=seed)
    expected = BinContents.from_bin_of_item(bins)
    assert plan.order.tolist() == expected.items.tolist()
    assert plan.row_offsets.tolist() == expected.offsets.tolist()


def test_balanced_is_not_a_binpack_algorithm() -> None:
    with pytest.raises(ValueError, match=r"unknown packing algorithm 'balanced'.*balanced_pack"):
        pack_lengths([1, 2], 4, algorithm="balanced")
    with pytest.raises(ValueError, match="go together"):
        plan_rows(np.array([1, 2]), 4, algorithm="balanced")
    with pytest.raises(ValueError, match="go together"):
        plan_rows(np.array([1, 2]), 4, balance=_target())


def test_pack_settings_take_a_typed_target_only() -> None:
    target = parse_balance_spec("dp=2,gbs=4,linear=1,quadratic=0.01")
    assert PackSettings(seq_length=64, algorithm="balanced", balance=target).balance is target
    with pytest.raises(ValueError, match=r"must be a longpack\.balance\.BalanceTarget"):
        text = "dp=2,gbs=4,linear=1,quadratic=0.01"
        PackSettings(seq_length=64, algorithm="balanced", balance=text)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="go together"):
        PackSettings(seq_length=64, balance=target)


def test_parse_with_planner_cost_model() -> None:
    spec = "dp=8,pp=4,vpp=2,gbs=128,model=qwen3_30b_a3b,gpu=h100,precision=fp8"
    t = parse_balance_spec(spec)
    assert (t.dp, t.pp, t.vpp, t.gbs, t.schedule) == (8, 4, 2, 128, "interleaved")
    assert t.spec == spec  # the text the manifest records
    m = t.cost_model
    assert m == pack_cost_model(model="qwen3_30b_a3b", gpu="h100", precision="fp8")
    # attention makes one 32K document cost more than 32 x 1K documents of the same tokens
    assert m.pack_cost([32768]) > 2 * m.pack_cost([1024] * 32)
    # same tokens, same linear work: the difference is exactly the quadratic term
    diff = m.pack_cost([32768]) - m.pack_cost([1024] * 32)
    assert diff == pytest.approx(m.quadratic * (32768**2 - 32 * 1024**2), rel=1e-9)


def test_planner_cost_model_scales_with_the_group_that_runs_a_pack() -> None:
    one = pack_cost_model(model="llama3_1_8b", gpu="h100")
    four = pack_cost_model(model="llama3_1_8b", gpu="h100", tp=2, cp=2)
    assert one.pack_cost([8192]) == pytest.approx(4 * four.pack_cost([8192]))
    with pytest.raises(ConfigError, match="precision 'fp4' is unknown"):
        pack_cost_model(model="llama3_1_8b", gpu="h100", precision="fp4")


def test_a_target_built_in_code_has_a_spec_that_reads_back() -> None:
    target = _target(pp=2, vpp=3, schedule="interleaved", micro_batch_size=2, gbs=8, sampler="single")
    again = parse_balance_spec(target.spec)
    assert again == target and again.spec == target.spec
    assert again.cost_model == target.cost_model


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("dp=8", "needs gbs="),
        ("gbs=8", "needs dp="),
        ("dp=8,gbs=12,linear=1,quadratic=1", "not divisible by MBS\\*DP"),
        ("dp=2,gbs=4", "needs a cost model"),
        ("dp=2,gbs=4,model=llama3_1_8b", "needs both model=M and gpu=G"),
        ("dp=2,gbs=4,linear=1,quadratic=1,model=x,gpu=y", "not both"),
        ("dp=two,gbs=4", "not an integer"),
        ("dp=2,gbs=4,colour=red", "not key=value with a known key"),
        ("dp=2,gbs=4,linear=1,quadratic=1,schedule=zigzag", "schedule 'zigzag' is unknown"),
        ("dp=2,gbs=4,linear=-1,quadratic=1", "must be a finite number >= 0"),
    ],
)
def test_parse_errors_say_what_to_fix(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_balance_spec(spec)


def _max_rank_work(costs: np.ndarray, *, dp: int, gbs: int) -> tuple[float, float]:
    """Independent of ``simulate_schedule`` and ``pack_slots``: with PP 1 and MBS 1, Megatron-Bridge's
    batch sampler gives DP rank ``r`` rows ``r, r+DP, ...`` of every global batch of ``gbs`` rows, and a
    step lasts as long as its busiest rank. Returns (sum over steps of the busiest rank's work, the same
    with every step's work spread evenly over its ranks)."""
    busiest = even = 0.0
    for start in range(0, len(costs) - len(costs) % gbs, gbs):
        step = costs[start : start + gbs]
        per_rank = [float(step[r::dp].sum()) for r in range(dp)]
        busiest += max(per_rank)
        even += sum(per_rank) / dp
    return busiest, even


def test_balanced_beats_best_fit_on_step_time() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(600), 1.0, 6000).astype(np.int64), 1, 8192)
    target = parse_balance_spec("dp=4,pp=2,gbs=32,model=llama3_1_8b,gpu=h100")
    costs = target.cost_model
    best_fit = pack_lengths(lengths, 8192, seed=1)
    balanced = balanced_pack(lengths, 8192, target, seed=1)
    assert packing_stats(lengths, balanced, 8192).efficiency >= (
        packing_stats(lengths, best_fit, 8192).efficiency * 0.995
    )

    def step_time(bins: np.ndarray) -> float:
        return simulate_schedule(costs.cost(lengths, bins), dp=4, pp=2, gbs=32).total_time

    assert step_time(balanced) < step_time(best_fit)


def test_balanced_evens_rank_work_by_an_independent_count() -> None:
    # Judged without the simulator the packer optimises: pack costs recomputed from each row's lengths
    # by hand (linear + quadratic terms), ranks dealt as the sampler deals them.
    rng = np.random.default_rng(4)
    lengths = np.clip(rng.lognormal(np.log(500), 1.1, 5000).astype(np.int64), 1, 8192)
    linear, quadratic = 1.0, 1.0 / 2048
    target = BalanceTarget(cost_model=PackCostModel(linear=linear, quadratic=quadratic), dp=4, gbs=32)

    def row_costs(bins: np.ndarray) -> np.ndarray:
        out = np.zeros(int(bins.max()) + 1)
        for length, b in zip(lengths.tolist(), bins.tolist(), strict=True):
            out[b] += linear * length + quadratic * length * length
        return out

    balanced, even_b = _max_rank_work(row_costs(balanced_pack(lengths, 8192, target, seed=2)), dp=4, gbs=32)
    shuffled, even_s = _max_rank_work(row_costs(pack_lengths(lengths, 8192, seed=2)), dp=4, gbs=32)
    assert balanced / even_b < 1.02  # within 2 % of a perfect split of every step
    assert shuffled / even_s > 1.05  # best-fit in shuffled order leaves a visible imbalance
    assert balanced < shuffled
