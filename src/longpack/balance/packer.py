"""Workload-balanced packing: fill packs like best-fit, even out their cost, and order them for training.

``balanced_pack(lengths, capacity, *, cost_model, dp, gbs, ...) -> bin_of_item`` where **bin ids are the
training order**: bin ``k`` is the ``k``-th pack the data loader reads. Write packs in ascending bin id
and Megatron's sequential samplers (``pack_slots``) give every DP rank of every global batch the work
this module planned for it.

Three stages (numpy + numba; no I/O, no torch):

1. **Fill.** Take the bin count ``B`` of best-fit decreasing (the tightest packer in ``longpack.binpack``).
   Place items longest first, each into the open bin of **lowest current cost** that still has room (LPT
   scheduling under a capacity constraint), opening a bin only when none has room. Long sequences land
   in different packs and short ones top up the cheap packs, so pack costs come out as even as the
   items allow while the pack count stays at (or within a few bins of) best-fit's.
2. **Steps.** Sort packs by cost and cut them into ``GBS`` strata of ``steps`` packs; each step takes
   one pack of every stratum, the stratum-to-step matching drawn at random (seeded). Every global batch
   gets the same mix of heavy and light packs, and step order carries no length trend.
3. **Ranks.** Inside a step, deal packs heaviest first to the least-loaded DP rank with a free slot, then
   swap pairs between the most and least loaded rank while that lowers the maximum; micro-batches of
   ``MBS`` packs are formed the same way, and their order on a rank is shuffled (seeded).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
from numba import njit

from longpack.balance.cost import PackCostModel
from longpack.balance.schedule import SAMPLERS, micro_batches_per_rank, pack_slots, positions_for_slots


@njit(cache=True)
def _lowest_cost_fit(
    order: np.ndarray, lengths: np.ndarray, item_cost: np.ndarray, capacity: int, initial_bins: int
) -> tuple[np.ndarray, int]:  # pragma: no cover - compiled
    """Stage 1: each item (in ``order``) into the open bin of lowest cost with room; new bin if none."""
    n = order.shape[0]
    max_bins = initial_bins + n
    room = np.full(max_bins, capacity, dtype=np.int64)
    cost = np.zeros(max_bins, dtype=np.float64)
    out = np.empty(lengths.shape[0], dtype=np.int64)
    nbins = initial_bins
    for t in range(n):
        i = order[t]
        length = lengths[i]
        best = -1
        best_cost = np.inf
        for b in range(nbins):
            if room[b] >= length and cost[b] < best_cost:
                best_cost = cost[b]
                best = b
        if best < 0:
            best = nbins
            nbins += 1
        room[best] -= length
        cost[best] += item_cost[i]
        out[i] = best
    return out, nbins


def _balanced_groups(costs: np.ndarray, groups: int, per_group: int, swap_rounds: int = 64) -> np.ndarray:
    """Split ``groups·per_group`` items into ``groups`` groups of ``per_group``, evening out group sums.

    Returns ``members[g, j]`` (item indices). Greedy (heaviest item to the lightest group with a free
    slot), then pair swaps between the heaviest and lightest group while they lower the heavier one.
    """
    order = np.argsort(-costs, kind="stable")
    load = np.zeros(groups)
    count = np.zeros(groups, dtype=np.int64)
    members = np.empty((groups, per_group), dtype=np.int64)
    for i in order:
        open_groups = np.flatnonzero(count < per_group)
        g = open_groups[np.argmin(load[open_groups])]
        members[g, count[g]] = i
        count[g] += 1
        load[g] += costs[i]
    for _ in range(swap_rounds if groups > 1 else 0):
        hi, lo = int(np.argmax(load)), int(np.argmin(load))
        gap = load[hi] - load[lo]
        if gap <= 0:
            break
        delta = costs[members[hi]][:, None] - costs[members[lo]][None, :]  # moving hi->lo lowers hi by delta
        gain = np.where((delta > 0) & (delta < gap), np.minimum(delta, gap - delta), -1.0)
        a, b = np.unravel_index(int(np.argmax(gain)), gain.shape)
        if gain[a, b] <= 1e-12 * gap:
            break
        members[hi, a], members[lo, b] = members[lo, b], members[hi, a]
        load[hi] -= delta[a, b]
        load[lo] += delta[a, b]
    return members


def cost_balanced_bins(
    lengths: Any, capacity: int, *, cost_model: PackCostModel, target_bins: int | None = None
) -> np.ndarray:
    """Stage 1 alone: pack to capacity with even pack costs (bin ids in creation order, not training order).

    ``target_bins`` bins are opened up front (default: best-fit decreasing's bin count); more are opened
    only for items that fit nowhere.

    >>> m = PackCostModel(linear=1.0, quadratic=1.0)
    >>> cost_balanced_bins([6, 5, 3, 2, 2, 2], 10, cost_model=m).tolist()  # 3 bins, costs 42, 30, 30
    [0, 1, 2, 2, 2, 2]
    """
    cap = _check_capacity(capacity)
    arr = _check_lengths(lengths, cap)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if target_bins is None:
        from longpack.binpack import pack_lengths

        target_bins = int(pack_lengths(arr, cap, algorithm="best_fit_decreasing").max()) + 1
    item_cost = cost_model.sequence_cost(arr)
    order = np.lexsort((np.arange(arr.size), -arr)).astype(np.int64)  # longest first, ties by index
    bins, nbins = _lowest_cost_fit(order, arr, item_cost, cap, int(target_bins))
    used = np.zeros(nbins, dtype=bool)
    used[bins] = True
    dense = np.cumsum(used) - 1  # drop bins that stayed empty (target_bins above what was needed)
    return dense[bins].astype(np.int64)


def order_packs(
    pack_costs: Any,
    *,
    dp: int,
    gbs: int,
    micro_batch_size: int = 1,
    sampler: str = "batch",
    seed: int = 0,
) -> np.ndarray:
    """Stages 2-3: training position of every pack (a permutation of ``0..P-1``).

    ``position[b]`` is where pack ``b`` goes in the file. If ``P`` is not a multiple of ``GBS`` the last
    global batch is partial; its packs are drawn at random (seeded) so it has no length bias either.

    >>> pos = order_packs([9.0, 1.0, 8.0, 2.0], dp=2, gbs=4, seed=0)
    >>> from longpack.balance.schedule import pack_slots
    >>> ranks = pack_slots(4, dp=2, gbs=4).rank
    >>> sorted([9.0 + 1.0, 8.0 + 2.0]) == sorted(
    ...     [sum(c for c, p in zip([9.0, 1.0, 8.0, 2.0], pos) if ranks[p] == r) for r in (0, 1)])
    True
    """
    costs = np.asarray(pack_costs, dtype=np.float64)
    m = micro_batches_per_rank(dp=dp, gbs=gbs, micro_batch_size=micro_batch_size)
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {SAMPLERS}")
    rng = np.random.default_rng(_check_seed(seed))
    n = costs.size
    full_steps, rest = divmod(n, gbs)
    ids = np.arange(n, dtype=np.int64)
    tail = np.sort(rng.choice(n, size=rest, replace=False)) if rest else np.zeros(0, dtype=np.int64)
    body = np.setdiff1d(ids, tail, assume_unique=True)
    # Stage 2: stratify by cost (ties broken by pack id), one pack per stratum and step.
    body = body[np.lexsort((body, -costs[body]))]
    strata = body.reshape(gbs, full_steps) if full_steps else body.reshape(gbs, 0)
    step_members = np.empty((full_steps, gbs), dtype=np.int64)
    for s in range(gbs):
        step_members[:, s] = strata[s, rng.permutation(full_steps)]
    slot_pos = positions_for_slots(dp=dp, gbs=gbs, micro_batch_size=micro_batch_size, sampler=sampler)
    position = np.empty(n, dtype=np.int64)
    for step in range(full_steps):
        packs = _place_step(step_members[step], costs, dp, m, micro_batch_size, rng)
        position[packs] = step * gbs + slot_pos.ravel()
    if rest:
        # Partial last step: the sampler fills positions 0..rest-1 of the global batch in order, so only
        # those slots exist; place the tail packs on them by cost (heaviest first to the lightest rank).
        slots = pack_slots(rest, dp=dp, gbs=gbs, micro_batch_size=micro_batch_size, sampler=sampler)
        load = np.zeros(dp)
        free = [list(np.flatnonzero(slots.rank == r)) for r in range(dp)]
        for b in tail[np.lexsort((tail, -costs[tail]))]:
            candidates = [r for r in range(dp) if free[r]]
            r = min(candidates, key=lambda q: (load[q], q))
            position[b] = full_steps * gbs + free[r].pop(0)
            load[r] += costs[b]
    return position


def _place_step(
    members: np.ndarray,
    costs: np.ndarray,
    dp: int,
    m: int,
    mbs: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Packs of one step as ``[rank, micro-batch, j]`` flattened (the layout of ``positions_for_slots``)."""
    ranks = _balanced_groups(costs[members], dp, m * mbs)  # [dp, m*mbs] indices into members
    out = np.empty((dp, m, mbs), dtype=np.int64)
    for r in range(dp):
        local = members[ranks[r]]
        mbs_groups = _balanced_groups(costs[local], m, mbs) if mbs > 1 else np.arange(m)[:, None]
        out[r] = local[mbs_groups[rng.permutation(m)]]
    return out.ravel()


def balanced_pack(
    lengths: Any,
    capacity: int,
    *,
    cost_model: PackCostModel,
    dp: int,
    gbs: int,
    micro_batch_size: int = 1,
    sampler: str = "batch",
    seed: int = 0,
    target_bins: int | None = None,
) -> np.ndarray:
    """Pack ``lengths`` into bins of ``capacity`` and number the bins in workload-balanced training order.

    Returns ``bin_of_item`` (np.int64, dense ids). **Bin ``k`` is the ``k``-th pack consumed**; with
    ``dp``, ``gbs``, ``micro_batch_size`` and ``sampler`` as in training, every DP rank of every global
    batch gets a near-equal share of the step's cost (``cost_model``). Same inputs and seed give the same
    output. See the module docstring for the algorithm.

    >>> m = PackCostModel(linear=1.0, quadratic=0.001)
    >>> bins = balanced_pack([900, 800, 100, 200, 500, 500, 400, 600], 1000, cost_model=m, dp=2, gbs=4)
    >>> sorted(np.bincount(bins, weights=[900, 800, 100, 200, 500, 500, 400, 600]).tolist())
    [1000.0, 1000.0, 1000.0, 1000.0]
    """
    bins = cost_balanced_bins(lengths, capacity, cost_model=cost_model, target_bins=target_bins)
    if bins.size == 0:
        return bins
    arr = np.asarray(lengths, dtype=np.int64)
    costs = cost_model.cost(arr, bins)
    position = order_packs(
        costs, dp=dp, gbs=gbs, micro_batch_size=micro_batch_size, sampler=sampler, seed=seed
    )
    return position[bins]


def step_length_correlation(lengths: Any, bin_of_item: Any, *, gbs: int) -> float:
    """Pearson correlation between step index and the mean sample length of that step.

    Bin ``k`` is read ``k``-th, so it belongs to step ``k // gbs``. Near 0 means no length trend over
    training (what a shuffled order gives); best-fit decreasing's creation order gives about -1.
    Returns 0.0 when there are fewer than 3 steps or no variation.

    >>> step_length_correlation([10, 10, 5, 5, 1, 1], [0, 1, 2, 3, 4, 5], gbs=2)
    -0.9979487157886733
    """
    arr = np.asarray(lengths, dtype=np.float64)
    step = np.asarray(bin_of_item, dtype=np.int64) // _check_capacity(gbs)
    n_steps = int(step.max()) + 1 if step.size else 0
    if n_steps < 3:
        return 0.0
    count = np.bincount(step, minlength=n_steps)
    keep = count > 0
    mean = np.bincount(step, weights=arr, minlength=n_steps)[keep] / count[keep]
    index = np.flatnonzero(keep).astype(np.float64)
    if mean.std() == 0:
        return 0.0
    return float(np.corrcoef(index, mean)[0, 1])


def _check_capacity(capacity: Any) -> int:
    try:
        cap = operator.index(capacity)
    except TypeError:
        raise TypeError(f"capacity must be an integer, got {capacity!r}") from None
    if cap < 1:
        raise ValueError(f"capacity must be >= 1, got {cap}")
    return cap


def _check_seed(seed: Any) -> int:
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(f"seed must be a non-negative integer, got {seed!r}") from None
    if value < 0:
        raise ValueError(f"seed must be >= 0, got {value}")
    return value


def _check_lengths(lengths: Any, capacity: int) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"lengths must be a 1-D array of integers, got dtype {arr.dtype} shape {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    bad = np.flatnonzero((arr < 1) | (arr > capacity))
    if bad.size:
        raise ValueError(
            f"{bad.size} of {arr.size} lengths are outside 1..{capacity} (capacity {capacity}); first at index "
            f"{bad[0]}: {int(arr[bad[0]])}. Truncate, split or drop those items before packing."
        )
    return arr
