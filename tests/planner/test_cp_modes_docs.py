"""The figures of docs/guide/plan-data.md are what ``plan_cp_modes`` computes now.

The table between the ``<!-- cp-modes:begin -->`` / ``<!-- cp-modes:end -->`` markers is rebuilt from the
length sets below (seeded) and compared with the page; ``LONGPACK_REGEN_DOCS=1`` rewrites it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from longpack.balance.cp_modes import CP_MODE_NAMES
from longpack.binpack import pack_lengths
from longpack.planner.cp_modes import plan_cp_modes

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "plan-data.md"
BEGIN, END = "<!-- cp-modes:begin -->", "<!-- cp-modes:end -->"


def _packs(lengths: np.ndarray, size: int) -> list[list[int]]:
    bins = pack_lengths(lengths.astype(np.int32), size)
    rows: dict[int, list[int]] = {}
    for n, b in zip(lengths.tolist(), bins.tolist(), strict=True):
        rows.setdefault(b, []).append(int(n))
    return [rows[k] for k in sorted(rows)]


#: Published gains over static sequence / context parallelism, set beside the length set most like the paper's own
#: long-tailed data (not the same data; "-": none).
PUBLISHED = {
    "long-tailed long context (median 6K, max 128K)": "FlexSP (arXiv 2412.01523): up to 1.98x",
    "ByteScale-like tail (median 3K, max 256K)": "ByteScale (arXiv 2502.21231): up to 7.89x",
}


def _cases() -> list[tuple[str, list[list[int]], dict]]:
    rng = np.random.default_rng(2026)
    chat = np.clip(rng.lognormal(np.log(600), 0.8, 20000), 16, 8192).astype(int)
    long_ctx = np.clip(rng.lognormal(np.log(6000), 1.3, 3000), 64, 131072).astype(int)
    extreme = np.clip(rng.lognormal(np.log(3000), 1.6, 4000), 64, 262144).astype(int)
    docs = np.array([131072] * 20 + [1024] * 2400)
    import contextlib

    from longpack.jobs.pack import _demo_folder
    from longpack.jobs.plan_data import corpus_packs

    with contextlib.ExitStack() as stack:
        demo = corpus_packs([str(_demo_folder(stack))], seq_length=4096, pad_seq_to_mult=4, tokenizer="qwen3")
    return [
        (
            "the demo (12,000 chat and prompt/completion records)",
            demo.packs,
            {"pack_size": 4096, "gpus": 16, "tp": 1, "cp": 2},
        ),
        (
            "short-dominated chat (median 600, max 8K)",
            _packs(chat, 8192),
            {"pack_size": 8192, "gpus": 32, "tp": 2, "cp": 2},
        ),
        (
            "long-tailed long context (median 6K, max 128K)",
            _packs(long_ctx, 131072),
            {"pack_size": 131072, "gpus": 128, "tp": 2, "cp": 16},
        ),
        (
            "ByteScale-like tail (median 3K, max 256K)",
            _packs(extreme, 262144),
            {"pack_size": 262144, "gpus": 128, "tp": 1, "cp": 32},
        ),
        (
            "full-length documents among 1K chats",
            _packs(docs, 131072),
            {"pack_size": 131072, "gpus": 64, "tp": 1, "cp": 16},
        ),
    ]


def table() -> str:
    """The table, then every cell a mode is infeasible in (at some cap, or all), with Megatron's reason."""
    lines = [
        "| data | layout (Llama-3.1-8B, H100, BF16) | best hybrid CP (cap) | best DP-balanced (cap) "
        "| best dynamic CP (cap) | band | recommended | published, on the paper's own long-tailed data |",
        "|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for name, packs, lay in _cases():
        dp = lay["gpus"] // (lay["tp"] * lay["cp"])
        plan = plan_cp_modes(packs, model="llama3_1_8b", gpu="h100", gbs=dp * 8, **lay)

        def best(mode: str, plan=plan, name=name) -> str:
            c = plan.best(mode)
            s = c.speedup(mode)
            refused = [x.max_seqlen_per_rank for x in plan.comparisons if mode in x.infeasible]
            mark = f" [{len(notes) + 1}]" if refused else ""
            if refused:
                why: dict[str, list[int]] = {}
                for x in plan.comparisons:
                    if mode in x.infeasible:
                        why.setdefault(x.infeasible[mode], []).append(x.max_seqlen_per_rank)
                notes.append(
                    f"{len(notes) + 1}. {name}, {CP_MODE_NAMES[mode]}: "
                    + "; ".join(
                        f"at cap {', '.join(map(str, caps))}: {reason}" for reason, caps in why.items()
                    )
                )
            if not np.isfinite(c.times[mode]):
                return f"infeasible{mark}"
            return f"{s:.2f}x ({c.max_seqlen_per_rank}){mark}"

        cells = " | ".join(best(m) for m in ("hybrid", "dp_balanced", "dynamic_cp"))
        lines.append(
            f"| {name} | TP{lay['tp']} CP{lay['cp']} DP{dp}, {lay['pack_size'] // 1024}K packs | {cells} | "
            f"± {100 * plan.error_band:.0f} % | {plan.recommended} | {PUBLISHED.get(name, '-')} |"
        )
    if notes:
        lines += ["", "Where a mode is refused (at the caps named; a refused cap is never recommended):", ""]
        lines += notes
    return "\n".join(lines)


@pytest.mark.slow
def test_the_page_shows_what_the_model_computes() -> None:
    text = PAGE.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    now = "\n" + table() + "\n"
    if os.environ.get("LONGPACK_REGEN_DOCS") == "1" and text[start:end] != now:
        PAGE.write_text(text[:start] + now + text[end:])
        return
    assert text[start:end] == now, "docs/guide/plan-data.md is stale; rerun with LONGPACK_REGEN_DOCS=1"
