"""Megatron-Bridge compatible packing: the golden behaviours of Megatron-Bridge's ``test_algorithms.py`` and
equality with a plain linear-scan first fit written here (the O(N^2) scan NeMo used)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.binpack import megatron

# ----------------------------------------------------------------------------------------------
# Reference: plain linear scan, Python lists only.
# ----------------------------------------------------------------------------------------------


def scan_first_fit(seqlens: list[int], pack_size: int) -> list[list[int]]:
    bins: list[list[int]] = []
    sums: list[int] = []
    for s in seqlens:
        for i in range(len(bins)):
            if sums[i] + s <= pack_size:
                bins[i].append(s)
                sums[i] += s
                break
        else:
            bins.append([s])
            sums.append(s)
    return bins


def scan_first_fit_decreasing(seqlens: list[int], pack_size: int) -> list[list[int]]:
    return scan_first_fit(sorted(seqlens, reverse=True), pack_size)


def scan_create_packing_strategy(
    histogram: list[int], pack_size: int, algorithm: str, rng: np.random.RandomState
) -> tuple[list[list[int]], dict]:
    seqlens: list[int] = []
    for length, count in enumerate(histogram):
        seqlens.extend([length] * count)
    if algorithm == "first_fit":
        bins = scan_first_fit(seqlens, pack_size)
    elif algorithm == "first_fit_decreasing":
        bins = scan_first_fit_decreasing(seqlens, pack_size)
    else:
        shuffled = seqlens[:]
        rng.shuffle(shuffled)
        bins = scan_first_fit(shuffled, pack_size)
    sums = [sum(b) for b in bins]
    meta = {
        "dataset_max_seqlen": max(seqlens),
        "max_samples_per_bin": max(len(b) for b in bins),
        "packing_factor": round(len(seqlens) / len(sums), 2),
        "packing_efficiency": round(sum(sums) / len(sums) / pack_size * 100, 2),
        "pack_size": pack_size,
        "min_packed_seqlen": min(sums),
    }
    return bins, meta


@pytest.fixture
def global_rng_restored() -> Iterator[None]:
    state = np.random.get_state()
    yield
    np.random.set_state(state)


# ----------------------------------------------------------------------------------------------
# Golden behaviours of Megatron-Bridge's tests/unit_tests/data/packing/test_algorithms.py
# ----------------------------------------------------------------------------------------------


def test_ffd_oversize_items_get_their_own_bins() -> None:
    assert megatron.first_fit_decreasing([1111, 8192, 4096, 1000], 2048) == [[8192], [4096], [1111], [1000]]


@pytest.mark.parametrize("algorithm", ["first_fit_decreasing", "first_fit_shuffle", "first_fit"])
def test_10000_random_lengths_respect_capacity(algorithm: str) -> None:
    seqlens = np.random.RandomState(0).randint(1, 2048, size=10_000).tolist()
    fn = getattr(megatron, algorithm)
    kwargs = {"rng": np.random.RandomState(1)} if algorithm == "first_fit_shuffle" else {}
    bins = fn(seqlens, 2048, **kwargs)
    assert all(sum(b) <= 2048 for b in bins)
    assert sorted(x for b in bins for x in b) == sorted(seqlens)


@pytest.mark.parametrize(
    ("seqlens", "pack_size"),
    [([500, 600, 500, 400, 700], 1200), ([4096, 3000, 5000], 2048)],
)
def test_first_fit_equals_linear_scan_golden(seqlens: list[int], pack_size: int) -> None:
    assert megatron.first_fit(seqlens, pack_size) == scan_first_fit(seqlens, pack_size)


def test_first_fit_small_golden_values() -> None:
    assert megatron.first_fit([500, 600, 500, 400, 700], 1200) == [[500, 600], [500, 400], [700]]
    assert megatron.first_fit([4096, 3000, 5000], 2048) == [[4096], [3000], [5000]]


@pytest.mark.parametrize("seed", range(5))
def test_first_fit_equals_linear_scan_5000_items(seed: int) -> None:
    seqlens = np.random.RandomState(seed).randint(1, 2048, size=5000).tolist()
    assert megatron.first_fit(seqlens, 2048) == scan_first_fit(seqlens, 2048)


def test_first_fit_item_lengths_packs_objects() -> None:
    items = ["a", "b", "c", "d"]
    assert megatron.first_fit(items, 10, item_lengths=[5, 3, 2, 7]) == [["a", "b", "c"], ["d"]]


def test_object_packing_matches_integer_packing() -> None:
    lengths = np.random.RandomState(3).randint(0, 40, size=300).tolist()
    items = [f"item{i}" for i in range(len(lengths))]
    by_len = dict(zip(items, lengths, strict=True))
    for fn in (megatron.first_fit, megatron.first_fit_decreasing):
        object_bins = fn(items, 64, item_lengths=lengths)
        assert [[by_len[x] for x in b] for b in object_bins] == fn(lengths, 64)


def test_item_lengths_mismatch_and_positional_third_argument() -> None:
    with pytest.raises(ValueError, match="same number of entries"):
        megatron.first_fit(["a", "b"], 10, item_lengths=[1, 2, 3])
    with pytest.raises(ValueError, match="same number of entries"):
        megatron.first_fit_decreasing(["a", "b"], 10, item_lengths=[1])
    with pytest.raises(TypeError):
        megatron.first_fit(["a", "b"], 10, [1, 2])  # type: ignore[misc]
    with pytest.raises(TypeError):
        megatron.first_fit_decreasing(["a", "b"], 10, [1, 2])  # type: ignore[misc]


def test_ffd_item_lengths_golden() -> None:
    items = ["a", "b", "c", "d", "e"]
    assert megatron.first_fit_decreasing(items, 10, item_lengths=[5, 3, 2, 7, 4]) == [
        ["d", "b"],
        ["a", "e"],
        ["c"],
    ]


def test_ffd_equal_lengths_keep_input_order() -> None:
    assert megatron.first_fit_decreasing(["i0", "i1", "i2"], 10, item_lengths=[6, 6, 4]) == [
        ["i0", "i2"],
        ["i1"],
    ]


@pytest.mark.parametrize(
    ("seqlens", "pack_size"),
    [
        ([], 100),
        ([0, 0, 0], 100),
        ([0, 30, 0, 100, 0, 70, 0], 100),
        ([150], 100),
        ([150, 200, 101], 100),
        ([50, 50, 50, 50], 100),
        ([150, 0, 0, 100, 0], 100),
    ],
)
def test_ffd_equals_linear_scan_edge_cases(seqlens: list[int], pack_size: int) -> None:
    assert megatron.first_fit_decreasing(seqlens, pack_size) == scan_first_fit_decreasing(seqlens, pack_size)
    assert megatron.first_fit(seqlens, pack_size) == scan_first_fit(seqlens, pack_size)


def test_ffd_edge_case_values() -> None:
    assert megatron.first_fit_decreasing([], 100) == []
    assert megatron.first_fit_decreasing([50, 50, 50, 50], 100) == [[50, 50], [50, 50]]
    assert megatron.first_fit_decreasing([150, 200, 101], 100) == [[200], [150], [101]]
    # zero-length items fit any bin that is not over-full; an over-full bin is never reused
    assert megatron.first_fit([150, 0, 0], 100) == [[150], [0, 0]]


@pytest.mark.parametrize("seed", range(3))
def test_ffd_equals_linear_scan_random_0_to_2248(seed: int) -> None:
    seqlens = np.random.RandomState(seed).randint(0, 2248, size=3000).tolist()
    assert megatron.first_fit_decreasing(seqlens, 2048) == scan_first_fit_decreasing(seqlens, 2048)


# ----------------------------------------------------------------------------------------------
# Properties: equal to the linear scan on random inputs, including zero and over-size items.
# ----------------------------------------------------------------------------------------------

lengths_and_size = st.integers(1, 60).flatmap(
    lambda size: st.tuples(st.lists(st.integers(0, size + 15), max_size=120), st.just(size))
)


@settings(max_examples=150, deadline=None)
@given(lengths_and_size)
def test_first_fit_family_equals_linear_scan(case: tuple[list[int], int]) -> None:
    seqlens, pack_size = case
    assert megatron.first_fit(seqlens, pack_size) == scan_first_fit(seqlens, pack_size)
    assert megatron.first_fit_decreasing(seqlens, pack_size) == scan_first_fit_decreasing(seqlens, pack_size)
    shuffled = list(seqlens)
    np.random.RandomState(7).shuffle(shuffled)
    assert megatron.first_fit_shuffle(seqlens, pack_size, rng=np.random.RandomState(7)) == scan_first_fit(
        shuffled, pack_size
    )


histograms = st.integers(1, 40).flatmap(
    lambda size: st.tuples(
        st.lists(st.integers(0, 6), min_size=1, max_size=size + 1).filter(lambda h: sum(h) > 0),
        st.just(size),
        st.sampled_from(megatron.PACKING_ALGORITHMS),
        st.integers(0, 2**32 - 1),
    )
)


@settings(max_examples=150, deadline=None)
@given(histograms)
def test_create_packing_strategy_equals_reference(case: tuple[list[int], int, str, int]) -> None:
    histogram, pack_size, algorithm, seed = case
    ours_rng, ref_rng = np.random.RandomState(seed), np.random.RandomState(seed)
    bins, meta = megatron.create_packing_strategy(histogram, pack_size, algorithm, rng=ours_rng)
    ref_bins, ref_meta = scan_create_packing_strategy(histogram, pack_size, algorithm, ref_rng)
    assert bins == ref_bins
    assert meta == ref_meta
    assert list(meta) == list(ref_meta)  # same key order in the JSON
    # the RNG was consumed exactly as by the reference: the next draws agree
    assert ours_rng.randint(0, 2**31, size=4).tolist() == ref_rng.randint(0, 2**31, size=4).tolist()

    flat, offsets, meta_arrays = megatron.create_packing_strategy_arrays(
        histogram, pack_size, algorithm, rng=np.random.RandomState(seed)
    )
    assert flat.dtype == np.int64 and offsets.dtype == np.int64
    assert [flat[offsets[b] : offsets[b + 1]].tolist() for b in range(len(offsets) - 1)] == ref_bins
    assert meta_arrays == ref_meta


def test_create_packing_strategy_uses_global_rng_like_megatron(global_rng_restored: None) -> None:
    histogram = [0, 3, 5, 0, 7, 2, 9, 1]
    np.random.seed(1234)
    ours, meta = megatron.create_packing_strategy(histogram, 10)
    after_ours = np.random.random()
    ref, ref_meta = scan_create_packing_strategy(
        histogram, 10, "first_fit_shuffle", np.random.RandomState(1234)
    )
    ref_rng = np.random.RandomState(1234)
    ref_rng.shuffle(list(range(sum(histogram))))
    assert ours == ref and meta == ref_meta
    assert after_ours == ref_rng.random()


def test_metadata_values_golden() -> None:
    _, meta = megatron.create_packing_strategy([0, 0, 2, 1, 1], 6, "first_fit_decreasing")
    assert meta == {
        "dataset_max_seqlen": 4,
        "max_samples_per_bin": 2,
        "packing_factor": 2.0,
        "packing_efficiency": 91.67,
        "pack_size": 6,
        "min_packed_seqlen": 5,
    }
    assert all(type(v) in (int, float) for v in meta.values())


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 1000, 4097])
@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1])
def test_legacy_shuffle_list_and_ndarray_consume_rng_identically(n: int, seed: int) -> None:
    values = np.random.RandomState(99).randint(0, 10_000, size=n)
    as_list = values.tolist()
    as_array = values.astype(np.int64).copy()
    list_rng, array_rng = np.random.RandomState(seed), np.random.RandomState(seed)
    list_rng.shuffle(as_list)
    array_rng.shuffle(as_array)
    assert as_array.tolist() == as_list
    assert list_rng.randint(0, 2**31, size=8).tolist() == array_rng.randint(0, 2**31, size=8).tolist()


def test_first_fit_shuffle_default_rng_is_global(global_rng_restored: None) -> None:
    seqlens = list(range(1, 40))
    np.random.seed(5)
    ours = megatron.first_fit_shuffle(seqlens, 50)
    np.random.seed(5)
    shuffled = seqlens[:]
    np.random.shuffle(shuffled)
    assert ours == scan_first_fit(shuffled, 50)


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown packing_algorithm 'best_fit'"):
        megatron.create_packing_strategy([1, 2], 4, "best_fit")
    with pytest.raises(ValueError, match="histogram holds no items"):
        megatron.create_packing_strategy([0, 0], 4, "first_fit")
    with pytest.raises(ValueError, match=r"histogram\[1\] = -2"):
        megatron.create_packing_strategy([0, -2], 4, "first_fit")
    with pytest.raises(ValueError, match="must be >= 0"):
        megatron.first_fit([3, -1], 4)
    with pytest.raises(TypeError, match="RandomState"):
        megatron.first_fit_shuffle([1, 2], 4, rng=np.random.default_rng(0))  # type: ignore[arg-type]


def test_arrays_are_flat_int64_for_large_input() -> None:
    histogram = np.bincount(np.random.RandomState(0).randint(1, 4097, size=200_000), minlength=4097)
    flat, offsets, meta = megatron.create_packing_strategy_arrays(
        histogram, 4096, "first_fit_shuffle", rng=np.random.RandomState(0)
    )
    assert flat.shape == (200_000,) and offsets[0] == 0 and offsets[-1] == 200_000
    sums = np.add.reduceat(flat, offsets[:-1])
    assert sums.max() <= 4096 and meta["min_packed_seqlen"] == sums.min()
    assert np.array_equal(np.bincount(flat, minlength=4097), histogram)


def test_huge_lengths_use_a_64_bit_tree() -> None:
    big = 2**40
    seqlens = [big // 2, big, 3 * big, big // 2 + 1, 0, big // 4, big // 4]
    assert megatron.first_fit(seqlens, big) == scan_first_fit(seqlens, big)
    small_cap = [2**33, 5, 2**35, 3]
    assert megatron.first_fit(small_cap, 10) == scan_first_fit(small_cap, 10) == [[2**33], [5, 3], [2**35]]
