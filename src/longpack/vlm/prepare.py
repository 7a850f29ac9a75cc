"""Prepared VLM sequences: one sample -> the exact post-processor token row, labels, loss mask and pixel tensors.

A :class:`QwenVLPreparer` holds a longpack tokenizer (the built-in ``qwen3`` has Qwen-VL's vision tokens at the
Qwen2-VL ids: ``<|vision_start|>`` 151652, ``<|image_pad|>`` 151655, ``<|video_pad|>`` 151656) and a real
transformers Qwen-VL image processor. :meth:`QwenVLPreparer.prepare` renders the conversation (one pad per
image), runs the processor on the decoded images, expands every ``<|image_pad|>`` to
``prod(image_grid_thw) // merge_size**2`` copies, and builds the row Megatron-Bridge's
``prepare_qwen_vl_sequence`` (``models/qwen_vl/data/collate_fn.py``) builds:

- ``input_ids`` (int64 ``[L]``), ``attention_mask`` (ones), ``position_ids`` (``arange(L)``);
- ``labels``: ``input_ids`` shifted left by one, ``-100`` at the end, on Bridge's skipped vision/ChatML tokens
  and wherever the shifted loss mask is 0;
- ``loss_mask`` (float32): the assistant mask shifted left by one. Assistant ownership is ``longpack.text``'s
  (content through ``<|im_end|>``) plus the newline after ``<|im_end|>``, as Bridge's Qwen-VL end marker
  ``<|im_end|>\\n`` is supervised; Bridge's skipped tokens (``<|im_start|>``, vision start/end/pad tokens) are 0;
- ``visual_values``: ``pixel_values`` (float32 ``[patches, 3 * temporal_patch * patch**2]``),
  ``image_grid_thw`` (int64 ``[images, 3]``), and for videos (decoded with PyAV, frames sampled as the family's
  video processor samples them, :mod:`longpack.vlm.video`) ``pixel_values_videos``, ``video_grid_thw`` and
  (Qwen2-VL, Qwen2.5-VL video files) ``second_per_grid_ts`` (float32 ``[videos]``). A Qwen3-VL video's pad
  becomes, per temporal grid, ``<t seconds>`` then ``<|vision_start|>``, its pads and ``<|vision_end|>``
  (``Qwen3VLProcessor.replace_video_token``); transformers 5.24 keeps the template's outer
  ``<|vision_start|>`` / ``<|vision_end|>`` around them, 5.25 drops them (the installed version decides,
  or ``VLMConfig.transformers_version``; :mod:`longpack.vlm.hf_versions`);

plus what Bridge's row does not carry: ``mrope_position_ids`` (int64 ``[3, L]``, Qwen-VL's 3-D rope index of
this sequence alone, :mod:`longpack.vlm.rope`) and the visual token count.

Limits are applied before any pixel is decoded where the header allows it, each refusal counted by reason in
:attr:`QwenVLPreparer.stats`: ``max_images``; ``max_visual_tokens`` (from image sizes alone); images that
cannot be decoded (file or key and the decoder's reason); ``max_length`` (tokens after expansion, aligned to
``pad_to_multiple_of``, against the pack size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from longpack._optional import require
from longpack.errors import ConfigError
from longpack.text.tokenizers import Tokenizer, as_tokenizer
from longpack.topology import align_up
from longpack.vlm.chat import CHAT_TEMPLATES, media_sources, normalize_conversation, render_ids
from longpack.vlm.errors import REJECT_REASONS, SampleError, SampleRejected, VLMError
from longpack.vlm.hf_versions import (
    checked_version,
    parse_version,
    require_behaviour,
    transformers_behaviour,
)
from longpack.vlm.rope import mrope_position_ids
from longpack.vlm.video import (
    VideoConfig,
    VideoInfo,
    default_video_config,
    frame_list_grid,
    is_frame_list,
    processor_pixel_values,
    qwen3_frame_timestamps,
    qwen3_sample_frame_indices,
    qwen3_timestamp_text,
    qwen3_video_grid_thw,
    read_frame_list,
    read_video,
    sample_frame_indices,
    seconds_per_grid,
    video_grid_thw,
    video_info,
    video_pixel_values,
)
from longpack.vlm.vision import (
    VisionConfig,
    decode_image,
    grid_token_count,
    image_grid_thw,
    image_size,
)

IGNORE_INDEX = -100
# Megatron-Bridge's Qwen token list of ids never trained on (``data/token_utils.py`` QWEN_TOKENS), where the
# tokenizer has them.
VLM_SKIPPED_TOKEN_TEXTS: tuple[str, ...] = (
    "<|im_start|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
)
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISUAL_KEYS: tuple[str, ...] = (
    "pixel_values",
    "pixel_values_videos",
    "image_grid_thw",
    "video_grid_thw",
    "second_per_grid_ts",
)
_EXAMPLES_KEPT = 20


@dataclass(frozen=True, kw_only=True)
class VLMConfig:
    """How samples become prepared sequences. Limits are ``None`` to disable; Bridge's Qwen-VL encoder
    defaults are ``max_images=10`` and ``max_visual_tokens=16384``.

    >>> VLMConfig(max_length=4096, pad_to_multiple_of=8).pad_to_multiple_of
    8
    >>> VLMConfig(max_visual_tokens=0)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: VLMConfig.max_visual_tokens must be a positive integer or None, got 0
    """

    vision: VisionConfig | None = None  # None: read from the image processor
    # None: the family's video processor defaults (VideoConfig(): Qwen2VLVideoProcessor; Qwen3-VL: QWEN3_VL_VIDEO)
    video: VideoConfig | None = None
    chat_template: str = "qwen2_vl"
    media_first: bool = False
    max_images: int | None = 10
    max_visual_tokens: int | None = 16384
    max_length: int | None = None
    pad_to_multiple_of: int = 1
    supervise_turn_newline: bool = True
    # None: the installed transformers' (longpack.vlm.hf_versions); else the version the training job runs
    transformers_version: str | None = None

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        if self.transformers_version is not None:
            checked_version(str(self.transformers_version))
        for name in ("max_images", "max_visual_tokens", "max_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(
                    f"VLMConfig.{name} must be a positive integer or None, got {value!r}", fields=name
                )
        m = self.pad_to_multiple_of
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigError(
                f"VLMConfig.pad_to_multiple_of must be an integer >= 1, got {m!r}",
                fields="pad_to_multiple_of",
            )
        if self.chat_template not in CHAT_TEMPLATES:
            raise ConfigError(
                f"VLMConfig.chat_template={self.chat_template!r} is not one of {CHAT_TEMPLATES}",
                fields="chat_template",
            )

    def refuse_images(self, key: str, n_images: int) -> None:
        """Raise ``SampleRejected(key, "too_many_images")`` past ``max_images`` (every family's limit).

        >>> VLMConfig(max_images=2).refuse_images("k", 3)
        Traceback (most recent call last):
        ...
        longpack.vlm.errors.SampleRejected: sample k: 3 images > max_images=2
        """
        if self.max_images is not None and n_images > self.max_images:
            raise SampleRejected(key, "too_many_images", f"{n_images} images > max_images={self.max_images}")

    def refuse_visual_tokens(self, key: str, visual: int) -> None:
        """Raise ``SampleRejected(key, "visual_tokens")`` past ``max_visual_tokens`` (every family's limit)."""
        if self.max_visual_tokens is not None and visual > self.max_visual_tokens:
            raise SampleRejected(
                key, "visual_tokens", f"{visual} visual tokens > max_visual_tokens={self.max_visual_tokens}"
            )


@dataclass(kw_only=True)
class VLMStats:
    """Counts of one preparer (they cross worker processes only through the batches that carry them).

    >>> s = VLMStats(); s.count_rejected(SampleRejected("k", "too_long", "x")); s.rejected["too_long"], s.skipped
    (1, 1)
    """

    prepared: int = 0
    tokens: int = 0
    visual_tokens: int = 0
    images: int = 0
    videos: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    examples: list[str] = field(default_factory=list)  # the first messages of rejected samples

    @property
    def skipped(self) -> int:
        """Samples refused by a limit (all reasons)."""
        return sum(self.rejected.values())

    def count_rejected(self, exc: SampleRejected) -> None:
        self.rejected[exc.reason] += 1
        if len(self.examples) < _EXAMPLES_KEPT:
            self.examples.append(str(exc))

    def as_dict(self) -> dict[str, Any]:
        return {
            "prepared": self.prepared,
            "skipped": self.skipped,
            "rejected": dict(self.rejected),
            "tokens": self.tokens,
            "visual_tokens": self.visual_tokens,
            "images": self.images,
            "videos": self.videos,
            "examples": list(self.examples),
        }


@dataclass
class PreparedSequence:
    """One processed, unpadded VLM sequence: Bridge's ``QwenVLPreparedSequence`` (``row``, ``visual_values``)
    plus its 3-D positions and counts. Tensors are torch CPU tensors."""

    key: str
    row: dict[str, Any]
    visual_values: dict[str, Any]
    mrope_position_ids: Any  # None for families with 1-D positions (Gemma3-VL)
    visual_tokens: int
    # the id a packed row's gaps get (Bridge: 0 for Qwen-VL, the tokenizer's pad id for Gemma3-VL)
    pad_token_id: int = 0

    @property
    def sequence_length(self) -> int:
        """Tokens after image-pad expansion (the packed length before alignment)."""
        return int(self.row["input_ids"].numel())

    @property
    def nbytes(self) -> int:
        """Host memory of the tensors (what a packing buffer holds per candidate sample)."""
        tensors = [*self.row.values(), *self.visual_values.values(), self.mrope_position_ids]
        return int(sum(t.element_size() * t.numel() for t in tensors if t is not None))


@dataclass(frozen=True)
class SampleLength:
    """What :meth:`QwenVLPreparer.length` computes from metadata: the exact token count after expansion,
    the visual tokens, the image grids and the host memory the prepared sequence will take."""

    tokens: int
    visual_tokens: int
    image_grids: tuple[tuple[int, int, int], ...]
    prepared_nbytes: int
    video_grids: tuple[tuple[int, int, int], ...] = ()


def prepared_nbytes(
    tokens: int,
    image_grids: Sequence[Sequence[int]],
    vision: VisionConfig,
    video_grids: Sequence[Sequence[int]] = (),
    *,
    timed_videos: bool = True,
) -> int:
    """Host bytes of a prepared sequence: the five int64/float32 row tensors, the 3-D positions, float32
    ``pixel_values`` / ``pixel_values_videos`` (``3 * temporal_patch * patch**2`` values per patch), int64
    grids and float32 ``second_per_grid_ts`` (unless ``timed_videos`` is false: frame lists carry none).

    >>> prepared_nbytes(100, [(1, 4, 4)], VisionConfig()), prepared_nbytes(100, [], VisionConfig(), [(1, 4, 4)])
    (81288, 81292)
    """
    row = tokens * (8 + 8 + 8 + 8 + 4)  # input_ids, attention_mask, position_ids, labels, loss_mask
    rope = 3 * tokens * 8
    patch_values = 3 * vision.temporal_patch_size * vision.patch_size**2
    patches = sum(int(t) * int(h) * int(w) for t, h, w in (*image_grids, *video_grids))
    seconds = 4 * len(video_grids) if timed_videos else 0
    return row + rope + patches * patch_values * 4 + 3 * 8 * (len(image_grids) + len(video_grids)) + seconds


class QwenVLPreparer:
    """Prepare Qwen-VL samples (see the module docstring).

    ``tokenizer``: a longpack tokenizer or spec (``"qwen3"``, a Qwen-VL tokenizer folder); ``image_processor``:
    a transformers Qwen-VL image processor (default ``Qwen2VLImageProcessor()``, built offline) for images;
    video pixels are made as the family's video processor makes them (its resize, rescale, mean / std and patch
    layout: :func:`longpack.vlm.video.processor_pixel_values`, settings in ``VLMConfig.video``). A sample is a
    mapping with ``messages`` or ``conversations`` and optional ``images`` / ``videos`` (see :func:`longpack.vlm.chat.normalize_conversation`) and an optional ``__key__``.
    """

    #: Rows of a prepared sequence's positions: ``QwenVLFamily.position_dims`` (3-D multimodal rope).
    position_dims: ClassVar[int] = 3

    def __init__(
        self,
        tokenizer: str | Tokenizer | Any = "qwen3",
        image_processor: Any = None,
        *,
        config: VLMConfig | None = None,
    ) -> None:
        self.config = config or VLMConfig()
        # the transformers whose processors these sequences follow (refused outside the supported range)
        self.transformers_version = checked_version(self.config.transformers_version)
        self.tokenizer = as_tokenizer(tokenizer)
        # Without a processor but with VLMConfig(vision=...), lengths (metadata only) need no transformers;
        # the default processor is built on the first prepare().
        if image_processor is None and self.config.vision is None:
            image_processor = default_image_processor()
        self._image_processor = image_processor
        self._processor_name = (
            type(image_processor).__name__ if image_processor is not None else "Qwen2VLImageProcessor"
        )
        self.vision = self.config.vision or VisionConfig.from_image_processor(image_processor)
        self.video = self.config.video or default_video_config(self.vision.rope_variant)
        specials = self.tokenizer.special_tokens
        missing = [t for t in (IMAGE_PAD, VIDEO_PAD) if t not in specials]
        if missing:
            raise VLMError(
                f"tokenizer {self.tokenizer.name} has no {', '.join(missing)} token; use 'qwen3' or a Qwen-VL "
                "tokenizer folder"
            )
        self.image_token_id = specials[IMAGE_PAD]
        self.video_token_id = specials[VIDEO_PAD]
        self.skipped_ids = np.array(
            sorted(specials[t] for t in VLM_SKIPPED_TOKEN_TEXTS if t in specials), dtype=np.int64
        )
        self.im_end_id = specials.get("<|im_end|>")
        newline = self.tokenizer.encode("\n")
        self.newline_id = newline[0] if len(newline) == 1 else None
        self.vision_start_id = specials.get("<|vision_start|>")
        self.vision_end_id = specials.get("<|vision_end|>")
        self.stats = VLMStats()

    @property
    def image_processor(self) -> Any:
        """The image processor (transformers' ``Qwen2VLImageProcessor()`` unless one was given)."""
        if self._image_processor is None:
            # (the patch geometry of this preparer's vision settings: Qwen3-VL's processor has patch 16)
            self._image_processor = default_image_processor(self.vision)
        return self._image_processor

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes rebuild a built-in or file tokenizer from its spec (not megabytes of BPE ranks).
        state = dict(self.__dict__)
        state["tokenizer"] = self.tokenizer.portable()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state["tokenizer"] = as_tokenizer(state["tokenizer"])
        self.__dict__.update(state)

    def identity(self) -> dict[str, Any]:
        """What decides the prepared sequences (stored with loader states): tokenizer identity, the
        transformers minor version whose processors they follow, vision and preparation settings."""
        from dataclasses import asdict

        version = self.transformers_version
        return {
            "tokenizer": self.tokenizer.identity(),
            "transformers": None if version is None else "{}.{}".format(*parse_version(version)),
            "image_processor": self._processor_name,
            "vision": asdict(self.vision),
            "video": asdict(self.video),
            "config": {k: v for k, v in asdict(self.config).items() if k != "vision"},
        }

    # ------------------------------------------------------------------ metadata only
    def _messages(self, sample: Mapping[str, Any]) -> list[dict[str, Any]]:
        return normalize_conversation(sample, media_first=self.config.media_first)

    def length(
        self,
        sample: Mapping[str, Any],
        *,
        key: str | None = None,
        image_sizes: Sequence[tuple[int, int]] | None = None,
    ) -> SampleLength:
        """Exact token count after expansion without decoding any pixel: image sizes from ``image_sizes``
        (``(width, height)`` per image, e.g. from a metadata column) or from each image file's header.
        Raises :class:`SampleRejected` (naming the key) for a problem of the sample (an unreadable header, an
        image the processor refuses, placeholders that do not match the images); limits are not applied here."""
        key = _key(sample, key)
        try:
            return self._length(sample, key, image_sizes)
        except SampleError as exc:
            raise exc.named(key) from None

    def _length(
        self, sample: Mapping[str, Any], key: str, image_sizes: Sequence[tuple[int, int]] | None
    ) -> SampleLength:
        messages = self._messages(sample)
        images, videos = media_sources(messages)
        vgrids = tuple(self._video_grid(src, key) for src in videos)
        if image_sizes is None:
            image_sizes = [image_size(src, key=key) for src in images]
        if len(image_sizes) != len(images):
            raise SampleRejected(
                key, "placeholder_mismatch", f"{len(image_sizes)} image sizes for {len(images)} images"
            )
        grids = tuple(image_grid_thw(int(w), int(h), self.vision) for w, h in image_sizes)
        ids, _ = render_ids(messages, self.tokenizer, chat_template=self.config.chat_template)
        visual = grid_token_count((*grids, *vgrids), self.vision.merge_size)
        tokens = len(ids) - len(grids) - len(vgrids) + visual
        timed = not any(is_frame_list(v) for v in videos)
        if self.vision.rope_variant == "qwen3_vl" and videos:  # timestamps and per-frame start/end tokens
            timed = False
            tokens = len(ids) - len(grids) - len(vgrids) + grid_token_count(grids, self.vision.merge_size)
            tokens += sum(len(self._qwen3_video_ids(src, key)) for src in videos)
            array = np.asarray(ids, dtype=np.int64)
            tokens -= len(self._dropped_video_wrappers(array, np.flatnonzero(array == self.video_token_id)))
        return SampleLength(
            tokens,
            visual,
            grids,
            prepared_nbytes(tokens, grids, self.vision, vgrids, timed_videos=timed),
            vgrids,
        )

    def _qwen3_video(self, source: Any, key: str) -> tuple[tuple[int, int, int], Any, list[float], VideoInfo]:
        """A Qwen3-VL video's ``(grid_thw, sampled frame indices, seconds per temporal grid, header)`` from its
        container header (no frame decoded); a frame list has no frame rate for the timestamps: refused."""
        if is_frame_list(source):
            raise SampleRejected(
                key,
                "unsupported_video",
                "a video given as a frame list, but Qwen3-VL's processor writes each frame group's time into "
                "the text and a frame list has no frame rate (give the video file instead)",
            )
        info = video_info(source, key=key)
        try:
            keep = qwen3_sample_frame_indices(info.frames, info.fps, self.video)
            grid = qwen3_video_grid_thw(len(keep), info.width, info.height, self.vision, self.video)
        except SampleError as exc:
            raise SampleRejected(key, exc.reason, f"video: {exc.detail}") from None
        seconds = qwen3_frame_timestamps(keep, info.fps, self.vision.temporal_patch_size)
        return grid, keep, seconds, info

    @property
    def qwen3_video_outer_wrapper(self) -> bool:
        """Whether Qwen3-VL's processor keeps the chat template's outer ``<|vision_start|>`` /
        ``<|vision_end|>`` around a video's frame groups (transformers 5.24) or drops them (5.25); see
        :mod:`longpack.vlm.hf_versions`."""
        found = transformers_behaviour(self.config.transformers_version)
        return require_behaviour(
            found, "the text Qwen3-VL's processor writes for a video"
        ).qwen3_video_outer_wrapper

    def _dropped_video_wrappers(self, ids: np.ndarray, video_at: np.ndarray) -> np.ndarray:
        """Indices of the outer ``<|vision_start|>`` / ``<|vision_end|>`` around each video pad that the
        installed Qwen3-VL processor drops (none for transformers 5.24)."""
        if not len(video_at) or self.qwen3_video_outer_wrapper:
            return np.zeros(0, dtype=np.int64)
        dropped = [
            (int(at) - 1, int(at) + 1)
            for at in video_at
            if 0 < at < len(ids) - 1
            and ids[at - 1] == self.vision_start_id
            and ids[at + 1] == self.vision_end_id
        ]
        return np.asarray([i for pair in dropped for i in pair], dtype=np.int64)

    def _qwen3_video_ids(self, source: Any, key: str) -> Any:
        """The ids Qwen3-VL's processor puts in place of a video's ``<|video_pad|>`` (transformers 5.24 and
        5.25 ``Qwen3VLProcessor.replace_video_token``): per temporal grid ``<t seconds>`` then
        ``<|vision_start|>``, the grid's ``h * w / merge**2`` pads and ``<|vision_end|>``."""
        start, end = self.vision_start_id, self.vision_end_id
        if start is None or end is None:
            raise VLMError(
                f"tokenizer {self.tokenizer.name} has no <|vision_start|> / <|vision_end|> token, which Qwen3-VL "
                "writes around every video frame group; use 'qwen3' or a Qwen-VL tokenizer folder"
            )
        grid, _, seconds, _ = self._qwen3_video(source, key)
        per_frame = grid[1] * grid[2] // self.vision.merge_size**2
        pieces: list[int] = []
        for t in seconds:
            pieces += self.tokenizer.encode(qwen3_timestamp_text(t))
            pieces += [int(start), *[self.video_token_id] * per_frame, int(end)]
        return np.asarray(pieces, dtype=np.int64)

    def _video_grid(self, source: Any, key: str) -> tuple[int, int, int]:
        """A video's ``grid_thw`` from its container header (no frame decoded)."""
        if self.vision.rope_variant == "qwen3_vl":
            return self._qwen3_video(source, key)[0]
        if is_frame_list(source):
            return frame_list_grid(source, self.vision, self.video, key=key)
        info = video_info(source, key=key)
        try:
            n = len(
                sample_frame_indices(
                    info.frames, info.fps, self.video, temporal_patch_size=self.vision.temporal_patch_size
                )
            )
        except SampleRejected as exc:
            raise SampleRejected(key, exc.reason, f"video: {exc.detail}") from None
        return video_grid_thw(n, info.width, info.height, self.vision, self.video)

    def measure(
        self,
        sample: Mapping[str, Any],
        *,
        key: str | None = None,
        image_sizes: Sequence[tuple[int, int]] | None = None,
    ) -> SampleLength:
        """:meth:`length` with the limits applied as :meth:`prepare` applies them (``max_images``,
        ``max_visual_tokens``, ``max_length`` aligned to ``pad_to_multiple_of``), still without decoding a
        pixel: a refusal raises :class:`SampleRejected`, counted in :attr:`stats`. What a packer that decodes
        only selected samples (deferred decoding) holds per candidate: the length, not the pixels."""
        key = _key(sample, key)
        cfg = self.config
        try:
            if cfg.max_images is not None:
                cfg.refuse_images(key, len(media_sources(self._messages(sample))[0]))
            length = self.length(sample, key=key, image_sizes=image_sizes)
            cfg.refuse_visual_tokens(key, length.visual_tokens)
            if (
                cfg.max_length is not None
                and align_up(length.tokens, cfg.pad_to_multiple_of) > cfg.max_length
            ):
                raise SampleRejected(
                    key,
                    "too_long",
                    f"{length.tokens} tokens after expanding {length.visual_tokens} visual tokens (aligned to "
                    f"{cfg.pad_to_multiple_of}: {align_up(length.tokens, cfg.pad_to_multiple_of)}) > "
                    f"max_length={cfg.max_length}",
                )
        except SampleError as exc:
            rejected = exc.named(key)
            self.stats.count_rejected(rejected)
            raise rejected from None
        return length

    # ------------------------------------------------------------------ full preparation
    def try_prepare(self, sample: Mapping[str, Any], *, key: str | None = None) -> PreparedSequence | None:
        """:meth:`prepare`, but a limit's refusal is counted in :attr:`stats` and returns ``None``."""
        try:
            return self.prepare(sample, key=key)
        except SampleRejected:
            return None

    def prepare(self, sample: Mapping[str, Any], *, key: str | None = None) -> PreparedSequence:
        """The prepared sequence of one sample. A limit's refusal or a problem of the sample (see
        :data:`~longpack.vlm.errors.REJECT_REASONS`) raises :class:`SampleRejected` naming the key, counted in
        :attr:`stats`; a setting that fails for every sample raises :class:`VLMError`."""
        key = _key(sample, key)
        try:
            return self._prepare(sample, key)
        except SampleError as exc:
            rejected = exc.named(key)
            self.stats.count_rejected(rejected)
            raise rejected from None

    def _prepare(self, sample: Mapping[str, Any], key: str) -> PreparedSequence:
        import torch

        cfg, vision = self.config, self.vision
        messages = self._messages(sample)
        images, videos = media_sources(messages)
        cfg.refuse_images(key, len(images))
        # Visual tokens from the headers, before any pixel is decoded.
        sizes = [image_size(src, key=key) for src in images]
        grids = [image_grid_thw(w, h, vision) for w, h in sizes]
        vgrids = [self._video_grid(src, key) for src in videos]
        predicted = grid_token_count([*grids, *vgrids], vision.merge_size)
        cfg.refuse_visual_tokens(key, predicted)
        ids_list, spans = render_ids(messages, self.tokenizer, chat_template=cfg.chat_template)
        ids = np.asarray(ids_list, dtype=np.int64)
        owned = np.zeros(len(ids), dtype=np.float32)
        for i, j, _ in spans:
            owned[i:j] = 1.0
            if (
                cfg.supervise_turn_newline
                and j < len(ids)
                and self.newline_id is not None
                and ids[j] == self.newline_id
                and ids[j - 1] == self.im_end_id
            ):
                owned[j] = 1.0
        visual_values: dict[str, Any] = {}
        counts = np.ones(len(ids), dtype=np.int64)
        image_at = np.flatnonzero(ids == self.image_token_id)
        video_at = np.flatnonzero(ids == self.video_token_id)
        if len(image_at) != len(images) or len(video_at) != len(videos):
            raise SampleRejected(
                key,
                "placeholder_mismatch",
                f"the rendered text has {len(image_at)} {IMAGE_PAD} and {len(video_at)} {VIDEO_PAD} "
                f"tokens for {len(images)} images and {len(videos)} videos (does the text spell a pad token?)",
            )
        if images:
            decoded = [decode_image(src, key=key) for src in images]
            out = self._process_images(decoded)
            grid = out["image_grid_thw"].to(torch.int64).reshape(-1, 3)
            if [tuple(int(x) for x in row) for row in grid] != grids:
                raise VLMError(
                    f"sample {key}: the image processor made grids {grid.tolist()} but the resize rule of "
                    f"{vision} gives {[list(g) for g in grids]}; pass VLMConfig(vision=...) matching the processor"
                )
            visual_values["pixel_values"] = out["pixel_values"].contiguous()
            visual_values["image_grid_thw"] = grid
            counts[image_at] = grid.prod(dim=-1).numpy() // vision.merge_size**2
        video_ids: list[Any] = []
        if videos and vision.rope_variant == "qwen3_vl":
            pixels = []
            for src, predicted_grid in zip(videos, vgrids, strict=True):
                _, keep, _, info = self._qwen3_video(src, key)
                frames = read_video(src, self.video, key=key, indices=keep)
                size = (predicted_grid[1] * vision.patch_size, predicted_grid[2] * vision.patch_size)
                try:
                    pixels.append(processor_pixel_values(frames, size, vision, self.video))
                except VLMError as exc:
                    raise VLMError(f"sample {key}: {exc}") from None
                video_ids.append(self._qwen3_video_ids(src, key))
            visual_values["pixel_values_videos"] = torch.cat(pixels).contiguous()
            visual_values["video_grid_thw"] = torch.tensor(vgrids, dtype=torch.int64).reshape(-1, 3)
            counts[video_at] = [len(v) for v in video_ids]
            counts[self._dropped_video_wrappers(ids, video_at)] = 0  # transformers >= 5.25
        elif videos:
            pixels, seconds = [], []
            for src, predicted_grid in zip(videos, vgrids, strict=True):
                if is_frame_list(src):  # Bridge's pre-extracted frames: no rate, no second_per_grid_ts
                    frames = read_frame_list(src, self.video, key=key)
                else:
                    info = video_info(src, key=key)
                    frames = read_video(
                        src, self.video, temporal_patch_size=vision.temporal_patch_size, key=key
                    )
                    seconds.append(
                        seconds_per_grid(len(frames), info.frames, info.fps, vision.temporal_patch_size)
                    )
                try:
                    values, grid_thw = video_pixel_values(frames, vision, self.video)
                except VLMError as exc:
                    raise VLMError(f"sample {key}: {exc}") from None
                if grid_thw != predicted_grid:
                    raise VLMError(
                        f"sample {key}: video frames gave grid {list(grid_thw)} but its header gives "
                        f"{list(predicted_grid)}"
                    )
                pixels.append(values)
            vgrid = torch.tensor(vgrids, dtype=torch.int64).reshape(-1, 3)
            visual_values["pixel_values_videos"] = torch.cat(pixels).contiguous()
            visual_values["video_grid_thw"] = vgrid
            if len(seconds) == len(videos):  # (Bridge's frame lists carry none: it passes no rate)
                visual_values["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
            counts[video_at] = vgrid.prod(dim=-1).numpy() // vision.merge_size**2
        visual = int(counts[image_at].sum() + counts[video_at].sum())
        expanded = np.repeat(ids, counts)
        mask = np.repeat(owned, counts)
        if video_ids:  # Qwen3-VL: each video pad becomes its timestamped frame groups
            starts = np.cumsum(counts) - counts
            for at, inserted in zip(video_at, video_ids, strict=True):
                expanded[starts[at] : starts[at] + len(inserted)] = inserted
            visual = int(counts[image_at].sum()) + grid_token_count(vgrids, vision.merge_size)
        if len(self.skipped_ids):
            mask[np.isin(expanded, self.skipped_ids)] = 0.0
        length = len(expanded)
        if cfg.max_length is not None and align_up(length, cfg.pad_to_multiple_of) > cfg.max_length:
            raise SampleRejected(
                key,
                "too_long",
                f"{length} tokens after expanding {visual} visual tokens (aligned to {cfg.pad_to_multiple_of}: {align_up(length, cfg.pad_to_multiple_of)}) "
                f"> max_length={cfg.max_length}",
            )
        if length < 2:
            raise SampleRejected(key, "malformed", f"{length} token(s); a sequence needs at least 2")
        labels = np.empty(length, dtype=np.int64)
        labels[:-1] = expanded[1:]
        labels[-1] = IGNORE_INDEX
        if len(self.skipped_ids):
            labels[np.isin(labels, self.skipped_ids)] = IGNORE_INDEX
        shifted = np.zeros(length, dtype=np.float32)
        shifted[:-1] = mask[1:]
        labels[shifted == 0] = IGNORE_INDEX
        input_ids = torch.from_numpy(expanded)
        rope = mrope_position_ids(
            expanded,
            visual_values.get("image_grid_thw"),
            visual_values.get("video_grid_thw"),
            visual_values.get("second_per_grid_ts"),
            image_token_id=self.image_token_id,
            video_token_id=self.video_token_id,
            merge_size=vision.merge_size,
            rope_variant=vision.rope_variant,
            tokens_per_second=vision.tokens_per_second,
        )
        stats = self.stats
        stats.prepared += 1
        stats.tokens += length
        stats.visual_tokens += visual
        stats.images += len(images)
        stats.videos += len(videos)
        return PreparedSequence(
            key=key,
            row={
                "input_ids": input_ids,
                "attention_mask": torch.ones(length, dtype=torch.int64),
                "position_ids": torch.arange(length, dtype=torch.int64),
                "labels": torch.from_numpy(labels),
                "loss_mask": torch.from_numpy(shifted),
            },
            visual_values=visual_values,
            mrope_position_ids=torch.from_numpy(rope),
            visual_tokens=visual,
        )

    def _process_images(self, images: list[Any]) -> Any:
        size = {"shortest_edge": self.vision.min_pixels, "longest_edge": self.vision.max_pixels}
        return self.image_processor(images=images, return_tensors="pt", size=size)


def default_image_processor(vision: VisionConfig | None = None) -> Any:
    """transformers' ``Qwen2VLImageProcessor()`` with its default settings (built offline, no download), with
    the patch, merge and temporal patch sizes of ``vision`` when given."""
    transformers = require("transformers", "vlm", purpose="the Qwen-VL image processor")
    if vision is None:
        return transformers.Qwen2VLImageProcessor()
    return transformers.Qwen2VLImageProcessor(
        patch_size=vision.patch_size,
        merge_size=vision.merge_size,
        temporal_patch_size=vision.temporal_patch_size,
    )


def _key(sample: Mapping[str, Any], key: str | None) -> str:
    if key is not None:
        return str(key)
    for name in ("__key__", "key", "id"):
        if isinstance(sample, Mapping) and sample.get(name) is not None:
            return str(sample[name])
    return "?"
