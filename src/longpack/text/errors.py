"""The one exception type for user-facing input problems."""

from __future__ import annotations

from longpack.errors import InputError as _InputError


class InputError(_InputError):
    """A problem with the user's input data or tokenizer, with its location (``file:line``) and the fix.

    The CLI turns it into exit code 2. Example::

        >>> str(InputError("data.jsonl:3: invalid JSON (Expecting value: column 1); fix the line or pass --skip-malformed"))
        'data.jsonl:3: invalid JSON (Expecting value: column 1); fix the line or pass --skip-malformed'
    """


class RowError(_InputError):
    """One malformed row; the reader adds ``file:line`` and the fix (or skips it with ``skip_malformed``)."""
