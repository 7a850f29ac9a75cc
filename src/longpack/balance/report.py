"""Side-by-side comparison of packers under one cost model and training layout (pure numpy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack import choices
from longpack.balance.cost import PackCostModel
from longpack.balance.packer import balanced_pack, step_length_correlation
from longpack.balance.schedule import simulate_schedule
from longpack.balance.target import BalanceTarget
from longpack.binpack import pack_lengths

#: What each column of ``longpack balance`` means (the table's legend, its help and the docs say this).
COLUMNS = {
    "packs": "packs the packer made",
    "fill %": "tokens / (packs x pack size)",
    "time s": "simulated time of one pass over the data: the sum of step times, each step waiting for its "
    "slowest DP rank and pipeline",
    "/ideal": "time s / the ideal: the same work spread perfectly evenly over ranks and micro-batches "
    "(1.000 = nothing lost to imbalance)",
    "rank imb": "mean over steps of (slowest DP rank's work / mean rank's work); 1.000 = every rank equal",
    "corr": "correlation of the step index with the step's mean sample length: near 0 no trend over "
    "training (as a shuffle), -1 long samples first (a sorted order changes the loss curve)",
}


@dataclass(frozen=True, kw_only=True)
class PackingReport:
    """One packing's simulated training pass. ``bin_of_item`` ids are the order packs are read."""

    name: str
    bin_of_item: np.ndarray
    num_packs: int
    fill: float  # total tokens / (packs · capacity)
    total_time: float  # sum of simulated step times
    ideal_time: float  # same packs, perfectly balanced
    rank_imbalance: float  # mean over steps of max/mean rank work
    step_length_correlation: float


def compare_packings(
    lengths: Any,
    capacity: int,
    *,
    cost_model: PackCostModel,
    dp: int,
    pp: int,
    gbs: int,
    micro_batch_size: int = 1,
    schedule: str = choices.SCHEDULE_1F1B,
    vpp: int = 1,
    sampler: str = choices.BATCH_SAMPLER,
    seed: int = 0,
) -> list[PackingReport]:
    """Pack with Megatron-Bridge's ``first_fit_shuffle``, ``best_fit_decreasing`` and ``balanced_pack``.

    >>> model = PackCostModel(linear=1.0, quadratic=0.001)
    >>> reports = compare_packings([900, 800, 100, 200, 500, 500, 400, 600] * 4, 1000, cost_model=model,
    ...                            dp=2, pp=1, gbs=4)
    >>> [(r.name, r.num_packs) for r in reports]
    [('first_fit_shuffle', 17), ('best_fit', 16), ('balanced', 16)]
    >>> reports[2].total_time <= reports[1].total_time
    True
    """
    arr = np.asarray(lengths, dtype=np.int64)
    layout: dict[str, Any] = dict(
        dp=dp, pp=pp, gbs=gbs, micro_batch_size=micro_batch_size, schedule=schedule, vpp=vpp
    )
    target = BalanceTarget(cost_model=cost_model, sampler=sampler, **layout)
    packings = {
        choices.FIRST_FIT_SHUFFLE: pack_lengths(
            arr, capacity, algorithm=choices.FIRST_FIT_SHUFFLE, seed=seed
        ),
        "best_fit": pack_lengths(arr, capacity, algorithm=choices.BEST_FIT_DECREASING, seed=seed),
        "balanced": balanced_pack(arr, capacity, target, seed=seed),
    }
    out = []
    for name, bins in packings.items():
        result = simulate_schedule(cost_model.cost(arr, bins), sampler=sampler, **layout)
        n = int(bins.max()) + 1 if bins.size else 0
        out.append(
            PackingReport(
                name=name,
                bin_of_item=bins,
                num_packs=n,
                fill=float(arr.sum()) / (n * capacity) if n else 1.0,
                total_time=result.total_time,
                ideal_time=result.ideal_time,
                rank_imbalance=float(result.rank_imbalance.mean()),
                step_length_correlation=step_length_correlation(arr, bins, gbs=gbs),
            )
        )
    return out
