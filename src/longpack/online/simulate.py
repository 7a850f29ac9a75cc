"""What an online packer's buffer size costs: fill against offline packing of the same samples (pure numpy).

Workloads (runtime lengths, clipped to ``1..capacity``; seeded, deterministic):

- ``lognormal``: SFT-like chat data, median ``capacity / 16``, sigma 1.0 (a long right tail);
- ``bimodal``: 70 % short turns (lognormal, median ``capacity / 32``, sigma 0.6) and 30 % long documents
  (uniform in ``0.4 .. 0.95 * capacity``), the mix where small buffers hurt most.

>>> synthetic_lengths("lognormal", 5, 4096, seed=0).tolist()
[290, 224, 486, 284, 150]
>>> row = simulate([700, 500, 300, 500, 1000], 1000, [2], algorithm="first_fit_decreasing")[0]
>>> row["buffer_size"], row["online_packs"], row["offline_packs"], row["online_fill"]
(2, 4, 3, 0.75)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from longpack import binpack
from longpack.online.packer import OnlinePacker, aligned_length

WORKLOADS: tuple[str, ...] = ("lognormal", "bimodal")


def synthetic_lengths(workload: str, n: int, capacity: int, *, seed: int) -> np.ndarray:
    """``n`` runtime lengths of a named workload (int64), see the module docstring."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r} is not one of {WORKLOADS}")
    rng = np.random.default_rng(seed)
    if workload == "lognormal":
        raw = rng.lognormal(np.log(capacity / 16), 1.0, n)
    else:
        short = rng.lognormal(np.log(capacity / 32), 0.6, n)
        long = rng.uniform(0.4 * capacity, 0.95 * capacity, n)
        raw = np.where(rng.random(n) < 0.7, short, long)
    return np.clip(np.rint(raw), 1, capacity).astype(np.int64)


def offline_fill(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    *,
    pad_to_multiple_of: int = 1,
    algorithm: str,
    seed: int = 0,
) -> tuple[float, int]:
    """``(fill, packs)`` of packing all samples at once (lengths truncated and aligned as the online packer does).

    >>> offline_fill([6, 4, 5, 5], 10, algorithm="best_fit_decreasing")
    (1.0, 2)
    """
    m = pad_to_multiple_of
    limit = capacity // m * m
    aligned = np.array([aligned_length(min(int(x), limit), m) for x in lengths], dtype=np.int64)
    if len(aligned) == 0:
        return 0.0, 0
    bins = binpack.pack_lengths(aligned, capacity, algorithm=algorithm, seed=seed)
    packs = int(bins.max()) + 1
    return float(aligned.sum()) / (packs * capacity), packs


def simulate(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    buffer_sizes: Iterable[int],
    *,
    pad_to_multiple_of: int = 1,
    algorithm: str = "best_fit_decreasing",
    offline_algorithm: str = "best_fit_decreasing",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per buffer size: online fill and packs, offline fill and packs, fill ratio, packs/s.

    Lengths longer than the capacity are truncated (the online packer's default policy), in both runs.
    """
    values = [int(x) for x in lengths]
    off_fill, off_packs = offline_fill(
        values, capacity, pad_to_multiple_of=pad_to_multiple_of, algorithm=offline_algorithm, seed=seed
    )
    out = []
    for b in buffer_sizes:
        packer = OnlinePacker(
            capacity, int(b), pad_to_multiple_of=pad_to_multiple_of, algorithm=algorithm, seed=seed
        )
        start = time.perf_counter()
        packs = sum(1 for _ in packer.pack(values))
        elapsed = time.perf_counter() - start
        fill = packer.stats.fill(capacity)
        out.append(
            {
                "buffer_size": int(b),
                "online_fill": round(fill, 4),
                "online_packs": packs,
                "offline_fill": round(off_fill, 4),
                "offline_packs": off_packs,
                "fill_ratio": round(fill / off_fill, 4) if off_fill else 0.0,
                "truncated": packer.stats.truncated,
                "packs_per_s": round(packs / elapsed, 1) if elapsed > 0 else float("inf"),
            }
        )
    return out


def smallest_buffer_within(rows: Sequence[dict[str, Any]], tolerance: float = 0.01) -> int | None:
    """Smallest buffer whose fill is within ``tolerance`` (relative) of offline fill, or ``None``.

    >>> smallest_buffer_within([{"buffer_size": 8, "fill_ratio": 0.9}, {"buffer_size": 64, "fill_ratio": 0.995}])
    64
    """
    ok = [r["buffer_size"] for r in rows if r["fill_ratio"] >= 1 - tolerance]
    return min(ok) if ok else None
