"""Which CP groups Megatron-Core builds for hybrid / dynamic CP, and whether a schedule fits them.

Hybrid and dynamic context parallelism run each sub-sample on ``k`` of the DP x CP ranks. Megatron-Core
creates the process groups for those ``k`` once, at start-up, and a schedule that puts a sub-sample on
ranks that do not form one of those groups cannot run:

* hybrid CP (``create_hybrid_dp_cp_groups`` in ``megatron/core/parallel_state.py``, Megatron-LM
  main @d98e8a64dd): for every power of two ``2 <= k < 2**floor(log2 N)`` the groups
  ``ranks[0:k], ranks[k:2k], ...``, plus the whole DP x CP group of ``N`` ranks
  (``get_hybrid_data_context_parallel_groups`` returns it for ``k == N``); ``k == 1`` needs no group;
* dynamic CP (``create_dynamic_dp_cp_groups``, Megatron-LM dev @d48bd6be0a): the same blocks for every
  power of two ``min_dynamic_context_parallel_size <= k < 2**floor(log2 N)`` (``k = 1`` included when the
  minimum is 1), plus the whole group.

Both assert an even ``N`` ("Hybrid/Dynamic context parallel requires an even number of ranks"). A
sub-sample on ``k`` ranks is therefore runnable only when ``k`` is one of those sizes and its ranks are
``r, r+1, ..., r+k-1`` with ``r`` a multiple of ``k`` and ``r + k <= N`` (a trailing block shorter than
``k``, as ``ranks[8:12]`` of 10 ranks, has fewer than ``k`` members).

>>> cp_group_sizes(12)
(1, 2, 4, 12)
>>> cp_group_sizes(16, scheme="dynamic", min_cp_size=2)
(2, 4, 8, 16)
>>> block_reason([2, 3, 4, 5], 8, cp_group_sizes(8)) is not None
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from longpack.errors import ConfigError

__all__ = ["InfeasibleCPSchedule", "block_reason", "cp_group_sizes", "even_ranks_reason", "schedule_reason"]

#: Megatron's scheme names, as ``parallel_state`` names its group kinds.
SCHEMES = ("hybrid", "dynamic")


class InfeasibleCPSchedule(ConfigError):
    """Megatron-Core cannot run this CP schedule (its scheduler fails on the lengths, or a sub-sample lands
    on ranks with no process group). ``mode``: the CP mode (``hybrid`` / ``dynamic_cp`` / ``dp_balanced``)."""

    def __init__(self, *args: object, mode: str, fields: str | tuple[str, ...] = ()) -> None:
        super().__init__(*args, fields=fields)
        self.mode = mode

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild, (str(self), self.mode, self.fields))


def _rebuild(message: str, mode: str, fields: tuple[str, ...]) -> InfeasibleCPSchedule:
    return InfeasibleCPSchedule(message, mode=mode, fields=fields)


def _floor_log2(n: int) -> int:
    return n.bit_length() - 1


def cp_group_sizes(dp_cp_size: int, *, scheme: str = "hybrid", min_cp_size: int = 1) -> tuple[int, ...]:
    """The sub-sample widths Megatron-Core has process groups for on ``dp_cp_size`` ranks (see the module
    docstring). ``int(log2(N))`` in Megatron equals ``floor(log2 N)`` for every ``N`` up to 2**48."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    top = _floor_log2(dp_cp_size)
    if scheme == "hybrid":
        sizes = {1, *(2**i for i in range(1, top))}
    else:
        sizes = {2**i for i in range(top) if 2**i >= min_cp_size}
    sizes.add(dp_cp_size)
    return tuple(sorted(sizes))


def even_ranks_reason(dp: int, cp: int, *, scheme: str = "hybrid") -> str | None:
    """Megatron-Core's start-up assert on an odd DP x CP, as a reason (``None`` when even)."""
    if (dp * cp) % 2 == 0:
        return None
    name = "Hybrid" if scheme == "hybrid" else "Dynamic"
    return (
        f"DP x CP = {dp} x {cp} = {dp * cp} ranks: Megatron-Core asserts '{name} context parallel requires an "
        "even number of ranks'; choose an even DP x CP"
    )


def block_reason(ranks: Sequence[int], dp_cp_size: int, sizes: Sequence[int]) -> str | None:
    """Why a sub-sample on ``ranks`` has no process group (a clause to follow "on"), or ``None`` when it has one.

    >>> block_reason([4, 5, 6, 7], 6, cp_group_sizes(6))
    '4 ranks (4-7) of 6, but Megatron-Core builds CP groups of 1, 2, 6 ranks only'
    """
    k = len(ranks)
    first = ranks[0]
    if list(ranks) != list(range(first, first + k)):
        return f"ranks {list(ranks)} of {dp_cp_size}, which are not consecutive"
    if k not in sizes:
        return (
            f"{k} ranks ({first}-{first + k - 1}) of {dp_cp_size}, but Megatron-Core builds CP groups of "
            f"{', '.join(map(str, sizes))} ranks only"
        )
    if k == 1 or k == dp_cp_size:
        return None
    if first % k or first + k > dp_cp_size:
        return (
            f"ranks {first}-{first + k - 1} of {dp_cp_size}, which are not one of Megatron-Core's {k}-rank CP "
            f"groups (those start at multiples of {k})"
        )
    return None


def schedule_reason(
    micro_batches: Iterable[Sequence[Sequence[int]]], dp_cp_size: int, sizes: Sequence[int]
) -> str | None:
    """The first sub-sample of a schedule that has no process group, as a reason; ``None`` when all have one.

    ``micro_batches``: per group (hybrid) or micro-batch (dynamic), the sample ids of every rank.

    >>> schedule_reason([[[0], [0], [1], [1]]], 4, cp_group_sizes(4))
    >>> schedule_reason([[[0], [1], [1], [2]]], 4, cp_group_sizes(4))
    "sub-sample 1 on ranks 1-2 of 4, which are not one of Megatron-Core's 2-rank CP groups (those start at multiples of 2)"
    """
    for ids_per_rank in micro_batches:
        where: dict[int, list[int]] = {}
        for rank, ids in enumerate(ids_per_rank):
            for sid in ids:
                where.setdefault(int(sid), []).append(rank)
        for sid, ranks in where.items():
            reason = block_reason(ranks, dp_cp_size, sizes)
            if reason is not None:
                return f"sub-sample {sid} on {reason}"
    return None
