"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: the resize rule of :mod:`longpack.vlm.vision`, the 3-D rope index of
:mod:`longpack.vlm.rope`, :class:`longpack.vlm.QwenVLPreparer`, and Megatron-Bridge's Qwen-VL packed keys.

The three differ in patch size (Qwen3-VL: 16, as its processor config ``patch_size``), in how video frames
are numbered by the rope index (``rope_variant``) and in video handling (Qwen3-VL samples, resizes and writes
timestamps by its own rule, :mod:`longpack.vlm.video`); images are counted alike.

>>> QwenVLFamily("qwen3_vl").vision.patch_size, QwenVLFamily("qwen3_vl").visual_tokens(640, 480)
(16, 300)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longpack.errors import ConfigError
from longpack.vlm.errors import sized
from longpack.vlm.prepare import VISUAL_KEYS, QwenVLPreparer, VLMConfig
from longpack.vlm.rope import mrope_position_ids
from longpack.vlm.vision import ROPE_VARIANTS, VisionConfig, visual_token_count

# Patch size per family (transformers' processor configs of the released checkpoints).
_PATCH_SIZE = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}


class QwenVLFamily:
    """One Qwen-VL family; ``vision`` overrides its default :class:`VisionConfig` (pixel limits)."""

    can_prepare = True
    batch_keys: tuple[str, ...] = (*VISUAL_KEYS, "mrope_position_ids")
    position_dims = 3
    config_fields: tuple[str, ...] = ("vision", "video", "max_images", "max_visual_tokens")

    def __init__(self, name: str, vision: VisionConfig | None = None) -> None:
        if name not in ROPE_VARIANTS:
            raise ConfigError(f"Qwen-VL family {name!r} is not one of {ROPE_VARIANTS}", fields="family")
        self.name = name
        self.vision = vision or VisionConfig(patch_size=_PATCH_SIZE[name], rope_variant=name)

    @sized
    def visual_tokens(self, width: int, height: int) -> int:
        return visual_token_count(width, height, self.vision)

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any], *, preparer: Any = None) -> Any:
        prep = preparer or self.preparer()
        return mrope_position_ids(
            input_ids,
            visual_values.get("image_grid_thw"),
            visual_values.get("video_grid_thw"),
            visual_values.get("second_per_grid_ts"),
            image_token_id=prep.image_token_id,
            video_token_id=prep.video_token_id,
            merge_size=self.vision.merge_size,
            rope_variant=self.name,
            tokens_per_second=self.vision.tokens_per_second,
        )

    def reported_settings(self, preparer: QwenVLPreparer) -> dict[str, int | bool]:
        v = preparer.vision
        return {
            "patch_size": v.patch_size,
            "merge_size": v.merge_size,
            "min_pixels": v.min_pixels,
            "max_pixels": v.max_pixels,
        }

    def preparer(
        self, tokenizer: Any = "qwen3", image_processor: Any = None, **config: Any
    ) -> QwenVLPreparer:
        """A :class:`QwenVLPreparer` with this family's vision settings (``config``: :class:`VLMConfig`
        fields)."""
        vision = config.pop("vision", None) or self.vision
        vision = dataclasses.replace(vision, rope_variant=self.name)
        return QwenVLPreparer(tokenizer, image_processor, config=VLMConfig(vision=vision, **config))
