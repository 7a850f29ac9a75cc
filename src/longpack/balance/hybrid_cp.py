"""Megatron-Core's hybrid context-parallel schedule, simulated exactly on the CPU.

With ``hybrid_context_parallel=True`` Megatron-Core (``HybridCPDataLoaderWrapper`` in
``megatron/core/datasets/data_schedule.py`` and ``BalancedCPScheduler`` in
``megatron/core/pipeline_parallel/hybrid_cp_schedule.py``, megatron-core 0.16) unpacks every packed row of
a global batch into its sub-samples, gathers their lengths over the data-parallel group and deals them
out to the DP x CP ranks: a sub-sample of length ``L`` runs on ``ranks_needed(L)`` ranks (the next power
of two of ``L / max_seqlen_per_dp_cp_rank``), short ones on one rank each. Ranks work through *groups*;
within a group a rank runs its sub-samples back to back and the group ends with a barrier over DP x CP.

This module reproduces that assignment rank for rank, including the scheduler's own choices (greedy
buckets of roughly equal estimated work, a new rank group preferred while free ranks remain, trimming of
the most loaded group, widening the smallest groups until no rank is idle), so that what longpack
reports for a corpus is what Megatron will run. It is a re-statement, tested against megatron-core's
class on random length sets (``tests/balance/test_hybrid_cp.py``), not a copy.

Work is Megatron's own estimate, ``L**2 / ranks`` per rank (``get_total_workload``): a relative measure
of attention work used for balancing, not a time. The planner turns schedules into times.

>>> schedule = schedule_hybrid_cp([8192, 3000, 2000, 1000, 500, 400], max_seqlen_per_rank=4096, dp_cp_size=4)
>>> schedule.groups[0].sample_ids
((0,), (0,), (1,), (2, 3, 4, 5))
>>> [ranks_needed(n, 4096) for n in (8192, 8193, 4096, 1)]
[2, 4, 1, 1]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from longpack.balance.cp_groups import InfeasibleCPSchedule, cp_group_sizes, schedule_reason
from longpack.errors import ConfigError
from longpack.topology import ranks_needed

# Megatron-Core's scheduler constants (BalancedCPScheduler.next_hdp_group / make_buckets_equal defaults).
BALANCE_SLACK = 0.05  # a group is balanced when max - min work <= 5 % of max
BUCKET_OVERSHOOT = 1.1  # a bucket closes when its work would pass 110 % of the per-bucket target


def work(length: int, ranks: int) -> float:
    """Megatron's per-rank work estimate of a sub-sample: ``length**2 / ranks``.

    >>> work(4096, 2)
    8388608.0
    """
    return (length * length) / ranks


@dataclass(frozen=True, kw_only=True)
class HybridCPGroup:
    """One group of a hybrid-CP step: what every DP x CP rank runs between two barriers.

    ``sample_ids[r]`` / ``lengths[r]`` are rank ``r``'s sub-samples in execution order; a sub-sample on
    ``k`` ranks appears in ``k`` consecutive ranks' lists (each runs ``1/k`` of it).
    """

    sample_ids: tuple[tuple[int, ...], ...]
    lengths: tuple[tuple[int, ...], ...]

    def ranks_of(self, sample_id: int) -> int:
        """How many ranks share ``sample_id`` in this group (Megatron's ``local_cp_size``)."""
        return sum(sample_id in ids for ids in self.sample_ids)

    def rank_work(self) -> tuple[float, ...]:
        """Each rank's estimated work in this group (sum of ``L**2 / ranks`` over its sub-samples)."""
        shared = {sid: self.ranks_of(sid) for ids in self.sample_ids for sid in ids}
        return tuple(
            sum(work(n, shared[sid]) for sid, n in zip(ids, lens, strict=True))
            for ids, lens in zip(self.sample_ids, self.lengths, strict=True)
        )


@dataclass(frozen=True, kw_only=True)
class HybridCPSchedule:
    """The groups of one global batch, in execution order."""

    groups: tuple[HybridCPGroup, ...]
    dp_cp_size: int
    max_seqlen_per_rank: int

    def critical_work(self) -> float:
        """Sum over groups of the busiest rank's work: the step's length in Megatron's work units
        (groups end with a barrier, so each costs its slowest rank)."""
        return sum(max(group.rank_work()) for group in self.groups)

    def mean_work(self) -> float:
        """Sum over groups of the mean rank work: the step's length if every group were balanced."""
        return sum(sum(w) / len(w) for w in (group.rank_work() for group in self.groups))

    def infeasible_reason(self) -> str | None:
        """Why Megatron-Core cannot run this schedule (a sub-sample on ranks with no hybrid-CP process group,
        :mod:`longpack.balance.cp_groups`), or ``None``. The scheduler itself does not check this: on 8 ranks it
        can place a 4-rank sub-sample on ranks 2-5, where the 4-rank groups are 0-3 and 4-7.

        >>> s = schedule_hybrid_cp([161, 108, 144, 178, 67, 254, 214, 146, 209], max_seqlen_per_rank=100,
        ...                        dp_cp_size=8)
        >>> s.infeasible_reason().split(",")[0]
        'sub-sample 8 on ranks 2-5 of 8'
        """
        sizes = cp_group_sizes(self.dp_cp_size, scheme="hybrid")
        return schedule_reason((g.sample_ids for g in self.groups), self.dp_cp_size, sizes)


def schedule_hybrid_cp(
    lengths: Sequence[int], *, max_seqlen_per_rank: int, dp_cp_size: int
) -> HybridCPSchedule:
    """Megatron-Core's hybrid-CP assignment of the sub-samples of one global batch.

    ``lengths[i]`` is sub-sample ``i``'s length (the non-empty ``cu_seqlens`` segments of every packed row of
    the global batch, DP rank 0's rows first, as ``HybridCPDataLoaderWrapper`` numbers them);
    ``dp_cp_size`` is the DP x CP group size. Raises :class:`~longpack.balance.cp_groups.InfeasibleCPSchedule`
    (a ``ConfigError``) where Megatron's scheduler fails: a sub-sample needing more ranks than the group has,
    or idle ranks it cannot fill (``fill_empty_gpus`` widens a group past the last rank: an ``IndexError`` in
    Megatron). A schedule it returns may still put a sub-sample on ranks with no process group: see
    :meth:`HybridCPSchedule.infeasible_reason`.

    >>> schedule_hybrid_cp([400, 400], max_seqlen_per_rank=100, dp_cp_size=10)
    Traceback (most recent call last):
    ...
    longpack.balance.cp_groups.InfeasibleCPSchedule: hybrid CP on 10 DP x CP ranks: to fill idle ranks 8-9, Megatron-Core's scheduler (fill_empty_gpus) widens the 4-rank group on ranks 0-3 to 8 ranks and pushes the ranks after it past rank 9 (an IndexError in Megatron); this cap cannot run hybrid CP on 10 ranks: choose another max_seqlen_per_dp_cp_rank or a power-of-two DP x CP

    >>> s = schedule_hybrid_cp([100, 90, 80, 70], max_seqlen_per_rank=128, dp_cp_size=2)
    >>> [g.sample_ids for g in s.groups]
    [((0, 3), (1, 2))]
    """
    for name, value in (("max_seqlen_per_rank", max_seqlen_per_rank), ("dp_cp_size", dp_cp_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}", fields=name)
    items = [(i, int(n)) for i, n in enumerate(lengths) if int(n) > 0]
    for sample_id, n in items:
        if ranks_needed(n, max_seqlen_per_rank) > dp_cp_size:
            raise InfeasibleCPSchedule(
                f"sub-sample {sample_id} of {n} tokens needs {ranks_needed(n, max_seqlen_per_rank)} ranks at "
                f"max_seqlen_per_dp_cp_rank={max_seqlen_per_rank}, more than the DP x CP group's {dp_cp_size}; "
                "Megatron-Core's scheduler fails on it. Raise max_seqlen_per_dp_cp_rank to at least "
                f"{-(-n // dp_cp_size)} or pack shorter rows",
                fields="max_seqlen_per_dp_cp_rank",
                mode="hybrid",
            )
    # Longest first; equal lengths keep their order (a stable sort, as Megatron's sorted()).
    pending = sorted(items, key=lambda item: item[1], reverse=True)
    groups = []
    while pending:
        ids, lens, pending = _next_group(pending, max_seqlen_per_rank, dp_cp_size)
        groups.append(
            HybridCPGroup(
                sample_ids=tuple(tuple(r) for r in ids),
                lengths=tuple(tuple(r) for r in lens),
            )
        )
    return HybridCPSchedule(
        groups=tuple(groups), dp_cp_size=dp_cp_size, max_seqlen_per_rank=max_seqlen_per_rank
    )


def _buckets(items: list[tuple[int, int]], cap: int) -> list[deque[tuple[int, int]]]:
    """Consecutive runs of roughly equal work, as many as there are distinct rank counts."""
    k = len({ranks_needed(n, cap) for _, n in items})
    target = sum(work(n, ranks_needed(n, cap)) for _, n in items) / k
    buckets: list[deque[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    current_work = 0.0
    open_slots = k  # Megatron decrements this *and* counts closed buckets against it; kept as is
    for i, (sample_id, n) in enumerate(items):
        w = work(n, ranks_needed(n, cap))
        if current and (
            current_work + w > target * BUCKET_OVERSHOOT or len(items) - i <= open_slots - len(buckets)
        ):
            buckets.append(deque(current))
            current, current_work = [], 0.0
            open_slots -= 1
        current.append((sample_id, n))
        current_work += w
    if current:
        buckets.append(deque(current))
    return buckets


def _next_group(
    items: list[tuple[int, int]], cap: int, total: int
) -> tuple[list[list[int]], list[list[int]], list[tuple[int, int]]]:
    """One group: (sample ids per rank, lengths per rank, sub-samples left for later groups)."""
    buckets = _buckets(items, cap)
    lens: list[list[int]] = [[] for _ in range(total)]
    ids: list[list[int]] = [[] for _ in range(total)]
    load = [0.0] * total
    group_of: list[int | None] = [None] * total
    members: dict[int, list[int]] = {}
    size: dict[int, int] = {}
    first_needed: int | None = None
    check_balance = False

    while buckets:
        pick = None
        for b, bucket in enumerate(buckets):
            if not bucket:
                continue
            needed = ranks_needed(bucket[0][1], cap)
            free = sum(g is None for g in group_of)
            if any(s == needed for s in size.values()) or free >= needed:
                pick = b
                break
        if pick is None:
            break
        sample_id, n = buckets[pick][0]
        needed = ranks_needed(n, cap)
        if first_needed is None:
            first_needed = needed

        # The least loaded existing group of this size (first on ties) ...
        best_gid, best_load = None, float("inf")
        for gid, s in size.items():
            if s == needed:
                gid_load = max(load[r] for r in members[gid])
                if gid_load < best_load:
                    best_gid, best_load = gid, gid_load
        # ... unless free ranks form a new group that is less loaded (free ranks are idle: load 0).
        free_ranks = sorted((r for r in range(total) if group_of[r] is None), key=lambda r: load[r])
        if len(free_ranks) >= needed and load[free_ranks[needed - 1]] < best_load:
            best_gid = len(size)
            members[best_gid] = free_ranks[:needed]
            size[best_gid] = needed
            for r in free_ranks[:needed]:
                group_of[r] = best_gid
        assert best_gid is not None  # the pick above guarantees a group or enough free ranks
        cost = work(n, needed)
        for r in members[best_gid]:
            lens[r].append(n)
            ids[r].append(sample_id)
            load[r] += cost

        buckets[pick].popleft()
        while buckets and not buckets[0]:
            buckets.pop(0)
        if needed < first_needed:  # Megatron compares with the group's first sub-sample, not the previous
            check_balance = True
        if check_balance and buckets and max(load) - min(load) <= BALANCE_SLACK * max(load):
            break

    left = [item for bucket in buckets for item in bucket]
    _trim(lens, ids, load, group_of, members, size, left, cap)
    _widen_into_idle_ranks(lens, ids, members, size, total)
    return ids, lens, left


def _trim(
    lens: list[list[int]],
    ids: list[list[int]],
    load: list[float],
    group_of: list[int | None],
    members: dict[int, list[int]],
    size: dict[int, int],
    left: list[tuple[int, int]],
    cap: int,
) -> None:
    """Hand the busiest group's last sub-sample back while that narrows the spread of work."""
    while True:
        high, low = max(load), min(load)
        spread = high - low
        if spread <= BALANCE_SLACK * high or low == 0:
            return
        busiest = load.index(high)
        if len(lens[busiest]) <= 1:
            return
        gid = group_of[busiest]
        assert gid is not None
        n = lens[busiest][-1]
        cost = work(n, ranks_needed(n, cap))
        projected = load[:]
        for r in members[gid]:
            projected[r] -= cost
        if max(projected) - min(projected) >= spread:
            return
        sample_id = ids[busiest][-1]
        for r in members[gid]:
            lens[r].pop()
            ids[r].pop()
            load[r] -= cost
        left.append((sample_id, n))


def _widen_into_idle_ranks(
    lens: list[list[int]],
    ids: list[list[int]],
    members: dict[int, list[int]],
    size: dict[int, int],
    total: int,
) -> None:
    """While a rank is idle, double the first of the narrowest groups (Megatron's ``fill_empty_gpus``).

    Groups occupy consecutive ranks in creation order, so the idle ranks are a suffix; widening a group
    shifts every later group right by the ranks it gains.
    """
    while any(not r for r in lens):
        narrowest = min(size.values())
        wider = min(narrowest * 2, total)
        gain = wider - narrowest
        gid = next(g for g, s in size.items() if s == narrowest)
        first, last = members[gid][0], members[gid][-1]
        idle = next(r for r in range(total) if not lens[r])
        if all(lens[idle : idle + gain]):
            raise InfeasibleCPSchedule(
                "hybrid CP: idle ranks were found but too few to widen a group; Megatron-Core's scheduler "
                "fails here too. Raise max_seqlen_per_dp_cp_rank",
                fields="max_seqlen_per_dp_cp_rank",
                mode="hybrid",
            )
        if idle + gain > total:  # Megatron writes rank idle - 1 + gain: past the last rank
            raise InfeasibleCPSchedule(
                f"hybrid CP on {total} DP x CP ranks: to fill idle ranks {idle}-{total - 1}, Megatron-Core's "
                f"scheduler (fill_empty_gpus) widens the {narrowest}-rank group on ranks {first}-{last} to "
                f"{wider} ranks and pushes the ranks after it past rank {total - 1} (an IndexError in Megatron); "
                f"this cap cannot run hybrid CP on {total} ranks: choose another max_seqlen_per_dp_cp_rank or a "
                "power-of-two DP x CP",
                fields="max_seqlen_per_dp_cp_rank",
                mode="hybrid",
            )
        shifted_lens, shifted_ids = lens[last + 1 : idle], ids[last + 1 : idle]
        new_lens: list[list[int]] = [[] for _ in range(total)]
        new_ids: list[list[int]] = [[] for _ in range(total)]
        new_lens[:first], new_ids[:first] = lens[:first], ids[:first]
        for r in range(first, last + gain + 1):
            new_lens[r], new_ids[r] = list(lens[last]), list(ids[last])
        for offset, (r_lens, r_ids) in enumerate(zip(shifted_lens, shifted_ids, strict=True)):
            new_lens[last + gain + 1 + offset], new_ids[last + gain + 1 + offset] = r_lens, r_ids
        lens[:], ids[:] = new_lens, new_ids
        size[gid] = wider
        members[gid] = list(range(first, last + gain + 1))
        for later in size:
            if later > gid:
                members[later] = [r + gain for r in members[later]]
