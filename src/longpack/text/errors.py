"""The text layer's input errors: :class:`longpack.errors.InputError` (re-exported, not redefined) and
:class:`RowError`, one malformed row.

>>> str(InputError("data.jsonl:3: invalid JSON (Expecting value: column 1); fix the line or pass --skip-malformed"))
'data.jsonl:3: invalid JSON (Expecting value: column 1); fix the line or pass --skip-malformed'
"""

from __future__ import annotations

from longpack.errors import InputError as _InputError

#: A problem with the user's input data or tokenizer, with its location (``file:line``) and the fix; the
#: CLI turns it into exit code 2. ``longpack.errors.InputError`` itself (one class per name).
InputError = _InputError


class RowError(_InputError):
    """One malformed row; the reader adds ``file:line`` and the fix (or skips it with ``skip_malformed``)."""


class EmptyDocument(RowError):
    """A ``format="text"`` row whose text tokenizes to no token: Megatron-LM's ``preprocess_data.py``
    writes no sequence for it (``encode`` keeps a document only when it has ids; EOD is appended only then),
    so it is not a sample either; the reader counts it, with ``file:line``, as an empty document."""
