"""What a pipeline rank holds, shared by the memory and the time model (pure Python).

Layer kinds (MoE or dense FFN × softmax or linear attention: per-layer costs depend on the kind only),
the tensors one decoder layer saves for backward (``layer_activation_terms``: bytes for the memory model,
recompute and dispatch traffic for the time model), the split of layers over (virtual) pipeline stages
and the micro-batches of a step. ``memory`` and ``timing`` both import this module and not each other.

>>> from longpack.planner.catalog import load_model
>>> from longpack.planner.options import PlanLayout
>>> from longpack.topology import ParallelLayout
>>> m = load_model("deepseek_v3")
>>> plan = PlanLayout(layout=ParallelLayout(world_size=64, pp=4), mbs=1)
>>> counts = stage_counts_for(m, plan)
>>> sum(counts) == m.num_layers, num_microbatches(plan, 64)
(True, 4)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from longpack.planner.arithmetic import GDN_CHUNK, flops_breakdown
from longpack.planner.catalog import ModelSpec
from longpack.planner.options import PlanError, PlanLayout, stage_layer_counts


@dataclass(frozen=True)
class ActivationTerm:
    """Elements saved for backward per token by one module of one layer.

    ``bytes_per_element`` is 2 (BF16), 4 (FP32) or ``None`` for a GEMM input (1 B under FP8
    recipes, 2 B otherwise). ``expert`` terms live on the expert rank (``k`` copies per token,
    scaled by routing imbalance); ``etp_split`` terms are further divided by ETP.
    """

    name: str
    elements: float
    removed_by: tuple[str, ...]
    bytes_per_element: float | None = 2.0
    expert: bool = False
    etp_split: bool = False


# Attention output O: fused/flash attention saves O for its backward and the output projection saves
# its GEMM input. Under FP8 GEMMs one might expect a BF16 O (attention) plus an FP8 copy
# (projection), which `core_attn` recompute would halve; the Llama-3-70B FP8 measurements show no
# such saving ([mlp] 55.6 GB = [mlp, core_attn] 55.6 GB, calibration cp239/cp240), so O is counted
# once, as a GEMM input, and `core_attn` drops only the softmax statistics.
def _attention_output_terms(o_width: int, num_heads: int) -> list[ActivationTerm]:
    return [
        ActivationTerm("attn_out", o_width, (), None),
        ActivationTerm("softmax_lse", num_heads, ("core_attn",), 4.0),
    ]


def layer_activation_terms(model: ModelSpec, index: int, dispatcher: str) -> list[ActivationTerm]:
    """Saved-for-backward tensors of decoder layer ``index`` (docs/reference/planner-model.md#activations).

    >>> from longpack.planner.catalog import load_model
    >>> terms = layer_activation_terms(load_model("deepseek_v3"), 10, "alltoall")
    >>> round(sum(t.elements for t in terms) / 1e3)
    285
    """
    h = model.hidden_size
    att = model.attention
    # Megatron-Core's TE layer spec fuses a norm into the following GEMM (TELayerNormColumnParallelLinear)
    # wherever nothing else reads the norm output: the input norm of GQA attention and the pre-MLP norm
    # of a dense MLP; those norms are IdentityOp modules and `layernorm` recompute skips them
    # (TransformerLayer.__init__: recompute_input_layernorm / recompute_pre_mlp_layernorm only "if not
    # isinstance(..., IdentityOp)"). The fused module still saves the norm input and its output (the GEMM
    # input, FP8 under FP8 recipes). MLA's input norm and the MoE pre-router norm are separate TENorm
    # modules, which `layernorm` does recompute. Measured: Llama-3-70B FP8 [core_attn, layernorm] peaks
    # at 59.6 GB vs 58.8 GB for [core_attn] (calibration cp241 vs cp238) — no saving.
    gqa = model.layer_is_softmax_attention(index) and att.kind != "mla"
    input_norm_recompute: tuple[str, ...] = () if gqa else ("layernorm",)
    terms: list[ActivationTerm] = [
        ActivationTerm("input_norm_in", h, ()),
        ActivationTerm("input_norm_out", h, input_norm_recompute, None),
    ]
    if not model.layer_is_softmax_attention(index):
        g = model.gdn
        assert g is not None
        qk = g.num_key_heads * g.key_head_dim
        v = g.num_value_heads * g.value_head_dim
        # FLA's chunk_gated_delta_rule saves q and k as it receives them (Megatron-Core repeats the key
        # heads to the value heads first), v, the decay g (FP32), beta and the chunk matrix A (C per
        # token and head); it recomputes the per-chunk states in backward
        # (fla/ops/gated_delta_rule/chunk.py: save_for_backward).
        kernel_qk = 2 * g.num_value_heads * g.key_head_dim if g.num_value_heads != g.num_key_heads else 2 * qk
        terms += [
            ActivationTerm("gdn_in_proj", 2 * qk + 2 * v + 2 * g.num_value_heads, ()),
            ActivationTerm("gdn_conv", 2 * qk + v, ()),
            ActivationTerm("gdn_kernel_qk", kernel_qk, ()),
            ActivationTerm("gdn_chunk_a", g.num_value_heads * GDN_CHUNK, ()),
            ActivationTerm("gdn_decay", g.num_value_heads, (), 4.0),
            ActivationTerm("gdn_core_out", v, ()),
            ActivationTerm("gdn_norm_out", v, ("gdn_norm_out",), None),
        ]
    elif att.kind == "mla":
        r_q, r_kv = att.q_lora_rank, att.kv_lora_rank
        terms += [
            ActivationTerm("q_latent", r_q, (), None),
            ActivationTerm("q_latent_norm", r_q, ("layernorm",), None),
            ActivationTerm("kv_latent", r_kv + att.qk_rope_head_dim, (), None),
            ActivationTerm("kv_latent_norm", r_kv, ("layernorm",), None),
            ActivationTerm("q_up", att.q_width, ("mla_up_proj",)),
            ActivationTerm("k_up", att.kv_width, ("mla_up_proj",)),
            ActivationTerm("v_up", att.v_width, ("mla_up_proj",)),
            *_attention_output_terms(att.o_width, att.num_heads),
        ]
    else:
        gate = att.q_width if att.output_gate else 0
        terms += [
            ActivationTerm("qkv", att.q_width + 2 * att.kv_width + gate, ()),
            *_attention_output_terms(att.o_width, att.num_heads),
        ]
        if att.output_gate:
            # the output gate multiplies the attention output by sigmoid(gate): the product's backward
            # keeps both factors, the ungated output (the fused kernel's O, which the gated product
            # replaces as the projection input) and the sigmoid
            terms.append(ActivationTerm("attn_gate_sigmoid", gate, ()))
            terms.append(ActivationTerm("attn_out_ungated", att.o_width, ()))
    moe_layer = model.layer_is_moe(index)
    terms += [
        ActivationTerm("pre_mlp_norm_in", h, ()),
        ActivationTerm("pre_mlp_norm_out", h, ("layernorm",) if moe_layer else (), None),
    ]
    if moe_layer:
        assert model.moe is not None
        moe = model.moe
        k, fe = moe.top_k, moe.moe_ffn_hidden_size
        terms += [
            ActivationTerm("router_probs", moe.num_experts, ("moe",), 4.0),
            ActivationTerm("dispatched_tokens", k * h, ("moe",), None, expert=True),
            ActivationTerm("expert_fc1_out", 2 * k * fe, ("moe",), expert=True, etp_split=True),
            ActivationTerm("expert_act_out", k * fe, ("moe", "moe_act"), None, expert=True, etp_split=True),
        ]
        if dispatcher in ("alltoall", "allgather"):
            # without the fused/memory-efficient permutation the expert outputs are kept for the probs grad
            terms.append(ActivationTerm("expert_out_unpermuted", k * h, ("moe",), expert=True))
        if moe.shared_ffn_hidden_size:
            fs = moe.shared_ffn_hidden_size
            terms += [
                ActivationTerm("shared_fc1_out", 2 * fs, ("moe", "shared_experts")),
                ActivationTerm("shared_act_out", fs, ("moe", "shared_experts"), None),
            ]
    else:
        f = model.ffn_hidden_size
        fc1 = 2 * f if model.gated_mlp else f
        terms += [
            ActivationTerm("mlp_fc1_out", fc1, ("mlp",)),
            ActivationTerm("mlp_act_out", f, ("mlp",), None),
        ]
    return terms


@functools.lru_cache(maxsize=256)
def kind_representatives(model: ModelSpec) -> tuple[int, ...]:
    """For each layer index (MTP included), the first index of a layer of the same kind (MoE or dense
    FFN × softmax or linear attention): per-layer costs only depend on the kind.

    >>> from longpack.planner.catalog import load_model
    >>> kind_representatives(load_model("deepseek_v3"))[:5]
    (0, 0, 0, 3, 3)
    """
    first: dict[tuple[bool, bool], int] = {}
    out = []
    for i in range(model.num_layers):
        key = (model.layer_is_moe(i), model.layer_is_softmax_attention(i))
        out.append(first.setdefault(key, i))
    return tuple(out)


def num_microbatches(plan: PlanLayout, gbs: int) -> int:
    """Micro-batches per pipeline per step, ``m = GBS / (MBS · DP)``.

    >>> from longpack.topology import ParallelLayout
    >>> num_microbatches(PlanLayout(layout=ParallelLayout(world_size=64, pp=4), mbs=2), 256)
    8
    """
    denom = plan.mbs * plan.layout.dp
    if gbs % denom:
        raise PlanError(
            f"gbs={gbs} is not divisible by mbs*dp = {plan.mbs}*{plan.layout.dp} = {denom}; "
            "choose a global batch that is a multiple of it"
        )
    return gbs // denom


def stage_counts_for(model: ModelSpec, plan: PlanLayout) -> tuple[int, ...]:
    """Decoder layers per virtual stage, balancing the output layer and MTP on the last stage."""
    return _stage_counts(model, plan.layout.pp, plan.vpp)


@functools.lru_cache(maxsize=4096)
def _stage_counts(model: ModelSpec, p: int, v: int) -> tuple[int, ...]:
    if p * v == 1:
        return (model.num_layers,)
    per_layer = flops_breakdown(model, 4096, include_mtp=False)
    layer_flops = (per_layer.total - per_layer.logits) / model.num_layers
    mtp = flops_breakdown(model, 4096).total - per_layer.total if model.mtp_layers else 0.0
    last_extra = (per_layer.logits + mtp) / layer_flops
    return stage_layer_counts(model.num_layers, pp=p, vpp=v, first_extra=0.0, last_extra=last_extra)


@functools.lru_cache(maxsize=65536)
def rank_kinds(
    model: ModelSpec, counts: tuple[int, ...], r: int, p: int, v: int
) -> tuple[tuple[int, int], ...]:
    """``(representative layer index, how many)`` of the layer kinds on pipeline rank ``r``
    (chunk-major virtual stages ``r, r+p, ...``; MTP layers sit on the last rank)."""
    rep = kind_representatives(model)
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    tally: dict[int, int] = {}
    for j in range(v):
        stage = r + j * p
        for i in range(starts[stage], starts[stage + 1]):
            tally[rep[i]] = tally.get(rep[i], 0) + 1
    if r == p - 1 and model.mtp_layers:
        mtp = rep[model.mtp_layer_index]
        tally[mtp] = tally.get(mtp, 0) + model.mtp_layers
    return tuple(sorted(tally.items()))
