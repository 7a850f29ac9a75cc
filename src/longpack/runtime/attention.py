"""Reference attention for packed THD rows, and context-parallel attention over ``torch.distributed``.

- :func:`varlen_attention` is the single-process reference: one ``scaled_dot_product_attention`` call per
  packed sequence, on the real tokens only (``cu_seqlens``), placed at the physical offsets
  (``cu_seqlens_padded``). Gap and tail tokens get zeros. On a GPU with ``flash_attn`` installed and no gaps
  it uses ``flash_attn_varlen_func`` instead.
- :func:`ring_attention` and :func:`allgather_attention` compute the same thing when every CP rank holds only
  its zigzag shard (:func:`longpack.runtime.context_parallel.thd_partition_indices`). Each token carries its
  ``(sequence id, offset in sequence, real?)`` label (:func:`token_layout`), so masking is by sequence identity
  and causal offset, never by position in the local stream: a token can only see earlier real tokens of its
  own sequence, wherever the shards put them. Ring attention passes K/V blocks around the ring and merges
  partial results by log-sum-exp (as TE's ``p2p`` CP does); all-gather attention gathers K/V first
  (TE's ``all_gather`` CP).

Example (two sequences of 2 and 1 tokens; the third token only sees itself)::

    >>> q = k = torch.zeros(3, 1, 1); v = torch.tensor([1.0, 3.0, 5.0]).view(3, 1, 1)
    >>> varlen_attention(q, k, v, torch.tensor([0, 2, 3])).flatten().tolist()
    [1.0, 2.0, 5.0]
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from longpack.runtime.context_parallel import thd_partition_indices

__all__ = [
    "TokenLayout",
    "allgather_attention",
    "block_attention",
    "merge_partial_attention",
    "ring_attention",
    "shard_layout",
    "token_layout",
    "varlen_attention",
]


def _offsets(values: Any, name: str) -> list[int]:
    tensor = torch.as_tensor(values)
    if tensor.dim() == 2 and tensor.size(0) == 1:
        tensor = tensor[0]
    if tensor.dim() != 1 or tensor.numel() < 2 or int(tensor[0]) != 0:
        raise ValueError(f"{name} must be 1-D offsets starting at 0, got {tensor.tolist()}")
    out = [int(x) for x in tensor.tolist()]
    if any(b < a for a, b in itertools.pairwise(out)):
        raise ValueError(f"{name} must be non-decreasing, got {out}")
    return out


def _flash_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int], causal: bool, scale: float
):
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    if q.dtype not in (torch.float16, torch.bfloat16):
        return None
    cu_t = torch.tensor(cu, dtype=torch.int32, device=q.device)
    max_len = max(b - a for a, b in itertools.pairwise(cu))
    return flash_attn_varlen_func(q, k, v, cu_t, cu_t, max_len, max_len, softmax_scale=scale, causal=causal)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: Any,
    *,
    cu_seqlens_padded: Any = None,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention over a packed THD row ``[T, heads, dim]``, each sequence on its own.

    What the offsets mean: docs/reference/thd-batch.md#attention.

    Sequence ``i`` has ``cu_seqlens[i+1] - cu_seqlens[i]`` real tokens starting at physical offset
    ``cu_seqlens_padded[i]`` (default: ``cu_seqlens``); the rest of its physical segment, and anything past
    the last boundary, is a gap and gets zeros. Zero-length sequences are allowed.

    >>> q = k = torch.zeros(4, 1, 1); v = torch.tensor([2.0, 4.0, 9.0, 9.0]).view(4, 1, 1)
    >>> varlen_attention(q, k, v, [0, 2, 3], cu_seqlens_padded=[0, 2, 4]).flatten().tolist()
    [2.0, 3.0, 9.0, 0.0]
    """
    if q.dim() != 3 or k.shape != q.shape[:2] + k.shape[2:] or v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"q, k, v must be [T, heads, dim] with equal T and heads; got {q.shape}, {k.shape}, {v.shape}"
        )
    cu = _offsets(cu_seqlens, "cu_seqlens")
    padded = cu if cu_seqlens_padded is None else _offsets(cu_seqlens_padded, "cu_seqlens_padded")
    if len(padded) != len(cu):
        raise ValueError(f"cu_seqlens {cu} and cu_seqlens_padded {padded} must have the same length")
    if padded[-1] > q.size(0):
        raise ValueError(f"the last physical boundary {padded[-1]} exceeds the row length {q.size(0)}")
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    if q.is_cuda and cu_seqlens_padded is None and cu[-1] == q.size(0):
        fused = _flash_varlen(q, k, v, cu, causal, scale)
        if fused is not None:
            return fused
    out = torch.zeros(q.shape[:2] + v.shape[2:], dtype=v.dtype, device=v.device)
    for i in range(len(cu) - 1):
        length = cu[i + 1] - cu[i]
        if length <= 0:
            continue
        start = padded[i]
        if padded[i + 1] - start < length:
            raise ValueError(
                f"sequence {i}: {length} real tokens do not fit its physical segment {padded[i : i + 2]}"
            )
        sl = slice(start, start + length)
        # SDPA wants [heads, L, dim].
        res = F.scaled_dot_product_attention(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), is_causal=causal, scale=scale
        )
        out[sl] = res.transpose(0, 1)
    return out


@dataclass(frozen=True)
class TokenLayout:
    """Per-token labels of a THD stream: sequence id (``-1`` past the last boundary), offset in sequence, real?"""

    seq_id: torch.Tensor
    offset: torch.Tensor
    real: torch.Tensor

    def select(self, index: torch.Tensor) -> TokenLayout:
        """The labels of the tokens at ``index`` (e.g. one CP rank's shard)."""
        return TokenLayout(self.seq_id[index], self.offset[index], self.real[index])


def token_layout(cu_seqlens: Any, total_tokens: int, *, cu_seqlens_padded: Any = None) -> TokenLayout:
    """Label every token of a THD row of ``total_tokens`` with its sequence, offset and real/gap status.

    >>> lay = token_layout([0, 3, 5], 8, cu_seqlens_padded=[0, 4, 8])
    >>> lay.seq_id.tolist(), lay.offset.tolist(), lay.real.int().tolist()
    ([0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 3, 0, 1, 2, 3], [1, 1, 1, 0, 1, 1, 0, 0])
    """
    cu = np.asarray(_offsets(cu_seqlens, "cu_seqlens"), dtype=np.int64)
    padded = cu if cu_seqlens_padded is None else np.asarray(_offsets(cu_seqlens_padded, "cu_seqlens_padded"))
    t = np.arange(total_tokens, dtype=np.int64)
    seq = np.searchsorted(padded, t, side="right") - 1
    inside = t < padded[-1]
    seq = np.where(inside, np.clip(seq, 0, len(padded) - 2), -1)
    offset = np.where(inside, t - padded[np.clip(seq, 0, None)], 0)
    lengths = np.diff(cu)
    real = inside & (offset < lengths[np.clip(seq, 0, None)])
    return TokenLayout(torch.from_numpy(seq), torch.from_numpy(offset), torch.from_numpy(real))


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_layout: TokenLayout,
    k_layout: TokenLayout,
    *,
    causal: bool = True,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries against one K/V block, with log-sum-exp: ``(out [Tq,H,D], lse [Tq,H])``.

    Query ``a`` may see key ``b`` iff both are real tokens of the same sequence and (if causal)
    ``offset[b] <= offset[a]``. Queries that see nothing in this block get ``out = 0`` and ``lse = -inf``.

    >>> lay = token_layout([0, 2], 2)
    >>> out, lse = block_attention(torch.zeros(2, 1, 1), torch.zeros(2, 1, 1),
    ...                            torch.tensor([1.0, 3.0]).view(2, 1, 1), lay, lay)
    >>> out.flatten().tolist(), [round(x, 4) for x in lse.flatten().tolist()]
    ([1.0, 2.0], [0.0, 0.6931])
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    allowed = (
        (q_layout.seq_id[:, None] == k_layout.seq_id[None, :])
        & q_layout.real[:, None]
        & k_layout.real[None, :]
    )
    if causal:
        allowed &= k_layout.offset[None, :] <= q_layout.offset[:, None]
    allowed = allowed.to(scores.device)
    scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [H, Tq]
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe.unsqueeze(-1))
    out = torch.einsum("hqk,khd->qhd", probs, v)
    return out, lse.transpose(0, 1).contiguous()


def merge_partial_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attention results over disjoint key sets by their log-sum-exp weights.

    >>> o, l = merge_partial_attention(torch.ones(1, 1, 1), torch.zeros(1, 1), 3 * torch.ones(1, 1, 1),
    ...                                torch.zeros(1, 1))
    >>> o.item(), round(l.item(), 4)
    (2.0, 0.6931)
    """
    lse = torch.logaddexp(lse_a, lse_b)
    finite = ~torch.isinf(lse)
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    w_a = torch.where(finite, torch.exp(lse_a - safe), torch.zeros_like(lse))
    w_b = torch.where(finite, torch.exp(lse_b - safe), torch.zeros_like(lse))
    return out_a * w_a.unsqueeze(-1) + out_b * w_b.unsqueeze(-1), lse


def _group_ranks(group: Any) -> tuple[int, int, list[int]]:
    import torch.distributed as dist

    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))
    return size, rank, ranks


def _stack_layout(layout: TokenLayout) -> torch.Tensor:
    return torch.stack([layout.seq_id, layout.offset, layout.real.to(torch.int64)])


def _unstack_layout(packed: torch.Tensor) -> TokenLayout:
    return TokenLayout(packed[0], packed[1], packed[2].bool())


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: TokenLayout,
    *,
    causal: bool = True,
    scale: float | None = None,
    group: Any = None,
) -> torch.Tensor:
    """Context-parallel attention: K/V blocks travel around the CP ring, results merge by log-sum-exp.

    Every rank of ``group`` calls this with its own shard ``q, k, v [T/cp, H, D]`` and the shard's
    :class:`TokenLayout`; each returns the attention output of its own queries, equal to the matching rows of
    :func:`varlen_attention` on the whole row. Runs on gloo (CPU) or NCCL (GPU).
    """
    import torch.distributed as dist

    size, rank, ranks = _group_ranks(group)
    out, lse = block_attention(q, k, v, layout, layout, causal=causal, scale=scale)
    if size == 1:
        return out
    send_to = ranks[(rank + 1) % size]
    recv_from = ranks[(rank - 1) % size]
    block_k, block_v, block_meta = k.contiguous(), v.contiguous(), _stack_layout(layout)
    for _ in range(size - 1):
        next_k, next_v, next_meta = (
            torch.empty_like(block_k),
            torch.empty_like(block_v),
            torch.empty_like(block_meta),
        )
        requests = [
            dist.isend(block_k, send_to, group=group),
            dist.isend(block_v, send_to, group=group),
            dist.isend(block_meta, send_to, group=group),
            dist.irecv(next_k, recv_from, group=group),
            dist.irecv(next_v, recv_from, group=group),
            dist.irecv(next_meta, recv_from, group=group),
        ]
        for request in requests:
            if request is not None:
                request.wait()
        block_k, block_v, block_meta = next_k, next_v, next_meta
        part, part_lse = block_attention(
            q, block_k, block_v, layout, _unstack_layout(block_meta), causal=causal, scale=scale
        )
        out, lse = merge_partial_attention(out, lse, part, part_lse)
    return out


def allgather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: TokenLayout,
    *,
    causal: bool = True,
    scale: float | None = None,
    group: Any = None,
) -> torch.Tensor:
    """Context-parallel attention that all-gathers every rank's K/V shard, then attends locally.

    Same contract as :func:`ring_attention` (every shard must have the same length, which the zigzag split
    guarantees: ``T/cp`` tokens per rank).
    """
    import torch.distributed as dist

    size, _, _ = _group_ranks(group)
    if size == 1:
        return block_attention(q, k, v, layout, layout, causal=causal, scale=scale)[0]
    ks = [torch.empty_like(k) for _ in range(size)]
    vs = [torch.empty_like(v) for _ in range(size)]
    meta = _stack_layout(layout)
    metas = [torch.empty_like(meta) for _ in range(size)]
    dist.all_gather(ks, k.contiguous(), group=group)
    dist.all_gather(vs, v.contiguous(), group=group)
    dist.all_gather(metas, meta, group=group)
    full_layout = _unstack_layout(torch.cat(metas, dim=1))
    return block_attention(q, torch.cat(ks), torch.cat(vs), layout, full_layout, causal=causal, scale=scale)[
        0
    ]


def shard_layout(
    cu_seqlens: Any, total_tokens: int, *, cu_seqlens_padded: Any = None, cp_size: int, cp_rank: int
) -> tuple[torch.Tensor, TokenLayout]:
    """A CP rank's token indices and the :class:`TokenLayout` of those tokens.

    >>> index, lay = shard_layout([0, 3, 5], 8, cu_seqlens_padded=[0, 4, 8], cp_size=2, cp_rank=1)
    >>> index.tolist(), lay.seq_id.tolist(), lay.offset.tolist(), lay.real.int().tolist()
    ([1, 2, 5, 6], [0, 0, 1, 1], [1, 2, 1, 2], [1, 1, 1, 0])
    """
    physical = cu_seqlens if cu_seqlens_padded is None else cu_seqlens_padded
    index = thd_partition_indices(physical, total_tokens, cp_size=cp_size, cp_rank=cp_rank)
    full = token_layout(cu_seqlens, total_tokens, cu_seqlens_padded=cu_seqlens_padded)
    return index, full.select(index)
