"""Gemma3-VL (visual token counts only): every image is resized to a fixed square (896 px in the released
processor config) and becomes ``mm_tokens_per_image`` (256) soft tokens; with pan and scan, an image whose
aspect ratio reaches ``pan_and_scan_min_ratio_to_activate`` also contributes crops along its long side, each
another 256 tokens. The crop count restates transformers' ``Gemma3ImageProcessor.pan_and_scan``
(``models/gemma3/image_processing_gemma3.py``): ``round(long / short)`` crops, at most ``long // min_crop``,
clamped to ``[2, max_num_crops]``, none when a crop's short side would fall under ``min_crop``.

Samples are not prepared here: Gemma3's rows need its tokenizer and chat template (a download), and
Megatron-Bridge packs them with ``gemma3_vl_collate_fn`` from the processor's own output.

>>> Gemma3Family().visual_tokens(640, 480), Gemma3Family(do_pan_and_scan=True).visual_tokens(1200, 300)
(256, 1280)
"""

from __future__ import annotations

import math
from typing import Any

from longpack.vlm.errors import SampleError, VLMError


class Gemma3Family:
    """Gemma3-VL with the processor settings given (defaults: the released ``Gemma3ImageProcessor``
    config, pan and scan off as in its ``preprocessor_config.json``)."""

    name = "gemma3"
    can_prepare = False
    batch_keys: tuple[str, ...] = ("pixel_values",)

    def __init__(
        self,
        *,
        mm_tokens_per_image: int = 256,
        do_pan_and_scan: bool = False,
        pan_and_scan_min_crop_size: int = 256,
        pan_and_scan_max_num_crops: int = 4,
        pan_and_scan_min_ratio_to_activate: float = 1.2,
    ) -> None:
        self.mm_tokens_per_image = mm_tokens_per_image
        self.do_pan_and_scan = do_pan_and_scan
        self.min_crop = pan_and_scan_min_crop_size
        self.max_crops = pan_and_scan_max_num_crops
        self.min_ratio = pan_and_scan_min_ratio_to_activate

    def crops(self, width: int, height: int) -> int:
        """Pan-and-scan crops of one image (0 when pan and scan is off or does not activate).

        >>> Gemma3Family(do_pan_and_scan=True).crops(1200, 300), Gemma3Family(do_pan_and_scan=True).crops(300, 280)
        (4, 0)
        """
        if width < 1 or height < 1:
            raise SampleError(
                "empty_image", f"image size {width}x{height}: both sides must be at least 1 pixel"
            )
        if not self.do_pan_and_scan:
            return 0
        long, short = max(width, height), min(width, height)
        if long / short < self.min_ratio:
            return 0
        n = math.floor(long / short + 0.5)  # half rounds up
        n = min(long // self.min_crop, n)
        n = min(self.max_crops, max(2, n))
        crop_long, crop_short = math.ceil(long / n), short
        if min(crop_long, crop_short) < self.min_crop:
            return 0
        return n

    def visual_tokens(self, width: int, height: int) -> int:
        return (1 + self.crops(width, height)) * self.mm_tokens_per_image

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any]) -> Any:
        import numpy as np

        return np.arange(len(input_ids), dtype=np.int64)  # 1-D rope: images take plain positions

    def preparer(self, tokenizer: Any = None, image_processor: Any = None, **config: Any) -> Any:
        raise VLMError(
            "Gemma3-VL samples are not prepared by longpack (its rows need Gemma3's tokenizer and chat template); "
            "use Megatron-Bridge's gemma3_vl_collate_fn, and longpack for its visual token counts"
        )
