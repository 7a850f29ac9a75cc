"""The one exception base of longpack and its subclasses, one per layer.

Every failure a user can cause (bad data, a bad setting, an output folder that cannot be written, a
packed folder that cannot be read, a layout that cannot fit) raises a :class:`LongpackError`. Its message
names what it is about (``file:line``, the field and its value) and the fix. The CLI prints the message
(field names spelled as its flags) and exits with code 2; any other exception is a bug in longpack and is
reported as one (exit code 3).

The subclasses also derive from the built-in type callers caught before this module existed
(``ValueError``, ``FileExistsError``, ``RuntimeError``), so ``except ValueError`` keeps working.

>>> try:
...     raise ConfigError("pack.seq_length: must be a positive integer, got 0; pass e.g. seq_length=4096")
... except LongpackError as exc:
...     print(type(exc).__name__, "|", exc)
ConfigError | pack.seq_length: must be a positive integer, got 0; pass e.g. seq_length=4096
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendError",
    "BatchError",
    "CatalogError",
    "ConfigError",
    "DamagedDataError",
    "InputError",
    "LongpackError",
    "LongpackWarning",
    "MissingDependencyError",
    "OnlineError",
    "OutputError",
    "OutputExistsError",
    "PackedDataError",
    "PlanError",
    "StorageError",
    "warn_all",
]


class LongpackError(Exception):
    """Base of every user-facing longpack failure; the message says what, where and how to fix it.

    ``fields`` names the settings the message is about, as Python names (``seq_length``, ``text.format``);
    a front end that spells them differently (the CLI: ``--seq-length``) translates those names in the
    message. The message itself speaks of fields, never of one front end's flags.

    >>> e = LongpackError("seq_length must be positive, got 0", fields="seq_length")
    >>> e.fields, e.field, str(e)
    (('seq_length',), 'seq_length', 'seq_length must be positive, got 0')
    >>> import pickle; pickle.loads(pickle.dumps(e)).fields  # survives worker processes
    ('seq_length',)
    """

    def __init__(self, *args: object, fields: str | tuple[str, ...] = ()) -> None:
        super().__init__(*args)
        self.fields: tuple[str, ...] = (fields,) if isinstance(fields, str) else tuple(fields)

    @property
    def field(self) -> str | None:
        """The first (main) field the message is about, or ``None``."""
        return self.fields[0] if self.fields else None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.fields), self.__dict__)


def _rebuild(cls: type[LongpackError], args: tuple[object, ...], fields: tuple[str, ...]) -> LongpackError:
    exc = cls.__new__(cls, *args)
    LongpackError.__init__(exc, *args, fields=fields)
    return exc


class InputError(LongpackError, ValueError):
    """Input data or a tokenizer cannot be used: a file, a row (``file:line``), a column, a template."""


class ConfigError(LongpackError, ValueError):
    """A setting is invalid: the message names the field (or config key with ``file:line``) and value."""


class OutputError(LongpackError, OSError):
    """An output path cannot be written (not a folder, not writable, locked by another run, disk full)."""


class OutputExistsError(OutputError, FileExistsError):
    """The output folder exists and overwriting it was not asked for (or is refused)."""


class StorageError(LongpackError, OSError):
    """Object storage (``s3://``, any fsspec URL) failed: a missing bucket, denied access, a dropped
    connection, an interrupted upload; the message names the URL, what was being done and the fix."""


class PackedDataError(LongpackError, ValueError):
    """A packed folder or file cannot be read as packed data: missing, unfinished, corrupt or mismatched."""


class DamagedDataError(PackedDataError):
    """The bytes of a packed file are damaged: it no longer opens as Parquet (or ``.npy``), or a row group
    cannot be decoded. ``longpack inspect --verify`` and ``longpack verify`` report it as a failed check
    (exit 1, like a manifest that no longer matches); elsewhere it is the command's input error (exit 2)."""


class BatchError(LongpackError, ValueError):
    """Rows cannot become a THD batch (collate, in-batch packing, context-parallel split)."""


class OnlineError(LongpackError, ValueError):
    """The online packer was given invalid samples or a state that does not match it."""


class CatalogError(ConfigError):
    """A model or GPU is not in the catalog, or a catalog / ``config.json`` entry is invalid."""


class PlanError(ConfigError):
    """A planning request cannot be answered: invalid sizes, or no layout fits (with the reasons)."""


class BackendError(LongpackError, RuntimeError):
    """An execution backend (Ray) failed in a way the user can act on (cannot connect, task kept failing)."""


class MissingDependencyError(LongpackError, ImportError):
    """An optional package is not installed; the message names the extra that installs it
    (``pip install 'longpack[pack]'``)."""


class LongpackWarning(UserWarning):
    """What a job's CLI prints as ``warning: ...``, issued to Python callers as a warning (the CLI, which
    prints them itself, filters them out)."""


def warn_all(messages: Any, *, stacklevel: int = 3) -> None:
    """Issue each message as a :class:`LongpackWarning` (``stacklevel`` 3: the caller of the job's ``run``)."""
    import warnings

    for message in messages or ():
        warnings.warn(str(message), LongpackWarning, stacklevel=stacklevel)
