"""Qwen3.5-VL (its text model is hybrid Gated DeltaNet): visual token counts and 3-D positions.

Sources (transformers 5.24 ``models/qwen3_5``, ``models/auto``): its processor is ``Qwen3VLProcessor``, its
image processor ``Qwen2VLImageProcessor`` (16-pixel patches, 2 x 2 merge, as Qwen3-VL) and its video processor
``Qwen3VLVideoProcessor``, so an image's tokens are Qwen3-VL's; the ids are Qwen3.5's vocabulary's
(``Qwen3_5Config``: ``<|image_pad|>`` 248056, ``<|video_pad|>`` 248057). ``Qwen3_5Model.get_rope_index`` runs
over ``mm_token_type_ids`` (image 1, video 2, as the processor marks the pad tokens) and splits every video
into one ``(1, h, w)`` grid per frame: Qwen3-VL's rule (:func:`longpack.vlm.rope.mrope_position_ids` with
``rope_variant="qwen3_vl"``).

Samples are not prepared here (``can_prepare`` is false): Bridge's Qwen3.5-VL recipes pack in the model's step
(``defer_in_batch_packing_to_step=True``), not in a collate, and the chat template is the checkpoint's.

>>> f = Qwen35VLFamily()
>>> f.visual_tokens(640, 480), f.visual_tokens(1920, 1080)
(300, 943)
>>> f.position_ids([1, IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, 2], {"image_grid_thw": [[1, 2, 4]]}).tolist()
[[0, 1, 1, 3], [0, 1, 1, 3], [0, 1, 2, 3]]
"""

from __future__ import annotations

from typing import Any

from longpack.vlm.errors import VLMError
from longpack.vlm.rope import mrope_position_ids
from longpack.vlm.vision import VisionConfig, visual_token_count

# ``Qwen3_5Config`` defaults (transformers 5.24 ``configuration_qwen3_5.py``).
IMAGE_TOKEN_ID, VIDEO_TOKEN_ID = 248056, 248057
BATCH_KEYS: tuple[str, ...] = ("pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw")


class Qwen35VLFamily:
    """Qwen3.5-VL with its processors' defaults (``vision``: other pixel limits)."""

    name = "qwen3_5_vl"
    can_prepare = False
    batch_keys: tuple[str, ...] = BATCH_KEYS
    position_dims = 3
    config_fields: tuple[str, ...] = ()

    def __init__(self, vision: VisionConfig | None = None) -> None:
        self.vision = vision or VisionConfig(patch_size=16, rope_variant="qwen3_vl")

    def visual_tokens(self, width: int, height: int) -> int:
        return visual_token_count(width, height, self.vision)

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any]) -> Any:
        """``[3, L]`` positions of one unpadded sequence (``Qwen3_5Model.get_rope_index``)."""
        return mrope_position_ids(
            input_ids,
            visual_values.get("image_grid_thw"),
            visual_values.get("video_grid_thw"),
            image_token_id=IMAGE_TOKEN_ID,
            video_token_id=VIDEO_TOKEN_ID,
            merge_size=self.vision.merge_size,
            rope_variant="qwen3_vl",
        )

    def reported_settings(self, preparer: object) -> dict[str, int | bool]:
        return {}  # no preparer of its samples to report on

    def preparer(self, tokenizer: Any = None, image_processor: Any = None, **config: Any) -> Any:
        raise VLMError(
            "Qwen3.5-VL samples are not prepared by longpack (Bridge's Qwen3.5-VL recipes pack in the model's "
            "step, defer_in_batch_packing_to_step=True, with the checkpoint's chat template); use longpack for "
            "visual token counts and position_ids"
        )
