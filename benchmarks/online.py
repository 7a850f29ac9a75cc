"""Online packing benchmark: fill vs. candidate-buffer size against offline best fit, packs/s, host memory.

Run: ``PYTHONPATH=src python benchmarks/online.py [--samples 20000] [--capacity 4096] [--repeats 3]``.

For each workload (``longpack.online.simulate``: SFT-like lognormal, bimodal) and buffer size the stream is
packed by ``OnlinePacker`` (Energon's buffer semantics, best-fit-decreasing selection) and compared with one
offline best-fit-decreasing run over the same samples. packs/s is the median of ``--repeats`` runs over bare
lengths (selection cost only); "tok packs/s" packs token samples into Bridge rows. Memory per buffered sample
is measured with tracemalloc on token samples (int64 ids + int8 mask: 9 bytes per token plus overhead).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from longpack.online import OnlinePacker
from longpack.online.simulate import WORKLOADS, offline_fill, smallest_buffer_within, synthetic_lengths

BUFFER_SIZES = (8, 16, 64, 256, 1024, 4096)


def token_samples(lengths: np.ndarray, seed: int):
    rng = np.random.default_rng(seed)
    for n in lengths.tolist():
        yield {"input_ids": rng.integers(0, 150_000, n + 1), "loss_mask": np.ones(n + 1, dtype=np.int8)}


def held_bytes(lengths: np.ndarray, capacity: int, buffer_size: int, multiple: int) -> tuple[int, int]:
    """(traced bytes held, samples buffered) after the buffer filled and one pack left."""
    packer = OnlinePacker(capacity, buffer_size, pad_to_multiple_of=multiple)
    stream = token_samples(lengths, seed=1)
    tracemalloc.start()
    it = packer.pack(stream)
    before = tracemalloc.get_traced_memory()[0]
    pack = next(it)
    del pack
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held, len(packer.state_dict()["stored_lengths"])


def bytes_per_buffered_sample(lengths: np.ndarray, capacity: int, multiple: int) -> float:
    """Marginal host bytes per buffered token sample: (held(1024) - held(64)) / (samples difference)."""
    small = held_bytes(lengths, capacity, 64, multiple)
    large = held_bytes(lengths, capacity, min(1024, len(lengths)), multiple)
    return (large[0] - small[0]) / max(large[1] - small[1], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--pad-to-multiple-of", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cap, m = args.capacity, args.pad_to_multiple_of
    print(f"capacity {cap}, pad_to_multiple_of {m}, {args.samples} samples, median of {args.repeats} runs")
    for workload in WORKLOADS:
        lengths = synthetic_lengths(workload, args.samples, cap, seed=args.seed)
        start = time.perf_counter()
        off_fill, off_packs = offline_fill(
            lengths, cap, pad_to_multiple_of=m, algorithm="best_fit_decreasing"
        )
        off_s = time.perf_counter() - start
        print(
            f"\n## {workload}: mean length {lengths.mean():.0f}, offline BFD fill {off_fill:.4f} "
            f"({off_packs} packs, {off_s * 1e3:.1f} ms)"
        )
        print(f"{'buffer':>7} {'fill':>7} {'packs':>7} {'ratio':>7} {'packs/s':>9} {'tok packs/s':>11}")
        rows = []
        values = lengths.tolist()
        sample_tokens = list(token_samples(lengths[: min(len(lengths), 4000)], seed=2))
        for b in BUFFER_SIZES:
            times = []
            n_packs, fill = 0, 0.0
            for _ in range(args.repeats):
                packer = OnlinePacker(cap, b, pad_to_multiple_of=m)
                t0 = time.perf_counter()
                n_packs = sum(1 for _ in packer.pack(values))
                times.append(time.perf_counter() - t0)
                fill = packer.stats.fill(cap)
            tok = OnlinePacker(cap, b, pad_to_multiple_of=m)
            t0 = time.perf_counter()
            tok_packs = sum(1 for _ in tok.pack(sample_tokens))
            tok_s = time.perf_counter() - t0
            ratio = fill / off_fill
            rows.append({"buffer_size": b, "fill_ratio": ratio})
            print(
                f"{b:>7} {fill:>7.4f} {n_packs:>7} {ratio:>7.4f} {n_packs / statistics.median(times):>9.0f} "
                f"{tok_packs / tok_s:>11.0f}"
            )
        mem = bytes_per_buffered_sample(lengths, cap, m)
        stored = float((lengths + 1).mean())
        print(
            f"host memory per buffered token sample: {mem:.0f} B (mean {stored:.0f} stored tokens x 9 B = {9 * stored:.0f} B)"
        )
        best = smallest_buffer_within(rows)
        print(f"smallest buffer within 1% of offline fill: {best if best is not None else 'none up to 4096'}")


if __name__ == "__main__":
    main()
