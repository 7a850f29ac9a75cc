"""Hypothesis properties of the small algorithms in longpack.text (span ownership, chunking)."""

from __future__ import annotations

import gzip
import hashlib
import json
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
    st.booleans(),
)
def test_jsonl_chunks_cover_the_file_at_line_boundaries(
    lines: list[bytes], chunk: int, trailing: bool, bom: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    data = b"\xef\xbb\xbf" + data if bom else data  # the mark is dropped, whatever the block size
    if data.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"["):
        data = b"x" + data  # a JSON array file is read element by element (tested below)
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "x.jsonl"
        p.write_bytes(data)
        h = hashlib.sha256()
        got = list(jsonl_chunks(p, h, chunk_bytes=chunk))
    assert b"".join(blob for _, blob in got) == data.removeprefix(b"\xef\xbb\xbf")
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    line = 1
    for first, blob in got:
        assert first == line
        assert blob.endswith(b"\n") or blob is got[-1][1]
        line += blob.count(b"\n")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.dictionaries(st.text(max_size=5), json_values, max_size=4), max_size=12),
    st.sampled_from([None, 1, 2]),
    st.integers(1, 200),
    st.sampled_from(["none", "gzip", "zstd"]),
)
def test_json_array_chunks_give_every_element_once(
    rows: list[dict], indent: int | None, chunk: int, compression: str
) -> None:
    """A JSON array file read in chunks: one element per line, numbered from 1, whatever the layout,
    chunk size or compression; the hash is of the file as stored."""
    data = json.dumps(rows, indent=indent, ensure_ascii=False).encode()
    if compression == "gzip":
        stored, name = gzip.compress(data), "x.json.gz"
    elif compression == "zstd":
        import zstandard

        stored, name = zstandard.ZstdCompressor().compress(data), "x.json.zst"
    else:
        stored, name = data, "x.json"
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / name
        p.write_bytes(stored)
        h = hashlib.sha256()
        got = list(jsonl_chunks(p, h, chunk_bytes=chunk))
    parsed = [
        (first + k, json.loads(line)) for first, blob in got for k, line in enumerate(blob.splitlines())
    ]
    assert parsed == list(enumerate(rows, start=1))
    assert h.hexdigest() == hashlib.sha256(stored).hexdigest()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"x")), max_size=30),
    st.integers(1, 64),
    st.sampled_from(["gzip", "zstd"]),
)
def test_compressed_jsonl_chunks_equal_the_plain_file(
    lines: list[bytes], chunk: int, compression: str
) -> None:
    data = b"x" + b"\n".join(lines)
    if compression == "gzip":
        # two gzip members, as `cat a.gz b.gz` makes
        half = len(data) // 2
        stored = gzip.compress(data[:half]) + gzip.compress(data[half:])
    else:
        import zstandard

        stored = zstandard.ZstdCompressor().compress(data)
    with tempfile.TemporaryDirectory() as tmp:
        plain, packed = (
            Path(tmp) / "a.jsonl",
            Path(tmp) / ("a.jsonl.gz" if compression == "gzip" else "a.jsonl.zst"),
        )
        plain.write_bytes(data)
        packed.write_bytes(stored)
        assert list(jsonl_chunks(packed, hashlib.sha256(), chunk)) == list(
            jsonl_chunks(plain, hashlib.sha256(), chunk)
        )
