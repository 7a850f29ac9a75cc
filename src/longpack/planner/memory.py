"""Per-GPU memory on the most loaded pipeline rank (docs/reference/planner-model.md#memory).

``M_gpu = weights + grads + optimizer states + activations + buffers``. Parameters live in Megatron's
three sharding buckets (TP-sharded, replicated, routed experts over EP·ETP); optimizer states are
sharded over the dense DP×CP group or the expert-DP group (distributed optimizer). Activations are an
element count of the tensors each module saves for backward (Flash/fused attention: nothing
``O(s²)``), sharded by TP+SP and CP, minus what the chosen recompute modules drop, times the in-flight
micro-batches of the 1F1B / interleaved schedule on that rank.

>>> from longpack.planner.catalog import load_model, load_gpu
>>> from longpack.topology import ParallelLayout
>>> from longpack.planner.options import PlanLayout, TrainingOptions
>>> m = load_model("qwen3_30b_a3b")
>>> plan = PlanLayout(layout=ParallelLayout(world_size=16, ep=16, etp=1), mbs=1)
>>> mem = estimate_memory(m, plan, seq_length=4096, gbs=1024, options=TrainingOptions())
>>> 50 < mem.total_gib < 75
True
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from longpack.planner.arithmetic import layer_params, mtp_extra_params
from longpack.planner.catalog import ModelSpec
from longpack.planner.layers import layer_activation_terms, num_microbatches, rank_kinds, stage_counts_for
from longpack.planner.options import PlanLayout, TrainingOptions

GIB = float(2**30)
# Fixed reserve: CUDA context, NCCL communicators, cuBLAS/TE workspaces (hardware_catalog.yaml
# planner_constants.memory_reserve_GiB.cuda_context_nccl_misc).
CONTEXT_RESERVE_GIB = 3.0
# DeepEP / HybridEP communication buffers: 1-4 GiB, growing with EP and hidden size (same source).
DISPATCH_BUFFER_GIB = {"alltoall": 0.0, "allgather": 0.0, "deepep": 2.0, "hybridep": 1.5}
# Allocator fragmentation with expandable segments, relative to the dynamic (activation) part.
FRAGMENTATION = 0.05
# Distributed-optimizer bucket (Megatron's default ~40 M elements) gathered/reduced at once.
BUCKET_ELEMENTS = 40_000_000


@dataclass(frozen=True)
class _LayerKind:
    """Per-token activation bytes and parameter buckets of one kind of layer."""

    act_dense: float  # bytes per token (before TP/CP sharding), non-expert terms, after recompute
    act_expert: float  # bytes per token-copy, expert terms not split by ETP
    act_expert_etp: float  # bytes per token-copy, expert terms split by ETP
    act_full: float  # all terms, no recompute (working set of one layer)
    dense_params: int
    replicated_params: int
    expert_params: int


@functools.lru_cache(maxsize=4096)
def _layer_kind(
    model: ModelSpec, index: int, recompute: tuple[str, ...], gemm_bytes: float, dispatcher: str
) -> _LayerKind:
    full = recompute == ("full",)
    act_dense = act_expert = act_expert_etp = act_all = 0.0
    for term in layer_activation_terms(model, index, dispatcher):
        nbytes = gemm_bytes if term.bytes_per_element is None else term.bytes_per_element
        size = term.elements * nbytes
        act_all += size
        dropped = full or any(m in recompute for m in term.removed_by)
        if dropped:
            continue
        if term.expert:
            if term.etp_split:
                act_expert_etp += size
            else:
                act_expert += size
        else:
            act_dense += size
    if full:
        act_dense = 2.0 * model.hidden_size  # only the layer input is checkpointed
    params = layer_params(model, index)
    return _LayerKind(
        act_dense=act_dense,
        act_expert=act_expert,
        act_expert_etp=act_expert_etp,
        act_full=act_all,
        dense_params=params.dense,
        replicated_params=params.replicated,
        expert_params=params.expert,
    )


def bytes_per_param(options: TrainingOptions) -> tuple[float, float, float]:
    """``(weight, grad, optimizer_state)`` bytes per parameter before optimizer sharding.

    >>> bytes_per_param(TrainingOptions())
    (2.0, 2.0, 12.0)
    >>> bytes_per_param(TrainingOptions(precision="mxfp8", optimizer="adam_bf16_states", main_grads_fp32=True))
    (3.03, 4.0, 8.0)
    """
    weight = {"bf16": 2.0, "fp8": 2.0, "mxfp8": 3.03, "nvfp4": 3.0}[options.precision]
    grad = 4.0 if options.main_grads_fp32 else 2.0
    state = 12.0 if options.optimizer == "adam" else 8.0
    return weight, grad, state


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Peak memory of one GPU (the most loaded pipeline rank), in bytes.

    ``host_optimizer`` is the optimizer state moved to CPU memory (not counted in ``total``).
    """

    rank: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    buffers: float
    host_optimizer: float
    layers_on_rank: int
    inflight_microbatches: float

    @property
    def states(self) -> float:
        """Weights + gradients + optimizer states on the GPU."""
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> float:
        """Everything on the GPU, bytes."""
        return self.states + self.activations + self.logits + self.buffers

    @property
    def total_gib(self) -> float:
        """Everything on the GPU, GiB."""
        return self.total / GIB

    def as_dict(self) -> dict[str, float | int]:
        """GiB per component (JSON-friendly)."""
        return {
            "rank": self.rank,
            "weights_gib": round(self.weights / GIB, 3),
            "grads_gib": round(self.grads / GIB, 3),
            "optimizer_gib": round(self.optimizer / GIB, 3),
            "activations_gib": round(self.activations / GIB, 3),
            "logits_gib": round(self.logits / GIB, 3),
            "buffers_gib": round(self.buffers / GIB, 3),
            "total_gib": round(self.total_gib, 3),
            "host_optimizer_gib": round(self.host_optimizer / GIB, 3),
            "layers_on_rank": self.layers_on_rank,
            "inflight_microbatches": round(self.inflight_microbatches, 3),
        }


def inflight_chunks(*, rank: int, pp: int, vpp: int, microbatches: int) -> float:
    """Micro-batch activations alive on pipeline ``rank`` at its peak, in units of the rank's layers.

    1F1B: ``min(m, p − r)``; interleaved: ``min(p(v−1) + 2(p−r) − 1, m·v) / v``.

    >>> inflight_chunks(rank=0, pp=8, vpp=1, microbatches=64), inflight_chunks(rank=0, pp=8, vpp=4, microbatches=64)
    (8, 9.75)
    """
    if pp == 1:
        return 1
    if vpp == 1:
        return min(microbatches, pp - rank)
    return min(pp * (vpp - 1) + 2 * (pp - rank) - 1, microbatches * vpp) / vpp


def estimate_memory(
    model: ModelSpec,
    plan: PlanLayout,
    *,
    seq_length: int,
    gbs: int,
    options: TrainingOptions,
    ranks: tuple[int, ...] | None = None,
    stage_counts: tuple[int, ...] | None = None,
) -> MemoryBreakdown:
    """Peak memory on the most loaded pipeline rank (ranks 0 and ``p−1`` unless ``ranks`` given)."""
    lay = plan.layout
    t, c, p, e, u = lay.tp, lay.cp, lay.pp, lay.ep, lay.expert_tp
    v = plan.vpp
    m = num_microbatches(plan, gbs)
    counts = stage_counts if stage_counts is not None else stage_counts_for(model, plan)
    w_b, g_b, o_b = bytes_per_param(options)
    gemm_bytes = 1.0 if options.precision != "bf16" else 2.0
    offload = options.optimizer_offload
    z_dense = lay.dp * c if options.distributed_optimizer else 1
    z_expert = lay.edp if options.distributed_optimizer else 1
    tokens = plan.mbs * seq_length / (t * c)  # tokens of one micro-batch on one GPU (non-expert terms)
    h = model.hidden_size
    n_mtp = model.mtp_layers
    if ranks is None:
        ranks = (0, p - 1) if p > 1 else (0,)

    def per_param(z: float) -> tuple[float, float, float, float]:
        if options.fsdp:
            return w_b / z, g_b / z, o_b * (1 - offload) / z, o_b * offload / z
        return w_b, g_b, o_b * (1 - offload) / z, o_b * offload / z

    dense_pp = per_param(z_dense)
    expert_pp = per_param(z_expert)
    best: MemoryBreakdown | None = None
    for r in ranks:
        dense_params = replicated = expert_params = 0.0
        act_per_mb = 0.0
        act_full_max = 0.0
        layer_total = 0
        kinds = rank_kinds(model, counts, r, p, v)
        expert_tokens = tokens * options.imbalance  # expert terms already count k copies
        for i, count in kinds:
            kind = _layer_kind(model, i, options.recompute, gemm_bytes, options.dispatcher)
            dense_params += count * kind.dense_params
            replicated += count * kind.replicated_params
            expert_params += count * kind.expert_params
            act_per_mb += count * (
                kind.act_dense * tokens
                + kind.act_expert * expert_tokens
                + kind.act_expert_etp * expert_tokens / u
            )
            act_full_max = max(act_full_max, kind.act_full * tokens)
            layer_total += count
        if r == p - 1 and n_mtp:
            dense_params += n_mtp * mtp_extra_params(model)
        if r == 0:
            dense_params += model.vocab_size * h  # input embedding (vocab-parallel)
        if r == p - 1:
            if not model.tie_embeddings or p > 1:
                dense_params += model.vocab_size * h  # output layer
            replicated += h  # final norm
        local_dense = dense_params / t + replicated
        local_expert = expert_params / (e * u)
        weights = local_dense * dense_pp[0] + local_expert * expert_pp[0]
        grads = local_dense * dense_pp[1] + local_expert * expert_pp[1]
        optim = local_dense * dense_pp[2] + local_expert * expert_pp[2]
        host = local_dense * dense_pp[3] + local_expert * expert_pp[3]
        inflight = inflight_chunks(rank=r, pp=p, vpp=v, microbatches=m)
        activations = act_per_mb * inflight
        if options.full_recompute:
            activations += act_full_max  # one layer re-materialized during its backward
        if r == 0:
            activations += 2.0 * h * tokens * math.ceil(inflight)  # embedding output
        if c > 1 and options.cp_comm_type != "a2a":
            kv = model.attention.kv_width + model.attention.v_width
            activations += 2 * 2.0 * kv * tokens  # two in-flight KV receive buffers (ring attention)
        logits = 0.0
        if r == p - 1:
            logit_bytes = 2.0 + (0.0 if options.fused_cross_entropy else 4.0)
            # output-layer input (SP-sharded) and logits (vocab split by TP, tokens by CP): both scale
            # with tokens = b·s/(t·c) per GPU
            logits = (1 + n_mtp) * tokens * (2.0 * h + logit_bytes * model.vocab_size)
        buffers = CONTEXT_RESERVE_GIB * GIB + DISPATCH_BUFFER_GIB[options.dispatcher] * GIB
        if options.distributed_optimizer:
            buffers += BUCKET_ELEMENTS * (w_b + g_b)
        buffers += FRAGMENTATION * (activations + logits)
        cand = MemoryBreakdown(
            rank=r,
            weights=weights,
            grads=grads,
            optimizer=optim,
            activations=activations,
            logits=logits,
            buffers=buffers,
            host_optimizer=host,
            layers_on_rank=layer_total,
            inflight_microbatches=float(inflight),
        )
        if best is None or cand.total > best.total:
            best = cand
    assert best is not None
    return best
