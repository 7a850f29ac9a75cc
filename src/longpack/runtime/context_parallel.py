"""Context-parallel (CP) token partitioning: zigzag for BSHD, per-sequence zigzag for THD.

Causal attention makes late tokens more expensive, so Megatron-Core / TransformerEngine cut every sequence
into ``2*CP`` equal chunks and give CP rank ``r`` chunks ``r`` and ``2*CP-1-r`` ("DualChunkSwap";
docs/reference/thd-batch.md#cp-split). For packed THD rows the same cut is applied to **each physical
segment** independently (TE's ``thd_get_partitioned_indices``), which is why every padded sequence length must
be a multiple of ``2*CP``. Metadata (``cu_seqlens*``, ``max_seqlen*``) is replicated on every rank, not
sliced.

Example (two packed sequences of 8 tokens, CP=2)::

    >>> thd_partition_indices([0, 8, 16], 16, cp_size=2, cp_rank=0).tolist()
    [0, 1, 6, 7, 8, 9, 14, 15]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from longpack.errors import BatchError
from longpack.topology import zigzag_source_indices

__all__ = [
    "CONTEXT_PARALLEL_SKIP_KEYS",
    "ContextParallelError",
    "check_thd_alignment",
    "physical_cu_seqlens",
    "shard_batch",
    "thd_local_positions",
    "thd_partition_indices",
    "zigzag_indices",
]

#: Batch keys never sliced by the CP split (as Megatron-Bridge's ``gpt_step``; docs/reference/thd-batch.md).
CONTEXT_PARALLEL_SKIP_KEYS = frozenset(
    {
        "cu_seqlens_q",
        "cu_seqlens_kv",
        "cu_seqlens_q_padded",
        "cu_seqlens_kv_padded",
        "cu_seqlens",
        "cu_seqlens_unpadded",
        "cu_seqlens_argmin",
        "cu_seqlens_unpadded_argmin",
        "max_seqlen_q",
        "max_seqlen_kv",
        "max_seqlen",
        "token_count",
        "total_tokens",
        "attention_mask",
    }
)


class ContextParallelError(BatchError):
    """A batch or a sequence that cannot be split over the requested CP group."""


def _check_cp(cp_size: int, cp_rank: int) -> None:
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise ContextParallelError(f"cp_size must be a positive integer, got {cp_size!r}")
    if isinstance(cp_rank, bool) or not isinstance(cp_rank, int) or not 0 <= cp_rank < cp_size:
        raise ContextParallelError(f"cp_rank must satisfy 0 <= cp_rank < cp_size={cp_size}, got {cp_rank!r}")


def zigzag_indices(seq_len: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Token indices CP rank ``cp_rank`` keeps of one BSHD sequence (Megatron-Core ``get_batch_on_this_cp_rank``).

    The sequence is cut into ``2*cp_size`` chunks of ``seq_len / (2*cp_size)`` tokens; the rank keeps chunks
    ``cp_rank`` and ``2*cp_size-1-cp_rank``, in that order.

    >>> zigzag_indices(16, 2, 0).tolist()
    [0, 1, 2, 3, 12, 13, 14, 15]
    >>> zigzag_indices(16, 2, 1).tolist()
    [4, 5, 6, 7, 8, 9, 10, 11]
    """
    _check_cp(cp_size, cp_rank)
    if seq_len < 0 or seq_len % (2 * cp_size) != 0:
        raise ContextParallelError(
            f"sequence length {seq_len} is not divisible by 2*cp_size={2 * cp_size}; pad the sequence to a "
            f"multiple of {2 * cp_size} (Megatron asserts seq_length % (2*CP) == 0 when CP > 1)"
        )
    if cp_size == 1:
        return torch.arange(seq_len, dtype=torch.int64)
    chunk = seq_len // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk, dtype=torch.int64)
    second_chunk = 2 * cp_size - 1 - cp_rank
    second = torch.arange(second_chunk * chunk, (second_chunk + 1) * chunk, dtype=torch.int64)
    return torch.cat([first, second])


def _as_int_array(values: Sequence[int] | np.ndarray | torch.Tensor, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise ContextParallelError(
            f"{name} must be 1-D (or [1, K]); got shape {tuple(array.shape)}. Packed THD batches expect "
            "micro-batch size 1 for context-parallel slicing (THD layout)"
        )
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ContextParallelError(f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def thd_partition_indices(
    cu_seqlens_padded: Sequence[int] | np.ndarray | torch.Tensor,
    total_tokens: int,
    *,
    cp_size: int,
    cp_rank: int,
) -> torch.Tensor:
    """Token indices CP rank ``cp_rank`` keeps of a packed THD row (TE ``thd_get_partitioned_indices``).

    ``cu_seqlens_padded`` are the **physical** offsets. Each segment ``[s, e)`` is zigzag-split on its own
    (chunks ``cp_rank`` and ``2*cp_size-1-cp_rank`` of ``2*cp_size``), and the results are concatenated in
    segment order; the rank's local stream is ``total_tokens / cp_size`` long with local offsets
    ``cu_seqlens_padded / cp_size``. Unlike TE's kernel, tokens after the last boundary are an error
    rather than silently duplicated indices (docs/reference/thd-batch.md#cp-split).

    >>> thd_partition_indices([0, 8, 12], 12, cp_size=2, cp_rank=0).tolist()
    [0, 1, 6, 7, 8, 11]
    >>> thd_partition_indices([0, 8, 12], 12, cp_size=2, cp_rank=1).tolist()
    [2, 3, 4, 5, 9, 10]
    >>> thd_partition_indices([0, 6, 12], 12, cp_size=2, cp_rank=0)
    Traceback (most recent call last):
    ...
    longpack.runtime.context_parallel.ContextParallelError: sequence 0 has padded length 6, not a multiple of 2*cp_size=4; ...
    """
    _check_cp(cp_size, cp_rank)
    cu = _as_int_array(cu_seqlens_padded, "cu_seqlens_padded")
    if cu.size < 2 or cu[0] != 0:
        raise ContextParallelError(
            f"cu_seqlens_padded must start with 0 and hold at least 2 entries, got {cu.tolist()}"
        )
    lengths = np.diff(cu)
    if (lengths < 0).any():
        bad = int(np.argmax(lengths < 0))
        raise ContextParallelError(f"cu_seqlens_padded decreases at sequence {bad}: {cu.tolist()}")
    if int(cu[-1]) != int(total_tokens):
        raise ContextParallelError(
            f"cu_seqlens_padded[-1]={int(cu[-1])} != total_tokens={total_tokens}: tokens after the last "
            "boundary would be assigned to no sequence (TE duplicates indices here); make the last padded "
            "boundary equal the row width, e.g. extend the last segment or append the width as a boundary"
        )
    multiple = 2 * cp_size
    if cp_size > 1:
        bad_mask = lengths % multiple != 0
        if bad_mask.any():
            bad = int(np.argmax(bad_mask))
            raise ContextParallelError(
                f"sequence {bad} has padded length {int(lengths[bad])}, not a multiple of 2*cp_size={multiple}; "
                f"pack with pad_seq_to_mult a multiple of {multiple} (e.g. longpack.topology.pad_seq_to_mult)"
            )
    return torch.from_numpy(zigzag_source_indices(cu, cp_size, cp_rank))


def thd_local_positions(
    cu_seqlens_padded: Sequence[int] | np.ndarray | torch.Tensor, *, cp_size: int, cp_rank: int
) -> torch.Tensor:
    """Positions within their sequence of the tokens a CP rank holds, recomputed from the local stream.

    This is Megatron-Core's fused THD RoPE rule (docs/reference/thd-batch.md#cp-positions): local segment
    length ``L/cp``, half ``h = L/(2cp)``, a token at local offset ``p`` has global position ``r*h + p`` if
    ``p < h`` else ``L - (r+1)*h + (p - h)``. It equals the index-selected ``arange`` positions of each
    segment.

    >>> thd_local_positions([0, 8, 12], cp_size=2, cp_rank=0).tolist()
    [0, 1, 6, 7, 0, 3]
    """
    _check_cp(cp_size, cp_rank)
    cu = _as_int_array(cu_seqlens_padded, "cu_seqlens_padded")
    lengths = np.diff(cu)
    if cp_size > 1 and (lengths % (2 * cp_size) != 0).any():
        bad = int(np.argmax(lengths % (2 * cp_size) != 0))
        raise ContextParallelError(
            f"sequence {bad} has padded length {int(lengths[bad])}, not a multiple of 2*cp_size={2 * cp_size}"
        )
    local = lengths // cp_size
    seg = np.repeat(np.arange(lengths.size), local)
    local_starts = np.concatenate([[0], np.cumsum(local)])[:-1]
    p = np.arange(int(local.sum()), dtype=np.int64) - local_starts[seg]
    half = local[seg] // 2
    if cp_size == 1:
        return torch.from_numpy(p)
    positions = np.where(p < half, cp_rank * half + p, lengths[seg] - (cp_rank + 1) * half + (p - half))
    return torch.from_numpy(positions.astype(np.int64))


def check_thd_alignment(
    cu_seqlens_padded: Sequence[int] | np.ndarray | torch.Tensor,
    total_tokens: int,
    *,
    cp_size: int = 1,
    tp_size: int = 1,
    sequence_parallel: bool = False,
) -> int:
    """Check that a packed row splits over CP (and then over TP under SP); return the multiple required.

    Every physical segment must be a multiple of ``M = lcm(2*CP if CP > 1, CP*TP if SP and TP > 1)``
    (docs/reference/packed-format.md#alignment; :func:`longpack.topology.pad_seq_to_mult`), and the last
    padded boundary must equal ``total_tokens``. Then each CP rank holds ``T/CP`` tokens, divisible by TP for
    the SP scatter.

    >>> check_thd_alignment([0, 8, 24], 24, cp_size=2, tp_size=2, sequence_parallel=True)
    4
    >>> check_thd_alignment([0, 4, 12], 12, cp_size=2, tp_size=4, sequence_parallel=True)
    Traceback (most recent call last):
    ...
    longpack.runtime.context_parallel.ContextParallelError: sequence 0 has padded length 4, not a multiple of 8 = lcm(2*CP, CP*TP) for cp=2, tp=4, sp=True; pack with pad_seq_to_mult=8
    """
    from longpack.topology import pad_seq_to_mult

    multiple = pad_seq_to_mult(tp=tp_size, cp=cp_size, sp=sequence_parallel)
    cu = _as_int_array(cu_seqlens_padded, "cu_seqlens_padded")
    if cu.size < 2 or cu[0] != 0 or int(cu[-1]) != int(total_tokens):
        raise ContextParallelError(
            f"cu_seqlens_padded {cu.tolist()} must start at 0 and end at the row width {total_tokens}"
        )
    lengths = np.diff(cu)
    bad_mask = (lengths < 0) | (lengths % multiple != 0)
    if bad_mask.any():
        bad = int(np.argmax(bad_mask))
        raise ContextParallelError(
            f"sequence {bad} has padded length {int(lengths[bad])}, not a multiple of {multiple} = "
            f"lcm(2*CP, CP*TP) for cp={cp_size}, tp={tp_size}, sp={sequence_parallel}; "
            f"pack with pad_seq_to_mult={multiple}"
        )
    return multiple


def _one_row(offsets: Any) -> torch.Tensor:
    """Offsets of a THD micro-batch as 1-D: ``[K]`` as is, ``[1, K]`` squeezed; more rows are an error."""
    cu = torch.as_tensor(offsets)
    if cu.dim() == 2:
        if cu.size(0) != 1:
            raise ContextParallelError(
                f"Packed THD batches expect micro-batch size 1 for context-parallel slicing (THD layout); "
                f"the boundary tensor has shape {tuple(cu.shape)}"
            )
        cu = cu[0]
    return cu


def physical_cu_seqlens(batch: Mapping[str, Any]) -> torch.Tensor | None:
    """The physical (padded) offsets that decide a THD batch's CP split, as a 1-D int64 tensor.

    Current keys: ``cu_seqlens_q_padded`` if present, else ``cu_seqlens_q``. Legacy keys: ``cu_seqlens``
    trimmed at ``cu_seqlens_argmin`` (or at the first negative value). ``None`` for an unpacked batch.

    >>> physical_cu_seqlens({"cu_seqlens_q": torch.tensor([[0, 3, 5]]),
    ...                      "cu_seqlens_q_padded": torch.tensor([[0, 4, 8]])}).tolist()
    [0, 4, 8]
    >>> physical_cu_seqlens({"cu_seqlens": torch.tensor([[0, 4, 6, 8, -1, -1]])}).tolist()
    [0, 4, 6, 8]
    """
    if batch.get("cu_seqlens_q") is not None:
        cu = batch.get("cu_seqlens_q_padded")
        return _one_row(batch["cu_seqlens_q"] if cu is None else cu).to(torch.int64)
    if batch.get("cu_seqlens") is not None:
        cu = _one_row(batch["cu_seqlens"])
        argmin = batch.get("cu_seqlens_argmin")
        if argmin is not None:
            end = int(torch.as_tensor(argmin).reshape(-1)[0])
        else:
            negative = (cu < 0).nonzero()
            end = int(negative[0, 0]) if negative.numel() else cu.numel()
        return cu[:end].to(torch.int64)
    return None


def shard_batch(batch: Mapping[str, Any], cp_size: int, cp_rank: int) -> dict[str, Any]:
    """The part of a micro-batch that CP rank ``cp_rank`` of ``cp_size`` holds.

    THD batches (``cu_seqlens_q`` or legacy ``cu_seqlens`` present): every per-token tensor (dim 1) is
    index-selected with :func:`thd_partition_indices` over the physical offsets; the metadata keys
    (``cu_seqlens*``, ``max_seqlen*``, ``token_count``, ``total_tokens``, ``attention_mask``) stay whole, as
    in Megatron-Bridge's ``gpt_step`` (docs/reference/thd-batch.md#cp-split). Unpacked batches get the BSHD
    zigzag on dim 1 (dim 2 of an ``attention_mask`` ``[b,1,S,S]``, whose key axis stays full). ``None``
    values stay ``None``; the input is not modified.

    >>> batch = {"tokens": torch.arange(8).view(1, 8), "cu_seqlens_q": torch.tensor([[0, 3, 8]]),
    ...          "cu_seqlens_q_padded": torch.tensor([[0, 4, 8]]), "max_seqlen_q": torch.tensor([[4]])}
    >>> out = shard_batch(batch, 2, 1)
    >>> out["tokens"].tolist(), out["cu_seqlens_q_padded"].tolist()
    ([[1, 2, 5, 6]], [[0, 4, 8]])
    """
    _check_cp(cp_size, cp_rank)
    out = dict(batch)
    if cp_size == 1:
        return out
    cu = physical_cu_seqlens(batch)
    width = _token_width(batch)
    if cu is not None:
        index = thd_partition_indices(cu, width, cp_size=cp_size, cp_rank=cp_rank)
        for key, value in batch.items():
            if key in CONTEXT_PARALLEL_SKIP_KEYS or not isinstance(value, torch.Tensor):
                continue
            out[key] = _select_tokens(key, value, index, width, dim=1)
        return out
    index = zigzag_indices(width, cp_size, cp_rank)
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or key in {"token_count", "total_tokens"}:
            continue
        dim = 2 if key == "attention_mask" else 1
        out[key] = _select_tokens(key, value, index, width, dim=dim)
    return out


def _token_width(batch: Mapping[str, Any]) -> int:
    for key in ("tokens", "input_ids", "labels"):
        value = batch.get(key)
        if isinstance(value, torch.Tensor):
            if value.dim() < 2:
                raise ContextParallelError(
                    f"batch[{key!r}] must be [batch, tokens], got shape {tuple(value.shape)}"
                )
            return int(value.size(1))
    raise ContextParallelError("batch has no 'tokens', 'input_ids' or 'labels' tensor to take the width from")


def _select_tokens(
    key: str, value: torch.Tensor, index: torch.Tensor, width: int, *, dim: int
) -> torch.Tensor:
    if value.dim() <= dim or value.size(dim) != width:
        raise ContextParallelError(
            f"batch[{key!r}] has shape {tuple(value.shape)}; expected {width} tokens on dim {dim} to split it "
            "over CP (put non-token values under a metadata key or outside the batch)"
        )
    return value.index_select(dim, index.to(value.device))
