"""The visual token count from an image's size alone equals the real processor's output.

Oracle: transformers' ``Qwen2VLImageProcessor()`` (default settings, built offline) run on generated images,
and its own no-decode ``get_number_of_image_patches``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.errors import ConfigError
from longpack.vlm import (
    SampleRejected,
    VisionConfig,
    VLMError,
    image_grid_thw,
    image_size,
    visual_token_count,
)
from vlm_helpers import image_processor, make_image, png_bytes

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PIXEL_SETTINGS = [
    {},  # processor defaults: 56*56 .. 28*28*1280
    {"min_pixels": 200704, "max_pixels": 1003520},  # Megatron-Bridge's Qwen-VL recipe values
    {"min_pixels": 3136, "max_pixels": 64 * 28 * 28},  # a small budget: the max_pixels branch often
]


def processor_grid(width: int, height: int, settings_: dict) -> tuple[int, ...]:
    size = {
        "shortest_edge": settings_.get("min_pixels", 56 * 56),
        "longest_edge": settings_.get("max_pixels", 28 * 28 * 1280),
    }
    out = image_processor()(images=[make_image(width, height)], return_tensors="np", size=size)
    return tuple(int(x) for x in out["image_grid_thw"][0])


def test_config_from_the_processor_is_its_defaults() -> None:
    assert VisionConfig.from_image_processor(image_processor()) == VisionConfig()


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 900),
    height=st.integers(1, 900),
    which=st.sampled_from(range(len(PIXEL_SETTINGS))),
)
def test_grid_equals_the_processor_on_real_images(width: int, height: int, which: int) -> None:
    settings_ = PIXEL_SETTINGS[which]
    config = VisionConfig(**settings_)
    if max(width, height) / min(width, height) > 200:
        with pytest.raises(VLMError, match="aspect ratio"):
            image_grid_thw(width, height, config)
        with pytest.raises(ValueError, match="aspect ratio"):
            processor_grid(width, height, settings_)
        return
    assert image_grid_thw(width, height, config) == processor_grid(width, height, settings_)


@settings(max_examples=600, deadline=None)
@given(width=st.integers(1, 8000), height=st.integers(1, 8000), which=st.sampled_from(range(3)))
def test_patch_count_equals_the_processor_rule_on_many_sizes(width: int, height: int, which: int) -> None:
    """The processor's own size-only count (``get_number_of_image_patches``) over a wide size range."""
    settings_ = PIXEL_SETTINGS[which]
    config = VisionConfig(**settings_)
    if max(width, height) / min(width, height) > 200:
        return
    _, gh, gw = image_grid_thw(width, height, config)
    assert gh * gw == image_processor().get_number_of_image_patches(height, width, settings_)
    assert visual_token_count(width, height, config) == gh * gw // 4


@pytest.mark.parametrize(
    ("width", "height"), [(1, 1), (28, 28), (27, 29), (3, 600), (600, 3), (4000, 3000), (14, 2800)]
)
def test_edge_sizes_equal_the_processor(width: int, height: int) -> None:
    assert image_grid_thw(width, height, VisionConfig()) == processor_grid(width, height, {})


def test_size_comes_from_the_header_without_decoding(tmp_path) -> None:
    data = png_bytes(123, 45)
    truncated = data[: len(data) // 3]  # header intact, pixel data cut: decodes fail, sizes do not
    path = tmp_path / "cut.png"
    path.write_bytes(truncated)
    assert image_size(truncated) == (123, 45)
    assert image_size(path) == (123, 45)
    assert image_size(make_image(7, 9)) == (7, 9)
    with pytest.raises(SampleRejected, match=r"sample s1: image .*nope.png cannot be read") as info:
        image_size(tmp_path / "nope.png", key="s1")
    assert info.value.reason == "undecodable"


def test_bad_config_is_named() -> None:
    with pytest.raises(ConfigError, match=r"min_pixels=10 > max_pixels=5"):
        VisionConfig(min_pixels=10, max_pixels=5)
    with pytest.raises(ConfigError, match="rope_variant='qwen9'"):
        VisionConfig(rope_variant="qwen9")
