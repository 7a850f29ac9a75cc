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
        seq_length: int | None = typer.Option(
            None, "--seq-length", help="Indexed data: GPTDataset's sequence length (default: the manifest's)."
        ),
        seed: int | None = typer.Option(
            None, "--seed", help="Indexed data: Megatron's --seed (default 1234)."
        ),
        split: str = typer.Option(
            "1,0,0", "--split", help="Indexed data: Megatron's --split; the train part is shown."
        ),
        num_samples: int | None = typer.Option(
            None,
            "--num-samples",
            help="Indexed data: samples GPTDataset draws (train_iters * GBS; default 1 epoch).",
        ),
        sample: int | None = typer.Option(
            None, "--sample", help="Indexed data: show this sample's documents and cu_seqlens."
        ),
    ) -> None:
        """Summarize a packed output folder or a Megatron .bin/.idx prefix; exit 1 if unfinished or a check fails."""
        from longpack.outputs import check_output_file
        from longpack.packed import inspect_output, plot_output

        if Path(f"{folder}.idx").is_file() or _indexed_folder(folder):
            from longpack.packed.indexed import inspect_indexed

            report = inspect_indexed(
                folder, seq_length=seq_length, seed=seed, split=split, num_samples=num_samples, sample=sample
            )
            typer.echo(json.dumps(report, indent=2) if as_json else _indexed_text(report))
            return

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
    for problem in report["problems"]:
        echo(f"  problem: {problem}")


def _indexed_folder(folder: Path) -> bool:
    manifest = folder / "manifest.json"
    try:
        return (
            manifest.is_file()
            and json.loads(manifest.read_text()).get("settings", {}).get("output_format") == "indexed"
        )
    except (OSError, ValueError):
        return False


def _indexed_text(report: dict) -> str:  # type: ignore[type-arg]
    lines = [f"{report['folder']}: Megatron indexed dataset(s)"]
    for prefix, e in report["prefixes"].items():
        g = e["gpt_dataset"]
        lines.append(f"  {prefix}: {e['documents']} documents, {e['tokens']} tokens, {e['dtype']}")
        lines.append(
            f"    GPTDataset seq_length {g['seq_length']}, seed {g['seed']}, split {g['split']}: {g['samples']} "
            f"samples in {g['epochs']} epoch(s), tokens per sample {g['seq_length']}, {g['documents_cut']} of "
            f"{g['documents']} documents cut at sample boundaries, {g['segments_mean']} documents per sample "
            f"(max {g['segments_max']})"
        )
        lines.append(
            f"    attention work (causal, sum of squares / 2): {g['attention_work_unmasked']:.4g} without document "
            f"masking, {g['attention_work_masked']:.4g} with ({g['attention_work_ratio']:.1%})"
        )
        if "sample" in e:
            sm = e["sample"]
            lines.append(
                f"    sample {sm['index']} (index {sm['unshuffled_index']} before shuffling): documents "
                f"{sm['documents']} from offset {sm['first_document_offset']}, cu_seqlens {sm['cu_seqlens']}"
            )
    return "\n".join(lines)
