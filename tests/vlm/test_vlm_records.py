"""Records as users write them: content parts that name their image, an ``images`` list, both in one record;
relative paths resolve against the record's file wherever they are written; refusals name the real cause
and the sample key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from longpack.vlm import SampleRejected
from longpack.vlm.metadata import read_vlm_metadata, vlm_samples
from vlm_helpers import make_image, preparer

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ANSWER = {"role": "assistant", "content": "A cat."}


def part(path: str | None = None) -> dict:
    return {"type": "image", "image": path} if path is not None else {"type": "image"}


def user(*parts: dict) -> dict:
    return {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}


def write(tmp_path: Path, rows: list[dict]) -> Path:
    folder = tmp_path / "data"
    (folder / "img").mkdir(parents=True)
    make_image(64, 48, seed=1).save(folder / "img/a.png")
    make_image(90, 30, seed=2).save(folder / "img/b.png")
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def records() -> list[dict]:
    placeholder = {"messages": [{"role": "user", "content": "<image><image>What is it?"}, ANSWER],
                   "images": ["img/a.png", "img/b.png"]}  # fmt: skip
    return [
        placeholder,
        # content parts naming their files, no list
        {"messages": [user(part("img/a.png"), part("img/b.png")), ANSWER]},
        # content parts naming their files and a list repeating them (a dataset's media column)
        {
            "messages": [user(part("img/a.png"), part("img/b.png")), ANSWER],
            "images": ["img/a.png", "img/b.png"],
        },
        # one part names its file, one takes the list's
        {"messages": [user(part("img/a.png"), part()), ANSWER], "images": ["img/b.png"]},
        # ShareGPT turns with parts
        {
            "conversations": [
                {"from": "human", "value": [part("img/a.png"), part("img/b.png"), "What is it?"]},
                {"from": "gpt", "value": "A cat."},
            ]
        },
    ]


def test_every_form_resolves_against_the_records_file_and_counts_alike(tmp_path, monkeypatch) -> None:
    path = write(tmp_path, records())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative paths must not resolve against the current folder
    prep = preparer(max_visual_tokens=None)
    table = read_vlm_metadata(path, prep)
    assert table.keys == [f"train.jsonl:{i}" for i in range(1, 6)]
    assert sum(table.rejected.values()) == 0
    assert len(set(table.tokens.tolist())) == 1 and table.images.tolist() == [2] * 5
    prepared = [prep.prepare(sample, key=key) for key, sample in vlm_samples(path)]
    first = prepared[0].row["input_ids"].tolist()
    assert all(p.row["input_ids"].tolist() == first for p in prepared)
    grids = [p.visual_values["image_grid_thw"].tolist() for p in prepared]
    assert grids == [grids[0]] * 5 and grids[0][0] != grids[0][1]  # a.png then b.png, in every form


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"messages": [user(part("img/a.png")), ANSWER], "images": ["img/b.png"]},
         r"the sample's 'images' list has 1 images but the conversation takes 0 of them: 1 image parts name "
         r"their own source and the list is not those same images"),
        ({"messages": [user(part("img/a.png"), part()), ANSWER]},
         r"more image placeholders / image parts without a source than the 0 images of the sample's 'images' "
         r"list \(1 more image parts name their own source\)"),
        ({"messages": [user(part("img/missing.png")), ANSWER]}, r"missing\.png cannot be read"),
    ],
    ids=["list-differs", "part-without-source", "missing-file"],
)  # fmt: skip
def test_refusals_name_the_real_cause_and_the_key(tmp_path, row: dict, message: str) -> None:
    path = write(tmp_path, [records()[0], row])
    prep = preparer(max_visual_tokens=None)
    table = read_vlm_metadata(path, prep)
    assert table.keys == ["train.jsonl:1"]
    assert len(table.skipped) == 1 and table.skipped[0]["key"] == "train.jsonl:2"
    assert table.examples[0].startswith("sample train.jsonl:2: ")
    assert re.search(message, table.examples[0]), table.examples[0]
    _, (key, sample) = vlm_samples(path)
    with pytest.raises(SampleRejected, match=message) as info:
        prep.prepare(sample, key=key)
    assert info.value.key == "train.jsonl:2"
    assert str(tmp_path / "data/img") in str(info.value) or "missing" not in message
