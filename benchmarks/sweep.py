"""How long `longpack sweep` takes: tokenize once + pack at every candidate length, against the by-hand
way (tokenize again for every candidate, as separate `longpack pack` runs do), run in the same process.

    PYTHONPATH=src python benchmarks/sweep.py [--samples 200000] [--repeats 3]

Part 1 uses the built-in demo data with the built-in Qwen3 tokenizer; part 2 synthetic lengths (no
tokenizer) to show how the packing part scales, with and without the planner, and with the CP modes
(``--cp-modes``) on a TP1 CP2 PP1 layout. Prints medians; timings
depend on the machine's load.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from longpack.jobs.sweep import PlannerSetup, SweepSettings, pack_candidate, sweep
from longpack.planner.catalog import load_gpu, load_model
from longpack.samples import TokenizedSamples
from longpack.text import TextConfig, tokenize_inputs, write_demo_dataset
from timing import median_time

LENGTHS = (2048, 4096, 8192, 16384)


def synthetic(n: int, seed: int) -> TokenizedSamples:
    rng = np.random.default_rng(seed)
    lens = np.minimum(rng.lognormal(6, 1.2, n).astype(np.int64) + 2, 60000)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    total = int(offsets[-1])
    return TokenizedSamples(
        tokens=np.ones(total, np.int32),
        loss_mask=np.ones(total, np.uint8),
        offsets=offsets,
        source_file=np.zeros(n, np.int32),
        source_row=np.arange(n),
        files=("synthetic",),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    settings = SweepSettings(pack_lengths=LENGTHS, overlength="truncate")

    with tempfile.TemporaryDirectory() as tmp:
        demo = str(write_demo_dataset(Path(tmp) / "demo"))
        config = TextConfig()

        def tokenize() -> TokenizedSamples:
            return tokenize_inputs([demo], tokenizer="qwen3", config=config, workers=args.workers).samples

        samples = tokenize()
        t_tok = median_time(tokenize, args.repeats)
        t_sweep = median_time(lambda: sweep(samples, settings, eos_id=151645), args.repeats)

        def by_hand() -> None:
            for length in LENGTHS:
                pack_candidate(tokenize(), settings, length, eos_id=151645)

        t_hand = median_time(by_hand, args.repeats)
    print(f"demo data: {len(samples)} samples, {int(samples.runtime_lengths().sum()):,} tokens, qwen3")
    print(f"{'step':<52}{'median s':>10}")
    print(f"{'tokenize once':<52}{t_tok:>10.3f}")
    print(f"{'sweep, 4 candidates (packing only)':<52}{t_sweep:>10.3f}")
    print(f"{'longpack sweep = tokenize once + sweep':<52}{t_tok + t_sweep:>10.3f}")
    print(f"{'by hand: tokenize + pack per candidate (4x)':<52}{t_hand:>10.3f}")
    print(f"ratio by hand / sweep: {t_hand / (t_tok + t_sweep):.2f}x")

    big = synthetic(args.samples, 0)
    planner = PlannerSetup(model=load_model("llama3_1_8b"), gpu=load_gpu("H100_SXM"), num_gpus=8)
    t_pack = median_time(lambda: sweep(big, settings, eos_id=0), args.repeats)
    t_plan = median_time(lambda: sweep(big, settings, eos_id=0, planner=planner), args.repeats)
    print(f"\nsynthetic: {args.samples:,} samples, {int(big.runtime_lengths().sum()):,} tokens")
    print(f"{'sweep, 4 candidates, packing only':<52}{t_pack:>10.3f}")
    print(f"{'sweep, 4 candidates, with the planner (llama3_1_8b)':<52}{t_plan:>10.3f}")

    # --cp-modes: the same planner pinned to TP1 CP2 PP1 (the modes need PP 1), with and without the modes
    cp2 = SweepSettings(pack_lengths=LENGTHS, overlength="truncate", pad_seq_to_mult=4)
    pinned = PlannerSetup(
        model=load_model("llama3_1_8b"),
        gpu=load_gpu("H100_SXM"),
        num_gpus=8,
        pins={"tp": 1, "cp": 2, "pp": 1},
    )
    t_cp2 = median_time(lambda: sweep(big, cp2, eos_id=0, planner=pinned), args.repeats)
    t_modes = median_time(lambda: sweep(big, cp2, eos_id=0, planner=pinned, cp_modes=True), args.repeats)
    print(f"{'same, planner pinned to TP1 CP2 PP1':<52}{t_cp2:>10.3f}")
    print(f"{'same, with the CP modes (--cp-modes)':<52}{t_modes:>10.3f}")
    print(f"ratio with / without the CP modes: {t_modes / t_cp2:.2f}x")


if __name__ == "__main__":
    main()
