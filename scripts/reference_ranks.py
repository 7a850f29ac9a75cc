"""Print the rank of every published long-context layout among the planner's feasible layouts.

For each calibration point at 16K tokens and more with a measured throughput, the planner is asked for the
same model, GPU, GPU count, sequence length, precision and global batch; the published layout (the
``published`` reference) is evaluated and its rank among the feasible layouts, by predicted step time, is
printed with the count (ranked among the layouts that also pass ``longpack check``). Runs on any longpack tree with ``reference_for`` and ``search(keep_all=True)``, so
the same script gives the figures of an older commit (``PYTHONPATH=<old tree>/src python
scripts/reference_ranks.py``).

Usage: ``python scripts/reference_ranks.py`` (a markdown table on stdout).
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import replace


def ranks() -> list[tuple[str, str, int, int, str]]:
    """``(point id, what, rank, of, recommended)`` of each published long-context layout."""
    from longpack.planner.calibration import packaged_points
    from longpack.planner.catalog import load_gpu, load_model
    from longpack.planner.reference import reference_for
    from longpack.planner.search import SearchRequest, search

    out = []
    for p in packaged_points():
        if not p.tflops or p.seq_length < 16384 or p.superseded:
            continue
        req = SearchRequest(
            model=load_model(p.model),
            gpu=load_gpu(p.gpu),
            num_gpus=p.plan.layout.world_size,
            seq_length=p.seq_length,
            gbs=p.gbs,
            precision=p.options.precision,
        )
        ref = reference_for(req)
        if ref is None or ref.kind != "published":
            continue
        found = search(replace(req, keep_all=True))
        times = sorted(c.time.step_time for c in found.candidates)
        rank = bisect.bisect_left(times, ref.candidate.time.step_time) + 1
        what = (
            f"{p.model} {p.seq_length // 1024}K on {p.plan.layout.world_size} {p.gpu} {p.options.precision}"
        )
        out.append((p.id, f"{what}: {ref.candidate.plan.label}", rank, len(times), _verdict(p, req)))
    return out


def _verdict(p: object, req: object) -> str:
    """What ``longpack plan`` recommends for the run's request: the published layout, or a pick with
    its claimed gain."""
    from longpack.jobs import PlanConfig

    cfg = PlanConfig(
        model=req.model.name,  # type: ignore[attr-defined]
        gpu=req.gpu.name,  # type: ignore[attr-defined]
        gpus=req.num_gpus,  # type: ignore[attr-defined]
        seq_length=req.seq_length,  # type: ignore[attr-defined]
        gbs=req.gbs,  # type: ignore[attr-defined]
        precision=req.precision,  # type: ignore[attr-defined]
        top=1,
    )
    cmp_ = cfg.run().comparison
    if cmp_ is None or cmp_.verdict != "pick":
        return "published"
    return f"pick {cmp_.gain:+.0%}"


def table(rows: list[tuple[str, str, int, int, str]]) -> str:
    """The markdown table of :func:`ranks`."""
    lines = ["| point | published layout | rank | recommended |", "|---|---|---:|---|"]
    lines += [f"| {i} | {what} | {rank:,} of {of:,} | {v} |" for i, what, rank, of, v in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table(ranks()) + "\n")
