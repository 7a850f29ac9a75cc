"""Megatron-LM's DP-balanced sequence-packing scheduler, simulated exactly on the CPU.

With ``sequence_packing_scheduler="dp_balanced"`` Megatron-LM (``DpBalancedScheduler`` in
``megatron/core/datasets/data_schedule.py``, added by PR #6684 on 2026-08-20, after megatron-core 0.16)
packs at run time: the unpacked samples of a global batch, gathered over the data-parallel group in
rank order (lengths padded for CP), are laid into packs in their original order, a pack closing when
the next sample would pass ``max_seqlen_per_dp_cp_rank * CP`` tokens. The pack count is then made a
multiple of DP (times ``microbatch_group_size_per_vp_stage`` with VPP) by moving the last samples of the
last multi-sample packs into packs of their own, and micro-batch ``i`` gives DP rank ``d`` pack
``i * DP + d`` (its CP ranks split it as usual).

This module reproduces that assignment (tested against Megatron-LM's class where the installed
megatron-core has it); it is a re-statement, not a copy.

>>> dp_balanced_packs([300, 500, 200, 400, 100, 600], max_seqlen_per_rank=512, cp=2, dp=2)
[[0, 1, 2], [3], [5], [4]]
"""

from __future__ import annotations

from collections.abc import Sequence

from longpack.errors import ConfigError


def dp_balanced_packs(
    lengths: Sequence[int],
    *,
    max_seqlen_per_rank: int,
    cp: int,
    dp: int,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> list[list[int]]:
    """The packs (lists of sample ids, in micro-batch-major, DP-minor order) of one global batch.

    Pack ``i * dp + d`` runs on DP rank ``d`` in micro-batch ``i``. Samples longer than
    ``max_seqlen_per_rank * cp`` are refused (Megatron would build an over-long pack). Raises
    ``ConfigError`` where Megatron's scheduler asserts (too few samples to fill ``dp`` packs).

    >>> dp_balanced_packs([500, 400, 300, 600, 200], max_seqlen_per_rank=1000, cp=1, dp=2)
    [[0, 1], [2], [4], [3]]

    Megatron never splits the first pack, so a global batch that fits in one pack fails with DP > 1:

    >>> dp_balanced_packs([100, 100, 100], max_seqlen_per_rank=1000, cp=1, dp=2)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: 3 samples cannot fill a multiple of 2 packs (DP x VPP micro-batch group); Megatron-LM's dp_balanced scheduler asserts 'Not enough samples to move'. It needs more samples per global batch: a larger global batch, or more data where the data holds fewer samples than one global batch
    """
    for name, value in (("max_seqlen_per_rank", max_seqlen_per_rank), ("cp", cp), ("dp", dp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}", fields=name)
    limit = max_seqlen_per_rank * cp
    packs: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, n in enumerate(lengths):
        if n > limit:
            raise ConfigError(
                f"sample {i} has {n} tokens, more than max_seqlen_per_dp_cp_rank x CP = "
                f"{max_seqlen_per_rank} x {cp} = {limit}; raise max_seqlen_per_dp_cp_rank or truncate it",
                fields="max_seqlen_per_dp_cp_rank",
            )
        if filled + n <= limit:
            current.append(i)
            filled += n
        else:
            packs.append(current)
            current, filled = [i], n
    if current:
        packs.append(current)
    multiple = dp * (microbatch_group_size_per_vp_stage or 1)
    missing = -len(packs) % multiple
    last = len(packs) - 1
    while missing:
        if last <= 0:
            raise ConfigError(
                f"{len(lengths)} sample{'' if len(lengths) == 1 else 's'} cannot fill a multiple of {multiple} packs (DP x VPP micro-batch "
                "group); Megatron-LM's dp_balanced scheduler asserts 'Not enough samples to move'. It needs more "
                "samples per global batch: a larger global batch, or more data where the data holds fewer samples "
                "than one global batch",
                fields="gbs",
            )
        if len(packs[last]) > 1:
            packs.append([packs[last].pop()])
            missing -= 1
        else:
            last -= 1
    return packs
