"""RL rollout packer: microseconds per rollout for one step's rollouts, against Megatron-LM's own packer.

Run: ``PYTHONPATH=src python benchmarks/rl_packer.py [--rollouts 10000] [--bin-size 16384] [--dp 8]``
(``LONGPACK_MEGATRON_LM=/path/to/Megatron-LM`` adds Megatron-LM's ``SequencePacker`` +
``distribute_packed_bins`` on the same rollouts, run through ``tests/megatron_rl_harness.py``).

Rollout lengths are lognormal (median 1,500 tokens, capped at the bin size), prompt tokens masked out of
the loss, one per-token log-prob array carried along. Each row is the median of ``--repeats`` runs of
packing for all ``--dp`` ranks in one process (a real trainer packs once and keeps its own rank); "floor"
is writing the same tokens into preallocated bins with one vectorised copy, the least any packer does.
The imbalance column is the busiest DP rank's predicted work over the mean (``PackCostModel``: one unit
per token plus one per causal pair of a 4,096-token sequence); the "planner cost" rows pack and balance
with the planner's one step-time model for ``--model`` on ``--gpu`` (``pack_cost_model``, built once, not
timed) and report the imbalance of its seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from longpack.balance.rollouts import pack_rollouts
from longpack.planner.balance_costs import pack_cost_model


def rollouts(
    count: int, bin_size: int, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(1500), 0.8, count).astype(np.int64), 16, bin_size - 16)
    tokens = [rng.integers(1, 150_000, n) for n in lengths]
    masks = [np.r_[np.zeros(n // 4, np.int64), np.ones(n - n // 4, np.int64)] for n in lengths]
    logprobs = [rng.normal(size=n).astype(np.float32) for n in lengths]
    return tokens, masks, logprobs


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--bin-size", type=int, default=16_384)
    parser.add_argument("--dp", type=int, default=8)
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="qwen3_8b", help="catalog model of the planner cost rows")
    parser.add_argument("--gpu", default="H100_SXM", help="catalog GPU of the planner cost rows")
    args = parser.parse_args()
    planner_cost = pack_cost_model(model=args.model, gpu=args.gpu, cp=args.cp, seq_length=args.bin_size)
    tokens, masks, logprobs = rollouts(args.rollouts, args.bin_size, seed=0)
    multiple = 2 * args.cp if args.cp > 1 else 1
    rows = []

    def packer(distribution: str, cost_model=None):
        return lambda: pack_rollouts(
            tokens,
            loss_masks=masks,
            token_side={"logprobs": logprobs},
            bin_size=args.bin_size,
            dp=args.dp,
            cp=args.cp,
            distribution=distribution,
            cost_model=cost_model,
        )

    for distribution in ("fifo", "balanced"):
        packing = packer(distribution)()
        seconds = median_seconds(packer(distribution), args.repeats)
        rows.append((f"longpack {distribution}", seconds, packing.imbalance, packing.efficiency))
    for distribution in ("fifo", "balanced"):
        packing = packer(distribution, planner_cost)()
        seconds = median_seconds(packer(distribution, planner_cost), args.repeats)
        name = f"longpack {distribution}, planner cost ({args.model}, {args.gpu})"
        rows.append((name, seconds, packing.imbalance, packing.efficiency))

    lengths = np.array([t.size for t in tokens])
    flat = np.concatenate(tokens)

    def floor() -> None:
        slots = -(-lengths // multiple) * multiple
        bins = -(-int(slots.sum()) // args.bin_size) + args.dp
        out = np.zeros(bins * args.bin_size, dtype=flat.dtype)
        starts = np.concatenate([[0], np.cumsum(slots)[:-1]])
        index = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(
            flat.size
        )
        out[index] = flat

    rows.append(
        ("floor (one vectorised copy)", median_seconds(floor, args.repeats), float("nan"), float("nan"))
    )

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import megatron_rl_harness as harness

    path = harness.source_path()
    if path is not None:
        warnings.simplefilter("ignore")
        module = harness.load(path, pad_id=0)
        listed = [t.tolist() for t in tokens]
        listed_masks = [m.tolist() for m in masks]

        def megatron() -> None:
            harness.run_upstream(
                module,
                listed,
                listed_masks,
                bin_size=args.bin_size,
                max_sequences_per_bin=16,
                seq_length_multiple=multiple,
                dp=args.dp,
                distribution="fifo",
                pad_id=0,
            )

        rows.append(
            (
                "Megatron-LM SequencePacker (CPU torch)",
                median_seconds(megatron, args.repeats),
                float("nan"),
                float("nan"),
            )
        )

    base = rows[0][1]
    print(
        f"{args.rollouts:,} rollouts, bin {args.bin_size:,}, DP {args.dp}, CP {args.cp}; median of {args.repeats}"
    )
    print("| packer | seconds | µs / rollout | vs longpack fifo | imbalance | fill |")
    print("|---|---|---|---|---|---|")
    for name, seconds, imbalance, fill in rows:
        shown_imbalance = "" if np.isnan(imbalance) else f"{imbalance:.3f}"
        shown_fill = "" if np.isnan(fill) else f"{fill:.1%}"
        print(
            f"| {name} | {seconds:.3f} | {seconds / args.rollouts * 1e6:.1f} | {seconds / base:.2f}x | "
            f"{shown_imbalance} | {shown_fill} |"
        )


if __name__ == "__main__":
    main()
