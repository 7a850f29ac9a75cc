"""Workload-balanced packing: fill packs like best-fit, even out their cost, and order them for training.

``balanced_pack(lengths, capacity, target, *, seed) -> bin_of_item`` (``target``: a ``BalanceTarget``, the
topology and pack cost model) where **bin ids are the training order**: bin ``k`` is the ``k``-th pack the
data loader reads. Write packs in ascending bin id and Megatron's sequential samplers (``pack_slots``) give
every DP rank of every global batch the work this module planned for it.

Three stages (numpy + numba; no I/O, no torch):

1. **Fill.** Best-fit decreasing's packs (``longpack.binpack``), or an even-cost fill with the same bin
   count (``cost_balanced_bins``: items longest first, each into the open bin of **lowest current cost**
   that still has room, a new bin only when none has). ``fill="auto"`` runs stages 2-3 on both and keeps
   the one ``simulate_schedule`` finds faster: even costs help pure DP, while best-fit's uneven costs
   leave light packs to pair with the unavoidably heavy ones (one long sequence alone) under PP.
2. **Steps.** Sort packs by cost and cut them into ``GBS`` strata of ``steps`` packs; each step takes
   one pack of every stratum, the stratum-to-step matching drawn at random (seeded). Every global batch
   gets the same mix of heavy and light packs, and step order carries no length trend.
3. **Ranks.** Inside a step, deal packs heaviest first to the least-loaded DP rank with a free slot, then
   swap pairs between the most and least loaded rank while that lowers the maximum; micro-batches of
   ``MBS`` packs are formed the same way, and their order on a rank is shuffled (seeded). With PP, the
   micro-batch order of every rank is searched with ``pipeline_makespan``, and packs are swapped between
   a step's slowest rank and its fastest ranks while that shortens the step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from longpack import choices
from longpack.balance.cost import PackCostModel
from longpack.balance.schedule import (
    SAMPLERS,
    micro_batches_per_rank,
    pack_slots,
    pipeline_makespan,
    positions_for_slots,
    simulate_schedule,
)
from longpack.balance.target import BalanceTarget
from longpack.binpack import check_capacity, check_seed, pack_lengths, validate_lengths
from longpack.binpack._dispatch import kernels
from longpack.errors import ConfigError


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
    cap = check_capacity(capacity)
    arr = np.asarray(validate_lengths(lengths, cap), dtype=np.int64)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if target_bins is None:
        target_bins = int(pack_lengths(arr, cap, algorithm=choices.BEST_FIT_DECREASING).max()) + 1
    item_cost = cost_model.sequence_cost(arr)
    order = np.lexsort((np.arange(arr.size), -arr)).astype(np.int64)  # longest first, ties by index
    bins, nbins = kernels().lowest_cost_fit(order, arr, item_cost, cap, int(target_bins))
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
    sampler: str = choices.BATCH_SAMPLER,
    pp: int = 1,
    schedule: str = choices.SCHEDULE_1F1B,
    vpp: int = 1,
    seed: int = 0,
    passes: int = 2,
) -> np.ndarray:
    """Stages 2-3: training position of every pack (a permutation of ``0..P-1``).

    ``position[b]`` is where pack ``b`` goes in the file. If ``P`` is not a multiple of ``GBS`` the last
    global batch is partial; its packs are a systematic sample of the cost-sorted packs (random offset),
    so it carries the same mix as the other steps. With ``pp > 1`` the order of each rank's micro-batches
    is chosen with ``pipeline_makespan`` (best of a few orders, then pair swaps while they shorten the
    pipeline), and ``passes`` rounds of pack swaps between each step's slowest rank and the others even
    out pipeline *times* rather than summed work: under PP a rank holding one very heavy micro-batch
    stalls, so it should carry lighter packs besides.

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
        raise ConfigError(f"unknown sampler {sampler!r}; choose one of {SAMPLERS}")
    if pp > 1:
        pipeline_makespan(np.ones(m), pp=pp, schedule=schedule, vpp=vpp)  # validates pp/vpp/schedule early
    rng = np.random.default_rng(check_seed(seed))
    n = costs.size
    full_steps, rest = divmod(n, gbs)
    by_cost = np.lexsort((np.arange(n), -costs))  # heaviest first, ties by pack id
    if rest:
        picks = np.floor((np.arange(rest) + rng.random()) * (n / rest)).astype(np.int64)
        tail = by_cost[np.minimum(picks, n - 1)]
        body = by_cost[np.isin(by_cost, tail, invert=True)]
    else:
        tail, body = np.zeros(0, dtype=np.int64), by_cost
    # Stage 2: cost strata of `full_steps` packs; every step takes one pack of each stratum.
    strata = body.reshape(gbs, full_steps)
    step_members = np.empty((full_steps, gbs), dtype=np.int64)
    for s in range(gbs):
        step_members[:, s] = strata[s, rng.permutation(full_steps)]
    # Stage 3: ranks and micro-batches of every step: placed[step, rank, micro-batch, j] = pack id.
    placed = np.empty((full_steps, dp, m, micro_batch_size), dtype=np.int64)
    for step in range(full_steps):
        placed[step] = _place_step(step_members[step], costs, dp, m, micro_batch_size, rng)
    if pp > 1 and full_steps:
        placed = _reorder(placed, costs, pp=pp, schedule=schedule, vpp=vpp)
        for _ in range(passes):
            placed = _rebalance_makespans(placed, costs, pp=pp, schedule=schedule, vpp=vpp)
            placed = _reorder(placed, costs, pp=pp, schedule=schedule, vpp=vpp)
    slot_pos = positions_for_slots(dp=dp, gbs=gbs, micro_batch_size=micro_batch_size, sampler=sampler)
    position = np.empty(n, dtype=np.int64)
    for step in range(full_steps):
        position[placed[step].ravel()] = step * gbs + slot_pos.ravel()
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


def _reorder(placed: np.ndarray, costs: np.ndarray, *, pp: int, schedule: str, vpp: int) -> np.ndarray:
    """Reorder the micro-batches of every (step, rank) of ``placed[S, dp, m, mbs]`` for a short pipeline."""
    steps, dp, m, mbs = placed.shape
    flat = placed.reshape(steps * dp, m, mbs)
    perm = _best_micro_batch_order(costs[flat].sum(axis=2), pp=pp, schedule=schedule, vpp=vpp)
    return np.take_along_axis(flat, perm[:, :, None], axis=1).reshape(placed.shape)


def _rebalance_makespans(
    placed: np.ndarray,
    costs: np.ndarray,
    *,
    pp: int,
    schedule: str,
    vpp: int,
    max_rounds: int = 48,
    partners: int = 3,
    max_rows: int = 1 << 16,
) -> np.ndarray:
    """Swap packs between the slowest rank of a step and a fast rank while the step gets shorter.

    Equal work per rank is not equal time per rank under PP: a rank holding one very heavy micro-batch
    stalls its pipeline, so it should carry less of the remaining work. Each round evaluates, for every
    step at once, all swaps of one pack of the slowest rank with a lighter pack of one of the
    ``partners`` fastest ranks (each pack keeps its slot) and applies the one that lowers
    ``max(new slowest, new partner)`` the most.
    """
    placed = placed.copy()
    steps, dp, m, mbs = placed.shape
    if dp < 2:
        return placed
    k = min(partners, dp - 1)
    slots = m * mbs
    mb_of_slot = np.arange(slots) // mbs
    chunk = max(1, max_rows // max(1, k * slots * slots))
    for lo in range(0, steps, chunk):
        part = placed[lo : lo + chunk].reshape(-1, dp, slots)  # view into `placed`
        s_count = part.shape[0]
        s_idx = np.arange(s_count)
        active = np.ones(s_count, dtype=bool)
        for _ in range(max_rounds):
            c = costs[part]  # [S, dp, slots]
            mbc = c.reshape(s_count, dp, m, mbs).sum(axis=3)  # slot t is in micro-batch t // mbs
            span = pipeline_makespan(mbc, pp=pp, schedule=schedule, vpp=vpp)  # [S, dp]
            by_span = np.argsort(span, axis=1, kind="stable")
            hot, fast = by_span[:, -1], by_span[:, :k]  # the slowest rank is never among the k fastest
            c_hot = c[s_idx, hot]  # [S, slots]
            c_fast = c[s_idx[:, None], fast]  # [S, k, slots]
            delta = c_hot[:, None, :, None] - c_fast[:, :, None, :]  # [S, k, i (hot slot), j (partner slot)]
            cand = np.flatnonzero((delta > 0) & active[:, None, None, None])
            worst = np.full(delta.size, np.inf)
            if cand.size:
                cs, cp, ci, cj = np.unravel_index(cand, delta.shape)
                d = delta.ravel()[cand]
                new_hot = mbc[cs, hot[cs]].copy()  # [C, m]
                new_hot[np.arange(cand.size), mb_of_slot[ci]] -= d
                new_partner = mbc[cs, fast[cs, cp]].copy()
                new_partner[np.arange(cand.size), mb_of_slot[cj]] += d
                worst[cand] = np.maximum(
                    pipeline_makespan(new_hot, pp=pp, schedule=schedule, vpp=vpp),
                    pipeline_makespan(new_partner, pp=pp, schedule=schedule, vpp=vpp),
                )
            worst = worst.reshape(s_count, -1)
            flat_best = np.argmin(worst, axis=1)
            best = worst[s_idx, flat_best]
            improve = active & (best < span[s_idx, hot] * (1 - 1e-9))
            if not improve.any():
                break
            for s in np.flatnonzero(improve):
                p_idx, i, j = np.unravel_index(flat_best[s], (k, slots, slots))
                h, partner = hot[s], fast[s, p_idx]
                part[s, h, i], part[s, partner, j] = part[s, partner, j], part[s, h, i]
            active = improve
    return placed


def _best_micro_batch_order(
    mb_costs: np.ndarray, *, pp: int, schedule: str, vpp: int, max_rounds: int = 12
) -> np.ndarray:
    """Per row of ``mb_costs[R, m]``, a permutation of the micro-batches that shortens the pipeline.

    Starts from the best of: the given order, ascending, descending and "light at both ends, heavy in
    the middle"; then applies the best pair swap per row while any swap shortens that row's makespan.
    All candidates of all rows go through ``pipeline_makespan`` in one batched call per round.
    """
    rows, m = mb_costs.shape
    asc = np.argsort(mb_costs, axis=1, kind="stable")
    middle = np.concatenate([asc[:, 0::2], asc[:, 1::2][:, ::-1]], axis=1)  # light ends, heavy middle
    starts = np.stack([np.tile(np.arange(m), (rows, 1)), asc, asc[:, ::-1], middle], axis=1)  # [R, 4, m]
    spans = pipeline_makespan(
        np.take_along_axis(mb_costs[:, None, :], starts, axis=2), pp=pp, schedule=schedule, vpp=vpp
    )
    best = starts[np.arange(rows), np.argmin(spans, axis=1)]
    best_span = spans.min(axis=1)
    i_idx, j_idx = np.triu_indices(m, k=1)
    for _ in range(max_rounds if m > 1 else 0):
        cand = np.repeat(best[:, None, :], len(i_idx), axis=1)  # [R, S, m]
        s_idx = np.arange(len(i_idx))
        cand[:, s_idx, i_idx], cand[:, s_idx, j_idx] = best[:, j_idx], best[:, i_idx]
        spans = pipeline_makespan(
            np.take_along_axis(mb_costs[:, None, :], cand, axis=2), pp=pp, schedule=schedule, vpp=vpp
        )
        pick = np.argmin(spans, axis=1)
        new_span = spans[np.arange(rows), pick]
        better = new_span < best_span * (1 - 1e-12)
        if not better.any():
            break
        best[better] = cand[better, pick[better]]
        best_span[better] = new_span[better]
    return best


def _place_step(
    members: np.ndarray,
    costs: np.ndarray,
    dp: int,
    m: int,
    mbs: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Packs of one step as ``[rank, micro-batch, j]`` (the layout of ``positions_for_slots``)."""
    ranks = _balanced_groups(costs[members], dp, m * mbs)  # [dp, m*mbs] indices into members
    out = np.empty((dp, m, mbs), dtype=np.int64)
    for r in range(dp):
        local = members[ranks[r]]
        mbs_groups = _balanced_groups(costs[local], m, mbs) if mbs > 1 else np.arange(m)[:, None]
        out[r] = local[mbs_groups[rng.permutation(m)]]
    return out


FILLS = ("auto", "best_fit", "even_cost")


def balanced_pack(
    lengths: Any,
    capacity: int,
    target: BalanceTarget,
    *,
    seed: int,
    fill: str = "auto",
    passes: int = 2,
) -> np.ndarray:
    """Pack ``lengths`` into bins of ``capacity`` and number the bins in workload-balanced training order.

    Returns ``bin_of_item`` (np.int64, dense ids). **Bin ``k`` is the ``k``-th pack consumed**; with the
    topology of ``target`` (``dp``, ``gbs``, ``micro_batch_size``, ``sampler``, ``pp``, ``schedule``,
    ``vpp``) as in training, every DP rank of every global batch gets a near-equal share of the step's
    time under ``target.cost_model``. Same inputs and seed give the same output.

    ``fill`` picks the packs before ordering: ``"best_fit"`` (best-fit decreasing's packs: tightest, and
    their uneven costs leave light packs to pair with unavoidably heavy ones), ``"even_cost"``
    (``cost_balanced_bins``) or ``"auto"`` (both, keeping the one ``simulate_schedule`` finds faster;
    ties go to best-fit). Either uses best-fit decreasing's bin count (even-cost opens more only for
    items that fit nowhere; ``"auto"`` drops it if that costs more than 0.5 % fill). See the module
    docstring for the ordering.

    >>> t = BalanceTarget(cost_model=PackCostModel(linear=1.0, quadratic=0.001), dp=2, gbs=4)
    >>> bins = balanced_pack([900, 800, 100, 200, 500, 500, 400, 600], 1000, t, seed=0)
    >>> sorted(np.bincount(bins, weights=[900, 800, 100, 200, 500, 500, 400, 600]).tolist())
    [1000.0, 1000.0, 1000.0, 1000.0]
    """
    if not isinstance(target, BalanceTarget):
        raise TypeError(
            f"target must be a longpack.balance.BalanceTarget, got {type(target).__name__} "
            "(read a 'dp=..,gbs=..,model=..,gpu=..' text with "
            "longpack.planner.balance_costs.parse_balance_spec)"
        )
    if fill not in FILLS:
        raise ConfigError(f"unknown fill {fill!r}; choose one of {FILLS}")
    cap = check_capacity(capacity)
    seed = check_seed(seed)
    arr = np.asarray(validate_lengths(lengths, cap), dtype=np.int64)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    cost_model = target.cost_model
    layout: dict[str, Any] = dict(
        dp=target.dp,
        gbs=target.gbs,
        micro_batch_size=target.micro_batch_size,
        sampler=target.sampler,
        pp=target.pp,
        schedule=target.schedule,
        vpp=target.vpp,
    )
    reference = pack_lengths(arr, cap, algorithm=choices.BEST_FIT_DECREASING, seed=0)
    candidates = []
    if fill in ("auto", "best_fit"):
        candidates.append(reference)
    if fill in ("auto", "even_cost"):
        even = cost_balanced_bins(arr, cap, cost_model=cost_model, target_bins=int(reference.max()) + 1)
        # auto never trades fill for balance beyond 0.5 % of best-fit's efficiency (issue 8's budget).
        if fill == "even_cost" or (int(even.max()) + 1) * 0.995 <= int(reference.max()) + 1:
            candidates.append(even)
    best: tuple[float, np.ndarray] | None = None
    for bins in candidates:
        costs = cost_model.cost(arr, bins)
        position = order_packs(costs, seed=seed, passes=passes, **layout)
        ordered = np.empty_like(costs)
        ordered[position] = costs
        total = simulate_schedule(ordered, **layout).total_time
        if best is None or total < best[0]:
            best = (total, position[bins])
    assert best is not None
    return best[1]


def step_length_correlation(lengths: Any, bin_of_item: Any, *, gbs: int) -> float:
    """Pearson correlation between step index and the mean sample length of that step.

    Bin ``k`` is read ``k``-th, so it belongs to step ``k // gbs``. Near 0 means no length trend over
    training (what a shuffled order gives); best-fit decreasing's creation order gives about -1.
    Returns 0.0 when there are fewer than 3 steps or no variation.

    >>> step_length_correlation([10, 10, 5, 5, 1, 1], [0, 1, 2, 3, 4, 5], gbs=2)
    -0.9979487157886733
    """
    arr = np.asarray(lengths, dtype=np.float64)
    step = np.asarray(bin_of_item, dtype=np.int64) // check_capacity(gbs, "gbs")
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
