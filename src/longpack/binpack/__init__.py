"""Bin packing on length arrays (numpy + numba; no I/O, no torch).

``pack_lengths(lengths, capacity, *, algorithm, seed) -> bin_of_item`` (np.int64, dense bin ids) and
``packing_stats``. ``longpack.binpack.megatron`` holds the Megatron-Bridge compatible list/array API.

>>> from longpack.binpack import pack_lengths, packing_stats
>>> bins = pack_lengths([700, 300, 500, 500, 1000], 1000, seed=0)
>>> packing_stats([700, 300, 500, 500, 1000], bins, 1000).num_bins
3
"""

from __future__ import annotations

from longpack.binpack._pack import ALGORITHMS, BALANCED, PackingStats, pack_lengths, packing_stats

__all__ = ["ALGORITHMS", "BALANCED", "PackingStats", "pack_lengths", "packing_stats"]
