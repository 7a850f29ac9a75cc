"""``longpack online-sim``: fill of the online (candidate-buffer) packer against offline packing; options
from ``OnlineSimConfig``."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import OnlineSimConfig


def _smallest(best: int | None) -> str:
    return "smallest buffer within 1% of offline fill: " + (
        str(best) if best is not None else "none of these"
    )


def present(config: Any, result: Any) -> None:
    report = result.report
    if result.vlm:
        _present_vlm(config, result)
        return
    typer.echo(
        f"{report['source']}, pack size {report['capacity']}, pad_seq_to_mult {result.pad_seq_to_mult}, "
        f"algorithm {result.algorithm}"
    )
    typer.echo(
        f"{'buffer':>7} {'online fill':>11} {'packs':>7} {'offline fill':>12} {'packs':>7} {'ratio':>7}"
    )
    for r in report["rows"]:
        typer.echo(
            f"{r['buffer_size']:>7} {r['online_fill']:>11.4f} {r['online_packs']:>7} "
            f"{r['offline_fill']:>12.4f} {r['offline_packs']:>7} {r['fill_ratio']:>7.4f}"
        )
    typer.echo(_smallest(report["smallest_buffer_within_1pct"]))


def _present_vlm(config: Any, result: Any) -> None:
    report = result.report
    s = report["samples"]
    rejected = ", ".join(f"{k} {v}" for k, v in s["rejected"].items() if v) or "none"
    typer.echo(
        f"{report['source']}: {s['samples']} samples (refused: {rejected}); tokens p50 {s['tokens_p50']}, "
        f"p95 {s['tokens_p95']}, max {s['tokens_max']}; prepared MiB/sample mean {s['prepared_mib_mean']}, "
        f"p95 {s['prepared_mib_p95']}, max {s['prepared_mib_max']}"
    )
    for message in s["examples"]:
        typer.echo(f"  refused: {message}")
    if len(s["skipped"]) > len(s["examples"]):
        typer.echo(f"  ... {len(s['skipped']) - len(s['examples'])} more refused (--json lists every key)")
    vision = ", ".join(f"{k} {v}" for k, v in report["vision"].items())  # what counted the visual tokens
    typer.echo(
        f"pack size {config.pack_size}, pad_seq_to_mult {result.pad_seq_to_mult}, algorithm {report['algorithm']}, "
        f"{report['workers']} loader worker(s) per rank; family {report['family']} ({vision})"
    )
    typer.echo(
        f"{'buffer':>7} {'online fill':>11} {'packs':>7} {'offline fill':>12} {'ratio':>7} "
        f"{'peak MiB/worker':>15} {'mean MiB/worker':>15} {'peak MiB/rank':>13}"
    )
    for r in report["rows"]:
        typer.echo(
            f"{r['buffer_size']:>7} {r['online_fill']:>11.4f} {r['online_packs']:>7} {r['offline_fill']:>12.4f} "
            f"{r['fill_ratio']:>7.4f} {r['buffer_peak_mib_worker']:>15.1f} {r['buffer_mean_mib_worker']:>15.1f} "
            f"{r['buffer_peak_mib_rank']:>13.1f}"
        )
    typer.echo(_smallest(report["smallest_buffer_within_1pct"]))


def register(app: typer.Typer) -> None:
    add_command(app, "online-sim", OnlineSimConfig, present=present)
