"""Bin packing on length arrays (numpy + numba; no I/O, no torch). Knows lengths only.

``pack_lengths(lengths, capacity, *, algorithm, seed) -> bin_of_item`` (np.int64, dense bin ids),
``pack_bins`` (the same bins with the order of the items inside each: packed rows) and ``packing_stats``.
``longpack.binpack.megatron`` holds the Megatron-Bridge compatible list/array API.

>>> from longpack.binpack import pack_lengths, packing_stats
>>> bins = pack_lengths([700, 300, 500, 500, 1000], 1000, seed=0)
>>> packing_stats([700, 300, 500, 500, 1000], bins, 1000).num_bins
3
"""

from __future__ import annotations

from longpack.binpack._pack import (
    ALGORITHMS,
    MAX_CAPACITY,
    BinContents,
    PackingStats,
    check_capacity,
    check_seed,
    pack_bins,
    pack_lengths,
    packing_stats,
    validate_lengths,
)

__all__ = [
    "ALGORITHMS",
    "MAX_CAPACITY",
    "BinContents",
    "PackingStats",
    "check_capacity",
    "check_seed",
    "pack_bins",
    "pack_lengths",
    "packing_stats",
    "validate_lengths",
]
