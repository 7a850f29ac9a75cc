"""``longpack inspect``: summary, histograms and verification of a packed output folder; options from
``InspectConfig``."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import InspectConfig


def register(app: typer.Typer) -> None:
    add_command(app, "inspect", InspectConfig, present=lambda config, result: _present(result.report))


def _present(report: dict[str, Any]) -> None:
    if report.get("format") == "indexed":  # a Megatron .bin/.idx prefix or an indexed pack folder
        typer.echo(_indexed_text(report))
        return
    if report.get("kind") != "token store":
        _print_human(report)
        return
    r = report
    typer.echo(
        f"{r['store']}: token store, {r['samples']} samples, {r['tokens']} tokens ({r['supervised_tokens']} "
        f"supervised), stored lengths {r['stored_length']['min']}..{r['stored_length']['max']} (mean "
        f"{r['stored_length']['mean']}); tokenizer {r['tokenizer']}, format {r['format']}, {r['inputs']} input "
        f"file(s), longpack {r['longpack_version']}"
    )
    for change in r["changes"]:
        typer.echo(f"  changed: {change}")
    if not r["changes"]:
        typer.echo("  inputs unchanged: packs as tokenized")


def _print_human(report: dict[str, Any]) -> None:
    echo = typer.echo
    if report.get("damaged"):
        state = "DAMAGED (a file cannot be read; see the problems below)"
    elif report["finished"]:
        state = "finished"
    elif report.get("manifest_unreadable"):
        state = "UNFINISHED (manifest.json cannot be read; see the problems below)"
    elif report.get("no_manifest_ok"):
        state = "no manifest.json (read as Megatron-Bridge wrote it)"
    else:
        state = "UNFINISHED (no manifest.json; a folder Megatron-Bridge wrote: --no-manifest-ok)"
    echo(f"{report['folder']}: {state}, format {report.get('format') or 'unknown'}")
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


def _indexed_text(report: dict[str, Any]) -> str:
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
    problems = report.get("problems", [])
    if problems:
        lines.append(f"  verify: {len(problems)} problem(s)")
        lines.extend(f"  problem: {p}" for p in problems)
    elif report.get("verified"):
        lines.append(
            "  verify: all checks passed (every file's sha256 and size, the index against the tokens)"
        )
    return "\n".join(lines)
