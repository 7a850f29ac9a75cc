"""Which samples go into which packed row, in which order (pure numpy; bins from ``longpack.binpack``).

A :class:`PackPlan` is two arrays: ``order`` (the kept-sample positions, row after row) and
``row_offsets`` (row ``j`` holds ``order[row_offsets[j]:row_offsets[j+1]]``). Lengths are runtime tokens.

Rows are ``longpack.binpack.pack_bins``'s bins, so one algorithm name means the same bins and items
everywhere: ``first_fit_shuffle`` reproduces Megatron-Bridge's rows exactly (its shuffle, first fit and
fill step; see ``longpack.binpack.megatron.fill_order``); the other algorithms write rows in bin-id order
with samples in input order inside a row. ``balanced`` (with a ``longpack.balance.BalanceTarget``) writes
``longpack.balance.balanced_pack``'s bins in bin-id order, which is the training order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from longpack import choices
from longpack.errors import ConfigError

if TYPE_CHECKING:
    from longpack.balance import BalanceTarget

MEGATRON_ALGORITHM = choices.MEGATRON_ALGORITHM
DEFAULT_ALGORITHM = choices.DEFAULT_ALGORITHM
#: Workload-balanced rows for a training topology (``plan_rows(..., balance=BalanceTarget(...))``).
BALANCED_ALGORITHM = choices.BALANCED_ALGORITHM


@dataclass(frozen=True, kw_only=True)
class PackPlan:
    """Rows of a packing: ``order`` int64 ``[K]`` and ``row_offsets`` int64 ``[B+1]``."""

    order: np.ndarray
    row_offsets: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1


def plan_rows(
    lengths: np.ndarray,
    pack_size: int,
    *,
    algorithm: str = DEFAULT_ALGORITHM,
    seed: int = 0,
    balance: BalanceTarget | None = None,
) -> PackPlan:
    """Pack runtime ``lengths`` (each in ``1..pack_size``) into rows of at most ``pack_size`` tokens.

    ``algorithm`` is one of ``longpack.binpack.ALGORITHMS`` (rows = ``pack_bins``), or ``"balanced"``
    together with ``balance`` (rows = ``balanced_pack``'s bins in training order). ``first_fit_shuffle``
    also takes zero lengths (one-token samples Megatron-Bridge keeps) and places them as Bridge does.

    >>> p = plan_rows(np.array([3, 5, 2]), 6, algorithm="first_fit_decreasing")
    >>> [p.order[p.row_offsets[j]:p.row_offsets[j + 1]].tolist() for j in range(p.num_rows)]
    [[1], [0, 2]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if pack_size < 1:
        raise ConfigError(f"pack_size must be positive, got {pack_size}")
    if (algorithm == BALANCED_ALGORITHM) != (balance is not None):
        raise ConfigError(
            f"algorithm={BALANCED_ALGORITHM!r} and balance=BalanceTarget(...) go together "
            f"(got algorithm={algorithm!r}, balance={'a target' if balance is not None else None})"
        )
    if len(lengths) == 0:
        return PackPlan(order=np.zeros(0, np.int64), row_offsets=np.zeros(1, np.int64))
    lowest = 0 if algorithm == MEGATRON_ALGORITHM else 1
    if int(lengths.min()) < lowest or int(lengths.max()) > pack_size:
        raise ConfigError(
            f"lengths must lie in {lowest}..{pack_size} (pack size); got {int(lengths.min())}..{int(lengths.max())}"
        )
    from longpack.binpack import BinContents, pack_bins

    if algorithm == MEGATRON_ALGORITHM:
        from longpack.binpack.megatron import first_fit_shuffle_rows

        items, offsets = first_fit_shuffle_rows(lengths, pack_size, seed=seed)
        return PackPlan(order=items, row_offsets=offsets)

    if balance is not None:
        from longpack.balance import balanced_pack

        # Rows are written in bin-id order, which balanced_pack makes the training order.
        bins = BinContents.from_bin_of_item(balanced_pack(lengths, pack_size, balance, seed=seed))
    else:
        bins = pack_bins(lengths, pack_size, algorithm=algorithm, seed=seed)
    return PackPlan(order=bins.items, row_offsets=bins.offsets)


def pack_metadata(lengths: np.ndarray, plan: PackPlan, pack_size: int) -> dict[str, Any]:
    """Megatron-Bridge's per-split pack metadata dict (``create_packing_strategy``), from runtime ``lengths``
    and a plan.

    >>> lengths = np.array([4, 3, 2])
    >>> plan = PackPlan(order=np.array([0, 2, 1]), row_offsets=np.array([0, 2, 3]))
    >>> pack_metadata(lengths, plan, 8)  # doctest: +NORMALIZE_WHITESPACE
    {'dataset_max_seqlen': 4, 'max_samples_per_bin': 2, 'packing_factor': 1.5, 'packing_efficiency': 56.25,
     'pack_size': 8, 'min_packed_seqlen': 3}
    """
    if plan.num_rows == 0:
        raise ConfigError("cannot compute packing metadata of an empty split (no samples left to pack)")
    lengths = np.asarray(lengths, dtype=np.int64)
    row_sums = np.add.reduceat(lengths[plan.order], plan.row_offsets[:-1])
    per_row = np.diff(plan.row_offsets)
    num_bins = plan.num_rows
    return {
        "dataset_max_seqlen": int(lengths.max()),
        "max_samples_per_bin": int(per_row.max()),
        "packing_factor": round(len(lengths) / num_bins, 2),
        "packing_efficiency": round(int(row_sums.sum()) / num_bins / pack_size * 100, 2),
        "pack_size": int(pack_size),
        "min_packed_seqlen": int(row_sums.min()),
    }
