"""``longpack pack``: SFT data -> Megatron-Bridge packed Parquet or ``.npy``; its options are ``PackConfig``'s
fields (``longpack.cli.generate``); this module prints the result."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli import options as opt
from longpack.cli.generate import add_command
from longpack.jobs import PackConfig
from longpack.jobs.pack import DPO, INDEXED

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
    print_summary(result.to_dict(), result.manifest.to_dict())
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


def print_indexed_summary(summary: dict[str, Any]) -> None:
    """The human-readable account of an indexed (Megatron ``.bin``/``.idx``) pack."""
    c, g, echo = summary["counts"], summary["gpt_dataset"], typer.echo
    echo(f"indexed -> {summary['out']}")
    echo(
        f"  format: {summary['format']}   tokenizer: {summary['tokenizer'].get('name')}   dtype: {summary['dtype']}"
    )
    echo(
        f"  rows read {c['rows_read']}, malformed {c['malformed']}, documents {summary['documents']}, "
        f"tokens {summary['tokens']}, in {len(summary['prefixes'])} prefix(es)"
        + (f"; {c['empty']} empty row(s): no document, as preprocess_data.py" if c.get("empty") else "")
    )
    echo(
        f"  GPTDataset at seq_length {g['seq_length']}, seed {g['seed']}: {g['samples']} samples, "
        f"{g['documents_cut']} documents cut at sample boundaries, attention work with document masking "
        f"{g['attention_work_ratio']:.1%} of without"
    )
    for warning in summary["warnings"]:
        echo(f"  warning: {warning}")
    import shlex

    args = summary["megatron_args"]
    echo("Megatron-LM: " + shlex.join(args))
    rest = args[args.index("--split") :]
    if not any(ch.isspace() for p in summary["prefixes"] for ch in p):  # the file is split at whitespace
        echo(f"  or: {shlex.join(['--data-args-path', summary['data_args_path'], *rest])}")
    b = summary["bridge_dataset"]
    echo(
        "Megatron-Bridge GPTDatasetConfig: "
        + ", ".join(f"{k}={tuple(v) if k == 'blend' else v!r}" for k, v in b.items())
    )
    echo(f"  inspect it: longpack inspect {shlex.quote(summary['out'])}")


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


def print_preference_summary(summary: dict[str, Any]) -> None:
    """The human-readable account of a packed DPO (preference pairs) output."""
    c, echo = summary["counts"], typer.echo
    echo(f"packed DPO pairs -> {summary['file']}")
    echo(
        f"  layout: NeMo-Aligner packed DPO   tokenizer: {summary['tokenizer'].get('name', summary['tokenizer'])}"
    )
    echo(
        f"  rows read {c['rows_read']}, malformed {c['malformed']}, pairs {c['pairs_read']}, packed {c['packed']}, "
        f"dropped {c['dropped']} (longer than pack_size {summary['pack_size']})"
    )
    echo(
        f"  {c['rows']} rows, fill {summary['fill_mean']:.1%} ({summary['algorithm']}, seed {summary['seed']})"
    )
    for w in summary["warnings"]:
        echo(f"  warning: {w}")
    echo(f"  check: longpack verify --dpo {summary['file']} --model MODEL")


def print_summary(summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The human-readable account of a finished pack (``summary``: ``PackResult.to_dict()``)."""
    if summary.get("output_format") == INDEXED:
        print_indexed_summary(summary)
        return
    if summary.get("output_format") == DPO:
        print_preference_summary(summary)
        return
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
