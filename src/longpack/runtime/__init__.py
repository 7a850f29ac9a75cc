"""THD runtime: packed rows -> Megatron-Core THD batches, in-batch packing, context-parallel split.

The torch parts of this layer import torch; the dataset does not. Every name below is imported on first
use (PEP 562), so ``from longpack.runtime import PackedDataset`` loads numpy and pyarrow only, and torch
comes in with the first torch batch (``collate_packed``, ``PackedCollator``, ...). Main entry points:

- :class:`~longpack.runtime.dataset.PackedDataset`: random access to packed Parquet (file, folder or glob).
- :func:`~longpack.runtime.collate.collate_packed` / :class:`~longpack.runtime.collate.PackedCollator`:
  Megatron-Bridge's packed collate (main contract, optional legacy keys).
- :func:`~longpack.runtime.in_batch.pack_right_padded_batch`: in-batch packing of a right-padded micro-batch;
  :func:`~longpack.runtime.in_batch.build_visual_thd_batch` / :class:`~longpack.runtime.in_batch.VisualInBatchCollator`
  for prepared VLM sequences.
- :mod:`~longpack.runtime.context_parallel`: zigzag indices (BSHD and THD) and :func:`shard_batch`.
- :mod:`~longpack.runtime.attention`: reference varlen attention, ring and all-gather CP attention.
- :func:`~longpack.runtime.megatron.to_packed_seq_params`: Megatron-Core ``PackedSeqParams``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> module that defines it; imported on first attribute access.
_LAZY = {
    "allgather_attention": "attention",
    "ring_attention": "attention",
    "token_layout": "attention",
    "varlen_attention": "attention",
    "PackedCollator": "collate",
    "collate_packed": "collate",
    "load_pack_metadata": "collate",
    "shard_batch": "context_parallel",
    "thd_partition_indices": "context_parallel",
    "zigzag_indices": "context_parallel",
    "PackedDataset": "dataset",
    "resolve_packed_parquet_paths": "dataset",
    "validate_row": "dataset",
    "VisualInBatchCollator": "in_batch",
    "build_thd_row": "in_batch",
    "build_visual_thd_batch": "in_batch",
    "pack_right_padded_batch": "in_batch",
    "packed_padding_mask": "in_batch",
    "packed_seq_params_kwargs": "megatron",
    "to_packed_seq_params": "megatron",
}

if TYPE_CHECKING:
    from longpack.runtime.attention import allgather_attention, ring_attention, token_layout, varlen_attention
    from longpack.runtime.collate import PackedCollator, collate_packed, load_pack_metadata
    from longpack.runtime.context_parallel import shard_batch, thd_partition_indices, zigzag_indices
    from longpack.runtime.dataset import PackedDataset, resolve_packed_parquet_paths, validate_row
    from longpack.runtime.in_batch import (
        VisualInBatchCollator,
        build_thd_row,
        build_visual_thd_batch,
        pack_right_padded_batch,
        packed_padding_mask,
    )
    from longpack.runtime.megatron import packed_seq_params_kwargs, to_packed_seq_params


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'longpack.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"longpack.runtime.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "PackedCollator",
    "PackedDataset",
    "VisualInBatchCollator",
    "allgather_attention",
    "build_thd_row",
    "build_visual_thd_batch",
    "collate_packed",
    "load_pack_metadata",
    "pack_right_padded_batch",
    "packed_padding_mask",
    "packed_seq_params_kwargs",
    "resolve_packed_parquet_paths",
    "ring_attention",
    "shard_batch",
    "thd_partition_indices",
    "to_packed_seq_params",
    "token_layout",
    "validate_row",
    "varlen_attention",
    "zigzag_indices",
]
