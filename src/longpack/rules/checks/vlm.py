"""VLM packing (Qwen-VL task encoder): visual limits against the pack, and the packing buffer's host memory.

The MBS rules, the mutual exclusions and Energon's rejections (MTP, CUDA graphs, PP, the EP-overlap warning)
live in the ``packing`` and ``energon`` families, the model-family opt-outs (Qwen3.5-VL, GLM-4.5V) in
``family``; these rules read the task encoder's own settings (Megatron-Bridge
``QwenVLEnergonTaskEncoderConfig``: ``dataset.task_encoder.*``).
"""

from __future__ import annotations

from collections.abc import Iterator

from longpack.choices import DEFERRED_VLM_ENCODERS
from longpack.rules.checks.common import K_BUF, K_DSEQ, E, V, W
from longpack.rules.config import DatasetKind, TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("vlm", "VLM packing (Qwen-VL task encoder)")

K_TE = "dataset.task_encoder"
K_MINPX = f"{K_TE}.min_pixels"
K_MAXPX = f"{K_TE}.max_pixels"
K_MAXIMG = f"{K_TE}.max_num_images"
K_MAXVT = f"{K_TE}.max_visual_tokens"
K_WORKERS = "dataset.num_workers"
#: Megatron-Bridge's ``QwenVLEnergonTaskEncoderConfig`` defaults (used for settings not given).
BRIDGE_DEFAULTS = {
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "min_pixels": 200704,
    "max_pixels": 1003520,
    "max_num_images": 10,
    "max_visual_tokens": 16384,
}
#: Above this worst-case buffer memory per rank (all its loader workers) the buffer rule warns.
BUFFER_WARN_BYTES = 16 * 2**30


def _te(s: TrainingSetup, name: str) -> int | None:
    return getattr(s.dataset, f"te_{name}")


def _te_or_default(s: TrainingSetup, name: str) -> int:
    value = _te(s, name)
    return BRIDGE_DEFAULTS[name] if value is None else value


def worst_case_sample_bytes(s: TrainingSetup) -> tuple[int, int, str]:
    """``(bytes, patches, what bounds them)``: the most host memory one prepared sample's ``pixel_values``
    can take (float32, ``3 * temporal_patch * patch**2`` values per patch), bounded by the image count times
    the patches of a ``max_pixels`` image, by ``max_visual_tokens * merge**2`` and by the pack width (an
    accepted sample has at most ``seq_length`` tokens).

    >>> from longpack.rules.config import setup_from_mapping
    >>> s = setup_from_mapping({"dataset": {"seq_length": 8192}}).setup
    >>> worst_case_sample_bytes(s)
    (154140672, 32768, 'seq_length=8192 tokens * merge 2**2')
    """
    patch = _te_or_default(s, "patch_size")
    merge = _te_or_default(s, "spatial_merge_size")
    bounds = [
        (
            _te_or_default(s, "max_num_images") * (_te_or_default(s, "max_pixels") // patch**2),
            f"max_num_images={_te_or_default(s, 'max_num_images')} * max_pixels={_te_or_default(s, 'max_pixels')}"
            f" / patch {patch}**2",
        ),
        (
            _te_or_default(s, "max_visual_tokens") * merge**2,
            f"max_visual_tokens={_te_or_default(s, 'max_visual_tokens')} * merge {merge}**2",
        ),
    ]
    seq = s.dataset.seq_length or s.model.seq_length
    if seq:
        bounds.append((seq * merge**2, f"seq_length={seq} tokens * merge {merge}**2"))
    patches, why = min(bounds)
    return pixel_bytes(s, patches), patches, why


def pixel_bytes(s: TrainingSetup, patches: int) -> int:
    """Host bytes of ``patches`` prepared patches: float32, ``3 * temporal_patch * patch**2`` values each (the
    ``pixel_values`` term of ``longpack.vlm.prepare.prepared_nbytes``, which the packers count; a test binds
    the two).

    >>> from longpack.rules.config import setup_from_mapping
    >>> pixel_bytes(setup_from_mapping({}).setup, 1)  # 3 * 2 * 14**2 float32 values
    4704
    """
    values_per_patch = 3 * _te_or_default(s, "temporal_patch_size") * _te_or_default(s, "patch_size") ** 2
    return patches * values_per_patch * 4


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


@FAMILY.rule(
    "LP-VLM-001",
    E,
    "task-encoder sizes and limits are positive",
    "C.1 (QwenVLEnergonTaskEncoderConfig.validate)",
    fix="set the named task-encoder size to an integer >= 1 (a limit: >= 1, or null to disable it)",
)
def vlm_positive(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge refuses a non-positive patch size, merge size, temporal patch size or pixel bound,
    and a limit (images, frames, visual tokens) that is set but not positive."""
    for name in (
        "patch_size",
        "spatial_merge_size",
        "temporal_patch_size",
        "min_pixels",
        "max_pixels",
        "max_num_images",
        "max_num_frames",
        "max_visual_tokens",
    ):
        value = _te(s, name)
        if value is not None and value < 1:
            key = f"{K_TE}.{name}"
            yield V(f"{key}={value} must be a positive integer", f"set {key} to a value >= 1 (or null)", key)


@FAMILY.rule(
    "LP-VLM-002",
    E,
    "task-encoder min_pixels <= max_pixels",
    "transformers Qwen2-VL smart_resize",
    fix="set dataset.task_encoder.min_pixels <= dataset.task_encoder.max_pixels",
)
def vlm_pixel_range(s: TrainingSetup) -> Iterator[Violation]:
    """The processor resizes every image into ``[min_pixels, max_pixels]``; with the bounds crossed an image
    that is scaled up past ``max_pixels`` is never scaled back, so token counts stop following the budget."""
    lo, hi = _te_or_default(s, "min_pixels"), _te_or_default(s, "max_pixels")
    if (_te(s, "min_pixels") is not None or _te(s, "max_pixels") is not None) and lo > hi:
        yield V(
            f"{K_MINPX}={lo} > {K_MAXPX}={hi}",
            f"set {K_MINPX} <= {K_MAXPX} (Bridge's defaults: 200704 and 1003520)",
            K_MINPX,
            K_MAXPX,
        )


@FAMILY.rule(
    "LP-VLM-003",
    W,
    "max_visual_tokens below the pack width",
    "C.3",
    fix="set dataset.task_encoder.max_visual_tokens below dataset.seq_length (room for the text), or raise seq_length",
)
def vlm_visual_budget(s: TrainingSetup) -> Iterator[Violation]:
    """A sample is checked against ``max_visual_tokens`` first and against the pack width after the image
    pads are expanded: with a visual budget of at least ``seq_length`` tokens, samples near the budget pass
    the first check and fail the second (Bridge's encoder raises for each, counted toward its failure
    tolerance of 100 in a row; in-batch packing raises in the collate)."""
    budget = _te(s, "max_visual_tokens")
    seq = s.dataset.seq_length or s.model.seq_length
    packing = s.dataset.energon_packing or s.dataset.enable_in_batch_packing
    if packing and budget is not None and seq and budget >= seq:
        yield V(
            f"{K_MAXVT}={budget} >= seq_length={seq}: samples with that many visual tokens cannot fit a pack",
            f"set {K_MAXVT} below {seq} (e.g. {seq * 3 // 4}, leaving room for the text), or raise {K_DSEQ}",
            K_MAXVT,
            K_DSEQ,
        )


@FAMILY.rule(
    "LP-VLM-004",
    W,
    "packing buffer's worst-case pixel memory per rank under 16 GiB",
    "Energon packing_buffer_size (per worker); Bridge QwenVLTaskEncoder.encode_sample prepares pixels on entry",
    fix="set dataset.task_encoder._target_ to longpack's deferred-decoding QwenVLPackingEncoder (its buffer holds "
    "encoded media and token counts) or lower dataset.packing_buffer_size (8-16 for high-resolution or video "
    "data) or max_pixels / max_num_images, and measure worker RSS with `longpack online-sim --vlm`",
)
def vlm_buffer_memory(s: TrainingSetup) -> Iterator[Violation]:
    """Energon's packing buffer holds ``packing_buffer_size`` candidates **per loader worker**. Megatron-Bridge's
    ``QwenVLTaskEncoder`` (and longpack's eager encoder) prepares a sample when it enters the buffer, so each
    candidate keeps its float32 pixel patches until its pack is emitted: the worst case per rank is
    ``max(num_workers, 1) * packing_buffer_size * worst sample``. longpack's deferred encoder
    (:data:`~longpack.choices.DEFERRED_VLM_ENCODERS`) buffers encoded media and token counts and decodes the
    members of one pack when it is emitted: its pixel worst case is ``max(num_workers, 1) * one pack``, a
    pack holding at most ``seq_length`` tokens, so ``seq_length * merge**2`` patches (plus the buffered
    samples' encoded bytes, which depend on the data: ``online-sim --vlm`` measures them)."""
    buffer = s.dataset.packing_buffer_size
    if (
        not s.dataset.energon_packing
        or buffer is None
        or buffer < 1
        or s.dataset.kind is not DatasetKind.ENERGON
    ):
        return
    per_sample, patches, why = worst_case_sample_bytes(s)
    workers = max(s.dataset.num_workers or 1, 1)
    seq = s.dataset.seq_length or s.model.seq_length
    if s.dataset.task_encoder_target in DEFERRED_VLM_ENCODERS and seq:
        merge = _te_or_default(s, "spatial_merge_size")
        pack = pixel_bytes(s, seq * merge**2)
        total = workers * pack
        if total > BUFFER_WARN_BYTES:
            yield V(
                f"decoded pack worst case {_gib(total)} per rank (deferred decoding): {workers} worker(s) * one pack "
                f"of seq_length={seq} tokens * merge {merge}**2 patches = {pack / 2**20:.1f} MiB, plus the buffered "
                "samples' encoded media",
                f"lower {K_DSEQ} or {K_WORKERS}; measure the real distribution with `longpack online-sim --vlm FILE`",
                K_DSEQ,
                K_WORKERS,
            )
        return
    total = workers * buffer * per_sample
    if total > BUFFER_WARN_BYTES:
        yield V(
            f"packing buffer worst case {_gib(total)} per rank (the buffer holds prepared pixels): {workers} "
            f"worker(s) * packing_buffer_size={buffer} * {per_sample / 2**20:.1f} MiB per sample ({patches} "
            f"patches, bounded by {why})",
            f"set {K_TE}._target_ to longpack's deferred-decoding {DEFERRED_VLM_ENCODERS[0].rsplit('.', 1)[1]} "
            "(its buffer holds encoded bytes and token counts; pixels are decoded when a pack is emitted), or lower "
            f"{K_BUF} (8-16 for "
            f"high-resolution data) or {K_MAXPX} / {K_MAXIMG}; measure the real distribution with "
            "`longpack online-sim --vlm FILE`",
            K_BUF,
            K_WORKERS,
        )
