"""Error bands of the planner's step-time estimates, from its own leave-one-model-out residuals.

Every estimate the planner prints carries a relative error band: the width ``w`` such that, on the
published runs of the calibration file, a fraction :data:`COVERAGE` (80 %) of the leave-one-model-out
(LOMO) errors of models *like this one* are within ``± w``. "Like this one" is the group of its context
band (``<=8K``, ``16-32K``, ``64K+``), GPU generation (``hopper`` / ``blackwell``) and kind (``dense`` /
``moe``); a group with fewer than :data:`MIN_POINTS` residuals falls back to (band, kind), then the band,
then (for 16K and longer) both long bands pooled (``16K+``), then every residual, and the band says which group it used and how many points it rests on.

A LOMO residual is ``predicted / measured − 1`` of TFLOP/s/GPU with the constants refitted without that
model's points, which is the relative error of the measured step time over the predicted one: a step
estimated at ``t`` took between ``t·(1 − w)`` and ``t·(1 + w)`` for 80 % of the held-out runs.

The residuals ship in ``longpack/data/planner_error_bands.yaml``; ``python -m longpack.planner.uncertainty``
recomputes them (a LOMO refit per model, about a minute) and rewrites the file.

>>> from longpack.planner.catalog import load_gpu, load_model
>>> band = error_band(load_model("deepseek_v3"), load_gpu("H100"), 131072)
>>> band.group, band.n >= MIN_POINTS, 0 < band.width < 1
('16K+', True, True)
>>> format_with_band(0.8412, band.width)[:7]
'0.84 s '
"""

from __future__ import annotations

import functools
import math
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
    "Residual",
    "band_for",
    "error_band",
    "format_band",
    "format_with_band",
    "gpu_generation",
    "load_residuals",
    "model_kind",
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
    """One leave-one-model-out residual of the calibration set."""

    id: str
    model: str
    gpu: str
    seq_length: int
    band: str
    generation: str
    kind: str
    error: float  # predicted / measured TFLOP/s/GPU - 1, the model refitted without this model


@dataclass(frozen=True, kw_only=True)
class ErrorBand:
    """``width``: relative half-width (0.09 = ± 9 %); ``group``: the residual group it comes from
    (``"64K+/hopper/moe"`` or a coarser fallback); ``n``: residuals in that group; ``coverage``: the share
    of them inside ``± width``."""

    width: float
    group: str
    n: int
    coverage: float = COVERAGE

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly mapping."""
        return {
            "width": round(self.width, 4),
            "group": self.group,
            "n": self.n,
            "coverage": self.coverage,
            "source": "leave-one-model-out residuals of the calibration set",
        }


def _quantile(values: Sequence[float], q: float) -> float:
    """The smallest value with at least ``q`` of ``values`` at or below it (no interpolation, so the
    share of residuals inside the band is at least ``q``)."""
    ordered = sorted(values)
    k = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[k]


def _groups(residual: Residual | tuple[str, str, str]) -> tuple[str, ...]:
    band, gen, kind = (
        (residual.band, residual.generation, residual.kind) if isinstance(residual, Residual) else residual
    )
    wider = ("16K+",) if band != "<=8K" else ()  # the two long bands pooled before everything
    return (f"{band}/{gen}/{kind}", f"{band}/{kind}", band, *wider, "all")


def band_for(key: tuple[str, str, str], residuals: Iterable[Residual]) -> ErrorBand:
    """The error band of (context band, generation, kind) from ``residuals``: the first group of
    ``band/generation/kind``, ``band/kind``, ``band``, ``all`` with at least :data:`MIN_POINTS` points.

    >>> rs = [Residual(id=str(i), model="m", gpu="g", seq_length=4096, band="<=8K", generation="hopper",
    ...                kind="dense", error=e) for i, e in enumerate([0.01, -0.02, 0.05, 0.1, -0.2] * 2)]
    >>> b = band_for(("<=8K", "hopper", "dense"), rs)
    >>> b.group, b.n, b.width
    ('<=8K/hopper/dense', 10, 0.1)
    """
    pool = list(residuals)
    by_group: dict[str, list[float]] = {}
    for r in pool:
        for g in _groups(r):
            by_group.setdefault(g, []).append(abs(r.error))
    for g in _groups(key):
        values = by_group.get(g, [])
        if len(values) >= MIN_POINTS or (g == "all" and values):
            return ErrorBand(width=_quantile(values, COVERAGE), group=g, n=len(values))
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
    return band_for((band, generation, kind), load_residuals())


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
    """:class:`Residual` rows from ``longpack.planner.calibration.leave_one_model_out`` results."""
    from longpack.planner.catalog import load_gpu, load_model

    out = []
    for r in results:
        if r.tflops_error is None:
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
                error=round(float(r.tflops_error), 6),
            )
        )
    return out


def write_residuals(residuals: Sequence[Residual], path: str | Path, *, rounds: int) -> None:
    """Write the residual file (atomically) with a per-group summary for readers."""
    from dataclasses import asdict

    from longpack.outputs import atomic_write_bytes

    groups: dict[str, dict[str, Any]] = {}
    for key in sorted({(r.band, r.generation, r.kind) for r in residuals}):
        b = band_for(key, residuals)
        groups["/".join(key)] = {"uses": b.group, "n": b.n, "width": round(b.width, 4)}
    doc = {
        "schema_version": 1,
        "what": (
            "leave-one-model-out residuals (predicted / measured TFLOP/s/GPU - 1) of the calibration points; "
            f"error bands are their {COVERAGE:.0%} quantile of |error| by context band, GPU generation and kind"
        ),
        "regenerate": "python -m longpack.planner.uncertainty",
        "lomo_rounds": rounds,
        "coverage": COVERAGE,
        "min_points": MIN_POINTS,
        "groups": groups,
        "residuals": [asdict(r) for r in residuals],
    }
    atomic_write_bytes(Path(path), yaml.safe_dump(doc, sort_keys=False, width=120).encode("utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    """Recompute the LOMO residuals of the packaged calibration set and rewrite the shipped file."""
    from longpack.planner.calibration import leave_one_model_out, load_points

    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "data" / DATA_FILE
    rounds = 3
    points, _ = load_points()
    residuals = residuals_from_lomo(leave_one_model_out(points, rounds=rounds))
    write_residuals(residuals, out, rounds=rounds)
    print(f"wrote {len(residuals)} residuals to {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    raise SystemExit(main())
