"""Compare the planner's estimates with published runs, and fit the time model's free constants.

A calibration file has the schema of ``calibration_points.yaml`` (a ``points:`` list; each point has
``model``, ``gpu``, ``num_gpus``, ``seq_len``, ``tp``/``cp``/``ep``/``etp``/``pp``/``vpp``, ``mbs``,
``gbs``, ``precision``, ``result: {tflops_per_gpu, mem_*}`` and optional recipe settings). Points
whose model or GPU is not in the catalogs, or whose layout is incomplete, are reported as skipped
with the reason — never guessed.

>>> pts, skipped = load_points()
>>> len(pts) > 50, sorted({p.gpu for p in pts})[:2], dict(skipped)["cp230"]
(True, ['B200', 'GB200'], "unknown model 'moonlight_16b_a3b'")
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from longpack.errors import InputError
from longpack.outputs import atomic_write_bytes
from longpack.planner.catalog import CatalogError, load_gpu, load_model
from longpack.planner.memory import GIB, estimate_memory
from longpack.planner.options import PlanError, PlanLayout, TrainingOptions
from longpack.planner.timing import TimeModelParams, estimate_time, fitted_params
from longpack.topology import ParallelLayout, TopologyError, parse_pipeline_layout

_MEMORY_KEYS = ("mem_peak_allocated_GiB_rank0", "mem_peak_GB", "mem_allocated_GB", "mem_per_gpu_GB")


@dataclass(frozen=True, kw_only=True)
class CalibrationPoint:
    """One measured run, normalized to planner inputs."""

    id: str
    model: str
    gpu: str
    plan: PlanLayout
    seq_length: int
    gbs: int
    options: TrainingOptions
    tflops: float | None
    memory_gib: float | None
    superseded: bool
    memory_rank: str = "hot"
    stage_counts: tuple[int, ...] | None = None
    #: the publication it comes from (:func:`source_key`: repository and file, or arXiv id), what
    #: leave-one-source-out holds out together
    source: str = ""
    #: measured tokens per second per GPU when the source states it (step-time comparisons use it, so
    #: a source's FLOP convention cannot hide an error)
    tokens_per_s: float | None = None


def _precision(raw: str, gpu_arch: str) -> str:
    text = raw.lower()
    blackwell = gpu_arch.startswith("blackwell")
    if "nvfp4" in text:
        return "nvfp4"
    if "fp8" in text:
        # MXFP8 exists only on Blackwell; the 25.09 table's "FP8" means MXFP8 there, blockwise on Hopper
        return "mxfp8" if blackwell and ("mx" in text or "25.09" in text) else "fp8"
    return "bf16"


def _settings(point: dict[str, Any]) -> dict[str, str]:
    recipe = point.get("recipe_at_head") or {}
    if not recipe.get("parallelism_matches_table"):
        return {}
    return {k: str(v) for k, v in (recipe.get("settings") or {}).items()}


def _recompute(point: dict[str, Any], settings: dict[str, str]) -> tuple[str, ...]:
    text = str(point.get("recompute") or "")
    other = str(point.get("other") or "").lower()
    if not text and "recompute" in other:
        text = other.split("recompute")[-1].replace("up_proj", "mla_up_proj").replace("mla_mla_", "mla_")
        text = text.split("(")[-1].split(")")[0]
    if not text and settings:
        if settings.get("recompute_granularity", "").lower() == "full":
            return ("full",)
        text = settings.get("recompute_modules", "")
    text = text.lower()
    if "full" in text:
        return ("full",)
    found = []
    for name in ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "shared_experts"):
        if name in text:
            found.append(name)
    if "moe" in text.replace("moe_act", "").replace("moe_", ""):
        found.append("moe")
    return tuple(found)


def _dispatcher(point: dict[str, Any], settings: dict[str, str]) -> str:
    text = (
        str(point.get("dispatcher") or "") + " " + settings.get("moe_flex_dispatcher_backend", "")
    ).lower()
    for name in ("hybridep", "deepep", "allgather", "alltoall"):
        if name in text:
            return name
    if settings.get("moe_token_dispatcher_type", "").lower() == "alltoall":
        return "alltoall"
    return "alltoall"


def _graphs(point: dict[str, Any], settings: dict[str, str]) -> str:
    impl = settings.get("cuda_graph_impl", "").lower()
    if "full_iteration" in impl:
        return "full"
    if (
        impl in ("local", "transformer_engine")
        or point.get("cuda_graph")
        or "cuda graph" in str(point.get("other") or "").lower()
    ):
        return "partial"
    return "none"


def _measured_memory(result: dict[str, Any]) -> tuple[float | None, str]:
    """Measured peak memory in GiB and which pipeline rank it describes (``first``, ``last``, ``hot``).

    Units: Megatron-Bridge logs ``mem-max-allocated-gigabytes`` from ``torch.cuda.memory_stats()``
    in decimal GB (1e9 B); the skills cards quote those values as "GB" and, where they mean GiB,
    say so (Nemotron-3-Nano study: "66.297 GB after iteration 1 ... about 72.9 GiB allocated").
    Rank: the Bridge/Megatron memory scalars in the training log summary, TensorBoard and W&B are
    written by the last global rank only (Megatron ``global_vars``: the TensorBoard / W&B writers
    exist on ``rank == world_size - 1``; ``training_log`` uses ``print_rank_last``), and with
    Megatron's rank order (pp outermost) that rank sits on the LAST pipeline stage. Evidence in
    the data: Llama-3-70B PR #3107 "58.8 GB (OOM on rank 0)" — a run whose rank 0 ran out of 80 GB
    while the logged peak was 58.8 GB. So ``mem_peak_GB`` / ``mem_allocated_GB`` are compared with
    the last stage, ``mem_peak_allocated_GiB_rank0`` with rank 0, and a paper's per-GPU figure
    (``mem_per_gpu_GB``) with the most loaded rank.

    >>> gib, rank = _measured_memory({"mem_peak_GB": 58.8})
    >>> round(gib, 2), rank
    (54.76, 'last')
    >>> _measured_memory({"mem_peak_allocated_GiB_rank0": 62.166})
    (62.166, 'first')
    """
    if isinstance(result.get("mem_peak_allocated_GiB_rank0"), int | float):
        return float(result["mem_peak_allocated_GiB_rank0"]), "first"
    for key, rank in (("mem_peak_GB", "last"), ("mem_allocated_GB", "last"), ("mem_per_gpu_GB", "hot")):
        if isinstance(result.get(key), int | float):
            return float(result[key]) * 1e9 / GIB, rank
    return None, "hot"


def normalize_point(point: dict[str, Any]) -> CalibrationPoint:
    """Turn one raw calibration mapping into planner inputs; raises ``ValueError`` naming what is missing."""
    pid = str(point.get("id", "?"))
    if point.get("exclude"):
        raise ValueError(f"point {pid}: excluded: {point['exclude']}")
    model = load_model(str(point.get("model", "")).split(" ")[0])
    gpu = load_gpu(str(point.get("gpu", "")))
    result = point.get("result") or {}
    memory_only = not isinstance(result.get("tflops_per_gpu"), int | float) and any(
        isinstance(result.get(k), int | float) for k in _MEMORY_KEYS
    )
    for key in ("num_gpus", "seq_len", "tp", "pp", "gbs"):
        if key == "gbs" and memory_only and point.get(key) is None:
            continue  # peak memory does not depend on GBS once the pipeline is full (assumed below)
        if not isinstance(point.get(key), int):
            raise ValueError(f"point {pid}: field {key!r} missing or not an integer")
    settings = _settings(point)
    tp = point["tp"]
    etp = point.get("etp")
    vpp = point.get("vpp")
    layout = ParallelLayout(
        world_size=point["num_gpus"],
        tp=tp,
        cp=point.get("cp") or 1,
        pp=point["pp"],
        vpp=vpp if vpp and vpp > 1 else None,
        ep=point.get("ep") or 1,
        etp=etp if isinstance(etp, int) else (1 if model.moe else None),
        sp=tp > 1,
    )
    plan = PlanLayout(layout=layout, mbs=int(point.get("mbs") or 1), dense=model.moe is None)
    gbs = point.get("gbs")
    if not isinstance(gbs, int):  # memory-only point: a full pipeline (m = 4·p·v micro-batches)
        gbs = layout.dp * plan.mbs * 4 * layout.pp * (layout.vpp or 1)
    precision = _precision(str(point.get("precision", "bf16")), gpu.arch)
    ep_overlap = (
        settings.get("overlap_moe_expert_parallel_comm", "").lower() == "true"
        or "a2a overlap on" in str(point.get("other", "")).lower()
    )
    if isinstance(point.get("ep_overlap"), bool):
        ep_overlap = point["ep_overlap"]
    tp_overlap = point.get("tp_comm_overlap")
    if not isinstance(tp_overlap, bool):
        # Megatron-Bridge's dense recipes turn TP-comm overlap on; its MoE recipes mostly leave it off
        tp_overlap = settings.get("tp_comm_overlap", str(model.moe is None)).lower() == "true"
    optimizer = str(point.get("optimizer") or ("muon" if model.name == "kimi_k2" else "adam"))
    stage_counts = None
    if point.get("pipeline_layout"):
        stages = parse_pipeline_layout(str(point["pipeline_layout"]))
        if len(stages) != layout.pp * (layout.vpp or 1):
            raise ValueError(f"point {pid}: pipeline_layout has {len(stages)} stages, not pp*vpp")
        stage_counts = tuple(sum(1 for x in st if x == "decoder") for st in stages)
    options = TrainingOptions(
        precision=precision,
        recompute=_recompute(point, settings),
        dispatcher=_dispatcher(point, settings) if model.moe else "alltoall",
        ep_overlap=ep_overlap and layout.ep > 1,
        cuda_graphs=_graphs(point, settings),
        optimizer=optimizer,
        main_grads_fp32=bool(point.get("main_grads_fp32", False)),
        optimizer_offload=float(point.get("optimizer_offload") or 0.0),
        fsdp=bool(point.get("fsdp")) and str(point.get("fsdp")) not in ("0", "False"),
        # Megatron's default cp_comm_type is p2p; a point that names another says so
        cp_comm_type=str(point.get("cp_comm_type") or settings.get("cp_comm_type") or "p2p"),
        tp_comm_overlap=tp_overlap and layout.tp > 1,
    )
    tflops = result.get("tflops_per_gpu")
    tokens = result.get("tokens_per_sec_per_gpu")
    mem, mem_rank = _measured_memory(result)
    return CalibrationPoint(
        id=pid,
        model=model.name,
        gpu=gpu.name,
        plan=plan,
        seq_length=int(point["seq_len"]),
        gbs=int(gbs),
        options=options,
        tflops=float(tflops) if isinstance(tflops, int | float) else None,
        memory_gib=mem,
        superseded=bool(point.get("superseded_by_newer_release")),
        memory_rank=mem_rank,
        stage_counts=stage_counts,
        source=source_key(str(point.get("source") or pid)),
        tokens_per_s=float(tokens) if isinstance(tokens, int | float) and tokens > 0 else None,
    )


def source_key(text: str) -> str:
    """The publication a calibration point's ``source`` names: ``owner/repo:path`` (commit, release and
    section dropped; a Megatron-Bridge performance summary and its archive are one page, the same table
    over releases), else an arXiv id, else the text's first words.

    >>> source_key("NVIDIA-NeMo/Megatron-Bridge:docs/performance-summary-archive.md@067f987d [release 26.04]")
    'NVIDIA-NeMo/Megatron-Bridge:docs/performance-summary.md'
    >>> source_key("'NVIDIA/skills:skills/x/card.yaml@7149a88 (validated_on 2026-04-01) data")
    'NVIDIA/skills:skills/x/card.yaml'
    >>> source_key("Korthikanti et al. 2022 (arXiv:2205.05198) Table 5")
    'arXiv:2205.05198'
    """
    import re

    t = " ".join(text.split()).lstrip("'\"")
    m = re.match(r"([\w.-]+/[\w.-]+):([^@\s]+)", t)
    if m:
        return (
            f"{m.group(1)}:{m.group(2).replace('performance-summary-archive.md', 'performance-summary.md')}"
        )
    m = re.search(r"arXiv:\s*(\d{4}\.\d{4,5})", t)
    if m:
        return f"arXiv:{m.group(1)}"
    return " ".join(t.split()[:3])


def read_calibration(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The raw ``points:`` mappings of a calibration file (default: the packaged one).

    >>> len(read_calibration()) > 80
    True
    """
    if path is None:
        text = (
            resources.files("longpack")
            .joinpath("data", "calibration_points.yaml")
            .read_text(encoding="utf-8")
        )
        where = "calibration_points.yaml"
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: cannot read calibration file: {exc}", fields="calibration") from exc
    # the packaged file is ours: the C loader reads it ~7x faster (plan and its reference read it)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader) if path is None else yaml.SafeLoader
    try:
        raw = yaml.load(text, Loader=loader) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None else where
        raise InputError(
            f"{at}: not valid YAML ({getattr(exc, 'problem', None) or exc})", fields="calibration"
        ) from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("points"), list):
        raise InputError(
            f"{where}: expected a mapping with a 'points:' list (schema of calibration_points.yaml)",
            fields="calibration",
        )
    return list(raw["points"])


def load_points(path: str | Path | None = None) -> tuple[list[CalibrationPoint], list[tuple[str, str]]]:
    """Normalized points of a calibration file (default: the packaged ``calibration_points.yaml``)
    and ``(id, reason)`` for every point that was skipped."""
    points: list[CalibrationPoint] = []
    skipped: list[tuple[str, str]] = []
    for entry in read_calibration(path):
        if not isinstance(entry, dict):
            skipped.append(("?", f"not a mapping: {entry!r:.40}"))
            continue
        try:
            points.append(normalize_point(entry))
        except (CatalogError, PlanError, TopologyError, ValueError) as exc:
            skipped.append((str(entry.get("id", "?")), str(exc).split(";")[0]))
    return points, skipped


@functools.cache
def packaged_points() -> tuple[CalibrationPoint, ...]:
    """The normalized points of the packaged calibration file (read once per process)."""
    return tuple(load_points()[0])


@dataclass(frozen=True, kw_only=True)
class PointResult:
    """Prediction vs measurement for one point (``None`` where not measured / not computable)."""

    id: str
    model: str
    gpu: str
    layout: str
    precision: str
    measured_tflops: float | None
    predicted_tflops: float | None
    tflops_error: float | None
    measured_memory_gib: float | None
    predicted_memory_gib: float | None
    memory_error: float | None
    memory_rank: int | None = None  # pipeline rank the memory prediction describes
    seq_length: int = 0
    band: str = ""
    #: step-time error: measured step time / predicted step time - 1 (from tokens/s where the source
    #: states it, else from TFLOP/s with the same FLOP count on both sides); + = ran slower than predicted
    step_error: float | None = None
    source: str = ""
    #: leave-one-out only: the step-time error of the estimate anchored on a published run of the same
    #: model and GPU from another publication (``longpack.planner.level``), and that run's id
    anchored_step_error: float | None = None
    anchor: str = ""


#: Context-length bands of the error report (tokens per sequence).
BANDS = ("<=8K", "16-32K", "64K+")


def context_band(seq_length: int) -> str:
    """The report band of a sequence length: ``<=8K``, ``16-32K`` (anything up to 32K) or ``64K+``.

    >>> context_band(4096), context_band(16384), context_band(32768), context_band(131072)
    ('<=8K', '16-32K', '16-32K', '64K+')
    """
    if seq_length <= 8192:
        return BANDS[0]
    if seq_length <= 32768:
        return BANDS[1]
    return BANDS[2]


def predict_time(point: CalibrationPoint, params: TimeModelParams | None = None) -> Any:
    """The step-time estimate (``TimeBreakdown``) of one point (``None`` when it cannot be evaluated)."""
    try:
        return estimate_time(
            load_model(point.model),
            load_gpu(point.gpu),
            point.plan,
            seq_length=point.seq_length,
            gbs=point.gbs,
            options=point.options,
            params=params,
            stage_counts=point.stage_counts,
        )
    except PlanError:
        return None


def predict_tflops(point: CalibrationPoint, params: TimeModelParams | None = None) -> float | None:
    """Predicted TFLOP/s/GPU of one point (``None`` when the layout cannot be evaluated)."""
    tim = predict_time(point, params)
    return None if tim is None else float(tim.tflops_per_gpu)


def step_error(point: CalibrationPoint, tim: Any) -> float | None:
    """Measured / predicted step time − 1 of one point: from tokens/s/GPU when the source states them,
    else from TFLOP/s/GPU (the planner's FLOP count on both sides)."""
    if tim is None:
        return None
    if point.tokens_per_s:
        return float(tim.tokens_per_s_per_gpu) / point.tokens_per_s - 1
    if point.tflops:
        return float(tim.tflops_per_gpu) / point.tflops - 1
    return None


def evaluate_point(point: CalibrationPoint, params: TimeModelParams | None = None) -> PointResult:
    """Predicted TFLOP/s/GPU and memory of one point; errors are relative (pred/meas − 1)."""
    model = load_model(point.model)
    tim = predict_time(point, params)
    pred_t = None if tim is None else float(tim.tflops_per_gpu)
    pred_m = None
    pred_rank: int | None = None
    try:
        p = point.plan.layout.pp
        ranks = {"first": (0,), "last": (p - 1,)}.get(point.memory_rank)  # None: most loaded
        mem = estimate_memory(
            model,
            point.plan,
            seq_length=point.seq_length,
            gbs=point.gbs,
            options=point.options,
            ranks=ranks,
            stage_counts=point.stage_counts,
        )
        pred_m = mem.total_gib
        pred_rank = mem.rank
    except PlanError:
        pass
    t_err = pred_t / point.tflops - 1 if pred_t is not None and point.tflops else None
    m_err = pred_m / point.memory_gib - 1 if pred_m is not None and point.memory_gib else None
    return PointResult(
        id=point.id,
        model=point.model,
        gpu=point.gpu,
        layout=point.plan.label,
        precision=point.options.precision,
        measured_tflops=point.tflops,
        predicted_tflops=pred_t,
        tflops_error=t_err,
        measured_memory_gib=point.memory_gib,
        predicted_memory_gib=pred_m,
        memory_error=m_err,
        memory_rank=pred_rank if point.memory_gib else None,
        seq_length=point.seq_length,
        band=context_band(point.seq_length),
        step_error=step_error(point, tim) if point.tflops else None,
        source=point.source,
    )


@dataclass(frozen=True, kw_only=True)
class BandStats:
    """Step-time errors (measured / predicted − 1) of one context band: count, median absolute and
    signed error, p90."""

    n: int
    median_ape: float
    median_error: float
    p90_ape: float

    def as_dict(self) -> dict[str, float | int]:
        """JSON-friendly mapping."""
        return {
            "n": self.n,
            "median_ape": self.median_ape,
            "median_error": self.median_error,
            "p90_ape": self.p90_ape,
        }


def band_stats(results: tuple[PointResult, ...] | list[PointResult]) -> dict[str, BandStats]:
    """Error statistics per context band (every band listed, ``n = 0`` where empty).

    >>> r = PointResult(id="x", model="m", gpu="g", layout="l", precision="bf16", measured_tflops=100.0,
    ...                 predicted_tflops=110.0, tflops_error=0.1, measured_memory_gib=None,
    ...                 predicted_memory_gib=None, memory_error=None, seq_length=65536, band="64K+")
    >>> band_stats([r])["64K+"].median_error, band_stats([r])["<=8K"].n
    (0.1, 0)
    """
    out = {}
    for band in BANDS:
        errs = [e for e in (_err(r) for r in results if r.band == band) if e is not None]
        n, med, p90 = _ape_stats(errs)
        out[band] = BandStats(
            n=n, median_ape=med, median_error=float(np.median(errs)) if errs else float("nan"), p90_ape=p90
        )
    return out


def _err(r: PointResult) -> float | None:
    """The error a band reports: the step-time error, else (no step time computable) the TFLOP/s one."""
    return r.step_error if r.step_error is not None else r.tflops_error


@dataclass(frozen=True, kw_only=True)
class EvaluationSummary:
    """Error distribution over a calibration file (absolute percentage errors), overall and per band;
    ``lomo`` holds the leave-one-model-out results when they were computed."""

    results: tuple[PointResult, ...]
    skipped: tuple[tuple[str, str], ...]
    tflops_n: int
    tflops_median_ape: float
    tflops_p90_ape: float
    memory_n: int
    memory_median_ape: float
    memory_p90_ape: float
    bands: dict[str, BandStats] = field(default_factory=dict)
    lomo: tuple[PointResult, ...] | None = None
    lomo_bands: dict[str, BandStats] | None = None
    loso: tuple[PointResult, ...] | None = None
    loso_bands: dict[str, BandStats] | None = None
    #: the LOSO estimates anchored on a published run of the same model and GPU from another source
    loso_anchored_bands: dict[str, BandStats] | None = None
    #: per context band: the share of LOSO residuals inside the error band built without their source
    #: (``longpack.planner.uncertainty.band_coverage``; set by ``plan evaluate``)
    coverage: dict[str, dict[str, float]] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly mapping."""
        doc: dict[str, Any] = {
            "tflops": {
                "n": self.tflops_n,
                "median_ape": self.tflops_median_ape,
                "p90_ape": self.tflops_p90_ape,
            },
            "memory": {
                "n": self.memory_n,
                "median_ape": self.memory_median_ape,
                "p90_ape": self.memory_p90_ape,
            },
            "bands": {k: v.as_dict() for k, v in self.bands.items()},
            "points": [r.__dict__ for r in self.results],
            "skipped": [{"id": i, "reason": r} for i, r in self.skipped],
        }
        if self.loso is not None and self.loso_bands is not None:
            doc["loso"] = {
                "bands": {k: v.as_dict() for k, v in self.loso_bands.items()},
                "anchored_bands": {k: v.as_dict() for k, v in (self.loso_anchored_bands or {}).items()},
                "coverage": self.coverage,
                "points": [
                    {
                        "id": r.id,
                        "model": r.model,
                        "source": r.source,
                        "band": r.band,
                        "predicted_tflops": r.predicted_tflops,
                        "step_error": r.step_error,
                        "anchored_step_error": r.anchored_step_error,
                        "anchor": r.anchor,
                    }
                    for r in self.loso
                ],
            }
        if self.lomo is not None and self.lomo_bands is not None:
            doc["lomo"] = {
                "bands": {k: v.as_dict() for k, v in self.lomo_bands.items()},
                "points": [
                    {
                        "id": r.id,
                        "model": r.model,
                        "band": r.band,
                        "predicted_tflops": r.predicted_tflops,
                        "tflops_error": r.tflops_error,
                    }
                    for r in self.lomo
                ],
            }
        return doc


def _ape_stats(errors: list[float]) -> tuple[int, float, float]:
    if not errors:
        return 0, float("nan"), float("nan")
    arr = np.abs(np.asarray(errors))
    return len(errors), float(np.median(arr)), float(np.percentile(arr, 90))


def evaluate(
    points: list[CalibrationPoint],
    skipped: list[tuple[str, str]] | None = None,
    params: TimeModelParams | None = None,
    *,
    lomo: bool = False,
    lomo_rounds: int = 3,
    loso: bool = False,
) -> EvaluationSummary:
    """Evaluate every point; median and 90th-percentile absolute percentage error, overall and per
    context band. ``lomo=True`` also refits the constants once per model without that model's points
    (``lomo_rounds`` coordinate-search rounds from the physical priors) and predicts the held-out
    model's points with them."""
    results = tuple(evaluate_point(p, params) for p in points)
    t_n, t_med, t_p90 = _ape_stats([r.tflops_error for r in results if r.tflops_error is not None])
    m_n, m_med, m_p90 = _ape_stats([r.memory_error for r in results if r.memory_error is not None])
    lomo_results = leave_one_model_out(points, rounds=lomo_rounds) if lomo else None
    loso_results = leave_one_source_out(points, rounds=lomo_rounds) if loso else None
    return EvaluationSummary(
        results=results,
        skipped=tuple(skipped or ()),
        tflops_n=t_n,
        tflops_median_ape=t_med,
        tflops_p90_ape=t_p90,
        memory_n=m_n,
        memory_median_ape=m_med,
        memory_p90_ape=m_p90,
        bands=band_stats(results),
        lomo=lomo_results,
        lomo_bands=band_stats(lomo_results) if lomo_results is not None else None,
        loso=loso_results,
        loso_bands=band_stats(loso_results) if loso_results is not None else None,
        loso_anchored_bands=anchored_band_stats(loso_results) if loso_results is not None else None,
    )


def leave_one_model_out(points: list[CalibrationPoint], *, rounds: int = 3) -> tuple[PointResult, ...]:
    """For each model with measured TFLOP/s: fit on the other models' points, predict this model's.

    Returns one :class:`PointResult` (TFLOP/s and step time) per point with a measurement, in input order.
    """
    return _leave_one_out(points, lambda p: p.model, rounds=rounds)


def leave_one_source_out(points: list[CalibrationPoint], *, rounds: int = 3) -> tuple[PointResult, ...]:
    """For each publication (:func:`source_key`): fit on the points of every other source, predict this
    source's — a new publication's runs, none of whose rows (nor their repeats in other releases of the
    same table) the constants saw."""
    return _leave_one_out(points, lambda p: p.source, rounds=rounds)


def _leave_one_out(points: list[CalibrationPoint], key: Any, *, rounds: int) -> tuple[PointResult, ...]:
    usable = [p for p in points if p.tflops]
    by_key: dict[str, TimeModelParams] = {}
    for name in sorted({key(p) for p in usable}):
        train = [p for p in usable if key(p) != name]
        by_key[name], _ = fit_params(train, rounds=rounds) if train else (TimeModelParams(), 0.0)
    from longpack.planner.level import level_for

    out = []
    for p in usable:
        params = by_key[key(p)]
        tim = predict_time(p, params)
        pred = None if tim is None else float(tim.tflops_per_gpu)
        err = pred / p.tflops - 1 if pred is not None and p.tflops else None
        own = step_error(p, tim)
        level = level_for(
            p.model,
            p.gpu,
            seq_length=p.seq_length,
            precision=p.options.precision,
            points=[a for a in usable if key(a) != key(p)],  # never an anchor the constants did not see
            predict=lambda a, params=params: step_error(a, predict_time(a, params)),  # type: ignore[misc]
        )
        anchored = (1 + own) / level.factor - 1 if own is not None and level is not None else None
        out.append(
            PointResult(
                id=p.id,
                model=p.model,
                gpu=p.gpu,
                layout=p.plan.label,
                precision=p.options.precision,
                measured_tflops=p.tflops,
                predicted_tflops=pred,
                tflops_error=err,
                measured_memory_gib=None,
                predicted_memory_gib=None,
                memory_error=None,
                seq_length=p.seq_length,
                band=context_band(p.seq_length),
                step_error=own,
                source=p.source,
                anchored_step_error=anchored,
                anchor=level.point_id if level is not None else "",
            )
        )
    return tuple(out)


def anchored_band_stats(results: tuple[PointResult, ...] | list[PointResult]) -> dict[str, BandStats]:
    """:func:`band_stats` of the leave-one-out estimates anchored on a published run of the same model
    and GPU from another publication (only the points that have one)."""
    return band_stats(
        [replace(r, step_error=r.anchored_step_error) for r in results if r.anchored_step_error is not None]
    )


# --------------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------------

# (lower, upper) bounds keep every constant physical.
_BOUNDS: dict[str, tuple[float, float]] = {
    "eta_gemm": (0.2, 1.0),
    "gemm_half_size": (10.0, 5000.0),
    # FP8's dense peak is twice BF16's, but the whole step's GEMM mix (blockwise scaling, the BF16 wgrad
    # and attention it leaves) gets well under that; fitted on the public points without the
    # performance-summary rows the coordinate search ran it to 1.98 and made DeepSeek-V3 H100 FP8 ~16 %
    # too fast at 16K-128K
    "fp8_speedup": (1.0, 1.6),
    "nvfp4_speedup": (1.0, 4.0),
    # achieved over published kernel efficiency: framework work around the fused kernel lowers it; a
    # training step does not run the kernel faster than its own benchmark (above 1 the fit used it to make
    # long-context attention ~19 % faster than the cuDNN bars, and over-predicted Qwen3-235B's rise with
    # length: -10 % at 16K to +9 % at 128K in-sample, within 3 % with the bound)
    "attention_factor": (0.5, 1.0),
    "cp_step_overhead_us": (5.0, 50.0),  # a kernel launch plus an NCCL send/recv handshake
    # host/launch cost of one layer's fwd+bwd per micro-batch without CUDA graphs (a few hundred kernel
    # launches); unbounded, the fit used ~1 ms of it per layer to absorb unmodelled per-source offsets
    "layer_overhead_us": (10.0, 300.0),
    "fp8_speedup_blackwell": (1.0, 2.0),
    "elementwise_passes": (0.5, 30.0),
    "fp8_cast_passes": (0.5, 12.0),
    "graph_overhead_factor": (0.05, 1.0),
    "ep_exposed_overlap": (0.0, 1.0),
    "comm_exposed": (0.0, 0.5),  # overlapped (userbuffers, bucketed DP): at most half exposed
    "tp_exposed_no_overlap": (0.5, 1.0),  # not overlapped: at least half exposed
    "blackwell_factor": (0.5, 1.5),
    # GB300 / B300 have GB200's BF16 and FP8 peaks (NVIDIA NVL72 spec tables): clocks and power, not peak
    "blackwell_ultra_factor": (0.5, 1.5),
}


#: Share of the loss carried by the <= 8K band; the long-context bands share the rest (their few points
#: would otherwise be drowned by the ~180 short ones; an even split lets them pull the GEMM constants).
SHORT_BAND_WEIGHT = 0.75


def _loss(params: TimeModelParams, points: list[CalibrationPoint]) -> float:
    """Mean absolute log error of the step time (:func:`step_error`: from tokens/s/GPU where the source
    states them, so a source's FLOP convention cannot bias the constants): the <= 8K band weighted
    ``SHORT_BAND_WEIGHT``, the long-context points (16K and more) the rest."""
    short: list[float] = []
    long: list[float] = []
    for p in points:
        err = step_error(p, predict_time(p, params)) if p.tflops else None
        if err is not None and err > -1:
            (short if p.seq_length <= 8192 else long).append(abs(math.log1p(err)))
    if not short and not long:
        return float("inf")
    if not long or not short:
        return float(np.mean(short or long))
    return float(SHORT_BAND_WEIGHT * np.mean(short) + (1 - SHORT_BAND_WEIGHT) * np.mean(long))


def fit_params(
    points: list[CalibrationPoint],
    *,
    start: TimeModelParams | None = None,
    rounds: int = 8,
) -> tuple[TimeModelParams, float]:
    """Fit the time-model constants on ``points`` by coordinate search in log space (deterministic).

    Starts from the physical priors (:class:`TimeModelParams` defaults) unless ``start`` is given, so
    ``longpack plan fit --out src/longpack/data/planner_fit.yaml`` reproduces the shipped constants.

    Minimizes the band-weighted mean absolute log error (``SHORT_BAND_WEIGHT``) of the step time over every point with a
    measured TFLOP/s (rows superseded by a newer release stay in: they carry the software-drift
    variance the planner must live with). Returns the constants and the final loss.
    """
    usable = [p for p in points if p.tflops]
    current = start or TimeModelParams()
    current = replace(
        current, **{k: min(hi, max(lo, getattr(current, k))) for k, (lo, hi) in _BOUNDS.items()}
    )
    best = _loss(current, usable)
    names = [f.name for f in fields(TimeModelParams)]
    step = 0.5
    for _ in range(rounds):
        for name in names:
            lo, hi = _BOUNDS[name]
            for _try in range(6):
                improved = False
                for direction in (1.0, -1.0):
                    value = getattr(current, name)
                    cand_value = min(hi, max(lo, value * math.exp(direction * step)))
                    if cand_value == value:
                        continue
                    cand = replace(current, **{name: cand_value})
                    loss = _loss(cand, usable)
                    if loss < best - 1e-6:
                        current, best, improved = cand, loss, True
                        break
                if not improved:
                    break
        step /= 2
    return current, best


def write_fit(params: TimeModelParams, path: str | Path, *, loss: float, source: str) -> None:
    """Write fitted constants (and the attention kernel curves they build on) as YAML atomically."""
    from longpack.planner.attention import kernel_curves

    path = Path(path)
    doc = {
        "schema_version": 2,
        "fitted_on": source,
        "refit_command": "longpack plan fit --calibration <file> --out src/longpack/data/planner_fit.yaml",
        "loss_band_weighted_mean_abs_log_error": round(float(loss), 6),
        "params": {k: round(v, 6) for k, v in params.as_dict().items()},
        "attention_kernel_curves": kernel_curves().as_dict(),
    }
    text = yaml.safe_dump(doc, sort_keys=False)
    atomic_write_bytes(path, text.encode("utf-8"))


__all__ = [
    "BANDS",
    "BandStats",
    "CalibrationPoint",
    "EvaluationSummary",
    "PointResult",
    "anchored_band_stats",
    "band_stats",
    "context_band",
    "evaluate",
    "evaluate_point",
    "fit_params",
    "fitted_params",
    "leave_one_model_out",
    "leave_one_source_out",
    "load_points",
    "normalize_point",
    "predict_tflops",
    "predict_time",
    "read_calibration",
    "source_key",
    "step_error",
    "write_fit",
]
