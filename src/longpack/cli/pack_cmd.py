"""``longpack pack``: SFT data -> Megatron-Bridge packed Parquet or ``.npy``; its options are ``PackConfig``'s
fields (``longpack.cli.generate``); this module prints the result."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli import options as opt
from longpack.cli.generate import add_command
from longpack.jobs import PackConfig

SHOWN = 10


def _mix_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``--mix a.jsonl=0.7 b/=0.3``: the entries after the first arrive as arguments."""
    if kwargs.get("mix"):
        positional = list(kwargs.get("inputs") or [])
        kwargs["mix"] = [*kwargs["mix"], *[p for p in positional if "=" in p]]
        kwargs["inputs"] = [p for p in positional if "=" not in p]
    return kwargs


def present(config: Any, result: Any) -> None:
    """The human-readable account of a finished pack."""
    summary = result.to_dict()
    own = result.format.present(summary)  # a format with its own account (indexed, dpo), or None
    if own is not None:
        for line in own:
            typer.echo(line)
    else:
        print_summary(summary, result.manifest.to_dict())
    if result.backend is not None and "out_of_core" in result.backend:
        spilled = result.backend["out_of_core"]["spilled_tokens"]
        typer.echo(f"  two passes: {spilled} tokens went through the scratch folder (past --memory-budget)")
    if result.backend is not None and result.backend.get("name") == "ray":
        mem = result.backend
        workers_mib = [round(v / 2**20) for v in mem["worker_peak_rss_bytes"].values()]
        typer.echo(
            f"ray: peak RSS driver {mem['driver_peak_rss_bytes'] / 2**20:.0f} MiB, "
            f"{len(workers_mib)} worker processes, max {max(workers_mib, default=0)} MiB"
        )


def register(app: typer.Typer) -> None:
    add_command(app, "pack", PackConfig, present=present, prepare=_mix_arguments)


def listed_note(listed: int, total: int) -> str:
    """How much of a capped manifest list is there.

    >>> listed_note(3, 3), listed_note(100000, 100250)
    ('all listed in manifest.json', 'the first 100000 listed in manifest.json, 250 not listed')
    """
    if listed >= total:
        return "all listed in manifest.json"
    return f"the first {listed} listed in manifest.json, {total - listed} not listed"


def end_of_document(summary: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    """For documents (``--format text``): the token each one ends with, by name and id (the tokenizer's EOS:
    Qwen3's is ``<|im_end|>``, where a Qwen base model's pretraining ends documents with
    ``<|endoftext|>``), or that none is appended (``--no-append-eod``); ``None`` for SFT data."""
    text = (manifest.get("settings") or {}).get("text") or {}
    if "text" not in str(summary.get("format") or "").split(","):
        return None
    if not text.get("append_eod", True):
        return "documents end with no EOD token (--no-append-eod)"
    tok: dict[str, Any] = summary["tokenizer"] if isinstance(summary.get("tokenizer"), dict) else {}
    eos = tok.get("eos_id")
    names = [name for name, i in (tok.get("special_tokens") or {}).items() if i == eos]
    named = f"{names[0]} (id {eos})" if names else f"id {eos}"
    return f"documents end with {named}, the tokenizer's EOS (--append-eod); --no-append-eod leaves it out"


def print_summary(summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The human-readable account of a finished pack (``summary``: ``PackResult.to_dict()``)."""
    c = summary["counts"]
    echo = typer.echo
    echo(f"packed -> {summary['out']}")
    echo(
        f"  format: {summary['format']}   tokenizer: {summary['tokenizer'].get('name', summary['tokenizer'])}"
    )
    eod = end_of_document(summary, manifest)
    if eod:
        echo(f"  {eod}")
    echo(
        f"  pad_seq_to_mult: {summary['pad_seq_to_mult']}  ({opt.cli_message(summary['pad_seq_to_mult_source'], opt.MULT_FIELDS)})"
    )
    echo(f"  algorithm: {summary['algorithm']}   seed: {summary['seed']}")
    echo(
        f"  rows read {c['rows_read']}, malformed {c['malformed']}, samples {c['samples_read']}, "
        f"packed {c['packed']}, truncated {c['truncated']}, dropped {c['dropped']}"
        + (f", fragmented {c['fragmented']}" if c.get("fragmented") else "")
    )
    for name, s in summary["splits"].items():
        meta = s["metadata"]
        echo(
            f"  {name}: {s['rows']} rows of <= {meta['pack_size']} tokens, {s['samples_packed']} samples, "
            f"{meta['packing_factor']} samples/row, efficiency {meta['packing_efficiency']}%, "
            f"files: {', '.join(s['files'])}"
        )
    for name, split in manifest["splits"].items():
        for kind in ("truncated", "dropped", "fragmented"):
            entries = split.get(kind)
            if not entries:
                continue
            total = split[kind + "_count"]
            echo(f"  {name}: {total} {kind} ({listed_note(len(entries), total)}):")
            for e in entries[:SHOWN]:
                if kind == "truncated":
                    detail = f"kept {e['kept_tokens']} tokens"
                elif kind == "fragmented":
                    detail = f"{e['fragments']} fragments"
                else:
                    detail = e["reason"]
                echo(f"    {e['source']}: {e['stored_length']} tokens, {detail}")
            if total > SHOWN:
                echo(f"    ... {total - SHOWN} more")
    if manifest["malformed"]:
        echo(
            f"  malformed rows skipped: {c['malformed']} ({listed_note(len(manifest['malformed']), c['malformed'])}; "
            f"first: {manifest['malformed'][0]['source']})"
        )
    for info in manifest.get("inputs", [])[:SHOWN]:
        cols = info.get("columns")
        if cols is None:
            continue
        ignored = ", ".join(f"{k} ({n})" for k, n in cols["ignored"].items()) or "none"
        echo(
            f"  {info['path']}: {info['rows']} rows; columns used: {', '.join(cols['used']) or '-'}; ignored: {ignored}"
        )
    if len(manifest.get("inputs", [])) > SHOWN:
        echo(f"  ... {len(manifest['inputs']) - SHOWN} more inputs (columns of each in manifest.json)")
    mix = manifest.get("mix")
    if mix:
        echo(f"  mix: {mix['samples']} samples, seed {mix['seed']}")
        for src in mix["sources"]:
            echo(
                f"    {src['name']}: weight {src['weight']} ({src['share']:.1%}), rows read {src['rows_read']}, "
                f"malformed {src['malformed']}, samples {src['samples']}, drawn {src['drawn']} "
                f"({src['epochs']:g} epochs: {src['unused']} unused, {src['repeated']} repeats), "
                f"packed {src['packed']}, truncated {src['truncated']}, dropped {src['dropped']}"
            )
    for warning in manifest.get("warnings", []):
        echo(f"  warning: {warning}")
    for note in summary.get("notes", []):
        echo(f"  note: {opt.cli_message(note, ('separator', 'prompt_template'))}")
    handoff = summary["bridge_config"]
    echo(f"Megatron-Bridge config ({handoff['api']} API): {handoff['path']}")
    echo("  as Hydra overrides (paste after the launcher, e.g. run_recipe.py --recipe ...):")
    overrides = handoff["overrides"]
    for i, item in enumerate(overrides):
        echo(f"    {item}" + (" \\" if i + 1 < len(overrides) else ""))
    echo("  in a recipe (Python):")
    for line in handoff["python"].splitlines():
        echo(f"    {line}" if line else "")
    echo(f"  check it: {handoff['check']}")
