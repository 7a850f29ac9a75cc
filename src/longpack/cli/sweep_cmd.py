"""``longpack sweep``: choose the pack size at equal token slots per step (parse -> ``SweepConfig`` ->
run -> print)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from longpack.cli import options as opt


def _deprecated(old: str, new: str) -> None:
    typer.echo(f"warning: {old} is deprecated; use {new}", err=True)


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep_command(
        inputs: Annotated[
            list[str] | None,
            typer.Argument(metavar="[INPUT]...", help="JSONL / Parquet files, folders or globs."),
        ] = None,
        pack_size: str = typer.Option(
            "2048,4096,8192,16384",
            "--pack-size",
            help="Candidate pack sizes (packed_sequence_size = seq_length), comma-separated; 8k = 8192.",
        ),
        pack_lengths: str | None = typer.Option(None, "--pack-lengths", hidden=True),
        token_slots: int = typer.Option(
            65536,
            "--token-slots",
            help="packed_sequence_size x global_batch_size, equal for every candidate (GBS = slots / size).",
        ),
        tokenizer: opt.Tokenizer = None,
        pad_seq_to_mult: opt.PadSeqToMult = None,
        tp: opt.Tp = None,
        cp: opt.Cp = None,
        sp: opt.Sp = False,
        algorithm: opt.AlgorithmOpt = "best_fit_decreasing",
        seed: opt.Seed = 0,
        overlength: Annotated[
            opt.Overlength, typer.Option("--overlength", help="Samples longer than a pack.")
        ] = "drop",
        workers: opt.Workers = None,
        fmt: opt.Format = "auto",
        prompt_key: opt.PromptKey = "prompt",
        completion_key: opt.CompletionKey = "completion",
        prompt_template: opt.PromptTemplate = "{prompt}",
        separator: opt.Separator = "",
        prompt_completion_loss: opt.PromptCompletionLoss = "completion",
        chat_loss: opt.ChatLoss = "assistant",
        messages_key: opt.MessagesKey = "messages",
        tools_key: opt.ToolsKey = "tools",
        skip_malformed: opt.SkipMalformed = False,
        model: opt.ModelId = None,
        gpu: opt.Gpu = None,
        gpus: opt.Gpus = None,
        layout: str | None = typer.Option(
            None, "--layout", help="Pin the layout, e.g. 'tp=2,cp=1,pp=2,ep=8' (SP on when TP > 1)."
        ),
        precision: Annotated[opt.Precision, typer.Option("--precision", help="Training precision.")] = "bf16",
        headroom: float = typer.Option(
            0.95, "--headroom", help="Fraction of usable GPU memory a layout may use."
        ),
        recompute: str | None = typer.Option(
            None,
            "--recompute",
            help="Pin recompute modules ('none', 'layernorm,mlp', 'full'; default: cheapest that fits).",
        ),
        offload: bool = typer.Option(True, "--offload/--no-offload", help="Allow optimizer CPU offload."),
        as_json: opt.Json = False,
        plot: str | None = typer.Option(
            None, "--plot", help="Write a PNG: real tokens/s, memory and truncation vs pack size."
        ),
        demo: bool = typer.Option(
            False, "--demo", help="Sweep the built-in demo SFT data (default --tokenizer qwen3)."
        ),
        bridge_version: opt.BridgeVersion = None,
        megatron_core_version: opt.McoreVersion = None,
    ) -> None:
        """Pack at every candidate size with equal token slots per step; compare counts, fill, batch
        rules and (with --model/--gpu/--gpus) memory and real tokens/s; recommend a pack size."""
        from longpack.cli.pack_cmd import text_config
        from longpack.errors import ConfigError
        from longpack.jobs.sweep import SweepConfig

        if pack_lengths is not None:
            _deprecated("--pack-lengths", "--pack-size")
            pack_size = pack_lengths
        if plot is not None and not Path(plot).parent.is_dir():
            raise ConfigError(f"plot {plot}: folder {Path(plot).parent} does not exist", fields="plot")
        config = SweepConfig(
            inputs=list(inputs or []),
            tokenizer=tokenizer,
            demo=demo,
            pack_lengths=pack_size,
            token_slots=token_slots,
            pad_seq_to_mult=pad_seq_to_mult,
            tp=tp,
            cp=cp,
            sp=sp,
            layout=layout,
            algorithm=algorithm,
            seed=seed,
            overlength=overlength,
            text=text_config(
                fmt=fmt,
                prompt_key=prompt_key,
                completion_key=completion_key,
                prompt_template=prompt_template,
                separator=separator,
                prompt_completion_loss=prompt_completion_loss,
                chat_loss=chat_loss,
                messages_key=messages_key,
                tools_key=tools_key,
                skip_malformed=skip_malformed,
            ),
            workers=workers,
            model=model,
            gpu=gpu,
            gpus=gpus,
            precision=precision,
            headroom=headroom,
            recompute=recompute,
            offload=offload,
            progress=not as_json and sys.stderr.isatty(),
            bridge_version=bridge_version,
            megatron_core_version=megatron_core_version,
        )
        result = config.run()
        doc = result.as_dict()
        if plot is not None:
            _plot(result, Path(plot), title=_title(doc))
            doc["plot"] = str(plot)
        if as_json:
            typer.echo(json.dumps(doc, indent=2))
        else:
            _print_human(result, doc)
        if config.planner is not None and result.recommendation is None:
            raise typer.Exit(1)


def _title(doc: dict[str, Any]) -> str:
    slots = doc["settings"]["token_slots"]
    where = f", {doc['model']} on {doc['gpus']}x{doc['gpu']}" if doc["model"] else ""
    return f"pack-length sweep at {slots:,} token slots per step{where}"


def _print_human(result: Any, doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from longpack.jobs.sweep import nice_int

    console = Console(width=None if sys.stdout.isatty() else 150)
    inp = doc["input"]
    s = doc["settings"]
    console.print(
        f"{result.read} samples ({inp['format']}, tokenizer {inp['tokenizer']}); pad_seq_to_mult "
        f"{s['pad_seq_to_mult']} ({opt.cli_message(doc['pad_seq_to_mult_source'], opt.MULT_FIELDS)}); algorithm {s['algorithm']}, overlength "
        f"{s['overlength']}, seed {s['seed']}",
        markup=False,
        highlight=False,
    )
    planner = doc["model"] is not None
    table = Table(title=_title(doc))
    cols = ["pack", "GBS", "kept", "trunc (tok lost)", "dropped (tok)", "packs", "fill", "real fill"]
    cols += ["steps/ep", "ΣL²/step", "ΣL/step", "DP", "batch rules"]
    for col in cols:
        table.add_column(col, justify="left" if col == "batch rules" else "right")
    for c in result.candidates:
        rules = (
            "-"
            if c.batch_rules is None
            else ("ok" if not c.batch_rules else ",".join(f["id"] for f in c.batch_rules))
        )
        table.add_row(
            str(c.pack_length),
            str(c.gbs),
            str(c.kept),
            f"{c.truncated} ({c.truncated_tokens_lost:,})",
            f"{c.dropped} ({c.dropped_tokens:,})",
            str(c.packs),
            f"{c.fill:.1%}",
            f"{c.real_fill:.1%}",
            f"{c.steps_per_epoch}" + (f" +{c.leftover_packs}p" if c.leftover_packs else ""),
            nice_int(c.attention_work_per_step),
            nice_int(c.linear_work_per_step),
            "-" if c.dp is None else str(c.dp),
            rules,
        )
    console.print(table)
    if planner:
        est_table = Table(title=f"planner: {doc['model']} on {doc['gpus']}x{doc['gpu']}, MBS 1")
        for col in (
            "pack",
            "GBS",
            "layout",
            "recompute",
            "GiB/GPU",
            "step s",
            "real tok/s",
            "per GPU",
            "fits",
        ):
            est_table.add_column(col, justify="left" if col in ("layout", "recompute", "fits") else "right")
        for c in result.candidates:
            e = c.estimate
            est_table.add_row(
                str(c.pack_length),
                str(c.gbs),
                _short_label(e.layout),
                (",".join(e.recompute) or "-")
                + (f" +offload {e.optimizer_offload:.0%}" if e.optimizer_offload else "")
                if e.fits
                else "-",
                "-" if e.memory_gib is None else f"{e.memory_gib:.1f}",
                "-" if e.step_time_s is None else f"{e.step_time_s:.3f}",
                "-" if e.real_tokens_per_s is None else f"{e.real_tokens_per_s:,.0f}",
                "-" if e.real_tokens_per_s_per_gpu is None else f"{e.real_tokens_per_s_per_gpu:,.0f}",
                "yes" if c.ok else "NO",
            )
        console.print(est_table)
    console.print(
        "steps/ep: full optimizer steps per epoch (+N packs left over); ΣL²/step, ΣL/step: attention and linear "
        "work per step over the packed samples' runtime lengths",
        markup=False,
        highlight=False,
    )
    for c in result.candidates:
        for p in c.problems:
            console.print(f"  {c.pack_length}: {p}", markup=False, highlight=False)
    rec = result.recommendation
    if rec is not None:
        console.print(f"Recommendation: pack length {rec.pack_length}, GBS {rec.gbs}", markup=False)
        console.print(f"  {rec.reason}", markup=False, highlight=False)
        console.print(
            f"  Megatron-Bridge: dataset.offline_packing_specs.packed_sequence_size={rec.pack_length} "
            f"model.seq_length={rec.pack_length} dataset.seq_length={rec.pack_length} "
            f"train.global_batch_size={rec.gbs} train.micro_batch_size=1",
            markup=False,
            highlight=False,
        )
    elif planner:
        console.print("No candidate fits: see the problems above.", markup=False)
    else:
        console.print(
            "Give --model, --gpu and --gpus for memory, real tokens/s and a recommendation.", markup=False
        )
    console.print(f"Warning: {result.warning}.", markup=False, highlight=False)
    if "plot" in doc:
        console.print(f"wrote {doc['plot']}", markup=False, highlight=False)


def _short_label(label: str | None) -> str:
    """``TP1 CP1 EP1 ETP1 PP2 VPP16 DP4 EDP4 MBS1`` -> ``PP2 VPP16 DP4`` (size-1 axes and MBS1 left out)."""
    if not label:
        return "-"
    parts = [p for p in label.split() if not (p.endswith("P1") and p[:-1].isalpha()) and p != "MBS1"]
    if not any(p.startswith("EP") for p in parts):
        parts = [p for p in parts if not p.startswith("EDP")]
    return " ".join(parts) or "DP1"


def _plot(result: Any, path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from longpack.cli.plan_cmd import write_png_atomic

    cands = result.candidates
    xs = [c.pack_length for c in cands]
    planner = any(c.estimate is not None for c in cands)
    panels = 3 if planner else 1
    fig, axes = plt.subplots(panels, 1, figsize=(7, 2.6 * panels + 0.6), sharex=True, squeeze=False)
    ax_list = [a[0] for a in axes]
    if planner:
        fitting = [(c.pack_length, c.estimate.real_tokens_per_s) for c in cands if c.ok]
        ax = ax_list[0]
        ax.plot([x for x, _ in fitting], [y / 1e3 for _, y in fitting], "o-", color="tab:blue")
        rec = result.recommendation
        if rec is not None:
            best = next(c for c in cands if c.pack_length == rec.pack_length)
            ax.plot(
                [rec.pack_length], [best.estimate.real_tokens_per_s / 1e3], "*", ms=14, color="tab:orange"
            )
        for c in cands:
            if not c.ok:
                ax.axvline(c.pack_length, color="tab:red", ls=":", lw=1)
        ax.set_ylabel("real K tokens/s")
        ax = ax_list[1]
        mem = [(c.pack_length, c.estimate.memory_gib) for c in cands if c.estimate.memory_gib is not None]
        ax.plot([x for x, _ in mem], [y for _, y in mem], "s-", color="tab:purple")
        budget = max(c.estimate.memory_budget_gib for c in cands)
        ax.axhline(budget, color="tab:red", ls="--", lw=1, label=f"budget {budget:.0f} GiB")
        over = [
            (c.pack_length, c.estimate.memory_gib)
            for c in cands
            if not c.estimate.fits and c.estimate.memory_gib
        ]
        if over:
            ax.plot(
                [x for x, _ in over], [y for _, y in over], "x", ms=10, color="tab:red", label="does not fit"
            )
        for c in cands:
            if c.estimate.memory_gib is None:
                ax.axvline(c.pack_length, color="tab:red", ls=":", lw=1)
        ax.set_ylabel("GiB per GPU")
        ax.legend(loc="lower right", fontsize=8)
    ax = ax_list[-1]
    ax.plot(
        xs, [100 * (c.truncated + c.dropped) / max(c.read, 1) for c in cands], "o-", label="samples cut (%)"
    )
    lost = [
        100
        * (c.truncated_tokens_lost + c.dropped_tokens)
        / max(c.real_tokens + c.truncated_tokens_lost + c.dropped_tokens, 1)
        for c in cands
    ]
    ax.plot(xs, lost, "s--", label="tokens lost (%)")
    ax.set_ylabel("truncated + dropped (%)")
    ax.legend(fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("pack length (tokens); GBS = token slots / pack length")
    ax_list[0].set_title(title, fontsize=10)
    fig.tight_layout()
    try:
        write_png_atomic(fig, path)
    finally:
        plt.close(fig)
