"""Parallel layout arithmetic: TP, CP, PP, VPP, EP, ETP, DP, EDP, SP and what follows from them.

Pure Python; no torch. Names follow Megatron-Core (``tensor_model_parallel_size`` = TP, ...).

Example::

    >>> layout = ParallelLayout(world_size=64, tp=2, cp=4, pp=2, ep=8, sp=True)
    >>> layout.dp, layout.edp, layout.pad_seq_to_mult
    (4, 2, 8)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class TopologyError(ValueError):
    """A parallel layout that cannot exist (a size does not divide the world, a size is not positive)."""


def pad_seq_to_mult(*, tp: int = 1, cp: int = 1, sp: bool = False) -> int:
    """Per-sequence alignment multiple for THD packing under CP and SP.

    ``lcm(2*CP if CP>1 else 1, CP*TP if SP and TP>1 else 1)`` (Megatron-Bridge, spec
    ``megatron-packing.md`` §1 and ``energon-thd-cp.md`` §C.2): every CP rank gets two equal chunks of
    every sequence (zigzag), and with SP each CP shard must further split evenly over TP.

    >>> pad_seq_to_mult(tp=1, cp=1), pad_seq_to_mult(cp=4), pad_seq_to_mult(tp=4, cp=2, sp=True)
    (1, 8, 8)
    >>> pad_seq_to_mult(tp=4, sp=True), pad_seq_to_mult(tp=4, sp=False)
    (4, 1)
    """
    for name, value in (("tp", tp), ("cp", cp)):
        if not isinstance(value, int) or value < 1:
            raise TopologyError(f"{name} must be a positive integer, got {value!r}")
    cp_multiple = 2 * cp if cp > 1 else 1
    sp_multiple = cp * tp if sp and tp > 1 else 1
    return math.lcm(cp_multiple, sp_multiple)


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """A Megatron parallel layout on ``world_size`` GPUs.

    Dense layers use ``TP x CP x PP x DP = world_size``. MoE layers use parallel folding:
    ``ETP x EP x PP x EDP = world_size`` (expert DP is independent of CP). ``etp=None`` means
    ``expert_tensor_parallel_size`` defaults to TP, as in Megatron-Core.

    >>> ParallelLayout(world_size=8, tp=2).dp
    4
    >>> ParallelLayout(world_size=8, tp=3)
    Traceback (most recent call last):
    ...
    longpack.topology.TopologyError: world_size=8 is not divisible by TP*CP*PP = 3*1*1 = 3; ...
    """

    world_size: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1
    etp: int | None = None
    sp: bool = False

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "cp", "pp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TopologyError(f"{name} must be a positive integer, got {value!r}")
        if self.vpp is not None and (not isinstance(self.vpp, int) or self.vpp < 1):
            raise TopologyError(f"vpp must be a positive integer or None, got {self.vpp!r}")
        if self.etp is not None and (not isinstance(self.etp, int) or self.etp < 1):
            raise TopologyError(f"etp must be a positive integer or None, got {self.etp!r}")
        if self.vpp is not None and self.vpp > 1 and self.pp == 1:
            raise TopologyError(
                f"vpp={self.vpp} needs pipeline parallelism (pp > 1); set vpp=None or raise pp"
            )
        dense = self.tp * self.cp * self.pp
        if self.world_size % dense:
            raise TopologyError(
                f"world_size={self.world_size} is not divisible by TP*CP*PP = "
                f"{self.tp}*{self.cp}*{self.pp} = {dense}; choose sizes whose product divides the GPU count"
            )
        expert = self.expert_tp * self.ep * self.pp
        if self.world_size % expert:
            raise TopologyError(
                f"world_size={self.world_size} is not divisible by ETP*EP*PP = "
                f"{self.expert_tp}*{self.ep}*{self.pp} = {expert}; choose an EP (and ETP) whose product "
                "with PP divides the GPU count"
            )

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size (ETP); defaults to TP as in Megatron-Core."""
        return self.tp if self.etp is None else self.etp

    @property
    def dp(self) -> int:
        """Dense data-parallel size: ``world_size / (TP*CP*PP)``."""
        return self.world_size // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        """Expert data-parallel size with MoE parallel folding: ``world_size / (ETP*EP*PP)``."""
        return self.world_size // (self.expert_tp * self.ep * self.pp)

    @property
    def model_parallel_size(self) -> int:
        """GPUs that hold one dense model replica: ``TP*CP*PP``."""
        return self.tp * self.cp * self.pp

    @property
    def pad_seq_to_mult(self) -> int:
        """Per-sequence alignment multiple this layout needs for THD packing."""
        return pad_seq_to_mult(tp=self.tp, cp=self.cp, sp=self.sp)
