"""Benchmark ``longpack plan``: search speed, agreement with a brute-force reference, calibration errors.

Run: ``PYTHONPATH=src python benchmarks/plan_search.py [--repeats 5]``

1. Full search for the issue's speed case (DeepSeek-V3, 1,024 H100, 128K, FP8): median CPU seconds of
   ``--repeats`` runs (process time, i.e. one core).
2. The search's bisection over the recompute ladder vs a brute-force reference that evaluates every
   recompute x offload combination of every layout (same process, smaller case): speed ratio and whether
   both pick the same best layout.
3. Calibration: predicted vs measured TFLOP/s/GPU per (model, GPU) group and overall median / p90 APE.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import numpy as np

from longpack.errors import LongpackError
from longpack.jobs.plan import PlanConfig
from longpack.planner.calibration import evaluate, load_points
from longpack.planner.catalog import list_gpus, list_models, load_gpu, load_model
from longpack.planner.memory import estimate_memory, stage_counts_for
from longpack.planner.search import (
    SearchRequest,
    _options_for,
    enumerate_layouts,
    recompute_ladder,
    search,
)
from longpack.planner.timing import estimate_time


def brute_force_best(req: SearchRequest) -> tuple[str, float]:
    """Reference: every layout x every recompute setting x every offload level; fastest that fits."""
    best_label, best_time = "", float("inf")
    gbs = req.global_batch
    for plan in enumerate_layouts(req):
        counts = stage_counts_for(req.model, plan)
        for rec in recompute_ladder(req.model):
            for off in (0.0, 0.5, 1.0):
                opts = _options_for(req, plan, rec, off)
                mem = estimate_memory(
                    req.model, plan, seq_length=req.seq_length, gbs=gbs, options=opts, stage_counts=counts
                )
                if mem.total_gib > req.memory_budget_gib:
                    continue
                tim = estimate_time(
                    req.model,
                    req.gpu,
                    plan,
                    seq_length=req.seq_length,
                    gbs=gbs,
                    options=opts,
                    stage_counts=counts,
                )
                if tim.step_time < best_time:
                    best_label, best_time = plan.label, tim.step_time
    return best_label, best_time


def _cpu_seconds(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    print("== 1. search speed (one core, process time) ==")
    print(f"{'case':<44} {'layouts':>8} {'feasible':>9} {'median s':>9}  best")
    cases = [
        ("deepseek_v3", "H100", 1024, 131072, "fp8"),
        ("deepseek_v3", "H100", 512, 262144, "fp8"),
        ("qwen3_235b_a22b", "GB200", 128, 131072, "bf16"),
        ("kimi_k2", "GB300", 256, 65536, "mxfp8"),
    ]
    for model, gpu, n, s, prec in cases:
        req = SearchRequest(
            model=load_model(model), gpu=load_gpu(gpu), num_gpus=n, seq_length=s, precision=prec
        )
        secs, res = _cpu_seconds(lambda req=req: search(req, top_k=10), args.repeats)
        best = res.candidates[0] if res.candidates else None  # type: ignore[attr-defined]
        label = f"{best.plan.label} {best.time.tflops_per_gpu:.0f} TFLOP/s" if best else "-"
        print(
            f"{model + ' ' + str(n) + 'x' + gpu + ' s=' + str(s):<44} {res.layouts_considered:>8} "  # type: ignore[attr-defined]
            f"{res.layouts_feasible:>9} {secs:>9.2f}  {label}"  # type: ignore[attr-defined]
        )

    print(
        "\n== 1b. the plan job (search + reference + comparison), DeepSeek-V3 1,024 H100 128K FP8, top 10 =="
    )
    secs, _ = _cpu_seconds(
        lambda: PlanConfig(
            model="deepseek_v3", gpu="H100", gpus=1024, seq_length=131072, precision="fp8", top=10
        ).run(),
        args.repeats,
    )
    print(f"median {secs:.2f} s (target <= 3 s)")

    print("\n== 1c. every catalog model x GPU x length (256 GPUs), the plan job; slowest re-run ==")
    grid = []
    for model in list_models():
        for gpu in list_gpus():
            for s in (4096, 32768, 131072):
                precision = "fp8" if not load_gpu(gpu).is_blackwell else "mxfp8"

                def job(model=model, gpu=gpu, s=s, precision=precision):
                    try:
                        return PlanConfig(
                            model=model, gpu=gpu, gpus=256, seq_length=s, precision=precision, top=10
                        ).run()
                    except LongpackError:
                        return None

                t0 = time.process_time()
                job()
                grid.append((time.process_time() - t0, model, gpu, s, job))
    grid.sort(key=lambda r: -r[0])
    print(
        f"{len(grid)} cases, single runs: max {grid[0][0]:.2f} s, median {statistics.median(r[0] for r in grid):.2f} s"
    )
    for _, model, gpu, s, job in grid[:3]:
        secs, _ = _cpu_seconds(job, args.repeats)
        print(f"  {model} {gpu} s={s}: median {secs:.2f} s (target <= 10 s)")

    print("\n== 2. bisection search vs brute-force reference (same process) ==")
    req = SearchRequest(
        model=load_model("qwen3_235b_a22b"),
        gpu=load_gpu("H100"),
        num_gpus=128,
        seq_length=32768,
        precision="fp8",
    )
    fast_s, fast = _cpu_seconds(lambda: search(req, top_k=1), args.repeats)
    ref_s, ref = _cpu_seconds(lambda: brute_force_best(req), 1)
    fast_best = fast.candidates[0]  # type: ignore[attr-defined]
    print(f"search      : {fast_s:.2f} s  best {fast_best.plan.label} step {fast_best.time.step_time:.3f} s")
    print(f"brute force : {ref_s:.2f} s  best {ref[0]} step {ref[1]:.3f} s")  # type: ignore[index]
    print(
        f"speed-up {ref_s / fast_s:.1f}x; same best step time: {abs(fast_best.time.step_time - ref[1]) < 1e-9}"
    )  # type: ignore[index]

    print("\n== 3. calibration (predicted vs measured TFLOP/s/GPU) ==")
    points, skipped = load_points()
    summary = evaluate(points, skipped)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in summary.results:
        if r.tflops_error is not None:
            groups[(r.model, r.gpu)].append(r.tflops_error)
    print(f"{'model':<18} {'gpu':<9} {'n':>3} {'median err':>11} {'median |err|':>13}")
    for (model, gpu), errs in sorted(groups.items()):
        arr = np.asarray(errs)
        print(f"{model:<18} {gpu:<9} {len(arr):>3} {np.median(arr):>+11.1%} {np.median(np.abs(arr)):>13.1%}")
    print(
        f"overall TFLOP/s: n={summary.tflops_n} median APE {summary.tflops_median_ape:.1%} "
        f"p90 {summary.tflops_p90_ape:.1%}; memory: n={summary.memory_n} median APE "
        f"{summary.memory_median_ape:.1%} p90 {summary.memory_p90_ape:.1%}; skipped {len(skipped)}"
    )


if __name__ == "__main__":
    main()
