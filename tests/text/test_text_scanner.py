"""The compiled pre-tokenized scanner (``longpack.text._native``) and the threaded reader built on it.

What must hold: a line the scanner takes is one ``json.loads`` reads, to the same tokens, mask and keys
(the per-row path's result); every other line is left to the per-row path, so that ``tokenize_inputs``
gives exactly what the per-row ``json.loads`` path gives for any file (samples, row numbers, malformed rows
with ``file:line``, column counts, sha256), for any chunking and thread count.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longpack.text import InputError, TextConfig, load_tokenizer, tokenize_inputs
from longpack.text import pipeline as text_pipeline
from longpack.text.rows import RowError, sample_from_row

if os.environ.get("LONGPACK_KERNELS") != "numba":
    native = importlib.import_module("longpack.text._native")
else:
    native = pytest.importorskip("longpack.text._native", reason="LONGPACK_KERNELS=numba")

TOK = load_tokenizer("bytes")  # vocabulary 0..258


def scan_lines(data: bytes) -> tuple[Any, ...]:
    size = len(data)
    buffers = text_pipeline._ScanBuffers(size, np.int32)
    return text_pipeline._scan(data, TOK.vocab_size, np.int32, buffers), buffers


def slow_sample(line: bytes) -> tuple[list[int], list[int], set[str]] | None:
    """What the per-row path makes of one line: (ids, mask, keys), or None if it rejects it."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    try:
        ids, mask = sample_from_row(row, "pretokenized", TextConfig(), TOK)
    except RowError:
        return None
    return ids, list(mask), set(row)


# -- line grammar: valid pieces and near misses --------------------------------------------------------

WS = st.sampled_from(["", " ", "  ", "\t", "\r", "\x0b", "\x0c", "\xa0", "\n"])
INTS = st.sampled_from(
    [
        "0",
        "1",
        "-0",
        "7",
        "258",
        "259",
        "-1",
        "01",
        "+2",
        "1.0",
        "1e2",
        "2E1",
        "1.",
        "99999999999999999999",
        "123456789012345678",
        "1234567890123456789",
        " 4",
        "5 ",
        "true",
        "null",
        '"3"',
        "0x1",
        "",
        "NaN",
    ]
)
MASK = st.sampled_from(["0", "1", "-0", "2", "true", "false", "1.0", "01", " 1", "1 ", "null"])
VALUE = st.recursive(
    st.sampled_from(
        [
            '"x"',
            '"a\\"b"',
            '"\\u00e9"',
            '"\\ud800"',
            '"\\x"',
            '"tab\there"',
            '"é"',
            '"\ud800"',
            '"😀"',
            "1",
            "-2.5e3",
            "1.",
            "01",
            "NaN",
            "Infinity",
            "-Infinity",
            "+1",
            "true",
            "false",
            "null",
            "nul",
            '""',
            "[]",
            "{}",
            "[1,]",
            '{"a":}',
        ]
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(inner, max_size=2).map(
            lambda xs: "{" + ", ".join(f'"k{i}": {x}' for i, x in enumerate(xs)) + "}"
        ),
    ),
    max_leaves=6,
)
KEY = st.sampled_from(
    ['"input_ids"', '"loss_mask"', '"id"', '"é"', '"input\\u005fids"', '"lengths"', "input_ids", '"a\tb"']
)


CLEAN_WS = st.sampled_from(["", " ", "\t", "\r", " \t "])
CLEAN_INTS = st.sampled_from(["0", "1", "-0", "7", "42", "258"])
CLEAN_VALUE = st.sampled_from(['"x"', '"\\u00e9"', '"é"', "1", "-2.5e3", "null", "[1, {}]", '{"a": [true]}'])


@st.composite
def lines(draw: Any) -> bytes:
    """Half clean rows (every piece valid, so most are taken), half with near misses in every piece."""
    clean = draw(st.booleans())
    ws, ints, mask, value = (
        (CLEAN_WS, CLEAN_INTS, st.sampled_from(["0", "1"]), CLEAN_VALUE) if clean else (WS, INTS, MASK, VALUE)
    )
    keys = draw(st.lists(KEY, min_size=0, max_size=4))
    if clean:
        keys = [
            '"input_ids"',
            *draw(st.lists(st.sampled_from(['"loss_mask"', '"id"', '"é"']), unique=True, max_size=2)),
        ]
        keys = draw(st.permutations(keys))
    n = draw(st.integers(2, 6)) if clean else None
    members = []
    for key in keys:
        if key in ('"input_ids"', '"input\\u005fids"'):
            items = draw(st.lists(ints, min_size=n or 0, max_size=n or 5))
            value_text = "[" + ",".join(draw(ws) + v + draw(ws) for v in items) + "]"
        elif key == '"loss_mask"':
            items = draw(st.lists(mask, min_size=n or 0, max_size=n or 5))
            value_text = "[" + ",".join(draw(ws) + v for v in items) + "]"
            if not clean and draw(st.booleans()):
                value_text = draw(st.sampled_from(["null", "[1, 1]", "[1, 1, 1]"]))
        else:
            value_text = draw(value)
        members.append(key + draw(ws) + ":" + draw(ws) + value_text)
    body = ("," + draw(ws)).join(members)
    text = draw(ws) + "{" + draw(ws) + body + draw(ws) + "}" + draw(ws)
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate: the bytes json.loads still decodes
    if data and draw(st.integers(0, 3)) == 0:  # a near miss: one byte dropped, doubled or replaced
        k = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["drop", "double", "replace"]))
        if how == "drop":
            data = data[:k] + data[k + 1 :]
        elif how == "double":
            data = data[:k] + data[k : k + 1] + data[k:]
        else:
            data = data[:k] + bytes([draw(st.integers(0, 255))]) + data[k + 1 :]
    return data


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines(), min_size=1, max_size=6))
def test_an_accepted_line_is_what_json_loads_reads(texts: list[bytes]) -> None:
    data = b"\n".join(texts)
    scan, _ = scan_lines(data)
    physical = data.split(b"\n")
    accepted = dict(zip(scan.lines.tolist(), range(len(scan.lengths)), strict=True))
    declined = {line for _, _, line in scan.declined}
    ends = np.concatenate([[0], np.cumsum(scan.lengths)])
    keys: dict[int, set[str]] = {}
    for row, start, end in scan.keys:
        keys.setdefault(row, set()).add(data[start:end].decode())
    for k, line in enumerate(physical):
        if not line.strip():
            assert k not in accepted and k not in declined  # blank: skipped, as the per-row path skips it
            continue
        assert (k in accepted) != (k in declined)
        if k in accepted:
            want = slow_sample(line)
            assert want is not None, line  # json.loads reads it and the per-row path takes it
            r = accepted[k]
            assert scan.tokens[ends[r] : ends[r + 1]].tolist() == want[0], line
            assert scan.mask[ends[r] : ends[r + 1]].tolist() == want[1], line
            assert {"input_ids"} | ({"loss_mask"} if "loss_mask" in want[2] else set()) | keys.get(
                r, set()
            ) == want[2]
    assert scan.newlines == data.count(b"\n")


def test_the_plain_forms_are_taken_and_the_rest_declined() -> None:
    taken = [
        b'{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}',
        b'{"loss_mask":[1,1],"input_ids":[258,0]}\r',
        b' {"input_ids": [ 5 , -0 ] , "id": "x\\u00e9\xc3\xa9", "meta": {"a": [1.5e3, null, true]}} ',
        b'{"input_ids": [7, 8], "score": -Infinity, "n": NaN}',
    ]
    declined = [
        b'{"input_ids": [1, 2], "loss_mask": [true, false]}',  # bool mask: json.loads path
        b'{"input_ids": [1, 2], "input_ids": [3, 4]}',  # duplicate key
        b'{"input\\u005fids": [1, 2]}',  # escaped key
        b'{"input_ids": [1, 2.0]}',
        b'{"input_ids": [1, 259]}',  # outside the vocabulary
        b'{"input_ids": [1]}',  # one token
        b'{"input_ids": [1, 2], "loss_mask": [1]}',
        b'{"input_ids": [01, 2]}',
        b'{"input_ids": [1, 2]}\x0c',
        b'{"input_ids": [1, 2], "s": "\xed\xa0\x80"}',  # an encoded surrogate
        b'{"input_ids": [1, 2], "loss_mask": null}',
    ]
    scan, _ = scan_lines(b"\n".join([*taken, *declined]))
    assert scan.lines.tolist() == [0, 1, 2, 3]
    assert [line for _, _, line in scan.declined] == list(range(4, 4 + len(declined)))
    assert scan.tokens.tolist() == [1, 2, 3, 258, 0, 5, 0, 7, 8]
    assert scan.mask.tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1] and scan.with_mask == 2
    for line in taken:
        assert slow_sample(line) is not None


def _per_row_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """tokenize_inputs as it reads without any fast path: json.loads + sample_from_row for every line."""
    monkeypatch.setattr(text_pipeline, "_scanner", lambda: None)
    monkeypatch.setattr(text_pipeline, "_fast_pretokenized", lambda job, tok: None)


def _run(path: Path, *, skip: bool = True, workers: int = 1) -> Any:
    cfg = TextConfig(format="pretokenized", skip_malformed=skip)
    try:
        return tokenize_inputs([str(path)], tokenizer="bytes", config=cfg, workers=workers)
    except InputError as e:
        return e


def _same(a: Any, b: Any) -> None:
    if isinstance(a, Exception) or isinstance(b, Exception):
        assert type(a) is type(b) and str(a) == str(b)
        return
    for name in ("tokens", "loss_mask", "offsets", "source_row", "source_file"):
        np.testing.assert_array_equal(getattr(a.samples, name), getattr(b.samples, name), err_msg=name)
    assert a.samples.tokens.dtype == b.samples.tokens.dtype
    assert a.rows_read == b.rows_read and a.malformed == b.malformed and a.inputs == b.inputs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(lines(), st.sampled_from([b'{"input_ids": [1, 2, 3]}', b"", b"  ", b"not json"])),
        max_size=12,
    ),
    st.sampled_from(["\n", "\r\n"]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([7, 64, 1 << 20]),
)
def test_tokenize_inputs_reads_exactly_what_the_per_row_path_reads(
    tmp_path_factory: pytest.TempPathFactory,
    texts: list[bytes],
    newline: str,
    bom: bool,
    skip: bool,
    chunk: int,
) -> None:
    path = tmp_path_factory.mktemp("scan") / "rows.jsonl"
    body = newline.encode().join(t.replace(b"\n", b" ") for t in texts)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(text_pipeline, "SCAN_CHUNK_BYTES", chunk)  # chunk edges inside lines, lines > a chunk
        fast = _run(path, skip=skip, workers=2)
        fast_one = _run(path, skip=skip, workers=1)
    with pytest.MonkeyPatch.context() as mp:
        _per_row_only(mp)
        slow = _run(path, skip=skip)
    _same(fast, slow)
    _same(fast_one, slow)


def test_scanned_file_keeps_line_numbers_hash_and_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(1)
    rows = []
    for k in range(400):
        n = int(rng.integers(2, 60))
        row: dict[str, Any] = {"input_ids": rng.integers(0, 259, n).tolist()}
        if k % 3:
            row["loss_mask"] = rng.integers(0, 2, n).tolist()
        if k % 5 == 0:
            row["id"] = f"row-{k}"
        rows.append(json.dumps(row))
    rows[17] = ""  # blank: skipped, numbering kept
    rows[40] = '{"input_ids": [1, 2], "loss_mask": [true, false]}'  # declined, read by json.loads
    rows[41] = '{"input_ids": [1, 1.5]}'  # malformed: reported at its line
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(text_pipeline, "SCAN_CHUNK_BYTES", 1000)
    got = _run(path, workers=2)
    assert got.malformed == ((f"{path}:42", "key 'input_ids' must hold integers, found 1.5"),)
    assert got.inputs[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert got.inputs[0]["columns"]["ignored"] == {"id": 79}  # 80 minus row 40, replaced
    assert got.samples.source_row.tolist() == [k + 1 for k in range(400) if k not in (17, 41)]
    with pytest.raises(InputError, match=r"p\.jsonl:42: key 'input_ids' must hold integers"):
        tokenize_inputs([str(path)], tokenizer="bytes", config=TextConfig(format="pretokenized"), workers=2)
    monkeypatch.setattr(text_pipeline, "_scanner", lambda: None)
    monkeypatch.setattr(text_pipeline, "_fast_pretokenized", lambda job, tok: None)
    _same(got, _run(path))


def test_scanner_refuses_short_output_buffers() -> None:
    data = b'{"input_ids": [1, 2]}\n'
    small = np.empty(2, np.int32)
    with pytest.raises(ValueError, match="tokens/mask need"):
        native.scan_pretokenized(
            data, 259, small, np.empty(20, np.uint8), np.empty(5, np.int64), np.empty(5, np.int64)
        )
