"""Layout search: enumerate valid TP/CP/EP/ETP/PP/VPP/DP/MBS layouts, pick the cheapest recompute /
offload setting that fits each, rank by estimated step time.

Constraints: ``N = t·c·p·D = u·e·p·D_e``; ``t`` divides the attention heads and KV heads and stays inside
the NVLink domain; ``e`` divides the experts; ``s`` is a multiple of ``pad_seq_to_mult`` (``2c``, and
``c·t`` with SP); ``GBS = m·MBS·D``; interleaving needs ``p > 1`` and ``m ≥ p``; EP overlap needs
``e > 1``, VPP when ``p > 1`` and no ``moe``/full recompute; optimizer offload needs the distributed
optimizer; DeepEP is not used on NVL72 systems (HybridEP instead). The Megatron constraints are the
predicates of :mod:`longpack.rules` (``LP-TOPO-001``..``005``, ``LP-SP-001``, ``LP-CP-001``,
``LP-PP-006``, ``LP-BATCH-001``/``002``), so the search and ``longpack check`` cannot disagree;
:func:`layout_findings` then runs every rule on the ranked layouts as a second opinion.

>>> from longpack.planner.catalog import load_model, load_gpu
>>> req = SearchRequest(model=load_model("qwen3_30b_a3b"), gpu=load_gpu("H100"), num_gpus=16,
...                     seq_length=4096, gbs=256)
>>> best = search(req).candidates[0]
>>> best.plan.layout.world_size, best.memory.total_gib < req.memory_budget_gib
(16, True)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from longpack.catalog import GPUSpec, ModelFamily, ModelSpec
from longpack.planner.attention import gdn_cp_allowed
from longpack.planner.memory import MemoryBreakdown, estimate_memory, stage_counts_for
from longpack.planner.options import PlanError, PlanLayout, TrainingOptions, layout_string
from longpack.planner.timing import TimeBreakdown, TimeModelParams, best_cp_comm_type, estimate_time
from longpack.rules import Finding, TrainingSetup, has_errors, run_rules
from longpack.rules.checks.batch import gbs_covers_dp, gbs_divisible
from longpack.rules.checks.cp import cp_divides_seq_length
from longpack.rules.checks.family import GDN_CP_SINCE, gdn_cp_supported
from longpack.rules.checks.pipeline import vpp_has_pp
from longpack.rules.checks.topology import (
    ep_divides_experts,
    expert_grid_fits,
    mp_divides_world,
    sp_splits_cp_shard,
    tp_divides,
)
from longpack.rules.versions import UpstreamVersions
from longpack.topology import ParallelLayout, TopologyError

VPP_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)


def gdn_cp_in_version(versions: UpstreamVersions | None) -> bool:
    """Whether the Megatron-Core version checked for runs Gated DeltaNet with CP > 1 (``None``: the newest
    known, ``main``; ``longpack plan`` passes the installed or given version). ``check``'s rule
    LP-MODEL-004 owns the fact (:func:`longpack.rules.checks.family.gdn_cp_supported`).

    >>> old, new = UpstreamVersions.resolve(mcore="0.16.1"), UpstreamVersions.resolve(mcore="0.18.0")
    >>> gdn_cp_in_version(old), gdn_cp_in_version(new), gdn_cp_in_version(None)
    (False, True, True)
    """
    return gdn_cp_supported(_mcore_of(versions))


def _mcore_of(versions: UpstreamVersions | None) -> str:
    # no versions given (the Python API's default): the newest known; the CLI always resolves them
    return versions.mcore if versions is not None else "main"


def vpp_choices(num_layers: int, pp: int) -> tuple[int, ...]:
    """Virtual pipeline sizes searched for ``pp`` stages: :data:`VPP_CHOICES` and every ``v`` that splits
    the layers evenly into ``pp·v`` virtual stages (Mixtral-8x22B's 56 layers: PP 4 x VPP 14).

    >>> vpp_choices(56, 4)
    (1, 2, 3, 4, 6, 7, 8, 12, 14, 16)
    """
    if pp <= 1:
        return (1,)
    even = {v for v in range(1, num_layers // pp + 1) if num_layers % (pp * v) == 0}
    return tuple(sorted({*VPP_CHOICES, *even}))


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """What to plan for. ``None`` fields are searched; set one to pin it (e.g. ``tp=1``).

    ``headroom`` is the fraction of the GPU's usable memory a layout may use.
    ``recompute`` pins the recompute modules (``None`` = cheapest that fits); ``dispatcher=None``
    picks DeepEP on NVLink-8 systems and HybridEP on NVL72.
    """

    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int
    seq_length: int
    gbs: int | None = None
    precision: str = "bf16"
    headroom: float = 0.95
    dispatcher: str | None = None
    recompute: tuple[str, ...] | None = None
    allow_offload: bool = True
    optimizer: str = "adam"
    imbalance: float = 1.0
    cuda_graphs: str = "none"
    tp: int | None = None
    cp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    ep: int | None = None
    etp: int | None = None
    mbs: int | None = None
    max_tp: int = 8
    keep_all: bool = False
    #: rank settings no calibration point constrains too (``longpack.planner.evidence``); off: choose
    #: among measured ones (an unmeasured setting never wins by its modelled gain alone)
    explore: bool = False
    #: pins of settings the search otherwise chooses (``None``: chosen); the reference layout uses them
    #: for Megatron's defaults
    cp_comm_type: str | None = None
    ep_overlap: bool | None = None
    tp_comm_overlap: bool | None = None
    allow_full_recompute: bool = True
    #: Megatron-Bridge / Megatron-Core versions the rules check candidates for (None: check's default).
    rule_versions: UpstreamVersions | None = None

    def __post_init__(self) -> None:
        for name in ("num_gpus", "seq_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise PlanError(f"{name} must be an integer, got {value!r}", fields=name)
        if self.num_gpus < 1:
            raise PlanError(f"gpus must be positive, got {self.num_gpus}", fields="gpus")
        if self.num_gpus > MAX_GPUS:
            raise PlanError(
                f"num_gpus={self.num_gpus:,} is more than the planner searches ({MAX_GPUS:,} GPUs, "
                "beyond any published training run); plan a smaller cluster",
                fields="gpus",
            )
        if self.seq_length < 2:
            raise PlanError(f"seq_length must be >= 2, got {self.seq_length}", fields="seq_length")
        if self.seq_length > MAX_SEQ_LENGTH:
            raise PlanError(
                f"seq_length={self.seq_length:,} is longer than the planner models ({MAX_SEQ_LENGTH:,} tokens)",
                fields="seq_length",
            )
        if self.gbs is not None and (
            isinstance(self.gbs, bool) or not isinstance(self.gbs, int) or self.gbs < 1
        ):
            raise PlanError(f"gbs must be a positive integer, got {self.gbs!r}", fields="gbs")
        if not (
            isinstance(self.headroom, int | float)
            and not isinstance(self.headroom, bool)
            and math.isfinite(self.headroom)
            and 0 < self.headroom <= 1
        ):
            raise PlanError(f"headroom must be in (0, 1], got {self.headroom}", fields="headroom")
        if not (
            isinstance(self.imbalance, int | float)
            and not isinstance(self.imbalance, bool)
            and math.isfinite(self.imbalance)
            and self.imbalance >= 1
        ):
            raise PlanError(
                f"imbalance must be a finite number >= 1.0 (1.0 = balanced routing), got {self.imbalance}",
                fields="imbalance",
            )
        for name in ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "max_tp"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"{name} must be a positive integer, got {value!r}", fields=name)
        if self.model.moe is None:
            for name in ("ep", "etp"):
                value = getattr(self, name)
                if value is not None and value > 1:
                    raise PlanError(
                        f"{name}={value} pins expert parallelism, but {self.model.name} is a dense model "
                        f"(no experts); drop the {name} pin",
                        fields=name,
                    )
        pinned = (self.tp or 1) * (self.cp or 1) * (self.pp or 1)
        if self.num_gpus % pinned:
            raise PlanError(
                f"the pinned TP*CP*PP = {pinned} does not divide {self.num_gpus} GPUs; pick sizes whose "
                "product divides the GPU count",
                fields=tuple(n for n in ("tp", "cp", "pp") if getattr(self, n) is not None),
            )
        if self.precision in ("mxfp8", "nvfp4") and not self.gpu.is_blackwell:
            raise PlanError(
                f"precision {self.precision} needs a Blackwell GPU; {self.gpu.name} supports bf16 and fp8 (blockwise)",
                fields="precision",
            )

    @property
    def memory_budget_gib(self) -> float:
        """Usable GiB per GPU after headroom."""
        return self.gpu.usable_memory_gib * self.headroom

    @property
    def memory_margin(self) -> float:
        """The memory estimate's one-sided band (``longpack.planner.uncertainty.memory_band``): a layout
        must fit with its estimate raised by it."""
        from longpack.planner.uncertainty import memory_band

        return memory_band().width

    @property
    def fit_budget_gib(self) -> float:
        """The most GiB an *estimate* may use: :attr:`memory_budget_gib` less the memory band's headroom
        (``estimate · (1 + band) <= budget``)."""
        return self.memory_budget_gib / (1 + self.memory_margin)

    @property
    def gbs_is_default(self) -> bool:
        """Whether the global batch is the planner's default (no ``gbs`` given)."""
        return self.gbs is None

    @property
    def global_batch(self) -> int:
        """GBS: given, or :data:`DEFAULT_TOKENS_PER_STEP` tokens per step rounded to a power of two
        sequences (at least one)."""
        if self.gbs is not None:
            return self.gbs
        return default_global_batch(self.seq_length)


#: Tokens per optimizer step when no GBS is given: 4M (2**22), the batch Llama 2 trained with (4M tokens,
#: arXiv:2307.09288) and Llama 3 405B started with (4M tokens, arXiv:2407.21783, section 3.4); published
#: runs sit between 1M and 16M.
DEFAULT_TOKENS_PER_STEP = 4 * 2**20
#: Largest cluster the search accepts (a request above it is refused, not searched for minutes).
MAX_GPUS = 2**20
#: Longest sequence the search accepts.
MAX_SEQ_LENGTH = 2**25


def default_global_batch(seq_length: int) -> int:
    """Sequences per step for :data:`DEFAULT_TOKENS_PER_STEP` tokens, a power of two, at least 1.

    >>> default_global_batch(4096), default_global_batch(131072), default_global_batch(8_000_000)
    (1024, 32, 1)
    """
    return max(1, 2 ** round(math.log2(max(1.0, DEFAULT_TOKENS_PER_STEP / seq_length))))


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One evaluated layout with its options, memory, time and the reasons for it."""

    plan: PlanLayout
    options: TrainingOptions
    memory: MemoryBreakdown
    time: TimeBreakdown
    stage_counts: tuple[int, ...]
    reasons: tuple[str, ...] = field(default_factory=tuple)
    mtp_layers: int = 0
    #: settings of this candidate no calibration point constrains (``longpack.planner.evidence``)
    unmeasured: tuple[str, ...] = ()
    #: ``longpack check`` findings for this layout (warnings and infos; layouts with errors are rejected).
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def pipeline_layout(self) -> str | None:
        """Custom ``pipeline_model_parallel_layout`` when stages are not uniform, else ``None``."""
        if len(self.stage_counts) <= 1 or (len(set(self.stage_counts)) == 1 and self.mtp_layers == 0):
            return None
        return layout_string(self.stage_counts, mtp_layers=self.mtp_layers)


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """Ranked feasible candidates plus what was considered.

    ``rejected`` counts layouts by the reason they were dropped (those the enumeration never built
    included, under ``not enumerated: ...``); ``rule_of_thumb`` compares the best layout with the best
    one using the ``CP ≈ s/4096`` rule of thumb.
    """

    request: SearchRequest
    candidates: tuple[Candidate, ...]
    layouts_considered: int
    layouts_feasible: int
    rejected: dict[str, int]
    rule_of_thumb: RuleOfThumb | None = None
    #: every feasible layout, fastest first, before the ``longpack check`` cross-check (the reference's
    #: rank and the best layout within measured territory are found among them)
    ranked: tuple[Candidate, ...] = ()

    def rank_of(self, step_time: float) -> int:
        """1-based rank a layout with this step time takes among the feasible ones."""
        import bisect

        return bisect.bisect_left([c.time.step_time for c in self.ranked], step_time) + 1


@dataclass(frozen=True, kw_only=True)
class RuleOfThumb:
    """The ``CP ≈ s/4096`` rule of thumb against the chosen layout.

    ``cp``: the rule's CP (a power of two); ``candidate``: the fastest feasible layout with that CP
    (``None`` if none fits, then ``why_not`` says why); ``slower``: its step time over the best one's.
    """

    cp: int
    candidate: Candidate | None
    slower: float | None
    why_not: tuple[str, ...] = ()


def rule_of_thumb_cp(seq_length: int) -> int:
    """``s/4096`` rounded to a power of two (1 below 8K): the NVIDIA long-context starting point.

    >>> rule_of_thumb_cp(4096), rule_of_thumb_cp(32768), rule_of_thumb_cp(131072)
    (1, 8, 32)
    """
    return max(1, 2 ** round(math.log2(max(seq_length / 4096, 1))))


def _pow2_upto(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


@functools.lru_cache(maxsize=1024)
def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def recompute_ladder(model: ModelSpec) -> list[tuple[str, ...]]:
    """Recompute settings ordered from cheapest to most memory-saving (the preferences of the NVIDIA recipes:
    MoE ``moe_act``, then ``layernorm``, MLA ``mla_up_proj``, dense ``mlp``, whole ``moe``, then full;
    core attention is never recomputed by choice).

    >>> recompute_ladder(__import__("longpack.planner.catalog", fromlist=["x"]).load_model("llama3_1_8b"))
    [(), ('layernorm',), ('layernorm', 'mlp'), ('full',)]
    """
    ladder: list[tuple[str, ...]] = [()]
    current: list[str] = []
    steps: list[str] = []
    if model.moe is not None:
        steps.append("moe_act")
    steps.append("layernorm")
    if model.attention.kind == "mla":
        steps.append("mla_up_proj")
    if model.num_dense_layers > 0:
        steps.append("mlp")
    for step in steps:
        current.append(step)
        ladder.append(tuple(sorted(current)))
    if model.moe is not None:
        heavy = sorted({*current, "moe"} - {"moe_act"})
        ladder.append(tuple(heavy))
    ladder.append(("full",))
    return ladder


def default_dispatcher(gpu: GPUSpec, ep: int) -> str:
    """HybridEP on NVL72 (GB200/GB300), DeepEP on NVLink-8 systems, alltoall without EP."""
    if ep <= 1:
        return "alltoall"
    return "hybridep" if gpu.nvlink_domain > 8 else "deepep"


#: Fewest tokens per CP rank the search considers (a planner choice, not a Megatron rule).
MIN_TOKENS_PER_CP_RANK = 256


def enumerate_layouts(req: SearchRequest, rejected: dict[str, int] | None = None) -> list[PlanLayout]:
    """Every parallel layout (with MBS) that satisfies the hard constraints.

    ``rejected``, when given, collects why choices were not enumerated (``not enumerated: ...`` keys,
    counting the sizes each reason removed), so an empty search can say why.
    """
    model, n, s = req.model, req.num_gpus, req.seq_length
    gbs = req.global_batch
    att = model.attention
    why: dict[str, int] = rejected if rejected is not None else {}

    def drop(reason: str) -> None:
        key = f"not enumerated: {reason}"
        why[key] = why.get(key, 0) + 1

    domain = req.gpu.nvlink_domain
    tps = [req.tp] if req.tp is not None else _pow2_upto(min(req.max_tp, domain))
    kept_tps = []
    for t in tps:
        if t > domain:
            drop(f"TP {t} exceeds the {domain}-GPU NVLink domain of {req.gpu.name}")
        elif not tp_divides(att.num_heads, tp=t):
            drop(f"TP {t} does not divide the {att.num_heads} attention heads")
        elif att.kind != "mla" and not tp_divides(att.num_kv_heads, tp=t):
            drop(f"TP {t} does not divide the {att.num_kv_heads} KV heads")
        elif not mp_divides_world(n, tp=t, cp=1, pp=1):
            drop(f"TP {t} does not divide {n} GPUs")
        else:
            kept_tps.append(t)
    out: list[PlanLayout] = []
    for t in kept_tps:
        cps = [req.cp] if req.cp is not None else _pow2_upto(n // t)
        for c in cps:
            if not cp_divides_seq_length(s, cp=c):
                drop(f"CP {c}: seq_length {s} is not a multiple of 2*CP = {2 * c}")
                continue
            if s // c < MIN_TOKENS_PER_CP_RANK and req.cp is None:
                drop(f"CP {c}: fewer than {MIN_TOKENS_PER_CP_RANK} tokens per CP rank")
                continue
            if c > 1 and model.gdn is not None and not gdn_cp_in_version(req.rule_versions):
                drop(
                    f"CP {c}: Megatron-Core {_mcore_of(req.rule_versions)} asserts CP = 1 for Gated DeltaNet "
                    f"(TransformerConfig, before {GDN_CP_SINCE}; check's LP-MODEL-004); plan with "
                    f"--megatron-core-version {GDN_CP_SINCE}"
                )
                continue
            if not gdn_cp_allowed(model, t=t, c=c):
                assert model.gdn is not None
                drop(
                    f"TP {t} x CP {c}: CP does not divide the {model.gdn.num_key_heads} // TP Gated DeltaNet "
                    "key heads (its context parallelism splits heads)"
                )
                continue
            sp = t > 1
            # with SP the sequence splits over CP and then TP: 2c | s (LP-CP-001) and ct | s (LP-SP-001)
            if sp and not sp_splits_cp_shard(s, tp=t, cp=c, sp=sp):
                drop(f"TP {t} x CP {c}: seq_length {s} is not a multiple of TP*CP (sequence parallel)")
                continue
            if not mp_divides_world(n, tp=t, cp=c, pp=1):
                drop(f"TP {t} x CP {c} = {t * c} does not divide {n} GPUs")
                continue
            rest = n // (t * c)
            if req.pp is not None:
                pps = [req.pp] if rest % req.pp == 0 else []
                if not pps:
                    drop(f"PP {req.pp} does not divide the {rest} GPUs left by TP {t} x CP {c}")
            else:
                pps = [p for p in _divisors(rest) if p <= model.num_layers]
            for p in pps:
                d = rest // p
                mbss = [req.mbs] if req.mbs is not None else ([1, 2, 4] if s <= 8192 else [1])
                for b in mbss:
                    if not (gbs_divisible(gbs, mbs=b, dp=d) and gbs_covers_dp(gbs, mbs=b, dp=d)):
                        drop(f"GBS {gbs} is not a multiple of MBS x DP (DP {d} with TP {t} CP {c} PP {p})")
                        continue
                    m = gbs // (b * d)
                    # interleaving needs PP (LP-PP-006) and, in Megatron's schedule, m >= p micro-batches
                    vpps = [
                        v
                        for v in vpp_choices(model.num_layers, p)
                        if vpp_has_pp(v, pp=p) and (v == 1 or m >= p) and p * v <= model.num_layers + 2
                    ]
                    if req.vpp is not None:
                        if req.vpp in vpps or req.vpp == 1:
                            vpps = [req.vpp]
                        else:
                            drop(f"VPP {req.vpp} with PP {p}: needs PP > 1, m >= PP and PP*VPP <= layers + 2")
                            vpps = []
                    for v in vpps:
                        if model.moe is None:
                            eps: list[tuple[int, int]] = [(1, t)]
                        else:
                            etps = [req.etp] if req.etp is not None else [1] + ([t] if t > 1 else [])
                            eps = []
                            for u in etps:
                                for e in [req.ep] if req.ep is not None else _divisors(model.moe.num_experts):
                                    if not ep_divides_experts(model.moe.num_experts, ep=e):
                                        drop(f"EP {e} does not divide the {model.moe.num_experts} experts")
                                    elif not expert_grid_fits(n, pp=p, ep=e, etp=u):
                                        if req.ep is not None or req.etp is not None:
                                            drop(
                                                f"EP {e} x ETP {u} does not divide the {n // p} GPUs per PP stage"
                                            )
                                    else:
                                        eps.append((e, u))
                        for e, u in eps:
                            try:
                                lay = ParallelLayout(
                                    world_size=n,
                                    tp=t,
                                    cp=c,
                                    pp=p,
                                    vpp=v if v > 1 else None,
                                    ep=e,
                                    etp=u,
                                    sp=sp,
                                )
                            except TopologyError as exc:
                                drop(str(exc).split(";")[0])
                                continue
                            out.append(PlanLayout(layout=lay, mbs=b, dense=req.model.moe is None))
    return out


def _dispatcher_for(req: SearchRequest, ep_width: int) -> str:
    """The pinned dispatcher, else the GPU's default, else (without ``explore``) a dispatcher some
    calibration point used on this GPU when the default has none."""
    if req.dispatcher:
        return req.dispatcher
    default = default_dispatcher(req.gpu, ep_width)
    if req.explore or ep_width <= 1 or req.model.moe is None:
        return default
    from longpack.planner.evidence import measured_dispatchers

    measured = measured_dispatchers(req.gpu.name)
    if default in measured or not measured:
        return default
    return next(d for d in ("hybridep", "deepep", "alltoall", "allgather") if d in measured)


def _cp_comm_for(req: SearchRequest, plan: PlanLayout) -> str:
    if req.cp_comm_type is not None:
        return req.cp_comm_type
    among = None
    if not req.explore:
        from longpack.planner.evidence import measured_cp_comm_types

        among = tuple(sorted(measured_cp_comm_types()))
    return best_cp_comm_type(req.model, req.gpu, plan, seq_length=req.seq_length, among=among)


def _options_for(
    req: SearchRequest, plan: PlanLayout, recompute: tuple[str, ...], offload: float
) -> TrainingOptions:
    lay = plan.layout
    dispatcher = _dispatcher_for(req, lay.ep * lay.expert_tp)
    overlap = (
        req.model.moe is not None
        and lay.ep > 1
        and (lay.pp == 1 or (lay.vpp or 1) > 1)
        and dispatcher != "allgather"
        and "moe" not in recompute
        and recompute != ("full",)
    )
    if req.ep_overlap is not None:
        overlap = overlap and req.ep_overlap
    return _make_options(
        req.precision,
        recompute,
        offload,
        dispatcher,
        req.optimizer,
        overlap,
        _cp_comm_for(req, plan),
        "none" if recompute == ("full",) and req.cuda_graphs == "partial" else req.cuda_graphs,
        req.imbalance,
        lay.tp > 1 and (req.tp_comm_overlap is None or req.tp_comm_overlap),
    )


@functools.lru_cache(maxsize=8192)
def _make_options(
    precision: str,
    recompute: tuple[str, ...],
    offload: float,
    dispatcher: str,
    optimizer: str,
    overlap: bool,
    cp_comm_type: str,
    cuda_graphs: str,
    imbalance: float,
    tp_comm_overlap: bool,
) -> TrainingOptions:
    # the same few option sets recur across thousands of layouts; validate each once
    return TrainingOptions(
        precision=precision,
        recompute=recompute,
        optimizer_offload=offload,
        dispatcher=dispatcher,
        optimizer=optimizer,
        ep_overlap=overlap,
        cp_comm_type=cp_comm_type,
        cuda_graphs=cuda_graphs,
        imbalance=imbalance,
        tp_comm_overlap=tp_comm_overlap,
    )


def _memory_estimate(
    req: SearchRequest, plan: PlanLayout, opts: TrainingOptions, counts: tuple[int, ...]
) -> MemoryBreakdown:
    """The memory estimate of ``plan`` with ``opts`` for the request's model, sequence and global batch."""
    return estimate_memory(
        req.model, plan, seq_length=req.seq_length, gbs=req.global_batch, options=opts, stage_counts=counts
    )


def _memory(req: SearchRequest, plan: PlanLayout, opts: TrainingOptions, counts: tuple[int, ...]) -> float:
    return _memory_estimate(req, plan, opts, counts).total_gib


def _time(
    req: SearchRequest,
    plan: PlanLayout,
    opts: TrainingOptions,
    counts: tuple[int, ...],
    params: TimeModelParams | None = None,
) -> TimeBreakdown:
    """The step-time estimate of ``plan`` with ``opts`` (``params``: fitted constants, else the packaged fit)."""
    return estimate_time(
        req.model,
        req.gpu,
        plan,
        seq_length=req.seq_length,
        gbs=req.global_batch,
        options=opts,
        params=params,
        stage_counts=counts,
    )


def versus(a: float, b: float, unit: str = "GiB", digits: int = 1) -> str:
    """``"69.8 GiB < 75.1 GiB"``: two figures with the comparison their printed values show (so a reason
    never says ``>`` of two numbers in the other order, or of two equal ones).

    >>> versus(69.84, 75.1), versus(80.0, 75.1), versus(75.12, 75.14)
    ('69.8 GiB < 75.1 GiB', '80.0 GiB > 75.1 GiB', '75.1 GiB = 75.1 GiB')
    """
    x, y = f"{a:.{digits}f}", f"{b:.{digits}f}"
    op = ">" if float(x) > float(y) else "<" if float(x) < float(y) else "="
    return f"{x} {unit} {op} {y} {unit}"


def _recompute_reasons(req: SearchRequest, cand: Candidate) -> list[str]:
    """Why this recompute / offload setting: what the lighter setting would need, what the heavier
    (full recompute) would cost."""
    out: list[str] = []
    budget = req.fit_budget_gib
    opts, plan, counts = cand.options, cand.plan, cand.stage_counts
    ladder = [req.recompute] if req.recompute is not None else recompute_ladder(req.model)
    step = cand.time.step_time
    if req.recompute is not None:
        out.append(f"recompute pinned to {', '.join(opts.recompute) or 'none'}")
    elif opts.recompute and opts.recompute in ladder:
        idx = ladder.index(opts.recompute)
        lighter = ladder[idx - 1] if idx > 0 else ()
        lighter_opts = _options_for(req, plan, lighter, opts.optimizer_offload)
        need = _memory(req, plan, lighter_opts, counts)
        if need > budget:
            why = f"needs {versus(need, budget)} budget"
        else:
            slower = _time(req, plan, lighter_opts, counts).step_time
            why = (
                f"fits ({versus(need, budget)} budget) but takes {slower:.2f} s per step vs {step:.2f} s"
                if slower > step
                else f"fits ({versus(need, budget)} budget); the search kept the heavier setting"
            )
        out.append(
            f"recompute {', '.join(opts.recompute)}: the lighter setting ({', '.join(lighter) or 'none'}) {why}"
        )
    elif opts.recompute:
        out.append(
            f"recompute {', '.join(opts.recompute)} (as given; fits: {versus(cand.memory.total_gib, budget)} budget)"
        )
    else:
        out.append(f"no recompute: fits ({versus(cand.memory.total_gib, budget)} budget)")
    if not opts.full_recompute:
        full = _time(req, plan, replace(opts, recompute=("full",), ep_overlap=False), counts).step_time
        if full > step:
            out.append(
                f"selective, not full recompute: full would cost {full - step:.2f} s more per step "
                f"(+{full / step - 1:.0%}); full recompute replays attention at long context"
            )
    if opts.optimizer_offload > 0:
        need = _memory(req, plan, replace(opts, optimizer_offload=0.0), counts)
        without = (
            f"without it {versus(need, budget)} budget"
            if need > budget
            else f"without it the layout needs {versus(need, budget)} budget but a heavier recompute, slower"
        )
        out.append(
            f"optimizer CPU offload {opts.optimizer_offload:.0%}: {without}; costs {cand.time.offload:.2f} s per step"
        )
    return out


def _reasons(req: SearchRequest, cand: Candidate, rule: RuleOfThumb | None = None) -> tuple[str, ...]:
    lay, s = cand.plan.layout, req.seq_length
    gbs = req.global_batch
    m = gbs // (cand.plan.mbs * lay.dp)
    tim = cand.time
    out = []
    rule_cp = rule_of_thumb_cp(s)
    if lay.cp > 1 or rule_cp > 1:
        text = (
            f"CP {lay.cp}: {s // lay.cp} tokens per CP rank, zigzag chunks of {s // (2 * lay.cp)}; "
            f"rule of thumb s/4096 = {rule_cp}"
        )
        if lay.cp > 1:
            where = "inside the NVLink domain" if lay.tp * lay.cp <= req.gpu.nvlink_domain else "across nodes"
            text += (
                f"; cp_comm_type {tim.cp_comm_type} ({where}): attention {tim.attention:.2f} s at "
                f"{tim.attention_efficiency:.0%} of BF16 peak, {tim.cp_comm:.2f} s CP comm exposed"
            )
        out.append(text)
    if rule is not None and rule.cp != lay.cp:
        if rule.candidate is not None and rule.slower is not None:
            alt = rule.candidate
            out.append(
                f"the best rule-of-thumb layout ({alt.plan.label}) takes {alt.time.step_time:.2f} s per step "
                f"({rule.slower:+.0%}) at {alt.memory.total_gib:.1f} GiB: CP {rule.cp} "
                + (
                    f"exposes {alt.time.cp_comm:.2f} s of CP comm vs {tim.cp_comm:.2f} s"
                    if alt.time.cp_comm > tim.cp_comm
                    else f"leaves DP {alt.plan.layout.dp} vs {lay.dp} and bubble {alt.time.bubble:.2f} s vs {tim.bubble:.2f} s"
                )
            )
        elif rule.why_not:
            out.append(f"rule-of-thumb CP {rule.cp} does not work here: {'; '.join(rule.why_not)}")
    if lay.dp == 1:
        out.append(f"DP is 1: GBS {gbs} = {m} micro-batches x MBS {cand.plan.mbs}")
    else:
        out.append(f"DP {lay.dp}: GBS {gbs} = {m} micro-batches x MBS {cand.plan.mbs} x DP {lay.dp}")
    if lay.tp > 1:
        out.append(
            f"TP {lay.tp} with tp_comm_overlap assumed (emitted): {tim.tp_comm:.2f} s of TP comm exposed per step"
        )
    if req.model.moe is not None and lay.ep * lay.expert_tp > 1:
        width = lay.ep * lay.expert_tp
        where = (
            "inside one NVLink domain"
            if width <= req.gpu.nvlink_domain
            else f"across {width // req.gpu.nvlink_domain} NVLink domains"
        )
        ovl = ", EP overlap on" if cand.options.ep_overlap else ""
        out.append(
            f"EP {lay.ep} x ETP {lay.expert_tp} {where} ({cand.options.dispatcher}{ovl}): "
            f"{tim.ep_comm:.2f} s EP comm exposed"
        )
    if lay.pp > 1:
        share = tim.bubble / tim.step_time
        out.append(f"PP {lay.pp} x VPP {cand.plan.vpp}: pipeline bubble {share:.0%} of the step")
    out.extend(_recompute_reasons(req, cand))
    if req.imbalance == 1.0 and req.model.moe is not None:
        out.append("routing assumed balanced (imbalance 1.0, like published benchmarks); see --imbalance")
    out.append(
        f"memory {cand.memory.total_gib:.1f} GiB (rank {cand.memory.rank}), "
        f"{cand.memory.total_gib * (1 + req.memory_margin):.1f} GiB with the +{req.memory_margin:.1%} memory band, "
        f"of {req.memory_budget_gib:.1f} GiB"
    )
    out.extend(f"longpack check {f.rule_id} ({f.severity}): {f.message}" for f in cand.findings)
    return tuple(out)


def evaluate_layout(
    req: SearchRequest,
    plan: PlanLayout,
    options: TrainingOptions,
    params: TimeModelParams | None = None,
    stage_counts: tuple[int, ...] | None = None,
) -> Candidate:
    """Memory and time of one layout with given options (no feasibility filtering); ``stage_counts``
    gives decoder layers per virtual stage (a custom pipeline layout), else the planner's split."""
    plan = replace(plan, dense=req.model.moe is None)
    counts = stage_counts if stage_counts is not None else stage_counts_for(req.model, plan)
    mem = _memory_estimate(req, plan, options, counts)
    tim = _time(req, plan, options, counts, params)
    cand = Candidate(
        plan=plan, options=options, memory=mem, time=tim, stage_counts=counts, mtp_layers=req.model.mtp_layers
    )
    return replace(cand, reasons=_reasons(req, cand), unmeasured=_unmeasured(req, cand))


def _unmeasured(req: SearchRequest, cand: Candidate) -> tuple[str, ...]:
    from longpack.planner.evidence import unmeasured_settings

    return unmeasured_settings(req.model, req.gpu, cand.plan, cand.options)


def layout_findings(req: SearchRequest, cand: Candidate) -> tuple[Finding, ...]:
    """What ``longpack check`` says of a candidate: the Megatron topology, batch, CP and pipeline rules
    run on the layout as Megatron-Bridge would receive it (pretraining data, the model's shape from its
    catalog family).

    The search enumerates only layouts it believes valid; this is the independent second opinion, so a
    planner bug cannot recommend a layout that Megatron would refuse at start-up.
    """
    setup = TrainingSetup.from_layout(
        cand.plan.layout,
        seq_length=req.seq_length,
        family=ModelFamily.of_model(req.model),
        micro_batch_size=cand.plan.mbs,
        global_batch_size=req.global_batch,
        dataset_kind="pretraining",
        pipeline_model_parallel_layout=cand.pipeline_layout,
        versions=req.rule_versions,
    )
    return tuple(run_rules(setup))


def search(req: SearchRequest, *, top_k: int = 10, params: TimeModelParams | None = None) -> SearchResult:
    """All feasible layouts ranked by estimated step time (fastest first), ``top_k`` kept.

    For every layout the offload levels (0, 0.5, 1.0) are tried; for each the cheapest recompute
    setting of :func:`recompute_ladder` that fits is found by bisection (memory never rises along
    the ladder), and the fastest fitting combination is kept. The best layout is compared with the
    fastest feasible one at the rule-of-thumb CP (:func:`rule_of_thumb_cp`).
    """
    budget = req.fit_budget_gib
    ladder = [req.recompute] if req.recompute is not None else recompute_ladder(req.model)
    if not req.allow_full_recompute and len(ladder) > 1:
        ladder = [r for r in ladder if r != ("full",)]
    offloads = [0.0, 0.5, 1.0] if req.allow_offload else [0.0]
    rejected: dict[str, int] = {}
    layouts = enumerate_layouts(req, rejected)
    rule_cp = rule_of_thumb_cp(req.seq_length)
    rule_rejected: dict[str, int] = {}
    feasible: list[Candidate] = []
    too_big = (
        "does not fit even with full recompute and offload"
        if req.allow_offload
        else ("does not fit even with full recompute (offload not allowed)")
    )
    if req.recompute is not None:
        too_big = f"does not fit with the pinned recompute {', '.join(req.recompute) or 'none'}"
    for plan in layouts:
        counts = stage_counts_for(req.model, plan)

        def mem_gib(
            opts: TrainingOptions, plan: PlanLayout = plan, counts: tuple[int, ...] = counts
        ) -> float:
            return _memory(req, plan, opts, counts)

        try:
            heaviest = _options_for(req, plan, ladder[-1], offloads[-1])
            least = mem_gib(heaviest)
            if least > budget:
                key = too_big
                rejected[key] = rejected.get(key, 0) + 1
                if plan.layout.cp == rule_cp:
                    k2 = f"{plan.label}: {versus(least, budget, digits=0)} at best"
                    rule_rejected[k2] = rule_rejected.get(k2, 0) + 1
                continue
            best: Candidate | None = None
            for offload in offloads:
                lo, hi = 0, len(ladder) - 1
                if mem_gib(_options_for(req, plan, ladder[hi], offload)) > budget:
                    continue
                while lo < hi:
                    mid = (lo + hi) // 2
                    if mem_gib(_options_for(req, plan, ladder[mid], offload)) <= budget:
                        hi = mid
                    else:
                        lo = mid + 1
                opts = _options_for(req, plan, ladder[lo], offload)
                tim = _time(req, plan, opts, counts, params)
                if best is None or tim.step_time < best.time.step_time:
                    mem = _memory_estimate(req, plan, opts, counts)
                    best = Candidate(
                        plan=plan,
                        options=opts,
                        memory=mem,
                        time=tim,
                        stage_counts=counts,
                        mtp_layers=req.model.mtp_layers,
                    )
                if lo == 0:
                    break  # fits without recompute: more offload cannot be faster
        except PlanError as exc:
            key = str(exc).split(";")[0]
            rejected[key] = rejected.get(key, 0) + 1
            continue
        if best is not None:
            feasible.append(best)
    feasible.sort(key=lambda c: (c.time.step_time, c.memory.total))
    # Cross-check the ranked layouts with longpack.rules, in rank order, until top_k pass.
    kept: list[Candidate] = []
    rule_rejected_check = 0
    for cand in feasible:
        if not req.keep_all and len(kept) >= top_k:
            break
        findings = layout_findings(req, cand)
        if has_errors(findings):
            rule_rejected_check += 1
            first = next(f for f in findings if f.severity == "error")
            key = f"refused by longpack check ({first.rule_id})"
            rejected[key] = rejected.get(key, 0) + 1
            continue
        kept.append(replace(cand, findings=findings, unmeasured=_unmeasured(req, cand)))
    rule = _rule_of_thumb(req, kept, feasible, rule_cp, rule_rejected, rejected)
    return SearchResult(
        request=req,
        candidates=tuple(
            replace(c, reasons=_reasons(req, c, rule if i == 0 else None)) for i, c in enumerate(kept)
        ),
        layouts_considered=len(layouts),
        layouts_feasible=len(feasible) - rule_rejected_check,
        rejected=rejected,
        rule_of_thumb=rule,
        ranked=tuple(feasible),
    )


def _rule_of_thumb(
    req: SearchRequest,
    kept: list[Candidate],
    feasible: list[Candidate],
    rule_cp: int,
    rule_rejected: dict[str, int],
    rejected: dict[str, int],
) -> RuleOfThumb | None:
    if not kept:
        return None
    best = kept[0]
    for cand in feasible:
        if cand.plan.layout.cp == rule_cp:
            if has_errors(layout_findings(req, cand)):
                continue
            return RuleOfThumb(
                cp=rule_cp, candidate=cand, slower=cand.time.step_time / best.time.step_time - 1
            )
    why: list[str] = []
    if rule_cp > req.num_gpus:
        why.append(f"CP {rule_cp} needs more than the {req.num_gpus} GPUs")
    why.extend(
        k[len("not enumerated: ") :] for k in rejected if k.startswith(f"not enumerated: CP {rule_cp}:")
    )
    if rule_rejected:
        worst = sorted(rule_rejected)[:3]
        why.append(f"{sum(rule_rejected.values())} layouts with CP {rule_cp} do not fit, e.g. {worst[0]}")
    if req.cp is not None and req.cp != rule_cp:
        why.append(f"CP is pinned to {req.cp}")
    if not why:
        why.append(f"no layout with CP {rule_cp} is valid for {req.num_gpus} GPUs and GBS {req.global_batch}")
    return RuleOfThumb(cp=rule_cp, candidate=None, slower=None, why_not=tuple(why))
