"""Videos for the Qwen-VL families: frames decoded with PyAV (``pip install av``, in the ``vlm`` extra), frame
sampling and token counts as transformers' ``Qwen2VLVideoProcessor`` makes them, from the container header
alone where no pixel is needed.

The processor (``models/qwen2_vl/video_processing_qwen2_vl.py``) samples ``fps`` frames per second of video:
``n = total / video_fps * fps`` clamped to ``[min_frames, min(max_frames, total)]`` (``max_frames`` floored to
a multiple of ``temporal_patch_size`` first) and floored to a multiple of ``temporal_patch_size``; the frame
indices are ``int(i * total / n)``. Every frame is resized by the image rule (:func:`~longpack.vlm.vision.smart_resize`)
with the video pixel limits (``size = {shortest_edge: 128*28*28, longest_edge: 28*28*768}`` by default;
the per-frame cap is off, the processor's default), and ``grid_thw = (ceil(n / temporal_patch), h / patch,
w / patch)``; its LLM tokens are ``prod(grid_thw) // merge_size**2``. Qwen2.5-VL's processor adds
``second_per_grid_ts = temporal_patch_size / sampled_fps`` with ``sampled_fps = n / total * video_fps``
(``processing_qwen2_5_vl.py`` and ``VideoMetadata.sampled_fps`` in ``video_utils.py``).

Pixels: the video processor cuts frame pairs into patches laid out ``(t, h/merge, w/merge, merge, merge,
channel, temporal_patch, patch, patch)`` (its ``patchify``); the image processor lays each image out the same
way with the frame repeated ``temporal_patch`` times. So :func:`video_pixel_values` runs the image processor on
every sampled frame (with the video pixel limits) and takes each group's frames from their own rows: the
video processor's layout and grid, without torchvision (which that processor needs and which has no CPU wheel
here). Its resize is the image processor's (PIL bicubic), so pixels can differ from the torchvision resize by
rounding; grids and token counts are the same rule.

Qwen3-VL (transformers 5.24 ``models/qwen3_vl/video_processing_qwen3_vl.py`` and ``processing_qwen3_vl.py``)
differs: ``n = int(total / video_fps * fps)`` frames clamped to ``[min_frames, min(max_frames, total)]`` at
``linspace(0, total - 1, n)`` rounded (:func:`qwen3_sample_frame_indices`); one size for every frame whose
pixels over all ``n`` frames lie in the video limits (:func:`qwen3_smart_resize`, :data:`QWEN3_VL_VIDEO`: patch
16, merge 2, temporal 2); and the processor writes ``<t seconds>`` (:func:`qwen3_frame_timestamps`, the mean
time of each frame pair) before each temporal grid's vision tokens. Its per-frame pixel cap
(``cap_pixels_per_frame``) is off, the 5.24 default; its pixels are the frames resized (PIL bicubic) to that
size and normalized by the image processor (:func:`resized_frame_pixel_values`).

>>> sample_frame_indices(20, 10.0, VideoConfig()).tolist()  # 2 s at 10 fps -> 4 frames
[0, 5, 10, 15]
>>> video_grid_thw(4, 64, 48, VisionConfig(), VideoConfig()), video_token_count(4, 64, 48, VisionConfig(), VideoConfig())
((2, 20, 28), 280)
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack._optional import require
from longpack.errors import ConfigError
from longpack.vlm.errors import SampleError, SampleRejected, VLMError
from longpack.vlm.vision import VisionConfig, smart_resize

#: transformers ``utils/constants.py``: ``OPENAI_CLIP_MEAN`` / ``OPENAI_CLIP_STD`` (``Qwen2VLVideoProcessor``'s
#: and the Qwen-VL image processors' normalization) and ``IMAGENET_STANDARD_MEAN`` / ``IMAGENET_STANDARD_STD``
#: (``Qwen3VLVideoProcessor``'s).
OPENAI_CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_STANDARD_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)
#: ``VideoProcessorMixin.rescale_factor`` (transformers ``video_processing_utils.py``).
RESCALE_FACTOR = 1 / 255


@dataclass(frozen=True, kw_only=True)
class VideoConfig:
    """Frame sampling, pixel limits and normalization of a video (defaults: transformers'
    ``Qwen2VLVideoProcessor()`` with ``do_sample_frames=True, fps=2``). ``max_num_frames`` applies to
    pre-extracted frame lists only (Bridge's ``QwenVLTaskEncoder.max_num_frames``, 60: it keeps their first
    frames; ``None`` keeps all). ``image_mean`` / ``image_std``: the video processor's (not the image
    processor's: Qwen3-VL's differ)."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 28 * 28 * 768
    max_num_frames: int | None = 60
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    def __post_init__(self) -> None:
        if not (isinstance(self.fps, int | float) and self.fps > 0):
            raise ConfigError(f"VideoConfig.fps must be > 0, got {self.fps!r}", fields="fps")
        for name in ("min_frames", "max_frames", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"VideoConfig.{name} must be a positive integer, got {value!r}", fields=name
                )
        n = self.max_num_frames
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(
                f"VideoConfig.max_num_frames must be a positive integer or None, got {n!r}",
                fields="max_num_frames",
            )
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if not (
                isinstance(value, tuple | list)
                and len(value) == 3
                and all(
                    isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value
                )
                and (name == "image_mean" or all(v > 0 for v in value))
            ):
                raise ConfigError(
                    f"VideoConfig.{name} must be 3 finite numbers (one per RGB channel"
                    f"{', each > 0' if name == 'image_std' else ''}), got {value!r}",
                    fields=name,
                )
            object.__setattr__(self, name, tuple(float(v) for v in value))


@dataclass(frozen=True)
class VideoInfo:
    """What a video container's header says: frame count, frame rate and frame size."""

    frames: int
    fps: float
    width: int
    height: int


def sample_frame_indices(
    total_frames: int, video_fps: float, video: VideoConfig, *, temporal_patch_size: int = 2
) -> np.ndarray:
    """Indices of the frames the processor keeps (see the module docstring); ``int64``."""
    if total_frames < 1 or video_fps <= 0:
        raise SampleRejected("?", "empty_video", f"a video of {total_frames} frames at {video_fps} fps")
    max_frames = math.floor(min(video.max_frames, total_frames) / temporal_patch_size) * temporal_patch_size
    n_float = total_frames / video_fps * video.fps
    n_float = min(max(n_float, video.min_frames), max_frames, total_frames)
    n = math.floor(n_float / temporal_patch_size) * temporal_patch_size
    if n < 1:
        raise SampleRejected(
            "?",
            "empty_video",
            f"a video of {total_frames} frames gives no group of {temporal_patch_size} frames to sample",
        )
    step = total_frames / n
    return np.array([int(i * step) for i in range(n)], dtype=np.int64)


def video_grid_thw(
    n_frames: int, width: int, height: int, vision: VisionConfig, video: VideoConfig
) -> tuple[int, int, int]:
    """``(t, h, w)`` grid of ``n_frames`` sampled frames of ``width`` x ``height`` pixels."""
    h, w = smart_resize(
        height, width, factor=vision.factor, min_pixels=video.min_pixels, max_pixels=video.max_pixels
    )
    t = -(-n_frames // vision.temporal_patch_size)
    return t, h // vision.patch_size, w // vision.patch_size


def video_token_count(
    n_frames: int, width: int, height: int, vision: VisionConfig, video: VideoConfig
) -> int:
    """LLM tokens of a video: ``prod(grid_thw) // merge_size**2``."""
    t, h, w = video_grid_thw(n_frames, width, height, vision, video)
    return t * h * w // vision.merge_size**2


def seconds_per_grid(
    n_frames: int, total_frames: int, video_fps: float, temporal_patch_size: int = 2
) -> float:
    """Qwen2.5-VL's ``second_per_grid_ts`` of a video: ``temporal_patch_size / sampled_fps``.

    >>> seconds_per_grid(4, 20, 10.0)  # 4 of 20 frames at 10 fps: sampled at 2 fps, 2 frames per grid
    1.0
    """
    return temporal_patch_size / (n_frames / total_frames * video_fps)


def video_pixel_values(
    frames: np.ndarray, vision: VisionConfig, video: VideoConfig
) -> tuple[Any, tuple[int, int, int]]:
    """``(pixel_values_videos, grid_thw)`` of sampled ``uint8 [n, H, W, 3]`` frames as
    ``Qwen2VLVideoProcessor`` makes them: each frame resized to the video grid's size
    (:func:`video_grid_thw`), then :func:`processor_pixel_values` (the last frame repeated up to a frame pair)."""
    n = len(frames)
    if n == 0:
        raise SampleRejected("?", "empty_video", "a video with no sampled frame")
    t, gh, gw = video_grid_thw(n, frames.shape[2], frames.shape[1], vision, video)
    pixels = processor_pixel_values(frames, (gh * vision.patch_size, gw * vision.patch_size), vision, video)
    return pixels, (t, gh, gw)


def processor_resize(frames: np.ndarray, size: tuple[int, int]) -> Any:
    """``uint8 [n, 3, height, width]``: the frames resized as the transformers video processors resize them on
    the CPU: ``BaseVideoProcessor.resize`` with ``resample=BICUBIC`` is torchvision's ``resize`` with
    ``antialias=True``, which for a ``uint8`` CPU tensor runs torch's native antialiased bicubic
    ``interpolate`` on the ``uint8`` values (torchvision 0.28 ``transforms/v2/functional/_geometry.py``
    ``resize_image``; no float round trip). A frame already at ``size`` is returned as it is."""
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    if tuple(tensor.shape[-2:]) == tuple(size):
        return tensor.contiguous()
    return torch.nn.functional.interpolate(
        tensor, size=list(size), mode="bicubic", align_corners=False, antialias=True
    )


def processor_pixel_values(
    frames: np.ndarray, size: tuple[int, int], vision: VisionConfig, video: VideoConfig
) -> Any:
    """``pixel_values_videos`` float32 ``[t * h * w, 3 * temporal_patch * patch**2]`` of ``uint8 [n, H, W, 3]``
    frames as ``Qwen2VLVideoProcessor`` / ``Qwen3VLVideoProcessor._preprocess`` make them: resized to ``size =
    (height, width)`` (:func:`processor_resize`), rescaled and normalized in one step with the video processor's
    mean and std (``TorchvisionBackend.rescale_and_normalize``: ``(x - mean / rescale) / (std / rescale)`` in
    float32) and cut by its ``patchify`` (the last frame repeated up to a multiple of ``temporal_patch_size``;
    patches laid out ``(t, h/merge, w/merge, merge, merge, channel, temporal_patch, patch, patch)``)."""
    import torch

    if len(frames) == 0:
        raise SampleRejected("?", "empty_video", "a video with no sampled frame")
    resized = processor_resize(frames, size)
    mean = torch.tensor(video.image_mean) * (1.0 / RESCALE_FACTOR)
    std = torch.tensor(video.image_std) * (1.0 / RESCALE_FACTOR)
    values = resized.to(torch.float32).sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    temporal, p, m = vision.temporal_patch_size, vision.patch_size, vision.merge_size
    if pad := -len(values) % temporal:
        values = torch.cat((values, values[-1:].expand(pad, -1, -1, -1)))
    n, channels, height, width = values.shape
    gt, gh, gw = n // temporal, height // p, width // p
    if gh * p != height or gw * p != width or gh % m or gw % m:
        raise VLMError(
            f"video frames of {width}x{height} pixels are not whole {p * m}-pixel merged patches; the video "
            "resize rule gives multiples of patch_size * merge_size"
        )
    patches = values.reshape(gt, temporal, channels, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gt * gh * gw, channels * temporal * p * p).contiguous()


def is_frame_list(source: Any) -> bool:
    """A video given as its frames (a list of encoded images or arrays), as Megatron-Bridge's Energon video
    samples carry them (pre-extracted, already at the wanted rate), rather than as a video file.

    >>> is_frame_list([b"...", b"..."]), is_frame_list(b"...")
    (True, False)
    """
    return isinstance(source, list | tuple)


def frame_list_grid(
    frames: Any, vision: VisionConfig, video: VideoConfig, *, key: str = "?"
) -> tuple[int, int, int]:
    """``grid_thw`` of a pre-extracted frame list from its first frame's header: Bridge keeps the first
    ``max_num_frames`` frames and runs the video processor with ``do_sample_frames=False`` (every frame kept,
    the last repeated up to a multiple of ``temporal_patch_size``)."""
    from longpack.vlm.vision import image_size

    kept = list(frames)[: video.max_num_frames]
    if not kept:
        raise SampleRejected(key, "empty_video", "a video given as a frame list with no frame")
    width, height = image_size(kept[0], key=key)
    return video_grid_thw(len(kept), width, height, vision, video)


def read_frame_list(frames: Any, video: VideoConfig, *, key: str = "?") -> np.ndarray:
    """The kept frames of a frame list as ``uint8 [n, H, W, 3]`` RGB; frames of different sizes are
    ``undecodable`` (the video processor stacks them)."""
    from longpack.vlm.vision import decode_image

    kept = list(frames)[: video.max_num_frames]
    if not kept:
        raise SampleRejected(key, "empty_video", "a video given as a frame list with no frame")
    arrays = [np.asarray(decode_image(f, key=key)) for f in kept]
    shapes = sorted({a.shape for a in arrays})
    if len(shapes) > 1:
        raise SampleRejected(key, "undecodable", f"video frames of different sizes {shapes[:3]}")
    return np.stack(arrays)


def _av_error() -> type[Exception]:
    """PyAV's base error (its decoding errors are not all ``OSError`` / ``ValueError``)."""
    av = require("av", "vlm", purpose="video decoding (PyAV)")
    return av.FFmpegError  # type: ignore[no-any-return]


def _open(source: Any) -> Any:
    av = require("av", "vlm", purpose="video decoding (PyAV)")
    if isinstance(source, bytes | bytearray | memoryview):
        return av.open(io.BytesIO(bytes(source)))
    if isinstance(source, str | os.PathLike):
        return av.open(str(Path(source)))
    raise TypeError(f"a video is encoded bytes or a file path, not a {type(source).__name__}")


def video_info(source: Any, *, key: str = "?") -> VideoInfo:
    """Frame count, rate and size from the container header (no frame decoded); frames are counted by
    demuxing when the header has no count. A file PyAV cannot open is ``undecodable``, 0 bytes ``empty_video``."""
    if isinstance(source, bytes | bytearray | memoryview) and len(source) == 0:
        raise SampleRejected(key, "empty_video", "video <0 encoded bytes> is empty")
    try:
        with _open(source) as container:
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            frames = int(stream.frames or 0)
            if frames == 0:
                frames = sum(1 for packet in container.demux(stream) if packet.size)
            return VideoInfo(frames, fps, int(stream.codec_context.width), int(stream.codec_context.height))
    except (OSError, IndexError, ValueError, TypeError, _av_error()) as exc:
        raise SampleRejected(
            key, "undecodable", f"video cannot be read ({type(exc).__name__}: {exc})"
        ) from None


def read_video(
    source: Any,
    video: VideoConfig,
    *,
    temporal_patch_size: int = 2,
    key: str = "?",
    indices: np.ndarray | None = None,
) -> np.ndarray:
    """The sampled frames as ``uint8 [n, H, W, 3]`` RGB (decoded with PyAV, in presentation order): those of
    ``indices`` when given (e.g. :func:`qwen3_sample_frame_indices`), else of :func:`sample_frame_indices`."""
    info = video_info(source, key=key)
    try:
        keep = (
            sample_frame_indices(info.frames, info.fps, video, temporal_patch_size=temporal_patch_size)
            if indices is None
            else np.asarray(indices, dtype=np.int64)
        )
    except SampleRejected as exc:
        raise SampleRejected(key, exc.reason, exc.detail) from None
    wanted = set(keep.tolist())
    frames: dict[int, np.ndarray] = {}
    try:
        with _open(source) as container:
            for index, frame in enumerate(container.decode(video=0)):
                if index in wanted:
                    frames[index] = frame.to_ndarray(format="rgb24")
                if index >= int(keep[-1]):
                    break
    except (OSError, ValueError, _av_error()) as exc:
        raise SampleRejected(
            key, "undecodable", f"video cannot be decoded ({type(exc).__name__}: {exc})"
        ) from None
    missing = [i for i in keep.tolist() if i not in frames]
    if missing:
        raise SampleRejected(
            key,
            "undecodable",
            f"video header says {info.frames} frames but frames {missing[:5]} did not decode",
        )
    return np.stack([frames[i] for i in keep.tolist()])


# ---------------------------------------------------------------------------------------------- Qwen3-VL
#: Qwen3-VL's video settings (transformers 5.24 / 5.25 ``Qwen3VLVideoProcessor``): pixel limits ``size``
#: (``shortest_edge`` ``128 * 32 * 32``, ``longest_edge`` ``32 * 32 * 768``; they bound the pixels of all
#: sampled frames together) and ``image_mean`` / ``image_std`` ``IMAGENET_STANDARD_*`` (0.5), not the image
#: processor's CLIP values.
QWEN3_VL_VIDEO = VideoConfig(
    min_pixels=128 * 32 * 32,
    max_pixels=32 * 32 * 768,
    image_mean=IMAGENET_STANDARD_MEAN,
    image_std=IMAGENET_STANDARD_STD,
)


def default_video_config(rope_variant: str) -> VideoConfig:
    """A family's video processor defaults: :data:`QWEN3_VL_VIDEO` for ``qwen3_vl``, else ``VideoConfig()``.

    >>> default_video_config("qwen3_vl").max_pixels, default_video_config("qwen2_vl").max_pixels
    (786432, 602112)
    """
    return QWEN3_VL_VIDEO if rope_variant == "qwen3_vl" else VideoConfig()


def qwen3_sample_frame_indices(total_frames: int, video_fps: float, video: VideoConfig) -> np.ndarray:
    """Frames Qwen3-VL's video processor keeps (transformers 5.24
    ``models/qwen3_vl/video_processing_qwen3_vl.py``, ``Qwen3VLVideoProcessor.sample_frames``):
    ``n = int(total / video_fps * fps)`` clamped to ``[min_frames, min(max_frames, total)]`` (no rounding to
    frame pairs: the last frame is repeated when patching), indices ``linspace(0, total - 1, n)`` rounded.

    >>> qwen3_sample_frame_indices(20, 10.0, QWEN3_VL_VIDEO).tolist()  # 2 s at 10 fps -> 4 frames
    [0, 6, 13, 19]
    """
    if total_frames < 1 or video_fps <= 0:
        raise SampleRejected("?", "empty_video", f"a video of {total_frames} frames at {video_fps} fps")
    n = int(total_frames / video_fps * video.fps)
    n = min(max(n, video.min_frames), video.max_frames, total_frames)
    return np.linspace(0, total_frames - 1, n).round().astype(np.int64)


def qwen3_smart_resize(
    num_frames: int,
    height: int,
    width: int,
    *,
    temporal_factor: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """``(height, width)`` of every frame of a Qwen3-VL video (transformers 5.24
    ``models/qwen3_vl/video_processing_qwen3_vl.py``, ``smart_resize``): sides too small for ``factor`` are
    scaled up first, then multiples of ``factor`` whose pixels over ``round(num_frames / temporal_factor) *
    temporal_factor`` frames lie in ``[min_pixels, max_pixels]`` (the limits bound the whole clip).

    >>> qwen3_smart_resize(4, 48, 64, temporal_factor=2, factor=32, min_pixels=131072, max_pixels=786432)
    (160, 224)
    """
    if num_frames < temporal_factor:
        raise SampleError(
            "empty_video", f"{num_frames} sampled frame(s): Qwen3-VL's video resize needs {temporal_factor}"
        )
    if height < 1 or width < 1:
        raise SampleError("empty_video", f"video frames of {width}x{height} pixels")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise SampleError(
            "aspect_ratio",
            f"video frames of {width}x{height}: aspect ratio {max(height, width) / min(height, width):.1f} is "
            "above 200, which Qwen3-VL's video processor refuses",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen3_video_grid_thw(
    n_frames: int, width: int, height: int, vision: VisionConfig, video: VideoConfig
) -> tuple[int, int, int]:
    """``(t, h, w)`` grid of ``n_frames`` sampled Qwen3-VL frames of ``width`` x ``height`` pixels.

    >>> qwen3_video_grid_thw(4, 64, 48, VisionConfig(patch_size=16), QWEN3_VL_VIDEO)
    (2, 10, 14)
    """
    h, w = qwen3_smart_resize(
        n_frames,
        height,
        width,
        temporal_factor=vision.temporal_patch_size,
        factor=vision.factor,
        min_pixels=video.min_pixels,
        max_pixels=video.max_pixels,
    )
    return -(-n_frames // vision.temporal_patch_size), h // vision.patch_size, w // vision.patch_size


def qwen3_frame_timestamps(indices: Any, video_fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds of every temporal grid of a Qwen3-VL video (transformers 5.24
    ``models/qwen3_vl/processing_qwen3_vl.py``, ``Qwen3VLProcessor._calculate_timestamps``): the indices
    padded with the last one to a multiple of ``temporal_patch_size``, each group's first and last frame time
    averaged.

    >>> qwen3_frame_timestamps([0, 6, 13, 19, 25], 10.0)
    [0.3, 1.6, 2.5]
    """
    seconds = [int(i) / video_fps for i in indices]
    if pad := -len(seconds) % temporal_patch_size:
        seconds += [seconds[-1]] * pad
    step = temporal_patch_size
    return [(seconds[i] + seconds[i + step - 1]) / 2 for i in range(0, len(seconds), step)]


def qwen3_timestamp_text(seconds: float) -> str:
    """The text Qwen3-VL's processor writes before a temporal grid's vision tokens (``replace_video_token``).

    >>> qwen3_timestamp_text(1.25)
    '<1.2 seconds>'
    """
    return f"<{seconds:.1f} seconds>"
