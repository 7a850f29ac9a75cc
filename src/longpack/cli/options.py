"""What the commands share: the translation of library field names (``seq_length``) into the flags that set
them (``--seq-length``) in error messages, and the typer options of the commands still written by hand
(the generated ones take theirs from their job config: ``longpack.cli.generate``).

The choice lists below are ``longpack.choices``' (``tests/jobs/test_jobs.py::test_cli_choice_lists_are_the_librarys``
checks they stay equal).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import typer

from longpack.jobs.options import BRIDGE_VERSION_HELP, MCORE_VERSION_HELP

# -- choices (shown in help as [a|b|c]) ------------------------------------------------------------------
Algorithm = Literal["best_fit_decreasing", "first_fit_shuffle", "first_fit", "first_fit_decreasing"]
Precision = Literal["bf16", "fp8", "mxfp8", "nvfp4"]
Dispatcher = Literal["alltoall", "allgather", "deepep", "hybridep"]
Optimizer = Literal["adam", "adam_bf16_states", "muon"]
DatasetKindChoice = Literal["sft", "direct_hf", "energon", "mock_vlm", "pretraining"]
Schedule = Literal["1f1b", "interleaved"]
Sampler = Literal["batch", "single"]
Workload = Literal["lognormal", "bimodal"]

# -- options the commands not yet generated from their configs share --------------------------------------
Seed = Annotated[int, typer.Option("--seed", help="Seed of every random step (Megatron: dataset.seed).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
Gpus = Annotated[int | None, typer.Option("--gpus", help="Number of GPUs (world size).")]
# Help written once, with the job options (longpack.jobs.options); check and plan are not generated yet.
BridgeVersion = Annotated[str | None, typer.Option("--bridge-version", help=BRIDGE_VERSION_HELP)]
McoreVersion = Annotated[str | None, typer.Option("--megatron-core-version", help=MCORE_VERSION_HELP)]


# -- field -> flag ------------------------------------------------------------------------------------
#: Fields whose flag is not ``--`` + the field with ``-`` for ``_`` (the default rule).
FIELD_FLAGS = {
    "inputs": "INPUT",
    "val_inputs": "--val-input",
    "pack_lengths": "--pack-size",
    "model_shape": "--model-shape",
    "text.format": "--format",
    "gpus": "--gpus",
    "world_size": "--gpus",
    "backend": "--backend",
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
    """
    for field in sorted(fields, key=len, reverse=True):
        flag = flag_for(field)
        # ``field=True`` is the bare flag; ``field=2`` speaks of a recorded value, not of the flag: kept
        pattern = rf"(?<![\w./\\-]){re.escape(field)}(?:=True)?(?![\w/\\=-]|\.\w)"
        message = re.sub(pattern, flag, message)
    return message
