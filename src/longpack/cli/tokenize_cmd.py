"""``longpack tokenize``: inputs -> a token store to pack again and again; its options are ``TokenizeConfig``'s
fields (``longpack.cli.generate``); this module prints the result."""

from __future__ import annotations

from typing import Any

import typer

from longpack.cli.generate import add_command
from longpack.jobs import TokenizeConfig


def present(config: Any, result: Any) -> None:
    summary = result.summary()
    typer.echo(
        f"token store -> {summary['store']}: {summary['samples']} samples, {summary['tokens']} tokens from "
        f"{summary['inputs']} input file(s), tokenizer {summary['tokenizer']}, format {summary['format']}"
        + (f", in {summary['shards']} shards" if "shards" in summary else "")
    )
    typer.echo(f"  pack it: longpack pack --store {summary['store']} --seq-length N --out OUT")


def register(app: typer.Typer) -> None:
    add_command(
        app,
        "tokenize",
        TokenizeConfig,
        present=present,
        help="Tokenize once into a store; `longpack pack --store STORE` then packs it at any size, mult, "
        "algorithm, split, seed or format without tokenizing again.",
    )
