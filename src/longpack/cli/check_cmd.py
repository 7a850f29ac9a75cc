"""``longpack check``: every packing, context-parallel and batch rule, before a GPU is touched
(parse -> ``CheckConfig`` -> run -> print).

Exit codes: 0 = no error-severity finding, 1 = at least one error, 2 = the input cannot be read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from longpack.cli import options as opt
from longpack.jobs.check import family_table, rule_table

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


def _fail_input(exc: Exception, as_json: bool) -> typer.Exit:
    from longpack.cli.options import cli_message

    message = cli_message(str(exc), getattr(exc, "fields", ()))
    if as_json:
        typer.echo(json.dumps({"ok": False, "exit_code": EXIT_UNREADABLE, "input_error": message}, indent=2))
    else:
        typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_UNREADABLE)


def rules_markdown() -> str:
    """The rule table of README.md (``longpack check --list-rules --markdown``)."""
    lines = [
        "| id | severity | what it checks | versions | source |",
        "|---|---|---|---|---|",
    ]
    for r in rule_table():
        title = r["title"] + (" (with `--packed`)" if r["scope"] == "packed" else "")
        lines.append(f"| `{r['id']}` | {r['severity']} | {title} | {r['versions']} | {_sources_md(r)} |")
    return "\n".join(lines)


def _sources_md(row: dict[str, Any]) -> str:
    """The rule's source in words, then each upstream file with its commit (linked on GitHub)."""
    parts = [row["source"]]
    for src in row["sources"]:
        if src["repo"] == "longpack" or not src["path"]:
            continue
        where = f"{src['repo'].split('/')[1]} `{src['path']}`"
        if src["commit"]:
            url = f"https://github.com/{src['repo']}/commit/{src['commit']}"
            where += f" @ [{src['commit']}]({url})"
        where += " (relaxed it)" if src["relaxes"] else ""
        if where not in parts:
            parts.append(where)
    return "<br>".join(parts)


def _list_rules(as_json: bool, markdown: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = rule_table()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if markdown:
        typer.echo(rules_markdown())
        return
    table = Table(title=f"longpack check: {len(rows)} rules")
    for col in ("id", "severity", "checks", "versions", "source"):
        table.add_column(col, no_wrap=col in ("id", "severity"), overflow="fold")
    for r in rows:
        title = r["title"] + (" [--packed]" if r["scope"] == "packed" else "")
        table.add_row(r["id"], r["severity"], title, r["versions"], r["source"])
    Console().print(table)


def _list_families(as_json: bool) -> None:
    rows = family_table()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(
            f"{r['name']:<20} layers={r['num_layers']} heads={r['num_attention_heads']} "
            f"kv={r['num_query_groups']} experts={r['num_moe_experts']} mtp={r['mtp_num_layers']} "
            f"offline_packing={r['offline_packing']} in_batch_packing={r['in_batch_packing']}"
        )


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
        gpus: opt.Gpus = None,
        model: str | None = typer.Option(
            None, "--model", help="Model: a catalog id (see --list-families) for the model rules."
        ),
        dataset_kind: Annotated[
            opt.DatasetKindChoice | None,
            typer.Option("--dataset-kind", help="Megatron-Bridge dataset config (default: inferred)."),
        ] = None,
        packed: Annotated[
            Path | None,
            typer.Option(
                "--packed", help="Packed output folder to check against the config (metadata + Parquet)."
            ),
        ] = None,
        no_manifest_ok: bool = typer.Option(
            False,
            "--no-manifest-ok",
            help="With --packed: read a folder without manifest.json (Megatron-Bridge's prepare step writes none).",
        ),
        as_json: opt.Json = False,
        list_rules: bool = typer.Option(False, "--list-rules", help="List every rule and exit."),
        list_families: bool = typer.Option(
            False, "--list-families", help="List known model families and exit."
        ),
        markdown: bool = typer.Option(False, "--markdown", help="With --list-rules: a Markdown table."),
        show_ignored: bool = typer.Option(
            False, "--show-ignored", help="List every config key no rule reads."
        ),
        bridge_version: opt.BridgeVersion = None,
        megatron_core_version: opt.McoreVersion = None,
        verbose: bool = typer.Option(
            False, "--verbose", "-v", help="Also list the rules not applied to these versions (and why)."
        ),
    ) -> None:
        """Check a Megatron-Bridge training config (plus overrides, GPU count and packed data) against every
        packing, context-parallel, batch, CUDA-graph, Energon, MoE and pipeline rule."""
        from longpack.errors import LongpackError
        from longpack.jobs.check import CheckConfig

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
            result = CheckConfig(
                config=config_path,
                overrides=tuple(items),
                gpus=gpus,
                model=model,
                dataset_kind=dataset_kind,
                packed=packed,
                packed_no_manifest_ok=no_manifest_ok,
                bridge_version=bridge_version,
                megatron_core_version=megatron_core_version,
            ).run()
        except LongpackError as exc:
            raise _fail_input(exc, as_json) from exc
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
        else:
            _print_human(result, show_ignored, verbose)
        raise typer.Exit(result.exit_code)


def _print_human(result: Any, show_ignored: bool, verbose: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    config_path, findings, loaded, packed = result.config, result.findings, result.loaded, result.packed
    console = Console(width=max(100, Console().width), soft_wrap=False, highlight=False)
    s = result.summary()
    console.print(
        f"[bold]{escape(config_path or '(no config file)')}[/]: {s['world_size'] or '?'} GPUs  TP{s['tp']} CP{s['cp']} "
        f"PP{s['pp']}{'' if not s['vpp'] else ' VPP' + str(s['vpp'])} EP{s['ep']} ETP{s['etp']}"
        f"{' SP' if s['sp'] else ''}  DP={s['dp'] or '?'} EDP={s['edp'] or '?'}  "
        f"pad_seq_to_mult needed={s['pad_seq_to_mult_required']}  dataset={s['dataset_kind']}  "
        f"model={s['model_family'] or '?'}"
    )
    for note in loaded.notes:
        console.print(Text(f"  {note}", style="dim"))
    if result.versions is not None:
        console.print(
            Text(
                f"  rules for {result.versions.describe('bridge')}, {result.versions.describe('mcore')}; "
                f"{len(result.not_applied)} rules do not apply to these versions"
                + ("" if verbose else " (--verbose lists them)"),
                style="dim",
            )
        )
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
            if f.applies_to and not f.applies_to.endswith("(rule: all versions)"):
                # version-bounded rules say which versions they were applied for (JSON always does)
                problem.append("\nfor " + f.applies_to, style="dim")
            table.add_row(
                Text(f.severity.value, style=colors[f.severity.value]), f.rule_id, problem, Text(f.fix)
            )
        console.print(table)
    counts = {sev: sum(1 for f in findings if f.severity == sev) for sev in ("error", "warning", "info")}
    verdict = "[red]FAIL[/]" if counts["error"] else "[green]OK[/]"
    console.print(
        f"{verdict}: {counts['error']} errors, {counts['warning']} warnings, {counts['info']} infos"
    )
    if verbose and result.not_applied:
        console.print(Text("Rules not applied to these versions:", style="dim"))
        for r in result.not_applied:
            console.print(Text(f"  {r.id}  {r.title}  [{r.provenance.ranges_text()}]", style="dim"))
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
