"""Core-attention time on one GPU: fused-attention kernel efficiency and context-parallel communication.

Two halves, both pure Python:

* **Kernel curves**, fitted on published kernel benchmarks (``longpack/data/attention_kernels.yaml``:
  the cuDNN fused-attention kernel that TransformerEngine runs for Megatron-Core, measured in the
  FlashAttention-3 paper; the Blackwell plateau from FlashAttention-4). Efficiency (fraction of the
  dense BF16 peak) rises with the length ``L`` a kernel call sees, as ``η(L) = η∞ · L / (L + L½)``,
  separately for forward and backward, with and without the causal mask; it scales with the head
  dimension and the GPU generation. ``1/η = 1/η∞ + (L½/η∞)·(1/L)`` is linear in ``1/L``, so every curve
  is an ordinary least-squares line.
* **Context parallelism**, as TransformerEngine implements Megatron's ``cp_comm_type``: ``p2p`` (ring:
  each rank holds 2 zigzag chunks of ``s/(2·CP)`` tokens; step 0 runs the causal diagonal, the ``CP−1``
  other steps run unmasked kernels on one chunk against two while the next KV chunk travels; what is
  not hidden behind a step's compute is exposed), ``a2a`` (Ulysses all-to-alls of Q, K, V and O, not
  overlapped; the kernel then sees the whole sequence for ``heads/CP`` heads), ``a2a+p2p`` (an a2a
  group inside the NVLink domain, a ring across it: longer ring chunks hide the ring better) and
  ``allgather`` (K and V gathered before the kernels, dK/dV reduce-scattered after).

>>> from longpack.planner.catalog import load_model, load_gpu
>>> m, g = load_model("llama3_1_8b"), load_gpu("H100")
>>> short = attention_cost(m, g, lengths=((4096, 1),), tp=1, cp=1, kind="p2p")
>>> long = attention_cost(m, g, lengths=((131072, 1),), tp=1, cp=16, kind="p2p")
>>> 0.3 < short.model_efficiency(g) < long.model_efficiency(g) < 0.6
True
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from longpack.planner.arithmetic import GDN_CHUNK, chunked_delta_rule_flops, core_attention_coefficient
from longpack.planner.catalog import GPUSpec, ModelSpec

__all__ = [
    "AttentionCost",
    "GatedDeltaNetCost",
    "KernelCurves",
    "LinearAttentionFit",
    "attention_cost",
    "attention_head_dim",
    "best_attention_cost",
    "cp_comm_candidates",
    "fit_kernel_curves",
    "fit_linear_attention",
    "gated_deltanet_cost",
    "gdn_cp_allowed",
    "gdn_elementwise_elements",
    "hierarchical_sizes",
    "kernel_curves",
    "kernel_efficiency",
    "linear_attention_fit",
    "state_pass_shares",
    "state_pass_slowdown",
]

#: Backward FLOPs of fused attention over forward FLOPs (5 matmuls instead of 2; FlashAttention's
#: ``benchmarks/benchmark_flash_attention.py`` counts them the same way).
BACKWARD_FLOP_RATIO = 2.5
# NCCL efficiencies of the links (hardware_catalog.yaml planner_constants.nccl_busbw_efficiency).
NVLINK_ALLTOALL_EFF = 0.65
IB_EFF = 0.85
#: Achieved over nominal unidirectional NVLink bandwidth of one NCCL send/recv pair, the transfer of a
#: CP ring step (planner_constants.nccl_busbw_efficiency.intra_node_sendrecv): NVIDIA/nccl-tests issue
#: #268 measures ``sendrecv_perf`` between two NVLink-connected H100s plateauing near 180 GB/s of 450.
#: A measured constant, not a fitted one: only DeepSeek-V3's long-context points carry enough K/V
#: traffic to constrain it (its MLA ring moves ~80 KB per token), so a fitted value would be
#: unconstrained whenever that model is left out.
NVLINK_SENDRECV_EFF = 0.40


@dataclass(frozen=True, kw_only=True)
class KernelCurves:
    """Fitted fused-attention kernel curves (fractions of the dense BF16 peak).

    ``fwd_causal``, ``fwd_full`` and ``bwd_full`` are ``(η∞, L½)`` for head dim 128 on Hopper;
    ``head_dim_factor`` gives the plateau relative to head dim 128 at the measured head dims;
    ``blackwell_ratio`` scales every curve on Blackwell; ``fp8_forward_speedup`` is the FP8 over BF16
    plateau ratio of the forward kernel (used only when FP8 attention is enabled).
    """

    fwd_causal: tuple[float, float]
    fwd_full: tuple[float, float]
    bwd_full: tuple[float, float]
    head_dim_factor: tuple[tuple[int, float], ...]
    blackwell_ratio: float
    fp8_forward_speedup: float
    kernel: str = "cudnn"

    def as_dict(self) -> dict[str, Any]:
        """Rounded mapping (what ``planner_fit.yaml`` records)."""
        return {
            "kernel": self.kernel,
            "fwd_causal": {
                "plateau": round(self.fwd_causal[0], 4),
                "half_length": round(self.fwd_causal[1], 1),
            },
            "fwd_full": {"plateau": round(self.fwd_full[0], 4), "half_length": round(self.fwd_full[1], 1)},
            "bwd_full": {"plateau": round(self.bwd_full[0], 4), "half_length": round(self.bwd_full[1], 1)},
            "head_dim_factor": {int(d): round(f, 4) for d, f in self.head_dim_factor},
            "blackwell_ratio": round(self.blackwell_ratio, 4),
            "fp8_forward_speedup": round(self.fp8_forward_speedup, 4),
        }


def _line_fit(lengths: list[float], effs: list[float]) -> tuple[float, float]:
    """Least squares of ``1/η = a + b/L``; returns ``(η∞, L½) = (1/a, b/a)``."""
    xs = [1.0 / x for x in lengths]
    ys = [1.0 / y for y in effs]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    return 1.0 / a, max(b, 0.0) / a


def fit_kernel_curves(doc: dict[str, Any], peaks: dict[str, float]) -> KernelCurves:
    """Fit the kernel curves on a benchmark document (the schema of ``attention_kernels.yaml``).

    ``peaks`` maps a GPU name to its dense BF16 peak in TFLOP/s.

    >>> doc = {"fit_kernel": "k", "series": [
    ...     {"kernel": "k", "gpu": "G", "direction": d, "causal": c, "head_dim": 128, "precision": "bf16",
    ...      "seqlen": [1000, 4000], "tflops": [400, 640]} for d, c in (("fwd", True), ("fwd", False), ("bwd", False))]}
    >>> curves = fit_kernel_curves(doc, {"G": 1000})
    >>> [round(x) for x in curves.fwd_full], curves.blackwell_ratio
    ([1, 1000], 1.0)
    """
    kernel = doc.get("fit_kernel", "cudnn")
    series = [s for s in doc.get("series", []) if s.get("kernel") == kernel]

    def pick(direction: str, causal: bool, head_dim: int, precision: str = "bf16") -> dict[str, Any] | None:
        for s in series:
            if (
                s["direction"] == direction
                and bool(s["causal"]) == causal
                and int(s["head_dim"]) == head_dim
                and s.get("precision", "bf16") == precision
            ):
                return s
        return None

    def curve(s: dict[str, Any]) -> tuple[float, float]:
        peak = peaks[s["gpu"]]
        return _line_fit([float(x) for x in s["seqlen"]], [float(y) / peak for y in s["tflops"]])

    base = {}
    for key, (direction, causal) in {
        "fwd_causal": ("fwd", True),
        "fwd_full": ("fwd", False),
        "bwd_full": ("bwd", False),
    }.items():
        s = pick(direction, causal, 128)
        if s is None:
            raise ValueError(
                f"attention kernel benchmarks need a {kernel} {direction} causal={causal} head_dim 128 series"
            )
        base[key] = curve(s)
    factors = []
    for s in series:
        if s["direction"] == "fwd" and not s["causal"] and s.get("precision", "bf16") == "bf16":
            factors.append((int(s["head_dim"]), curve(s)[0] / base["fwd_full"][0]))
    fp8 = 1.0
    for s in series:
        if s.get("precision") == "fp8" and s["direction"] == "fwd" and not s["causal"]:
            ref = pick("fwd", False, int(s["head_dim"]))
            if ref is not None:
                fp8 = curve(s)[0] / curve(ref)[0]
    ratio = 1.0
    for p in doc.get("plateaus", []):
        if (
            p.get("kernel") == kernel
            and p["direction"] == "fwd"
            and not p["causal"]
            and int(p["head_dim"]) == 128
        ):
            ratio = (float(p["tflops"]) / peaks[p["gpu"]]) / base["fwd_full"][0]
    return KernelCurves(
        fwd_causal=base["fwd_causal"],
        fwd_full=base["fwd_full"],
        bwd_full=base["bwd_full"],
        head_dim_factor=tuple(sorted(set(factors))),
        blackwell_ratio=ratio,
        fp8_forward_speedup=fp8,
        kernel=str(kernel),
    )


@functools.cache
def kernel_curves() -> KernelCurves:
    """The curves fitted on the packaged ``attention_kernels.yaml`` (deterministic, closed form).

    >>> c = kernel_curves()
    >>> 0.5 < c.fwd_full[0] < 0.7, 0.4 < c.bwd_full[0] < 0.6, c.fwd_causal[1] > c.fwd_full[1]
    (True, True, True)
    """
    from longpack.planner.catalog import load_gpu

    text = resources.files("longpack").joinpath("data", "attention_kernels.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    gpus = {s["gpu"] for s in doc.get("series", [])} | {p["gpu"] for p in doc.get("plateaus", [])}
    return fit_kernel_curves(doc, {name: load_gpu(name).peak_tflops("bf16") for name in gpus})


def _head_dim_factor(curves: KernelCurves, head_dim: float) -> float:
    points = curves.head_dim_factor
    if not points:
        return 1.0
    x = math.log2(max(head_dim, 1.0))
    xs = [math.log2(d) for d, _ in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        return points[-1][1]
    for (x0, (_, f0)), (x1, (_, f1)) in zip(
        zip(xs, points, strict=True), zip(xs[1:], points[1:], strict=True), strict=True
    ):
        if x0 <= x <= x1:
            return f0 + (f1 - f0) * (x - x0) / (x1 - x0)
    return 1.0  # pragma: no cover - the loop covers the range


def kernel_efficiency(
    direction: str, causal: bool, length: float, *, head_dim: float, blackwell: bool, fp8: bool = False
) -> float:
    """Fraction of the dense BF16 peak a fused-attention kernel reaches on ``length``-token blocks.

    The backward curve with a causal mask is the unmasked backward curve times the forward
    causal/unmasked ratio at the same length (no published causal backward series).

    >>> round(kernel_efficiency("fwd", True, 16384, head_dim=128, blackwell=False), 2)
    0.56
    >>> kernel_efficiency("fwd", True, 1024, head_dim=128, blackwell=False) < kernel_efficiency(
    ...     "fwd", True, 8192, head_dim=128, blackwell=False)
    True
    """
    c = kernel_curves()

    def at(curve: tuple[float, float]) -> float:
        plateau, half = curve
        return plateau * length / (length + half)

    if direction == "fwd":
        eff = at(c.fwd_causal if causal else c.fwd_full)
        if fp8:
            eff *= c.fp8_forward_speedup
    else:
        eff = at(c.bwd_full)
        if causal:
            eff *= at(c.fwd_causal) / at(c.fwd_full)
    eff *= _head_dim_factor(c, head_dim)
    if blackwell:
        eff *= c.blackwell_ratio
    return eff


def cp_comm_candidates(model: ModelSpec, *, t: int, c: int) -> tuple[str, ...]:
    """CP communication types a layout allows: ``a2a`` needs ``CP`` to divide the KV heads per TP rank
    (MLA: the heads); ``a2a+p2p`` needs an a2a level of at least 2 that divides them; ``allgather`` and
    ``p2p`` have no head constraint.

    >>> from longpack.planner.catalog import load_model
    >>> cp_comm_candidates(load_model("qwen3_235b_a22b"), t=4, c=4)
    ('p2p', 'allgather')
    >>> cp_comm_candidates(load_model("deepseek_v3"), t=1, c=32)
    ('p2p', 'a2a', 'a2a+p2p', 'allgather')
    """
    heads = _heads_per_tp_rank(model, t)
    out = ["p2p"]
    if c > 1 and heads and heads % c == 0:
        out.append("a2a")
    if c > 2 and heads and heads % 2 == 0:
        out.append("a2a+p2p")
    if c > 1:
        out.append("allgather")
    return tuple(out)


def _heads_per_tp_rank(model: ModelSpec, t: int) -> int:
    att = model.attention
    groups = att.num_heads if att.kind == "mla" else att.num_kv_heads
    return groups // t if groups % t == 0 else 0


def hierarchical_sizes(model: ModelSpec, gpu: GPUSpec, *, t: int, c: int) -> tuple[int, int]:
    """``hierarchical_context_parallel_sizes`` of ``a2a+p2p``: the inner all-to-all level is the largest
    power of two dividing ``CP`` and the heads per TP rank that keeps it inside the NVLink domain; the
    ring (p2p) level goes across.

    >>> from longpack.planner.catalog import load_model, load_gpu
    >>> hierarchical_sizes(load_model("deepseek_v3"), load_gpu("H100"), t=1, c=32)
    (8, 4)
    """
    heads = max(_heads_per_tp_rank(model, t), 1)
    inner = 1
    while (
        inner * 2 <= c
        and c % (inner * 2) == 0
        and heads % (inner * 2) == 0
        and t * inner * 2 <= max(gpu.nvlink_domain, 1)
    ):
        inner *= 2
    return inner, c // inner


@dataclass(frozen=True, kw_only=True)
class AttentionCost:
    """Seconds of core attention for one layer and one micro-batch on one GPU.

    ``forward`` / ``backward``: kernel time; ``exposed_forward`` / ``exposed_backward``: CP
    communication not hidden behind the kernels (plus the per-step launch cost of the ring);
    ``ring_length``: tokens per zigzag chunk a ring step works on (the whole sequence without a ring);
    ``sizes``: ``(a2a level, ring level)``.
    """

    kind: str
    forward: float
    backward: float
    exposed_forward: float
    exposed_backward: float
    ring_length: float
    sizes: tuple[int, int]
    fwd_flops: float

    @property
    def kernel(self) -> float:
        """Forward + backward kernel seconds."""
        return self.forward + self.backward

    @property
    def exposed(self) -> float:
        """Exposed CP communication seconds (forward + backward)."""
        return self.exposed_forward + self.exposed_backward

    @property
    def total(self) -> float:
        """Kernels plus exposed communication."""
        return self.kernel + self.exposed

    def model_efficiency(self, gpu: GPUSpec) -> float:
        """Megatron model FLOPs (3 × forward) of this attention per second, over the dense BF16 peak."""
        if self.total <= 0:
            return 0.0
        return 3.0 * self.fwd_flops / self.total / (gpu.peak_tflops("bf16") * 1e12)


def attention_head_dim(model: ModelSpec) -> float:
    """Head dimension the kernel runs at (MLA: the mean of the query/key and value head dims).

    >>> from longpack.planner.catalog import load_model
    >>> attention_head_dim(load_model("llama3_1_8b")), attention_head_dim(load_model("deepseek_v3"))
    (128.0, 160.0)
    """
    att = model.attention
    if att.kind == "mla":
        return (att.qk_nope_head_dim + att.qk_rope_head_dim + att.v_head_dim) / 2
    return float(att.head_dim)


def _link_bandwidth(gpu: GPUSpec, span: int, *, stride: int = 1) -> float:
    """Per-GPU bandwidth of a ring step or all-gather over ``span`` consecutive GPUs whose members sit
    ``stride`` ranks apart (the TP size, times the a2a level of ``a2a+p2p``).

    Inside the NVLink domain: one NCCL send/recv pair (``NVLINK_SENDRECV_EFF`` of the unidirectional
    NVLink figure). Across it, each domain carries ``stride`` ring hops out (one per interleaved group),
    and NCCL spreads a hop over the domain's NICs through NVLink (PXN; NVIDIA/nccl issue #601: the
    operation is split over NVLink and balanced onto the NICs), so a hop gets ``domain / stride`` NICs
    of the catalog's per-GPU network bandwidth, never more than its own send/recv pair can feed.

    >>> from longpack.planner.catalog import load_gpu
    >>> h100 = load_gpu("H100")
    >>> [round(_link_bandwidth(h100, s, stride=t) / 1e9) for s, t in ((8, 1), (32, 1), (32, 4), (64, 8))]
    [180, 180, 85, 42]
    """
    nvlink = gpu.nvlink_unidir_gbps * 1e9 * NVLINK_SENDRECV_EFF
    domain = max(gpu.nvlink_domain, 1)
    if span <= domain:
        return nvlink
    nics = max(domain // max(stride, 1), 1)
    return min(nvlink, nics * gpu.inter_node_unidir_gbps * 1e9 * IB_EFF)


def _alltoall_seconds(nbytes: float, group: int, gpu: GPUSpec, *, stride: int) -> float:
    if nbytes <= 0 or group <= 1:
        return 0.0
    inside = min(max(gpu.nvlink_domain // max(stride, 1), 1) / group, 1.0)
    nvl = gpu.nvlink_unidir_gbps * 1e9 * NVLINK_ALLTOALL_EFF
    ib = gpu.inter_node_unidir_gbps * 1e9 * IB_EFF
    return nbytes * inside / nvl + nbytes * (1 - inside) / ib


@functools.lru_cache(maxsize=65536)
def attention_cost(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    lengths: tuple[tuple[int, float], ...],
    tp: int,
    cp: int,
    kind: str,
    fp8: bool = False,
    peak_scale: float = 1.0,
    factor: float = 1.0,
    step_overhead_s: float = 0.0,
) -> AttentionCost:
    """Core attention of one layer for one micro-batch on one GPU.

    ``lengths``: ``(sequence length, count)`` of the sequences in the micro-batch (a packed THD row has
    several); ``kind``: the CP communication type; ``peak_scale``: the GPU generation's clock factor;
    ``factor``: the fitted training/kernel ratio (framework overheads around the fused kernel);
    ``step_overhead_s``: launch and synchronisation cost of one ring step (ring bandwidths come from
    the hardware catalog, see ``_link_bandwidth``).
    """
    att = model.attention
    blackwell = gpu.is_blackwell
    head_dim = attention_head_dim(model)
    peak = gpu.peak_tflops("bf16") * 1e12 * peak_scale * factor
    coeff = core_attention_coefficient(model)
    inner, ring = {"p2p": (1, cp), "a2a": (cp, 1), "allgather": (1, cp)}.get(kind) or hierarchical_sizes(
        model, gpu, t=tp, c=cp
    )
    if cp == 1:
        inner, ring = 1, 1

    def eff(direction: str, causal: bool, length: float) -> float:
        return kernel_efficiency(direction, causal, length, head_dim=head_dim, blackwell=blackwell, fp8=fp8)

    fwd = bwd = step_fwd = step_bwd = flops = 0.0
    tokens = 0.0
    chunk_weighted = 0.0
    for seq, count in lengths:
        work = 2.0 * coeff * seq * seq / (tp * cp) * count  # causal forward FLOPs on this GPU
        flops += work
        tokens += seq * count
        if kind == "allgather" and cp > 1:
            half = seq / (2 * cp)
            fwd += work / (peak * eff("fwd", False, half))
            bwd += BACKWARD_FLOP_RATIO * work / (peak * eff("bwd", False, half))
            chunk_weighted += half * work
        elif ring == 1:
            fwd += work / (peak * eff("fwd", True, seq))
            bwd += BACKWARD_FLOP_RATIO * work / (peak * eff("bwd", True, seq))
            chunk_weighted += seq * work
        else:
            half = seq / (2 * ring)  # zigzag chunk
            diag, off = work / ring, work * (ring - 1) / ring
            f_off = off / (peak * eff("fwd", False, math.sqrt(2) * half))
            b_off = BACKWARD_FLOP_RATIO * off / (peak * eff("bwd", False, math.sqrt(2) * half))
            fwd += diag / (peak * eff("fwd", True, 2 * half)) + f_off
            bwd += BACKWARD_FLOP_RATIO * diag / (peak * eff("bwd", True, 2 * half)) + b_off
            step_fwd += f_off / (ring - 1)
            step_bwd += b_off / (ring - 1)
            chunk_weighted += half * work
    exposed_f = exposed_b = 0.0
    kv_bytes = tokens / cp * (att.kv_width + att.v_width) * 2.0 / tp  # K and V of this rank's tokens
    if kind == "allgather" and cp > 1:
        gather = (cp - 1) * kv_bytes / _link_bandwidth(gpu, tp * cp, stride=tp)
        exposed_f = gather
        exposed_b = 2 * gather  # K/V gathered again, dK/dV reduce-scattered
    elif ring > 1:
        bw = _link_bandwidth(gpu, tp * cp, stride=tp * inner)
        step_bytes = kv_bytes / inner
        exposed_f = (ring - 1) * max(0.0, step_bytes / bw - step_fwd) + ring * step_overhead_s
        exposed_b = (ring - 1) * max(0.0, 2 * step_bytes / bw - step_bwd) + ring * step_overhead_s
    if inner > 1:
        widths = att.q_width + att.kv_width + att.v_width + att.o_width
        volume = (inner - 1) / inner * tokens / cp * widths * 2.0 / tp
        a2a = _alltoall_seconds(volume, inner, gpu, stride=tp)
        exposed_f += a2a
        exposed_b += a2a
    return AttentionCost(
        kind=kind,
        forward=fwd,
        backward=bwd,
        exposed_forward=exposed_f,
        exposed_backward=exposed_b,
        ring_length=chunk_weighted / flops if flops else 0.0,
        sizes=(inner, ring),
        fwd_flops=flops,
    )


def best_attention_cost(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    lengths: tuple[tuple[int, float], ...],
    tp: int,
    cp: int,
    requested: str = "auto",
    fp8: bool = False,
    peak_scale: float = 1.0,
    factor: float = 1.0,
    step_overhead_s: float = 0.0,
) -> AttentionCost:
    """The cheapest allowed CP communication type (``requested`` pins one; a type the layout does not
    allow falls back to ``p2p``).

    >>> from longpack.planner.catalog import load_model, load_gpu
    >>> best_attention_cost(load_model("deepseek_v3"), load_gpu("H100"), lengths=((131072, 1),), tp=1, cp=32).kind
    'a2a+p2p'
    """
    allowed = cp_comm_candidates(model, t=tp, c=cp)
    kinds = allowed if requested == "auto" else ((requested,) if requested in allowed else ("p2p",))
    costs = [
        attention_cost(
            model,
            gpu,
            lengths=lengths,
            tp=tp,
            cp=cp,
            kind=k,
            fp8=fp8,
            peak_scale=peak_scale,
            factor=factor,
            step_overhead_s=step_overhead_s,
        )
        for k in kinds
    ]
    return min(costs, key=lambda x: x.total)


# --------------------------------------------------------------------------------------------------
# Linear attention: Gated DeltaNet layers (flash-linear-attention's chunked gated delta rule)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LinearAttentionFit:
    """The chunked gated delta rule's kernel time, fitted on published FLA timings.

    One kernel call on ``F`` forward FLOPs (:func:`~longpack.planner.arithmetic.chunked_delta_rule_flops`
    summed over tokens and heads) takes ``overhead_fwd + F / (eff_fwd · peak)`` forward and
    ``overhead_fwdbwd + 3F / (eff_fwdbwd · peak)`` forward + backward; ``peak`` is the GPU's dense BF16
    peak, the efficiencies are fractions of it (measured on ``gpu``, applied on every GPU).
    """

    eff_fwd: float
    overhead_fwd_s: float
    eff_fwdbwd: float
    overhead_fwdbwd_s: float
    chunk: int
    gpu: str
    rows: int
    #: per-FLOP time on Hopper over Blackwell (FLA's chunk kernels timed on both; 1.0 without such rows)
    hopper_slowdown: float = 1.0

    def seconds(self, flops_fwd: float, peak_flops: float, *, backward: bool) -> float:
        """Seconds of one call running ``flops_fwd`` forward FLOPs (plus its backward when ``backward``)."""
        if backward:
            return self.overhead_fwdbwd_s + 3.0 * flops_fwd / (self.eff_fwdbwd * peak_flops)
        return self.overhead_fwd_s + flops_fwd / (self.eff_fwd * peak_flops)

    def seconds_on(
        self, gpu: GPUSpec, flops_fwd: float, *, backward: bool, fitted_peak_tflops: float
    ) -> float:
        """:meth:`seconds` on ``gpu``: Blackwell at the fitted fraction of its own peak; Hopper at the
        fitted GPU's per-FLOP speed divided by :attr:`hopper_slowdown` (``fitted_peak_tflops``: the
        dense BF16 peak of the GPU the rows were timed on)."""
        if gpu.is_blackwell:
            return self.seconds(flops_fwd, gpu.peak_tflops("bf16") * 1e12, backward=backward)
        return self.seconds(flops_fwd, fitted_peak_tflops * 1e12 / self.hopper_slowdown, backward=backward)


def _affine_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares of ``y = a + b·x``; returns ``(a, b)``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else my / mx
    return my - b * mx, b


#: Value-dimension block of FLA's sequential state pass (``chunk_delta_h.py`` autotunes ``BV`` over 32
#: and 64 on Hopper/Blackwell; 32 gives the most thread blocks, what a small grid picks)
STATE_PASS_BV = 32


def _state_shares(key_dim: int, value_dim: int, chunk: int = GDN_CHUNK) -> tuple[float, float]:
    per_head = chunked_delta_rule_flops(key_dim, value_dim, chunk)
    state = key_dim * value_dim
    return 4 * state / per_head, 16 * state / (3 * per_head)


def _occupancy_slowdown(blocks: float, sm_count: int | None) -> float:
    return max(1.0, sm_count / max(blocks, 1.0)) if sm_count else 1.0


def fit_linear_attention(
    doc: dict[str, Any], peaks: dict[str, float], sm_count: int | None = None
) -> LinearAttentionFit:
    """Fit :class:`LinearAttentionFit` on the ``linear_attention`` section of ``attention_kernels.yaml``.

    ``peaks`` maps the GPU name to its dense BF16 peak in TFLOP/s; ``sm_count`` (of that GPU) lets a
    row whose state pass has fewer thread blocks than SMs count its work as the planner will
    (:func:`state_pass_slowdown`). The intercept is the per-call cost (launches of the chunk pipeline's
    kernels and their low occupancy on small inputs).

    >>> rows = [{"batch": 1, "seqlen": n, "heads": 1, "head_dim": 128, "fwd_ms": 1 + n * 1e-3,
    ...          "fwdbwd_ms": 3 + n * 3e-3} for n in (1024, 4096)]
    >>> f = fit_linear_attention({"linear_attention": {"gpu": "G", "chunk_size": 64, "rows": rows}}, {"G": 1.0})
    >>> round(f.overhead_fwd_s * 1e3, 3), round(f.eff_fwd / f.eff_fwdbwd, 3)
    (1.0, 1.0)
    """
    section = doc.get("linear_attention") or {}
    rows = section.get("rows") or []
    if len(rows) < 2:
        raise ValueError("the linear_attention section needs at least two timed rows")
    chunk = int(section.get("chunk_size", GDN_CHUNK))
    peak = peaks[section["gpu"]] * 1e12
    flops_f, flops_fb = [], []
    for r in rows:
        d = int(r["head_dim"])
        work = r["batch"] * r["seqlen"] * r["heads"] * chunked_delta_rule_flops(d, d, chunk)
        slow = _occupancy_slowdown(r["batch"] * r["heads"] * math.ceil(d / STATE_PASS_BV), sm_count)
        share_f, share_fb = _state_shares(d, d, chunk)
        flops_f.append(work * (1 + share_f * (slow - 1)))
        flops_fb.append(work * (1 + share_fb * (slow - 1)))
    a_f, b_f = _affine_fit(flops_f, [r["fwd_ms"] * 1e-3 for r in rows])
    a_fb, b_fb = _affine_fit(flops_fb, [r["fwdbwd_ms"] * 1e-3 for r in rows])
    slowdown = 1.0
    pairs = (section.get("generation_pairs") or {}).get("rows") or []
    if len(pairs) >= 2:
        work = [float(r["batch"] * r["seqlen"]) for r in pairs]
        slowdown = (
            _affine_fit(work, [r["hopper_ms"] for r in pairs])[1]
            / _affine_fit(work, [r["blackwell_ms"] for r in pairs])[1]
        )
    return LinearAttentionFit(
        eff_fwd=1.0 / (b_f * peak),
        overhead_fwd_s=max(a_f, 0.0),
        eff_fwdbwd=3.0 / (b_fb * peak),
        overhead_fwdbwd_s=max(a_fb, 0.0),
        chunk=chunk,
        gpu=str(section["gpu"]),
        rows=len(rows),
        hopper_slowdown=slowdown,
    )


@functools.cache
def linear_attention_fit() -> LinearAttentionFit:
    """The fit on the packaged FLA GB200 timings.

    >>> f = linear_attention_fit()
    >>> f.gpu, f.chunk, round(f.eff_fwd, 3), round(f.eff_fwdbwd, 3), round(f.overhead_fwdbwd_s * 1e3, 2)
    ('GB200', 64, 0.093, 0.051, 1.53)
    >>> round(f.hopper_slowdown, 2)
    1.37
    """
    from longpack.planner.catalog import load_gpu

    text = resources.files("longpack").joinpath("data", "attention_kernels.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    gpu = doc["linear_attention"]["gpu"]
    spec = load_gpu(gpu)
    return fit_linear_attention(doc, {gpu: spec.peak_tflops("bf16")}, spec.sm_count)


@dataclass(frozen=True, kw_only=True)
class GatedDeltaNetCost:
    """Seconds of one Gated DeltaNet layer's token mixing (between its in- and out-projection GEMMs) for one
    micro-batch on one GPU: ``kernel_fwd`` / ``kernel``: the chunk kernel forward / forward + backward;
    ``elementwise``: the memory-bound modules around it (short convolution, q/k L2 norm and head repeat,
    gates, gated RMSNorm), forward + backward; ``a2a``: the context-parallel all-to-alls (Megatron-Core
    splits the heads over CP ranks: in-projection output to head-parallel, norm output back), forward +
    backward, not overlapped; ``fwd_flops``: the kernel's forward FLOPs."""

    kernel_fwd: float
    kernel: float
    elementwise: float
    a2a: float
    fwd_flops: float

    @property
    def total(self) -> float:
        """Everything, forward + backward."""
        return self.kernel + self.elementwise + self.a2a


def gdn_elementwise_elements(model: ModelSpec) -> float:
    """Elements per token read or written by a GDN layer's memory-bound modules in its forward pass.

    Short convolution (in and out ``2·q_k + v``), q/k L2 norm (``2·q_k`` in and out), the head repeat of
    q and k to the value heads (``2·q_k`` in, ``2·H_v·d_k`` out), the gated RMSNorm (core output and gate
    in, normed output out: ``3·v``) and the decay/beta gates (``4·H_v``).

    >>> from longpack.planner.catalog import load_model
    >>> gdn_elementwise_elements(load_model("qwen3_next_80b_a3b"))
    49280.0
    """
    g = model.gdn
    if g is None:
        return 0.0
    qk = g.num_key_heads * g.key_head_dim
    v = g.num_value_heads * g.value_head_dim
    repeat = 2 * qk + 2 * g.num_value_heads * g.key_head_dim if g.num_value_heads != g.num_key_heads else 0
    return float(2 * (2 * qk + v) + 2 * (2 * qk) + repeat + 3 * v + 4 * g.num_value_heads)


def gdn_cp_allowed(model: ModelSpec, *, t: int, c: int) -> bool:
    """Whether Megatron-Core's GDN runs with TP ``t`` and CP ``c``: its all-to-all splits the key and
    value heads of a TP rank over the CP ranks, so ``c`` must divide both
    (``gated_delta_net/common.py``: the split sections must be divisible by ``cp_size``).

    >>> from longpack.planner.catalog import load_model
    >>> m = load_model("qwen3_next_80b_a3b")
    >>> gdn_cp_allowed(m, t=1, c=16), gdn_cp_allowed(m, t=2, c=16), gdn_cp_allowed(load_model("llama3_1_8b"), t=1, c=64)
    (True, False, True)
    """
    g = model.gdn
    if g is None or model.full_attention_interval <= 1 or c == 1:
        return True
    k_heads, v_heads = g.num_key_heads, g.num_value_heads
    if k_heads % t or v_heads % t:
        return False
    return (k_heads // t) % c == 0 and (v_heads // t) % c == 0


def state_pass_shares(model: ModelSpec) -> tuple[float, float]:
    """Shares of the chunk kernel's work done by its sequential state pass: forward (``S`` update and
    ``W·S``: ``4·d_k·d_v`` of :func:`chunked_delta_rule_flops`) and forward + backward (the forward pass,
    its recomputation in backward and the backward state pass, ``dh`` and the ``dv`` term: ``16·d_k·d_v``
    of three times the forward).

    >>> from longpack.planner.catalog import load_model
    >>> [round(x, 2) for x in state_pass_shares(load_model("qwen3_next_80b_a3b"))]
    [0.36, 0.48]
    """
    g = model.gdn
    if g is None:
        return 0.0, 0.0
    return _state_shares(g.key_head_dim, g.value_head_dim)


def state_pass_slowdown(model: ModelSpec, gpu: GPUSpec, *, sequences: float, tp: int, cp: int) -> float:
    """How much slower the sequential state pass runs than at full occupancy: it walks the chunks of each
    sequence in order with one thread block per (sequence, head, ``BV``-wide value block), so with fewer
    blocks than SMs only that share of the GPU works (``SMs / blocks``; 1 when the grid fills the GPU or
    the catalog has no SM count). Modelled, not measured: FLA's published timings all fill the GPU.

    >>> from longpack.planner.catalog import load_model, load_gpu
    >>> m, g = load_model("qwen3_next_80b_a3b"), load_gpu("GB200")
    >>> state_pass_slowdown(m, g, sequences=1, tp=1, cp=16), state_pass_slowdown(m, g, sequences=2, tp=1, cp=1)
    (18.5, 1.0)
    """
    g = model.gdn
    if g is None or not gpu.sm_count:
        return 1.0
    blocks = max(sequences, 1.0) * g.num_value_heads / (tp * cp) * math.ceil(g.value_head_dim / STATE_PASS_BV)
    return _occupancy_slowdown(blocks, gpu.sm_count)


@functools.lru_cache(maxsize=65536)
def gated_deltanet_cost(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    tokens: float,
    tp: int,
    cp: int,
    hbm_bytes_per_s: float,
    sequences: float = 1.0,
) -> GatedDeltaNetCost:
    """One GDN layer, one micro-batch of ``tokens`` tokens in ``sequences`` sequences (whole sequences,
    before TP/CP) on one GPU.

    The heads are split over TP and (by the all-to-all) over CP, so each GPU runs the chunk kernel on
    the full sequence for ``H_v/(TP·CP)`` heads: one kernel call per micro-batch, its per-call overhead
    included; the state pass slows down when it has fewer thread blocks than the GPU has SMs
    (:func:`state_pass_slowdown`).

    >>> from longpack.planner.catalog import load_model, load_gpu
    >>> m, g = load_model("qwen3_next_80b_a3b"), load_gpu("GB200")
    >>> one = gated_deltanet_cost(m, g, tokens=32768, tp=1, cp=1, hbm_bytes_per_s=5.6e12)
    >>> four = gated_deltanet_cost(m, g, tokens=32768, tp=1, cp=4, hbm_bytes_per_s=5.6e12)
    >>> round(one.kernel * 1e3, 1), one.a2a, four.kernel > one.kernel / 4, four.a2a > 0
    (6.4, 0.0, True, True)
    """
    from longpack.planner.arithmetic import gdn_kernel_flops_per_token

    g = model.gdn
    if g is None:
        raise ValueError(f"{model.name} has no Gated DeltaNet layers")
    from longpack.planner.catalog import load_gpu

    fit = linear_attention_fit()
    fitted_peak = load_gpu(fit.gpu).peak_tflops("bf16")
    flops = tokens * gdn_kernel_flops_per_token(model) / (tp * cp)
    per_gpu_tokens = tokens / (tp * cp)
    # forward once, backward reads the inputs and output grads and writes the input grads
    elementwise = 3 * 2.0 * gdn_elementwise_elements(model) * per_gpu_tokens / hbm_bytes_per_s
    a2a = 0.0
    if cp > 1:
        qk = g.num_key_heads * g.key_head_dim
        v = g.num_value_heads * g.value_head_dim
        channels = (2 * qk + 2 * v + 2 * g.num_value_heads) + v  # in-projection output, norm output
        volume = (cp - 1) / cp * per_gpu_tokens * channels * 2.0
        a2a = 2 * _alltoall_seconds(volume, cp, gpu, stride=tp)  # forward and backward
    kernel_fwd = fit.seconds_on(gpu, flops, backward=False, fitted_peak_tflops=fitted_peak)
    kernel = fit.seconds_on(gpu, flops, backward=True, fitted_peak_tflops=fitted_peak)
    slow = state_pass_slowdown(model, gpu, sequences=sequences, tp=tp, cp=cp)
    if slow > 1.0:
        fwd_share, both_share = state_pass_shares(model)
        kernel_fwd = fit.overhead_fwd_s + (kernel_fwd - fit.overhead_fwd_s) * (1 + fwd_share * (slow - 1))
        kernel = fit.overhead_fwdbwd_s + (kernel - fit.overhead_fwdbwd_s) * (1 + both_share * (slow - 1))
    return GatedDeltaNetCost(
        kernel_fwd=kernel_fwd,
        kernel=kernel,
        elementwise=elementwise,
        a2a=a2a,
        fwd_flops=flops,
    )
