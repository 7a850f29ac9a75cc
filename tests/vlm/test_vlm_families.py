"""The family registry: each family's visual token count equals its transformers image processor, built
offline from a config (no download); the Qwen-VL families prepare the rows of ``QwenVLPreparer``."""

from __future__ import annotations

import numpy as np
import pytest

from longpack import choices
from longpack.errors import ConfigError
from longpack.vlm.families import FAMILIES, Gemma3Family, QwenVLFamily, vlm_family
from vlm_helpers import make_image, random_samples

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

SIZES = [(1, 1), (33, 20), (200, 199), (256, 255), (300, 250), (640, 480), (480, 640), (1200, 300), (300, 1200),
         (513, 256), (512, 256), (1000, 100), (100, 1000), (2000, 390), (767, 256), (4000, 40)]  # fmt: skip


def test_registry_names_every_family_and_refuses_others() -> None:
    assert tuple(sorted(FAMILIES)) == choices.VLM_FAMILIES  # the one list of names
    assert set(FAMILIES) == {
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "gemma3",
        "nemotron_vl",
        "glm4v",
        "kimi_vl",
        "qwen3_5_vl",
    }
    assert all(FAMILIES[name].name == name for name in FAMILIES)
    with pytest.raises(ConfigError, match="unknown VLM family 'llava'"):
        vlm_family("llava")


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_qwen_counts_equal_the_processor(name: str) -> None:
    family = vlm_family(name)
    v = family.vision
    processor = transformers.Qwen2VLImageProcessor(
        patch_size=v.patch_size, merge_size=v.merge_size, size={"shortest_edge": v.min_pixels, "longest_edge": v.max_pixels}
    )  # fmt: skip
    for w, h in SIZES:
        grid = processor(images=[make_image(w, h)], return_tensors="np")["image_grid_thw"]
        assert family.visual_tokens(w, h) == int(np.prod(grid)) // v.merge_size**2, (name, w, h)


def test_qwen_family_preparer_is_the_qwen_preparer() -> None:
    sample = random_samples(1, seed=3, max_images=1)[0]
    family = QwenVLFamily("qwen2_vl")
    prep = family.preparer(image_processor=transformers.Qwen2VLImageProcessor())
    seq = prep.prepare(sample)
    assert (
        seq.mrope_position_ids.tolist()
        == family.position_ids(seq.row["input_ids"], seq.visual_values).tolist()
    )


@pytest.mark.parametrize("pan_and_scan", [False, True])
def test_gemma3_counts_equal_the_processor(pan_and_scan: bool) -> None:
    settings = {"pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                "pan_and_scan_min_ratio_to_activate": 1.2}  # fmt: skip
    processor = transformers.Gemma3ImageProcessor(
        do_pan_and_scan=pan_and_scan, size={"height": 28, "width": 28}, **settings
    )
    family = Gemma3Family(do_pan_and_scan=pan_and_scan, **settings)
    for w, h in SIZES[1:]:
        out = processor(images=[np.zeros((h, w, 3), dtype=np.uint8)], return_tensors="np")
        crops = int(np.asarray(out["num_crops"]).reshape(-1)[0])
        assert family.crops(w, h) == crops, (w, h)
        assert family.visual_tokens(w, h) == (1 + crops) * 256
        assert out["pixel_values"].shape[0] == 1 + crops
