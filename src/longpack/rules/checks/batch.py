"""Batch sizes: the global batch against micro-batch size and data parallelism, for training and eval.

>>> gbs_divisible(12, mbs=1, dp=4), gbs_divisible(10, mbs=1, dp=4), gbs_covers_dp(2, mbs=1, dp=4)
(True, False, False)
"""

from __future__ import annotations

from collections.abc import Iterator

from longpack.rules.checks.common import K_GBS, K_MBS, E, V
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("batch", "Batch sizes")


def gbs_divisible(gbs: int, *, mbs: int, dp: int) -> bool:
    """A global batch of at least one micro-batch per DP rank is a whole number of ``MBS*DP``
    (``LP-BATCH-001``; smaller batches are ``LP-BATCH-002``'s)."""
    unit = mbs * dp
    return gbs < unit or gbs % unit == 0


def gbs_covers_dp(gbs: int, *, mbs: int, dp: int) -> bool:
    """Every data-parallel rank gets a micro-batch: ``GBS >= MBS*DP`` (``LP-BATCH-002``)."""
    return not 0 < gbs < mbs * dp


@FAMILY.rule(
    "LP-BATCH-001",
    E,
    "GBS divisible by MBS*DP",
    "Bridge batch sampler; MCore microbatch calculator",
    fix="use a train.global_batch_size that is a multiple of MBS*DP",
)
def gbs_divisible_rule(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron's sampler and micro-batch calculator split the global batch into micro-batches of MBS per
    data-parallel rank; a remainder is a start-up error."""
    dp, gbs = s.dp, s.global_batch_size
    if dp is None or gbs is None or s.micro_batch_size < 1:
        return
    if not gbs_divisible(gbs, mbs=s.micro_batch_size, dp=dp):
        unit = s.micro_batch_size * dp
        yield V(
            f"global_batch_size={gbs} is not divisible by MBS*DP = {s.micro_batch_size}*{dp} = {unit}",
            f"use GBS = {(gbs // unit) * unit} or {(gbs // unit + 1) * unit}",
            K_GBS,
            K_MBS,
        )


@FAMILY.rule(
    "LP-BATCH-002",
    E,
    "GBS >= MBS*DP (every data-parallel rank gets a microbatch)",
    "Bridge batch sampler; Bridge docs (recommended settings)",
    fix="raise train.global_batch_size to a multiple of MBS*DP, or lower DP",
)
def gbs_at_least_dp(s: TrainingSetup) -> Iterator[Violation]:
    """A global batch smaller than one micro-batch per data-parallel rank leaves some ranks without data."""
    dp, gbs = s.dp, s.global_batch_size
    if dp is None or gbs is None or s.micro_batch_size < 1:
        return
    if not gbs_covers_dp(gbs, mbs=s.micro_batch_size, dp=dp):
        unit = s.micro_batch_size * dp
        yield V(
            f"global_batch_size={gbs} < MBS*DP = {s.micro_batch_size}*{dp} = {unit}: some data-parallel "
            "ranks would get no sample",
            f"raise train.global_batch_size to a multiple of {unit}, or lower DP (more TP/CP/PP or fewer GPUs)",
            K_GBS,
        )


@FAMILY.rule(
    "LP-BATCH-003",
    E,
    "eval GBS divisible by eval MBS * eval DP",
    "Bridge ConfigContainer.validate",
    fix="set validation.eval_global_batch_size to a multiple of eval MBS * eval DP",
)
def eval_gbs(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge asserts the evaluation batch (defaults: the training GBS and MBS, and the training CP
    unless ``dist.eval_context_parallel_size`` is set) splits evenly over the evaluation DP ranks."""
    if (
        s.eval_global_batch_size is None
        and s.eval_micro_batch_size is None
        and s.eval_context_parallel_size is None
    ):
        return
    if s.world_size is None:
        return
    gbs = s.eval_global_batch_size or s.global_batch_size
    mbs = s.eval_micro_batch_size or s.micro_batch_size
    cp = s.eval_context_parallel_size or s.cp
    mp = s.tp * cp * s.pp
    if gbs is None or s.world_size % mp or mbs < 1:
        return
    dp = s.world_size // mp
    if gbs % (mbs * dp):
        yield V(
            f"eval global batch {gbs} is not divisible by eval MBS*DP = {mbs}*{dp} = {mbs * dp}",
            f"set validation.eval_global_batch_size to a multiple of {mbs * dp}",
            "validation.eval_global_batch_size",
            "validation.eval_micro_batch_size",
        )
