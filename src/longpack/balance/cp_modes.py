"""Static CP, Megatron's hybrid CP, its DP-balanced packing scheduler and dynamic CP, timed on the same tokens.

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
* **dynamic_cp** (``dynamic_context_parallel``, ``sequence_packing_scheduler="default_dynamic_cp"``,
  Megatron-LM dev): ``schedule_dynamic_cp`` cuts the step's sequences into micro-batches over all
  ``dp x cp`` ranks, each sequence on a CP group chosen per micro-batch; a CP group starts a micro-batch
  when all its ranks have finished the previous one, and the step ends when the last rank does.

The three schedulers see the sequences in the order Megatron gathers them (``get_batch_and_global_seqlens``
and ``HybridCPDataLoaderWrapper``): every DP rank's own packs in its micro-batch order (the sampler gives
DP rank ``d`` packs ``d, d + DP, d + 2 DP, ...`` of a global batch), DP rank 0's first
(:func:`gather_order`). Hybrid and dynamic CP are infeasible where Megatron-Core has no process group for
a sub-sample's ranks (:mod:`longpack.balance.cp_groups`) or its scheduler fails.

The time of a micro-batch comes from a caller's ``seconds(lengths, ranks)`` (the planner's step-time
model), so the comparison is only as good as that model; pipeline parallelism is not modelled (hybrid
CP refuses it).

>>> cost = lambda lengths, ranks: sum(n + n * n / 1000 for n in lengths) / ranks
>>> packs = [[4000], [500] * 8, [3000, 1000], [250] * 16]
>>> c = compare_cp_modes(packs, dp=2, cp=2, gbs=4, max_seqlen_per_rank=2048, seconds=cost)
>>> {mode: round(t) for mode, t in c.times.items()}
{'static': 17000, 'hybrid': 14000, 'dp_balanced': 13000, 'dynamic_cp': 12750}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from longpack.balance.cp_groups import InfeasibleCPSchedule, even_ranks_reason
from longpack.balance.dp_balanced import dp_balanced_packs
from longpack.balance.dynamic_cp import DynamicCPSchedule, schedule_dynamic_cp
from longpack.balance.hybrid_cp import schedule_hybrid_cp
from longpack.balance.schedule import positions_for_slots, simulate_schedule
from longpack.errors import ConfigError

#: The CP modes ``compare_cp_modes`` times, Megatron's default first, with the names text and tables use.
CP_MODE_NAMES = {
    "static": "static CP",
    "hybrid": "hybrid CP",
    "dp_balanced": "DP-balanced packing",
    "dynamic_cp": "dynamic CP",
}
CP_MODES = tuple(CP_MODE_NAMES)


def gather_order(packs_in_batch: int, *, dp: int, gbs: int) -> list[int]:
    """The order in which Megatron's schedulers see the packs of one global batch: DP rank 0's packs (its
    micro-batches in order), then DP rank 1's, ...; with Megatron's batch sampler (MBS 1) rank ``d`` holds
    packs ``d, d + DP, ...``. A last partial batch keeps the packs it has.

    >>> gather_order(8, dp=2, gbs=8)
    [0, 2, 4, 6, 1, 3, 5, 7]
    """
    pos = positions_for_slots(dp=dp, gbs=gbs)
    return [int(p) for p in pos.reshape(dp, -1).ravel() if p < packs_in_batch]


def dynamic_cp_times(
    schedule: DynamicCPSchedule, seconds: Callable[[Sequence[int], int], float]
) -> tuple[float, float, int]:
    """(step time, mean busy time per rank, micro-batches) of one dynamic-CP global batch: a CP group of a
    micro-batch runs its sub-samples as one packed micro-batch on its ``k`` ranks once every one of them
    is done with the previous micro-batch; the step ends when the last rank is done."""
    n = schedule.dp_cp_size
    finish = [0.0] * n
    busy = 0.0
    for mb in schedule.micro_batches:
        nxt = finish[:]
        for ranks, lengths in mb.cp_groups():
            t = seconds(list(lengths), len(ranks))
            end = max(finish[r] for r in ranks) + t
            busy += t * len(ranks)
            for r in ranks:
                nxt[r] = end
        finish = nxt
    return max(finish), busy / n, len(schedule.micro_batches)


@dataclass(frozen=True, kw_only=True)
class CPModeComparison:
    """Summed step times per mode (the unit of ``seconds``) over ``steps`` global batches.

    ``hybrid_groups``: hybrid-CP groups per step (each ends with a DP x CP barrier);
    ``hybrid_balance``: mean over groups of mean-rank / busiest-rank time (1.0 = no rank waits);
    ``dp_balanced_micro_batches``: micro-batches per DP rank per step under the DP-balanced scheduler;
    ``dynamic_cp_micro_batches``: micro-batches per step under dynamic CP.
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
    dynamic_cp_micro_batches: float = 0.0

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
    min_cp_size: int = 1,
) -> CPModeComparison:
    """Time every mode of ``CP_MODES`` on the same global batches (see the module docstring).

    ``pack_lengths[k]``: the sequence lengths of the ``k``-th pack read; a last partial global batch counts
    as it is. ``seconds(lengths, ranks)``: the time of a micro-batch holding ``lengths`` on ``ranks`` CP
    ranks. A mode whose Megatron scheduler fails on these lengths at this cap is ``infeasible`` (time
    ``inf``, with the scheduler's reason), as are hybrid and dynamic CP on an odd number of DP x CP ranks
    (Megatron-Core builds their groups only over an even count) and where a sub-sample lands on ranks
    with no process group; static CP always runs. ``min_cp_size``: dynamic CP's
    ``min_dynamic_context_parallel_size``.

    >>> cost = lambda lengths, ranks: sum(lengths) / ranks
    >>> odd = compare_cp_modes([[100]] * 3, dp=3, cp=1, gbs=3, max_seqlen_per_rank=100, seconds=cost)
    >>> odd.times["hybrid"], odd.infeasible["hybrid"][:20], odd.times["dynamic_cp"]
    (inf, 'DP x CP = 3 x 1 = 3 ', inf)
    """
    if gbs % dp:
        raise ConfigError(f"gbs={gbs} must be a multiple of dp={dp}", fields="gbs")
    static = simulate_schedule([seconds(list(p), cp) for p in pack_lengths], dp=dp, pp=1, gbs=gbs)
    hybrid = balanced = dynamic = 0.0
    hybrid_mean = balanced_ideal = dynamic_mean = 0.0
    groups = 0
    balance = 0.0
    micro_batches = dynamic_batches = 0
    infeasible: dict[str, str] = {}
    for mode, scheme in (("hybrid", "hybrid"), ("dynamic_cp", "dynamic")):
        odd = even_ranks_reason(dp, cp, scheme=scheme)
        if odd is not None:
            infeasible[mode] = odd
    for start in range(0, len(pack_lengths), gbs):
        chunk = pack_lengths[start : start + gbs]
        batch = [int(n) for k in gather_order(len(chunk), dp=dp, gbs=gbs) for n in chunk[k]]
        if "hybrid" not in infeasible:
            try:
                schedule = schedule_hybrid_cp(
                    batch, max_seqlen_per_rank=max_seqlen_per_rank, dp_cp_size=dp * cp
                )
            except ConfigError as exc:
                infeasible["hybrid"] = str(exc)
            else:
                why = schedule.infeasible_reason()
                if why is not None:
                    infeasible["hybrid"] = (
                        f"hybrid CP at max_seqlen_per_dp_cp_rank={max_seqlen_per_rank}: Megatron-Core's "
                        f"scheduler puts {why}, so the run would fail"
                    )
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
        if "dynamic_cp" not in infeasible:
            try:
                dyn = schedule_dynamic_cp(
                    batch,
                    max_seqlen_per_rank=max_seqlen_per_rank,
                    dp_cp_size=dp * cp,
                    min_cp_size=min_cp_size,
                )
            except InfeasibleCPSchedule as exc:
                infeasible["dynamic_cp"] = str(exc)
            else:
                why = dyn.infeasible_reason()
                if why is not None:
                    infeasible["dynamic_cp"] = (
                        f"dynamic CP at max_seqlen_per_dp_cp_rank={max_seqlen_per_rank}: Megatron-Core's "
                        f"scheduler puts {why}, so the run would fail"
                    )
                else:
                    step, mean, count = dynamic_cp_times(dyn, seconds)
                    dynamic += step
                    dynamic_mean += mean
                    dynamic_batches += count
    steps = static.num_steps
    slowest: dict[str, float] = {
        "static": static.total_time,
        "hybrid": hybrid,
        "dp_balanced": balanced,
        "dynamic_cp": dynamic,
    }
    means: dict[str, float] = {
        "static": static.ideal_time,
        "hybrid": hybrid_mean,
        "dp_balanced": balanced_ideal,
        "dynamic_cp": dynamic_mean,
    }
    return CPModeComparison(
        times={m: math.inf if m in infeasible else float(slowest[m]) for m in CP_MODES},
        steps=steps,
        tokens=int(sum(sum(p) for p in pack_lengths)),
        hybrid_groups=groups / steps,
        hybrid_balance=balance / max(1, groups),
        dp_balanced_micro_batches=micro_batches / steps,
        max_seqlen_per_rank=max_seqlen_per_rank,
        infeasible=infeasible,
        imbalance={m: math.inf if m in infeasible else _ratio(slowest[m], means[m]) for m in CP_MODES},
        dynamic_cp_micro_batches=dynamic_batches / steps,
    )


def _ratio(busiest: float, mean: float) -> float:
    return float(busiest / mean) if mean > 0 else 1.0
