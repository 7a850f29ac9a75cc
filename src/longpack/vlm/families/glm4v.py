"""GLM-4.1V / GLM-4.5V: visual token counts from image sizes, the 3-D rope positions of a sequence, and the
packed batch Megatron-Bridge's GLM-VL collate builds.

Sources (transformers 5.24 ``models/glm4v``, Megatron-Bridge ``models/glm_vl/data/collate_fn.py``):

- **Resize** (``Glm4vImageProcessor`` with its defaults: 14 px patches, 2 x 2 merge, temporal patch 2,
  ``size = {shortest_edge: 112 * 112, longest_edge: 28 * 28 * 15000}``): an image is a clip of
  ``temporal_patch_size`` frames; sides under 28 px are scaled up to 28 first; an aspect ratio over 200 is
  refused; each side is rounded to a multiple of 28, and the frames x area is brought inside the pixel limits
  by a common scale (floored to 28 when too large, ceiled when too small). An image costs
  ``(h / 14) * (w / 14) / 4`` tokens.
- **Positions** (``Glm4vModel.get_rope_index``): runs of equal ``mm_token_type_ids`` (text 0, image 1,
  video 2); text advances all three axes together; an image of grid ``(t, h, w)`` takes
  ``(start + t', start + h', start + w')`` over its merged grid and moves the start by ``max(h, w) / 2``;
  a video is split into one grid per frame first.
- **Packed batch** (``glm4v_collate_fn(enable_in_batch_packing=True)``): each row keeps the processor's 1-D
  positions (``arange``; the model computes the 3-D ones from ``mm_token_type_ids``), rows are concatenated by
  ``build_mcore_thd_sequence_batch_from_rows`` with ``mm_token_type_ids`` padded with 0 (restated by
  :func:`longpack.runtime.in_batch.build_glm4v_thd_batch`), and
  ``visual_inputs`` holds ``pixel_values``, ``image_grid_thw`` (video keys when present) and the packed
  ``mm_token_type_ids``. Bridge's collate also runs the processor and chat template itself, so longpack does
  not prepare GLM samples (``can_prepare`` is false): it counts tokens for planning and restates the packing.

>>> f = Glm4vFamily()
>>> f.grid(640, 480), f.visual_tokens(640, 480), f.visual_tokens(1920, 1080)
((1, 34, 46), 391, 2691)
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from longpack.vlm.errors import SampleError, VLMError, sized

# ``Glm4vConfig`` defaults (transformers 5.24 ``configuration_glm4v.py``): ``<|image|>``, ``<|video|>``,
# ``<|begin_of_video|>``, ``<|end_of_video|>``.
IMAGE_TOKEN_ID, VIDEO_TOKEN_ID = 151343, 151344
VIDEO_START_ID, VIDEO_END_ID = 151341, 151342
# Bridge's ``THW_GRID_VISUAL_KEYS`` plus the token types its GLM collate adds to ``visual_inputs``.
BATCH_KEYS: tuple[str, ...] = (
    "pixel_values",
    "pixel_values_videos",
    "image_grid_thw",
    "video_grid_thw",
    "mm_token_type_ids",
)


class Glm4vFamily:
    """GLM-4.1V / GLM-4.5V with ``Glm4vImageProcessor``'s default settings (override any of them)."""

    name = "glm4v"
    can_prepare = False
    batch_keys: tuple[str, ...] = BATCH_KEYS
    position_dims = 3
    config_fields: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        patch_size: int = 14,
        merge_size: int = 2,
        temporal_patch_size: int = 2,
        min_pixels: int = 112 * 112,
        max_pixels: int = 28 * 28 * 15000,
    ) -> None:
        self.patch_size = patch_size
        self.merge_size = merge_size
        self.temporal_patch_size = temporal_patch_size
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """``(height, width)`` the processor resizes a ``width`` x ``height`` image to.

        >>> Glm4vFamily().resized(20, 3000)
        (4200, 28)
        """
        if width < 1 or height < 1:
            raise SampleError(
                "empty_image", f"image size {width}x{height}: both sides must be at least 1 pixel"
            )
        factor, frames = self.patch_size * self.merge_size, self.temporal_patch_size
        if height < factor or width < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        if max(height, width) / min(height, width) > 200:
            raise SampleError(
                "aspect_ratio",
                f"image size {width}x{height}: aspect ratio {max(height, width) / min(height, width):.1f} "
                "is over 200 (GLM-4V's processor refuses it)",
            )
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        t_bar = round(frames / self.temporal_patch_size) * self.temporal_patch_size
        if t_bar * h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(frames * height * width / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif t_bar * h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (frames * height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        """``image_grid_thw`` of one image (patches, before the merge)."""
        h, w = self.resized(width, height)
        return 1, h // self.patch_size, w // self.patch_size

    @sized
    def visual_tokens(self, width: int, height: int) -> int:
        t, h, w = self.grid(width, height)
        return t * h * w // self.merge_size**2

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any]) -> Any:
        """``[3, L]`` positions of one unpadded sequence; ``visual_values`` has ``image_grid_thw`` /
        ``video_grid_thw`` and optionally ``mm_token_type_ids`` (else made from the ids as the processor makes
        them, :func:`mm_token_type_ids`: video frames are image tokens between ``<|begin_of_video|>`` and
        ``<|end_of_video|>``).

        >>> ids = [1, 2] + [IMAGE_TOKEN_ID] * 4 + [3]
        >>> Glm4vFamily().position_ids(ids, {"image_grid_thw": [[1, 4, 4]]}).tolist()
        [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]
        """
        ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
        types = visual_values.get("mm_token_type_ids")
        types = mm_token_type_ids(ids) if types is None else np.asarray(types, dtype=np.int64).reshape(-1)
        if types.shape != ids.shape:
            raise SampleError(
                "malformed", f"mm_token_type_ids has {types.size} entries for {ids.size} tokens"
            )
        grids: dict[int, list[tuple[int, int, int]]] = {1: [], 2: []}
        for key, kind in (("image_grid_thw", 1), ("video_grid_thw", 2)):
            value = visual_values.get(key)
            for t, h, w in (
                np.asarray(value if value is not None else [], dtype=np.int64).reshape(-1, 3).tolist()
            ):
                grids[kind] += [(1, h, w)] * (t if kind == 2 else 1)  # a video: one grid per frame
        pending = {kind: iter(g) for kind, g in grids.items()}
        m, pieces, current = self.merge_size, [], 0
        for kind, run in itertools.groupby(types.tolist()):
            n = len(list(run))
            if kind == 0:
                pieces.append(np.broadcast_to(np.arange(n) + current, (3, n)))
                current += n
                continue
            grid = next(pending[kind], None)
            if grid is None:
                raise SampleError(
                    "placeholder_mismatch", f"more {('image', 'video')[kind - 1]} runs than grids"
                )
            t, h, w = grid[0], grid[1] // m, grid[2] // m
            if t * h * w != n:
                raise SampleError(
                    "placeholder_mismatch", f"a run of {n} visual tokens for a {t}x{h}x{w} grid"
                )
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            pieces.append(np.stack([tt, hh, ww]).reshape(3, -1) + current)
            current += max(h, w)
        if any(next(it, None) is not None for it in pending.values()):
            raise SampleError("placeholder_mismatch", "more image/video grids than visual-token runs")
        return np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), dtype=np.int64)

    def reported_settings(self, preparer: object) -> dict[str, int | bool]:
        return {}  # no preparer of its samples to report on

    def preparer(self, tokenizer: Any = None, image_processor: Any = None, **config: Any) -> Any:
        raise VLMError(
            "GLM-4V samples are not prepared by longpack (Bridge's glm4v_collate_fn runs the processor and chat "
            "template itself); use longpack for visual token counts, position_ids and longpack.runtime.in_batch.build_glm4v_thd_batch"
        )


def mm_token_type_ids(
    input_ids: Any,
    *,
    image_token_id: int = IMAGE_TOKEN_ID,
    video_start_id: int = VIDEO_START_ID,
    video_end_id: int = VIDEO_END_ID,
) -> np.ndarray:
    """Text 0, image 1, video 2 per token, as ``Glm4vProcessor.create_mm_token_type_ids`` makes them (transformers
    5.24 / 5.25 ``processing_glm4v.py``): the processor writes every video frame with the image token, so an
    image token is video (2) where more ``<|begin_of_video|>`` than ``<|end_of_video|>`` precede it, else
    image (1); every other token is 0.

    >>> ids = [5, IMAGE_TOKEN_ID, VIDEO_START_ID, IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, 7, VIDEO_END_ID, IMAGE_TOKEN_ID]
    >>> mm_token_type_ids(ids).tolist()
    [0, 1, 0, 2, 2, 0, 0, 1]
    """
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    in_video = np.cumsum(ids == video_start_id) > np.cumsum(ids == video_end_id)
    image = ids == image_token_id
    return np.where(image & in_video, 2, np.where(image, 1, 0)).astype(np.int64)
