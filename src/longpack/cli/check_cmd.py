"""``longpack check``: every packing, context-parallel and batch rule, before a GPU is touched.

Exit codes: 0 = no error-severity finding, 1 = at least one error, 2 = the input cannot be read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


def _fail_input(message: str, as_json: bool) -> typer.Exit:
    if as_json:
        typer.echo(json.dumps({"ok": False, "exit_code": EXIT_UNREADABLE, "input_error": message}, indent=2))
    else:
        typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_UNREADABLE)


def rules_markdown() -> str:
    """The rule table of README.md (``longpack check --list-rules --markdown``)."""
    from longpack.rules import RULES

    lines = ["| id | severity | what it checks | source |", "|---|---|---|---|"]
    for r in RULES.values():
        title = r.title + (" (with `--packed`)" if r.scope == "packed" else "")
        lines.append(f"| `{r.id}` | {r.severity.value} | {title} | {r.source} |")
    return "\n".join(lines)


def _list_rules(as_json: bool, markdown: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    from longpack.rules import RULES

    rows = [
        {"id": r.id, "severity": r.severity.value, "title": r.title, "source": r.source, "scope": r.scope}
        for r in RULES.values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if markdown:
        typer.echo(rules_markdown())
        return
    table = Table(title=f"longpack check: {len(rows)} rules")
    for col in ("id", "severity", "checks", "source"):
        table.add_column(col, no_wrap=col in ("id", "severity"), overflow="fold")
    for r in rows:
        title = r["title"] + (" [--packed]" if r["scope"] == "packed" else "")
        table.add_row(r["id"], r["severity"], title, r["source"])
    Console().print(table)


def _list_families(as_json: bool) -> None:
    from longpack.rules import FAMILIES

    rows = [
        {
            "name": f.name,
            "display_name": f.display_name,
            "num_layers": f.num_layers,
            "num_attention_heads": f.num_attention_heads,
            "num_query_groups": f.num_query_groups,
            "num_moe_experts": f.num_moe_experts,
            "mtp_num_layers": f.mtp_num_layers,
            "offline_packing": f.offline_packing and f.any_packing,
            "in_batch_packing": f.in_batch_packing and f.any_packing,
        }
        for f in FAMILIES
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(
            f"{r['name']:<20} layers={r['num_layers']} heads={r['num_attention_heads']} "
            f"kv={r['num_query_groups']} experts={r['num_moe_experts']} mtp={r['mtp_num_layers']} "
            f"offline_packing={r['offline_packing']} in_batch_packing={r['in_batch_packing']}"
        )


def _summary(setup: Any) -> dict[str, Any]:
    m = setup.model
    return {
        "world_size": setup.world_size,
        "tp": setup.tp,
        "cp": setup.cp,
        "pp": setup.pp,
        "vpp": m.virtual_pipeline_model_parallel_size,
        "ep": setup.ep,
        "etp": setup.etp,
        "sp": setup.sp,
        "dp": setup.dp,
        "edp": None if setup.layout is None else setup.layout.edp,
        "pad_seq_to_mult_required": setup.required_pad_seq_to_mult,
        "dataset_kind": setup.dataset.kind.value,
        "model_family": None if setup.family is None else setup.family.name,
        "seq_length": setup.model_seq_length,
        "packed_width": setup.packed_width,
        "micro_batch_size": setup.micro_batch_size,
        "global_batch_size": setup.global_batch_size,
    }


def register(app: typer.Typer) -> None:
    @app.command(
        "check",
        context_settings={"allow_extra_args": False},
        epilog="Exit codes: 0 no errors, 1 at least one error-severity finding, 2 input cannot be read.",
    )
    def check(
        args: Annotated[
            list[str] | None,
            typer.Argument(
                metavar="[CONFIG] [KEY=VALUE ...]",
                help="A YAML/JSON config (Megatron-Bridge dumps welcome), then Hydra-style overrides "
                "(model.context_parallel_size=8, +key=value, ~key).",
            ),
        ] = None,
        gpus: int | None = typer.Option(None, "--gpus", help="World size (number of GPUs)."),
        model: str | None = typer.Option(None, "--model", help="Model family (see --list-families)."),
        dataset_kind: str | None = typer.Option(
            None,
            "--dataset-kind",
            help="sft | direct_hf | energon | mock_vlm | pretraining (default: inferred).",
        ),
        packed: Annotated[
            Path | None,
            typer.Option(
                "--packed", help="Packed output folder to check against the config (metadata + Parquet)."
            ),
        ] = None,
        as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
        list_rules: bool = typer.Option(False, "--list-rules", help="List every rule and exit."),
        list_families: bool = typer.Option(
            False, "--list-families", help="List known model families and exit."
        ),
        markdown: bool = typer.Option(False, "--markdown", help="With --list-rules: a Markdown table."),
        show_ignored: bool = typer.Option(
            False, "--show-ignored", help="List every config key no rule reads."
        ),
    ) -> None:
        """Check a Megatron-Bridge training config (plus overrides, GPU count and packed data) against every
        packing, context-parallel, batch, CUDA-graph, Energon, MoE and pipeline rule."""
        from longpack.rules import (
            ConfigError,
            PackedDataError,
            has_errors,
            inspect_packed_dir,
            load_setup,
            run_rules,
            setup_from_mapping,
        )

        if list_rules:
            _list_rules(as_json, markdown)
            raise typer.Exit(EXIT_OK)
        if list_families:
            _list_families(as_json)
            raise typer.Exit(EXIT_OK)
        items = list(args or [])
        config_path: str | None = None
        if items and "=" not in items[0] and not items[0].startswith("~"):
            config_path = items.pop(0)
        try:
            if config_path is not None:
                loaded = load_setup(
                    config_path, items, world_size=gpus, dataset_kind=dataset_kind, model_family=model
                )
            else:
                loaded = setup_from_mapping(
                    {}, overrides=items, world_size=gpus, dataset_kind=dataset_kind, model_family=model
                )
        except ConfigError as exc:
            raise _fail_input(str(exc), as_json) from exc
        except ValueError as exc:  # e.g. an unknown --dataset-kind
            raise _fail_input(str(exc), as_json) from exc
        setup = loaded.setup
        summary_packed = None
        if packed is not None:
            try:
                pss = setup.dataset.offline_packing_specs
                summary_packed = inspect_packed_dir(
                    packed,
                    multiple=(setup.required_cp_multiple, setup.required_pad_seq_to_mult),
                    pack_size_hint=None if pss is None else pss.packed_sequence_size,
                )
            except PackedDataError as exc:
                raise _fail_input(str(exc), as_json) from exc
        findings = run_rules(setup, summary_packed)
        code = EXIT_ERRORS if has_errors(findings) else EXIT_OK
        if as_json:
            out: dict[str, Any] = {
                "config": config_path,
                "overrides": items,
                "ok": code == EXIT_OK,
                "exit_code": code,
                "summary": _summary(setup),
                "counts": {
                    s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")
                },
                "findings": [f.to_dict() for f in findings],
                "notes": list(loaded.notes),
                "ignored_keys": list(loaded.ignored_keys),
            }
            if summary_packed is not None:
                out["packed"] = {
                    "path": summary_packed.path,
                    "pack_size": summary_packed.pack_size,
                    "metadata": summary_packed.metadata_path,
                    "parquet_files": len(summary_packed.parquet_files),
                    "rows": summary_packed.rows,
                    "sequences": summary_packed.segments,
                    "misaligned_sequences": summary_packed.misaligned_segments,
                    "manifest": summary_packed.manifest is not None,
                }
            typer.echo(json.dumps(out, indent=2))
            raise typer.Exit(code)
        _print_human(config_path, setup, findings, loaded, summary_packed, show_ignored)
        raise typer.Exit(code)


def _print_human(
    config_path: str | None, setup: Any, findings: list[Any], loaded: Any, packed: Any, show_ignored: bool
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    console = Console(width=max(100, Console().width), soft_wrap=False, highlight=False)
    s = _summary(setup)
    console.print(
        f"[bold]{escape(config_path or '(no config file)')}[/]: {s['world_size'] or '?'} GPUs  TP{s['tp']} CP{s['cp']} "
        f"PP{s['pp']}{'' if not s['vpp'] else ' VPP' + str(s['vpp'])} EP{s['ep']} ETP{s['etp']}"
        f"{' SP' if s['sp'] else ''}  DP={s['dp'] or '?'} EDP={s['edp'] or '?'}  "
        f"pad_seq_to_mult needed={s['pad_seq_to_mult_required']}  dataset={s['dataset_kind']}  "
        f"model={s['model_family'] or '?'}"
    )
    for note in loaded.notes:
        console.print(Text(f"  {note}", style="dim"))
    if packed is not None:
        console.print(
            Text(
                f"  packed: {packed.path}: N={packed.pack_size} rows={packed.rows} sequences={packed.segments} "
                f"metadata={'yes' if packed.metadata_path else 'no'} manifest={'yes' if packed.manifest else 'no'}"
            )
        )
    if findings:
        table = Table(show_lines=True)
        table.add_column("severity", no_wrap=True)
        table.add_column("rule", no_wrap=True)
        table.add_column("problem", overflow="fold")
        table.add_column("fix", overflow="fold")
        colors = {"error": "red", "warning": "yellow", "info": "cyan"}
        for f in findings:
            problem = Text(f.message)
            if f.where:
                problem.append("\n" + "; ".join(f.where), style="dim")
            table.add_row(
                Text(f.severity.value, style=colors[f.severity.value]), f.rule_id, problem, Text(f.fix)
            )
        console.print(table)
    counts = {sev: sum(1 for f in findings if f.severity == sev) for sev in ("error", "warning", "info")}
    verdict = "[red]FAIL[/]" if counts["error"] else "[green]OK[/]"
    console.print(
        f"{verdict}: {counts['error']} errors, {counts['warning']} warnings, {counts['info']} infos"
    )
    if loaded.ignored_keys:
        shown = loaded.ignored_keys if show_ignored else loaded.ignored_keys[:8]
        more = "" if show_ignored or len(loaded.ignored_keys) <= 8 else " ... (--show-ignored lists all)"
        console.print(
            Text(
                f"{len(loaded.ignored_keys)} config keys not used by any rule: {', '.join(shown)}{more}",
                style="dim",
            )
        )
    sys.stdout.flush()
