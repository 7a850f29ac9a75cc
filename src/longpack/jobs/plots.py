"""Figures the jobs write (matplotlib, the ``plot`` extra, imported when a figure is drawn): written
atomically and without a timestamp, so the same result gives the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longpack.outputs import atomic_write

__all__ = ["plan_png", "plot_figure", "sweep_png", "write_png_atomic"]


def write_png_atomic(fig: Any, path: Path) -> None:
    """Save a matplotlib figure as a PNG atomically (temp file, fsync, rename), without a timestamp."""
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=120, metadata={"Software": None}))


def sweep_png(result: Any, path: Path) -> None:
    """Real tokens/s, memory per GPU and truncation vs pack size, as a PNG at ``path`` (sweep ``plot``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = result.candidates
    planner = any(c.estimate is not None for c in cands)
    panels = 3 if planner else 1
    fig, axes = plt.subplots(panels, 1, figsize=(7, 2.6 * panels + 0.6), sharex=True, squeeze=False)
    ax_list = [a[0] for a in axes]
    if planner:
        _throughput_panel(ax_list[0], cands, result.recommendation)
        _memory_panel(ax_list[1], cands)
    _cut_panel(ax_list[-1], cands)
    ax_list[0].set_title(result.title, fontsize=10)
    fig.tight_layout()
    try:
        write_png_atomic(fig, path)
    finally:
        plt.close(fig)


def _throughput_panel(ax: Any, cands: Any, rec: Any) -> None:
    """Real tokens/s of the candidates that fit, the recommended one starred, the others marked."""
    fitting = [(c.pack_length, c.estimate.real_tokens_per_s) for c in cands if c.ok]
    ax.plot([x for x, _ in fitting], [y / 1e3 for _, y in fitting], "o-", color="tab:blue")
    if rec is not None:
        best = next(c for c in cands if c.pack_length == rec.pack_length)
        ax.plot([rec.pack_length], [best.estimate.real_tokens_per_s / 1e3], "*", ms=14, color="tab:orange")
    for c in cands:
        if not c.ok:
            ax.axvline(c.pack_length, color="tab:red", ls=":", lw=1)
    ax.set_ylabel("real K tokens/s")


def _memory_panel(ax: Any, cands: Any) -> None:
    """Memory per GPU against the budget; what does not fit crossed, what has no estimate marked."""
    mem = [(c.pack_length, c.estimate.memory_gib) for c in cands if c.estimate.memory_gib is not None]
    ax.plot([x for x, _ in mem], [y for _, y in mem], "s-", color="tab:purple")
    budget = max(c.estimate.memory_budget_gib for c in cands)
    ax.axhline(budget, color="tab:red", ls="--", lw=1, label=f"budget {budget:.0f} GiB")
    over = [
        (c.pack_length, c.estimate.memory_gib) for c in cands if not c.estimate.fits and c.estimate.memory_gib
    ]
    if over:
        ax.plot([x for x, _ in over], [y for _, y in over], "x", ms=10, color="tab:red", label="does not fit")
    for c in cands:
        if c.estimate.memory_gib is None:
            ax.axvline(c.pack_length, color="tab:red", ls=":", lw=1)
    ax.set_ylabel("GiB per GPU")
    ax.legend(loc="lower right", fontsize=8)


def _cut_panel(ax: Any, cands: Any) -> None:
    """Samples cut and tokens lost (truncated + dropped) per pack size, on the shared log-2 axis."""
    xs = [c.pack_length for c in cands]
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


def plot_figure(rows: list[dict[str, Any]], budget_gib: float, title: str) -> Any:
    """The ``--plot`` figure: TFLOP/s/GPU (top) and memory (bottom, from zero, with the budget line) of
    the best layout per sequence length, each point labelled with its layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    xs = [r["seq_length"] for r in rows]
    ys = [r["tflops"] for r in rows]
    ax1.plot(xs, ys, "o-", color="tab:blue")
    for r in rows:
        ax1.annotate(
            r["short_label"],
            (r["seq_length"], r["tflops"]),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
        )
    ax1.set_ylabel("TFLOP/s/GPU (best layout)")
    ax1.set_ylim(0, max([*ys, 1.0]) * 1.25)
    mems = [r["memory_gib"] for r in rows]
    ax2.plot(xs, mems, "s-", color="tab:red", label="estimated peak (most loaded rank)")
    ax2.axhline(budget_gib, color="black", linestyle="--", linewidth=1, label=f"budget {budget_gib:.0f} GiB")
    ax2.set_ylim(0, max([*mems, budget_gib]) * 1.15)
    ax2.set_ylabel("GiB per GPU")
    ax2.legend(loc="lower right", fontsize=8)
    if xs:
        ax2.set_xscale("log", base=2)
        ax2.set_xticks(xs, [f"{x // 1024}K" for x in xs])
    ax2.set_xlabel("sequence length")
    ax1.set_title(title)
    fig.tight_layout()
    return fig


def plan_png(req_kwargs: dict[str, Any], seq_length: int, path: Path) -> list[dict[str, Any]]:
    """TFLOP/s/GPU and memory of the best layout at 4K, 8K, ... up to ``seq_length``: memory axis from
    zero with the budget line, each point labelled with its layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from longpack.planner.search import SearchRequest, search

    lengths = []
    s = 4096
    while s <= seq_length:
        lengths.append(s)
        s *= 2
    if not lengths or lengths[-1] != seq_length:
        lengths.append(seq_length)
    rows: list[dict[str, Any]] = []
    budget = 0.0
    for s in lengths:
        req = SearchRequest(**{**req_kwargs, "seq_length": s})
        budget = req.memory_budget_gib
        res = search(req, top_k=1)
        if res.candidates:
            c = res.candidates[0]
            lay = c.plan.layout
            rows.append(
                {
                    "seq_length": s,
                    "layout": c.plan.label,
                    "short_label": f"TP{lay.tp} CP{lay.cp} EP{lay.ep} PP{lay.pp}",
                    "tflops": c.time.tflops_per_gpu,
                    "memory_gib": c.memory.total_gib,
                    "memory_rank": c.memory.rank,
                }
            )
    fig = plot_figure(
        rows, budget, f"{req_kwargs['model'].name} on {req_kwargs['num_gpus']}x{req_kwargs['gpu'].name}"
    )
    write_png_atomic(fig, path)
    plt.close(fig)
    return rows
