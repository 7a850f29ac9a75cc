"""Collate-time ("in-batch") THD packing: MBS right-padded rows become one packed THD row.

Follows Megatron-Bridge's ``build_mcore_thd_sequence_batch_from_rows`` and
``pack_right_padded_sequence_batch_to_mcore_thd`` (docs/reference/thd-batch.md#in-batch). Unlike the
offline collate the rows are *not* shifted here: each row already carries its ``labels`` and ``loss_mask``.
Alignment gaps sit at the end of each segment: tokens ``pad_token_id``, labels ``ignore_index``, loss 0,
positions continuing.

VLM rows: :func:`build_visual_thd_batch` packs prepared image+text sequences as Megatron-Bridge's
``build_qwen_vl_packed_batch`` does (visual tensors concatenated in sequence order, 3-D positions restarting per
sequence), :class:`VisualInBatchCollator` is its collate-time form for MBS > 1, and :func:`packed_padding_mask`
marks the gaps between logical and physical THD boundaries for MoE router statistics.

Example (two rows of lengths 3 and 2, alignment 4)::

    >>> batch = {"input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]),
    ...          "position_ids": torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])}
    >>> out = pack_right_padded_batch(batch, pad_to_multiple_of=4, emit_padding_mask=True)
    >>> out["input_ids"].tolist(), out["cu_seqlens_q"].tolist(), out["cu_seqlens_q_padded"].tolist()
    ([[1, 2, 3, 0, 4, 5, 0, 0]], [0, 3, 5], [0, 4, 8])
    >>> out["position_ids"].tolist(), int(out["max_seqlen_q"])
    ([[0, 1, 2, 3, 0, 1, 2, 3]], 4)
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch

from longpack.errors import BatchError
from longpack.topology import align_up

__all__ = [
    "VISUAL_KEYS",
    "InBatchPackingError",
    "VisualInBatchCollator",
    "build_glm4v_thd_batch",
    "build_kimi_thd_batch",
    "build_nemotron_vl_thd_batch",
    "build_thd_row",
    "build_visual_thd_batch",
    "pack_mimo_language_shard",
    "pack_right_padded_batch",
    "packed_padding_mask",
]

_RESERVED = frozenset({"position_ids", "labels", "loss_mask", "attention_mask", "padding_mask"})


class InBatchPackingError(BatchError):
    """Rows that cannot be packed into one THD row (empty rows, wrong shapes, too long)."""


def build_thd_row(
    rows: Sequence[Mapping[str, Any]],
    *,
    token_key: str = "input_ids",
    sequence_length: int | None = None,
    pad_token_id: int = 0,
    ignore_index: int = -100,
    pad_to_multiple_of: int = 1,
    pad_to_max_length: bool = False,
    sequence_tensor_pad_values: Mapping[str, Any] | None = None,
    emit_padding_mask: bool = False,
) -> dict[str, Any]:
    """Concatenate unpadded rows into one THD row ``[1, T]`` with Megatron-Core metadata.

    Each row needs 1-D ``token_key`` and ``position_ids`` tensors; ``labels``, ``loss_mask`` and the keys of
    ``sequence_tensor_pad_values`` are optional but must be in all rows or none. Row ``i`` of length ``L_i``
    takes ``ceil(L_i / m) * m`` slots; with ``pad_to_max_length`` the last segment absorbs the slack up to
    ``sequence_length``. Returns the token key, ``position_ids``, ``labels``, ``loss_mask``,
    ``attention_mask=None``, ``cu_seqlens_q``/``kv`` (int32, logical), ``cu_seqlens_q_padded``/``kv``
    (only when some segment has a gap), ``max_seqlen_q``/``kv`` (0-d int32, max physical length),
    ``total_tokens`` and, if asked, ``padding_mask`` (True on gaps).

    >>> rows = [{"input_ids": torch.tensor([1, 2, 3]), "position_ids": torch.arange(3),
    ...          "labels": torch.tensor([2, 3, -100]), "loss_mask": torch.tensor([1, 1, 0])},
    ...         {"input_ids": torch.tensor([4, 5]), "position_ids": torch.arange(2),
    ...          "labels": torch.tensor([5, -100]), "loss_mask": torch.tensor([1, 0])}]
    >>> out = build_thd_row(rows, sequence_length=8, pad_to_max_length=True)
    >>> out["input_ids"].tolist(), out["labels"].tolist()
    ([[1, 2, 3, 4, 5, 0, 0, 0]], [[2, 3, -100, 5, -100, -100, -100, -100]])
    >>> out["cu_seqlens_q"].tolist(), out["cu_seqlens_q_padded"].tolist(), out["total_tokens"]
    ([0, 3, 5], [0, 3, 8], 8)
    """
    if not rows:
        raise InBatchPackingError("build_thd_row needs at least one row")
    if (
        isinstance(pad_to_multiple_of, bool)
        or not isinstance(pad_to_multiple_of, int)
        or pad_to_multiple_of < 1
    ):
        raise InBatchPackingError(f"pad_to_multiple_of must be an integer >= 1, got {pad_to_multiple_of!r}")
    if sequence_length is not None and sequence_length < 1:
        raise InBatchPackingError(f"sequence_length must be >= 1 when given, got {sequence_length}")
    if pad_to_max_length and sequence_length is None:
        raise InBatchPackingError("pad_to_max_length=True requires sequence_length")
    extras = dict(sequence_tensor_pad_values or {})
    clash = sorted(set(extras) & (_RESERVED | {token_key}))
    if clash:
        raise InBatchPackingError(
            f"sequence_tensor_pad_values may not name the built-in keys {clash}; they are padded already"
        )

    lengths: list[int] = []
    for i, row in enumerate(rows):
        tokens = row.get(token_key)
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.numel() < 1:
            raise InBatchPackingError(
                f"row {i}: {token_key!r} must be a non-empty 1-D tensor, got "
                f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}"
            )
        if sequence_length is not None and tokens.numel() > sequence_length:
            raise InBatchPackingError(
                f"Packed sequence row length {tokens.numel()} exceeds configured sequence_length {sequence_length}."
            )
        if row.get("position_ids") is None:
            raise InBatchPackingError(f"row {i}: 'position_ids' is required for THD packing")
        mask = row.get("attention_mask")
        if mask is not None and not bool(torch.as_tensor(mask).bool().all()):
            raise InBatchPackingError(
                f"row {i}: attention_mask has padded positions; THD packing requires unpadded input rows"
            )
        lengths.append(int(tokens.numel()))
    optional = ["position_ids", "labels", "loss_mask", *extras]
    present: dict[str, bool] = {}
    for key in optional:
        have = [row.get(key) is not None for row in rows]
        if any(have) and not all(have):
            raise InBatchPackingError(
                f"{key!r} is present in some rows but not all; give it in every row or none"
            )
        present[key] = all(have)
        if present[key]:
            for i, row in enumerate(rows):
                value = row[key]
                if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.numel() != lengths[i]:
                    raise InBatchPackingError(
                        f"row {i}: {key!r} must be a 1-D tensor of length {lengths[i]} like {token_key!r}"
                    )

    m = pad_to_multiple_of
    padded = [align_up(n, m) for n in lengths]
    total = sum(padded)
    if pad_to_max_length:
        assert sequence_length is not None
        if total > sequence_length:
            raise InBatchPackingError(
                f"Packed sequence length {total} exceeds configured sequence_length {sequence_length}."
            )
        padded[-1] += sequence_length - total
        total = sequence_length

    first = rows[0][token_key]
    device = first.device
    starts = [0]
    for p in padded:
        starts.append(starts[-1] + p)
    out: dict[str, Any] = {}

    def fill(key: str, pad_value: Any) -> torch.Tensor:
        template = rows[0][key]
        result = torch.full((1, total), pad_value, dtype=template.dtype, device=device)
        for row, start, n in zip(rows, starts, lengths, strict=False):
            result[0, start : start + n] = row[key].to(device)
        return result

    out[token_key] = fill(token_key, pad_token_id)
    positions = fill("position_ids", 0)
    for row, start, n, p in zip(rows, starts, lengths, padded, strict=False):
        if p > n:
            last = row["position_ids"][-1].to(device)
            positions[0, start + n : start + p] = last + torch.arange(
                1, p - n + 1, device=device, dtype=positions.dtype
            )
    out["position_ids"] = positions
    out["labels"] = fill("labels", ignore_index) if present["labels"] else None
    out["loss_mask"] = fill("loss_mask", 0) if present["loss_mask"] else None
    for key, value in extras.items():
        if present[key]:
            out[key] = fill(key, value)
    out["attention_mask"] = None
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    out["cu_seqlens_q"] = cu
    out["cu_seqlens_kv"] = cu
    if padded != lengths:
        cu_padded = torch.tensor(starts, dtype=torch.int32, device=device)
        out["cu_seqlens_q_padded"] = cu_padded
        out["cu_seqlens_kv_padded"] = cu_padded
    max_seqlen = torch.tensor(max(padded), dtype=torch.int32)
    out["max_seqlen_q"] = max_seqlen
    out["max_seqlen_kv"] = max_seqlen
    out["total_tokens"] = total
    if emit_padding_mask:
        gap = torch.ones((1, total), dtype=torch.bool, device=device)
        for start, n in zip(starts, lengths, strict=False):
            gap[0, start : start + n] = False
        out["padding_mask"] = gap
    return out


def pack_right_padded_batch(
    batch: MutableMapping[str, Any],
    *,
    token_key: str | None = None,
    sequence_length: int | None = None,
    pad_token_id: int = 0,
    ignore_index: int = -100,
    pad_to_multiple_of: int = 1,
    sequence_tensor_pad_values: Mapping[str, Any] | None = None,
    emit_padding_mask: bool = False,
) -> MutableMapping[str, Any]:
    """Pack a right-padded micro-batch ``[B, S]`` into one THD row ``[1, T]`` **in place**.

    Row lengths come from ``attention_mask`` (per-row sums) if given, else from ``token != pad_token_id``;
    the active positions must be a prefix of each row. Writes back the token key(s), ``labels``,
    ``loss_mask``, ``position_ids``, ``attention_mask=None``, the ``cu_seqlens*``/``max_seqlen*`` keys,
    ``total_tokens`` and extras, and removes stale ``padding_mask`` / ``cu_seqlens_*_padded`` keys that
    were not produced. Returns ``batch``.

    >>> batch = {"tokens": torch.tensor([[1, 2, 3, 0, 0, 0, 0], [4, 5, 6, 7, 0, 0, 0]]),
    ...          "position_ids": torch.arange(7).repeat(2, 1)}
    >>> out = pack_right_padded_batch(batch)
    >>> out["tokens"].tolist(), out["cu_seqlens_q"].tolist(), int(out["max_seqlen_q"])
    ([[1, 2, 3, 4, 5, 6, 7]], [0, 3, 7], 4)
    """
    if token_key is None:
        if isinstance(batch.get("tokens"), torch.Tensor):
            token_key = "tokens"
        elif isinstance(batch.get("input_ids"), torch.Tensor):
            token_key = "input_ids"
        else:
            raise InBatchPackingError("the batch has neither a 'tokens' nor an 'input_ids' tensor to pack")
    tokens = batch[token_key]
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise InBatchPackingError(f"batch[{token_key!r}] must be a 2-D [batch, sequence] tensor")
    positions = batch.get("position_ids")
    if not isinstance(positions, torch.Tensor) or positions.shape != tokens.shape:
        raise InBatchPackingError(
            f"batch['position_ids'] must be a tensor of shape {tuple(tokens.shape)} like {token_key!r}"
        )
    extras = dict(sequence_tensor_pad_values or {})
    for key in ("labels", "loss_mask", *extras):
        value = batch.get(key)
        if value is not None and (not isinstance(value, torch.Tensor) or value.shape != tokens.shape):
            raise InBatchPackingError(
                f"batch[{key!r}] must have shape {tuple(tokens.shape)} like {token_key!r}"
            )
    mask = batch.get("attention_mask")
    if mask is not None:
        mask = torch.as_tensor(mask)
        if mask.shape != tokens.shape:
            raise InBatchPackingError(
                f"attention_mask must be 2-D {tuple(tokens.shape)} for direct packing, got {tuple(mask.shape)}"
            )
        active = mask.bool()
    else:
        active = tokens != pad_token_id
    lengths = active.sum(dim=1)
    width = tokens.size(1)
    prefix = torch.arange(width, device=tokens.device).unsqueeze(0) < lengths.unsqueeze(1)
    if not torch.equal(prefix, active):
        raise InBatchPackingError("Direct sequence packing requires right-padded input rows.")
    if bool((lengths == 0).any()):
        empty = int((lengths == 0).nonzero()[0, 0])
        raise InBatchPackingError(f"Cannot pack a batch containing an empty sequence row (row {empty})")
    rows = []
    for i, n in enumerate(lengths.tolist()):
        row: dict[str, Any] = {token_key: tokens[i, :n], "position_ids": positions[i, :n]}
        for key in ("labels", "loss_mask", *extras):
            if batch.get(key) is not None:
                row[key] = batch[key][i, :n]
        rows.append(row)
    packed = build_thd_row(
        rows,
        token_key=token_key,
        sequence_length=sequence_length,
        pad_token_id=pad_token_id,
        ignore_index=ignore_index,
        pad_to_multiple_of=pad_to_multiple_of,
        sequence_tensor_pad_values=extras,
        emit_padding_mask=emit_padding_mask,
    )
    for key in ("tokens", "input_ids"):
        if isinstance(batch.get(key), torch.Tensor):
            batch[key] = packed[token_key]
    for key in ("cu_seqlens_q_padded", "cu_seqlens_kv_padded", "padding_mask"):
        if key not in packed:
            batch.pop(key, None)
    for key, value in packed.items():
        if key == token_key:
            continue
        if key in ("labels", "loss_mask") and value is None and key not in batch:
            continue
        batch[key] = value
    return batch


# ---------------------------------------------------------------------------------------------- VLM rows

# The visual keys Megatron-Bridge's Qwen-VL packer concatenates (``QWEN_VISUAL_KEYS``), in its order.
VISUAL_KEYS: tuple[str, ...] = (
    "pixel_values",
    "pixel_values_videos",
    "image_grid_thw",
    "video_grid_thw",
    "second_per_grid_ts",
)


def packed_padding_mask(
    cu_seqlens: Any, cu_seqlens_padded: Any | None, total_tokens: int
) -> torch.Tensor | None:
    """``[1, total_tokens]`` bool, True on tokens that belong to no real sequence: each segment's alignment
    gap (between its logical and physical end) and any tail after the last physical boundary. ``None`` when
    there are neither (the row is all real tokens).

    This is the mask Megatron-Bridge's Qwen3-VL model derives from the logical vs physical THD boundaries for
    Megatron-Core's MoE router (``routing_map & ~padding_mask``: gaps stay out of the auxiliary-loss token
    counts, z-loss and expert-bias counts).

    >>> packed_padding_mask(torch.tensor([0, 3, 5]), torch.tensor([0, 4, 8]), 10).int().tolist()
    [[0, 0, 0, 1, 0, 0, 1, 1, 1, 1]]
    >>> packed_padding_mask(torch.tensor([0, 3, 5]), None, 5) is None
    True
    """
    real = torch.as_tensor(cu_seqlens).reshape(-1).to(torch.int64)
    physical = (
        real if cu_seqlens_padded is None else torch.as_tensor(cu_seqlens_padded).reshape(-1).to(torch.int64)
    )
    if real.numel() < 2 or physical.shape != real.shape:
        raise InBatchPackingError(
            f"cu_seqlens {real.tolist()} and cu_seqlens_padded {physical.tolist()} must be 1-D offsets of the "
            "same length (at least 2)"
        )
    lengths = real.diff()
    spans = physical.diff()
    if (
        int(real[0]) != 0
        or int(physical[0]) != 0
        or bool((lengths <= 0).any())
        or bool((spans < lengths).any())
    ):
        raise InBatchPackingError(
            f"cu_seqlens {real.tolist()} / cu_seqlens_padded {physical.tolist()}: offsets must start at 0, every "
            "logical length must be > 0 and no physical length may be shorter than its logical one"
        )
    if int(physical[-1]) > total_tokens:
        raise InBatchPackingError(
            f"cu_seqlens_padded[-1]={int(physical[-1])} is past the row's {total_tokens} tokens"
        )
    if torch.equal(lengths, spans) and int(physical[-1]) == total_tokens:
        return None
    pad = torch.ones((1, total_tokens), dtype=torch.bool)
    for start, n in zip(physical[:-1].tolist(), lengths.tolist(), strict=True):
        pad[0, start : start + n] = False
    return pad


def build_visual_thd_batch(
    sequences: Sequence[Any],
    *,
    sequence_length: int | None,
    pad_to_multiple_of: int = 1,
    pad_to_max_length: bool = False,
    emit_padding_mask: bool = False,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """One THD row from prepared VLM sequences, as Megatron-Bridge's ``build_qwen_vl_packed_batch``
    (``models/qwen_vl/data/collate_fn.py``) builds it, plus 3-D positions and an optional padding mask.

    Each sequence has ``row`` (1-D ``input_ids``, ``position_ids``, ``labels``, ``loss_mask``, all-ones
    ``attention_mask``) and ``visual_values`` (``pixel_values``, ``image_grid_thw``, video keys), as
    ``longpack.vlm.PreparedSequence`` and Bridge's ``QwenVLPreparedSequence`` do. The text keys are
    :func:`build_thd_row`'s (labels -100; alignment ``pad_to_multiple_of`` per sequence; with
    ``pad_to_max_length`` the last segment reaches ``sequence_length``); gaps get ``pad_token_id``, by default
    the sequences' own ``pad_token_id`` (``PreparedSequence.pad_token_id``: 0 for Qwen-VL as Bridge's
    ``build_qwen_vl_packed_batch``, the tokenizer's pad id for Gemma3-VL as ``gemma3_vl_collate_fn``). ``visual_inputs`` maps each visual key
    present to its tensors concatenated in sequence order. Added to Bridge's keys:

    - ``mrope_position_ids`` ``[3, 1, T]`` when every sequence has ``mrope_position_ids`` ``[3, L]`` (each
      computed on its sequence alone, so every sequence restarts at 0); gap positions continue on each axis;
    - ``padding_mask`` ``[1, T]`` (True on gaps and tail, :func:`packed_padding_mask`) when
      ``emit_padding_mask`` and the row has gaps.
    """
    if not sequences:
        raise InBatchPackingError("build_visual_thd_batch needs at least one sequence")
    rows = []
    for i, seq in enumerate(sequences):
        row = getattr(seq, "row", None)
        if not isinstance(row, Mapping):
            raise InBatchPackingError(
                f"sequence {i}: expected a prepared sequence with .row and .visual_values, got {type(seq).__name__}"
            )
        rows.append(row)
    if pad_token_id is None:
        pad_ids = sorted({int(getattr(seq, "pad_token_id", 0)) for seq in sequences})
        if len(pad_ids) > 1:
            raise InBatchPackingError(
                f"the sequences have different pad ids {pad_ids} (prepared by different tokenizers?); pass "
                "pad_token_id=... or pack sequences of one preparer",
                fields="pad_token_id",
            )
        pad_token_id = pad_ids[0]
    out = build_thd_row(
        rows,
        sequence_length=sequence_length,
        pad_token_id=pad_token_id,
        ignore_index=-100,
        pad_to_multiple_of=pad_to_multiple_of,
        pad_to_max_length=pad_to_max_length,
    )
    visual: dict[str, list[torch.Tensor]] = {key: [] for key in VISUAL_KEYS}
    for seq in sequences:
        for key, value in (getattr(seq, "visual_values", None) or {}).items():
            if key not in visual:
                raise InBatchPackingError(f"unknown visual key {key!r}; expected one of {VISUAL_KEYS}")
            visual[key].append(value)
    out["visual_inputs"] = {key: torch.cat(values, dim=0) for key, values in visual.items() if values}
    found = [getattr(seq, "mrope_position_ids", None) for seq in sequences]
    ropes = [r for r in found if r is not None]
    if len(ropes) == len(sequences):
        total = out["total_tokens"]
        starts = out.get("cu_seqlens_q_padded", out["cu_seqlens_q"]).tolist()  # physical offsets
        positions = torch.zeros((3, 1, total), dtype=torch.int64)
        for i, (rope, row) in enumerate(zip(ropes, rows, strict=True)):
            n = int(row["input_ids"].numel())
            if tuple(rope.shape) != (3, n):
                raise InBatchPackingError(
                    f"sequence {i}: mrope_position_ids has shape {tuple(rope.shape)}, not (3, {n})"
                )
            start, stop = int(starts[i]), int(starts[i + 1])
            positions[:, 0, start : start + n] = rope
            gap = stop - start - n
            if gap > 0:
                positions[:, 0, start + n : stop] = rope[:, -1:] + torch.arange(1, gap + 1)
        out["mrope_position_ids"] = positions
    if emit_padding_mask:
        mask = packed_padding_mask(out["cu_seqlens_q"], out.get("cu_seqlens_q_padded"), out["total_tokens"])
        if mask is not None:
            out["padding_mask"] = mask
    return out


def build_glm4v_thd_batch(
    rows: Sequence[Mapping[str, Any]],
    visual_values: Sequence[Mapping[str, Any]],
    *,
    sequence_length: int | None = None,
    pad_token_id: int = 0,
    pad_to_multiple_of: int = 1,
) -> dict[str, Any]:
    """One THD row from GLM rows (1-D ``input_ids``, ``position_ids``, ``labels``, ``loss_mask``,
    ``attention_mask``, ``mm_token_type_ids``) and each row's visual tensors, as Bridge's
    ``glm4v_collate_fn(enable_in_batch_packing=True)`` (``models/glm_vl/data/collate_fn.py``) packs them after
    running the processor: :func:`build_thd_row` with ``mm_token_type_ids`` padded with 0, then ``visual_inputs``
    with the THW-grid keys concatenated and the packed ``mm_token_type_ids``.

    >>> row = lambda n: {"input_ids": torch.arange(1, n + 1), "position_ids": torch.arange(n),
    ...                  "labels": torch.arange(2, n + 2), "loss_mask": torch.ones(n),
    ...                  "mm_token_type_ids": torch.tensor([0] + [1] * (n - 1))}
    >>> out = build_glm4v_thd_batch([row(3), row(2)], [{}, {}], pad_to_multiple_of=4)
    >>> out["cu_seqlens_q_padded"].tolist(), out["visual_inputs"]["mm_token_type_ids"].tolist()
    ([0, 4, 8], [[0, 1, 1, 0, 0, 1, 0, 0]])
    """
    out = build_thd_row(
        rows,
        sequence_length=sequence_length,
        pad_token_id=pad_token_id,
        ignore_index=-100,
        pad_to_multiple_of=pad_to_multiple_of,
        sequence_tensor_pad_values={"mm_token_type_ids": 0},
    )
    visual: dict[str, Any] = {}
    for key in VISUAL_KEYS[:4]:  # Bridge's THW_GRID_VISUAL_KEYS
        values = [v[key] for v in visual_values if isinstance(v.get(key), torch.Tensor)]
        if values:
            visual[key] = torch.cat(values, dim=0)
    visual["mm_token_type_ids"] = out.pop("mm_token_type_ids")
    out["visual_inputs"] = visual
    return out


#: Kimi K2.5's ``<|media_pad|>`` (Bridge's ``kimi_k25_vl_collate_fn`` default ``media_token_id``).
KIMI_MEDIA_TOKEN_ID = 163605


def build_kimi_thd_batch(
    samples: Sequence[Mapping[str, Any]],
    *,
    sequence_length: int | None = None,
    pad_token_id: int = 0,
    pad_to_multiple_of: int = 1,
    media_token_id: int = KIMI_MEDIA_TOKEN_ID,
    merge_kernel_size: tuple[int, int] = (2, 2),
) -> dict[str, Any]:
    """One THD row from Kimi K2.5 processor outputs, as Bridge's ``kimi_k25_vl_collate_fn(
    enable_in_batch_packing=True)`` (``models/kimi_vl/data/collate_fn.py``) packs them after its processor call.

    Each sample has the processor's 1-D ``input_ids`` (one ``<|media_pad|>`` per image) and ``attention_mask``,
    the assistant ``loss_mask`` over those ids (unshifted), and when it has images ``grid_thws`` (``[n, 3]``)
    and ``pixel_values``. Per sample (``_expand_image_tokens_and_aligned_mask``): the ``i``-th placeholder
    becomes ``t * (h // merge_h) * (w // merge_w)`` placeholders of ``grid_thws[i]``, the attention mask 1 and
    the loss mask the placeholder's value over them; then the row is Bridge's: float32 loss mask shifted left
    by one, ``labels`` the next token where it is 1 (else -100), ``position_ids`` ``arange``. The rows are packed
    by :func:`build_thd_row` (gaps ``pad_token_id``, the tokenizer's) and ``visual_inputs`` holds the
    concatenated ``pixel_values`` and ``image_grid_thw`` (from ``grid_thws``). Unlike Bridge (a warning, then
    as many placeholders expanded as there are grid rows), placeholders that do not match the grid rows are an
    :class:`InBatchPackingError` naming the sample.

    >>> s = {"input_ids": torch.tensor([7, KIMI_MEDIA_TOKEN_ID, 8, 9]), "attention_mask": torch.ones(4, dtype=torch.long),
    ...      "loss_mask": torch.tensor([0, 0, 1, 1]), "grid_thws": torch.tensor([[1, 2, 4]])}
    >>> out = build_kimi_thd_batch([s])
    >>> out["input_ids"].tolist(), out["labels"].tolist(), out["cu_seqlens_q"].tolist()
    ([[7, 163605, 163605, 8, 9]], [[-100, -100, 8, 9, -100]], [0, 5])
    """
    merge_h, merge_w = merge_kernel_size
    rows: list[dict[str, torch.Tensor]] = []
    pixels: list[torch.Tensor] = []
    grids: list[torch.Tensor] = []
    for i, sample in enumerate(samples):
        ids = torch.as_tensor(sample["input_ids"]).reshape(-1)
        attention = torch.as_tensor(sample["attention_mask"]).reshape(-1)
        loss = torch.as_tensor(sample["loss_mask"]).reshape(-1)
        if not (ids.numel() == attention.numel() == loss.numel()):
            raise InBatchPackingError(
                f"sample {i}: input_ids ({ids.numel()}), attention_mask ({attention.numel()}) and loss_mask "
                f"({loss.numel()}) differ in length"
            )
        grid = sample.get("grid_thws")
        at = (ids == media_token_id).nonzero(as_tuple=True)[0]
        if grid is not None and len(at):
            grid = torch.as_tensor(grid).reshape(-1, 3)
            if len(at) != len(grid):
                raise InBatchPackingError(
                    f"sample {i}: {len(at)} <|media_pad|> placeholders for {len(grid)} grid_thws rows; each "
                    "image needs one placeholder (Bridge would warn and expand only as many as it has rows)"
                )
            counts = torch.ones(ids.numel(), dtype=torch.long)
            counts[at] = torch.tensor(
                [int(t) * (int(h) // merge_h) * (int(w) // merge_w) for t, h, w in grid.tolist()]
            )
            ids, loss = ids.repeat_interleave(counts), loss.repeat_interleave(counts)
            attention = attention.repeat_interleave(counts)
            attention[ids == media_token_id] = 1
        if grid is not None:
            grids.append(torch.as_tensor(grid))
        if sample.get("pixel_values") is not None:
            pixels.append(torch.as_tensor(sample["pixel_values"]))
        mask = loss.to(torch.float32)
        shifted = torch.cat([mask[1:], mask.new_zeros(1)])
        labels = torch.cat([ids[1:], ids.new_full((1,), -100)])
        rows.append(
            {
                "input_ids": ids,
                "attention_mask": attention,
                "position_ids": torch.arange(ids.numel(), dtype=torch.long),
                "labels": labels.masked_fill(shifted == 0, -100),
                "loss_mask": shifted,
            }
        )
    out = build_thd_row(
        rows,
        sequence_length=sequence_length,
        pad_token_id=pad_token_id,
        ignore_index=-100,
        pad_to_multiple_of=pad_to_multiple_of,
    )
    visual: dict[str, torch.Tensor] = {}
    if pixels:
        visual["pixel_values"] = torch.cat(pixels, dim=0)
    if grids:
        visual["image_grid_thw"] = torch.cat(grids, dim=0)
    out["visual_inputs"] = visual
    return out


def build_nemotron_vl_thd_batch(
    prepared: Sequence[Any],
    *,
    language_max_sequence_length: int | None = None,
    pad_to_multiple_of: int = 1,
    tokens_per_tile: int = 256,
) -> dict[str, Any]:
    """One THD row of prepared Nemotron-VL sequences (:class:`longpack.vlm.families.nemotron_vl.NemotronVLPreparer`)
    in the layout Bridge's ``training/llava_step.py`` takes packed (PR #4874): the THD keys of
    :func:`build_thd_row` over the collated ids (gaps the tokenizer's pad id), ``num_patches`` (one 1 per tile,
    concatenated) and ``visual_inputs["pixel_values"]`` (the tiles, in sequence order). The step grows each
    segment by ``tokens_per_tile - 1`` per ``<image>`` and silently cuts the row at the language model's
    ``seq_length``; with ``language_max_sequence_length`` the expanded, aligned row is checked against it
    here instead, and a row that would be cut is an :class:`InBatchPackingError` naming its length.

    Boundaries after the expansion: :func:`longpack.vlm.families.nemotron_vl.expand_packed_boundaries`.
    """
    if not prepared:
        raise InBatchPackingError("no sequences to pack")
    rows = [p.row for p in prepared]
    out = build_thd_row(
        rows,
        pad_token_id=int(getattr(prepared[0], "pad_token_id", 0)),
        ignore_index=-100,
        pad_to_multiple_of=pad_to_multiple_of,
    )
    tiles = [
        int(p.visual_values["num_patches"].numel()) if "num_patches" in p.visual_values else 0
        for p in prepared
    ]
    if language_max_sequence_length is not None:
        # the step's physical row: each aligned segment grown by its tiles (llava_step does not re-align)
        expanded = sum(
            align_up(int(r["input_ids"].numel()), pad_to_multiple_of) + n * (tokens_per_tile - 1)
            for r, n in zip(rows, tiles, strict=True)
        )
        if expanded > language_max_sequence_length:
            raise InBatchPackingError(
                f"the packed row is {expanded} language-model tokens after LLaVA expands its {sum(tiles)} "
                f"<image> tiles to {tokens_per_tile} each > language_max_sequence_length="
                f"{language_max_sequence_length} (llava_step would cut it there without an error)",
                fields="language_max_sequence_length",
            )
    pixels = [p.visual_values["pixel_values"] for p in prepared if "pixel_values" in p.visual_values]
    patches = [p.visual_values["num_patches"] for p in prepared if "num_patches" in p.visual_values]
    out["num_patches"] = torch.cat(patches) if patches else torch.zeros(0, dtype=torch.int32)
    out["visual_inputs"] = {"pixel_values": torch.cat(pixels)} if pixels else {}
    return out


def pack_mimo_language_shard(
    batch: Mapping[str, Any], *, lengths: Sequence[int] | torch.Tensor | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One data-parallel shard of a MegatronMIMO language batch (``[B, S]`` right-padded rows) packed into one
    tight THD row ``[1, T]``, as Bridge's ``megatron_mimo_step.forward_step`` does with
    ``defer_in_batch_packing_to_step=True`` (``data/megatron_mimo/sequence_pack.py`` ``pack_language_shard``,
    Bridge @a4916b8d0): each row's real length is the count of its ``attention_mask`` ones (``lengths``
    overrides it), the rows' first ``length`` tokens are concatenated in batch order (no alignment gaps, no
    length budget: the whole shard is one pack), ``labels`` padded with -100, ``loss_mask`` with 0,
    ``position_ids`` 2-D ``[B, S]`` or MRoPE ``[3, B, S]`` concatenated per row (each row's own positions), and
    ``attention_mask`` becomes ``None``. Returns ``(packed_batch, packing_kwargs)``: the other keys of
    ``batch`` (``modality_inputs``...) unchanged, and the ``cu_seqlens_{q,kv}[_padded]`` (int32, the padded
    ones equal: the row is tight) and ``max_seqlen_{q,kv}`` (int) that ``MimoModel.forward(packing_kwargs=...)``
    takes. ``input_ids`` may be ``None`` (a later pipeline stage packs labels and loss mask to the same row).

    Where Bridge would pack the wrong tokens silently, this refuses with an :class:`InBatchPackingError`
    naming the row: an ``attention_mask`` that is not ones-then-zeros (left padding, holes), a length longer
    than the row; and as Bridge, a missing or mis-shaped ``attention_mask`` and an empty shard.

    >>> batch = {"input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
    ...          "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
    ...          "labels": torch.tensor([[6, 7, -100, -100], [9, -100, -100, -100]])}
    >>> packed, kwargs = pack_mimo_language_shard(batch)
    >>> packed["input_ids"].tolist(), packed["labels"].tolist(), packed["attention_mask"]
    ([[5, 6, 7, 8, 9]], [[6, 7, -100, 9, -100]], None)
    >>> kwargs["cu_seqlens_q"].tolist(), kwargs["max_seqlen_q"]
    ([0, 3, 5], 3)
    """
    tensors = {k: batch.get(k) for k in ("input_ids", "labels", "loss_mask", "position_ids")}
    tensors = {k: v if isinstance(v, torch.Tensor) else None for k, v in tensors.items()}
    positions = tensors["position_ids"]
    if positions is not None and not (
        positions.dim() == 2 or (positions.dim() == 3 and positions.size(0) == 3)
    ):
        raise InBatchPackingError(
            f"position_ids must be [B, S] or MRoPE [3, B, S], got shape {tuple(positions.shape)}",
            fields="position_ids",
        )
    ref = next((tensors[k] for k in ("input_ids", "labels", "loss_mask") if tensors[k] is not None), None)
    if ref is not None:
        rows, width = int(ref.size(0)), int(ref.size(-1))
    elif positions is not None:
        rows, width = int(positions.size(-2)), int(positions.size(-1))
    else:
        raise InBatchPackingError(
            "a MegatronMIMO language shard needs at least one of input_ids, labels, loss_mask, position_ids"
        )
    if lengths is None:
        mask = batch.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise InBatchPackingError(
                "MegatronMIMO in-batch packing takes each row's length from a [batch, seq] attention_mask "
                "(covering the modality placeholder tokens); the batch has "
                + ("none" if mask is None else f"shape {tuple(getattr(mask, 'shape', ()))}"),
                fields="attention_mask",
            )
        if mask.size(-1) != width:
            raise InBatchPackingError(
                f"attention_mask width {mask.size(-1)} does not match the batch width {width}",
                fields="attention_mask",
            )
        real = mask.to(torch.bool)
        counts = real.sum(dim=1).to(torch.long)
        for row in range(real.size(0)):
            n = int(counts[row])
            if bool(real[row, n:].any()):
                raise InBatchPackingError(
                    f"row {row}: attention_mask is not right-padded (ones then zeros), so its length "
                    f"({n} ones) would pack the wrong tokens",
                    fields="attention_mask",
                )
    else:
        counts = torch.as_tensor(lengths, dtype=torch.long)
    if counts.dim() != 1 or counts.numel() != rows:
        raise InBatchPackingError(
            f"per-row lengths of shape {tuple(counts.shape)} for a shard of {rows} rows", fields="lengths"
        )
    seglens = [int(n) for n in counts.tolist()]
    for row, n in enumerate(seglens):
        if not 0 <= n <= width:
            raise InBatchPackingError(f"row {row}: length {n} outside [0, {width}]", fields="lengths")
    total = sum(seglens)
    if total == 0:
        raise InBatchPackingError("every row of the shard has length 0: nothing to pack")
    device = (ref if ref is not None else positions).device  # type: ignore[union-attr]
    cu = torch.tensor([0, *torch.tensor(seglens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    def concat(src: torch.Tensor | None) -> torch.Tensor | None:
        if src is None:
            return None
        return torch.cat([src[i, :n] for i, n in enumerate(seglens)]).reshape(1, total)

    packed = dict(batch)
    if tensors["input_ids"] is not None:
        packed["input_ids"] = concat(tensors["input_ids"])
    packed["labels"] = concat(tensors["labels"])
    packed["loss_mask"] = concat(tensors["loss_mask"])
    if positions is None:
        packed["position_ids"] = None
    elif positions.dim() == 3:
        packed["position_ids"] = torch.cat([positions[:, i, :n] for i, n in enumerate(seglens)], dim=1)[
            :, None
        ]
    else:
        packed["position_ids"] = concat(positions)
    packed["attention_mask"] = None  # block-diagonal attention comes from cu_seqlens
    longest = max(seglens)
    kwargs = {
        "cu_seqlens_q": cu,
        "cu_seqlens_kv": cu,
        "cu_seqlens_q_padded": cu,
        "cu_seqlens_kv_padded": cu,
        "max_seqlen_q": longest,
        "max_seqlen_kv": longest,
    }
    return packed, kwargs


ON_BAD_SAMPLE: tuple[str, ...] = ("skip", "raise")


class VisualInBatchCollator:
    """A ``collate_fn`` for collate-time ("in-batch") packing of VLM micro-batches (MBS > 1): each example is
    prepared by ``prepare`` (e.g. ``longpack.vlm.QwenVLPreparer(...).prepare``) and the micro-batch becomes one
    THD row (:func:`build_visual_thd_batch`); Bridge's ``qwen2_5_collate_fn(enable_in_batch_packing=True)``.

    A bad sample (``prepare`` raises an error with a ``reason`` and a ``key``, as ``longpack.vlm.SampleRejected``
    does for a limit, an unreadable or refused image, placeholders that do not match the images, a malformed
    conversation), or one longer than ``sequence_length`` (reason ``too_long``), is handled by
    ``on_bad_sample``: ``"skip"`` (default) leaves it out and lists it in the batch's ``skipped`` key as
    ``{"key", "reason", "message"}`` (so the refusal reaches the trainer even from loader worker processes) while
    its neighbours are packed; ``"raise"`` raises it (its message names the sample). A micro-batch whose every
    sample is refused is a :class:`InBatchPackingError` naming each. Errors without a ``reason`` (a setting that
    fails for every sample) are raised. ``emit_padding_mask`` defaults to ``pad_to_multiple_of > 1`` (Bridge's
    text in-batch collate does the same).
    """

    def __init__(
        self,
        prepare: Any,
        *,
        sequence_length: int | None,
        pad_to_multiple_of: int = 1,
        pad_to_max_length: bool = False,
        emit_padding_mask: bool | None = None,
        on_bad_sample: str = "skip",
    ) -> None:
        if not callable(prepare):
            raise InBatchPackingError(
                f"prepare must be callable (one example -> prepared sequence), got {prepare!r}"
            )
        if on_bad_sample not in ON_BAD_SAMPLE:
            raise InBatchPackingError(
                f"on_bad_sample={on_bad_sample!r} is not one of {ON_BAD_SAMPLE}", fields="on_bad_sample"
            )
        self.prepare = prepare
        self.sequence_length = sequence_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_to_max_length = pad_to_max_length
        self.emit_padding_mask = pad_to_multiple_of > 1 if emit_padding_mask is None else emit_padding_mask
        self.on_bad_sample = on_bad_sample

    def __call__(self, examples: Sequence[Any]) -> dict[str, Any]:
        from longpack.errors import LongpackError

        prepared, skipped = [], []
        for i, example in enumerate(examples):
            try:
                seq = self.prepare(example)
            except LongpackError as exc:
                reason = getattr(exc, "reason", None)
                if reason is None or self.on_bad_sample == "raise":
                    raise
                skipped.append({"key": getattr(exc, "key", str(i)), "reason": reason, "message": str(exc)})
                continue
            n = int(seq.row["input_ids"].numel())
            if self.sequence_length is not None and n > self.sequence_length:
                key = getattr(seq, "key", str(i))
                message = f"sample {key}: {n} tokens after expansion > sequence_length={self.sequence_length}"
                if self.on_bad_sample == "raise":
                    raise InBatchPackingError(message, fields="sequence_length")
                skipped.append({"key": key, "reason": "too_long", "message": message})
                continue
            prepared.append(seq)
        if not prepared:
            reasons = "; ".join(s["message"] for s in skipped)
            raise InBatchPackingError(f"every sample of this micro-batch was refused: {reasons}")
        out = build_visual_thd_batch(
            prepared,
            sequence_length=self.sequence_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            pad_to_max_length=self.pad_to_max_length,
            emit_padding_mask=self.emit_padding_mask,
        )
        out["sample_keys"] = [getattr(p, "key", None) for p in prepared]
        out["skipped"] = skipped
        return out
