"""Megatron-Bridge ``ConfigContainer`` overrides for a planned layout, in four forms, and parsing them back.

Every setting the estimate assumes is emitted, so pasting the overrides reproduces what was estimated:
the parallel sizes, the pipeline layout, the CP communication type (with the hierarchical sizes of
``a2a+p2p``, and per-token loss normalisation, which packed finetuning with CP needs), TP-comm and DP overlap, the MoE dispatcher and EP overlap, the recompute modules, the
optimizer offload fraction, the CUDA-graph implementation and scope, the precision recipe, the fused
cross entropy, the batch and the sequence length. Keys are the Megatron-Bridge / Megatron-Core config
field names (``model.*`` for the ``GPTModelProvider`` / ``TransformerConfig``, ``optimizer.*`` for
``OptimizerConfig``, ``ddp.*``, ``comm_overlap.*``, ``train.*``, ``dataset.*``, ``mixed_precision`` for
the named precision recipes).

Forms: ``key=value`` lines in the Hydra override grammar that Megatron-Bridge's ``run_recipe.py``
parses (strings with special characters double-quoted, ``null``, ``true``/``false``, ``[a,b]`` lists);
the same as one shell-safe argument list (:func:`to_shell`); a nested YAML document (:func:`to_yaml`);
Python assignments on a recipe's ``cfg`` (:func:`to_python_snippet`). :func:`parse_overrides` reads
the lines back with ``longpack check``'s own override parser.

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

import re
import shlex
from typing import Any

import yaml

from longpack.planner.options import PlanError, PlanLayout, TrainingOptions
from longpack.topology import ParallelLayout

__all__ = [
    "format_override",
    "override_values",
    "parse_overrides",
    "to_overrides",
    "to_python_snippet",
    "to_shell",
    "to_yaml",
]

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
#: Megatron-Bridge's CUDA-graph settings for the planner's graph modes (the TE-scoped "partial" graphs of
#: the MoE perf recipes capture attention, router and dispatch preprocessing).
_GRAPH_IMPL = {"none": "none", "partial": "transformer_engine", "full": "full_iteration"}
_MOE_GRAPH_SCOPE = ["attn", "moe_router", "moe_preprocess"]

# A Hydra / YAML string that needs no quotes: an identifier-like word that YAML would not read as
# another type.
_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_YAML_WORDS = {"null", "true", "false", "yes", "no", "on", "off", "~"}  # YAML 1.1 non-strings


def format_override(key: str, value: Any) -> str:
    """One ``key=value`` in the Hydra override grammar (also valid YAML for the value).

    >>> format_override("model.pipeline_model_parallel_layout", "Et|(tt|)*30mL")
    'model.pipeline_model_parallel_layout="Et|(tt|)*30mL"'
    >>> format_override("model.virtual_pipeline_model_parallel_size", None)
    'model.virtual_pipeline_model_parallel_size=null'
    >>> format_override("model.recompute_modules", ["moe_act", "layernorm"])
    'model.recompute_modules=[moe_act,layernorm]'
    >>> format_override("model.cp_comm_type", "a2a+p2p"), format_override("x", True)
    ('model.cp_comm_type="a2a+p2p"', 'x=true')
    """
    return f"{key}={_format_value(value)}"


def _format_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    text = str(value)
    if _BARE.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def override_values(
    plan: PlanLayout,
    options: TrainingOptions,
    *,
    seq_length: int,
    gbs: int,
    pipeline_layout: str | None = None,
    hopper: bool = True,
    moe: bool = True,
    hierarchical_cp: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The overrides as typed values, in output order (``None`` = ``null``).

    ``hierarchical_cp``: the ``(a2a, p2p)`` sizes when ``cp_comm_type`` is ``a2a+p2p``.

    >>> from longpack.topology import ParallelLayout
    >>> v = override_values(PlanLayout(layout=ParallelLayout(world_size=8, tp=8, sp=True)), TrainingOptions(),
    ...                     seq_length=4096, gbs=8, moe=False)
    >>> v["comm_overlap.tp_comm_overlap"], v["model.recompute_granularity"], v["ddp.overlap_grad_reduce"]
    (True, None, True)
    """
    lay = plan.layout
    out: dict[str, Any] = {
        "model.tensor_model_parallel_size": lay.tp,
        "model.context_parallel_size": lay.cp,
        "model.pipeline_model_parallel_size": lay.pp,
        "model.virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp and lay.vpp > 1 else None,
        "model.expert_model_parallel_size": lay.ep,
        "model.expert_tensor_parallel_size": lay.expert_tp,
        "model.sequence_parallel": bool(lay.sp),
        "model.pipeline_model_parallel_layout": pipeline_layout or None,
    }
    if not moe:  # a dense model has no experts: no expert-parallel sizes to set
        del out["model.expert_model_parallel_size"], out["model.expert_tensor_parallel_size"]
    if lay.cp > 1:
        kind = options.cp_comm_type if options.cp_comm_type != "auto" else "p2p"
        out["model.cp_comm_type"] = kind
        if kind == "a2a+p2p":
            if hierarchical_cp is None:
                raise PlanError("cp_comm_type a2a+p2p needs its hierarchical (a2a, p2p) sizes")
            out["model.hierarchical_context_parallel_sizes"] = list(hierarchical_cp)
        # finetuning (packed SFT) with CP: a CP rank whose tokens are all loss-masked would divide by
        # zero without per-token loss normalisation (longpack check LP-CP rule)
        out["model.calculate_per_token_loss"] = True
    out["comm_overlap.tp_comm_overlap"] = bool(options.tp_comm_overlap and lay.tp > 1)
    out["ddp.overlap_grad_reduce"] = True
    out["ddp.overlap_param_gather"] = True
    if options.full_recompute:
        out["model.recompute_granularity"] = "full"
        out["model.recompute_method"] = "uniform"
        out["model.recompute_num_layers"] = 1
        out["model.recompute_modules"] = None
    elif options.recompute:
        out["model.recompute_granularity"] = "selective"
        out["model.recompute_modules"] = list(options.recompute)
    else:
        out["model.recompute_granularity"] = None
        out["model.recompute_modules"] = None
    if moe:
        if options.dispatcher in ("deepep", "hybridep"):
            out["model.moe_token_dispatcher_type"] = "flex"
            out["model.moe_flex_dispatcher_backend"] = options.dispatcher
        else:
            out["model.moe_token_dispatcher_type"] = options.dispatcher
        out["model.overlap_moe_expert_parallel_comm"] = bool(options.ep_overlap)
    out["model.cuda_graph_impl"] = _GRAPH_IMPL[options.cuda_graphs]
    out["model.cuda_graph_scope"] = list(_MOE_GRAPH_SCOPE) if options.cuda_graphs == "partial" and moe else []
    out["model.cross_entropy_loss_fusion"] = bool(options.fused_cross_entropy)
    out["mixed_precision"] = _PRECISION_RECIPES[(options.precision, hopper)]
    if options.fp8_attention:
        out["model.fp8_dot_product_attention"] = True
    out["optimizer.use_distributed_optimizer"] = bool(options.distributed_optimizer)
    out["optimizer.use_precision_aware_optimizer"] = options.optimizer == "adam_bf16_states"
    out["optimizer.optimizer_cpu_offload"] = options.optimizer_offload > 0
    if options.optimizer_offload > 0:
        out["optimizer.optimizer_offload_fraction"] = round(options.optimizer_offload, 4)
        out["optimizer.overlap_cpu_optimizer_d2h_h2d"] = True
    out["train.global_batch_size"] = gbs
    out["train.micro_batch_size"] = plan.mbs
    out["model.seq_length"] = seq_length
    out["dataset.seq_length"] = seq_length
    return out


def to_overrides(
    plan: PlanLayout,
    options: TrainingOptions,
    *,
    seq_length: int,
    gbs: int,
    pipeline_layout: str | None = None,
    hopper: bool = True,
    moe: bool = True,
    hierarchical_cp: tuple[int, int] | None = None,
) -> list[str]:
    """``key=value`` lines for Megatron-Bridge (``run_recipe.py ... key=value``, Hydra grammar)."""
    values = override_values(
        plan,
        options,
        seq_length=seq_length,
        gbs=gbs,
        pipeline_layout=pipeline_layout,
        hopper=hopper,
        moe=moe,
        hierarchical_cp=hierarchical_cp,
    )
    return [format_override(k, v) for k, v in values.items()]


def to_shell(lines: list[str]) -> str:
    """The override lines as shell words, one per line with ``\\`` continuations: paste after the
    launcher command; every word reaches the program exactly as printed in :func:`to_overrides`.

    >>> print(to_shell(['model.cp_comm_type="a2a+p2p"', "model.recompute_modules=[moe_act]"]))
    'model.cp_comm_type="a2a+p2p"' \\
    'model.recompute_modules=[moe_act]'
    """
    return " \\\n".join(shlex.quote(line) for line in lines)


def _nested(values: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for key, value in values.items():
        node = root
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return root


def to_yaml(lines: list[str]) -> str:
    """The overrides as one nested YAML document (``longpack check FILE`` and Bridge's ``--config-file``
    read it).

    >>> print(to_yaml(["model.tensor_model_parallel_size=2", "model.recompute_modules=null"]), end="")
    model:
      tensor_model_parallel_size: 2
      recompute_modules: null
    """
    return yaml.safe_dump(_nested(_values(lines)), sort_keys=False, default_flow_style=False)


def to_python_snippet(lines: list[str]) -> str:
    """The same overrides as Python assignments on a recipe's ``cfg`` (a ``ConfigContainer``).

    >>> print(to_python_snippet(["model.tensor_model_parallel_size=2", "mixed_precision=bf16_mixed"]))
    cfg.model.tensor_model_parallel_size = 2
    cfg.mixed_precision = 'bf16_mixed'
    """
    return "\n".join(f"cfg.{key} = {value!r}" for key, value in _values(lines).items())


def _values(lines: list[str]) -> dict[str, Any]:
    """Flat ``{key: value}`` of override lines, parsed by ``longpack check``'s override parser."""
    from longpack.rules.config_file import ConfigError as _ConfigFileError
    from longpack.rules.config_file import apply_overrides

    kept = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if "=" not in text:
            raise PlanError(f"override line {number} {line!r} has no '='; expected key=value")
        kept.append(text)
    try:
        nested = apply_overrides({}, kept)
    except _ConfigFileError as exc:
        raise PlanError(str(exc)) from exc
    flat: dict[str, Any] = {}
    for text in kept:
        key = text.split("=", 1)[0].lstrip("+").strip()
        node: Any = nested
        for part in key.split("."):
            node = node[part]
        flat[key] = node
    return flat


def parse_overrides(
    lines: list[str], *, world_size: int
) -> tuple[PlanLayout, TrainingOptions, dict[str, Any]]:
    """Read ``key=value`` override lines back into a layout, options and all the values.

    Raises :class:`PlanError` naming a malformed line.
    """
    values = _values(lines)
    vpp = values.get("model.virtual_pipeline_model_parallel_size")
    etp = values.get("model.expert_tensor_parallel_size")
    layout = ParallelLayout(
        world_size=world_size,
        tp=int(values.get("model.tensor_model_parallel_size", 1)),
        cp=int(values.get("model.context_parallel_size", 1)),
        pp=int(values.get("model.pipeline_model_parallel_size", 1)),
        vpp=int(vpp) if vpp else None,
        ep=int(values.get("model.expert_model_parallel_size", 1)),
        etp=int(etp) if etp is not None else None,
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
    graphs = {v: k for k, v in _GRAPH_IMPL.items()}.get(
        str(values.get("model.cuda_graph_impl", "none")), "none"
    )
    options = TrainingOptions(
        precision=_RECIPE_PRECISION.get(str(values.get("mixed_precision", "bf16_mixed")), "bf16"),
        recompute=recompute,
        optimizer_offload=float(values.get("optimizer.optimizer_offload_fraction", 1.0))
        if values.get("optimizer.optimizer_cpu_offload")
        else 0.0,
        dispatcher=str(dispatcher),
        optimizer="adam_bf16_states" if values.get("optimizer.use_precision_aware_optimizer") else "adam",
        distributed_optimizer=bool(values.get("optimizer.use_distributed_optimizer", True)),
        ep_overlap=bool(values.get("model.overlap_moe_expert_parallel_comm", False)),
        cp_comm_type=str(values.get("model.cp_comm_type", "p2p")),
        cuda_graphs=graphs,
        tp_comm_overlap=bool(values.get("comm_overlap.tp_comm_overlap", False)),
        fp8_attention=bool(values.get("model.fp8_dot_product_attention", False)),
        fused_cross_entropy=bool(values.get("model.cross_entropy_loss_fusion", True)),
    )
    return plan, options, values
