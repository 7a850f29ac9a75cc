"""Megatron-Core's dynamic context parallelism (``default_dynamic_cp``), simulated exactly on the CPU.

With ``dynamic_context_parallel=True`` (``--dynamic-context-parallel``, which sets
``--sequence-packing-scheduler default_dynamic_cp``; Megatron-LM dev: PRs #2000 @2d6e946bab and #5154
@d2e7ec5b88, the rename from ``hybrid_context_parallel`` @c3dbea746b; read at dev @d48bd6be0a) every DP
rank gathers the sequence lengths of its micro-batches of a global batch over the DP group
(``get_batch_and_global_seqlens``: DP rank 0's sub-samples first, each rank's in its micro-batch order),
and ``DefaultDynamicCPScheduler`` (``megatron/core/datasets/data_schedule.py``) cuts them into
*micro-batches* over all ``N = DP x CP`` ranks, choosing a CP group size per sub-sample
(``next_hdp_group_packing_aware`` in ``megatron/core/datasets/data_schedule_utils.py``):

* sub-samples longest first; the longest opens a group of ``cp_min(L)`` ranks (``dcp_gpus_needed``: the
  next power of two of ``L / max_seqlen_per_dp_cp_rank``, at least ``min_dynamic_context_parallel_size``);
* each next one tries every power of two ``k >= cp_min(L)`` up to ``N``: joining an existing ``k``-rank group
  whose per-rank tokens stay within the cap, or opening a new group on the ``k`` least-loaded free ranks;
  it takes the placement with the lowest busiest-rank work (``L**2 / k`` per rank), if that stays within
  ``1.05 x tallest x cap`` (never binding: the token cap already bounds a rank's work by
  ``tallest x cap``); with no placement it waits for a later micro-batch;
* idle ranks are filled by doubling the first of the narrowest groups (later groups move right); when that
  cannot fill them, the micro-batch becomes one group of all ``N`` ranks holding the longest sub-samples
  whose per-rank share fits the cap.

This module restates that procedure (it is not a copy) and is tested against Megatron-LM's own functions
(``tests/balance/test_dynamic_cp.py``). Megatron's scheduler failures are :class:`InfeasibleCPSchedule`.

>>> s = schedule_dynamic_cp([8192, 3000, 2000, 1000, 500, 400], max_seqlen_per_rank=4096, dp_cp_size=4)
>>> [mb.sample_ids for mb in s.micro_batches]
[((0,), (0,), (1, 3), (2, 4, 5))]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from longpack.balance.cp_groups import InfeasibleCPSchedule, cp_group_sizes, schedule_reason
from longpack.errors import ConfigError
from longpack.topology import ranks_needed

#: Megatron-Core's ``_DYNAMIC_CP_WORKLOAD_CAP_DELTA``: a placement may reach 105 % of tallest x cap.
WORKLOAD_CAP_DELTA = 0.05


def cp_min(length: int, max_seqlen_per_rank: int, min_cp_size: int = 1) -> int:
    """Megatron's ``dcp_gpus_needed``: the ranks a sub-sample needs at least.

    >>> cp_min(8193, 4096), cp_min(100, 4096, min_cp_size=2)
    (4, 2)
    """
    return max(min_cp_size, ranks_needed(length, max_seqlen_per_rank))


def _work(length: int, ranks: int) -> float:
    return (length * length) / ranks


@dataclass(frozen=True, kw_only=True)
class DynamicCPMicroBatch:
    """One micro-batch over the ``N`` DP x CP ranks: ``sample_ids[r]`` / ``lengths[r]`` are what rank ``r``
    runs (a sub-sample on ``k`` ranks appears in ``k`` consecutive ranks' lists)."""

    sample_ids: tuple[tuple[int, ...], ...]
    lengths: tuple[tuple[int, ...], ...]

    def cp_groups(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """``(ranks, lengths)`` of every CP group of this micro-batch, in rank order: the ranks that run the
        same sub-samples, each sub-sample split over all of them."""
        groups: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        r = 0
        n = len(self.sample_ids)
        while r < n:
            end = r + 1
            while end < n and self.sample_ids[end] == self.sample_ids[r]:
                end += 1
            groups.append((tuple(range(r, end)), self.lengths[r]))
            r = end
        return groups


@dataclass(frozen=True, kw_only=True)
class DynamicCPSchedule:
    """The micro-batches of one global batch, in execution order."""

    micro_batches: tuple[DynamicCPMicroBatch, ...]
    dp_cp_size: int
    max_seqlen_per_rank: int
    min_cp_size: int

    def infeasible_reason(self) -> str | None:
        """Why Megatron-Core cannot run this schedule (a sub-sample on ranks that are not one of
        ``create_dynamic_dp_cp_groups``'s groups), or ``None``."""
        sizes = cp_group_sizes(self.dp_cp_size, scheme="dynamic", min_cp_size=self.min_cp_size)
        return schedule_reason((mb.sample_ids for mb in self.micro_batches), self.dp_cp_size, sizes)


def schedule_dynamic_cp(
    lengths: Sequence[int], *, max_seqlen_per_rank: int, dp_cp_size: int, min_cp_size: int = 1
) -> DynamicCPSchedule:
    """``DefaultDynamicCPScheduler.get_groups_and_subsamples`` on one global batch (without VPP).

    ``lengths[i]``: sub-sample ``i`` in Megatron's gather order (see the module docstring). Raises
    :class:`InfeasibleCPSchedule` where Megatron's scheduler fails: a sub-sample needing more than ``N``
    ranks, no sub-sample fitting the whole group, or a widening that pushes ranks past the last one. Empty
    sub-samples are left out (Megatron unpacks only non-empty segments); a negative length is a
    ``ConfigError``. A schedule it returns may still put a sub-sample on ranks with no process group:
    :meth:`DynamicCPSchedule.infeasible_reason`.
    """
    for name, value in (
        ("max_seqlen_per_rank", max_seqlen_per_rank),
        ("dp_cp_size", dp_cp_size),
        ("min_cp_size", min_cp_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}", fields=name)
    items = []
    for i, n in enumerate(lengths):
        if isinstance(n, bool) or int(n) != n or n < 0:
            raise ConfigError(f"lengths[{i}] must be a non-negative integer, got {n!r}", fields="lengths")
        if n:  # Megatron unpacks only non-empty cu_seqlens segments
            items.append((i, int(n)))
    pending = sorted(items, key=lambda item: item[1], reverse=True)
    micro_batches = []
    while pending:
        ids, lens, pending = _next_micro_batch(pending, dp_cp_size, max_seqlen_per_rank, min_cp_size)
        micro_batches.append(
            DynamicCPMicroBatch(sample_ids=tuple(map(tuple, ids)), lengths=tuple(map(tuple, lens)))
        )
    return DynamicCPSchedule(
        micro_batches=tuple(micro_batches),
        dp_cp_size=dp_cp_size,
        max_seqlen_per_rank=max_seqlen_per_rank,
        min_cp_size=min_cp_size,
    )


def _next_micro_batch(
    items: list[tuple[int, int]], total: int, cap: int, min_cp_size: int
) -> tuple[list[list[int]], list[list[int]], list[tuple[int, int]]]:
    """One micro-batch: (sample ids per rank, lengths per rank, sub-samples left for later)."""
    items = sorted(items, key=lambda item: item[1], reverse=True)
    tallest = items[0][1]
    limit = float(tallest) * float(cap) * (1.0 + WORKLOAD_CAP_DELTA)
    lens: list[list[int]] = [[] for _ in range(total)]
    ids: list[list[int]] = [[] for _ in range(total)]
    load = [0.0] * total
    owner: list[int | None] = [None] * total
    members: dict[int, list[int]] = {}
    width: dict[int, int] = {}
    tokens: dict[int, float] = {}  # per-rank tokens of each group

    def place(gid: int, sample_id: int, n: int) -> None:
        k = width[gid]
        tokens[gid] = tokens.get(gid, 0.0) + n / k
        for r in members[gid]:
            lens[r].append(n)
            ids[r].append(sample_id)
            load[r] += _work(n, k)

    def open_group(ranks: list[int], k: int) -> int:
        gid = len(width)
        members[gid], width[gid] = ranks, k
        for r in ranks:
            owner[r] = gid
        return gid

    first_id, first_n = items[0]
    need = cp_min(first_n, cap, min_cp_size)
    if need > total:
        raise InfeasibleCPSchedule(
            f"dynamic CP: sub-sample {first_id} of {first_n} tokens needs {need} ranks at "
            f"max_seqlen_per_dp_cp_rank={cap}, more than the {total} DP x CP ranks; Megatron-Core's scheduler "
            f"asserts. Raise max_seqlen_per_dp_cp_rank to at least {-(-first_n // total)} or pack shorter rows",
            fields="max_seqlen_per_dp_cp_rank",
            mode="dynamic_cp",
        )
    place(open_group(list(range(need)), need), first_id, first_n)

    # Every rank of a group carries the same work (each sub-sample adds the same L**2 / k to all of them) and
    # free ranks carry none, so the busiest rank after a placement is the larger of the group's new load and
    # the busiest other group; Megatron takes the max over all ranks, which is that number. New groups open
    # on the lowest free ranks (all at load 0, sorted stably), so the free ranks are a suffix.
    next_free = need
    # The most tokens any group could still take (a necessary condition only, with slack for rounding): a
    # sub-sample longer than that, with too few free ranks for its narrowest group, has no placement, and
    # most sub-samples of a full micro-batch are turned away here without the exact test below.
    room = (cap - tokens[0]) * width[0]
    left: list[tuple[int, int]] = []
    for sample_id, n in items[1:]:
        if total - next_free < cp_min(n, cap, min_cp_size) and n > room * (1 + 1e-9) + 1e-6:
            left.append((sample_id, n))
            continue
        best: tuple[float, int, int | None, list[int] | None] | None = None
        top_gid, top, second = -1, 0.0, 0.0  # the two busiest groups' loads (0: a free rank)
        for gid, ranks in members.items():
            g = load[ranks[0]]
            if g > top:
                top_gid, top, second = gid, g, top
            elif g > second:
                second = g
        k = cp_min(n, cap, min_cp_size)
        while k <= total:
            cost = _work(n, k)
            for gid, w in width.items():
                if w != k or tokens.get(gid, 0.0) + n / k > cap:
                    continue
                peak = max(load[members[gid][0]] + cost, second if gid == top_gid else top)
                if peak <= limit and (best is None or peak < best[0]):
                    best = (peak, k, gid, None)
            if total - next_free >= k:
                peak = max(cost, top)
                if peak <= limit and (best is None or peak < best[0]):
                    best = (peak, k, None, list(range(next_free, next_free + k)))
            k *= 2
        if best is None:
            left.append((sample_id, n))
            continue
        _, best_k, best_gid, best_ranks = best
        if best_gid is None:
            assert best_ranks is not None
            best_gid = open_group(best_ranks, best_k)
            next_free += best_k
        place(best_gid, sample_id, n)
        room = max((cap - tokens[g]) * w for g, w in width.items())

    while any(not r for r in lens):
        if not _widen_once(lens, ids, load, members, width, total):
            ids, lens, left = _whole_group(items, total, cap)
            break
    return ids, lens, left


def _widen_once(
    lens: list[list[int]],
    ids: list[list[int]],
    load: list[float],
    members: dict[int, list[int]],
    width: dict[int, int],
    total: int,
) -> bool:
    """Double the first narrowest group that can grow into the idle tail (Megatron's
    ``fill_empty_gpus_once``); ``False`` when none can."""
    idle = next(r for r in range(total) if not lens[r])
    if any(lens[idle:]):
        raise InfeasibleCPSchedule(
            "dynamic CP: idle ranks are not all at the tail; Megatron-Core's scheduler asserts "
            "'fill_empty_gpus_once assumes empty ranks are contiguous at the tail'. Choose another "
            "max_seqlen_per_dp_cp_rank",
            fields="max_seqlen_per_dp_cp_rank",
            mode="dynamic_cp",
        )
    if not width:
        return False
    narrowest = min(width.values())
    wider = min(narrowest * 2, total)
    gain = wider - narrowest
    for gid, w in list(width.items()):
        if w != narrowest:
            continue
        first, last = members[gid][0], members[gid][-1]
        if last + 1 > idle or last + gain >= total:
            continue
        if idle - 1 + gain >= total:  # Megatron writes the pushed ranks past the last one: an IndexError
            raise InfeasibleCPSchedule(
                f"dynamic CP on {total} DP x CP ranks: to fill idle ranks {idle}-{total - 1}, Megatron-Core's "
                f"scheduler (fill_empty_gpus_once) widens the {narrowest}-rank group on ranks {first}-{last} to "
                f"{wider} ranks and pushes the ranks after it past rank {total - 1} (an IndexError in Megatron); "
                "choose another max_seqlen_per_dp_cp_rank or a power-of-two DP x CP",
                fields="max_seqlen_per_dp_cp_rank",
                mode="dynamic_cp",
            )
        pushed = list(zip(lens[last + 1 : idle], ids[last + 1 : idle], load[last + 1 : idle], strict=True))
        grown = list(lens[last]), list(ids[last]), sum(_work(n, wider) for n in lens[last])
        for r in range(first, last + gain + 1):
            lens[r], ids[r], load[r] = list(grown[0]), list(grown[1]), grown[2]
        for offset, (r_lens, r_ids, r_load) in enumerate(pushed):
            r = last + gain + 1 + offset
            lens[r], ids[r], load[r] = r_lens, r_ids, r_load
        for r in range(last + gain + 1 + len(pushed), total):
            lens[r], ids[r], load[r] = [], [], 0.0
        width[gid] = wider
        members[gid] = list(range(first, last + gain + 1))
        for other in width:
            if other != gid and min(members[other]) > last:
                members[other] = [r + gain for r in members[other]]
        return True
    return False


def _whole_group(
    items: list[tuple[int, int]], total: int, cap: int
) -> tuple[list[list[int]], list[list[int]], list[tuple[int, int]]]:
    """Megatron's ``fill_with_full_dpxcp_group``: one group of all ranks, the longest sub-samples whose
    per-rank share fits the cap (greedily, longest first); the rest wait."""
    chosen: list[tuple[int, int]] = []
    left: list[tuple[int, int]] = []
    per_rank = 0.0
    for sample_id, n in items:
        if per_rank + n / total <= cap:
            chosen.append((sample_id, n))
            per_rank += n / total
        else:
            left.append((sample_id, n))
    if not chosen:
        raise InfeasibleCPSchedule(
            f"dynamic CP: no sub-sample fits the whole {total}-rank group at max_seqlen_per_dp_cp_rank={cap}; "
            "Megatron-Core's scheduler asserts 'At least one sequence should fit in the full DPxCP group'. "
            "Raise max_seqlen_per_dp_cp_rank",
            fields="max_seqlen_per_dp_cp_rank",
            mode="dynamic_cp",
        )
    return (
        [[s for s, _ in chosen] for _ in range(total)],
        [[n for _, n in chosen] for _ in range(total)],
        left,
    )
