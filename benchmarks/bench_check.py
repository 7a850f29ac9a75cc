"""How long `longpack check` takes: all rules on the example configs, and the --packed scan of a packed
folder against a plain per-row Python scan of the same Parquet file (run in the same process).

    PYTHONPATH=src python benchmarks/bench_check.py [--rows 2000]

Prints medians over repeats; timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from longpack.rules import inspect_packed_dir, load_setup, run_rules
from timing import median_time

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "check"


def write_folder(folder: Path, rows: int, pack: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids, starts, masks = [], [], []
    for _ in range(rows):
        lens: list[int] = []
        left = pack
        while left >= 8:
            n = int(rng.integers(1, min(left, 4096) // 8 + 1)) * 8
            lens.append(n + 1)  # stored = runtime + 1
            left -= n
        row_starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).tolist()
        total = int(sum(lens))
        ids.append(np.full(total, 7, dtype=np.int64))
        starts.append(row_starts)
        masks.append(np.ones(total, dtype=np.int8))
    table = pa.table(
        {
            "input_ids": pa.array(ids, type=pa.list_(pa.int64())),
            "loss_mask": pa.array(masks, type=pa.list_(pa.int8())),
            "seq_start_id": pa.array(starts, type=pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, folder / f"training_{pack}.idx.parquet", row_group_size=500)


def python_scan(folder: Path, multiple: int) -> int:
    """Reference: read rows as Python lists and walk the segments one by one."""
    bad = 0
    for file in sorted(folder.glob("*.parquet")):
        table = pq.read_table(file, columns=["input_ids", "seq_start_id"])
        for ids, starts in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
            bounds = [*starts, len(ids)]
            for a, b in itertools.pairwise(bounds):
                if (b - a - 1) % multiple:
                    bad += 1
    return bad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--pack", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    print(f"{'case':<48} {'median':>12}")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        loaded = load_setup(path)
        t = median_time(lambda s=loaded.setup: run_rules(s), 50)
        print(f"run_rules {path.name:<38} {t * 1e3:>9.3f} ms")
    t = median_time(lambda: run_rules(load_setup(EXAMPLES / "qwen3_235b_128k_sft_128xgb200.yaml").setup), 20)
    print(f"{'load YAML + run_rules (qwen3 235b)':<48} {t * 1e3:>9.3f} ms")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_folder(folder, args.rows, args.pack, seed=0)
        size_mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        named = folder / f"training_{args.pack}.idx.parquet"  # Bridge-style data: no manifest, named
        fast = median_time(lambda: inspect_packed_dir(named, multiple=8), args.repeats)
        slow = median_time(lambda: python_scan(folder, 8), max(1, args.repeats // 2))
        summary = inspect_packed_dir(named, multiple=8)
        assert summary.misaligned_segments == python_scan(folder, 8) == 0
        print(
            f"--packed scan {args.rows} rows x {args.pack} tokens ({summary.segments} sequences, {size_mb:.1f} MB): "
            f"longpack {fast:.3f} s, per-row Python {slow:.3f} s, ratio {slow / fast:.1f}x"
        )


if __name__ == "__main__":
    main()
