"""``format="text"``: one document per row (a ``text`` column of JSON Lines or Parquet), loss on every token,
EOS appended per document (``append_eod``), accounted per document."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longpack.errors import InputError
from longpack.text import TextConfig
from longpack.text.pipeline import tokenize_inputs
from longpack.text.tokenizers import load_tokenizer

DOCS = ["The first document.", "A second, longer document " * 5, "ünïcode ☃ third", "4"]


def test_text_rows_tokenize_as_documents(tmp_path: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d, "meta": i}) + "\n" for i, d in enumerate(DOCS)))
    tok = load_tokenizer("qwen3")
    r = tokenize_inputs([str(src)], tokenizer="qwen3", config=TextConfig(), workers=1)
    assert r.format == "text"  # detected from the column
    assert len(r.samples) == len(DOCS)
    for i, doc in enumerate(DOCS):
        ids, mask = r.samples.sample(i)
        assert ids.tolist() == [*tok.encode(doc), tok.eos_id]
        assert mask.tolist() == [1] * len(ids)
    assert r.inputs[0]["columns"]["used"] == ["text"]
    with pytest.raises(InputError, match=r"docs.jsonl:4: the document has 1 token\(s\)"):
        tokenize_inputs([str(src)], tokenizer="qwen3", config=TextConfig(append_eod=False), workers=1)
    plain = tokenize_inputs(
        [str(src)], tokenizer="qwen3", config=TextConfig(append_eod=False, skip_malformed=True), workers=1
    )
    assert plain.samples.sample(0)[0].tolist() == tok.encode(DOCS[0]) and len(plain.malformed) == 1


def test_text_key_in_parquet_and_malformed_rows(tmp_path: Path) -> None:
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": [*DOCS, None]}), src)
    cfg = TextConfig(format="text", text_key="body")
    with pytest.raises(InputError, match=r"docs.parquet:4: key 'body' must be a string"):
        tokenize_inputs([str(src)], tokenizer="bytes", config=cfg, workers=1)
    r = tokenize_inputs(
        [str(src)],
        tokenizer="bytes",
        config=TextConfig(format="text", text_key="body", skip_malformed=True),
        workers=1,
    )
    assert len(r.samples) == len(DOCS) and r.malformed[0][0].endswith("docs.parquet:4")
    assert r.samples.sample(3)[0].tolist() == [ord("4"), 258]


def test_plain_text_files_are_one_document_each(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("First document.\nTwo lines.\n")
    (tmp_path / "b.txt").write_text("Second ☃")
    (tmp_path / "c.txt").write_bytes(b"\xff\xfe not utf-8")
    (tmp_path / "README.md").write_text("not read")
    tok = load_tokenizer("bytes")
    r = tokenize_inputs(
        [str(tmp_path / "*.txt")], tokenizer="bytes", config=TextConfig(skip_malformed=True), workers=1
    )
    assert r.format == "text" and [i["kind"] for i in r.inputs] == ["txt"] * 3
    assert [r.samples.sample(k)[0].tolist() for k in range(2)] == [
        [*tok.encode("First document.\nTwo lines.\n"), tok.eos_id],
        [*tok.encode("Second ☃"), tok.eos_id],
    ]
    assert r.malformed[0][0].endswith("c.txt:1") and "not UTF-8" in r.malformed[0][1]
    # a folder scan leaves .txt files out (a README beside SFT data is no document); SFT formats refuse them
    with pytest.raises(InputError, match="holds no"):
        tokenize_inputs([str(tmp_path)], tokenizer="bytes", config=TextConfig(), workers=1)
    with pytest.raises(InputError, match="a plain-text file is one document"):
        tokenize_inputs(
            [str(tmp_path / "a.txt")], tokenizer="bytes", config=TextConfig(format="chat"), workers=1
        )
