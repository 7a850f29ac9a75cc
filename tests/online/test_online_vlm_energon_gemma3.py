"""Gemma3-VL through the Energon packing encoders, on the generated WebDataset of test_online_vlm_energon.py
(``energon prepare``d ``CrudeWebdataset``, good and bad samples) with transformers' ``Gemma3Processor`` built
offline (vlm_helpers.gemma3_processor): every sample packed or reported once, each batch the THD row of its
members prepared alone (Bridge's Gemma3 in-batch keys: 1-D positions, ``pixel_values`` per image, no grids),
exact resume at save points with 0 and 2 loader workers; Nemotron-VL refused when the encoder is built; video
samples (which Gemma3-VL and longpack's Qwen3-VL do not take) skipped and named in a mixed dataset.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

energon = pytest.importorskip("megatron.energon")
pytest.importorskip("transformers")

import torch  # noqa: E402
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset  # noqa: E402
from test_online_vlm_energon import (  # noqa: E402
    BROKEN,
    EMPTY,
    LOADER_OPTIONS,
    MALFORMED,
    MISMATCH,
    N_SAMPLES,
    accounting,
    sample_members,
    signature,
    write_dataset,
)

from longpack.errors import OnlineError  # noqa: E402
from longpack.online.energon import (  # noqa: E402
    LoaderStateMismatch,
    read_loader_state,
    replaying_workers,
    restore_loader_state,
    save_loader_state,
    write_loader_state,
)
from longpack.online.vlm import EagerQwenVLPackingEncoder, QwenVLPackingEncoder  # noqa: E402
from longpack.runtime.in_batch import build_visual_thd_batch  # noqa: E402
from longpack.vlm.families import vlm_family  # noqa: E402
from vlm_helpers import gemma3_processor, png_bytes, video_bytes  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

# Byte-level test tokenizer (one token a character) + 256 soft tokens an image: samples of 100-700 tokens.
SEQ_LENGTH = 1024
MULTIPLE = 8
# Gemma3-VL resizes every image to a square: the 402x2 image (refused by Qwen-VL's aspect-ratio limit) and the
# 900x900 one are packed; the other bad inputs are refused with the reasons Qwen-VL's are.
GEMMA3_BAD = {
    **dict.fromkeys(BROKEN, "undecodable"),
    **dict.fromkeys(MISMATCH, "placeholder_mismatch"),
    **dict.fromkeys(EMPTY, "empty_image"),
    **dict.fromkeys(MALFORMED, "malformed"),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("energon_gemma3_ds"), sample_members, N_SAMPLES)


def gemma3_preparer():
    return vlm_family("gemma3").preparer(processor=gemma3_processor())


def make_loader(root: Path, *, workers: int, eager: bool = False, prep=None, **kwargs):
    encoder = (EagerQwenVLPackingEncoder if eager else QwenVLPackingEncoder)(
        prep or gemma3_preparer(), seq_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE, **kwargs
    )
    ds = get_train_dataset(
        root,
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=1,
        packing_buffer_size=8,
        shuffle_buffer_size=4,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        repeat=False,
    )
    return get_savable_loader(ds, **LOADER_OPTIONS), encoder


def expected_batch(batch: dict, prep) -> dict:
    """The THD row of the batch's members prepared alone from the tar members (not via Energon)."""
    members = []
    for key in batch["sample_keys"]:
        raw = sample_members(int(key[1:]))
        images = [raw[k] for k in sorted(k for k in raw if k.startswith("img"))]
        members.append(prep.prepare({**json.loads(raw["json"]), "images": images}, key=key))
    out = build_visual_thd_batch(
        members, sequence_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE, emit_padding_mask=True
    )
    return {**out, "sample_keys": batch["sample_keys"], "skipped": batch["skipped"]}


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_every_sample_once_batches_are_gemma3_rows_and_resume_is_exact(
    dataset: Path, workers: int, tmp_path
) -> None:
    first, enc = make_loader(dataset, workers=workers)
    it = iter(first)
    batches = [next(it), next(it)]
    state = save_loader_state(first, enc)  # after 2 packs: before any worker's reader ends its pass
    assert not replaying_workers(state)
    write_loader_state(tmp_path / "state.pkl", state)
    batches += list(it)
    keys = accounting(batches)
    assert len(keys) == N_SAMPLES and set(keys.values()) == {1}
    skipped = {r["key"]: r for b in batches for r in b["skipped"]}
    assert {key: r["reason"] for key, r in skipped.items()} == GEMMA3_BAD
    assert all(r["message"].startswith(f"sample {r['key']}: ") for r in skipped.values())
    prep = gemma3_preparer()
    images = 0
    for b in batches:
        assert signature(expected_batch(b, prep)) == signature(b)
        # Bridge's Gemma3 keys: 1-D positions restarting per sequence, pixel_values per image, no grids.
        assert "mrope_position_ids" not in b and set(b["visual_inputs"]) <= {"pixel_values"}
        starts = b["cu_seqlens_q_padded"].tolist()
        for a, z in itertools.pairwise(starts):
            assert torch.equal(b["position_ids"][0, a:z], torch.arange(z - a))
        if "pixel_values" in b["visual_inputs"]:
            pixels = b["visual_inputs"]["pixel_values"]
            assert pixels.dtype == torch.bfloat16 and tuple(pixels.shape[1:]) == (3, 28, 28)
            images += pixels.shape[0]
            assert int((b["input_ids"] == prep.image_token_id).sum()) == 256 * pixels.shape[0]
    packed = {k for b in batches for k in b["sample_keys"]}
    assert images == sum(len([m for m in sample_members(int(k[1:])) if m.startswith("img")]) for k in packed)
    assert {"s00003", "s00019"} <= packed  # the 402x2 and 900x900 images: no Gemma3-VL limit refuses them
    restored, encoder = make_loader(dataset, workers=workers)
    restore_loader_state(restored, read_loader_state(tmp_path / "state.pkl"), encoder)
    assert [signature(b) for b in restored] == [signature(b) for b in batches[2:]]


def test_deferred_decoding_gives_the_eager_batches_and_the_preparer_is_in_the_state(dataset: Path) -> None:
    deferred, enc = make_loader(dataset, workers=0)
    it = iter(deferred)
    batches = [next(it)]
    state = save_loader_state(deferred, enc)
    batches += list(it)
    eager, _ = make_loader(dataset, workers=0, eager=True)
    assert [signature(b) for b in eager] == [signature(b) for b in batches]
    assert state["config"]["longpack_packing"]["preparer"]["family"] == "gemma3"
    other, other_encoder = make_loader(
        dataset, workers=0, prep=vlm_family("gemma3").preparer(processor=gemma3_processor(side=56))
    )
    with pytest.raises(LoaderStateMismatch, match=r"longpack_packing\.preparer\.image_processor\.size"):
        restore_loader_state(other, state, other_encoder)


@pytest.mark.parametrize("given", ["nemotron_vl", "family object"])
def test_nemotron_vl_is_refused_naming_why(given: str) -> None:
    family = "nemotron_vl" if given == "nemotron_vl" else vlm_family("nemotron_vl")
    for encoder in (QwenVLPackingEncoder, EagerQwenVLPackingEncoder):
        with pytest.raises(
            OnlineError,
            match=r"cannot pack nemotron_vl samples: .*expands each <image> to 256 embeddings after the packed boundaries",
        ):
            encoder(family, seq_length=SEQ_LENGTH)


def test_a_family_instead_of_its_preparer_is_refused() -> None:
    with pytest.raises(OnlineError, match=r"pass the gemma3 family's preparer \(vlm_family\('gemma3'\)"):
        QwenVLPackingEncoder(vlm_family("gemma3"), seq_length=SEQ_LENGTH)
    with pytest.raises(OnlineError, match=r"preparer must be a VLM family's preparer .* got int"):
        QwenVLPackingEncoder(3, seq_length=SEQ_LENGTH)  # type: ignore[arg-type]


MIXED_SAMPLES = 8


def mixed_members(i: int) -> dict[str, bytes]:
    """An image sample (even ``i``) or a video sample (odd ``i``, a real mp4 generated with PyAV)."""
    kind, member = ("<image>", "img0.png") if i % 2 == 0 else ("<video>", "vid0.mp4")
    chat = {
        "messages": [
            {"role": "user", "content": f"{kind}What is it?"},
            {"role": "assistant", "content": "A."},
        ]
    }
    media = png_bytes(48 + i, 40, seed=i) if i % 2 == 0 else video_bytes(4, 2, 32, 32)
    return {"json": json.dumps(chat).encode(), member: media}


def qwen3_vl_preparer():
    from transformers import Qwen2VLImageProcessor

    return vlm_family("qwen3_vl").preparer(image_processor=Qwen2VLImageProcessor(patch_size=16))


@pytest.mark.parametrize(
    ("family", "workers", "eager"),
    [
        ("gemma3", 0, False),
        ("gemma3", 0, True),
        pytest.param("gemma3", 2, False, marks=pytest.mark.slow),
    ],
)
def test_video_samples_of_a_family_without_video_are_skipped_and_named_not_fatal(
    tmp_path, family: str, workers: int, eager: bool
) -> None:
    """Gemma3-VL has no video input: in a mixed image/video dataset each video sample is refused
    (``unsupported_video``, its key and the fix in its ``skipped`` record), every image sample is packed;
    the loader does not stop."""
    root = write_dataset(tmp_path, mixed_members, MIXED_SAMPLES, shards=2)
    prep = gemma3_preparer()
    loader, _ = make_loader(root, workers=workers, eager=eager, prep=prep)
    batches = list(loader)
    keys = accounting(batches)
    assert len(keys) == MIXED_SAMPLES and set(keys.values()) == {1}
    packed = sorted(k for b in batches for k in b["sample_keys"])
    assert packed == [f"s{i:05d}" for i in range(0, MIXED_SAMPLES, 2)]
    skipped = sorted((r for b in batches for r in b["skipped"]), key=lambda r: r["key"])
    assert [(r["key"], r["reason"]) for r in skipped] == [
        (f"s{i:05d}", "unsupported_video") for i in range(1, MIXED_SAMPLES, 2)
    ]
    for r in skipped:
        assert r["message"].startswith(f"sample {r['key']}: ")
        assert r["message"].endswith(
            "(use qwen2_vl / qwen2_5_vl / qwen3_vl for video, or drop the video samples)"
        )


@pytest.mark.parametrize(("workers", "eager"), [(0, False), pytest.param(2, True, marks=pytest.mark.slow)])
def test_qwen3_vl_packs_the_same_mixed_image_and_video_dataset_whole(
    tmp_path, workers: int, eager: bool
) -> None:
    """The dataset Gemma3-VL refuses half of: Qwen3-VL takes video files, so every sample is packed, none
    skipped."""
    root = write_dataset(tmp_path, mixed_members, MIXED_SAMPLES, shards=2)
    loader, _ = make_loader(root, workers=workers, eager=eager, prep=qwen3_vl_preparer())
    batches = list(loader)
    keys = accounting(batches)
    assert len(keys) == MIXED_SAMPLES and set(keys.values()) == {1}
    assert sorted(k for b in batches for k in b["sample_keys"]) == [f"s{i:05d}" for i in range(MIXED_SAMPLES)]
    assert [r for b in batches for r in b["skipped"]] == []
