"""Qwen3.5-VL: visual token counts equal its image processor (``Qwen2VLImageProcessor`` with the 16-pixel
patches ``models/auto`` gives ``qwen3_5``); positions equal ``Qwen3_5Model.get_rope_index`` itself (run on a
stand-in ``self`` carrying the vision config's ``spatial_merge_size`` and the model's
``get_vision_position_ids``), with ``mm_token_type_ids`` from the processor's own ``create_mm_token_type_ids``
(a bare ``Qwen3VLProcessor`` holding Qwen3.5's ids), on random image, video and text sequences laid out as the
processor writes them (a video: per frame ``<t seconds>``, ``<|vision_start|>``, pads, ``<|vision_end|>``)."""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack import choices
from longpack.vlm import VLMError
from longpack.vlm.families import FAMILIES, Qwen35VLFamily, vlm_family
from longpack.vlm.families.qwen3_5_vl import IMAGE_TOKEN_ID, VIDEO_TOKEN_ID
from vlm_helpers import make_image

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
qwen3_5 = pytest.importorskip("transformers.models.qwen3_5")
VISION_START, VISION_END = 248053, 248054  # Qwen3_5Config's <|vision_start|> / <|vision_end|>
SIZES = [(1, 1), (33, 20), (300, 250), (640, 480), (480, 640), (1200, 300), (1920, 1080), (4000, 40)]


def test_registered_and_counts_equal_the_processor() -> None:
    assert "qwen3_5_vl" in choices.VLM_FAMILIES and isinstance(FAMILIES["qwen3_5_vl"], Qwen35VLFamily)
    with pytest.raises(VLMError, match="not prepared"):
        vlm_family("qwen3_5_vl").preparer()
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    assert "Qwen2VLImageProcessor" in str(IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_5"])
    config = qwen3_5.Qwen3_5Config()
    assert (config.image_token_id, config.video_token_id) == (IMAGE_TOKEN_ID, VIDEO_TOKEN_ID)
    assert (config.vision_start_token_id, config.vision_end_token_id) == (VISION_START, VISION_END)
    family = vlm_family("qwen3_5_vl")
    v = family.vision
    assert (v.patch_size, v.merge_size) == (
        config.vision_config.patch_size,
        config.vision_config.spatial_merge_size,
    )
    processor = transformers.Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, size={"shortest_edge": v.min_pixels, "longest_edge": v.max_pixels}
    )
    for w, h in SIZES:
        grid = processor(images=[make_image(w, h)], return_tensors="np")["image_grid_thw"]
        assert family.visual_tokens(w, h) == int(np.prod(grid)) // 4, (w, h)


def transformers_positions(ids: list[int], images, videos) -> list[list[int]]:
    owner = object.__new__(transformers.Qwen3VLProcessor)
    owner.__dict__.update(image_token_id=IMAGE_TOKEN_ID, video_token_id=VIDEO_TOKEN_ID)
    types_ = owner.create_mm_token_type_ids([ids])[0]
    model = qwen3_5.modeling_qwen3_5.Qwen3_5Model
    stand_in = types.SimpleNamespace(config=qwen3_5.Qwen3_5Config())
    stand_in.get_vision_position_ids = functools.partial(model.get_vision_position_ids, stand_in)
    positions, _ = model.get_rope_index(
        stand_in,
        torch.tensor([ids]),
        torch.tensor([types_]),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return positions[:, 0].tolist()


@st.composite
def sequences(draw):
    ids, images, videos = [], [], []
    for _ in range(draw(st.integers(1, 5))):
        ids += draw(st.lists(st.integers(1, 1000), min_size=1, max_size=5))
        kind = draw(st.sampled_from(["image", "video", "text"]))
        h, w = draw(st.integers(1, 4)) * 2, draw(st.integers(1, 4)) * 2
        if kind == "image":
            images.append([1, h, w])
            ids += [VISION_START, *[IMAGE_TOKEN_ID] * (h * w // 4), VISION_END]
        elif kind == "video":
            t = draw(st.integers(1, 3))
            videos.append([t, h, w])
            for second in range(t):  # "<0.5 seconds>" as a few text ids, then the frame group
                ids += [17 + second, 18, VISION_START, *[VIDEO_TOKEN_ID] * (h * w // 4), VISION_END]
    return ids, images, videos


@settings(max_examples=60, deadline=None)
@given(sequences())
def test_positions_equal_get_rope_index(case) -> None:
    ids, images, videos = case
    ours = vlm_family("qwen3_5_vl").position_ids(ids, {"image_grid_thw": images, "video_grid_thw": videos})
    assert ours.tolist() == transformers_positions(ids, images, videos)
