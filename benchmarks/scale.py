"""`longpack pack` at scale: local backend vs the Ray Data backend with 1 and 2 workers.

Input: one pre-tokenized Parquet file (``input_ids`` list<int32>, row groups of 50k rows) with short SFT-like
runtime lengths (log-normal, median 48 tokens, clipped to 8..1024), so that 1M and 5M samples fit the disk and
memory of a small shared machine. Settings: ``--seq-length 1024 --pack-size 2048``, ``best_fit_decreasing``.

Each measurement runs in a fresh subprocess. Ray runs start their own local cluster
(``ray.init(num_cpus=W)``, 2 GB object store); the cluster start-up is reported apart from the pipeline time.
samples/s = input samples / pipeline seconds (tokenize + plan + write, manifest included). Peak RSS: the
driver process (``ru_maxrss``), and for Ray the largest peak of any worker process that ran a task (it counts
object-store pages a worker mapped). Every Ray output is checked byte for byte against the local one (the
manifest lists every shard's sha256; equal manifests and equal shard hashes).

    python benchmarks/scale.py                                   # 1M and 5M, local / ray1 / ray2
    python benchmarks/scale.py --sizes 200000 --modes local ray2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

SEQ_LENGTH = 1024
PACK_SIZE = 2048
ROW_GROUP = 50_000


def make_input(path: Path, n: int, seed: int = 0) -> int:
    """Write ``n`` pre-tokenized rows; return the stored token count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    total = 0
    with pq.ParquetWriter(path, pa.schema([pa.field("input_ids", pa.list_(pa.int32()))])) as writer:
        for lo in range(0, n, ROW_GROUP):
            m = min(ROW_GROUP, n - lo)
            lengths = (
                np.clip(np.round(rng.lognormal(np.log(48), 0.8, size=m)), 8, SEQ_LENGTH).astype(np.int64) + 1
            )
            offsets = np.zeros(m + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            tokens = rng.integers(3, 250, size=int(offsets[-1]), dtype=np.int32)
            arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))
            writer.write_table(pa.table({"input_ids": arr}), row_group_size=ROW_GROUP)
            total += int(offsets[-1])
    return total


def run_one(mode: str, src: str, out: str, rows_per_shard: int | None = None) -> dict:
    """One measurement (in its own process): mode ``local`` or ``rayW``."""
    from longpack.jobs import LocalExecutor, PackConfig
    from longpack.text import TextConfig

    job = PackConfig(
        inputs=[src],
        out=out,
        tokenizer="bytes",
        seq_length=SEQ_LENGTH,
        pack_size=PACK_SIZE,
        rows_per_shard=rows_per_shard,
        text=TextConfig(format="pretokenized"),
        overwrite=True,
    )
    startup = 0.0
    report: dict = {}
    if mode == "local":
        t0 = time.perf_counter()
        result = replace(job, backend=LocalExecutor()).run()
        wall = time.perf_counter() - t0
    else:
        import ray

        from longpack.cluster import RayExecutor

        workers = int(mode.removeprefix("ray"))
        t0 = time.perf_counter()
        ray.init(
            num_cpus=workers,
            object_store_memory=2 * 2**30,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        startup = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = replace(job, backend=RayExecutor()).run()
        wall = time.perf_counter() - t0
        report = result.backend or {}
        ray.shutdown()
    return {
        "mode": mode,
        "wall_s": wall,
        "startup_s": startup,
        "samples": result.counts["samples_read"],
        "driver_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "worker_peak_rss": max(report.get("worker_peak_rss_bytes", {}).values(), default=0),
        "worker_processes": len(report.get("worker_peak_rss_bytes", {})),
    }


def output_digest(out: Path) -> str:
    digest = hashlib.sha256()
    for p in sorted(out.iterdir()):
        digest.update(p.name.encode())
        digest.update(hashlib.sha256(p.read_bytes()).digest())
    return digest.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000])
    ap.add_argument("--modes", nargs="+", default=["local", "ray1", "ray2"])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--rows-per-shard", type=int, default=None, help="default: longpack's (~2**27 tokens per shard)"
    )
    ap.add_argument("--run", nargs=3, metavar=("MODE", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        print(json.dumps(run_one(*args.run, rows_per_shard=args.rows_per_shard)))
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="longpack-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.sizes:
        src = workdir / f"in_{n}.parquet"
        tokens = make_input(src, n)
        ref = None
        for mode in args.modes:
            out = workdir / f"out_{n}_{mode}"
            proc = subprocess.run(
                [sys.executable, __file__, "--run", mode, str(src), str(out)]
                + ([f"--rows-per-shard={args.rows_per_shard}"] if args.rows_per_shard else []),
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                print(f"{n} {mode}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            digest = output_digest(out)
            ref = ref or digest
            r.update(n=n, tokens=tokens, identical=digest == ref)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            for p in out.iterdir():
                p.unlink()
            out.rmdir()
        src.unlink()
    print(
        f"\n{'samples':>9} {'tokens':>11} {'mode':>6} {'start s':>8} {'pipeline s':>10} {'samples/s':>10} "
        f"{'vs local':>8} {'driver MiB':>10} {'max worker MiB':>14} {'procs':>5} {'same bytes':>10}"
    )
    for r in rows:
        base = next((x for x in rows if x["n"] == r["n"] and x["mode"] == "local"), None)
        ratio = f"{base['wall_s'] / r['wall_s']:.2f}x" if base else "-"
        print(
            f"{r['n']:>9} {r['tokens']:>11} {r['mode']:>6} {r['startup_s']:>8.1f} {r['wall_s']:>10.1f} "
            f"{r['n'] / r['wall_s']:>10.0f} {ratio:>8} {r['driver_peak_rss'] / 2**20:>10.0f} "
            f"{r['worker_peak_rss'] / 2**20:>14.0f} {r['worker_processes']:>5} {r['identical']!s:>10}"
        )


if __name__ == "__main__":
    main()
