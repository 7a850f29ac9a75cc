"""``longpack sweep``: choose the pack size at equal token slots per step; its options are ``SweepConfig``'s
fields (``longpack.cli.generate``); this module prints the result."""

from __future__ import annotations

import sys
from typing import Any

import typer

from longpack.cli import options as opt
from longpack.cli.generate import add_command
from longpack.jobs import SweepConfig
from longpack.jobs.sweep import MODE_NAMES, nice_int


def register(app: typer.Typer) -> None:
    add_command(
        app,
        "sweep",
        SweepConfig,
        present=lambda config, result: _print_human(result, result.to_dict()),
    )


def _print_human(result: Any, doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

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
    table = Table(title=result.title)
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
                "-"
                if e.step_time_s is None
                else f"{e.step_time_s:.3f}" + (f" ± {e.error_band * 100:.0f} %" if e.error_band else ""),
                "-" if e.real_tokens_per_s is None else f"{e.real_tokens_per_s:,.0f}",
                "-" if e.real_tokens_per_s_per_gpu is None else f"{e.real_tokens_per_s_per_gpu:,.0f}",
                # the memory verdict; a candidate that fits but cannot run (too few packs for one step,
                # a batch rule) says so, and why is listed below the tables
                ("yes" if c.ok else "yes, see below") if e.fits else "NO",
            )
        console.print(est_table)
    if any(c.cp_modes is not None for c in result.candidates):
        console.print(_cp_modes_table(result, doc))
    console.print(
        "steps/ep: full optimizer steps per epoch (+N packs left over); ΣL²/step, ΣL/step: attention and linear "
        "work per step over the packed samples' runtime lengths",
        markup=False,
        highlight=False,
    )
    for c in result.candidates:
        for p in c.problems:
            console.print(f"  {c.pack_length}: {p}", markup=False, highlight=False)
        notes = {cell.note for cell in c.cp_modes.cells if cell.note} if c.cp_modes is not None else set()
        for note in sorted(notes):
            console.print(f"  {c.pack_length}: CP modes: {note}", markup=False, highlight=False)
    rec = result.recommendation
    if rec is not None:
        console.print(f"Recommendation: pack length {rec.pack_length}, GBS {rec.gbs}", markup=False)
        console.print(f"  {rec.reason}", markup=False, highlight=False)
        # one line whatever the console width: pasted, a wrapped line would run its second half as a command
        console.print(
            f"  Megatron-Bridge: {' '.join(rec.bridge_overrides())}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        for line in rec.mode_advice():
            console.print(f"  {line}", markup=False, highlight=False)
    elif planner:
        console.print("No pack length can be recommended: see the problems above.", markup=False)
    else:
        console.print(
            "Give --model, --gpu and --gpus for memory, real tokens/s and a recommendation.", markup=False
        )
    from longpack.cli.options import cli_message

    for note in result.notes:
        console.print(f"Note: {cli_message(note, ('token_slots',))}.", markup=False, highlight=False)
    console.print(f"Warning: {result.warning}.", markup=False, highlight=False)
    if "plot" in doc:
        console.print(f"wrote {doc['plot']}", markup=False, highlight=False)


def _cp_modes_table(result: Any, doc: dict[str, Any]) -> Any:
    """Pack length x CP mode: step time with its band, speed-up over static CP, rank imbalance, real
    tokens/s; the mode each pack length would run (``*``: static unless a gain is outside the band)."""
    from rich.table import Table

    table = Table(title=f"CP modes: {doc['model']} on {doc['gpus']}x{doc['gpu']}, same global batches")
    for col in (
        "pack",
        "layout",
        "mode",
        "max seqlen/rank",
        "step s",
        "vs static",
        "imbalance",
        "real tok/s",
        "pick",
    ):
        table.add_column(col, justify="left" if col in ("layout", "mode", "pick") else "right")
    for c in result.candidates:
        modes = c.cp_modes
        if modes is None:
            continue
        band = f" ± {modes.error_band * 100:.0f} %" if modes.error_band else ""
        for i, cell in enumerate(modes.cells):
            table.add_row(
                str(c.pack_length) if i == 0 else "",
                _short_label(c.estimate.layout) if i == 0 else "",
                MODE_NAMES[cell.mode],
                "-" if cell.max_seqlen_per_dp_cp_rank is None else str(cell.max_seqlen_per_dp_cp_rank),
                "-" if cell.step_time_s is None else f"{cell.step_time_s:.3f}{band}",
                "-" if cell.speedup is None else f"{cell.speedup:.2f}x",
                "-" if cell.rank_imbalance is None else f"{cell.rank_imbalance:.2f}",
                "-" if cell.real_tokens_per_s is None else f"{cell.real_tokens_per_s:,.0f}",
                "*" if cell.mode == modes.recommended else "",
            )
    return table


def _short_label(label: str | None) -> str:
    """``TP1 CP1 EP1 ETP1 PP2 VPP16 DP4 EDP4 MBS1`` -> ``PP2 VPP16 DP4`` (size-1 axes and MBS1 left out)."""
    if not label:
        return "-"
    parts = [p for p in label.split() if not (p.endswith("P1") and p[:-1].isalpha()) and p != "MBS1"]
    if not any(p.startswith("EP") for p in parts):
        parts = [p for p in parts if not p.startswith("EDP")]
    return " ".join(parts) or "DP1"
