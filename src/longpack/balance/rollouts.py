"""Packing RL rollouts at run time: bins of THD micro-batches, their DP ranks and their CP split.

Rollouts (GRPO / PPO generations, the log-prob and value passes over them) arrive during training with
lengths nobody knew when the data was prepared, so they are packed online, once per step:

1. **Fill.** Rollouts longest first, each appended to the current bin while its *slot* (its length rounded
   up to ``seq_length_multiple``) fits and the bin holds fewer than ``max_sequences_per_bin`` rollouts,
   otherwise a new bin is started: Megatron-LM's RL ``SequencePacker.pack_sequences``
   (NVIDIA/Megatron-LM@3ad8c2a6b1:megatron/rl/sequence_packing_utils.py). Every rollout starts at a
   multiple of ``seq_length_multiple``; the gap to the next slot stays pad with loss mask 0.
   ``fill="best_fit_decreasing"`` puts each rollout (longest first) into the open bin with the least room
   that still takes it instead, under the same caps: fewer bins, so fewer micro-batches per step.
2. **Ranks.** ``distribution="fifo"`` gives DP rank ``r`` a contiguous run of bins (the first
   ``n % dp`` ranks one more), ``"round-robin"`` bins ``r, r+dp, …``: Megatron-LM's
   ``distribute_packed_bins``. ``"balanced"`` deals bins heaviest first by their cost under a
   ``PackCostModel`` (causal attention makes a bin's work grow with Σ Lᵢ², not with its token count; use
   the planner's step-time model, ``longpack.planner.balance_costs.pack_cost_model``, for seconds) to the
   least loaded rank with a free slot, then swaps bins between the busiest and idlest rank while that
   lowers the busiest, and keeps that or one of Megatron-LM's two orders, whichever leaves the busiest rank
   least to do. Every rank gets ``ceil(n / dp)`` bins; ranks short of that get empty bins (all pad,
   loss mask 0), as Megatron-LM's ``create_empty_bins``, so every rank runs the same number of
   micro-batches. An empty bin is costed as what it runs: one ghost sequence over the whole width.
3. **Metadata.** Per bin, ``cu_seqlens`` (real lengths, cumulated, then the trailing pad as one ghost
   sequence) and ``cu_seqlens_padded`` (slot offsets, then the bin width), both padded to
   ``max_sequences_per_bin + 2`` entries by repeating the last one (zero-length ghosts keep one tensor
   shape for CUDA graphs): Megatron-LM's ``create_packed_seq_params_for_bin``. ``cp_indices(rank)``
   gives the tokens each CP rank keeps (TransformerEngine's per-sequence zigzag split).

Pure numpy: no torch, no I/O. The default ``seq_length_multiple`` is longpack's
``pad_seq_to_mult(tp, cp, sp)``; Megatron-LM's RL path uses ``2*CP`` (it does not add SP's ``CP*TP``
term), so pass ``seq_length_multiple=2 * cp`` to match it exactly under SP.

>>> rollouts = [[5, 6, 7], [8, 9], [1, 2, 3, 4, 5], [4]]
>>> packing = pack_rollouts(rollouts, bin_size=8, dp=2)
>>> packing.ranks[0].seq_indices, packing.ranks[1].seq_indices
(((2, 0),), ((1, 3),))
>>> packing.ranks[1].tokens.tolist()
[[8, 9, 4, 0, 0, 0, 0, 0]]
>>> packing.ranks[1].position_ids.tolist()
[[0, 1, 0, 0, 0, 0, 0, 0]]
>>> packing.ranks[1].cu_seqlens.tolist()[0][:4]
[0, 2, 3, 8]
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longpack.balance.cost import PackCostModel
from longpack.balance.packer import _balanced_groups
from longpack.choices import (
    DEFAULT_ROLLOUT_DISTRIBUTION,
    DEFAULT_ROLLOUT_FILL,
    ROLLOUT_DISTRIBUTIONS,
    ROLLOUT_FILLS,
)
from longpack.errors import ConfigError
from longpack.topology import align_up, kernel_pad_multiple, pad_seq_to_mult, zigzag_source_indices

__all__ = [
    "ROLLOUT_DISTRIBUTIONS",
    "RankBins",
    "RolloutPacking",
    "RolloutPackingError",
    "check_fp8_bin_size",
    "pack_rollouts",
]

# Causal attention dominates long rollouts; a model without the planner's figures still balances by
# work rather than by tokens (one unit per token plus one per causal pair of a 4K-token sequence).
_DEFAULT_COST = PackCostModel(linear=1.0, quadratic=1.0 / 4096)


class RolloutPackingError(ConfigError):
    """Rollouts or settings the rollout packer cannot pack (too long, empty, wrong shapes)."""


@dataclass(frozen=True, kw_only=True)
class RankBins:
    """The bins (micro-batches of one sequence each, THD) one DP rank trains on.

    ``tokens``, ``position_ids``, ``loss_mask`` and every array of ``token_side`` are ``[bins, bin_size]``;
    ``cu_seqlens`` and ``cu_seqlens_padded`` are ``int32 [bins, max_sequences_per_bin + 2]``
    (``cu_seqlens_padded`` equals ``cu_seqlens`` when ``seq_length_multiple`` is 1). ``seq_indices[b]``
    are the input indices of the rollouts in bin ``b`` in order; ``seq_starts[b]`` their slot offsets plus
    the end of the last slot (Megatron-LM's ``PackingInfo.seq_starts``). An empty bin (a rank's padding)
    has no rollouts and one ghost sequence over the whole width.
    """

    tokens: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray
    cu_seqlens: np.ndarray
    cu_seqlens_padded: np.ndarray
    seq_indices: tuple[tuple[int, ...], ...]
    seq_starts: tuple[tuple[int, ...], ...]
    token_side: Mapping[str, np.ndarray] = field(default_factory=dict)
    cost: float = 0.0

    @property
    def num_bins(self) -> int:
        """Bins on this rank (the micro-batches it runs), empty bins included."""
        return int(self.tokens.shape[0])

    def cp_indices(self, bin_index: int, cp_size: int, cp_rank: int) -> np.ndarray:
        """Token columns of bin ``bin_index`` that CP rank ``cp_rank`` of ``cp_size`` keeps.

        The per-sequence zigzag split over the bin's slots (``cu_seqlens_padded``, its zero-length ghost
        entries dropped); each slot must be a multiple of ``2*cp_size``, which the packer guarantees when
        ``seq_length_multiple`` is a multiple of it.
        """
        bounds = np.unique(self.cu_seqlens_padded[bin_index].astype(np.int64))
        if cp_size > 1 and np.any(np.diff(bounds) % (2 * cp_size)):
            raise RolloutPackingError(
                f"bin {bin_index} has slots {np.diff(bounds).tolist()} that do not split over "
                f"2*cp_size={2 * cp_size} chunks; pack with seq_length_multiple a multiple of {2 * cp_size}"
            )
        if not 0 <= cp_rank < cp_size:
            raise RolloutPackingError(f"cp_rank must satisfy 0 <= cp_rank < cp_size={cp_size}, got {cp_rank}")
        return zigzag_source_indices(bounds, cp_size, cp_rank)


@dataclass(frozen=True, kw_only=True)
class RolloutPacking:
    """What ``pack_rollouts`` returns: the bins of every DP rank and how well they are balanced.

    ``ranks[r]`` is DP rank ``r``'s ``RankBins``; ``rank_costs[r]`` the sum of its bins' costs under the
    cost model used (``cost_model``); ``imbalance`` the busiest rank's cost over the mean (1.0 = even).
    ``bin_of_rollout[i]`` and ``rank_of_rollout[i]`` locate input rollout ``i``.
    """

    ranks: tuple[RankBins, ...]
    bin_size: int
    seq_length_multiple: int
    max_sequences_per_bin: int
    distribution: str
    fill: str
    cost_model: PackCostModel
    rank_costs: tuple[float, ...]
    bin_of_rollout: np.ndarray
    rank_of_rollout: np.ndarray
    lengths: np.ndarray

    @property
    def imbalance(self) -> float:
        """Busiest rank's cost / mean rank cost (1.0 when perfectly even)."""
        costs = np.asarray(self.rank_costs, dtype=np.float64)
        mean = float(costs.mean()) if costs.size else 0.0
        return float(costs.max() / mean) if mean > 0 else 1.0

    @property
    def efficiency(self) -> float:
        """Rollout tokens / (bins × bin_size) over all ranks, empty bins included."""
        slots = sum(r.num_bins for r in self.ranks) * self.bin_size
        return float(self.lengths.sum() / slots) if slots else 0.0

    def unpack(self, rank: int, values: Any) -> dict[int, np.ndarray]:
        """Per-token values computed on rank ``rank``'s bins (``[bins, bin_size]``, e.g. log-probs) back
        per rollout: ``{rollout index: values of its tokens}``.

        >>> p = pack_rollouts([[1, 2, 3], [4]], bin_size=4)
        >>> {k: v.tolist() for k, v in p.unpack(0, p.ranks[0].tokens * 10).items()}
        {0: [10, 20, 30], 1: [40]}
        """
        bins = self.ranks[rank]
        array = np.asarray(values)
        if array.shape[:2] != bins.tokens.shape:
            raise RolloutPackingError(
                f"values for rank {rank} must be shaped {bins.tokens.shape} (bins x bin_size), "
                f"got {array.shape}"
            )
        out: dict[int, np.ndarray] = {}
        for b, (indices, starts) in enumerate(zip(bins.seq_indices, bins.seq_starts, strict=True)):
            for i, start in zip(indices, starts, strict=False):
                out[i] = array[b, start : start + int(self.lengths[i])]
        return out


def _as_rollouts(token_ids: Sequence[Any]) -> list[np.ndarray]:
    if isinstance(token_ids, np.ndarray) and token_ids.ndim != 2:
        raise RolloutPackingError(
            f"token_ids must be a sequence of 1-D arrays (one per rollout), got an array of shape "
            f"{token_ids.shape}"
        )
    rollouts = []
    for i, ids in enumerate(token_ids):
        array = np.asarray(ids)
        if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise RolloutPackingError(
                f"rollout {i} must be a 1-D array of integer token ids, got shape {array.shape} and "
                f"dtype {array.dtype}"
            )
        if array.size == 0:
            raise RolloutPackingError(
                f"rollout {i} is empty; drop empty generations before packing (they train on nothing)"
            )
        rollouts.append(array)
    if not rollouts:
        raise RolloutPackingError("no rollouts to pack: token_ids is empty")
    return rollouts


def _per_token(name: str, values: Sequence[Any], lengths: np.ndarray) -> list[np.ndarray]:
    if len(values) != lengths.size:
        raise RolloutPackingError(f"{name} has {len(values)} entries for {lengths.size} rollouts")
    out = []
    for i, v in enumerate(values):
        array = np.asarray(v)
        if array.shape != (int(lengths[i]),):
            raise RolloutPackingError(
                f"{name}[{i}] has shape {array.shape}; it must hold one value per token of rollout {i} "
                f"({int(lengths[i])} tokens)"
            )
        out.append(array)
    return out


def _next_fit(lengths: np.ndarray, slots: np.ndarray, bin_size: int, max_per_bin: int) -> list[list[int]]:
    """Megatron-LM's greedy fill: longest rollout first (ties in input order), next bin when full."""
    order = sorted(range(slots.size), key=lambda i: int(lengths[i]), reverse=True)
    bins: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in order:
        slot = int(slots[i])
        if current and used + slot <= bin_size and len(current) < max_per_bin:
            current.append(i)
            used += slot
        else:
            if current:
                bins.append(current)
            current, used = [i], slot
    if current:
        bins.append(current)
    return bins


def _best_fit(lengths: np.ndarray, slots: np.ndarray, bin_size: int, max_per_bin: int) -> list[list[int]]:
    """Longest first, each into the open bin with the least room that still takes its slot (ties: the
    older bin); bins holding ``max_per_bin`` rollouts close."""
    order = sorted(range(slots.size), key=lambda i: int(lengths[i]), reverse=True)
    bins: list[list[int]] = []
    room: list[int] = []
    open_bins: list[tuple[int, int]] = []  # (room left, bin id), sorted
    for i in order:
        slot = int(slots[i])
        at = bisect.bisect_left(open_bins, (slot, -1))
        if at == len(open_bins):
            b = len(bins)
            bins.append([i])
            room.append(bin_size - slot)
        else:
            _, b = open_bins.pop(at)
            bins[b].append(i)
            room[b] -= slot
        if len(bins[b]) < max_per_bin and room[b] > 0:
            bisect.insort(open_bins, (room[b], b))
    return bins


# lengths, slots -> bins, in the order of ROLLOUT_FILLS
_FILL = dict(zip(ROLLOUT_FILLS, (_next_fit, _best_fit), strict=True))


def _fifo(costs: np.ndarray, dp: int, empty_cost: float) -> list[list[int]]:
    per, extra = divmod(costs.size, dp)
    out, start = [], 0
    for r in range(dp):
        size = per + (1 if r < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def _round_robin(costs: np.ndarray, dp: int, empty_cost: float) -> list[list[int]]:
    return [list(range(r, costs.size, dp)) for r in range(dp)]


def _busiest(costs: np.ndarray, ranks: list[list[int]], per_rank: int, empty_cost: float) -> float:
    return max(float(costs[r].sum()) + empty_cost * (per_rank - len(r)) for r in ranks)


def _cost_balanced(costs: np.ndarray, dp: int, empty_cost: float) -> list[list[int]]:
    n = costs.size
    per_rank = -(-n // dp)
    # a rank short of bins runs empty ones, which cost what a full-width ghost sequence costs
    padded = np.concatenate([costs, np.full(per_rank * dp - n, empty_cost)])
    members = _balanced_groups(padded, dp, per_rank)
    greedy = [sorted(int(b) for b in row if b < n) for row in members]
    # never worse than Megatron-LM's own orders on the same bins
    candidates = [greedy, _round_robin(costs, dp, empty_cost), _fifo(costs, dp, empty_cost)]
    return min(candidates, key=lambda ranks: _busiest(costs, ranks, per_rank, empty_cost))


_DISTRIBUTE = dict(zip(ROLLOUT_DISTRIBUTIONS, (_fifo, _round_robin, _cost_balanced), strict=True))


def check_fp8_bin_size(bin_size: int, *, tp: int = 1, cp: int = 1, sp: bool = False, fp8_recipe: str) -> None:
    """Refuse a bin width whose share per rank (``bin_size / CP``, ``/ TP`` under SP) is not a multiple of the
    FP8 recipe's block (``longpack.topology.kernel_pad_multiple``): bins are fixed-width, so the width decides.

    >>> check_fp8_bin_size(16384, cp=2, fp8_recipe="mxfp8")
    >>> check_fp8_bin_size(16400, cp=2, fp8_recipe="mxfp8")
    Traceback (most recent call last):
    ...
    longpack.balance.rollouts.RolloutPackingError: fp8_recipe 'mxfp8': every rank's share of a bin must be a multiple of the recipe's token block, so bin_size a multiple of 64 (CP 2, TP 1, SP off); 16400 is not: use 16448 or 16384
    """
    need = kernel_pad_multiple(tp=tp, cp=cp, sp=sp, fp8_recipe=fp8_recipe)
    if bin_size % need:
        raise RolloutPackingError(
            f"fp8_recipe {fp8_recipe!r}: every rank's share of a bin must be a multiple of the recipe's token "
            f"block, so bin_size a multiple of {need} (CP {cp}, TP {tp}, SP {'on' if sp else 'off'}); "
            f"{bin_size} is not: use {align_up(bin_size, need)} or {bin_size // need * need}"
        )


def pack_rollouts(
    token_ids: Sequence[Any],
    *,
    bin_size: int,
    loss_masks: Sequence[Any] | None = None,
    token_side: Mapping[str, Sequence[Any]] | None = None,
    max_sequences_per_bin: int = 16,
    dp: int = 1,
    tp: int = 1,
    cp: int = 1,
    sp: bool = False,
    seq_length_multiple: int | None = None,
    distribution: str = DEFAULT_ROLLOUT_DISTRIBUTION,
    fill: str = DEFAULT_ROLLOUT_FILL,
    cost_model: PackCostModel | None = None,
    pad_id: int = 0,
    fp8_recipe: str | None = None,
) -> RolloutPacking:
    """Pack one step's rollouts into THD bins for ``dp`` data-parallel ranks (see the module docstring).

    - ``token_ids``: one 1-D integer array per rollout (prompt + generation, no padding).
    - ``loss_masks``: optional per-token 0/1 masks (e.g. generation tokens only); packed as the loss mask
      times 1 on the rollout's tokens, 0 on pad, as Megatron-LM multiplies its generation masks in.
    - ``token_side``: further per-token arrays (old / reference / inference log-probs, per-token
      advantages), packed in the same places, 0 elsewhere.
    - ``seq_length_multiple``: slot alignment; default ``pad_seq_to_mult(tp=tp, cp=cp, sp=sp)``.
    - ``fill``: ``"next_fit_decreasing"`` (Megatron-LM's, the default) or ``"best_fit_decreasing"``
      (fewer bins, so fewer micro-batches, for the same rollouts).
    - ``cost_model``: the bin cost ``"balanced"`` evens out and ``rank_costs`` report; default one unit
      per token plus one per causal pair of a 4,096-token sequence.
    - ``fp8_recipe``: with FP8 (``"mxfp8"``, ``"delayed"``, ...) ``bin_size`` must give every rank a
      multiple of the recipe's token block (:func:`check_fp8_bin_size`).

    >>> rollouts = [[1] * 8, [2] * 8, [3] * 6, [4] * 3]  # four bins of one rollout each
    >>> fifo = pack_rollouts(rollouts, bin_size=8, dp=2)
    >>> even = pack_rollouts(rollouts, bin_size=8, dp=2, distribution="balanced")
    >>> [r.seq_indices for r in fifo.ranks], round(fifo.imbalance, 2)
    ([((0,), (1,)), ((2,), (3,))], 1.28)
    >>> [r.seq_indices for r in even.ranks], round(even.imbalance, 2)
    ([((0,), (2,)), ((1,), (3,))], 1.12)
    """
    for name, value in (("bin_size", bin_size), ("max_sequences_per_bin", max_sequences_per_bin), ("dp", dp)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise RolloutPackingError(f"{name} must be a positive integer, got {value!r}")
    if distribution not in ROLLOUT_DISTRIBUTIONS:
        raise RolloutPackingError(
            f"distribution must be one of {', '.join(ROLLOUT_DISTRIBUTIONS)}, got {distribution!r}"
        )
    if fill not in ROLLOUT_FILLS:
        raise RolloutPackingError(f"fill must be one of {', '.join(ROLLOUT_FILLS)}, got {fill!r}")
    multiple = pad_seq_to_mult(tp=tp, cp=cp, sp=sp) if seq_length_multiple is None else seq_length_multiple
    if isinstance(multiple, bool) or not isinstance(multiple, int | np.integer) or multiple < 1:
        raise RolloutPackingError(f"seq_length_multiple must be a positive integer, got {multiple!r}")
    if bin_size % multiple:
        raise RolloutPackingError(
            f"bin_size {bin_size} is not a multiple of seq_length_multiple {multiple}; use a bin size such "
            f"as {align_up(bin_size, multiple)}"
        )
    if fp8_recipe is not None:
        check_fp8_bin_size(bin_size, tp=tp, cp=cp, sp=sp, fp8_recipe=fp8_recipe)
    model = _DEFAULT_COST if cost_model is None else cost_model
    rollouts = _as_rollouts(token_ids)
    lengths = np.array([r.size for r in rollouts], dtype=np.int64)
    slots = align_up(lengths, multiple)
    too_long = np.flatnonzero(slots > bin_size)
    if too_long.size:
        i = int(too_long[0])
        raise RolloutPackingError(
            f"rollout {i} needs a slot of {int(slots[i])} tokens ({int(lengths[i])} tokens aligned to "
            f"{multiple}) but bins hold {bin_size}; {too_long.size} rollout(s) are too long: raise bin_size "
            "or cap the generation length"
        )
    masks = None if loss_masks is None else _per_token("loss_masks", loss_masks, lengths)
    sides = {name: _per_token(f"token_side[{name!r}]", v, lengths) for name, v in (token_side or {}).items()}

    bins = _FILL[fill](lengths, slots, bin_size, max_sequences_per_bin)
    bin_costs = np.array([model.pack_cost(lengths[b]) for b in bins], dtype=np.float64)
    empty_cost = model.pack_cost([bin_size])
    assignment = _DISTRIBUTE[distribution](bin_costs, dp, empty_cost)
    per_rank = -(-len(bins) // dp)
    width = max_sequences_per_bin + 2
    dtype = rollouts[0].dtype
    bin_of_rollout = np.empty(lengths.size, dtype=np.int64)
    rank_of_rollout = np.empty(lengths.size, dtype=np.int64)
    ranks = []
    for rank, own in enumerate(assignment):
        tokens = np.full((per_rank, bin_size), pad_id, dtype=dtype)
        positions = np.zeros((per_rank, bin_size), dtype=np.int64)
        loss = np.zeros((per_rank, bin_size), dtype=np.float32)
        side_out = {
            name: np.zeros((per_rank, bin_size), dtype=np.result_type(*(a.dtype for a in arrays)))
            for name, arrays in sides.items()
        }
        cu = np.full((per_rank, width), bin_size, dtype=np.int32)
        cu_padded = np.full((per_rank, width), bin_size, dtype=np.int32)
        cu[:, 0] = 0
        cu_padded[:, 0] = 0
        indices: list[tuple[int, ...]] = []
        starts_out: list[tuple[int, ...]] = []
        on_rank: list[int] = []
        offsets: list[np.ndarray] = []
        for local, b in enumerate(own):
            members = bins[b]
            starts = np.concatenate([[0], np.cumsum(slots[members])]).astype(np.int64)
            real = np.cumsum(np.concatenate([[0], lengths[members], [bin_size - starts[-1]]]))
            cu[local, : real.size] = real
            cu[local, real.size :] = real[-1]
            bounds = np.append(starts, bin_size)
            cu_padded[local, : bounds.size] = bounds
            cu_padded[local, bounds.size :] = bounds[-1]
            indices.append(tuple(int(i) for i in members))
            starts_out.append(tuple(int(x) for x in starts))
            on_rank.extend(members)
            offsets.append(local * bin_size + starts[:-1])
            bin_of_rollout[members] = local
        if on_rank:
            # one scatter per array: the flat column of every token of every rollout on this rank
            member_array = np.asarray(on_rank, dtype=np.int64)
            n = lengths[member_array]
            first = np.concatenate([[0], np.cumsum(n)[:-1]])
            within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(first, n)
            column = np.repeat(np.concatenate(offsets), n) + within
            tokens.reshape(-1)[column] = np.concatenate([rollouts[i] for i in on_rank])
            positions.reshape(-1)[column] = within
            loss.reshape(-1)[column] = 1.0 if masks is None else np.concatenate([masks[i] for i in on_rank])
            for name, arrays in sides.items():
                side_out[name].reshape(-1)[column] = np.concatenate([arrays[i] for i in on_rank])
            rank_of_rollout[member_array] = rank
        for _ in range(per_rank - len(own)):
            indices.append(())
            starts_out.append(())
        ranks.append(
            RankBins(
                tokens=tokens,
                position_ids=positions,
                loss_mask=loss,
                cu_seqlens=cu,
                cu_seqlens_padded=cu_padded,
                seq_indices=tuple(indices),
                seq_starts=tuple(starts_out),
                token_side=side_out,
                cost=float(bin_costs[own].sum()) + empty_cost * (per_rank - len(own)),
            )
        )
    return RolloutPacking(
        ranks=tuple(ranks),
        bin_size=bin_size,
        seq_length_multiple=int(multiple),
        max_sequences_per_bin=max_sequences_per_bin,
        distribution=distribution,
        fill=fill,
        cost_model=model,
        rank_costs=tuple(r.cost for r in ranks),
        bin_of_rollout=bin_of_rollout,
        rank_of_rollout=rank_of_rollout,
        lengths=lengths,
    )
