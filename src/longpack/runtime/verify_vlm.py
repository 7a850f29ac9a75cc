"""Packed = unpacked for Qwen-VL rows: mRoPE (3-D) positions, image features and the text decoder.

:func:`verify_visual_row` takes prepared Qwen-VL sequences (``longpack.vlm.QwenVLPreparer(...).prepare``),
builds the THD row Megatron-Bridge's Qwen-VL packing builds (:func:`~longpack.runtime.in_batch.
build_visual_thd_batch`, with longpack's 3-D positions), and runs a tiny random model of the family
(:func:`build_visual_model`: transformers' ``Qwen2VLModel`` / ``Qwen2_5_VLModel`` built from the config alone,
float64, text and vision towers shrunk, vocabulary, mRoPE sections (scaled), patch, merge and temporal sizes
kept) on it, against every sequence alone. Checks (each a :class:`~longpack.runtime.verify.Failure`):

- ``metadata``: the row's physical ``cu_seqlens`` are the sequences' aligned offsets; every sequence's 3-D
  positions in the row equal transformers' own ``get_rope_index`` on that sequence alone (an independent
  oracle), so every packed sequence restarts at 0 on all three axes;
- ``vision``: the image features of the packed row's pixels (all images of the row through the vision tower at
  once) equal each sequence's own, image by image;
- ``loss`` / ``gradients``: per-sequence loss of the text decoder (THD attention from ``cu_seqlens``, mRoPE
  positions from the row) equals the sequence alone (transformers' ``sdpa``, its own causal mask); parameter
  and input-embedding gradients too (random per-sequence weights);
- ``isolation``: the gradient of the even sequences' losses w.r.t. the odd sequences' input embeddings, and
  the reverse, is exactly zero;
- ``padding``: no loss on a token outside ``cu_seqlens``.

Not covered: video rows (the same code path with ``pixel_values_videos``; not exercised here), Qwen3-VL
(deepstack features are added inside the decoder layers), and the ``hf`` backend's CP and PP checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from longpack.errors import ConfigError
from longpack.runtime.verify import (
    TOLERANCE,
    Failure,
    RowReport,
    batch_layout,
    metadata_failures,
    run_thd,
    token_losses,
)
from longpack.runtime.verify_model import HEAD_CLASSES, register_thd_attention, run_in_float64
from longpack.topology import align_up

__all__ = [
    "VISUAL_FAULTS",
    "VISUAL_MODEL_TYPES",
    "VisualRowReport",
    "build_visual_model",
    "verify_visual_row",
]

#: Families whose text decoder and vision tower verify can build (transformers model types).
VISUAL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
#: Faults of a Qwen-VL row (what a broken stack does) -> what they model. Each must fail.
VISUAL_FAULTS = {
    "positions-not-restarted": "the 3-D positions run on across sequences instead of restarting at 0",
    "positions-1d": "1-D positions restarting per sequence instead of mRoPE (a stack that drops the 3-D index)",
    "drop-cu-seqlens": "the attention receives no cu_seqlens",
}
#: Shrunk text decoder: head_dim 16 keeps Qwen-VL's mRoPE split (16, 24, 24 of 64 frequencies) exact as 2, 3, 3.
TINY_TEXT = {
    "hidden_size": 32,
    "num_attention_heads": 2,
    "head_dim": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
}
#: Shrunk vision tower (patch, merge and temporal sizes are the source's: the processor's pixels depend on them).
TINY_VISION = {
    "depth": 1,
    "num_heads": 2,
    "embed_dim": 16,
    "hidden_size": 16,
    "intermediate_size": 16,
    "mlp_ratio": 1,
}


@dataclass(frozen=True, kw_only=True)
class VisualRowReport(RowReport):
    """A :class:`~longpack.runtime.verify.RowReport` plus the image features' worst relative difference."""

    vision_max_rel_diff: float = 0.0


def build_visual_model(source: Mapping[str, Any], *, seed: int = 0) -> Any:
    """The tiny float64 Qwen-VL model (``Qwen2VLModel`` / ``Qwen2_5_VLModel``, no LM head) of ``source`` (a
    ``config.json`` dict), weights from ``seed``, in eval mode."""
    from transformers import AutoConfig, AutoModel

    register_thd_attention()
    settings = dict(source)
    model_type = settings.pop("model_type", None)
    if model_type not in VISUAL_MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r}: verify builds Qwen-VL rows for {', '.join(VISUAL_MODEL_TYPES)}",
            fields="model",
        )
    for key in ("architectures", "torch_dtype", "dtype", "quantization_config"):
        settings.pop(key, None)
    config = AutoConfig.for_model(model_type, **settings)
    text, vision = config.text_config, config.vision_config
    rope = dict(text.rope_parameters or {})
    section = [int(s) for s in rope.get("mrope_section", (16, 24, 24))]
    half = TINY_TEXT["head_dim"] // 2
    if any((half * s) % sum(section) for s in section):
        raise ConfigError(f"mrope_section {section} does not scale to {half} frequencies", fields="model")
    rope["mrope_section"] = [half * s // sum(section) for s in section]
    kv = int(getattr(text, "num_key_value_heads", 0) or 0)
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    for key, value in TINY_TEXT.items():
        setattr(text, key, value)
    text.num_key_value_heads = 2 if kv in (0, heads) else 1
    text.rope_parameters = rope
    text.layer_types = ["full_attention"]
    text.initializer_range = 0.2
    text.use_sliding_window = False
    for key, value in TINY_VISION.items():
        if hasattr(vision, key):
            setattr(vision, key, value)
    if hasattr(vision, "out_hidden_size"):
        vision.out_hidden_size = TINY_TEXT["hidden_size"]
    else:
        vision.hidden_size = TINY_TEXT["hidden_size"]  # Qwen2-VL: the merger's output width
    if hasattr(vision, "fullatt_block_indexes"):
        vision.fullatt_block_indexes = [0]
    config.tie_word_embeddings = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModel.from_config(config, dtype=torch.float64)
    model.eval()
    model.config._attn_implementation = "sdpa"
    model.language_model.config._attn_implementation = "sdpa"
    run_in_float64(model)
    run_in_float64(model.language_model)
    return model


def _image_features(model: Any, visual: Mapping[str, Any]) -> torch.Tensor:
    pixels = visual.get("pixel_values")
    if pixels is None or not len(pixels):
        return torch.zeros(0, int(model.config.text_config.hidden_size), dtype=torch.float64)
    with torch.no_grad():
        out = model.get_image_features(torch.as_tensor(pixels), torch.as_tensor(visual["image_grid_thw"]))
    return torch.cat(list(out.pooler_output))


def _inputs(model: Any, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    embeds = model.get_input_embeddings()(ids.view(1, -1)).detach()
    mask = (ids == int(model.config.image_token_id)).view(1, -1, 1).expand_as(embeds)
    return embeds.masked_scatter(mask, features.to(embeds.dtype))


def verify_visual_row(
    sequences: Sequence[Any],
    model: Any,
    *,
    pad_to_multiple_of: int = 1,
    seed: int = 0,
    where: Mapping[str, Any] | None = None,
    fault: str | None = None,
) -> RowReport:
    """Check one Qwen-VL THD row of ``sequences`` (prepared sequences) with ``model``
    (:func:`build_visual_model`); ``fault``: one of :data:`VISUAL_FAULTS`, to see the check fail."""
    from longpack.runtime.in_batch import build_visual_thd_batch

    where = {
        "split": "vlm",
        "file": "prepared sequences",
        "row": 0,
        **(where or {}),
        "rank": "single process",
    }
    batch = build_visual_thd_batch(sequences, sequence_length=None, pad_to_multiple_of=pad_to_multiple_of)
    tokens = batch["input_ids"][0]
    width = tokens.numel()
    lengths = [int(s.row["input_ids"].numel()) for s in sequences]
    aligned = [align_up(n, pad_to_multiple_of) for n in lengths]
    spans = np.concatenate([[0], np.cumsum(aligned)]).astype(np.int64)
    positions = batch["mrope_position_ids"][:, 0]  # [3, T]
    if fault is not None and fault not in VISUAL_FAULTS:
        raise ConfigError(f"fault must be one of {', '.join(VISUAL_FAULTS)}, got {fault!r}", fields="fault")
    if fault == "positions-not-restarted":
        positions = torch.arange(width).expand(3, width).clone()
    if fault == "positions-1d":
        positions = batch["position_ids"].view(1, width).expand(3, width).clone()
    if fault == "drop-cu-seqlens":
        batch = {k: v for k, v in batch.items() if not k.startswith("cu_seqlens")}
    failures = metadata_failures(batch, spans, None, where)
    language = model.language_model
    head = (
        torch.randn(
            TINY_TEXT["hidden_size"],
            HEAD_CLASSES,
            generator=torch.Generator().manual_seed(seed + 1),
            dtype=torch.float64,
        )
        / TINY_TEXT["hidden_size"] ** 0.5
    )
    weights = 0.5 + torch.rand(
        len(sequences), generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64
    )
    params = [p for p in language.parameters() if p.requires_grad]

    # Each sequence alone: transformers' positions, its own image features, sdpa.
    rope_diff = 0
    vision_diff = 0.0
    own_features = []
    ref_losses, ref_embed_grads = [], []
    ref_param = [torch.zeros_like(p) for p in params]
    for i, seq in enumerate(sequences):
        ids = seq.row["input_ids"].to(torch.int64)
        grid = seq.visual_values.get("image_grid_thw")
        types = (ids == int(model.config.image_token_id)).to(torch.int32).view(1, -1)
        oracle, _ = model.get_rope_index(
            ids.view(1, -1), types, image_grid_thw=None if grid is None else torch.as_tensor(grid)
        )
        start = int(spans[i])
        got = positions[:, start : start + ids.numel()]
        if not torch.equal(got, oracle[:, 0]):
            rope_diff += 1
            if rope_diff == 1:
                bad = int((got != oracle[:, 0]).any(dim=0).nonzero()[0])
                failures.append(
                    Failure(
                        check="metadata",
                        sample=i,
                        detail=f"3-D position of token {bad} is {got[:, bad].tolist()}, transformers' "
                        f"get_rope_index on the sequence alone gives {oracle[:, 0, bad].tolist()}",
                        **where,
                    )
                )
        features = _image_features(model, seq.visual_values)
        own_features.append(features)
        inputs = _inputs(model, ids, features).requires_grad_(True)
        hidden = language(inputs_embeds=inputs, position_ids=oracle).last_hidden_state[0]
        loss = token_losses(hidden, seq.row["labels"], seq.row["loss_mask"], head).sum()
        grads = torch.autograd.grad(loss * weights[i], [inputs, *params], allow_unused=True)
        ref_losses.append(loss.detach())
        ref_embed_grads.append(grads[0][0])
        for acc, g in zip(ref_param, grads[1:], strict=True):
            if g is not None:
                acc += g

    # The packed row: all pixels through the vision tower at once, THD attention, the row's 3-D positions.
    packed_features = _image_features(model, batch.get("visual_inputs", {}))
    expected = torch.cat(own_features) if own_features else packed_features
    if packed_features.shape != expected.shape:
        vision_diff = float("inf")
    elif expected.numel():
        vision_diff = float((packed_features - expected).abs().max()) / max(1.0, float(expected.abs().max()))
    if vision_diff > TOLERANCE:
        failures.append(
            Failure(
                check="vision",
                sample=None,
                detail=f"image features of the packed row differ from each sequence's own (relative {vision_diff:.2e})",
                **where,
            )
        )
    inputs = _inputs(model, tokens, packed_features).requires_grad_(True)
    language.config._attn_implementation = "sdpa"
    hidden = run_thd(language, inputs, positions.unsqueeze(1), _plan(batch, width))
    per_token = token_losses(hidden, batch["labels"][0], batch["loss_mask"][0], head)
    packed_losses = torch.stack([per_token[int(a) : int(b)].sum() for a, b in itertools.pairwise(spans)])
    loss_diffs = [
        abs(float(a) - float(b)) / max(1.0, abs(float(b)))
        for a, b in zip(packed_losses.detach(), ref_losses, strict=True)
    ]
    worst = int(np.argmax(loss_diffs))
    if loss_diffs[worst] > TOLERANCE:
        failures.append(
            Failure(
                check="loss",
                sample=worst,
                detail=f"packed loss {float(packed_losses[worst].detach()):.12g} != alone {float(ref_losses[worst]):.12g} "
                f"(relative {loss_diffs[worst]:.2e})",
                **where,
            )
        )
    owner = torch.full((width,), -1, dtype=torch.int64)
    for i, n in enumerate(lengths):
        owner[int(spans[i]) : int(spans[i]) + n] = i
    parity = torch.arange(len(sequences)) % 2
    summed = [torch.zeros_like(p) for p in params]
    embed_diff, leak, leak_sample = 0.0, 0.0, None
    for p in (0, 1):
        chosen = (parity == p).to(torch.float64)
        if not bool(chosen.any()):
            continue
        grads = torch.autograd.grad(
            (packed_losses * weights * chosen).sum(), [inputs, *params], retain_graph=True, allow_unused=True
        )
        for acc, g in zip(summed, grads[1:], strict=True):
            if g is not None:
                acc += g
        g_embed = grads[0][0]
        foreign = (owner < 0) | (parity[owner.clamp(min=0)] != p)
        size = float(g_embed[foreign].abs().max()) if bool(foreign.any()) else 0.0
        if size > leak:
            leak = size
            hit = ((g_embed.abs().amax(dim=1) > 0) & foreign).nonzero()
            leak_sample = int(owner[int(hit[0])]) if hit.numel() else None
        for i in range(p, len(sequences), 2):
            got = g_embed[int(spans[i]) : int(spans[i]) + lengths[i]]
            want = ref_embed_grads[i]
            embed_diff = max(embed_diff, float((got - want).abs().max()) / max(1.0, float(want.abs().max())))
    outside = (owner < 0) & (batch["loss_mask"][0] != 0)
    if bool(outside.any()):
        failures.append(
            Failure(
                check="padding",
                sample=None,
                detail=f"{int(outside.sum())} token(s) outside cu_seqlens carry loss",
                **where,
            )
        )
    param_diff = max(
        (
            float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
            for a, b in zip(summed, ref_param, strict=True)
        ),
        default=0.0,
    )
    if max(param_diff, embed_diff) > TOLERANCE:
        failures.append(
            Failure(
                check="gradients",
                sample=None,
                detail=f"gradients differ from each sequence alone (parameters {param_diff:.2e}, input embeddings "
                f"{embed_diff:.2e})",
                **where,
            )
        )
    if leak > 0.0:
        failures.append(
            Failure(
                check="isolation",
                sample=leak_sample,
                detail=f"another sequence's loss has a gradient of up to {leak:.2e} w.r.t. this sequence's inputs",
                **where,
            )
        )
    kept: list[Failure] = []
    for failure in failures:
        if all(k.check != failure.check for k in kept):
            kept.append(failure)
    return VisualRowReport(
        split=str(where["split"]),
        file=str(where["file"]),
        row=int(where["row"]),
        index=int(where["row"]),
        tokens=int(sum(lengths)),
        samples=len(sequences),
        loss_max_rel_diff=max(loss_diffs),
        grad_max_rel_diff=param_diff,
        embedding_grad_max_rel_diff=embed_diff,
        leak_max_abs=leak,
        padding_loss_tokens=int(outside.sum()),
        in_batch_max_rel_diff=0.0,
        vision_max_rel_diff=vision_diff,
        failures=tuple(kept),
    )


def _plan(batch: Mapping[str, Any], width: int) -> Any:
    from longpack.runtime.verify_model import attention_plan

    return attention_plan(batch_layout(batch, width))
