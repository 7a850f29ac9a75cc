"""Energon native packing: what ``EnergonDatasetConfig`` and ``ConfigContainer.validate`` require of it."""

from __future__ import annotations

from collections.abc import Iterator

from longpack.rules.checks.common import INFO, K_AIC, K_BUF, K_CGI, K_IBP, K_MBS, K_MTP, K_PP, K_PTL, E, V, W
from longpack.rules.config import ENERGON_BUILDER_OWNED_KWARGS, DatasetKind, TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("energon", "Energon native packing")


def _energon(s: TrainingSetup) -> bool:
    return s.dataset.energon_packing


@FAMILY.rule(
    "LP-EN-001",
    E,
    "Energon packing needs train.micro_batch_size=1",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set train.micro_batch_size=1",
)
def en_mbs(s: TrainingSetup) -> Iterator[Violation]:
    """Energon packs replace the batch dimension: one pack per micro-batch."""
    if _energon(s) and s.micro_batch_size != 1:
        yield V(
            f"Energon native packing (packing_buffer_size={s.dataset.packing_buffer_size}) with "
            f"train.micro_batch_size={s.micro_batch_size}",
            "set train.micro_batch_size=1 (packs replace the batch dimension)",
            K_MBS,
            K_BUF,
        )


@FAMILY.rule(
    "LP-EN-002",
    E,
    "Energon dataset and eval MBS equal train.micro_batch_size",
    "Bridge ConfigContainer.validate (Energon datasets)",
    fix="set dataset.micro_batch_size and validation.eval_micro_batch_size to train.micro_batch_size",
)
def en_mbs_match(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge (0.6.0 on) requires an Energon dataset's micro-batch size to equal the training
    one, and the evaluation one too, packing or not."""
    if s.dataset.kind is not DatasetKind.ENERGON:
        return
    for key, value in (
        ("dataset.micro_batch_size", s.dataset.micro_batch_size),
        ("validation.eval_micro_batch_size", s.eval_micro_batch_size),
    ):
        if value is not None and value != s.micro_batch_size:
            yield V(
                f"{key}={value} differs from train.micro_batch_size={s.micro_batch_size}",
                f"set {key}={s.micro_batch_size}",
                key,
                K_MBS,
            )


@FAMILY.rule(
    "LP-EN-003",
    E,
    "Energon packing needs calculate_per_token_loss=True",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set model.calculate_per_token_loss=true",
)
def en_per_token(s: TrainingSetup) -> Iterator[Violation]:
    """Packs hold a variable number of samples, so the loss must be normalized per token."""
    if _energon(s) and not s.model.calculate_per_token_loss:
        yield V(
            "Energon native packing with calculate_per_token_loss=False: packs hold a variable number of samples",
            "set model.calculate_per_token_loss=true",
            K_PTL,
        )


@FAMILY.rule(
    "LP-EN-004",
    E,
    "Energon packing needs ddp.average_in_collective=False",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set ddp.average_in_collective=false",
)
def en_avg(s: TrainingSetup) -> Iterator[Violation]:
    """Per-token loss sums over ranks; averaging in the gradient collective would divide twice."""
    if _energon(s) and s.average_in_collective:
        yield V(
            "Energon native packing with ddp.average_in_collective=True",
            "set ddp.average_in_collective=false",
            K_AIC,
        )


@FAMILY.rule(
    "LP-EN-005",
    E,
    "Energon packing does not support MTP",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set model.mtp_num_layers=null, or turn native packing off (dataset.packing_buffer_size=null)",
)
def en_mtp(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge refuses multi-token prediction with Energon native packing."""
    if _energon(s) and (s.model.mtp_num_layers or 0) > 0:
        yield V(
            f"Energon native packing with mtp_num_layers={s.model.mtp_num_layers}",
            f"set {K_MTP}=null, or turn native packing off ({K_BUF}=null)",
            K_MTP,
            K_BUF,
        )


@FAMILY.rule(
    "LP-EN-006",
    E,
    "Energon packing does not support CUDA graphs",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set model.cuda_graph_impl=none and model.vision_cuda_graph_impl=none",
)
def en_graphs(s: TrainingSetup) -> Iterator[Violation]:
    """Energon packs change shape every step; Megatron-Bridge refuses language and vision CUDA graphs."""
    vision = s.model.vision_cuda_graph_impl
    if _energon(s) and (s.model.training_cuda_graph or vision not in (None, "none", "")):
        yield V(
            f"Energon native packing with cuda_graph_impl={s.model.cuda_graph_impl!r}, vision_cuda_graph_impl={vision!r}",
            f"set {K_CGI}=none and model.vision_cuda_graph_impl=none",
            K_CGI,
            "model.vision_cuda_graph_impl",
        )


@FAMILY.rule(
    "LP-EN-007",
    E,
    "Energon packing does not support Qwen3-VL DistTrain",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set dist_train.use_dist_train=false",
)
def en_dist_train(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge refuses Qwen3-VL DistTrain with Energon native packing."""
    if _energon(s) and s.use_dist_train:
        yield V(
            "Energon native packing with dist_train.use_dist_train=True",
            "set dist_train.use_dist_train=false",
            "dist_train.use_dist_train",
        )


@FAMILY.rule(
    "LP-EN-008",
    E,
    "Energon packing does not support pipeline parallelism",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set model.pipeline_model_parallel_size=1 (use TP/CP/EP), or turn native packing off",
)
def en_pp(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge does not yet support pipeline parallelism with Energon native packing."""
    if _energon(s) and s.pp > 1:
        yield V(
            f"Energon native packing with pipeline_model_parallel_size={s.pp} ('does not yet support pipeline parallelism')",
            "set model.pipeline_model_parallel_size=1 (use TP/CP/EP), or turn native packing off",
            K_PP,
            K_BUF,
        )


@FAMILY.rule(
    "LP-EN-009",
    W,
    "Energon packing turns MoE EP overlap and delayed wgrad off",
    "Bridge ConfigContainer.validate (Energon packing)",
    fix="set model.overlap_moe_expert_parallel_comm=false and model.delay_wgrad_compute=false",
)
def en_ep_overlap(s: TrainingSetup) -> Iterator[Violation]:
    """The combined-1F1B schedule behind EP overlap does not forward packed metadata, so Megatron-Bridge
    turns both off with a warning; the config then does not say what runs."""
    m = s.model
    if _energon(s) and (m.overlap_moe_expert_parallel_comm or m.delay_wgrad_compute or s.comm_overlap_moe_ep):
        yield V(
            "Energon native packing with overlap_moe_expert_parallel_comm/delay_wgrad_compute requested: Bridge "
            "disables both with a warning (the combined-1F1B schedule does not forward packed metadata)",
            "set model.overlap_moe_expert_parallel_comm=false and model.delay_wgrad_compute=false so the config "
            "says what runs",
            "model.overlap_moe_expert_parallel_comm",
            "model.delay_wgrad_compute",
        )


@FAMILY.rule(
    "LP-EN-010",
    E,
    "Energon packing and in-batch packing are mutually exclusive",
    "Bridge EnergonDatasetConfig.validate",
    fix="set dataset.enable_in_batch_packing=false (or dataset.packing_buffer_size=null)",
)
def en_inbatch(s: TrainingSetup) -> Iterator[Violation]:
    """One packing owner: Energon packs in the loader, in-batch packing in the collate."""
    if _energon(s) and s.dataset.enable_in_batch_packing:
        yield V(
            "packing_buffer_size is set and enable_in_batch_packing=True (Bridge: 'select exactly one packing owner')",
            f"set {K_IBP}=false (or {K_BUF}=null)",
            K_IBP,
            K_BUF,
        )


@FAMILY.rule(
    "LP-EN-011",
    E,
    "Energon packing cannot defer packing to the step",
    "Bridge EnergonDatasetConfig.validate",
    fix="set dataset.defer_in_batch_packing_to_step=false",
)
def en_defer(s: TrainingSetup) -> Iterator[Violation]:
    """Energon packs are already THD batches; deferring packing to the step would pack twice."""
    if _energon(s) and s.dataset.defer_in_batch_packing_to_step:
        yield V(
            "packing_buffer_size is set and defer_in_batch_packing_to_step=True (Bridge: 'use the canonical vlm_step path')",
            "set dataset.defer_in_batch_packing_to_step=false",
            "dataset.defer_in_batch_packing_to_step",
        )


@FAMILY.rule(
    "LP-EN-012",
    E,
    "packing_buffer_size > 0",
    "Bridge EnergonDatasetConfig.validate",
    fix="set dataset.packing_buffer_size to a positive count (16 is a good start), or null to turn packing off",
)
def en_buffer_positive(s: TrainingSetup) -> Iterator[Violation]:
    """The buffer holds the candidate samples a pack is chosen from; ``null`` turns packing off, zero or less
    is refused."""
    b = s.dataset.packing_buffer_size
    if s.dataset.kind is DatasetKind.ENERGON and b is not None and b <= 0:
        yield V(
            f"packing_buffer_size={b} must be > 0 (or null to turn packing off)", f"set {K_BUF}=16", K_BUF
        )


@FAMILY.rule(
    "LP-EN-013",
    E,
    "Energon packing needs the Qwen-VL task encoder",
    "Bridge EnergonDatasetConfig.validate",
    fix="use QwenVLEnergonTaskEncoderConfig, or turn native packing off and use in-batch packing",
)
def en_encoder(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge's native packing currently supports only ``QwenVLEnergonTaskEncoderConfig``."""
    t = s.dataset.task_encoder_target
    if _energon(s) and t and "QwenVL" not in t.replace("_", ""):
        yield V(
            f"native packing with task encoder {t} (Bridge 'currently supports only QwenVLEnergonTaskEncoderConfig')",
            "use QwenVLEnergonTaskEncoderConfig, or turn native packing off and use in-batch packing",
            "dataset.task_encoder._target_",
            K_BUF,
        )


@FAMILY.rule(
    "LP-EN-014",
    E,
    "Energon dataset_kwargs must not override builder-owned arguments",
    "Bridge EnergonDatasetConfig.validate",
    fix="set those values through the dataset config fields, not dataset.dataset_kwargs",
)
def en_builder_owned(s: TrainingSetup) -> Iterator[Violation]:
    """The Energon builder sets the batch size, buffers, split and task encoder itself;
    ``EnergonDatasetConfig.validate`` refuses them in ``dataset_kwargs``."""
    if s.dataset.kind is not DatasetKind.ENERGON:
        return
    owned = sorted(k for k in s.dataset.dataset_kwargs if k in ENERGON_BUILDER_OWNED_KWARGS)
    if owned:
        yield V(
            f"dataset.dataset_kwargs overrides builder-owned arguments {owned}",
            "set them through the dataset config fields (micro_batch_size, packing_buffer_size, ...) instead",
            "dataset.dataset_kwargs",
        )


@FAMILY.rule(
    "LP-EN-016",
    E,
    "Energon datasets have no test split (do_test=False)",
    "Bridge EnergonDatasetConfig.validate",
    fix="set dataset.do_test=false",
)
def en_do_test(s: TrainingSetup) -> Iterator[Violation]:
    """``EnergonDatasetConfig.validate`` rejects ``do_test=True``: Energon datasets have train and val only."""
    if s.dataset.kind is DatasetKind.ENERGON and s.dataset.do_test:
        yield V(
            "Energon dataset with do_test=True (EnergonDatasetConfig.validate rejects it)",
            "set dataset.do_test=false",
            "dataset.do_test",
        )


@FAMILY.rule(
    "LP-EN-017",
    E,
    "Energon path set; worker, shuffle and sample limits valid",
    "Bridge EnergonDatasetConfig.validate",
    fix="set dataset.path, and worker counts >= 0, buffer and sample limits >= 1 (or null)",
)
def en_fields(s: TrainingSetup) -> Iterator[Violation]:
    """``EnergonDatasetConfig.validate`` checks the dataset path and the worker, shuffle-buffer, sample and
    micro-batch limits."""
    d = s.dataset
    if d.kind is not DatasetKind.ENERGON:
        return
    if d.path is not None and not d.path.strip():
        yield V("dataset.path is empty", "set dataset.path to the Energon dataset folder", "dataset.path")
    checks = (
        ("dataset.num_workers", d.num_workers, 0),
        ("dataset.num_val_workers", d.num_val_workers, 0),
        ("dataset.shuffle_buffer_size", d.shuffle_buffer_size, 1),
        ("dataset.max_samples_per_sequence", d.max_samples_per_sequence, 1),
        ("dataset.micro_batch_size", d.micro_batch_size, 1),
    )
    for key, value, low in checks:
        if value is not None and value < low:
            yield V(f"{key}={value} must be >= {low}", f"set {key} to a value >= {low} (or null)", key)


@FAMILY.rule(
    "LP-EN-015",
    INFO,
    "Energon packing_buffer_size of at least 8 candidates",
    "Bridge docs (recommended settings)",
    fix="raise dataset.packing_buffer_size to 8-16 candidates per worker",
)
def en_buffer_small(s: TrainingSetup) -> Iterator[Violation]:
    """First-fit-decreasing over a small buffer finds poor packs; the docs suggest 8-16 candidates per
    worker."""
    b = s.dataset.packing_buffer_size
    if _energon(s) and b is not None and 0 < b < 8:
        yield V(
            f"packing_buffer_size={b} gives first-fit-decreasing few candidates per pack",
            "the docs suggest starting at 8-16 candidates per worker (high-resolution or video data)",
            K_BUF,
        )
