"""``longpack topology``: what a parallel layout implies; options from ``TopologyConfig``."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import TopologyConfig


def present(config: Any, result: Any) -> None:
    for key, value in result.to_dict().items():
        typer.echo(f"{key:>16}: {value}")


def register(app: typer.Typer) -> None:
    add_command(app, "topology", TopologyConfig, present=present)
