"""Kimi-VL (Kimi K2.5): visual token counts from image sizes, as transformers 5.24's ``Kimi_K25ImageProcessor``
(``models/kimi_k25``) makes them with its defaults, and the expansion Megatron-Bridge's Kimi collate does.

- **Resize** (``navit_resize``): patches of 14 px; the image is scaled down (never up) by the most restrictive
  of ``sqrt(max_patches / ((h // 14) * (w // 14)))`` (``max_patches`` 16384) and ``512 * 14 / side`` per side,
  each side truncated (at least 1 px), then padded up to a multiple of ``2 * 14``.
- **Tokens** (``Kimi_K25Processor.replace_image_token``; Bridge ``models/kimi_vl/data/collate_fn.py``
  ``_expand_image_tokens``, merge kernel 2 x 2): ``t * (h / 2) * (w / 2)`` of the padded patch grid, one
  ``<|media_pad|>`` (id 163605) each.
- **Packing**: Bridge's collate expands each placeholder to that count and packs the rows with
  ``build_mcore_thd_sequence_batch_from_rows`` (1-D positions); its processor is the checkpoint's, whose grid key
  is ``grid_thws``. longpack counts tokens only (``can_prepare`` is false).

>>> k = KimiVLFamily()
>>> k.grid(640, 480), k.visual_tokens(640, 480), k.visual_tokens(1920, 1080)
((1, 36, 46), 414, 2691)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from longpack.vlm.errors import SampleError, VLMError, sized

MEDIA_TOKEN_ID = 163605  # Bridge's Kimi K2.5 default ``media_token_id``
BATCH_KEYS: tuple[str, ...] = ("pixel_values", "image_grid_thw")


class KimiVLFamily:
    """Kimi K2.5 with ``Kimi_K25ImageProcessor``'s defaults (override any of them)."""

    name = "kimi_vl"
    can_prepare = False
    batch_keys: tuple[str, ...] = BATCH_KEYS
    position_dims = 1
    config_fields: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        patch_size: int = 14,
        merge_size: int = 2,
        max_patches: int = 16384,
        max_side_patches: int = 512,
    ) -> None:
        self.patch_size = patch_size
        self.merge_size = merge_size
        self.max_patches = max_patches
        self.max_side_patches = max_side_patches

    def padded(self, width: int, height: int) -> tuple[int, int]:
        """``(height, width)`` of the resized and padded image."""
        if width < 1 or height < 1:
            raise SampleError(
                "empty_image", f"image size {width}x{height}: both sides must be at least 1 pixel"
            )
        p = self.patch_size
        patches = max(1.0, height // p) * max(1.0, width // p)
        limit = self.max_side_patches * p
        scale = min(1.0, math.sqrt(self.max_patches / patches), limit / height, limit / width)
        h = min(max(1, int(height * scale)), limit)
        w = min(max(1, int(width * scale)), limit)
        factor = self.merge_size * p
        return (factor - h % factor) % factor + h, (factor - w % factor) % factor + w

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        """``image_grid_thw`` of one image."""
        h, w = self.padded(width, height)
        return 1, h // self.patch_size, w // self.patch_size

    @sized
    def visual_tokens(self, width: int, height: int) -> int:
        t, h, w = self.grid(width, height)
        return t * (h // self.merge_size) * (w // self.merge_size)

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any]) -> Any:
        return np.arange(len(input_ids), dtype=np.int64)  # 1-D rope

    def reported_settings(self, preparer: object) -> dict[str, int | bool]:
        return {}  # no preparer of its samples to report on

    def preparer(self, tokenizer: Any = None, image_processor: Any = None, **config: Any) -> Any:
        raise VLMError(
            "Kimi-VL samples are not prepared by longpack (Bridge's kimi collate runs the checkpoint's processor); "
            "use longpack for visual token counts"
        )
