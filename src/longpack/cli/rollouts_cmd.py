"""``longpack rollouts``: how one step's RL rollouts pack per DP rank; options from ``RolloutsConfig``."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import RolloutsConfig


def present(config: Any, result: Any) -> None:
    typer.echo(
        f"{result.rollouts:,} rollouts, {result.tokens:,} tokens; bin {config.bin_size:,}, DP {config.dp}, "
        f"slots aligned to {result.seq_length_multiple}; cost in {result.cost_unit}"
    )
    typer.echo(
        f"{'fill':<20} {'distribution':<13} {'bins/rank':>9} {'fill %':>7} {'busiest':>12} {'mean':>12} "
        f"{'imbalance':>9}"
    )
    for row in result.rows:
        typer.echo(
            f"{row['fill_algorithm']:<20} {row['distribution']:<13} {row['bins_per_rank']:>9} {100 * row['fill']:>7.2f} "
            f"{row['busiest_rank']:>12.4g} {row['mean_rank']:>12.4g} {row['imbalance']:>9.3f}"
        )
    typer.echo("  bins/rank: micro-batches every DP rank runs this step (ranks short of it get empty bins)")
    typer.echo("  busiest / mean: the slowest DP rank's cost and the average; the step waits for the slowest")


def register(app: typer.Typer) -> None:
    add_command(app, "rollouts", RolloutsConfig, present=present)
