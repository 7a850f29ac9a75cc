"""Megatron-Bridge ``ConfigContainer`` overrides for a planned layout, and parsing them back.

Keys are the Megatron-Bridge / Megatron-Core config field names (``model.*`` for the
``GPTModelProvider`` / ``TransformerConfig``, ``optimizer.*`` for ``OptimizerConfig``, ``train.*``,
``dataset.*``, ``mixed_precision`` for the named precision recipes).

>>> from longpack.topology import ParallelLayout
>>> from longpack.planner.options import PlanLayout, TrainingOptions
>>> plan = PlanLayout(layout=ParallelLayout(world_size=64, tp=2, cp=2, ep=8, etp=1, pp=2, sp=True))
>>> lines = to_overrides(plan, TrainingOptions(recompute=("moe_act",)), seq_length=8192, gbs=64)
>>> lines[:3]
['model.tensor_model_parallel_size=2', 'model.context_parallel_size=2', 'model.pipeline_model_parallel_size=2']
>>> parse_overrides(lines, world_size=64)[0] == plan
True
"""

from __future__ import annotations

import ast
from typing import Any

from longpack.planner.options import PlanError, PlanLayout, TrainingOptions
from longpack.topology import ParallelLayout

_PRECISION_RECIPES = {
    ("bf16", False): "bf16_mixed",
    ("bf16", True): "bf16_mixed",
    ("fp8", True): "bf16_with_fp8_subchannel_scaling_mixed",  # Hopper: blockwise 1x128 / 128x128
    ("fp8", False): "bf16_with_fp8_current_scaling_mixed",  # Blackwell per-tensor current scaling
    ("mxfp8", False): "bf16_with_mxfp8_mixed",
    ("mxfp8", True): "bf16_with_mxfp8_mixed",
    ("nvfp4", False): "bf16_with_nvfp4_mixed",
    ("nvfp4", True): "bf16_with_nvfp4_mixed",
}
_RECIPE_PRECISION = {v: k[0] for k, v in _PRECISION_RECIPES.items()}


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if any(ch in value for ch in "|*() ") else value
    if isinstance(value, list | tuple):
        return "[" + ",".join(repr(v) for v in value) + "]"
    return str(value)


def to_overrides(
    plan: PlanLayout,
    options: TrainingOptions,
    *,
    seq_length: int,
    gbs: int,
    pipeline_layout: str | None = None,
    hopper: bool = True,
    moe: bool = True,
) -> list[str]:
    """``key=value`` lines for Megatron-Bridge (``run_recipe.py ... key=value`` / OmegaConf dotlist)."""
    lay = plan.layout
    out: dict[str, Any] = {
        "model.tensor_model_parallel_size": lay.tp,
        "model.context_parallel_size": lay.cp,
        "model.pipeline_model_parallel_size": lay.pp,
        "model.virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp and lay.vpp > 1 else None,
        "model.expert_model_parallel_size": lay.ep,
        "model.expert_tensor_parallel_size": lay.expert_tp,
        "model.sequence_parallel": bool(lay.sp),
    }
    if pipeline_layout:
        out["model.pipeline_model_parallel_layout"] = pipeline_layout
    if lay.cp > 1:
        out["model.cp_comm_type"] = options.cp_comm_type if options.cp_comm_type != "auto" else "p2p"
    if options.full_recompute:
        out["model.recompute_granularity"] = "full"
        out["model.recompute_method"] = "uniform"
        out["model.recompute_num_layers"] = 1
    elif options.recompute:
        out["model.recompute_granularity"] = "selective"
        out["model.recompute_modules"] = list(options.recompute)
    if moe:
        if options.dispatcher in ("deepep", "hybridep"):
            out["model.moe_token_dispatcher_type"] = "flex"
            out["model.moe_flex_dispatcher_backend"] = options.dispatcher
        else:
            out["model.moe_token_dispatcher_type"] = options.dispatcher
        out["model.overlap_moe_expert_parallel_comm"] = bool(options.ep_overlap)
    out["mixed_precision"] = _PRECISION_RECIPES[(options.precision, hopper)]
    out["optimizer.use_distributed_optimizer"] = bool(options.distributed_optimizer)
    if options.optimizer == "adam_bf16_states":
        out["optimizer.use_precision_aware_optimizer"] = True
    if options.optimizer_offload > 0:
        out["optimizer.optimizer_cpu_offload"] = True
        out["optimizer.optimizer_offload_fraction"] = round(options.optimizer_offload, 4)
        out["optimizer.overlap_cpu_optimizer_d2h_h2d"] = True
    out["train.global_batch_size"] = gbs
    out["train.micro_batch_size"] = plan.mbs
    out["model.seq_length"] = seq_length
    out["dataset.seq_length"] = seq_length
    return [f"{k}={_fmt(v)}" for k, v in out.items()]


def to_python_snippet(lines: list[str]) -> str:
    """The same overrides as Python assignments on a recipe's ``cfg`` (a ``ConfigContainer``).

    >>> print(to_python_snippet(["model.tensor_model_parallel_size=2", "mixed_precision=bf16_mixed"]))
    cfg.model.tensor_model_parallel_size = 2
    cfg.mixed_precision = 'bf16_mixed'
    """
    out = []
    for line in lines:
        key, _, raw = line.partition("=")
        value = _parse_value(raw)
        out.append(f"cfg.{key} = {value!r}")
    return "\n".join(out)


def _parse_value(raw: str) -> Any:
    if raw in ("None", "null"):
        return None
    if raw in ("True", "true"):
        return True
    if raw in ("False", "false"):
        return False
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def parse_overrides(
    lines: list[str], *, world_size: int
) -> tuple[PlanLayout, TrainingOptions, dict[str, Any]]:
    """Read ``key=value`` override lines back into a layout, options and the remaining values.

    Raises :class:`PlanError` naming a malformed line.
    """
    values: dict[str, Any] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, raw = line.partition("=")
        if not sep:
            raise PlanError(f"override line {number} {line!r} has no '='; expected key=value")
        values[key.strip()] = _parse_value(raw.strip())
    vpp = values.get("model.virtual_pipeline_model_parallel_size")
    layout = ParallelLayout(
        world_size=world_size,
        tp=int(values.get("model.tensor_model_parallel_size", 1)),
        cp=int(values.get("model.context_parallel_size", 1)),
        pp=int(values.get("model.pipeline_model_parallel_size", 1)),
        vpp=int(vpp) if vpp else None,
        ep=int(values.get("model.expert_model_parallel_size", 1)),
        etp=int(values["model.expert_tensor_parallel_size"])
        if values.get("model.expert_tensor_parallel_size") is not None
        else None,
        sp=bool(values.get("model.sequence_parallel", False)),
    )
    plan = PlanLayout(layout=layout, mbs=int(values.get("train.micro_batch_size", 1)))
    granularity = values.get("model.recompute_granularity")
    recompute: tuple[str, ...] = ()
    if granularity == "full":
        recompute = ("full",)
    elif granularity == "selective":
        recompute = tuple(values.get("model.recompute_modules") or ())
    dispatcher = values.get("model.moe_token_dispatcher_type", "alltoall")
    if dispatcher == "flex":
        dispatcher = values.get("model.moe_flex_dispatcher_backend", "deepep")
    options = TrainingOptions(
        precision=_RECIPE_PRECISION.get(str(values.get("mixed_precision", "bf16_mixed")), "bf16"),
        recompute=recompute,
        optimizer_offload=float(values.get("optimizer.optimizer_offload_fraction", 0.0))
        if values.get("optimizer.optimizer_cpu_offload")
        else 0.0,
        dispatcher=str(dispatcher),
        optimizer="adam_bf16_states" if values.get("optimizer.use_precision_aware_optimizer") else "adam",
        distributed_optimizer=bool(values.get("optimizer.use_distributed_optimizer", True)),
        ep_overlap=bool(values.get("model.overlap_moe_expert_parallel_comm", False)),
        cp_comm_type=str(values.get("model.cp_comm_type", "p2p")),
    )
    return plan, options, values
