"""``longpack plan``: rank long-context MoE layouts; ``plan estimate`` one layout; ``plan evaluate`` /
``plan fit`` against published runs. Options from ``PlanConfig``, ``EstimateConfig``, ``EvaluateConfig`` and
``FitConfig``; this module prints their results."""

from __future__ import annotations

import math
import sys
from typing import Any

import typer

from longpack.cli.generate import add_command, add_group
from longpack.jobs import EstimateConfig, EvaluateConfig, FitConfig, PlanConfig
from longpack.jobs.plan import (
    candidate_dict,
    cp_mode_lines,
    format_band,
    format_with_band,
    plan_notes,
    reference_lines,
    rejection_lines,
    step_band,
)

__all__ = ["register"]

PLAN_HELP = "Plan a long-context MoE layout: memory and throughput estimates calibrated on published runs."


def present_plan(config: Any, result: Any) -> None:
    ref_row = None
    if result.reference is not None and result.comparison is not None:
        rank = result.comparison.reference_rank
        ref_row = (f"ref {rank}" if rank else "ref", result.reference.candidate)
    _print_candidates(
        result.search,
        result.request,
        reference=reference_lines(result),
        recommended=result.recommended,
        ref_row=ref_row,
    )
    if result.cp_modes is not None:
        for line in cp_mode_lines(result.cp_modes):
            typer.echo(line)
    if result.plot is not None:
        typer.echo(f"wrote {result.plot['path']}")


def _print_candidates(
    result: Any,
    req: Any,
    *,
    show_best: bool = True,
    reference: list[str] | None = None,
    recommended: Any = None,
    ref_row: tuple[str, Any] | None = None,
) -> None:
    from rich.console import Console
    from rich.table import Table

    band = step_band(req)
    dense = req.model.moe is None

    # wide enough for the layout labels when piped (rich falls back to 80 columns)
    console = Console(width=None if sys.stdout.isatty() else 180)
    gbs_note = " (default: 4M tokens/step)" if req.gbs_is_default else ""
    table = Table(
        title=(
            f"{req.model.name} on {req.num_gpus}x{req.gpu.name}, seq {req.seq_length}, GBS {req.global_batch}"
            f"{gbs_note}, {req.precision} — {result.layouts_feasible} of {result.layouts_considered} layouts fit "
            f"{req.memory_budget_gib:.0f} GiB with the +{req.memory_margin:.0%} memory band"
        )
    )
    for col in (
        "#",
        "layout",
        "recompute",
        "offload",
        "dispatch",
        "CP comm",
        "GiB",
        "step s",
        "TFLOP/s",
        "MFU",
        "tok/s/GPU",
    ):
        table.add_column(col, justify="right" if col not in ("layout", "recompute", "dispatch") else "left")
    rows = [(str(i), c) for i, c in enumerate(result.candidates, 1)]
    if ref_row is not None:
        rows.append(ref_row)
    for tag, c in rows:
        table.add_row(
            tag,
            c.plan.label,
            ",".join(c.options.recompute) or "-",
            f"{c.options.optimizer_offload:.0%}",
            "-" if dense else c.options.dispatcher + (" +ovl" if c.options.ep_overlap else ""),
            (c.options.cp_comm_type if c.plan.layout.cp > 1 else "-")
            + (" unmeasured" if c.unmeasured else ""),
            f"{c.memory.total_gib:.1f}",
            f"{c.time.step_time:.2f} {format_band(band)}",
            f"{c.time.tflops_per_gpu:.0f}",
            f"{c.time.mfu_vs_bf16_peak:.0%}",
            f"{c.time.tokens_per_s_per_gpu:.0f}",
        )
    console.print(table)
    for note in plan_notes(req):
        console.print(f"note: {note}", markup=False, highlight=False)
    for c in result.candidates:
        for what in c.unmeasured:
            console.print(f"unmeasured ({c.plan.label}): {what}", markup=False, highlight=False)
    for line in reference or []:
        console.print(line, markup=False, highlight=False)
    if not result.candidates:
        console.print("No layout fits. Why, by group of rejected layouts:", markup=False)
        for line in rejection_lines(result):
            console.print(f"  - {line}", markup=False, highlight=False)
        return
    if show_best:
        best = recommended if recommended is not None else result.candidates[0]
        d = candidate_dict(best, req)
        title = "Recommended" if recommended is not None else "Best"
        console.print(f"{title}: {best.plan.label}", markup=False, highlight=False)
        for reason in best.reasons:
            console.print(f"  - {reason}", markup=False, highlight=False)
        mem = d["memory"]
        console.print(
            f"  memory GiB (pipeline rank {mem['rank']}): "
            + ", ".join(f"{k[:-4]} {v}" for k, v in mem.items() if k.endswith("_gib")),
            markup=False,
            highlight=False,
        )
        tim = d["time"]
        console.print(
            "  time s/step: "
            + ", ".join(
                f"{k} {tim[k]:.3g}"
                for k in (
                    "compute",
                    "attention",
                    "recompute",
                    "overhead",
                    "tp_comm",
                    "cp_comm",
                    "ep_comm",
                    "dp_comm",
                    "bubble",
                    "offload",
                )
            ),
            markup=False,
            highlight=False,
        )
        _print_overrides(console, d)


def _print_overrides(console: Any, d: dict[str, Any]) -> None:
    console.print("Megatron-Bridge overrides (shell-quoted; paste after run_recipe.py ...):", markup=False)
    console.print(d["overrides_shell"], markup=False, highlight=False, soft_wrap=True)
    console.print("As YAML (longpack check FILE / --config-file):", markup=False)
    console.print(d["overrides_yaml"].rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    console.print("Python (on a recipe's cfg):", markup=False)
    console.print(d["overrides_python"], markup=False, highlight=False, soft_wrap=True)


def present_estimate(config: Any, result: Any) -> None:
    from rich.console import Console

    req, cand, d = result.request, result.candidate, result.doc
    m, g, gpus, seq_length = req.model, req.gpu, req.num_gpus, req.seq_length
    plan_layout = cand.plan
    gbs_note = " (default: 4M tokens/step)" if req.gbs_is_default else ""
    typer.echo(
        f"{m.name} on {gpus}x{g.name}, seq {seq_length}, GBS {req.global_batch}{gbs_note}: {plan_layout.label}"
    )
    typer.echo(
        f"fits: {'yes' if d['fits'] else 'NO'} ({cand.memory.total_gib:.1f} of {req.memory_budget_gib:.1f} GiB, "
        f"pipeline rank {cand.memory.rank})"
    )
    for k, v in d["memory"].items():
        typer.echo(f"  memory {k:>24}: {v}")
    for k, v in d["time"].items():
        if isinstance(v, dict):
            continue  # error_band_basis: printed below
        typer.echo(f"  time   {k:>24}: {v if isinstance(v, str) else format(v, '.6g')}")
    basis = d["time"]["error_band_basis"]
    typer.echo(
        f"step time {format_with_band(d['time']['step_time'], d['time']['error_band'])} (the band covers "
        f"{basis['coverage']:.0%} of the leave-one-model-out residuals of group {basis['group']}, n = {basis['n']})"
    )
    for what in cand.unmeasured:
        typer.echo(f"  unmeasured: {what}")
    for reason in cand.reasons:
        typer.echo(f"  - {reason}")
    _print_overrides(Console(width=None if sys.stdout.isatty() else 180), d)


def present_evaluate(config: Any, result: Any) -> None:
    summary, show_points = result.summary, config.points
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    lomo_by_id = {r.id: r for r in summary.lomo or ()}
    if show_points:
        table = Table(title="predicted vs measured")
        for col in (
            "id",
            "model",
            "gpu",
            "prec",
            "seq",
            "layout",
            "meas",
            "pred",
            "err",
            "LOMO err",
            "mem meas",
            "mem pred",
        ):
            table.add_column(col)
        for r in summary.results:
            lo = lomo_by_id.get(r.id)
            table.add_row(
                r.id,
                r.model,
                r.gpu,
                r.precision,
                str(r.seq_length),
                r.layout,
                f"{r.measured_tflops:.0f}" if r.measured_tflops else "-",
                f"{r.predicted_tflops:.0f}" if r.predicted_tflops else "-",
                f"{r.tflops_error:+.0%}" if r.tflops_error is not None else "-",
                f"{lo.tflops_error:+.0%}" if lo is not None and lo.tflops_error is not None else "-",
                f"{r.measured_memory_gib:.1f}" if r.measured_memory_gib else "-",
                f"{r.predicted_memory_gib:.1f} (rank {r.memory_rank})"
                if r.memory_error is not None and r.predicted_memory_gib
                else "-",
            )
        console.print(table)

    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{x:.1%}"

    bands = Table(
        title=(
            "Step-time error (measured / predicted - 1) by context band: median |error|, median signed, p90 |error|;"
            " LOSO = leave-one-source-out; LOSO anchored = the same estimates anchored on a published run of the same"
            " model and GPU from another source (n: points that have one); coverage = share of LOSO residuals inside the printed 80 % band built "
            "without their source (widened: the factor on the conformal 80 % quantile that makes it hold; unwidened: "
            "the coverage without it)"
        )
    )
    for col in (
        "band",
        "n",
        "in-sample median",
        "signed",
        "p90",
        "LOMO median",
        "LOSO median",
        "LOSO signed",
        "LOSO p90",
        "LOSO anchored (n)",
        "band (median)",
        "widened",
        "coverage",
        "unwidened",
    ):
        bands.add_column(col, justify="left" if col == "band" else "right")
    for band, st in summary.bands.items():
        lb = (summary.lomo_bands or {}).get(band)
        sb = (summary.loso_bands or {}).get(band)
        ab = (summary.loso_anchored_bands or {}).get(band)
        cov = (summary.coverage or {}).get(band)
        bands.add_row(
            band,
            str(st.n),
            pct(st.median_ape),
            pct(st.median_error),
            pct(st.p90_ape),
            pct(lb.median_ape) if lb else "-",
            pct(sb.median_ape) if sb else "-",
            pct(sb.median_error) if sb else "-",
            pct(sb.p90_ape) if sb else "-",
            f"{pct(ab.median_ape)} ({ab.n})" if ab and ab.n else "-",
            f"± {pct(cov['median_width'])}" if cov else "-",
            f"x{cov['level']:.2f}" if cov else "-",
            pct(cov["coverage"]) if cov else "-",
            pct(cov["coverage_at_plain_80"]) if cov else "-",
        )
    console.print(bands)
    console.print(
        f"TFLOP/s/GPU: n={summary.tflops_n} median APE {pct(summary.tflops_median_ape)} "
        f"p90 APE {pct(summary.tflops_p90_ape)}"
    )
    console.print(
        f"memory: n={summary.memory_n} median APE {pct(summary.memory_median_ape)} p90 APE {pct(summary.memory_p90_ape)}"
    )
    for r in summary.results:
        if r.memory_error is not None:
            console.print(
                f"  memory {r.id} {r.model} {r.gpu}: measured {r.measured_memory_gib:.1f} GiB, predicted "
                f"{r.predicted_memory_gib:.1f} GiB on pipeline rank {r.memory_rank} ({r.memory_error:+.1%})",
                markup=False,
                highlight=False,
            )
    console.print(
        f"skipped {len(summary.skipped)} points (model/GPU not in the catalogs, incomplete layout, or excluded)"
    )


def present_fit(config: Any, result: Any) -> None:
    summary = result.summary
    bands = ", ".join(f"{k} {v.median_ape:.1%} (n={v.n})" for k, v in summary.bands.items() if v.n)
    typer.echo(
        f"wrote {result.out}: loss {result.loss:.4f}; TFLOP/s median APE {summary.tflops_median_ape:.1%}, "
        f"p90 {summary.tflops_p90_ape:.1%} over {summary.tflops_n} points; by band: {bands}"
    )


def register(app: typer.Typer) -> None:
    plan = add_group(app, "plan", PlanConfig, present=present_plan, help=PLAN_HELP)
    add_command(plan, "estimate", EstimateConfig, present=present_estimate)
    add_command(plan, "evaluate", EvaluateConfig, present=present_evaluate)
    add_command(plan, "fit", FitConfig, present=present_fit)
