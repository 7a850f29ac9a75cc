"""Which settings a measurement supports: a setting no calibration point uses is ``unmeasured``.

The time model has terms for every CP communication type and MoE dispatcher, but only the settings some
published run of ``calibration_points.yaml`` used have constrained its constants. A setting no point
constrains (``a2a`` / ``a2a+p2p`` / ``allgather`` CP communication: every published long-context run
uses Megatron's default ``p2p``; a dispatcher on a GPU type with no point using it) is labelled
``unmeasured``, and the planner does not pick it by its modelled gain alone: the default search
chooses among measured settings, ``--explore`` ranks the unmeasured ones too (labelled).

>>> from longpack.planner.catalog import load_gpu, load_model
>>> from longpack.planner.options import PlanLayout, TrainingOptions
>>> from longpack.topology import ParallelLayout
>>> "p2p" in measured_cp_comm_types(), "a2a+p2p" in measured_cp_comm_types()
(True, False)
>>> plan = PlanLayout(layout=ParallelLayout(world_size=256, cp=32, pp=8, ep=32, etp=1))
>>> unmeasured_settings(load_model("deepseek_v3"), load_gpu("H100"), plan,
...                     TrainingOptions(cp_comm_type="a2a+p2p", dispatcher="deepep"))
('cp_comm_type a2a+p2p: no calibration point uses it',)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from longpack.planner.catalog import GPUSpec, ModelSpec
from longpack.planner.options import PlanLayout, TrainingOptions

__all__ = [
    "NEARBY",
    "measured_cp_comm_types",
    "measured_dispatchers",
    "unmeasured_changes",
    "unmeasured_settings",
]


@functools.cache
def measured_cp_comm_types() -> frozenset[str]:
    """CP communication types some calibration point with CP > 1 used."""
    from longpack.planner.calibration import packaged_points

    return frozenset(p.options.cp_comm_type for p in packaged_points() if p.plan.layout.cp > 1)


@functools.cache
def measured_dispatchers(gpu_name: str) -> frozenset[str]:
    """MoE dispatchers some calibration point with expert parallelism used on this GPU type."""
    from longpack.planner.calibration import packaged_points

    return frozenset(
        p.options.dispatcher
        for p in packaged_points()
        if p.gpu == gpu_name and p.plan.layout.ep * (p.plan.layout.expert_tp or 1) > 1
    )


def unmeasured_settings(
    model: ModelSpec, gpu: GPUSpec, plan: PlanLayout, options: TrainingOptions
) -> tuple[str, ...]:
    """The settings of a layout that no calibration point constrains, each with why."""
    out = []
    lay = plan.layout
    if lay.cp > 1 and options.cp_comm_type not in measured_cp_comm_types():
        out.append(f"cp_comm_type {options.cp_comm_type}: no calibration point uses it")
    expert_parallel = model.moe is not None and lay.ep * lay.expert_tp > 1
    if expert_parallel and options.dispatcher not in measured_dispatchers(gpu.name):
        out.append(f"dispatcher {options.dispatcher}: no calibration point on {gpu.name} uses it")
    return tuple(out)


#: How far a setting may sit from a calibration point's and still count as measured ("nearby"): within
#: this factor (CP size and tokens per CP rank, TP, EP, VPP depth).
NEARBY = 2.0


@dataclass(frozen=True)
class _Measured:
    id: str
    kind: str
    attention: str
    long: bool
    blackwell: bool
    gpu: str
    seq_length: int
    tp: int
    cp: int
    vpp: int
    ep: int
    etp: int
    recompute: frozenset[str]
    dispatcher: str
    ep_overlap: bool
    offload: bool
    cp_comm_type: str


@functools.cache
def _territory() -> tuple[_Measured, ...]:
    """The settings of every calibration point with a measured throughput."""
    from longpack.planner.calibration import packaged_points
    from longpack.planner.catalog import load_gpu, load_model

    out = []
    for p in packaged_points():
        if not p.tflops:
            continue
        lay = p.plan.layout
        out.append(
            _Measured(
                id=p.id,
                kind="moe" if load_model(p.model).moe is not None else "dense",
                attention=_attention(load_model(p.model)),
                long=p.seq_length > 8192,
                blackwell=load_gpu(p.gpu).is_blackwell,
                gpu=p.gpu,
                seq_length=p.seq_length,
                tp=lay.tp,
                cp=lay.cp,
                vpp=lay.vpp or 1,
                ep=lay.ep,
                etp=lay.expert_tp or 1,
                recompute=frozenset(p.options.recompute),
                dispatcher=p.options.dispatcher,
                ep_overlap=p.options.ep_overlap,
                offload=p.options.optimizer_offload > 0,
                cp_comm_type=p.options.cp_comm_type,
            )
        )
    return tuple(out)


def _attention(model: ModelSpec) -> str:
    """The attention a CP measurement transfers between: the kind (``mla``, ``gqa``, ...), with Gated
    DeltaNet hybrids apart (their CP splits heads and pays all-to-alls)."""
    return model.attention.kind + ("+gdn" if model.gdn is not None else "")


def _near(a: float, b: float) -> bool:
    return max(a, b) <= NEARBY * min(a, b)


def unmeasured_changes(
    model: ModelSpec, gpu: GPUSpec, seq_length: int, pick: Any, reference: Any
) -> tuple[str, ...]:
    """The settings ``pick`` changes from ``reference`` that no calibration point measures nearby.

    Measured territory, setting by setting (a point of the same kind, dense or MoE, unless said):
    **CP** — a point with the same attention (MLA, GQA, a Gated DeltaNet hybrid) whose CP and tokens per
    CP rank are both within :data:`NEARBY` of the pick's; **TP**
    within :data:`NEARBY`; **EP / ETP** — a MoE point with the same ETP and EP within :data:`NEARBY`;
    **VPP** depth within :data:`NEARBY` (any kind); **recompute scope** — a point of the same context
    class (<= 8K or longer) that recomputes no more than the pick (so the pick keeps no more activations
    than a measured run kept); **dispatcher** on this GPU type; **EP overlap** on this GPU generation;
    **CP communication type**; **optimizer offload**.
    """
    pts = _territory()
    kind = "moe" if model.moe is not None else "dense"
    same = [p for p in pts if p.kind == kind]
    a, b = reference.plan.layout, pick.plan.layout
    o, q = reference.options, pick.options
    out: list[str] = []
    if a.cp != b.cp:
        per_rank = seq_length / b.cp
        att = _attention(model)
        if not any(
            p.attention == att and _near(p.cp, b.cp) and _near(p.seq_length / p.cp, per_rank) for p in same
        ):
            out.append(
                f"CP {b.cp} at {seq_length // b.cp} tokens per CP rank: no {kind} calibration point with "
                f"{att} attention within {NEARBY:g}x of both"
            )
    if a.tp != b.tp and not any(_near(p.tp, b.tp) for p in same):
        out.append(f"TP {b.tp}: no {kind} calibration point within {NEARBY:g}x")
    if model.moe is not None and (a.ep, a.expert_tp) != (b.ep, b.expert_tp):
        etp = b.expert_tp or 1
        if not any(p.etp == etp and _near(p.ep, b.ep) for p in same):
            out.append(
                f"EP {b.ep} x ETP {etp}: no MoE calibration point with ETP {etp} and EP within {NEARBY:g}x"
            )
    if (reference.plan.vpp or 1) != (pick.plan.vpp or 1) and (pick.plan.vpp or 1) > 1:
        v = pick.plan.vpp or 1
        if not any(p.vpp > 1 and _near(p.vpp, v) for p in pts):
            out.append(f"VPP {v}: no calibration point with a VPP depth within {NEARBY:g}x")
    if o.recompute != q.recompute:
        mine = frozenset(q.recompute)
        long = seq_length > 8192
        covered = "full" in mine or any(
            p.long == long and (p.recompute <= mine or ("full" in p.recompute and "full" in mine))
            for p in same
        )
        if not covered:
            what = ",".join(q.recompute) or "none"
            out.append(
                f"recompute {what}: every {kind} calibration point at "
                f"{'> 8K' if long else '<= 8K'} recomputes more (the saved activations are modelled only)"
            )
    expert = model.moe is not None and b.ep * (b.expert_tp or 1) > 1
    if expert and o.dispatcher != q.dispatcher and q.dispatcher not in measured_dispatchers(gpu.name):
        out.append(f"dispatcher {q.dispatcher}: no calibration point on {gpu.name} uses it")
    overlap_measured = any(p.ep_overlap and p.blackwell == gpu.is_blackwell for p in pts)
    if q.ep_overlap and not o.ep_overlap and not overlap_measured:
        gen = "Blackwell" if gpu.is_blackwell else "Hopper"
        out.append(f"EP overlap: no {gen} calibration point runs it")
    if b.cp > 1 and o.cp_comm_type != q.cp_comm_type and q.cp_comm_type not in measured_cp_comm_types():
        out.append(f"cp_comm_type {q.cp_comm_type}: no calibration point uses it")
    if q.optimizer_offload > 0 and o.optimizer_offload == 0 and not any(p.offload for p in pts):
        out.append("optimizer offload: no calibration point uses it")
    return tuple(out)
