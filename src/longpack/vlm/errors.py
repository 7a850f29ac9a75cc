"""Errors of the VLM layer: an image that cannot be used, a sample a limit refuses.

All are :class:`longpack.errors.InputError` (exit code 2 in the CLI). A problem caused by one sample (its
image, its conversation, a limit) is a :class:`SampleError` with a machine-readable ``reason`` in
:data:`REJECT_REASONS`; once the sample's key is known it becomes a :class:`SampleRejected`, whose message
names the key. Streaming callers (the Energon encoder, the in-batch collator, ``online-sim --vlm``) skip and
count those per reason instead of hiding them or aborting the sample's neighbours. A plain
:class:`VLMError` is a setting that fails for every sample (a tokenizer without the vision tokens, a
processor whose grids differ from the configured resize rule) and is raised; a video sample of a family
without video input is a refusal of that sample (``unsupported_video``), not a setting:

    >>> e = SampleRejected("s7", "visual_tokens", "1296 visual tokens > max_visual_tokens=1024")
    >>> e.reason, str(e)
    ('visual_tokens', 'sample s7: 1296 visual tokens > max_visual_tokens=1024')
    >>> SampleError("aspect_ratio", "image size 1x300: aspect ratio 300.0 is above 200").named("s8").args[0]
    'sample s8: image size 1x300: aspect ratio 300.0 is above 200'
"""

from __future__ import annotations

from typing import Any

from longpack.errors import InputError

# Why a sample is skipped, as counted by ``VLMStats`` and the packers' ``skipped`` records (one key per cause):
# the limits (visual_tokens, too_many_images, too_long), an image that cannot be read (undecodable), an
# image the processors refuse (aspect_ratio above 200, empty_image with a side of 0 pixels), a video with no
# frame to sample (empty_video), placeholders that do not match the sample's media (placeholder_mismatch),
# and a sample without a usable conversation (malformed). A video that cannot be read is undecodable; a video
# in a sample of a family that takes none (Gemma3-VL), or a Qwen3-VL frame list (no frame rate for its
# timestamps), is unsupported_video: a mixed image/video dataset skips those video samples, not the run.
REJECT_REASONS: tuple[str, ...] = (
    "visual_tokens",
    "too_many_images",
    "too_long",
    "undecodable",
    "aspect_ratio",
    "empty_image",
    "empty_video",
    "placeholder_mismatch",
    "malformed",
    "unsupported_video",
)


class VLMError(InputError):
    """A VLM sample cannot be prepared: bad message structure, a missing image, a processor mismatch."""


class SampleError(VLMError):
    """A problem of one sample (``reason`` in :data:`REJECT_REASONS`), raised where its key is not known."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"reason={reason!r} is not one of {REJECT_REASONS}")
        super().__init__(detail)
        self.reason = reason
        self.detail = detail

    def named(self, key: str) -> SampleRejected:
        """The same problem as a :class:`SampleRejected` of sample ``key``."""
        return SampleRejected(key, self.reason, self.detail)

    def __reduce__(self) -> tuple[type, tuple[str, ...]]:
        return (type(self), (self.reason, self.detail))


class SampleRejected(SampleError):
    """A sample refused by a limit or by a problem of its own (``reason`` in :data:`REJECT_REASONS`); callers
    skip and count it. The message names the sample's key."""

    def __init__(self, key: str, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.args = (f"sample {key}: {detail}",)
        self.key = key

    def named(self, key: str) -> SampleRejected:
        return self

    def __reduce__(self) -> tuple[type, tuple[str, ...]]:
        return (type(self), (self.key, self.reason, self.detail))


def check_image_size(width: Any, height: Any) -> tuple[int, int]:
    """``(width, height)`` as ints, for an image size given as data (a JSONL's ``image_sizes``, a caller of
    a family's ``visual_tokens``): whole numbers of pixels (an integral float such as ``640.0`` is one), at
    least 1. Anything else is a :class:`SampleError`: ``empty_image`` for a side of 0, ``malformed`` for
    NaN, infinity, a fraction, a negative size, a boolean, a string or ``None``.

    >>> check_image_size(640, 480.0)
    (640, 480)
    >>> check_image_size(float("nan"), 480)
    Traceback (most recent call last):
    ...
    longpack.vlm.errors.SampleError: image size nan x 480: width and height must be whole numbers of pixels (>= 1)
    >>> check_image_size(0, 480).reason
    Traceback (most recent call last):
    ...
    longpack.vlm.errors.SampleError: image size 0 x 480: both sides must be at least 1 pixel
    """
    import math
    import numbers

    sides = []
    for value in (width, height):
        whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        integral_float = (
            isinstance(value, numbers.Real)
            and not isinstance(value, bool | numbers.Integral)
            and math.isfinite(float(value))
            and float(value).is_integer()
        )
        if not (whole or integral_float) or int(value) < 0:
            raise SampleError(
                "malformed",
                f"image size {width!r} x {height!r}: width and height must be whole numbers of pixels (>= 1)",
            )
        sides.append(int(value))
    if min(sides) == 0:
        raise SampleError(
            "empty_image", f"image size {width!r} x {height!r}: both sides must be at least 1 pixel"
        )
    return sides[0], sides[1]


def sized(visual_tokens: Any) -> Any:
    """Decorate a family's ``visual_tokens(self, width, height)``: the size is checked first
    (:func:`check_image_size`), so every family refuses NaN, infinity, booleans and fractions alike."""
    import functools

    @functools.wraps(visual_tokens)
    def checked(self: Any, width: Any, height: Any) -> int:
        w, h = check_image_size(width, height)
        return int(visual_tokens(self, w, h))

    return checked
