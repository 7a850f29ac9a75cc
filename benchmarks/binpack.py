"""Benchmark of ``longpack.binpack`` against the packers people run today.

Run from the repository root:

    PYTHONPATH=src python benchmarks/binpack.py --quick        # 100k items, one capacity, a minute
    PYTHONPATH=src python benchmarks/binpack.py                # full matrix: 100k/1M/10M x 3 capacities

Workloads (all seeded): SFT-like lognormal (median 600, sigma 1.0, tail capped at 32,768, then clipped at the
capacity), uniform 1..capacity, bimodal (70 % lognormal median 150 sigma 0.5 + 30 % median 2,500 sigma 0.6).

Rows, all in this process on the same input:
* ``bfd``: ``pack_lengths(algorithm="best_fit_decreasing")`` (the default), bin ids permuted, assignment array
  included.
* ``ffs``: ``pack_lengths(algorithm="first_fit_shuffle")``, Megatron-Bridge's bins and rows (its fill step picks
  each item), assignment array included.
* ``ffs.arrays``: ``megatron.create_packing_strategy_arrays`` (what the pack pipeline calls).
* ``py-segtree-ffs``: a pure-Python segment-tree first fit after ``np.random.shuffle`` of the ascending length
  list, as Megatron-Bridge's ``data/packing`` runs it today. Checked to give identical bins to ``ffs``.
* ``lightbinpack.obfd``: C++ optimized best fit decreasing from PyPI (``pip install lightbinpack``, the
  ``bench`` extra), given a Python list (its native input).

Time is the median of ``--repeats`` runs (the pure-Python baseline runs once at N >= 1M). Memory is the growth of
peak RSS over the first run, per item, sampled every 0.2 ms by a helper process: it sees numba and C++
allocations, which tracemalloc does not (input and output arrays of the packer included). ``ratio`` is the row's time divided by the time of the longpack row it is compared with (``bfd`` for
best-fit baselines, ``ffs`` for first-fit baselines): above 1 means longpack is faster.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack.binpack import megatron, pack_lengths, packing_stats

WORKLOADS = ("lognormal", "uniform", "bimodal")


def make_lengths(workload: str, n: int, capacity: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, WORKLOADS.index(workload), n, capacity])
    if workload == "lognormal":
        x = np.minimum(rng.lognormal(np.log(600), 1.0, n), 32_768)
    elif workload == "uniform":
        return rng.integers(1, capacity + 1, n, dtype=np.int64)
    elif workload == "bimodal":
        long = rng.random(n) < 0.3
        x = np.where(long, rng.lognormal(np.log(2500), 0.6, n), rng.lognormal(np.log(150), 0.5, n))
    else:
        raise ValueError(f"unknown workload {workload!r}; choose one of {WORKLOADS}")
    return np.clip(np.round(x), 1, capacity).astype(np.int64)


# ----------------------------------------------------------------------------------------------
# Baseline: pure-Python segment-tree first fit, as Megatron-Bridge's data/packing/algorithms.py runs it today.
# ----------------------------------------------------------------------------------------------


def python_segment_tree_first_fit(seqlens: list[int], pack_size: int) -> list[list[int]]:
    n = len(seqlens)
    if n == 0:
        return []
    tree = [0] * (4 * n)  # max of remaining capacity; node 1 covers leaves [0, n), all leaves start at 0
    bins: list[list[int]] = []
    remaining: list[int] = []
    for s in seqlens:
        found = -1
        if tree[1] >= s:
            node, lo, hi = 1, 0, n - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if tree[2 * node] >= s:
                    node, hi = 2 * node, mid
                else:
                    node, lo = 2 * node + 1, mid + 1
            found = lo
        if found == -1 or found >= len(bins):
            found = len(bins)
            bins.append([s])
            remaining.append(pack_size - s)
        else:
            bins[found].append(s)
            remaining[found] -= s
        _python_update(tree, n, found, remaining[found])
    return bins


def _python_update(tree: list[int], n: int, index: int, value: int) -> None:
    path = []
    node, lo, hi = 1, 0, n - 1
    while lo < hi:
        path.append(node)
        mid = (lo + hi) // 2
        if index <= mid:
            node, hi = 2 * node, mid
        else:
            node, lo = 2 * node + 1, mid + 1
    tree[node] = value
    for parent in reversed(path):
        tree[parent] = max(tree[2 * parent], tree[2 * parent + 1])


def python_first_fit_shuffle(lengths: np.ndarray, capacity: int, seed: int) -> list[list[int]]:
    histogram = np.bincount(lengths, minlength=capacity + 1).tolist()
    seqlens: list[int] = []
    for length, count in enumerate(histogram):
        seqlens.extend([length] * count)
    np.random.RandomState(seed).shuffle(seqlens)
    return python_segment_tree_first_fit(seqlens, capacity)


# ----------------------------------------------------------------------------------------------
# Measurement helpers
# ----------------------------------------------------------------------------------------------


def _fix_malloc() -> None:
    """Make glibc return big frees to the OS, so that peak RSS measures each run on its own."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, disables the dynamic threshold
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    except OSError:
        pass


_SAMPLER = r"""
import os, select, sys
pid, page = int(sys.argv[1]), os.sysconf("SC_PAGE_SIZE")
statm = open(f"/proc/{pid}/statm", "rb")
def rss():
    statm.seek(0)
    return int(statm.read().split()[1]) * page
active, peak = False, 0
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.0002 if active else None)
    if ready:
        cmd = sys.stdin.readline().strip()
        if cmd == "start":
            active, base = True, rss()
            peak = base
            print(base, flush=True)
        elif cmd == "stop":
            active = False
            print(max(peak, rss()), flush=True)
        else:
            break
    if active:
        peak = max(peak, rss())
"""


class RssSampler:
    """Peak RSS of this process over a stretch of code, sampled every 0.2 ms by a helper process.

    A helper process (not a thread) keeps sampling while numba or C++ code holds the GIL, and it sees
    every allocator (numpy, numba, C++), which tracemalloc does not.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        if os.path.exists(f"/proc/{os.getpid()}/statm"):
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _SAMPLER, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

    def _ask(self, cmd: str) -> int:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def start(self) -> int | None:
        return None if self.proc is None else self._ask("start")

    def stop(self) -> int | None:
        return None if self.proc is None else self._ask("stop")


SAMPLER: RssSampler | None = None


@dataclass
class Row:
    workload: str
    capacity: int
    n: int
    name: str
    seconds: float
    bins_over_l1: float
    efficiency: float
    bytes_per_item: float | None
    ratio: float | None = None
    note: str = ""


def measure(fn: Callable[[], Any], repeats: int, memory: bool = False) -> tuple[float, Any, float | None]:
    """Median seconds, the last result, and (``memory=True``) peak RSS growth in bytes over the first run."""
    times = []
    result: Any = None
    peak: float | None = None
    for r in range(repeats):
        result = None
        gc.collect()
        base = SAMPLER.start() if memory and SAMPLER is not None and r == 0 else None
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        if base is not None and SAMPLER is not None:
            top = SAMPLER.stop()
            peak = None if top is None else max(0, top - base)
    return statistics.median(times), result, peak


def bins_from_lists(lists: list[list[int]], n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    for b, items in enumerate(lists):
        out[items] = b
    return out


def runner(name: str, lengths: np.ndarray, capacity: int) -> Callable[[], Any]:
    """The call a row times, with its input already in the form it takes."""
    if name == "bfd":
        return lambda: pack_lengths(lengths, capacity, seed=0)
    if name == "ffs":
        return lambda: pack_lengths(lengths, capacity, algorithm="first_fit_shuffle", seed=0)
    if name == "ffs.arrays":
        histogram = np.bincount(lengths, minlength=capacity + 1)
        return lambda: megatron.create_packing_strategy_arrays(
            histogram, capacity, "first_fit_shuffle", rng=np.random.RandomState(0)
        )
    if name == "lightbinpack.obfd":
        import lightbinpack

        as_list = lengths.tolist()
        return lambda: lightbinpack.obfd(as_list, capacity)
    raise ValueError(name)


def child_memory(workload: str, capacity: int, n: int, name: str) -> float | None:
    """Peak RSS growth per item of one run of ``name``, measured in a fresh process (no reused heap)."""
    cmd = [sys.executable, __file__, "--child-memory", workload, str(capacity), str(n), name]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    value = res.stdout.strip().splitlines()[-1]
    return None if value == "None" else float(value)


def _child_memory_main(workload: str, capacity: int, n: int, name: str) -> None:
    _fix_malloc()
    global SAMPLER
    SAMPLER = RssSampler()
    runner(name, make_lengths(workload, 200, capacity), capacity)()  # load compiled code
    fn = runner(name, make_lengths(workload, n, capacity), capacity)
    gc.collect()
    base = SAMPLER.start()
    result = fn()
    top = SAMPLER.stop()
    del result
    print("None" if base is None or top is None else max(0, top - base) / n)


def run_config(
    workload: str, capacity: int, n: int, args: argparse.Namespace, lightbinpack: Any | None
) -> list[Row]:
    lengths = make_lengths(workload, n, capacity)
    rows: list[Row] = []

    def add(name: str, seconds: float, bin_of: np.ndarray, note: str = "") -> Row:
        stats = packing_stats(lengths, bin_of, capacity)
        assert stats.max_bin_fill <= capacity, f"{name} overfilled a bin"
        mem = child_memory(workload, capacity, n, name) if args.memory else None
        row = Row(
            workload,
            capacity,
            n,
            name,
            seconds,
            stats.bins_over_lower_bound,
            stats.efficiency,
            mem,
            note=note,
        )
        rows.append(row)
        return row

    t, bfd, _ = measure(runner("bfd", lengths, capacity), args.repeats)
    bfd_row = add("bfd", t, bfd)
    del bfd
    t, ffs, _ = measure(runner("ffs", lengths, capacity), args.repeats)
    ffs_row = add("ffs", t, ffs)
    t, (flat, offsets, _), _ = measure(runner("ffs.arrays", lengths, capacity), args.repeats)
    del ffs
    assert len(offsets) - 1 == round(ffs_row.bins_over_l1 * -(-int(lengths.sum()) // capacity))
    mem = child_memory(workload, capacity, n, "ffs.arrays") if args.memory else None
    rows.append(Row(workload, capacity, n, "ffs.arrays", t, ffs_row.bins_over_l1, ffs_row.efficiency, mem))

    if lightbinpack is not None:
        t, lists, _ = measure(runner("lightbinpack.obfd", lengths, capacity), args.repeats)
        row = add("lightbinpack.obfd", t, bins_from_lists(lists, n))
        row.ratio = t / bfd_row.seconds
        del lists

    if n <= args.python_max_n:
        repeats = 1 if n >= 1_000_000 else args.repeats
        t, lists, mem = measure(lambda: python_first_fit_shuffle(lengths, capacity, 0), repeats, memory=True)
        same = len(lists) == len(offsets) - 1 and all(
            lst == flat[offsets[b] : offsets[b + 1]].tolist() for b, lst in enumerate(lists)
        )
        assert same, "pure-Python first_fit_shuffle and longpack disagree"
        rows.append(
            Row(
                workload,
                capacity,
                n,
                "py-segtree-ffs",
                t,
                ffs_row.bins_over_l1,
                ffs_row.efficiency,
                None if mem is None else mem / n,
                ratio=t / ffs_row.seconds,
                note=f"identical bins to ffs; {repeats} run(s)",
            )
        )
        del lists
    return rows


def compile_times() -> list[tuple[float, float]]:
    """(wall, CPU) seconds for import + first calls in a fresh process: empty numba cache, then filled."""
    code = (
        "import time; t=time.perf_counter(); c=time.process_time(); import numpy as np; "
        "from longpack.binpack import pack_lengths; x=np.arange(1,100)\n"
        "for a in ('best_fit_decreasing','first_fit_shuffle'): pack_lengths(x, 128, algorithm=a)\n"
        "print(time.perf_counter()-t, time.process_time()-c)"
    )
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for _ in range(2):
            res = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            wall, cpu = res.stdout.split()
            out.append((float(wall), float(cpu)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="100k items, capacity 8192, all workloads")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--capacities", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--python-max-n", type=int, default=1_000_000, help="largest N for the pure-Python baseline"
    )
    parser.add_argument("--no-lightbinpack", action="store_true")
    parser.add_argument("--compile-only", action="store_true", help="only measure numba compile/load time")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory runs")
    parser.add_argument("--child-memory", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_memory:
        workload, capacity, n, name = args.child_memory
        _child_memory_main(workload, int(capacity), int(n), name)
        return
    if args.quick:
        args.sizes, args.capacities = [100_000], [8192]

    _fix_malloc()
    global SAMPLER
    SAMPLER = RssSampler()
    lightbinpack = None
    if not args.no_lightbinpack:
        try:
            import lightbinpack
        except ImportError:
            print("lightbinpack not installed (pip install -e '.[bench]'); its rows are skipped")

    (cold, cold_cpu), (warm, warm_cpu) = compile_times()
    print(
        f"import + first calls in a fresh process: empty numba cache {cold:.2f} s ({cold_cpu:.2f} CPU-s), "
        f"filled cache {warm:.2f} s ({warm_cpu:.2f} CPU-s)"
    )
    if args.compile_only:
        return
    # compile/load in this process before timing anything
    pack_lengths(np.arange(1, 100), 128)
    pack_lengths(np.arange(1, 100), 128, algorithm="first_fit_shuffle")

    header = f"{'workload':<10} {'cap':>6} {'N':>9}  {'algorithm':<18} {'time s':>8} {'bins/L1':>8} {'eff %':>7} {'B/item':>7} {'ratio':>7}  note"
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        for capacity in args.capacities:
            for workload in args.workloads:
                for row in run_config(workload, capacity, n, args, lightbinpack):
                    mem = "-" if row.bytes_per_item is None else f"{row.bytes_per_item:.1f}"
                    ratio = "" if row.ratio is None else f"{row.ratio:.1f}x"
                    print(
                        f"{row.workload:<10} {row.capacity:>6} {row.n:>9}  {row.name:<18} {row.seconds:>8.3f} "
                        f"{row.bins_over_l1:>8.5f} {row.efficiency * 100:>7.3f} {mem:>7} {ratio:>7}  {row.note}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
