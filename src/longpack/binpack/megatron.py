"""Megatron-Bridge compatible bin packing (Megatron-Bridge ``data/packing/algorithms.py``).

Same bins, bin order and in-bin order as Megatron-Bridge's ``first_fit``, ``first_fit_decreasing``,
``first_fit_shuffle`` and ``create_packing_strategy``, computed by compiled code in O(N log N):

* first fit: each item goes to the lowest-index open bin whose remaining capacity is >= its length, else
  to a new bin. A zero-length item fits any bin that is not over-full. An item longer than ``pack_size``
  opens a bin of its own whose remaining capacity is negative, so no later item goes there.
* first fit decreasing: stable sort by length, descending, then first fit.
* first fit shuffle: ``rng.shuffle`` of a copy (Megatron: ``np.random.shuffle``, the global RNG that
  ``prepare_gpt_sft_packed_data`` seeds with the dataset seed), then first fit. Shuffling an ndarray and
  shuffling a Python list draw the same numbers from a legacy ``RandomState``, so the permutation matches.

The RNG is consumed exactly as Megatron consumes the global RNG (one ``shuffle`` of N items, nothing for
the other algorithms), so ``fill_order`` can continue with ``rng.permutation(count)`` per length for
the fill step (Megatron-Bridge's ``fill_packing_strategy``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from longpack import choices
from longpack.binpack._dispatch import kernels

__all__ = [
    "PACKING_ALGORITHMS",
    "create_packing_strategy",
    "create_packing_strategy_arrays",
    "fill_order",
    "first_fit",
    "first_fit_decreasing",
    "first_fit_shuffle",
    "first_fit_shuffle_rows",
]

#: Algorithms ``create_packing_strategy`` accepts (Megatron looks them up by name in its module).
PACKING_ALGORITHMS = choices.MEGATRON_ALGORITHMS

T = TypeVar("T")


def _pack_size(pack_size: Any) -> int:
    try:
        return operator.index(pack_size)
    except TypeError:
        raise TypeError(f"pack_size must be an integer, got {pack_size!r}") from None


def _as_lengths(seqlens: Any, what: str = "seqlens") -> np.ndarray:
    arr = np.asarray(seqlens)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(
            f"{what} must be a 1-D sequence of integers, got dtype {arr.dtype} shape {arr.shape}"
        )
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    bad, first = kernels().count_invalid(arr, 0, np.iinfo(np.int64).max)
    if bad:
        raise ValueError(
            f"{what} must be >= 0; {bad} are negative, first at index {first}: {int(arr[first])}"
        )
    return arr


def _resolve_rng(rng: np.random.RandomState | None) -> np.random.RandomState | Any:
    if rng is None:
        return np.random  # the global legacy RNG, as Megatron uses it
    if not isinstance(rng, np.random.RandomState):
        raise TypeError(
            f"rng must be a numpy.random.RandomState (Megatron draws from the legacy RNG), got {type(rng).__name__}"
        )
    return rng


def _first_fit_arrays(ordered: np.ndarray, pack_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # An int32 tree (one cache line per node) whenever every remaining capacity fits in it.
    longest = int(ordered.max()) if ordered.size else 0
    small = pack_size - longest > -(2**31) and pack_size < 2**31 - 1
    unopened = np.iinfo(np.int32).min if small else np.iinfo(np.int64).min
    dtype = np.int32 if small else np.int64
    bin_of, nbins = kernels().first_fit_bins(ordered, pack_size, dtype(unopened))
    return kernels().group_by_bin(ordered, bin_of, nbins)


def _split(values: list[T], offsets: np.ndarray) -> list[list[T]]:
    bounds = offsets.tolist()
    return [values[bounds[b] : bounds[b + 1]] for b in range(len(bounds) - 1)]


def _with_items(
    ordered_items: Sequence[T], flat_lengths: np.ndarray, offsets: np.ndarray, position: np.ndarray
) -> list[list[T]]:
    """Lists of items (not lengths) in bin order, given the flat position of each ordered item."""
    slot_item = np.empty(len(position), dtype=np.int64)
    slot_item[position] = np.arange(len(position), dtype=np.int64)
    items = [ordered_items[k] for k in slot_item.tolist()]
    return _split(items, offsets)


def _item_lengths(items: Sequence[Any], item_lengths: Any) -> np.ndarray:
    lengths = _as_lengths(item_lengths, "item_lengths")
    if len(lengths) != len(items):
        raise ValueError(
            f"item_lengths must have the same number of entries as the items: got {len(lengths)} lengths "
            f"for {len(items)} items"
        )
    return lengths


def first_fit(seqlens: Sequence[Any], pack_size: int, *, item_lengths: Any = None) -> list[list[Any]]:
    """First fit in the given order, exactly as Megatron-Bridge's ``first_fit``.

    With ``item_lengths``, ``seqlens`` holds arbitrary items packed by those lengths.

    >>> first_fit([500, 600, 500, 400, 700], 1200)
    [[500, 600], [500, 400], [700]]
    >>> first_fit(["a", "b", "c", "d"], 10, item_lengths=[5, 3, 2, 7])
    [['a', 'b', 'c'], ['d']]
    """
    size = _pack_size(pack_size)
    if item_lengths is not None:
        lengths = _item_lengths(seqlens, item_lengths)
        flat, offsets, position = _first_fit_arrays(lengths, size)
        return _with_items(seqlens, flat, offsets, position)
    lengths = _as_lengths(seqlens)
    flat, offsets, _ = _first_fit_arrays(lengths, size)
    return _split(flat.tolist(), offsets)


def first_fit_decreasing(
    seqlens: Sequence[Any], pack_size: int, *, item_lengths: Any = None
) -> list[list[Any]]:
    """Stable sort by length, descending, then first fit (Megatron-Bridge's ``first_fit_decreasing``).

    >>> first_fit_decreasing([1111, 8192, 4096, 1000], 2048)
    [[8192], [4096], [1111], [1000]]
    >>> first_fit_decreasing(list("abcde"), 10, item_lengths=[5, 3, 2, 7, 4])
    [['d', 'b'], ['a', 'e'], ['c']]
    """
    size = _pack_size(pack_size)
    if item_lengths is not None:
        lengths = _item_lengths(seqlens, item_lengths)
        order = np.argsort(-lengths, kind="stable")
        flat, offsets, position = _first_fit_arrays(lengths[order], size)
        ordered_items = [seqlens[k] for k in order.tolist()]
        return _with_items(ordered_items, flat, offsets, position)
    lengths = _as_lengths(seqlens)
    flat, offsets, _ = _first_fit_arrays(np.sort(lengths)[::-1].copy(), size)
    return _split(flat.tolist(), offsets)


def first_fit_shuffle(
    seqlens: Sequence[int], pack_size: int, *, rng: np.random.RandomState | None = None
) -> list[list[int]]:
    """Shuffle a copy with ``rng`` (None: the global ``np.random``, as Megatron), then first fit.

    >>> first_fit_shuffle([1, 2, 3, 4, 5], 6, rng=np.random.RandomState(0))
    [[3, 1, 2], [4], [5]]
    """
    size = _pack_size(pack_size)
    lengths = _as_lengths(seqlens).copy()
    _resolve_rng(rng).shuffle(lengths)
    flat, offsets, _ = _first_fit_arrays(lengths, size)
    return _split(flat.tolist(), offsets)


def _expand_histogram(histogram: Any) -> np.ndarray:
    counts = np.asarray(histogram)
    if counts.ndim != 1 or (counts.size and counts.dtype.kind not in "iu"):
        raise ValueError(f"histogram must be a 1-D sequence of integer counts, got dtype {counts.dtype}")
    counts = counts.astype(np.int64, copy=False)
    if counts.size and int(counts.min()) < 0:
        bad = int(np.flatnonzero(counts < 0)[0])
        raise ValueError(f"histogram counts must be >= 0; histogram[{bad}] = {int(counts[bad])}")
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def _metadata(flat: np.ndarray, offsets: np.ndarray, pack_size: int) -> dict[str, Any]:
    nbins = len(offsets) - 1
    if nbins == 0:
        raise ValueError(
            "histogram holds no items: there is nothing to pack (Megatron's max() fails here too)"
        )
    per_bin = np.diff(offsets)
    bin_sums = np.add.reduceat(flat, offsets[:-1])
    num_items = len(flat)
    total = int(flat.sum())
    return {
        "dataset_max_seqlen": int(flat.max()),
        "max_samples_per_bin": int(per_bin.max()),
        "packing_factor": round(num_items / nbins, 2),
        "packing_efficiency": round(total / nbins / pack_size * 100, 2),
        "pack_size": pack_size,
        "min_packed_seqlen": int(bin_sums.min()),
    }


def create_packing_strategy_arrays(
    histogram: Any,
    pack_size: int,
    packing_algorithm: str,
    *,
    rng: np.random.RandomState | None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """``create_packing_strategy`` as flat arrays: ``(lengths_in_bin_order, bin_offsets, metadata)``.

    Bin ``b`` holds ``lengths_in_bin_order[bin_offsets[b]:bin_offsets[b + 1]]`` (both int64; offsets has
    B+1 entries). Megatron expands the histogram ascending (``[0]*h[0] + [1]*h[1] + ...``) before the
    algorithm runs; so does this. ``rng`` (None: the global ``np.random``) is used only by
    ``first_fit_shuffle``, for one shuffle, exactly as Megatron uses the global RNG.

    >>> flat, offsets, meta = create_packing_strategy_arrays([0, 0, 2, 1, 1], 6, "first_fit_decreasing", rng=None)
    >>> flat.tolist(), offsets.tolist()
    ([4, 2, 3, 2], [0, 2, 4])
    >>> meta
    {'dataset_max_seqlen': 4, 'max_samples_per_bin': 2, 'packing_factor': 2.0, 'packing_efficiency': 91.67, 'pack_size': 6, 'min_packed_seqlen': 5}
    """
    size = _pack_size(pack_size)
    flat, offsets = _strategy_flat(histogram, size, packing_algorithm, rng)
    return flat, offsets, _metadata(flat, offsets, size)


def _strategy_flat(
    histogram: Any, pack_size: int, packing_algorithm: str, rng: np.random.RandomState | None
) -> tuple[np.ndarray, np.ndarray]:
    """``create_packing_strategy_arrays`` without the metadata (used by ``pack_lengths``)."""
    if packing_algorithm not in PACKING_ALGORITHMS:
        raise ValueError(
            f"unknown packing_algorithm {packing_algorithm!r}; choose one of {', '.join(PACKING_ALGORITHMS)}"
        )
    lengths = _expand_histogram(histogram)
    if packing_algorithm == choices.FIRST_FIT_DECREASING:
        lengths = lengths[::-1].copy()  # ascending expansion reversed == stable descending sort
    elif packing_algorithm == choices.FIRST_FIT_SHUFFLE:
        _resolve_rng(rng).shuffle(lengths)
    flat, offsets, _ = _first_fit_arrays(lengths, pack_size)
    return flat, offsets


def create_packing_strategy(
    histogram: Any,
    pack_size: int,
    packing_algorithm: str = choices.FIRST_FIT_SHUFFLE,
    *,
    rng: np.random.RandomState | None = None,
) -> tuple[list[list[int]], dict[str, Any]]:
    """Megatron-Bridge's ``create_packing_strategy``: bins of lengths plus the pack metadata dict.

    ``histogram[L]`` is the number of items of runtime length ``L``. Metadata keys and rounding are
    Megatron-Bridge's: ``dataset_max_seqlen``, ``max_samples_per_bin``, ``packing_factor`` (2 decimals),
    ``packing_efficiency`` (percent, 2 decimals), ``pack_size``, ``min_packed_seqlen``.

    >>> create_packing_strategy([0, 0, 2, 1, 1], 6, "first_fit_decreasing")[0]
    [[4, 2], [3, 2]]
    """
    flat, offsets, meta = create_packing_strategy_arrays(histogram, pack_size, packing_algorithm, rng=rng)
    return _split(flat.tolist(), offsets), meta


def fill_order(lengths: Any, lengths_in_bin_order: Any, rng: np.random.RandomState) -> np.ndarray:
    """Which item fills each slot of a packing of lengths, as Megatron-Bridge's ``fill_packing_strategy``.

    ``lengths[i]`` is item ``i``'s length; ``lengths_in_bin_order`` the packing's lengths, bin after bin
    (``create_packing_strategy_arrays(...)[0]``), a rearrangement of ``lengths``. Megatron keeps each
    length's items in input order, draws ``rng.permutation(count)`` for every length present in
    ascending length order (continuing the RNG that shuffled, for ``first_fit_shuffle``), and each bin,
    in bin order, pops the items of a length from the end of that length's permuted list. Returns the
    item index of every slot (np.int64, a permutation of ``0..N-1``).

    >>> fill_order([2, 3, 2], [3, 2, 2], np.random.RandomState(0)).tolist()
    [1, 0, 2]
    """
    arr = _as_lengths(lengths, "lengths")
    slots = _as_lengths(lengths_in_bin_order, "lengths_in_bin_order")
    if len(slots) != len(arr):
        raise ValueError(
            f"lengths_in_bin_order must hold as many entries as lengths: got {len(slots)} for {len(arr)}"
        )
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    histogram = np.bincount(arr)
    if not np.array_equal(np.bincount(slots, minlength=len(histogram)), histogram):
        raise ValueError("lengths_in_bin_order is not a rearrangement of lengths")
    generator = _resolve_rng(rng)
    starts = np.zeros(len(histogram) + 1, dtype=np.int64)
    np.cumsum(histogram, out=starts[1:])
    perms = np.empty(len(arr), dtype=np.int64)
    for length in np.flatnonzero(histogram).tolist():  # ascending length order, as Megatron draws
        perms[starts[length] : starts[length + 1]] = generator.permutation(int(histogram[length]))
    return kernels().fill_items_by_length(arr, slots, perms, starts)


def first_fit_shuffle_rows(lengths: Any, pack_size: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron-Bridge's packed rows for ``first_fit_shuffle``: ``(items, offsets)``, row ``j`` holding items
    ``items[offsets[j]:offsets[j+1]]`` in its order.

    One ``RandomState(seed)`` plays Bridge's seeded global RNG: the histogram expansion is shuffled and
    packed by first fit, then each length's items are permuted for the fill step (``fill_order``). Unlike
    ``longpack.binpack.pack_bins``, zero-length items are accepted, as Bridge keeps a one-token sample (runtime
    length 0): first fit puts it into the lowest-index open bin.

    >>> items, offsets = first_fit_shuffle_rows([3, 0, 5, 2], 6, seed=1234)
    >>> [items[offsets[j]:offsets[j + 1]].tolist() for j in range(len(offsets) - 1)]
    [[1, 3, 0], [2]]
    """
    arr = _as_lengths(lengths, "lengths")
    size = _pack_size(pack_size)
    if arr.size == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    if int(arr.max()) > size:
        raise ValueError(f"lengths must be <= pack_size {size}; got {int(arr.max())}")
    rng = np.random.RandomState(seed)
    histogram = np.bincount(arr, minlength=size + 1)
    flat, offsets = _strategy_flat(histogram, size, choices.FIRST_FIT_SHUFFLE, rng)
    return fill_order(arr, flat, rng), offsets.astype(np.int64)
