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

from longpack.planner.catalog import GPUSpec, ModelSpec
from longpack.planner.options import PlanLayout, TrainingOptions

__all__ = ["measured_cp_comm_types", "measured_dispatchers", "unmeasured_settings"]


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
