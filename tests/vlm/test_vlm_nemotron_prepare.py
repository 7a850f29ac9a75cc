"""Nemotron-VL preparation from a local checkpoint folder (tests/vlm_helpers.py: a Nemotron-shaped tokenizer
with Bridge's image ids and turn markers, a ``config.json`` with the tiling and normalization keys): rows as
Bridge's ``nemotron_nano_v2_vl_collate_fn`` makes them for one sample, restated here from its steps (the
processor's text with 256 ``<image>`` per tile, the assistant boundary mask on it, ``adjust_image_tokens``'
collapse, shifted labels); pixel tiles; lengths from the headers; the packed row and its expansion.
Bridge's own collate on the same samples: ``scripts/vlm_bridge_harness.py`` (``nemotron_vl prepare`` rows)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from longpack.runtime.in_batch import InBatchPackingError, build_nemotron_vl_thd_batch
from longpack.vlm import SampleRejected, VLMError
from longpack.vlm.families.gemma3 import assistant_boundary_mask
from longpack.vlm.families.nemotron_vl import (
    IMAGE_TOKEN_ID,
    NemotronVLPreparer,
    collapse_image_tokens,
    expand_packed_boundaries,
)
from vlm_helpers import make_image, nemotron_vl_checkpoint, png_bytes, random_samples

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def prep(tmp_path_factory) -> NemotronVLPreparer:
    folder = nemotron_vl_checkpoint(tmp_path_factory.mktemp("nemotron_ckpt"))
    return NemotronVLPreparer.from_checkpoint(folder, max_images=None, max_visual_tokens=None)


def samples() -> list[dict]:
    out = random_samples(6, seed=5, max_images=2, max_side=1200)
    out.append(
        {
            "__key__": "system",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "<image> What?"},
                {"role": "assistant", "content": "A cube."},
                {"role": "user", "content": "Colour?"},
                {"role": "assistant", "content": "Red."},
            ],
            "images": [make_image(1500, 400, 3)],
        }
    )
    return out


def bridge_steps(prep: NemotronVLPreparer, sample: dict) -> dict:
    """Bridge's collate for one sample, restated step by step: the processor's ids (256 ``<image>`` per
    tile), the boundary mask on them, skipped tokens, ``adjust_image_tokens`` on ids and mask, labels shifted
    and masked, loss mask shifted."""
    messages, images = prep._conversation(sample, "k")
    from longpack.vlm.vision import image_size

    tiles = [prep.family.tiles(*image_size(i)) for i in images]
    text = prep.text(messages, [256 * n for n in tiles])  # the processor's text
    ids = np.asarray(prep.tokenizer(text, add_special_tokens=False)["input_ids"])
    mask = assistant_boundary_mask(ids, prep.start_ids, prep.end_ids)
    mask[np.isin(ids, prep.skipped_ids)] = 0
    collapsed = collapse_image_tokens(ids, tiles)
    # adjust_image_tokens keeps the mask of each region's first media tokens (0 inside a user turn)
    keep = np.ones(len(ids), bool)
    for start in np.flatnonzero(ids == prep.img_start_id):
        end = start + 1 + int(np.argmax(ids[start + 1 :] == prep.img_end_id))
        n = tiles.pop(0)
        keep[start + 1 + n : end] = False
        tiles.append(n)  # keep the order for the pixels check
    mask = mask[keep]
    assert np.array_equal(ids[keep], collapsed)
    labels = np.append(collapsed[1:], -100)
    labels[np.isin(labels, prep.skipped_ids)] = -100
    shifted = np.append(mask[1:], 0).astype(np.float32)
    labels[shifted == 0] = -100
    return {"input_ids": collapsed, "labels": labels, "loss_mask": shifted, "tiles": tiles}


def test_rows_equal_bridge_collate_steps_and_lengths_equal_headers(prep) -> None:
    for sample in samples():
        seq = prep.prepare(sample)
        expected = bridge_steps(prep, sample)
        assert seq.row["input_ids"].tolist() == expected["input_ids"].tolist()
        assert seq.row["labels"].tolist() == expected["labels"].tolist()
        assert seq.row["loss_mask"].tolist() == expected["loss_mask"].tolist()
        assert seq.row["position_ids"].tolist() == list(range(seq.sequence_length))
        assert prep.length(sample).tokens == seq.sequence_length
        tiles = sum(expected["tiles"])
        assert seq.visual_tokens == 256 * tiles
        if tiles:
            assert seq.visual_values["num_patches"].tolist() == [1] * tiles
            assert seq.visual_values["pixel_values"].shape == (tiles, 3, 512, 512)
            assert seq.visual_values["pixel_values"].dtype == torch.bfloat16
        assert float(seq.row["loss_mask"].sum()) > 0  # every sample trains on its answers


def test_assistant_tokens_trained_and_image_tokens_never(prep) -> None:
    seq = prep.prepare(samples()[-1])
    ids, mask = seq.row["input_ids"], seq.row["loss_mask"]
    trained = prep.tokenizer.decode(ids[1:][mask[:-1] == 1])
    assert trained == "A cube.<SPECIAL_12>Red.<SPECIAL_12>"
    assert not bool(((ids == IMAGE_TOKEN_ID)[1:] & (mask[:-1] == 1)).any())


def test_pixel_tiles_are_crops_when_the_image_is_the_grid(prep) -> None:
    image = make_image(1024, 512, 4)  # grid (2, 1): no resize; two tiles and a thumbnail
    tiles = prep.pixel_tiles(image)
    assert tiles.shape == (3, 3, 512, 512)
    raw = torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 255
    mean = torch.tensor(prep.norm_mean).reshape(3, 1, 1)
    std = torch.tensor(prep.norm_std).reshape(3, 1, 1)
    assert torch.allclose(tiles[0], (raw[:, :, :512] - mean) / std, atol=1e-5)
    assert torch.allclose(tiles[1], (raw[:, :, 512:] - mean) / std, atol=1e-5)
    single = prep.pixel_tiles(make_image(512, 512, 5))
    assert single.shape == (1, 3, 512, 512)  # one tile: no thumbnail


def test_limits_use_the_language_model_length(prep, tmp_path) -> None:
    folder = nemotron_vl_checkpoint(tmp_path / "c")
    small = NemotronVLPreparer.from_checkpoint(folder, max_length=600, max_visual_tokens=None)
    sample = {
        "__key__": "big",
        "messages": [{"role": "user", "content": "<image>x"}, {"role": "assistant", "content": "y"}],
        "images": [png_bytes(1024, 512)],
    }
    assert small.length(sample).tokens < 100  # collated: 3 tiles
    with pytest.raises(SampleRejected, match=r"sample big: .* language-model tokens .* > max_length=600"):
        small.prepare(sample)
    with pytest.raises(SampleRejected, match=r"too_long|max_length"):
        small.measure(sample)
    assert small.stats.rejected["too_long"] == 2


def test_refusals_name_the_cause(prep, tmp_path) -> None:
    video = {"__key__": "v", "messages": [{"role": "user", "content": "<video>x"}], "videos": [b"x"]}
    with pytest.raises(SampleRejected, match=r"sample v: .*video"):
        prep.prepare(video)
    folder = nemotron_vl_checkpoint(tmp_path / "n")
    config = json.loads((folder / "config.json").read_text())
    del config["norm_std"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(VLMError, match=r"config.json: no norm_std"):
        NemotronVLPreparer.from_checkpoint(folder)
    with pytest.raises(VLMError, match=r"cannot read the checkpoint config"):
        NemotronVLPreparer.from_checkpoint(tmp_path / "absent")


def test_packed_row_and_its_expansion(prep) -> None:
    seqs = [prep.prepare(s) for s in samples()[:4]]
    out = build_nemotron_vl_thd_batch(seqs, pad_to_multiple_of=8)
    lengths = [s.sequence_length for s in seqs]
    assert out["cu_seqlens_q"].tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    tiles = [int(s.visual_values["num_patches"].numel()) if s.visual_values else 0 for s in seqs]
    assert out["num_patches"].tolist() == [1] * sum(tiles)
    assert out["visual_inputs"]["pixel_values"].shape[0] == sum(tiles)
    grown = expand_packed_boundaries(out["cu_seqlens_q"], out["cu_seqlens_q_padded"], out["input_ids"])
    llm = [prep.llm_length(n, [t]) for n, t in zip(lengths, tiles, strict=True)]
    assert grown["cu_seqlens_q"].diff().tolist() == llm
    total = int(grown["cu_seqlens_q_padded"][-1])
    build_nemotron_vl_thd_batch(seqs, pad_to_multiple_of=8, language_max_sequence_length=total)
    with pytest.raises(InBatchPackingError, match=f"{total} language-model tokens .*llava_step would cut"):
        build_nemotron_vl_thd_batch(seqs, pad_to_multiple_of=8, language_max_sequence_length=total - 1)


class PilRevisionImageProcessor:
    """The other published revision of the checkpoint's ``NemotronNanoVLV2ImageProcessor``, restated for the
    test: each tile cut from a PIL-resized image, then ``ToTensor`` and normalization (``tiles`` overrides the
    count, to test the tiling check)."""

    def __init__(self, prep: NemotronVLPreparer, tiles: int | None = None) -> None:
        self.prep, self.tiles = prep, tiles

    def __call__(self, images, return_tensors="pt"):
        side, out, counts = self.prep.family.tile_size, [], []
        mean = torch.tensor(self.prep.norm_mean).reshape(3, 1, 1)
        std = torch.tensor(self.prep.norm_std).reshape(3, 1, 1)
        for image in images:
            cols, rows = self.prep.family.grid(*image.size)
            big = image.convert("RGB").resize((cols * side, rows * side))
            crops = [
                big.crop((c * side, r * side, (c + 1) * side, (r + 1) * side))
                for r in range(rows)
                for c in range(cols)
            ]
            if len(crops) > 1:
                crops.append(image.convert("RGB").resize((side, side)))
            for crop in crops:
                out.append(
                    (torch.from_numpy(np.asarray(crop, dtype=np.float32)).permute(2, 0, 1) / 255 - mean) / std
                )
            counts.append(self.tiles or len(crops))
        return {"pixel_values": torch.stack(out), "num_patches": torch.tensor(counts)}


def test_the_checkpoints_image_processor_gives_the_pixels_and_its_tiling_is_checked(prep, tmp_path) -> None:
    folder = nemotron_vl_checkpoint(tmp_path / "ip")
    sample = samples()[-1]
    own = NemotronVLPreparer.from_checkpoint(folder, max_visual_tokens=None)
    own.image_processor = PilRevisionImageProcessor(own)
    seq, restated = own.prepare(sample), prep.prepare(sample)
    expected = PilRevisionImageProcessor(own)([make_image(1500, 400, 3)])["pixel_values"].to(torch.bfloat16)
    assert torch.equal(seq.visual_values["pixel_values"], expected)
    assert seq.row["input_ids"].tolist() == restated.row["input_ids"].tolist()
    # the two revisions' pixels differ (PIL's resize vs torchvision's on floats): why the processor is an option
    assert not torch.equal(seq.visual_values["pixel_values"], restated.visual_values["pixel_values"])
    own.image_processor = PilRevisionImageProcessor(own, tiles=2)
    with pytest.raises(VLMError, match=r"sample system: the image processor made \[2\] tiles .* gives \[5\]"):
        own.prepare(sample)


def test_preprocessor_config_overrides_config_json(tmp_path) -> None:
    folder = nemotron_vl_checkpoint(tmp_path / "pp")
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"image_size": 448, "max_num_tiles": 6, "norm_mean": [0.5] * 3, "norm_std": [0.25] * 3})
    )
    prep = NemotronVLPreparer.from_checkpoint(folder)
    assert (prep.family.tile_size, prep.family.max_num_tiles, prep.norm_mean) == (448, 6, [0.5] * 3)
    assert prep.family.tokens_per_tile == (448 // 16) ** 2 // 4
