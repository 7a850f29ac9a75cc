"""Checks of single setting values, shared by every config and command: one wording, one rule.

Sizes are positive integers everywhere (``0`` is an error, never "unset"; ``True`` is not the integer 1);
counts and seeds are non-negative integers; fractions and rates are finite numbers in a range; switches
are booleans. Each check returns the value it accepted (an ``int`` for integer-valued numpy scalars) or
raises :class:`~longpack.errors.ConfigError` naming the field, the value and what is expected.

>>> positive_int(8, "tp"), optional_positive_int(None, "cp"), finite_float(0.5, "val_fraction", lo=0.0, hi=1.0)
(8, None, 0.5)
>>> positive_int(0, "cp")
Traceback (most recent call last):
...
longpack.errors.ConfigError: cp must be a positive integer, got 0
>>> finite_float(float("nan"), "imbalance", lo=1.0)
Traceback (most recent call last):
...
longpack.errors.ConfigError: imbalance must be a finite number >= 1, got nan
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from longpack.errors import ConfigError, LongpackError

__all__ = [
    "MAX_SEED",
    "finite_float",
    "flag",
    "non_negative_int",
    "one_of",
    "optional_positive_int",
    "plain_fields",
    "plain_value",
    "positive_int",
    "seed",
]


def _as_int(value: Any) -> int | None:
    """``value`` as an ``int`` if it is an integer (Python or numpy), not a bool; else ``None``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def positive_int(value: Any, field: str, *, at_most: int | None = None, why: str = "") -> int:
    """``value`` if it is an integer >= 1 (and <= ``at_most``); ``why`` explains the upper bound.

    >>> positive_int(4, "workers")
    4
    >>> positive_int(True, "pp")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: pp must be a positive integer, got True
    >>> positive_int(100, "cp", at_most=64, why="one process per rank")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: cp must be at most 64 (one process per rank), got 100
    """
    number = _as_int(value)
    if number is None or number < 1:
        raise ConfigError(f"{field} must be a positive integer, got {value!r}", fields=field)
    if at_most is not None and number > at_most:
        reason = f" ({why})" if why else ""
        raise ConfigError(f"{field} must be at most {at_most}{reason}, got {value!r}", fields=field)
    return number


def optional_positive_int(value: Any, field: str, **bounds: Any) -> int | None:
    """``None`` (not given) or a positive integer, as :func:`positive_int`.

    >>> optional_positive_int(2, "vpp"), optional_positive_int(None, "vpp")
    (2, None)
    """
    return None if value is None else positive_int(value, field, **bounds)


#: Seeds go to ``np.random.RandomState`` (Megatron-Bridge's shuffle), which takes ``0..2**32-1``.
MAX_SEED = 2**32 - 1


def non_negative_int(value: Any, field: str, *, at_most: int | None = None) -> int:
    """``value`` if it is an integer >= 0 (a count, an index that cannot be negative), <= ``at_most``.

    >>> non_negative_int(0, "rounds")
    0
    >>> non_negative_int(-1, "rounds")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: rounds must be a non-negative integer, got -1
    """
    number = _as_int(value)
    if number is None or number < 0:
        raise ConfigError(f"{field} must be a non-negative integer, got {value!r}", fields=field)
    if at_most is not None and number > at_most:
        raise ConfigError(f"{field} must be at most {at_most}, got {value!r}", fields=field)
    return number


def seed(value: Any, field: str = "seed") -> int:
    """A random seed: an integer in ``0..2**32-1``.

    >>> seed(1234)
    1234
    >>> seed(2**32)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: seed must be at most 4294967295, got 4294967296
    """
    return non_negative_int(value, field, at_most=MAX_SEED)


def finite_float(
    value: Any,
    field: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``value`` as a float if it is a finite real number within ``[lo, hi]`` (open ends as asked).

    >>> finite_float(1, "tflops", lo=0.0, lo_open=True)
    1.0
    >>> finite_float(1.0, "val_fraction", lo=0.0, hi=1.0, hi_open=True)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: val_fraction must be a finite number in [0, 1), got 1.0
    >>> finite_float("0.1", "val_fraction")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: val_fraction must be a finite number, got '0.1'
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    number = float(value) if ok else math.nan
    if ok and math.isfinite(number):
        ok = (lo is None or (number > lo if lo_open else number >= lo)) and (
            hi is None or (number < hi if hi_open else number <= hi)
        )
    else:
        ok = False
    if not ok:
        if lo is not None and hi is not None:
            where = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        elif lo is not None:
            where = f" {'>' if lo_open else '>='} {lo:g}"
        elif hi is not None:
            where = f" {'<' if hi_open else '<='} {hi:g}"
        else:
            where = ""
        raise ConfigError(f"{field} must be a finite number{where}, got {value!r}", fields=field)
    return number


def one_of(
    value: Any, allowed: Sequence[Any], field: str, *, error: type[LongpackError] = ConfigError
) -> Any:
    """``value`` if it is one of ``allowed`` (a choice list of ``longpack.choices``), else ``error``: the one
    message for a value outside its choices.

    >>> one_of("npy", ("parquet", "npy"), "output_format")
    'npy'
    >>> one_of("csv", ("parquet", "npy"), "output_format")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: output_format must be one of parquet, npy, got 'csv'
    """
    if value not in allowed:
        raise error(f"{field} must be one of {', '.join(map(str, allowed))}, got {value!r}", fields=field)
    return value


def flag(value: Any, field: str) -> bool:
    """``value`` if it is a bool (``"no"`` is not false, ``1`` is not true).

    >>> flag(False, "overwrite")
    False
    >>> flag("no", "overwrite")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: overwrite must be True or False, got 'no'
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be True or False, got {value!r}", fields=field)
    return value


def plain_value(value: Any) -> Any:
    """``value`` with numpy scalars (``np.int32(8)``, ``np.float32(0.1)``, ``np.bool_(True)``) as the
    Python ``int`` / ``float`` / ``bool`` they hold, also inside lists and tuples; a one-dimensional numpy
    array of numbers as the tuple of them (``pack_lengths=np.array([4096, 8192])``); anything else as is.

    A config keeps what it is given, and what it keeps is written (YAML, JSON) after the work is done:
    a numpy scalar there cannot be written, so it is made plain on the way in.

    >>> import numpy as np
    >>> plain_value(np.int32(8)), plain_value((np.int64(2), 3)), plain_value("x")
    (8, (2, 3), 'x')
    >>> type(plain_value(np.bool_(True))).__name__
    'bool'
    >>> plain_value(np.array([4096, 8192]))
    (4096, 8192)
    """
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    if (
        type(value).__module__ == "numpy"
        and getattr(value, "ndim", None) == 1
        and getattr(getattr(value, "dtype", None), "kind", "") in ("i", "u", "f", "b")
    ):
        return tuple(value.tolist())
    if isinstance(value, list | tuple) and any(type(v).__module__ == "numpy" for v in value):
        return type(value)(plain_value(v) for v in value)
    return value


def _list_only(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` takes only a list (``Sequence[int]``, ``Sequence[str] |
    None``), not also one value (``Sequence[int] | str`` takes ``"2048,4096"``)."""
    text = str(annotation).replace(" ", "")
    if not text.startswith("Sequence["):
        return False
    depth = 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0 and char == "]":
            return text[i + 1 :] in ("", "|None")
    return False


def plain_fields(config: Any) -> None:
    """Make every field of the (frozen) dataclass ``config`` plain (:func:`plain_value`); every
    ``*Config.__post_init__`` calls it first, so its checks and its writers see Python values only.

    A field that takes a list (``Sequence[int]``) given one value takes it as a list of one: ``cp=4`` is
    ``cp=(4,)`` (it was a bare ``TypeError``), ``dtype="float64"`` is ``("float64",)`` (not the letters).
    """
    import dataclasses
    from pathlib import PurePath

    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, str | bytes | int | float | PurePath) and _list_only(f.type):
            value = (value,)
            object.__setattr__(config, f.name, value)
        plain = plain_value(value)
        if plain is not value:
            object.__setattr__(config, f.name, plain)
