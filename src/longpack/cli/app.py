"""The ``longpack`` command: every sub-command parses its flags into a job config (``longpack.jobs``),
runs it and prints the result.

Exit codes, for every command: 0 success; 1 the command ran and found a problem (``check`` errors, an
``inspect --verify`` failure, no layout fits); 2 the input or a setting is wrong (a
``longpack.errors.LongpackError``: the message says what and how to fix it); 3 an internal error, a bug in
longpack (the traceback is printed with ``longpack --debug ...``).
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

import longpack
from longpack.cli import help_layout
from longpack.errors import LongpackError

COMMAND_ORDER = (
    "pack",
    "tokenize",
    "preview",
    "inspect",
    "sweep",
    "check",
    "plan",
    "balance",
    "online-sim",
    "thd-batch",
    "cp-check",
    "verify",
    "topology",
)
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 3
REPORT_URL_HINT = "please report it with the command you ran and `longpack --debug ...`'s traceback"


class LongpackGroup(TyperGroup):
    """Runs a command and turns a ``LongpackError`` into ``error: <message>`` (exit 2) and anything else
    into an internal-error report (exit 3), for every command, under ``main()`` and under test runners."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _flags_as_flags(self)

    def list_commands(self, ctx: Any) -> list[str]:
        """Commands in the order a user meets them (typer would list sub-apps such as ``plan`` last)."""
        names = super().list_commands(ctx)
        order = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda n: order.get(n, len(order)))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, KeyboardInterrupt):  # usage errors, exits
            raise
        except BrokenPipeError:  # the reader went away (`longpack ... | head`): stop quietly
            _silence_stdout()
            raise typer.Exit(1) from None
        except LongpackError as exc:
            from longpack.cli.options import cli_message

            typer.echo(f"error: {cli_message(str(exc), exc.fields)}", err=True)
            if _debug(ctx):
                traceback.print_exc()
            # a problem found in the data (e.g. past --max-drop-fraction) exits 1, a wrong setting 2
            raise typer.Exit(getattr(exc, "exit_code", EXIT_USER_ERROR)) from exc
        except Exception as exc:
            typer.echo(f"internal error, {REPORT_URL_HINT}: {type(exc).__name__}: {exc}", err=True)
            if _debug(ctx):
                traceback.print_exc()
            else:
                typer.echo("(run again with `longpack --debug ...` for the traceback)", err=True)
            raise typer.Exit(EXIT_INTERNAL_ERROR) from exc


def _silence_stdout() -> None:
    import contextlib
    import os

    # (OSError, ValueError, AttributeError): stdout is not a real file (a test runner's buffer)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _debug(ctx: Any) -> bool:
    return bool((ctx.find_root().obj or {}).get("debug"))


help_layout.install()  # option names and choices are never cut at 80 columns

app = typer.Typer(
    name="longpack",
    cls=LongpackGroup,
    help="Packed sequences for long-context and MoE training with Megatron-Core / Megatron-Bridge.",
    epilog="Exit codes: 0 ok, 1 a problem was found, 2 bad input or setting, 3 internal error (a bug).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(longpack.__version__)
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print longpack's version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Print tracebacks of errors."),
) -> None:
    ctx.obj = {"debug": debug}


@app.command("version", hidden=True)
def version() -> None:
    """Print longpack's version (also: ``longpack --version``)."""
    typer.echo(longpack.__version__)


# One module per command (listed in help in COMMAND_ORDER); each defines ``register(app)``.
_COMMAND_MODULES = (
    "pack_cmd",
    "tokenize_cmd",
    "preview_cmd",
    "inspect_cmd",
    "sweep_cmd",
    "check_cmd",
    "plan_cmd",
    "balance_cmd",
    "online_cmd",
    "rollouts_cmd",
    "thd_batch_cmd",
    "cp_check_cmd",
    "verify_cmd",
    "topology_cmd",
)


def _flags_as_flags(command: Any) -> None:
    """Boolean flags take no value: show no ``<bool>`` type next to them in help."""
    for param in command.params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    make_help_option = command.get_help_option

    def get_help_option(ctx: Any) -> Any:  # --help is made per call, not kept in params
        option = make_help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        _flags_as_flags(sub)


def _register_commands() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(f"longpack.cli.{name}").register(app)


_register_commands()


def main() -> None:
    try:
        app(prog_name="longpack")
    except LongpackError as exc:  # raised outside a command (while parsing)
        from longpack.cli.options import cli_message

        typer.echo(f"error: {cli_message(str(exc), exc.fields)}", err=True)
        sys.exit(EXIT_USER_ERROR)


if __name__ == "__main__":
    main()
