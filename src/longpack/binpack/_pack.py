"""``pack_lengths``, ``pack_bins`` and ``packing_stats``: the public entry points of ``longpack.binpack``."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack import choices as _choices
from longpack.errors import ConfigError


def _compiled() -> Any:
    """The compiled kernels (the C extension built with the package, else numba), imported on first use,
    so that ``import longpack.binpack`` (names, constants, checks) stays light and a missing numba is
    reported only when packing starts without the extension."""
    from longpack.binpack._dispatch import kernels

    return kernels()


#: Names accepted by ``pack_lengths(..., algorithm=...)`` (the list lives in ``longpack.choices``).
ALGORITHMS = _choices.ALGORITHMS
MEGATRON_ALGORITHMS = _choices.MEGATRON_ALGORITHMS


def check_capacity(capacity: Any, name: str = "capacity") -> int:
    """``capacity`` as an ``int`` >= 1, or ``TypeError`` / ``ValueError`` naming it.

    >>> check_capacity(8)
    8
    >>> check_capacity(0, "gbs")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: gbs must be >= 1, got 0
    """
    try:
        cap = operator.index(capacity)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {capacity!r}") from None
    if cap < 1:
        raise ConfigError(f"{name} must be >= 1, got {cap}")
    return cap


#: Largest capacity ``pack_lengths`` accepts: its working arrays are indexed by token count (8 B per
#: possible length), so 2**25 tokens already costs about 0.5 GB on top of the items.
MAX_CAPACITY = 2**25


def check_seed(seed: Any) -> int:
    """``seed`` as an ``int`` in ``0..2**32-1`` (what ``np.random.RandomState`` takes), or an error.

    >>> check_seed(7)
    7
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: seed must be in 0..2**32-1, got -1
    """
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(f"seed must be an integer in 0..2**32-1, got {seed!r}") from None
    if not 0 <= value < 2**32:
        raise ConfigError(f"seed must be in 0..2**32-1, got {value}")
    return value


def validate_lengths(lengths: Any, capacity: int) -> np.ndarray:
    """Return ``lengths`` as a 1-D int32/int64 array, or raise ``ValueError`` naming the bad items.

    >>> validate_lengths([3, 9, 0], 8)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: 2 of 3 lengths are outside 1..8 (capacity 8); first at index 1: 9. Truncate, split or drop those items before packing.
    """
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ConfigError(f"lengths must be a 1-D sequence of integers, got an array of shape {arr.shape}")
    if arr.dtype.kind == "f":
        whole = np.isfinite(arr) & (arr == np.floor(arr))
        if not whole.all():
            not_whole = np.flatnonzero(~whole)
            raise ConfigError(
                f"{len(not_whole)} of {len(arr)} lengths are not whole numbers; first at index {not_whole[0]}: "
                f"{arr[not_whole[0]]!r}. Pass integer token counts."
            )
        arr = arr.astype(np.int64)
    elif arr.dtype.kind not in "iu":
        if arr.size == 0:
            arr = arr.astype(np.int64)
        else:
            raise ConfigError(f"lengths must be integers, got dtype {arr.dtype}")
    if arr.dtype != np.int64 and arr.dtype != np.int32:
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise ConfigError("lengths do not fit in int64")
        arr = arr.astype(np.int64)
    arr = np.ascontiguousarray(arr)
    bad, first = _compiled().count_invalid(arr, 1, capacity)
    if bad:
        raise ConfigError(
            f"{bad} of {len(arr)} lengths are outside 1..{capacity} (capacity {capacity}); first at index "
            f"{first}: {int(arr[first])}. Truncate, split or drop those items before packing."
        )
    return arr


def pack_lengths(
    lengths: Any,
    capacity: int,
    *,
    algorithm: str = _choices.DEFAULT_ALGORITHM,
    seed: int = 0,
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
      ascending-sorted lengths, as Megatron's histogram expansion does). Bin ids are not permuted.
    * Which of several items of equal length goes where: for ``first_fit_shuffle``, exactly the item
      Megatron-Bridge's ``fill_packing_strategy`` puts there (its RNG, after the shuffle, draws
      ``permutation(count)`` of each length's items in ascending length order, and each bin pops from
      the end; ``longpack.binpack.megatron.fill_order``), so these bins are Megatron-Bridge's packed rows.
      For ``first_fit`` and ``first_fit_decreasing``, the item with the lower index takes the earlier
      place in bin order.

    Lengths must be integers in 1..capacity; anything else raises ``ValueError`` naming how many items
    are invalid and the first one (truncate, split or drop them first). Workload-balanced packing (bins
    in training order for a DP/PP topology) is ``longpack.balance.balanced_pack``.

    >>> pack_lengths([3, 5, 2, 6], 8, algorithm="first_fit_decreasing").tolist()
    [1, 1, 0, 0]
    >>> bins = pack_lengths([3, 5, 2, 6], 8)
    >>> sorted(np.bincount(bins, weights=[3, 5, 2, 6]).tolist())
    [8.0, 8.0]
    """
    arr, cap, seed = _checked(lengths, capacity, algorithm, seed)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if algorithm == _choices.FIRST_FIT_SHUFFLE:
        return _megatron_fill(arr, cap, seed).bin_of_item()
    if algorithm in MEGATRON_ALGORITHMS:
        from longpack.binpack import megatron

        histogram = np.bincount(arr, minlength=cap + 1)
        flat, offsets = megatron._strategy_flat(histogram, cap, algorithm, np.random.RandomState(seed))
        return _compiled().assign_items_by_length(arr, flat, offsets, cap)
    bin_of, nbins = _compiled().best_fit_decreasing_bins(arr, cap)
    new_id = np.random.RandomState(seed).permutation(nbins).astype(np.int64, copy=False)
    _compiled().relabel_in_place(bin_of, new_id)
    return bin_of


@dataclass(frozen=True, kw_only=True)
class BinContents:
    """The items of every bin, bin after bin: bin ``b`` holds ``items[offsets[b]:offsets[b + 1]]``.

    ``items`` (int64 ``[N]``) is a permutation of the item indices, in bin order and, inside a bin, in
    the order the items are laid out (a packed row's order); ``offsets`` (int64 ``[B+1]``) starts at 0.

    >>> c = BinContents.from_bin_of_item(np.array([1, 0, 1]))
    >>> c.items.tolist(), c.offsets.tolist(), c.bin_of_item().tolist()
    ([1, 0, 2], [0, 1, 3], [1, 0, 1])
    """

    items: np.ndarray
    offsets: np.ndarray

    @property
    def num_bins(self) -> int:
        return len(self.offsets) - 1

    def bin_of_item(self) -> np.ndarray:
        """``bin_of_item`` (np.int64 ``[N]``) of these bins, as ``pack_lengths`` returns it."""
        out = np.empty(len(self.items), dtype=np.int64)
        out[self.items] = np.repeat(np.arange(self.num_bins, dtype=np.int64), np.diff(self.offsets))
        return out

    @classmethod
    def from_bin_of_item(cls, bin_of_item: Any) -> BinContents:
        """Bins in ascending id, items of a bin in ascending index (ids that hold no item are skipped)."""
        bins = np.asarray(bin_of_item, dtype=np.int64)
        items = np.argsort(bins, kind="stable").astype(np.int64, copy=False)
        counts = np.bincount(bins) if bins.size else np.zeros(0, dtype=np.int64)
        counts = counts[counts > 0]
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(items=items, offsets=offsets)


def pack_bins(
    lengths: Any,
    capacity: int,
    *,
    algorithm: str = _choices.DEFAULT_ALGORITHM,
    seed: int = 0,
) -> BinContents:
    """``pack_lengths`` with the order of the items inside each bin: the rows a packer writes.

    Same bins as ``pack_lengths(lengths, capacity, algorithm=algorithm, seed=seed)`` (its
    ``bin_of_item()`` is that array). Inside a bin, ``first_fit_shuffle`` lays items out in
    Megatron-Bridge's order (its first fit's order of lengths, each length's item as its fill step
    picks it): bins, in-bin order and items are Megatron-Bridge's packed rows. The other algorithms keep
    the input order inside a bin.

    >>> c = pack_bins([3, 5, 2], 6, algorithm="first_fit_decreasing")
    >>> [c.items[c.offsets[b] : c.offsets[b + 1]].tolist() for b in range(c.num_bins)]
    [[1], [0, 2]]
    """
    arr, cap, seed = _checked(lengths, capacity, algorithm, seed)
    if arr.size == 0:
        return BinContents(items=np.zeros(0, np.int64), offsets=np.zeros(1, np.int64))
    if algorithm == _choices.FIRST_FIT_SHUFFLE:
        return _megatron_fill(arr, cap, seed)
    return BinContents.from_bin_of_item(pack_lengths(arr, cap, algorithm=algorithm, seed=seed))


def _checked(lengths: Any, capacity: Any, algorithm: str, seed: Any) -> tuple[np.ndarray, int, int]:
    cap = check_capacity(capacity)
    if cap > MAX_CAPACITY:
        raise ConfigError(
            f"capacity {cap} is above the supported {MAX_CAPACITY} tokens: working memory grows with the "
            f"capacity (8 B per possible length); pack in smaller units (e.g. divide lengths and capacity by "
            f"a common alignment such as pad_seq_to_mult)"
        )
    value = check_seed(seed)
    if algorithm not in ALGORITHMS:
        raise ConfigError(
            f"unknown packing algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)} "
            "(workload-balanced packing is longpack.balance.balanced_pack)"
        )
    return validate_lengths(lengths, cap), cap, value


def _megatron_fill(arr: np.ndarray, cap: int, seed: int) -> BinContents:
    """``first_fit_shuffle`` as Megatron-Bridge packs and fills (``megatron.first_fit_shuffle_rows``)."""
    from longpack.binpack import megatron

    items, offsets = megatron.first_fit_shuffle_rows(arr, cap, seed=seed)
    return BinContents(items=items, offsets=offsets)


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
    cap = check_capacity(capacity)
    arr = np.asarray(lengths, dtype=np.int64)
    bins = np.asarray(bin_of_item, dtype=np.int64)
    if arr.ndim != 1 or bins.shape != arr.shape:
        raise ConfigError(
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
        raise ConfigError(f"bin_of_item has a negative id at index {int(np.argmin(bins))}")
    nbins = int(bins.max()) + 1
    items = np.bincount(bins, minlength=nbins)
    empty = np.flatnonzero(items == 0)
    if len(empty):
        raise ConfigError(f"bin ids are not dense: bin {int(empty[0])} of 0..{nbins - 1} holds no item")
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
