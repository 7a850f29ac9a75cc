"""Feasibility of hybrid / dynamic CP schedules exactly as Megatron-Core builds its process groups.

``cp_group_sizes`` / ``block_reason`` are checked, for every DP x CP from 2 to 32, against the rank lists
Megatron-LM's own ``create_hybrid_dp_cp_groups`` (main) and ``create_dynamic_dp_cp_groups`` (dev) build
(lifted from a checkout, see ``megatron_lm_source``; skipped without one) and against the rule written out
here; the schedulers' outputs are checked block by block on random length sets.
"""

from __future__ import annotations

import megatron_lm_source as upstream
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.balance.cp_groups import InfeasibleCPSchedule, block_reason, cp_group_sizes
from longpack.balance.dynamic_cp import schedule_dynamic_cp
from longpack.balance.hybrid_cp import schedule_hybrid_cp
from longpack.errors import ConfigError, LongpackError

ALL_N = range(2, 33)


def rule_blocks(n: int, sizes) -> set[tuple[int, ...]]:
    """Every rank block a sub-sample may run on: single ranks, the whole group, aligned full k-blocks."""
    out = {(r,) for r in range(n)} if 1 in sizes else set()
    out.add(tuple(range(n)))
    for k in sizes:
        out |= {tuple(range(r, r + k)) for r in range(0, n - k + 1, k)}
    return out


def all_blocks(n: int):
    return [tuple(range(r, r + k)) for k in range(1, n + 1) for r in range(0, n - k + 1)]


@pytest.mark.parametrize("n", ALL_N)
@pytest.mark.parametrize("scheme,min_cp", [("hybrid", 1), ("dynamic", 1), ("dynamic", 2), ("dynamic", 4)])
def test_block_feasibility_is_the_rule_for_every_dp_cp(n, scheme, min_cp):
    sizes = cp_group_sizes(n, scheme=scheme, min_cp_size=min_cp)
    allowed = rule_blocks(n, sizes)
    for block in all_blocks(n):
        assert (block_reason(list(block), n, sizes) is None) == (block in allowed), (n, block)


@pytest.mark.skipif(
    upstream.group_builders() is None, reason="no Megatron-LM checkout (LONGPACK_MEGATRON_LM)"
)
@pytest.mark.parametrize("n", ALL_N)
@pytest.mark.parametrize("scheme,min_cp", [("hybrid", 1), ("dynamic", 1), ("dynamic", 2), ("dynamic", 4)])
def test_blocks_are_the_groups_megatron_core_creates(n, scheme, min_cp):
    builders = upstream.group_builders()
    made = builders["made"]
    made.clear()
    if scheme == "hybrid":
        builders["hybrid"](0, list(range(n)), None)
    else:
        builders["dynamic"](0, list(range(n)), None, min_cp_size=min_cp)
    # a group of label k is usable for a k-rank sub-sample only when it has k members
    real = {tuple(ranks) for desc, ranks in made if len(ranks) == int(desc.rsplit("_", 1)[1])}
    real.add(tuple(range(n)))  # get_*_data_context_parallel_groups(group_size=N): the DP x CP group
    if scheme == "hybrid":
        real |= {(r,) for r in range(n)}  # local_cp_size 1 runs on the rank alone
    sizes = cp_group_sizes(n, scheme=scheme, min_cp_size=min_cp)
    assert {b for b in all_blocks(n) if block_reason(list(b), n, sizes) is None} == real


def test_the_issue_cases():
    # DP x CP 10 and 14: Megatron's fill_empty_gpus pushes ranks past the last one (IndexError there)
    for n in (10, 14):
        with pytest.raises(InfeasibleCPSchedule, match=r"fill_empty_gpus.*IndexError in Megatron") as exc:
            schedule_hybrid_cp([400, 400], max_seqlen_per_rank=100, dp_cp_size=n)
        assert isinstance(exc.value, LongpackError) and isinstance(exc.value, ConfigError)
        assert exc.value.mode == "hybrid" and exc.value.field == "max_seqlen_per_dp_cp_rank"
    # DP x CP 8: a 4-rank sub-sample on ranks 2-5, where the 4-rank groups are 0-3 and 4-7
    s = schedule_hybrid_cp(
        [161, 108, 144, 178, 67, 254, 214, 146, 209], max_seqlen_per_rank=100, dp_cp_size=8
    )
    assert "ranks 2-5 of 8" in s.infeasible_reason()
    # a 4-rank sub-sample on 6 ranks has no group
    assert cp_group_sizes(6) == (1, 2, 6) and cp_group_sizes(24) == (1, 2, 4, 8, 24)


def test_megatron_core_fails_on_the_issue_case_too():
    hybrid_cp_schedule = pytest.importorskip("megatron.core.pipeline_parallel.hybrid_cp_schedule")

    class Group:
        def size(self):
            return 10

    with pytest.raises(IndexError):
        hybrid_cp_schedule.BalancedCPScheduler(100, Group()).get_groups_and_subsamples(
            list(enumerate([400, 400])), None
        )


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 8192), min_size=1, max_size=40),
    cap=st.sampled_from([128, 512, 1024]),
    n=st.integers(1, 16).map(lambda h: 2 * h),
    scheme=st.sampled_from(["hybrid", "dynamic"]),
)
def test_a_schedule_is_feasible_iff_every_sub_sample_has_a_group(lengths, cap, n, scheme):
    try:
        if scheme == "hybrid":
            s = schedule_hybrid_cp(lengths, max_seqlen_per_rank=cap, dp_cp_size=n)
            blocks = [g.sample_ids for g in s.groups]
        else:
            s = schedule_dynamic_cp(lengths, max_seqlen_per_rank=cap, dp_cp_size=n)
            blocks = [mb.sample_ids for mb in s.micro_batches]
    except InfeasibleCPSchedule as exc:
        assert "max_seqlen_per_dp_cp_rank" in str(exc) or "DP x CP" in str(exc)
        return
    allowed = rule_blocks(n, cp_group_sizes(n, scheme=scheme))
    runnable = True
    for ids in blocks:
        where: dict[int, list[int]] = {}
        for r, rank_ids in enumerate(ids):
            for sid in rank_ids:
                where.setdefault(sid, []).append(r)
        runnable &= all(tuple(r) in allowed for r in where.values())
    assert (s.infeasible_reason() is None) == runnable


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6000), min_size=4, max_size=48),
    n=st.integers(2, 32),
    cap=st.sampled_from([256, 1024]),
)
def test_compare_cp_modes_never_crashes_and_refuses_exactly_what_megatron_core_cannot_run(lengths, n, cap):
    """Every DP x CP from 2 to 32 (as DP = n, CP = 1 and, where even, DP = n / 2, CP = 2): hybrid and dynamic
    CP are infeasible exactly on an odd count, a scheduler failure or a sub-sample without a process group."""
    from longpack.balance.cp_modes import compare_cp_modes, gather_order

    def cost(ls, ranks):
        return sum(x + x * x / 1000 for x in ls) / ranks

    for dp, cp in {(n, 1), *(((n // 2, 2),) if n % 2 == 0 else ())}:
        packs = [lengths[i::dp] or [1] for i in range(dp)]
        c = compare_cp_modes(packs, dp=dp, cp=cp, gbs=dp, max_seqlen_per_rank=cap, seconds=cost)
        batch = [x for k in gather_order(dp, dp=dp, gbs=dp) for x in packs[k]]
        for mode, schedule in (("hybrid", schedule_hybrid_cp), ("dynamic_cp", schedule_dynamic_cp)):
            if n % 2:
                expected = True
            else:
                try:
                    s = schedule(batch, max_seqlen_per_rank=cap, dp_cp_size=n)
                except InfeasibleCPSchedule:
                    expected = True
                else:
                    expected = s.infeasible_reason() is not None
            assert (mode in c.infeasible) == expected, (mode, c.infeasible.get(mode))
            assert (c.times[mode] == float("inf")) == expected
