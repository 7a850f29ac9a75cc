"""What each output format of the pack job is and can do, as data: one :class:`OutputFormat` record per
format, so that callers read a record instead of comparing format names. A new format is a new record here
(and its writer).

Light on purpose (no numpy, no pyarrow): the job config checks settings against these records before any
heavy module is loaded.

>>> OUTPUT_FORMAT["npy"].bridge_api, OUTPUT_FORMAT["parquet"].suffix, OUTPUT_FORMAT["indexed"].seed_default
('legacy', '.idx.parquet', 1234)
>>> tuple(OUTPUT_FORMAT) == choices.OUTPUT_FORMATS
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longpack import choices

__all__ = [
    "OUTPUT_FORMAT",
    "OutputFormat",
    "Refusal",
    "known_format",
    "load",
    "output_format",
]


@dataclass(frozen=True)
class Refusal:
    """A pack setting that means nothing for a format: given (not its default), the job refuses it with
    ``message``, naming ``fields``."""

    setting: str
    message: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class OutputFormat:
    """One output format of the pack job.

    - ``suffix``: the packed files' suffix (``None``: the writer names its files, as ``.bin`` / ``.idx``).
    - ``writer``: the function that writes it (``module:function``; imported when used).
    - ``refused``: the settings it takes no value for, each with the reason (:class:`Refusal`), in order.
    - ``bridge_api``: the Megatron-Bridge API its ``bridge_config.yaml`` is written for (``"main"``: v0.4.0+;
      ``"legacy"``: <= 0.3.x and NeMo 2; ``None``: not a Megatron-Bridge packed-SFT hand-off).
    - ``seed_default``: the seed when none is given (``None``: 0, or Bridge's with ``compat``).
    - ``spills``: its rows may be filled from tokens spilled to a scratch folder (out-of-core packing).
    - ``sharded``: a split may be cut into several files (``rows_per_shard``); ``default_shards``: it is, by
      default, into shards of about 2**27 tokens (one file with ``compat``).
    - ``executor_writes``: the executor writes its files (``PackExecutor.write``); else the job writes
      every document with ``writer``. ``summary``: the function that turns its manifest into what
      ``longpack pack --json`` prints (``None``: the pack result's own).
    - ``needs``: the executor capabilities it needs (``PackExecutor.supports``), with the refusal when the
      executor lacks one.
    - ``fixed_min_tokens``: a ``text.min_tokens`` the format imposes (Megatron keeps one-token documents).
    - ``sharded_store``: the job can write it from a sharded token store, prefix by prefix
      (``longpack.jobs.sharded_tokenize``): on an executor without ``one_file_per_split`` that supports
      ``sharded_indexed`` (Ray), or locally within ``memory_budget``.
    - ``preference_pairs``: its inputs are preference pairs (prompt, chosen, rejected), tokenized and packed
      on their own (``longpack.jobs.preference``), not SFT rows; ``longpack verify`` checks them with
      ``--dpo``, and a missing ``seq_length`` is ``pack_size`` (a pair is one item of a row: the row bounds
      it).
    - ``summary_lines``: the function that turns its summary (``summary``'s) into the lines ``longpack pack``
      prints (``None``: the pack job's own account).
    """

    name: str
    suffix: str | None
    writer: str
    bridge_api: str | None
    refused: tuple[Refusal, ...] = ()
    seed_default: int | None = None
    spills: bool = False
    sharded: bool = False
    default_shards: bool = False
    executor_writes: bool = True
    summary: str | None = None
    needs: Mapping[str, Refusal] = field(default_factory=dict)
    fixed_min_tokens: int | None = None
    sharded_store: bool = False
    preference_pairs: bool = False
    summary_lines: str | None = None

    def present(self, summary: Mapping[str, Any]) -> list[str] | None:
        """The lines ``longpack pack`` prints for ``summary`` (``None``: the pack job's own account).

        >>> OUTPUT_FORMAT["parquet"].present({}) is None
        True
        """
        return None if self.summary_lines is None else list(load(self.summary_lines)(summary))


def _indexed_refusals() -> tuple[Refusal, ...]:
    why = {
        "val_fraction": "Megatron's --split carves validation documents out of the same prefixes",
        "val_inputs": "pack the validation documents into their own folder and give Megatron both",
        "overlength": "documents are written whole; GPTDataset cuts them into seq_length samples",
        "compat": "compat is Megatron-Bridge's packed SFT format",
        "balance": "indexed data is not packed into rows",
        "row_group_size": "a Parquet setting",
        "pad_seq_to_mult": "indexed data has no per-sample alignment",
        "pad_to_max_length": "a Megatron-Bridge packed-SFT setting",
        "pad_cu_seqlens": "a Megatron-Bridge packed-SFT setting",
        "pack_size": "indexed samples are seq_length tokens (GPTDataset)",
    }
    return (
        *(
            Refusal(name, f"output_format indexed: drop {name} ({reason})", (name, "output_format"))
            for name, reason in why.items()
        ),
        Refusal(
            "ids_dtype",
            "output_format indexed picks the token dtype from the vocabulary (uint16 or int32, as Megatron); "
            "drop ids_dtype",
            ("ids_dtype", "output_format"),
        ),
    )


def _dpo_refusals() -> tuple[Refusal, ...]:
    why = {
        "val_fraction": "NeMo-Aligner reads a packed validation set from its own file: pack it on its own",
        "val_inputs": "pack the validation pairs into their own folder",
        "overlength": "a pair longer than pack_size is dropped and listed, never cut",
        "compat": "compat is Megatron-Bridge's packed SFT format",
        "balance": "packed DPO rows are not balanced across ranks",
        "row_group_size": "a Parquet setting",
        "rows_per_shard": "NeMo-Aligner reads one .npy",
        "ids_dtype": "the rows hold Python ints",
        "pad_seq_to_mult": "NeMo-Aligner's collate pads each batch, not each sequence",
        "pad_to_max_length": "a Megatron-Bridge packed-SFT setting",
        "pad_cu_seqlens": "a Megatron-Bridge packed-SFT setting",
        "mix": "mix the preference data before packing",
        "store": "pairs are tokenized from their text (prompt, chosen, rejected)",
        "memory_budget": "pairs are packed in memory",
    }
    return tuple(
        Refusal(name, f"output_format dpo: drop {name} ({reason})", (name, "output_format"))
        for name, reason in why.items()
    )


OUTPUT_FORMAT: dict[str, OutputFormat] = {
    choices.PARQUET: OutputFormat(
        name=choices.PARQUET,
        suffix=".idx.parquet",
        writer="longpack.packed.pipeline:write_shard_file",
        bridge_api="main",
        spills=True,
        sharded=True,
        default_shards=True,
    ),
    choices.NPY: OutputFormat(
        name=choices.NPY,
        suffix=".npy",
        writer="longpack.packed.pipeline:write_npy_file",
        bridge_api="legacy",
        refused=(
            Refusal(
                "rows_per_shard",
                "output_format npy writes one file per split (Bridge <= 0.3 reads one .npy path); drop "
                "rows_per_shard",
                ("output_format", "rows_per_shard"),
            ),
            Refusal(
                "row_group_size",
                "row_group_size is a Parquet setting; drop it with output_format npy",
                ("output_format", "row_group_size"),
            ),
            Refusal(
                "ids_dtype",
                "ids_dtype is a Parquet setting (npy rows hold Python ints); drop it with output_format npy",
                ("output_format", "ids_dtype"),
            ),
        ),
        needs={
            choices.ONE_FILE_PER_SPLIT: Refusal(
                "backend",
                "output_format npy is written by the local backend (one file per split); use backend local",
                ("output_format", "backend"),
            )
        },
    ),
    choices.INDEXED: OutputFormat(
        name=choices.INDEXED,
        suffix=None,
        writer="longpack.packed.indexed:write_indexed_output",
        bridge_api=None,
        refused=_indexed_refusals(),
        seed_default=choices.BRIDGE_DEFAULT_SEED,  # Megatron-LM's --seed default too (GPTDataset's shuffle)
        sharded=True,  # rows_per_shard: documents per prefix
        executor_writes=False,
        summary="longpack.packed.indexed:indexed_summary",
        summary_lines="longpack.packed.indexed:indexed_summary_lines",
        needs={
            choices.SHARDED_INDEXED: Refusal(
                "backend",
                "output_format indexed is written by backend local or ray (an executor object needs "
                "sharded_indexed)",
                ("output_format", "backend"),
            )
        },
        fixed_min_tokens=1,
        sharded_store=True,
    ),
    choices.DPO: OutputFormat(
        name=choices.DPO,
        suffix=None,
        writer="longpack.packed.preference:write_packed_dpo",
        bridge_api=None,
        refused=_dpo_refusals(),
        executor_writes=False,
        summary="longpack.packed.preference:preference_summary",
        summary_lines="longpack.packed.preference:preference_summary_lines",
        preference_pairs=True,
        needs={
            choices.ONE_FILE_PER_SPLIT: Refusal(
                "backend",
                "output_format dpo is written by the local backend; use backend local",
                ("output_format", "backend"),
            )
        },
    ),
}


def load(target: str) -> Any:
    """The function a record names (``module:function``).

    >>> load(OUTPUT_FORMAT["npy"].writer).__name__
    'write_npy_file'
    """
    import importlib

    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def known_format(name: object) -> OutputFormat | None:
    """The record of a format name, or ``None`` for a name (or value) that is no format, which its own
    check refuses.

    >>> known_format("dpo").preference_pairs, known_format("csv"), known_format(["npy"])
    (True, None, None)
    """
    return OUTPUT_FORMAT.get(name) if isinstance(name, str) else None


def output_format(name: str | None) -> OutputFormat:
    """The record of a format name (``None``: the default format, as a manifest without the key means).

    >>> output_format(None).name
    'parquet'
    """
    return OUTPUT_FORMAT[choices.DEFAULT_OUTPUT_FORMAT if name is None else name]
