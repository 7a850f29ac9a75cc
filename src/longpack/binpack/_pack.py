"""``pack_lengths`` and ``packing_stats``: the public entry points of ``longpack.binpack``."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack.binpack import _kernels

#: Names accepted by ``pack_lengths(..., algorithm=...)``. The first three reproduce Megatron-Bridge's
#: bins exactly (compatibility mode); ``best_fit_decreasing`` packs tightest and is the default.
ALGORITHMS: tuple[str, ...] = (
    "best_fit_decreasing",
    "first_fit",
    "first_fit_decreasing",
    "first_fit_shuffle",
)
#: Workload-balanced packing; needs ``balance=`` (see ``pack_lengths``).
BALANCED = "balanced"
MEGATRON_ALGORITHMS: tuple[str, ...] = ("first_fit", "first_fit_decreasing", "first_fit_shuffle")


def _check_capacity(capacity: Any) -> int:
    try:
        cap = operator.index(capacity)
    except TypeError:
        raise TypeError(f"capacity must be an integer, got {capacity!r}") from None
    if cap < 1:
        raise ValueError(f"capacity must be >= 1, got {cap}")
    return cap


#: Largest capacity ``pack_lengths`` accepts: its working arrays are indexed by token count (8 B per
#: possible length), so 2**25 tokens already costs about 0.5 GB on top of the items.
MAX_CAPACITY = 2**25


def _check_seed(seed: Any) -> int:
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(f"seed must be an integer in 0..2**32-1, got {seed!r}") from None
    if not 0 <= value < 2**32:
        raise ValueError(f"seed must be in 0..2**32-1, got {value}")
    return value


def validate_lengths(lengths: Any, capacity: int) -> np.ndarray:
    """Return ``lengths`` as a 1-D int32/int64 array, or raise ``ValueError`` naming the bad items.

    >>> validate_lengths([3, 9, 0], 8)
    Traceback (most recent call last):
    ...
    ValueError: 2 of 3 lengths are outside 1..8 (capacity 8); first at index 1: 9. Truncate, split or drop those items before packing.
    """
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D sequence of integers, got an array of shape {arr.shape}")
    if arr.dtype.kind == "f":
        whole = np.isfinite(arr) & (arr == np.floor(arr))
        if not whole.all():
            not_whole = np.flatnonzero(~whole)
            raise ValueError(
                f"{len(not_whole)} of {len(arr)} lengths are not whole numbers; first at index {not_whole[0]}: "
                f"{arr[not_whole[0]]!r}. Pass integer token counts."
            )
        arr = arr.astype(np.int64)
    elif arr.dtype.kind not in "iu":
        if arr.size == 0:
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    if arr.dtype != np.int64 and arr.dtype != np.int32:
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise ValueError("lengths do not fit in int64")
        arr = arr.astype(np.int64)
    arr = np.ascontiguousarray(arr)
    bad, first = _kernels.count_invalid(arr, 1, capacity)
    if bad:
        raise ValueError(
            f"{bad} of {len(arr)} lengths are outside 1..{capacity} (capacity {capacity}); first at index "
            f"{first}: {int(arr[first])}. Truncate, split or drop those items before packing."
        )
    return arr


def pack_lengths(
    lengths: Any,
    capacity: int,
    *,
    algorithm: str = "best_fit_decreasing",
    seed: int = 0,
    balance: Any = None,
) -> np.ndarray:
    """Assign each item a bin so that no bin's total length exceeds ``capacity``.

    Returns ``bin_of_item`` (np.int64, one bin id per item, ids 0..B-1 with no gaps). Same inputs and
    seed give the same output on every run and machine.

    * ``best_fit_decreasing`` (default): longest item first, into the open bin with the least room that
      still fits it. Bin ids are then permuted with ``np.random.RandomState(seed)`` so that bin order does
      not follow fullness or length.
    * ``first_fit``, ``first_fit_decreasing``, ``first_fit_shuffle``: Megatron-Bridge compatibility.
      Bin ``k`` holds exactly the lengths of Megatron's ``create_packing_strategy(histogram, capacity,
      algorithm)[0][k]`` with the global RNG seeded by ``seed`` (so ``first_fit`` works on the
      ascending-sorted lengths, as Megatron's histogram expansion does). Bin ids are not permuted. Among
      items of equal length, the item with the lower index takes the earlier place in bin order.

    * ``balanced``: workload-balanced packing (``longpack.balance.balanced_pack``) for the topology and
      cost model in ``balance`` (a ``longpack.balance.BalanceTarget``): best-fit-level fill, and **bin ids
      are the training order**, arranged so every DP rank of every step gets a near-equal share of work.
      It is not in ``ALGORITHMS``, which lists the algorithms that need nothing but the lengths.

    Lengths must be integers in 1..capacity; anything else raises ``ValueError`` naming how many items
    are invalid and the first one (truncate, split or drop them first).

    >>> pack_lengths([3, 5, 2, 6], 8, algorithm="first_fit_decreasing").tolist()
    [1, 1, 0, 0]
    >>> bins = pack_lengths([3, 5, 2, 6], 8)
    >>> sorted(np.bincount(bins, weights=[3, 5, 2, 6]).tolist())
    [8.0, 8.0]
    """
    cap = _check_capacity(capacity)
    if cap > MAX_CAPACITY:
        raise ValueError(
            f"capacity {cap} is above the supported {MAX_CAPACITY} tokens: working memory grows with the "
            f"capacity (8 B per possible length); pack in smaller units (e.g. divide lengths and capacity by "
            f"a common alignment such as pad_seq_to_mult)"
        )
    seed = _check_seed(seed)
    if algorithm == BALANCED:
        if balance is None:
            raise ValueError(
                'algorithm="balanced" needs balance=longpack.balance.BalanceTarget(...) '
                "(the DP/PP/GBS topology and the pack cost model to balance for)"
            )
        # Imported here: balance builds on this module (best-fit packs are its starting point).
        from longpack.balance import balanced_pack

        return balanced_pack(
            validate_lengths(lengths, cap),
            cap,
            cost_model=balance.cost_model,
            dp=balance.dp,
            gbs=balance.gbs,
            micro_batch_size=balance.micro_batch_size,
            sampler=balance.sampler,
            pp=balance.pp,
            schedule=balance.schedule,
            vpp=balance.vpp,
            seed=seed,
        )
    if balance is not None:
        raise ValueError(f"balance= is only used with algorithm='balanced', not {algorithm!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown packing algorithm {algorithm!r}; choose one of {', '.join((*ALGORITHMS, BALANCED))}"
        )
    arr = validate_lengths(lengths, cap)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if algorithm in MEGATRON_ALGORITHMS:
        from longpack.binpack import megatron

        histogram = np.bincount(arr, minlength=cap + 1)
        flat, offsets = megatron._strategy_flat(histogram, cap, algorithm, np.random.RandomState(seed))
        return _kernels.assign_items_by_length(arr, flat, offsets, cap)
    bin_of, nbins = _kernels.best_fit_decreasing_bins(arr, cap)
    new_id = np.random.RandomState(seed).permutation(nbins).astype(np.int64, copy=False)
    _kernels.relabel_in_place(bin_of, new_id)
    return bin_of


@dataclass(frozen=True, kw_only=True)
class PackingStats:
    """Summary of one packing (see ``packing_stats``). Fills are in tokens."""

    num_items: int
    total_length: int
    capacity: int
    num_bins: int
    lower_bound: int  # L1 = ceil(total_length / capacity), the fewest bins any packing can use
    bins_over_lower_bound: float  # num_bins / lower_bound (1.0 when both are 0)
    efficiency: float  # total_length / (num_bins * capacity) (1.0 when there are no bins)
    max_items_per_bin: int
    mean_items_per_bin: float
    min_bin_fill: int
    max_bin_fill: int


def packing_stats(lengths: Any, bin_of_item: Any, capacity: int) -> PackingStats:
    """Bin count, L1 lower bound, bins/L1, efficiency, items per bin and bin fills of a packing.

    ``bin_of_item`` must use dense ids 0..B-1. Over-full bins are not an error here: they show as
    ``max_bin_fill > capacity``.

    >>> s = packing_stats([3, 5, 2, 7], [1, 1, 0, 0], 8)
    >>> (s.num_bins, s.lower_bound, s.efficiency, s.min_bin_fill, s.max_bin_fill, s.max_items_per_bin)
    (2, 3, 1.0625, 8, 9, 2)
    """
    cap = _check_capacity(capacity)
    arr = np.asarray(lengths, dtype=np.int64)
    bins = np.asarray(bin_of_item, dtype=np.int64)
    if arr.ndim != 1 or bins.shape != arr.shape:
        raise ValueError(
            f"lengths and bin_of_item must be 1-D of the same size, got shapes {arr.shape} and {bins.shape}"
        )
    n = int(arr.size)
    total = int(arr.sum())
    lower = -(-total // cap)
    if n == 0:
        return PackingStats(
            num_items=0,
            total_length=0,
            capacity=cap,
            num_bins=0,
            lower_bound=0,
            bins_over_lower_bound=1.0,
            efficiency=1.0,
            max_items_per_bin=0,
            mean_items_per_bin=0.0,
            min_bin_fill=0,
            max_bin_fill=0,
        )
    if int(bins.min()) < 0:
        raise ValueError(f"bin_of_item has a negative id at index {int(np.argmin(bins))}")
    nbins = int(bins.max()) + 1
    items = np.bincount(bins, minlength=nbins)
    empty = np.flatnonzero(items == 0)
    if len(empty):
        raise ValueError(f"bin ids are not dense: bin {int(empty[0])} of 0..{nbins - 1} holds no item")
    fill = np.bincount(bins, weights=arr, minlength=nbins).astype(np.int64)
    return PackingStats(
        num_items=n,
        total_length=total,
        capacity=cap,
        num_bins=nbins,
        lower_bound=lower,
        bins_over_lower_bound=nbins / lower if lower else 1.0,
        efficiency=total / (nbins * cap),
        max_items_per_bin=int(items.max()),
        mean_items_per_bin=n / nbins,
        min_bin_fill=int(fill.min()),
        max_bin_fill=int(fill.max()),
    )
