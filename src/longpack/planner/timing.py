"""Step time and throughput: compute at a size-dependent GEMM efficiency, core attention from fused-kernel
curves under the context-parallel split, TP / CP / EP / DP communication with overlap, pipeline bubble
with VPP, recompute and offload costs.

The few free constants (:class:`TimeModelParams`) are fitted on ``calibration_points.yaml`` by
``longpack plan fit`` and shipped as ``longpack/data/planner_fit.yaml``; the attention kernel curves
come from published kernel benchmarks (:mod:`longpack.planner.attention`).

>>> from longpack.planner.catalog import load_model, load_gpu
>>> from longpack.topology import ParallelLayout
>>> from longpack.planner.options import PlanLayout, TrainingOptions
>>> plan = PlanLayout(layout=ParallelLayout(world_size=16, ep=16, etp=1), mbs=1)
>>> est = estimate_time(load_model("qwen3_30b_a3b"), load_gpu("H100"), plan, seq_length=4096, gbs=1024,
...                     options=TrainingOptions(dispatcher="hybridep", ep_overlap=True))
>>> 100 < est.tflops_per_gpu < 600
True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from importlib import resources

import yaml

from longpack.planner.arithmetic import (
    flops_breakdown,
    layer_flops,
    layer_params,
    mtp_extra_params,
)
from longpack.planner.attention import (
    AttentionCost,
    best_attention_cost,
    cp_comm_candidates,
    gated_deltanet_cost,
    hierarchical_sizes,
)
from longpack.planner.catalog import GPUSpec, ModelSpec
from longpack.planner.layers import (
    layer_activation_terms,
    num_microbatches,
    rank_kinds,
    stage_counts_for,
)
from longpack.planner.options import PlanLayout, TrainingOptions

# Link efficiencies (hardware_catalog.yaml planner_constants.nccl_busbw_efficiency).
NVLINK_COLLECTIVE_EFF = 0.80
NVLINK_ALLTOALL_EFF = 0.65
IB_EFF = 0.85
# CPU Adam throughput per GPU for optimizer offload, params/s: Qwen3-30B TP2 PP2 EP4 on 16 H100 went
# 0.996 s -> 4.2 s at 100 % offload with ~1.9 B optimizer-sharded params per GPU (NVIDIA/skills
# nemo-mbridge-perf-cpu-offloading card) ≈ 0.6e9/s.
CPU_ADAM_PARAMS_PER_S = 0.6e9
# Grace hosts over NVLink-C2C (GB200/GB300): DSV3 offload costs 0.1-0.2 s/iteration for 15-20 GB of
# optimizer state per GPU (~1.5 B params) -> ~10e9 params/s (Megatron-LM's DeepSeek-V3 GB200 write-up).
CPU_ADAM_PARAMS_PER_S_GRACE = 10e9
HBM_BW_EFF = 0.7


@dataclass(frozen=True, kw_only=True)
class TimeModelParams:
    """Free constants of the time model (fitted; see ``longpack plan fit``).

    ``eta_gemm``: peak fraction of a large BF16 GEMM; ``gemm_half_size``: GEMM size (geometric-mean
    dimension) at which efficiency halves; ``fp8_speedup`` / ``nvfp4_speedup``: effective GEMM speedup
    of the low-precision recipes over BF16; ``fp8_speedup_blackwell``: the same on Blackwell (MXFP8 /
    current scaling); ``attention_factor``: achieved over published fused-attention kernel efficiency
    inside a training step (layout transposes, RoPE, the zigzag reorder of CP, THD bookkeeping);
    ``cp_step_overhead_us``: launch and wait cost of one ring step of CP attention (the ring's
    bandwidths are not fitted: they come from the hardware catalog, ``attention._link_bandwidth``);
    ``elementwise_passes``: HBM passes over each saved MoE activation (routing, permute/unpermute,
    grouped-expert activation function) by memory-bound kernels, per training step of a layer;
    ``fp8_cast_passes``: HBM passes (BF16 bytes) over every GEMM input by the quantize/transpose kernels
    of an FP8 / MXFP8 / NVFP4 recipe, per training step of a layer;
    ``layer_overhead_us``: host/launch overhead per layer per micro-batch (fwd+bwd) without CUDA graphs;
    ``graph_overhead_factor``: its multiplier with full-iteration CUDA graphs (partial graphs: square
    root); ``ep_exposed_overlap``: exposed fraction of EP all-to-all with EP overlap on;
    ``comm_exposed``: exposed fraction of TP traffic with TP-comm overlap (userbuffers) and of DP
    traffic; ``tp_exposed_no_overlap``: exposed fraction of TP traffic without TP-comm overlap;
    ``blackwell_factor`` / ``blackwell_ultra_factor``: clock/efficiency multipliers relative to Hopper.
    """

    eta_gemm: float = 0.62
    gemm_half_size: float = 400.0
    fp8_speedup: float = 1.35
    fp8_speedup_blackwell: float = 1.35
    elementwise_passes: float = 4.0
    fp8_cast_passes: float = 3.0
    nvfp4_speedup: float = 1.8
    attention_factor: float = 0.9
    cp_step_overhead_us: float = 20.0
    layer_overhead_us: float = 400.0
    graph_overhead_factor: float = 0.4
    ep_exposed_overlap: float = 0.35
    comm_exposed: float = 0.3
    tp_exposed_no_overlap: float = 0.8
    blackwell_factor: float = 1.0
    blackwell_ultra_factor: float = 1.15

    def as_dict(self) -> dict[str, float]:
        """Plain mapping (for YAML/JSON)."""
        return {k: float(v) for k, v in asdict(self).items()}


@functools.cache
def fitted_params() -> TimeModelParams:
    """The constants shipped in ``longpack/data/planner_fit.yaml`` (defaults if the file is absent).

    >>> fitted_params().eta_gemm > 0
    True
    """
    path = resources.files("longpack").joinpath("data", "planner_fit.yaml")
    if not path.is_file():
        return TimeModelParams()
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    names = {f.name for f in fields(TimeModelParams)}
    values = {k: float(v) for k, v in (raw.get("params") or {}).items() if k in names}
    return TimeModelParams(**values)


@functools.lru_cache(maxsize=4096)
def _moe_traffic(model: ModelSpec, index: int, dispatcher: str, imbalance: float, etp: int) -> float:
    """Bytes per token of the MoE tensors touched by memory-bound kernels in one layer.

    Dense-layer norms/activations are fused into TE GEMM epilogues; MoE routing, permutation and the
    grouped-expert activation run as separate memory-bound kernels.
    """
    traffic = 0.0
    for term in layer_activation_terms(model, index, dispatcher):
        if term.expert or term.name == "router_probs":
            nbytes = 2.0 if term.bytes_per_element is None else term.bytes_per_element
            share = imbalance / (etp if term.etp_split else 1) if term.expert else 1.0
            traffic += term.elements * nbytes * share
    return traffic


@functools.lru_cache(maxsize=4096)
def _gemm_input_elements(model: ModelSpec, index: int, dispatcher: str, imbalance: float, etp: int) -> float:
    """Elements per token entering the GEMMs of one layer (what an FP8 recipe quantizes, forward)."""
    total = 0.0
    for term in layer_activation_terms(model, index, dispatcher):
        if term.bytes_per_element is None:
            share = imbalance / (etp if term.etp_split else 1) if term.expert else 1.0
            total += term.elements * share
    return total


@functools.lru_cache(maxsize=4096)
def _elementwise_recompute_bytes(
    model: ModelSpec, index: int, dispatcher: str, recompute: tuple[str, ...], imbalance: float
) -> float:
    """HBM bytes per token re-read/written by recomputing memory-bound modules (norms, activations)."""
    total = 0.0
    for term in layer_activation_terms(model, index, dispatcher):
        cheap = [m for m in term.removed_by if m in ("layernorm", "moe_act", "gdn_norm_out")]
        if cheap and any(m in recompute for m in cheap):
            total += term.elements * (imbalance if term.expert else 1.0) * 2.0 * 3  # read, write, reread
    return total


@functools.lru_cache(maxsize=256)
def _param_totals(model: ModelSpec) -> tuple[float, float]:
    """(TP-sharded + embedding params, routed-expert params) of the main decoder."""
    dense = (
        sum(layer_params(model, i).dense for i in range(model.num_layers))
        + 2 * model.vocab_size * model.hidden_size
    )
    expert = sum(layer_params(model, i).expert for i in range(model.num_layers))
    return float(dense), float(expert)


def _rho(x: int) -> float:
    return (x - 1) / x if x > 1 else 0.0


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown:
    """Estimated step time (seconds) and throughput. Component times are per step on the slowest rank."""

    step_time: float
    compute: float
    recompute: float
    overhead: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    dp_comm: float
    bubble: float
    offload: float
    tflops_per_gpu: float
    tokens_per_s_per_gpu: float
    mfu_vs_bf16_peak: float
    mfu_vs_precision_peak: float
    flops_per_token: float
    attention: float = 0.0
    attention_efficiency: float = 0.0
    cp_comm_type: str = "p2p"
    cp_ring_length: float = 0.0
    #: seconds of one (mean) micro-batch on the slowest pipeline rank (all its layers, forward + backward)
    microbatch: float = 0.0

    def as_dict(self) -> dict[str, float | str]:
        """Rounded mapping for reports."""
        return {k: v if isinstance(v, str) else round(float(v), 6) for k, v in asdict(self).items()}


def _gemm_eff(params: TimeModelParams, m: float, n: float, k: float) -> float:
    size = max(m, 1.0) ** (1 / 3) * max(n, 1.0) ** (1 / 3) * max(k, 1.0) ** (1 / 3)
    return params.eta_gemm * size / (size + params.gemm_half_size)


def _arch_factor(gpu: GPUSpec, params: TimeModelParams) -> float:
    if gpu.arch.startswith("blackwell_ultra"):
        return params.blackwell_ultra_factor
    if gpu.arch.startswith("blackwell"):
        return params.blackwell_factor
    return 1.0


def _link_time(nbytes: float, group: int, gpu: GPUSpec, *, stride: int = 1, alltoall: bool = False) -> float:
    """Seconds to move ``nbytes`` per GPU within a group of ``group`` ranks spaced ``stride`` apart."""
    if nbytes <= 0 or group <= 1:
        return 0.0
    span = group * stride
    nvl_eff = NVLINK_ALLTOALL_EFF if alltoall else NVLINK_COLLECTIVE_EFF
    nvl = gpu.nvlink_unidir_gbps * 1e9 * nvl_eff
    ib = gpu.inter_node_unidir_gbps * 1e9 * IB_EFF
    if span <= gpu.nvlink_domain:
        return nbytes / nvl
    if not alltoall:
        return nbytes / ib  # ring collectives run at the slowest link
    inside = max(gpu.nvlink_domain // stride, 1) / group
    return nbytes * inside / nvl + nbytes * (1 - inside) / ib


@dataclass(frozen=True, kw_only=True)
class RowWork:
    """What one packed row (a micro-batch of MBS 1) holds: its width in tokens and its sequences.

    ``row_length``: tokens the row's GEMMs run on (the pack length: packed rows are padded to it);
    ``sequences``: ``(length, count)`` of the sequences a row holds *on average* (counts may be
    fractional: over a dataset, ``count`` is how many sequences of that length there are per pack).
    Core attention is a sum over sequences, so the mean row's attention time is the mean of the rows'
    attention times; each sequence is split into its own per-CP-rank zigzag chunks.

    >>> RowWork.full(8192).sequences
    ((8192, 1.0),)
    >>> RowWork.from_packs([4096, 4096, 2048, 2048], packs=2, row_length=8192).sequences
    ((2048, 1.0), (4096, 1.0))
    """

    row_length: int
    sequences: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if self.row_length < 1 or not self.sequences:
            raise ValueError("a row needs a positive length and at least one sequence")
        if any(n < 1 or n > self.row_length or c <= 0 for n, c in self.sequences):
            raise ValueError(f"sequences must be positive lengths <= {self.row_length} with positive counts")

    @classmethod
    def full(cls, seq_length: int) -> RowWork:
        """One sequence filling the row (BSHD data, or a pack that is one full-length sample)."""
        return cls(row_length=int(seq_length), sequences=((int(seq_length), 1.0),))

    @classmethod
    def from_packs(cls, lengths: Sequence[int], *, packs: int, row_length: int) -> RowWork:
        """The mean row of ``packs`` packed rows holding sequences of ``lengths`` (runtime tokens)."""
        if packs < 1:
            raise ValueError("packs must be positive")
        counts: dict[int, int] = {}
        for x in lengths:
            counts[int(x)] = counts.get(int(x), 0) + 1
        return cls(
            row_length=int(row_length), sequences=tuple((n, c / packs) for n, c in sorted(counts.items()))
        )

    @property
    def context(self) -> float:
        """Attention context per token, ``Σ Lᵢ² / Σ Lᵢ`` (Megatron's THD FLOP convention)."""
        return sum(n * n * c for n, c in self.sequences) / sum(n * c for n, c in self.sequences)

    @property
    def tokens(self) -> float:
        """Sequence (non-padding) tokens of the mean row."""
        return sum(n * c for n, c in self.sequences)

    def scaled(self, mbs: int) -> tuple[tuple[int, float], ...]:
        """``(length, count)`` of one micro-batch of ``mbs`` such rows."""
        return tuple((n, c * mbs) for n, c in self.sequences)


def attention_for(
    model: ModelSpec,
    gpu: GPUSpec,
    plan: PlanLayout,
    *,
    seq_length: int,
    options: TrainingOptions,
    params: TimeModelParams | None = None,
    rows: RowWork | None = None,
) -> AttentionCost:
    """Core attention of one softmax layer and one micro-batch with the layout's CP split (``auto``:
    the cheapest allowed ``cp_comm_type``).

    >>> from longpack.planner.catalog import load_model, load_gpu
    >>> from longpack.topology import ParallelLayout
    >>> plan = PlanLayout(layout=ParallelLayout(world_size=256, cp=32, pp=8, ep=32, etp=1))
    >>> a = attention_for(load_model("deepseek_v3"), load_gpu("H100"), plan, seq_length=131072,
    ...                   options=TrainingOptions(cp_comm_type="auto"))
    >>> a.kind, a.sizes
    ('a2a+p2p', (8, 4))
    """
    prm = params or fitted_params()
    lay = plan.layout
    return best_attention_cost(
        model,
        gpu,
        lengths=(rows or RowWork.full(seq_length)).scaled(plan.mbs),
        tp=lay.tp,
        cp=lay.cp,
        requested=options.cp_comm_type,
        fp8=options.fp8_attention,
        peak_scale=_arch_factor(gpu, prm),
        factor=prm.attention_factor,
        step_overhead_s=prm.cp_step_overhead_us * 1e-6,
    )


def estimate_time(
    model: ModelSpec,
    gpu: GPUSpec,
    plan: PlanLayout,
    *,
    seq_length: int,
    gbs: int,
    options: TrainingOptions,
    params: TimeModelParams | None = None,
    stage_counts: tuple[int, ...] | None = None,
    rows: RowWork | None = None,
) -> TimeBreakdown:
    """THE step-time model: one training iteration's time and the model TFLOP/s/GPU (Megatron convention).

    Every caller goes through here with the same inputs: ``plan`` and ``options`` (the layout and its
    settings), ``gbs`` packed rows per step of ``seq_length`` tokens each, and ``rows`` (what a row
    holds: :class:`RowWork`; default one full-length sequence per row). ``longpack plan``, ``plan
    estimate``, ``sweep`` (rows built from the packs it made), the balanced packer's cost model
    (:func:`longpack.planner.balance_costs.pack_cost_model`) and calibration all call it. GEMMs run on
    the whole row width (padding included); core attention is the sum over the row's sequences, each
    split into its own per-CP-rank zigzag chunks; a step is ``m`` mean micro-batches plus the pipeline
    bubble, DP and offload. Model TFLOP/s and tokens/s count the sequence (non-padding) tokens.
    """
    prm = params or fitted_params()
    work = rows or RowWork.full(seq_length)
    if work.row_length != seq_length:
        raise ValueError(f"rows are {work.row_length} tokens wide but seq_length is {seq_length}")
    lay = plan.layout
    t, c, p, e, u, v = lay.tp, lay.cp, lay.pp, lay.ep, lay.expert_tp, plan.vpp
    b = plan.mbs
    m = num_microbatches(plan, gbs)
    counts = stage_counts if stage_counts is not None else stage_counts_for(model, plan)
    h = model.hidden_size
    context = work.context
    arch = _arch_factor(gpu, prm)
    bf16_peak = gpu.peak_tflops("bf16") * 1e12 * arch
    fp8 = prm.fp8_speedup_blackwell if gpu.is_blackwell else prm.fp8_speedup
    speed = {"bf16": 1.0, "fp8": fp8, "mxfp8": fp8, "nvfp4": prm.nvfp4_speedup}
    gemm_peak = bf16_peak * speed[options.precision]
    tokens_mb = b * seq_length  # tokens of one micro-batch (whole sequence)
    tokens_gpu = tokens_mb / (t * c)  # per GPU after TP+SP and CP sharding
    moe = model.moe
    hbm = gpu.hbm_bandwidth_tbps * 1e12 * HBM_BW_EFF
    graph = {"none": 1.0, "partial": math.sqrt(prm.graph_overhead_factor), "full": prm.graph_overhead_factor}

    # efficiencies of the GEMM families
    eff_dense = _gemm_eff(prm, tokens_mb / c, h, h / t)
    eff_logits = _gemm_eff(prm, tokens_mb / c, h, model.vocab_size / t)
    eff_expert = eff_dense
    if moe is not None:
        tokens_per_expert = moe.top_k * tokens_mb * e / (t * c * moe.num_experts)
        eff_expert = _gemm_eff(prm, tokens_per_expert, h, moe.moe_ffn_hidden_size / u)
    attn = attention_for(model, gpu, plan, seq_length=seq_length, options=options, params=prm, rows=work)
    # linear-attention (Gated DeltaNet) layers: FLA's chunk kernel at its published per-call cost and
    # efficiency, the memory-bound modules around it and the CP all-to-alls
    gdn = (
        gated_deltanet_cost(
            model,
            gpu,
            tokens=float(tokens_mb),
            tp=t,
            cp=c,
            hbm_bytes_per_s=hbm,
            sequences=b * sum(count for _, count in work.sequences),
        )
        if model.gdn is not None
        else None
    )
    tp_exposed = prm.comm_exposed if options.tp_comm_overlap else prm.tp_exposed_no_overlap

    @functools.cache
    def layer_time(index: int) -> tuple[float, float, float, float, float, float, float]:
        """(compute, recompute, tp, cp, ep, overhead, attention kernels) seconds of one layer for one
        micro-batch."""
        f = layer_flops(model, index, context)
        softmax = model.layer_is_softmax_attention(index)
        gemm = tokens_gpu * (
            f.dense_gemm / (gemm_peak * eff_dense) + f.expert_gemm / (gemm_peak * eff_expert)
        )
        attention = attn.kernel
        traffic = _moe_traffic(model, index, options.dispatcher, options.imbalance, u)
        elementwise = prm.elementwise_passes * traffic * tokens_gpu / hbm
        if not softmax:
            assert gdn is not None
            attention = gdn.kernel
            elementwise += gdn.elementwise
        if options.precision != "bf16":
            cast = _gemm_input_elements(model, index, options.dispatcher, options.imbalance, u) * 2.0
            elementwise += prm.fp8_cast_passes * cast * tokens_gpu / hbm
        compute = gemm + attention + elementwise
        re = 0.0
        if options.full_recompute:
            # one more forward: a third of the GEMM and elementwise work, the attention forward (+ its ring)
            re = (gemm + elementwise) / 3
            if softmax:
                re += attn.forward + attn.exposed_forward
            else:
                assert gdn is not None
                re += gdn.kernel_fwd + gdn.a2a / 2  # the forward kernel and all-to-alls again
        else:
            lp = layer_params(model, index)
            fwd_gemm = 0.0
            if options.recomputes("core_attn") and softmax:
                re += attn.forward + attn.exposed_forward
            if options.recomputes("mla_up_proj") and model.attention.kind == "mla":
                att = model.attention
                up = att.q_lora_rank * att.q_width + att.kv_lora_rank * (
                    att.num_heads * (att.qk_nope_head_dim + att.v_head_dim)
                )
                fwd_gemm += 2 * up
            if model.layer_is_moe(index) and moe is not None:
                shared = 2 * model.gamma * h * moe.shared_ffn_hidden_size
                if options.recomputes("moe"):
                    re += tokens_gpu * (2 * lp.expert_active) / (gemm_peak * eff_expert)
                    fwd_gemm += shared
                elif options.recomputes("shared_experts"):
                    fwd_gemm += shared
            elif options.recomputes("mlp"):
                fwd_gemm += 2 * model.gamma * h * model.ffn_hidden_size
            re += tokens_gpu * fwd_gemm / (gemm_peak * eff_dense)
            cheap = tokens_gpu * _elementwise_recompute_bytes(
                model, index, options.dispatcher, options.recompute, options.imbalance
            )
            re += cheap / hbm
        tp = 0.0
        # with SP, per TP-sharded block: all-gather + reduce-scatter forward, the same two backward and a
        # re-gather of the saved sharded input (5 transfers of the block's tokens x h)
        block_bytes = 5 * tokens_mb * h * 2.0 / c
        if t > 1:
            blocks = 1 if model.layer_is_moe(index) else 2  # attention (+ dense MLP)
            tp = _link_time(blocks * _rho(t) * block_bytes, t, gpu) * tp_exposed
        if model.layer_is_moe(index) and u > 1:
            # expert TP: the dispatcher gathers / scatters tokens over the ETP group itself; userbuffer
            # TP-comm overlap does not cover it
            tp += _link_time(_rho(u) * block_bytes, u, gpu) * prm.tp_exposed_no_overlap
        cp = 0.0
        if c > 1:
            cp = attn.exposed if softmax or gdn is None else gdn.a2a
        ep = 0.0
        if model.layer_is_moe(index) and moe is not None and e * u > 1:
            width = e * u
            byte_per = 2.0 if options.precision == "bf16" else (1.03 + 2.0) / 2
            if options.dispatcher == "allgather":
                vol = 4 * _rho(width) * width * tokens_gpu * h * 2.0
            else:
                vol = 4 * _rho(width) * moe.top_k * tokens_gpu * h * byte_per * options.imbalance
            dedup = 1.0
            if options.dispatcher in ("deepep", "hybridep") and width > gpu.nvlink_domain:
                # a token crosses the network once per distinct remote node among its k experts
                nodes = math.ceil(width / gpu.nvlink_domain)
                remote_copies = moe.top_k * (1 - 1 / nodes)
                remote_nodes = (nodes - 1) * (1 - (1 - 1 / nodes) ** moe.top_k)
                dedup = remote_nodes / remote_copies
            ep = _alltoall_time(vol, width, gpu, dedup)
            if options.ep_overlap:
                ep *= prm.ep_exposed_overlap
        overhead = prm.layer_overhead_us * 1e-6 * graph[options.cuda_graphs]
        return compute, re, tp, cp, ep, overhead, attention if softmax else 0.0

    per_rank = []
    for r in range(p):
        tot = [0.0] * 7
        for i, count in rank_kinds(model, counts, r, p, v):
            for k, x in enumerate(layer_time(i)):
                tot[k] += count * x
        if r == p - 1:
            logit_flops = 6.0 * h * model.vocab_size * (1 + model.mtp_layers)
            logit_flops += 6.0 * mtp_extra_params(model) * model.mtp_layers
            tot[0] += tokens_gpu * logit_flops / (gemm_peak * eff_logits)
        per_rank.append(tot)
    slow = max(per_rank, key=lambda x: sum(x[:6]))
    t_mb = sum(slow[:6])
    compute_step = slow[0] * m
    bubble = t_mb * (p - 1) / v if p > 1 else 0.0

    # data-parallel gradient reduce-scatter + parameter all-gather (distributed optimizer), per step
    w_bytes = 1.0 if options.precision == "fp8" else 2.0
    dense_total, expert_total = _param_totals(model)
    dense_local = dense_total / (t * p)
    expert_local = expert_total / (e * u * p)
    z_dense, z_exp = lay.dp * c, lay.edp
    dp_bytes_dense = _rho(z_dense) * dense_local * (2.0 + w_bytes)
    dp_bytes_exp = _rho(z_exp) * expert_local * (2.0 + w_bytes)
    dp = (
        _link_time(dp_bytes_dense, z_dense, gpu, stride=t)
        + _link_time(dp_bytes_exp, z_exp, gpu, stride=e * u)
    ) * prm.comm_exposed

    offload = 0.0
    if options.optimizer_offload > 0:
        opt_params = dense_local / z_dense + expert_local / z_exp
        phi = options.optimizer_offload
        transfer = phi * opt_params * (4.0 + 2.0) / (gpu.host_link_unidir_gbps * 1e9)
        rate = CPU_ADAM_PARAMS_PER_S_GRACE if gpu.nvlink_domain > 8 else CPU_ADAM_PARAMS_PER_S
        offload = transfer + phi * opt_params / rate

    step = t_mb * m + bubble + dp + offload
    ftok = flops_breakdown(model, context=context).total
    world = lay.world_size
    tokens_step = gbs * work.tokens
    tflops = tokens_step * ftok / (world * step) / 1e12
    prec_peak = gpu.peak_tflops("bf16" if options.precision == "bf16" else options.precision)
    return TimeBreakdown(
        step_time=step,
        compute=compute_step,
        recompute=slow[1] * m,
        overhead=slow[5] * m,
        tp_comm=slow[2] * m,
        cp_comm=slow[3] * m,
        ep_comm=slow[4] * m,
        dp_comm=dp,
        bubble=bubble,
        offload=offload,
        tflops_per_gpu=tflops,
        tokens_per_s_per_gpu=tokens_step / (world * step),
        mfu_vs_bf16_peak=tflops / gpu.peak_tflops("bf16"),
        mfu_vs_precision_peak=tflops / prec_peak,
        flops_per_token=ftok,
        attention=slow[6] * m,
        attention_efficiency=attn.model_efficiency(gpu) if c >= 1 else 0.0,
        cp_comm_type=attn.kind if c > 1 else "p2p",
        cp_ring_length=attn.ring_length,
        microbatch=t_mb,
    )


def best_cp_comm_type(
    model: ModelSpec,
    gpu: GPUSpec,
    plan: PlanLayout,
    *,
    seq_length: int,
    among: tuple[str, ...] | None = None,
) -> str:
    """The CP communication type with the least attention time (kernels + exposed communication) for
    this layout (``p2p`` without CP); ``among`` limits the choice (``p2p`` when none of them is allowed).

    >>> from longpack.planner.catalog import load_model, load_gpu
    >>> from longpack.topology import ParallelLayout
    >>> plan = PlanLayout(layout=ParallelLayout(world_size=64, tp=1, cp=8, pp=1))
    >>> best_cp_comm_type(load_model("llama3_1_8b"), load_gpu("H100"), plan, seq_length=65536)
    'p2p'
    """
    if plan.layout.cp == 1:
        return "p2p"
    return _best_cp(model, gpu, plan.layout.tp, plan.layout.cp, plan.mbs, seq_length, among)


@functools.lru_cache(maxsize=4096)
def _best_cp(
    model: ModelSpec, gpu: GPUSpec, t: int, c: int, mbs: int, seq_length: int, among: tuple[str, ...] | None
) -> str:
    prm = fitted_params()
    kinds = cp_comm_candidates(model, t=t, c=c)
    if among is not None:
        kinds = tuple(k for k in kinds if k in among)
        if len(kinds) <= 1:
            return kinds[0] if kinds else "p2p"
    costs = [
        best_attention_cost(
            model,
            gpu,
            lengths=((seq_length, mbs),),
            tp=t,
            cp=c,
            requested=k,
            peak_scale=_arch_factor(gpu, prm),
            factor=prm.attention_factor,
            step_overhead_s=prm.cp_step_overhead_us * 1e-6,
        )
        for k in kinds
    ]
    return min(costs, key=lambda x: x.total).kind


def _alltoall_time(
    nbytes: float, group: int, gpu: GPUSpec, inter_node_factor: float = 1.0, *, stride: int = 1
) -> float:
    """All-to-all of ``nbytes`` per GPU over ``group`` ranks spaced ``stride`` apart: the share whose
    peers sit in the same NVLink domain runs at NVLink speed, the rest over the network (scaled by
    ``inter_node_factor``)."""
    if nbytes <= 0 or group <= 1:
        return 0.0
    inside = min(max(gpu.nvlink_domain // stride, 1) / group, 1.0)
    nvl = gpu.nvlink_unidir_gbps * 1e9 * NVLINK_ALLTOALL_EFF
    ib = gpu.inter_node_unidir_gbps * 1e9 * IB_EFF
    return nbytes * inside / nvl + nbytes * (1 - inside) * inter_node_factor / ib


__all__ = [
    "RowWork",
    "TimeBreakdown",
    "TimeModelParams",
    "attention_for",
    "best_cp_comm_type",
    "cp_comm_candidates",
    "estimate_time",
    "fitted_params",
    "hierarchical_sizes",
]
