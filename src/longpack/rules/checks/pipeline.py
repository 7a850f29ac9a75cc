"""Pipeline layouts: how the decoder layers (plus embedding, loss and MTP) split over PP x VPP stages.

>>> suggest_layout(61, 8, 4, 1)
'Et|(tt|)*30mL'
>>> vpp_has_pp(2, pp=1), vpp_has_pp(None, pp=1)
(False, True)
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from longpack.rules.checks.common import K_LAYOUT, K_MTP, K_PP, K_VPP, E, V
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation
from longpack.topology import TopologyError, parse_pipeline_layout, pipeline_split

FAMILY = RuleFamily("pipeline", "Pipeline layouts")


def vpp_has_pp(vpp: int | None, *, pp: int) -> bool:
    """Virtual pipeline stages (interleaving) exist only with pipeline parallelism (``LP-PP-006``)."""
    return vpp is None or vpp <= 1 or pp > 1


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


@FAMILY.rule(
    "LP-PP-001",
    E,
    "layers divisible by PP*VPP when no uneven layout is given",
    "MCore TransformerConfig",
    fix="give a model.pipeline_model_parallel_layout (the finding suggests one), or change PP/VPP",
)
def pp_even(s: TrainingSetup) -> Iterator[Violation]:
    """Without an uneven-split setting Megatron-Core gives every one of the ``PP*VPP`` stages the same
    number of decoder layers, so the layer count must divide evenly."""
    if (s.pp > 1 or (s.model.virtual_pipeline_model_parallel_size or 1) > 1) and _pp_method(s) == "even":
        err = _split_error(s)
        if err:
            yield V(err, _layout_fix(s), "model.num_layers", K_PP, K_VPP)


@FAMILY.rule(
    "LP-PP-002",
    E,
    "pipeline_model_parallel_layout valid for PP, VPP, layers and MTP",
    "MCore PipelineParallelLayerLayout",
    fix="write PP*VPP stages of E, t, m, L placing every decoder and MTP layer once",
)
def pp_layout(s: TrainingSetup) -> Iterator[Violation]:
    """A custom layout must parse, have ``PP*VPP`` stages, and place every decoder layer, every MTP layer,
    the embedding and the loss exactly once."""
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


@FAMILY.rule(
    "LP-PP-003",
    E,
    "first/last pipeline-stage layer counts valid",
    "MCore TransformerConfig",
    fix="adjust model.num_layers_in_first/last_pipeline_stage so the middle stages split evenly",
)
def pp_first_last(s: TrainingSetup) -> Iterator[Violation]:
    """With ``num_layers_in_first/last_pipeline_stage`` the remaining layers must split evenly over the
    middle stages."""
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


@FAMILY.rule(
    "LP-PP-004",
    E,
    "account_for_embedding/loss split divisible by PP*VPP",
    "MCore TransformerConfig",
    fix="set both account_for_* flags or neither so the counted layers divide by PP*VPP, or use a layout",
)
def pp_account_for(s: TrainingSetup) -> Iterator[Violation]:
    """``account_for_embedding/loss_in_pipeline_split`` count the embedding and the loss as layers; the
    counted total must divide evenly over the stages."""
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


@FAMILY.rule(
    "LP-PP-005",
    E,
    "only one uneven-pipeline mechanism at a time",
    "MCore TransformerConfig",
    fix="keep only the layout (or only the first/last counts)",
)
def pp_conflicts(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core accepts a custom layout, first/last-stage counts or the account_for flags, but not a
    combination of them."""
    msg = _pp_conflict(s)
    if msg:
        yield V(
            msg + "; Megatron-Core rejects the combination",
            "keep only the layout (or only the first/last counts)",
            K_LAYOUT,
            "model.num_layers_in_first_pipeline_stage",
            "model.account_for_embedding_in_pipeline_split",
        )


@FAMILY.rule(
    "LP-PP-006",
    E,
    "virtual pipeline stages need PP > 1",
    "MCore",
    fix="set model.virtual_pipeline_model_parallel_size=null, or raise PP",
)
def vpp_needs_pp(s: TrainingSetup) -> Iterator[Violation]:
    """Interleaved (virtual) pipeline stages are chunks of pipeline ranks; with one pipeline rank there
    is nothing to interleave."""
    v = s.model.virtual_pipeline_model_parallel_size
    if not vpp_has_pp(v, pp=s.pp):
        yield V(
            f"virtual_pipeline_model_parallel_size={v} with pipeline_model_parallel_size=1",
            "set model.virtual_pipeline_model_parallel_size=null, or raise PP",
            K_VPP,
            K_PP,
        )
