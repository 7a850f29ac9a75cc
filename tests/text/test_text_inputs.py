"""Every input form, and nothing silently lost: compressed files, JSON arrays, datasets folders, hub ids
from the local cache, ``Json`` columns, symlinks and loops, deep JSON, the strict pretokenized fast path,
damaged files, column accounting."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.text import InputError, TextConfig, load_tokenizer, tokenize_inputs
from longpack.text.inputs import find_inputs
from longpack.text.pipeline import _fast_pretokenized, _Job
from longpack.text.rows import sample_from_row

CHAT_ROWS: list[dict[str, Any]] = [
    {
        "messages": [
            {"role": "user", "content": f"question {i} 北京 😀"},
            {"role": "assistant", "content": "answer " * (i % 7 + 1)},
        ],
        "id": i,
    }
    for i in range(60)
]
SHAREGPT_ROWS = [
    {"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a" * (i % 5 + 1)}]}
    for i in range(20)
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def run(inputs: list[Path | str], **cfg: Any) -> Any:
    return tokenize_inputs([str(p) for p in inputs], tokenizer="bytes", config=TextConfig(**cfg), workers=1)


def same_samples(a: Any, b: Any) -> bool:
    sa, sb = a.samples, b.samples
    return (
        np.array_equal(sa.tokens, sb.tokens)
        and np.array_equal(sa.loss_mask, sb.loss_mask)
        and np.array_equal(sa.offsets, sb.offsets)
        and np.array_equal(sa.source_row, sb.source_row)
    )


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def test_gz_and_zst_give_byte_identical_packs(tmp_path: Path) -> None:
    from longpack.jobs import PackConfig

    plain = write_jsonl(tmp_path / "d" / "chat.jsonl", CHAT_ROWS)
    (tmp_path / "g").mkdir()
    (tmp_path / "z").mkdir()
    (tmp_path / "g" / "chat.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    (tmp_path / "z" / "chat.jsonl.zst").write_bytes(_zstd(plain.read_bytes()))
    outs = {}
    for name, src in (("plain", plain), ("gz", tmp_path / "g"), ("zst", tmp_path / "z" / "chat.jsonl.zst")):
        r = PackConfig(
            inputs=[str(src)], out=tmp_path / f"out-{name}", tokenizer="bytes", seq_length=128
        ).run()
        assert r.counts["rows_read"] == 60
        outs[name] = {
            p.name: p.read_bytes()
            for p in sorted((tmp_path / f"out-{name}").iterdir())
            if p.suffix == ".parquet"
        }
    assert outs["plain"] and outs["plain"] == outs["gz"] == outs["zst"]
    manifest = json.loads((tmp_path / "out-gz" / "manifest.json").read_text())
    assert manifest["inputs"][0]["compression"] == "gzip"
    for name in outs:  # every row accounted for, per input
        for info in json.loads((tmp_path / f"out-{name}" / "manifest.json").read_text())["inputs"]:
            assert info["rows"] == info["malformed"] + info["packed"] + info["dropped"]
    assert (
        manifest["inputs"][0]["sha256"]
        != json.loads((tmp_path / "out-plain" / "manifest.json").read_text())["inputs"][0]["sha256"]
    )


def test_corrupt_gzip_member_names_the_line_and_the_fix(tmp_path: Path) -> None:
    data = "".join(json.dumps(r) + "\n" for r in CHAT_ROWS * 400).encode()
    good = gzip.compress(data[: len(data) // 2]) + gzip.compress(data[len(data) // 2 :])
    bad = bytearray(good)
    bad[len(good) * 3 // 4] ^= 0xFF  # inside the second member
    p = tmp_path / "broken.jsonl.gz"
    p.write_bytes(bytes(bad))
    with pytest.raises(
        InputError,
        match=r"broken\.jsonl\.gz:\d+: corrupt or cut-short gzip data after line \d+ \(the last complete line.*gzip -t",
    ):
        run([p], skip_malformed=True)
    p.write_bytes(good[:-20])  # cut short
    with pytest.raises(InputError, match=r"corrupt or cut-short gzip data .*cut short"):
        run([p])


def test_json_array_file_equals_jsonl(tmp_path: Path) -> None:
    lines = write_jsonl(tmp_path / "a.jsonl", SHAREGPT_ROWS)
    arr = tmp_path / "sharegpt.json"
    arr.write_text(json.dumps(SHAREGPT_ROWS, indent=2, ensure_ascii=False))
    a, b = run([lines]), run([arr])
    assert same_samples(a, b) and b.inputs[0]["kind"] == "json_array" and b.format == "sharegpt"
    arr.write_text('[{"conversations": []}, {"conversations": [ ')
    with pytest.raises(InputError, match=r"sharegpt\.json:1: element 2 of the JSON array is not valid JSON"):
        run([arr], format="sharegpt", skip_malformed=True)


def test_datasets_folder_and_dataset_dict(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    plain = run([write_jsonl(tmp_path / "c.jsonl", CHAT_ROWS)])
    datasets.Dataset.from_list(CHAT_ROWS).save_to_disk(str(tmp_path / "saved"))
    got = run([tmp_path / "saved"])
    assert np.array_equal(got.samples.tokens, plain.samples.tokens)
    assert got.samples.source_row.tolist() == list(range(60))  # 0-based rows, as for Parquet
    assert got.inputs[0]["kind"] == "hf" and got.inputs[0]["columns"]["ignored"] == {"id": 60}
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(CHAT_ROWS[:10]),
            "test": datasets.Dataset.from_list(CHAT_ROWS[10:12]),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    r = run([tmp_path / "dd"])
    assert r.rows_read == 10
    assert any("split 'test'" in why for _, why in r.skipped_inputs)
    assert run([tmp_path / "dd" / "test"]).rows_read == 2


def test_hub_id_from_the_local_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("datasets")
    repo = tmp_path / "hub" / "datasets--acme--chat"
    snap = repo / "snapshots" / "0123abcd"
    write_jsonl(snap / "data" / "train-00000-of-00001.jsonl", CHAT_ROWS[:8])
    write_jsonl(snap / "data" / "test-00000-of-00001.jsonl", CHAT_ROWS[:3])
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run(["hf:acme/chat"]).rows_read == 8
    assert run(["acme/chat:test"]).rows_read == 3
    with pytest.raises(InputError, match=r"has no split 'dev'; it has \['test', 'train'\]"):
        run(["hf:acme/chat:dev"])
    with pytest.raises(
        InputError, match=r"'acme/other' is not in the local HF cache .*nothing is downloaded"
    ):
        run(["hf:acme/other"])


def test_json_columns_of_datasets_parquet_exports(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    if not hasattr(datasets, "Json"):
        pytest.skip("datasets < 5 has no Json feature")
    rows = [
        {"messages": r["messages"], "tools": [{"type": "function", "function": {"name": "f"}}]}
        for r in CHAT_ROWS
    ]
    feats = datasets.Features({"messages": datasets.Json(), "tools": datasets.Json()})
    datasets.Dataset.from_list(rows, features=feats).to_parquet(str(tmp_path / "x.parquet"))
    got = run([tmp_path / "x.parquet"])
    expected = run([write_jsonl(tmp_path / "x.jsonl", rows)])
    assert np.array_equal(got.samples.tokens, expected.samples.tokens) and len(got.malformed) == 0


def test_damaged_parquet_names_the_row_group(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "x.parquet"
    table = pa.table({"prompt": [f"p{i}" * 50 for i in range(4000)], "completion": ["c" * 40] * 4000})
    pq.write_table(table, p, row_group_size=1000, compression="snappy")
    meta = pq.ParquetFile(p).metadata
    col = meta.row_group(2).column(0)
    data = bytearray(p.read_bytes())
    start = col.dictionary_page_offset or col.data_page_offset
    size = col.total_compressed_size
    data[start : start + size] = bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8))
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"x\.parquet: row group 2 \(rows 2000-2999\) cannot be read"):
        run([p])


def test_symlinked_folders_are_followed_and_loops_end(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write_jsonl(real / "r.jsonl", CHAT_ROWS[:5])
    data = tmp_path / "data"
    write_jsonl(data / "own.jsonl", CHAT_ROWS[:2])
    (data / "linked").symlink_to(real, target_is_directory=True)
    (data / "loop").symlink_to(data, target_is_directory=True)  # data/loop/loop/... forever
    (data / "sub").mkdir()
    (data / "sub" / "back").symlink_to(tmp_path, target_is_directory=True)
    (data / "dangling").symlink_to(tmp_path / "nowhere")
    (data / "notes.txt").write_text("x")
    found = find_inputs([str(data)])
    assert sorted(f.path.name for f in found.files) == ["own.jsonl", "r.jsonl"]
    reasons = found.skipped_summary()
    assert reasons.get("broken symlink") == 1 and reasons.get("not a data file (.txt)") == 1
    assert any("already searched" in r for r in reasons)
    r = run([data])
    assert r.rows_read == 7 and any("not read:" in w for w in r.warnings)
    globbed = find_inputs([str(data / "**" / "*.jsonl")])  # through the loops, and it ends
    assert sorted(f.path.name for f in globbed.files) == ["own.jsonl", "r.jsonl"]


def test_deep_json_is_a_malformed_row(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    deep = '{"messages": ' + "[" * 1000 + "]" * 1000 + "}"
    p.write_text(json.dumps(CHAT_ROWS[0]) + "\n" + deep + "\n" + '{"messages": "' + "[" * 300 + '"}\n')
    with pytest.raises(InputError, match=r"d\.jsonl:2: JSON nested deeper than 100 levels"):
        run([p], format="chat")
    r = run([p], format="chat", skip_malformed=True)
    assert r.rows_read == 3 and [m[0].rsplit(":", 1)[1] for m in r.malformed] == ["2", "3"]


def test_ignored_columns_are_reported_with_warnings(tmp_path: Path) -> None:
    rows = [{"prompt": "p", "completion": "c", "tools": [], "images": ["a.png"], "id": 1}] * 3
    r = run([write_jsonl(tmp_path / "pc.jsonl", rows)])
    cols = r.inputs[0]["columns"]
    assert cols == {"used": ["completion", "prompt"], "ignored": {"id": 3, "images": 3, "tools": 3}}
    assert sorted(re.findall(r"column '(\w+)'", " ".join(r.warnings))) == ["images", "tools"]


def test_chat_template_jinja_beside_the_config_wins(tmp_path: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "yo": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": "{{ 1/0 }}"})
    )
    (tmp_path / "chat_template.json").write_text(
        json.dumps({"chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"})
    )
    msgs = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}]}
    cfg = TextConfig(chat_loss="full")
    assert sample_from_row(msgs, "chat", cfg, load_tokenizer(str(tmp_path)))[0] == [1, 2]
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }} {{ m['content'] }} {% endfor %}"
    )
    from longpack.text.tokenizers import _CACHE

    _CACHE.clear()
    tok2 = load_tokenizer(str(tmp_path))
    assert sample_from_row(msgs, "chat", cfg, tok2)[0] == [1, 1, 2, 2]
    assert "chat_template.jinja" in tok2.identity()["files"]


# -- the pretokenized fast path accepts exactly what json.loads accepts ------------------------------------

_NUMBERS = st.sampled_from(
    [
        "1",
        "0",
        "-0",
        "01",
        "+2",
        "1.0",
        "1e2",
        "-5",
        "99999999999999999999",
        "007",
        "3 ",
        " 4",
        "\t5",
        "\x0b6",
        "7\x0c",
        "",
        "a",
        "0x1",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(_NUMBERS, min_size=0, max_size=4), min_size=1, max_size=4),
    st.booleans(),
    st.sampled_from(["", " ", "\t", "\r", "\x0b", "\x0c", "\xa0"]),
)
def test_fast_path_accepts_exactly_what_json_loads_accepts(
    groups: list[list[str]], with_mask: bool, ws: str
) -> None:
    lines = []
    for g in groups:
        ids = ",".join(g)
        line = f'{ws}{{"input_ids":{ws}[{ids}]'
        if with_mask:
            line += f', "loss_mask": [{",".join("1" for _ in g)}]'
        lines.append(line + "}" + ws)
    payload = "\n".join(lines).encode()
    tok = load_tokenizer("bytes")
    job = _Job("jsonl", "x.jsonl", 1, payload, "pretokenized", TextConfig(skip_malformed=True), "bytes")
    fast = _fast_pretokenized(job, tok)
    if fast is None:
        return  # the per-row json path reads (or rejects with file:line) every line
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    for line in lines:
        row = json.loads(line)  # the fast path took it: json.loads must read it to the same values
        ids, mask = sample_from_row(row, "pretokenized", TextConfig(), tok)
        expected_ids += ids
        expected_mask += list(mask)
    assert fast.tokens.tolist() == expected_ids and fast.loss_mask.tolist() == expected_mask


def test_fast_path_rejects_what_json_loads_rejects_with_the_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [01, +2, 3]}\n')
    with pytest.raises(InputError, match=r"t\.jsonl:2: invalid JSON"):
        run([p])
    r = run([p], skip_malformed=True)
    assert r.samples.tokens.tolist() == [1, 2, 3] and len(r.malformed) == 1


def test_per_input_accounting_with_malformed_truncated_and_dropped(tmp_path: Path) -> None:
    from longpack.jobs import PackConfig

    rows = [{"prompt": "q", "completion": "a" * n} for n in (3, 10, 80, 200)]
    arr = tmp_path / "d" / "rows.json"
    arr.parent.mkdir()
    arr.write_text(json.dumps([*rows, {"prompt": 1}]))
    (tmp_path / "d" / "more.jsonl.gz").write_bytes(
        gzip.compress(b'{"prompt": "x", "completion": "yy"}\nnot json\n')
    )
    for overlength in ("drop", "truncate"):
        r = PackConfig(
            inputs=[str(tmp_path / "d")],
            out=tmp_path / f"o-{overlength}",
            tokenizer="bytes",
            seq_length=64,
            overlength=overlength,
            text=TextConfig(skip_malformed=True),
        ).run()
        by_name = {Path(i["path"]).name: i for i in r.manifest.inputs}
        a, b = by_name["rows.json"], by_name["more.jsonl.gz"]
        assert (a["rows"], a["malformed"], b["rows"], b["malformed"]) == (5, 1, 2, 1)
        for info in (a, b):
            assert info["rows"] == info["malformed"] + info["packed"] + info["dropped"]
        assert (a["dropped"], a["truncated"]) == ((2, 0) if overlength == "drop" else (0, 2))


def test_ignored_turn_keys_are_counted_and_meaningful_ones_warned(tmp_path: Path) -> None:
    rows = [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a", "weight": 0}]},
        {"conversations": [{"from": "human", "value": "q", "lang": "en"}, {"from": "gpt", "value": "a"}]},
    ]
    r = run([write_jsonl(tmp_path / "s.jsonl", rows)])
    assert r.inputs[0]["columns"]["ignored"] == {"conversations[].lang": 1, "conversations[].weight": 1}
    (warning,) = r.warnings
    assert "turn key 'conversations[].weight' (a per-turn loss weight" in warning and "1 of 2 rows" in warning
