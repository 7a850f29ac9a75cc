"""From a THD batch to Megatron-Core's ``PackedSeqParams``, and helpers around THD offsets.

:func:`packed_seq_params_kwargs` follows Megatron-Bridge's ``get_packed_seq_params`` (see
docs/reference/thd-batch.md#packed-seq-params) for both key schemes: current (``cu_seqlens_q`` …) and legacy
(``cu_seqlens`` with ``-1`` padding and ``cu_seqlens_argmin``). It needs only torch;
:func:`to_packed_seq_params` builds the real dataclass when the optional ``megatron-core`` extra is installed
(``pip install 'longpack[megatron]'``), passing only the fields the installed version has.

Example::

    >>> kw = packed_seq_params_kwargs({"cu_seqlens_q": torch.tensor([[0, 3, 5]]),
    ...                                "cu_seqlens_q_padded": torch.tensor([[0, 4, 8]]),
    ...                                "max_seqlen_q": torch.tensor([[4]])})
    >>> kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_kv_padded"].tolist(), kw["max_seqlen_q"], kw["qkv_format"]
    ([0, 3, 5], [0, 4, 8], 4, 'thd')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "logical_and_physical_offsets",
    "packed_seq_params_kwargs",
    "repack_thd",
    "sequence_index",
    "to_packed_seq_params",
    "unpack_thd",
]


def _squeeze(value: Any) -> Any:
    return value.squeeze() if isinstance(value, torch.Tensor) else value


def _scalar(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{name} must contain exactly one value, got shape {tuple(value.shape)}; packed THD batches "
                "expect micro-batch size 1"
            )
        return int(value.item())
    return int(value)


def _trim(cu: torch.Tensor, argmin: Any) -> torch.Tensor:
    cu = cu.reshape(-1) if cu.dim() > 1 else cu
    if argmin is not None:
        end = int(torch.as_tensor(argmin).reshape(-1)[0])
    else:
        end = int(torch.argmin(cu)) if bool((cu < 0).any()) else cu.numel()
    return cu[:end]


def sequence_index(cu_seqlens: Any, total_tokens: int) -> torch.Tensor:
    """Segment id per token ``[1, total_tokens]`` (int32), with one extra id for tokens past the last boundary.

    This is Megatron-Core's ``PackedSeqParams.seq_idx`` (docs/reference/thd-batch.md#packed-seq-params), used
    to reset Mamba/SSM state between packed sequences. ``-1`` entries (legacy padding) are ignored.

    >>> sequence_index(torch.tensor([0, 5, 7, 11, -1]), 16).tolist()
    [[0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]]
    """
    cu = torch.as_tensor(cu_seqlens).reshape(-1).to(torch.int64)
    cu = cu[cu >= 0]
    positions = torch.arange(total_tokens, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], positions, right=True)
    return seq.to(torch.int32).unsqueeze(0)


def packed_seq_params_kwargs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The ``PackedSeqParams`` fields for a THD micro-batch (MBS 1), as Megatron-Bridge builds them.

    Current keys: tensors squeezed (no trimming), ``cu_seqlens_kv`` defaults to ``cu_seqlens_q``, padded
    offsets passed through (or ``None``), ``max_seqlen_*`` as Python ints (more than one value is a
    ``ValueError``), ``total_tokens`` (and ``seq_idx``) when the batch has it. Legacy keys: ``cu_seqlens``
    trimmed at ``cu_seqlens_argmin`` (else at the first ``-1``); with ``cu_seqlens_unpadded`` the logical
    offsets go to ``cu_seqlens_q/kv`` and the physical ones to ``*_padded``; otherwise ``*_padded`` stay
    ``None`` (which keeps TE on its faster kernels).

    >>> kw = packed_seq_params_kwargs({"cu_seqlens": torch.tensor([[0, 128, 256, 384, -1, -1]]),
    ...                                "cu_seqlens_argmin": torch.tensor([[4]]), "max_seqlen": torch.tensor([[128]])})
    >>> kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_q_padded"], kw["max_seqlen_q"]
    ([0, 128, 256, 384], None, 128)
    """
    out: dict[str, Any] = {"qkv_format": "thd"}
    if batch.get("cu_seqlens_q") is not None:
        cu_q = _squeeze(batch["cu_seqlens_q"])
        cu_kv = _squeeze(batch.get("cu_seqlens_kv"))
        out["cu_seqlens_q"] = cu_q
        out["cu_seqlens_kv"] = cu_q if cu_kv is None else cu_kv
        padded_q = _squeeze(batch.get("cu_seqlens_q_padded"))
        padded_kv = _squeeze(batch.get("cu_seqlens_kv_padded"))
        out["cu_seqlens_q_padded"] = padded_q
        out["cu_seqlens_kv_padded"] = padded_q if padded_kv is None else padded_kv
        max_q = _scalar(batch.get("max_seqlen_q"), "max_seqlen_q")
        max_kv = _scalar(batch.get("max_seqlen_kv"), "max_seqlen_kv")
        out["max_seqlen_q"] = max_q
        out["max_seqlen_kv"] = max_q if max_kv is None else max_kv
    elif batch.get("cu_seqlens") is not None:
        padded = _trim(_squeeze(batch["cu_seqlens"]), batch.get("cu_seqlens_argmin"))
        max_seqlen = _scalar(batch.get("max_seqlen"), "max_seqlen")
        if batch.get("cu_seqlens_unpadded") is not None:
            unpadded = _trim(_squeeze(batch["cu_seqlens_unpadded"]), batch.get("cu_seqlens_unpadded_argmin"))
            out.update(
                cu_seqlens_q=unpadded,
                cu_seqlens_kv=unpadded,
                cu_seqlens_q_padded=padded,
                cu_seqlens_kv_padded=padded,
            )
        else:
            out.update(
                cu_seqlens_q=padded, cu_seqlens_kv=padded, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None
            )
        out["max_seqlen_q"] = max_seqlen
        out["max_seqlen_kv"] = max_seqlen
    else:
        raise ValueError(
            "the batch has no packed metadata: expected 'cu_seqlens_q' (current keys) or 'cu_seqlens' (legacy keys)"
        )
    total = _scalar(batch.get("total_tokens"), "total_tokens")
    if total is not None:
        out["total_tokens"] = total
        physical = (
            out["cu_seqlens_q_padded"] if out["cu_seqlens_q_padded"] is not None else out["cu_seqlens_q"]
        )
        out["seq_idx"] = sequence_index(physical, total)
    return out


def to_packed_seq_params(batch: Mapping[str, Any]) -> Any:
    """Megatron-Core ``PackedSeqParams`` for a THD micro-batch; needs ``pip install 'longpack[megatron]'``.

    Fields the installed Megatron-Core does not have (``total_tokens``/``seq_idx`` before 0.18) are
    dropped; ``seq_idx`` is left to Megatron-Core's own ``__post_init__`` when it has ``total_tokens``.
    """
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "to_packed_seq_params needs megatron-core: pip install 'longpack[megatron]' "
            "(megatron-core==0.16.1 installs on the CPU)"
        ) from exc
    kwargs = packed_seq_params_kwargs(batch)
    names = {field.name for field in dataclasses.fields(PackedSeqParams)}
    if "total_tokens" in names:
        kwargs.pop("seq_idx", None)
    return PackedSeqParams(**{key: value for key, value in kwargs.items() if key in names})


def logical_and_physical_offsets(params: Any) -> tuple[Any, Any]:
    """``(cu_seqlens_q, cu_seqlens_q_padded)`` of a ``PackedSeqParams``-like object; physical defaults to logical.

    >>> from types import SimpleNamespace
    >>> p = SimpleNamespace(cu_seqlens_q=torch.tensor([0, 6, 14]), cu_seqlens_q_padded=None)
    >>> q, padded = logical_and_physical_offsets(p); padded is q
    True
    """
    logical = params.cu_seqlens_q
    physical = getattr(params, "cu_seqlens_q_padded", None)
    return logical, (logical if physical is None else physical)


def unpack_thd(
    tokens: torch.Tensor, cu_seqlens: Any, cu_seqlens_padded: Any = None, *, pad_value: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a THD row ``[1, T]`` back into right-padded rows: ``(rows, valid_mask, starts, lengths)``.

    >>> rows, mask, starts, lengths = unpack_thd(torch.tensor([[10, 11, 0, 0, 20, 21, 22, 0]]),
    ...                                          [0, 2, 5], [0, 4, 8])
    >>> rows.tolist(), mask.tolist(), starts.tolist(), lengths.tolist()
    ([[10, 11, 0], [20, 21, 22]], [[True, True, False], [True, True, True]], [0, 4], [2, 3])
    """
    flat = tokens.reshape(-1)
    cu = torch.as_tensor(cu_seqlens).reshape(-1).to(torch.int64)
    padded = (
        cu if cu_seqlens_padded is None else torch.as_tensor(cu_seqlens_padded).reshape(-1).to(torch.int64)
    )
    lengths = cu.diff()
    starts = padded[:-1]
    width = int(lengths.max()) if lengths.numel() else 0
    rows = torch.full((lengths.numel(), width), pad_value, dtype=flat.dtype, device=flat.device)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    for i, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        rows[i, :length] = flat[start : start + length]
    return rows, mask, starts, lengths


def repack_thd(
    rows: torch.Tensor, cu_seqlens: Any, cu_seqlens_padded: Any = None, *, total_tokens: int | None = None
) -> torch.Tensor:
    """Inverse of :func:`unpack_thd`: place right-padded rows at their physical offsets, zeros in the gaps.

    >>> repack_thd(torch.tensor([[0, 1, 0], [0, 1, 2]]), [0, 2, 5], [0, 4, 8]).tolist()
    [[0, 1, 0, 0, 0, 1, 2, 0]]
    """
    cu = torch.as_tensor(cu_seqlens).reshape(-1).to(torch.int64)
    padded = (
        cu if cu_seqlens_padded is None else torch.as_tensor(cu_seqlens_padded).reshape(-1).to(torch.int64)
    )
    total = int(padded[-1]) if total_tokens is None else total_tokens
    out = torch.zeros((1, total), dtype=rows.dtype, device=rows.device)
    for i, (start, length) in enumerate(zip(padded[:-1].tolist(), cu.diff().tolist(), strict=True)):
        out[0, start : start + length] = rows[i, :length]
    return out
