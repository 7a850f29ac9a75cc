"""Training-step simulator: per-pack costs -> step times under data and pipeline parallelism.

The model of a step (pure numpy; no I/O, no torch):

* Packs are consumed in order: pack ``k`` is the ``k``-th row the data loader reads. Global batch ``s``
  holds packs ``s·GBS .. (s+1)·GBS - 1``; ``pack_slots`` says which DP rank and micro-batch each one
  lands on (Megatron's samplers, see there). A micro-batch of ``MBS`` packs costs the sum of its packs.
* A pack's cost is the forward+backward time of the whole model on it. With PP ``p`` and VPP ``v`` every
  virtual stage gets ``cost / (p·v)`` of it, ``forward_fraction`` (default 1/3: one GEMM forward, two
  backward) in the forward pass and the rest in the backward pass.
* Each DP rank runs its micro-batches through Megatron's pipeline schedule: 1F1B (warm-up forwards,
  steady one-forward-one-backward, cool-down backwards) or interleaved 1F1B with ``v`` model chunks per
  stage. An operation starts when the stage is free and its input has arrived (forward: same micro-batch
  on the previous virtual stage; backward: the next virtual stage, or its own forward on the last one).
  Communication is not modelled (free and overlapped).
* The step ends when the slowest DP rank's pipeline drains (gradient all-reduce is a barrier).
* The **ideal** step gives every micro-batch of the step the same cost (the step's mean): the time the
  step would take if its work were perfectly balanced over ranks and micro-batches. It follows the
  bubble formula (docs/reference/planner-model.md#pipeline-bubble): ``(m + p - 1)·(t_f + t_b)`` for 1F1B.

Every time is a max-plus expression of the durations, so adding work to any pack never shortens a step.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack import choices
from longpack.errors import ConfigError

SCHEDULES = choices.SCHEDULES
SAMPLERS = choices.SAMPLERS


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def micro_batches_per_rank(*, dp: int, gbs: int, micro_batch_size: int = 1) -> int:
    """``m = GBS / (MBS·DP)``; raises like Megatron's samplers when it is not a whole number.

    >>> micro_batches_per_rank(dp=8, gbs=128, micro_batch_size=2)
    8
    """
    dp, gbs, mbs = (
        _positive_int(n, v) for n, v in (("dp", dp), ("gbs", gbs), ("micro_batch_size", micro_batch_size))
    )
    if gbs % (mbs * dp):
        raise ConfigError(
            f"gbs={gbs} is not divisible by micro_batch_size*dp = {mbs}*{dp} = {mbs * dp}; Megatron's "
            "samplers refuse this too. Choose a global batch that is a multiple of MBS*DP"
        )
    return gbs // (mbs * dp)


@dataclass(frozen=True, kw_only=True)
class PackSlots:
    """Where each pack of a training-ordered sequence runs: ``step[k]``, ``rank[k]``, ``micro_batch[k]``."""

    step: np.ndarray
    rank: np.ndarray
    micro_batch: np.ndarray


def _slot_table(*, dp: int, gbs: int, micro_batch_size: int, sampler: str) -> tuple[np.ndarray, np.ndarray]:
    """(rank, micro-batch) of each position 0..GBS-1 inside one global batch."""
    m = micro_batches_per_rank(dp=dp, gbs=gbs, micro_batch_size=micro_batch_size)
    del m
    p = np.arange(gbs, dtype=np.int64)
    if sampler == choices.BATCH_SAMPLER:
        # Megatron-Bridge MegatronPretrainingBatchSampler: rank r reads rows r, r+DP, r+2·DP, ... of the
        # global batch; the training loop then cuts that list into micro-batches of MBS rows in order.
        return p % dp, (p // dp) // micro_batch_size
    if sampler == choices.SINGLE_SAMPLER:
        # Megatron-LM MegatronPretrainingSampler: every MBS·DP consecutive rows form one micro-batch
        # round; rank r reads rows [r·MBS, (r+1)·MBS) of the round.
        return (p % (micro_batch_size * dp)) // micro_batch_size, p // (micro_batch_size * dp)
    raise ConfigError(f"unknown sampler {sampler!r}; choose one of {SAMPLERS}")


def pack_slots(
    num_packs: int, *, dp: int, gbs: int, micro_batch_size: int = 1, sampler: str = choices.BATCH_SAMPLER
) -> PackSlots:
    """Global batch (step), DP rank and micro-batch of each pack, for packs read in file order.

    ``sampler="batch"`` is Megatron-Bridge's ``MegatronPretrainingBatchSampler`` (``dataloader_type=
    "batch"``, the GPT-SFT default; Megatron-Bridge ``src/megatron/bridge/data/samplers.py`` @869bb397):
    rank ``r`` gets rows ``r, r+DP, ...`` of each global batch, split into micro-batches in that order.
    ``sampler="single"`` is Megatron-LM's ``MegatronPretrainingSampler`` (``megatron/training/datasets/
    data_samplers.py`` @cd55b7a2): rounds of ``MBS·DP`` consecutive rows, rank ``r`` takes rows
    ``[r·MBS, (r+1)·MBS)`` of each round. Both agree when ``MBS == 1``. Samplers that shuffle rows
    (``dataloader_type="cyclic"``) destroy any order written to the file.

    >>> s = pack_slots(8, dp=2, gbs=4, micro_batch_size=2)
    >>> s.step.tolist(), s.rank.tolist(), s.micro_batch.tolist()
    ([0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0, 0, 0])
    >>> pack_slots(4, dp=2, gbs=4, micro_batch_size=2, sampler="single").rank.tolist()
    [0, 0, 1, 1]
    """
    rank_of, mb_of = _slot_table(dp=dp, gbs=gbs, micro_batch_size=micro_batch_size, sampler=sampler)
    k = np.arange(int(num_packs), dtype=np.int64)
    return PackSlots(step=k // gbs, rank=rank_of[k % gbs], micro_batch=mb_of[k % gbs])


def positions_for_slots(
    *, dp: int, gbs: int, micro_batch_size: int = 1, sampler: str = choices.BATCH_SAMPLER
) -> np.ndarray:
    """``pos[rank, micro_batch, j]``: position inside a global batch of the ``j``-th pack of that micro-batch.

    The inverse of ``pack_slots`` within one global batch: write a pack at ``step·GBS + pos[r, i, j]``
    and the sampler hands it to rank ``r`` as part of micro-batch ``i``.

    >>> positions_for_slots(dp=2, gbs=4).tolist()
    [[[0], [2]], [[1], [3]]]
    """
    rank_of, mb_of = _slot_table(dp=dp, gbs=gbs, micro_batch_size=micro_batch_size, sampler=sampler)
    m = gbs // (micro_batch_size * dp)
    out = np.empty((dp, m, micro_batch_size), dtype=np.int64)
    fill = np.zeros((dp, m), dtype=np.int64)
    for p in range(gbs):
        r, i = rank_of[p], mb_of[p]
        out[r, i, fill[r, i]] = p
        fill[r, i] += 1
    return out


@dataclass(frozen=True)
class _Program:
    """A pipeline schedule as a topologically ordered list of operations (shared by all ranks and steps)."""

    micro_batch: np.ndarray  # [ops] micro-batch of each op
    is_forward: np.ndarray  # [ops] bool
    prev_on_stage: np.ndarray  # [ops] index of the op before it on the same stage, -1 if first
    dependency: np.ndarray  # [ops] index of the op whose output it needs, -1 if none
    num_ops: int


def _stage_orders(pp: int, vpp: int, m: int, schedule: str) -> list[list[tuple[bool, int, int]]]:
    """Per stage, the ordered ops ``(is_forward, chunk, micro_batch)`` of Megatron's schedule."""
    orders: list[list[tuple[bool, int, int]]] = []
    if schedule == choices.SCHEDULE_1F1B:
        for stage in range(pp):
            warm = min(pp - stage - 1, m)
            ops = [(True, 0, j) for j in range(warm)]
            for i in range(m - warm):
                ops += [(True, 0, warm + i), (False, 0, i)]
            ops += [(False, 0, j) for j in range(m - warm, m)]
            orders.append(ops)
        return orders
    total = m * vpp

    def chunk_of(k: int, forward: bool) -> int:
        chunk = (k % (pp * vpp)) // pp
        return chunk if forward else vpp - 1 - chunk

    def mb_of(k: int) -> int:
        return (k // (pp * vpp)) * pp + k % pp

    for stage in range(pp):
        # Megatron-Core forward_backward_pipelining_with_interleaving: when m == pp every forward is a
        # warm-up forward; otherwise (p - rank - 1)·2 + (v - 1)·p of them.
        warm = total if m == pp else min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
        ops = [(True, chunk_of(k, True), mb_of(k)) for k in range(warm)]
        for i in range(total - warm):
            k = warm + i
            ops += [(True, chunk_of(k, True), mb_of(k)), (False, chunk_of(i, False), mb_of(i))]
        ops += [(False, chunk_of(k, False), mb_of(k)) for k in range(total - warm, total)]
        orders.append(ops)
    return orders


@functools.lru_cache(maxsize=64)
def _program(pp: int, vpp: int, m: int, schedule: str) -> _Program:
    orders = _stage_orders(pp, vpp, m, schedule)
    nv = pp * vpp
    ids: dict[tuple[bool, int, int], int] = {}  # (forward, virtual stage, micro-batch) -> op id
    stage_of: list[int] = []
    records: list[tuple[bool, int, int]] = []
    for stage, ops in enumerate(orders):
        for fwd, chunk, mb in ops:
            ids[(fwd, chunk * pp + stage, mb)] = len(records)
            records.append((fwd, chunk * pp + stage, mb))
            stage_of.append(stage)
    n = len(records)
    prev = np.full(n, -1, dtype=np.int64)
    dep = np.full(n, -1, dtype=np.int64)
    last_on_stage: dict[int, int] = {}
    for op, st in enumerate(stage_of):
        prev[op] = last_on_stage.get(st, -1)
        last_on_stage[st] = op
    for op, (fwd, vs, mb) in enumerate(records):
        if fwd:
            dep[op] = ids[(True, vs - 1, mb)] if vs > 0 else -1
        else:
            dep[op] = ids[(False, vs + 1, mb)] if vs < nv - 1 else ids[(True, vs, mb)]
    # Kahn's algorithm: an evaluation order in which every op comes after both of its predecessors.
    indeg = (prev >= 0).astype(np.int64) + (dep >= 0).astype(np.int64)
    succ: list[list[int]] = [[] for _ in range(n)]
    for op in range(n):
        for pre in (prev[op], dep[op]):
            if pre >= 0:
                succ[pre].append(op)
    queue = deque(int(i) for i in np.flatnonzero(indeg == 0))
    topo: list[int] = []
    while queue:
        op = queue.popleft()
        topo.append(op)
        for nxt in succ[op]:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                queue.append(nxt)
    if len(topo) != n:  # pragma: no cover - the schedules above are deadlock-free
        raise RuntimeError(f"pipeline schedule {schedule} pp={pp} vpp={vpp} m={m} deadlocks")
    order = np.array(topo, dtype=np.int64)
    rank_in_topo = np.empty(n, dtype=np.int64)
    rank_in_topo[order] = np.arange(n)
    remap = np.append(rank_in_topo, -1)  # index -1 stays -1
    return _Program(
        micro_batch=np.array([records[i][2] for i in order], dtype=np.int64),
        is_forward=np.array([records[i][0] for i in order], dtype=bool),
        prev_on_stage=remap[prev[order]],
        dependency=remap[dep[order]],
        num_ops=n,
    )


def pipeline_makespan(
    micro_batch_costs: Any,
    *,
    pp: int,
    schedule: str = choices.SCHEDULE_1F1B,
    vpp: int = 1,
    forward_fraction: float = 1.0 / 3.0,
) -> np.ndarray:
    """Time for one pipeline to run its micro-batches; ``micro_batch_costs[..., m]`` (leading dims batch).

    >>> pipeline_makespan([3.0, 3.0, 3.0, 3.0], pp=2).item()  # (m + p - 1)·(t_f + t_b) = 5·1.5
    7.5
    >>> pipeline_makespan([3.0, 3.0, 3.0, 3.0], pp=1).item()  # no pipeline: just the sum
    12.0
    """
    pp, vpp = _positive_int("pp", pp), _positive_int("vpp", vpp)
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")
    if not 0.0 < forward_fraction < 1.0:
        raise ConfigError(f"forward_fraction must be in (0, 1), got {forward_fraction!r}")
    costs = np.asarray(micro_batch_costs, dtype=np.float64)
    m = costs.shape[-1]
    if m < 1:
        raise ConfigError("need at least one micro-batch per rank")
    if schedule == choices.SCHEDULE_1F1B and vpp != 1:
        raise ConfigError(f"vpp={vpp} needs schedule='interleaved'; 1F1B runs one model chunk per stage")
    if schedule == choices.SCHEDULE_INTERLEAVED and m % pp:
        raise ConfigError(
            f"the interleaved schedule needs micro-batches per rank (m={m}) to be a multiple of pp={pp} "
            "(Megatron-Core's requirement); raise the global batch or use schedule='1f1b'"
        )
    prog = _program(pp, vpp, m, schedule)
    lead = costs.shape[:-1]
    flat = costs.reshape(-1, m)
    share = np.where(prog.is_forward, forward_fraction, 1.0 - forward_fraction) / (pp * vpp)
    end = np.zeros((prog.num_ops + 1, flat.shape[0]), dtype=np.float64)  # row -1 = "nothing": time 0
    mb_cost_t = flat.T  # [m, batch]
    for op in range(prog.num_ops):
        start = np.maximum(end[prog.prev_on_stage[op]], end[prog.dependency[op]])
        end[op] = start + share[op] * mb_cost_t[prog.micro_batch[op]]
    return end[: prog.num_ops].max(axis=0).reshape(lead)


@dataclass(frozen=True, kw_only=True)
class ScheduleResult:
    """Simulated steps. Times are in the unit of the pack costs.

    - ``step_times[s]``: step ``s`` (slowest DP rank's pipeline); ``ideal_step_times[s]``: same work,
      perfectly balanced; ``rank_work[s, r]``: summed pack cost on rank ``r``;
      ``micro_batch_costs[s, r, i]``: cost of micro-batch ``i`` of rank ``r``.
    - The last step may be partial (fewer than GBS packs); its missing micro-batches cost 0.
    """

    step_times: np.ndarray
    ideal_step_times: np.ndarray
    rank_work: np.ndarray
    micro_batch_costs: np.ndarray
    dp: int
    pp: int
    gbs: int

    @property
    def num_steps(self) -> int:
        """Number of (possibly partial) global batches."""
        return len(self.step_times)

    @property
    def total_time(self) -> float:
        """Sum of step times: the time for one pass over all packs."""
        return float(self.step_times.sum())

    @property
    def ideal_time(self) -> float:
        """Sum of ideal step times."""
        return float(self.ideal_step_times.sum())

    @property
    def efficiency(self) -> float:
        """``ideal_time / total_time`` (1.0 = perfectly balanced)."""
        return self.ideal_time / self.total_time if self.total_time > 0 else 1.0

    @property
    def rank_imbalance(self) -> np.ndarray:
        """Per step, ``max(rank_work) / mean(rank_work)`` (1.0 = every rank got the same work)."""
        mean = self.rank_work.mean(axis=1)
        return np.divide(self.rank_work.max(axis=1), mean, out=np.ones_like(mean), where=mean > 0)


def simulate_schedule(
    pack_costs: Any,
    *,
    dp: int,
    pp: int,
    gbs: int,
    micro_batch_size: int = 1,
    schedule: str = choices.SCHEDULE_1F1B,
    vpp: int = 1,
    sampler: str = choices.BATCH_SAMPLER,
    forward_fraction: float = 1.0 / 3.0,
) -> ScheduleResult:
    """Simulate training steps over packs consumed in order (see the module docstring for the model).

    ``pack_costs[k]`` is the forward+backward time of the whole model on the ``k``-th pack read.

    >>> r = simulate_schedule([4.0, 4.0, 1.0, 1.0], dp=2, pp=1, gbs=4)
    >>> r.rank_work.tolist(), r.step_times.tolist(), r.ideal_step_times.tolist()
    ([[5.0, 5.0]], [5.0], [5.0])
    >>> simulate_schedule([4.0, 1.0, 4.0, 1.0], dp=2, pp=1, gbs=4).step_times.tolist()  # rank 0: 4 + 4
    [8.0]
    """
    dp, pp, gbs = _positive_int("dp", dp), _positive_int("pp", pp), _positive_int("gbs", gbs)
    mbs = _positive_int("micro_batch_size", micro_batch_size)
    m = micro_batches_per_rank(dp=dp, gbs=gbs, micro_batch_size=mbs)
    costs = np.asarray(pack_costs, dtype=np.float64)
    if costs.ndim != 1:
        raise ConfigError(f"pack_costs must be 1-D (one cost per pack), got shape {costs.shape}")
    if costs.size and (not np.isfinite(costs).all() or costs.min() < 0):
        bad = int(np.flatnonzero(~np.isfinite(costs) | (costs < 0))[0])
        raise ConfigError(f"pack_costs[{bad}] = {costs[bad]!r}; costs must be finite and >= 0")
    steps = max(1, -(-costs.size // gbs))
    padded = np.zeros(steps * gbs, dtype=np.float64)
    padded[: costs.size] = costs
    pos = positions_for_slots(dp=dp, gbs=gbs, micro_batch_size=mbs, sampler=sampler)  # [dp, m, mbs]
    per_step = padded.reshape(steps, gbs)
    mb_costs = per_step[:, pos].sum(axis=-1)  # [steps, dp, m]
    step_times = pipeline_makespan(
        mb_costs, pp=pp, schedule=schedule, vpp=vpp, forward_fraction=forward_fraction
    ).max(axis=1)
    unit = float(
        pipeline_makespan(np.ones(m), pp=pp, schedule=schedule, vpp=vpp, forward_fraction=forward_fraction)
    )
    ideal = per_step.sum(axis=1) / (dp * m) * unit
    return ScheduleResult(
        step_times=step_times,
        ideal_step_times=ideal,
        rank_work=mb_costs.sum(axis=2),
        micro_batch_costs=mb_costs,
        dp=dp,
        pp=pp,
        gbs=gbs,
    )
