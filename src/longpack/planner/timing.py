"""Step time and throughput (docs/reference/planner-model.md#time): compute at a size-dependent GEMM
efficiency, TP / CP / EP / DP communication with overlap, pipeline bubble with VPP, recompute and
offload costs.

The few free constants (:class:`TimeModelParams`) are fitted on ``calibration_points.yaml`` by
``longpack plan fit`` and shipped as ``longpack/data/planner_fit.yaml``.

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
from dataclasses import asdict, dataclass, fields
from importlib import resources

import yaml

from longpack.planner.arithmetic import (
    core_attention_coefficient,
    flops_breakdown,
    layer_flops,
    layer_params,
    mtp_extra_params,
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
# 0.996 s -> 4.2 s at 100 % offload with ~1.9 B optimizer-sharded params per GPU ≈ 0.6e9/s.
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
    of the low-precision recipes over BF16; ``eta_attention``: core-attention peak fraction;
    ``fp8_speedup_blackwell``: the same on Blackwell (MXFP8 / current scaling);
    ``elementwise_passes``: HBM passes over each saved MoE activation (routing, permute/unpermute,
    grouped-expert activation function) by memory-bound kernels, per training step of a layer;
    ``layer_overhead_us``: host/launch overhead per layer per micro-batch (fwd+bwd) without CUDA graphs;
    ``graph_overhead_factor``: its multiplier with full-iteration CUDA graphs (partial graphs: square
    root); ``ep_exposed_overlap``: exposed fraction of EP all-to-all with EP overlap on;
    ``comm_exposed``: exposed fraction of TP (dense models, userbuffer overlap) and DP traffic;
    ``tp_exposed_moe``: exposed fraction of TP traffic in MoE models (no TP-comm overlap in their recipes); ``blackwell_factor`` /
    ``blackwell_ultra_factor``: clock/efficiency multipliers relative to Hopper.
    """

    eta_gemm: float = 0.62
    gemm_half_size: float = 400.0
    fp8_speedup: float = 1.35
    fp8_speedup_blackwell: float = 1.35
    elementwise_passes: float = 4.0
    nvfp4_speedup: float = 1.8
    eta_attention: float = 0.45
    layer_overhead_us: float = 400.0
    graph_overhead_factor: float = 0.4
    ep_exposed_overlap: float = 0.35
    comm_exposed: float = 0.3
    tp_exposed_moe: float = 0.5
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

    def as_dict(self) -> dict[str, float]:
        """Rounded mapping for reports."""
        return {k: round(float(v), 6) for k, v in asdict(self).items()}


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
    sub_lengths: tuple[int, ...] | None = None,
) -> TimeBreakdown:
    """Step time of one training iteration and the resulting model TFLOP/s/GPU (Megatron convention)."""
    prm = params or fitted_params()
    lay = plan.layout
    t, c, p, e, u, v = lay.tp, lay.cp, lay.pp, lay.ep, lay.expert_tp, plan.vpp
    b = plan.mbs
    m = num_microbatches(plan, gbs)
    counts = stage_counts if stage_counts is not None else stage_counts_for(model, plan)
    h = model.hidden_size
    context = float(seq_length)
    if sub_lengths:
        context = sum(x * x for x in sub_lengths) / sum(sub_lengths)
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
    attn_peak = bf16_peak * prm.eta_attention

    @functools.cache
    def layer_time(index: int) -> tuple[float, float, float, float, float, float]:
        """(compute, recompute, tp, cp, ep, overhead) seconds of one layer for one micro-batch."""
        f = layer_flops(model, index, context)
        compute = tokens_gpu * (
            f.dense_gemm / (gemm_peak * eff_dense)
            + f.expert_gemm / (gemm_peak * eff_expert)
            + f.attention / attn_peak
        )
        traffic = _moe_traffic(model, index, options.dispatcher, options.imbalance, u)
        compute += prm.elementwise_passes * traffic * tokens_gpu / hbm
        re = 0.0
        if options.full_recompute:
            re = compute / 3
        else:
            lp = layer_params(model, index)
            fwd_gemm = 0.0
            if options.recomputes("core_attn") and model.layer_is_softmax_attention(index):
                re += tokens_gpu * f.attention / 3 / attn_peak
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
            elementwise = tokens_gpu * _elementwise_recompute_bytes(
                model, index, options.dispatcher, options.recompute, options.imbalance
            )
            re += elementwise / hbm
        tp = 0.0
        if t > 1:
            tp_bytes = 8 * _rho(t) * tokens_mb * h * 2.0 / c
            exposed = prm.tp_exposed_moe if moe is not None else prm.comm_exposed
            tp = _link_time(tp_bytes, t, gpu) * exposed
        cp = 0.0
        if c > 1 and model.layer_is_softmax_attention(index):
            att = model.attention
            attn_time = tokens_gpu * f.attention / attn_peak
            cp = min(
                _cp_time(kind, model, gpu, t=t, c=c, tokens_mb=tokens_mb, attn_time=attn_time)
                for kind in _cp_kinds(model, options.cp_comm_type, t=t, c=c)
            )
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
        return compute, re, tp, cp, ep, overhead

    per_rank = []
    for r in range(p):
        tot = [0.0] * 6
        for i, count in rank_kinds(model, counts, r, p, v):
            for k, x in enumerate(layer_time(i)):
                tot[k] += count * x
        if r == p - 1:
            logit_flops = 6.0 * h * model.vocab_size * (1 + model.mtp_layers)
            logit_flops += 6.0 * mtp_extra_params(model) * model.mtp_layers
            tot[0] += tokens_gpu * logit_flops / (gemm_peak * eff_logits)
        per_rank.append(tot)
    slow = max(per_rank, key=sum)
    t_mb = sum(slow)
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
    ftok = flops_breakdown(model, seq_length, sub_lengths=sub_lengths).total
    world = lay.world_size
    tflops = gbs * seq_length * ftok / (world * step) / 1e12
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
        tokens_per_s_per_gpu=gbs * seq_length / (world * step),
        mfu_vs_bf16_peak=tflops / gpu.peak_tflops("bf16"),
        mfu_vs_precision_peak=tflops / prec_peak,
        flops_per_token=ftok,
    )


def cp_comm_candidates(model: ModelSpec, *, t: int, c: int) -> tuple[str, ...]:
    """CP communication types a layout allows: ``a2a`` needs ``c ≤ g/t`` (KV heads per TP rank);
    ``a2a+p2p`` needs an a2a group of at least 2 inside that limit.

    >>> from longpack.planner.catalog import load_model
    >>> cp_comm_candidates(load_model("qwen3_235b_a22b"), t=4, c=4)
    ('p2p',)
    >>> cp_comm_candidates(load_model("deepseek_v3"), t=1, c=32)
    ('p2p', 'a2a', 'a2a+p2p')
    """
    heads = model.attention.num_kv_heads // t if model.attention.num_kv_heads % t == 0 else 0
    out = ["p2p"]
    if c > 1 and heads >= c:
        out.append("a2a")
    if c > 2 and heads >= 2:
        out.append("a2a+p2p")
    return tuple(out)


def _hierarchical_a2a_size(model: ModelSpec, gpu: GPUSpec, *, t: int, c: int) -> int:
    """Size of the inner all-to-all group of ``a2a+p2p`` CP: the largest power of two that divides ``c``,
    fits the KV heads per TP rank and keeps the a2a inside the NVLink domain (ring p2p goes across)."""
    heads = max(model.attention.num_kv_heads // t, 1)
    limit = max(1, min(c, heads, gpu.nvlink_domain // t))
    return 2 ** int(math.log2(limit))


def _cp_kinds(model: ModelSpec, requested: str, *, t: int, c: int) -> tuple[str, ...]:
    allowed = cp_comm_candidates(model, t=t, c=c)
    if requested == "auto":
        return allowed
    return (requested,) if requested in allowed else ("p2p",)


def _cp_time(
    kind: str, model: ModelSpec, gpu: GPUSpec, *, t: int, c: int, tokens_mb: float, attn_time: float
) -> float:
    """Exposed CP communication of one attention layer for one micro-batch (fwd + bwd)."""
    att = model.attention
    local = tokens_mb / c
    c1 = {"a2a": c, "p2p": 1}.get(kind) or _hierarchical_a2a_size(model, gpu, t=t, c=c)
    c2 = c // c1
    a2a = 0.0
    if c1 > 1:
        widths = att.q_width + att.kv_width + att.v_width + att.o_width
        a2a = _alltoall_time(2 * _rho(c1) * local * widths * 2.0 / t, c1, gpu, stride=t)
    ring = 0.0
    if c2 > 1:
        kv_bytes = 3 * (c2 - 1) * local * (att.kv_width + att.v_width) * 2.0 / t
        ring = max(0.0, _link_time(kv_bytes, c2, gpu, stride=t * c1) - attn_time)
    return a2a + ring


def best_cp_comm_type(model: ModelSpec, gpu: GPUSpec, plan: PlanLayout, *, seq_length: int) -> str:
    """The CP communication type with the least exposed time for this layout (``p2p`` without CP)."""
    lay = plan.layout
    if lay.cp == 1:
        return "p2p"
    return _best_cp(model, gpu, lay.tp, lay.cp, plan.mbs, seq_length)


@functools.lru_cache(maxsize=4096)
def _best_cp(model: ModelSpec, gpu: GPUSpec, t: int, c: int, mbs: int, seq_length: int) -> str:
    prm = fitted_params()
    tokens_mb = mbs * seq_length
    attn_flops = 6.0 * core_attention_coefficient(model) * seq_length * tokens_mb / (t * c)
    attn_time = attn_flops / (gpu.peak_tflops("bf16") * 1e12 * _arch_factor(gpu, prm) * prm.eta_attention)
    return min(
        cp_comm_candidates(model, t=t, c=c),
        key=lambda k: _cp_time(k, model, gpu, t=t, c=c, tokens_mb=tokens_mb, attn_time=attn_time),
    )


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
