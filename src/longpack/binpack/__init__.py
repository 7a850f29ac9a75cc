"""Bin packing on length arrays (pure numpy; no I/O, no torch).

``pack_lengths(lengths, capacity, *, algorithm, seed) -> bin_of_item`` (np.int64, dense bin ids).
"""

from __future__ import annotations

import numpy as np

ALGORITHMS = ("first_fit_decreasing",)


def pack_lengths(
    lengths: np.ndarray, capacity: int, *, algorithm: str = "first_fit_decreasing", seed: int = 0
) -> np.ndarray:
    """Assign each item a bin so that no bin's total exceeds ``capacity``.

    >>> pack_lengths(np.array([3, 5, 2]), 6).tolist()
    [1, 0, 1]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    bad = np.flatnonzero((lengths < 1) | (lengths > capacity))
    if len(bad):
        raise ValueError(
            f"{len(bad)} item(s) have lengths outside 1..{capacity}; first at index {bad[0]} "
            f"(length {lengths[bad[0]]}); truncate, split or drop them before packing"
        )
    order = np.argsort(-lengths, kind="stable")
    free: list[int] = []
    out = np.empty(len(lengths), dtype=np.int64)
    for i in order:
        for b, room in enumerate(free):
            if room >= lengths[i]:
                free[b] -= int(lengths[i])
                out[i] = b
                break
        else:
            free.append(capacity - int(lengths[i]))
            out[i] = len(free) - 1
    return out
