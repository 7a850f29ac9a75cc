"""The options several jobs share, each written once: a factory per option returns the config field (its
default, help, flag, choices; typed as the value, as ``dataclasses.field`` is), so ``pack``, ``sweep`` and ``preview`` offer the same ``--tokenizer``, the
same ``--tp``/``--cp``/``--sp`` and so on. A job's own options are written in its config.

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True, kw_only=True)
... class Demo:
...     seed: int = seed_option()
>>> option_of(dataclasses.fields(Demo)[0]).help
'Seed of every random step (Megatron: dataset.seed).'
"""

from __future__ import annotations

from typing import Any

from longpack import choices
from longpack.option import Option, option, option_of

__all__ = [
    "BRIDGE_VERSION_HELP",
    "DEMO_TOKENIZER",
    "MCORE_VERSION_HELP",
    "Option",
    "algorithm_option",
    "bridge_version_option",
    "cp_option",
    "demo_option",
    "fp8_recipe_option",
    "gpu_option",
    "gpus_option",
    "hybridep_option",
    "inputs_option",
    "megatron_core_version_option",
    "model_option",
    "option",
    "option_of",
    "pad_seq_to_mult_option",
    "seed_option",
    "sp_option",
    "tokenizer_option",
    "tp_option",
    "workers_option",
]

INPUTS_HELP = "JSONL / Parquet files, folders or globs."
#: The tokenizer of ``--demo`` runs (pack, sweep).
DEMO_TOKENIZER = "qwen3"


def inputs_option(help: str = INPUTS_HELP, *, metavar: str = "[INPUT]...", required: bool = False) -> Any:
    """The data to read: ``INPUT...`` arguments on the command line."""
    return option(
        **({} if required else {"default": ()}),
        help=help,
        positional=True,
        metavar=metavar,
        cli_type=list[str] if required else list[str] | None,
    )


def tokenizer_option() -> Any:
    return option(None, help="tokenizer.json, HF model folder, 'qwen3' or 'bytes'.", cli_type=str | None)


def pad_seq_to_mult_option() -> int | None:
    """One definition of ``pad_seq_to_mult`` for every job: ``None`` means derived from ``tp``/``cp``/``sp``
    (``longpack.jobs.pack.resolve_pad_seq_to_mult``, the one place it is validated), else 1."""
    return option(None, help="Per-sample alignment multiple (default: from --tp/--cp/--sp, else 1).")


def tp_option() -> int | None:
    return option(None, help="Tensor parallel size (derives --pad-seq-to-mult).")


def cp_option() -> int | None:
    return option(None, help="Context parallel size (derives --pad-seq-to-mult).")


def sp_option() -> bool:
    return option(False, help="Sequence parallelism on (derives --pad-seq-to-mult).")


def fp8_recipe_option(help: str = "") -> str | None:
    """``--fp8-recipe``: the kernels' token multiple joins the per-sample one (``longpack.topology
    .kernel_pad_multiple``: MXFP8 32 / FP8 16 tokens per rank)."""
    return option(
        None,
        help=help
        or "FP8 recipe (mxfp8, delayed, ...): adds the kernels' multiple (MXFP8 32 / FP8 16 tokens per rank).",
        cli_type=str | None,
    )


def hybridep_option(help: str = "") -> bool:
    """``--hybridep``: HybridEP's 128-token combine chunk joins the per-sample multiple."""
    return option(False, help=help or "HybridEP dispatch: adds its 128-token chunk to the multiple.")


def algorithm_option() -> str:
    return option(
        choices.DEFAULT_ALGORITHM,
        help="Bin packing; first_fit_shuffle gives Megatron-Bridge's exact rows.",
        choices=choices.ALGORITHMS,
    )


# The default order is longpack.rules.versions.UpstreamVersions.resolve's (given, environment, installed,
# newest known); tests/rules/test_rules_versions.py checks the variable names against its ENV_VARS.
BRIDGE_VERSION_HELP = (
    "Megatron-Bridge version the rules are for (0.6.0, main; default: $LONGPACK_BRIDGE_VERSION, else the "
    "installed megatron-bridge, else the range the config's own keys bound, else the newest known; never "
    "inferred from megatron-core alone)."
)
MCORE_VERSION_HELP = (
    "Megatron-Core version the rules are for (0.19.0, main, dev; default: $LONGPACK_MEGATRON_CORE_VERSION, "
    "else the megatron-core installed beside a megatron-bridge, else the one the Megatron-Bridge version is "
    "built on (kept inside the range the config's Megatron-Core keys bound), else the newest known)."
)


def bridge_version_option() -> str | None:
    """``--bridge-version``: the Megatron-Bridge version ``check``, ``plan`` and ``sweep`` apply rules for."""
    return option(None, help=BRIDGE_VERSION_HELP, cli_type=str | None)


def megatron_core_version_option() -> str | None:
    """``--megatron-core-version``: the Megatron-Core version the rules are applied for."""
    return option(None, help=MCORE_VERSION_HELP, cli_type=str | None)


def seed_option(default: int | None = 0, help: str = "") -> int:
    return option(default, help=help or "Seed of every random step (Megatron: dataset.seed).")


def workers_option() -> int | None:
    return option(None, help="Tokenizer processes (default: all cores).")


def demo_option(what: str) -> bool:
    return option(False, help=f"{what} the built-in demo SFT data (default --tokenizer {DEMO_TOKENIZER}).")


def model_option() -> str | None:
    return option(None, help="Model: a catalog id (e.g. llama3_1_8b) or a config.json path.")


def gpu_option() -> str | None:
    return option(None, help="GPU type (e.g. H100_SXM, H200, B200).")


def gpus_option(*, required: bool = False) -> int:
    help = "Number of GPUs (world size)."
    return option(help=help, cli_type=int) if required else option(None, help=help)
