"""Visual token counts from image sizes alone, and image decoding with reasons.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL processors resize every image so both sides are multiples of
``factor = patch_size * merge_size`` and the pixel count lies in ``[min_pixels, max_pixels]`` (transformers'
``smart_resize`` in ``models/qwen2_vl/image_processing_qwen2_vl.py``), cut it into ``patch_size`` patches
(``image_grid_thw = [1, H / patch, W / patch]``) and merge ``merge_size x merge_size`` patches into one LLM
token. So an image's token count is a function of its width and height, which an image file's header gives
without decoding the pixels: packing plans, ``sweep`` and ``online-sim`` can work on VLM metadata.

>>> config = VisionConfig()  # transformers' Qwen2VLImageProcessor() defaults: patch 14, merge 2
>>> smart_resize(300, 500, factor=28, min_pixels=config.min_pixels, max_pixels=config.max_pixels)
(308, 504)
>>> image_grid_thw(500, 300, config), visual_token_count(500, 300, config)  # width 500, height 300
((1, 22, 36), 198)
"""

from __future__ import annotations

import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longpack.errors import ConfigError
from longpack.vlm.errors import SampleError, SampleRejected

ROPE_VARIANTS: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# Largest aspect ratio the processors accept (they raise ValueError past it).
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """The vision settings that decide token counts and 3-D positions. Defaults: transformers'
    ``Qwen2VLImageProcessor()`` (patch 14, merge 2, temporal patch 2, ``min_pixels = 56*56``,
    ``max_pixels = 28*28*1280``) and the Qwen2-VL rope index. Megatron-Bridge's Qwen-VL recipes pass
    ``min_pixels=200704`` (256 * 28 * 28) and ``max_pixels=1003520``; Qwen3-VL uses patch 16.

    ``rope_variant`` picks the 3-D position rule (``qwen2_vl``; ``qwen2_5_vl`` spaces video frames by
    ``tokens_per_second * second_per_grid_ts``; ``qwen3_vl`` numbers every video frame as its own grid).

    >>> VisionConfig(patch_size=16).factor
    32
    >>> VisionConfig(min_pixels=0)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: VisionConfig.min_pixels must be a positive integer, got 0
    """

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    rope_variant: str = "qwen2_vl"
    tokens_per_second: float = 2.0

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"VisionConfig.{name} must be a positive integer, got {value!r}", fields=name
                )
        if self.min_pixels > self.max_pixels:
            raise ConfigError(
                f"VisionConfig.min_pixels={self.min_pixels} > max_pixels={self.max_pixels}",
                fields="min_pixels",
            )
        if self.rope_variant not in ROPE_VARIANTS:
            raise ConfigError(
                f"VisionConfig.rope_variant={self.rope_variant!r} is not one of {ROPE_VARIANTS}",
                fields="rope_variant",
            )
        if not (isinstance(self.tokens_per_second, int | float) and self.tokens_per_second > 0):
            raise ConfigError(
                f"VisionConfig.tokens_per_second must be > 0, got {self.tokens_per_second!r}",
                fields="tokens_per_second",
            )

    @property
    def factor(self) -> int:
        """Side multiple of a resized image: ``patch_size * merge_size``."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_image_processor(cls, processor: Any, **overrides: Any) -> VisionConfig:
        """The settings of a transformers Qwen-VL image processor (4.x ``min_pixels``/``max_pixels``
        attributes or 5.x ``size = {shortest_edge, longest_edge}``), with ``overrides`` on top."""
        size: Any = getattr(processor, "size", None)

        def get(key: str) -> Any:
            return size.get(key) if isinstance(size, dict) else getattr(size, key, None)

        min_pixels = getattr(processor, "min_pixels", None) or get("shortest_edge")
        max_pixels = getattr(processor, "max_pixels", None) or get("longest_edge")
        if min_pixels is None or max_pixels is None:
            raise ConfigError(
                f"{type(processor).__name__} has no min_pixels/max_pixels (nor size shortest_edge/longest_edge); "
                "is it a Qwen-VL image processor?"
            )
        values: dict[str, Any] = {
            "patch_size": int(processor.patch_size),
            "merge_size": int(processor.merge_size),
            "temporal_patch_size": int(processor.temporal_patch_size),
            "min_pixels": int(min_pixels),
            "max_pixels": int(max_pixels),
        }
        values.update(overrides)
        return cls(**values)


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """``(resized_height, resized_width)``: multiples of ``factor``, pixel count in ``[min_pixels, max_pixels]``,
    aspect ratio kept as closely as the multiples allow (the Qwen-VL processors' rule).

    >>> smart_resize(1080, 1920, factor=28, min_pixels=3136, max_pixels=1003520)
    (728, 1316)
    >>> smart_resize(10, 10, factor=28, min_pixels=3136, max_pixels=1003520)
    (56, 56)
    """
    if height < 1 or width < 1:
        raise SampleError("empty_image", f"image size {width}x{height}: both sides must be at least 1 pixel")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise SampleError(
            "aspect_ratio",
            f"image size {width}x{height}: aspect ratio {max(height, width) / min(height, width):.1f} is above "
            f"{MAX_ASPECT_RATIO}, which the Qwen-VL processors refuse",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_grid_thw(width: int, height: int, config: VisionConfig) -> tuple[int, int, int]:
    """``(1, grid_h, grid_w)`` in patches, as the processor's ``image_grid_thw`` row for this image.

    >>> image_grid_thw(640, 480, VisionConfig())
    (1, 34, 46)
    """
    h, w = smart_resize(
        height, width, factor=config.factor, min_pixels=config.min_pixels, max_pixels=config.max_pixels
    )
    return 1, h // config.patch_size, w // config.patch_size


def visual_token_count(width: int, height: int, config: VisionConfig) -> int:
    """LLM tokens of one image: ``prod(image_grid_thw) // merge_size**2``.

    >>> visual_token_count(640, 480, VisionConfig()), visual_token_count(640, 480, VisionConfig(patch_size=16))
    (391, 300)
    """
    t, h, w = image_grid_thw(width, height, config)
    return t * h * w // config.merge_size**2


def grid_token_count(grid_thw: Any, merge_size: int) -> int:
    """Sum of ``prod(row) // merge_size**2`` over ``[n, 3]`` grid rows (images or videos).

    >>> grid_token_count([[1, 34, 46], [2, 4, 4]], 2)
    399
    """
    total = 0
    for row in grid_thw:
        t, h, w = (int(x) for x in row)
        total += t * h * w // merge_size**2
    return total


ImageSource = Any  # PIL.Image.Image | numpy array (H, W[, C]) | bytes | str | os.PathLike


def _describe(source: ImageSource) -> str:
    if isinstance(source, str | os.PathLike):
        return str(source)
    if isinstance(source, bytes | bytearray | memoryview):
        return f"<{len(source)} encoded bytes>"
    return f"<{type(source).__name__}>"


def _reason(exc: BaseException) -> str:
    """The decoder's message without the in-memory buffer's address (so the same file gives the same text)."""
    return f"{type(exc).__name__}: " + re.sub(r" <_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(exc))


def is_empty_media(source: Any) -> bool:
    """Whether an image or video source holds no bytes at all: empty encoded bytes, or a file of 0 bytes
    (refused as ``empty_image`` / ``empty_video``, as the docs say, not as ``undecodable``).

    >>> is_empty_media(b""), is_empty_media(b"x"), is_empty_media("/no/such/file")
    (True, False, False)
    """
    if isinstance(source, bytes | bytearray | memoryview):
        return len(source) == 0
    if isinstance(source, str | os.PathLike):
        try:
            return Path(source).is_file() and Path(source).stat().st_size == 0
        except OSError:
            return False
    return False


def _decoder_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises for a file that is not an image, or one too large to decode safely (a
    decompression bomb: more pixels than ``PIL.Image.MAX_IMAGE_PIXELS`` allows)."""
    from PIL import Image, UnidentifiedImageError

    return (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError)


def image_size(source: ImageSource, *, key: str = "?") -> tuple[int, int]:
    """``(width, height)`` of an image, read from its header when it is a file or encoded bytes (no pixels
    are decoded). A file that is not an image raises :class:`SampleRejected` (reason ``undecodable``).

    >>> image_size(b"not an image", key="s3")
    Traceback (most recent call last):
    ...
    longpack.vlm.errors.SampleRejected: sample s3: image <12 encoded bytes> cannot be read (UnidentifiedImageError: cannot identify image file)
    """
    if hasattr(source, "size") and hasattr(source, "mode"):  # a PIL image
        return int(source.size[0]), int(source.size[1])
    if hasattr(source, "shape") and hasattr(source, "dtype"):  # an array, (H, W[, C])
        shape = tuple(source.shape)
        if len(shape) not in (2, 3):
            raise SampleRejected(key, "undecodable", f"image array of shape {shape} is not (H, W[, C])")
        return int(shape[1]), int(shape[0])
    from PIL import Image

    if is_empty_media(source):
        raise SampleRejected(key, "empty_image", f"image {_describe(source)} is empty (0 bytes)")
    try:
        if isinstance(source, bytes | bytearray | memoryview):
            with Image.open(io.BytesIO(bytes(source))) as im:
                return int(im.size[0]), int(im.size[1])
        if isinstance(source, str | os.PathLike):
            with Image.open(Path(source)) as im:
                return int(im.size[0]), int(im.size[1])
    except _decoder_errors() as exc:
        raise SampleRejected(
            key, "undecodable", f"image {_describe(source)} cannot be read ({_reason(exc)})"
        ) from None
    raise SampleRejected(key, "undecodable", f"cannot use an image of type {type(source).__name__}")


def decode_image(source: ImageSource, *, key: str = "?") -> Any:
    """The image as an RGB ``PIL.Image`` (decoded now); failures raise :class:`SampleRejected`
    (reason ``undecodable``) naming the file or key and the decoder's reason.

    >>> import numpy as np
    >>> decode_image(np.zeros((4, 6, 3), dtype=np.uint8)).size
    (6, 4)
    """
    from PIL import Image

    if is_empty_media(source):
        raise SampleRejected(key, "empty_image", f"image {_describe(source)} is empty (0 bytes)")
    refused: tuple[type[BaseException], ...] = (*_decoder_errors(), TypeError)
    try:
        if isinstance(source, Image.Image):
            image = source
        elif hasattr(source, "shape") and hasattr(source, "dtype"):
            import numpy as np

            array = np.asarray(source)
            if array.dtype != np.uint8:
                raise SampleRejected(
                    key, "undecodable", f"image array has dtype {array.dtype}; pass uint8 (H, W[, C]) pixels"
                )
            image = Image.fromarray(array)
        elif isinstance(source, bytes | bytearray | memoryview):
            image = Image.open(io.BytesIO(bytes(source)))
        elif isinstance(source, str | os.PathLike):
            image = Image.open(Path(source))
        else:
            raise SampleRejected(key, "undecodable", f"cannot use an image of type {type(source).__name__}")
        image.load()
        return image.convert("RGB") if image.mode != "RGB" else image
    except SampleRejected:
        raise
    except refused as exc:
        raise SampleRejected(
            key, "undecodable", f"image {_describe(source)} cannot be decoded ({_reason(exc)})"
        ) from None
