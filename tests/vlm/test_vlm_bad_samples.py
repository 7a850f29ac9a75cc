"""Every bad-input class is refused with its reason and the sample's key, counted, and never aborts its
neighbours: in ``prepare``, in the in-batch collator (``on_bad_sample``), in ``online-sim --vlm`` metadata.
(The Energon encoder's side is in tests/online/test_online_vlm_energon.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from longpack.runtime.in_batch import InBatchPackingError, VisualInBatchCollator
from longpack.vlm import SampleRejected
from longpack.vlm.metadata import read_vlm_metadata
from vlm_helpers import make_image, preparer

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

CHAT = [{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "A cat."}]


def bad_samples() -> dict[str, tuple[str, dict]]:
    """key -> (reason, sample): one of each bad-input class."""
    return {
        "wide": ("aspect_ratio", {"messages": CHAT, "images": [make_image(402, 2)]}),
        "tall": ("aspect_ratio", {"messages": CHAT, "images": [make_image(1, 250)]}),
        "two_for_one": ("placeholder_mismatch", {"messages": CHAT, "images": [make_image(30, 30)] * 2}),
        "none_for_one": ("placeholder_mismatch", {"messages": CHAT}),
        "empty_array": ("empty_image", {"messages": CHAT, "images": [np.zeros((0, 5, 3), dtype=np.uint8)]}),
        "empty_bytes": ("empty_image", {"messages": CHAT, "images": [b""]}),
        "robot": ("malformed", {"messages": [{"role": "robot", "content": "x"}]}),
        "garbage": ("undecodable", {"messages": CHAT, "images": [b"GIF89a not really"]}),
    }


@pytest.mark.parametrize("key", sorted(bad_samples()))
def test_prepare_names_the_key_and_the_reason(key: str) -> None:
    reason, sample = bad_samples()[key]
    prep = preparer()
    before = prep.stats.rejected[reason]
    with pytest.raises(SampleRejected, match=rf"^sample {key}: ") as info:
        prep.prepare({**sample, "__key__": key})
    assert info.value.reason == reason and info.value.key == key
    assert prep.stats.rejected[reason] == before + 1


def test_in_batch_skips_bad_samples_and_packs_their_neighbours() -> None:
    good = [
        {"__key__": f"ok{i}", "messages": CHAT, "images": [make_image(40 + 10 * i, 30, seed=i)]}
        for i in range(2)
    ]
    bad = [{**sample, "__key__": key} for key, (_, sample) in sorted(bad_samples().items())]
    examples = [good[0], *bad, good[1]]
    prep = preparer()
    batch = VisualInBatchCollator(prep.prepare, sequence_length=4096)(examples)
    assert batch["sample_keys"] == ["ok0", "ok1"]
    assert [(r["key"], r["reason"]) for r in batch["skipped"]] == [
        (key, reason) for key, (reason, _) in sorted(bad_samples().items())
    ]
    assert all(r["message"].startswith(f"sample {r['key']}: ") for r in batch["skipped"])
    # The packed neighbours are exactly the batch of the good samples alone.
    alone = VisualInBatchCollator(prep.prepare, sequence_length=4096)(good)
    assert batch["input_ids"].tolist() == alone["input_ids"].tolist()
    assert batch["visual_inputs"]["pixel_values"].equal(alone["visual_inputs"]["pixel_values"])
    with pytest.raises(
        SampleRejected, match=r"^sample empty_array: image size 5x0: both sides must be at least 1 pixel"
    ):
        VisualInBatchCollator(prep.prepare, sequence_length=4096, on_bad_sample="raise")(examples)
    with pytest.raises(InBatchPackingError, match="on_bad_sample='drop' is not one of"):
        VisualInBatchCollator(prep.prepare, sequence_length=4096, on_bad_sample="drop")
    with pytest.raises(
        InBatchPackingError,
        match=r"was refused: sample two_for_one: .*; sample wide: image size 402x2: aspect ratio 201.0.*; sample empty_array",
    ):
        VisualInBatchCollator(prep.prepare, sequence_length=4096)(bad[-2:] + bad[:1])


def test_metadata_counts_every_class_with_its_key(tmp_path) -> None:
    rows = [
        {"messages": CHAT, "image_sizes": [[640, 480]]},
        {"messages": CHAT, "image_sizes": [[201 * 3, 3]]},
        {"messages": CHAT, "image_sizes": [[0, 10]]},
        {"messages": CHAT, "image_sizes": [[10, 10], [10, 10]]},
        {"messages": [{"role": "robot", "content": "x"}], "image_sizes": []},
    ]
    path = tmp_path / "meta.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = read_vlm_metadata(path, preparer())
    assert table.keys == ["meta.jsonl:1"]
    assert table.skipped == [
        {"key": "meta.jsonl:2", "reason": "aspect_ratio"},
        {"key": "meta.jsonl:3", "reason": "empty_image"},
        {"key": "meta.jsonl:4", "reason": "placeholder_mismatch"},
        {"key": "meta.jsonl:5", "reason": "malformed"},
    ]
    assert table.examples[0].startswith("sample meta.jsonl:2: image size 603x3: aspect ratio 201.0")
    summary = table.summary()
    assert summary["skipped"] == table.skipped and summary["rejected"]["aspect_ratio"] == 1
