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
from longpack.planner.memory import MemoryBreakdown, estimate_memory, stage_counts_for
from longpack.planner.options import PlanError, PlanLayout, TrainingOptions, layout_string
from longpack.planner.timing import TimeBreakdown, TimeModelParams, best_cp_comm_type, estimate_time
from longpack.rules import Finding, TrainingSetup, has_errors, run_rules
from longpack.rules.checks.batch import gbs_covers_dp, gbs_divisible
from longpack.rules.checks.cp import cp_divides_seq_length
from longpack.rules.checks.pipeline import vpp_has_pp
from longpack.rules.checks.topology import (
    ep_divides_experts,
    expert_grid_fits,
    mp_divides_world,
    sp_splits_cp_shard,
    tp_divides,
)
from longpack.topology import ParallelLayout, TopologyError

VPP_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)


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

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise PlanError(f"num_gpus must be positive, got {self.num_gpus}")
        if self.seq_length < 2:
            raise PlanError(f"seq_length must be >= 2, got {self.seq_length}")
        if self.gbs is not None and self.gbs < 1:
            raise PlanError(f"gbs must be positive, got {self.gbs}")
        if not 0 < self.headroom <= 1:
            raise PlanError(f"headroom must be in (0, 1], got {self.headroom}")
        if self.precision in ("mxfp8", "nvfp4") and not self.gpu.is_blackwell:
            raise PlanError(
                f"precision {self.precision} needs a Blackwell GPU; {self.gpu.name} supports bf16 and fp8 (blockwise)"
            )

    @property
    def memory_budget_gib(self) -> float:
        """Usable GiB per GPU after headroom."""
        return self.gpu.usable_memory_gib * self.headroom

    @property
    def global_batch(self) -> int:
        """GBS: given, or ≈ 16M tokens per step rounded to a power of two (the token budget of the
        Megatron-Bridge DeepSeek-V3 recipes, GBS 4096 × 4K; GBS shrinks as ``s`` grows)."""
        if self.gbs is not None:
            return self.gbs
        return max(1, 2 ** round(math.log2(max(1.0, 16 * 2**20 / self.seq_length))))


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
    """Ranked feasible candidates plus what was considered."""

    request: SearchRequest
    candidates: tuple[Candidate, ...]
    layouts_considered: int
    layouts_feasible: int
    rejected: dict[str, int]


def _pow2_upto(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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


def enumerate_layouts(req: SearchRequest) -> list[PlanLayout]:
    """Every parallel layout (with MBS) that satisfies the hard constraints."""
    model, n, s = req.model, req.num_gpus, req.seq_length
    gbs = req.global_batch
    att = model.attention
    tps = [
        t
        for t in _pow2_upto(min(req.max_tp, req.gpu.nvlink_domain))
        if tp_divides(att.num_heads, tp=t)
        and (att.kind == "mla" or tp_divides(att.num_kv_heads, tp=t))
        and mp_divides_world(n, tp=t, cp=1, pp=1)
    ]
    if req.tp is not None:
        tps = [req.tp]
    out: list[PlanLayout] = []
    for t in tps:
        cps = [
            c
            for c in _pow2_upto(n // t)
            if cp_divides_seq_length(s, cp=c) and s // c >= MIN_TOKENS_PER_CP_RANK
        ]
        if req.cp is not None:
            cps = [req.cp]
        for c in cps:
            sp = t > 1
            # with SP the sequence splits over CP and then TP: 2c | s (LP-CP-001) and ct | s (LP-SP-001);
            # a pinned CP without SP is left to layout_findings, which reports LP-CP-001
            if sp and not (cp_divides_seq_length(s, cp=c) and sp_splits_cp_shard(s, tp=t, cp=c, sp=sp)):
                continue
            if not mp_divides_world(n, tp=t, cp=c, pp=1):
                continue
            rest = n // (t * c)
            pps = [p for p in _divisors(rest) if p <= model.num_layers]
            if req.pp is not None:
                pps = [req.pp] if rest % req.pp == 0 else []
            for p in pps:
                d = rest // p
                mbss = [1, 2, 4] if s <= 8192 else [1]
                if req.mbs is not None:
                    mbss = [req.mbs]
                for b in mbss:
                    if not (gbs_divisible(gbs, mbs=b, dp=d) and gbs_covers_dp(gbs, mbs=b, dp=d)):
                        continue
                    m = gbs // (b * d)
                    # interleaving needs PP (LP-PP-006) and, in Megatron's schedule, m >= p micro-batches
                    vpps = [
                        v
                        for v in VPP_CHOICES
                        if vpp_has_pp(v, pp=p) and (v == 1 or m >= p) and p * v <= model.num_layers + 2
                    ]
                    if req.vpp is not None:
                        vpps = [req.vpp] if req.vpp in vpps or req.vpp == 1 else []
                    for v in vpps:
                        if model.moe is None:
                            eps: list[tuple[int, int]] = [(1, t)]
                        else:
                            etps = [1] + ([t] if t > 1 else [])
                            if req.etp is not None:
                                etps = [req.etp]
                            eps = [
                                (e, u)
                                for u in etps
                                for e in _divisors(model.moe.num_experts)
                                if ep_divides_experts(model.moe.num_experts, ep=e)
                                and expert_grid_fits(n, pp=p, ep=e, etp=u)
                            ]
                            if req.ep is not None:
                                eps = [(e, u) for e, u in eps if e == req.ep]
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
                            except TopologyError:
                                continue
                            out.append(PlanLayout(layout=lay, mbs=b))
    return out


def _options_for(
    req: SearchRequest, plan: PlanLayout, recompute: tuple[str, ...], offload: float
) -> TrainingOptions:
    lay = plan.layout
    dispatcher = req.dispatcher or default_dispatcher(req.gpu, lay.ep * lay.expert_tp)
    overlap = (
        req.model.moe is not None
        and lay.ep > 1
        and (lay.pp == 1 or (lay.vpp or 1) > 1)
        and dispatcher != "allgather"
        and "moe" not in recompute
        and recompute != ("full",)
    )
    return _make_options(
        req.precision,
        recompute,
        offload,
        dispatcher,
        req.optimizer,
        overlap,
        best_cp_comm_type(req.model, req.gpu, plan, seq_length=req.seq_length),
        "none" if recompute == ("full",) and req.cuda_graphs == "partial" else req.cuda_graphs,
        req.imbalance,
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
    )


def _reasons(req: SearchRequest, cand: Candidate) -> tuple[str, ...]:
    lay, s = cand.plan.layout, req.seq_length
    gbs = req.global_batch
    m = gbs // (cand.plan.mbs * lay.dp)
    out = []
    if lay.cp > 1:
        rule = max(1, 2 ** round(math.log2(max(s / 4096, 1))))
        out.append(f"CP {lay.cp} -> {s // lay.cp} tokens per CP rank (rule of thumb s/4096 = {rule})")
    if lay.dp == 1:
        out.append(f"DP is 1: GBS {gbs} = {m} micro-batches x MBS {cand.plan.mbs}")
    else:
        out.append(f"DP {lay.dp}: GBS {gbs} = {m} micro-batches x MBS {cand.plan.mbs} x DP {lay.dp}")
    if lay.ep * lay.expert_tp > 1:
        width = lay.ep * lay.expert_tp
        where = (
            "inside one NVLink domain"
            if width <= req.gpu.nvlink_domain
            else f"across {width // req.gpu.nvlink_domain} NVLink domains"
        )
        out.append(f"EP {lay.ep} x ETP {lay.expert_tp} {where} ({cand.options.dispatcher})")
    if lay.pp > 1:
        share = cand.time.bubble / cand.time.step_time
        out.append(f"PP {lay.pp} x VPP {cand.plan.vpp}: pipeline bubble {share:.0%} of the step")
    if cand.options.recompute:
        out.append(f"recompute {', '.join(cand.options.recompute)} to fit")
    if cand.options.optimizer_offload > 0:
        out.append(f"needs optimizer offload {cand.options.optimizer_offload:.0%}")
    out.append(
        f"memory {cand.memory.total_gib:.1f} of {req.memory_budget_gib:.1f} GiB (rank {cand.memory.rank})"
    )
    out.extend(f"longpack check {f.rule_id} ({f.severity}): {f.message}" for f in cand.findings)
    return tuple(out)


def evaluate_layout(
    req: SearchRequest,
    plan: PlanLayout,
    options: TrainingOptions,
    params: TimeModelParams | None = None,
) -> Candidate:
    """Memory and time of one layout with given options (no feasibility filtering)."""
    counts = stage_counts_for(req.model, plan)
    gbs = req.global_batch
    mem = estimate_memory(
        req.model, plan, seq_length=req.seq_length, gbs=gbs, options=options, stage_counts=counts
    )
    tim = estimate_time(
        req.model,
        req.gpu,
        plan,
        seq_length=req.seq_length,
        gbs=gbs,
        options=options,
        params=params,
        stage_counts=counts,
    )
    cand = Candidate(
        plan=plan, options=options, memory=mem, time=tim, stage_counts=counts, mtp_layers=req.model.mtp_layers
    )
    return replace(cand, reasons=_reasons(req, cand))


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
    )
    return tuple(run_rules(setup))


def search(req: SearchRequest, *, top_k: int = 10, params: TimeModelParams | None = None) -> SearchResult:
    """All feasible layouts ranked by estimated step time (fastest first), ``top_k`` kept.

    For every layout the offload levels (0, 0.5, 1.0) are tried; for each the cheapest recompute
    setting of :func:`recompute_ladder` that fits is found by bisection (memory never rises along
    the ladder), and the fastest fitting combination is kept.
    """
    budget = req.memory_budget_gib
    ladder = [req.recompute] if req.recompute is not None else recompute_ladder(req.model)
    offloads = [0.0, 0.5, 1.0] if req.allow_offload else [0.0]
    gbs = req.global_batch
    layouts = enumerate_layouts(req)
    rejected: dict[str, int] = {}
    feasible: list[Candidate] = []
    for plan in layouts:
        counts = stage_counts_for(req.model, plan)

        def mem_gib(
            opts: TrainingOptions, plan: PlanLayout = plan, counts: tuple[int, ...] = counts
        ) -> float:
            return estimate_memory(
                req.model, plan, seq_length=req.seq_length, gbs=gbs, options=opts, stage_counts=counts
            ).total_gib

        try:
            heaviest = _options_for(req, plan, ladder[-1], offloads[-1])
            if mem_gib(heaviest) > budget:
                rejected["does not fit even with full recompute and offload"] = (
                    rejected.get("does not fit even with full recompute and offload", 0) + 1
                )
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
                tim = estimate_time(
                    req.model,
                    req.gpu,
                    plan,
                    seq_length=req.seq_length,
                    gbs=gbs,
                    options=opts,
                    params=params,
                    stage_counts=counts,
                )
                if best is None or tim.step_time < best.time.step_time:
                    mem = estimate_memory(
                        req.model, plan, seq_length=req.seq_length, gbs=gbs, options=opts, stage_counts=counts
                    )
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
    rule_rejected = 0
    for cand in feasible:
        if not req.keep_all and len(kept) >= top_k:
            break
        findings = layout_findings(req, cand)
        if has_errors(findings):
            rule_rejected += 1
            first = next(f for f in findings if f.severity == "error")
            key = f"refused by longpack check ({first.rule_id})"
            rejected[key] = rejected.get(key, 0) + 1
            continue
        kept.append(replace(cand, findings=findings))
    return SearchResult(
        request=req,
        candidates=tuple(replace(c, reasons=_reasons(req, c)) for c in kept),
        layouts_considered=len(layouts),
        layouts_feasible=len(feasible) - rule_rejected,
        rejected=rejected,
    )
