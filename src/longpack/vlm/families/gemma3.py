"""Gemma3-VL: visual token counts from image sizes, prepared samples and packed batches as Megatron-Bridge's
``gemma3_vl_collate_fn(enable_in_batch_packing=True)`` (``models/gemma_vl/data/collate_fn.py``) builds them.

Token counts: every image is resized to a fixed square (896 px in the released processor config) and becomes
``mm_tokens_per_image`` (256, the processor's ``image_seq_length``) soft tokens; with pan and scan, an image
whose aspect ratio reaches ``pan_and_scan_min_ratio_to_activate`` also contributes crops along its long side,
each another 256 tokens. The crop count restates transformers' ``Gemma3ImageProcessor.pan_and_scan``
(``models/gemma3/image_processing_gemma3.py``): ``round(long / short)`` crops, at most ``long // min_crop``,
clamped to ``[2, max_num_crops]``, none when a crop's short side would fall under ``min_crop``.

Text expansion (transformers' ``Gemma3Processor``): the chat template puts one ``<start_of_image>`` per image;
the processor replaces it by ``"\\n\\n<start_of_image>" + 256 x "<image_soft_token>" + "<end_of_image>\\n\\n"``,
and with crops by ``"Here is the original image " + that + " and here are some crops to help you see better "``
followed by one such sequence per crop, joined by spaces. :meth:`Gemma3Preparer.length` tokenizes exactly that
text, so lengths are exact without decoding a pixel.

Rows (Bridge's in-batch branch, restated): ``input_ids`` and ``attention_mask`` from
``processor.apply_chat_template`` of the one sample; ``position_ids = arange(L)`` (Gemma3 uses plain 1-D rope:
image tokens take ordinary positions); the unshifted loss mask is 1 on each model turn's content and its
``<end_of_turn>`` (Bridge's boundary markers ``<start_of_turn>model\\n`` ... ``<end_of_turn>``), 0 on Bridge's
skipped tokens (:data:`BRIDGE_SKIPPED_TOKENS` present in the tokenizer's added tokens); labels are the ids
shifted left, ``-100`` at the end, on skipped tokens and where the shifted mask is 0. ``pixel_values`` is
cast to bfloat16 per sample, as Bridge does; the processor's ``token_type_ids`` are not carried (Bridge's
packed branch drops them).

Bidirectional image attention: Gemma3 lets the soft tokens of one image attend to each other both ways.
Bridge's Gemma3-VL model (``models/gemma_vl/modeling_gemma3_vl.py``) derives those blocks from ``input_ids``
alone (each run of consecutive image tokens is one block) and adds them to a causal bias over the whole
row. A packed row keeps every image's run inside its own sequence (runs are bounded by ``<start_of_image>`` /
``<end_of_image>``, which are not image tokens), so the blocks are the same packed or not; what the bias
does not separate is one sequence from the next, which the THD boundaries (``cu_seqlens``) do.

>>> Gemma3Family().visual_tokens(640, 480), Gemma3Family(do_pan_and_scan=True).visual_tokens(1200, 300)
(256, 1280)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from longpack.topology import align_up
from longpack.vlm.chat import media_sources, normalize_conversation
from longpack.vlm.errors import SampleError, SampleRejected, VLMError, sized
from longpack.vlm.hf_versions import checked_version
from longpack.vlm.prepare import (
    IGNORE_INDEX,
    VLM_SKIPPED_TOKEN_TEXTS,
    PreparedSequence,
    SampleLength,
    VLMConfig,
    VLMStats,
    _key,
)

# Megatron-Bridge's token texts never trained on (``data/token_utils.py`` PAD_TOKENS, one set for every model:
# the Qwen list of ``longpack.vlm.prepare`` and the LLaVA, Llama, Gemma and Gemma-3n ones); those a tokenizer
# has among its added tokens are skipped.
BRIDGE_SKIPPED_TOKENS: frozenset[str] = frozenset(VLM_SKIPPED_TOKEN_TEXTS) | {
    "<image>", "<pad>",
    "<|begin_of_text|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|python_tag|>", "<|image|>",
    "<image_soft_token>", "<audio_soft_token>", "<start_of_audio>", "<start_of_image>", "<end_of_audio>",
    "<end_of_image>",
}  # fmt: skip
# Bridge's Gemma assistant boundaries (``data/conversation_processing.py`` infer_assistant_mask_boundary_config).
ASSISTANT_START, ASSISTANT_END = "<start_of_turn>model\n", "<end_of_turn>"
BATCH_KEYS: tuple[str, ...] = ("pixel_values",)
# transformers' Gemma3Processor call defaults (pan and scan off; crops of at least 256 px, at most 4, from an
# aspect ratio of 1.2).
_PAN_AND_SCAN_DEFAULTS: dict[str, Any] = {
    "do_pan_and_scan": False,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


class Gemma3Family:
    """Gemma3-VL with the processor settings given (defaults: the released ``Gemma3ImageProcessor``
    config, pan and scan off as in its ``preprocessor_config.json``)."""

    name = "gemma3"
    can_prepare = True
    batch_keys: tuple[str, ...] = BATCH_KEYS
    position_dims = 1
    config_fields: tuple[str, ...] = ("max_images", "max_visual_tokens")

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

    @classmethod
    def from_processor(cls, processor: Any, **overrides: Any) -> Gemma3Family:
        """The family a ``Gemma3Processor`` call gives: its ``image_seq_length`` and the pan-and-scan settings
        of its call defaults (the processor class's ``images_kwargs``, which take precedence over the image
        processor's own attributes in transformers 5: pan and scan is off unless a call asks for it, and
        Bridge's collate does not), with ``overrides`` (the settings this preparer passes to every call)."""
        defaults = {**_PAN_AND_SCAN_DEFAULTS, **dict(getattr(processor, "images_kwargs", None) or {})}
        settings = {k: defaults[k] for k in _PAN_AND_SCAN_DEFAULTS} | overrides
        return cls(mm_tokens_per_image=int(processor.image_seq_length), **settings)

    def processor_kwargs(self) -> dict[str, Any]:
        """The pan-and-scan settings as ``Gemma3Processor`` call keywords."""
        return {
            "do_pan_and_scan": self.do_pan_and_scan,
            "pan_and_scan_min_crop_size": self.min_crop,
            "pan_and_scan_max_num_crops": self.max_crops,
            "pan_and_scan_min_ratio_to_activate": self.min_ratio,
        }

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

    @sized
    def visual_tokens(self, width: int, height: int) -> int:
        return (1 + self.crops(width, height)) * self.mm_tokens_per_image

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any]) -> Any:
        return np.arange(len(input_ids), dtype=np.int64)  # 1-D rope: images take plain positions

    def reported_settings(self, preparer: Gemma3Preparer) -> dict[str, int | bool]:
        return {
            "tokens_per_image": preparer.family.mm_tokens_per_image,
            "pan_and_scan": preparer.family.do_pan_and_scan,
        }

    def preparer(
        self, tokenizer: Any = None, image_processor: Any = None, *, processor: Any = None, **config: Any
    ) -> Gemma3Preparer:
        """A :class:`Gemma3Preparer`: ``processor`` (a transformers ``Gemma3Processor``); or ``tokenizer`` a
        local folder holding a saved ``Gemma3Processor`` (read offline); or ``tokenizer`` a transformers
        tokenizer with Gemma3's ``boi``/``eoi``/image tokens and chat template, with ``image_processor``
        (default ``Gemma3ImageProcessor``). ``config``: :class:`~longpack.vlm.VLMConfig` limits."""
        import os

        if processor is None:
            if tokenizer is None or (
                isinstance(tokenizer, str | os.PathLike) and not os.path.isdir(tokenizer)
            ):
                raise VLMError(
                    "Gemma3-VL preparation needs a transformers Gemma3Processor (processor=), a folder with a "
                    f"saved Gemma3Processor or a Gemma3 tokenizer object (tokenizer=), got {tokenizer!r}"
                )
            from longpack._optional import require

            transformers = require("transformers", "vlm", purpose="the Gemma3 processor")
        if processor is None and isinstance(tokenizer, str | os.PathLike):
            try:
                processor = transformers.Gemma3Processor.from_pretrained(
                    str(tokenizer), local_files_only=True
                )
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                raise VLMError(
                    f"{tokenizer}: not a saved Gemma3Processor folder ({type(exc).__name__}: {exc})"
                ) from None
        if processor is None:
            if image_processor is None:
                image_processor = transformers.Gemma3ImageProcessor(
                    do_pan_and_scan=self.do_pan_and_scan,
                    pan_and_scan_min_crop_size=self.min_crop,
                    pan_and_scan_max_num_crops=self.max_crops,
                    pan_and_scan_min_ratio_to_activate=self.min_ratio,
                )
            processor = transformers.Gemma3Processor(
                image_processor=image_processor,
                tokenizer=tokenizer,
                chat_template=getattr(tokenizer, "chat_template", None),
                image_seq_length=self.mm_tokens_per_image,
            )
        return Gemma3Preparer(processor, family=self, config=VLMConfig(**config))


class Gemma3Preparer:
    """Prepare Gemma3-VL samples with a transformers ``Gemma3Processor`` (see the module docstring). Samples
    are the forms :func:`longpack.vlm.chat.normalize_conversation` reads; limits are ``config``'s
    (``max_images``, ``max_visual_tokens``, ``max_length`` aligned to ``pad_to_multiple_of``), each refusal a
    :class:`~longpack.vlm.SampleRejected` naming the key, counted in :attr:`stats`."""

    position_dims: ClassVar[int] = Gemma3Family.position_dims

    def __init__(
        self, processor: Any, *, family: Gemma3Family | None = None, config: VLMConfig | None = None
    ) -> None:
        self.processor = processor
        self.config = config or VLMConfig()
        # the transformers whose Gemma3Processor runs here (refused outside the supported range)
        self.transformers_version = checked_version(self.config.transformers_version)
        self.family = family or Gemma3Family.from_processor(processor)
        if self.family.mm_tokens_per_image != int(processor.image_seq_length):
            raise VLMError(
                f"Gemma3 family has {self.family.mm_tokens_per_image} tokens per image but the processor's "
                f"image_seq_length is {processor.image_seq_length}"
            )
        tok = processor.tokenizer
        self.tokenizer = tok
        self.image_token_id = int(tok.image_token_id)
        if tok.pad_token is None:  # Bridge falls back to eos for padding
            tok.pad_token = tok.eos_token
        self.pad_token_id = int(getattr(tok, "pad_token_id", 0) or 0)
        self.skipped_ids = np.array(
            sorted({int(i) for i, t in tok.added_tokens_decoder.items() if str(t) in BRIDGE_SKIPPED_TOKENS}),
            dtype=np.int64,
        )
        self.start_ids = tok.encode(ASSISTANT_START, add_special_tokens=False)
        self.end_ids = tok.encode(ASSISTANT_END, add_special_tokens=False)
        self.stats = VLMStats()

    def identity(self) -> dict[str, Any]:
        """What decides the prepared sequences (stored with Energon loader states and compared on restore):
        the tokenizer (name, size, hashes of its vocabulary and chat template), the image processor's
        settings, tokens per image, pan and scan, and the preparation limits."""
        import dataclasses
        import hashlib
        import json

        tok = self.tokenizer
        vocab = json.dumps(sorted(tok.get_vocab().items(), key=lambda kv: kv[1]), ensure_ascii=False)
        template = self.processor.chat_template or getattr(tok, "chat_template", None) or ""
        image_processor = self.processor.image_processor
        return {
            "family": self.family.name,
            "tokenizer": {
                "name_or_path": str(getattr(tok, "name_or_path", "")),
                "vocab_size": len(tok),
                "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
                "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest(),
            },
            # plain JSON values (an enum setting such as ``resample`` must not reach a pickled loader state)
            "image_processor": {
                "class": type(image_processor).__name__,
                **json.loads(json.dumps(image_processor.to_dict(), sort_keys=True, default=str)),
            },
            "image_seq_length": self.family.mm_tokens_per_image,
            "pan_and_scan": self.family.processor_kwargs(),
            "config": {k: v for k, v in dataclasses.asdict(self.config).items() if k != "vision"},
        }

    # ------------------------------------------------------------------ text and lengths
    def _conversation(self, sample: Mapping[str, Any], key: str) -> tuple[list[dict[str, Any]], list[Any]]:
        messages = normalize_conversation(sample, media_first=self.config.media_first)
        images, videos = media_sources(messages)
        if videos:
            raise SampleRejected(
                key,
                "unsupported_video",
                f"{len(videos)} video(s), but Gemma3-VL has no video input (use qwen2_vl / qwen2_5_vl / "
                "qwen3_vl for video, or drop the video samples)",
            )
        return messages, images

    @staticmethod
    def _hf_conversation(messages: Sequence[Mapping[str, Any]], images: Sequence[Any] | None) -> list[Any]:
        """The conversation in the processor's form (image parts carry decoded images when given)."""
        it = iter(images or ())
        out = []
        for m in messages:
            parts: list[dict[str, Any]] = []
            for p in m["content"]:
                if p["type"] == "image":
                    parts.append({"type": "image", "image": next(it)} if images else {"type": "image"})
                else:
                    parts.append({"type": "text", "text": p["text"]})
            out.append({"role": m["role"], "content": parts})
        return out

    def _limits(self, key: str, n_images: int, visual: int, tokens: int | None) -> None:
        cfg = self.config
        cfg.refuse_images(key, n_images)
        cfg.refuse_visual_tokens(key, visual)
        if tokens is None or cfg.max_length is None:
            return
        if align_up(tokens, cfg.pad_to_multiple_of) > cfg.max_length:
            raise SampleRejected(
                key,
                "too_long",
                f"{tokens} tokens after expanding {visual} visual tokens (aligned to {cfg.pad_to_multiple_of}: "
                f"{align_up(tokens, cfg.pad_to_multiple_of)}) > max_length={cfg.max_length}",
            )

    def expanded_text(self, text: str, crops: Sequence[int]) -> str:
        """``text`` with its ``<start_of_image>`` placeholders replaced as ``Gemma3Processor`` replaces
        them (``crops``: pan-and-scan crops per image, in order)."""
        proc = self.processor
        pieces = text.split(proc.boi_token)
        if len(pieces) - 1 != len(crops):
            raise SampleError(
                "placeholder_mismatch",
                f"the rendered text has {len(pieces) - 1} {proc.boi_token} for {len(crops)} images",
            )
        out = [pieces[0]]
        for n, rest in zip(crops, pieces[1:], strict=True):
            full = proc.full_image_sequence
            if n:
                full = (
                    f"Here is the original image {full} and here are some crops to help you see better "
                    + " ".join([full] * n)
                )
            out.append(full)
            out.append(rest)
        return "".join(out)

    def length(
        self,
        sample: Mapping[str, Any],
        *,
        key: str | None = None,
        image_sizes: Sequence[tuple[int, int]] | None = None,
    ) -> SampleLength:
        """Exact token count after expansion, without decoding a pixel (sizes from ``image_sizes`` or the
        image headers); limits are not applied. ``image_grids`` is empty (Gemma3 has no grids)."""
        from longpack.vlm.vision import image_size

        key = _key(sample, key)
        try:
            messages, images = self._conversation(sample, key)
            sizes = image_sizes if image_sizes is not None else [image_size(s, key=key) for s in images]
            if len(sizes) != len(images):
                raise SampleError(
                    "placeholder_mismatch", f"{len(sizes)} image sizes for {len(images)} images"
                )
            crops = [self.family.crops(int(w), int(h)) for w, h in sizes]
            text = self.processor.apply_chat_template(self._hf_conversation(messages, None), tokenize=False)
            ids = self.tokenizer(self.expanded_text(text, crops), add_special_tokens=False)["input_ids"]
        except SampleError as exc:
            raise exc.named(key) from None
        visual = sum((1 + c) * self.family.mm_tokens_per_image for c in crops)
        tokens = len(ids)
        row_bytes = tokens * (8 + 8 + 8 + 8 + 4)
        pixels = sum(1 + c for c in crops) * 3 * _image_side(self.processor) ** 2 * 2  # bfloat16
        return SampleLength(tokens, visual, (), row_bytes + pixels)

    def measure(
        self,
        sample: Mapping[str, Any],
        *,
        key: str | None = None,
        image_sizes: Sequence[tuple[int, int]] | None = None,
    ) -> SampleLength:
        """:meth:`length` with the limits applied (a refusal counted in :attr:`stats`)."""
        key = _key(sample, key)
        try:
            length = self.length(sample, key=key, image_sizes=image_sizes)
            n_images = len(self._conversation(sample, key)[1])
            self._limits(key, n_images, length.visual_tokens, length.tokens)
        except SampleError as exc:
            rejected = exc.named(key)
            self.stats.count_rejected(rejected)
            raise rejected from None
        return length

    # ------------------------------------------------------------------ preparation
    def try_prepare(self, sample: Mapping[str, Any], *, key: str | None = None) -> PreparedSequence | None:
        """:meth:`prepare`, but a refusal is counted and returns ``None``."""
        try:
            return self.prepare(sample, key=key)
        except SampleRejected:
            return None

    def prepare(self, sample: Mapping[str, Any], *, key: str | None = None) -> PreparedSequence:
        """The prepared sequence of one sample (``mrope_position_ids`` is ``None``: 1-D positions)."""
        key = _key(sample, key)
        try:
            return self._prepare(sample, key)
        except SampleError as exc:
            rejected = exc.named(key)
            self.stats.count_rejected(rejected)
            raise rejected from None

    def _prepare(self, sample: Mapping[str, Any], key: str) -> PreparedSequence:
        import torch

        from longpack.vlm.vision import decode_image, image_size

        messages, images = self._conversation(sample, key)
        sizes = [image_size(s, key=key) for s in images]
        predicted = sum(self.family.visual_tokens(w, h) for w, h in sizes)
        self._limits(key, len(images), predicted, None)
        decoded = [decode_image(s, key=key) for s in images]
        out = self.processor.apply_chat_template(
            [self._hf_conversation(messages, decoded)],
            tokenize=True,
            padding=False,
            truncation=True,
            return_tensors="pt",
            return_dict=True,
            **self._call_kwargs(),
        )
        input_ids = out["input_ids"][0].to(torch.int64)
        ids = input_ids.numpy()
        visual = int((ids == self.image_token_id).sum())
        if visual != predicted:
            raise VLMError(
                f"sample {key}: the processor made {visual} image tokens but the family's rule gives {predicted}; "
                "build the family from the processor (Gemma3Family.from_processor)"
            )
        length = len(ids)
        self._limits(key, len(images), visual, length)
        if length < 2:
            raise SampleRejected(key, "malformed", f"{length} token(s); a sequence needs at least 2")
        mask = self.assistant_mask(ids)
        if len(self.skipped_ids):
            mask[np.isin(ids, self.skipped_ids)] = 0.0
        labels = np.empty(length, dtype=np.int64)
        labels[:-1] = ids[1:]
        labels[-1] = IGNORE_INDEX
        if len(self.skipped_ids):
            labels[np.isin(labels, self.skipped_ids)] = IGNORE_INDEX
        shifted = np.zeros(length, dtype=np.float32)
        shifted[:-1] = mask[1:]
        labels[shifted == 0] = IGNORE_INDEX
        attention = out.get("attention_mask")
        visual_values: dict[str, Any] = {}
        if images:
            visual_values["pixel_values"] = out["pixel_values"].to(torch.bfloat16).contiguous()
        stats = self.stats
        stats.prepared += 1
        stats.tokens += length
        stats.visual_tokens += visual
        stats.images += len(images)
        return PreparedSequence(
            key=key,
            row={
                "input_ids": input_ids,
                "attention_mask": attention[0] if attention is not None else torch.ones_like(input_ids),
                "position_ids": torch.arange(length, dtype=torch.int64),
                "labels": torch.from_numpy(labels),
                "loss_mask": torch.from_numpy(shifted),
            },
            visual_values=visual_values,
            mrope_position_ids=None,
            visual_tokens=visual,
            pad_token_id=self.pad_token_id,
        )

    def _call_kwargs(self) -> dict[str, Any]:
        # Bridge's call passes no image settings; pan and scan must be asked for at every call.
        return {"images_kwargs": self.family.processor_kwargs()} if self.family.do_pan_and_scan else {}

    def assistant_mask(self, ids: np.ndarray) -> np.ndarray:
        """Unshifted float32 mask: 1 on every model turn's content and its ``<end_of_turn>``
        (:func:`assistant_boundary_mask` with the Gemma template's markers)."""
        return assistant_boundary_mask(ids, self.start_ids, self.end_ids)


def assistant_boundary_mask(ids: np.ndarray, start_ids: Sequence[int], end_ids: Sequence[int]) -> np.ndarray:
    """Unshifted float32 mask of Bridge's assistant boundary scan (``data/conversation_processing.py``
    ``_assistant_mask_from_boundary_config`` with one loss role, its end marker included): a turn's content
    starts after ``start_ids`` and ends at the first ``end_ids`` before the next ``start_ids``; the content
    and that end marker get 1; a turn without an end marker gets nothing.

    >>> assistant_boundary_mask(np.array([9, 1, 5, 6, 2, 9, 1, 7]), [1], [2]).tolist()
    [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    """
    mask = np.zeros(len(ids), dtype=np.float32)
    starts = _find_all(ids, start_ids)
    for n, s in enumerate(starts):
        content = s + len(start_ids)
        stop = starts[n + 1] if n + 1 < len(starts) else len(ids)
        ends = [e for e in _find_all(ids[content:stop], end_ids) if content + e + len(end_ids) <= stop]
        if not ends:
            continue
        end = content + ends[0]
        mask[content : end + len(end_ids)] = 1.0
    return mask


def _find_all(ids: np.ndarray, pattern: Sequence[int]) -> list[int]:
    """Non-overlapping start positions of ``pattern`` in ``ids``.

    >>> _find_all(np.array([1, 2, 1, 2, 2]), [1, 2])
    [0, 2]
    """
    m = len(pattern)
    out: list[int] = []
    i = 0
    while m and i + m <= len(ids):
        if list(ids[i : i + m]) == list(pattern):
            out.append(i)
            i += m
        else:
            i += 1
    return out


def _image_side(processor: Any) -> int:
    size = getattr(processor.image_processor, "size", None)
    height = size.get("height") if isinstance(size, Mapping) else getattr(size, "height", None)
    return int(height or 896)
