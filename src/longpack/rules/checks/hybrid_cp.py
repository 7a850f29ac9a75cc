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
from longpack.rules.scheduling_keys import (
    GLOBAL_BATCH_PACKING_SINCE,
    K_CAP,
    K_DCP,
    K_GBP,
    K_HCP,
    K_MIN_DCP,
    K_PAD_ALIGN,
    K_SCHED,
    K_THD_MAX,
    PACKING_SCHEDULERS,
    scheduler_range,
)
from longpack.rules.versions import MCORE
from longpack.topology import pad_seq_to_mult, ranks_needed

FAMILY = RuleFamily("hybrid_cp", "Hybrid context parallelism and packing schedulers")

K_MBG = "model.microbatch_group_size_per_vp_stage"
K_FSDP = "ddp.use_megatron_fsdp"
K_DLT = "dataset.dataloader_type"
K_DPG = "dist.use_decentralized_pg"


def _width(s: TrainingSetup) -> int | None:
    """The longest sample the schedulers can see: the packed width, else the sequence length."""
    return s.packed_width or s.model_seq_length


def _hybrid(s: TrainingSetup) -> bool:
    """Hybrid CP, or dynamic CP (Megatron-Core dev's name for it; the old key is its alias)."""
    return s.model.hybrid_context_parallel or s.model.dynamic_context_parallel


def _hkey(s: TrainingSetup) -> str:
    """The key the config spells hybrid / dynamic CP with."""
    return K_DCP if s.model.dynamic_context_parallel else K_HCP


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
            _hkey(s),
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
            _hkey(s),
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
            _hkey(s),
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
            _hkey(s),
            K_FSDP,
        )
    loader = s.dataset.dataloader_type
    if loader is not None and loader != "single":
        yield V(
            f"hybrid_context_parallel with dataloader_type={loader!r}: only the 'single' data loader is supported",
            "set dataset.dataloader_type=single",
            _hkey(s),
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
    users = [k for k, on in ((_hkey(s), _hybrid(s)), (K_SCHED, s.model.sequence_packing_scheduler)) if on]
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
    "sequence_packing_scheduler is a scheduler the Megatron-Core version has",
    "Megatron-Core wrap_data_iterator (PackingSchedulerEnum; dev: scheduler_map)",
    fix="set model.sequence_packing_scheduler to one the version registers (dp_balanced; default_dynamic_cp from Megatron-Core dev)",
)
def sched_known(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core looks the name up among the schedulers it registers: ``dp_balanced`` on ``main``,
    and ``default_dynamic_cp`` too on ``dev`` (dynamic CP). A name another version registers is refused
    by this one."""
    name = s.model.sequence_packing_scheduler
    if not name:
        return
    mcore = s.versions.mcore if s.versions is not None else "main"
    origin = s.versions.origin(MCORE) if s.versions is not None else "newest known"
    here = [n for n, r in PACKING_SCHEDULERS if r.contains(mcore, MCORE)]
    if name.lower() in here:
        return
    has = scheduler_range(name)
    why = (
        f"Megatron-Core {mcore} ({origin}) registers {', '.join(here) or 'no scheduler'}; "
        f"{name!r} is in Megatron-Core {has.text}"
        if has is not None
        else f"{name!r} is not one of {', '.join(n for n, _ in PACKING_SCHEDULERS)} (Megatron-Core {mcore}, {origin})"
    )
    fix = (
        f"run Megatron-Core {has.text} (pass --megatron-core-version), or set {K_SCHED}={here[0]}"
        if has is not None and here
        else f"set {K_SCHED}={here[0] if here else 'dp_balanced'}"
    )
    yield V(f"sequence_packing_scheduler={name!r}: {why}", fix, K_SCHED)


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
    """Up to ``main`` (067f987df), Megatron-Bridge passes ``hybrid_context_parallel`` /
    ``dynamic_context_parallel`` to the process-group set-up only: its training steps split every batch
    with ``is_hybrid_cp=False`` and nothing wraps the data iterator with Megatron-Core's
    ``wrap_data_iterator``, so the schedulers never run (batches are split as static CP). Bridge's own
    dynamic-CP example (``examples/training_features/long_context/dynamic_context_parallel.py``, d1067cede)
    is a local demo of the scheduler that says so: it builds no model and trains nothing. Global-batch
    packing (``dataset.enable_global_batch_packing``, PR #6127) wires the scheduler into the training loop;
    from that version on ``LP-GBP-001`` takes over."""
    keys = [k for k, on in ((_hkey(s), _hybrid(s)), (K_SCHED, s.model.sequence_packing_scheduler)) if on]
    if keys:
        yield V(
            f"{' and '.join(keys)} set in a Megatron-Bridge config: Bridge builds the groups but never schedules "
            "batches by them (every step splits with is_hybrid_cp=False), so the run trains with static CP",
            "run the hybrid-CP / DP-balanced schedule with Megatron-LM's pretrain_gpt.py, or drop "
            f"{' and '.join(keys)} from the Bridge config",
            *keys,
        )


def _scheduled(s: TrainingSetup) -> list[str]:
    keys = [K_SCHED] if s.model.sequence_packing_scheduler else []
    return ([_hkey(s)] if _hybrid(s) else []) + keys


@FAMILY.rule(
    "LP-GBP-001",
    E,
    "the packing scheduler and dynamic CP need dataset.enable_global_batch_packing",
    "Megatron-Bridge ConfigContainer.validate (global-batch packing, PR #6127)",
    fix="set dataset.enable_global_batch_packing=true (it selects the scheduler), or drop the model keys",
)
def gbp_switch(s: TrainingSetup) -> Iterator[Violation]:
    """With global-batch packing, ``dataset.enable_global_batch_packing`` drives
    ``model.sequence_packing_scheduler`` (``default_dynamic_cp`` with dynamic CP, else ``dp_balanced``) and
    Bridge refuses the model field without the dataset switch."""
    keys = _scheduled(s)
    if keys and not s.dataset.enable_global_batch_packing:
        yield V(
            f"{' and '.join(keys)} set without {K_GBP}: Megatron-Bridge >= {GLOBAL_BATCH_PACKING_SINCE} "
            "(global-batch packing) refuses the scheduler's model field without the dataset switch",
            f"set {K_GBP}=true (it selects the scheduler), or drop {' and '.join(keys)}",
            *keys,
        )


@FAMILY.rule(
    "LP-DCP-001",
    E,
    "hybrid_context_parallel and dynamic_context_parallel are not both set",
    "Megatron-Core dev ModelParallelConfig.__post_init__",
    fix="keep model.dynamic_context_parallel only (model.hybrid_context_parallel is its deprecated alias)",
)
def dcp_both(s: TrainingSetup) -> Iterator[Violation]:
    """``hybrid_context_parallel`` sets ``dynamic_context_parallel``; both at once is a ``ValueError``."""
    if s.model.hybrid_context_parallel and s.model.dynamic_context_parallel:
        yield V(
            "hybrid_context_parallel and dynamic_context_parallel are both set: Megatron-Core refuses the pair "
            "('Cannot set both ...')",
            f"drop {K_HCP} and keep {K_DCP}=true",
            K_HCP,
            K_DCP,
        )


@FAMILY.rule(
    "LP-DCP-002",
    E,
    "dynamic CP runs the default_dynamic_cp scheduler",
    "Megatron-Core dev ModelParallelConfig.__post_init__; Megatron-LM dev arguments",
    fix="set model.sequence_packing_scheduler=default_dynamic_cp (or leave it unset: dynamic CP selects it)",
)
def dcp_scheduler(s: TrainingSetup) -> Iterator[Violation]:
    """Dynamic CP sets the scheduler to ``default_dynamic_cp`` when it is unset and refuses any other."""
    name = s.model.sequence_packing_scheduler
    if _hybrid(s) and name and name.lower() != "default_dynamic_cp":
        yield V(
            f"{_hkey(s)} with sequence_packing_scheduler={name!r}: dynamic context parallelism requires "
            "sequence_packing_scheduler=default_dynamic_cp",
            f"set {K_SCHED}=default_dynamic_cp (or leave it unset)",
            _hkey(s),
            K_SCHED,
        )


@FAMILY.rule(
    "LP-DCP-003",
    E,
    "min_dynamic_context_parallel_size between 1 and DP x CP",
    "Megatron-Core dev ModelParallelConfig.__post_init__; Megatron-LM dev arguments",
    fix="set model.min_dynamic_context_parallel_size between 1 and DP * CP",
)
def dcp_min_size(s: TrainingSetup) -> Iterator[Violation]:
    """The smallest dynamic CP group: at least 1 (the config refuses less) and at most the DP x CP ranks
    the groups are formed from (Megatron-LM asserts it)."""
    low = s.model.min_dynamic_context_parallel_size
    if low is None or not _hybrid(s):
        return
    dp = s.dp
    if low < 1 or (dp is not None and low > dp * s.cp):
        top = "DP * CP" if dp is None else f"DP*CP = {dp}*{s.cp} = {dp * s.cp}"
        yield V(
            f"min_dynamic_context_parallel_size={low}: must be >= 1 and <= {top}",
            f"set {K_MIN_DCP}=1 (groups then range from 1 to {top})",
            K_MIN_DCP,
        )


def _alignment(s: TrainingSetup) -> int | str | None:
    raw = s.model.pad_packed_seq_alignment
    if raw is None:
        return None
    text = str(raw).strip().lower()
    if text == "max":
        return "max"
    try:
        return int(text)
    except ValueError:
        return text


@FAMILY.rule(
    "LP-DCP-004",
    E,
    "pad_packed_seq_alignment is 'max' or a positive multiple up to max_seqlen_per_dp_cp_rank",
    "Megatron-Core dev ModelParallelConfig.__post_init__ (pad_packed_seq_alignment)",
    fix="set model.pad_packed_seq_alignment=max (or a multiple <= model.max_seqlen_per_dp_cp_rank) and set the cap",
)
def dcp_pad_alignment(s: TrainingSetup) -> Iterator[Violation]:
    """The scheduler pads packed THD tensors to the cap (``max``) or to a multiple of N; it needs the cap,
    and N must be positive and at most the cap."""
    align = _alignment(s)
    if align is None:
        return
    cap = _cap(s)
    if isinstance(align, str) and align != "max":
        yield V(
            f"pad_packed_seq_alignment={s.model.pad_packed_seq_alignment!r} is neither 'max' nor an integer",
            f"set {K_PAD_ALIGN}=max or a positive integer",
            K_PAD_ALIGN,
        )
    elif cap is None:
        yield V(
            "pad_packed_seq_alignment is set without max_seqlen_per_dp_cp_rank: Megatron-Core refuses it",
            f"set {K_CAP} (start from seq_length / CP)",
            K_PAD_ALIGN,
            K_CAP,
        )
    elif isinstance(align, int) and not 0 < align <= cap:
        yield V(
            f"pad_packed_seq_alignment={align}: must be a positive integer at most max_seqlen_per_dp_cp_rank={cap}",
            f"set {K_PAD_ALIGN} between 1 and {cap}, or max",
            K_PAD_ALIGN,
            K_CAP,
        )


@FAMILY.rule(
    "LP-DCP-005",
    E,
    "THD CUDA graphs with a packing scheduler pad to max_seqlen_per_dp_cp_rank and a fixed sequence count",
    "Megatron-LM dev arguments and TransformerConfig (THD CUDA graph)",
    fix="set model.pad_packed_seq_alignment=max and model.thd_max_packed_sequences with CUDA graphs and a "
    "packing scheduler",
)
def dcp_graph_alignment(s: TrainingSetup) -> Iterator[Violation]:
    """A graph replays fixed shapes: with a scheduler (or dynamic CP) and ``cuda_graph_impl`` set, the
    packed tensors must be padded to the cap (``max``, or an alignment equal to the cap); dynamic CP with
    the local ``enable_cuda_graph`` is refused outright."""
    if not (s.model.sequence_packing_scheduler or _hybrid(s)):
        return
    if _hybrid(s) and s.model.enable_cuda_graph:
        yield V(
            f"{_hkey(s)} with enable_cuda_graph: dynamic context parallelism is not supported with CUDA Graph",
            "set model.enable_cuda_graph=false",
            _hkey(s),
        )
    if s.model.cuda_graph_impl == "none":
        return
    if s.model.thd_max_packed_sequences is None:
        yield V(
            f"cuda_graph_impl={s.model.cuda_graph_impl} with a packing scheduler and no thd_max_packed_sequences: "
            "THD CUDA graphs need a fixed number of sequences per pack (cu_seqlens padded to it)",
            f"set {K_THD_MAX} to the most sequences a pack holds",
            K_THD_MAX,
            K_CGI,
        )
    align, cap = _alignment(s), _cap(s)
    if align is None or (align != "max" and align != cap):
        yield V(
            f"cuda_graph_impl={s.model.cuda_graph_impl} with a packing scheduler and pad_packed_seq_alignment="
            f"{s.model.pad_packed_seq_alignment!r}: THD CUDA graphs need 'max' or the cap ({cap})",
            f"set {K_PAD_ALIGN}=max",
            K_PAD_ALIGN,
            K_CGI,
        )


@FAMILY.rule(
    "LP-DCP-006",
    W,
    "hybrid_context_parallel is the deprecated spelling of dynamic_context_parallel",
    "Megatron-Core dev ModelParallelConfig (DeprecationWarning)",
    fix="rename model.hybrid_context_parallel to model.dynamic_context_parallel",
)
def dcp_alias(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core dev still reads the old key (it sets ``dynamic_context_parallel``) but warns that it
    will be removed."""
    if s.model.hybrid_context_parallel and not s.model.dynamic_context_parallel:
        yield V(
            "hybrid_context_parallel is deprecated in this Megatron-Core (renamed dynamic_context_parallel, #3405)",
            f"rename {K_HCP} to {K_DCP}",
            K_HCP,
        )


@FAMILY.rule(
    "LP-DCP-007",
    E,
    "min_dynamic_context_parallel_size a power of two (global-batch packing)",
    "Megatron-Bridge global-batch packing validation (dynamic CP)",
    fix="set model.min_dynamic_context_parallel_size to a power of two (1, 2, 4, ...) at most DP * CP",
)
def dcp_min_power_of_two(s: TrainingSetup) -> Iterator[Violation]:
    """Dynamic CP groups are powers of two (Megatron-Core forms one group per power of two from the
    smallest up), and Bridge's validation refuses a smallest size that is not one rather than let it
    round up silently: ``min_dynamic_context_parallel_size=3`` would give groups of 4 and more."""
    low = s.model.min_dynamic_context_parallel_size
    if low is None or low < 1 or not _hybrid(s) or low & (low - 1) == 0:
        return  # below 1 is LP-DCP-003's
    below = 1 << (low.bit_length() - 1)
    yield V(
        f"min_dynamic_context_parallel_size={low} is not a power of two: Megatron-Bridge's dynamic-CP "
        f"validation refuses it (the groups Megatron-Core forms would start at {below * 2})",
        f"set {K_MIN_DCP}={below} (or {below * 2})",
        K_MIN_DCP,
    )


@FAMILY.rule(
    "LP-DCP-008",
    E,
    "dynamic CP needs the global parallel state (dist.use_decentralized_pg=false)",
    "Megatron-Bridge global-batch packing validation (dynamic CP)",
    fix="set dist.use_decentralized_pg=false with model.dynamic_context_parallel",
)
def dcp_decentralized_pg(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core looks the dynamic CP groups up in ``parallel_state``; with decentralized process groups
    (HyperCommGrid) that state is never built, so Bridge's validation refuses the pair."""
    if _hybrid(s) and s.use_decentralized_pg:
        yield V(
            f"{_hkey(s)} with dist.use_decentralized_pg=true: Megatron-Core resolves dynamic CP groups from its "
            "global parallel state, which decentralized process groups do not build",
            f"set {K_DPG}=false",
            K_DPG,
            _hkey(s),
        )
