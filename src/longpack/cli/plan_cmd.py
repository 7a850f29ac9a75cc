"""``longpack plan``: rank long-context MoE layouts; ``plan estimate`` one layout; ``plan evaluate`` /
``plan fit`` against published runs."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from longpack.cli import options as opt
from longpack.jobs.plan import candidate_dict, parse_layout
from longpack.planner.catalog import list_gpus, list_models, load_gpu, load_model
from longpack.planner.options import TrainingOptions, normalize_recompute

__all__ = ["parse_layout", "plan_app", "plot_figure", "register", "write_png_atomic"]

plan_app = typer.Typer(
    name="plan",
    help="Plan a long-context MoE layout: memory and throughput estimates calibrated on published runs.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def _print_candidates(result: Any, req: Any, *, show_best: bool = True) -> None:
    from rich.console import Console
    from rich.table import Table

    from longpack.jobs.plan import plan_notes, rejection_lines

    # wide enough for the layout labels when piped (rich falls back to 80 columns)
    console = Console(width=None if sys.stdout.isatty() else 180)
    gbs_note = " (default: 4M tokens/step)" if req.gbs_is_default else ""
    table = Table(
        title=(
            f"{req.model.name} on {req.num_gpus}x{req.gpu.name}, seq {req.seq_length}, GBS {req.global_batch}"
            f"{gbs_note}, {req.precision} — {result.layouts_feasible} of {result.layouts_considered} layouts fit "
            f"{req.memory_budget_gib:.0f} GiB"
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
    for i, c in enumerate(result.candidates, 1):
        table.add_row(
            str(i),
            c.plan.label,
            ",".join(c.options.recompute) or "-",
            f"{c.options.optimizer_offload:.0%}",
            c.options.dispatcher + (" +ovl" if c.options.ep_overlap else ""),
            c.options.cp_comm_type if c.plan.layout.cp > 1 else "-",
            f"{c.memory.total_gib:.1f}",
            f"{c.time.step_time:.2f}",
            f"{c.time.tflops_per_gpu:.0f}",
            f"{c.time.mfu_vs_bf16_peak:.0%}",
            f"{c.time.tokens_per_s_per_gpu:.0f}",
        )
    console.print(table)
    for note in plan_notes(req):
        console.print(f"note: {note}", markup=False, highlight=False)
    if not result.candidates:
        console.print("No layout fits. Why, by group of rejected layouts:", markup=False)
        for line in rejection_lines(result):
            console.print(f"  - {line}", markup=False, highlight=False)
        return
    if show_best:
        best = result.candidates[0]
        d = candidate_dict(best, req)
        console.print(f"Best: {best.plan.label}", markup=False, highlight=False)
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


def write_png_atomic(fig: Any, path: Path) -> None:
    """Save a matplotlib figure as a PNG atomically (temp file, fsync, rename), without a timestamp."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, metadata={"Software": None})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plot_figure(rows: list[dict[str, Any]], budget_gib: float, title: str) -> Any:
    """The ``--plot`` figure: TFLOP/s/GPU (top) and memory (bottom, from zero, with the budget line) of
    the best layout per sequence length, each point labelled with its layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    xs = [r["seq_length"] for r in rows]
    ys = [r["tflops"] for r in rows]
    ax1.plot(xs, ys, "o-", color="tab:blue")
    for r in rows:
        ax1.annotate(
            r["short_label"],
            (r["seq_length"], r["tflops"]),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
        )
    ax1.set_ylabel("TFLOP/s/GPU (best layout)")
    ax1.set_ylim(0, max([*ys, 1.0]) * 1.25)
    mems = [r["memory_gib"] for r in rows]
    ax2.plot(xs, mems, "s-", color="tab:red", label="estimated peak (most loaded rank)")
    ax2.axhline(budget_gib, color="black", linestyle="--", linewidth=1, label=f"budget {budget_gib:.0f} GiB")
    ax2.set_ylim(0, max([*mems, budget_gib]) * 1.15)
    ax2.set_ylabel("GiB per GPU")
    ax2.legend(loc="lower right", fontsize=8)
    if xs:
        ax2.set_xscale("log", base=2)
        ax2.set_xticks(xs, [f"{x // 1024}K" for x in xs])
    ax2.set_xlabel("sequence length")
    ax1.set_title(title)
    fig.tight_layout()
    return fig


def _plot(req_kwargs: dict[str, Any], seq_length: int, path: Path) -> list[dict[str, Any]]:
    """TFLOP/s/GPU and memory of the best layout at 4K, 8K, ... up to ``seq_length``: memory axis from
    zero with the budget line, each point labelled with its layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from longpack.planner.search import SearchRequest, search

    lengths = []
    s = 4096
    while s <= seq_length:
        lengths.append(s)
        s *= 2
    if not lengths or lengths[-1] != seq_length:
        lengths.append(seq_length)
    rows: list[dict[str, Any]] = []
    budget = 0.0
    for s in lengths:
        req = SearchRequest(**{**req_kwargs, "seq_length": s})
        budget = req.memory_budget_gib
        res = search(req, top_k=1)
        if res.candidates:
            c = res.candidates[0]
            lay = c.plan.layout
            rows.append(
                {
                    "seq_length": s,
                    "layout": c.plan.label,
                    "short_label": f"TP{lay.tp} CP{lay.cp} EP{lay.ep} PP{lay.pp}",
                    "tflops": c.time.tflops_per_gpu,
                    "memory_gib": c.memory.total_gib,
                    "memory_rank": c.memory.rank,
                }
            )
    fig = plot_figure(
        rows, budget, f"{req_kwargs['model'].name} on {req_kwargs['num_gpus']}x{req_kwargs['gpu'].name}"
    )
    write_png_atomic(fig, path)
    plt.close(fig)
    return rows


@plan_app.callback()
def plan(
    ctx: typer.Context,
    model: str | None = typer.Option(
        None, "--model", help=f"Model: a catalog id ({', '.join(list_models())}) or a config.json path."
    ),
    gpu: str | None = typer.Option(None, "--gpu", help=f"GPU type ({', '.join(list_gpus())})."),
    gpus: opt.Gpus = None,
    seq_length: int | None = typer.Option(
        None, "--seq-length", help="Sequence length (tokens per packed row)."
    ),
    gbs: int | None = typer.Option(
        None, "--gbs", help="Global batch size in sequences (default: 4M tokens per step, a power of two)."
    ),
    precision: Annotated[
        opt.Precision, typer.Option("--precision", help="Training precision (fp8: Hopper blockwise).")
    ] = "bf16",
    top: int = typer.Option(10, "--top", help="Show the best K layouts."),
    bridge_version: opt.BridgeVersion = None,
    megatron_core_version: opt.McoreVersion = None,
    headroom: float = typer.Option(
        0.95, "--headroom", help="Fraction of usable GPU memory a layout may use."
    ),
    dispatcher: Annotated[
        opt.Dispatcher | None, typer.Option("--dispatcher", help="MoE token dispatcher (default by GPU).")
    ] = None,
    recompute: str | None = typer.Option(
        None, "--recompute", help="Pin recompute modules, e.g. 'moe_act,layernorm' or 'full'."
    ),
    offload: bool = typer.Option(True, "--offload/--no-offload", help="Allow optimizer CPU offload."),
    optimizer: Annotated[
        opt.Optimizer, typer.Option("--optimizer", help="adam_bf16_states: precision-aware Adam.")
    ] = "adam",
    imbalance: float = typer.Option(
        1.0, "--imbalance", help="Routing imbalance on the hot expert rank (1.0 = balanced)."
    ),
    tp: int | None = typer.Option(None, "--tp", help="Pin TP."),
    cp: int | None = typer.Option(None, "--cp", help="Pin CP."),
    pp: int | None = typer.Option(None, "--pp", help="Pin PP."),
    ep: int | None = typer.Option(None, "--ep", help="Pin EP."),
    mbs: int | None = typer.Option(None, "--mbs", help="Pin the micro-batch size."),
    as_json: opt.Json = False,
    plot: str | None = typer.Option(
        None, "--plot", help="Write a PNG of TFLOP/s and memory vs sequence length."
    ),
) -> None:
    """Rank every layout that fits by estimated step time and print Megatron-Bridge overrides."""
    if ctx.invoked_subcommand is not None:
        return
    from longpack.errors import ConfigError
    from longpack.jobs.plan import PlanConfig

    missing = [
        n
        for n, v in (("model", model), ("gpu", gpu), ("gpus", gpus), ("seq_length", seq_length))
        if v is None
    ]
    if missing:
        raise ConfigError(
            f"missing {', '.join(missing)}; e.g. longpack plan --model deepseek_v3 --gpu H100 --gpus 256 "
            "--seq-length 131072",
            fields=tuple(missing),
        )
    assert model is not None and gpu is not None and gpus is not None and seq_length is not None
    config = PlanConfig(
        model=model,
        gpu=gpu,
        gpus=gpus,
        seq_length=seq_length,
        gbs=gbs,
        precision=precision,
        headroom=headroom,
        dispatcher=dispatcher,
        recompute=recompute,
        offload=offload,
        optimizer=optimizer,
        imbalance=imbalance,
        tp=tp,
        cp=cp,
        pp=pp,
        ep=ep,
        mbs=mbs,
        top=top,
        bridge_version=bridge_version,
        megatron_core_version=megatron_core_version,
    )
    if plot is not None:
        from longpack.outputs import check_output_file

        check_output_file(plot, field="plot")  # before the search
    result = config.run()
    req = result.request
    plot_rows = _plot(config.request_kwargs(), seq_length, Path(plot)) if plot is not None else None
    if as_json:
        doc = result.to_dict()
        if plot_rows is not None:
            doc["plot"] = {"path": str(plot), "points": plot_rows}
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print_candidates(result.search, req)
        if plot is not None:
            typer.echo(f"wrote {plot}")
    if not result.ok:
        raise typer.Exit(1)


@plan_app.command("estimate")
def estimate(
    model: str = typer.Option(..., "--model", help="Model: a catalog id or a config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU type."),
    gpus: int = typer.Option(..., "--gpus", help="Number of GPUs."),
    seq_length: int = typer.Option(..., "--seq-length", help="Sequence length (tokens per packed row)."),
    layout: str = typer.Option(..., "--layout", help="e.g. 'tp=1,cp=32,ep=32,pp=8,vpp=4,mbs=1'"),
    gbs: int | None = typer.Option(None, "--gbs", help="Global batch size in sequences."),
    precision: Annotated[opt.Precision, typer.Option("--precision", help="Training precision.")] = "bf16",
    recompute: str = typer.Option("", "--recompute", help="e.g. 'mla_up_proj,layernorm,moe,mlp' or 'full'."),
    offload: float = typer.Option(0.0, "--offload", help="Optimizer CPU offload fraction 0..1."),
    dispatcher: Annotated[
        opt.Dispatcher | None, typer.Option("--dispatcher", help="MoE token dispatcher (default by GPU).")
    ] = None,
    optimizer: Annotated[opt.Optimizer, typer.Option("--optimizer", help="Optimizer.")] = "adam",
    cp_comm_type: Annotated[
        Literal["auto", "p2p", "a2a", "a2a+p2p", "allgather"],
        typer.Option("--cp-comm-type", help="CP communication (auto: the fastest the layout allows)."),
    ] = "auto",
    tp_comm_overlap: bool = typer.Option(
        True, "--tp-comm-overlap/--no-tp-comm-overlap", help="TP communication overlapped with GEMMs."
    ),
    ep_overlap: bool | None = typer.Option(
        None, "--ep-overlap/--no-ep-overlap", help="Default: on where allowed."
    ),
    imbalance: float = typer.Option(1.0, "--imbalance", help="Routing imbalance on the hot expert rank."),
    headroom: float = typer.Option(
        0.95, "--headroom", help="Fraction of usable GPU memory a layout may use."
    ),
    as_json: opt.Json = False,
) -> None:
    """Memory and time of one given layout."""
    from longpack.planner.search import SearchRequest, default_dispatcher, evaluate_layout
    from longpack.planner.timing import best_cp_comm_type

    m, g = load_model(model), load_gpu(gpu)
    plan_layout, _ = parse_layout(layout, world_size=gpus)
    req = SearchRequest(
        model=m,
        gpu=g,
        num_gpus=gpus,
        seq_length=seq_length,
        gbs=gbs,
        precision=precision.lower(),
        headroom=headroom,
    )
    rec = normalize_recompute(recompute)
    lay = plan_layout.layout
    overlap_ok = (
        m.moe is not None
        and lay.ep > 1
        and (lay.pp == 1 or plan_layout.vpp > 1)
        and "moe" not in rec
        and rec != ("full",)
    )
    opts = TrainingOptions(
        precision=precision.lower(),
        recompute=rec,
        optimizer_offload=offload,
        dispatcher=dispatcher or default_dispatcher(g, lay.ep * lay.expert_tp),
        optimizer=optimizer,
        ep_overlap=overlap_ok if ep_overlap is None else ep_overlap,
        cp_comm_type=best_cp_comm_type(m, g, plan_layout, seq_length=seq_length)
        if cp_comm_type == "auto"
        else cp_comm_type,
        imbalance=imbalance,
        tp_comm_overlap=tp_comm_overlap and lay.tp > 1,
    )
    cand = evaluate_layout(req, plan_layout, opts)
    d = candidate_dict(cand, req)
    d["fits"] = cand.memory.total_gib <= req.memory_budget_gib
    d["memory_budget_gib"] = round(req.memory_budget_gib, 3)
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    from rich.console import Console

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
        typer.echo(f"  time   {k:>24}: {v if isinstance(v, str) else format(v, '.6g')}")
    for reason in cand.reasons:
        typer.echo(f"  - {reason}")
    _print_overrides(Console(width=None if sys.stdout.isatty() else 180), d)


@plan_app.command("evaluate")
def evaluate_cmd(
    calibration: str | None = typer.Option(
        None, "--calibration", help="Calibration YAML (default: the packaged file)."
    ),
    as_json: opt.Json = False,
    show_points: bool = typer.Option(False, "--points", help="List every point."),
    lomo: bool = typer.Option(
        True,
        "--lomo/--no-lomo",
        help="Also refit without each model and predict its points (leave-one-model-out; ~1 min).",
    ),
    lomo_rounds: int = typer.Option(3, "--lomo-rounds", help="Coordinate-search rounds of each LOMO refit."),
) -> None:
    """Predicted vs measured TFLOP/s/GPU (and memory): median / p90 absolute percentage error overall and
    by context band (<=8K, 16-32K, 64K+), in-sample and leave-one-model-out."""
    from longpack.planner.calibration import evaluate

    if lomo_rounds < 1:
        from longpack.errors import ConfigError

        raise ConfigError(f"lomo-rounds must be a positive integer, got {lomo_rounds}", fields="lomo_rounds")
    points, skipped = _load_points(calibration)
    summary = evaluate(points, skipped, lomo=lomo, lomo_rounds=lomo_rounds)
    if as_json:
        typer.echo(json.dumps(summary.as_dict(), indent=2, default=float))
        return
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
        title="TFLOP/s/GPU error by context band (median |error|, median signed error, p90 |error|)"
    )
    for col in ("band", "n", "in-sample median", "signed", "p90", "LOMO median", "LOMO signed", "LOMO p90"):
        bands.add_column(col, justify="left" if col == "band" else "right")
    for band, st in summary.bands.items():
        lb = (summary.lomo_bands or {}).get(band)
        bands.add_row(
            band,
            str(st.n),
            pct(st.median_ape),
            pct(st.median_error),
            pct(st.p90_ape),
            pct(lb.median_ape) if lb else "-",
            pct(lb.median_error) if lb else "-",
            pct(lb.p90_ape) if lb else "-",
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


@plan_app.command("fit")
def fit_cmd(
    calibration: str | None = typer.Option(
        None, "--calibration", help="Calibration YAML (default: the packaged file)."
    ),
    out: str = typer.Option(..., "--out", help="Where to write the fitted constants (YAML)."),
    rounds: int = typer.Option(8, "--rounds", help="Coordinate-search rounds (the shipped fit used 8)."),
) -> None:
    """Refit the time model's free constants on a calibration file and write them as YAML."""
    from longpack.outputs import check_output_file
    from longpack.planner.calibration import evaluate, fit_params, write_fit
    from longpack.validate import non_negative_int

    check_output_file(out, field="out")  # before the fit
    non_negative_int(rounds, "rounds")
    points, skipped = _load_points(calibration)
    params, loss = fit_params(points, rounds=rounds)
    write_fit(params, out, loss=loss, source=str(calibration or "calibration_points.yaml"))
    summary = evaluate(points, skipped, params=params)
    bands = ", ".join(f"{k} {v.median_ape:.1%} (n={v.n})" for k, v in summary.bands.items() if v.n)
    typer.echo(
        f"wrote {out}: loss {loss:.4f}; TFLOP/s median APE {summary.tflops_median_ape:.1%}, "
        f"p90 {summary.tflops_p90_ape:.1%} over {summary.tflops_n} points; by band: {bands}"
    )


def _load_points(calibration: str | None) -> Any:
    from longpack.errors import ConfigError, LongpackError
    from longpack.planner.calibration import load_points

    try:
        return load_points(calibration)
    except LongpackError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc), fields="calibration") from exc


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app, name="plan")
