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


# One module per command; each defines ``register(app)``. Keep one name per line (merge-friendly).
_COMMAND_MODULES = (
    "topology_cmd",
    "check_cmd",
    "online_cmd",
    "plan_cmd",
    "cp_check_cmd",
    "thd_batch_cmd",
    "pack_cmd",
    "inspect_cmd",
    "sweep_cmd",
    "balance_cmd",
)


def _register_commands() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(f"longpack.cli.{name}").register(app)


_register_commands()


def main() -> None:
    from longpack.errors import MissingDependencyError

    try:
        app()
    except MissingDependencyError as exc:  # an extra is not installed: say which, no traceback
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
