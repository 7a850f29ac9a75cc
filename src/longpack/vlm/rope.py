"""Qwen-VL's 3-D (mRoPE) position ids of one sequence, computed from its tokens and visual grids alone.

Text tokens get the same position on all three axes (temporal, height, width), counting on from the previous
token. A run of image (or video) pad tokens gets, for its grid ``(t, h, w)`` merged to
``(t, h / merge, w / merge)``: temporal ``start + floor(frame * interval)``, height ``start + row``, width
``start + column`` (row-major over frames, rows, columns); the text after it continues at
``start + max(h, w) / merge``. ``interval`` is 1 for images; for videos it is 1 (Qwen2-VL, Qwen3-VL) or
``tokens_per_second * second_per_grid_ts`` (Qwen2.5-VL); Qwen3-VL numbers each video frame as its own
``(1, h, w)`` grid (timestamps sit between frames). This is transformers' ``get_rope_index`` of
``Qwen2VLModel`` / ``Qwen2_5_VLModel`` / ``Qwen3VLModel`` (5.x) for a single unpadded sequence.

Because the index depends only on one sequence, a packed row's index is the per-sequence indices
concatenated: every packed sequence restarts at 0 (``longpack.runtime.in_batch.build_visual_thd_batch``).

>>> import numpy as np
>>> ids = np.array([5, 9, 9, 9, 9, 6, 7])  # text, a 2x2-token image (grid 1x4x4, merge 2), text
>>> mrope_position_ids(ids, [[1, 4, 4]], image_token_id=9, video_token_id=8, merge_size=2).tolist()
[[0, 1, 1, 1, 1, 3, 4], [0, 1, 1, 2, 2, 3, 4], [0, 1, 2, 1, 2, 3, 4]]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from longpack.vlm.errors import VLMError
from longpack.vlm.vision import ROPE_VARIANTS


def _grids(value: Any) -> list[tuple[int, int, int]]:
    if value is None:
        return []
    array = np.asarray(value, dtype=np.int64).reshape(-1, 3)
    return [(int(t), int(h), int(w)) for t, h, w in array]


def mrope_position_ids(
    input_ids: Any,
    image_grid_thw: Any = None,
    video_grid_thw: Any = None,
    second_per_grid_ts: Sequence[float] | Any = None,
    *,
    image_token_id: int,
    video_token_id: int,
    merge_size: int,
    rope_variant: str = "qwen2_vl",
    tokens_per_second: float = 2.0,
) -> np.ndarray:
    """``int64 [3, L]`` positions of one unpadded sequence (see the module docstring).

    The number of pad tokens of every image/video run must equal its grid's token count; a mismatch (a
    truncated sequence, grids of another sample) is a :class:`~longpack.vlm.errors.VLMError`.
    """
    if rope_variant not in ROPE_VARIANTS:
        raise VLMError(f"rope_variant={rope_variant!r} is not one of {ROPE_VARIANTS}")
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    kind = np.zeros(len(ids), dtype=np.int8)
    kind[ids == image_token_id] = 1
    kind[ids == video_token_id] = 2
    images = _grids(image_grid_thw)
    videos = _grids(video_grid_thw)
    intervals: list[float] = [1.0] * len(videos)
    if rope_variant == "qwen2_5_vl" and videos:
        seconds = (
            [1.0] * len(videos) if second_per_grid_ts is None else [float(x) for x in second_per_grid_ts]
        )
        intervals = [tokens_per_second * s for s in seconds]
    if rope_variant == "qwen3_vl":  # one (1, h, w) grid per frame
        videos = [(1, h, w) for t, h, w in videos for _ in range(t)]
        intervals = [1.0] * len(videos)
    queues: dict[int, list[tuple[int, int, int]]] = {1: images, 2: videos}
    used = {1: 0, 2: 0}
    out = np.empty((3, len(ids)), dtype=np.int64)
    # Runs of equal kind: [start, stop) boundaries.
    change = np.flatnonzero(np.diff(kind)) + 1
    bounds = [0, *change.tolist(), len(ids)]
    current = 0
    for lo, hi in itertools.pairwise(bounds):
        if hi <= lo:
            continue
        k = int(kind[lo])
        if k == 0:
            out[:, lo:hi] = np.arange(current, current + hi - lo)
            current += hi - lo
            continue
        what = "image" if k == 1 else "video"
        if used[k] >= len(queues[k]):
            raise VLMError(
                f"the sequence has more {what} token runs than {what}_grid_thw rows ({len(queues[k])}); "
                "pass the grids of this sequence"
            )
        index = used[k]
        t, h, w = queues[k][index]
        used[k] += 1
        gt, gh, gw = t, h // merge_size, w // merge_size
        if gt * gh * gw != hi - lo:
            raise VLMError(
                f"{what} {index}: {hi - lo} pad tokens but its grid {t}x{h}x{w} (merge {merge_size}) needs "
                f"{gt * gh * gw}; the sequence and its grids do not belong together (truncated?)"
            )
        interval = intervals[index] if k == 2 else 1.0
        temporal = (np.arange(gt, dtype=np.float64) * interval).astype(np.int64) + current
        block = np.empty((3, gt, gh, gw), dtype=np.int64)
        block[0] = temporal[:, None, None]
        block[1] = (np.arange(gh) + current)[None, :, None]
        block[2] = (np.arange(gw) + current)[None, None, :]
        out[:, lo:hi] = block.reshape(3, -1)
        current += max(h, w) // merge_size
    for k, what in ((1, "image"), (2, "video")):
        if used[k] != len(queues[k]):
            raise VLMError(
                f"{len(queues[k])} {what} grids but {used[k]} {what} token runs in the sequence; the sequence "
                "and its grids do not belong together"
            )
    return out
