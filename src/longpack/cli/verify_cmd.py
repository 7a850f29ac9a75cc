"""``longpack verify``: prove that a model sees what was packed (packed = unpacked, per row, CP rank and PP
stage); options from ``VerifyConfig``."""

from __future__ import annotations

import typer

from longpack.cli.generate import add_command
from longpack.jobs import VerifyConfig


def register(app: typer.Typer) -> None:
    add_command(
        app, "verify", VerifyConfig, present=lambda config, result: typer.echo("\n".join(result.present()))
    )
