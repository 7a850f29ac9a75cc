"""The CLI generator refuses a command whose fields (nested groups flattened) share a flag."""

from __future__ import annotations

import dataclasses

import pytest
import typer

from longpack.cli.app import app
from longpack.cli.generate import FlagCollisionError, add_command, check_flag_collisions, cli_fields
from longpack.option import option


@dataclasses.dataclass(frozen=True)
class Inner:
    seed: int = option(0, help="Inner seed.")
    size: int = option(1, help="Inner size.")


@dataclasses.dataclass(frozen=True)
class Outer:
    seed: int = option(0, help="Seed.")
    inner: Inner = option(default_factory=Inner, help="A group.", nested_except=())

    def run(self) -> dict[str, int]:
        return {}


@dataclasses.dataclass(frozen=True)
class Apart:
    seed: int = option(0, help="Seed.")
    inner: Inner = option(default_factory=Inner, help="A group.", nested_except=("seed",))

    def run(self) -> dict[str, int]:
        return {}


@dataclasses.dataclass(frozen=True)
class Aliased:
    size: int = option(0, help="Size.", aliases=("--seed",))
    seed: int = option(0, help="Seed.")

    def run(self) -> dict[str, int]:
        return {}


def test_a_nested_field_that_takes_an_outer_flag_is_refused() -> None:
    with pytest.raises(FlagCollisionError, match=r"--seed sets both seed and inner\.seed"):
        add_command(typer.Typer(), "demo", Outer, present=lambda c, r: None)


def test_an_alias_counts_and_a_field_left_out_of_the_group_does_not() -> None:
    with pytest.raises(FlagCollisionError, match="--seed sets both size and seed"):
        check_flag_collisions(list(cli_fields(Aliased)), "longpack demo")
    add_command(typer.Typer(), "demo", Apart, present=lambda c, r: None)  # inner.seed is not offered


def test_no_command_of_longpack_has_a_collision() -> None:
    """Every command was generated (importing the app) with the check on; it also holds for each again."""
    import typer.main

    root = typer.main.get_command(app)
    assert len(root.commands) > 10  # type: ignore[attr-defined]
