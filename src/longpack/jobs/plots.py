"""Figures the jobs write (matplotlib, the ``plot`` extra, imported when a figure is drawn): written
atomically and without a timestamp, so the same result gives the same bytes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["sweep_png", "write_png_atomic"]


def write_png_atomic(fig: Any, path: Path) -> None:
    """Save a matplotlib figure as a PNG atomically (temp file, fsync, rename), without a timestamp."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, metadata={"Software": None})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sweep_png(result: Any, path: Path) -> None:
    """Real tokens/s, memory per GPU and truncation vs pack size, as a PNG at ``path`` (sweep ``plot``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = result.candidates
    xs = [c.pack_length for c in cands]
    planner = any(c.estimate is not None for c in cands)
    panels = 3 if planner else 1
    fig, axes = plt.subplots(panels, 1, figsize=(7, 2.6 * panels + 0.6), sharex=True, squeeze=False)
    ax_list = [a[0] for a in axes]
    if planner:
        fitting = [(c.pack_length, c.estimate.real_tokens_per_s) for c in cands if c.ok]
        ax = ax_list[0]
        ax.plot([x for x, _ in fitting], [y / 1e3 for _, y in fitting], "o-", color="tab:blue")
        rec = result.recommendation
        if rec is not None:
            best = next(c for c in cands if c.pack_length == rec.pack_length)
            ax.plot(
                [rec.pack_length], [best.estimate.real_tokens_per_s / 1e3], "*", ms=14, color="tab:orange"
            )
        for c in cands:
            if not c.ok:
                ax.axvline(c.pack_length, color="tab:red", ls=":", lw=1)
        ax.set_ylabel("real K tokens/s")
        ax = ax_list[1]
        mem = [(c.pack_length, c.estimate.memory_gib) for c in cands if c.estimate.memory_gib is not None]
        ax.plot([x for x, _ in mem], [y for _, y in mem], "s-", color="tab:purple")
        budget = max(c.estimate.memory_budget_gib for c in cands)
        ax.axhline(budget, color="tab:red", ls="--", lw=1, label=f"budget {budget:.0f} GiB")
        over = [
            (c.pack_length, c.estimate.memory_gib)
            for c in cands
            if not c.estimate.fits and c.estimate.memory_gib
        ]
        if over:
            ax.plot(
                [x for x, _ in over], [y for _, y in over], "x", ms=10, color="tab:red", label="does not fit"
            )
        for c in cands:
            if c.estimate.memory_gib is None:
                ax.axvline(c.pack_length, color="tab:red", ls=":", lw=1)
        ax.set_ylabel("GiB per GPU")
        ax.legend(loc="lower right", fontsize=8)
    ax = ax_list[-1]
    ax.plot(
        xs, [100 * (c.truncated + c.dropped) / max(c.read, 1) for c in cands], "o-", label="samples cut (%)"
    )
    lost = [
        100
        * (c.truncated_tokens_lost + c.dropped_tokens)
        / max(c.real_tokens + c.truncated_tokens_lost + c.dropped_tokens, 1)
        for c in cands
    ]
    ax.plot(xs, lost, "s--", label="tokens lost (%)")
    ax.set_ylabel("truncated + dropped (%)")
    ax.legend(fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("pack length (tokens); GBS = token slots / pack length")
    ax_list[0].set_title(result.title, fontsize=10)
    fig.tight_layout()
    try:
        write_png_atomic(fig, path)
    finally:
        plt.close(fig)
