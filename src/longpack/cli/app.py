"""The ``longpack`` command. Each sub-command lives in its own module and registers itself here."""

from __future__ import annotations

import typer

import longpack

app = typer.Typer(
    name="longpack",
    help="Packed sequences for long-context and MoE training with Megatron-Core / Megatron-Bridge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command("version")
def version() -> None:
    """Print longpack's version."""
    typer.echo(longpack.__version__)


def _register_commands() -> None:
    # One import per command module; each module calls ``register(app)``.
    from longpack.cli import balance_cmd, topology_cmd

    topology_cmd.register(app)
    balance_cmd.register(app)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
