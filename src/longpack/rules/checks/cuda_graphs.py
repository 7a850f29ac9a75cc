"""CUDA graphs: static shapes for packed batches, and what a graph may capture."""

from __future__ import annotations

from collections.abc import Iterator

from longpack.rules.checks.common import (
    K_CGI,
    K_CGS,
    K_CP,
    K_IBP,
    K_PCU,
    K_PTML,
    E,
    V,
    W,
    fixed_width,
    pad_cu,
)
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("cuda_graphs", "CUDA graphs")

#: Scopes that capture the MoE router.
ROUTER_SCOPES = {"moe", "moe_router", "moe_preprocess"}


def _te_or_full(s: TrainingSetup) -> bool:
    return s.model.cuda_graph_impl == "transformer_engine" or s.model.full_iteration_graph


@FAMILY.rule(
    "LP-CG-001",
    E,
    "offline packing with TE/full-iteration CUDA graphs needs pad_to_max_length",
    "Bridge ConfigContainer.validate",
    fix="set dataset.dataset_kwargs.pad_to_max_length=true",
)
def cg_fixed_width(s: TrainingSetup) -> Iterator[Violation]:
    """A captured graph replays fixed shapes; with offline packing Megatron-Bridge requires fixed-width rows
    for Transformer Engine and full-iteration graphs, even with an MLP-only scope."""
    if s.dataset.offline_packing and _te_or_full(s) and not fixed_width(s):
        yield V(
            f"offline packing with cuda_graph_impl={s.model.cuda_graph_impl!r} (scope "
            f"{list(s.model.cuda_graph_scope) or 'whole layer'}) and no pad_to_max_length: graphs need static shapes",
            f"set {K_PTML}=true",
            K_CGI,
            K_PTML,
        )


@FAMILY.rule(
    "LP-CG-002",
    E,
    "CUDA graphs that capture packed attention need pad_cu_seqlens",
    "Bridge ConfigContainer.validate",
    fix="set dataset.offline_packing_specs.pad_cu_seqlens=true, or capture only the MLP",
)
def cg_pad_cu(s: TrainingSetup) -> Iterator[Violation]:
    """Packed attention reads ``cu_seqlens``, whose length changes with the number of sequences in a row
    unless padded; full-iteration, whole-layer and attention-scoped graphs capture it."""
    m = s.model
    scope = set(m.cuda_graph_scope) - {"full_iteration"}
    captures_attn = m.full_iteration_graph or (
        m.cuda_graph_impl == "transformer_engine" and (not scope or "attn" in scope)
    )
    if s.dataset.offline_packing and captures_attn and not pad_cu(s):
        yield V(
            f"cuda_graph_impl={m.cuda_graph_impl!r} with scope {list(m.cuda_graph_scope) or 'whole layer'} captures "
            "packed attention, but pad_cu_seqlens=False (cu_seqlens would change shape every step)",
            f"set {K_PCU}=true (needs {K_PTML}=true and the <N>_metadata.jsonl file), or use {K_CGS}=[mlp]",
            K_PCU,
            K_CGS,
        )


@FAMILY.rule(
    "LP-CG-003",
    E,
    "full-iteration CUDA graph needs check_for_nan_in_loss=False",
    "Bridge ConfigContainer.validate",
    fix="set rerun_state_machine.check_for_nan_in_loss=false",
)
def cg_full_iteration_nan(s: TrainingSetup) -> Iterator[Violation]:
    """The NaN check reads the loss on the host inside the step, which a full-iteration graph cannot
    replay; Megatron-Bridge asserts it off."""
    if s.model.full_iteration_graph and s.check_for_nan_in_loss:
        yield V(
            "full-iteration CUDA graph with rerun_state_machine.check_for_nan_in_loss=True",
            "set rerun_state_machine.check_for_nan_in_loss=false",
            "rerun_state_machine.check_for_nan_in_loss",
            K_CGI,
        )


@FAMILY.rule(
    "LP-CG-004",
    E,
    "packed MoE: no router-scoped TE CUDA graphs",
    "Bridge gpt_step forward",
    fix="use an attention-only scope (model.cuda_graph_scope=[attn]) or model.cuda_graph_impl=none",
)
def cg_moe_router(s: TrainingSetup) -> Iterator[Violation]:
    """Packed batches carry a ``padding_mask`` the MoE router must see; Megatron-Bridge refuses
    router-scoped Transformer Engine graphs for them."""
    m = s.model
    if not s.is_moe or m.cuda_graph_impl != "transformer_engine":
        return
    scope = set(m.cuda_graph_scope)
    captures_router = not scope or bool(scope & ROUTER_SCOPES)
    padding_mask = s.dataset.offline_packing or (
        s.dataset.collate_in_batch_packing and s.required_pad_seq_to_mult > 1
    )
    if captures_router and padding_mask:
        yield V(
            f"MoE model with packed batches (they carry padding_mask) and TE CUDA graphs of scope "
            f"{sorted(scope) or 'whole layer'}, which captures the router (Bridge: 'Packed MoE padding masks do "
            "not support router-scoped Transformer Engine CUDA graphs')",
            f"use an attention-only scope ({K_CGS}=[attn]) or {K_CGI}=none",
            K_CGS,
            K_CGI,
        )


@FAMILY.rule(
    "LP-CG-005",
    W,
    "CUDA graphs with variable packed shapes",
    "Bridge performance guide",
    fix="fix the packed width (pad_to_max_length=true), or set model.cuda_graph_impl=none",
)
def cg_variable_shapes(s: TrainingSetup) -> Iterator[Violation]:
    """The performance guide supports CUDA graphs with fixed-size packed sequences only: a new row width is
    a new shape to capture."""
    if not s.model.training_cuda_graph:
        return
    if s.dataset.collate_in_batch_packing and not (s.dataset.pad_to_max_length or s.pp > 1 or s.ep > 1):
        yield V(
            f"cuda_graph_impl={s.model.cuda_graph_impl!r} with collate-time in-batch packing: the packed width "
            "changes every step, and CUDA graphs support fixed-size packed sequences, not varying lengths",
            f"set {K_CGI}=none, or dataset.pad_to_max_length=true",
            K_CGI,
            K_IBP,
        )
    elif s.dataset.offline_packing and s.model.cuda_graph_impl == "local" and not fixed_width(s):
        yield V(
            "cuda_graph_impl='local' with offline packing and no pad_to_max_length: every new row width is "
            "a new shape",
            f"set {K_PTML}=true (and {K_PCU}=true), or {K_CGI}=none",
            K_CGI,
            K_PTML,
        )


@FAMILY.rule(
    "LP-CG-006",
    E,
    "training CUDA graphs with CP > 1 and packed sequences need Megatron-Core 0.19",
    "Megatron-Core PackedSeqParams / TEDotProductAttention (training graphs with CP > 1)",
    fix="upgrade Megatron-Core to 0.19.0+, or model.cuda_graph_impl=none with CP > 1",
)
def cg_cp_packed(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core made training CUDA graphs work with CP > 1 on packed (THD) inputs in 0.19.0
    (``pad_between_seqs`` carried in ``PackedSeqParams``); earlier versions do not replay packed
    attention with CP correctly."""
    if s.model.training_cuda_graph and s.cp > 1 and s.dataset.any_packing:
        yield V(
            f"training CUDA graphs (cuda_graph_impl={s.model.cuda_graph_impl}) with CP={s.cp} and packed sequences "
            "on a Megatron-Core before 0.19.0",
            f"upgrade Megatron-Core to >= 0.19.0, or set {K_CGI}=none",
            K_CGI,
            K_CP,
        )


@FAMILY.rule(
    "LP-CG-007",
    E,
    "locally captured CUDA graphs only for full-iteration capture",
    "Bridge validate_cuda_graph_configuration",
    fix='set model.cuda_graph_impl="transformer_engine" for scoped capture, or the full_iteration scope',
)
def cg_local_scope(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge accepts ``cuda_graph_impl="local"`` only for full-iteration graphs (and local
    inference-scope graphs); scoped per-module capture has to use Transformer Engine's graphs."""
    m = s.model
    if m.cuda_graph_impl == "local" and not m.full_iteration_graph:
        scopes = f" with scopes {list(m.cuda_graph_scope)}" if m.cuda_graph_scope else ""
        yield V(
            f'cuda_graph_impl="local"{scopes}: Megatron-Bridge supports local graphs only for full-iteration capture',
            f'set {K_CGI}="transformer_engine" (scoped capture such as attn or mlp), or {K_CGS}=[full_iteration]',
            K_CGI,
            K_CGS,
        )
