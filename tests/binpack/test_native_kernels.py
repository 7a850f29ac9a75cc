"""The C kernels (``longpack.binpack._native``, ``longpack.packed._native``) against the numba kernels they
port, on random inputs: the same results, bit for bit, for every kernel and dtype.

The extensions are built by ``pip install`` / ``pip install -e .``: a missing one fails these tests (the
README's install builds them); they are skipped only under ``LONGPACK_KERNELS=numba``.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.binpack import _kernels as numba_kernels
from longpack.packed import _kernels_numba as numba_fill


def _native(name: str):  # type: ignore[no-untyped-def]
    if os.environ.get("LONGPACK_KERNELS") != "numba":
        return importlib.import_module(name)
    return pytest.importorskip(name, reason="LONGPACK_KERNELS=numba")


native = _native("longpack.binpack._native")
native_fill = _native("longpack.packed._native")

lengths_st = st.lists(st.integers(1, 64), min_size=0, max_size=300)


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert int(a) == int(b)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@given(values=lengths_st, cap=st.integers(1, 80))
@settings(max_examples=60, deadline=None)
def test_best_fit_decreasing_matches_numba(dtype, values, cap) -> None:  # type: ignore[no-untyped-def]
    arr = np.minimum(np.array(values, dtype=dtype), cap).astype(dtype)
    _same(native.best_fit_decreasing_bins(arr, cap), numba_kernels.best_fit_decreasing_bins(arr, cap))
    _same(native.count_invalid(arr, 2, cap - 1), numba_kernels.count_invalid(arr, 2, cap - 1))


@pytest.mark.parametrize("tree", [np.int32, np.int64])
@given(values=st.lists(st.integers(0, 120), max_size=400), pack=st.integers(1, 100))
@settings(max_examples=60, deadline=None)
def test_first_fit_and_grouping_match_numba(tree, values, pack) -> None:  # type: ignore[no-untyped-def]
    # lengths above pack_size and zero lengths included: both kernels follow Megatron's linear scan there
    arr = np.array(values, dtype=np.int64)
    unopened = tree(np.iinfo(tree).min)
    got = native.first_fit_bins(arr, pack, unopened)
    _same(got, numba_kernels.first_fit_bins(arr, pack, unopened))
    bin_of, nbins = got
    grouped = native.group_by_bin(arr, bin_of, nbins)
    _same(grouped, numba_kernels.group_by_bin(arr, bin_of, nbins))
    flat, offsets, _ = grouped
    top = int(arr.max()) if arr.size else 0
    _same(
        native.assign_items_by_length(arr, flat, offsets, top),
        numba_kernels.assign_items_by_length(arr, flat, offsets, top),
    )
    if arr.size:
        histogram = np.bincount(arr)
        starts = np.zeros(len(histogram) + 1, np.int64)
        np.cumsum(histogram, out=starts[1:])
        rng = np.random.RandomState(len(values))
        perms = np.concatenate([rng.permutation(int(c)) for c in histogram]).astype(np.int64)
        _same(
            native.fill_items_by_length(arr, flat, perms, starts),
            numba_kernels.fill_items_by_length(arr, flat, perms, starts),
        )


@given(values=lengths_st, seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_relabel_and_lowest_cost_fit_match_numba(values, seed) -> None:  # type: ignore[no-untyped-def]
    arr = np.array(values, dtype=np.int64)
    rng = np.random.default_rng(seed)
    nb = max(1, len(arr) // 3)
    bins = rng.integers(0, nb, len(arr)).astype(np.int64)
    new_id = rng.permutation(nb).astype(np.int64)
    a, b = bins.copy(), bins.copy()
    native.relabel_in_place(a, new_id)
    numba_kernels.relabel_in_place(b, new_id)
    _same(a, b)
    order = np.argsort(-arr, kind="stable").astype(np.int64)
    cost = rng.random(len(arr)) * arr
    got = native.lowest_cost_fit(order, arr, cost, 64, 2)
    want = numba_kernels.lowest_cost_fit(order, arr, cost, 64, 2)
    assert got[1] == want[1]
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("tokens_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_row_fill_matches_numba(tokens_dtype, ids_dtype, data) -> None:  # type: ignore[no-untyped-def]
    kept = np.array(data.draw(st.lists(st.integers(0, 9), max_size=30)), dtype=np.int64)
    pad = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(kept), max_size=len(kept))), np.int64)
    stored = kept + pad
    src = np.zeros(len(kept), np.int64)
    np.cumsum(kept[:-1], out=src[1:]) if len(kept) > 1 else None
    rng = np.random.default_rng(len(kept))
    tokens = rng.integers(0, 1000, int(kept.sum())).astype(tokens_dtype)
    mask = rng.integers(0, 2, len(tokens)).astype(np.uint8)
    total = int(stored.sum())
    outs = [(np.full(total, -7, ids_dtype), np.full(total, 9, np.int8)) for _ in range(2)]
    native_fill.fill_tokens_and_mask(tokens, mask, src, kept, stored, 2, *outs[0])
    numba_fill.fill_tokens_and_mask(tokens, mask, src, kept, stored, 2, *outs[1])
    _same(outs[0][0], outs[1][0])
    _same(outs[0][1], outs[1][1])


def test_native_kernels_refuse_bad_input_instead_of_writing_out_of_bounds() -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.8"):
        native.best_fit_decreasing_bins(np.array([3, 9]), 8)
    with pytest.raises(ValueError, match="outside new_id"):
        native.relabel_in_place(np.array([0, 5]), np.array([1, 0]))
    with pytest.raises(TypeError, match="int32 or int64"):
        native.count_invalid(np.array([1.0, 2.0]), 0, 3)
    ids, m = np.empty(2, np.int64), np.empty(2, np.int8)
    with pytest.raises(ValueError, match="outside the token buffer"):
        native_fill.fill_tokens_and_mask(
            np.array([1], np.int32),
            np.array([1], np.uint8),
            np.array([0]),
            np.array([2]),
            np.array([2]),
            0,
            ids,
            m,
        )
