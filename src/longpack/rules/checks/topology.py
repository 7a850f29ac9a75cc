"""Topology: how TP, CP, PP, EP and ETP fit the world size and the model's heads and experts.

The predicates here are what the layout planner prunes its search with.

>>> mp_divides_world(16, tp=2, cp=2, pp=2), mp_divides_world(12, tp=8, cp=1, pp=1)
(True, False)
>>> expert_grid_fits(16, pp=1, ep=16, etp=2), tp_divides(8, tp=4), ep_divides_experts(128, ep=3)
(False, True, False)
"""

from __future__ import annotations

from collections.abc import Iterator

from longpack.rules.checks.common import K_CP, K_EP, K_ETP, K_PP, K_SEQ, K_SP, K_TP, E, V, W
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("topology", "Parallel topology")


# --- predicates (pure; the planner uses them too) ---------------------------------------------------


def mp_divides_world(world_size: int, *, tp: int, cp: int, pp: int) -> bool:
    """Megatron-Core's dense grid: ``TP*CP*PP`` divides the world size (``LP-TOPO-001``)."""
    return world_size % (tp * cp * pp) == 0


def expert_grid_fits(world_size: int, *, pp: int, ep: int, etp: int) -> bool:
    """MoE parallel folding: ``EP*ETP`` divides ``N/PP`` (``LP-TOPO-002``; vacuous when PP does not
    divide N, which ``LP-TOPO-001`` reports)."""
    return world_size % pp != 0 or (world_size // pp) % (ep * etp) == 0


def ep_divides_experts(num_experts: int, *, ep: int) -> bool:
    """Every expert-parallel rank holds the same number of experts (``LP-TOPO-003``)."""
    return num_experts % ep == 0


def tp_divides(heads: int, *, tp: int) -> bool:
    """Attention heads (or KV heads) split evenly over TP (``LP-TOPO-004`` / ``LP-TOPO-005``)."""
    return heads % tp == 0


def kv_heads_fit_tp(kv_heads: int, *, tp: int) -> bool:
    """KV heads a multiple or a divisor of TP (``LP-TOPO-007``): from Megatron-Core 0.16.0 a TP larger
    than the KV heads sub-shards each KV head over ``TP / kv_heads`` ranks.

    >>> kv_heads_fit_tp(8, tp=4), kv_heads_fit_tp(4, tp=8), kv_heads_fit_tp(6, tp=4)
    (True, True, False)
    """
    return kv_heads % tp == 0 or tp % kv_heads == 0


def sp_splits_cp_shard(width: int, *, tp: int, cp: int, sp: bool) -> bool:
    """With sequence parallelism the tokens of each CP rank split over TP (``LP-SP-001``; a width CP does
    not divide is ``LP-CP-001``'s to report).

    >>> sp_splits_cp_shard(8196, tp=4, cp=2, sp=True), sp_splits_cp_shard(8196, tp=4, cp=2, sp=False)
    (False, True)
    """
    if not (sp and tp > 1) or width % cp:
        return True
    return (width // cp) % tp == 0


# --- rules --------------------------------------------------------------------------------------------


@FAMILY.rule(
    "LP-TOPO-001",
    E,
    "world size divisible by TP*CP*PP",
    "MCore parallel_state",
    fix="use a multiple of TP*CP*PP GPUs, or change TP/CP/PP so that their product divides the world size",
)
def world_divisible(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core builds the data-parallel groups from ``N / (TP*CP*PP)``; a remainder stops
    ``initialize_model_parallel``."""
    if s.world_size is None:
        return
    if not mp_divides_world(s.world_size, tp=s.tp, cp=s.cp, pp=s.pp):
        mp = s.tp * s.cp * s.pp
        yield V(
            f"world size {s.world_size} is not divisible by TP*CP*PP = {s.tp}*{s.cp}*{s.pp} = {mp}",
            f"use a multiple of {mp} GPUs, or change TP/CP/PP so that their product divides {s.world_size}",
            K_TP,
            K_CP,
            K_PP,
        )


@FAMILY.rule(
    "LP-TOPO-002",
    E,
    "EP*ETP divides N/PP (MoE parallel folding)",
    "MCore parallel_state",
    fix="lower EP or ETP (model.expert_tensor_parallel_size=1 is usual) so that EP*ETP divides N/PP",
)
def expert_folding(s: TrainingSetup) -> Iterator[Violation]:
    """The expert grid (EP x ETP x expert DP) folds over the ``N/PP`` ranks of one pipeline stage. ETP
    defaults to TP when unset, which often makes ``EP*ETP`` too large."""
    if s.world_size is None or s.world_size % s.pp:
        return
    if not expert_grid_fits(s.world_size, pp=s.pp, ep=s.ep, etp=s.etp):
        per_stage = s.world_size // s.pp
        etp_note = (
            f" (expert_tensor_parallel_size unset, so ETP defaults to TP={s.tp})"
            if s.model.expert_tensor_parallel_size is None
            else ""
        )
        fix = "lower EP or ETP so that EP*ETP divides N/PP"
        if s.etp > 1 and per_stage % s.ep == 0:
            fix = "set model.expert_tensor_parallel_size=1 (experts rarely need TP), " + fix
        yield V(
            f"EP*ETP = {s.ep}*{s.etp} = {s.ep * s.etp} does not divide N/PP = {s.world_size}/{s.pp} = "
            f"{per_stage}{etp_note}",
            fix,
            K_EP,
            K_ETP,
        )


@FAMILY.rule(
    "LP-TOPO-003",
    E,
    "expert count divisible by EP; EP > 1 only for MoE models",
    "MCore",
    fix="choose EP among the divisors of num_moe_experts (EP=1 for a dense model)",
)
def experts_divisible(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core places ``num_moe_experts / EP`` experts on every expert-parallel rank; a dense model
    has nothing to spread over EP."""
    n = s.model.num_moe_experts
    if s.ep > 1 and not n:
        yield V(
            f"expert_model_parallel_size={s.ep} but the model has no experts (num_moe_experts={n})",
            "set model.expert_model_parallel_size=1 for a dense model (or set model.num_moe_experts)",
            K_EP,
            "model.num_moe_experts",
        )
    elif n and not ep_divides_experts(n, ep=s.ep):
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d <= 2 * s.ep][-3:]
        yield V(
            f"num_moe_experts={n} is not divisible by EP={s.ep}",
            f"choose EP among the divisors of {n} (e.g. {', '.join(map(str, divisors))})",
            K_EP,
            "model.num_moe_experts",
        )


@FAMILY.rule(
    "LP-TOPO-004",
    E,
    "attention heads divisible by TP",
    "MCore attention",
    fix="choose a TP that divides model.num_attention_heads",
)
def heads_tp(s: TrainingSetup) -> Iterator[Violation]:
    """Tensor parallelism splits the attention heads; each TP rank needs a whole number of them."""
    h = s.model.num_attention_heads
    if h and not tp_divides(h, tp=s.tp):
        yield V(
            f"num_attention_heads={h} is not divisible by TP={s.tp}",
            f"choose TP dividing {h}",
            K_TP,
            "model.num_attention_heads",
        )


@FAMILY.rule(
    "LP-TOPO-005",
    E,
    "KV heads (num_query_groups) divisible by TP",
    "MCore attention",
    fix="choose a TP that divides model.num_query_groups (spread the rest with CP or PP)",
)
def kv_heads_tp(s: TrainingSetup) -> Iterator[Violation]:
    """With grouped-query attention the KV heads are split over TP as well, so TP must divide them (up to
    Megatron-Core 0.15; 0.16.0 relaxed this to ``LP-TOPO-007``)."""
    g = s.model.num_query_groups
    if g and not tp_divides(g, tp=s.tp):
        yield V(
            f"num_query_groups (KV heads)={g} is not divisible by TP={s.tp}",
            f"choose TP dividing {g} (use CP or PP to spread the rest)",
            K_TP,
            "model.num_query_groups",
        )


@FAMILY.rule(
    "LP-TOPO-007",
    E,
    "KV heads (num_query_groups) a multiple or a divisor of TP",
    "MCore TransformerConfig (QKV sub-sharding)",
    fix="choose a TP that divides model.num_query_groups or is a multiple of it",
)
def kv_heads_fit_tp_rule(s: TrainingSetup) -> Iterator[Violation]:
    """From Megatron-Core 0.16.0 a TP larger than the KV heads is allowed when it is a multiple of them
    (each KV head is sub-sharded over TP / KV ranks); otherwise the heads must still split evenly."""
    g = s.model.num_query_groups
    if g and not kv_heads_fit_tp(g, tp=s.tp):
        yield V(
            f"num_query_groups (KV heads)={g} is neither a multiple nor a divisor of TP={s.tp}",
            f"choose TP dividing {g}, or a multiple of {g} (Megatron-Core >= 0.16.0 sub-shards KV heads)",
            K_TP,
            "model.num_query_groups",
        )


@FAMILY.rule(
    "LP-TOPO-006",
    W,
    "sequence parallelism only with TP > 1",
    "MCore sequence parallelism; Megatron-LM arguments",
    fix="set model.sequence_parallel=false, or raise TP",
)
def sp_needs_tp(s: TrainingSetup) -> Iterator[Violation]:
    """Sequence parallelism shards activations over the TP group; with TP=1 Megatron-LM turns it off, so
    the config does not say what runs."""
    if s.sp and s.tp == 1:
        yield V(
            "sequence_parallel=True with TP=1 does nothing (Megatron-LM turns it off)",
            "set model.sequence_parallel=false, or raise TP",
            K_SP,
            K_TP,
        )


@FAMILY.rule(
    "LP-SP-001",
    E,
    "with SP, tokens per CP rank divisible by TP",
    "MCore sequence parallelism",
    fix="use a sequence length divisible by CP*TP",
)
def sp_tokens(s: TrainingSetup) -> Iterator[Violation]:
    """Sequence parallelism scatters each CP rank's tokens over the TP ranks; the split must be even."""
    width = s.packed_width
    if not width or sp_splits_cp_shard(width, tp=s.tp, cp=s.cp, sp=s.sp):
        return
    local = width // s.cp
    yield V(
        f"with SP, each CP rank's {width}/{s.cp} = {local} tokens must split over TP={s.tp}",
        f"use a sequence length divisible by CP*TP = {s.cp * s.tp}",
        K_SEQ,
        K_TP,
        K_CP,
    )
