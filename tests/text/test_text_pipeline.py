"""tokenize_inputs end to end: JSONL and Parquet, globs/folders, auto-detection, errors, workers, demo data."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longpack.text import (
    InputError,
    TextConfig,
    demo_inputs,
    load_tokenizer,
    resolve_inputs,
    tokenize_inputs,
    write_demo_dataset,
)
from longpack.text import inputs as inputs_mod
from longpack.text.pipeline import _fast_pretokenized, _Job

EOS = 258


def write_jsonl(path: Path, rows: list, raw: dict[int, str] | None = None) -> Path:
    """Rows as JSON lines; ``raw`` replaces line i (0-based) with a literal string."""
    lines = [json.dumps(r) for r in rows]
    for i, text in (raw or {}).items():
        lines.insert(i, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


PC_ROWS = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(5)]


def run(paths, **kw):
    cfg = kw.pop(
        "config", TextConfig(**{k: kw.pop(k) for k in list(kw) if k in TextConfig.__dataclass_fields__})
    )
    return tokenize_inputs(
        [str(p) for p in paths],
        tokenizer=kw.pop("tokenizer", "bytes"),
        config=cfg,
        workers=kw.pop("workers", 1),
    )


def test_jsonl_prompt_completion_end_to_end(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "a.jsonl", PC_ROWS)
    r = run([p])
    s = r.samples
    assert r.format == "prompt_completion" and r.rows_read == 5 and r.malformed == ()
    assert s.tokens.dtype == np.int32 and s.loss_mask.dtype == np.uint8 and s.offsets.dtype == np.int64
    assert s.sample(1)[0].tolist() == [*b"p1", *b"c1", EOS] and s.sample(1)[1].tolist() == [0, 0, 1, 1, 1]
    assert s.source_row.tolist() == [1, 2, 3, 4, 5] and s.files == (str(p.resolve()),)
    assert r.inputs[0]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert r.inputs[0]["size_bytes"] == p.stat().st_size and r.inputs[0]["format"] == "prompt_completion"
    assert r.tokenizer["kind"] == "bytes" and r.tokenizer["eos_id"] == EOS
    # progress bars only draw on a terminal; elsewhere they are silent and change nothing
    quiet = tokenize_inputs([str(p)], tokenizer="bytes", config=TextConfig(), workers=1, progress=True)
    assert quiet.samples.tokens.tolist() == s.tokens.tolist()


def test_malformed_json_names_file_line_and_skip_counts(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "bad.jsonl", PC_ROWS, raw={2: '{"prompt": "x", '})
    with pytest.raises(
        InputError,
        match=r"bad\.jsonl:3: invalid JSON \(Expecting property name .* column 17\).*--skip-malformed",
    ):
        run([p])
    r = run([p], skip_malformed=True)
    assert r.rows_read == 6 and len(r.samples) == 5
    assert [m[0] for m in r.malformed] == [f"{p.resolve()}:3"] and "invalid JSON" in r.malformed[0][1]
    assert r.samples.source_row.tolist() == [1, 2, 4, 5, 6]


def test_blank_lines_keep_line_numbers_and_missing_key_error(tmp_path: Path) -> None:
    p = write_jsonl(
        tmp_path / "b.jsonl", PC_ROWS[:2], raw={1: "", 2: "   ", 3: '{"prompt": "x", "answer": "y"}'}
    )
    with pytest.raises(
        InputError,
        match=r"b\.jsonl:4: missing key 'completion' \(completion\); the row has keys \['answer', 'prompt'\]",
    ):
        run([p])
    r = run([p], skip_malformed=True)
    assert r.samples.source_row.tolist() == [1, 5] and r.rows_read == 3


def test_empty_inputs_and_all_malformed_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no rows in the inputs"):
        run([tmp_path / "e.jsonl"])
    p = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "a", "answer": "b"}] * 2)
    with pytest.raises(InputError, match=r"all 2 rows were malformed and skipped \(first: .*m\.jsonl:1"):
        run([p], skip_malformed=True, format="prompt_completion")
    (tmp_path / "arr.json").write_text('[{"prompt": "a"}, 3]')  # arrays are read; these rows are bad
    with pytest.raises(InputError, match=r"arr\.json:1: missing key 'completion'"):
        run([tmp_path / "arr.json"], format="prompt_completion")
    with pytest.raises(InputError, match=r"all 2 rows were malformed"):
        run([tmp_path / "arr.json"], format="prompt_completion", skip_malformed=True)
    p = write_jsonl(tmp_path / "nofmt.jsonl", [{"body": "a"}])  # ("text" is a document: format text)
    with pytest.raises(InputError, match=r"nofmt\.jsonl: cannot detect the format from keys \['body'\]"):
        run([p])


def test_auto_detects_per_file_and_reports(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d" / "1_pc.jsonl", PC_ROWS[:2])
    write_jsonl(
        tmp_path / "d" / "2_chat.jsonl",
        [{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}],
    )
    write_jsonl(
        tmp_path / "d" / "3_sg.jsonl",
        [{"conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}]}],
    )
    write_jsonl(tmp_path / "d" / "4_pre.jsonl", [{"input_ids": [1, 2, 3]}])
    r = run([tmp_path / "d"])
    assert r.format == "chat,pretokenized,prompt_completion,sharegpt"
    assert [i["format"] for i in r.inputs] == ["prompt_completion", "chat", "sharegpt", "pretokenized"]
    assert len(r.samples) == 5 and r.samples.source_file.tolist() == [0, 0, 1, 2, 3]
    # chat and sharegpt give the same sample
    assert r.samples.sample(2)[0].tolist() == r.samples.sample(3)[0].tolist()
    # a forced format applies to every file
    with pytest.raises(InputError, match=r"1_pc\.jsonl:1: missing key 'messages'"):
        run([tmp_path / "d"], format="chat")


def test_parquet_inputs_all_formats(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"prompt": ["p0", "p1"], "completion": ["c0", "c1"], "extra": [1, 2]}),
        tmp_path / "pc.parquet",
    )
    msgs = [[{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]]
    pq.write_table(pa.table({"messages": msgs}), tmp_path / "chat.parquet")
    pre = pa.table(
        {
            "input_ids": pa.array([[1, 2, 3], [4, 5]], pa.list_(pa.int32())),
            "loss_mask": pa.array([[0, 1, 1], [1, 1]], pa.list_(pa.int8())),
        }
    )
    pq.write_table(pre, tmp_path / "pre.pq")
    r = run([tmp_path / "*.parquet", tmp_path / "pre.pq"])
    assert [Path(i["path"]).name for i in r.inputs] == ["chat.parquet", "pc.parquet", "pre.pq"]
    s = r.samples
    assert len(s) == 5 and s.source_row.tolist() == [0, 0, 1, 0, 1]  # Parquet rows are 0-based
    assert s.sample(1)[0].tolist() == [*b"p0", *b"c0", EOS]
    assert s.sample(3)[0].tolist() == [1, 2, 3] and s.sample(3)[1].tolist() == [0, 1, 1]
    chat_jsonl = write_jsonl(tmp_path / "j" / "chat.jsonl", [{"messages": msgs[0]}])
    assert s.sample(0)[0].tolist() == run([chat_jsonl]).samples.sample(0)[0].tolist()
    # a null in a Parquet row is reported with its 0-based row index
    pq.write_table(pa.table({"prompt": ["a", None], "completion": ["b", "c"]}), tmp_path / "null.parquet")
    with pytest.raises(InputError, match=r"null\.parquet:1: key 'prompt' must be a str, got NoneType"):
        run([tmp_path / "null.parquet"])


def test_pretokenized_fast_and_row_paths_agree(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [
        {"input_ids": rng.integers(0, 256, int(n)).tolist(), "loss_mask": rng.integers(0, 2, int(n)).tolist()}
        for n in rng.integers(2, 40, 50)
    ]
    clean = write_jsonl(tmp_path / "clean.jsonl", rows)  # numpy text fast path
    blank = write_jsonl(tmp_path / "blank.jsonl", rows, raw={10: ""})  # fast path, line numbers kept
    reordered = [{"loss_mask": r["loss_mask"], "input_ids": r["input_ids"]} for r in rows]
    slow = write_jsonl(tmp_path / "slow.jsonl", reordered)  # not the plain form -> per-row json path
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    a, b_, c, d = run([clean]).samples, run([blank]).samples, run([parquet]).samples, run([slow]).samples
    job = _Job("jsonl", "x", 1, clean.read_bytes(), "pretokenized", TextConfig(), "bytes")
    assert _fast_pretokenized(job, load_tokenizer("bytes")) is not None
    assert _fast_pretokenized(replace(job, payload=slow.read_bytes()), load_tokenizer("bytes")) is None
    for other in (b_, c, d):
        assert np.array_equal(a.tokens, other.tokens) and np.array_equal(a.loss_mask, other.loss_mask)
        assert np.array_equal(a.offsets, other.offsets)
    assert a.source_row.tolist() == list(range(1, 51))
    assert b_.source_row.tolist() == list(range(1, 11)) + list(range(12, 52))
    assert c.source_row.tolist() == list(range(50))
    # a bad row inside an otherwise clean chunk is still found at its line
    bad = write_jsonl(tmp_path / "bad.jsonl", [*rows[:5], {"input_ids": [1]}, *rows[5:]])
    with pytest.raises(InputError, match=r"bad\.jsonl:6: the sample has 1 token"):
        run([bad])


def test_worker_count_does_not_change_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs_mod, "JSONL_CHUNK_BYTES", 4096)  # many chunks
    monkeypatch.setattr("longpack.text.pipeline.INLINE_BYTES", 0)  # small, but with the worker pool
    monkeypatch.setattr(inputs_mod, "PARQUET_CHUNK_ROWS", 16)
    demo = write_demo_dataset(tmp_path / "demo", n=300, seed=3)
    rows = [json.loads(x) for x in (demo / "prompt_completion.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), demo / "pc.parquet")
    bad = write_jsonl(tmp_path / "demo" / "z_bad.jsonl", PC_ROWS * 20, raw={7: "{oops", 50: "[1]"})
    assert bad.exists()
    cfg = TextConfig(skip_malformed=True)
    one = tokenize_inputs([str(demo)], tokenizer="qwen3", config=cfg, workers=1)
    two = tokenize_inputs([str(demo)], tokenizer="qwen3", config=cfg, workers=2)
    for name in ("tokens", "loss_mask", "offsets", "source_file", "source_row"):
        x, y = getattr(one.samples, name), getattr(two.samples, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    assert one.malformed == two.malformed and len(one.malformed) == 2
    assert one.inputs == two.inputs and one.format == two.format
    # the first error in file order wins, whatever the worker count
    with pytest.raises(InputError, match=r"z_bad\.jsonl:8: invalid JSON"):
        tokenize_inputs([str(demo)], tokenizer="bytes", config=TextConfig(), workers=2)


def test_resolve_inputs_globs_folders_dedup(tmp_path: Path) -> None:
    for rel in ("x/a.jsonl", "x/sub/b.parquet", "x/c.txt", "y.ndjson"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    got = resolve_inputs([str(tmp_path / "x"), str(tmp_path / "x" / "a.jsonl"), str(tmp_path / "*.ndjson")])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == ["x/a.jsonl", "x/sub/b.parquet", "y.ndjson"]
    assert resolve_inputs([str(tmp_path / "**" / "*.parquet")]) == [(tmp_path / "x/sub/b.parquet").resolve()]
    # a .txt named directly is a plain-text document (format text); in a folder it is left out (above)
    assert resolve_inputs([str(tmp_path / "x" / "c.txt")]) == [(tmp_path / "x" / "c.txt").resolve()]
    (tmp_path / "x" / "c.csv").write_text("a,b\n")
    with pytest.raises(InputError, match=r"unsupported file type '\.csv'"):
        resolve_inputs([str(tmp_path / "x" / "c.csv")])
    with pytest.raises(InputError, match="is not a file, folder, glob or hub id"):
        resolve_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(InputError, match="no inputs given"):
        resolve_inputs([])


@pytest.mark.slow
def test_demo_is_deterministic_real_text_and_long_tailed(tmp_path: Path) -> None:
    a = write_demo_dataset(tmp_path / "a", n=12000, seed=0)
    files = sorted(a.iterdir())
    assert [f.name for f in files] == ["chat.jsonl", "prompt_completion.jsonl"]
    lines = {f.name: f.read_text().splitlines() for f in files}
    assert sum(map(len, lines.values())) == 12000
    assert len(lines["chat.jsonl"]) > 2000 and len(lines["prompt_completion.jsonl"]) > 2000
    sizes = np.array([len(x) for f in lines.values() for x in f])
    assert np.median(sizes) < 1000 and (sizes > 12000).sum() >= 10  # a few samples of several thousand tokens
    first = json.loads(lines["prompt_completion.jsonl"][0])
    assert set(first) == {"prompt", "completion"} and "`" in first["prompt"]
    # same n and seed -> same bytes; records come out sequentially, so a smaller n is a prefix of a larger one
    b1 = write_demo_dataset(tmp_path / "b1", n=1500, seed=0)
    b2 = write_demo_dataset(tmp_path / "b2", n=1500, seed=0)
    for f in files:
        assert (b1 / f.name).read_bytes() == (b2 / f.name).read_bytes()
        small = (b1 / f.name).read_text().splitlines()
        assert small == lines[f.name][: len(small)]
    c = write_demo_dataset(tmp_path / "c", n=1500, seed=1)  # another seed -> other data
    assert (c / "chat.jsonl").read_bytes() != (b1 / "chat.jsonl").read_bytes()


def test_demo_inputs_cache(tmp_path: Path) -> None:
    files = demo_inputs(tmp_path, n=50, seed=0)
    mtimes = [Path(f).stat().st_mtime_ns for f in files]
    assert demo_inputs(tmp_path, n=50, seed=0) == files
    assert [Path(f).stat().st_mtime_ns for f in files] == mtimes  # not regenerated
    r = tokenize_inputs(files, tokenizer="bytes", config=TextConfig(), workers=1)
    assert len(r.samples) == 50 and r.format == "chat,prompt_completion"


def test_hf_folder_tokenizer_in_worker_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_text_formats import CHATML, _hf_folder

    monkeypatch.setattr(inputs_mod, "JSONL_CHUNK_BYTES", 64)  # several chunks, so the pool really runs
    monkeypatch.setattr("longpack.text.pipeline.INLINE_BYTES", 0)

    folder = _hf_folder(tmp_path / "model", CHATML)
    (folder / "tokenizer.json").rename(folder / "my_tok.json")  # a tokenizer file not named tokenizer.json
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    p = write_jsonl(tmp_path / "c.jsonl", [chat] * 3)
    spec = str(folder / "my_tok.json")
    one = tokenize_inputs([str(p)], tokenizer=spec, config=TextConfig(), workers=1)
    two = tokenize_inputs([str(p)], tokenizer=spec, config=TextConfig(), workers=2)
    assert one.samples.tokens.tolist() == two.samples.tokens.tolist() == [8, 1, 3, 9, 8, 2, 4, 9] * 3
    assert one.samples.loss_mask.tolist() == [0, 0, 0, 0, 0, 0, 1, 1] * 3
    assert one.tokenizer["path"] == str((folder / "my_tok.json").resolve()) and one.tokenizer["eos_id"] == 9


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"input_ids": [1, -2]}', r"input_ids holds -2, outside the tokenizer's vocabulary"),
        ('{"input_ids": [1.5, 2]}', r"key 'input_ids' must hold integers, found 1\.5"),
        ('{"input_ids": [1, null]}', r"key .input_ids. must hold integers, found None"),
        ('{"input_ids": [1, 2], "loss_mask": [1, 2]}', r"loss_mask must hold 0/1, found 2"),
        ('{"input_ids": [1, 2], "loss_mask": [1]}', r"loss_mask has 1 entries but input_ids has 2"),
        ('{"input_ids": [[1], [2]]}', r"key .input_ids. must hold integers, found \[1\]"),
    ],
)
def test_pretokenized_bad_values_are_found_at_their_line(tmp_path: Path, bad_line: str, message: str) -> None:
    p = write_jsonl(tmp_path / "p.jsonl", [{"input_ids": [1, 2, 3]}] * 4, raw={2: bad_line})
    with pytest.raises(InputError, match=rf"p\.jsonl:3: {message}"):
        run([p], format="pretokenized")


def test_undetectable_file_is_a_clear_error(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "junk.jsonl", [], raw={0: "not json", 1: "[1, 2]"})
    with pytest.raises(
        InputError, match=r"junk\.jsonl: none of the first 2 non-blank lines is a JSON object"
    ):
        run([p])
    with pytest.raises(InputError, match=r"junk\.jsonl:1: invalid JSON"):
        run([p], format="chat")
