"""Hybrid context parallelism and the DP-balanced sequence-packing scheduler (Megatron-Core).

Hybrid CP (``model.hybrid_context_parallel``) reschedules the packed sub-samples of a global batch over
the DP x CP ranks, each sample on as few ranks as its length needs: ``2**ceil(log2(L / cap))`` ranks for a
sample of ``L`` tokens with ``cap = model.max_seqlen_per_dp_cp_rank`` (Megatron-Core
``BalancedCPScheduler.gpus_needed``). Megatron-LM's argument checks allow it only without pipeline
parallelism, CUDA graphs or Megatron FSDP, with the ``single`` data loader and per-token loss. The
DP-balanced scheduler (``model.sequence_packing_scheduler="dp_balanced"``, ``wrap_data_iterator``) packs
samples in order up to ``cap * CP`` tokens and makes the pack count a multiple of DP.

>>> ranks_needed(32768, 4096), ranks_needed(100, 4096), ranks_needed(12288, 4096)
(8, 1, 4)
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from longpack.rules.checks.common import K_CGI, K_CP, K_GBS, K_PP, K_PSM, K_PTL, K_SEQ, E, V, W
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation
from longpack.rules.scheduling_keys import K_CAP, K_HCP, K_SCHED
from longpack.rules.scheduling_keys import PACKING_SCHEDULERS as _SCHEDULERS_BY_VERSION
from longpack.topology import pad_seq_to_mult, ranks_needed

FAMILY = RuleFamily("hybrid_cp", "Hybrid context parallelism and packing schedulers")

K_MBG = "model.microbatch_group_size_per_vp_stage"
K_FSDP = "ddp.use_megatron_fsdp"
K_DLT = "dataset.dataloader_type"
#: Megatron-Core's packing schedulers (``scheduler_map`` in ``megatron/core/datasets/data_schedule.py``:
#: ``dp_balanced`` on main, ``default_dynamic_cp`` too on dev @d48bd6be0a), from the one list.
PACKING_SCHEDULERS = tuple(name for name, _ in _SCHEDULERS_BY_VERSION)


def _width(s: TrainingSetup) -> int | None:
    """The longest sample the schedulers can see: the packed width, else the sequence length."""
    return s.packed_width or s.model_seq_length


def _hybrid(s: TrainingSetup) -> bool:
    return s.model.hybrid_context_parallel


def _dp_balanced(s: TrainingSetup) -> bool:
    """The DP-balanced scheduler's own rules; dynamic CP's scheduler (``default_dynamic_cp``) replaces its
    packing (``DefaultDynamicCPScheduler.get_groups_and_subsamples``, Megatron-LM dev @d48bd6be0a)."""
    name = s.model.sequence_packing_scheduler
    return bool(name) and str(name).lower() == "dp_balanced"


def _cap(s: TrainingSetup) -> int | None:
    cap = s.model.max_seqlen_per_dp_cp_rank
    return cap if cap is not None and cap > 0 else None


@FAMILY.rule(
    "LP-HCP-001",
    E,
    "hybrid context parallelism without pipeline parallelism",
    "Megatron-LM arguments (hybrid CP)",
    fix="set model.pipeline_model_parallel_size=1, or model.hybrid_context_parallel=false",
)
def hcp_no_pp(s: TrainingSetup) -> Iterator[Violation]:
    """The hybrid-CP scheduler regroups DP x CP ranks per micro-batch, which a pipeline schedule cannot follow."""
    if _hybrid(s) and s.pp > 1:
        yield V(
            f"hybrid_context_parallel with pipeline_model_parallel_size={s.pp}: Megatron-LM refuses hybrid CP "
            "with pipeline parallelism",
            "set model.pipeline_model_parallel_size=1 (fold the ranks into DP/CP), or turn hybrid CP off",
            K_HCP,
            K_PP,
        )


@FAMILY.rule(
    "LP-HCP-002",
    E,
    "hybrid context parallelism without CUDA graphs",
    "Megatron-LM arguments (hybrid CP)",
    fix="set model.cuda_graph_impl=none, or model.hybrid_context_parallel=false",
)
def hcp_no_graphs(s: TrainingSetup) -> Iterator[Violation]:
    """Per-micro-batch CP groups and sample lengths change every step: nothing a graph can replay."""
    if _hybrid(s) and s.model.training_cuda_graph:
        yield V(
            f"hybrid_context_parallel with CUDA graphs (cuda_graph_impl={s.model.cuda_graph_impl}"
            f"{', enable_cuda_graph' if s.model.enable_cuda_graph else ''}): Megatron-LM refuses the pair",
            "set model.cuda_graph_impl=none (and enable_cuda_graph=false), or turn hybrid CP off",
            K_HCP,
            K_CGI,
        )


@FAMILY.rule(
    "LP-HCP-003",
    E,
    "hybrid context parallelism needs calculate_per_token_loss=True",
    "Megatron-LM arguments (hybrid CP)",
    fix="set model.calculate_per_token_loss=true",
)
def hcp_per_token_loss(s: TrainingSetup) -> Iterator[Violation]:
    """Ranks hold different numbers of sub-samples and tokens; only a per-token loss sums them right."""
    if _hybrid(s) and not s.model.calculate_per_token_loss:
        yield V(
            "hybrid_context_parallel without calculate_per_token_loss: ranks carry unequal token counts",
            "set model.calculate_per_token_loss=true",
            K_HCP,
            K_PTL,
        )


@FAMILY.rule(
    "LP-HCP-004",
    E,
    "hybrid context parallelism without Megatron FSDP, with the single data loader",
    "Megatron-LM arguments (hybrid CP)",
    fix="set ddp.use_megatron_fsdp=false and dataset.dataloader_type=single",
)
def hcp_fsdp_loader(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-LM also refuses hybrid CP with Megatron FSDP and with any data loader but ``single``."""
    if not _hybrid(s):
        return
    if s.use_megatron_fsdp:
        yield V(
            "hybrid_context_parallel with Megatron FSDP: Megatron-LM refuses the pair",
            "set ddp.use_megatron_fsdp=false (use the distributed optimizer), or turn hybrid CP off",
            K_HCP,
            K_FSDP,
        )
    loader = s.dataset.dataloader_type
    if loader is not None and loader != "single":
        yield V(
            f"hybrid_context_parallel with dataloader_type={loader!r}: only the 'single' data loader is supported",
            "set dataset.dataloader_type=single",
            K_HCP,
            K_DLT,
        )


@FAMILY.rule(
    "LP-HCP-005",
    E,
    "hybrid CP / packing scheduler need max_seqlen_per_dp_cp_rank",
    "Megatron-Core ModelParallelConfig (hybrid CP); Megatron-Core wrap_data_iterator",
    fix="set model.max_seqlen_per_dp_cp_rank (start from seq_length / CP)",
)
def hcp_cap_set(s: TrainingSetup) -> Iterator[Violation]:
    """Both schedulers size their work by the per-rank cap; without it they divide by ``None``."""
    users = [k for k, on in ((K_HCP, _hybrid(s)), (K_SCHED, s.model.sequence_packing_scheduler)) if on]
    if users and _cap(s) is None:
        width = _width(s)
        start = f"{math.ceil(width / s.cp)} (= {width} / CP {s.cp})" if width else "seq_length / CP"
        yield V(
            f"{' and '.join(users)} set without a positive max_seqlen_per_dp_cp_rank "
            f"(got {s.model.max_seqlen_per_dp_cp_rank})",
            f"set {K_CAP}={start}, Megatron-Core's suggested starting point",
            *users,
            K_CAP,
        )


@FAMILY.rule(
    "LP-HCP-006",
    E,
    "hybrid CP: the longest sample fits on the DP x CP ranks",
    "Megatron-Core BalancedCPScheduler.gpus_needed",
    fix="raise model.max_seqlen_per_dp_cp_rank so that the pack width needs at most DP*CP ranks",
)
def hcp_cap_fits(s: TrainingSetup) -> Iterator[Violation]:
    """A sample of ``L`` tokens needs ``2**ceil(log2(L / cap))`` ranks; more than DP x CP cannot be scheduled."""
    cap, width, dp = _cap(s), _width(s), s.dp
    if not _hybrid(s) or cap is None or width is None or dp is None:
        return
    need, have = ranks_needed(width, cap), dp * s.cp
    if need > have:
        yield V(
            f"a {width}-token sample needs {need} ranks at max_seqlen_per_dp_cp_rank={cap}, "
            f"but DP*CP = {dp}*{s.cp} = {have}",
            f"set {K_CAP}>={math.ceil(width / have)} (so the pack width fits on {have} ranks), or shorten the packs",
            K_CAP,
            K_SEQ,
            K_CP,
        )


@FAMILY.rule(
    "LP-HCP-010",
    E,
    "hybrid CP needs an even number of DP x CP ranks",
    "Megatron-Core parallel_state (hybrid DP x CP groups)",
    fix="choose the GPU count, TP or PP so that DP x CP is even, or set model.hybrid_context_parallel=false",
)
def hcp_even_ranks(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core builds the hybrid DP x CP groups (a group for every power of two below DP x CP) only
    over an even number of ranks, and asserts so at start-up."""
    dp = s.dp
    if not _hybrid(s) or dp is None or (dp * s.cp) % 2 == 0:
        return
    yield V(
        f"hybrid_context_parallel with DP*CP = {dp}*{s.cp} = {dp * s.cp} ranks: Megatron-Core asserts 'Hybrid "
        "context parallel requires an even number of ranks' when it builds the hybrid groups",
        "choose longpack.world_size (--gpus), model.tensor_model_parallel_size or "
        "model.pipeline_model_parallel_size so that DP*CP is even, or set model.hybrid_context_parallel=false",
        K_HCP,
        K_CP,
    )


@FAMILY.rule(
    "LP-HCP-007",
    W,
    "hybrid CP: max_seqlen_per_dp_cp_rank between seq_length/CP and the pack width",
    "Megatron-Core ModelParallelConfig (hybrid CP)",
    fix="set model.max_seqlen_per_dp_cp_rank to about seq_length / CP (what each rank's memory was sized for)",
)
def hcp_cap_range(s: TrainingSetup) -> Iterator[Violation]:
    """The cap is what one rank's activation memory holds. Above the pack width no sample is ever split
    (hybrid CP degenerates to data parallelism of whole rows); far below seq_length / CP every long row is
    spread over more ranks than static CP would use."""
    cap, width = _cap(s), _width(s)
    if not _hybrid(s) or cap is None or width is None:
        return
    static = math.ceil(width / s.cp)
    if cap >= width and s.cp > 1:
        yield V(
            f"max_seqlen_per_dp_cp_rank={cap} >= the pack width {width}: every sample lands on one rank, "
            f"which must then hold {width} tokens of activations (static CP {s.cp} holds {static})",
            f"set {K_CAP}={static} (= {width} / CP {s.cp}) unless one rank fits a whole row",
            K_CAP,
            K_SEQ,
        )
    elif cap * 2 <= static:
        yield V(
            f"max_seqlen_per_dp_cp_rank={cap} is at most half of seq_length/CP = {static}: the longest rows are "
            f"spread over {ranks_needed(width, cap)} ranks instead of CP={s.cp}",
            f"set {K_CAP}={static} unless memory requires the smaller cap",
            K_CAP,
            K_CP,
        )


@FAMILY.rule(
    "LP-HCP-008",
    E,
    "hybrid CP: packed sub-samples split into 2 * (ranks) equal chunks",
    "Megatron-Core get_batch_on_this_hybrid_cp_rank; TransformerEngine thd_get_partitioned_indices",
    fix="set pad_seq_to_mult to a multiple of 2 * the largest hybrid-CP group",
)
def hcp_alignment(s: TrainingSetup) -> Iterator[Violation]:
    """A sample on ``g`` ranks is cut into ``2g`` load-balanced chunks, so the longest samples (on the
    largest group) need lengths divisible by ``2g``, and by ``g*TP`` with sequence parallelism."""
    cap, width = _cap(s), _width(s)
    specs = s.dataset.offline_packing_specs
    if not _hybrid(s) or cap is None or width is None or specs is None or not s.dataset.offline_packing:
        return
    g = ranks_needed(width, cap)
    if s.dp is not None:
        g = min(g, s.dp * s.cp)
    if g <= 1:
        return
    need = pad_seq_to_mult(tp=s.tp, cp=g, sp=s.sp)
    mult = specs.pad_seq_to_mult or 1
    if mult % need:
        yield V(
            f"pad_seq_to_mult={mult}: a {width}-token sample goes to {g} ranks under hybrid CP "
            f"(max_seqlen_per_dp_cp_rank={cap}) and must split into {2 * g} equal chunks",
            f"set {K_PSM}={math.lcm(mult, need)} and re-pack the data",
            K_PSM,
            K_CAP,
        )


@FAMILY.rule(
    "LP-SCHED-001",
    E,
    "sequence_packing_scheduler is a known scheduler",
    "Megatron-Core wrap_data_iterator (PackingSchedulerEnum)",
    fix="set model.sequence_packing_scheduler=dp_balanced",
)
def sched_known(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core looks the name up in ``PackingSchedulerEnum`` (upper-cased)."""
    name = s.model.sequence_packing_scheduler
    if name and name.lower() not in PACKING_SCHEDULERS:
        yield V(
            f"sequence_packing_scheduler={name!r} is not one of {', '.join(PACKING_SCHEDULERS)}",
            f"set {K_SCHED}=dp_balanced",
            K_SCHED,
        )


@FAMILY.rule(
    "LP-SCHED-002",
    E,
    "DP-balanced scheduler: every sample fits max_seqlen_per_dp_cp_rank * CP",
    "Megatron-Core DpBalancedScheduler.get_groups_and_subsamples",
    fix="raise model.max_seqlen_per_dp_cp_rank to at least seq_length / CP",
)
def sched_sample_fits(s: TrainingSetup) -> Iterator[Violation]:
    """Packs are filled in order up to ``cap * CP`` tokens; a longer sample starts a pack it overflows
    (and, first in a batch, leaves an empty pack before it)."""
    cap, width = _cap(s), _width(s)
    if not _dp_balanced(s) or cap is None or width is None:
        return
    if width > cap * s.cp:
        yield V(
            f"samples of up to {width} tokens but max_seqlen_per_dp_cp_rank*CP = {cap}*{s.cp} = {cap * s.cp}",
            f"set {K_CAP}>={math.ceil(width / s.cp)}",
            K_CAP,
            K_SEQ,
            K_CP,
        )


@FAMILY.rule(
    "LP-SCHED-003",
    E,
    "DP-balanced scheduler: global batch of at least DP (x VPP group) samples",
    "Megatron-Core DpBalancedScheduler.get_groups_and_subsamples",
    fix="raise train.global_batch_size to at least DP * microbatch_group_size_per_vp_stage",
)
def sched_enough_samples(s: TrainingSetup) -> Iterator[Violation]:
    """The pack count is made a multiple of DP (times the VPP micro-batch group) by moving samples out of
    packs; a global batch with fewer samples than that multiple fails with 'Not enough samples to move'."""
    dp, gbs = s.dp, s.global_batch_size
    if not _dp_balanced(s) or dp is None or gbs is None:
        return
    group = (
        s.model.microbatch_group_size_per_vp_stage if s.model.virtual_pipeline_model_parallel_size else None
    )
    multiple = dp * (group or 1)
    if gbs < multiple:
        yield V(
            f"global_batch_size={gbs} samples but the scheduler needs a multiple of DP={dp}"
            f"{f' x microbatch_group_size_per_vp_stage={group}' if group else ''} = {multiple} packs",
            f"set {K_GBS}>={multiple}",
            K_GBS,
            K_SCHED,
        )


@FAMILY.rule(
    "LP-HCP-009",
    W,
    "Megatron-Bridge does not run the hybrid-CP or packing schedulers",
    "Bridge gpt_step (is_hybrid_cp=False); Bridge initialize",
    fix="train with Megatron-LM's pretrain_gpt.py for hybrid CP / the DP-balanced scheduler, or drop the keys",
)
def hcp_not_in_bridge(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge passes ``hybrid_context_parallel`` to the process-group set-up only: its training
    steps split every batch with ``is_hybrid_cp=False`` and nothing wraps the data iterator with
    Megatron-Core's ``HybridCPDataLoaderWrapper`` or ``wrap_data_iterator``, so the schedulers never run
    (batches are split as static CP)."""
    keys = [k for k, on in ((K_HCP, _hybrid(s)), (K_SCHED, s.model.sequence_packing_scheduler)) if on]
    if keys:
        yield V(
            f"{' and '.join(keys)} set in a Megatron-Bridge config: Bridge builds the groups but never schedules "
            "batches by them (every step splits with is_hybrid_cp=False), so the run trains with static CP",
            "run the hybrid-CP / DP-balanced schedule with Megatron-LM's pretrain_gpt.py, or drop "
            f"{' and '.join(keys)} from the Bridge config",
            *keys,
        )
