"""``pack_lengths`` / ``packing_stats``: properties for every algorithm, Megatron bin order, errors."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.binpack import ALGORITHMS, PackingStats, megatron, pack_lengths, packing_stats


def best_fit_decreasing_reference(lengths: list[int], capacity: int) -> list[int]:
    """Plain best fit decreasing, one item at a time, over a sorted list of the bins' free room.

    Returns the sorted bin fills (bins with equal room are interchangeable, so the fills are unique).
    """
    rooms: list[int] = []
    for length in sorted(lengths, reverse=True):
        i = bisect.bisect_left(rooms, length)
        if i == len(rooms):
            bisect.insort(rooms, capacity - length)
        else:
            bisect.insort(rooms, rooms.pop(i) - length)
    return sorted(capacity - room for room in rooms)


cases = st.integers(1, 80).flatmap(
    lambda cap: st.tuples(
        st.lists(st.integers(1, cap), max_size=150),
        st.just(cap),
        st.sampled_from(ALGORITHMS),
        st.integers(0, 2**32 - 1),
    )
)


@settings(max_examples=200, deadline=None)
@given(cases)
def test_pack_lengths_properties(case: tuple[list[int], int, str, int]) -> None:
    lengths, capacity, algorithm, seed = case
    bins = pack_lengths(lengths, capacity, algorithm=algorithm, seed=seed)
    assert bins.dtype == np.int64 and bins.shape == (len(lengths),)  # each item exactly once
    if lengths:
        nbins = int(bins.max()) + 1
        assert np.all(np.bincount(bins, minlength=nbins) > 0)  # dense ids 0..B-1
        assert np.bincount(bins, weights=lengths).max() <= capacity  # capacity respected
    again = pack_lengths(np.array(lengths, dtype=np.int32), capacity, algorithm=algorithm, seed=seed)
    assert np.array_equal(bins, again)  # deterministic, whatever the integer dtype


@settings(max_examples=150, deadline=None)
@given(cases)
def test_best_fit_decreasing_fills_equal_reference(case: tuple[list[int], int, str, int]) -> None:
    lengths, capacity, _, seed = case
    bins = pack_lengths(lengths, capacity, seed=seed)
    fills = np.bincount(bins, weights=lengths).astype(int).tolist() if lengths else []
    # bins with equal room are interchangeable, so every best-fit-decreasing run has the same fills
    assert sorted(fills) == best_fit_decreasing_reference(lengths, capacity)


@settings(max_examples=150, deadline=None)
@given(cases)
def test_megatron_family_bin_k_is_megatron_bin_k(case: tuple[list[int], int, str, int]) -> None:
    lengths, capacity, algorithm, seed = case
    if algorithm == "best_fit_decreasing" or not lengths:
        return
    histogram = np.bincount(lengths, minlength=capacity + 1).tolist()
    expected, _ = megatron.create_packing_strategy(
        histogram, capacity, algorithm, rng=np.random.RandomState(seed)
    )
    bins = pack_lengths(lengths, capacity, algorithm=algorithm, seed=seed)
    # the documented identity rule: equal lengths go to their occurrences in bin order, lower index first
    queues: dict[int, list[int]] = {}
    for b, content in enumerate(expected):
        for length in content:
            queues.setdefault(length, []).append(b)
    want = [queues[length].pop(0) for length in lengths]
    assert bins.tolist() == want


def test_golden_outputs_are_stable_across_versions() -> None:
    lengths = [7, 3, 9, 1, 4, 6, 2, 8, 5, 5]
    assert pack_lengths(lengths, 10, seed=0).tolist() == pack_lengths(lengths, 10, seed=0).tolist()
    assert pack_lengths(lengths, 10, seed=0).tolist() == [1, 1, 2, 2, 3, 3, 0, 0, 4, 4]
    assert pack_lengths(lengths, 10, algorithm="first_fit_decreasing").tolist() == [
        2, 2, 0, 0, 3, 3, 1, 1, 4, 4,
    ]  # fmt: skip
    assert pack_lengths(lengths, 10, algorithm="first_fit_shuffle", seed=3).tolist() == [
        4, 1, 2, 1, 1, 3, 1, 5, 0, 0,
    ]  # fmt: skip


def test_seed_permutes_best_fit_bins_only() -> None:
    lengths = np.random.RandomState(0).randint(1, 1000, size=2000)
    a, b = pack_lengths(lengths, 1000, seed=0), pack_lengths(lengths, 1000, seed=1)
    assert not np.array_equal(a, b)
    fills_a = np.sort(np.bincount(a, weights=lengths))
    assert np.array_equal(fills_a, np.sort(np.bincount(b, weights=lengths)))


def test_global_rng_untouched() -> None:
    state = np.random.get_state()
    lengths = np.random.RandomState(1).randint(1, 100, size=500)
    for algorithm in ALGORITHMS:
        pack_lengths(lengths, 100, algorithm=algorithm, seed=11)
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1]) and state[2:] == after[2:]


def test_empty_and_exact_and_full_capacity() -> None:
    for algorithm in ALGORITHMS:
        assert pack_lengths([], 10, algorithm=algorithm).tolist() == []
        bins = pack_lengths([10, 10, 10], 10, algorithm=algorithm)
        assert sorted(bins.tolist()) == [0, 1, 2]
        bins = pack_lengths([5, 5, 5, 5], 10, algorithm=algorithm)
        assert np.bincount(bins).tolist() == [2, 2] or algorithm == "first_fit_shuffle"


def test_invalid_lengths_error_names_count_index_value_and_fix() -> None:
    with pytest.raises(ValueError) as err:
        pack_lengths([5, 0, 3, 12, 11], 10)
    msg = str(err.value)
    assert "3 of 5 lengths are outside 1..10" in msg
    assert "first at index 1: 0" in msg
    assert "Truncate, split or drop" in msg
    with pytest.raises(ValueError, match="first at index 0: 11"):
        pack_lengths(np.array([11], dtype=np.uint16), 10, algorithm="first_fit")
    with pytest.raises(ValueError, match="not whole numbers; first at index 1"):
        pack_lengths([1.0, 2.5], 10)
    with pytest.raises(ValueError, match="1-D"):
        pack_lengths([[1, 2]], 10)
    with pytest.raises(ValueError, match="unknown packing algorithm 'next_fit'"):
        pack_lengths([1], 10, algorithm="next_fit")
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        pack_lengths([1], 0)
    with pytest.raises(ValueError, match="seed must be in"):
        pack_lengths([1], 10, seed=-1)
    assert pack_lengths(np.array([1.0, 2.0]), 10).tolist() == [0, 0]


def test_packing_stats_values() -> None:
    stats = packing_stats([6, 2, 5, 3, 4], [0, 0, 1, 1, 2], 8)
    assert stats == PackingStats(
        num_items=5,
        total_length=20,
        capacity=8,
        num_bins=3,
        lower_bound=3,
        bins_over_lower_bound=1.0,
        efficiency=20 / 24,
        max_items_per_bin=2,
        mean_items_per_bin=5 / 3,
        min_bin_fill=4,
        max_bin_fill=8,
    )
    assert packing_stats([], [], 8).num_bins == 0
    with pytest.raises(ValueError, match="not dense: bin 1"):
        packing_stats([1, 2], [0, 2], 8)
    with pytest.raises(ValueError, match="same size"):
        packing_stats([1, 2], [0], 8)


def test_best_fit_decreasing_near_lower_bound_on_sft_like_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(600), 1.0, 100_000)), 1, 8192).astype(np.int64)
    stats = packing_stats(lengths, pack_lengths(lengths, 8192), 8192)
    assert stats.max_bin_fill <= 8192
    assert stats.bins_over_lower_bound <= 1.0005


@pytest.mark.parametrize("workload", ["lognormal", "uniform", "small"])
def test_best_fit_decreasing_group_moves_equal_item_by_item(workload: str) -> None:
    rng = np.random.default_rng(5)
    if workload == "lognormal":
        lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.0, 30_000)), 1, 2048).astype(np.int64)
    elif workload == "uniform":
        lengths = rng.integers(1, 2049, 30_000)
    else:
        lengths = rng.integers(1, 40, 30_000)
    bins = pack_lengths(lengths, 2048, seed=1)
    fills = np.sort(np.bincount(bins, weights=lengths).astype(np.int64)).tolist()
    assert fills == best_fit_decreasing_reference(lengths.tolist(), 2048)
