"""What every command shares: one flag per concept, the choice lists shown in help, and the translation of
library field names (``seq_length``) into the flags that set them (``--seq-length``) in error messages.

The choice lists are the library's (``tests/test_cli_consistency.py`` checks they stay equal); they are
spelled out here so that ``longpack --help`` does not import the packing stack.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import typer

# -- choices (shown in help as [a|b|c]) ------------------------------------------------------------------
Algorithm = Literal["best_fit_decreasing", "first_fit_shuffle", "first_fit", "first_fit_decreasing"]
Overlength = Literal["drop", "truncate", "error"]
IdsDtype = Literal["int64", "int32"]
Backend = Literal["local", "ray"]
TextFormat = Literal["auto", "prompt_completion", "chat", "sharegpt", "pretokenized"]
PromptCompletionLossChoice = Literal["completion", "full"]
ChatLossChoice = Literal["assistant", "last_turn", "full"]
Precision = Literal["bf16", "fp8", "mxfp8", "nvfp4"]
Dispatcher = Literal["alltoall", "allgather", "deepep", "hybridep"]
Optimizer = Literal["adam", "adam_bf16_states", "muon"]
DatasetKindChoice = Literal["sft", "direct_hf", "energon", "mock_vlm", "pretraining"]
Schedule = Literal["1f1b", "interleaved"]
Sampler = Literal["batch", "single"]
Workload = Literal["lognormal", "bimodal"]

# -- options shared by pack and sweep (one definition, so their flags and help never drift) --------------
Workers = Annotated[int | None, typer.Option("--workers", help="Tokenizer processes (default: all cores).")]
Format = Annotated[TextFormat, typer.Option("--format", help="How rows are read (auto: detected per file).")]
PromptKey = Annotated[str, typer.Option("--prompt-key")]
CompletionKey = Annotated[str, typer.Option("--completion-key")]
PromptTemplate = Annotated[
    str,
    typer.Option(
        "--prompt-template",
        help=r"Prompt format with {prompt} and other row keys; \n, \t, \r and \\ are read as escapes.",
    ),
]
Separator = Annotated[
    str, typer.Option("--separator", help=r"Text between prompt and completion; \n, \t, \r, \\ escapes.")
]
ToolsKey = Annotated[
    str, typer.Option("--tools-key", help="Column with each row's tool definitions (chat, sharegpt).")
]
PromptCompletionLoss = Annotated[
    PromptCompletionLossChoice, typer.Option("--prompt-completion-loss", help="Tokens that train.")
]
ChatLoss = Annotated[ChatLossChoice, typer.Option("--chat-loss", help="Assistant turns that train.")]
MessagesKey = Annotated[str, typer.Option("--messages-key")]
SkipMalformed = Annotated[bool, typer.Option("--skip-malformed", help="Skip and count malformed rows.")]
Tokenizer = Annotated[
    str | None, typer.Option("--tokenizer", help="tokenizer.json, HF model folder, 'qwen3' or 'bytes'.")
]
PadSeqToMult = Annotated[
    int | None,
    typer.Option(
        "--pad-seq-to-mult", help="Per-sample alignment multiple (default: from --tp/--cp/--sp, else 1)."
    ),
]
Tp = Annotated[int | None, typer.Option("--tp", help="Tensor parallel size (derives --pad-seq-to-mult).")]
Cp = Annotated[int | None, typer.Option("--cp", help="Context parallel size (derives --pad-seq-to-mult).")]
Sp = Annotated[bool, typer.Option("--sp", help="Sequence parallelism on (derives --pad-seq-to-mult).")]
AlgorithmOpt = Annotated[
    Algorithm,
    typer.Option("--algorithm", help="Bin packing; first_fit_shuffle gives Megatron-Bridge's exact rows."),
]
Seed = Annotated[int, typer.Option("--seed", help="Seed of every random step (Megatron: dataset.seed).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
ModelId = Annotated[
    str | None, typer.Option("--model", help="Model: a catalog id (e.g. llama3_1_8b) or a config.json path.")
]
Gpu = Annotated[str | None, typer.Option("--gpu", help="GPU type (e.g. H100_SXM, H200, B200).")]
Gpus = Annotated[int | None, typer.Option("--gpus", help="Number of GPUs (world size).")]
# The default order is longpack.rules.versions.UpstreamVersions.resolve's (not imported here: --help must
# not load the rules); tests/rules/test_rules_versions.py checks the variable names against ENV_VARS.
BridgeVersion = Annotated[
    str | None,
    typer.Option(
        "--bridge-version",
        help="Megatron-Bridge version the rules are for (0.6.0, main; default: $LONGPACK_BRIDGE_VERSION, "
        "else the installed megatron-bridge, else the newest longpack knows).",
    ),
]
McoreVersion = Annotated[
    str | None,
    typer.Option(
        "--megatron-core-version",
        help="Megatron-Core version the rules are for (0.19.0, main; default: $LONGPACK_MEGATRON_CORE_VERSION, "
        "else the installed megatron-core, else the newest longpack knows).",
    ),
]

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    r"""A flag value with the escapes a user types in a shell read as such: ``\n`` newline, ``\t`` tab, ``\r``
    carriage return, ``\\`` one backslash. Any other backslash stays as typed (``\x`` is two characters);
    real newlines (``$'...'`` in bash) pass through.

    >>> unescape(r"Q: {prompt}\nA:"), unescape(r"a\\nb"), unescape(r"\d+")
    ('Q: {prompt}\nA:', 'a\\nb', '\\d+')
    """
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


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
        pattern = rf"(?<![\w./\\-]){re.escape(field)}(?:=True)?(?![\w/\\-]|\.\w)"
        message = re.sub(pattern, flag, message)
    return message
