"""Workload-balanced packing: pack cost model, training-step simulator and the balanced packer.

Packs with equal token counts can differ several-fold in work (causal attention grows with Σ L²), and
under data and pipeline parallelism the slowest micro-batch and the slowest rank set the step time.

- ``PackCostModel``: ``cost = per_pack + per_sequence·k + linear·Σ L + quadratic·Σ L²``, from FLOPs
  (``from_flops``, ``from_dense_model``) or fitted to measured times (``fit``).
- ``simulate_schedule``: step times for DP × PP (1F1B / interleaved) and the perfectly balanced ideal.
- ``BalanceTarget``: the topology (DP, PP, VPP, GBS, MBS, sampler, schedule) and the cost model.
- ``balanced_pack``: best-fit-level fill with even pack costs; **bin ids are the training order**.
- ``pack_rollouts``: RL rollouts packed at run time into THD bins per DP rank (Megatron-LM's RL packer's
  layout, or balanced by cost), with ``cu_seqlens`` and the CP split.

Imports ``longpack.binpack`` only. Cost models from the planner's catalogs and the ``--balance`` text are
built by ``longpack.planner.balance_costs`` (``pack_cost_model``, ``parse_balance_spec``), which imports
this package.

>>> from longpack.balance import BalanceTarget, PackCostModel, balanced_pack, simulate_schedule
>>> model = PackCostModel(linear=1.0, quadratic=0.001)
>>> lengths = [900, 800, 100, 200, 500, 500, 400, 600]
>>> bins = balanced_pack(lengths, 1000, BalanceTarget(cost_model=model, dp=2, gbs=4), seed=0)
>>> result = simulate_schedule(model.cost(lengths, bins), dp=2, pp=1, gbs=4)
>>> result.num_steps, round(result.efficiency, 3)
(1, 0.982)
"""

from __future__ import annotations

from longpack.balance.cost import PackCostModel, TransformerFlops, megatron_dense_flops
from longpack.balance.packer import (
    balanced_pack,
    cost_balanced_bins,
    order_packs,
    step_length_correlation,
)
from longpack.balance.rollouts import RankBins, RolloutPacking, RolloutPackingError, pack_rollouts
from longpack.balance.schedule import (
    SAMPLERS,
    SCHEDULES,
    PackSlots,
    ScheduleResult,
    micro_batches_per_rank,
    pack_slots,
    pipeline_makespan,
    positions_for_slots,
    simulate_schedule,
)
from longpack.balance.target import BalanceTarget

__all__ = [
    "SAMPLERS",
    "SCHEDULES",
    "BalanceTarget",
    "PackCostModel",
    "PackSlots",
    "RankBins",
    "RolloutPacking",
    "RolloutPackingError",
    "ScheduleResult",
    "TransformerFlops",
    "balanced_pack",
    "cost_balanced_bins",
    "megatron_dense_flops",
    "micro_batches_per_rank",
    "order_packs",
    "pack_rollouts",
    "pack_slots",
    "pipeline_makespan",
    "positions_for_slots",
    "simulate_schedule",
    "step_length_correlation",
]
