"""An estimate's level anchored on a published run of the same model and GPU type.

Most of the time model's error on a new publication is an offset shared by the runs of one model on one GPU
type (its kernels, its software release, what the source counts): DeepSeek-V3 on H100 FP8 runs ~15 %
slower than the model predicts at every length, Qwen3-Next on GB200 ~2x. A published run of that model on
that GPU (a calibration point with a measured throughput) measures the offset: ``factor`` = its measured
step time / the model's step time for the same run. The anchored estimate of a layout is the model's
step time × ``factor``: the model then predicts only the ratio of the layout to the published run, and
the offset cancels. ``longpack plan`` prints the anchor and the anchored step times of the reference and
the pick (the ranking is the model's: one factor for every layout of the request); ``longpack plan
evaluate`` scores the anchored estimates leave-one-source-out (the anchor always from another
publication).

>>> lv = level_for("deepseek_v3", "H100_SXM", seq_length=131072, precision="fp8")
>>> lv.point_id, lv.seq_length, lv.factor > 1
('cp405', 131072, True)
>>> level_for("llama3_1_8b", "B300", seq_length=4096, precision="bf16") is None
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Level", "choose_anchor", "level_for"]


@dataclass(frozen=True, kw_only=True)
class Level:
    """The published run an estimate is anchored on: ``point_id`` and ``source`` (the calibration point),
    its ``seq_length``, ``precision`` and ``layout``, and ``factor`` = its measured step time / the time
    model's step time for it (``1.18``: the model is 18 % too fast for this model and GPU).

    >>> Level(point_id="cp1", source="s", seq_length=4096, precision="bf16", layout="TP1", factor=1.2).apply(2.0)
    2.4
    """

    point_id: str
    source: str
    seq_length: int
    precision: str
    layout: str
    factor: float

    def apply(self, step_time: float) -> float:
        """The anchored step time of a model estimate ``step_time``."""
        return step_time * self.factor

    def describe(self) -> str:
        """One line for the plan output."""
        return (
            f"{self.point_id} ({self.layout}, {self.seq_length // 1024}K, {self.precision}; {self.source}): "
            f"measured / predicted step time {self.factor:.2f}"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly mapping."""
        return {
            "point": self.point_id,
            "source": self.source,
            "seq_length": self.seq_length,
            "precision": self.precision,
            "layout": self.layout,
            "factor": self.factor,
        }


def choose_anchor(
    points: Iterable[Any],
    *,
    model: str,
    gpu: str,
    seq_length: int,
    precision: str,
    exclude_source: str | None = None,
) -> Any | None:
    """The published run to anchor on among calibration ``points``: the same model and GPU type with a
    measured throughput (not from ``exclude_source``), preferring the same precision, then the nearest
    sequence length (in octaves), then the newest release of a repeated row, then the lowest id.

    >>> from longpack.planner.calibration import packaged_points
    >>> choose_anchor(packaged_points(), model="deepseek_v3", gpu="H100_SXM", seq_length=65536, precision="fp8").id
    'cp404'
    """
    best: tuple[tuple[float, ...], str, Any] | None = None
    for p in points:
        if p.model != model or p.gpu != gpu or not p.tflops or p.source == exclude_source:
            continue
        score = (
            0.0 if p.options.precision == precision else 1.0,
            abs(math.log2(p.seq_length / seq_length)),
            1.0 if p.superseded else 0.0,
        )
        if best is None or (score, p.id) < (best[0], best[1]):
            best = (score, p.id, p)
    return None if best is None else best[2]


def level_for(
    model: str,
    gpu: str,
    *,
    seq_length: int,
    precision: str,
    points: Iterable[Any] | None = None,
    predict: Callable[[Any], float | None] | None = None,
    exclude_source: str | None = None,
) -> Level | None:
    """The :class:`Level` of ``model`` on ``gpu`` from the anchor :func:`choose_anchor` picks (``points``:
    the packaged calibration points; ``predict``: the step-time error of a point under the constants in
    use, default the packaged fit); ``None`` when no published run of that model on that GPU type states a
    throughput."""
    from longpack.planner.calibration import packaged_points, predict_time, step_error

    pool = packaged_points() if points is None else points
    anchor = choose_anchor(
        pool, model=model, gpu=gpu, seq_length=seq_length, precision=precision, exclude_source=exclude_source
    )
    if anchor is None:
        return None
    err = predict(anchor) if predict is not None else step_error(anchor, predict_time(anchor))
    if err is None or err <= -1:
        return None
    return Level(
        point_id=anchor.id,
        source=anchor.source,
        seq_length=anchor.seq_length,
        precision=anchor.options.precision,
        layout=anchor.plan.label,
        factor=1.0 + float(err),
    )
