"""What the commands share: the translation of library field names (``seq_length``) into the flags that set
them (``--seq-length``) in error messages. The options themselves come from the job configs
(``longpack.cli.generate``), their choice lists from ``longpack.choices``.
"""

from __future__ import annotations

import re

# -- field -> flag ------------------------------------------------------------------------------------
#: Fields whose flag is not ``--`` + the field with ``-`` for ``_`` (the default rule).
#: The generated commands add theirs (a field whose option has its own ``flag``, e.g. ``val_inputs`` ->
#: ``--val-input``); these are the names of library fields no command offers under their own name.
FIELD_FLAGS = {
    "inputs": "INPUT",
    "world_size": "--gpus",
}


def flag_for(field: str) -> str:
    """The CLI flag that sets a library field.

    >>> flag_for("seq_length"), flag_for("val_inputs"), flag_for("text.chat_loss")
    ('--seq-length', '--val-input', '--chat-loss')
    """
    if field in FIELD_FLAGS:
        return FIELD_FLAGS[field]
    return "--" + field.rsplit(".", 1)[-1].replace("_", "-")


#: The fields a ``pad_seq_to_mult_source`` text names (where the alignment came from).
MULT_FIELDS = ("pad_seq_to_mult", "tp", "cp", "sp")


def cli_message(message: str, fields: tuple[str, ...]) -> str:
    """A library error message with the fields it names (``fields``) spelled as CLI flags.

    ``name=True`` becomes the bare flag; names inside paths or longer words are left alone.

    >>> cli_message("seq_length (4096) must not exceed pack_size (2048); lower seq_length",
    ...             ("seq_length", "pack_size"))
    '--seq-length (4096) must not exceed --pack-size (2048); lower --seq-length'
    >>> cli_message("folder /tmp/out exists; set overwrite=True or choose a new out", ("out", "overwrite"))
    'folder /tmp/out exists; set --overwrite or choose a new --out'

    A field name after an article or a noun that makes it a thing ("the store", "token store", "a
    split") is the thing, not the setting: left alone.

    >>> cli_message("token store /s no longer matches; the store was tokenized otherwise: rebuild store", ("store",))
    'token store /s no longer matches; the store was tokenized otherwise: rebuild --store'
    """
    for field in sorted(fields, key=len, reverse=True):
        flag = flag_for(field)
        # ``field=True`` is the bare flag; ``field=2`` speaks of a recorded value, not of the flag: kept
        pattern = rf"(?<![\w./\\-]){re.escape(field)}(?:=True)?(?![\w/\\=-]|\.\w)"

        def swap(m: re.Match[str], flag: str = flag, field: str = field) -> str:
            before = m.string[max(0, m.start() - 12) : m.start()].lower()
            noun = field in _NOUN_FIELDS and _NOUN_BEFORE.search(before)
            return m.group(0) if noun else flag

        message = re.sub(pattern, swap, message)
    return message


#: Fields that are also plain nouns in messages ("the store", "token store"); others are always flags.
_NOUN_FIELDS = frozenset({"store"})
#: Words after which such a field name is a noun (the thing), not the setting: "the store", "token store".
_NOUN_BEFORE = re.compile(r"(?:^|\W)(?:the|a|an|this|that|each|every|token|its|their|one)\s+$")
