"""The rank table of published long-context layouts in docs/guide/plan.md is what
``scripts/reference_ranks.py`` prints now (the "now" column; the "before" column is the same script's
output at commit b1d6110, kept as printed). ``LONGPACK_REGEN_DOCS=1`` rewrites the "now" column."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guide" / "plan.md"
START, END = "<!-- reference-ranks:start -->", "<!-- reference-ranks:end -->"
ROW = re.compile(r"^\| (cp\d+) \| (.+?) \| (.+?) \| (.+?) \| (.+?) \| (.+?) \|$")


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("reference_ranks", ROOT / "scripts" / "reference_ranks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table() -> list[tuple[str, ...]]:
    text = PAGE.read_text()
    block = text[text.index(START) + len(START) : text.index(END)]
    rows = []
    for line in block.strip().splitlines()[2:]:
        m = ROW.match(line)
        assert m, line
        rows.append(tuple(m.group(k) for k in range(1, 7)))
    return rows


@pytest.mark.slow
def test_the_rank_table_is_what_the_script_prints_now() -> None:
    now = {i: (what, f"{rank:,} of {of:,}", v) for i, what, rank, of, v in _script().ranks()}
    if os.environ.get("LONGPACK_REGEN_DOCS") == "1":
        before = {r[0]: (r[2], r[4]) for r in _table()}
        lines = [
            "| point | published layout | rank before (b1d6110) | rank now | recommended before | recommended now |",
            "|---|---|---:|---:|---|---|",
        ]
        for i, (what, rank, v) in now.items():
            b_rank, b_v = before.get(i, ("-", "-"))
            lines.append(f"| {i} | {what} | {b_rank} | {rank} | {b_v} | {v} |")
        text = PAGE.read_text()
        head, rest = text.split(START)
        _old, tail = rest.split(END)
        PAGE.write_text(head + START + "\n" + "\n".join(lines) + "\n" + END + tail)
    rows = _table()
    assert [r[0] for r in rows] == list(now)
    for i, what, _b_rank, rank, _b_v, v in rows:
        assert (what, rank, v) == now[i], i
