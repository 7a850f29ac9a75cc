"""One option of a job config, written once: the dataclass field carries its default and, as metadata, its
help, its flag, its choices and how a command line's text becomes its value. Every front end derives from
the field: the CLI (``longpack.cli.generate``) builds its options from it, the docs list it, and the config
checks the choices through :func:`check_choices`.

>>> from dataclasses import dataclass, fields
>>> @dataclass(frozen=True, kw_only=True)
... class Demo:
...     overlength: str = option("drop", help="Samples longer than a pack.", choices=("drop", "truncate"))
...     def __post_init__(self) -> None:
...         check_choices(self)
>>> spec = option_of(fields(Demo)[0]); spec.flags("overlength"), spec.choices
(('--overlength',), ('drop', 'truncate'))
>>> Demo(overlength="cut")
Traceback (most recent call last):
...
longpack.errors.ConfigError: overlength must be one of drop, truncate, got 'cut'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from longpack.errors import ConfigError
from longpack.validate import one_of

__all__ = ["Option", "check_choices", "option", "option_of", "unescape"]

_KEY = "longpack.option"


@dataclass(frozen=True, kw_only=True)
class Option:
    """What a front end needs to offer one config field (see :func:`option`)."""

    help: str
    flag: str | None = None  # default: ``--`` + the field name with ``-`` for ``_``
    aliases: tuple[str, ...] = ()  # more spellings (hidden in help), e.g. an old name kept for scripts
    negative: str | None = None  # the off switch of a boolean that defaults to on (``--no-offload``)
    choices: tuple[str, ...] | None = None
    or_object: bool = False  # from Python, an object may stand in for a choice (an executor for a backend)
    positional: bool = False  # a command-line argument (``INPUT...``) instead of a ``--flag``
    metavar: str | None = None
    cli_type: Any = None  # the type a command line gives (default: the field's own type)
    parse: Callable[[Any], Any] | None = None  # command-line text -> the field's value
    hidden: bool = False
    cli: bool = True  # False: Python only (a loaded tokenizer, an executor object, progress bars)
    #: a nested config (``text: TextConfig``): its own options are offered flat, except these fields
    nested_except: tuple[str, ...] | None = None

    def flags(self, name: str) -> tuple[str, ...]:
        """The command-line spellings of field ``name``: the main flag first.

        >>> Option(help="", aliases=("--capacity",)).flags("pack_lengths")
        ('--pack-lengths', '--capacity')
        """
        return (self.flag or "--" + name.replace("_", "-"), *self.aliases)


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Any = dataclasses.MISSING,
    **spec: Any,
) -> Any:
    """A dataclass field with its :class:`Option` (keyword arguments as there).

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class C:
    ...     seed: int = option(0, help="Seed of every random step.")
    >>> C().seed
    0
    """
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={_KEY: Option(help=help, **spec)}
    )


def option_of(field: dataclasses.Field[Any]) -> Option | None:
    """The :class:`Option` of a config field, or ``None`` (a field no front end offers)."""
    found = field.metadata.get(_KEY)
    return found if isinstance(found, Option) else None


def check_choices(
    config: Any,
    *,
    prefix: str = "",
    error: type[ConfigError] = ConfigError,
    also: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """Every field of ``config`` that has choices holds one of them (or ``None`` where that is its default).

    ``prefix`` names a nested config in messages (``text.``). The one place a choice list is checked: the
    message names the field, the value and the choices; ``error`` is the job's own ``ConfigError`` subclass;
    ``also`` names values a field takes from Python only (``algorithm="balanced"`` with a balance target).
    """
    for field in dataclasses.fields(config):
        spec = option_of(field)
        if spec is None or spec.choices is None:
            continue
        value = getattr(config, field.name)
        if (value is None and field.default is None) or (spec.or_object and not isinstance(value, str)):
            continue
        if value not in (also or {}).get(field.name, ()):
            one_of(value, spec.choices, prefix + field.name, error=error)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    r"""A value typed in a shell with its escapes read as such: ``\n`` newline, ``\t`` tab, ``\r`` carriage
    return, ``\\`` one backslash. Any other backslash stays as typed (``\x`` is two characters); real
    newlines (``$'...'`` in bash) pass through. The ``parse`` of options whose values hold such characters.

    >>> unescape(r"Q: {prompt}\nA:"), unescape(r"a\\nb"), unescape(r"\d+")
    ('Q: {prompt}\nA:', 'a\\nb', '\\d+')
    """
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def refuse_unknown_settings(cls: type) -> type:
    """Make ``cls(...)`` (a keyword-only config dataclass) refuse an unknown keyword with a
    :class:`~longpack.errors.ConfigError` instead of the bare ``TypeError`` of a dataclass: one that
    belongs to a nested config (``PackConfig(skip_malformed=True)``: a ``TextConfig`` setting) names it and
    how to pass it, any other names the nearest settings. Returns ``cls`` (usable as a decorator).

    >>> from dataclasses import dataclass, field
    >>> @dataclass(frozen=True, kw_only=True)
    ... class Inner:
    ...     depth: int = 1
    >>> @refuse_unknown_settings
    ... @dataclass(frozen=True, kw_only=True)
    ... class Outer:
    ...     inner: Inner = field(default_factory=Inner)
    ...     width: int = 2
    >>> Outer(depth=3)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: Outer has no setting 'depth': it belongs to Inner; give it as Outer(inner=Inner(depth=3))
    >>> Outer(widht=3)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: Outer has no setting 'widht' (did you mean width?); its settings: inner, width
    """
    import difflib
    import functools

    init: Any = cls.__init__  # type: ignore[misc]
    own = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]

    def nested() -> dict[str, tuple[str, str]]:
        """Setting name -> (field, nested class name) of the nested config dataclasses (found from each
        field's default: a ``default_factory`` class or the default's class)."""
        out: dict[str, tuple[str, str]] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            factory = f.default_factory
            kind = factory if isinstance(factory, type) else type(f.default)
            if f.init and dataclasses.is_dataclass(kind):
                for inner in dataclasses.fields(kind):
                    out.setdefault(inner.name, (f.name, kind.__name__))
        return out

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in own]
        if unknown:
            key = unknown[0]
            inner = nested().get(key)
            if inner is not None:
                field_name, kind = inner
                raise ConfigError(
                    f"{cls.__name__} has no setting {key!r}: it belongs to {kind}; give it as "
                    f"{cls.__name__}({field_name}={kind}({key}={kwargs[key]!r}))",
                    fields=key,
                )
            near = difflib.get_close_matches(key, own, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise ConfigError(
                f"{cls.__name__} has no setting {key!r}{hint}; its settings: {', '.join(own)}", fields=key
            )
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls
