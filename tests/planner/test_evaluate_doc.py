"""The error table of docs/reference/planner-model.md (#errors) is what ``longpack plan evaluate`` computes
now on the packaged calibration file (in-sample, leave-one-source-out, LOSO anchored on another source's
run of the same model and GPU, and the printed band's coverage on held-out sources).
``LONGPACK_REGEN_DOCS=1`` rewrites it."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "planner-model.md"
START, END = "<!-- evaluate-bands:start -->", "<!-- evaluate-bands:end -->"


def _pct(x: float) -> str:
    return f"{x:.1%}".replace("-", "−")


def table() -> str:
    """The markdown table ``plan evaluate`` gives in its band columns."""
    from longpack.planner.calibration import evaluate, load_points
    from longpack.planner.uncertainty import band_coverage

    points, skipped = load_points()
    summary = evaluate(points, skipped, loso=True)
    summary = replace(summary, coverage=band_coverage(summary.loso or ()))
    lines = [
        "| band | n | in-sample median (signed) | LOSO median (signed) | LOSO p90 | LOSO anchored (n) "
        "| band (median) | coverage on held-out sources |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for band, st in summary.bands.items():
        lb = (summary.loso_bands or {})[band]
        ab = (summary.loso_anchored_bands or {}).get(band)
        cov = (summary.coverage or {})[band]
        anchored = f"{_pct(ab.median_ape)} ({ab.n})" if ab and ab.n else "-"
        lines.append(
            f"| {band} | {st.n} | {_pct(st.median_ape)} ({_pct(st.median_error)}) | {_pct(lb.median_ape)} "
            f"({_pct(lb.median_error)}) | {_pct(lb.p90_ape)} | {anchored} | ± {_pct(cov['median_width'])} "
            f"| {_pct(cov['coverage'])} |"
        )
    return "\n".join(lines)


@pytest.mark.slow
def test_the_error_table_is_what_plan_evaluate_computes_now() -> None:
    now = table()
    text = PAGE.read_text()
    head, rest = text.split(START)
    old, tail = rest.split(END)
    if os.environ.get("LONGPACK_REGEN_DOCS") == "1":
        PAGE.write_text(head + START + "\n" + now + "\n" + END + tail)
        old = "\n" + now + "\n"
    assert old.strip() == now, (
        "docs/reference/planner-model.md#errors is stale; rerun with LONGPACK_REGEN_DOCS=1"
    )
