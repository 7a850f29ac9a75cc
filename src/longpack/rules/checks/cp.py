"""Context parallelism and sequence lengths: CP splits, loss settings, all-to-all and collate multiples.

>>> cp_divides_seq_length(8192, cp=2), cp_divides_seq_length(8190, cp=2), cp_divides_seq_length(7, cp=1)
(True, False, True)
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from longpack.rules.checks.common import (
    INFO,
    K_AIC,
    K_CP,
    K_DSEQ,
    K_PTL,
    K_SEQ,
    K_SP,
    K_TP,
    E,
    V,
    multiple_text,
)
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation
from longpack.topology import align_up

FAMILY = RuleFamily("cp", "Context parallelism and sequence lengths")


def cp_divides_seq_length(seq_length: int, *, cp: int) -> bool:
    """With CP > 1 every sequence splits into ``2*CP`` chunks (zigzag load balance), so ``2*CP`` divides
    the sequence length (``LP-CP-001``)."""
    return cp <= 1 or seq_length % (2 * cp) == 0


@FAMILY.rule(
    "LP-CP-001",
    E,
    "model.seq_length divisible by 2*CP when CP > 1",
    "Bridge ConfigContainer.validate",
    fix="set model.seq_length and dataset.seq_length to a multiple of 2*CP",
)
def cp_seq_length(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge asserts ``seq_length % (2*CP) == 0``: context parallelism cuts every sequence into
    ``2*CP`` chunks and gives each CP rank one from the front and one from the back."""
    seq = s.model_seq_length
    if seq and not cp_divides_seq_length(seq, cp=s.cp):
        up = align_up(seq, 2 * s.cp)
        yield V(
            f"seq_length={seq} is not divisible by 2*CP = {2 * s.cp} (Bridge: 'Sequence length must be "
            "divisible by 2 * context parallel size')",
            f"set model.seq_length and dataset.seq_length to a multiple of {2 * s.cp} (e.g. {up})",
            K_SEQ,
            K_CP,
        )


@FAMILY.rule(
    "LP-CP-002",
    E,
    "finetuning with CP > 1 needs calculate_per_token_loss=True",
    "Bridge ConfigContainer.validate",
    fix="set model.calculate_per_token_loss=true",
)
def cp_per_token_loss(s: TrainingSetup) -> Iterator[Violation]:
    """With CP a rank can hold only masked (prompt) tokens; averaging its loss per rank divides by zero.
    Megatron-Bridge asserts per-token loss for every finetuning dataset with CP > 1."""
    if s.cp > 1 and s.dataset.kind.is_finetuning and not s.model.calculate_per_token_loss:
        yield V(
            f"CP={s.cp} with a {s.dataset.kind} dataset and calculate_per_token_loss=False: a CP rank "
            "whose tokens are all masked produces a NaN loss",
            "set model.calculate_per_token_loss=true",
            K_PTL,
            K_CP,
        )


@FAMILY.rule(
    "LP-CP-003",
    E,
    "finetuning with CP > 1 needs ddp.average_in_collective=False",
    "Bridge ConfigContainer.validate",
    fix="set ddp.average_in_collective=false",
)
def cp_average_in_collective(s: TrainingSetup) -> Iterator[Violation]:
    """Per-token loss sums tokens over ranks; averaging inside the gradient collective would divide twice.
    Megatron-Bridge asserts it off for finetuning with CP > 1."""
    if s.cp > 1 and s.dataset.kind.is_finetuning and s.average_in_collective:
        yield V(
            f"CP={s.cp} with a {s.dataset.kind} dataset and ddp.average_in_collective=True",
            "set ddp.average_in_collective=false",
            K_AIC,
            K_CP,
        )


def _a2a_level(s: TrainingSetup) -> tuple[int, str] | None:
    types = set(s.model.cp_comm_type)
    if "a2a" in types:
        return s.cp, "a2a over the whole CP group"
    if "a2a+p2p" in types and s.model.hierarchical_context_parallel_sizes:
        return s.model.hierarchical_context_parallel_sizes[0], "the a2a level of a2a+p2p"
    return None


@FAMILY.rule(
    "LP-CP-004",
    E,
    "CP all-to-all needs heads/TP and KV heads/TP divisible by the a2a size",
    "MCore / TransformerEngine cp_comm_type",
    fix="use cp_comm_type p2p, or a2a+p2p with an a2a level dividing the heads per TP rank, or change TP",
)
def cp_a2a_heads(s: TrainingSetup) -> Iterator[Violation]:
    """All-to-all context parallelism (Ulysses style) trades the sequence split for a head split, so the
    heads of each TP rank must divide by the all-to-all group size."""
    level = _a2a_level(s)
    if level is None or s.cp == 1:
        return
    size, what = level
    for name, key, n in (
        ("num_attention_heads", "model.num_attention_heads", s.model.num_attention_heads),
        ("num_query_groups (KV heads)", "model.num_query_groups", s.model.num_query_groups),
    ):
        if not n or n % s.tp:
            continue
        local = n // s.tp
        if local % size:
            yield V(
                f"{name}/TP = {n}/{s.tp} = {local} is not divisible by {size} ({what}, cp_comm_type="
                f"{list(s.model.cp_comm_type)})",
                f"use cp_comm_type p2p (or a2a+p2p with a smaller a2a level dividing {local}), or change TP",
                "model.cp_comm_type",
                key,
                K_TP,
            )


@FAMILY.rule(
    "LP-CP-005",
    E,
    "hierarchical_context_parallel_sizes multiply to CP",
    "MCore / TransformerEngine cp_comm_type",
    fix="give model.hierarchical_context_parallel_sizes whose product is CP",
)
def cp_hierarchy_product(s: TrainingSetup) -> Iterator[Violation]:
    """Hierarchical CP (``a2a+p2p``) nests an all-to-all group inside a ring; the level sizes multiply to
    the CP size."""
    sizes = s.model.hierarchical_context_parallel_sizes
    if sizes and math.prod(sizes) != s.cp:
        yield V(
            f"hierarchical_context_parallel_sizes={list(sizes)} multiply to {math.prod(sizes)}, not CP={s.cp}",
            f"give sizes whose product is {s.cp}, e.g. [{min(8, s.cp)}, {s.cp // min(8, s.cp)}] for a2a+p2p",
            "model.hierarchical_context_parallel_sizes",
            K_CP,
        )


@FAMILY.rule(
    "LP-CP-006",
    E,
    "cp_comm_type a2a+p2p needs hierarchical_context_parallel_sizes",
    "MCore / TransformerEngine cp_comm_type",
    fix="set model.hierarchical_context_parallel_sizes=[a2a_size, p2p_size] with product CP",
)
def cp_hierarchy_required(s: TrainingSetup) -> Iterator[Violation]:
    """``a2a+p2p`` needs to know how the CP group splits into its all-to-all and ring levels."""
    if "a2a+p2p" in s.model.cp_comm_type and not s.model.hierarchical_context_parallel_sizes:
        yield V(
            "cp_comm_type uses a2a+p2p but hierarchical_context_parallel_sizes is not set",
            f"set model.hierarchical_context_parallel_sizes=[a2a_size, p2p_size] with product CP (CP={s.cp})",
            "model.cp_comm_type",
            "model.hierarchical_context_parallel_sizes",
        )


@FAMILY.rule(
    "LP-CP-007",
    E,
    "DirectHF/Energon/MockVLM seq_length divisible by the CP/SP collate multiple",
    "Bridge ConfigContainer.validate",
    fix="set dataset.seq_length (and model.seq_length) to a multiple of lcm(2*CP, CP*TP with SP)",
)
def cp_collate_multiple(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge pads DirectHF, Energon and MockVLM rows to ``lcm(2*CP, CP*TP with SP)`` and
    requires ``dataset.seq_length`` to be a multiple of it."""
    if not s.dataset.kind.has_pad_to_max_length_attr:
        return
    seq = s.dataset.seq_length if s.dataset.seq_length is not None else s.model.seq_length
    m = s.required_pad_seq_to_mult
    if seq and m > 1 and seq % m:
        yield V(
            f"dataset.seq_length={seq} is not divisible by the CP/SP collate padding multiple {multiple_text(s)}",
            f"set dataset.seq_length (and model.seq_length) to a multiple of {m}",
            K_DSEQ,
            K_CP,
            K_TP,
            K_SP,
        )


@FAMILY.rule(
    "LP-CP-008",
    INFO,
    "CP shards of at least ~4096 tokens (docs rule of thumb)",
    "Bridge docs (recommended settings)",
    fix="use CP ~ seq_length/4096 and spend the other GPUs on data parallelism",
)
def cp_shard_size(s: TrainingSetup) -> Iterator[Violation]:
    """The Megatron-Bridge performance guide suggests CP ~ seq_len/4096 (4096-8192 tokens per shard);
    smaller shards spend more time communicating than computing."""
    seq = s.model_seq_length
    if s.cp > 1 and seq and seq // s.cp < 4096:
        yield V(
            f"seq_length {seq} / CP {s.cp} = {seq // s.cp} tokens per CP rank; the docs suggest CP ~ "
            "seq_len/4096 and 4096-8192 tokens per shard (CP pays off from ~8K)",
            f"consider CP={max(1, seq // 4096)} and spend the GPUs on DP",
            K_CP,
        )


@FAMILY.rule(
    "LP-SEQ-001",
    E,
    "model.seq_length equals dataset.seq_length",
    "Bridge ConfigContainer.validate",
    fix="set model.seq_length and dataset.seq_length to the same value",
)
def seq_lengths_match(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge asserts that the model and dataset sequence lengths match."""
    ms, ds = s.model.seq_length, s.dataset.seq_length
    if ms is not None and ds is not None and ms != ds:
        yield V(
            f"model.seq_length={ms} differs from dataset.seq_length={ds} (Bridge: 'Please ensure sequence length "
            "configuration in model config and dataset config match')",
            f"set both to the same value (model.seq_length={ds} or dataset.seq_length={ms})",
            K_SEQ,
            K_DSEQ,
        )


@FAMILY.rule(
    "LP-CP-009",
    E,
    "Bridge's THD context-parallel split needs Megatron-Core 0.18",
    "Bridge packed_seq_utils (THD CP partitioning)",
    fix="upgrade Megatron-Core to 0.18.0+, or train packed data with CP=1",
)
def cp_thd_needs_mcore(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge 0.6.0 splits packed (THD) batches over CP ranks with Megatron-Core's
    ``get_batch_on_this_cp_rank(..., is_hybrid_cp=...)``, which Megatron-Core has from 0.18.0; with an
    older Megatron-Core the first packed CP step raises."""
    if s.cp > 1 and s.dataset.any_packing:
        yield V(
            f"packed sequences with CP={s.cp} on a Megatron-Core before 0.18.0: Bridge's THD CP split needs "
            "get_batch_on_this_cp_rank(..., is_hybrid_cp=...)",
            "upgrade Megatron-Core to >= 0.18.0, or set model.context_parallel_size=1",
            K_CP,
        )


CP_PARTITION_MODES = ("zigzag", "contiguous")


@FAMILY.rule(
    "LP-CP-010",
    E,
    "cp_partition_mode is zigzag or contiguous; contiguous CP needs a packing scheduler's THD inputs",
    "Megatron-Core dev TransformerConfig.__post_init__ (cp_partition_mode, #5087)",
    fix="set model.cp_partition_mode=zigzag, or run the packing scheduler (model.sequence_packing_scheduler)",
)
def cp_partition_mode(s: TrainingSetup) -> Iterator[Violation]:
    """How a packed row is split over the CP ranks: ``zigzag`` (two chunks per rank, the load-balanced
    default every earlier path uses) or ``contiguous`` (one chunk per rank; DeepSeek-V4's hybrid attention
    and gated delta nets need it). Megatron-Core refuses other names, and ``contiguous`` under CP unless a
    sequence-packing scheduler builds the THD batches (the legacy CP slicing, Bridge's included, is
    zigzag only); MTP with TP > 1 and SP is refused with it too (a known padding-mask bug)."""
    mode = s.model.cp_partition_mode
    if mode is None:
        return
    key = "model.cp_partition_mode"
    if mode not in CP_PARTITION_MODES:
        yield V(
            f"cp_partition_mode={mode!r} is not one of {', '.join(CP_PARTITION_MODES)}",
            f"set {key}=zigzag",
            key,
        )
        return
    distributed = s.cp > 1 or s.model.dynamic_context_parallel or s.model.hybrid_context_parallel
    if mode != "contiguous" or not distributed:
        return
    if not s.model.sequence_packing_scheduler and not (
        s.model.dynamic_context_parallel or s.model.hybrid_context_parallel
    ):
        yield V(
            f"cp_partition_mode='contiguous' with CP={s.cp} but no sequence_packing_scheduler: the CP batch "
            "slicing without a scheduler (Bridge's packed THD split included) only does zigzag",
            f"set {key}=zigzag, or pack with the scheduler (dataset.enable_global_batch_packing=true)",
            key,
            K_CP,
        )
    if (s.model.mtp_num_layers or 0) > 0 and s.tp > 1 and s.sp:
        yield V(
            f"cp_partition_mode='contiguous' with MTP, TP={s.tp} and sequence parallelism: Megatron-Core refuses "
            "the combination (a known token-side padding-mask bug)",
            f"set {key}=zigzag, or model.tensor_model_parallel_size=1 / model.sequence_parallel=false",
            key,
            "model.mtp_num_layers",
        )


@FAMILY.rule(
    "LP-CP-011",
    E,
    "inter-document masking with CP > 1: Bridge splits every document into 2*CP chunks",
    "Megatron-Core GPTDatasetConfig.inter_document_masking (f88b85f8c6); Bridge gpt_step packed CP split",
    fix="set dataset.inter_document_masking=false with CP > 1 in Megatron-Bridge (or train without CP)",
)
def idm_cp(s: TrainingSetup) -> Iterator[Violation]:
    """With ``inter_document_masking`` the pretraining dataset returns ``cu_seqlens`` at document
    boundaries. Megatron-LM's ``pretrain_gpt.py`` then splits the sample per sequence
    (``use_per_sequence_balancing``), because raw documents are not multiples of ``2*CP``; Bridge's
    ``gpt_step`` (067f987df) sees the ``cu_seqlens`` and takes its packed THD split, which cuts every
    document into ``2*CP`` equal chunks and fails on the first document that is not a multiple."""
    if not s.dataset.inter_document_masking or s.cp <= 1:
        return
    yield V(
        f"dataset.inter_document_masking with CP={s.cp}: documents are not padded to multiples of 2*CP = "
        f"{2 * s.cp}, and Bridge's packed CP split needs every one to be",
        "set dataset.inter_document_masking=false (attention then crosses documents, as without it), or "
        "train this with Megatron-LM's pretrain_gpt.py (it splits per sequence)",
        "dataset.inter_document_masking",
        K_CP,
    )
