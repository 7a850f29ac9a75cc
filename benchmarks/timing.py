"""Timing shared by the benchmarks: the median of several runs (DESIGN.md: ratios against baselines run in
the same process, median of several runs)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeats: int, *, warmup: bool = False) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn`` (after one untimed call with ``warmup``)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
