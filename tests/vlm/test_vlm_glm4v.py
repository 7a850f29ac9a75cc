"""GLM-4.1V / GLM-4.5V on the family registry: visual token counts from image headers equal transformers'
``Glm4vImageProcessor`` (built offline from its defaults); positions equal ``Glm4vModel.get_rope_index``
(transformers' own method, run on a stand-in ``self`` carrying the vision config's ``spatial_merge_size``
and the model's ``get_vision_position_ids``); the packed batch equals Megatron-Bridge's
``glm4v_collate_fn(enable_in_batch_packing=True)`` packing (``models/glm_vl/data/collate_fn.py``, commit
067f987), restated in ``bridge_glm4v_packed`` below: rows keep 1-D ``arange`` positions, rows are packed as
``build_mcore_thd_sequence_batch_from_rows`` with ``mm_token_type_ids`` padded with 0, and ``visual_inputs``
holds the concatenated THW-grid keys plus the packed ``mm_token_type_ids``. ``scripts/vlm_bridge_harness.py``
runs Bridge's own packing function on the same rows.
"""

from __future__ import annotations

import functools
import io
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from longpack import choices
from longpack.runtime.in_batch import build_glm4v_thd_batch
from longpack.vlm import SampleError, VLMError
from longpack.vlm.families import FAMILIES, Glm4vFamily, vlm_family
from longpack.vlm.families.glm4v import (
    IMAGE_TOKEN_ID,
    VIDEO_END_ID,
    VIDEO_START_ID,
    mm_token_type_ids,
)
from longpack.vlm.vision import image_size
from vlm_helpers import png_bytes

transformers = pytest.importorskip("transformers")
glm4v = pytest.importorskip("transformers.models.glm4v")

IMAGE_START_ID, IMAGE_END_ID = 151339, 151340  # Glm4vConfig's <|begin_of_image|> / <|end_of_image|>
SIZES = [(1, 1), (27, 27), (28, 28), (33, 20), (100, 1000), (1000, 100), (224, 224), (300, 250), (640, 480),
         (480, 640), (20, 3000), (57, 113)]  # fmt: skip
LARGE = [(1280, 720), (1920, 1080), (3000, 2500), (4000, 3000)]  # the last two: over max_pixels, scaled down


def test_registered() -> None:
    assert "glm4v" in choices.VLM_FAMILIES and isinstance(FAMILIES["glm4v"], Glm4vFamily)
    assert not vlm_family("glm4v").can_prepare
    with pytest.raises(VLMError, match="glm4v_collate_fn"):
        vlm_family("glm4v").preparer()


def solid_png(width: int, height: int) -> bytes:
    """A one-colour PNG (cheap to encode at 12 megapixels; the count depends on the size only)."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 140, 30)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def test_counts_from_headers_equal_the_processor() -> None:
    assert_counts_equal_the_processor(SIZES)


@pytest.mark.slow  # the processor resizes 12-megapixel images (~10 s on a loaded 2-core machine)
def test_counts_equal_the_processor_over_max_pixels() -> None:
    assert_counts_equal_the_processor(LARGE)


def assert_counts_equal_the_processor(sizes: list[tuple[int, int]]) -> None:
    processor = glm4v.Glm4vImageProcessor()  # the class defaults; no download
    family = vlm_family("glm4v")
    merge = processor.merge_size
    for w, h in sizes:
        data = solid_png(w, h)
        assert image_size(data) == (w, h)
        out = processor(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
        grid = out["image_grid_thw"][0].tolist()
        assert family.grid(*image_size(data)) == tuple(grid), (w, h)
        assert family.visual_tokens(w, h) == int(np.prod(grid)) // merge**2, (w, h)
        assert out["pixel_values"].shape[0] == int(np.prod(grid))


def test_aspect_ratio_over_200_refused_like_the_processor() -> None:
    from longpack.vlm.vision import decode_image

    with pytest.raises(ValueError, match="aspect ratio"):
        glm4v.Glm4vImageProcessor()(images=[decode_image(png_bytes(6000, 28))], return_tensors="pt")
    with pytest.raises(SampleError) as caught:
        vlm_family("glm4v").visual_tokens(6000, 28)
    assert caught.value.reason == "aspect_ratio"
    with pytest.raises(SampleError) as caught:
        vlm_family("glm4v").visual_tokens(0, 5)
    assert caught.value.reason == "empty_image"


def transformers_rope_index(input_ids: torch.Tensor, types_: torch.Tensor, images, videos) -> torch.Tensor:
    """``Glm4vModel.get_rope_index`` itself, on a stand-in ``self`` (the method reads only these two)."""
    model = glm4v.modeling_glm4v.Glm4vModel
    config = glm4v.Glm4vConfig()
    stand_in = types.SimpleNamespace(config=config)
    stand_in.get_vision_position_ids = functools.partial(model.get_vision_position_ids, stand_in)
    positions, _ = model.get_rope_index(
        stand_in,
        input_ids[None],
        types_[None],
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return positions[:, 0]


@st.composite
def sequences(draw):
    ids, images, videos = [], [], []
    for _ in range(draw(st.integers(1, 6))):
        ids += draw(st.lists(st.integers(1, 1000), min_size=1, max_size=6))
        kind = draw(st.sampled_from(["image", "video", "text"]))
        h, w = draw(st.integers(1, 5)) * 2, draw(st.integers(1, 5)) * 2
        if kind == "image":
            images.append([1, h, w])
            ids += [IMAGE_TOKEN_ID] * (h * w // 4)
        elif kind == "video":
            t = draw(st.integers(1, 3))
            videos.append([t, h, w])
            # the chat template's video brackets around Glm4vProcessor.replace_video_token's frames: each
            # <|begin_of_image|> image tokens <|end_of_image|> and the frame's second
            ids.append(VIDEO_START_ID)
            for second in range(t):
                ids += [IMAGE_START_ID, *[IMAGE_TOKEN_ID] * (h * w // 4), IMAGE_END_ID, 15 + second]
            ids.append(VIDEO_END_ID)
    return ids, images, videos


def processor_token_types(ids: list[int]) -> list[int]:
    """``Glm4vProcessor.create_mm_token_type_ids`` itself on a bare processor (it reads three ids)."""
    processor = object.__new__(glm4v.processing_glm4v.Glm4vProcessor)
    processor.__dict__.update(
        image_token_id=IMAGE_TOKEN_ID, video_start_id=VIDEO_START_ID, video_end_id=VIDEO_END_ID
    )
    return processor.create_mm_token_type_ids([ids])[0]


@settings(max_examples=60, deadline=None)
@given(sequences())
def test_positions_equal_get_rope_index(case) -> None:
    """Without ``mm_token_type_ids`` too: the types are the processor's, from the video brackets."""
    ids, images, videos = case
    types_ = processor_token_types(ids)
    assert mm_token_type_ids(ids).tolist() == types_
    expected = transformers_rope_index(torch.tensor(ids), torch.tensor(types_), images, videos)
    grids = {"image_grid_thw": images, "video_grid_thw": videos}
    ours = vlm_family("glm4v").position_ids(ids, grids)
    assert ours.tolist() == expected.tolist()
    given_types = vlm_family("glm4v").position_ids(ids, {**grids, "mm_token_type_ids": types_})
    assert given_types.tolist() == expected.tolist()


def test_position_errors_are_sample_errors() -> None:
    family = vlm_family("glm4v")
    with pytest.raises(SampleError) as caught:
        family.position_ids([1, IMAGE_TOKEN_ID, 2], {"image_grid_thw": [[1, 4, 4]]})
    assert caught.value.reason == "placeholder_mismatch"
    with pytest.raises(SampleError, match="more image/video grids"):
        family.position_ids([1, 2], {"image_grid_thw": [[1, 2, 2]]})


def glm_row(seed: int, length: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A row as Bridge's GLM collate makes it from one processor output (ids, arange, shifted labels)."""
    rng = np.random.default_rng(seed)
    h, w = 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4))
    ids = torch.tensor([5, 6, *([IMAGE_TOKEN_ID] * (h * w // 4)), *rng.integers(1, 999, length).tolist()])
    mask = torch.tensor((rng.random(ids.numel()) > 0.3).astype(np.float32))
    labels = torch.cat([ids[1:], ids.new_full((1,), -100)]).masked_fill(mask == 0, -100)
    row = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.numel()),
           "labels": labels, "loss_mask": mask, "mm_token_type_ids": torch.tensor(mm_token_type_ids(ids))}  # fmt: skip
    visual = {"pixel_values": torch.rand(h * w, 1176), "image_grid_thw": torch.tensor([[1, h, w]])}
    return row, visual


def bridge_glm4v_packed(rows, visuals, *, sequence_length, multiple, pad_id=0):
    """Bridge's GLM in-batch packing restated (``build_mcore_thd_sequence_batch_from_rows`` + visual_inputs)."""
    lengths = [int(r["input_ids"].numel()) for r in rows]
    padded = [-(-n // multiple) * multiple for n in lengths]
    total = sum(padded)
    out = {"input_ids": torch.full((1, total), pad_id), "position_ids": torch.zeros((1, total), dtype=torch.long),
           "labels": torch.full((1, total), -100), "loss_mask": torch.zeros((1, total)),
           "mm": torch.zeros((1, total), dtype=torch.long)}  # fmt: skip
    offset = 0
    for row, n, p in zip(rows, lengths, padded, strict=True):
        for key, src in (("input_ids", "input_ids"), ("labels", "labels"), ("loss_mask", "loss_mask"),
                         ("mm", "mm_token_type_ids"), ("position_ids", "position_ids")):  # fmt: skip
            out[key][0, offset : offset + n] = row[src]
        out["position_ids"][0, offset + n : offset + p] = torch.arange(n, p)
        offset += p
    cu = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)
    cu_padded = torch.tensor(np.cumsum([0, *padded]), dtype=torch.int32)
    out.update(attention_mask=None, cu_seqlens_q=cu, cu_seqlens_kv=cu, total_tokens=total,
               max_seqlen_q=torch.tensor(max(padded), dtype=torch.int32),
               max_seqlen_kv=torch.tensor(max(padded), dtype=torch.int32))  # fmt: skip
    if padded != lengths:
        out.update(cu_seqlens_q_padded=cu_padded, cu_seqlens_kv_padded=cu_padded)
    mm = out.pop("mm")
    out["visual_inputs"] = {
        "pixel_values": torch.cat([v["pixel_values"] for v in visuals]),
        "image_grid_thw": torch.cat([v["image_grid_thw"] for v in visuals]),
        "mm_token_type_ids": mm,
    }
    return out


def assert_same(theirs: dict, ours: dict) -> None:
    assert set(theirs) == set(ours)
    for key, value in theirs.items():
        if isinstance(value, dict):
            assert_same(value, ours[key])
        elif isinstance(value, torch.Tensor):
            assert value.dtype == ours[key].dtype and torch.equal(value, ours[key]), key
        else:
            assert value == ours[key], key


@pytest.mark.parametrize("multiple", [1, 8])
def test_packed_batch_equals_bridge_restated(multiple: int) -> None:
    pairs = [glm_row(seed, 5 + 7 * seed) for seed in range(5)]
    rows, visuals = [p[0] for p in pairs], [p[1] for p in pairs]
    ours = build_glm4v_thd_batch(rows, visuals, sequence_length=4096, pad_to_multiple_of=multiple)
    assert_same(bridge_glm4v_packed(rows, visuals, sequence_length=4096, multiple=multiple), ours)
    assert set(ours["visual_inputs"]) <= set(vlm_family("glm4v").batch_keys)
