"""The calibration jobs of the planner: ``plan evaluate`` (predicted vs measured TFLOP/s/GPU and memory on
published runs, in-sample and leave-one-model-out) and ``plan fit`` (refit the time model's free constants)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longpack.errors import ConfigError, LongpackError
from longpack.option import option
from longpack.validate import non_negative_int, positive_int

__all__ = ["EvaluateConfig", "EvaluateResult", "FitConfig", "FitResult"]

CALIBRATION_HELP = "Calibration YAML (default: the packaged file)."

if TYPE_CHECKING:
    from longpack.planner.calibration import EvaluationSummary


def _load_points(calibration: str | Path | None) -> Any:
    from longpack.planner.calibration import load_points

    try:
        return load_points(calibration)
    except LongpackError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc), fields="calibration") from exc


@dataclass(frozen=True, kw_only=True)
class EvaluateConfig:
    """Which calibration points, and whether to refit without each model (leave-one-model-out)."""

    command_help = (
        "Predicted vs measured TFLOP/s/GPU (and memory): median / p90 absolute percentage error overall and "
        "by context band (<=8K, 16-32K, 64K+), in-sample, leave-one-model-out and leave-one-source-out, with "
        "the error bands' coverage."
    )

    calibration: str | None = option(None, help=CALIBRATION_HELP)
    points: bool = option(False, help="List every point.")
    lomo: bool = option(
        True,
        help="Also refit without each model and predict its points (leave-one-model-out; ~1 min).",
        negative="--no-lomo",
    )
    lomo_rounds: int = option(3, help="Coordinate-search rounds of each LOMO refit.")
    loso: bool = option(
        True,
        help=(
            "Also refit without each source (publication) and predict its points (leave-one-source-out), "
            "with the coverage of the error bands on sources they were not built from (~1 min)."
        ),
        negative="--no-loso",
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        positive_int(self.lomo_rounds, "lomo_rounds")

    def run(self) -> EvaluateResult:
        from longpack.planner.calibration import evaluate

        points, skipped = _load_points(self.calibration)
        from dataclasses import replace

        from longpack.planner.uncertainty import band_coverage

        summary = evaluate(points, skipped, lomo=self.lomo, lomo_rounds=self.lomo_rounds, loso=self.loso)
        if summary.loso is not None:
            summary = replace(summary, coverage=band_coverage(summary.loso))
        return EvaluateResult(summary=summary)


@dataclass(frozen=True, kw_only=True)
class EvaluateResult:
    """``longpack.planner.calibration``'s summary: per point, per band, in-sample and LOMO errors."""

    summary: EvaluationSummary

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.summary.as_dict()
        return doc


@dataclass(frozen=True, kw_only=True)
class FitConfig:
    """Refit on ``calibration`` with ``rounds`` of coordinate search; write the constants to ``out``."""

    command_help = "Refit the time model's free constants on a calibration file and write them as YAML."

    calibration: str | None = option(None, help=CALIBRATION_HELP)
    out: str | Path = option(help="Where to write the fitted constants (YAML).", cli_type=str)
    rounds: int = option(8, help="Coordinate-search rounds (the shipped fit used 8).")

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        non_negative_int(self.rounds, "rounds")

    def run(self) -> FitResult:
        from longpack.outputs import check_output_file
        from longpack.planner.calibration import evaluate, fit_params, write_fit

        check_output_file(self.out, field="out")  # before the fit
        points, skipped = _load_points(self.calibration)
        params, loss = fit_params(points, rounds=self.rounds)
        write_fit(params, self.out, loss=loss, source=str(self.calibration or "calibration_points.yaml"))
        return FitResult(out=str(self.out), loss=loss, summary=evaluate(points, skipped, params=params))


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """Where the constants went, the fit's loss, and the refit model's errors on the same points."""

    out: str
    loss: float
    summary: EvaluationSummary

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "loss": self.loss, "evaluation": self.summary.as_dict()}
