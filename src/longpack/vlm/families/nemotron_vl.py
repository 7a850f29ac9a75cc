"""Nemotron-VL (Nemotron Nano V2 VL): visual token counts from image sizes, the placeholder layout Megatron-
Bridge's collate builds, the packed-row boundaries its training step expands, and :class:`NemotronVLPreparer`
(samples prepared from a local checkpoint folder's tokenizer, chat template and ``config.json``).

Not in transformers 5.24 (its processor is the checkpoint's remote code), so the sources are Megatron's:

- **Tiles** (Megatron-LM ``examples/multimodal/image_processing.py`` ``dynamic_preprocess``, InternVL's
  dynamic tiling): the candidate grids are every ``(cols, rows)`` with ``1 <= cols * rows <= max_num_tiles``;
  the one whose ``cols / rows`` is closest to the image's ``width / height`` wins, a tie going to the later
  (larger) grid when the image's area exceeds half of that grid's pixel area; a grid of more than one tile
  adds a thumbnail tile. Bridge's Nemotron-VL provider (``models/nemotron_vl/nemotron_vl_provider.py``) sets
  512-pixel tiles, ``max_num_tiles=12``; the checkpoint's processor adds the thumbnail.
- **Tokens per tile** (megatron-core ``get_num_image_embeddings``, as ``LLaVAModel`` sizes ``img_seq_len``):
  ``(512 / 16)**2`` patches without a class token, a quarter after pixel shuffle: 256.
- **Collated row** (Bridge ``models/nemotron_vl/data/collate_fn.py`` with ``nemotron_vl_utils.adjust_image_tokens``):
  every ``<img>`` ... ``</img>`` region keeps ``<img>``, one ``<image>`` (id 131072) per tile and ``</img>``; the
  LLaVA model later replaces each ``<image>`` by 256 embeddings, so an image costs ``tiles * 256 + 2``
  positions of the language model; ``num_patches`` becomes one 1 per tile; positions are ``arange``.
- **Packing**: Bridge's Nemotron-VL collate refuses in-batch packing; packed rows (``cu_seqlens`` over the
  collated ids) reach ``training/llava_step.py``, whose ``_expand_packed_metadata_for_visual_embeddings``
  (PR #4874) grows each segment by ``(img_seq_len - 1)`` per ``<image>`` token and clamps the row at the
  language model's ``seq_length`` (tokens past it are cut, not refused). :func:`expand_packed_boundaries`
  restates it; a packer must budget the expanded length, which :meth:`NemotronVLFamily.llm_tokens` gives.

>>> f = NemotronVLFamily()
>>> f.tokens_per_tile, f.tiles(512, 512), f.tiles(1024, 512), f.visual_tokens(1920, 1080)
(256, 1, 3, 2304)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from longpack.vlm.errors import SampleError, VLMError, sized

# Bridge's collate constants (``models/nemotron_vl/data/collate_fn.py``, provider ``image_token_index``).
IMAGE_TOKEN_ID, IMG_START_TOKEN_ID, IMG_END_TOKEN_ID = 131072, 131073, 131074
BATCH_KEYS: tuple[str, ...] = ("pixel_values", "num_patches")


class NemotronVLFamily:
    """Nemotron Nano V2 VL with Bridge's provider settings (512 px tiles of 16 px patches, pixel shuffle, at most
    12 tiles, a thumbnail when tiled)."""

    name = "nemotron_vl"
    can_prepare = False
    batch_keys: tuple[str, ...] = BATCH_KEYS
    position_dims = 1
    config_fields: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        tile_size: int = 512,
        patch_size: int = 16,
        pixel_shuffle: bool = True,
        max_num_tiles: int = 12,
        use_thumbnail: bool = True,
    ) -> None:
        self.tile_size = tile_size
        self.patch_size = patch_size
        self.pixel_shuffle = pixel_shuffle
        self.max_num_tiles = max_num_tiles
        self.use_thumbnail = use_thumbnail
        self.grids = sorted(
            {
                (cols, rows)
                for n in range(1, max_num_tiles + 1)
                for cols in range(1, n + 1)
                for rows in range(1, n + 1)
                if cols * rows <= max_num_tiles
            },
            key=lambda g: g[0] * g[1],
        )

    @property
    def tokens_per_tile(self) -> int:
        """Language-model positions of one tile (``img_seq_len``)."""
        n = (self.tile_size // self.patch_size) ** 2
        return int(n * 0.25) if self.pixel_shuffle else n

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """``(cols, rows)`` of the tiling of a ``width`` x ``height`` image.

        >>> NemotronVLFamily().grid(1920, 1080), NemotronVLFamily().grid(100, 1000)
        ((4, 2), (1, 10))
        """
        if width < 1 or height < 1:
            raise SampleError(
                "empty_image", f"image size {width}x{height}: both sides must be at least 1 pixel"
            )
        aspect = width / height
        best, best_diff = (1, 1), float("inf")
        for cols, rows in self.grids:
            diff = abs(aspect - cols / rows)
            if diff < best_diff:
                best, best_diff = (cols, rows), diff
            elif diff == best_diff and width * height > 0.5 * self.tile_size**2 * cols * rows:
                best = (cols, rows)
        return best

    def tiles(self, width: int, height: int) -> int:
        """Tiles of one image, the thumbnail included."""
        cols, rows = self.grid(width, height)
        n = cols * rows
        return n + 1 if self.use_thumbnail and n != 1 else n

    @sized
    def visual_tokens(self, width: int, height: int) -> int:
        return self.tiles(width, height) * self.tokens_per_tile

    def llm_tokens(self, collated_tokens: int, image_tiles: Sequence[int]) -> int:
        """Language-model length of a collated row of ``collated_tokens`` ids (one ``<image>`` per tile) whose
        images have ``image_tiles`` tiles: what must fit the pack, since the step clamps beyond it.

        >>> NemotronVLFamily().llm_tokens(40, [3, 1])
        1060
        """
        return collated_tokens + sum(image_tiles) * (self.tokens_per_tile - 1)

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any]) -> Any:
        return np.arange(len(input_ids), dtype=np.int64)  # 1-D rope

    def reported_settings(self, preparer: object) -> dict[str, int | bool]:
        return {}  # no preparer of its samples to report on

    def preparer(self, tokenizer: Any = None, image_processor: Any = None, **config: Any) -> Any:
        raise VLMError(
            "Nemotron-VL samples do not go through the in-batch collator or the Energon encoders: the LLaVA "
            "model expands each <image> to 256 embeddings after the packed boundaries are built; prepare them "
            "with NemotronVLPreparer.from_checkpoint(folder) (longpack.vlm.families.nemotron_vl) and pack them "
            "with longpack.runtime.in_batch.build_nemotron_vl_thd_batch, which budgets the expanded length"
        )


#: Bridge's Nemotron-VL assistant boundaries (``models/nemotron_vl/data/collate_fn.py``).
ASSISTANT_START, ASSISTANT_END = "<SPECIAL_11>Assistant\n", "<SPECIAL_12>"
IMG_START, IMG_END, IMG_CONTEXT = "<img>", "</img>", "<image>"


class NemotronVLPreparer:
    """Prepare Nemotron Nano V2 VL samples from the checkpoint files a user has locally (the tokenizer and its
    chat template, ``config.json``'s tiling and pixel normalization) into the rows Bridge's
    ``nemotron_nano_v2_vl_collate_fn`` makes for one sample, without the checkpoint's remote-code processor:

    - **text**: the conversation (the forms :func:`longpack.vlm.chat.normalize_conversation` reads; image parts
      as ``{"type": "image"}``) rendered by the tokenizer's own chat template, which writes one ``<image>`` per
      image; the ``i``-th ``<image>`` becomes ``<img>`` + one ``<image>`` per tile of image ``i`` + ``</img>``,
      the collated form (the processor writes 256 per tile and Bridge's ``adjust_image_tokens`` keeps one,
      :func:`collapse_image_tokens`); tokenized without added special tokens;
    - **tiles** (:class:`NemotronVLFamily`, ``force_image_size`` / ``max_num_tiles`` / ``use_thumbnail`` from
      ``config.json``): ``num_patches`` is one 1 per tile, as the collate rewrites it;
    - **loss** (Bridge's markers ``<SPECIAL_11>Assistant\\n`` ... ``<SPECIAL_12>``, the end marker trained,
      :func:`~longpack.vlm.families.gemma3.assistant_boundary_mask`), 0 on Bridge's skipped tokens (``<image>``,
      ``<pad>``, ... among the tokenizer's added tokens); labels the ids shifted left, -100 at the end, on
      skipped tokens and where the shifted mask is 0; ``position_ids`` ``arange``;
    - **pixels**: with ``image_processor`` (the checkpoint's own, e.g. ``AutoImageProcessor.from_pretrained(
      folder, trust_remote_code=True)``: running its code is the user's choice) its ``pixel_values``, its
      ``num_patches`` checked against the family's tiling; without, longpack's restatement of the checkpoint's
      ``NemotronNanoVLV2ImageProcessor`` (``image_processing.py``: ``ToTensor``, then torchvision's bicubic
      ``Resize`` of the float image to ``(rows * S, cols * S)``, cut into ``S x S`` tiles row by row, the whole
      image resized to ``S x S`` as the thumbnail when tiled, normalized with ``norm_mean`` / ``norm_std``),
      bfloat16 ``[tiles, 3, S, S]``. Published revisions of that file differ (one resizes with PIL before
      ``ToTensor``), so the restatement matches one revision only: pass the checkpoint's processor where pixels
      must be its own.

    ``length``, ``measure`` count from the image headers; ``PreparedSequence.sequence_length`` is the collated
    length, :meth:`llm_length` the language model's (what a pack must fit: ``llava_step`` cuts a longer row).
    Videos are refused (``unsupported_video``: Bridge's Nemotron-VL video path takes one sample per batch).

    >>> prep = NemotronVLPreparer.from_checkpoint("ckpt/")      # doctest: +SKIP
    >>> seq = prep.prepare({"messages": [{"role": "user", "content": "<image>What is it?"},
    ...                                  {"role": "assistant", "content": "A cat."}], "images": ["cat.png"]})
    ... # doctest: +SKIP
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        family: NemotronVLFamily | None = None,
        norm_mean: Sequence[float],
        norm_std: Sequence[float],
        config: Any = None,
        image_processor: Any = None,
    ) -> None:
        from longpack.vlm.families.gemma3 import BRIDGE_SKIPPED_TOKENS
        from longpack.vlm.hf_versions import checked_version
        from longpack.vlm.prepare import VLMConfig, VLMStats

        self.tokenizer = tokenizer
        self.family = family or NemotronVLFamily()
        self.config = config or VLMConfig()
        self.transformers_version = checked_version(self.config.transformers_version)
        if len(norm_mean) != 3 or len(norm_std) != 3:
            raise VLMError(f"norm_mean and norm_std need 3 values (RGB), got {norm_mean!r} and {norm_std!r}")
        self.norm_mean, self.norm_std = [float(x) for x in norm_mean], [float(x) for x in norm_std]
        self.image_processor = image_processor
        vocab = tokenizer.get_vocab()
        found = {t: vocab.get(t) for t in (IMG_START, IMG_END, IMG_CONTEXT)}
        if any(v is None for v in found.values()):
            raise VLMError(
                f"the tokenizer lacks the Nemotron-VL image tokens {sorted(t for t, v in found.items() if v is None)}"
            )
        self.image_token_id = int(found[IMG_CONTEXT])  # type: ignore[arg-type]
        self.img_start_id, self.img_end_id = int(found[IMG_START]), int(found[IMG_END])  # type: ignore[arg-type]
        if getattr(tokenizer, "chat_template", None) is None:
            raise VLMError(
                "the tokenizer has no chat_template (the checkpoint's tokenizer_config.json has one)"
            )
        if tokenizer.pad_token is None:  # Bridge falls back to eos for padding
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_token_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)
        self.skipped_ids = np.array(
            sorted(
                {int(i) for i, t in tokenizer.added_tokens_decoder.items() if str(t) in BRIDGE_SKIPPED_TOKENS}
            ),
            dtype=np.int64,
        )
        self.start_ids = tokenizer.encode(ASSISTANT_START, add_special_tokens=False)
        self.end_ids = tokenizer.encode(ASSISTANT_END, add_special_tokens=False)
        self.stats = VLMStats()

    @classmethod
    def from_checkpoint(
        cls, folder: Any, *, image_processor: Any = None, **config: Any
    ) -> NemotronVLPreparer:
        """The preparer of a local checkpoint folder: its tokenizer (``AutoTokenizer``, offline, no remote
        code), ``preprocessor_config.json`` (``image_size``, ``max_num_tiles``, ``use_thumbnail``,
        ``norm_mean``, ``norm_std``: the image processor's settings) over ``config.json``
        (``force_image_size``, ``max_num_tiles`` (12 when absent, Bridge's provider), ``use_thumbnail``,
        ``patch_size``, ``downsample_ratio``, ``norm_mean``, ``norm_std``); ``image_processor``: see the class
        docstring; ``config``: :class:`~longpack.vlm.VLMConfig` limits."""
        import json
        from pathlib import Path

        from longpack._optional import require
        from longpack.vlm.prepare import VLMConfig

        path = Path(folder)
        config_path = path / "config.json"
        try:
            checkpoint = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise VLMError(f"{config_path}: cannot read the checkpoint config ({exc})") from None
        processor_path = path / "preprocessor_config.json"
        if processor_path.exists():
            try:
                processor_config = json.loads(processor_path.read_text())
            except ValueError as exc:
                raise VLMError(f"{processor_path}: not JSON ({exc})") from None
            checkpoint = {**checkpoint, **processor_config}
            if "image_size" in processor_config:
                checkpoint["force_image_size"] = processor_config["image_size"]
        missing = [k for k in ("norm_mean", "norm_std") if k not in checkpoint]
        if missing:
            raise VLMError(
                f"{config_path}: no {' and '.join(missing)} (the pixel normalization of the checkpoint; also "
                "looked in preprocessor_config.json)"
            )
        transformers = require("transformers", "vlm", purpose="the Nemotron-VL tokenizer")
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise VLMError(f"{path}: no tokenizer that loads offline ({type(exc).__name__}: {exc})") from None
        vision = checkpoint.get("vision_config") or {}
        family = NemotronVLFamily(
            tile_size=int(checkpoint.get("force_image_size") or vision.get("image_size") or 512),
            patch_size=int(checkpoint.get("patch_size") or vision.get("patch_size") or 16),
            pixel_shuffle=float(checkpoint.get("downsample_ratio", 0.5)) == 0.5,
            max_num_tiles=int(checkpoint.get("max_num_tiles", 12)),
            use_thumbnail=bool(checkpoint.get("use_thumbnail", True)),
        )
        return cls(
            tokenizer,
            family=family,
            norm_mean=checkpoint["norm_mean"],
            norm_std=checkpoint["norm_std"],
            config=VLMConfig(**config),
            image_processor=image_processor,
        )

    def identity(self) -> dict[str, Any]:
        """What decides the prepared sequences: the tokenizer (hashes of vocabulary and template), tiling,
        normalization and limits."""
        import dataclasses
        import hashlib
        import json

        vocab = json.dumps(
            sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1]), ensure_ascii=False
        )
        f = self.family
        return {
            "family": f.name,
            "tokenizer": {
                "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
                "chat_template_sha256": hashlib.sha256(
                    str(self.tokenizer.chat_template).encode()
                ).hexdigest(),
            },
            "tiling": [f.tile_size, f.patch_size, f.pixel_shuffle, f.max_num_tiles, f.use_thumbnail],
            "norm": [self.norm_mean, self.norm_std],
            "image_processor": None if self.image_processor is None else type(self.image_processor).__name__,
            "config": {k: v for k, v in dataclasses.asdict(self.config).items() if k != "vision"},
        }

    # ------------------------------------------------------------------ text and lengths
    def _conversation(self, sample: Any, key: str) -> tuple[list[dict[str, Any]], list[Any]]:
        from longpack.vlm.chat import media_sources, normalize_conversation
        from longpack.vlm.errors import SampleRejected

        messages = normalize_conversation(sample, media_first=self.config.media_first)
        images, videos = media_sources(messages)
        if videos:
            raise SampleRejected(
                key,
                "unsupported_video",
                f"{len(videos)} video(s): Bridge's Nemotron-VL video path takes one sample per micro-batch and "
                "longpack prepares Nemotron-VL images only",
            )
        return messages, images

    def text(self, messages: Sequence[Any], tiles: Sequence[int]) -> str:
        """The collated text: the chat template's rendering with the ``i``-th ``<image>`` replaced by
        ``<img>`` + ``tiles[i]`` ``<image>`` + ``</img>``."""
        conversation = [
            {
                "role": m["role"],
                "content": [
                    {"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                    for p in m["content"]
                ],
            }
            for m in messages
        ]
        rendered = self.tokenizer.apply_chat_template(conversation, tokenize=False)
        pieces = rendered.split(IMG_CONTEXT)
        if len(pieces) - 1 != len(tiles):
            raise SampleError(
                "placeholder_mismatch",
                f"the chat template wrote {len(pieces) - 1} {IMG_CONTEXT} for {len(tiles)} image(s) (a text that "
                f"contains {IMG_CONTEXT} itself, or a template that drops image parts)",
            )
        out = [pieces[0]]
        for n, rest in zip(tiles, pieces[1:], strict=True):
            out += [IMG_START + IMG_CONTEXT * int(n) + IMG_END, rest]
        return "".join(out)

    def llm_length(self, collated_tokens: int, tiles: Sequence[int]) -> int:
        """Language-model positions of a collated row (:meth:`NemotronVLFamily.llm_tokens`)."""
        return self.family.llm_tokens(collated_tokens, tiles)

    def length(
        self, sample: Any, *, key: str | None = None, image_sizes: Sequence[tuple[int, int]] | None = None
    ):
        """Exact collated length from the image headers (no pixel decoded), limits not applied; ``tokens`` is
        the collated length, ``visual_tokens`` the language model's image positions (256 a tile)."""
        from longpack.vlm.prepare import SampleLength, _key
        from longpack.vlm.vision import image_size

        key = _key(sample, key)
        try:
            messages, images = self._conversation(sample, key)
            sizes = image_sizes if image_sizes is not None else [image_size(s, key=key) for s in images]
            if len(sizes) != len(images):
                raise SampleError(
                    "placeholder_mismatch", f"{len(sizes)} image sizes for {len(images)} images"
                )
            tiles = [self.family.tiles(int(w), int(h)) for w, h in sizes]
            ids = self.tokenizer(self.text(messages, tiles), add_special_tokens=False)["input_ids"]
        except SampleError as exc:
            raise exc.named(key) from None
        side = self.family.tile_size
        nbytes = len(ids) * (8 * 4 + 4) + sum(tiles) * (3 * side * side * 2 + 4)
        return SampleLength(len(ids), sum(tiles) * self.family.tokens_per_tile, (), nbytes)

    def _limits(self, key: str, n_images: int, visual: int, llm_tokens: int | None) -> None:
        from longpack.topology import align_up
        from longpack.vlm.errors import SampleRejected

        cfg = self.config
        cfg.refuse_images(key, n_images)
        cfg.refuse_visual_tokens(key, visual)
        if llm_tokens is not None and cfg.max_length is not None:
            aligned = align_up(llm_tokens, cfg.pad_to_multiple_of)
            if aligned > cfg.max_length:
                raise SampleRejected(
                    key,
                    "too_long",
                    f"{llm_tokens} language-model tokens after LLaVA expands the {visual} image positions "
                    f"(aligned to {cfg.pad_to_multiple_of}: {aligned}) > max_length={cfg.max_length}",
                )

    def measure(
        self, sample: Any, *, key: str | None = None, image_sizes: Sequence[tuple[int, int]] | None = None
    ):
        """:meth:`length` with the limits applied to the language model's length (a refusal counted)."""
        from longpack.vlm.prepare import _key

        key = _key(sample, key)
        try:
            length = self.length(sample, key=key, image_sizes=image_sizes)
            n_images = len(self._conversation(sample, key)[1])
            tiles = length.visual_tokens // self.family.tokens_per_tile
            self._limits(
                key, n_images, length.visual_tokens, length.tokens + tiles * (self.family.tokens_per_tile - 1)
            )
        except SampleError as exc:
            rejected = exc.named(key)
            self.stats.count_rejected(rejected)
            raise rejected from None
        return length

    # ------------------------------------------------------------------ preparation
    def pixel_tiles(self, image: Any) -> Any:
        """``[tiles, 3, S, S]`` float32 tiles of a decoded image (see the class docstring); torchvision's
        ``Resize`` of a float tensor is torch's bicubic interpolation with antialiasing, unclamped."""
        import torch

        f, side = self.family, self.family.tile_size
        width, height = image.size
        cols, rows = f.grid(width, height)
        rgb = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)[None]
        rgb = rgb.to(torch.float32) / 255.0  # ToTensor first: the resize runs on [0, 1] floats
        resized = torch.nn.functional.interpolate(
            rgb, size=(rows * side, cols * side), mode="bicubic", align_corners=False, antialias=True
        )
        tiles = (
            resized.reshape(1, 3, rows, side, cols, side).permute(0, 2, 4, 1, 3, 5).reshape(-1, 3, side, side)
        )
        if f.use_thumbnail and tiles.shape[0] > 1:
            thumb = torch.nn.functional.interpolate(
                rgb, size=(side, side), mode="bicubic", align_corners=False, antialias=True
            )
            tiles = torch.cat([tiles, thumb])
        mean = torch.tensor(self.norm_mean).reshape(1, 3, 1, 1)
        std = torch.tensor(self.norm_std).reshape(1, 3, 1, 1)
        return (tiles - mean) / std

    def _pixels(self, key: str, images: Sequence[Any], tiles: Sequence[int]) -> Any:
        """The tiles of a sample's decoded images: the checkpoint's image processor's when given (its
        ``num_patches`` must be the family's tiling), else :meth:`pixel_tiles`."""
        import torch

        if self.image_processor is None:
            return torch.cat([self.pixel_tiles(im) for im in images])
        out = self.image_processor(images=list(images), return_tensors="pt")
        theirs = [int(n) for n in torch.as_tensor(out["num_patches"]).reshape(-1).tolist()]
        if theirs != list(tiles):
            raise VLMError(
                f"sample {key}: the image processor made {theirs} tiles per image but the family's tiling gives "
                f"{list(tiles)} (tile size {self.family.tile_size}, at most {self.family.max_num_tiles} tiles, "
                f"thumbnail {self.family.use_thumbnail}); build the preparer from the same checkpoint's configs"
            )
        return torch.as_tensor(out["pixel_values"])

    def try_prepare(self, sample: Any, *, key: str | None = None) -> Any:
        """:meth:`prepare`, but a refusal is counted and returns ``None``."""
        from longpack.vlm.errors import SampleRejected

        try:
            return self.prepare(sample, key=key)
        except SampleRejected:
            return None

    def prepare(self, sample: Any, *, key: str | None = None) -> Any:
        """The prepared (collated) sequence of one sample; ``visual_values`` holds ``pixel_values``
        (bfloat16 tiles) and ``num_patches`` (one 1 per tile, int32)."""
        from longpack.vlm.prepare import _key

        key = _key(sample, key)
        try:
            return self._prepare(sample, key)
        except SampleError as exc:
            rejected = exc.named(key)
            self.stats.count_rejected(rejected)
            raise rejected from None

    def _prepare(self, sample: Any, key: str) -> Any:
        import torch

        from longpack.vlm.errors import SampleRejected
        from longpack.vlm.families.gemma3 import assistant_boundary_mask
        from longpack.vlm.prepare import IGNORE_INDEX, PreparedSequence
        from longpack.vlm.vision import decode_image, image_size

        messages, images = self._conversation(sample, key)
        sizes = [image_size(s, key=key) for s in images]
        tiles = [self.family.tiles(w, h) for w, h in sizes]
        visual = sum(tiles) * self.family.tokens_per_tile
        self._limits(key, len(images), visual, None)
        decoded = [decode_image(s, key=key) for s in images]
        ids = np.asarray(
            self.tokenizer(self.text(messages, tiles), add_special_tokens=False)["input_ids"], dtype=np.int64
        )
        length = len(ids)
        self._limits(key, len(images), visual, self.llm_length(length, tiles))
        if length < 2:
            raise SampleRejected(key, "malformed", f"{length} token(s); a sequence needs at least 2")
        mask = assistant_boundary_mask(ids, self.start_ids, self.end_ids)
        skipped = np.isin(ids, self.skipped_ids)
        mask[skipped] = 0.0
        labels = np.empty(length, dtype=np.int64)
        labels[:-1] = ids[1:]
        labels[-1] = IGNORE_INDEX
        labels[np.isin(labels, self.skipped_ids)] = IGNORE_INDEX
        shifted = np.zeros(length, dtype=np.float32)
        shifted[:-1] = mask[1:]
        labels[shifted == 0] = IGNORE_INDEX
        visual_values: dict[str, Any] = {}
        if images:
            pixels = self._pixels(key, decoded, tiles)
            visual_values["pixel_values"] = pixels.to(torch.bfloat16).contiguous()
            visual_values["num_patches"] = torch.ones(sum(tiles), dtype=torch.int32)
        stats = self.stats
        stats.prepared += 1
        stats.tokens += length
        stats.visual_tokens += visual
        stats.images += len(images)
        input_ids = torch.from_numpy(ids)
        return PreparedSequence(
            key=key,
            row={
                "input_ids": input_ids,
                "attention_mask": torch.ones_like(input_ids),
                "position_ids": torch.arange(length, dtype=torch.int64),
                "labels": torch.from_numpy(labels),
                "loss_mask": torch.from_numpy(shifted),
            },
            visual_values=visual_values,
            mrope_position_ids=None,
            visual_tokens=visual,
            pad_token_id=self.pad_token_id,
        )


def collapse_image_tokens(
    input_ids: Any,
    tiles: Sequence[int],
    *,
    img_start: int = IMG_START_TOKEN_ID,
    img_end: int = IMG_END_TOKEN_ID,
) -> np.ndarray:
    """One row's ids with every ``<img>`` ... ``</img>`` region holding ``tiles[i]`` copies of its media token,
    as Bridge's ``adjust_image_tokens`` does per row (the processor's text has ``tiles * 256`` of them).

    >>> collapse_image_tokens([5, 131073, 131072, 131072, 131072, 131074, 6], [2]).tolist()
    [5, 131073, 131072, 131072, 131074, 6]
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    starts = np.flatnonzero(ids == img_start).tolist()
    ends = np.flatnonzero(ids == img_end).tolist()
    if len(starts) != len(ends) or len(starts) != len(tiles):
        raise SampleError(
            "placeholder_mismatch",
            f"{len(starts)} <img> and {len(ends)} </img> regions for {len(tiles)} tile counts",
        )
    pieces, cursor, previous = [], 0, -1
    for start, end, n in zip(starts, ends, tiles, strict=True):
        media = ids[start + 1 : end]
        if start <= previous or end <= start + 1 or (media != media[0]).any():
            raise SampleError("malformed", f"image region at {start}..{end} is not <img> media... </img>")
        pieces += [ids[cursor : start + 1], np.full(int(n), media[0], dtype=np.int64), ids[end : end + 1]]
        cursor, previous = end + 1, end
    pieces.append(ids[cursor:])
    return np.concatenate(pieces)


def expand_packed_boundaries(
    cu_seqlens: Any,
    cu_seqlens_padded: Any | None,
    input_ids: Any,
    *,
    image_token_id: int = IMAGE_TOKEN_ID,
    tokens_per_tile: int = 256,
    language_max_sequence_length: int | None = None,
) -> dict[str, Any]:
    """The packed-sequence boundaries after LLaVA replaces each ``<image>`` token of a packed row by
    ``tokens_per_tile`` embeddings (Bridge ``llava_step._expand_packed_metadata_for_visual_embeddings``):
    ``cu_seqlens_q``/``_kv`` (and the ``_padded`` pair when given) and ``max_seqlen_q``/``_kv`` (an int, the
    longest physical segment). With ``language_max_sequence_length`` the row is cut there: segments past it are
    dropped and the one across it shortened, as the step does.

    >>> import torch
    >>> out = expand_packed_boundaries(torch.tensor([0, 4, 7]), None, torch.tensor([[1, 131072, 2, 3, 4, 5, 6]]))
    >>> out["cu_seqlens_q"].tolist(), out["max_seqlen_q"]
    ([0, 259, 262], 259)
    """
    import torch

    cu = torch.as_tensor(cu_seqlens).reshape(-1)
    physical = cu if cu_seqlens_padded is None else torch.as_tensor(cu_seqlens_padded).reshape(-1)
    ids = torch.as_tensor(input_ids).reshape(-1)
    n = cu.numel() - 1
    counts = torch.zeros(n, dtype=cu.dtype)
    if tokens_per_tile > 1:
        where = torch.nonzero(ids == image_token_id).reshape(-1)
        segment = torch.searchsorted(physical[1:].contiguous(), where, right=True)
        counts = torch.bincount(segment, minlength=n)[:n].to(cu.dtype) if where.numel() else counts
    grow = counts * (tokens_per_tile - 1)
    lengths = cu.diff() + grow
    spans = physical.diff() + grow
    if language_max_sequence_length is not None:
        ends = torch.cumsum(spans, 0).clamp(max=int(language_max_sequence_length))
        kept = torch.diff(torch.cat((physical[:1], ends)))
        keep = kept > 0
        spans = kept[keep]
        lengths = torch.minimum(lengths[keep], spans)
    new_cu = torch.cat((cu[:1], torch.cumsum(lengths, 0).to(cu.dtype)))
    out: dict[str, Any] = {"cu_seqlens_q": new_cu, "cu_seqlens_kv": new_cu}
    if cu_seqlens_padded is not None:
        new_padded = torch.cat((physical[:1], torch.cumsum(spans, 0).to(physical.dtype)))
        out["cu_seqlens_q_padded"] = out["cu_seqlens_kv_padded"] = new_padded
    out["max_seqlen_q"] = out["max_seqlen_kv"] = int(spans.max())
    return out
