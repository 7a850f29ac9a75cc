"""Which samples go into which packed row, in which order (pure numpy; bins from ``longpack.binpack``).

A :class:`PackPlan` is two arrays: ``order`` (the kept-sample positions, row after row) and
``row_offsets`` (row ``j`` holds ``order[row_offsets[j]:row_offsets[j+1]]``). Lengths are runtime tokens.

``first_fit_shuffle`` reproduces Megatron-Bridge's rows exactly (spec §2.2-2.6): one
``np.random.RandomState(seed)`` plays the part of Megatron's seeded global RNG; it shuffles the ascending
length list and first-fits it (``longpack.binpack.megatron``), then draws ``permutation(count)`` for every
length in ascending order, and each bin pops the items of a length from the end of that permuted list.
The other algorithms use ``longpack.binpack.pack_lengths``; rows follow bin ids and samples keep input
order inside a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MEGATRON_ALGORITHM = "first_fit_shuffle"
DEFAULT_ALGORITHM = "best_fit_decreasing"


@dataclass(frozen=True, kw_only=True)
class PackPlan:
    """Rows of a packing: ``order`` int64 ``[K]`` and ``row_offsets`` int64 ``[B+1]``."""

    order: np.ndarray
    row_offsets: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1


def plan_rows(
    lengths: np.ndarray,
    pack_size: int,
    *,
    algorithm: str = DEFAULT_ALGORITHM,
    seed: int = 0,
    balance: Any = None,
) -> PackPlan:
    """Pack runtime ``lengths`` (each in ``1..pack_size``) into rows of at most ``pack_size`` tokens.

    >>> p = plan_rows(np.array([3, 5, 2]), 6, algorithm="first_fit_decreasing")
    >>> [p.order[p.row_offsets[j]:p.row_offsets[j + 1]].tolist() for j in range(p.num_rows)]
    [[1], [0, 2]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if pack_size < 1:
        raise ValueError(f"pack_size must be positive, got {pack_size}")
    if len(lengths) == 0:
        return PackPlan(order=np.zeros(0, np.int64), row_offsets=np.zeros(1, np.int64))
    if int(lengths.min()) < 1 or int(lengths.max()) > pack_size:
        raise ValueError(
            f"lengths must lie in 1..{pack_size} (pack size); got {int(lengths.min())}..{int(lengths.max())}"
        )
    if algorithm == MEGATRON_ALGORITHM:
        return _megatron_rows(lengths, pack_size, seed)
    from longpack.binpack import pack_lengths

    # Rows are written in bin-id order; for "balanced" that order is the training order.
    bins = np.asarray(
        pack_lengths(lengths, pack_size, algorithm=algorithm, seed=seed, balance=balance), dtype=np.int64
    )
    order = np.argsort(bins, kind="stable")
    counts = np.bincount(bins)
    counts = counts[counts > 0]  # dense rows even if bin ids skip values
    row_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=row_offsets[1:])
    return PackPlan(order=order.astype(np.int64), row_offsets=row_offsets)


def _megatron_rows(lengths: np.ndarray, pack_size: int, seed: int) -> PackPlan:
    from longpack.binpack.megatron import create_packing_strategy_arrays

    rng = np.random.RandomState(seed)
    histogram = np.bincount(lengths, minlength=pack_size + 1)
    lengths_in_bin_order, bin_offsets, _ = create_packing_strategy_arrays(
        histogram, pack_size, MEGATRON_ALGORITHM, rng=rng
    )
    lengths_in_bin_order = np.asarray(lengths_in_bin_order, dtype=np.int64)
    # Items of each length in input order (Megatron appends them to ``sequences[L]`` in dataset order).
    by_length = np.argsort(lengths, kind="stable")
    starts = np.zeros(len(histogram) + 1, dtype=np.int64)
    np.cumsum(histogram, out=starts[1:])
    popped = np.empty(len(lengths), dtype=np.int64)
    for length in np.flatnonzero(histogram).tolist():
        group = by_length[starts[length] : starts[length + 1]]
        perm = rng.permutation(len(group))
        # Pops from the end: the k-th use of this length takes permuted[-1 - k].
        popped[starts[length] : starts[length + 1]] = group[perm][::-1]
    # The k-th occurrence of length L in bin order gets the k-th popped item of length L.
    occurrence = np.argsort(lengths_in_bin_order, kind="stable")
    order = np.empty(len(lengths), dtype=np.int64)
    order[occurrence] = popped
    return PackPlan(order=order, row_offsets=np.asarray(bin_offsets, dtype=np.int64))


def pack_metadata(lengths: np.ndarray, plan: PackPlan, pack_size: int) -> dict[str, Any]:
    """The per-split metadata dict of spec §2.5, from runtime ``lengths`` and a plan.

    >>> lengths = np.array([4, 3, 2])
    >>> plan = PackPlan(order=np.array([0, 2, 1]), row_offsets=np.array([0, 2, 3]))
    >>> pack_metadata(lengths, plan, 8)  # doctest: +NORMALIZE_WHITESPACE
    {'dataset_max_seqlen': 4, 'max_samples_per_bin': 2, 'packing_factor': 1.5, 'packing_efficiency': 56.25,
     'pack_size': 8, 'min_packed_seqlen': 3}
    """
    if plan.num_rows == 0:
        raise ValueError("cannot compute packing metadata of an empty split (no samples left to pack)")
    lengths = np.asarray(lengths, dtype=np.int64)
    row_sums = np.add.reduceat(lengths[plan.order], plan.row_offsets[:-1])
    per_row = np.diff(plan.row_offsets)
    num_bins = plan.num_rows
    return {
        "dataset_max_seqlen": int(lengths.max()),
        "max_samples_per_bin": int(per_row.max()),
        "packing_factor": round(len(lengths) / num_bins, 2),
        "packing_efficiency": round(int(row_sums.sum()) / num_bins / pack_size * 100, 2),
        "pack_size": int(pack_size),
        "min_packed_seqlen": int(row_sums.min()),
    }
