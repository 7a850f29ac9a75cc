"""The training setup the rules check, in Megatron-Bridge's names, read from YAML/JSON plus overrides.

A config is a nested mapping with Megatron-Bridge's sections (``model``, ``train``, ``validation``,
``dataset``, ``ddp``, ``dist``, ``rerun_state_machine``, ``comm_overlap``, ``dist_train``) and an optional
``longpack`` section for what Bridge does not store (``world_size``, ``model_family``,
``dataset_kind``). Megatron-Bridge's own YAML dumps load as they are: keys longpack does not use are
listed in :attr:`LoadedSetup.ignored_keys`, never fatal. Overrides are Hydra-style ``key=value`` with
dotted keys (``+key=value`` and ``++key=value`` also set, ``~key`` deletes); values parse as YAML
scalars (``8`` is an int, ``true`` a bool, ``null`` None, ``[attn,mlp]`` a list).

Every key longpack reads is declared once, as a field of the pydantic dataclasses below: its name (or
``validation_alias`` for other spellings and for keys outside the field's own section), its type and its
default. A value of the wrong type or shape (``model.context_parallel_size={a: 1}``, ``train: 5``) is a
:class:`ConfigError` naming the key, the value and its ``file:line``.

>>> loaded = setup_from_mapping(
...     {"model": {"context_parallel_size": 2, "seq_length": 4096}, "train": {"micro_batch_size": 1}},
...     overrides=["model.tensor_model_parallel_size=2", "longpack.world_size=8"],
... )
>>> s = loaded.setup
>>> s.world_size, s.model.tensor_model_parallel_size, s.model.context_parallel_size, s.model_seq_length
(8, 2, 2, 4096)
>>> setup_from_mapping({"train": 5})
Traceback (most recent call last):
...
longpack.errors.ConfigError: train=5: expected a mapping of train.* keys
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, AliasPath, ConfigDict, Field, PlainValidator, SkipValidation, TypeAdapter
from pydantic import ValidationError as _ValidationError
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo

from longpack.catalog import ModelFamily, find_family
from longpack.rules.config_file import ConfigError, apply_overrides, flatten, read_config_file
from longpack.rules.packed_data import PackedDataSummary
from longpack.rules.versions import UpstreamVersions
from longpack.topology import ParallelLayout, TopologyError, collate_pad_multiple


class DatasetKind(StrEnum):
    """Which Megatron-Bridge dataset config the run uses; rules differ per kind.

    ``sft`` = ``GPTSFTDatasetConfig`` (offline packing), ``direct_hf`` = ``DirectHFSFTDatasetConfig``
    (collate-time in-batch packing), ``energon`` = ``EnergonDatasetConfig`` (online packing),
    ``mock_vlm`` = ``MockVLMSFTDatasetConfig``, ``pretraining`` = ``GPTDatasetConfig`` (and the diffusion
    dataset providers, ``WanDatasetConfig`` / ``FluxDatasetConfig`` / ``*DataModuleConfig``: not finetuning).
    """

    SFT = "sft"
    DIRECT_HF = "direct_hf"
    ENERGON = "energon"
    MOCK_VLM = "mock_vlm"
    PRETRAINING = "pretraining"

    @property
    def is_finetuning(self) -> bool:
        """Datasets Bridge treats as finetuning (CP loss rules apply), i.e. everything but pretraining."""
        return self is not DatasetKind.PRETRAINING

    @property
    def has_pad_to_max_length_attr(self) -> bool:
        """Configs with their own ``pad_to_max_length`` attribute (forced True with PP>1 or EP>1)."""
        return self in (DatasetKind.DIRECT_HF, DatasetKind.ENERGON, DatasetKind.MOCK_VLM)


# Class names of Bridge dataset configs -> kind (matched against ``dataset._target_``).
_DATASET_TARGETS: tuple[tuple[str, DatasetKind], ...] = (
    ("DirectHFSFTDatasetConfig", DatasetKind.DIRECT_HF),
    ("MockVLMSFTDatasetConfig", DatasetKind.MOCK_VLM),
    ("Energon", DatasetKind.ENERGON),
    ("GPTSFTDatasetConfig", DatasetKind.SFT),
    ("FinetuningDatasetConfig", DatasetKind.SFT),
    ("HFDatasetConfig", DatasetKind.SFT),
    ("GPTDatasetConfig", DatasetKind.PRETRAINING),
    ("MockGPTDatasetConfig", DatasetKind.PRETRAINING),
    # the diffusion dataset providers (Wan, Flux) are no finetuning dataset either: Bridge's CP loss
    # asserts name only GPTSFT / DirectHFSFT / Energon / MockVLMSFT configs
    # (NVIDIA-NeMo/Megatron-Bridge@067f987df:src/megatron/bridge/training/config.py, ConfigContainer.validate)
    ("WanDatasetConfig", DatasetKind.PRETRAINING),
    ("FluxDatasetConfig", DatasetKind.PRETRAINING),
    ("DataModuleConfig", DatasetKind.PRETRAINING),
)

#: Keys read to recognize the model family, in the order they are tried.
FAMILY_KEYS = (
    "longpack.model_family",
    "model.hf_model_id",
    "model.hf_path",
    "tokenizer.tokenizer_model",
    "tokenizer.hf_tokenizer_path",
    "model._target_",
)
#: Keys read to tell the dataset kind (besides the dataset fields themselves).
KIND_KEYS = (
    "longpack.dataset_kind",
    "dataset._target_",
    "dataset.offline_packing_specs._target_",
    "dataset.packed_sequence_specs._target_",
)

#: Keys Energon's builder owns; ``dataset.dataset_kwargs`` may not override them (Megatron-Bridge
#: ``EnergonDatasetConfig.validate``).
ENERGON_BUILDER_OWNED_KWARGS = (
    "batch_size",
    "max_samples_per_sequence",
    "packing_buffer_size",
    "shuffle_buffer_size",
    "split_part",
    "task_encoder",
    "worker_config",
)


# --- value types: how a config value becomes a field value ---------------------------------------
# The conversions are Bridge-tolerant (``"8"`` and ``8.0`` are 8, ``"true"`` is True, a null bool is
# False); anything else raises ValueError("<what was expected>"), which becomes a ConfigError.


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            return int(v)
        raise ValueError("an integer")
    return v


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if v is None:
        return False
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ValueError("true or false")


def _opt_bool(v: Any) -> bool | None:
    return None if v is None else _bool(v)


def _opt_str(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str | int | float):
        return str(v)
    raise ValueError("a string")


def _graph_impl(v: Any) -> str:
    s = _opt_str(v)
    return "none" if s is None or s == "" else s


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("a number or null")
    return float(v)


def _opt_int_tuple(v: Any) -> tuple[int, ...] | None:
    if v is None:
        return None
    if isinstance(v, str | bytes) or not isinstance(v, Sequence):
        raise ValueError("a list of integers")
    try:
        return tuple(_int(x) for x in v)
    except ValueError:
        raise ValueError("a list of integers") from None


def _str_tuple(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if isinstance(v, Sequence) and not isinstance(v, bytes):
        if any(isinstance(x, Mapping | Sequence) and not isinstance(x, str) for x in v):
            raise ValueError("a string or a list of strings")
        return tuple(str(x) for x in v)
    raise ValueError("a string or a list of strings")


def _comm_types(v: Any) -> tuple[str, ...]:
    return tuple(t.lower() for t in _str_tuple(v))


def _scope(v: Any) -> tuple[str, ...]:
    # "full" (old default) and [] both mean the whole layer; the rules treat () as whole layer.
    items = tuple(s.strip().lower() for s in _str_tuple(v))
    return tuple(s for s in items if s not in ("full", ""))


def _layout(v: Any) -> str | tuple[tuple[str, ...], ...] | None:
    if v is None or isinstance(v, str):
        return v or None
    if isinstance(v, Sequence) and all(isinstance(row, Sequence) and not isinstance(row, str) for row in v):
        return tuple(tuple(str(x) for x in row) for row in v)
    raise ValueError("a layout string such as 'Et|(tt|)*30mL' or a list of lists of layer names")


def _mapping(v: Any) -> Mapping[str, Any]:
    if v is None:
        return {}
    if isinstance(v, Mapping):
        return dict(v)
    raise ValueError("a mapping")


def _dataset_kwargs(v: Any) -> Mapping[str, Any]:
    kwargs = dict(_mapping(v))
    if "pad_to_max_length" in kwargs:
        try:
            kwargs["pad_to_max_length"] = _bool(kwargs["pad_to_max_length"])
        except ValueError:
            raise ValueError("a mapping whose pad_to_max_length is true or false") from None
    return kwargs


def _kind(v: Any) -> DatasetKind:
    try:
        return DatasetKind(str(v))
    except ValueError:
        raise ValueError(f"one of {', '.join(k.value for k in DatasetKind)}") from None


Int = Annotated[int, PlainValidator(_int)]
OptInt = Annotated[int | None, PlainValidator(_opt_int)]
Bool = Annotated[bool, PlainValidator(_bool)]
OptBool = Annotated[bool | None, PlainValidator(_opt_bool)]
OptStr = Annotated[str | None, PlainValidator(_opt_str)]
OptFloat = Annotated[float | None, PlainValidator(_opt_float)]
#: A mapping kept whole (its inner keys are the dataset's own kwargs, not config keys).
KwargsMapping = Annotated[Mapping[str, Any], PlainValidator(_dataset_kwargs)]


class _Derived:
    """Field marker: longpack derives the value (inferred, or given in Python); no config key sets it."""

    def __repr__(self) -> str:
        return "DERIVED"


DERIVED = _Derived()

_SETTINGS = ConfigDict(validate_by_name=True, validate_by_alias=True, extra="ignore")


def _paths(alias: Any) -> list[tuple[str, ...]]:
    if alias is None:
        return []
    if isinstance(alias, str):
        return [(alias,)]
    if isinstance(alias, AliasPath):
        return [tuple(str(p) for p in alias.path)]
    if isinstance(alias, AliasChoices):
        return [p for choice in alias.choices for p in _paths(choice)]
    raise TypeError(f"unexpected alias {alias!r}")  # pragma: no cover - only the kinds above are declared


def _fields(cls: type) -> dict[str, FieldInfo]:
    return dict(cls.__pydantic_fields__)  # type: ignore[attr-defined]


def _is_derived(info: FieldInfo) -> bool:
    return any(m is DERIVED for m in info.metadata)


# --- the settings -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, config=_SETTINGS)
class ModelSettings:
    """``model.*``: parallel sizes, architecture, loss and CUDA-graph settings (Megatron-Core names)."""

    tensor_model_parallel_size: Int = 1
    pipeline_model_parallel_size: Int = 1
    virtual_pipeline_model_parallel_size: OptInt = None
    context_parallel_size: Int = 1
    expert_model_parallel_size: Int = 1
    expert_tensor_parallel_size: OptInt = None
    sequence_parallel: Bool = False
    hierarchical_context_parallel_sizes: Annotated[tuple[int, ...] | None, PlainValidator(_opt_int_tuple)] = (
        None
    )
    #: Lower-cased; a single string is a one-element list.
    cp_comm_type: Annotated[tuple[str, ...], PlainValidator(_comm_types)] = ()
    pipeline_model_parallel_layout: Annotated[
        str | tuple[tuple[str, ...], ...] | None, PlainValidator(_layout)
    ] = None
    num_layers_in_first_pipeline_stage: OptInt = None
    num_layers_in_last_pipeline_stage: OptInt = None
    account_for_embedding_in_pipeline_split: Bool = False
    account_for_loss_in_pipeline_split: Bool = False
    num_layers: OptInt = None
    num_attention_heads: OptInt = None
    num_query_groups: OptInt = None
    num_moe_experts: OptInt = None
    mtp_num_layers: OptInt = None
    seq_length: OptInt = None
    calculate_per_token_loss: Bool = False
    cuda_graph_impl: Annotated[str, PlainValidator(_graph_impl)] = "none"
    #: Normalized: ``()`` = whole layer; ``("full_iteration",)`` = full-iteration graph (old spelling).
    #: ``cuda_graph_modules`` is Megatron-Core's newer name (it wins when both are given).
    cuda_graph_scope: Annotated[tuple[str, ...], PlainValidator(_scope)] = Field(
        default=(), validation_alias=AliasChoices("cuda_graph_modules", "cuda_graph_scope")
    )
    vision_cuda_graph_impl: OptStr = None
    moe_token_dispatcher_type: OptStr = None
    moe_flex_dispatcher_backend: OptStr = None
    moe_expert_capacity_factor: OptFloat = None
    moe_router_load_balancing_type: OptStr = None
    overlap_moe_expert_parallel_comm: Bool = False
    delay_wgrad_compute: Bool = False
    #: Megatron-Core HybridEP: pad uneven per-rank dispatch inputs to the group maximum (MCore >= 0.19).
    moe_hybridep_pad_uneven_dispatch_inputs: OptBool = None
    #: Megatron-Core hybrid context parallelism (``BalancedCPScheduler``) and its per-rank length cap,
    #: which the DP-balanced packing scheduler (``sequence_packing_scheduler``) uses too.
    hybrid_context_parallel: Bool = False
    max_seqlen_per_dp_cp_rank: OptInt = None
    sequence_packing_scheduler: OptStr = None
    #: Megatron-Core dev's name for hybrid CP (``hybrid_context_parallel`` is its deprecated alias), the
    #: smallest dynamic CP group, and the THD padding after packing (``max`` or a multiple): see
    #: :mod:`longpack.rules.scheduling_keys`.
    dynamic_context_parallel: Bool = False
    min_dynamic_context_parallel_size: OptInt = None
    pad_packed_seq_alignment: OptStr = None
    #: Megatron-Core dev: the most sequences one THD pack holds (cu_seqlens padded to it; graphs need it).
    thd_max_packed_sequences: OptInt = None
    #: Megatron-Core dev: how packed rows are split over CP ranks (``zigzag`` default, ``contiguous``).
    cp_partition_mode: OptStr = None
    #: Megatron-Core TransformerConfig FP8 (``e4m3`` / ``hybrid``) and its recipe (``mxfp8``, ``delayed``...).
    fp8: OptStr = None
    fp8_recipe: OptStr = None
    microbatch_group_size_per_vp_stage: OptInt = None
    #: Megatron-LM's spelling of a local (per-layer) CUDA graph.
    enable_cuda_graph: Bool = False

    @property
    def full_iteration_graph(self) -> bool:
        """A full-iteration training CUDA graph (``cuda_graph_impl`` or the old scope spelling)."""
        return self.cuda_graph_impl == "full_iteration" or "full_iteration" in self.cuda_graph_scope

    @property
    def training_cuda_graph(self) -> bool:
        """Any training CUDA graph (``local``, ``transformer_engine``, full iteration, or Megatron-LM's
        ``enable_cuda_graph``)."""
        return self.cuda_graph_impl not in ("none", "") or self.full_iteration_graph or self.enable_cuda_graph

    @property
    def uses_hybridep(self) -> bool:
        """HybridEP dispatch (``flex`` dispatcher with the ``hybridep`` backend)."""
        return (
            self.moe_token_dispatcher_type == "flex"
            and (self.moe_flex_dispatcher_backend or "") == "hybridep"
        )


@dataclass(frozen=True, kw_only=True, config=_SETTINGS)
class OfflinePackingSpecs:
    """``dataset.offline_packing_specs.*`` (Megatron-Bridge ``PackedSequenceSpecs``)."""

    packed_sequence_size: Int = -1
    max_single_sequence_length: OptInt = None
    pad_cu_seqlens: Bool = False
    pad_seq_to_mult: OptInt = 1
    packed_metadata_path: OptStr = None
    #: Files (or a glob of shards) Bridge reads; it raises FileNotFoundError when one does not exist.
    packed_train_data_path: OptStr = None
    packed_val_data_path: OptStr = None


@dataclass(frozen=True, kw_only=True, config=_SETTINGS)
class DatasetSettings:
    """``dataset.*`` for every dataset kind (fields a kind lacks keep their defaults)."""

    #: Inferred from ``dataset._target_`` and the keys present, or given (``longpack.dataset_kind``).
    kind: Annotated[DatasetKind, PlainValidator(_kind), DERIVED] = DatasetKind.SFT
    seq_length: OptInt = None
    enable_offline_packing: Bool = False
    #: ``packed_sequence_specs`` is the Megatron-Bridge v0.5.1 name.
    offline_packing_specs: OfflinePackingSpecs | None = Field(
        default=None, validation_alias=AliasChoices("offline_packing_specs", "packed_sequence_specs")
    )
    dataset_kwargs: KwargsMapping = Field(default_factory=dict)
    #: The config's own attribute (DirectHF, Energon, MockVLM); ``None`` when absent.
    pad_to_max_length: OptBool = None
    enable_in_batch_packing: Bool = False
    defer_in_batch_packing_to_step: Bool = False
    #: Megatron-Bridge PR #6127: pack each global batch across DP x CP with Megatron-Core's scheduler.
    enable_global_batch_packing: Bool = False
    #: Megatron-Core GPTDatasetConfig (>= 0.19.0): per-document attention masks in pretraining.
    inter_document_masking: Bool = False
    in_batch_packing_pad_to_multiple_of: Int = 1
    pad_to_multiple_of: Int = 128
    packing_buffer_size: OptInt = None
    micro_batch_size: OptInt = None
    task_encoder_target: OptStr = Field(default=None, validation_alias=AliasPath("task_encoder", "_target_"))
    # Qwen-VL task encoder (Megatron-Bridge ``QwenVLEnergonTaskEncoderConfig``); None: not given (Bridge's
    # defaults apply: patch 14, merge 2, temporal patch 2, 200704..1003520 pixels, 10 images, 16384 tokens;
    # a limit given as null reads as not given).
    te_patch_size: OptInt = Field(default=None, validation_alias=AliasPath("task_encoder", "patch_size"))
    te_spatial_merge_size: OptInt = Field(
        default=None, validation_alias=AliasPath("task_encoder", "spatial_merge_size")
    )
    te_temporal_patch_size: OptInt = Field(
        default=None, validation_alias=AliasPath("task_encoder", "temporal_patch_size")
    )
    te_min_pixels: OptInt = Field(default=None, validation_alias=AliasPath("task_encoder", "min_pixels"))
    te_max_pixels: OptInt = Field(default=None, validation_alias=AliasPath("task_encoder", "max_pixels"))
    te_max_num_images: OptInt = Field(
        default=None, validation_alias=AliasPath("task_encoder", "max_num_images")
    )
    te_max_num_frames: OptInt = Field(
        default=None, validation_alias=AliasPath("task_encoder", "max_num_frames")
    )
    te_max_visual_tokens: OptInt = Field(
        default=None, validation_alias=AliasPath("task_encoder", "max_visual_tokens")
    )
    dataloader_type: OptStr = None
    # Energon fields validated by Megatron-Bridge EnergonDatasetConfig.validate.
    path: OptStr = None
    do_test: OptBool = None
    num_workers: OptInt = None
    num_val_workers: OptInt = None
    shuffle_buffer_size: OptInt = None
    max_samples_per_sequence: OptInt = None

    @property
    def fixed_width(self) -> bool:
        """``pad_to_max_length`` from the attribute or from ``dataset_kwargs`` (either counts)."""
        return bool(self.pad_to_max_length) or bool(self.dataset_kwargs.get("pad_to_max_length", False))

    @property
    def offline_packing(self) -> bool:
        """Offline packing is on (flag set and specs given)."""
        return self.enable_offline_packing and self.offline_packing_specs is not None

    @property
    def collate_in_batch_packing(self) -> bool:
        """In-batch packing done by the collate (``enable_in_batch_packing and not defer``)."""
        return self.enable_in_batch_packing and not self.defer_in_batch_packing_to_step

    @property
    def energon_packing(self) -> bool:
        """Native Energon packing is on iff ``packing_buffer_size is not None``."""
        return self.kind is DatasetKind.ENERGON and self.packing_buffer_size is not None

    @property
    def any_packing(self) -> bool:
        """Some packing path produces THD batches."""
        return self.offline_packing or self.enable_in_batch_packing or self.energon_packing


@dataclass(frozen=True, kw_only=True, config=ConfigDict(**_SETTINGS, arbitrary_types_allowed=True))
class TrainingSetup:
    """Everything the rules look at. Build it from a file with :func:`load_setup`, from a mapping with
    :func:`setup_from_mapping`, or from a layout with :meth:`from_layout` (no file needed).

    >>> s = TrainingSetup.from_layout(ParallelLayout(world_size=16, tp=2, cp=2, sp=True), seq_length=8192)
    >>> s.layout.dp, s.required_pad_seq_to_mult
    (4, 4)
    """

    world_size: OptInt = Field(default=None, validation_alias=AliasPath("longpack", "world_size"))
    #: Recognized from the config (``longpack.model_family``, HF ids, ``model._target_``) or given.
    family: Annotated[ModelFamily | None, DERIVED, SkipValidation] = None
    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    micro_batch_size: Int = Field(default=1, validation_alias=AliasPath("train", "micro_batch_size"))
    global_batch_size: OptInt = Field(default=None, validation_alias=AliasPath("train", "global_batch_size"))
    # Bridge moved these from train.* to validation.*; the train.* spelling wins when both are given.
    eval_micro_batch_size: OptInt = Field(
        default=None,
        validation_alias=AliasChoices(
            AliasPath("train", "eval_micro_batch_size"), AliasPath("validation", "eval_micro_batch_size")
        ),
    )
    eval_global_batch_size: OptInt = Field(
        default=None,
        validation_alias=AliasChoices(
            AliasPath("train", "eval_global_batch_size"), AliasPath("validation", "eval_global_batch_size")
        ),
    )
    eval_context_parallel_size: OptInt = Field(
        default=None, validation_alias=AliasPath("dist", "eval_context_parallel_size")
    )
    dataset: DatasetSettings = dataclasses.field(default_factory=DatasetSettings)
    average_in_collective: Bool = Field(
        default=False, validation_alias=AliasPath("ddp", "average_in_collective")
    )
    check_for_nan_in_loss: Bool = Field(
        default=True, validation_alias=AliasPath("rerun_state_machine", "check_for_nan_in_loss")
    )
    #: ``comm_overlap.*`` spellings of the MoE EP-overlap flags (Bridge ``CommOverlapConfig``).
    comm_overlap_moe_expert_parallel_comm: Bool = Field(
        default=False, validation_alias=AliasPath("comm_overlap", "overlap_moe_expert_parallel_comm")
    )
    comm_overlap_delay_wgrad_compute: Bool = Field(
        default=False, validation_alias=AliasPath("comm_overlap", "delay_wgrad_compute")
    )
    use_megatron_fsdp: Bool = Field(
        default=False,
        validation_alias=AliasChoices(
            AliasPath("dist", "use_megatron_fsdp"), AliasPath("ddp", "use_megatron_fsdp")
        ),
    )
    #: ``dist.use_decentralized_pg``: process groups from HyperCommGrid instead of Megatron-Core's global
    #: parallel state (dynamic CP resolves its groups from the latter).
    use_decentralized_pg: Bool = Field(
        default=False, validation_alias=AliasPath("dist", "use_decentralized_pg")
    )
    use_dist_train: Bool = Field(
        default=False,
        validation_alias=AliasChoices(
            AliasPath("model", "dist_train", "use_dist_train"), AliasPath("dist_train", "use_dist_train")
        ),
    )
    #: Dotted key -> "file:line" (or "override 'k=v'") where the value came from.
    sources: Annotated[Mapping[str, str], DERIVED, SkipValidation] = Field(default_factory=dict)
    #: The packed folder the run reads (``longpack check --packed``); the packed-data rules need it.
    packed: Annotated[PackedDataSummary | None, DERIVED, SkipValidation] = None
    #: Dotted keys the config and overrides set (declared or not): which settings the user wrote.
    given_keys: Annotated[frozenset[str], DERIVED, SkipValidation] = frozenset()
    #: The Megatron-Bridge / Megatron-Core versions the rules run for (set by ``run_rules``).
    versions: Annotated[UpstreamVersions | None, DERIVED, SkipValidation] = None

    @classmethod
    def from_layout(
        cls,
        layout: ParallelLayout,
        *,
        seq_length: int | None = None,
        family: ModelFamily | None = None,
        micro_batch_size: int = 1,
        global_batch_size: int | None = None,
        dataset: DatasetSettings | None = None,
        dataset_kind: str | DatasetKind = DatasetKind.SFT,
        versions: UpstreamVersions | None = None,
        **model_fields: Any,
    ) -> TrainingSetup:
        """A setup from a :class:`ParallelLayout` (what the planner and ``longpack pack`` hold).

        ``model_fields`` are further :class:`ModelSettings` fields (``num_layers=61``, ...); the
        architecture the family knows fills the ones not given. ``dataset`` (or just ``dataset_kind``)
        describes the data side; ``versions`` the Megatron-Bridge / Megatron-Core versions the rules run for
        (``None``: ``run_rules``'s default).

        >>> TrainingSetup.from_layout(ParallelLayout(world_size=8, tp=2), num_layers=32).model.num_layers
        32
        """
        model = ModelSettings(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp,
            context_parallel_size=layout.cp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.etp,
            sequence_parallel=layout.sp,
            seq_length=seq_length,
            **model_fields,
        )
        model = _fill_from_family(model, family)
        ds = (
            dataset
            if dataset is not None
            else DatasetSettings(kind=DatasetKind(str(dataset_kind)), seq_length=seq_length)
        )
        return cls(
            world_size=layout.world_size,
            family=family,
            model=model,
            micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size,
            dataset=ds,
            versions=versions,
        )

    # --- derived values ---------------------------------------------------------------------------

    @property
    def tp(self) -> int:
        return self.model.tensor_model_parallel_size

    @property
    def cp(self) -> int:
        return self.model.context_parallel_size

    @property
    def pp(self) -> int:
        return self.model.pipeline_model_parallel_size

    @property
    def ep(self) -> int:
        return self.model.expert_model_parallel_size

    @property
    def etp(self) -> int:
        """Expert TP; defaults to TP as in Megatron-Core."""
        e = self.model.expert_tensor_parallel_size
        return self.tp if e is None else e

    @property
    def sp(self) -> bool:
        return self.model.sequence_parallel

    @property
    def comm_overlap_moe_ep(self) -> bool:
        """MoE EP overlap or delayed wgrad requested through ``comm_overlap.*``."""
        return self.comm_overlap_moe_expert_parallel_comm or self.comm_overlap_delay_wgrad_compute

    @property
    def sizes_positive(self) -> bool:
        """TP, CP and PP are all >= 1 (the derived values below need it; ``LP-CFG-001`` reports others)."""
        return min(self.tp, self.cp, self.pp) >= 1

    @property
    def layout(self) -> ParallelLayout | None:
        """The parallel layout, or ``None`` when the world size is unknown or the sizes do not fit it."""
        if self.world_size is None:
            return None
        vpp = self.model.virtual_pipeline_model_parallel_size
        try:
            return ParallelLayout(
                world_size=self.world_size,
                tp=self.tp,
                cp=self.cp,
                pp=self.pp,
                vpp=vpp if vpp is not None and vpp > 1 else None,
                ep=self.ep,
                etp=self.model.expert_tensor_parallel_size,
                sp=self.sp,
            )
        except TopologyError:
            return None

    @property
    def dp(self) -> int | None:
        """Dense data-parallel size, ``None`` if unknown, not integral, or the sizes are not positive.

        >>> TrainingSetup(world_size=8, model=ModelSettings(context_parallel_size=0)).dp is None
        True
        """
        if self.world_size is None or not self.sizes_positive:
            return None
        if self.world_size % (self.tp * self.cp * self.pp):
            return None
        return self.world_size // (self.tp * self.cp * self.pp)

    @property
    def required_pad_seq_to_mult(self) -> int:
        """The per-sequence multiple the topology needs: ``lcm(2CP [CP>1], CP*TP [SP, TP>1])``, over the
        training CP and, if set, the evaluation CP."""
        cps = {self.cp}
        if self.eval_context_parallel_size is not None:
            cps.add(self.eval_context_parallel_size)
        if any(c < 1 for c in cps) or self.tp < 1:
            return 1
        return collate_pad_multiple(tp=self.tp, cp_sizes=tuple(sorted(cps)), sp=self.sp)

    @property
    def required_cp_multiple(self) -> int:
        """What THD context parallelism itself needs of every packed sequence: ``2*CP`` (lcm over training
        and evaluation CP), 1 without CP. With SP the docs ask for :attr:`required_pad_seq_to_mult`, but
        SP only constrains whole rows."""
        cps = {self.cp} | ({self.eval_context_parallel_size} if self.eval_context_parallel_size else set())
        return collate_pad_multiple(cp_sizes=tuple(sorted(max(c, 1) for c in cps)))

    @property
    def effective_pad_to_multiple_of(self) -> int:
        """Width multiple Bridge uses for unpacked DirectHF/Energon/MockVLM rows:
        ``lcm(dataset.pad_to_multiple_of, required multiple)``."""
        return math.lcm(max(1, self.dataset.pad_to_multiple_of), self.required_pad_seq_to_mult)

    @property
    def model_seq_length(self) -> int | None:
        """``model.seq_length``, falling back to ``dataset.seq_length``."""
        return self.model.seq_length if self.model.seq_length is not None else self.dataset.seq_length

    @property
    def packed_width(self) -> int | None:
        """Runtime width of one packed row: ``packed_sequence_size`` for offline packing, else the
        sequence length."""
        specs = self.dataset.offline_packing_specs
        if self.dataset.offline_packing and specs is not None and specs.packed_sequence_size > 0:
            return specs.packed_sequence_size
        return self.dataset.seq_length if self.dataset.seq_length is not None else self.model.seq_length

    @property
    def is_moe(self) -> bool:
        return bool(self.model.num_moe_experts)

    def where(self, *keys: str) -> list[str]:
        """Source locations of ``keys`` that came from a file or an override."""
        return [f"{k} @ {self.sources[k]}" for k in keys if k in self.sources]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadedSetup:
    """A setup read from a file: the setup plus what longpack did not use."""

    setup: TrainingSetup
    #: Dotted keys present in the input that no rule reads (Megatron-Bridge has hundreds).
    ignored_keys: tuple[str, ...] = ()
    #: How undeclared facts were inferred (dataset kind, model family), for the report.
    notes: tuple[str, ...] = ()


# --- the declared keys ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Declared:
    keys: frozenset[str]  # every dotted key some field reads (all spellings)
    sections: frozenset[str]  # dotted keys that must hold a mapping when present
    leaves: frozenset[str]  # mapping-valued keys kept whole (dataset.dataset_kwargs)


def _walk(cls: type, prefix: tuple[str, ...], keys: set[str], sections: set[str], leaves: set[str]) -> None:
    for name, info in _fields(cls).items():
        if _is_derived(info):
            continue
        for path in _paths(info.validation_alias) or [(name,)]:
            full = prefix + path
            for i in range(1, len(full)):
                sections.add(".".join(full[:i]))
            dotted = ".".join(full)
            keys.add(dotted)
            annotation = info.annotation
            nested = [
                a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "__pydantic_fields__")
            ]
            if nested:
                _walk(typing.cast(type, nested[0]), full, keys, sections, leaves)
            elif any(getattr(m, "func", None) is _dataset_kwargs for m in info.metadata):
                leaves.add(dotted)


def _declared() -> _Declared:
    keys: set[str] = set()
    sections: set[str] = set()
    leaves: set[str] = set()
    _walk(TrainingSetup, (), keys, sections, leaves)
    for key in (*FAMILY_KEYS, *KIND_KEYS):
        keys.add(key)
        parts = key.split(".")
        sections.update(".".join(parts[:i]) for i in range(1, len(parts)))
    # a nested settings object is itself a key (given as null or {}), not only a section
    return _Declared(frozenset(keys), frozenset(sections), frozenset(leaves))


DECLARED = _declared()


def declared_keys() -> list[str]:
    """Every dotted config key longpack reads, sorted (other keys are reported as ignored).

    >>> keys = declared_keys()
    >>> [k for k in ("train.micro_batch_size", "model.cuda_graph_modules", "dataset.kind") if k in keys]
    ['train.micro_batch_size', 'model.cuda_graph_modules']
    """
    return sorted(DECLARED.keys)


# --- building a setup -----------------------------------------------------------------------------


def _error_text(exc: _ValidationError, prefix: tuple[str, ...], sources: Mapping[str, str]) -> str:
    err = exc.errors(include_url=False)[0]
    loc = prefix + tuple(str(p) for p in err["loc"] if not isinstance(p, int))
    key = ".".join(loc)
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        expected = str(err["ctx"]["error"])
    elif err["type"] in ("dataclass_type", "dataclass_exact_type", "dict_type", "model_type"):
        expected = f"a mapping of {key}.* keys"
    else:
        expected = str(err["msg"]).lower()
    where = f" ({sources[key]})" if key in sources else ""
    return f"{key}={err['input']!r}{where}: expected {expected}"


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def _validated(
    cls: type, payload: Mapping[str, Any], prefix: tuple[str, ...], sources: Mapping[str, str]
) -> Any:
    try:
        return _adapter(cls).validate_python(payload)
    except _ValidationError as exc:
        raise ConfigError(_error_text(exc, prefix, sources)) from None


def _check_shapes(data: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Sections longpack reads must be mappings (``train: 5`` is an error, not an empty train section)."""
    for section in sorted(DECLARED.sections):
        node: Any = data
        for part in section.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None and not isinstance(node, Mapping):
            where = f" ({sources[section]})" if section in sources else ""
            raise ConfigError(f"{section}={node!r}{where}: expected a mapping of {section}.* keys")


def _section(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return dict(value) if isinstance(value, Mapping) else {}


def _infer_kind(flat: Mapping[str, Any]) -> tuple[DatasetKind, str]:
    target = str(flat.get("dataset._target_", "") or "")
    for fragment, kind in _DATASET_TARGETS:
        if fragment in target:
            return kind, f"dataset kind '{kind}' from dataset._target_={target}"
    keys = {k.split(".", 1)[1].split(".")[0] for k in flat if k.startswith("dataset.")}
    if "packing_buffer_size" in keys or "task_encoder" in keys:
        return DatasetKind.ENERGON, "dataset kind 'energon' (dataset has packing_buffer_size/task_encoder)"
    if keys & {"enable_offline_packing", "offline_packing_specs", "packed_sequence_specs"}:
        return DatasetKind.SFT, "dataset kind 'sft' (dataset has offline packing keys)"
    if keys & {"blend", "blend_per_split", "data_path", "split"}:
        return DatasetKind.PRETRAINING, "dataset kind 'pretraining' (dataset has blend/split keys)"
    if "enable_in_batch_packing" in keys:
        return DatasetKind.DIRECT_HF, "dataset kind 'direct_hf' (dataset has enable_in_batch_packing)"
    return (
        DatasetKind.SFT,
        "dataset kind not declared: assuming 'sft' (set longpack.dataset_kind or --dataset-kind)",
    )


def _infer_family(flat: Mapping[str, Any]) -> tuple[ModelFamily | None, str | None]:
    for key in FAMILY_KEYS:
        value = flat.get(key)
        if isinstance(value, str) and value:
            family = find_family(value)
            if family is not None:
                return family, f"model family '{family.name}' from {key}={value}"
            if key == "longpack.model_family":
                raise ConfigError(
                    f"longpack.model_family={value!r}: unknown family; run `longpack check --list-families`"
                )
    return None, None


def _fill_from_family(model: ModelSettings, family: ModelFamily | None) -> ModelSettings:
    if family is None:
        return model
    updates: dict[str, Any] = {}
    for name in ("num_layers", "num_attention_heads", "num_query_groups", "num_moe_experts"):
        if getattr(model, name) is None and getattr(family, name) is not None:
            updates[name] = getattr(family, name)
    if model.mtp_num_layers is None and family.mtp_num_layers:
        updates["mtp_num_layers"] = family.mtp_num_layers
    return dataclasses.replace(model, **updates) if updates else model


def _dataset(
    data: Mapping[str, Any], flat: Mapping[str, Any], kind: DatasetKind, src: Mapping[str, str]
) -> DatasetSettings:
    derived = {name for name, info in _fields(DatasetSettings).items() if _is_derived(info)}
    section = {k: v for k, v in _section(data, "dataset").items() if k not in derived}
    both = [k for k in ("offline_packing_specs", "packed_sequence_specs") if section.get(k) is not None]
    if len(both) == 2:
        raise ConfigError(
            "dataset.offline_packing_specs and dataset.packed_sequence_specs are both set (the second is the "
            "Megatron-Bridge v0.5.1 name of the first): keep one"
        )
    dataset: DatasetSettings = _validated(DatasetSettings, section, ("dataset",), src)
    updates: dict[str, Any] = {"kind": kind}
    specs = dataset.offline_packing_specs
    if (
        "dataset.packed_sequence_specs.packed_sequence_size" in flat
        and "enable_offline_packing" not in section
    ):
        # v0.5.1 configs: packing was on when packed_sequence_size > 0.
        updates["enable_offline_packing"] = specs is not None and specs.packed_sequence_size > 0
    return dataclasses.replace(dataset, **updates)


def setup_from_mapping(
    data: Mapping[str, Any],
    *,
    overrides: Iterable[str] = (),
    sources: Mapping[str, str] | None = None,
    world_size: int | None = None,
    dataset_kind: str | DatasetKind | None = None,
    model_family: str | None = None,
) -> LoadedSetup:
    """Build a :class:`TrainingSetup` from a nested mapping (a parsed config) plus overrides.

    Explicit arguments (``world_size`` ...) win over the ``longpack`` section of the mapping.

    >>> loaded = setup_from_mapping({"model": {"num_layers": 4, "foo": 1}, "optimizer": {"lr": 1e-4}})
    >>> loaded.ignored_keys
    ('model.foo', 'optimizer.lr')
    >>> setup_from_mapping({"model": {"context_parallel_size": {"a": 1}}})
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: model.context_parallel_size={'a': 1}: expected an integer
    """
    src: dict[str, str] = dict(sources or {})
    merged = apply_overrides(data, overrides, src)
    _check_shapes(merged, src)
    flat = flatten(merged, DECLARED.leaves)

    notes: list[str] = []
    if dataset_kind is not None:
        kind = DatasetKind(str(dataset_kind))
    elif "longpack.dataset_kind" in flat:
        try:
            kind = _kind(flat["longpack.dataset_kind"])
        except ValueError as exc:
            where = f" ({src['longpack.dataset_kind']})" if "longpack.dataset_kind" in src else ""
            raise ConfigError(
                f"longpack.dataset_kind={flat['longpack.dataset_kind']!r}{where}: expected {exc}"
            ) from None
    else:
        kind, note = _infer_kind(flat)
        notes.append(note)
    family: ModelFamily | None
    if model_family is not None:
        family = find_family(model_family)
        if family is None:
            raise ConfigError(
                f"--model {model_family!r}: unknown family; run `longpack check --list-families`"
            )
    else:
        family, note_f = _infer_family(flat)
        if note_f:
            notes.append(note_f)

    # the whole setup in one validation: model.*, train.*, ... by their declared keys
    payload: dict[str, Any] = {
        k: ({} if v is None else v) for k, v in merged.items() if k in DECLARED.sections and k != "dataset"
    }
    payload["dataset"] = _dataset(merged, flat, kind, src)
    setup: TrainingSetup = _validated(TrainingSetup, payload, (), src)
    updates: dict[str, Any] = {
        "model": _fill_from_family(setup.model, family),
        "family": family,
        "sources": src,
        "given_keys": frozenset(flat),
    }
    if world_size is not None:
        updates["world_size"] = world_size
    setup = dataclasses.replace(setup, **updates)
    ignored = tuple(sorted(k for k in flat if k not in DECLARED.keys))
    return LoadedSetup(setup=setup, ignored_keys=ignored, notes=tuple(notes))


def load_setup(
    path: str | Path,
    overrides: Iterable[str] = (),
    *,
    world_size: int | None = None,
    dataset_kind: str | DatasetKind | None = None,
    model_family: str | None = None,
) -> LoadedSetup:
    """Read a YAML/JSON config file, apply overrides, and build the setup (see :func:`setup_from_mapping`)."""
    data, sources = read_config_file(path)
    return setup_from_mapping(
        data,
        overrides=overrides,
        sources=sources,
        world_size=world_size,
        dataset_kind=dataset_kind,
        model_family=model_family,
    )


def equivalent_offline_config(micro_batch_size: int, global_batch_size: int | None, packed_size: int) -> str:
    """Bridge's suggested MBS=1 equivalent of an offline-packed config with MBS>1.

    >>> equivalent_offline_config(4, 32, 512)
    'train.micro_batch_size=1 train.global_batch_size=8 dataset.offline_packing_specs.packed_sequence_size=2048'
    """
    gbs = (
        ""
        if global_batch_size is None
        else f" train.global_batch_size={global_batch_size // micro_batch_size}"
    )
    return (
        f"train.micro_batch_size=1{gbs} "
        f"dataset.offline_packing_specs.packed_sequence_size={packed_size * micro_batch_size}"
    )


__all__ = [
    "DECLARED",
    "ENERGON_BUILDER_OWNED_KWARGS",
    "FAMILY_KEYS",
    "KIND_KEYS",
    "ConfigError",
    "DatasetKind",
    "DatasetSettings",
    "LoadedSetup",
    "ModelSettings",
    "OfflinePackingSpecs",
    "TrainingSetup",
    "apply_overrides",
    "declared_keys",
    "equivalent_offline_config",
    "load_setup",
    "read_config_file",
    "setup_from_mapping",
]
