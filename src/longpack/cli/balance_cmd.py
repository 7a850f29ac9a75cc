"""``longpack balance``: compare first-fit-shuffle, best-fit and workload-balanced packing of a length list;
options from ``BalanceConfig``."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import BalanceConfig


def present(config: Any, result: Any) -> None:
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(
        f"{'packing':<18} {'packs':>7} {'fill %':>7} {'time s':>12} {'/ideal':>7} {'rank imb':>8} {'corr':>6}"
    )
    for row in result.packings:
        typer.echo(
            f"{row['packing']:<18} {row['packs']:>7} {100 * row['fill']:>7.2f} {row['time_s']:>12.3f} "
            f"{row['vs_ideal']:>7.3f} {row['rank_imbalance']:>8.3f} {row['step_length_correlation']:>+6.2f}"
        )
    typer.echo(f"{'ideal':<18} {'':>7} {'':>7} {result.ideal_time_s:>12.3f} {1.0:>7.3f}")
    from longpack.jobs.balance import COLUMNS

    for name, meaning in COLUMNS.items():
        typer.echo(f"  {name}: {meaning}")
    if result.out is not None:
        typer.echo(f"balanced bin_of_item written to {result.out} (bin k is the k-th pack read)")


def register(app: typer.Typer) -> None:
    add_command(app, "balance", BalanceConfig, present=present)
