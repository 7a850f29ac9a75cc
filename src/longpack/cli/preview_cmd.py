"""``longpack preview``: decoded samples with what they train on marked; its options are
``PreviewConfig``'s fields (``longpack.cli.generate``); this module prints the result."""

from __future__ import annotations

import sys
from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import PreviewConfig


def present(config: Any, result: Any) -> None:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    if console.is_terminal and sys.stdout.isatty():
        console.print(result.text(color=True))
    else:
        typer.echo(result.text(color=False))
    if result.html_path is not None:
        typer.echo(f"wrote {result.html_path}", err=True)


def register(app: typer.Typer) -> None:
    add_command(app, "preview", PreviewConfig, present=present)
