"""``longpack inspect``: summary, histograms and verification of a packed output folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect(
        folder: Annotated[Path, typer.Argument(help="Output folder of `longpack pack`.")],
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        verify: bool = typer.Option(
            False,
            "--verify",
            help="Check every row (Megatron-Bridge validate_row, alignment, pack size) and the "
            "manifest against the files (hashes, counts, metadata).",
        ),
        plot: Annotated[
            Path | None, typer.Option("--plot", help="Save length and fill histograms as a PNG.")
        ] = None,
        no_manifest_ok: bool = typer.Option(
            False,
            "--no-manifest-ok",
            help="A folder without manifest.json is Megatron-Bridge's (its prepare step writes none), not unfinished.",
        ),
    ) -> None:
        """Summarize a packed output folder; exit 1 if it is unfinished or a check fails."""
        from longpack.outputs import check_output_file
        from longpack.packed import inspect_output, plot_output

        if plot is not None:
            check_output_file(plot, field="plot")  # before the (long) verification
        # a LongpackError: exit 2 (cli.app)
        report = inspect_output(folder, verify=verify, no_manifest_ok=no_manifest_ok)
        if plot is not None:
            plot_output(folder, plot)
            report["plot"] = str(plot)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            _print_human(report)
        if not report["ok"]:
            raise typer.Exit(1)


def _print_human(report: dict) -> None:  # type: ignore[type-arg]
    echo = typer.echo
    if report["finished"]:
        state = "finished"
    elif report.get("manifest_unreadable"):
        state = "UNFINISHED (manifest.json cannot be read; see the problems below)"
    elif report.get("no_manifest_ok"):
        state = "no manifest.json (read as Megatron-Bridge wrote it)"
    else:
        state = "UNFINISHED (no manifest.json; a folder Megatron-Bridge wrote: --no-manifest-ok)"
    echo(f"{report['folder']}: {state}, format {report.get('format', 'parquet')}")
    settings = report.get("settings") or {}
    if settings:
        echo(
            f"  pack_size {settings.get('pack_size')}, seq_length {settings.get('seq_length')}, "
            f"pad_seq_to_mult {settings.get('pad_seq_to_mult')}, algorithm {settings.get('algorithm')}, "
            f"seed {settings.get('seed')}"
        )
    counts = report.get("counts")
    if counts:
        echo(
            f"  rows read {counts.get('rows_read')}, malformed {counts.get('malformed')}, packed "
            f"{counts.get('packed')}, truncated {counts.get('truncated')}, dropped {counts.get('dropped')}"
        )
    for name, s in report["splits"].items():
        echo(
            f"  {name}: {s['rows']} rows, {s['samples']} samples ({s['samples_per_row_mean']}/row), "
            f"{s['runtime_tokens']} runtime tokens, {s['supervised_tokens']} supervised, "
            f"mean fill {s['fill_mean']:.2%}; files: {', '.join(s['files'])}"
        )
        echo("    sample runtime lengths:")
        for line in s["runtime_length_histogram"]:
            echo(f"      {line}")
        echo("    row fill (runtime tokens / pack size):")
        for line in s["fill_histogram"]:
            echo(f"      {line}")
    if report.get("plot"):
        echo(f"  plot: {report['plot']}")
    if report["verified"]:
        echo(
            "  verify: " + ("all checks passed" if report["ok"] else f"{len(report['problems'])} problem(s)")
        )
        outside = report.get("supervised_outside_cu_seqlens") or {}
        for name, c in outside.items():  # recorded by pack (manifest.json)
            echo(
                f"  verify: {name}: {c['tokens']} supervised token(s) outside cu_seqlens in {c['samples']} "
                "sample(s) (manifest)" + (f", first {c['listed'][0]}" if c["listed"] else "")
            )
    for problem in report["problems"]:
        echo(f"  problem: {problem}")
