"""Tokenize once, re-pack anywhere: what a token store saves, side by side in one run.

Run from the repository root (the text rows are generated once into ``--data-dir``):

    PYTHONPATH=src python benchmarks/store.py --rows 1000000 --data-dir /tmp/longpack-store-bench

Every measured step runs in a fresh process; its CPU time is the process's and its children's (the
tokenizer workers), from ``getrusage(RUSAGE_CHILDREN)`` around it; ``peak anon`` is the step's largest
``RssAnon`` (its own memory, sampled every 20 ms; memory-mapped store pages are file pages, not counted).

- ``first pack``: ``PackConfig(inputs=<text rows>, tokenizer="qwen3", seq_length=4096)``: tokenizing is
  its cost.
- ``tokenize``: ``TokenizeConfig(...)`` of the same rows into a store.
- ``re-pack``: ``PackConfig(store=..., seq_length=8192)``: a new pack size, nothing tokenized; the ratio
  is its CPU time over the first pack's.
- ``sweep``: ``SweepConfig(store=..., pack_lengths=<6 lengths>)``.
- ``open``: a fresh interpreter that imports ``longpack.runtime.PackedDataset``, opens the re-packed
  folder and reads one row (whether torch got imported is printed).
- ``reads``: random rows/s of the re-packed 8K rows, longpack's reader vs a numpy memory map of the same
  tokens (``benchmarks/reader.py``'s floor), items consumed the same way.

The rows: prompt/completion JSON Lines of words drawn from a fixed list (lognormal lengths, median ~60
words per side), so that the numbers of samples and tokens are those of a real SFT set.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
LENGTHS = "1024,2048,4096,8192,16384,32768"


def make_rows(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = np.array(
        ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), int(k))) for k in rng.integers(2, 10, 5000)]
    )
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for lo in range(0, n, 50_000):
            m = min(50_000, n - lo)
            p_len = np.clip(rng.lognormal(np.log(60), 0.8, m), 1, 3000).astype(int)
            c_len = np.clip(rng.lognormal(np.log(60), 0.8, m), 1, 3000).astype(int)
            picks = rng.integers(0, len(words), int(p_len.sum() + c_len.sum()))
            at = 0
            lines = []
            for a, b in zip(p_len.tolist(), c_len.tolist(), strict=True):
                prompt = " ".join(words[picks[at : at + a]])
                completion = " ".join(words[picks[at + a : at + a + b]])
                at += a + b
                lines.append(json.dumps({"prompt": prompt, "completion": completion}))
            fh.write("\n".join(lines) + "\n")
    tmp.rename(path)


def step(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; its printed ``RESULT {...}`` plus wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"step failed:\n{code}\n{proc.stderr[-3000:]}")
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), "RESULT {}")
    out = json.loads(line[7:])
    out["wall"] = wall
    out["cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return out


SAMPLER = """
import threading, json
peak = [0]
def _sample():
    while True:
        with open('/proc/self/status') as fh:
            for line in fh:
                if line.startswith('RssAnon:'):
                    peak[0] = max(peak[0], int(line.split()[1]) * 1024)
        if _stop.wait(0.02): return
_stop = threading.Event(); _t = threading.Thread(target=_sample, daemon=True); _t.start()
"""


def store_only(store: Path, data: Path, args: argparse.Namespace) -> None:
    """Re-pack (8K) and sweep an existing store, medians of ``--repeats`` fresh processes."""
    data.mkdir(parents=True, exist_ok=True)
    repack = (
        SAMPLER
        + f"""
import longpack
r = longpack.PackConfig(store={str(store)!r}, seq_length=8192, out={str(data / "again")!r}, overwrite=True).run()
_stop.set(); _t.join()
print('RESULT ' + json.dumps({{'samples': r.counts['samples_read'], 'peak_anon': peak[0]}}))
"""
    )
    sweep = f"""
import json, longpack
r = longpack.SweepConfig(store={str(store)!r}, pack_lengths={args.lengths!r}).run()
print('RESULT ' + json.dumps({{'candidates': len(r.candidates)}}))
"""
    repacks = [step(repack) for _ in range(args.repeats)]
    sweeps = [step(sweep) for _ in range(args.repeats)]
    print(
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; store {store}: "
        f"{repacks[0]['samples']} samples; medians of {args.repeats} fresh processes"
    )
    for name, runs in (
        ("re-pack at 8K", repacks),
        (f"sweep ({len(args.lengths.split(','))} lengths)", sweeps),
    ):
        print(
            f"{name:<22} wall {statistics.median(r['wall'] for r in runs):7.2f} s   "
            f"CPU {statistics.median(r['cpu'] for r in runs):7.2f} s"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--data-dir", default="/tmp/longpack-store-bench")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-repeats", type=int, default=1, help="runs of the first pack (each tokenizes)")
    ap.add_argument("--lengths", default=LENGTHS)
    ap.add_argument(
        "--store",
        default="",
        help="an existing store: time only the re-pack and the sweep on it (no text rows)",
    )
    args = ap.parse_args()
    if args.store:
        store_only(Path(args.store), Path(args.data_dir), args)
        return
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    rows = data / f"rows_{args.rows}.jsonl"
    if not rows.exists():
        make_rows(rows, args.rows)
    store, first, again = data / "store", data / "first", data / "again"
    print(
        f"{os.cpu_count()} CPUs (shared), load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{args.rows} text rows ({rows.stat().st_size / 2**20:.0f} MiB), tokenizer qwen3"
    )
    pack_first = (
        SAMPLER
        + f"""
import longpack
r = longpack.PackConfig(inputs=[{str(rows)!r}], tokenizer='qwen3', seq_length=4096, out={str(first)!r}, overwrite=True).run()
_stop.set(); _t.join()
print('RESULT ' + json.dumps({{'samples': r.counts['samples_read'], 'peak_anon': peak[0]}}))
"""
    )
    firsts = [step(pack_first) for _ in range(args.first_repeats)]
    tok = step(
        SAMPLER
        + f"""
import longpack
r = longpack.TokenizeConfig(inputs=[{str(rows)!r}], tokenizer='qwen3', out={str(store)!r}, overwrite=True).run()
_stop.set(); _t.join()
print('RESULT ' + json.dumps({{'samples': r.summary()['samples'], 'tokens': r.summary()['tokens'], 'peak_anon': peak[0]}}))
"""
    )
    repack_code = (
        SAMPLER
        + f"""
import longpack
r = longpack.PackConfig(store={str(store)!r}, seq_length=8192, out={str(again)!r}, overwrite=True).run()
_stop.set(); _t.join()
print('RESULT ' + json.dumps({{'rows': r.counts['rows'], 'peak_anon': peak[0]}}))
"""
    )
    repacks = [step(repack_code) for _ in range(args.repeats)]
    sweep_code = f"""
import json, longpack
r = longpack.SweepConfig(store={str(store)!r}, pack_lengths={args.lengths!r}).run()
print('RESULT ' + json.dumps({{'candidates': len(r.candidates)}}))
"""
    sweeps = [step(sweep_code) for _ in range(args.repeats)]
    open_code = f"""
import time, sys, json
t = time.perf_counter()
from longpack.runtime import PackedDataset
ds = PackedDataset({str(again)!r}); ds[len(ds) // 2]
print('RESULT ' + json.dumps({{'open': time.perf_counter() - t, 'torch': 'torch' in sys.modules}}))
"""
    opens = [step(open_code) for _ in range(args.repeats)]
    reads_code = f"""
import json, numpy as np, tempfile
from pathlib import Path
from reader import MemmapFloor, floor_rows_per_s, longpack_rows_per_s
from longpack.packed import PackedFolder
path = PackedFolder.open({str(again)!r}).files('training')[0]
n = sum(1 for _ in [0]) and PackedFolder.open({str(again)!r}).source_rows('training')
perm = np.random.default_rng(0).permutation(n)
with tempfile.TemporaryDirectory() as tmp:
    floor = MemmapFloor(path, Path(tmp))
    f = floor_rows_per_s(floor, perm, 2.0)
    l = longpack_rows_per_s(path, perm, mapped=False, prefetch=32, cache=64 * 2**20, budget=2.0)
print('RESULT ' + json.dumps({{'floor': f, 'longpack': l}}))
"""
    reads = [step(reads_code) for _ in range(args.repeats)]

    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    tokens = tok["tokens"]
    first_cpu = med(firsts, "cpu")
    print(
        f"samples {tok['samples']}, stored tokens {tokens}; medians of {args.repeats} runs (first pack: {args.first_repeats})"
    )
    print(
        f"{'step':<34} {'wall s':>8} {'CPU s':>8} {'vs first pack CPU':>18} {'peak anon MiB':>14} {'anon B/token':>13}"
    )
    for name, runs in (
        ("first pack (tokenize + pack 4K)", firsts),
        ("tokenize -> store", [tok]),
        ("re-pack from store at 8K", repacks),
        (f"sweep on store ({len(args.lengths.split(','))} lengths)", sweeps),
    ):
        anon = med(runs, "peak_anon") if "peak_anon" in runs[0] else None
        print(
            f"{name:<34} {med(runs, 'wall'):>8.2f} {med(runs, 'cpu'):>8.2f} {med(runs, 'cpu') / first_cpu:>18.3f} "
            + (f"{anon / 2**20:>14.0f} {anon / tokens:>13.2f}" if anon else f"{'-':>14} {'-':>13}")
        )
    print(
        f"open PackedDataset + 1 row: {med(opens, 'open'):.3f} s (torch imported: {opens[0]['torch']}); "
        f"random 8K rows/s: longpack {med(reads, 'longpack'):.0f}, memory-map floor {med(reads, 'floor'):.0f}, "
        f"ratio {statistics.median(r['longpack'] / r['floor'] for r in reads):.3f}"
    )


if __name__ == "__main__":
    main()
