"""MoE dispatch: sequence parallelism with EP, HybridEP widths, and expert capacity with packing."""

from __future__ import annotations

import math
from collections.abc import Iterator

from longpack.rules.checks.common import (
    HYBRIDEP_CHUNK,
    K_CGI,
    K_DSEQ,
    K_EP,
    K_PSS,
    K_PTML,
    K_SP,
    K_TP,
    E,
    V,
    W,
    fixed_effective,
)
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("moe", "MoE dispatch")


@FAMILY.rule(
    "LP-MOE-001",
    E,
    "EP > 1 with TP > 1 needs sequence parallelism",
    "MCore ModelParallelConfig",
    fix="set model.sequence_parallel=true",
)
def moe_sp(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core: 'When using expert parallelism and tensor parallelism, sequence parallelism must be
    used'."""
    if s.ep > 1 and s.tp > 1 and not s.sp:
        yield V(
            f"EP={s.ep} and TP={s.tp} with sequence_parallel=False (Megatron-Core: 'When using expert parallelism "
            "and tensor parallelism, sequence parallelism must be used')",
            "set model.sequence_parallel=true",
            K_SP,
            K_EP,
            K_TP,
        )


@FAMILY.rule(
    "LP-MOE-002",
    E,
    "HybridEP fixed packed width divisible by 128",
    "Bridge docs (recommended settings)",
    fix="use a packed width (packed_sequence_size / seq_length) that is a multiple of 128 and the topology multiple",
)
def moe_hybridep_width(s: TrainingSetup) -> Iterator[Violation]:
    """HybridEP combines tokens in 128-token chunks; fixed-width packed rows must be a whole number of
    chunks."""
    width = s.packed_width
    if (
        s.model.uses_hybridep
        and s.dataset.any_packing
        and fixed_effective(s)
        and width
        and width % HYBRIDEP_CHUNK
    ):
        yield V(
            f"HybridEP with fixed-width packed rows of {width} tokens: its {HYBRIDEP_CHUNK}-token combine chunk "
            f"needs a width divisible by {HYBRIDEP_CHUNK}",
            f"use a packed width (packed_sequence_size / seq_length) that is a multiple of "
            f"{math.lcm(HYBRIDEP_CHUNK, s.required_pad_seq_to_mult)}",
            K_PSS,
            K_DSEQ,
            "model.moe_flex_dispatcher_backend",
        )


@FAMILY.rule(
    "LP-MOE-003",
    E,
    "HybridEP with CUDA graphs needs fixed-width packs",
    "Bridge docs (recommended settings)",
    fix="set dataset.dataset_kwargs.pad_to_max_length=true, or model.cuda_graph_impl=none",
)
def moe_hybridep_graphs(s: TrainingSetup) -> Iterator[Violation]:
    """Graphed HybridEP must see equal per-rank dispatch shapes every step, which variable-width packs do
    not give."""
    if (
        s.model.uses_hybridep
        and s.model.training_cuda_graph
        and s.dataset.any_packing
        and not fixed_effective(s)
    ):
        yield V(
            "HybridEP with CUDA graphs and variable-width packed rows: graphed HybridEP must see equal per-rank "
            "dispatch shapes",
            f"set {K_PTML}=true (fixed width), or {K_CGI}=none",
            K_CGI,
            K_PTML,
        )


@FAMILY.rule(
    "LP-MOE-004",
    W,
    "packing with expert capacity / token dropping is untested",
    "Bridge docs (recommended settings)",
    fix="set model.moe_expert_capacity_factor=null (dropless) for packed training",
)
def moe_capacity(s: TrainingSetup) -> Iterator[Violation]:
    """With an expert capacity Megatron-Core may dispatch padding tokens and drop real ones; packing has no
    coverage for token-dropping setups."""
    cf = s.model.moe_expert_capacity_factor
    if s.is_moe and s.dataset.any_packing and cf is not None:
        yield V(
            f"packed batches with moe_expert_capacity_factor={cf}: MCore may dispatch padding tokens, and "
            "expert-capacity/token-dropping setups have no packing coverage",
            "set model.moe_expert_capacity_factor=null (dropless) for packed training, or validate the loss first",
            "model.moe_expert_capacity_factor",
        )
