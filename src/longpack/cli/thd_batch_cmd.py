"""``longpack thd-batch``: packed rows collated into a THD batch, and what each CP rank gets; options from
``ThdBatchConfig``."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import ThdBatchConfig


def present(config: Any, result: Any) -> None:
    info = result.to_dict()
    for key, value in info.items():
        if key == "cp_ranks":
            continue
        if isinstance(value, dict):
            shown = f"{value['dtype']} {value['shape']}"
            if "value" in value:
                shown += f" {value['value']}"
            typer.echo(f"{key:>22}: {shown}")
        else:
            typer.echo(f"{key:>22}: {value}")
    for entry in info.get("cp_ranks", []):
        typer.echo(
            f"{'cp rank ' + str(entry['cp_rank']):>22}: {entry['tokens']} tokens, {entry['real_tokens']} real, "
            f"{entry['supervised_tokens']} supervised"
        )


def register(app: typer.Typer) -> None:
    add_command(app, "thd-batch", ThdBatchConfig, present=present)
