"""``longpack check``: every packing, context-parallel and batch rule, before a GPU is touched
(parse -> ``CheckConfig`` -> run -> print).

Exit codes: 0 = no error-severity finding, 1 = at least one error, 2 = the input cannot be read.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.cli.options import cli_message
from longpack.errors import LongpackError
from longpack.jobs import CheckConfig
from longpack.jobs.check import family_table, rule_table
from longpack.jobs.options import option

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


def _input_error_as_json(exc: LongpackError, as_json: bool) -> None:
    """With ``--json``, input that cannot be read is a JSON answer too (exit 2); else ``error: ...``."""
    if as_json:
        message = cli_message(str(exc), exc.fields)
        typer.echo(json.dumps({"ok": False, "exit_code": EXIT_UNREADABLE, "input_error": message}, indent=2))
        raise typer.Exit(EXIT_UNREADABLE) from exc


@dataclass(frozen=True, kw_only=True)
class CheckView:
    """How ``longpack check`` answers: the listings instead of a check, and what the table shows."""

    list_rules: bool = option(False, help="List every rule and exit.")
    list_families: bool = option(False, help="List known model families and exit.")
    markdown: bool = option(False, help="With --list-rules: a Markdown table.")
    show_ignored: bool = option(False, help="List every config key no rule reads.")
    verbose: bool = option(False, help="Also list the rules not applied to these versions (and why).")
    explain: str | None = option(
        None,
        help="Explain one rule (LP-MTP-001): its sources, the versions it applies to, the Bridge recipes "
        "that exercise it.",
        cli_type=str | None,
        metavar="RULE",
    )


def _listing(view: CheckView, as_json: bool) -> bool:
    if view.explain is not None:
        _explain(view.explain, as_json)
        return True
    if view.list_rules:
        _list_rules(as_json, view.markdown)
        return True
    if view.list_families:
        _list_families(as_json)
        return True
    return False


def _config_then_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``check CONFIG KEY=VALUE ...``: the first argument is the config file unless it is an override."""
    items = list(kwargs.pop("overrides", None) or [])
    if items and "=" not in items[0] and not items[0].startswith("~"):
        kwargs["config"] = items.pop(0)
    kwargs["overrides"] = tuple(items)
    return kwargs


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


def _explain(rule_id: str, as_json: bool) -> None:
    from longpack.jobs.check import explain_rule

    try:
        e = explain_rule(rule_id)
    except LongpackError as exc:
        _input_error_as_json(exc, as_json)
        raise
    if as_json:
        typer.echo(json.dumps(e, indent=2))
        return
    typer.echo(f"{e['id']} ({e['severity']}): {e['title']}")
    typer.echo(f"  {e['description']}")
    typer.echo(f"  fix: {e['fix']}")
    typer.echo(f"  source: {e['source']}")
    for src in e["sources"]:
        typer.echo(f"    {src}")
    typer.echo("  applies to:")
    for name, v in e["versions"].items():
        known = ", ".join(v["known"]) or "none of the versions known"
        typer.echo(f"    {name} {v['range']} (known versions inside: {known})")
    recipes = e["recipes"]
    shown = ", ".join(recipes[:8]) + (f" and {len(recipes) - 8} more" if len(recipes) > 8 else "")
    typer.echo(f"  recipes that exercise it ({len(recipes)}): {shown or 'none'}")
    typer.echo(f"    ({e['recipes_from']})")


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
    add_command(
        app,
        "check",
        CheckConfig,
        present=lambda config, result, view: _print_human(result, view.show_ignored, view.verbose),
        prepare=_config_then_overrides,
        epilog="Exit codes: 0 no errors, 1 at least one error-severity finding, 2 input cannot be read.",
        view=CheckView,
        intercept=_listing,
        on_error=_input_error_as_json,
    )


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
