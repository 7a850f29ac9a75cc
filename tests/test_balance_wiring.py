"""algorithm="balanced" through pack_lengths, BalanceTarget parsing and the planner-derived cost model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.balance import BalanceTarget, PackCostModel, balanced_pack, simulate_schedule
from longpack.binpack import BALANCED, pack_lengths, packing_stats


def _target(**kw: object) -> BalanceTarget:
    base: dict[str, object] = {"cost_model": PackCostModel(linear=1.0, quadratic=0.002), "dp": 2, "gbs": 4}
    base.update(kw)
    return BalanceTarget(**base)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 512), min_size=1, max_size=200),
    seed=st.integers(0, 2**16),
)
def test_balanced_pack_lengths_respects_capacity_and_places_every_item_once(
    lengths: list[int], seed: int
) -> None:
    bins = pack_lengths(lengths, 512, algorithm=BALANCED, seed=seed, balance=_target())
    assert bins.dtype == np.int64 and bins.shape == (len(lengths),)
    totals = np.bincount(bins, weights=lengths)
    assert totals.max() <= 512
    assert set(np.unique(bins).tolist()) == set(range(int(bins.max()) + 1))  # dense ids
    again = pack_lengths(lengths, 512, algorithm=BALANCED, seed=seed, balance=_target())
    assert np.array_equal(bins, again)


def test_pack_lengths_balanced_equals_balanced_pack() -> None:
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 2000).astype(np.int64), 1, 4096)
    target = _target(dp=4, gbs=16, pp=2)
    via_binpack = pack_lengths(lengths, 4096, algorithm="balanced", seed=7, balance=target)
    direct = balanced_pack(
        lengths, 4096, cost_model=target.cost_model, dp=4, gbs=16, pp=2, seed=7, schedule="1f1b"
    )
    assert np.array_equal(via_binpack, direct)
    best = packing_stats(lengths, pack_lengths(lengths, 4096), 4096)
    ours = packing_stats(lengths, via_binpack, 4096)
    assert ours.efficiency >= best.efficiency * 0.995


def test_balanced_needs_a_target_and_others_refuse_one() -> None:
    with pytest.raises(ValueError, match="needs balance="):
        pack_lengths([1, 2], 4, algorithm="balanced")
    with pytest.raises(ValueError, match="only used with algorithm='balanced'"):
        pack_lengths([1, 2], 4, balance=_target())


def test_parse_with_planner_cost_model() -> None:
    t = BalanceTarget.parse("dp=8,pp=4,vpp=2,gbs=128,model=qwen3_30b_a3b,gpu=h100,precision=fp8")
    assert (t.dp, t.pp, t.vpp, t.gbs, t.schedule) == (8, 4, 2, 128, "interleaved")
    m = t.cost_model
    # attention makes one 32K document cost more than 32 x 1K documents of the same tokens
    assert m.pack_cost([32768]) > 2 * m.pack_cost([1024] * 32)
    # same tokens, same linear work: the difference is exactly the quadratic term
    diff = m.pack_cost([32768]) - m.pack_cost([1024] * 32)
    assert diff == pytest.approx(m.quadratic * (32768**2 - 32 * 1024**2), rel=1e-9)


def test_planner_cost_model_scales_with_the_group_that_runs_a_pack() -> None:
    one = PackCostModel.from_planner(model="llama3_1_8b", gpu="h100")
    four = PackCostModel.from_planner(model="llama3_1_8b", gpu="h100", tp=2, cp=2)
    assert one.pack_cost([8192]) == pytest.approx(4 * four.pack_cost([8192]))


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
    ],
)
def test_parse_errors_say_what_to_fix(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BalanceTarget.parse(spec)


def test_balanced_beats_best_fit_on_simulated_step_time() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(600), 1.0, 6000).astype(np.int64), 1, 8192)
    target = BalanceTarget.parse("dp=4,pp=2,gbs=32,model=llama3_1_8b,gpu=h100")
    costs = target.cost_model
    best_fit = pack_lengths(lengths, 8192, seed=1)
    balanced = pack_lengths(lengths, 8192, algorithm="balanced", seed=1, balance=target)

    def step_time(bins: np.ndarray) -> float:
        return simulate_schedule(costs.cost(lengths, bins), dp=4, pp=2, gbs=32).total_time

    assert step_time(balanced) < step_time(best_fit)
