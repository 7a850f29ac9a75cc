"""Packed (varlen) Gated DeltaNet for ``longpack verify``: the causal conv1d and the chunked delta rule of a
linear-attention layer run per packed sequence, from the batch's ``cu_seqlens``.

transformers' torch fallbacks of Qwen3-Next's kernels (``causal_conv1d_fn`` and
``torch_chunk_gated_delta_rule`` in ``transformers/models/qwen3_next/modeling_qwen3_next.py``) cannot keep
packed sequences apart: without FLA / causal-conv1d, transformers 5.24 refuses a ``cu_seqlens`` keyword
(``ValueError``, ``integrations/hub_kernels.py``), and a row packed through restarting position ids alone
(the ``sdpa`` path) runs as one sequence, its convolution window and recurrent state carried from one sample
into the next (transformers #46093). FLA's ``chunk_gated_delta_rule``
and ``causal_conv1d`` (which Megatron-Core's ``GatedDeltaNet`` calls with ``cu_seqlens`` for THD batches)
restart both at every sequence start: the convolution sees zeros before the sequence's first token, the
delta rule starts from a zero state and chunks from the sequence's own first token.

:func:`register_linear_kernels` wraps the family's two functions (module globals of the modeling file) so
that, when the layer is called with longpack's ``thd_plan`` (:func:`longpack.runtime.verify.run_thd`), they
do what FLA does with ``cu_seqlens``: the row's sequences are gathered (by length, as the attention plan
buckets them, tokens outside every sequence left out), the family's own function runs on that batch of
sequences (zero initial state, chunked from each sequence's start), and the outputs go back to their tokens;
tokens outside every sequence get zeros. Without ``thd_plan`` the wrapper calls the family's function
unchanged, so the unpacked reference is transformers' own code, untouched.

Context parallelism (``thd_gather`` set, :mod:`longpack.runtime.verify_dist`): as Megatron-Core's GDN CP
(Megatron-LM @20ba03fec0) splits heads, each rank all-gathers the row's tokens, runs every whole sequence
for its share of the heads (the convolution: its share of the channels) and all-gathers the heads back, then
keeps its own tokens (when the heads do not divide by the CP size, every rank runs all heads).

Nemotron-H's Mamba-2 layers (its ``linear_attention`` layer type) get the same treatment: its
``causal_conv1d_fn`` and chunked SSD scan ``mamba2_chunk_scan`` (whose torch fallback likewise refuses
``seq_idx``) run per packed sequence, zero convolution history and zero SSM state at every sequence start, as
mamba-ssm's kernels with ``seq_idx`` and Megatron-Core's ``MambaMixer`` with ``cu_seqlens`` do. Under CP each
rank runs the whole gathered sequences for all Mamba heads and keeps its own tokens (Megatron-Core's Mamba CP
splits heads too; with the result being the same, the split itself is not modelled there).

Faults (:data:`LINEAR_FAULTS`) hand the layer a plan that ignores the boundaries, as a stack does whose
linear layers receive no ``cu_seqlens``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "LINEAR_CP_FAULTS",
    "LINEAR_FAMILIES",
    "LINEAR_FAULTS",
    "LINEAR_LAYER_TYPES",
    "has_linear_layers",
    "register_linear_kernels",
]

#: Families whose linear-attention / SSM layers verify can run packed: model_type -> transformers modeling module
#: (Qwen3-Next: Gated DeltaNet; Nemotron-H: Mamba-2, its ``linear_attention`` layer type).
LINEAR_FAMILIES = {
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "nemotron_h": "transformers.models.nemotron_h.modeling_nemotron_h",
}
#: Layer types that are Gated DeltaNet or Mamba-2 (``config.layer_types`` entries of :data:`LINEAR_FAMILIES`).
LINEAR_LAYER_TYPES = ("linear_attention",)
#: Faults of the linear layers -> what they model (``longpack.runtime.verify.FAULTS`` lists them too).
LINEAR_FAULTS = {
    "linear-state-leak": "the Gated DeltaNet / Mamba-2 layers get no cu_seqlens: the convolution window and "
    "the recurrent state run on from one sample into the next (transformers #46093, NeMo Automodel #2147)",
    "conv-state-leak": "only the causal conv1d ignores the boundaries (the delta rule restarts): the "
    "convolution reads the previous sample's last tokens (the THD causal-conv1d bug, Megatron-LM #3798)",
}


#: CP faults of the linear layers (they act in the CP check only).
LINEAR_CP_FAULTS = {
    "linear-cp-local": "under CP, every rank runs the Gated DeltaNet / Mamba-2 layers on its own zigzag shard "
    "as if it were the sequence (no gather, no head split: a stack without linear-attention CP support)",
}


def has_linear_layers(config: Any) -> bool:
    """Whether a (transformers) config has Gated DeltaNet layers."""
    types = getattr(config, "layer_types", None) or ()
    return any(t in LINEAR_LAYER_TYPES for t in types)


def _head_split() -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def _gather_dim1(x: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """All-gather ``x [T, h, ...]`` along dim 1 (heads or channels) with the token all-gather."""
    return gather(x.movedim(1, 0).contiguous()).movedim(0, 1)


def _run_sequences(
    plan: Any,
    tensors: Sequence[torch.Tensor],
    fn: Callable[..., torch.Tensor],
    *,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    split: Sequence[int] | None = None,
) -> torch.Tensor:
    """``fn`` (batched sequences ``[S, L, ...]`` -> ``[S, L, ...]``) on every sequence of ``plan``, each on its
    own from its first token: token-major ``tensors [T, ...]`` in, ``[T, ...]`` out (zeros outside every
    sequence). ``gather`` (CP): sequences are the gathered row's; ``split``: per tensor, the size of dim 1
    to split over the CP ranks (heads or channels), or 0."""
    if gather is None:
        return _local_sequences(plan, tensors, fn)
    rank, size = _head_split()
    local = tensors[0].size(0)
    full = [gather(t.contiguous()) for t in tensors]
    sizes = list(split or [0] * len(tensors))
    divisible = all(s == 0 or s % size == 0 for s in sizes) and any(sizes)
    if divisible:
        full = [
            t if s == 0 else t.narrow(1, rank * (s // size), s // size)
            for t, s in zip(full, sizes, strict=True)
        ]
    out = _gathered_sequences(plan, full, fn)
    if divisible:
        out = _gather_dim1(out, gather)
    return out.narrow(0, rank * local, local)


def _local_sequences(
    plan: Any, tensors: Sequence[torch.Tensor], fn: Callable[..., torch.Tensor]
) -> torch.Tensor:
    width = tensors[0].size(0)
    pieces: list[torch.Tensor] = []
    where: list[torch.Tensor] = []
    padded = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in tensors]
    for gather_index, picked, target in plan.buckets:
        count, longest = gather_index.shape
        out = fn(*(t[gather_index] for t in padded))  # [S, L, ...]
        pieces.append(out.reshape(count * longest, *out.shape[2:]).index_select(0, picked))
        where.append(target)
    for qi, _ki, _mask, q_off, _k_off in plan.blocks:
        order = qi[torch.argsort(q_off, stable=True)]
        out = fn(*(t.index_select(0, order).unsqueeze(0) for t in tensors))[0]
        pieces.append(out)
        where.append(order)
    return _scatter(width, pieces, where, tensors, fn)


def _gathered_sequences(
    plan: Any, tensors: Sequence[torch.Tensor], fn: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """Every sequence of the gathered row (the plan's blocks: ``ki``/``k_off`` index the gathered tokens)."""
    width = tensors[0].size(0)
    pieces: list[torch.Tensor] = []
    where: list[torch.Tensor] = []
    for _qi, ki, _mask, _q_off, k_off in plan.blocks:
        order = ki[torch.argsort(k_off, stable=True)]
        pieces.append(fn(*(t.index_select(0, order).unsqueeze(0) for t in tensors))[0])
        where.append(order)
    return _scatter(width, pieces, where, tensors, fn)


def _scatter(
    width: int,
    pieces: list[torch.Tensor],
    where: list[torch.Tensor],
    tensors: Sequence[torch.Tensor],
    fn: Callable[..., torch.Tensor],
) -> torch.Tensor:
    if not pieces:  # no real token: the output shape from one empty call
        probe = fn(*(t[:0].unsqueeze(0) for t in tensors))[0]
        return probe.new_zeros(width, *probe.shape[1:])
    result = pieces[0].new_zeros(width, *pieces[0].shape[1:])
    return result.index_copy(0, torch.cat(where), torch.cat(pieces))


def _wrap_conv(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def causal_conv1d_fn(
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: str | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        plan = kwargs.get("thd_conv_plan") or kwargs.get("thd_plan")
        if plan is None:
            return original(hidden_states, weight, bias, activation=activation, **kwargs)
        if hidden_states.size(0) != 1:
            raise RuntimeError("longpack's packed causal conv1d takes one THD row")
        channels = hidden_states.size(1)
        gather = None if kwargs.get("thd_linear_local") else kwargs.get("thd_gather")

        def run(x: torch.Tensor) -> torch.Tensor:  # [S, L, C]
            c = x.size(2)
            if c == channels:
                w, b = weight, bias
            else:  # this CP rank's share of the channels
                start = _head_split()[0] * c
                w = weight.narrow(0, start, c)
                b = None if bias is None else bias.narrow(0, start, c)
            return original(x.transpose(1, 2), w, b, activation=activation).transpose(1, 2)

        out = _run_sequences(plan, [hidden_states[0].transpose(0, 1)], run, gather=gather, split=[channels])
        return out.transpose(0, 1).unsqueeze(0)

    causal_conv1d_fn.__wrapped__ = original  # type: ignore[attr-defined]
    return causal_conv1d_fn


def _wrap_delta_rule(original: Callable[..., Any]) -> Callable[..., Any]:
    def chunk_gated_delta_rule(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        chunk_size: int = 64,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        plan = kwargs.get("thd_linear_plan") or kwargs.get("thd_plan")
        if plan is None:
            return original(  # type: ignore[no-any-return]
                query,
                key,
                value,
                g=g,
                beta=beta,
                chunk_size=chunk_size,
                initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                **kwargs,
            )
        if query.size(0) != 1 or initial_state is not None or output_final_state:
            raise RuntimeError("longpack's packed delta rule takes one THD row, no cache")

        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_: torch.Tensor, b_: torch.Tensor) -> Any:
            out, _ = original(
                q, k, v, g=g_, beta=b_, chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel
            )
            return out

        heads_k, heads_v = int(key.size(2)), int(value.size(2))
        out = _run_sequences(
            plan,
            [query[0], key[0], value[0], g[0], beta[0]],
            run,
            gather=None if kwargs.get("thd_linear_local") else kwargs.get("thd_gather"),
            split=[heads_k, heads_k, heads_v, heads_v, heads_v],
        )
        return out.unsqueeze(0), None

    chunk_gated_delta_rule.__wrapped__ = original  # type: ignore[attr-defined]
    return chunk_gated_delta_rule


def _wrap_ssd_scan(original: Callable[..., Any]) -> Callable[..., Any]:
    """Mamba-2's chunked SSD scan (``mamba2_chunk_scan``) per packed sequence: zero initial state at every
    sequence start, chunks from its first token (what ``mamba_chunk_scan_combined`` does with ``seq_idx``)."""

    def mamba2_chunk_scan(
        hidden_states: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        chunk_size: int,
        D: torch.Tensor | None = None,
        dt_bias: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        dt_softplus: bool = False,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        return_final_states: bool = False,
        **kwargs: Any,
    ) -> Any:
        plan = kwargs.get("thd_linear_plan") or kwargs.get("thd_plan")
        settings = {"D": D, "dt_bias": dt_bias, "dt_softplus": dt_softplus, "dt_limit": dt_limit}
        if plan is None:
            return original(
                hidden_states,
                dt,
                A,
                B,
                C,
                chunk_size,
                initial_states=initial_states,
                return_final_states=return_final_states,
                **settings,
                **kwargs,
            )
        if hidden_states.size(0) != 1 or initial_states is not None or return_final_states:
            raise RuntimeError("longpack's packed SSD scan takes one THD row, no cache")

        def run(x: torch.Tensor, dt_: torch.Tensor, b_: torch.Tensor, c_: torch.Tensor) -> torch.Tensor:
            return original(x, dt_, A, b_, c_, chunk_size, z=kwargs.get("z"), **settings)  # type: ignore[no-any-return]

        out = _run_sequences(
            plan,
            [hidden_states[0], dt[0], B[0], C[0]],
            run,
            gather=None if kwargs.get("thd_linear_local") else kwargs.get("thd_gather"),
            split=None,
        )
        return out.unsqueeze(0)

    mamba2_chunk_scan.__wrapped__ = original  # type: ignore[attr-defined]
    return mamba2_chunk_scan


#: Per family: the modeling module's functions longpack wraps, and how.
_WRAPPERS: dict[str, dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = {
    "qwen3_next": {"causal_conv1d_fn": _wrap_conv, "torch_chunk_gated_delta_rule": _wrap_delta_rule},
    "nemotron_h": {"causal_conv1d_fn": _wrap_conv, "mamba2_chunk_scan": _wrap_ssd_scan},
}
_REGISTERED: set[str] = set()


def register_linear_kernels(model_type: str) -> None:
    """Wrap ``model_type``'s causal conv1d and its chunked delta rule or SSD scan (once per process); see the
    module text."""
    if model_type in _REGISTERED or model_type not in LINEAR_FAMILIES:
        return
    module = importlib.import_module(LINEAR_FAMILIES[model_type])
    for name, wrap in _WRAPPERS[model_type].items():
        setattr(module, name, wrap(getattr(module, name)))
    _REGISTERED.add(model_type)
