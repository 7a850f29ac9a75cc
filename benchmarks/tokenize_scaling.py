"""Per-worker scaling of sharded tokenizing: ``longpack tokenize --shard-bytes`` on this machine's processes
and ``--backend ray`` on a local Ray cluster, with 1 and 2 workers, on the same text documents and the Qwen3
tokenizer. Medians of ``--runs`` runs; Ray is started once (``ray.init(num_cpus=workers max)``) and its
start-up is not timed. The stores are compared byte for byte with the first run's (every file) or the run
stops. Tokens per second and the speed-up of 2 workers over 1 are printed.

    PYTHONPATH=src python benchmarks/tokenize_scaling.py [--megabytes 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_memory import make_docs  # the same documents


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megabytes", type=float, default=16.0)
    ap.add_argument("--shard-bytes", default="2M")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import ray

    from longpack.jobs import TokenizeConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        data = tmp / "docs.jsonl"
        make_docs(data, args.megabytes)
        reference: dict[str, bytes] | None = None
        results = {}
        tokens = 0
        for backend in ("local", "ray"):
            for workers in (1, 2):
                walls = []
                for run in range(args.runs):
                    out = tmp / f"{backend}{workers}-{run}"
                    t0 = time.perf_counter()
                    r = TokenizeConfig(
                        inputs=[data], out=out, tokenizer="qwen3", shard_bytes=args.shard_bytes,
                        workers=workers, backend=backend,
                    ).run()  # fmt: skip
                    walls.append(time.perf_counter() - t0)
                    tokens = int(r.manifest["tokens"])
                    got = files_of(out)
                    reference = reference or got
                    if got != reference:
                        raise SystemExit(f"{backend} with {workers} workers wrote another store")
                results[(backend, workers)] = statistics.median(walls)
    ray.shutdown()
    print(f"{args.megabytes} MiB of text documents, {tokens} tokens, qwen3, shards of {args.shard_bytes}")
    print(f"{'backend':<8}{'workers':>8}{'wall s':>9}{'tokens/s':>12}{'2 vs 1':>8}")
    for (backend, workers), wall in results.items():
        speedup = results[(backend, 1)] / wall if workers == 2 else 1.0
        print(f"{backend:<8}{workers:>8}{wall:>9.2f}{tokens / wall:>12.0f}{speedup:>8.2f}")


if __name__ == "__main__":
    main()
