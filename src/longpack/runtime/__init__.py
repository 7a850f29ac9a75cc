"""THD runtime: packed rows -> Megatron-Core THD batches, in-batch packing, context-parallel split.

This layer imports torch. Main entry points:

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
