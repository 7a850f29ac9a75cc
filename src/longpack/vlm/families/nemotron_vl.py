"""Nemotron-VL (Nemotron Nano V2 VL): visual token counts from image sizes, the placeholder layout Megatron-
Bridge's collate builds, and the packed-row boundaries its training step expands.

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
            "Nemotron-VL samples are not prepared by longpack (its processor is the checkpoint's remote code); "
            "use Bridge's nemotron_nano_v2_vl_collate_fn, and longpack for visual token counts, "
            "collapse_image_tokens and expand_packed_boundaries"
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
