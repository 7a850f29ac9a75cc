"""longpack's hybrid-CP schedule equals megatron-core's own BalancedCPScheduler, rank for rank."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.balance.hybrid_cp import schedule_hybrid_cp
from longpack.errors import ConfigError
from longpack.topology import ranks_needed

hybrid_cp_schedule = pytest.importorskip("megatron.core.pipeline_parallel.hybrid_cp_schedule")


class _GroupSize:
    """The scheduler reads only ``size()`` of its DP x CP process group."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


def megatron_schedule(lengths, cap, total):
    scheduler = hybrid_cp_schedule.BalancedCPScheduler(cap, _GroupSize(total))
    groups, sample_id_groups = scheduler.get_groups_and_subsamples(list(enumerate(lengths)), None)
    return [[list(r) for r in g] for g in groups], [[list(r) for r in g] for g in sample_id_groups]


def longpack_schedule(lengths, cap, total):
    s = schedule_hybrid_cp(lengths, max_seqlen_per_rank=cap, dp_cp_size=total)
    return [[list(r) for r in g.lengths] for g in s.groups], [
        [list(r) for r in g.sample_ids] for g in s.groups
    ]


def test_ranks_needed_equals_megatron_float_formula():
    for cap in (1, 3, 512, 4096, 8191, 32768):
        for n in [*range(1, 70), *np.random.default_rng(cap).integers(1, 2**21, 500).tolist()]:
            expected = max(1, 2 ** math.ceil(math.log2(n / cap)))
            assert ranks_needed(int(n), cap) == expected, (n, cap)


def test_equals_megatron_on_1000_random_length_sets():
    """Long-tailed sets (most short, a few near the cap times the group), group sizes 1-16, several caps."""
    rng = np.random.default_rng(20261201)
    checked = 0
    while checked < 1000:
        total = int(rng.choice([1, 2, 4, 8, 16, 6, 12]))
        cap = int(rng.choice([256, 1000, 4096]))
        count = int(rng.integers(1, 64))
        shape = rng.choice(["lognormal", "uniform", "bimodal"])
        if shape == "lognormal":
            lengths = np.minimum(rng.lognormal(math.log(cap / 4), 1.2, count), cap * total).astype(int)
        elif shape == "uniform":
            lengths = rng.integers(1, cap * total + 1, count)
        else:
            lengths = np.where(
                rng.random(count) < 0.85,
                rng.integers(1, cap // 4 + 1, count),
                rng.integers(cap, cap * total + 1, count),
            )
        lengths = [max(1, int(n)) for n in lengths]
        try:
            expected = megatron_schedule(lengths, cap, total)
        except (AssertionError, TypeError, ValueError, IndexError):
            with pytest.raises(ConfigError):
                longpack_schedule(lengths, cap, total)
            checked += 1
            continue
        assert longpack_schedule(lengths, cap, total) == expected, (lengths, cap, total)
        checked += 1


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4096), min_size=1, max_size=40),
    cap=st.sampled_from([128, 512, 1024]),
    total=st.sampled_from([1, 2, 4, 8]),
)
def test_equals_megatron_property(lengths, cap, total):
    try:
        expected = megatron_schedule(lengths, cap, total)
    except (AssertionError, TypeError, ValueError, IndexError):
        with pytest.raises(ConfigError):
            longpack_schedule(lengths, cap, total)
        return
    assert longpack_schedule(lengths, cap, total) == expected


def test_every_sub_sample_runs_exactly_once_on_its_ranks():
    lengths = [9000, 5000, 4000, 300, 200, 100, 7000, 2500, 50]
    s = schedule_hybrid_cp(lengths, max_seqlen_per_rank=4096, dp_cp_size=8)
    seen: dict[int, int] = {}
    for group in s.groups:
        for sid in {sid for ids in group.sample_ids for sid in ids}:
            assert sid not in seen
            seen[sid] = group.ranks_of(sid)
            assert seen[sid] >= ranks_needed(lengths[sid], 4096)
    assert sorted(seen) == list(range(len(lengths)))
    assert s.critical_work() >= s.mean_work()


def test_a_sub_sample_longer_than_the_group_can_hold_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"needs 4 ranks.*DP x CP group's 2"):
        schedule_hybrid_cp([10_000], max_seqlen_per_rank=4096, dp_cp_size=2)
