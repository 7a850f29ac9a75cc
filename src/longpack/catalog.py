"""The one model and GPU catalog: architectures, hardware figures and model-family facts.

``longpack plan`` computes with the architectures and GPUs; ``longpack check`` reads the same entries for
the layer/head/expert defaults and the packing opt-outs of each family. The catalogs ship as package data
(``longpack/data/model_catalog.yaml`` and ``hardware_catalog.yaml``) and are read with
:mod:`importlib.resources`. A model can also be read from a Hugging Face ``config.json``
(:func:`model_from_hf_config`).

Pure Python + PyYAML; no torch.

>>> model = load_model("qwen3_30b_a3b")
>>> model.hidden_size, model.num_layers, model.moe.num_experts if model.moe else None
(2048, 48, 128)
>>> load_gpu("H100").peak_tflops("fp8")
1979.0
>>> family = find_family("Qwen/Qwen3-8B")
>>> family.name, family.num_layers, family.num_query_groups, family.offline_packing
('qwen3_8b', 36, 8, True)
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from longpack.errors import CatalogError

# --------------------------------------------------------------------------------------------------
# Model description
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """Self-attention shape. ``kind`` is ``"gqa"`` (incl. MHA) or ``"mla"`` (DeepSeek multi-latent).

    >>> AttentionSpec(kind="gqa", num_heads=32, num_kv_heads=8, head_dim=128).q_width
    4096
    """

    kind: str
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0
    output_gate: bool = False
    qk_layernorm: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("gqa", "mla"):
            raise CatalogError(f"attention kind must be 'gqa' or 'mla', got {self.kind!r}")

    @property
    def q_width(self) -> int:
        """Query projection width ``a·d`` (MLA: ``a·(d_n + d_r)``)."""
        if self.kind == "mla":
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Key (= value) projection width ``g·d`` for GQA; post-up-projection K width for MLA."""
        if self.kind == "mla":
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_kv_heads * self.head_dim

    @property
    def v_width(self) -> int:
        """Value width (``g·d`` for GQA, ``a·d_v`` for MLA)."""
        if self.kind == "mla":
            return self.num_heads * self.v_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def o_width(self) -> int:
        """Attention output width entering the output projection (``a·d`` or ``a·d_v``)."""
        if self.kind == "mla":
            return self.num_heads * self.v_head_dim
        return self.num_heads * self.head_dim


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts FFN shape. ``shared_ffn_hidden_size`` is the sum over shared experts."""

    num_experts: int
    top_k: int
    moe_ffn_hidden_size: int
    shared_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False


@dataclass(frozen=True, kw_only=True)
class GatedDeltaNetSpec:
    """Gated DeltaNet (linear attention) layer shape, as in Qwen3-Next."""

    num_key_heads: int
    key_head_dim: int
    num_value_heads: int
    value_head_dim: int
    conv_kernel_dim: int = 4


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, dense or MoE, with optional MTP and hybrid linear attention.

    Layer ``i`` (0-based) has a dense MLP if ``i < first_k_dense_layers`` or the model has no MoE,
    otherwise an MoE FFN. With ``full_attention_interval = n > 1`` only layers ``i`` with
    ``(i+1) % n == 0`` use softmax attention; the others are Gated DeltaNet layers.

    >>> m = load_model("deepseek_v3")
    >>> m.num_dense_layers, m.num_moe_layers, m.mtp_layers
    (3, 58, 1)
    """

    name: str
    display_name: str = ""
    hidden_size: int
    num_layers: int
    vocab_size: int
    attention: AttentionSpec
    ffn_hidden_size: int = 0
    moe: MoESpec | None = None
    first_k_dense_layers: int = 0
    gated_mlp: bool = True
    tie_embeddings: bool = False
    mtp_layers: int = 0
    full_attention_interval: int = 1
    gdn: GatedDeltaNetSpec | None = None
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __hash__(self) -> int:
        # the planner keys many caches on the model; hash the (immutable) fields once
        cached = self.__dict__.get("_cached_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_cached_hash", cached)
        return cached

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise CatalogError(f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
        if self.full_attention_interval > 1 and self.gdn is None:
            raise CatalogError(
                f"model {self.name!r}: full_attention_interval={self.full_attention_interval} needs a "
                "gated_deltanet block describing the linear-attention layers"
            )
        if self.moe is None and self.ffn_hidden_size < 1:
            raise CatalogError(f"model {self.name!r}: a dense model needs ffn_hidden_size > 0")

    @property
    def gamma(self) -> int:
        """GEMMs per MLP: 3 for gated (SwiGLU) MLPs, 2 for plain."""
        return 3 if self.gated_mlp else 2

    def layer_is_moe(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based; MTP layers continue the count) has an MoE FFN."""
        return self.moe is not None and index >= self.first_k_dense_layers

    def layer_is_softmax_attention(self, index: int) -> bool:
        """Whether decoder layer ``index`` uses softmax attention (``False`` = Gated DeltaNet)."""
        if self.full_attention_interval <= 1:
            return True
        return (index + 1) % self.full_attention_interval == 0

    @property
    def num_moe_layers(self) -> int:
        """MoE layers in the main decoder stack (MTP excluded)."""
        return sum(self.layer_is_moe(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        """Dense-MLP layers in the main decoder stack."""
        return self.num_layers - self.num_moe_layers

    @property
    def mtp_layer_index(self) -> int:
        """MTP layers copy the type of the last decoder layer."""
        return self.num_layers - 1


# --------------------------------------------------------------------------------------------------
# GPU description
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU type: memory, dense tensor peaks, NVLink domain and links.

    >>> gpu = load_gpu("GB200")
    >>> gpu.nvlink_domain, gpu.peak_tflops("bf16"), round(gpu.usable_memory_gib, 1)
    (72, 2500.0, 184.0)
    """

    name: str
    arch: str
    hbm_gb: float
    usable_memory_gib: float
    peak: tuple[tuple[str, float], ...]
    nvlink_unidir_gbps: float
    nvlink_domain: int
    inter_node_unidir_gbps: float
    host_link_unidir_gbps: float
    hbm_bandwidth_tbps: float = 3.35
    aliases: tuple[str, ...] = ()
    #: streaming multiprocessors (``None``: no sourced figure in the catalog)
    sm_count: int | None = None

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak in TFLOP/s for ``dtype`` (``bf16``, ``fp8``, ``mxfp8``, ``nvfp4``).

        MXFP8 falls back to the FP8 peak; a dtype the GPU lacks raises :class:`CatalogError`.
        """
        table = dict(self.peak)
        if dtype == "mxfp8" and table.get("mxfp8") is None:
            dtype = "fp8"
        value = table.get(dtype)
        if value is None:
            raise CatalogError(f"GPU {self.name} has no {dtype} tensor peak in the hardware catalog")
        return float(value)

    @property
    def is_blackwell(self) -> bool:
        """Blackwell-class GPU (MXFP8/NVFP4 recipes, HybridEP, NVLink5)."""
        return self.arch.startswith("blackwell")


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def _read_package_yaml(filename: str) -> Any:
    text = resources.files("longpack").joinpath("data", filename).read_text(encoding="utf-8")
    # libyaml's parser when PyYAML has it (~10x faster: every `longpack` command lists the catalog's
    # models in `plan`'s help); the same safe constructors either way.
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def _catalog_entries() -> dict[str, dict[str, Any]]:
    raw = _read_package_yaml("model_catalog.yaml")
    entries = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(entries, dict):
        raise CatalogError("model_catalog.yaml: expected a top-level 'models:' mapping")
    for name, entry in entries.items():
        if not isinstance(entry, dict) or not entry.get("short_name"):
            raise CatalogError(f"model_catalog.yaml: models.{name} needs a mapping with a short_name")
    return dict(entries)


@functools.cache
def _model_entries() -> dict[str, dict[str, Any]]:
    # entries with an architecture; the others are families only the rules know
    return {k: v for k, v in _catalog_entries().items() if "hidden_size" in v}


@functools.cache
def _gpu_entries() -> dict[str, dict[str, Any]]:
    return dict(_read_package_yaml("hardware_catalog.yaml")["gpus"])


def list_models() -> list[str]:
    """Names of the catalog models.

    >>> "deepseek_v3" in list_models() and "qwen3_235b_a22b" in list_models()
    True
    """
    return sorted(_model_entries())


def list_gpus() -> list[str]:
    """Names of the catalog GPUs.

    >>> list_gpus()[:3]
    ['B200', 'B300', 'GB200']
    """
    return sorted(_gpu_entries())


def catalog_entry(name: str) -> dict[str, Any]:
    """The raw catalog mapping of model ``name`` (including its ``derived`` reference figures)."""
    entries = _model_entries()
    if name not in entries:
        raise CatalogError(f"unknown model {name!r}; known: {', '.join(sorted(entries))}")
    return entries[name]


def _model_from_catalog(name: str, entry: dict[str, Any]) -> ModelSpec:
    att = entry["attention"]
    kind = "mla" if att["type"] == "mla" else "gqa"
    attention = AttentionSpec(
        kind=kind,
        num_heads=int(att["num_attention_heads"]),
        num_kv_heads=int(att.get("num_kv_heads", att["num_attention_heads"])),
        head_dim=int(att.get("head_dim", entry["hidden_size"] // att["num_attention_heads"])),
        output_gate=bool(att.get("output_gate", False)),
        qk_layernorm=bool(att.get("qk_layernorm", False)),
        q_lora_rank=int(att.get("q_lora_rank") or 0),
        kv_lora_rank=int(att.get("kv_lora_rank") or 0),
        qk_nope_head_dim=int(att.get("qk_nope_head_dim") or 0),
        qk_rope_head_dim=int(att.get("qk_rope_head_dim") or 0),
        v_head_dim=int(att.get("v_head_dim") or 0),
    )
    moe_raw = entry.get("moe")
    moe = None
    if moe_raw:
        shared = int(moe_raw.get("num_shared_experts") or 0)
        shared_ffn = int(moe_raw.get("shared_expert_ffn_hidden_size") or 0)
        if shared and not shared_ffn:
            shared_ffn = int(moe_raw["moe_ffn_hidden_size"]) * shared
        moe = MoESpec(
            num_experts=int(moe_raw["num_experts"]),
            top_k=int(moe_raw["top_k"]),
            moe_ffn_hidden_size=int(moe_raw["moe_ffn_hidden_size"]),
            shared_ffn_hidden_size=shared_ffn,
            shared_expert_gate=bool(moe_raw.get("shared_expert_gate", False)),
        )
    gdn = None
    interval = 1
    if entry.get("gated_deltanet"):
        g = entry["gated_deltanet"]
        gdn = GatedDeltaNetSpec(
            num_key_heads=int(g["num_key_heads"]),
            key_head_dim=int(g["key_head_dim"]),
            num_value_heads=int(g["num_value_heads"]),
            value_head_dim=int(g["value_head_dim"]),
            conv_kernel_dim=int(g.get("conv_kernel_dim", 4)),
        )
        interval = int(entry.get("layer_pattern", {}).get("full_attention_interval", 4))
    return ModelSpec(
        name=name,
        display_name=str(entry.get("display_name", name)),
        hidden_size=int(entry["hidden_size"]),
        num_layers=int(entry["num_layers"]),
        vocab_size=int(entry["vocab_size"]),
        attention=attention,
        ffn_hidden_size=int(entry.get("ffn_hidden_size") or 0),
        moe=moe,
        first_k_dense_layers=int(entry.get("first_k_dense_layers") or 0),
        gated_mlp=str(entry.get("activation", "swiglu")).lower() in ("swiglu", "geglu", "silu_glu"),
        tie_embeddings=bool(entry.get("tie_embeddings", False)),
        mtp_layers=int(entry.get("mtp_layers") or 0),
        full_attention_interval=interval,
        gdn=gdn,
        source=f"model_catalog.yaml:{name}",
    )


def load_model(name_or_path: str) -> ModelSpec:
    """A model from the catalog by name, or from a Hugging Face ``config.json`` (file or folder).

    >>> load_model("kimi_k2").moe.num_experts
    384
    >>> load_model("no_such_model")
    Traceback (most recent call last):
    ...
    longpack.errors.CatalogError: unknown model 'no_such_model'; known: ...
    """
    entries = _model_entries()
    key = name_or_path.strip()
    normalized = key.lower().replace("-", "_").replace(".", "_")
    if key in entries:
        return _model_from_catalog(key, entries[key])
    if normalized in entries:
        return _model_from_catalog(normalized, entries[normalized])
    for name, entry in entries.items():
        if str(entry.get("hf_id", "")).lower() == key.lower():
            return _model_from_catalog(name, entry)
    path = Path(key)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        label = path.parent.name if path.name == "config.json" else path.stem
        return model_from_hf_config(path, name=label or None)
    raise CatalogError(
        f"unknown model {name_or_path!r}; known: {', '.join(sorted(entries))} "
        "(or pass the path of a Hugging Face config.json)"
    )


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


class _HFCounts:
    """Reads the integer fields of a Hugging Face ``config.json``: a count is a whole number (JSON ``32``;
    ``32.0`` is accepted as 32), never ``true``, ``NaN``, ``Infinity``, a fraction or a string; a missing
    field takes its default. A bad value is a :class:`CatalogError` naming the file, field and value."""

    def __init__(self, cfg: dict[str, Any], where: str) -> None:
        self.cfg, self.where = cfg, where

    def __call__(
        self,
        *keys: str,
        minimum: int = 1,
        default: int | None = None,
        at_most: tuple[int, str] | None = None,
    ) -> int:
        key = next((k for k in keys if self.cfg.get(k) is not None), None)
        if key is None:
            if default is None:
                raise CatalogError(
                    f"{self.where}: field {keys[0]!r} is missing; is this a decoder LM config.json?",
                    fields="model",
                )
            return default
        value = self.cfg[key]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            whole, value = True, int(value)
        if not whole or value < minimum:
            kind = "a positive integer" if minimum >= 1 else "a non-negative integer"
            raise CatalogError(
                f"{self.where}: field {key!r} must be {kind}, got {self.cfg[key]!r}; fix config.json",
                fields="model",
            )
        if at_most is not None and value > at_most[0]:
            raise CatalogError(
                f"{self.where}: field {key!r} is {value}, more than {at_most[1]} ({at_most[0]}); fix "
                "config.json",
                fields="model",
            )
        return int(value)


def _hf_attention(cfg: dict[str, Any], count: _HFCounts, model_type: str, where: str) -> AttentionSpec:
    """The attention of a Hugging Face config: MLA when it has a ``kv_lora_rank``, else GQA (its KV heads
    checked to divide the query heads)."""
    h = count("hidden_size")
    heads = count("num_attention_heads")
    if cfg.get("kv_lora_rank"):
        attention = AttentionSpec(
            kind="mla",
            num_heads=heads,
            num_kv_heads=heads,
            q_lora_rank=count("q_lora_rank", minimum=0, default=0),
            kv_lora_rank=count("kv_lora_rank"),
            qk_nope_head_dim=count("qk_nope_head_dim"),
            qk_rope_head_dim=count("qk_rope_head_dim"),
            v_head_dim=count("v_head_dim"),
            qk_layernorm=True,
        )
    else:
        attention = AttentionSpec(
            kind="gqa",
            num_heads=heads,
            num_kv_heads=count("num_key_value_heads", default=heads),
            head_dim=count("head_dim", default=h // heads if h % heads == 0 else None),
            output_gate=model_type == "qwen3_next",
            qk_layernorm=model_type in ("qwen3", "qwen3_moe", "qwen3_next") or bool(cfg.get("use_qk_norm")),
        )
    if attention.kind == "gqa":
        kv = attention.num_kv_heads
        if kv > heads or heads % kv:
            raise CatalogError(
                f"{where}: num_key_value_heads={kv} must divide num_attention_heads={heads} (each KV head "
                "serves a whole group of query heads); fix config.json",
                fields="model",
            )
    return attention


def _hf_moe(count: _HFCounts, model_type: str) -> tuple[MoESpec | None, int]:
    """The experts of a Hugging Face config (``None``: dense) and its leading dense layers."""
    num_experts = count("n_routed_experts", "num_experts", "num_local_experts", minimum=0, default=0)
    moe = None
    first_dense = 0
    if num_experts > 0:
        expert_ffn = count("moe_intermediate_size", "intermediate_size")
        shared_ffn = count("shared_expert_intermediate_size", minimum=0, default=0)
        n_shared = count("n_shared_experts", minimum=0, default=0)
        if not shared_ffn and n_shared:
            shared_ffn = n_shared * expert_ffn
        moe = MoESpec(
            num_experts=num_experts,
            top_k=count(
                "num_experts_per_tok", "moe_topk", default=2, at_most=(num_experts, "the number of experts")
            ),
            moe_ffn_hidden_size=expert_ffn,
            shared_ffn_hidden_size=shared_ffn,
            shared_expert_gate=model_type in ("qwen2_moe", "qwen3_next") and shared_ffn > 0,
        )
        first_dense = count("first_k_dense_replace", minimum=0, default=0)
    return moe, first_dense


def model_from_hf_config(config: str | Path | dict[str, Any], *, name: str | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` (path or parsed dict).

    Understands Llama/Mistral/Qwen2/Qwen3 (dense), Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3,
    Kimi-K2, GLM-4.5 (``glm4_moe``) and Qwen3-Next field names.

    >>> cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    ...        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    ...        "vocab_size": 128256}
    >>> m = model_from_hf_config(cfg, name="llama3_8b")
    >>> m.attention.kv_width, m.moe is None
    (1024, True)
    """
    where = "<dict>"
    if isinstance(config, dict):
        raw: Any = config
    else:
        where = str(config)
        try:
            raw = json.loads(Path(config).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise CatalogError(f"{where}: cannot read a Hugging Face config.json: {exc}") from exc
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: a Hugging Face config.json must hold a JSON object")
    cfg: dict[str, Any] = dict(raw)
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM in text_config
        cfg = {**cfg, **cfg["text_config"]}
    for required in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if cfg.get(required) is None:
            raise CatalogError(f"{where}: field {required!r} is missing; is this a decoder LM config.json?")
    count = _HFCounts(cfg, where)
    h = count("hidden_size")
    model_type = str(cfg.get("model_type", ""))
    attention = _hf_attention(cfg, count, model_type, where)
    moe, first_dense = _hf_moe(count, model_type)
    gdn = None
    interval = 1
    if model_type == "qwen3_next" or cfg.get("linear_num_value_heads"):
        interval = count("full_attention_interval", default=4)
        gdn = GatedDeltaNetSpec(
            num_key_heads=count("linear_num_key_heads"),
            key_head_dim=count("linear_key_head_dim"),
            num_value_heads=count("linear_num_value_heads"),
            value_head_dim=count("linear_value_head_dim"),
            conv_kernel_dim=count("linear_conv_kernel_dim", default=4),
        )
    act = str(_first(cfg, "hidden_act", "activation_function", default="silu")).lower()
    layers = count("num_hidden_layers")
    if first_dense > layers:
        raise CatalogError(
            f"{where}: first_k_dense_replace={first_dense} is more than num_hidden_layers={layers}; fix "
            "config.json",
            fields="model",
        )
    return ModelSpec(
        name=name or str(cfg.get("_name_or_path") or model_type or "hf_model"),
        display_name=name or str(cfg.get("_name_or_path") or model_type),
        hidden_size=h,
        num_layers=layers,
        vocab_size=count("vocab_size"),
        attention=attention,
        # a dense model's FFN has a width; an MoE model's experts may carry all of it
        ffn_hidden_size=count("intermediate_size", minimum=0 if moe else 1, default=0 if moe else None),
        moe=moe,
        first_k_dense_layers=first_dense,
        gated_mlp=act in ("silu", "swiglu", "swish") or model_type.startswith("gemma"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mtp_layers=count("num_nextn_predict_layers", "mtp_num_hidden_layers", minimum=0, default=0),
        full_attention_interval=interval,
        gdn=gdn,
        source=where,
    )


def load_gpu(name: str) -> GPUSpec:
    """A GPU from the hardware catalog by name or alias (case-insensitive; ``H800`` -> H100).

    >>> load_gpu("h100").name, load_gpu("DGX-GB300").name, load_gpu("H800").name
    ('H100_SXM', 'GB300', 'H100_SXM')
    """
    entries = _gpu_entries()
    wanted = name.strip().lower().replace("_", "-")
    match = None
    for key, entry in entries.items():
        names = [key] + [str(a).split(" ")[0] for a in entry.get("aliases", [])]
        if any(n.lower().replace("_", "-") == wanted for n in names):
            match = key
            break
    if match is None:
        raise CatalogError(f"unknown GPU {name!r}; known: {', '.join(sorted(entries))} (and their aliases)")
    entry = entries[match]
    peak = entry.get("peak_dense_tflops", {})
    usable = entry.get("usable_hbm_GiB_typical")
    if usable is None:
        usable = float(entry["hbm_GB"]) * 1e9 / 2**30
    nvlink = entry.get("nvlink", {})
    host = entry.get("host_link", {})
    return GPUSpec(
        name=match,
        arch=str(entry.get("arch", "")),
        hbm_gb=float(entry["hbm_GB"]),
        usable_memory_gib=float(usable),
        peak=tuple((k, float(v)) for k, v in peak.items() if v is not None),
        nvlink_unidir_gbps=float(nvlink.get("bw_per_gpu_unidir_GBps", 450)),
        nvlink_domain=int(nvlink.get("domain_size", 8)),
        inter_node_unidir_gbps=float(entry.get("inter_node", {}).get("bw_per_gpu_unidir_GBps", 50)),
        host_link_unidir_gbps=float(host.get("bw_unidir_GBps") or host.get("bw_unidir_GBps_per_gpu") or 64.0),
        hbm_bandwidth_tbps=float(entry.get("hbm_bandwidth_TBps", 3.35)),
        sm_count=int(entry["sm_count"]) if entry.get("sm_count") is not None else None,
        # aliases like "H800 (same compute, ...)" arrive split at the commas: keep model-like first words
        aliases=tuple(
            str(a).split(" ")[0]
            for a in entry.get("aliases", [])
            if str(a)[:1].isalnum() and any(ch.isdigit() for ch in str(a).split(" ")[0])
        ),
    )


# --------------------------------------------------------------------------------------------------
# Model families (what the configuration rules know of a model)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """One catalog entry as ``longpack check`` sees it: the architecture numbers the rules need (from
    :attr:`spec`; ``None`` when the catalog has no architecture for it) and the packing opt-outs of the
    family's Megatron-Bridge recipes.

    >>> f = find_family("deepseek_v3")
    >>> f.num_layers, f.num_attention_heads, f.num_moe_experts, f.mtp_num_layers
    (61, 128, 256, 1)
    >>> g = find_family("glm_4_5v")
    >>> g.spec is None, g.num_layers, g.in_batch_packing
    (True, None, False)
    """

    name: str
    #: The short name findings print (``DeepSeek-V3``).
    display_name: str
    spec: ModelSpec | None = None
    hf_id: str | None = None
    #: Regular expressions matched (case-insensitively) against HF ids and ``_target_`` class paths.
    patterns: tuple[str, ...] = ()
    #: Offline packed SFT supported by the family's recipes.
    offline_packing: bool = True
    #: Collate-level in-batch packing supported (``enable_in_batch_packing`` without deferral).
    in_batch_packing: bool = True
    #: Any packing (offline, in-batch, Energon) supported.
    any_packing: bool = True
    #: Why packing is refused, quoted from Megatron-Bridge.
    opt_out_reason: str = ""
    #: The fix for collate in-batch packing when the family packs elsewhere (empty: turn it off).
    in_batch_fix: str = ""

    @property
    def num_layers(self) -> int | None:
        return None if self.spec is None else self.spec.num_layers

    @property
    def num_attention_heads(self) -> int | None:
        return None if self.spec is None else self.spec.attention.num_heads

    @property
    def num_query_groups(self) -> int | None:
        """KV heads (MLA: the per-head K/V after up-projection, i.e. the attention heads)."""
        return None if self.spec is None else self.spec.attention.num_kv_heads

    @property
    def num_moe_experts(self) -> int | None:
        return None if self.spec is None or self.spec.moe is None else self.spec.moe.num_experts

    @property
    def mtp_num_layers(self) -> int:
        return 0 if self.spec is None else self.spec.mtp_layers

    @classmethod
    def of_model(cls, model: ModelSpec) -> ModelFamily:
        """The family of ``model``: its catalog family (with ``model``'s own architecture, which may come
        from a ``config.json``), or a family of its own that supports every packing path.

        >>> ModelFamily.of_model(load_model("qwen3_8b")) == find_family("qwen3_8b")
        True
        >>> spec = model_from_hf_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        ...     "intermediate_size": 128, "vocab_size": 100}, name="tiny")
        >>> f = ModelFamily.of_model(spec)
        >>> f.name, f.num_layers, f.patterns
        ('tiny', 2, ())
        """
        known = find_family(model.name)
        if known is None:
            return cls(name=model.name, display_name=model.display_name or model.name, spec=model)
        return known if known.spec == model else replace(known, spec=model)


def _family_from_entry(name: str, entry: dict[str, Any]) -> ModelFamily:
    packing = entry.get("packing") or {}
    allowed = {"offline", "in_batch", "any", "reason", "in_batch_fix"}
    if not isinstance(packing, dict) or set(packing) - allowed:
        raise CatalogError(
            f"model_catalog.yaml: models.{name}.packing takes only {sorted(allowed)}, got {packing!r}"
        )
    patterns = tuple(str(p) for p in entry.get("name_patterns") or ())
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise CatalogError(f"model_catalog.yaml: models.{name}.name_patterns {pattern!r}: {exc}") from exc
    return ModelFamily(
        name=name,
        display_name=str(entry["short_name"]),
        spec=_model_from_catalog(name, entry) if "hidden_size" in entry else None,
        hf_id=None if entry.get("hf_id") is None else str(entry["hf_id"]),
        patterns=patterns,
        offline_packing=bool(packing.get("offline", True)),
        in_batch_packing=bool(packing.get("in_batch", True)),
        any_packing=bool(packing.get("any", True)),
        opt_out_reason=str(packing.get("reason", "")),
        in_batch_fix=str(packing.get("in_batch_fix", "")),
    )


@functools.cache
def list_families() -> tuple[ModelFamily, ...]:
    """Every catalog family, in catalog order (the order :func:`find_family` tries their patterns).

    >>> [f.name for f in list_families()][:4]
    ['deepseek_v3', 'kimi_k2', 'glm_4_5', 'glm_4_5v']
    """
    return tuple(_family_from_entry(name, entry) for name, entry in _catalog_entries().items())


@functools.cache
def _families_by_name() -> dict[str, ModelFamily]:
    return {f.name: f for f in list_families()}


@functools.lru_cache(maxsize=4096)
def find_family(text: str) -> ModelFamily | None:
    """The family named ``text`` (a catalog name such as ``qwen3_235b_a22b``), or whose pattern matches
    an HF id or a Megatron-Bridge provider path in it; ``None`` when nothing matches.

    >>> find_family("megatron.bridge.models.qwen.Qwen3NextModelProvider80B_A3B").name
    'qwen3_next_80b_a3b'
    >>> find_family("zai-org/GLM-4.5V").name, find_family("zai-org/GLM-4.5").name
    ('glm_4_5v', 'glm_4_5')
    >>> find_family("zai-org/GLM-4.5-Air") is None  # another architecture: not guessed
    True
    >>> find_family("gpt2") is None
    True
    """
    key = text.strip().lower()
    by_name = _families_by_name()
    if key in by_name:
        return by_name[key]
    for family in list_families():
        if any(re.search(p, key) for p in family.patterns):
            return family
    return None


def family_names() -> list[str]:
    """Names accepted by ``longpack check --model`` and ``longpack.model_family``.

    >>> "deepseek_v3" in family_names() and "qwen3_8b" in family_names()
    True
    """
    return [f.name for f in list_families()]


__all__ = [
    "AttentionSpec",
    "CatalogError",
    "GPUSpec",
    "GatedDeltaNetSpec",
    "MoESpec",
    "ModelFamily",
    "ModelSpec",
    "catalog_entry",
    "family_names",
    "find_family",
    "list_families",
    "list_gpus",
    "list_models",
    "load_gpu",
    "load_model",
    "model_from_hf_config",
]
