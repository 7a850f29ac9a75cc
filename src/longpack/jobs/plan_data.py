"""The packs a corpus makes, for planning from the data (``longpack plan --data``).

``corpus_packs(data, ...)`` returns the runtime sequence lengths of every training pack, in the order a
training run reads them:

* a **packed folder** (``longpack pack`` output, or Megatron-Bridge's own): its training rows as written;
* a **token store** (``longpack tokenize``): its samples packed as ``longpack pack --store`` would;
* anything else is read as **inputs** (JSONL / Parquet files, folders, globs) with a tokenizer and packed
  exactly as ``longpack pack`` would at the plan's sequence length and ``pad_seq_to_mult``.

>>> from longpack.jobs.plan_data import split_rows
>>> split_rows([3, 5, 2, 7], [2, 2])
[[3, 5], [2, 7]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack.choices import DEFAULT_OVERLENGTH
from longpack.errors import ConfigError, InputError


@dataclass(frozen=True, kw_only=True)
class CorpusPacks:
    """The packs of a corpus and where they came from."""

    packs: list[list[int]]
    pack_size: int
    source: str  # "packed folder" | "token store" | "inputs"
    samples: int
    #: Samples left out of the packs: longer than ``seq_length`` (the ``drop`` policy of ``longpack pack``)
    #: or empty; 0 for a packed folder (what it holds was packed).
    dropped: int = 0


def split_rows(sample_lengths: Sequence[int], samples_per_row: Sequence[int]) -> list[list[int]]:
    """Cut the samples' lengths (row after row) into rows."""
    ends = np.cumsum(np.asarray(samples_per_row, dtype=np.int64))
    starts = ends - np.asarray(samples_per_row, dtype=np.int64)
    flat = [int(n) for n in sample_lengths]
    return [flat[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]


def _is_packed_folder(path: Path) -> bool:
    from longpack.packed.folder import is_data_name
    from longpack.packed.manifest import MANIFEST_NAME
    from longpack.store import is_store

    return (
        path.is_dir()
        and not is_store(path)
        and (
            (path / MANIFEST_NAME).is_file()
            or any(is_data_name(p.name) for p in path.iterdir() if p.is_file())
        )
    )


def corpus_packs(
    data: Sequence[str | Path],
    *,
    seq_length: int,
    pad_seq_to_mult: int,
    tokenizer: Any = None,
    text: Any = None,
    seed: int = 0,
    overlength: str = DEFAULT_OVERLENGTH,
) -> CorpusPacks:
    """The training packs of ``data`` (see the module docstring). A packed folder whose pack size is not
    ``seq_length`` is refused (its rows were packed for another length), as are inputs without a tokenizer."""
    if not data:
        raise ConfigError("data: give a packed folder or input files", fields="data")
    first = Path(data[0])
    try:
        packed_folder = len(data) == 1 and _is_packed_folder(first)
    except OSError as exc:  # a name too long for the file system, a folder that cannot be listed
        raise InputError(
            f"data {str(first)[:200]!r}: cannot be read ({exc.strerror or exc}); give a packed folder, a token "
            "store or input files",
            fields="data",
        ) from None
    if packed_folder:
        from longpack.packed.folder import PackedFolder

        folder = PackedFolder.open(first, split="training", allow_no_manifest=True)
        try:
            size = folder.pack_size
            if size is not None and size != seq_length:
                raise ConfigError(
                    f"data {first} was packed at {size} tokens but the plan is for seq_length {seq_length}; plan "
                    f"with seq_length {size} or re-pack it at {seq_length} tokens",
                    fields=("data", "seq_length"),
                )
            scan = folder.scan("training")
            packs = split_rows(scan.sample_runtime.tolist(), scan.samples_per_row.tolist())
            return CorpusPacks(
                packs=packs, pack_size=size or seq_length, source="packed folder", samples=scan.samples
            )
        finally:
            folder.close()
    from longpack.store import is_store

    if len(data) == 1 and is_store(first):
        from longpack.jobs.stores import open_store

        tokenized, _, _ = open_store(first, tokenizer=tokenizer)
        source = "token store"
    else:
        if tokenizer is None:
            from longpack.jobs.executors import input_read_errors
            from longpack.text.inputs import find_inputs

            with input_read_errors():  # a path that does not exist is named before the missing tokenizer
                find_inputs([str(p) for p in data])
            raise ConfigError(
                "data: inputs are tokenized and packed for the plan; give a tokenizer (or a packed folder or a "
                "token store)",
                fields=("data", "tokenizer"),
            )
        from longpack.jobs.executors import input_read_errors
        from longpack.text import TextConfig, tokenize_inputs
        from longpack.text.tokenizers import as_tokenizer

        with input_read_errors():
            tokenized = tokenize_inputs(
                [str(p) for p in data], tokenizer=as_tokenizer(tokenizer), config=text or TextConfig()
            )
        source = "inputs"
    from longpack.packed.pipeline import PackSettings, plan_split

    eos_id = tokenized.tokenizer.get("eos_id")
    if eos_id is None:
        raise InputError("the tokenizer has no EOS id; packing pads with EOS", fields="tokenizer")
    settings = PackSettings(
        seq_length=seq_length, pad_seq_to_mult=pad_seq_to_mult, seed=seed, overlength=overlength
    )
    aligned = settings.align(tokenized.samples, eos_id=int(eos_id))
    if len(aligned) == 0:
        raise InputError(
            f"data: no sample fits seq_length {seq_length}: all {len(tokenized.samples)} are longer (or empty) "
            f"and are dropped; plan with a larger seq_length (the longest sample's runtime length is "
            f"{int(tokenized.samples.runtime_lengths().max(initial=0))} tokens)",
            fields=("data", "seq_length"),
        )
    split = plan_split("training", tokenized.samples, settings, eos_id=int(eos_id), aligned=aligned)
    lengths = split.aligned.runtime_lengths()
    plan = split.plan
    packs = [
        [int(lengths[i]) for i in plan.order[plan.row_offsets[j] : plan.row_offsets[j + 1]]]
        for j in range(plan.num_rows)
    ]
    return CorpusPacks(
        packs=packs,
        pack_size=seq_length,
        source=source,
        samples=len(tokenized.samples),
        dropped=len(aligned.dropped),
    )
