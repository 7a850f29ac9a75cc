"""The CLI, generated from the job configs: each config field declared with :func:`longpack.option.option`
becomes one typer option (flag, type, default, choices and help from the field), so an option is written
once, in the config. A command is parse -> config -> ``.run()`` -> print: ``--json`` prints the result's
``to_dict()``; otherwise the command's ``present`` function prints it for people.

Why a small adapter over typer rather than cyclopts or tyro: typer (and click under it) is what the CLI,
its tests and its error handling already use, neither alternative is installed, and the adapter is short:
field metadata -> ``Annotated[type, typer.Option(...)]`` parameters of one generated function.

>>> import typer, dataclasses
>>> from longpack.jobs.options import option
>>> @dataclasses.dataclass(frozen=True, kw_only=True)
... class EchoConfig:
...     word: str = option("hi", help="What to say.", choices=("hi", "bye"))
...     def run(self) -> dict[str, str]:
...         return {"said": self.word}
>>> demo = typer.Typer()
>>> add_command(demo, "echo", EchoConfig, present=lambda config, result: typer.echo(result["said"]))
>>> from typer.testing import CliRunner
>>> CliRunner().invoke(demo, ["--word", "bye"]).output
'bye\\n'
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import typing
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import typer

from longpack.cli.options import FIELD_FLAGS
from longpack.errors import LongpackError
from longpack.jobs.options import Option, option_of

__all__ = [
    "CliField",
    "FlagCollisionError",
    "add_command",
    "add_group",
    "check_flag_collisions",
    "cli_fields",
]

JSON_FLAG = "--json"


@dataclasses.dataclass(frozen=True)
class CliField:
    """One config field as the CLI offers it: ``path`` is ``("text", "format")`` for a nested field."""

    path: tuple[str, ...]
    spec: Option
    type: Any
    default: Any  # inspect.Parameter.empty: required

    @property
    def param(self) -> str:
        return "__".join(self.path)

    @property
    def flags(self) -> tuple[str, ...]:
        return self.spec.flags(self.path[-1])


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return inspect.Parameter.empty


def cli_fields(config_cls: type) -> Iterator[CliField]:
    """The fields of a config class the CLI offers, nested configs flattened, in declaration order."""
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        spec = option_of(field)
        if spec is None or not spec.cli:
            continue
        if spec.nested_except is None:
            yield CliField((field.name,), spec, spec.cli_type or hints[field.name], _default(field))
            continue
        inner_cls = hints[field.name]
        inner_hints = typing.get_type_hints(inner_cls)
        for inner in dataclasses.fields(inner_cls):
            inner_spec = option_of(inner)
            if inner_spec is None or not inner_spec.cli or inner.name in spec.nested_except:
                continue
            yield CliField(
                (field.name, inner.name),
                inner_spec,
                inner_spec.cli_type or inner_hints[inner.name],
                _default(inner),
            )


class FlagCollisionError(TypeError):
    """Two fields of one command (a nested group's flattened fields included) would be set by one flag."""


def check_flag_collisions(items: list[CliField], command: str) -> None:
    """Refuse a command whose fields share a flag (main flag, alias or off switch), once nested groups are
    flattened: typer would silently give the flag to one of them (``tests/cli/test_flag_collisions.py``).
    """
    owner: dict[str, str] = {}
    for item in items:
        if item.spec.positional:
            continue
        spellings = [*item.flags, *([item.spec.negative] if item.spec.negative else [])]
        for flag in spellings:
            field = ".".join(item.path)
            other = owner.setdefault(flag, field)
            if other != field:
                raise FlagCollisionError(
                    f"{command}: {flag} sets both {other} and {field}; give one of them its own flag "
                    "(option(flag=...)) or leave it out of the group (nested_except)"
                )
    if JSON_FLAG in owner:
        raise FlagCollisionError(
            f"{command}: {JSON_FLAG} is every command's own flag; {owner[JSON_FLAG]} takes it"
        )


def _shown_default(item: CliField) -> str | None:
    """A default the command line cannot spell as is (a tuple of sizes): shown in help as it would be typed,
    while the option itself defaults to "not given" (the config's default applies)."""
    if isinstance(item.default, tuple | list) and item.default and not item.spec.positional:
        return ",".join(str(x) for x in item.default)
    return None


def _annotation(item: CliField) -> Any:
    spec = item.spec
    kind = item.type
    if spec.choices is not None:
        kind = Literal[spec.choices]  # type: ignore[valid-type]
        if item.default is None:
            kind = kind | None
    if spec.positional:
        info: Any = typer.Argument(metavar=spec.metavar, help=spec.help, hidden=spec.hidden)
    else:
        flags = item.flags[:1]
        if spec.negative is not None:
            flags = (f"{flags[0]}/{spec.negative}",)
        shown = _shown_default(item)
        info = typer.Option(
            *flags,
            help=spec.help,
            hidden=spec.hidden,
            metavar=spec.metavar,
            show_default=True if shown is None else shown,
        )
    return Annotated[kind, info]


def _alias_annotation(item: CliField, alias: str) -> Any:
    return Annotated[item.type | None, typer.Option(alias, hidden=True)]


def _parameters(items: list[CliField], view_items: list[CliField] | None = None) -> list[inspect.Parameter]:
    params = []
    for item in [*items, *(view_items or [])]:
        default = item.default
        if (item.spec.positional and default == ()) or _shown_default(item) is not None:
            default = None  # typer: not given
        params.append(
            inspect.Parameter(
                item.param, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_annotation(item)
            )
        )
        for i, alias in enumerate(item.spec.aliases):
            params.append(
                inspect.Parameter(
                    f"{item.param}__alias{i}",
                    inspect.Parameter.KEYWORD_ONLY,
                    default=None,
                    annotation=_alias_annotation(item, alias),
                )
            )
    params.append(
        inspect.Parameter(
            "as_json",
            inspect.Parameter.KEYWORD_ONLY,
            default=False,
            annotation=Annotated[bool, typer.Option(JSON_FLAG, help="Print JSON for machines.")],
        )
    )
    return params


def config_kwargs(items: list[CliField], values: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of the config from the parsed command line: values parsed, nested configs built
    from their flat options, options left out (``None`` where the field's default is not) not passed."""
    kwargs: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for item in items:
        value = values[item.param]
        for i, alias in enumerate(item.spec.aliases):
            old = values.get(f"{item.param}__alias{i}")
            if old is not None:
                typer.echo(f"warning: {alias} is deprecated; use {item.flags[0]}", err=True)
                value = old
        if value is None and item.default is not None:
            continue
        if item.spec.parse is not None and value is not None:
            value = item.spec.parse(value)
        if len(item.path) == 1:
            kwargs[item.path[0]] = value
        else:
            nested.setdefault(item.path[0], {})[item.path[1]] = value
    return {**kwargs, **nested}


def _build_nested(config_cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(config_cls)
    return {
        name: hints[name](**value)
        if isinstance(value, dict) and dataclasses.is_dataclass(hints[name])
        else value
        for name, value in kwargs.items()
    }


def _command(
    name: str,
    config_cls: type,
    *,
    present: Callable[..., None],
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None,
    help: str | None,
    group: bool = False,
    view: type | None = None,
    intercept: Callable[[Any, bool], bool] | None = None,
    on_error: Callable[[LongpackError, bool], None] | None = None,
) -> Callable[..., None]:
    """The typer function of one command: its signature is the config's fields (and ``--json``); with
    ``group``, it is a group's callback that runs only when no sub-command is named. ``view`` is a second
    option dataclass for how the command prints (``check --show-ignored``), handed to ``present`` as a
    third argument; ``intercept(view, as_json)`` may answer the command without a config (``--list-rules``)
    and return True; ``on_error(exc, as_json)`` may report a ``LongpackError`` its own way (before exit 2)."""
    items = list(cli_fields(config_cls))
    view_items = list(cli_fields(view)) if view is not None else []
    assert not {i.param for i in items} & {i.param for i in view_items}, "a view option shadows a field"
    check_flag_collisions([*items, *view_items], f"longpack {name}")
    field_names = {f.name for f in dataclasses.fields(config_cls)}
    for item in items:  # error messages name a field by the flag that sets it
        if not item.spec.positional and item.flags[0] != "--" + item.path[-1].replace("_", "-"):
            FIELD_FLAGS.setdefault(".".join(item.path[-1:]), item.flags[0])

    def command(**values: Any) -> None:
        ctx = values.pop("ctx", None)
        if ctx is not None and ctx.invoked_subcommand is not None:
            return
        as_json = values.pop("as_json")
        shown = None
        if view is not None:
            shown = view(**config_kwargs(view_items, {i.param: values.pop(i.param) for i in view_items}))
            if intercept is not None and intercept(shown, as_json):
                return
        kwargs = config_kwargs(items, values)
        if prepare is not None:
            kwargs = prepare(kwargs)
        if "progress" in field_names:
            kwargs["progress"] = not as_json and sys.stderr.isatty()
        try:
            config = config_cls(**_build_nested(config_cls, kwargs))
            result = config.run()
        except LongpackError as exc:
            if on_error is not None:
                on_error(exc, as_json)
            raise
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=_plain))
        elif view is not None:
            present(config, result, shown)
        else:
            present(config, result)
        code = getattr(result, "exit_code", 0)
        if code:
            raise typer.Exit(code)

    params = _parameters(items, view_items)
    if group:
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        params = [ctx_param, *params]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = name.replace("-", "_")
    command.__doc__ = help or _summary(config_cls)
    command.longpack_configs = (config_cls, *((view,) if view is not None else ()))  # type: ignore[attr-defined]
    return command


def _plain(value: Any) -> Any:
    """JSON for what ``json`` does not know: numbers (numpy scalars) as numbers, anything else as text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def add_command(
    app: typer.Typer,
    name: str,
    config_cls: type,
    *,
    present: Callable[..., None],
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    help: str | None = None,
    hidden: bool = False,
    epilog: str | None = None,
    view: type | None = None,
    intercept: Callable[[Any, bool], bool] | None = None,
    on_error: Callable[[LongpackError, bool], None] | None = None,
) -> None:
    """Register ``longpack <name>``: every offered field of ``config_cls`` is an option.

    ``present(config, result)`` prints a result for people; ``prepare`` may rewrite the config's keyword
    arguments (what a command line can only spell one way, e.g. ``--mix a=1 b=2``). A result with an
    ``exit_code`` attribute sets the command's exit code (1: the command ran and found a problem).
    """
    command = _command(
        name,
        config_cls,
        present=present,
        prepare=prepare,
        help=help,
        view=view,
        intercept=intercept,
        on_error=on_error,
    )
    app.command(name, hidden=hidden, epilog=epilog)(command)


def add_group(
    app: typer.Typer,
    name: str,
    config_cls: type,
    *,
    present: Callable[..., None],
    help: str | None = None,
) -> typer.Typer:
    """Register ``longpack <name>``, a command that also has sub-commands (``plan`` and ``plan estimate``):
    run without one, it is ``config_cls``'s command; the sub-commands are added to the returned group with
    :func:`add_command`. The group's required options are checked by the config (a sub-command needs none
    of them)."""
    group = typer.Typer(name=name, help=help or _summary(config_cls), invoke_without_command=True)
    command = _command(name, config_cls, present=present, prepare=None, help=help, group=True)
    group.callback()(command)
    app.add_typer(group, name=name)
    return group


def _summary(config_cls: type) -> str:
    """A command's help: the job's ``command_help``, else the first paragraph of the config's docstring."""
    text = getattr(config_cls, "command_help", None) or (config_cls.__doc__ or "").split("\n\n")[0]
    return inspect.cleandoc(text)
