"""``longpack cp-check``: prove on this machine that CP-sharded THD attention equals unsharded attention;
options from ``CpCheckConfig``."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import CpCheckConfig


def present(config: Any, result: Any) -> None:
    header = f"{'case':<22}{'cp':>3} {'dtype':<8}{'tokens':>7}{'seqs':>5}{'ring diff':>11}{'gather diff':>12}{'loss diff':>11}{'leak':>6}  ok"
    typer.echo(header)
    for c in result.cases:
        typer.echo(
            f"{c.case:<22}{c.cp_size:>3} {c.dtype:<8}{c.tokens:>7}{c.sequences:>5}"
            f"{c.ring_max_abs_diff:>11.1e}{c.allgather_max_abs_diff:>12.1e}{c.loss_abs_diff:>11.1e}"
            f"{'no' if c.isolation_max_change_outside == 0 else 'YES':>6}  {'yes' if c.ok else 'NO'}"
        )


def register(app: typer.Typer) -> None:
    add_command(app, "cp-check", CpCheckConfig, present=present)
