"""The reference beside every plan: a published layout when one exists, else the seed's rules.

A user comparing the planner's pick with NVIDIA's recipe needs both side by side, with the pick's
predicted gain and whether that gain is larger than the estimate's error band.

* **Published**: a run of ``calibration_points.yaml`` (Megatron-Bridge performance recipes, NVIDIA's
  skill cards, the Megatron-MoE model zoo; each point names its source) with the same model, GPU type
  and sequence length whose model-parallel sizes fit the GPU count and the global batch. Its settings
  are the published ones; a setting the run does not state is Megatron's default (``p2p`` CP
  communication, no EP overlap), never the planner's optimum. Held-out runs are not in that file.
* **Seed rules** otherwise: CP = s/4096 rounded to a power of two (the nearest feasible one), the
  lightest selective recompute that fits (never full), optimizer offload only when needed, Megatron's
  defaults for everything else (``p2p`` CP communication, the ``alltoall`` dispatcher, no EP overlap,
  no TP-comm overlap), and the fastest TP / PP / EP with those.

The comparison: ``gain`` = reference step time / pick step time − 1; inside the pick's error band
(``longpack.planner.uncertainty``) it is a **tie, and a tie goes to the reference**; a pick with an
unmeasured setting (``longpack.planner.evidence``) never wins by its modelled gain alone.

>>> from longpack.planner.catalog import load_gpu, load_model
>>> from longpack.planner.search import SearchRequest
>>> req = SearchRequest(model=load_model("deepseek_v3"), gpu=load_gpu("H100"), num_gpus=256,
...                     seq_length=131072, precision="fp8")
>>> ref = reference_for(req)
>>> ref.kind, ref.candidate.plan.label
('published', 'TP1 CP32 EP32 ETP1 PP8 VPP4 DP1 EDP1 MBS1')
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from longpack.planner.options import PlanError
from longpack.planner.search import Candidate, SearchRequest, evaluate_layout, rule_of_thumb_cp, search
from longpack.planner.uncertainty import format_band
from longpack.topology import TopologyError

__all__ = ["Comparison", "Reference", "compare", "reference_for"]


@dataclass(frozen=True, kw_only=True)
class Reference:
    """``kind``: ``published`` or ``seed rules``; ``source``: where the layout comes from;
    ``candidate``: the reference evaluated by the planner's own memory and step-time models;
    ``fits``: whether it fits the memory budget by the planner's estimate; ``notes``: what was adapted
    (a DP changed for another GPU count, the precision of the request)."""

    kind: str
    source: str
    candidate: Candidate
    fits: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """The pick against the reference: ``changes`` (settings that differ, ``"CP 32 -> 8"``),
    ``gain`` (reference time / pick time − 1), ``band`` (relative error band), ``outside_band``,
    ``verdict`` (``"pick"`` or ``"reference"``) and ``why``."""

    changes: tuple[str, ...]
    gain: float
    band: float
    outside_band: bool
    verdict: str
    why: str


def _published(req: SearchRequest) -> Reference | None:
    from longpack.planner.calibration import packaged_points

    best: tuple[tuple[int, int, int, float], Any] | None = None
    for point in packaged_points():
        if (point.model, point.gpu, point.seq_length) != (req.model.name, req.gpu.name, req.seq_length):
            continue
        if not point.tflops:
            continue  # a memory-only point states no throughput recipe
        lay = point.plan.layout
        mp = lay.tp * lay.cp * lay.pp
        if req.num_gpus % mp:
            continue
        score = (
            int(point.options.precision == req.precision),
            int(not point.superseded),  # the newest release of a repeated row
            int(lay.world_size == req.num_gpus),
            point.tflops or 0.0,
        )
        if best is None or score > best[0]:
            best = (score, point)
    if best is None:
        return None
    point = best[1]
    lay = point.plan.layout
    notes = []
    try:
        layout = lay if lay.world_size == req.num_gpus else replace_world(lay, req.num_gpus)
        plan = replace(point.plan, layout=layout)
        options = replace(point.options, precision=req.precision)
        if lay.world_size != req.num_gpus:
            notes.append(f"published on {lay.world_size} GPUs (DP {lay.dp}); here DP {layout.dp}")
        if point.options.precision != req.precision:
            notes.append(f"published in {point.options.precision}; estimated here in {req.precision}")
        if req.global_batch % (layout.dp * plan.mbs):
            return None
        cand = evaluate_layout(req, plan, options, stage_counts=point.stage_counts)
    except (PlanError, TopologyError, ValueError):
        return None
    src = _source_of(point.id)
    return Reference(
        kind="published",
        source=f"{src} (calibration point {point.id})",
        candidate=cand,
        fits=cand.memory.total_gib <= req.memory_budget_gib,
        notes=tuple(notes),
    )


def replace_world(lay: Any, world_size: int) -> Any:
    """The same model-parallel sizes on ``world_size`` GPUs (DP follows)."""
    from longpack.topology import ParallelLayout

    return ParallelLayout(
        world_size=world_size,
        tp=lay.tp,
        cp=lay.cp,
        pp=lay.pp,
        vpp=lay.vpp,
        ep=lay.ep,
        etp=lay.etp,
        sp=lay.sp,
    )


def _source_of(point_id: str) -> str:
    return _sources().get(point_id, "calibration_points.yaml")


@functools.cache
def _sources() -> dict[str, str]:
    """``id -> source`` of the packaged calibration points (read once)."""
    from longpack.planner.calibration import read_calibration

    return {
        str(p.get("id")): " ".join(str(p.get("source", "calibration_points.yaml")).split())
        for p in read_calibration()
        if isinstance(p, dict)
    }


def _seed(req: SearchRequest) -> Reference | None:
    rule = rule_of_thumb_cp(req.seq_length)
    order = [rule]
    step = 1
    while len(order) < 12:
        for cand in (rule // 2**step, rule * 2**step):
            if 1 <= cand <= req.num_gpus and cand not in order:
                order.append(cand)
        step += 1
        if rule // 2**step < 1 and rule * 2**step > req.num_gpus:
            break
    if req.cp is not None:
        order = [req.cp]
    for c in order:
        try:
            sub = replace(
                req,
                cp=c,
                cp_comm_type="p2p",
                dispatcher="alltoall" if req.model.moe is not None else req.dispatcher,
                ep_overlap=False,
                tp_comm_overlap=False,
                allow_full_recompute=False,
                explore=True,  # every setting is pinned above; nothing is left to the evidence filter
            )
            found = search(sub, top_k=1)
        except (PlanError, TopologyError):
            continue
        if found.candidates:
            cand = found.candidates[0]
            notes = (
                []
                if c == rule
                else [f"CP {rule} (s/4096) does not fit or is invalid here; nearest feasible CP {c}"]
            )
            return Reference(
                kind="seed rules",
                source=(
                    "seed rules: CP = s/4096 as a power of two, selective recompute, Megatron defaults "
                    + (
                        "(p2p CP comm, alltoall dispatcher, no EP / TP-comm overlap)"
                        if req.model.moe is not None
                        else "(p2p CP comm, no TP-comm overlap)"
                    )
                ),
                candidate=cand,
                fits=True,
                notes=tuple(notes),
            )
    return None


def reference_for(req: SearchRequest) -> Reference | None:
    """The published layout for this model / GPU / sequence length when one exists, else the seed's
    rules (``None`` when neither gives a valid layout)."""
    return _published(req) or _seed(req)


def _changes(pick: Candidate, ref: Candidate) -> tuple[str, ...]:
    a, b = ref.plan.layout, pick.plan.layout
    out = []
    for name, x, y in (
        ("TP", a.tp, b.tp),
        ("CP", a.cp, b.cp),
        ("PP", a.pp, b.pp),
        ("VPP", ref.plan.vpp, pick.plan.vpp),
        ("DP", a.dp, b.dp),
        ("MBS", ref.plan.mbs, pick.plan.mbs),
    ):
        if x != y:
            out.append(f"{name} {x} -> {y}")
    if pick.mtp_layers or a.ep > 1 or b.ep > 1:
        for name, x, y in (("EP", a.ep, b.ep), ("ETP", a.expert_tp, b.expert_tp)):
            if x != y:
                out.append(f"{name} {x} -> {y}")
    o, p = ref.options, pick.options
    if o.recompute != p.recompute:
        out.append(f"recompute {','.join(o.recompute) or 'none'} -> {','.join(p.recompute) or 'none'}")
    if o.optimizer_offload != p.optimizer_offload:
        out.append(f"optimizer offload {o.optimizer_offload:.0%} -> {p.optimizer_offload:.0%}")
    if (a.cp > 1 or b.cp > 1) and o.cp_comm_type != p.cp_comm_type:
        out.append(f"cp_comm_type {o.cp_comm_type} -> {p.cp_comm_type}")
    if (a.ep > 1 or b.ep > 1) and o.dispatcher != p.dispatcher:
        out.append(f"dispatcher {o.dispatcher} -> {p.dispatcher}")
    if (a.ep > 1 or b.ep > 1) and o.ep_overlap != p.ep_overlap:
        out.append(f"EP overlap {'on' if o.ep_overlap else 'off'} -> {'on' if p.ep_overlap else 'off'}")
    if (a.tp > 1 or b.tp > 1) and o.tp_comm_overlap != p.tp_comm_overlap:
        out.append(
            f"TP-comm overlap {'on' if o.tp_comm_overlap else 'off'} -> {'on' if p.tp_comm_overlap else 'off'}"
        )
    return tuple(out)


def compare(pick: Candidate, reference: Reference, band: float) -> Comparison:
    """The pick against the reference (see the module docstring for the rule).

    A reference that does not fit the memory budget (by the planner's estimate) loses to a pick that
    does; an identical layout is the reference itself.
    """
    changes = _changes(pick, reference.candidate)
    gain = reference.candidate.time.step_time / pick.time.step_time - 1
    outside = gain > band
    if not changes:
        return Comparison(
            changes=(),
            gain=0.0,
            band=band,
            outside_band=False,
            verdict="reference",
            why="the pick is the reference",
        )
    if not reference.fits:
        return Comparison(
            changes=changes,
            gain=gain,
            band=band,
            outside_band=outside,
            verdict="pick",
            why=(
                f"the reference needs {reference.candidate.memory.total_gib:.1f} GiB per GPU by the planner's "
                "memory estimate, more than the budget"
            ),
        )
    # an unmeasured kind of setting the reference shares (no dispatcher measured on this GPU at all)
    # does not decide; one only the pick has does
    shared = {u.split()[0] for u in reference.candidate.unmeasured}
    alone = [u for u in pick.unmeasured if u.split()[0] not in shared]
    if alone:
        return Comparison(
            changes=changes,
            gain=gain,
            band=band,
            outside_band=outside,
            verdict="reference",
            why=f"the pick relies on unmeasured settings ({'; '.join(alone)}): its gain is modelled only",
        )
    if outside:
        why = f"predicted gain {gain:+.0%} is outside the {format_band(band)} error band"
        return Comparison(changes=changes, gain=gain, band=band, outside_band=True, verdict="pick", why=why)
    why = (
        f"predicted gain {gain:+.0%} is inside the {format_band(band)} error band: a tie, and a tie goes to "
        "the reference"
    )
    return Comparison(changes=changes, gain=gain, band=band, outside_band=False, verdict="reference", why=why)
