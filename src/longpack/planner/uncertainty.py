"""Error bands of the planner's step-time estimates, from leave-one-source-out residuals, conformal.

Every estimate the planner prints carries a relative error band: the width ``w`` such that a step
estimated at ``t`` takes between ``t·(1 − w)`` and ``t·(1 + w)`` for at least :data:`COVERAGE` (80 %) of
the runs of a publication the constants never saw. The residuals are **leave-one-source-out** (LOSO):
the constants refitted without every point of one publication (``calibration.source_key``: a repository
file or an arXiv id; a table and its repeats over releases are one source), then that source's points
predicted; a residual is measured / predicted step time − 1 (from tokens/s where the source states them).

The width is the **split-conformal quantile** of the group's ``|residual|``: the ``⌈(n + 1)·q⌉``-th smallest
of ``n``, which covers a new exchangeable point with probability ≥ ``q`` — times a per-context-band factor
(:func:`tune_levels`, ``levels`` in the data file) that makes 80 % hold on sources the band never saw
(runs of one publication are exchangeable, publications are not). Groups: context band (``<=8K``,
``16-32K``, ``64K+``) × GPU generation (``hopper`` / ``blackwell``) × kind (``dense`` / ``moe``). A group
with fewer than :data:`MIN_POINTS` residuals uses the first coarser group that has them (``band/kind``,
``band``, the long bands pooled ``16K+``, ``all``) **widened to cover every residual of its own group**,
and says so (``few``: its own ``n``).

Memory estimates carry a one-sided band too (:func:`memory_band`): the conformal quantile of measured /
predicted peak memory − 1 over the calibration file's memory measurements; a layout must fit with it.

The residuals ship in ``longpack/data/planner_error_bands.yaml``; ``python -m longpack.planner.uncertainty``
recomputes them (a LOSO refit per source, about a minute) and rewrites the file.

>>> from longpack.planner.catalog import load_gpu, load_model
>>> band = error_band(load_model("deepseek_v3"), load_gpu("H100"), 131072)
>>> 0 < band.width < 1, band.coverage
(True, 0.8)
>>> format_with_band(0.8412, 0.09)[:7]
'0.84 s '
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from longpack.planner.catalog import GPUSpec, ModelSpec

__all__ = [
    "COVERAGE",
    "MIN_POINTS",
    "ErrorBand",
    "MemoryBand",
    "Residual",
    "band_coverage",
    "band_for",
    "error_band",
    "format_band",
    "format_with_band",
    "gpu_generation",
    "load_levels",
    "load_residuals",
    "memory_band",
    "memory_band_from",
    "model_kind",
    "source_coverage",
    "tune_levels",
]

#: Share of held-out residuals a band covers.
COVERAGE = 0.8
#: Fewest residuals a group needs before its own quantile is used (else the next coarser group).
MIN_POINTS = 8
DATA_FILE = "planner_error_bands.yaml"


def gpu_generation(gpu: GPUSpec) -> str:
    """``blackwell`` (B200, GB200, B300, GB300) or ``hopper`` (H100, H200)."""
    return "blackwell" if gpu.is_blackwell else "hopper"


def model_kind(model: ModelSpec) -> str:
    """``moe`` or ``dense``."""
    return "moe" if model.moe is not None else "dense"


def context_band(seq_length: int) -> str:
    """``<=8K``, ``16-32K`` or ``64K+`` (the bands of ``longpack plan evaluate``).

    >>> context_band(8192), context_band(32768), context_band(65536)
    ('<=8K', '16-32K', '64K+')
    """
    if seq_length <= 8192:
        return "<=8K"
    return "16-32K" if seq_length <= 32768 else "64K+"


@dataclass(frozen=True, kw_only=True)
class Residual:
    """One leave-one-source-out residual of the calibration set."""

    id: str
    model: str
    gpu: str
    seq_length: int
    band: str
    generation: str
    kind: str
    error: float  # measured / predicted step time - 1, the constants refitted without this point's source
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class ErrorBand:
    """``width``: relative half-width (0.09 = ± 9 %); ``group``: the residual group it comes from
    (``"64K+/hopper/moe"`` or a coarser fallback); ``n``: residuals in that group; ``coverage``: the share
    of them inside ``± width``."""

    width: float
    group: str
    n: int
    coverage: float = COVERAGE
    #: the request's own group when it had too few residuals (then ``group`` is the coarser one used)
    own_group: str = ""
    own_n: int = 0

    @property
    def few(self) -> bool:
        """Whether the request's own group had fewer than :data:`MIN_POINTS` residuals."""
        return bool(self.own_group) and self.own_group != self.group

    def describe(self) -> str:
        """``± 17 % covers >= 80 % of leave-one-source-out residuals (conformal) of group 16K+ (n = 10)``."""
        text = (
            f"{format_band(self.width)} covers >= {self.coverage:.0%} of leave-one-source-out residuals "
            f"(conformal) of group {self.group} (n = {self.n})"
        )
        if self.few:
            text += (
                f"; few points: {self.own_group} has only {self.own_n}, so the band is the coarser group's, "
                "widened to cover all of them"
            )
        return text

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly mapping."""
        return {
            "width": round(self.width, 4),
            "group": self.group,
            "n": self.n,
            "coverage": self.coverage,
            "own_group": self.own_group or self.group,
            "own_n": self.own_n if self.few else self.n,
            "few_points": self.few,
            "source": "leave-one-source-out residuals of the calibration set, split-conformal quantile",
        }


def _quantile(values: Sequence[float], q: float) -> float:
    """The split-conformal quantile: the ``⌈(n + 1)·q⌉``-th smallest of the ``n`` values (the largest when
    that index passes ``n``), so a new exchangeable value falls at or below it with probability ≥ ``q``.

    >>> _quantile([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], 0.8)
    0.8
    """
    ordered = sorted(values)
    k = min(len(ordered), math.ceil(q * (len(ordered) + 1))) - 1
    return ordered[max(0, k)]


def _groups(residual: Residual | tuple[str, str, str]) -> tuple[str, ...]:
    band, gen, kind = (
        (residual.band, residual.generation, residual.kind) if isinstance(residual, Residual) else residual
    )
    wider = ("16K+",) if band != "<=8K" else ()  # the two long bands pooled before everything
    return (f"{band}/{gen}/{kind}", f"{band}/{kind}", band, *wider, "all")


def band_for(
    key: tuple[str, str, str], residuals: Iterable[Residual], scale: float | None = None
) -> ErrorBand:
    """The error band of (context band, generation, kind) from ``residuals``: the conformal quantile of the
    first group of ``band/generation/kind``, ``band/kind``, ``band``, ``16K+``, ``all`` with at least
    :data:`MIN_POINTS` points (a coarser group widened to cover every residual of the own group).

    >>> rs = [Residual(id=str(i), model="m", gpu="g", seq_length=4096, band="<=8K", generation="hopper",
    ...                kind="dense", error=e) for i, e in enumerate([0.01, -0.02, 0.05, 0.1, -0.2] * 2)]
    >>> b = band_for(("<=8K", "hopper", "dense"), rs)
    >>> b.group, b.n, b.width
    ('<=8K/hopper/dense', 10, 0.2)
    """
    pool = list(residuals)
    by_group: dict[str, list[float]] = {}
    for r in pool:
        for g in _groups(r):
            by_group.setdefault(g, []).append(abs(r.error))
    own = _groups(key)[0]
    own_values = by_group.get(own, [])
    for g in _groups(key):
        values = by_group.get(g, [])
        if len(values) >= MIN_POINTS or (g == "all" and values):
            width = _quantile(values, COVERAGE) * (1.0 if scale is None else scale)
            if g != own:
                width = max([width, *own_values])
                return ErrorBand(width=width, group=g, n=len(values), own_group=own, own_n=len(own_values))
            return ErrorBand(width=width, group=g, n=len(values))
    raise ValueError("no residuals to build an error band from")


@functools.cache
def load_residuals(path: str | None = None) -> tuple[Residual, ...]:
    """The shipped LOMO residuals (``longpack/data/planner_error_bands.yaml``)."""
    text = (
        Path(path).read_text(encoding="utf-8")
        if path is not None
        else resources.files("longpack").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    )
    doc = yaml.safe_load(text) or {}
    return tuple(Residual(**r) for r in doc.get("residuals", []))


@functools.lru_cache(maxsize=256)
def _band_cached(band: str, generation: str, kind: str) -> ErrorBand:
    return band_for((band, generation, kind), load_residuals(), scale=load_levels().get(band))


#: Widening factors tried, smallest first, until the stated coverage holds on held-out sources.
SCALES = tuple(round(1 + 0.05 * i, 2) for i in range(61))


def source_coverage(
    residuals: Sequence[Residual], band: str, scale: float | None = None
) -> tuple[float, int]:
    """Share of ``band``'s residuals inside the error band of their group built from the residuals of the
    *other* sources only (a new publication's view), and how many were scored."""
    mine = [r for r in residuals if r.band == band]
    inside = scored = 0
    for r in mine:
        others = [x for x in residuals if x.source != r.source]
        if not others:
            continue
        scored += 1
        inside += abs(r.error) <= band_for((r.band, r.generation, r.kind), others, scale=scale).width
    return (inside / scored if scored else float("nan")), scored


def tune_levels(residuals: Sequence[Residual]) -> dict[str, float]:
    """Per context band, the smallest widening factor of :data:`SCALES` (applied to the conformal 80 %
    quantile) at which :func:`source_coverage` is at least :data:`COVERAGE`: publications differ more
    from each other than the runs of one publication do, so the plain quantile of pooled residuals
    under-covers a new source; this factor makes the stated 80 % hold on the calibration file's own
    held-out sources."""
    out = {}
    for band in sorted({r.band for r in residuals}):
        for scale in SCALES:
            cov, n = source_coverage(residuals, band, scale)
            if n == 0 or cov >= COVERAGE:
                out[band] = scale
                break
        else:
            out[band] = SCALES[-1]
    return out


@functools.cache
def load_levels() -> dict[str, float]:
    """The shipped per-band widening factors (``levels`` of ``planner_error_bands.yaml``)."""
    text = resources.files("longpack").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    return {str(k): float(v) for k, v in (doc.get("levels") or {}).items()}


def error_band(model: ModelSpec, gpu: GPUSpec, seq_length: int) -> ErrorBand:
    """The 80 % error band of a step-time estimate for this model kind, GPU generation and context."""
    return _band_cached(context_band(seq_length), gpu_generation(gpu), model_kind(model))


def format_band(width: float) -> str:
    """``"± 9 %"``: a relative error band as printed beside an estimate.

    >>> format_band(0.0913)
    '± 9 %'
    """
    return f"± {width * 100:.0f} %"


def format_with_band(seconds: float, width: float) -> str:
    """``"0.84 s ± 9 %"``: a step time and its relative error band.

    >>> format_with_band(0.8412, 0.0913), format_with_band(12.5, 0.4)
    ('0.84 s ± 9 %', '12.5 s ± 40 %')
    """
    shown = f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"
    return f"{shown} s {format_band(width)}"


def residuals_from_lomo(results: Iterable[Any]) -> list[Residual]:
    """:class:`Residual` rows (step-time errors) from ``longpack.planner.calibration``'s leave-one-out
    results (``leave_one_source_out`` or ``leave_one_model_out``)."""
    from longpack.planner.catalog import load_gpu, load_model

    out = []
    for r in results:
        err = r.step_error if r.step_error is not None else r.tflops_error
        if err is None:
            continue
        out.append(
            Residual(
                id=r.id,
                model=r.model,
                gpu=r.gpu,
                seq_length=int(r.seq_length),
                band=context_band(int(r.seq_length)),
                generation=gpu_generation(load_gpu(r.gpu)),
                kind=model_kind(load_model(r.model)),
                error=round(float(err), 6),
                source=r.source,
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class MemoryBand:
    """One-sided relative band of a memory estimate: measured peak memory was at most
    ``estimate · (1 + width)`` for at least ``coverage`` of new measurements (conformal over ``n``)."""

    width: float
    n: int
    coverage: float = COVERAGE

    def describe(self) -> str:
        return (
            f"+{self.width:.1%} covers >= {self.coverage:.0%} of the measured peak memories (conformal, "
            f"n = {self.n}) above the estimate"
        )


def memory_band_from(errors: Sequence[float]) -> MemoryBand:
    """The one-sided conformal band from memory errors ``predicted / measured − 1`` (an under-estimate,
    measured above predicted, is what costs an out-of-memory).

    >>> memory_band_from([0.05, -0.06, 0.0, -0.01]).width > 0.06
    True
    """
    over = [1.0 / (1.0 + e) - 1.0 for e in errors]  # measured / predicted - 1
    if not over:
        return MemoryBand(width=0.0, n=0)
    return MemoryBand(width=max(0.0, _quantile(over, COVERAGE)), n=len(over))


@functools.cache
def memory_band() -> MemoryBand:
    """The shipped memory band (``memory`` of ``planner_error_bands.yaml``; zero width if absent)."""
    text = resources.files("longpack").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    mem = doc.get("memory") or {}
    return MemoryBand(width=float(mem.get("width", 0.0)), n=int(mem.get("n", 0)))


def write_residuals(
    residuals: Sequence[Residual], path: str | Path, *, rounds: int, memory: MemoryBand | None = None
) -> None:
    """Write the residual file (atomically) with a per-group summary for readers."""
    from dataclasses import asdict

    from longpack.outputs import atomic_write_bytes

    levels = tune_levels(residuals)
    groups: dict[str, dict[str, Any]] = {}
    for key in sorted({(r.band, r.generation, r.kind) for r in residuals}):
        b = band_for(key, residuals, scale=levels.get(key[0]))
        groups["/".join(key)] = {"uses": b.group, "n": b.n, "width": round(b.width, 4)}
    doc: dict[str, Any] = {
        "schema_version": 2,
        "what": (
            "leave-one-source-out residuals (measured / predicted step time - 1) of the calibration points; "
            f"error bands are their split-conformal {COVERAGE:.0%} quantile of |error| by context band, GPU "
            "generation and kind"
        ),
        "regenerate": "python -m longpack.planner.uncertainty",
        "loso_rounds": rounds,
        "coverage": COVERAGE,
        "min_points": MIN_POINTS,
        "levels": levels,
        "coverage_on_held_out_sources": {
            band: round(source_coverage(residuals, band, levels[band])[0], 4) for band in levels
        },
        "groups": groups,
    }
    if memory is not None:
        doc["memory"] = {
            "width": round(memory.width, 4),
            "n": memory.n,
            "what": "one-sided conformal quantile of measured / predicted peak memory - 1",
        }
    doc["residuals"] = [asdict(r) for r in residuals]
    atomic_write_bytes(Path(path), yaml.safe_dump(doc, sort_keys=False, width=120).encode("utf-8"))


def band_coverage(results: Sequence[Any]) -> dict[str, dict[str, float]]:
    """How often the printed error band holds on a source it was not built from: for every
    leave-one-source-out residual, the band of its group (``longpack.planner.uncertainty.band_for``)
    built from the residuals of the *other* sources, and whether ``|residual|`` is inside it. Per context
    band: the widening factor ``level`` of the 80 % conformal quantile the planner uses there
    (``uncertainty.tune_levels``), the share inside with it (``coverage``) and with the plain quantile
    (``coverage_at_plain_80``), the median printed width and ``n``."""
    residuals = residuals_from_lomo(results)
    levels = tune_levels(residuals)
    out: dict[str, dict[str, float]] = {}
    for band in ("<=8K", "16-32K", "64K+"):
        level = levels.get(band, 1.0)
        cov, n = source_coverage(residuals, band, level)
        plain, _ = source_coverage(residuals, band, 1.0)
        widths = [
            band_for((r.band, r.generation, r.kind), residuals, scale=level).width
            for r in residuals
            if r.band == band
        ]
        out[band] = {
            "n": n,
            "level": level,
            "coverage": cov,
            "coverage_at_plain_80": plain,
            "median_width": float(statistics.median(widths)) if widths else float("nan"),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Recompute the LOSO residuals and the memory band of the packaged calibration set and rewrite the
    shipped file."""
    from longpack.planner.calibration import evaluate_point, leave_one_source_out, load_points

    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "data" / DATA_FILE
    rounds = 3
    points, _ = load_points()
    residuals = residuals_from_lomo(leave_one_source_out(points, rounds=rounds))
    mem_errors = [
        r.memory_error
        for r in (evaluate_point(p) for p in points if p.memory_gib)
        if r.memory_error is not None
    ]
    write_residuals(residuals, out, rounds=rounds, memory=memory_band_from(mem_errors))
    print(f"wrote {len(residuals)} residuals to {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    raise SystemExit(main())
