"""A small random model of a real architecture family, and THD attention for it (``longpack verify``).

:func:`tiny_config` shrinks a Hugging Face ``config.json`` (layers, width, heads, experts) and keeps what
packing can get wrong: the vocabulary, the positional scheme (RoPE theta and scaling: llama3, YaRN, ...),
sliding windows and the family's layer types. :func:`build_model` builds it with ``transformers`` from the
config alone (no download), in float64, with weights drawn from ``seed``.

Packed attention on the CPU: transformers has a varlen path only for flash-attention kernels (the
``cu_seq_lens_q`` keyword arguments) and, for ``sdpa``/``eager``, a block-diagonal mask it infers from
restarting ``position_ids`` (a ``W x W`` mask). Neither reads the THD metadata the training stack hands the
attention, so longpack registers its own attention function with ``transformers.AttentionInterface``
(:data:`THD_ATTENTION`): from the :class:`~longpack.runtime.attention.TokenLayout` built from the batch's
``cu_seqlens_q`` / ``cu_seqlens_q_padded`` it gathers the packed sequences into batches of similar length
and runs one causal ``scaled_dot_product_attention`` per batch (``Σ s_i²`` work; under CP, one masked call
per sequence against the gathered keys); tokens outside every sequence get a zero output, as
TransformerEngine's THD kernels give them. The model computes in float64 throughout (:class:`Float64Mode`:
transformers' float32 upcasts are promoted). The unpacked reference
runs the same model through transformers' own ``sdpa`` path with its own causal (and sliding-window) masks.

>>> cfg = tiny_config({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 4096, "num_hidden_layers": 36,
...                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1e6})
>>> cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"], cfg["num_key_value_heads"]
(1, 16, 1000, 1)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from longpack.errors import ConfigError, MissingDependencyError
from longpack.runtime.verify_linear import LINEAR_FAMILIES, LINEAR_LAYER_TYPES, register_linear_kernels

__all__ = [
    "HEAD_CLASSES",
    "THD_ATTENTION",
    "AttentionPlan",
    "attention_plan",
    "build_model",
    "tiny_config",
]

#: Name of longpack's THD attention in ``transformers.AttentionInterface``.
THD_ATTENTION = "longpack_thd"
#: Classes of the loss head: labels are hashed to ``label % HEAD_CLASSES`` (a per-token function, as the full
#: vocabulary head is, at a fraction of its cost; the embedding keeps the whole vocabulary).
HEAD_CLASSES = 256
#: Width of the shrunk model (hidden size, heads x head dim, MLP width).
TINY = {"hidden_size": 16, "num_attention_heads": 2, "head_dim": 8, "intermediate_size": 32}
#: Multi-latent attention of the shrunk model (DeepSeek-V3's ``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64,
#: ``qk_nope_head_dim`` 128, ``v_head_dim`` 128, scaled down together): RoPE on 8 of each head's 16 query/key
#: dimensions, as the family splits them.
TINY_MLA = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8}
#: Gated DeltaNet width of the shrunk model: 4 key heads, 8 value heads (Qwen3-Next's 1:2 grouping) of 8
#: dimensions (heads divisible by CP 2 and 4, for the head split); the convolution keeps the family's kernel.
TINY_LINEAR = {
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}
#: Mamba-2 width of the shrunk Nemotron-H: 4 heads of 8 (8 state dimensions, 2 groups); the convolution kernel
#: and the scan's chunk size are the family's.
TINY_MAMBA = {"mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 8, "n_groups": 2}
#: Nemotron-H's ``hybrid_override_pattern`` symbols -> layer types.
NEMOTRON_H_SYMBOLS = {"M": "linear_attention", "*": "full_attention", "E": "moe", "-": "mlp"}
#: Families with Mamba / SSM layers verify refuses (no packed path yet).
SSM_MODEL_TYPES = (
    "bamba",
    "falcon_h1",
    "falcon_mamba",
    "granitemoehybrid",
    "jamba",
    "mamba",
    "mamba2",
    "zamba",
    "zamba2",
)
#: Layer types whose token mixer is not softmax attention (state across packed sequences needs the
#: family's own varlen kernels, which transformers does not run on the CPU).
_UNSUPPORTED_LAYER_TYPES = ("linear_attention", "mamba", "conv", "recurrent")


def tiny_config(source: Mapping[str, Any], *, layers: int = 1) -> dict[str, Any]:
    """The shrunk config of a family: ``layers`` layers (one per layer type if the family has several), width
    and heads from :data:`TINY`, a few experts for MoE families; vocabulary, RoPE and sliding windows kept.

    >>> tiny_config({"model_type": "llama", "vocab_size": 50, "num_attention_heads": 8,
    ...              "num_key_value_heads": 8})["num_key_value_heads"]
    2
    """
    config = dict(source)
    if isinstance(config.get("text_config"), Mapping):
        raise ConfigError(
            f"model_type {config.get('model_type')!r} is a vision-language config; verify builds text "
            "decoders only (mRoPE rows are not verified yet): pass the text model's config.json",
            fields="model",
        )
    if config.get("model_type") in SSM_MODEL_TYPES:
        raise ConfigError(
            f"model_type {config.get('model_type')!r} has Mamba (SSM) layers; verify has no packed path for them "
            "yet (their state across packed sequences needs seq_idx / cu_seqlens kernels transformers does not "
            f"run on the CPU); it runs softmax attention, Qwen3-Next's Gated DeltaNet and Nemotron-H's Mamba-2",
            fields="model",
        )
    if config.get("model_type") == "nemotron_h":  # its layer types live in layers_block_type or a pattern
        pattern = config.pop("hybrid_override_pattern", None)
        blocks = config.pop("layers_block_type", None) or config.pop("layer_types", None)
        if not blocks and pattern:
            blocks = [NEMOTRON_H_SYMBOLS[c] for c in str(pattern) if c in NEMOTRON_H_SYMBOLS]
        config["layer_types"] = list(blocks or ["linear_attention", "moe", "full_attention", "mlp"])
        config.update(TINY_MAMBA)
        config["n_group"] = config["topk_group"] = 1
        if config.get("moe_shared_expert_intermediate_size"):
            config["moe_shared_expert_intermediate_size"] = 32
    types = config.get("layer_types")
    if config.get("model_type") == "qwen3_next" and not isinstance(types, list):
        interval = int(config.get("full_attention_interval") or 4)
        count = int(config.get("num_hidden_layers") or interval)
        types = config["layer_types"] = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(count)
        ]
    unsupported = set(_UNSUPPORTED_LAYER_TYPES)
    if config.get("model_type") in LINEAR_FAMILIES:
        unsupported -= set(LINEAR_LAYER_TYPES)
    if isinstance(types, list) and any(t in unsupported for t in types):
        raise ConfigError(
            f"model_type {config.get('model_type')!r} has {sorted(set(types))} layers; verify runs softmax "
            f"attention, Qwen3-Next's Gated DeltaNet and Nemotron-H's Mamba-2 (other linear-attention "
            "or SSM families need their own varlen kernels)",
            fields="model",
        )
    heads, kv = int(config.get("num_attention_heads") or 4), int(config.get("num_key_value_heads") or 0)
    config.update(TINY)
    config["num_key_value_heads"] = TINY["num_attention_heads"] if kv in (0, heads) else 1
    if isinstance(types, list) and types:
        kinds = list(dict.fromkeys(types))
        count = max(layers, len(kinds))
        config["layer_types"] = (kinds * count)[:count]
        config["num_hidden_layers"] = count
    else:
        config["num_hidden_layers"] = layers
    if "max_window_layers" in config:
        config["max_window_layers"] = min(int(config["max_window_layers"] or 0), config["num_hidden_layers"])
    if config.get("model_type") == "qwen3_next":
        config.update(TINY_LINEAR)
        config["mlp_only_layers"] = []
    if config.get("kv_lora_rank"):  # multi-latent attention (DeepSeek-V2/V3, Kimi K2): its own head widths
        config.update(TINY_MLA)
        if config.get("q_lora_rank"):  # None: queries are projected without a low-rank step (V2-Lite)
            config["q_lora_rank"] = TINY_MLA["kv_lora_rank"]
        config["head_dim"] = TINY_MLA["qk_rope_head_dim"]  # transformers' rotary tables are this wide
    if config.get("n_group") and config.get("n_routed_experts"):  # group-limited routing over 4 experts
        config["n_group"] = config["topk_group"] = 1
    if "first_k_dense_replace" in config:  # the first layers are dense: the shrunk model's layer routes
        config["first_k_dense_replace"] = 0
    if config.get("model_type") == "nemotron_h":  # the config takes the layer list as layers_block_type
        config["layers_block_type"] = config.pop("layer_types")
    for key, value in (
        ("moe_intermediate_size", 32),
        ("shared_expert_intermediate_size", 32),
        ("num_experts", 4),
        ("num_local_experts", 4),
        ("n_routed_experts", 4),
        ("num_experts_per_tok", 2),
    ):
        if config.get(key):
            config[key] = value
    config["initializer_range"] = 0.2  # sharper attention than 0.02: a wrong position shows in the loss
    config["tie_word_embeddings"] = False
    config["use_cache"] = False  # training: no KV cache, no recurrent / convolution state kept
    config.pop("architectures", None)
    config.pop("torch_dtype", None)
    config.pop("dtype", None)
    config.pop("quantization_config", None)
    return config


def build_model(source: Mapping[str, Any], *, seed: int = 0, layers: int = 1) -> Any:
    """The tiny float64 model (``transformers.AutoModel``: the decoder without its LM head) for ``source``,
    its weights drawn from ``seed`` without touching the global RNG, in eval mode, THD attention set."""
    try:
        from transformers import AutoConfig, AutoModel
    except ImportError as exc:
        raise MissingDependencyError(
            "longpack verify needs transformers: pip install 'longpack[hf,torch]'", fields="model"
        ) from exc
    register_thd_attention()
    shrunk = tiny_config(source, layers=layers)
    model_type = shrunk.pop("model_type")
    register_linear_kernels(model_type)
    try:
        config = AutoConfig.for_model(model_type, **shrunk)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"transformers {__import__('transformers').__version__} cannot build model_type {model_type!r}: {exc}",
            fields="model",
        ) from exc
    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"  # the family's own expert loop (grouped_mm has no float64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModel.from_config(config, dtype=torch.float64)
    model = model.to(torch.float64)  # parameters a family creates in float32 (Nemotron-H's router) too
    model.eval()  # no dropout; gradients still flow
    model.config._attn_implementation = "sdpa"
    run_in_float64(model)
    return model


class Float64Mode(torch.overrides.TorchFunctionMode):
    """Promotes every float32 request to float64: ``x.float()``, ``x.to(torch.float32)``, ``dtype=torch.float32``.

    transformers upcasts to float32 inside float64 models (RMSNorm, the RoPE tables, eager softmax). Two float64
    values that differ by round-off (two valid evaluation orders, ~1e-16) can round to adjacent float32
    numbers, a difference 1e8 times larger (measured: 0.17606205493211735 packed vs 0.17606205493211752
    alone before Qwen3's final RMSNorm gave outputs 2^-25 apart), so packed and unpacked could differ for
    reasons that have nothing to do with packing. Under this mode the family's own code runs unchanged, in
    float64 throughout.

    >>> with Float64Mode():
    ...     torch.ones(2).float().dtype, torch.ones(2).to(torch.float32).dtype
    (torch.float64, torch.float64)
    """

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            return args[0].double()
        if kwargs.get("dtype") is torch.float32:
            kwargs = {**kwargs, "dtype": torch.float64}
        if any(a is torch.float32 for a in args):
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return func(*args, **kwargs)


_FLOAT64_DEPTH = [0]


def _float64_forward(forward: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        if _FLOAT64_DEPTH[0]:
            return forward(*args, **kwargs)
        _FLOAT64_DEPTH[0] += 1
        try:
            with Float64Mode():
                return forward(*args, **kwargs)
        finally:
            _FLOAT64_DEPTH[0] -= 1

    return run


def run_in_float64(model: Any) -> None:
    """Run ``model`` and the pieces a pipeline stage calls on their own (its children and the items of its
    layer lists) under :class:`Float64Mode`."""
    modules = [model]
    for child in model.children():
        modules += list(child) if isinstance(child, torch.nn.ModuleList) else [child]
    for module in modules:
        module.forward = _float64_forward(module.forward)


@dataclass(frozen=True)
class AttentionPlan:
    """Which queries see which keys.

    ``buckets``: packed sequences whose queries and keys are the same contiguous run of real tokens, in
    order (every sequence of a whole THD row), gathered by length into ``[S, L]`` batches: ``gather`` holds
    token indices (``queries`` = a zero row, for the right padding of shorter sequences), ``picked`` the flat
    ``S * L`` positions of real tokens and ``target`` their token indices. Causal attention over a
    right-padded sequence never reaches its padding, so one SDPA call per bucket (``is_causal``: the
    kernel's flash path) gives every sequence its own attention, with no mask and no cross-sequence term.

    ``blocks``: the other sequences (a CP rank's shard against the gathered keys), one masked SDPA each:
    ``(query index, key index, mask, query offsets, key offsets)``.
    """

    queries: int
    blocks: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor], ...]
    buckets: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...] = ()


#: A bucket holds sequences at least this fraction of its longest (padding costs at most ~1/BUCKET_RATIO^2).
BUCKET_RATIO = 0.8


def _buckets(
    starts: np.ndarray, lengths: np.ndarray, dummy: int
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]:
    order = np.argsort(-lengths, kind="stable")
    out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    i = 0
    while i < order.size:
        longest = int(lengths[order[i]])
        j = i
        while j < order.size and lengths[order[j]] >= BUCKET_RATIO * longest:
            j += 1
        chosen = order[i:j]
        steps = np.arange(longest)
        inside = steps[None, :] < lengths[chosen][:, None]
        gather = np.where(inside, starts[chosen][:, None] + steps[None, :], dummy)
        picked = np.flatnonzero(inside)
        out.append(
            (
                torch.from_numpy(gather),
                torch.from_numpy(picked),
                torch.from_numpy(gather.reshape(-1)[picked].copy()),
            )
        )
        i = j
    return tuple(out)


def attention_plan(q_layout: Any, k_layout: Any | None = None) -> AttentionPlan:
    """The attention plan of a THD row (``k_layout``: the gathered keys' labels under CP).

    >>> from longpack.runtime.attention import token_layout
    >>> plan = attention_plan(token_layout([0, 2, 3], 4))
    >>> [(g.tolist(), t.tolist()) for g, _, t in plan.buckets], plan.blocks
    ([([[0, 1]], [0, 1]), ([[2]], [2])], ())
    """
    if k_layout is None:
        seq = q_layout.seq_id.numpy()
        offset = q_layout.offset.numpy()
        real = q_layout.real.numpy().astype(bool)
        tokens = np.flatnonzero(real)
        ids = seq[tokens]
        if tokens.size and bool(np.all(np.diff(ids) >= 0)):  # sequences in order: each one contiguous?
            first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            counts = np.diff(np.r_[first, tokens.size])
            starts = tokens[first]
            expected = np.repeat(starts, counts) + offset[tokens]
            if np.array_equal(expected, tokens) and not offset[starts].any():
                return AttentionPlan(
                    queries=int(seq.size), blocks=(), buckets=_buckets(starts, counts, int(seq.size))
                )
    same = k_layout is None
    k_layout = q_layout if k_layout is None else k_layout
    blocks = []
    q_real = q_layout.real
    k_real = k_layout.real
    seq_ids = torch.unique(q_layout.seq_id[q_real])
    for seq_id in seq_ids.tolist():
        qi = torch.nonzero((q_layout.seq_id == seq_id) & q_real).flatten()
        ki = torch.nonzero((k_layout.seq_id == seq_id) & k_real).flatten()
        q_off = q_layout.offset[qi]
        k_off = k_layout.offset[ki]
        contiguous = (
            same
            and qi.numel() > 0
            and int(qi[-1] - qi[0]) + 1 == qi.numel()
            and bool((q_off == torch.arange(qi.numel())).all())
        )
        mask = None if contiguous else (k_off[None, :] <= q_off[:, None])
        blocks.append((qi, ki, mask, q_off, k_off))
    return AttentionPlan(queries=int(q_layout.seq_id.numel()), blocks=tuple(blocks))


def _thd_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    thd_plan: AttentionPlan | None = None,
    thd_gather: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """``transformers`` attention interface: ``query [1, H, T, D]`` -> ``([1, T, H, Dv], None)``."""
    if thd_plan is None:
        raise RuntimeError("longpack THD attention called without thd_plan")
    q = query[0].transpose(0, 1)  # [T, H, D]
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    groups = q.size(1) // k.size(1)
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    if thd_gather is not None:  # context parallel: every rank's keys and values
        k, v = thd_gather(k), thd_gather(v)
    pieces, where = [], []
    if thd_plan.buckets:
        zero = q.new_zeros(1, q.size(1), q.size(2))
        qz, kz, vz = torch.cat([q, zero]), torch.cat([k, zero]), torch.cat([v, v.new_zeros(1, *v.shape[1:])])
        for gather, picked, target in thd_plan.buckets:
            count, longest = gather.shape
            qb, kb, vb = (x[gather].transpose(1, 2) for x in (qz, kz, vz))  # [S, H, L, D]
            if sliding_window is not None and longest > int(sliding_window):
                steps = torch.arange(longest)
                allowed = (steps[None, :] <= steps[:, None]) & (
                    steps[:, None] - steps[None, :] < int(sliding_window)
                )
                out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=allowed, scale=scaling)
            else:
                out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scaling)
            pieces.append(out.transpose(1, 2).reshape(count * longest, q.size(1), -1).index_select(0, picked))
            where.append(target)
    for qi, ki, mask, q_off, k_off in thd_plan.blocks:
        qb = q.index_select(0, qi).transpose(0, 1)
        kb = k.index_select(0, ki).transpose(0, 1)
        vb = v.index_select(0, ki).transpose(0, 1)
        windowed = sliding_window is not None and int(q_off.max()) >= int(sliding_window)
        if mask is None and not windowed:
            out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scaling)
        else:
            allowed = k_off[None, :] <= q_off[:, None] if mask is None else mask
            if windowed:
                allowed = allowed & (q_off[:, None] - k_off[None, :] < int(sliding_window))  # type: ignore[arg-type]
            out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=allowed, scale=scaling)
        pieces.append(out.transpose(0, 1))
        where.append(qi)
    result = torch.zeros(q.size(0), q.size(1), v.size(2), dtype=v.dtype)
    if pieces:
        result = result.index_copy(0, torch.cat(where), torch.cat(pieces))
    return result.unsqueeze(0), None


_REGISTERED = False


def register_thd_attention() -> None:
    """Register :data:`THD_ATTENTION` with transformers (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(THD_ATTENTION, _thd_attention)
    _REGISTERED = True
