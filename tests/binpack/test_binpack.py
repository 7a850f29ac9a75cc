"""``pack_lengths`` / ``packing_stats``: properties for every algorithm, Megatron bin order, errors."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.binpack import (
    ALGORITHMS,
    BinContents,
    PackingStats,
    megatron,
    pack_bins,
    pack_lengths,
    packing_stats,
)


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


def megatron_fill_reference(lengths: list[int], capacity: int, seed: int) -> list[list[int]]:
    """Megatron-Bridge's first_fit_shuffle rows as item indices, step by step in plain Python.

    One RandomState plays the seeded global RNG: create_packing_strategy shuffles and first-fits the
    ascending length list; fill_packing_strategy keeps each length's items in input order, draws
    permutation(count) per length in ascending order, and every bin pops a length's items from the end.
    """
    rng = np.random.RandomState(seed)
    histogram = np.bincount(lengths, minlength=capacity + 1).tolist()
    bins, _ = megatron.create_packing_strategy(histogram, capacity, "first_fit_shuffle", rng=rng)
    sequences: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        sequences.setdefault(length, []).append(i)
    for length in sorted(sequences):
        perm = rng.permutation(len(sequences[length]))
        sequences[length] = [sequences[length][k] for k in perm]
    rows = [[sequences[length].pop() for length in content] for content in bins]
    assert not any(sequences.values())
    return rows


@settings(max_examples=150, deadline=None)
@given(cases)
def test_megatron_family_bin_k_is_megatron_bin_k(case: tuple[list[int], int, str, int]) -> None:
    lengths, capacity, algorithm, seed = case
    if algorithm == "best_fit_decreasing" or not lengths:
        return
    bins = pack_lengths(lengths, capacity, algorithm=algorithm, seed=seed)
    if algorithm == "first_fit_shuffle":
        # the items Megatron-Bridge's fill step puts in each bin, and (pack_bins) in that order
        rows = megatron_fill_reference(lengths, capacity, seed)
        want = [0] * len(lengths)
        for b, row in enumerate(rows):
            for i in row:
                want[i] = b
        assert bins.tolist() == want
        c = pack_bins(lengths, capacity, algorithm=algorithm, seed=seed)
        assert [c.items[c.offsets[b] : c.offsets[b + 1]].tolist() for b in range(c.num_bins)] == rows
        return
    histogram = np.bincount(lengths, minlength=capacity + 1).tolist()
    expected, _ = megatron.create_packing_strategy(
        histogram, capacity, algorithm, rng=np.random.RandomState(seed)
    )
    # the documented identity rule: equal lengths go to their occurrences in bin order, lower index first
    queues: dict[int, list[int]] = {}
    for b, content in enumerate(expected):
        for length in content:
            queues.setdefault(length, []).append(b)
    want = [queues[length].pop(0) for length in lengths]
    assert bins.tolist() == want


def previous_plan_rows(lengths: np.ndarray, pack_size: int, algorithm: str, seed: int) -> tuple[list, list]:
    """``longpack.packed.plan_rows`` as it was before binpack owned Megatron's item order (verbatim logic):
    first_fit_shuffle filled by its own per-length permutation, the others as pack_lengths' bins in
    bin-id order with input order inside a bin."""
    if algorithm != "first_fit_shuffle":
        bins = pack_lengths(lengths, pack_size, algorithm=algorithm, seed=seed)
        order = np.argsort(bins, kind="stable")
        counts = np.bincount(bins)
        counts = counts[counts > 0]
        return order.tolist(), [0, *np.cumsum(counts).tolist()]
    rng = np.random.RandomState(seed)
    histogram = np.bincount(lengths, minlength=pack_size + 1)
    in_bin_order, bin_offsets, _ = megatron.create_packing_strategy_arrays(
        histogram, pack_size, "first_fit_shuffle", rng=rng
    )
    by_length = np.argsort(lengths, kind="stable")
    starts = np.zeros(len(histogram) + 1, dtype=np.int64)
    np.cumsum(histogram, out=starts[1:])
    popped = np.empty(len(lengths), dtype=np.int64)
    for length in np.flatnonzero(histogram).tolist():
        group = by_length[starts[length] : starts[length + 1]]
        perm = rng.permutation(len(group))
        popped[starts[length] : starts[length + 1]] = group[perm][::-1]
    occurrence = np.argsort(in_bin_order, kind="stable")
    order = np.empty(len(lengths), dtype=np.int64)
    order[occurrence] = popped
    return order.tolist(), bin_offsets.tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 200).flatmap(
        lambda cap: st.tuples(
            st.lists(st.integers(1, cap), min_size=1, max_size=300),
            st.just(cap),
            st.sampled_from(ALGORITHMS),
            st.integers(0, 2**32 - 1),
        )
    )
)
def test_pack_bins_and_plan_rows_equal_the_previous_plan_rows(case: tuple[list[int], int, str, int]) -> None:
    from longpack.packed import plan_rows

    lengths, capacity, algorithm, seed = case
    arr = np.asarray(lengths, dtype=np.int64)
    want_order, want_offsets = previous_plan_rows(arr, capacity, algorithm, seed)
    c = pack_bins(arr, capacity, algorithm=algorithm, seed=seed)
    assert (c.items.tolist(), c.offsets.tolist()) == (want_order, want_offsets)
    plan = plan_rows(arr, capacity, algorithm=algorithm, seed=seed)
    assert (plan.order.tolist(), plan.row_offsets.tolist()) == (want_order, want_offsets)
    # one name, one thing: pack_lengths' bins are pack_bins' bins
    assert np.array_equal(pack_lengths(arr, capacity, algorithm=algorithm, seed=seed), c.bin_of_item())


def test_bin_contents_from_bin_of_item_round_trips() -> None:
    bins = np.array([2, 0, 2, 1, 0])
    c = BinContents.from_bin_of_item(bins)
    assert c.items.tolist() == [1, 4, 3, 0, 2] and c.offsets.tolist() == [0, 2, 3, 5]
    assert c.bin_of_item().tolist() == bins.tolist()
    empty = pack_bins([], 8)
    assert empty.items.tolist() == [] and empty.offsets.tolist() == [0] and empty.num_bins == 0


def test_golden_outputs_are_stable_across_versions() -> None:
    lengths = [7, 3, 9, 1, 4, 6, 2, 8, 5, 5]
    assert pack_lengths(lengths, 10, seed=0).tolist() == [1, 1, 2, 2, 3, 3, 0, 0, 4, 4]
    assert pack_lengths(lengths, 10, algorithm="first_fit_decreasing").tolist() == [
        2, 2, 0, 0, 3, 3, 1, 1, 4, 4,
    ]  # fmt: skip
    assert pack_lengths(lengths, 10, algorithm="first_fit_shuffle", seed=3).tolist() == [
        4, 1, 2, 1, 1, 3, 1, 5, 0, 0,
    ]  # fmt: skip
    c = pack_bins(lengths, 10, algorithm="first_fit_shuffle", seed=3)
    assert c.items.tolist() == [8, 9, 6, 1, 3, 4, 2, 5, 0, 7]
    assert c.offsets.tolist() == [0, 2, 6, 7, 8, 9, 10]
    # with many equal lengths the fill step decides which item goes where (golden from plan_rows before)
    ties = [3, 3, 3, 2, 2, 5, 5, 5, 5, 1]
    assert pack_lengths(ties, 8, algorithm="first_fit_shuffle", seed=1).tolist() == [
        2, 1, 2, 2, 0, 3, 1, 0, 4, 0,
    ]  # fmt: skip
    # (pack_lengths gave [1, 2, 2, 0, 2, 0, 1, 3, 4, 0] before: Megatron's lengths, other items)


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
    with pytest.raises(ValueError, match="capacity 1073741824 is above the supported"):
        pack_lengths([1], 2**30)
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
