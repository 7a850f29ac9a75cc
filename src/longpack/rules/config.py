"""The training setup the rules check, in Megatron-Bridge's names, read from YAML/JSON plus overrides.

A config is a nested mapping with Megatron-Bridge's sections (``model``, ``train``, ``validation``,
``dataset``, ``ddp``, ``dist``, ``rerun_state_machine``, ``comm_overlap``, ``dist_train``) and an optional
``longpack`` section for what Bridge does not store (``world_size``, ``model_family``,
``dataset_kind``). Megatron-Bridge's own YAML dumps load as they are: keys longpack does not use are
listed in :attr:`LoadedSetup.ignored_keys`, never fatal. Overrides are Hydra-style ``key=value`` with
dotted keys (``+key=value`` and ``++key=value`` also set, ``~key`` deletes); values parse as YAML
scalars (``8`` is an int, ``true`` a bool, ``null`` None, ``[attn,mlp]`` a list).

>>> loaded = setup_from_mapping(
...     {"model": {"context_parallel_size": 2, "seq_length": 4096}, "train": {"micro_batch_size": 1}},
...     overrides=["model.tensor_model_parallel_size=2", "longpack.world_size=8"],
... )
>>> s = loaded.setup
>>> s.world_size, s.model.tensor_model_parallel_size, s.model.context_parallel_size, s.model_seq_length
(8, 2, 2, 4096)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from longpack.errors import ConfigError as _ConfigError
from longpack.rules.families import ModelFamily, find_family
from longpack.topology import ParallelLayout, TopologyError, collate_pad_multiple


class ConfigError(_ConfigError):
    """A config that cannot be read (bad file, bad override, a value of the wrong type)."""


class DatasetKind(StrEnum):
    """Which Megatron-Bridge dataset config the run uses; rules differ per kind.

    ``sft`` = ``GPTSFTDatasetConfig`` (offline packing), ``direct_hf`` = ``DirectHFSFTDatasetConfig``
    (collate-time in-batch packing), ``energon`` = ``EnergonDatasetConfig`` (online packing),
    ``mock_vlm`` = ``MockVLMSFTDatasetConfig``, ``pretraining`` = ``GPTDatasetConfig``.
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
)

#: Keys Energon's builder owns; ``dataset.dataset_kwargs`` may not override them (energon spec §C.1).
ENERGON_BUILDER_OWNED_KWARGS = (
    "batch_size",
    "max_samples_per_sequence",
    "packing_buffer_size",
    "shuffle_buffer_size",
    "split_part",
    "task_encoder",
    "worker_config",
)


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """``model.*``: parallel sizes, architecture, loss and CUDA-graph settings (Megatron-Core names)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = False
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    cp_comm_type: tuple[str, ...] = ()
    pipeline_model_parallel_layout: str | tuple[tuple[str, ...], ...] | None = None
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    num_moe_experts: int | None = None
    mtp_num_layers: int | None = None
    seq_length: int | None = None
    calculate_per_token_loss: bool = False
    cuda_graph_impl: str = "none"
    #: Normalized: ``()`` = whole layer; ``("full_iteration",)`` = full-iteration graph (old spelling).
    cuda_graph_scope: tuple[str, ...] = ()
    vision_cuda_graph_impl: str | None = None
    moe_token_dispatcher_type: str | None = None
    moe_flex_dispatcher_backend: str | None = None
    moe_expert_capacity_factor: float | None = None
    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False

    @property
    def full_iteration_graph(self) -> bool:
        """A full-iteration training CUDA graph (``cuda_graph_impl`` or the old scope spelling)."""
        return self.cuda_graph_impl == "full_iteration" or "full_iteration" in self.cuda_graph_scope

    @property
    def training_cuda_graph(self) -> bool:
        """Any training CUDA graph (``local``, ``transformer_engine`` or full iteration)."""
        return self.cuda_graph_impl not in ("none", "") or self.full_iteration_graph

    @property
    def uses_hybridep(self) -> bool:
        """HybridEP dispatch (``flex`` dispatcher with the ``hybridep`` backend)."""
        return (
            self.moe_token_dispatcher_type == "flex"
            and (self.moe_flex_dispatcher_backend or "") == "hybridep"
        )


@dataclass(frozen=True, kw_only=True)
class OfflinePackingSpecs:
    """``dataset.offline_packing_specs.*`` (Bridge ``PackedSequenceSpecs``, spec §1)."""

    packed_sequence_size: int = -1
    max_single_sequence_length: int | None = None
    pad_cu_seqlens: bool = False
    pad_seq_to_mult: int | None = 1
    packed_metadata_path: str | None = None


@dataclass(frozen=True, kw_only=True)
class DatasetSettings:
    """``dataset.*`` for every dataset kind (fields a kind lacks keep their defaults)."""

    kind: DatasetKind = DatasetKind.SFT
    seq_length: int | None = None
    enable_offline_packing: bool = False
    offline_packing_specs: OfflinePackingSpecs | None = None
    dataset_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: The config's own attribute (DirectHF, Energon, MockVLM); ``None`` when absent.
    pad_to_max_length: bool | None = None
    enable_in_batch_packing: bool = False
    defer_in_batch_packing_to_step: bool = False
    in_batch_packing_pad_to_multiple_of: int = 1
    pad_to_multiple_of: int = 128
    packing_buffer_size: int | None = None
    micro_batch_size: int | None = None
    task_encoder_target: str | None = None
    dataloader_type: str | None = None
    # Energon fields validated by EnergonDatasetConfig.validate (energon spec C.1).
    path: str | None = None
    do_test: bool | None = None
    num_workers: int | None = None
    num_val_workers: int | None = None
    shuffle_buffer_size: int | None = None
    max_samples_per_sequence: int | None = None

    @property
    def fixed_width(self) -> bool:
        """``pad_to_max_length`` from the attribute or from ``dataset_kwargs`` (either counts, spec §6.3)."""
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
        """Native Energon packing is on iff ``packing_buffer_size is not None`` (energon spec §C.1)."""
        return self.kind is DatasetKind.ENERGON and self.packing_buffer_size is not None

    @property
    def any_packing(self) -> bool:
        """Some packing path produces THD batches."""
        return self.offline_packing or self.enable_in_batch_packing or self.energon_packing


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """Everything the rules look at. Build it from a file with :func:`load_setup`, from a mapping with
    :func:`setup_from_mapping`, or from a layout with :meth:`from_layout` (no file needed).

    >>> s = TrainingSetup.from_layout(ParallelLayout(world_size=16, tp=2, cp=2, sp=True), seq_length=8192)
    >>> s.layout.dp, s.required_pad_seq_to_mult
    (4, 4)
    """

    world_size: int | None = None
    family: ModelFamily | None = None
    model: ModelSettings = field(default_factory=ModelSettings)
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    eval_micro_batch_size: int | None = None
    eval_global_batch_size: int | None = None
    eval_context_parallel_size: int | None = None
    dataset: DatasetSettings = field(default_factory=DatasetSettings)
    average_in_collective: bool = False
    check_for_nan_in_loss: bool = True
    comm_overlap_moe_ep: bool = False
    use_dist_train: bool = False
    #: Dotted key -> "file:line" (or "override 'k=v'") where the value came from.
    sources: Mapping[str, str] = field(default_factory=dict)

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
        **model_fields: Any,
    ) -> TrainingSetup:
        """A setup from a :class:`ParallelLayout` (what the planner and ``longpack pack`` hold).

        ``model_fields`` are further :class:`ModelSettings` fields (``num_layers=61``, ...);
        ``dataset`` (or just ``dataset_kind``) describes the data side.

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
        """Dense data-parallel size, ``None`` if unknown or not integral."""
        if self.world_size is None or self.world_size % (self.tp * self.cp * self.pp):
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
        SP only constrains whole rows (energon spec D.8)."""
        cps = {self.cp} | ({self.eval_context_parallel_size} if self.eval_context_parallel_size else set())
        return math.lcm(*(2 * c if c > 1 else 1 for c in cps))

    @property
    def effective_pad_to_multiple_of(self) -> int:
        """Width multiple Bridge uses for unpacked DirectHF/Energon/MockVLM rows:
        ``lcm(dataset.pad_to_multiple_of, required multiple)`` (spec §6.8)."""
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


@dataclass(frozen=True, kw_only=True)
class LoadedSetup:
    """A setup read from a file: the setup plus what longpack did not use."""

    setup: TrainingSetup
    #: Dotted keys present in the input that no rule reads (Megatron-Bridge has hundreds).
    ignored_keys: tuple[str, ...] = ()
    #: How undeclared facts were inferred (dataset kind, model family), for the report.
    notes: tuple[str, ...] = ()


# --- reading files --------------------------------------------------------------------------------


class _TolerantLoader(yaml.SafeLoader):
    """SafeLoader that turns unknown tags (``!!python/name:torch.bfloat16``) into their text."""


def _construct_unknown(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return f"<{node.tag} {node.value}>".strip()
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]


_TolerantLoader.add_multi_constructor("!", _construct_unknown)
_TolerantLoader.add_multi_constructor("tag:yaml.org,2002:python/", _construct_unknown)


def _node_lines(node: yaml.Node, prefix: str, out: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            out[path] = key_node.start_mark.line + 1
            _node_lines(value_node, path, out)


def read_config_file(path: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Read a YAML or JSON config: ``(mapping, {dotted key: "file:line"})``.

    Raises :class:`ConfigError` naming the file (and line, for YAML syntax errors).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    lines: dict[str, int] = {}
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    else:
        try:
            loader = _TolerantLoader(text)
            try:
                node = loader.get_single_node()
                data = loader.construct_document(node) if node is not None else None
            finally:
                loader.dispose()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
        if node is not None:
            _node_lines(node, "", lines)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: the top level must be a mapping of sections (model:, train:, ...), got {type(data).__name__}"
        )
    return data, {k: f"{p.name}:{n}" for k, n in lines.items()}


def apply_overrides(
    data: Mapping[str, Any], overrides: Iterable[str], sources: dict[str, str] | None = None
) -> dict[str, Any]:
    """Apply Hydra-style overrides to a nested mapping (returns a new mapping).

    >>> apply_overrides({"model": {"cp": 1}}, ["model.cp=4", "+train.mbs=2", "~model.cp", "a.b=[1, 2]"])
    {'model': {}, 'train': {'mbs': 2}, 'a': {'b': [1, 2]}}
    >>> apply_overrides({}, ["model.seq_length"])
    Traceback (most recent call last):
    ...
    longpack.rules.config.ConfigError: override 'model.seq_length': expected key=value (or ~key to delete)
    """
    result: dict[str, Any] = json.loads(json.dumps(data, default=str))  # deep copy, plain types
    for raw in overrides:
        text = raw.strip()
        if text.startswith("~"):
            path = text[1:].split("=", 1)[0].strip()
            _delete(result, path.split("."))
            if sources is not None:
                sources.pop(path, None)
            continue
        if "=" not in text:
            raise ConfigError(f"override {raw!r}: expected key=value (or ~key to delete)")
        key, value_text = text.split("=", 1)
        key = key.lstrip("+").strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {raw!r}: empty key part in {key!r}")
        try:
            value = yaml.safe_load(value_text) if value_text.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {raw!r}: value is not a YAML scalar or list: {exc}") from exc
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
        if sources is not None:
            sources[key] = f"override {raw!r}"
    return result


def _delete(node: dict[str, Any], parts: list[str]) -> None:
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            return
        node = child
    node.pop(parts[-1], None)


# --- converting values ----------------------------------------------------------------------------


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and path not in _DICT_VALUED:
            nested = _flatten(value, path)
            if nested:
                out.update(nested)
            else:
                out[path] = value
        else:
            out[path] = value
    return out


_DICT_VALUED = {"dataset.dataset_kwargs"}


def _conv_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            return int(v)
        raise TypeError("an integer")
    return v


def _conv_opt_int(v: Any) -> int | None:
    return None if v is None else _conv_int(v)


def _conv_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if v is None:
        return False
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise TypeError("true or false")


def _conv_opt_str(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str | int | float):
        return str(v)
    raise TypeError("a string")


def _conv_str_default_none(v: Any) -> str:
    s = _conv_opt_str(v)
    return "none" if s is None or s == "" else s


def _conv_float_opt(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError("a number or null")
    return float(v)


def _conv_int_tuple_opt(v: Any) -> tuple[int, ...] | None:
    if v is None:
        return None
    if isinstance(v, str | bytes) or not isinstance(v, Sequence):
        raise TypeError("a list of integers")
    return tuple(_conv_int(x) for x in v)


def _conv_str_tuple(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if isinstance(v, Sequence):
        return tuple(str(x) for x in v)
    raise TypeError("a string or a list of strings")


def _conv_scope(v: Any) -> tuple[str, ...]:
    # "full" (old default) and [] both mean the whole layer; the rules treat () as whole layer.
    items = tuple(s.strip().lower() for s in _conv_str_tuple(v))
    return tuple(s for s in items if s not in ("full", ""))


def _conv_layout(v: Any) -> str | tuple[tuple[str, ...], ...] | None:
    if v is None or isinstance(v, str):
        return v or None
    if isinstance(v, Sequence) and all(isinstance(row, Sequence) and not isinstance(row, str) for row in v):
        return tuple(tuple(str(x) for x in row) for row in v)
    raise TypeError("a layout string such as 'Et|(tt|)*30mL' or a list of lists of layer names")


def _conv_mapping(v: Any) -> Mapping[str, Any]:
    if v is None:
        return {}
    if isinstance(v, Mapping):
        return dict(v)
    raise TypeError("a mapping")


def _conv_dataset_kwargs(v: Any) -> Mapping[str, Any]:
    kwargs = dict(_conv_mapping(v))
    if "pad_to_max_length" in kwargs:
        try:
            kwargs["pad_to_max_length"] = _conv_bool(kwargs["pad_to_max_length"])
        except TypeError:
            raise TypeError("a mapping whose pad_to_max_length is true or false") from None
    return kwargs


Converter = Callable[[Any], Any]

_MODEL_KEYS: dict[str, Converter] = {
    "tensor_model_parallel_size": _conv_int,
    "pipeline_model_parallel_size": _conv_int,
    "virtual_pipeline_model_parallel_size": _conv_opt_int,
    "context_parallel_size": _conv_int,
    "expert_model_parallel_size": _conv_int,
    "expert_tensor_parallel_size": _conv_opt_int,
    "sequence_parallel": _conv_bool,
    "hierarchical_context_parallel_sizes": _conv_int_tuple_opt,
    "cp_comm_type": _conv_str_tuple,
    "pipeline_model_parallel_layout": _conv_layout,
    "num_layers_in_first_pipeline_stage": _conv_opt_int,
    "num_layers_in_last_pipeline_stage": _conv_opt_int,
    "account_for_embedding_in_pipeline_split": _conv_bool,
    "account_for_loss_in_pipeline_split": _conv_bool,
    "num_layers": _conv_opt_int,
    "num_attention_heads": _conv_opt_int,
    "num_query_groups": _conv_opt_int,
    "num_moe_experts": _conv_opt_int,
    "mtp_num_layers": _conv_opt_int,
    "seq_length": _conv_opt_int,
    "calculate_per_token_loss": _conv_bool,
    "cuda_graph_impl": _conv_str_default_none,
    "cuda_graph_scope": _conv_scope,
    "cuda_graph_modules": _conv_scope,  # Megatron-Core's newer name for cuda_graph_scope
    "vision_cuda_graph_impl": _conv_opt_str,
    "moe_token_dispatcher_type": _conv_opt_str,
    "moe_flex_dispatcher_backend": _conv_opt_str,
    "moe_expert_capacity_factor": _conv_float_opt,
    "overlap_moe_expert_parallel_comm": _conv_bool,
    "delay_wgrad_compute": _conv_bool,
}

_SPECS_KEYS: dict[str, Converter] = {
    "packed_sequence_size": _conv_int,
    "max_single_sequence_length": _conv_opt_int,
    "pad_cu_seqlens": _conv_bool,
    "pad_seq_to_mult": _conv_opt_int,
    "packed_metadata_path": _conv_opt_str,
}

_DATASET_KEYS: dict[str, Converter] = {
    "seq_length": _conv_opt_int,
    "enable_offline_packing": _conv_bool,
    "dataset_kwargs": _conv_dataset_kwargs,
    "pad_to_max_length": lambda v: None if v is None else _conv_bool(v),
    "enable_in_batch_packing": _conv_bool,
    "defer_in_batch_packing_to_step": _conv_bool,
    "in_batch_packing_pad_to_multiple_of": _conv_int,
    "pad_to_multiple_of": _conv_int,
    "packing_buffer_size": _conv_opt_int,
    "micro_batch_size": _conv_opt_int,
    "dataloader_type": _conv_opt_str,
    "path": _conv_opt_str,
    "do_test": lambda v: None if v is None else _conv_bool(v),
    "num_workers": _conv_opt_int,
    "num_val_workers": _conv_opt_int,
    "shuffle_buffer_size": _conv_opt_int,
    "max_samples_per_sequence": _conv_opt_int,
}

_OTHER_KEYS: dict[str, tuple[str, Converter]] = {
    "train.micro_batch_size": ("micro_batch_size", _conv_int),
    "train.global_batch_size": ("global_batch_size", _conv_opt_int),
    "validation.eval_micro_batch_size": ("eval_micro_batch_size", _conv_opt_int),
    "validation.eval_global_batch_size": ("eval_global_batch_size", _conv_opt_int),
    "train.eval_micro_batch_size": ("eval_micro_batch_size", _conv_opt_int),
    "train.eval_global_batch_size": ("eval_global_batch_size", _conv_opt_int),
    "dist.eval_context_parallel_size": ("eval_context_parallel_size", _conv_opt_int),
    "ddp.average_in_collective": ("average_in_collective", _conv_bool),
    "rerun_state_machine.check_for_nan_in_loss": ("check_for_nan_in_loss", _conv_bool),
    "dist_train.use_dist_train": ("use_dist_train", _conv_bool),
    "model.dist_train.use_dist_train": ("use_dist_train", _conv_bool),
}

_COMM_OVERLAP_KEYS = ("comm_overlap.overlap_moe_expert_parallel_comm", "comm_overlap.delay_wgrad_compute")
_LONGPACK_KEYS = ("longpack.world_size", "longpack.model_family", "longpack.dataset_kind")


def _convert(key: str, value: Any, conv: Converter, sources: Mapping[str, str]) -> Any:
    try:
        return conv(value)
    except (TypeError, ValueError) as exc:
        where = f" ({sources[key]})" if key in sources else ""
        raise ConfigError(f"{key}={value!r}{where}: expected {exc}") from None


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
    for key in (
        "longpack.model_family",
        "model.hf_model_id",
        "model.hf_path",
        "tokenizer.tokenizer_model",
        "tokenizer.hf_tokenizer_path",
        "model._target_",
    ):
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
    return replace(model, **updates) if updates else model


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
    """
    src: dict[str, str] = dict(sources or {})
    merged = apply_overrides(data, overrides, src)
    flat = _flatten(merged)
    used: set[str] = set()

    model_values: dict[str, Any] = {}
    for name, conv in _MODEL_KEYS.items():
        key = f"model.{name}"
        if key in flat:
            used.add(key)
            target = "cuda_graph_scope" if name == "cuda_graph_modules" else name
            model_values[target] = _convert(key, flat[key], conv, src)
    if "cp_comm_type" in model_values:
        model_values["cp_comm_type"] = tuple(t.lower() for t in model_values["cp_comm_type"])
    try:
        model = ModelSettings(**model_values)
    except TypeError as exc:  # pragma: no cover - guarded by the key table
        raise ConfigError(str(exc)) from exc

    # Dataset
    specs_values: dict[str, Any] = {}
    specs_present = False
    for prefix in ("dataset.offline_packing_specs", "dataset.packed_sequence_specs"):
        if prefix in flat:
            used.add(prefix)
            specs_present = specs_present or flat[prefix] is not None
        for name, conv in _SPECS_KEYS.items():
            key = f"{prefix}.{name}"
            if key in flat:
                used.add(key)
                specs_present = True
                specs_values[name] = _convert(key, flat[key], conv, src)
        if any(k.startswith(prefix + ".") for k in flat):
            specs_present = True
            used.update(k for k in flat if k == f"{prefix}._target_")
    ds_values: dict[str, Any] = {}
    for name, conv in _DATASET_KEYS.items():
        key = f"dataset.{name}"
        if key in flat:
            used.add(key)
            ds_values[name] = _convert(key, flat[key], conv, src)
    te_target = flat.get("dataset.task_encoder._target_")
    if te_target is not None:
        used.add("dataset.task_encoder._target_")
        ds_values["task_encoder_target"] = str(te_target)
    if (
        "dataset.packed_sequence_specs.packed_sequence_size" in flat
        and "dataset.enable_offline_packing" not in flat
    ):
        # v0.5.1 configs: packing was on when packed_sequence_size > 0.
        ds_values["enable_offline_packing"] = specs_values.get("packed_sequence_size", -1) > 0
    notes: list[str] = []
    if dataset_kind is not None:
        kind = DatasetKind(str(dataset_kind))
    elif "longpack.dataset_kind" in flat:
        try:
            kind = DatasetKind(str(flat["longpack.dataset_kind"]))
        except ValueError:
            raise ConfigError(
                f"longpack.dataset_kind={flat['longpack.dataset_kind']!r}: expected one of "
                f"{', '.join(k.value for k in DatasetKind)}"
            ) from None
    else:
        kind, note = _infer_kind(flat)
        notes.append(note)
    used.add("dataset._target_")
    dataset = DatasetSettings(
        kind=kind,
        offline_packing_specs=OfflinePackingSpecs(**specs_values) if specs_present else None,
        **ds_values,
    )

    top: dict[str, Any] = {}
    for key, (attr, conv) in _OTHER_KEYS.items():
        if key in flat:
            used.add(key)
            top[attr] = _convert(key, flat[key], conv, src)
    comm = False
    for key in _COMM_OVERLAP_KEYS:
        if key in flat:
            used.add(key)
            comm = comm or _convert(key, flat[key], _conv_bool, src)
    top["comm_overlap_moe_ep"] = comm

    # longpack section and explicit arguments
    used.update(k for k in _LONGPACK_KEYS if k in flat)
    if world_size is None and "longpack.world_size" in flat:
        world_size = _convert("longpack.world_size", flat["longpack.world_size"], _conv_opt_int, src)
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
    for key in ("model.hf_model_id", "model.hf_path", "tokenizer.tokenizer_model", "model._target_"):
        if key in flat:
            used.add(key)
    model = _fill_from_family(model, family)

    ignored = tuple(sorted(k for k in flat if k not in used))
    setup = TrainingSetup(
        world_size=world_size, family=family, model=model, dataset=dataset, sources=src, **top
    )
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
    """Bridge's suggested MBS=1 equivalent of an offline-packed config with MBS>1 (spec §6.12).

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
    "ENERGON_BUILDER_OWNED_KWARGS",
    "ConfigError",
    "DatasetKind",
    "DatasetSettings",
    "LoadedSetup",
    "ModelSettings",
    "OfflinePackingSpecs",
    "TrainingSetup",
    "apply_overrides",
    "equivalent_offline_config",
    "load_setup",
    "read_config_file",
    "setup_from_mapping",
]
