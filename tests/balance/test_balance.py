"""Workload-balanced packing: cost model, schedule simulator and balanced packer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from longpack.balance import (
    BalanceTarget,
    PackCostModel,
    balanced_pack,
    cost_balanced_bins,
    megatron_dense_flops,
    order_packs,
    pack_slots,
    pipeline_makespan,
    positions_for_slots,
    simulate_schedule,
    step_length_correlation,
)
from longpack.binpack import pack_lengths, packing_stats

# ----------------------------------------------------------------------------------------------------------
# Cost model
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "seq", "gflop"),
    [
        # Published figures (planner-model.md#flops): Llama-3 70B s=8192 -> 449.2, Llama-3.1 405B -> 2524.
        (dict(hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=128256), 8192, 449.2),
        (dict(hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248, vocab=128256), 8192, 2524),
    ],
)
def test_megatron_flops_match_planner_checks(config: dict, seq: int, gflop: float) -> None:
    f = megatron_dense_flops(**config)
    assert f.flops_per_token(seq) / 1e9 == pytest.approx(gflop, rel=1e-3)


def test_from_flops_counts_causal_pairs_exactly() -> None:
    m = PackCostModel.from_flops(
        linear_flops_per_token=10.0, attention_flops_per_token_pair=4.0, flops_per_second=2.0
    )
    # A sequence of L tokens: 10·L linear FLOPs and L(L+1)/2 causal pairs of 4 FLOPs, at 2 FLOP/s.
    for length in (1, 7, 100):
        assert m.pack_cost([length]) == pytest.approx((10 * length + 4 * length * (length + 1) / 2) / 2)


def test_from_flops_separate_attention_rate() -> None:
    m = PackCostModel.from_flops(
        linear_flops_per_token=0.0,
        attention_flops_per_token_pair=2.0,
        flops_per_second=1.0,
        attention_flops_per_second=4.0,
    )
    assert m.quadratic == pytest.approx(0.25) and m.linear == pytest.approx(0.25)


def test_cost_matches_pack_cost() -> None:
    m = PackCostModel(linear=1.5, quadratic=0.01, per_sequence=3.0, per_pack=7.0)
    lengths = np.array([5, 9, 30, 2, 2])
    bins = np.array([0, 0, 1, 2, 2])
    # per_pack + per_sequence·k + linear·ΣL + quadratic·ΣL², by hand: [5, 9], [30], [2, 2]
    expect = [
        7 + 3 * 2 + 1.5 * 14 + 0.01 * 106,
        7 + 3 + 1.5 * 30 + 0.01 * 900,
        7 + 3 * 2 + 1.5 * 4 + 0.01 * 8,
    ]
    np.testing.assert_allclose(m.cost(lengths, bins), expect)
    np.testing.assert_allclose([m.pack_cost(lengths[bins == b]) for b in range(3)], expect)


def test_cost_model_rejects_negative_coefficients() -> None:
    with pytest.raises(ValueError, match="quadratic"):
        PackCostModel(linear=1.0, quadratic=-1.0)
    with pytest.raises(ValueError, match="flops_per_second"):
        PackCostModel.from_flops(
            linear_flops_per_token=1.0, attention_flops_per_token_pair=1.0, flops_per_second=0.0
        )


@settings(max_examples=30, deadline=None)
@given(
    coef=st.tuples(*[st.floats(0.0, 10.0) for _ in range(4)]),
    seed=st.integers(0, 2**16),
)
@example(coef=(0.0, 0.0, 1e-09, 0.0), seed=0)  # times of ~1e-7 s: the subset choice must be scale-free
def test_fit_recovers_noiseless_coefficients(coef: tuple[float, float, float, float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    true = PackCostModel(per_pack=coef[0], per_sequence=coef[1], linear=coef[2], quadratic=coef[3] / 100)
    packs = [rng.integers(1, 200, size=rng.integers(1, 6)) for _ in range(40)]
    times = [true.pack_cost(p) for p in packs]
    fitted = PackCostModel.fit(packs, times)
    np.testing.assert_allclose(
        [fitted.pack_cost(p) for p in packs], times, rtol=1e-6, atol=1e-6 * max(1.0, max(times))
    )
    assert fitted.r2 is not None and (fitted.r2 > 0.999999 or np.ptp(times) < 1e-9)


def test_fit_keeps_coefficients_non_negative() -> None:
    # Time falls with length: an unconstrained fit would give a negative slope; NNLS clamps it to 0.
    packs = [[10], [20], [30], [40]]
    fitted = PackCostModel.fit(packs, [4.0, 3.0, 2.0, 1.0])
    assert min(fitted.per_pack, fitted.per_sequence, fitted.linear, fitted.quadratic) >= 0
    assert fitted.linear == 0 and fitted.quadratic == 0  # the best non-negative fit is the mean
    assert fitted.pack_cost([25]) == pytest.approx(2.5) and fitted.r2 == pytest.approx(0.0)


def test_fit_rejects_mismatched_input() -> None:
    with pytest.raises(ValueError, match="one time per pack"):
        PackCostModel.fit([[1], [2]], [1.0])


# ----------------------------------------------------------------------------------------------------------
# Samplers and simulator
# ----------------------------------------------------------------------------------------------------------


def megatron_batch_sampler(total: int, dp: int, gbs: int, mbs: int) -> dict[int, tuple[int, int, int]]:
    """Megatron-Bridge MegatronPretrainingBatchSampler + split into micro-batches, as a plain loop."""
    where = {}
    for step in range(total // gbs):
        batch = list(range(step * gbs, (step + 1) * gbs))
        for rank in range(dp):
            mine = batch[rank::dp]
            for i in range(len(mine) // mbs):
                for idx in mine[i * mbs : (i + 1) * mbs]:
                    where[idx] = (step, rank, i)
    return where


def megatron_single_sampler(total: int, dp: int, gbs: int, mbs: int) -> dict[int, tuple[int, int, int]]:
    """Megatron-LM MegatronPretrainingSampler; micro-batch rounds counted within each global batch."""
    where = {}
    rounds_per_step = gbs // (mbs * dp)
    for rnd in range(total // (mbs * dp)):
        batch = list(range(rnd * mbs * dp, (rnd + 1) * mbs * dp))
        for rank in range(dp):
            for idx in batch[rank * mbs : (rank + 1) * mbs]:
                where[idx] = (rnd // rounds_per_step, rank, rnd % rounds_per_step)
    return where


@pytest.mark.parametrize("sampler", ["batch", "single"])
@pytest.mark.parametrize(("dp", "mbs", "m"), [(1, 1, 3), (4, 1, 2), (2, 3, 2), (3, 2, 4)])
def test_pack_slots_follow_megatron_samplers(sampler: str, dp: int, mbs: int, m: int) -> None:
    gbs = dp * mbs * m
    total = 3 * gbs
    ref = (megatron_batch_sampler if sampler == "batch" else megatron_single_sampler)(total, dp, gbs, mbs)
    slots = pack_slots(total, dp=dp, gbs=gbs, micro_batch_size=mbs, sampler=sampler)
    got = {k: (int(slots.step[k]), int(slots.rank[k]), int(slots.micro_batch[k])) for k in range(total)}
    assert got == ref
    pos = positions_for_slots(dp=dp, gbs=gbs, micro_batch_size=mbs, sampler=sampler)
    assert sorted(pos.ravel().tolist()) == list(range(gbs))
    for r in range(dp):
        for i in range(m):
            for p in pos[r, i]:
                assert got[int(p)][1:] == (r, i)


@pytest.mark.parametrize(("pp", "m"), [(1, 4), (2, 2), (4, 8), (4, 3)])
def test_1f1b_equal_micro_batches_match_bubble_formula(pp: int, m: int) -> None:
    # Pipeline bubble (planner-model.md): T = (m + p - 1)·(t_f + t_b) with t_f + t_b = cost / p per stage.
    assert pipeline_makespan(np.full(m, 6.0), pp=pp).item() == pytest.approx((m + pp - 1) * 6.0 / pp)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 4)])
def test_interleaved_equal_micro_batches_match_bubble_formula(pp: int, vpp: int, m: int) -> None:
    # Pipeline bubble (planner-model.md): bubble / ideal = (p - 1) / (v·m) for the interleaved schedule.
    work = m * 6.0 / pp
    t = pipeline_makespan(np.full(m, 6.0), pp=pp, schedule="interleaved", vpp=vpp).item()
    assert t == pytest.approx(work * (1 + (pp - 1) / (vpp * m)))


def test_interleaved_needs_multiple_of_pp() -> None:
    with pytest.raises(ValueError, match="multiple of pp"):
        pipeline_makespan(np.ones(6), pp=4, schedule="interleaved", vpp=2)


def test_pp1_step_is_slowest_rank_sum() -> None:
    costs = np.array([5.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    r = simulate_schedule(costs, dp=2, pp=1, gbs=4)
    # batch sampler: rank 0 gets positions 0, 2 of each step.
    assert r.rank_work.tolist() == [[7.0, 3.0], [2.0, 2.0]]
    assert r.step_times.tolist() == [7.0, 2.0] and r.ideal_step_times.tolist() == [5.0, 2.0]


def test_partial_last_step_is_simulated() -> None:
    r = simulate_schedule(np.ones(10), dp=2, pp=2, gbs=4)
    assert r.num_steps == 3 and r.rank_work[-1].tolist() == [1.0, 1.0]


layouts = st.sampled_from(
    [
        dict(dp=1, pp=1, m=3, schedule="1f1b", vpp=1),
        dict(dp=2, pp=2, m=3, schedule="1f1b", vpp=1),
        dict(dp=3, pp=4, m=5, schedule="1f1b", vpp=1),
        dict(dp=2, pp=2, m=4, schedule="interleaved", vpp=2),
        dict(dp=1, pp=3, m=3, schedule="interleaved", vpp=2),
    ]
)


@settings(max_examples=40, deadline=None)
@given(layout=layouts, mbs=st.integers(1, 2), steps=st.integers(1, 3), cost=st.floats(0.01, 1e3))
def test_balanced_input_reaches_ideal(layout: dict, mbs: int, steps: int, cost: float) -> None:
    gbs = layout["dp"] * layout["m"] * mbs
    r = simulate_schedule(
        np.full(steps * gbs, cost),
        dp=layout["dp"],
        pp=layout["pp"],
        gbs=gbs,
        micro_batch_size=mbs,
        schedule=layout["schedule"],
        vpp=layout["vpp"],
    )
    np.testing.assert_allclose(r.step_times, r.ideal_step_times, rtol=1e-12)
    assert r.efficiency == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(layout=layouts, data=st.data())
def test_adding_work_never_shortens_a_step(layout: dict, data: st.DataObject) -> None:
    gbs = layout["dp"] * layout["m"]
    n = data.draw(st.integers(1, 3 * gbs))
    costs = np.array(data.draw(st.lists(st.floats(0.0, 100.0), min_size=n, max_size=n)))
    k = data.draw(st.integers(0, n - 1))
    extra = data.draw(st.floats(0.0, 100.0))
    kwargs = dict(dp=layout["dp"], pp=layout["pp"], gbs=gbs, schedule=layout["schedule"], vpp=layout["vpp"])
    before = simulate_schedule(costs, **kwargs)
    more = costs.copy()
    more[k] += extra
    after = simulate_schedule(more, **kwargs)
    assert (after.step_times >= before.step_times - 1e-9 * np.maximum(1.0, before.step_times)).all()
    assert after.total_time >= before.total_time - 1e-9 * max(1.0, before.total_time)


def test_simulator_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="divisible"):
        simulate_schedule(np.ones(8), dp=3, pp=1, gbs=8)
    with pytest.raises(ValueError, match=r"pack_costs\[1\]"):
        simulate_schedule(np.array([1.0, -1.0]), dp=1, pp=1, gbs=2)
    with pytest.raises(ValueError, match="schedule"):
        simulate_schedule(np.ones(4), dp=1, pp=2, gbs=4, schedule="gpipe")


# ----------------------------------------------------------------------------------------------------------
# Balanced packer
# ----------------------------------------------------------------------------------------------------------

MODEL = PackCostModel(linear=1.0, quadratic=1.0 / 256, per_sequence=2.0)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 256), min_size=1, max_size=120),
    dp=st.integers(1, 3),
    m=st.integers(1, 3),
    pp=st.sampled_from([1, 2]),
    mbs=st.integers(1, 2),
    sampler=st.sampled_from(["batch", "single"]),
    fill=st.sampled_from(["auto", "best_fit", "even_cost"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_balanced_pack_is_a_valid_deterministic_packing(
    lengths: list[int], dp: int, m: int, pp: int, mbs: int, sampler: str, fill: str, seed: int
) -> None:
    cap = 256
    target = BalanceTarget(
        cost_model=MODEL, dp=dp, gbs=dp * m * mbs, micro_batch_size=mbs, sampler=sampler, pp=pp
    )
    kwargs = dict(seed=seed, fill=fill, passes=1)
    bins = balanced_pack(lengths, cap, target, **kwargs)
    arr = np.asarray(lengths)
    assert bins.shape == arr.shape and bins.dtype == np.int64  # every item exactly once
    nbins = int(bins.max()) + 1
    assert set(bins.tolist()) == set(range(nbins))  # dense ids: bin id = training position
    assert np.bincount(bins, weights=arr).max() <= cap  # capacity
    best_fit = packing_stats(arr, pack_lengths(arr, cap), cap)
    if fill != "even_cost":  # even_cost alone may open a bin for an item that fits nowhere
        efficiency = packing_stats(arr, bins, cap).efficiency
        assert nbins <= best_fit.num_bins or efficiency >= best_fit.efficiency - 0.005
    np.testing.assert_array_equal(bins, balanced_pack(lengths, cap, target, **kwargs))  # determinism


def test_cost_balanced_bins_even_out_costs() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(200), 1.0, 3000)), 1, 4096).astype(np.int64)
    model = PackCostModel(linear=1.0, quadratic=1.0 / 512)
    even = cost_balanced_bins(lengths, 4096, cost_model=model)
    best = pack_lengths(lengths, 4096)
    assert int(even.max()) <= int(best.max())  # no more bins than best-fit here
    c_even, c_best = model.cost(lengths, even), model.cost(lengths, best)
    assert c_even.std() / c_even.mean() < c_best.std() / c_best.mean()


def test_balanced_pack_beats_best_fit_under_dp_and_pp() -> None:
    rng = np.random.default_rng(1)
    cap = 4096
    lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.2, 6000)), 1, cap).astype(np.int64)
    model = PackCostModel(linear=1.0, quadratic=1.0 / 256)
    kw = dict(dp=4, pp=2, gbs=32)
    best = pack_lengths(lengths, cap, seed=3)
    bal = balanced_pack(lengths, cap, BalanceTarget(cost_model=model, **kw), seed=3)
    t_best = simulate_schedule(model.cost(lengths, best), **kw)
    t_bal = simulate_schedule(model.cost(lengths, bal), **kw)
    gap_closed = (t_best.total_time - t_bal.total_time) / (t_best.total_time - t_best.ideal_time)
    assert gap_closed > 0.7
    assert t_bal.rank_imbalance.mean() < t_best.rank_imbalance.mean()


def test_balanced_pack_seed_changes_order_not_packs() -> None:
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 512, 400)
    target = BalanceTarget(cost_model=MODEL, dp=2, gbs=8)
    a = balanced_pack(lengths, 512, target, seed=0, fill="best_fit")
    b = balanced_pack(lengths, 512, target, seed=1, fill="best_fit")
    assert not np.array_equal(a, b)
    assert int(a.max()) == int(b.max())


def test_order_packs_is_a_permutation_with_partial_step() -> None:
    costs = np.random.default_rng(3).random(37)
    pos = order_packs(costs, dp=2, gbs=8, pp=2, seed=5)
    assert sorted(pos.tolist()) == list(range(37))
    pos = order_packs(costs, dp=2, gbs=8, pp=2, schedule="interleaved", vpp=2, seed=5)
    assert sorted(pos.tolist()) == list(range(37))


def test_order_packs_evens_out_rank_work() -> None:
    costs = np.random.default_rng(6).lognormal(0.0, 1.0, 256)
    kw = dict(dp=4, pp=2, gbs=32)
    ordered = np.empty_like(costs)
    ordered[order_packs(costs, seed=0, **kw)] = costs
    balanced = simulate_schedule(ordered, **kw)
    as_given = simulate_schedule(costs, **kw)
    assert balanced.rank_imbalance.max() < as_given.rank_imbalance.mean()
    assert balanced.total_time < as_given.total_time


def test_step_length_correlation_detects_sorted_order() -> None:
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 1000, 2000)
    sorted_bins = np.argsort(np.argsort(-lengths, kind="stable"))  # longest first: one item per bin
    assert step_length_correlation(lengths, sorted_bins, gbs=50) < -0.9
    bal = balanced_pack(lengths, 1000, BalanceTarget(cost_model=MODEL, dp=2, gbs=16), seed=0)
    assert abs(step_length_correlation(lengths, bal, gbs=16)) < 0.5


def test_balanced_pack_rejects_bad_input() -> None:
    one = BalanceTarget(cost_model=MODEL, dp=1, gbs=1)
    with pytest.raises(ValueError, match=r"outside 1\.\.10"):
        balanced_pack([5, 11], 10, one, seed=0)
    with pytest.raises(ValueError, match="fill"):
        balanced_pack([5], 10, one, seed=0, fill="worst")
    with pytest.raises(ValueError, match="divisible"):
        BalanceTarget(cost_model=MODEL, dp=2, gbs=3)
    with pytest.raises(TypeError, match="parse_balance_spec"):
        balanced_pack([5], 10, "dp=1,gbs=1,linear=1,quadratic=0", seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be in"):
        balanced_pack([5], 10, one, seed=-1)


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------


def test_cli_balance_writes_training_ordered_bins(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from longpack.cli.app import app

    rng = np.random.default_rng(5)
    lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.2, 800)), 1, 4096).astype(np.int64)
    src = tmp_path / "lengths.txt"
    src.write_text("# runtime lengths\n" + "\n".join(map(str, lengths)) + "\n")
    out = tmp_path / "bins.npy"
    args = [
        "balance",
        str(src),
        "--pack-size",
        "4096",
        "--dp",
        "2",
        "--pp",
        "2",
        "--gbs",
        "8",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    names = [row["packing"] for row in report["packings"]]
    assert names == ["first_fit_shuffle", "best_fit", "balanced"]
    bins = np.load(out)
    assert bins.shape == lengths.shape and np.bincount(bins, weights=lengths).max() <= 4096
    assert report["packings"][2]["packs"] == int(bins.max()) + 1


def test_cli_balance_names_bad_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from longpack.cli.app import app

    src = tmp_path / "lengths.txt"
    src.write_text("12\nseven\n")
    result = CliRunner().invoke(app, ["balance", str(src), "--pack-size", "64", "--dp", "1", "--gbs", "1"])
    assert result.exit_code == 2 and "lengths.txt:2" in result.output
