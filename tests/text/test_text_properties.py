"""Hypothesis properties of the small algorithms in longpack.text (span ownership, chunking)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.text.inputs import jsonl_chunks
from longpack.text.tokenizers import token_owners


@st.composite
def tokens_and_spans(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, int, int]]]:
    lengths = draw(st.lists(st.integers(1, 5), min_size=0, max_size=30))
    total = sum(lengths)
    cuts = sorted(set(draw(st.lists(st.integers(0, total), max_size=8))))
    spans = []
    for k in range(0, len(cuts) - 1, 2):
        if cuts[k] < cuts[k + 1]:
            spans.append((cuts[k], cuts[k + 1], len(spans)))
    return lengths, spans


@settings(max_examples=200, deadline=None)
@given(tokens_and_spans())
def test_token_owners_matches_brute_force(case: tuple[list[int], list[tuple[int, int, int]]]) -> None:
    lengths, spans = case
    ends = np.cumsum(np.array(lengths, dtype=np.int64))
    starts = ends - np.array(lengths, dtype=np.int64)
    got = token_owners(starts, ends, spans).tolist()
    expected = []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        owner = next((t for a, b, t in spans if a < e and s < b), -1)  # first span sharing a unit
        expected.append(owner)
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"x")), max_size=20),
    st.integers(1, 64),
    st.booleans(),
)
def test_jsonl_chunks_cover_the_file_at_line_boundaries(
    lines: list[bytes], chunk: int, trailing: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "x.jsonl"
        p.write_bytes(data)
        h = hashlib.sha256()
        got = list(jsonl_chunks(p, h, chunk_bytes=chunk))
    assert b"".join(blob for _, blob in got) == data
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    line = 1
    for first, blob in got:
        assert first == line
        assert blob.endswith(b"\n") or blob is got[-1][1]
        line += blob.count(b"\n")
