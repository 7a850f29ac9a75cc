"""Parameter counts and Megatron's training FLOPs per token (docs/reference/planner-model.md#flops).

FLOPs follow ``megatron/training/training.py::num_floating_point_operations`` (the convention behind
every NVIDIA "Model TFLOP/s/GPU" figure): every weight GEMM counts 6 FLOP per weight per token
(forward, dgrad, wgrad; 2 FLOP per MAC), core attention is causal-halved, recompute is not counted,
the router GEMM is not counted, logits are counted once per MTP depth plus once for the main head.
For packed (THD) batches the attention context is ``Σ Lᵢ² / Σ Lᵢ`` instead of the row length.

>>> from longpack.planner.catalog import load_model
>>> round(flops_per_token(load_model("deepseek_v3"), 4096) / 1e9, 1)
260.0
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from longpack.planner.catalog import ModelSpec

# --------------------------------------------------------------------------------------------------
# Per-component parameter counts
# --------------------------------------------------------------------------------------------------


def attention_linear_params(model: ModelSpec) -> int:
    """Weights of one softmax-attention block's projections (incl. MLA latent norms, output gate).

    GQA: ``h·(q + 2·kv) + q·h`` (+ ``h·q`` for a gated output). MLA:
    ``r_q·(h + a·(d_n+d_r)) + h·(r_kv + d_r) + r_kv·a·(d_n+d_v) + a·d_v·h + r_q + r_kv``.

    >>> from longpack.planner.catalog import load_model
    >>> round(attention_linear_params(load_model("deepseek_v3")) / 1e6, 1)
    187.1
    """
    att = model.attention
    h = model.hidden_size
    if att.kind == "mla":
        a = att.num_heads
        qk = att.qk_nope_head_dim + att.qk_rope_head_dim
        # without q LoRA the query is one h x a(d_n+d_r) projection
        q_term = att.q_lora_rank * (h + a * qk) + att.q_lora_rank if att.q_lora_rank else h * a * qk
        kv_term = att.kv_lora_rank * (h + a * (att.qk_nope_head_dim + att.v_head_dim)) + att.kv_lora_rank
        return q_term + kv_term + h * att.qk_rope_head_dim + a * att.v_head_dim * h
    q, kv = att.q_width, att.kv_width
    gate = q if att.output_gate else 0
    return h * (q + 2 * kv + gate) + q * h


def gdn_params(model: ModelSpec) -> int:
    """Weights of one Gated DeltaNet layer's mixer (in_proj q,k,v,z,b,a; depthwise conv; out_proj)."""
    g = model.gdn
    if g is None:
        return 0
    qk = g.num_key_heads * g.key_head_dim
    v = g.num_value_heads * g.value_head_dim
    h = model.hidden_size
    return h * (2 * qk + 2 * v + 2 * g.num_value_heads) + g.conv_kernel_dim * (2 * qk + v) + v * h


def mixer_params(model: ModelSpec, index: int) -> int:
    """Token-mixer weights of layer ``index`` (softmax attention or Gated DeltaNet), without norms."""
    if model.layer_is_softmax_attention(index):
        return attention_linear_params(model)
    return gdn_params(model)


@dataclass(frozen=True, kw_only=True)
class LayerParams:
    """Parameters of one decoder layer in Megatron's three sharding buckets.

    ``dense`` is TP-sharded (projections, dense MLP, shared experts), ``replicated`` is not sharded
    (norms, router, shared-expert gate), ``expert`` are the routed experts (sharded by EP·ETP).
    ``expert_active`` counts only ``top_k`` experts (for FLOPs and "active" parameter counts).
    """

    dense: int
    replicated: int
    expert: int
    expert_active: int

    @property
    def total(self) -> int:
        """All weights of the layer."""
        return self.dense + self.replicated + self.expert

    @property
    def active(self) -> int:
        """Weights touched by one token."""
        return self.dense + self.replicated + self.expert_active


@functools.lru_cache(maxsize=65536)
def layer_params(model: ModelSpec, index: int) -> LayerParams:
    """Parameters of decoder layer ``index`` split into sharding buckets.

    >>> from longpack.planner.catalog import load_model
    >>> p = layer_params(load_model("qwen3_30b_a3b"), 0)
    >>> p.expert // 10**6, p.dense // 10**6
    (603, 18)
    """
    h = model.hidden_size
    att = model.attention
    norms = 2 * h
    if model.layer_is_softmax_attention(index) and att.kind == "gqa" and att.qk_layernorm:
        norms += 2 * att.head_dim
    dense = mixer_params(model, index)
    replicated = norms
    expert = expert_active = 0
    if model.layer_is_moe(index):
        assert model.moe is not None
        moe = model.moe
        per_expert = model.gamma * h * moe.moe_ffn_hidden_size
        expert = moe.num_experts * per_expert
        expert_active = moe.top_k * per_expert
        dense += model.gamma * h * moe.shared_ffn_hidden_size
        replicated += h * moe.num_experts + (h if moe.shared_expert_gate else 0)
    else:
        dense += model.gamma * h * model.ffn_hidden_size
    return LayerParams(dense=dense, replicated=replicated, expert=expert, expert_active=expert_active)


def mtp_extra_params(model: ModelSpec) -> int:
    """Per MTP depth, the weights beyond its transformer layer: ``eh_proj`` (2h·h) + 3 norms."""
    h = model.hidden_size
    return 2 * h * h + 3 * h


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Whole-model parameter counts. ``*_main`` exclude MTP modules (publishers' headline numbers).

    >>> from longpack.planner.catalog import load_model
    >>> c = param_counts(load_model("deepseek_v3"))
    >>> round(c.total_main / 1e9, 2), round(c.active_main / 1e9, 2)
    (671.03, 37.55)
    """

    total_main: int
    active_main: int
    total_with_mtp: int
    active_with_mtp: int
    embedding: int
    routed_expert: int

    @property
    def active_nonembedding_main(self) -> int:
        """Active parameters without input/output embeddings (what "6N" shortcuts use)."""
        return self.active_main - self.embedding


def param_counts(model: ModelSpec) -> ParamCounts:
    """Total and active parameters (input and output embeddings counted separately when untied)."""
    h = model.hidden_size
    embedding = model.vocab_size * h * (1 if model.tie_embeddings else 2)
    total = active = embedding + h  # + final norm
    routed = 0
    for i in range(model.num_layers):
        p = layer_params(model, i)
        total += p.total
        active += p.active
        routed += p.expert
    mtp_total = mtp_active = 0
    if model.mtp_layers:
        p = layer_params(model, model.mtp_layer_index)
        mtp_total = model.mtp_layers * (p.total + mtp_extra_params(model))
        mtp_active = model.mtp_layers * (p.active + mtp_extra_params(model))
    return ParamCounts(
        total_main=total,
        active_main=active,
        total_with_mtp=total + mtp_total,
        active_with_mtp=active + mtp_active,
        embedding=embedding,
        routed_expert=routed,
    )


# --------------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------------


def core_attention_coefficient(model: ModelSpec) -> float:
    """``C_core``: core-attention FLOP/6 per token per unit of context for one softmax layer.

    GQA/MHA: ``a·d`` (QKᵀ and PV, causal-halved). MLA: ``a·(d_n+d_r)/2 + a·d_v/2``.

    >>> from longpack.planner.catalog import load_model
    >>> core_attention_coefficient(load_model("qwen3_30b_a3b"))
    4096.0
    """
    att = model.attention
    if att.kind == "mla":
        return att.num_heads * (att.qk_nope_head_dim + att.qk_rope_head_dim) / 2 + att.o_width / 2
    return float(att.q_width)


def effective_context(seq_length: int | None = None, sub_lengths: Sequence[int] | None = None) -> float:
    """Attention context per token: ``s`` for a BSHD row, ``Σ Lᵢ² / Σ Lᵢ`` for packed (THD) sequences.

    >>> effective_context(4096), effective_context(sub_lengths=[1024, 3072])
    (4096.0, 2560.0)
    """
    if sub_lengths is not None:
        lengths = np.asarray(sub_lengths, dtype=np.float64)
        if lengths.size == 0 or np.any(lengths <= 0):
            raise ValueError("sub_lengths must be a non-empty sequence of positive lengths")
        return float(np.sum(lengths**2) / np.sum(lengths))
    if seq_length is None or seq_length < 1:
        raise ValueError(f"seq_length must be a positive integer, got {seq_length!r}")
    return float(seq_length)


@dataclass(frozen=True, kw_only=True)
class FlopsBreakdown:
    """Training FLOPs per token by kind (Megatron convention). ``total`` is their sum.

    ``dense_gemm``: attention/GDN projections, dense MLPs, shared experts, MTP ``eh_proj``;
    ``expert_gemm``: routed experts (top-k); ``logits``: output heads; ``attention``: core attention
    (QKᵀ, PV) and the GDN chunk term.
    """

    dense_gemm: float
    expert_gemm: float
    logits: float
    attention: float

    @property
    def total(self) -> float:
        """FLOPs per token."""
        return self.dense_gemm + self.expert_gemm + self.logits + self.attention


def _gdn_chunk_flops(model: ModelSpec) -> float:
    """Megatron's count of the gated delta rule per token (forward): ``4·H_v·d_v²``, the FLOP convention of
    published TFLOP/s figures (``training.py::gdn_layer_flops``). The kernel's real work is larger; see
    :func:`chunked_delta_rule_flops`."""
    g = model.gdn
    assert g is not None
    return 4.0 * g.num_value_heads * g.value_head_dim**2


#: Chunk length of flash-linear-attention's ``chunk_gated_delta_rule`` (its default, and what
#: Megatron-Core's ``GatedDeltaNet`` sets: ``megatron/core/ssm/gated_delta_net/gdn.py``, ``chunk_size = 64``).
GDN_CHUNK = 64


def chunked_delta_rule_flops(key_dim: int, value_dim: int, chunk: int = GDN_CHUNK) -> float:
    """Forward FLOPs per token and head of the chunked (gated) delta rule, as flash-linear-attention computes it.

    Per chunk of ``C`` tokens: ``A = β·K·Kᵀ`` (``C²·d_k`` multiply-adds), the ``(I + A)⁻¹`` triangular
    solve (``≈ C³/3``), ``W = A·K`` and ``U = A·V`` (``C²·(d_k + d_v)``), the state pass
    ``V' = U − W·S`` and ``S ← S·γ + Kᵀ·V'`` (``2·C·d_k·d_v``), and the output ``O = Q·S + (Q·Kᵀ ⊙ M)·V'``
    (``C·d_k·d_v + C²·(d_k + d_v)``): per token ``6·d_k·d_v + 2C·(3·d_k + 2·d_v) + 2C²/3`` FLOPs, a state
    term ``O(d_k·d_v)`` and an intra-chunk term ``O(C·d)``, both independent of the sequence length.

    >>> round(chunked_delta_rule_flops(128, 128))
    182955
    """
    return 6.0 * key_dim * value_dim + 2.0 * chunk * (3 * key_dim + 2 * value_dim) + 2.0 * chunk * chunk / 3


def gdn_kernel_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one Gated DeltaNet layer's chunk kernel (all value heads; the query and
    key heads are repeated to the value heads before the kernel, as Megatron-Core does).

    >>> from longpack.planner.catalog import load_model
    >>> m = load_model("qwen3_next_80b_a3b")
    >>> round(gdn_kernel_flops_per_token(m) / 1e6, 2), round(gdn_kernel_flops_per_token(m) / _gdn_chunk_flops(m), 1)
    (5.85, 2.8)
    """
    g = model.gdn
    if g is None:
        return 0.0
    return g.num_value_heads * chunked_delta_rule_flops(g.key_head_dim, g.value_head_dim)


@functools.lru_cache(maxsize=65536)
def layer_flops(model: ModelSpec, index: int, context: float) -> FlopsBreakdown:
    """Training FLOPs per token of decoder layer ``index`` (MTP layers use the last index).

    >>> from longpack.planner.catalog import load_model
    >>> round(layer_flops(load_model("llama3_1_8b"), 0, 4096).total / 1e9, 2)
    1.41
    """
    p = layer_params(model, index)
    dense_weights = p.dense  # projections + dense MLP / shared experts; norms and router are not counted
    attention = 0.0
    if model.layer_is_softmax_attention(index):
        attention = 6.0 * core_attention_coefficient(model) * context
    else:
        attention = 6.0 * _gdn_chunk_flops(model)
    return FlopsBreakdown(
        dense_gemm=6.0 * dense_weights,
        expert_gemm=6.0 * p.expert_active,
        logits=0.0,
        attention=attention,
    )


def flops_breakdown(
    model: ModelSpec,
    seq_length: int | None = None,
    *,
    sub_lengths: Sequence[int] | None = None,
    include_mtp: bool = True,
    context: float | None = None,
) -> FlopsBreakdown:
    """Training FLOPs per token of the whole model, split by kind (see :class:`FlopsBreakdown`).

    >>> from longpack.planner.catalog import load_model
    >>> b = flops_breakdown(load_model("qwen3_235b_a22b"), 4096)
    >>> round(b.total / 1e9, 1), round(b.attention / b.total, 3)
    (148.0, 0.128)
    """
    if context is not None:  # already effective (``Σ Lᵢ² / Σ Lᵢ`` of a mean packed row)
        return _flops_breakdown_cached(model, float(context), include_mtp)
    if sub_lengths is None:
        return _flops_breakdown_cached(model, effective_context(seq_length), include_mtp)
    return _flops_breakdown_cached(model, effective_context(seq_length, sub_lengths), include_mtp)


@functools.lru_cache(maxsize=4096)
def _flops_breakdown_cached(model: ModelSpec, context: float, include_mtp: bool) -> FlopsBreakdown:
    """Cached body of :func:`flops_breakdown` (the context is already effective)."""
    dense = expert = attention = 0.0
    for i in range(model.num_layers):
        f = layer_flops(model, i, context)
        dense += f.dense_gemm
        expert += f.expert_gemm
        attention += f.attention
    n_mtp = model.mtp_layers if include_mtp else 0
    if n_mtp:
        f = layer_flops(model, model.mtp_layer_index, context)
        dense += n_mtp * (f.dense_gemm + 6.0 * mtp_extra_params(model))
        expert += n_mtp * f.expert_gemm
        attention += n_mtp * f.attention
    logits = 6.0 * model.hidden_size * model.vocab_size * (1 + n_mtp)
    return FlopsBreakdown(dense_gemm=dense, expert_gemm=expert, logits=logits, attention=attention)


def flops_per_token(
    model: ModelSpec,
    seq_length: int | None = None,
    *,
    sub_lengths: Sequence[int] | None = None,
    include_mtp: bool = True,
) -> float:
    """Megatron training FLOPs per token (fwd + bwd, no recompute) at context ``seq_length``.

    ``sub_lengths`` (packed THD data) replaces the context by ``Σ Lᵢ² / Σ Lᵢ``.

    >>> from longpack.planner.catalog import load_model
    >>> m = load_model("qwen3_30b_a3b")
    >>> round(flops_per_token(m, 4096) / 1e9, 1)
    23.0
    >>> flops_per_token(m, sub_lengths=[4096]) == flops_per_token(m, 4096)
    True
    """
    return flops_breakdown(model, seq_length, sub_lengths=sub_lengths, include_mtp=include_mtp).total
