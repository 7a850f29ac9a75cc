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


K_PAD_UNEVEN = "model.moe_hybridep_pad_uneven_dispatch_inputs"


def _variable_hybridep(s: TrainingSetup) -> bool:
    """HybridEP dispatching variable-width packed rows (per-rank token counts can differ)."""
    return s.model.uses_hybridep and s.dataset.any_packing and not fixed_effective(s)


@FAMILY.rule(
    "LP-MOE-005",
    E,
    "eager HybridEP with variable-width packs pads uneven dispatch inputs",
    "Megatron-Core MoEFlexTokenDispatcher (HybridEP THD); Bridge docs (HybridEP THD)",
    fix="set model.moe_hybridep_pad_uneven_dispatch_inputs=true, or fixed-width packs",
)
def moe_hybridep_uneven(s: TrainingSetup) -> Iterator[Violation]:
    """HybridEP needs equal per-rank dispatch sizes. Megatron-Core 0.19 can pad uneven inputs to the group
    maximum, but only on request; Megatron-Bridge from 0.6.0 turns the padding on itself for eager
    HybridEP, so this rule is for older Bridge versions."""
    if (
        _variable_hybridep(s)
        and not s.model.training_cuda_graph
        and not s.model.moe_hybridep_pad_uneven_dispatch_inputs
    ):
        yield V(
            "HybridEP with variable-width packed rows: ranks enter dispatch with different token counts, and "
            "this Megatron-Bridge does not pad them",
            f"set {K_PAD_UNEVEN}=true (pads to the group maximum), or {K_PTML}=true (fixed width)",
            K_PAD_UNEVEN,
            K_PTML,
        )


@FAMILY.rule(
    "LP-MOE-006",
    E,
    "HybridEP with packing needs fixed-width packs (no uneven-input padding)",
    "Megatron-Core MoEFlexTokenDispatcher (HybridEP THD)",
    fix="set dataset.dataset_kwargs.pad_to_max_length=true, or upgrade Megatron-Core to 0.19",
)
def moe_hybridep_fixed_old(s: TrainingSetup) -> Iterator[Violation]:
    """Before Megatron-Core 0.19 HybridEP has no way to pad uneven per-rank inputs: variable-width packs
    give ranks different token counts and the dispatch fails or hangs."""
    if _variable_hybridep(s):
        yield V(
            "HybridEP with variable-width packed rows on a Megatron-Core without uneven-input padding",
            f"set {K_PTML}=true (fixed width, divisible by {HYBRIDEP_CHUNK}), or use Megatron-Core >= 0.19.0 "
            f"with {K_PAD_UNEVEN}=true",
            K_PTML,
        )


@FAMILY.rule(
    "LP-MOE-007",
    E,
    "HybridEP uneven-input padding is not capture-safe under CUDA graphs",
    "Megatron-Core MoEFlexTokenDispatcher (HybridEP THD); Bridge transformer_config (safe HybridEP dispatch)",
    fix="set model.moe_hybridep_pad_uneven_dispatch_inputs=false and use fixed-width packs, or no CUDA graphs",
)
def moe_hybridep_pad_graphs(s: TrainingSetup) -> Iterator[Violation]:
    """The padding path all-reduces the token count and reads it on the host: a CUDA graph cannot capture
    that, so graphed HybridEP must get equal shapes from fixed-width packs instead."""
    if (
        s.model.uses_hybridep
        and s.model.training_cuda_graph
        and s.model.moe_hybridep_pad_uneven_dispatch_inputs
    ):
        yield V(
            f"{K_PAD_UNEVEN}=true with CUDA graphs (cuda_graph_impl={s.model.cuda_graph_impl}): the padding path's "
            "all-reduce and host read are not capture-safe",
            f"set {K_PAD_UNEVEN}=false and {K_PTML}=true (equal shapes), or {K_CGI}=none",
            K_PAD_UNEVEN,
            K_CGI,
        )


@FAMILY.rule(
    "LP-MOE-008",
    W,
    "packed padding counted in MoE router statistics",
    "Bridge docs (packed sequences: MoE padding mask)",
    fix="upgrade Megatron-Bridge (main masks packed padding out of router statistics), or pad less",
)
def moe_router_padding(s: TrainingSetup) -> Iterator[Violation]:
    """Before Megatron-Bridge's THD padding mask, the gaps of fixed-width or aligned packs were routed like
    tokens and counted in the auxiliary loss, z-loss and expert-bias statistics."""
    specs = s.dataset.offline_packing_specs
    pads = fixed_effective(s) or (specs is not None and (specs.pad_seq_to_mult or 1) > 1)
    if s.is_moe and s.dataset.any_packing and pads:
        yield V(
            "MoE with padded packs: this Megatron-Bridge routes the padding and counts it in the load-balancing "
            "loss, z-loss and expert-bias statistics",
            "upgrade Megatron-Bridge to main (padding mask), or keep padding small (pad_to_max_length=false, "
            "the smallest pad_seq_to_mult)",
            K_PTML,
            K_PSS,
        )


@FAMILY.rule(
    "LP-MOE-009",
    E,
    "quantile-balancing routing with packed padding masks",
    "Megatron-Core TopKRouter.routing (quantile balancing); Bridge packed collate (padding_mask)",
    fix="use another model.moe_router_load_balancing_type (aux_loss, seq_aux_loss, none) with packing",
)
def moe_quantile_padding(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge main hands the router a padding mask for offline and Energon packs; Megatron-Core's
    quantile-balancing routing (0.19) asserts that there is none."""
    kind = s.model.moe_router_load_balancing_type
    if s.is_moe and kind == "quantile_balancing" and (s.dataset.offline_packing or s.dataset.energon_packing):
        yield V(
            "moe_router_load_balancing_type=quantile_balancing with packed batches: the packed collate sends a "
            "padding mask, which quantile-balancing routing refuses",
            "set model.moe_router_load_balancing_type to aux_loss, seq_aux_loss or none for packed training",
            "model.moe_router_load_balancing_type",
        )
