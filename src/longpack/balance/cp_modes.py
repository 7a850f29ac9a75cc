"""Static CP, Megatron's hybrid CP and its DP-balanced packing scheduler, timed on the same tokens.

Each mode trains the same global batches (the sequences of ``gbs`` consecutive packs per step) on
``dp x cp`` ranks:

* **static** (Megatron's default): every pack is one micro-batch split over the ``cp`` ranks of a DP rank;
  packs are dealt to DP ranks as Megatron's batch sampler does; a step lasts as long as its busiest
  DP rank (the gradient all-reduce waits for it).
* **hybrid** (``hybrid_context_parallel``): the step's sequences are rescheduled over all ``dp x cp``
  ranks by ``schedule_hybrid_cp``, each on as few ranks as its length needs; a step is the sum over
  its groups of the busiest rank (each group ends with a barrier).
* **dp_balanced** (``sequence_packing_scheduler="dp_balanced"``): the step's sequences are re-packed in
  order up to ``max_seqlen_per_dp_cp_rank x cp`` tokens by ``dp_balanced_packs``; each pack is split over
  ``cp`` ranks; a step lasts as long as its busiest DP rank.

The time of a micro-batch comes from a caller's ``seconds(lengths, ranks)`` (the planner's step-time
model), so the comparison is only as good as that model; pipeline parallelism is not modelled (hybrid
CP refuses it).

>>> cost = lambda lengths, ranks: sum(n + n * n / 1000 for n in lengths) / ranks
>>> packs = [[4000], [500] * 8, [3000, 1000], [250] * 16]
>>> c = compare_cp_modes(packs, dp=2, cp=2, gbs=4, max_seqlen_per_rank=2048, seconds=cost)
>>> {mode: round(t) for mode, t in c.times.items()}
{'static': 17000, 'hybrid': 14000, 'dp_balanced': 17000}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from longpack.balance.dp_balanced import dp_balanced_packs
from longpack.balance.hybrid_cp import schedule_hybrid_cp
from longpack.balance.schedule import simulate_schedule
from longpack.errors import ConfigError

#: The CP modes ``compare_cp_modes`` times, Megatron's default first, with the names text and tables use.
CP_MODE_NAMES = {"static": "static CP", "hybrid": "hybrid CP", "dp_balanced": "DP-balanced packing"}
CP_MODES = tuple(CP_MODE_NAMES)


@dataclass(frozen=True, kw_only=True)
class CPModeComparison:
    """Summed step times per mode (the unit of ``seconds``) over ``steps`` global batches.

    ``hybrid_groups``: hybrid-CP groups per step (each ends with a DP x CP barrier);
    ``hybrid_balance``: mean over groups of mean-rank / busiest-rank time (1.0 = no rank waits);
    ``dp_balanced_micro_batches``: micro-batches per DP rank per step under the DP-balanced scheduler.
    ``infeasible``: the modes Megatron's scheduler refuses on these lengths at this cap, with the reason
    (their time is ``inf``). ``imbalance[mode]``: rank imbalance, the summed time of the busiest rank over
    the summed mean rank time (per step for static and DP-balanced, whose steps wait for the busiest DP
    rank; per group for hybrid CP, whose groups end with a barrier); 1.0 = no rank waits, ``inf`` when the
    mode is infeasible.
    """

    times: dict[str, float]
    steps: int
    tokens: int
    hybrid_groups: float
    hybrid_balance: float
    dp_balanced_micro_batches: float
    max_seqlen_per_rank: int
    infeasible: dict[str, str]
    imbalance: dict[str, float]

    def speedup(self, mode: str) -> float:
        """Static CP's time over ``mode``'s (> 1: ``mode`` is faster)."""
        return self.times["static"] / self.times[mode]


def compare_cp_modes(
    pack_lengths: Sequence[Sequence[int]],
    *,
    dp: int,
    cp: int,
    gbs: int,
    max_seqlen_per_rank: int,
    seconds: Callable[[Sequence[int], int], float],
) -> CPModeComparison:
    """Time every mode of ``CP_MODES`` on the same global batches (see the module docstring).

    ``pack_lengths[k]``: the sequence lengths of the ``k``-th pack read; a last partial global batch counts
    as it is. ``seconds(lengths, ranks)``: the time of a micro-batch holding ``lengths`` on ``ranks`` CP
    ranks. A mode whose Megatron scheduler fails on these lengths at this cap is ``infeasible`` (time
    ``inf``, with the scheduler's reason), as is hybrid CP on an odd number of DP x CP ranks (Megatron-Core
    builds its groups only over an even count); static CP always runs.

    >>> cost = lambda lengths, ranks: sum(lengths) / ranks
    >>> odd = compare_cp_modes([[100]] * 3, dp=3, cp=1, gbs=3, max_seqlen_per_rank=100, seconds=cost)
    >>> odd.times["hybrid"], odd.infeasible["hybrid"][:20]
    (inf, 'DP x CP = 3 x 1 = 3 ')
    """
    if gbs % dp:
        raise ConfigError(f"gbs={gbs} must be a multiple of dp={dp}", fields="gbs")
    static = simulate_schedule([seconds(list(p), cp) for p in pack_lengths], dp=dp, pp=1, gbs=gbs)
    hybrid = balanced = 0.0
    hybrid_mean = balanced_ideal = 0.0
    groups = 0
    balance = 0.0
    micro_batches = 0
    infeasible: dict[str, str] = {}
    if (dp * cp) % 2:
        # Megatron-Core's parallel_state builds the hybrid DP x CP groups only over an even rank count
        infeasible["hybrid"] = (
            f"DP x CP = {dp} x {cp} = {dp * cp} ranks: Megatron-Core asserts 'Hybrid context parallel requires an "
            "even number of ranks'"
        )
    for start in range(0, len(pack_lengths), gbs):
        batch = [int(n) for p in pack_lengths[start : start + gbs] for n in p]
        if "hybrid" not in infeasible:
            try:
                schedule = schedule_hybrid_cp(
                    batch, max_seqlen_per_rank=max_seqlen_per_rank, dp_cp_size=dp * cp
                )
            except ConfigError as exc:
                infeasible["hybrid"] = str(exc)
            else:
                for group in schedule.groups:
                    ranks = {sid: group.ranks_of(sid) for ids in group.sample_ids for sid in ids}
                    rank_times = [
                        sum(seconds([n], ranks[sid]) for sid, n in zip(ids, lens, strict=True))
                        for ids, lens in zip(group.sample_ids, group.lengths, strict=True)
                    ]
                    busiest = max(rank_times)
                    hybrid += busiest
                    hybrid_mean += sum(rank_times) / len(rank_times)
                    balance += sum(rank_times) / len(rank_times) / busiest if busiest else 1.0
                    groups += 1
        if "dp_balanced" not in infeasible:
            try:
                packs = dp_balanced_packs(batch, max_seqlen_per_rank=max_seqlen_per_rank, cp=cp, dp=dp)
            except ConfigError as exc:
                infeasible["dp_balanced"] = str(exc)
            else:
                costs = [seconds([batch[i] for i in p], cp) for p in packs]
                run = simulate_schedule(costs, dp=dp, pp=1, gbs=len(packs))
                balanced += run.total_time
                balanced_ideal += run.ideal_time
                micro_batches += len(packs) // dp
    steps = static.num_steps
    return CPModeComparison(
        times={
            "static": float(static.total_time),
            "hybrid": math.inf if "hybrid" in infeasible else hybrid,
            "dp_balanced": math.inf if "dp_balanced" in infeasible else balanced,
        },
        steps=steps,
        tokens=int(sum(sum(p) for p in pack_lengths)),
        hybrid_groups=groups / steps,
        hybrid_balance=balance / max(1, groups),
        dp_balanced_micro_batches=micro_batches / steps,
        max_seqlen_per_rank=max_seqlen_per_rank,
        infeasible=infeasible,
        imbalance={
            "static": _ratio(static.total_time, static.ideal_time),
            "hybrid": math.inf if "hybrid" in infeasible else _ratio(hybrid, hybrid_mean),
            "dp_balanced": math.inf if "dp_balanced" in infeasible else _ratio(balanced, balanced_ideal),
        },
    )


def _ratio(busiest: float, mean: float) -> float:
    return float(busiest / mean) if mean > 0 else 1.0
