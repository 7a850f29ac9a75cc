"""Gemma3-VL on the family registry: visual token counts equal transformers' ``Gemma3Processor`` (built
offline: a byte-level tokenizer with Gemma 3's special tokens and chat template, ``Gemma3ImageProcessor``);
lengths from headers equal prepared lengths; packed batches equal Megatron-Bridge's
``gemma3_vl_collate_fn(enable_in_batch_packing=True)`` key by key (restated below); every bad-input class is
skipped, counted and named.

``bridge_gemma3_rows`` is written from reading Bridge's source (``models/gemma_vl/data/collate_fn.py``,
``data/conversation_processing.py`` boundary markers for ``<start_of_turn>model``, ``data/token_utils.py``
PAD_TOKENS; commit 067f987): one ``apply_chat_template`` per example; unshifted mask 1 from after each
``<start_of_turn>model\\n`` up to and including the first ``<end_of_turn>`` after it; 0 on skipped tokens;
labels shifted, skipped tokens and shifted-mask-0 positions at -100; ``pixel_values`` in bfloat16; the row
packed as ``build_mcore_thd_sequence_batch_from_rows`` with the tokenizer's pad id (``bridge_packed_batch``
of test_vlm_batch.py). ``scripts/vlm_bridge_harness.py`` runs Bridge's own function for the same check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_vlm_batch import assert_same_batch, bridge_packed_batch

from longpack.runtime.in_batch import VisualInBatchCollator, build_visual_thd_batch
from longpack.vlm import SampleRejected, VLMError
from longpack.vlm.families import Gemma3Family, vlm_family
from vlm_helpers import gemma3_processor, make_image, random_samples, video_bytes

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

SIZES = [(1, 1), (33, 20), (200, 199), (256, 255), (300, 250), (640, 480), (480, 640), (1200, 300), (300, 1200),
         (513, 256), (512, 256), (1000, 100), (100, 1000), (2000, 390), (767, 256), (4000, 40)]  # fmt: skip
CHAT = [{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "A cat."}]


@pytest.mark.parametrize("pan_and_scan", [False, True])
def test_counts_equal_the_processor(pan_and_scan: bool) -> None:
    processor = gemma3_processor()
    family = Gemma3Family(do_pan_and_scan=pan_and_scan)
    soft = processor.tokenizer.image_token_id
    for w, h in SIZES:
        out = processor(
            text=[processor.boi_token], images=[[make_image(w, h)]], return_tensors="np",
            images_kwargs=family.processor_kwargs(),
        )  # fmt: skip
        assert family.visual_tokens(w, h) == int((out["input_ids"] == soft).sum()), (w, h)
        assert out["pixel_values"].shape[0] == 1 + family.crops(w, h)


def test_family_follows_the_processor_call_defaults() -> None:
    # transformers 5: Gemma3Processor's call defaults win over the image processor's do_pan_and_scan, so a
    # call that does not ask for pan and scan (Bridge's) makes 256 tokens an image.
    processor = gemma3_processor(do_pan_and_scan=True)
    assert not Gemma3Family.from_processor(processor).do_pan_and_scan
    assert Gemma3Family.from_processor(processor, do_pan_and_scan=True).visual_tokens(1200, 300) == 1280


@pytest.mark.parametrize("pan_and_scan", [False, True])
def test_length_from_headers_equals_the_prepared_length(pan_and_scan: bool) -> None:
    prep = Gemma3Family(do_pan_and_scan=pan_and_scan).preparer(
        processor=gemma3_processor(), max_images=None, max_visual_tokens=None
    )
    samples = random_samples(6, seed=5, max_images=2, max_side=900)
    samples.append({"__key__": "sys", "messages": [{"role": "system", "content": "Be brief."}, *CHAT],
                    "images": [make_image(700, 260)]})  # fmt: skip
    for sample in samples:
        seq = prep.prepare(sample)
        sizes = [im.size for im in sample["images"]]
        assert (
            prep.length(sample).tokens == prep.length(sample, image_sizes=sizes).tokens == seq.sequence_length
        )
        assert seq.visual_tokens == sum(prep.family.visual_tokens(w, h) for w, h in sizes)
        assert seq.mrope_position_ids is None
        assert torch.equal(seq.row["position_ids"], torch.arange(seq.sequence_length))


def bridge_gemma3_rows(examples: list[dict], processor) -> list:
    tok = processor.tokenizer
    pad_texts = {"<image_soft_token>", "<start_of_image>", "<end_of_image>", "<pad>", "<image>"}
    skipped = torch.tensor([i for i, t in tok.added_tokens_decoder.items() if str(t) in pad_texts])
    start = tok.encode("<start_of_turn>model\n", add_special_tokens=False)
    end = tok.encode("<end_of_turn>", add_special_tokens=False)
    out = []
    for example in examples:
        batch = processor.apply_chat_template(
            [example["conversation"]], tokenize=True, padding=False, truncation=True, return_tensors="pt",
            return_dict=True,
        )  # fmt: skip
        ids = batch["input_ids"][0]
        seq = ids.tolist()
        mask = torch.zeros(len(seq))
        i = 0
        while i < len(seq):
            if seq[i : i + len(start)] == start:
                j = i + len(start)
                while j < len(seq) and seq[j : j + len(end)] != end and seq[j : j + len(start)] != start:
                    j += 1
                if seq[j : j + len(end)] == end:
                    mask[i + len(start) : j + len(end)] = 1
                i = j
            else:
                i += 1
        mask[torch.isin(ids, skipped)] = 0
        labels = torch.cat([ids[1:], ids.new_full((1,), -100)])
        labels = labels.masked_fill(torch.isin(labels, skipped), -100)
        shifted = torch.cat([mask[1:], mask.new_zeros(1)])
        row = {"input_ids": ids, "attention_mask": batch["attention_mask"][0], "position_ids": torch.arange(len(seq)),
               "labels": labels.masked_fill(shifted == 0, -100), "loss_mask": shifted}  # fmt: skip
        visual = {"pixel_values": batch["pixel_values"].to(torch.bfloat16)} if "pixel_values" in batch else {}
        out.append(type("Seq", (), {"row": row, "visual_values": visual})())
    return out


@pytest.mark.parametrize("pad_last", [False, True], ids=["pad-0", "pad-3"])
def test_packed_batch_equals_bridge_in_batch_packing(pad_last: bool) -> None:
    """Gaps get the tokenizer's pad id, as ``gemma3_vl_collate_fn`` passes it (0 only for the released
    tokenizer's order; ``pad-3`` swaps ``<pad>`` and ``<unk>``)."""
    processor = gemma3_processor(pad_last=pad_last)
    pad_id = int(processor.tokenizer.pad_token_id)
    assert pad_id == (3 if pad_last else 0)
    prep = vlm_family("gemma3").preparer(processor=processor, max_images=None, max_visual_tokens=None)
    samples = random_samples(6, seed=9, max_images=2, max_side=300)
    examples = []
    for s in samples:
        messages, images = prep._conversation(s, "k")
        examples.append({"conversation": prep._hf_conversation(messages, images)})
    theirs = bridge_gemma3_rows(examples, processor)
    ours = [prep.prepare(s) for s in samples]
    assert sum(int(s.row["loss_mask"].sum()) for s in ours) > 0
    for multiple, length in ((1, None), (8, 4096)):
        kwargs = {"sequence_length": length, "pad_to_multiple_of": multiple}
        expected = bridge_packed_batch(theirs, pad_token_id=pad_id, **kwargs)
        assert_same_batch(build_visual_thd_batch(ours, **kwargs), expected)
        collated = VisualInBatchCollator(prep.prepare, **kwargs)(samples)
        assert torch.equal(collated["input_ids"], expected["input_ids"])
    if pad_last:  # the gaps hold the pad id
        gapped = build_visual_thd_batch(ours, sequence_length=4096, pad_to_multiple_of=8)
        cu, padded = gapped["cu_seqlens_q"].tolist(), gapped["cu_seqlens_q_padded"].tolist()
        gaps = [
            gapped["input_ids"][0, padded[i] + (cu[i + 1] - cu[i]) : padded[i + 1]] for i in range(len(ours))
        ]
        assert sum(g.numel() for g in gaps) > 0 and all(bool((g == 3).all()) for g in gaps)
    batch = build_visual_thd_batch(ours, sequence_length=None)
    # 1-D positions restart at every sequence; one image's soft tokens stay one run inside its sequence.
    starts = batch["cu_seqlens_q"].tolist()
    for seq, a, b in zip(ours, starts, starts[1:], strict=False):
        assert torch.equal(batch["position_ids"][0, a:b], torch.arange(b - a))
        assert torch.equal(batch["input_ids"][0, a:b], seq.row["input_ids"])


def bad_samples() -> dict[str, tuple[str, dict, dict]]:
    """key -> (reason, sample, limits): one of each bad-input class Gemma3-VL can meet."""
    ok = {"messages": CHAT, "images": [make_image(40, 30)]}
    return {
        "two_for_one": ("placeholder_mismatch", {"messages": CHAT, "images": [make_image(30, 30)] * 2}, {}),
        "none_for_one": ("placeholder_mismatch", {"messages": CHAT}, {}),
        "empty_array": (
            "empty_image",
            {"messages": CHAT, "images": [np.zeros((0, 5, 3), dtype=np.uint8)]},
            {},
        ),
        "empty_bytes": ("empty_image", {"messages": CHAT, "images": [b""]}, {}),
        "robot": ("malformed", {"messages": [{"role": "robot", "content": "x"}]}, {}),
        "garbage": ("undecodable", {"messages": CHAT, "images": [b"GIF89a not really"]}, {}),
        "many": (
            "too_many_images",
            {
                "messages": [{"role": "user", "content": "<image><image>?"}, CHAT[1]],
                "images": [make_image(20, 20)] * 2,
            },
            {"max_images": 1},
        ),
        "visual": ("visual_tokens", ok, {"max_visual_tokens": 100}),
        "long": ("too_long", ok, {"max_length": 200}),
        # Gemma3-VL has no video input: a video sample is refused, its neighbours packed (a mixed dataset
        # loses its video samples, counted, not the run).
        "video": (
            "unsupported_video",
            {"messages": [{"role": "user", "content": "<video>?"}, CHAT[1]], "videos": [[make_image(8, 8)]]},
            {},
        ),
    }


@pytest.mark.parametrize("key", sorted(bad_samples()))
def test_every_bad_input_class_is_named_and_counted(key: str) -> None:
    reason, sample, limits = bad_samples()[key]
    prep = vlm_family("gemma3").preparer(processor=gemma3_processor(), **limits)
    good = [
        {"__key__": f"ok{i}", "messages": CHAT, "images": [make_image(40 + i, 30, seed=i)]} for i in range(2)
    ]
    if limits:  # a limit refuses the good samples too when it is tight: judge the refused one alone
        good = []
    with pytest.raises(SampleRejected, match=rf"^sample {key}: ") as info:
        prep.prepare({**sample, "__key__": key})
    assert info.value.reason == reason and prep.stats.rejected[reason] == 1
    if reason == "unsupported_video":  # the message says what to do
        assert str(info.value).endswith(
            "(use qwen2_vl / qwen2_5_vl / qwen3_vl for video, or drop the video samples)"
        )
    if good:
        batch = VisualInBatchCollator(prep.prepare, sequence_length=4096)(
            [good[0], {**sample, "__key__": key}, good[1]]
        )
        assert batch["sample_keys"] == ["ok0", "ok1"]
        assert [(r["key"], r["reason"]) for r in batch["skipped"]] == [(key, reason)]


def test_settings_that_fail_for_every_sample_are_errors() -> None:
    with pytest.raises(VLMError, match="needs a transformers Gemma3Processor"):
        vlm_family("gemma3").preparer()


def test_online_sim_counts_gemma3_samples_from_a_saved_processor(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from longpack.cli.app import app
    from longpack.jobs.online_sim import OnlineSimConfig

    folder = tmp_path / "gemma3"
    gemma3_processor().save_pretrained(folder)
    rows = []
    for i, (w, h) in enumerate([(640, 480), (30, 900), (200, 200)]):
        make_image(w, h, seed=i).save(tmp_path / f"{i}.png")
        rows.append({"messages": CHAT, "images": [f"{i}.png"]})
    rows.append({"messages": CHAT, "image_sizes": [[1200, 300]]})
    rows.append({"messages": CHAT, "images": ["missing.png"]})  # undecodable: counted, named
    (tmp_path / "v.mp4").write_bytes(
        video_bytes(4, 2, 32, 32)
    )  # Gemma3-VL has no video input: counted, named
    rows.append({"messages": [{"role": "user", "content": "<video>?"}, CHAT[1]], "videos": ["v.mp4"]})
    (tmp_path / "vlm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = OnlineSimConfig(
        pack_size=2048, buffer_sizes="2,4", vlm=tmp_path / "vlm.jsonl", vlm_family="gemma3",
        tokenizer=str(folder), write_lengths=tmp_path / "lengths.txt",
    ).run().report  # fmt: skip
    prep = vlm_family("gemma3").preparer(processor=gemma3_processor())
    sizes = [(640, 480), (30, 900), (200, 200), (1200, 300)]
    expected = [prep.length({"messages": CHAT, "images": [make_image(w, h)]}).tokens for w, h in sizes]
    assert (tmp_path / "lengths.txt").read_text().split() == [str(n) for n in expected]
    assert report["family"] == "gemma3" and report["vision"] == {
        "tokens_per_image": 256,
        "pan_and_scan": False,
    }
    assert report["samples"]["samples"] == 4 and report["samples"]["rejected"]["undecodable"] == 1
    assert report["samples"]["rejected"]["unsupported_video"] == 1
    assert [s["reason"] for s in report["samples"]["skipped"]] == ["undecodable", "unsupported_video"]
    out = CliRunner().invoke(app, ["online-sim", "--pack-size", "2048", "--buffer-sizes", "2", "--vlm",
                                   str(tmp_path / "vlm.jsonl"), "--vlm-family", "nemotron_vl"])  # fmt: skip
    assert out.exit_code == 2 and "NemotronVLPreparer" in out.output and "Traceback" not in out.output


def test_the_preparer_crosses_to_loader_workers() -> None:
    import pickle

    prep = vlm_family("gemma3").preparer(processor=gemma3_processor())
    copy = pickle.loads(pickle.dumps(prep.prepare)).__self__  # what a DataLoader worker receives
    for sample in random_samples(3, seed=2, max_images=2):
        a, b = prep.prepare(sample), copy.prepare(sample)
        assert all(torch.equal(a.row[k], b.row[k]) for k in a.row)
        assert all(torch.equal(a.visual_values[k], b.visual_values[k]) for k in a.visual_values)
