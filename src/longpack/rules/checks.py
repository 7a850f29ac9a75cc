"""Every rule ``longpack check`` knows: packing, context parallelism, batches, CUDA graphs, Energon,
MoE, pipeline layouts, model-family opt-outs, and packed data against the topology.

Sources are named per rule: ``§6.N`` = ``shared/specs/megatron-packing.md`` §6 rule N (Megatron-Bridge
``ConfigContainer.validate``), ``§8`` = that spec's documented recommendations, ``C.1``/``C.2``/``D.7``/
``D.8`` = ``shared/specs/energon-thd-cp.md``, ``MCore`` = Megatron-Core ``TransformerConfig`` /
``ModelParallelConfig`` checks.

>>> from longpack.rules.config import setup_from_mapping
>>> s = setup_from_mapping({"model": {"context_parallel_size": 3, "seq_length": 256, "calculate_per_token_loss": True}}).setup
>>> [f.rule_id for f in run_rules(s) if f.severity == "error"]
['LP-CP-001']
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator

from longpack.rules.config import (
    ENERGON_BUILDER_OWNED_KWARGS,
    DatasetKind,
    TrainingSetup,
    equivalent_offline_config,
)
from longpack.rules.packed_data import PackedDataSummary
from longpack.rules.registry import RULES, Finding, Severity, Violation, rule, sorted_findings
from longpack.topology import TopologyError, parse_pipeline_layout, pipeline_split

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

K_TP = "model.tensor_model_parallel_size"
K_CP = "model.context_parallel_size"
K_PP = "model.pipeline_model_parallel_size"
K_VPP = "model.virtual_pipeline_model_parallel_size"
K_EP = "model.expert_model_parallel_size"
K_ETP = "model.expert_tensor_parallel_size"
K_SP = "model.sequence_parallel"
K_SEQ = "model.seq_length"
K_DSEQ = "dataset.seq_length"
K_MBS = "train.micro_batch_size"
K_GBS = "train.global_batch_size"
K_OFF = "dataset.enable_offline_packing"
K_IBP = "dataset.enable_in_batch_packing"
K_SPECS = "dataset.offline_packing_specs"
K_PSS = "dataset.offline_packing_specs.packed_sequence_size"
K_PSM = "dataset.offline_packing_specs.pad_seq_to_mult"
K_PCU = "dataset.offline_packing_specs.pad_cu_seqlens"
K_PTML = "dataset.dataset_kwargs.pad_to_max_length"
K_PTL = "model.calculate_per_token_loss"
K_AIC = "ddp.average_in_collective"
K_CGI = "model.cuda_graph_impl"
K_CGS = "model.cuda_graph_scope"
K_MTP = "model.mtp_num_layers"
K_BUF = "dataset.packing_buffer_size"
K_LAYOUT = "model.pipeline_model_parallel_layout"

ROUTER_SCOPES = {"moe", "moe_router", "moe_preprocess"}
HYBRIDEP_CHUNK = 128  # §8: "HybridEP with a 128-token combine chunk needs a width divisible by 128"


def V(message: str, fix: str, *keys: str) -> Violation:
    return Violation(message=message, fix=fix, keys=keys)


def _fixed(s: TrainingSetup) -> bool:
    return s.dataset.fixed_width


def _pad_cu(s: TrainingSetup) -> bool:
    specs = s.dataset.offline_packing_specs
    return specs is not None and specs.pad_cu_seqlens


def _pss(s: TrainingSetup) -> int | None:
    specs = s.dataset.offline_packing_specs
    return None if specs is None else specs.packed_sequence_size


def _m_text(s: TrainingSetup) -> str:
    cps = {s.cp} | ({s.eval_context_parallel_size} if s.eval_context_parallel_size else set())
    parts = []
    for cp in sorted(cps):
        cp_part = f"2*CP={2 * cp}" if cp > 1 else "1"
        sp_part = f"CP*TP={cp * s.tp}" if s.sp and s.tp > 1 else "1"
        parts.append(f"lcm({cp_part}, {sp_part})")
    return f"{s.required_pad_seq_to_mult} (= {' and '.join(parts)} for TP={s.tp} CP={'/'.join(map(str, sorted(cps)))} SP={s.sp})"


def suggest_layout(num_layers: int, pp: int, vpp: int, mtp_num_layers: int = 0) -> str:
    """A balanced ``pipeline_model_parallel_layout`` for ``num_layers`` on ``pp*vpp`` stages, counting
    the embedding, the loss and each MTP layer as one layer of work.

    >>> suggest_layout(61, 8, 4, 1)
    'Et|(tt|)*30mL'
    >>> suggest_layout(94, 4, 12)
    'Et|(tt|)*46tL'
    >>> suggest_layout(61, 4, 2, 1)
    'Et*7|(t*8|)*6t*6mL'
    >>> pipeline_split(num_layers=30, pp=4, vpp=2, layout=suggest_layout(30, 4, 2)).method
    'layout'
    """
    stages = pp * vpp
    units = num_layers + 2 + mtp_num_layers
    base, extra = divmod(units, stages)
    sizes = [base] * stages
    for i in range(extra):  # middle stages take the remainder; the first and last hold E and L
        sizes[1 + i % max(1, stages - 2) if stages > 2 else i] += 1
    text = []
    left = num_layers
    for i, size in enumerate(sizes):
        kinds = []
        room = size
        if i == 0:
            kinds.append("E")
            room -= 1
        tail = (["m"] * mtp_num_layers + ["L"]) if i == stages - 1 else []
        room -= len(tail)
        take = max(0, min(room, left)) if i < stages - 1 else left
        kinds.extend(["t"] * take)
        left -= take
        kinds.extend(tail)
        stage = "".join(kinds)
        text.append(re.sub(r"t{3,}", lambda m: f"t*{len(m.group(0))}", stage))
    out: list[str] = []
    i = 0
    while i < len(text):
        j = i
        while j + 1 < len(text) and text[j + 1] == text[i]:
            j += 1
        run = j - i + 1
        is_last_run = j == len(text) - 1
        if run > 1 and not is_last_run:
            out.append(f"({text[i]}|)*{run}")
        elif run > 1:
            out.append(f"({text[i]}|)*{run - 1}{text[i]}")
        else:
            out.append(text[i] + ("" if is_last_run else "|"))
        i = j + 1
    return "".join(out)


# ================================================================================================
# Basic input
# ================================================================================================


@rule("LP-CFG-001", E, "parallel sizes, batch sizes and lengths are positive integers", "MCore / Bridge")
def sizes_positive(s: TrainingSetup) -> Iterator[Violation]:
    m = s.model
    values = {
        K_TP: m.tensor_model_parallel_size,
        K_CP: m.context_parallel_size,
        K_PP: m.pipeline_model_parallel_size,
        K_EP: m.expert_model_parallel_size,
        K_ETP: m.expert_tensor_parallel_size,
        K_VPP: m.virtual_pipeline_model_parallel_size,
        K_MBS: s.micro_batch_size,
        K_GBS: s.global_batch_size,
        K_SEQ: m.seq_length,
        K_DSEQ: s.dataset.seq_length,
        "longpack.world_size": s.world_size,
        "dist.eval_context_parallel_size": s.eval_context_parallel_size,
        "dataset.pad_to_multiple_of": s.dataset.pad_to_multiple_of,
        "dataset.in_batch_packing_pad_to_multiple_of": s.dataset.in_batch_packing_pad_to_multiple_of,
    }
    for key, value in values.items():
        if value is not None and value < 1:
            yield V(f"{key}={value} must be a positive integer", f"set {key} to a value >= 1", key)


@rule("LP-CFG-002", INFO, "world size known (topology and batch rules need it)", "longpack")
def world_size_known(s: TrainingSetup) -> Iterator[Violation]:
    if s.world_size is None:
        yield V(
            "world size unknown: rules on DP, expert DP and GBS divisibility were skipped",
            "pass --gpus N (or longpack.world_size=N)",
        )


@rule("LP-CFG-003", INFO, "model architecture known (layer/head/expert rules need it)", "longpack")
def architecture_known(s: TrainingSetup) -> Iterator[Violation]:
    m = s.model
    if m.num_layers is None or m.num_attention_heads is None:
        yield V(
            f"model architecture incomplete (num_layers={m.num_layers}, num_attention_heads="
            f"{m.num_attention_heads}): pipeline-split and head-divisibility rules were skipped",
            "set model.num_layers / model.num_attention_heads / model.num_query_groups / "
            "model.num_moe_experts, or name a family with --model (see --list-families)",
            "model.num_layers",
        )


# ================================================================================================
# Topology
# ================================================================================================


@rule("LP-TOPO-001", E, "world size divisible by TP*CP*PP", "MCore parallel_state")
def world_divisible(s: TrainingSetup) -> Iterator[Violation]:
    if s.world_size is None:
        return
    mp = s.tp * s.cp * s.pp
    if s.world_size % mp:
        yield V(
            f"world size {s.world_size} is not divisible by TP*CP*PP = {s.tp}*{s.cp}*{s.pp} = {mp}",
            f"use a multiple of {mp} GPUs, or change TP/CP/PP so that their product divides {s.world_size}",
            K_TP,
            K_CP,
            K_PP,
        )


@rule("LP-TOPO-002", E, "EP*ETP divides N/PP (MoE parallel folding)", "MCore parallel_state")
def expert_folding(s: TrainingSetup) -> Iterator[Violation]:
    if s.world_size is None or s.world_size % s.pp:
        return
    per_stage = s.world_size // s.pp
    if per_stage % (s.ep * s.etp):
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


@rule("LP-TOPO-003", E, "expert count divisible by EP; EP > 1 only for MoE models", "MCore")
def experts_divisible(s: TrainingSetup) -> Iterator[Violation]:
    n = s.model.num_moe_experts
    if s.ep > 1 and not n:
        yield V(
            f"expert_model_parallel_size={s.ep} but the model has no experts (num_moe_experts={n})",
            "set model.expert_model_parallel_size=1 for a dense model (or set model.num_moe_experts)",
            K_EP,
            "model.num_moe_experts",
        )
    elif n and n % s.ep:
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d <= 2 * s.ep][-3:]
        yield V(
            f"num_moe_experts={n} is not divisible by EP={s.ep}",
            f"choose EP among the divisors of {n} (e.g. {', '.join(map(str, divisors))})",
            K_EP,
            "model.num_moe_experts",
        )


@rule("LP-TOPO-004", E, "attention heads divisible by TP", "MCore attention")
def heads_tp(s: TrainingSetup) -> Iterator[Violation]:
    h = s.model.num_attention_heads
    if h and h % s.tp:
        yield V(
            f"num_attention_heads={h} is not divisible by TP={s.tp}",
            f"choose TP dividing {h}",
            K_TP,
            "model.num_attention_heads",
        )


@rule("LP-TOPO-005", E, "KV heads (num_query_groups) divisible by TP", "MCore attention")
def kv_heads_tp(s: TrainingSetup) -> Iterator[Violation]:
    g = s.model.num_query_groups
    if g and g % s.tp:
        yield V(
            f"num_query_groups (KV heads)={g} is not divisible by TP={s.tp}",
            f"choose TP dividing {g} (use CP or PP to spread the rest)",
            K_TP,
            "model.num_query_groups",
        )


@rule("LP-TOPO-006", W, "sequence parallelism only with TP > 1", "D.8 / Megatron-LM")
def sp_needs_tp(s: TrainingSetup) -> Iterator[Violation]:
    if s.sp and s.tp == 1:
        yield V(
            "sequence_parallel=True with TP=1 does nothing (Megatron-LM turns it off)",
            "set model.sequence_parallel=false, or raise TP",
            K_SP,
            K_TP,
        )


@rule("LP-SP-001", E, "with SP, tokens per CP rank divisible by TP", "D.8")
def sp_tokens(s: TrainingSetup) -> Iterator[Violation]:
    width = s.packed_width
    if not (s.sp and s.tp > 1) or not width or width % s.cp:
        return
    local = width // s.cp
    if local % s.tp:
        yield V(
            f"with SP, each CP rank's {width}/{s.cp} = {local} tokens must split over TP={s.tp}",
            f"use a sequence length divisible by CP*TP = {s.cp * s.tp}",
            K_SEQ,
            K_TP,
            K_CP,
        )


# ================================================================================================
# Pipeline layouts
# ================================================================================================


def _pp_method(s: TrainingSetup) -> str:
    m = s.model
    if m.pipeline_model_parallel_layout is not None:
        return "layout"
    if m.num_layers_in_first_pipeline_stage is not None or m.num_layers_in_last_pipeline_stage is not None:
        return "first_last"
    if m.account_for_embedding_in_pipeline_split or m.account_for_loss_in_pipeline_split:
        return "account_for"
    return "even"


def _pp_conflict(s: TrainingSetup) -> str | None:
    m = s.model
    uneven = (
        m.num_layers_in_first_pipeline_stage is not None or m.num_layers_in_last_pipeline_stage is not None
    )
    acc = m.account_for_embedding_in_pipeline_split or m.account_for_loss_in_pipeline_split
    if m.pipeline_model_parallel_layout is not None and (uneven or acc):
        return "pipeline_model_parallel_layout is combined with first/last-stage counts or account_for_*"
    if uneven and acc:
        return "num_layers_in_first/last_pipeline_stage are combined with account_for_*_in_pipeline_split"
    return None


def _split_error(s: TrainingSetup) -> str | None:
    m = s.model
    if m.num_layers is None or _pp_conflict(s):
        return None
    try:
        pipeline_split(
            num_layers=m.num_layers,
            pp=s.pp,
            vpp=m.virtual_pipeline_model_parallel_size,
            mtp_num_layers=m.mtp_num_layers,
            layout=m.pipeline_model_parallel_layout,
            first_stage_layers=m.num_layers_in_first_pipeline_stage,
            last_stage_layers=m.num_layers_in_last_pipeline_stage,
            account_for_embedding=m.account_for_embedding_in_pipeline_split,
            account_for_loss=m.account_for_loss_in_pipeline_split,
        )
    except TopologyError as exc:
        return str(exc)
    return None


def _layout_fix(s: TrainingSetup) -> str:
    m = s.model
    v = m.virtual_pipeline_model_parallel_size or 1
    if m.num_layers is None:
        return "give a pipeline_model_parallel_layout"
    return (
        f"for example {K_LAYOUT}='{suggest_layout(m.num_layers, s.pp, v, m.mtp_num_layers or 0)}' "
        f"({s.pp * v} stages: E=embedding, t=layer, m=MTP, L=loss)"
    )


@rule("LP-PP-001", E, "layers divisible by PP*VPP when no uneven layout is given", "MCore TransformerConfig")
def pp_even(s: TrainingSetup) -> Iterator[Violation]:
    if (s.pp > 1 or (s.model.virtual_pipeline_model_parallel_size or 1) > 1) and _pp_method(s) == "even":
        err = _split_error(s)
        if err:
            yield V(err, _layout_fix(s), "model.num_layers", K_PP, K_VPP)


@rule(
    "LP-PP-002",
    E,
    "pipeline_model_parallel_layout valid for PP, VPP, layers and MTP",
    "MCore PipelineParallelLayerLayout",
)
def pp_layout(s: TrainingSetup) -> Iterator[Violation]:
    layout = s.model.pipeline_model_parallel_layout
    if layout is None or _pp_conflict(s):
        return
    try:
        stages = parse_pipeline_layout(layout)  # type: ignore[arg-type]
    except TopologyError as exc:
        yield V(str(exc), "use only E, t, m, L, '|', '*n' and '(...)*n' in the layout", K_LAYOUT)
        return
    if s.model.num_layers is None:
        if len(stages) % s.pp:
            yield V(
                f"layout has {len(stages)} stages, not divisible by PP={s.pp}",
                "write PP*VPP stages separated by '|'",
                K_LAYOUT,
                K_PP,
            )
        return
    err = _split_error(s)
    if err:
        yield V(err, _layout_fix(s), K_LAYOUT, "model.num_layers", K_MTP, K_PP, K_VPP)


@rule("LP-PP-003", E, "first/last pipeline-stage layer counts valid", "MCore TransformerConfig")
def pp_first_last(s: TrainingSetup) -> Iterator[Violation]:
    if _pp_method(s) == "first_last" and not _pp_conflict(s):
        err = _split_error(s)
        if err:
            yield V(
                err,
                "adjust model.num_layers_in_first/last_pipeline_stage, or use a layout: " + _layout_fix(s),
                "model.num_layers_in_first_pipeline_stage",
                "model.num_layers_in_last_pipeline_stage",
                K_VPP,
            )


@rule("LP-PP-004", E, "account_for_embedding/loss split divisible by PP*VPP", "MCore TransformerConfig")
def pp_account_for(s: TrainingSetup) -> Iterator[Violation]:
    if _pp_method(s) == "account_for" and not _pp_conflict(s):
        err = _split_error(s)
        if err:
            yield V(
                err,
                _layout_fix(s),
                "model.account_for_embedding_in_pipeline_split",
                "model.account_for_loss_in_pipeline_split",
                K_PP,
                K_VPP,
            )


@rule("LP-PP-005", E, "only one uneven-pipeline mechanism at a time", "MCore TransformerConfig")
def pp_conflicts(s: TrainingSetup) -> Iterator[Violation]:
    msg = _pp_conflict(s)
    if msg:
        yield V(
            msg + "; Megatron-Core rejects the combination",
            "keep only the layout (or only the first/last counts)",
            K_LAYOUT,
            "model.num_layers_in_first_pipeline_stage",
            "model.account_for_embedding_in_pipeline_split",
        )


@rule("LP-PP-006", E, "virtual pipeline stages need PP > 1", "MCore")
def vpp_needs_pp(s: TrainingSetup) -> Iterator[Violation]:
    v = s.model.virtual_pipeline_model_parallel_size
    if v is not None and v > 1 and s.pp == 1:
        yield V(
            f"virtual_pipeline_model_parallel_size={v} with pipeline_model_parallel_size=1",
            "set model.virtual_pipeline_model_parallel_size=null, or raise PP",
            K_VPP,
            K_PP,
        )


# ================================================================================================
# Context parallelism
# ================================================================================================


@rule("LP-CP-001", E, "model.seq_length divisible by 2*CP when CP > 1", "§6.10")
def cp_seq_length(s: TrainingSetup) -> Iterator[Violation]:
    seq = s.model_seq_length
    if s.cp > 1 and seq and seq % (2 * s.cp):
        up = -(-seq // (2 * s.cp)) * 2 * s.cp
        yield V(
            f"seq_length={seq} is not divisible by 2*CP = {2 * s.cp} (Bridge: 'Sequence length must be "
            "divisible by 2 * context parallel size')",
            f"set model.seq_length and dataset.seq_length to a multiple of {2 * s.cp} (e.g. {up})",
            K_SEQ,
            K_CP,
        )


@rule("LP-CP-002", E, "finetuning with CP > 1 needs calculate_per_token_loss=True", "§6.11")
def cp_per_token_loss(s: TrainingSetup) -> Iterator[Violation]:
    if s.cp > 1 and s.dataset.kind.is_finetuning and not s.model.calculate_per_token_loss:
        yield V(
            f"CP={s.cp} with a {s.dataset.kind} dataset and calculate_per_token_loss=False: a CP rank "
            "whose tokens are all masked produces a NaN loss",
            "set model.calculate_per_token_loss=true",
            K_PTL,
            K_CP,
        )


@rule("LP-CP-003", E, "finetuning with CP > 1 needs ddp.average_in_collective=False", "§6.11")
def cp_average_in_collective(s: TrainingSetup) -> Iterator[Violation]:
    if s.cp > 1 and s.dataset.kind.is_finetuning and s.average_in_collective:
        yield V(
            f"CP={s.cp} with a {s.dataset.kind} dataset and ddp.average_in_collective=True",
            "set ddp.average_in_collective=false",
            K_AIC,
            K_CP,
        )


def _a2a_level(s: TrainingSetup) -> tuple[int, str] | None:
    types = set(s.model.cp_comm_type)
    if "a2a" in types:
        return s.cp, "a2a over the whole CP group"
    if "a2a+p2p" in types and s.model.hierarchical_context_parallel_sizes:
        return s.model.hierarchical_context_parallel_sizes[0], "the a2a level of a2a+p2p"
    return None


@rule("LP-CP-004", E, "CP all-to-all needs heads/TP and KV heads/TP divisible by the a2a size", "D.7")
def cp_a2a_heads(s: TrainingSetup) -> Iterator[Violation]:
    level = _a2a_level(s)
    if level is None or s.cp == 1:
        return
    size, what = level
    for name, key, n in (
        ("num_attention_heads", "model.num_attention_heads", s.model.num_attention_heads),
        ("num_query_groups (KV heads)", "model.num_query_groups", s.model.num_query_groups),
    ):
        if not n or n % s.tp:
            continue
        local = n // s.tp
        if local % size:
            yield V(
                f"{name}/TP = {n}/{s.tp} = {local} is not divisible by {size} ({what}, cp_comm_type="
                f"{list(s.model.cp_comm_type)})",
                f"use cp_comm_type p2p (or a2a+p2p with a smaller a2a level dividing {local}), or change TP",
                "model.cp_comm_type",
                key,
                K_TP,
            )


@rule("LP-CP-005", E, "hierarchical_context_parallel_sizes multiply to CP", "D.7")
def cp_hierarchy_product(s: TrainingSetup) -> Iterator[Violation]:
    sizes = s.model.hierarchical_context_parallel_sizes
    if sizes and math.prod(sizes) != s.cp:
        yield V(
            f"hierarchical_context_parallel_sizes={list(sizes)} multiply to {math.prod(sizes)}, not CP={s.cp}",
            f"give sizes whose product is {s.cp}, e.g. [{min(8, s.cp)}, {s.cp // min(8, s.cp)}] for a2a+p2p",
            "model.hierarchical_context_parallel_sizes",
            K_CP,
        )


@rule("LP-CP-006", E, "cp_comm_type a2a+p2p needs hierarchical_context_parallel_sizes", "D.7")
def cp_hierarchy_required(s: TrainingSetup) -> Iterator[Violation]:
    if "a2a+p2p" in s.model.cp_comm_type and not s.model.hierarchical_context_parallel_sizes:
        yield V(
            "cp_comm_type uses a2a+p2p but hierarchical_context_parallel_sizes is not set",
            f"set model.hierarchical_context_parallel_sizes=[a2a_size, p2p_size] with product CP (CP={s.cp})",
            "model.cp_comm_type",
            "model.hierarchical_context_parallel_sizes",
        )


@rule(
    "LP-CP-007",
    E,
    "DirectHF/Energon/MockVLM seq_length divisible by the CP/SP collate multiple",
    "§6.8, C.2",
)
def cp_collate_multiple(s: TrainingSetup) -> Iterator[Violation]:
    if not s.dataset.kind.has_pad_to_max_length_attr:
        return
    seq = s.dataset.seq_length if s.dataset.seq_length is not None else s.model.seq_length
    m = s.required_pad_seq_to_mult
    if seq and m > 1 and seq % m:
        yield V(
            f"dataset.seq_length={seq} is not divisible by the CP/SP collate padding multiple {_m_text(s)}",
            f"set dataset.seq_length (and model.seq_length) to a multiple of {m}",
            K_DSEQ,
            K_CP,
            K_TP,
            K_SP,
        )


@rule("LP-CP-008", INFO, "CP shards of at least ~4096 tokens (docs rule of thumb)", "§8")
def cp_shard_size(s: TrainingSetup) -> Iterator[Violation]:
    seq = s.model_seq_length
    if s.cp > 1 and seq and seq // s.cp < 4096:
        yield V(
            f"seq_length {seq} / CP {s.cp} = {seq // s.cp} tokens per CP rank; the docs suggest CP ~ "
            "seq_len/4096 and 4096-8192 tokens per shard (CP pays off from ~8K)",
            f"consider CP={max(1, seq // 4096)} and spend the GPUs on DP",
            K_CP,
        )


@rule("LP-SEQ-001", E, "model.seq_length equals dataset.seq_length", "§6.14")
def seq_lengths_match(s: TrainingSetup) -> Iterator[Violation]:
    ms, ds = s.model.seq_length, s.dataset.seq_length
    if ms is not None and ds is not None and ms != ds:
        yield V(
            f"model.seq_length={ms} differs from dataset.seq_length={ds} (Bridge: 'Please ensure sequence length "
            "configuration in model config and dataset config match')",
            f"set both to the same value (model.seq_length={ds} or dataset.seq_length={ms})",
            K_SEQ,
            K_DSEQ,
        )


# ================================================================================================
# Batch sizes
# ================================================================================================


@rule("LP-BATCH-001", E, "GBS divisible by MBS*DP", "§6.9 (sampler / microbatch calculator)")
def gbs_divisible(s: TrainingSetup) -> Iterator[Violation]:
    dp, gbs = s.dp, s.global_batch_size
    if dp is None or gbs is None or s.micro_batch_size < 1:
        return
    unit = s.micro_batch_size * dp
    if gbs >= unit and gbs % unit:
        yield V(
            f"global_batch_size={gbs} is not divisible by MBS*DP = {s.micro_batch_size}*{dp} = {unit}",
            f"use GBS = {(gbs // unit) * unit} or {(gbs // unit + 1) * unit}",
            K_GBS,
            K_MBS,
        )


@rule("LP-BATCH-002", E, "GBS >= MBS*DP (every data-parallel rank gets a microbatch)", "§6.9, §8")
def gbs_at_least_dp(s: TrainingSetup) -> Iterator[Violation]:
    dp, gbs = s.dp, s.global_batch_size
    if dp is None or gbs is None or s.micro_batch_size < 1:
        return
    unit = s.micro_batch_size * dp
    if 0 < gbs < unit:
        yield V(
            f"global_batch_size={gbs} < MBS*DP = {s.micro_batch_size}*{dp} = {unit}: some data-parallel "
            "ranks would get no sample",
            f"raise train.global_batch_size to a multiple of {unit}, or lower DP (more TP/CP/PP or fewer GPUs)",
            K_GBS,
        )


@rule("LP-BATCH-003", E, "eval GBS divisible by eval MBS * eval DP", "§6.9")
def eval_gbs(s: TrainingSetup) -> Iterator[Violation]:
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


# ================================================================================================
# Offline and in-batch packing
# ================================================================================================


@rule("LP-PACK-001", E, "offline and in-batch packing are mutually exclusive", "§6.1")
def pack_exclusive(s: TrainingSetup) -> Iterator[Violation]:
    if s.dataset.enable_offline_packing and s.dataset.enable_in_batch_packing:
        yield V(
            "enable_offline_packing=True and enable_in_batch_packing=True (Bridge: 'mutually exclusive')",
            "keep one: offline packing for text SFT, in-batch packing for direct-HF/VLM collates",
            K_OFF,
            K_IBP,
        )


@rule("LP-PACK-002", E, "enable_offline_packing needs offline_packing_specs", "§6.2")
def pack_specs_missing(s: TrainingSetup) -> Iterator[Violation]:
    if s.dataset.enable_offline_packing and s.dataset.offline_packing_specs is None:
        yield V(
            "enable_offline_packing=True but offline_packing_specs is not set",
            f"set {K_PSS}=<pack size, e.g. the seq_length> (and {K_PSM})",
            K_OFF,
            K_SPECS,
        )


@rule("LP-PACK-003", E, "offline_packing_specs needs enable_offline_packing=True", "§6.2")
def pack_flag_missing(s: TrainingSetup) -> Iterator[Violation]:
    if s.dataset.offline_packing_specs is not None and not s.dataset.enable_offline_packing:
        yield V(
            "offline_packing_specs is set but enable_offline_packing=False",
            f"set {K_OFF}=true, or remove offline_packing_specs (~{K_SPECS})",
            K_OFF,
            K_SPECS,
        )


@rule("LP-PACK-004", E, "packed_sequence_size > 0 with offline packing", "§1, §6.12")
def pack_size_positive(s: TrainingSetup) -> Iterator[Violation]:
    pss = _pss(s)
    if s.dataset.offline_packing and pss is not None and pss <= 0:
        yield V(
            f"offline packing with packed_sequence_size={pss}",
            f"set {K_PSS} to the pack size (the docs recommend = seq_length)",
            K_PSS,
        )


@rule("LP-PACK-005", E, "offline packing needs micro_batch_size=1", "§6.12, §5.5")
def pack_mbs_one(s: TrainingSetup) -> Iterator[Violation]:
    pss = _pss(s)
    if s.dataset.offline_packing and s.micro_batch_size > 1 and pss and pss > 0:
        yield V(
            f"offline packing with micro_batch_size={s.micro_batch_size} (THD batches hold one packed row "
            "per microbatch)",
            "use the equivalent " + equivalent_offline_config(s.micro_batch_size, s.global_batch_size, pss),
            K_MBS,
            K_PSS,
        )


@rule("LP-PACK-006", E, "in-batch packing needs micro_batch_size > 1", "§6.13")
def inbatch_mbs(s: TrainingSetup) -> Iterator[Violation]:
    if s.dataset.enable_in_batch_packing and s.micro_batch_size == 1:
        yield V(
            "enable_in_batch_packing=True with micro_batch_size=1: in-batch packing concatenates the "
            "sequences of one microbatch, so it needs at least 2",
            "set train.micro_batch_size >= 2 (or use offline packing with MBS=1)",
            K_MBS,
            K_IBP,
        )


@rule("LP-PACK-007", E, "pad_cu_seqlens needs pad_to_max_length", "§6.3")
def pad_cu_needs_fixed(s: TrainingSetup) -> Iterator[Violation]:
    if _pad_cu(s) and not _fixed(s):
        yield V(
            "offline_packing_specs.pad_cu_seqlens=True but pad_to_max_length is not True",
            f"set {K_PTML}=true",
            K_PCU,
            K_PTML,
        )


@rule("LP-PACK-008", E, "pad_seq_to_mult splits every sequence into 2*CP equal chunks", "§1, §5.2, §9.9")
def pack_pad_mult(s: TrainingSetup) -> Iterator[Violation]:
    specs = s.dataset.offline_packing_specs
    if not s.dataset.offline_packing or specs is None:
        return
    m, c = s.required_pad_seq_to_mult, s.required_cp_multiple
    p = specs.pad_seq_to_mult
    if p is None:
        yield V(
            "pad_seq_to_mult=None breaks the runtime packed dataset (None > 1 raises TypeError)",
            f"set {K_PSM}={m}",
            K_PSM,
        )
    elif p >= 1 and p % c:
        yield V(
            f"pad_seq_to_mult={p} but with CP={s.cp} every packed sequence must split into 2*CP = {c} equal "
            "chunks (THD zigzag); Bridge never derives or checks this for offline packing, and the CP split "
            "fails at run time",
            f"set {K_PSM}={m} (= {_m_text(s)}) and rebuild the packed data into a fresh folder",
            K_PSM,
            K_CP,
        )


@rule("LP-PACK-016", W, "pad_seq_to_mult equals the documented lcm(2*CP, CP*TP with SP)", "§8")
def pack_pad_mult_docs(s: TrainingSetup) -> Iterator[Violation]:
    specs = s.dataset.offline_packing_specs
    if not s.dataset.offline_packing or specs is None or specs.pad_seq_to_mult is None:
        return
    m, c, p = s.required_pad_seq_to_mult, s.required_cp_multiple, specs.pad_seq_to_mult
    if p >= 1 and p % c == 0 and p % m:
        yield V(
            f"pad_seq_to_mult={p} is not a multiple of {_m_text(s)}: with sequence parallelism each row's "
            f"CP-local tokens must split over TP={s.tp}, which then holds only while every row width is a "
            "multiple of that (LP-PACK-012/013)",
            f"set {K_PSM}={m} as the docs recommend, and rebuild into a fresh folder",
            K_PSM,
            K_TP,
            K_SP,
        )


@rule("LP-PACK-009", INFO, "pad_seq_to_mult no larger than needed", "§8")
def pack_pad_mult_wasteful(s: TrainingSetup) -> Iterator[Violation]:
    specs = s.dataset.offline_packing_specs
    if not s.dataset.offline_packing or specs is None or specs.pad_seq_to_mult is None:
        return
    m, p = s.required_pad_seq_to_mult, specs.pad_seq_to_mult
    if p > m and p % m == 0:
        extra = " and selects TE's slower padded-offset kernel" if m == 1 else ""
        yield V(
            f"pad_seq_to_mult={p} is more than the {m} this topology needs: it adds padding{extra}",
            f"set {K_PSM}={m} unless you keep one packed build for several topologies",
            K_PSM,
        )


@rule("LP-PACK-010", W, "packed_sequence_size equals seq_length", "§6.14, §8")
def pack_size_equals_seq(s: TrainingSetup) -> Iterator[Violation]:
    pss = _pss(s)
    seq = s.dataset.seq_length if s.dataset.seq_length is not None else s.model.seq_length
    if s.dataset.offline_packing and pss and pss > 0 and seq and pss != seq:
        yield V(
            f"packed_sequence_size={pss} differs from seq_length={seq}; Bridge does not cross-check them, "
            "the docs say keep model, dataset and packed lengths equal",
            f"set {K_PSS}={seq} (or model/dataset.seq_length={pss}) and rebuild into a fresh folder",
            K_PSS,
            K_DSEQ,
        )


@rule("LP-PACK-011", E, "max_single_sequence_length <= packed_sequence_size", "§1, §2.6")
def pack_max_single(s: TrainingSetup) -> Iterator[Violation]:
    specs = s.dataset.offline_packing_specs
    if specs is None or specs.packed_sequence_size <= 0 or specs.max_single_sequence_length is None:
        return
    if specs.max_single_sequence_length > specs.packed_sequence_size:
        yield V(
            f"max_single_sequence_length={specs.max_single_sequence_length} > packed_sequence_size="
            f"{specs.packed_sequence_size}: an over-size sequence can never be placed",
            f"set max_single_sequence_length <= {specs.packed_sequence_size}",
            "dataset.offline_packing_specs.max_single_sequence_length",
            K_PSS,
        )


@rule(
    "LP-PACK-012", E, "packed width divisible by the topology multiple (trailing pad segment)", "§3.4, §5.2"
)
def pack_width_multiple(s: TrainingSetup) -> Iterator[Violation]:
    pss, m = _pss(s), s.required_pad_seq_to_mult
    if s.dataset.offline_packing and pss and pss > 0 and m > 1 and pss % m:
        yield V(
            f"packed_sequence_size={pss} is not a multiple of {_m_text(s)}: the trailing padding segment "
            f"up to the row width {pss} breaks the THD CP split",
            f"use a packed_sequence_size (and seq_length) that is a multiple of {m}",
            K_PSS,
            K_CP,
        )


@rule(
    "LP-PACK-013",
    E,
    "dynamic-width rounding (pad_seq_length_to_mult) a multiple of the topology multiple",
    "§3.1, §3.4, §5.2",
)
def pack_dynamic_width(s: TrainingSetup) -> Iterator[Violation]:
    m = s.required_pad_seq_to_mult
    if not s.dataset.offline_packing or _fixed(s) or m <= 1:
        return
    q = s.dataset.dataset_kwargs.get("pad_seq_length_to_mult", 16)
    if isinstance(q, int) and q > 0 and q % m:
        yield V(
            f"without pad_to_max_length the collate rounds each row to a multiple of pad_seq_length_to_mult="
            f"{q}, not of {_m_text(s)}; a trailing padding segment of the wrong size breaks the CP split",
            f"set dataset.dataset_kwargs.pad_seq_length_to_mult={math.lcm(q, m)} or {K_PTML}=true",
            "dataset.dataset_kwargs.pad_seq_length_to_mult",
            K_CP,
        )


@rule("LP-PACK-014", INFO, "pad_to_max_length is forced on with PP > 1 or EP > 1", "§6.7, C.2")
def pack_forced_fixed(s: TrainingSetup) -> Iterator[Violation]:
    if (
        s.dataset.kind.has_pad_to_max_length_attr
        and not s.dataset.pad_to_max_length
        and (s.pp > 1 or s.ep > 1)
    ):
        yield V(
            f"{s.dataset.kind} dataset with pad_to_max_length unset and PP={s.pp}, EP={s.ep}: Bridge turns it on, "
            f"so every row is {s.dataset.seq_length or s.model.seq_length} tokens wide",
            "set dataset.pad_to_max_length=true explicitly so the config says what runs",
            "dataset.pad_to_max_length",
            K_PP,
            K_EP,
        )


@rule(
    "LP-PACK-015",
    E,
    "GPT SFT in-batch packing cannot use dataloader_type='batch'",
    "Bridge GPTSFTDatasetConfig.validate",
)
def inbatch_dataloader(s: TrainingSetup) -> Iterator[Violation]:
    if (
        s.dataset.kind is DatasetKind.SFT
        and s.dataset.enable_in_batch_packing
        and s.dataset.dataloader_type == "batch"
    ):
        yield V(
            "enable_in_batch_packing=True with dataloader_type='batch' (Bridge: 'does not support "
            "dataloader_type='batch'')",
            "set dataset.dataloader_type=single (or cyclic)",
            "dataset.dataloader_type",
            K_IBP,
        )


@rule("LP-MTP-001", E, "no MTP with packed SFT", "§6.16 (docs), not enforced by code")
def mtp_packed(s: TrainingSetup) -> Iterator[Violation]:
    mtp = s.model.mtp_num_layers or 0
    if s.dataset.offline_packing and mtp > 0:
        yield V(
            f"offline packing with mtp_num_layers={mtp}: the docs list sequence packing for fine-tuning as "
            "not supported with MTP (Bridge does not check it)",
            f"set {K_MTP}=null (or 0) for packed SFT, or disable packing (~{K_SPECS} {K_OFF}=false)",
            K_MTP,
            K_OFF,
        )


# ================================================================================================
# CUDA graphs
# ================================================================================================


def _te_or_full(s: TrainingSetup) -> bool:
    return s.model.cuda_graph_impl == "transformer_engine" or s.model.full_iteration_graph


@rule("LP-CG-001", E, "offline packing with TE/full-iteration CUDA graphs needs pad_to_max_length", "§6.4")
def cg_fixed_width(s: TrainingSetup) -> Iterator[Violation]:
    if s.dataset.offline_packing and _te_or_full(s) and not _fixed(s):
        yield V(
            f"offline packing with cuda_graph_impl={s.model.cuda_graph_impl!r} (scope "
            f"{list(s.model.cuda_graph_scope) or 'whole layer'}) and no pad_to_max_length: graphs need static shapes",
            f"set {K_PTML}=true",
            K_CGI,
            K_PTML,
        )


@rule("LP-CG-002", E, "CUDA graphs that capture packed attention need pad_cu_seqlens", "§6.5")
def cg_pad_cu(s: TrainingSetup) -> Iterator[Violation]:
    m = s.model
    scope = set(m.cuda_graph_scope) - {"full_iteration"}
    captures_attn = m.full_iteration_graph or (
        m.cuda_graph_impl == "transformer_engine" and (not scope or "attn" in scope)
    )
    if s.dataset.offline_packing and captures_attn and not _pad_cu(s):
        yield V(
            f"cuda_graph_impl={m.cuda_graph_impl!r} with scope {list(m.cuda_graph_scope) or 'whole layer'} captures "
            "packed attention, but pad_cu_seqlens=False (cu_seqlens would change shape every step)",
            f"set {K_PCU}=true (needs {K_PTML}=true and the <N>_metadata.jsonl file), or use {K_CGS}=[mlp]",
            K_PCU,
            K_CGS,
        )


@rule("LP-CG-003", E, "full-iteration CUDA graph needs check_for_nan_in_loss=False", "§6.15")
def cg_full_iteration_nan(s: TrainingSetup) -> Iterator[Violation]:
    if s.model.full_iteration_graph and s.check_for_nan_in_loss:
        yield V(
            "full-iteration CUDA graph with rerun_state_machine.check_for_nan_in_loss=True",
            "set rerun_state_machine.check_for_nan_in_loss=false",
            "rerun_state_machine.check_for_nan_in_loss",
            K_CGI,
        )


@rule("LP-CG-004", E, "packed MoE: no router-scoped TE CUDA graphs", "§5.4")
def cg_moe_router(s: TrainingSetup) -> Iterator[Violation]:
    m = s.model
    if not s.is_moe or m.cuda_graph_impl != "transformer_engine":
        return
    scope = set(m.cuda_graph_scope)
    captures_router = not scope or bool(scope & ROUTER_SCOPES)
    padding_mask = s.dataset.offline_packing or (
        s.dataset.collate_in_batch_packing and s.required_pad_seq_to_mult > 1
    )
    if captures_router and padding_mask:
        yield V(
            f"MoE model with packed batches (they carry padding_mask) and TE CUDA graphs of scope "
            f"{sorted(scope) or 'whole layer'}, which captures the router (Bridge: 'Packed MoE padding masks do "
            "not support router-scoped Transformer Engine CUDA graphs')",
            f"use an attention-only scope ({K_CGS}=[attn]) or {K_CGI}=none",
            K_CGS,
            K_CGI,
        )


@rule("LP-CG-005", W, "CUDA graphs with variable packed shapes", "§8 (performance guide)")
def cg_variable_shapes(s: TrainingSetup) -> Iterator[Violation]:
    if not s.model.training_cuda_graph:
        return
    if s.dataset.collate_in_batch_packing and not (s.dataset.pad_to_max_length or s.pp > 1 or s.ep > 1):
        yield V(
            f"cuda_graph_impl={s.model.cuda_graph_impl!r} with collate-time in-batch packing: the packed width "
            "changes every step, and CUDA graphs support fixed-size packed sequences, not varying lengths",
            f"set {K_CGI}=none, or dataset.pad_to_max_length=true",
            K_CGI,
            K_IBP,
        )
    elif s.dataset.offline_packing and s.model.cuda_graph_impl == "local" and not _fixed(s):
        yield V(
            "cuda_graph_impl='local' with offline packing and no pad_to_max_length: every new row width is "
            "a new shape",
            f"set {K_PTML}=true (and {K_PCU}=true), or {K_CGI}=none",
            K_CGI,
            K_PTML,
        )


# ================================================================================================
# Energon native packing
# ================================================================================================


def _energon(s: TrainingSetup) -> bool:
    return s.dataset.energon_packing


@rule("LP-EN-001", E, "Energon packing needs train.micro_batch_size=1", "§6.6, C.2")
def en_mbs(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and s.micro_batch_size != 1:
        yield V(
            f"Energon native packing (packing_buffer_size={s.dataset.packing_buffer_size}) with "
            f"train.micro_batch_size={s.micro_batch_size}",
            "set train.micro_batch_size=1 (packs replace the batch dimension)",
            K_MBS,
            K_BUF,
        )


@rule("LP-EN-002", E, "Energon dataset and eval MBS equal train.micro_batch_size", "§6.6, C.2")
def en_mbs_match(s: TrainingSetup) -> Iterator[Violation]:
    if not _energon(s):
        return
    for key, value in (
        ("dataset.micro_batch_size", s.dataset.micro_batch_size),
        ("validation.eval_micro_batch_size", s.eval_micro_batch_size),
    ):
        if value is not None and value != s.micro_batch_size:
            yield V(
                f"{key}={value} differs from train.micro_batch_size={s.micro_batch_size}",
                f"set {key}={s.micro_batch_size}",
                key,
                K_MBS,
            )


@rule("LP-EN-003", E, "Energon packing needs calculate_per_token_loss=True", "§6.6, C.2")
def en_per_token(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and not s.model.calculate_per_token_loss:
        yield V(
            "Energon native packing with calculate_per_token_loss=False: packs hold a variable number of samples",
            "set model.calculate_per_token_loss=true",
            K_PTL,
        )


@rule("LP-EN-004", E, "Energon packing needs ddp.average_in_collective=False", "§6.6, C.2")
def en_avg(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and s.average_in_collective:
        yield V(
            "Energon native packing with ddp.average_in_collective=True",
            "set ddp.average_in_collective=false",
            K_AIC,
        )


@rule("LP-EN-005", E, "Energon packing does not support MTP", "§6.6, C.2")
def en_mtp(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and (s.model.mtp_num_layers or 0) > 0:
        yield V(
            f"Energon native packing with mtp_num_layers={s.model.mtp_num_layers}",
            f"set {K_MTP}=null, or turn native packing off ({K_BUF}=null)",
            K_MTP,
            K_BUF,
        )


@rule("LP-EN-006", E, "Energon packing does not support CUDA graphs", "§6.6, C.2")
def en_graphs(s: TrainingSetup) -> Iterator[Violation]:
    vision = s.model.vision_cuda_graph_impl
    if _energon(s) and (s.model.training_cuda_graph or vision not in (None, "none", "")):
        yield V(
            f"Energon native packing with cuda_graph_impl={s.model.cuda_graph_impl!r}, vision_cuda_graph_impl={vision!r}",
            f"set {K_CGI}=none and model.vision_cuda_graph_impl=none",
            K_CGI,
            "model.vision_cuda_graph_impl",
        )


@rule("LP-EN-007", E, "Energon packing does not support Qwen3-VL DistTrain", "§6.6, C.2")
def en_dist_train(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and s.use_dist_train:
        yield V(
            "Energon native packing with dist_train.use_dist_train=True",
            "set dist_train.use_dist_train=false",
            "dist_train.use_dist_train",
        )


@rule("LP-EN-008", E, "Energon packing does not support pipeline parallelism", "§6.6, C.2")
def en_pp(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and s.pp > 1:
        yield V(
            f"Energon native packing with pipeline_model_parallel_size={s.pp} ('does not yet support pipeline parallelism')",
            "set model.pipeline_model_parallel_size=1 (use TP/CP/EP), or turn native packing off",
            K_PP,
            K_BUF,
        )


@rule("LP-EN-009", W, "Energon packing turns MoE EP overlap and delayed wgrad off", "§6.6, C.2")
def en_ep_overlap(s: TrainingSetup) -> Iterator[Violation]:
    m = s.model
    if _energon(s) and (m.overlap_moe_expert_parallel_comm or m.delay_wgrad_compute or s.comm_overlap_moe_ep):
        yield V(
            "Energon native packing with overlap_moe_expert_parallel_comm/delay_wgrad_compute requested: Bridge "
            "disables both with a warning (the combined-1F1B schedule does not forward packed metadata)",
            "set model.overlap_moe_expert_parallel_comm=false and model.delay_wgrad_compute=false so the config "
            "says what runs",
            "model.overlap_moe_expert_parallel_comm",
            "model.delay_wgrad_compute",
        )


@rule("LP-EN-010", E, "Energon packing and in-batch packing are mutually exclusive", "C.1")
def en_inbatch(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and s.dataset.enable_in_batch_packing:
        yield V(
            "packing_buffer_size is set and enable_in_batch_packing=True (Bridge: 'select exactly one packing owner')",
            f"set {K_IBP}=false (or {K_BUF}=null)",
            K_IBP,
            K_BUF,
        )


@rule("LP-EN-011", E, "Energon packing cannot defer packing to the step", "C.1")
def en_defer(s: TrainingSetup) -> Iterator[Violation]:
    if _energon(s) and s.dataset.defer_in_batch_packing_to_step:
        yield V(
            "packing_buffer_size is set and defer_in_batch_packing_to_step=True (Bridge: 'use the canonical vlm_step path')",
            "set dataset.defer_in_batch_packing_to_step=false",
            "dataset.defer_in_batch_packing_to_step",
        )


@rule("LP-EN-012", E, "packing_buffer_size > 0", "C.1")
def en_buffer_positive(s: TrainingSetup) -> Iterator[Violation]:
    b = s.dataset.packing_buffer_size
    if s.dataset.kind is DatasetKind.ENERGON and b is not None and b <= 0:
        yield V(
            f"packing_buffer_size={b} must be > 0 (or null to turn packing off)", f"set {K_BUF}=16", K_BUF
        )


@rule("LP-EN-013", E, "Energon packing needs the Qwen-VL task encoder", "C.1")
def en_encoder(s: TrainingSetup) -> Iterator[Violation]:
    t = s.dataset.task_encoder_target
    if _energon(s) and t and "QwenVL" not in t.replace("_", ""):
        yield V(
            f"native packing with task encoder {t} (Bridge 'currently supports only QwenVLEnergonTaskEncoderConfig')",
            "use QwenVLEnergonTaskEncoderConfig, or turn native packing off and use in-batch packing",
            "dataset.task_encoder._target_",
            K_BUF,
        )


@rule("LP-EN-014", E, "Energon dataset_kwargs must not override builder-owned arguments", "C.1")
def en_builder_owned(s: TrainingSetup) -> Iterator[Violation]:
    if s.dataset.kind is not DatasetKind.ENERGON:
        return
    owned = sorted(k for k in s.dataset.dataset_kwargs if k in ENERGON_BUILDER_OWNED_KWARGS)
    if owned:
        yield V(
            f"dataset.dataset_kwargs overrides builder-owned arguments {owned}",
            "set them through the dataset config fields (micro_batch_size, packing_buffer_size, ...) instead",
            "dataset.dataset_kwargs",
        )


@rule("LP-EN-016", E, "Energon datasets have no test split (do_test=False)", "C.1")
def en_do_test(s: TrainingSetup) -> Iterator[Violation]:
    if s.dataset.kind is DatasetKind.ENERGON and s.dataset.do_test:
        yield V(
            "Energon dataset with do_test=True (EnergonDatasetConfig.validate rejects it)",
            "set dataset.do_test=false",
            "dataset.do_test",
        )


@rule("LP-EN-017", E, "Energon path set; worker, shuffle and sample limits valid", "C.1")
def en_fields(s: TrainingSetup) -> Iterator[Violation]:
    d = s.dataset
    if d.kind is not DatasetKind.ENERGON:
        return
    if d.path is not None and not d.path.strip():
        yield V("dataset.path is empty", "set dataset.path to the Energon dataset folder", "dataset.path")
    checks = (
        ("dataset.num_workers", d.num_workers, 0),
        ("dataset.num_val_workers", d.num_val_workers, 0),
        ("dataset.shuffle_buffer_size", d.shuffle_buffer_size, 1),
        ("dataset.max_samples_per_sequence", d.max_samples_per_sequence, 1),
        ("dataset.micro_batch_size", d.micro_batch_size, 1),
    )
    for key, value, low in checks:
        if value is not None and value < low:
            yield V(f"{key}={value} must be >= {low}", f"set {key} to a value >= {low} (or null)", key)


@rule("LP-EN-015", INFO, "Energon packing_buffer_size of at least 8 candidates", "§8")
def en_buffer_small(s: TrainingSetup) -> Iterator[Violation]:
    b = s.dataset.packing_buffer_size
    if _energon(s) and b is not None and 0 < b < 8:
        yield V(
            f"packing_buffer_size={b} gives first-fit-decreasing few candidates per pack",
            "the docs suggest starting at 8-16 candidates per worker (high-resolution or video data)",
            K_BUF,
        )


# ================================================================================================
# MoE dispatch
# ================================================================================================


@rule("LP-MOE-001", E, "EP > 1 with TP > 1 needs sequence parallelism", "MCore ModelParallelConfig")
def moe_sp(s: TrainingSetup) -> Iterator[Violation]:
    if s.ep > 1 and s.tp > 1 and not s.sp:
        yield V(
            f"EP={s.ep} and TP={s.tp} with sequence_parallel=False (Megatron-Core: 'When using expert parallelism "
            "and tensor parallelism, sequence parallelism must be used')",
            "set model.sequence_parallel=true",
            K_SP,
            K_EP,
            K_TP,
        )


def _fixed_effective(s: TrainingSetup) -> bool:
    forced = s.dataset.kind.has_pad_to_max_length_attr and (s.pp > 1 or s.ep > 1)
    return _fixed(s) or forced


@rule("LP-MOE-002", E, "HybridEP fixed packed width divisible by 128", "§8")
def moe_hybridep_width(s: TrainingSetup) -> Iterator[Violation]:
    width = s.packed_width
    if (
        s.model.uses_hybridep
        and s.dataset.any_packing
        and _fixed_effective(s)
        and width
        and width % HYBRIDEP_CHUNK
    ):
        yield V(
            f"HybridEP with fixed-width packed rows of {width} tokens: its {HYBRIDEP_CHUNK}-token combine chunk "
            f"needs a width divisible by {HYBRIDEP_CHUNK}",
            f"use a packed width (packed_sequence_size / seq_length) that is a multiple of "
            f"{math.lcm(HYBRIDEP_CHUNK, s.required_pad_seq_to_mult)}",
            K_PSS,
            K_DSEQ,
            "model.moe_flex_dispatcher_backend",
        )


@rule("LP-MOE-003", E, "HybridEP with CUDA graphs needs fixed-width packs", "§8")
def moe_hybridep_graphs(s: TrainingSetup) -> Iterator[Violation]:
    if (
        s.model.uses_hybridep
        and s.model.training_cuda_graph
        and s.dataset.any_packing
        and not _fixed_effective(s)
    ):
        yield V(
            "HybridEP with CUDA graphs and variable-width packed rows: graphed HybridEP must see equal per-rank "
            "dispatch shapes",
            f"set {K_PTML}=true (fixed width), or {K_CGI}=none",
            K_CGI,
            K_PTML,
        )


@rule("LP-MOE-004", W, "packing with expert capacity / token dropping is untested", "§8")
def moe_capacity(s: TrainingSetup) -> Iterator[Violation]:
    cf = s.model.moe_expert_capacity_factor
    if s.is_moe and s.dataset.any_packing and cf is not None:
        yield V(
            f"packed batches with moe_expert_capacity_factor={cf}: MCore may dispatch padding tokens, and "
            "expert-capacity/token-dropping setups have no packing coverage",
            "set model.moe_expert_capacity_factor=null (dropless) for packed training, or validate the loss first",
            "model.moe_expert_capacity_factor",
        )


# ================================================================================================
# Model-family opt-outs
# ================================================================================================


@rule("LP-MODEL-001", E, "family supports offline packing (Qwen3-Next, GLM-4.5 do not)", "§6.17")
def family_offline(s: TrainingSetup) -> Iterator[Violation]:
    f = s.family
    if f and f.any_packing and not f.offline_packing and s.dataset.offline_packing:
        yield V(
            f"{f.display_name} with offline packing: {f.opt_out_reason}",
            f"train {f.display_name} unpacked: {K_OFF}=false ~{K_SPECS} (the recipes use pad_seq_to_mult=1, MBS 1)",
            K_OFF,
            K_SPECS,
        )


@rule(
    "LP-MODEL-002",
    E,
    "family supports collate in-batch packing (Qwen3.5-VL, GLM-4.5V, Nemotron-VL do not)",
    "§6.17",
)
def family_inbatch(s: TrainingSetup) -> Iterator[Violation]:
    f = s.family
    if f and f.any_packing and not f.in_batch_packing and s.dataset.collate_in_batch_packing:
        fix = (
            "set dataset.defer_in_batch_packing_to_step=true (the model's step packs)"
            if f.name == "qwen3_5_vl"
            else f"set {K_IBP}=false"
        )
        yield V(f"{f.display_name} with collate in-batch packing: {f.opt_out_reason}", fix, K_IBP)


@rule("LP-MODEL-003", E, "family supports packing at all (Qwen3-Omni does not)", "§6.17")
def family_any(s: TrainingSetup) -> Iterator[Violation]:
    f = s.family
    if f and not f.any_packing and s.dataset.any_packing:
        yield V(
            f"{f.display_name} with packed sequences: {f.opt_out_reason}",
            f"turn packing off ({K_OFF}=false, {K_IBP}=false, {K_BUF}=null)",
            K_OFF,
            K_IBP,
        )


# ================================================================================================
# Packed data against the config (longpack check --packed DIR)
# ================================================================================================


@rule("LP-DATA-001", E, "metadata file present when pad_cu_seqlens", "§3.1, §3.5", scope="packed")
def data_metadata(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    if _pad_cu(s) and p.metadata_path is None:
        yield V(
            f"pad_cu_seqlens=True but {p.path} has no <N>_metadata.jsonl (Bridge: 'a metadata json file is "
            "required when pad_cu_seqlens is enabled')",
            "re-run the packing step so it writes the metadata file (or set packed_metadata_path)",
            K_PCU,
        )


@rule("LP-DATA-002", E, "pack size of the data equals packed_sequence_size", "§2.1", scope="packed")
def data_pack_size(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    pss = _pss(s)
    if p.pack_size is not None and pss and pss > 0 and p.pack_size != pss:
        yield V(
            f"{p.path} was packed for N={p.pack_size} tokens but packed_sequence_size={pss}",
            f"repack with packed_sequence_size={pss} into a fresh folder (or set {K_PSS}={p.pack_size})",
            K_PSS,
        )


@rule("LP-DATA-003", W, "pack size of the data equals seq_length", "§8", scope="packed")
def data_seq_length(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    seq = s.dataset.seq_length if s.dataset.seq_length is not None else s.model.seq_length
    pss = _pss(s)
    if p.pack_size is not None and seq and p.pack_size != seq and (pss is None or pss == p.pack_size):
        yield V(
            f"{p.path} was packed for N={p.pack_size} tokens but seq_length={seq}",
            f"keep model, dataset and packed lengths equal: repack with N={seq}",
            K_DSEQ,
        )


def _misaligned(p: PackedDataSummary, multiple: int) -> tuple[bool, str]:
    """Whether some packed sequence is not a multiple of ``multiple``, and how to say so."""
    count = p.misaligned_count(multiple)
    if count is None:  # not scanned for this multiple: the gcd of all lengths still decides
        return (
            p.segment_length_gcd % multiple != 0,
            f"packed sequence lengths share only the factor {p.segment_length_gcd}",
        )
    ex = p.first_misaligned_by_multiple.get(multiple) or (
        p.first_misaligned if multiple == p.checked_multiple else None
    )
    where = ""
    if ex is not None:
        where = f"; first: {ex.file} row {ex.row} sequence {ex.segment} has {ex.runtime_length} tokens"
    return count > 0, f"{count} of {p.segments} packed sequences are not a multiple of {multiple}{where}"


@rule("LP-DATA-004", E, "every packed sequence splits into 2*CP equal chunks", "§5.2, §9.9", scope="packed")
def data_alignment(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    c, m = s.required_cp_multiple, s.required_pad_seq_to_mult
    bad, text = _misaligned(p, c)
    if bad:
        yield V(
            f"{text} (2*CP = {c} for CP={s.cp}): the THD context-parallel split fails on them",
            f"repack with pad_seq_to_mult={m} into a fresh folder (longpack pack ... or {K_PSM}={m})",
            K_PSM,
            K_CP,
        )


@rule(
    "LP-DATA-010",
    W,
    "every packed sequence a multiple of the documented lcm(2*CP, CP*TP)",
    "§8",
    scope="packed",
)
def data_alignment_docs(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    c, m = s.required_cp_multiple, s.required_pad_seq_to_mult
    if m == c or _misaligned(p, c)[0]:
        return
    bad, text = _misaligned(p, m)
    if bad:
        yield V(
            f"{text} (= {_m_text(s)}): this works only while every row width is a multiple of {m}",
            f"repack with pad_seq_to_mult={m} into a fresh folder",
            K_PSM,
            K_SP,
        )


@rule("LP-DATA-005", E, "no packed row exceeds the pack size", "§2.6, §3.4", scope="packed")
def data_over_capacity(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    if p.rows_over_pack_size:
        yield V(
            f"{p.rows_over_pack_size} packed rows hold more than N={p.pack_size} runtime tokens (max "
            f"{p.max_row_runtime_tokens}); the collate asserts W <= max_seq_length",
            "repack: the packing step must never exceed the pack size",
            K_PSS,
        )


@rule(
    "LP-DATA-006",
    E,
    "fixed packed width divisible by the multiple (and 128 for HybridEP)",
    "§5.2, §8",
    scope="packed",
)
def data_fixed_width(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    n, m = p.pack_size, s.required_pad_seq_to_mult
    if n is None or _pss(s) == n:  # the config rules LP-PACK-012 / LP-MOE-002 already cover this width
        return
    needs_fixed = _fixed(s) or s.model.training_cuda_graph or s.model.uses_hybridep
    if not needs_fixed:
        return
    need = math.lcm(m, HYBRIDEP_CHUNK) if s.model.uses_hybridep else m
    if n % need:
        yield V(
            f"{p.path} packs to N={n}, used as a fixed width, which is not a multiple of {need}",
            f"repack with a pack size that is a multiple of {need}",
            K_PSS,
        )


@rule("LP-DATA-007", W, "packed data used with offline packing enabled", "§6.2", scope="packed")
def data_flag(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    if not s.dataset.offline_packing:
        yield V(
            f"--packed {p.path} given but the config does not enable offline packing",
            f"set {K_OFF}=true {K_PSS}={p.pack_size or '<N>'}",
            K_OFF,
        )


@rule("LP-DATA-008", E, "packed data needs micro_batch_size=1", "§5.5", scope="packed")
def data_mbs(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    if not s.dataset.offline_packing and s.micro_batch_size > 1:
        yield V(
            f"packed rows with micro_batch_size={s.micro_batch_size}: THD batches take one packed row per microbatch",
            "set train.micro_batch_size=1 and raise the pack size instead",
            K_MBS,
        )


@rule("LP-DATA-009", W, "recorded pad_seq_to_mult matches the topology", "§2.1, §8", scope="packed")
def data_recorded_mult(s: TrainingSetup, p: PackedDataSummary) -> Iterator[Violation]:
    r, m = p.recorded_pad_seq_to_mult, s.required_pad_seq_to_mult
    if r is not None and r % m:
        yield V(
            f"{p.path} records pad_seq_to_mult={r} but this topology needs a multiple of {_m_text(s)}: it was "
            "built for another topology",
            f"rebuild with pad_seq_to_mult={m} into a fresh folder",
            K_PSM,
        )


# ================================================================================================
# Runner
# ================================================================================================


def run_rules(
    setup: TrainingSetup, packed: PackedDataSummary | None = None, *, select: set[str] | None = None
) -> list[Finding]:
    """Run every registered rule (or those in ``select``) and return findings, errors first.

    When an input is not even positive (``LP-CFG-001``), only the ``LP-CFG`` rules run: the others would
    divide by it.
    """
    findings: list[Finding] = []
    basic_broken = any(True for _ in sizes_positive(setup))
    for r in RULES.values():
        if select is not None and r.id not in select:
            continue
        if basic_broken and not r.id.startswith("LP-CFG"):
            continue
        if r.scope == "packed":
            if packed is None:
                continue
            violations = list(r.check(setup, packed))
        else:
            violations = list(r.check(setup))
        for v in violations:
            findings.append(
                Finding(
                    rule_id=r.id,
                    severity=r.severity,
                    title=r.title,
                    message=v.message,
                    fix=v.fix,
                    keys=v.keys,
                    where=tuple(setup.where(*v.keys)),
                )
            )
    return sorted_findings(findings)


def has_errors(findings: Iterable[Finding]) -> bool:
    """Whether any finding is an error (``longpack check`` then exits 1)."""
    return any(f.severity is Severity.ERROR for f in findings)
