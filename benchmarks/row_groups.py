"""Packed Parquet row-group size: file size and Megatron-Bridge-style random access, per row-group size.

Run from the repository root:

    PYTHONPATH=src python benchmarks/row_groups.py --quick     # 1,000 rows of 4,096 tokens, a minute
    PYTHONPATH=src python benchmarks/row_groups.py             # 4,000 rows of 8,192 tokens

Megatron-Bridge's ``GPTSFTPackedParquetDataset.__getitem__`` reads the whole row group that holds the row
(``ParquetFile.read_row_group(g, columns=[input_ids, seq_start_id, loss_mask])``), keeps exactly that one
group cached, and takes the row with ``column[i].as_py()``. Its batch sampler shuffles rows across the
epoch, so nearly every access misses the cache: the cost of one random access is the cost of decoding one
row group. This script does exactly those calls (written from Bridge's reader; no Bridge import), for rows
packed by ``longpack.packed`` from SFT-like lognormal samples (median 600 tokens, ids uniform over a
151,669-token vocabulary, a prompt/answer loss mask), written with longpack's writer at each row-group size,
plus Bridge's own writer options (``pq.write_table(..., row_group_size=500)``: dictionary pages on every
column, statistics) for reference.

Columns: file size (MiB, and relative to the 500-row default), write time, random-access rows/s (median of
``--repeats`` runs of ``--reads`` random rows, a fresh reader each run), sequential rows/s (every row in
order, the cache hit path), and the ratio of random-access rows/s to the 500-row row group's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from longpack.packed import PackSettings, plan_splits
from longpack.packed.files import BRIDGE_WRITER_OPTIONS, ParquetWriterOptions
from longpack.packed.pipeline import write_shard_file
from longpack.samples import TokenizedSamples

COLUMNS = ["input_ids", "seq_start_id", "loss_mask"]
VOCAB = 151_669
EOS = 151_645


def make_samples(total_tokens: int, seed: int = 0) -> TokenizedSamples:
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < total_tokens:
        lengths += np.clip(rng.lognormal(np.log(600), 1.0, 10_000), 8, 32_768).astype(int).tolist()
    lens = np.array(lengths, dtype=np.int64)
    lens = lens[: int(np.searchsorted(np.cumsum(lens), total_tokens)) + 1]
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = rng.integers(0, VOCAB, int(offsets[-1]), dtype=np.int32)
    tokens[offsets[1:] - 1] = EOS
    prompt = (rng.random(len(lens)) * lens).astype(np.int64)
    within = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lens)
    mask = (within >= np.repeat(prompt, lens)).astype(np.uint8)
    return TokenizedSamples(
        tokens=tokens,
        loss_mask=mask,
        offsets=offsets,
        source_file=np.zeros(len(lens), np.int32),
        source_row=np.arange(1, len(lens) + 1),
        files=("synthetic",),
    )


def bridge_random_access(
    path: Path, rows: np.ndarray, budget_s: float = float("inf"), clock: str = "wall"
) -> float:
    """Rows per second reading ``rows`` one by one as Bridge's ``__getitem__`` does (one cached row group),
    stopping after ``budget_s`` seconds (at least 10 rows)."""
    pf = pq.ParquetFile(path)
    offsets = [0]
    for g in range(pf.metadata.num_row_groups):
        offsets.append(offsets[-1] + pf.metadata.row_group(g).num_rows)
    cached_group, table = None, None
    start = time.perf_counter()
    cpu_start = time.process_time()
    done = 0
    for row in rows.tolist():
        if done >= 10 and time.perf_counter() - start > budget_s:
            break
        done += 1
        g = int(np.searchsorted(offsets, row, side="right")) - 1
        if g != cached_group:
            table = pf.read_row_group(g, columns=COLUMNS)
            cached_group = g
        assert table is not None
        i = row - offsets[g]
        ids = table.column("input_ids")[i].as_py()
        starts = table.column("seq_start_id")[i].as_py()
        table.column("loss_mask")[i].as_py()
        _ = [*starts, len(ids)]
    elapsed = time.process_time() - cpu_start if clock == "cpu" else time.perf_counter() - start
    pf.close()
    return done / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pack-size", type=int, default=None)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--reads", type=int, default=None, help="random rows read per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per random-access run, at most")
    ap.add_argument("--sizes", default="8,16,32,64,128,256,500,1000")
    args = ap.parse_args()
    pack_size = args.pack_size or (4096 if args.quick else 8192)
    n_rows = args.rows or (2500 if args.quick else 4000)
    reads = args.reads or (300 if args.quick else 600)
    samples = make_samples(int(n_rows * pack_size * 0.97))
    settings = PackSettings(seq_length=pack_size, algorithm="first_fit_shuffle", seed=1234)
    split = plan_splits(samples, settings, eos_id=EOS)[0]
    rows_total = split.plan.num_rows
    rng = np.random.default_rng(1)
    variants: list[tuple[str, ParquetWriterOptions]] = [
        (f"longpack rg={n}", ParquetWriterOptions(row_group_size=int(n))) for n in args.sizes.split(",")
    ]
    variants += [
        ("longpack rg=500 +stats", ParquetWriterOptions(row_group_size=500, write_statistics=True)),
        ("longpack rg=500 old mask", ParquetWriterOptions(row_group_size=500, use_dictionary=("loss_mask",))),
        ("bridge writer rg=500", BRIDGE_WRITER_OPTIONS),
    ]
    print(
        f"pack size {pack_size}, {rows_total} rows, {split.report()['stored_tokens']:,} stored tokens; "
        f"{reads} random reads x {args.repeats} runs (median); pyarrow {pq.__name__} {__import__('pyarrow').__version__}; "
        f"{os.cpu_count()} CPUs"
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in variants:
            path = Path(tmp) / f"{name.replace(' ', '_').replace('=', '')}.idx.parquet"
            t0 = time.perf_counter()
            write_shard_file(path, split.aligned, split.plan, 0, rows_total, options=options)
            write_s = time.perf_counter() - t0
            size = path.stat().st_size
            footer = pq.ParquetFile(path).metadata.serialized_size
            runs = [
                bridge_random_access(path, rng.integers(0, rows_total, reads), args.budget)
                for _ in range(args.repeats)
            ]
            seq = bridge_random_access(path, np.arange(rows_total))
            results.append((name, size, footer, write_s, statistics.median(runs), seq))
            path.unlink()
    base = next(r for r in results if r[0] == "longpack rg=500")
    print(
        f"{'writer':<26} {'MiB':>8} {'size/500':>9} {'footer KiB':>10} {'write s':>8} {'random rows/s':>14} "
        f"{'vs 500':>7} {'seq rows/s':>11}"
    )
    for name, size, footer, write_s, rand, seq in results:
        print(
            f"{name:<26} {size / 2**20:>8.1f} {size / base[1]:>9.3f} {footer / 1024:>10.1f} {write_s:>8.2f} "
            f"{rand:>14.1f} {rand / base[4]:>7.2f} {seq:>11.0f}"
        )


if __name__ == "__main__":
    main()
