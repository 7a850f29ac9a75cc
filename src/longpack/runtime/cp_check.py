"""End-to-end proof that context-parallel THD batches attend exactly like the unsharded batch.

:func:`run_cp_check` starts ``cp_size`` real processes (``torch.multiprocessing`` spawn, ``torch.distributed``
gloo on the CPU). Every rank builds the same packed batches three ways (offline rows through
:func:`~longpack.runtime.collate.collate_packed` at a fixed width, in-batch packing of very different
lengths, and in-batch packing to a fixed width), takes its shard with
:func:`~longpack.runtime.context_parallel.shard_batch`, computes Q/K/V from its own tokens and position ids,
and runs :func:`~longpack.runtime.attention.ring_attention` and
:func:`~longpack.runtime.attention.allgather_attention`. It reports, per case and dtype:

- the largest difference between the CP result and unsharded :func:`~longpack.runtime.attention.varlen_attention`
  (on the rank's rows, and after reassembling all ranks' outputs in global order);
- the difference between the masked per-token loss summed over CP ranks and the unsharded loss;
- whether perturbing one sequence changed nothing outside it (no cross-sequence attention).

Used by the test-suite and by ``longpack cp-check``.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longpack.errors import ConfigError, OutputError
from longpack.outputs import WRITE_ERRNOS, atomic_write_bytes
from longpack.topology import align_up

__all__ = ["CPCheckCase", "run_cp_check"]

EOS = 2
VOCAB = 48
HEADS = 2
HEAD_DIM = 8
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}


@dataclass(frozen=True, kw_only=True)
class CPCheckCase:
    """One case's figures, from all ranks (max over ranks)."""

    case: str
    cp_size: int
    dtype: str
    tokens: int
    sequences: int
    ring_max_abs_diff: float
    allgather_max_abs_diff: float
    reassembled_max_abs_diff: float
    loss_abs_diff: float
    loss: float
    isolation_max_change_outside: float
    isolation_min_change_inside: float
    tolerance: float

    @property
    def ok(self) -> bool:
        """Within tolerance, no leak across sequences, and the perturbation did change its own sequence."""
        return (
            max(self.ring_max_abs_diff, self.allgather_max_abs_diff, self.reassembled_max_abs_diff)
            <= self.tolerance
            and self.loss_abs_diff <= self.tolerance * max(1.0, abs(self.loss))
            and self.isolation_max_change_outside == 0.0
            and self.isolation_min_change_inside > 0.0
        )


def _offline_rows(
    rng: np.random.Generator, runtime_lengths: list[int], multiple: int
) -> list[dict[str, Any]]:
    """Offline-packed rows: each sample's content, EOS, then EOS alignment pads (runtime length % m == 0)."""
    ids: list[int] = []
    mask: list[int] = []
    starts: list[int] = []
    for length in runtime_lengths:
        starts.append(len(ids))
        aligned = align_up(length, multiple)
        content = rng.integers(EOS + 1, VOCAB, size=length).tolist()
        stored = [*content, EOS] + [EOS] * (aligned - length)
        ids += stored
        # Label-aligned mask: supervise every content label except the first (a "prompt" token).
        mask += [0] + [1] * (length - 1) + [1] + [0] * (aligned - length)
    return [{"input_ids": ids, "loss_mask": mask, "seq_start_id": starts}]


def _in_batch_rows(rng: np.random.Generator, lengths: list[int]) -> list[dict[str, torch.Tensor]]:
    rows = []
    for length in lengths:
        ids = torch.from_numpy(rng.integers(EOS + 1, VOCAB, size=length))
        labels = torch.cat([ids[1:], torch.tensor([-100])])
        loss = (labels != -100).long()
        rows.append(
            {"input_ids": ids, "position_ids": torch.arange(length), "labels": labels, "loss_mask": loss}
        )
    return rows


def build_cases(cp_size: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """The packed batches every rank builds identically (same seed)."""
    from longpack.runtime.collate import collate_packed
    from longpack.runtime.in_batch import build_thd_row

    rng = np.random.default_rng(seed)
    m = 2 * cp_size
    cases: list[tuple[str, dict[str, Any]]] = []
    offline_lengths = [1, 5 * m + 3, 2, 3 * m - 1, 7]
    rows = _offline_rows(rng, offline_lengths, m)
    used = sum(align_up(n, m) for n in offline_lengths)
    width = used + 2 * m  # a trailing pure-padding pseudo-segment, itself a multiple of 2*CP
    offline = collate_packed(
        rows, max_seq_length=width, eos_id=EOS, pad_seq_to_mult=m, pad_to_max_length=True
    )
    cases.append(("offline-fixed-width", offline))
    lengths = [3, 9 * m + 1, 1, m, 2 * m + 5]
    inb = build_thd_row(_in_batch_rows(rng, lengths), pad_to_multiple_of=m)
    cases.append(("in-batch", _as_2d(inb)))
    fixed_lengths = [m + 1, 2]
    fixed_width = sum(align_up(n, m) for n in fixed_lengths) + 3 * m
    fixed = build_thd_row(
        _in_batch_rows(rng, fixed_lengths),
        pad_to_multiple_of=m,
        sequence_length=fixed_width,
        pad_to_max_length=True,
    )
    cases.append(("in-batch-fixed-width", _as_2d(fixed)))
    return cases


def _as_2d(batch: dict[str, Any]) -> dict[str, Any]:
    out = dict(batch)
    out["tokens"] = out.pop("input_ids")
    for key in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        if key in out:
            out[key] = out[key].unsqueeze(0)
    return out


class _TinyProjection:
    """Deterministic per-token Q/K/V and output head, so a shard's activations depend only on its tokens."""

    def __init__(self, seed: int, dtype: torch.dtype, max_positions: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        d = HEADS * HEAD_DIM

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

        self.embed = rand(VOCAB, d)
        self.pos = rand(max_positions, d) * 0.5
        self.wq, self.wk, self.wv = rand(d, d) / d**0.5, rand(d, d) / d**0.5, rand(d, d) / d**0.5
        self.head = rand(d, VOCAB) / d**0.5

    def qkv(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed[tokens] + self.pos[positions]
        return tuple((x @ w).view(-1, HEADS, HEAD_DIM) for w in (self.wq, self.wk, self.wv))

    def token_loss(self, out: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        logits = out.reshape(out.size(0), -1) @ self.head
        target = torch.where(loss_mask.bool(), labels, torch.zeros_like(labels))
        ce = torch.nn.functional.cross_entropy(logits, target, reduction="none")
        return (ce * loss_mask.to(ce.dtype)).sum()


def _check_one(
    name: str, batch: dict[str, Any], cp_size: int, rank: int, dtype_name: str, seed: int
) -> CPCheckCase:
    import torch.distributed as dist

    from longpack.runtime.attention import allgather_attention, ring_attention, shard_layout, varlen_attention
    from longpack.runtime.context_parallel import physical_cu_seqlens, shard_batch

    dtype = getattr(torch, dtype_name)
    tokens = batch["tokens"][0]
    total = tokens.numel()
    cu = batch["cu_seqlens_q"][0]
    padded = batch.get("cu_seqlens_q_padded")
    padded = padded[0] if padded is not None else None
    proj = _TinyProjection(seed, dtype, max_positions=total + 1)
    q, k, v = proj.qkv(tokens, batch["position_ids"][0])
    reference = varlen_attention(q, k, v, cu, cu_seqlens_padded=padded)
    ref_loss = proj.token_loss(reference, batch["labels"][0], batch["loss_mask"][0])

    shard = shard_batch(batch, cp_size, rank)
    index, layout = shard_layout(cu, total, cu_seqlens_padded=padded, cp_size=cp_size, cp_rank=rank)
    assert torch.equal(shard["tokens"][0], tokens[index])
    lq, lk, lv = proj.qkv(shard["tokens"][0], shard["position_ids"][0])
    ring = ring_attention(lq, lk, lv, layout)
    gathered = allgather_attention(lq, lk, lv, layout)
    ring_diff = (ring - reference[index]).abs().max().item()
    ag_diff = (gathered - reference[index]).abs().max().item()

    outs = [torch.empty_like(ring) for _ in range(cp_size)]
    indices = [torch.empty_like(index) for _ in range(cp_size)]
    dist.all_gather(outs, ring.contiguous())
    dist.all_gather(indices, index)
    full = torch.empty_like(reference)
    full[torch.cat(indices)] = torch.cat(outs)
    reassembled_diff = (full - reference).abs().max().item()

    local_loss = proj.token_loss(ring, shard["labels"][0], shard["loss_mask"][0]).to(torch.float64)
    dist.all_reduce(local_loss)
    loss_diff = abs(local_loss.item() - ref_loss.item())

    # Isolation: re-draw the tokens of the longest sequence; nothing outside it may change, bit for bit.
    physical = physical_cu_seqlens(batch)
    assert physical is not None
    lengths = cu.diff()
    victim = int(lengths.argmax())
    start = int((padded if padded is not None else cu)[victim])
    gen = torch.Generator().manual_seed(seed + 1)
    perturbed = dict(batch)
    new_tokens = batch["tokens"].clone()
    span = slice(start, start + int(lengths[victim]))
    # Shift every token by a non-zero amount within the non-EOS range, so each one really changes.
    shift = torch.randint(1, VOCAB - EOS - 1, (int(lengths[victim]),), generator=gen)
    new_tokens[0, span] = (new_tokens[0, span] - EOS - 1 + shift) % (VOCAB - EOS - 1) + EOS + 1
    perturbed["tokens"] = new_tokens
    p_shard = shard_batch(perturbed, cp_size, rank)
    pq_, pk, pv = proj.qkv(p_shard["tokens"][0], p_shard["position_ids"][0])
    p_ring = ring_attention(pq_, pk, pv, layout)
    inside = (layout.seq_id == victim) & layout.real
    change = (p_ring - ring).abs().amax(dim=(1, 2))
    outside_change = torch.tensor(
        change[~inside].max().item() if (~inside).any() else 0.0, dtype=torch.float64
    )
    inside_change = torch.tensor(
        change[inside].min().item() if inside.any() else float("inf"), dtype=torch.float64
    )
    figures = torch.tensor([ring_diff, ag_diff, reassembled_diff, outside_change.item()], dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    dist.all_reduce(inside_change, op=dist.ReduceOp.MIN)
    return CPCheckCase(
        case=name,
        cp_size=cp_size,
        dtype=dtype_name,
        tokens=total,
        sequences=int(cu.numel() - 1),
        ring_max_abs_diff=figures[0].item(),
        allgather_max_abs_diff=figures[1].item(),
        reassembled_max_abs_diff=figures[2].item(),
        loss_abs_diff=loss_diff,
        loss=ref_loss.item(),
        isolation_max_change_outside=figures[3].item(),
        isolation_min_change_inside=inside_change.item(),
        tolerance=TOLERANCE[dtype_name],
    )


def _worker(
    rank: int, cp_size: int, init_file: str, result_file: str, seed: int, dtypes: tuple[str, ...]
) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=cp_size)
    try:
        results = []
        for name, batch in build_cases(cp_size, seed):
            for dtype_name in dtypes:
                results.append(asdict(_check_one(name, batch, cp_size, rank, dtype_name, seed)))
        if rank == 0:
            atomic_write_bytes(Path(result_file), json.dumps(results).encode())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_cp_check(
    cp_size: int,
    *,
    seed: int = 0,
    dtypes: tuple[str, ...] = ("float64", "float32"),
    start_method: str = "forkserver",
) -> list[CPCheckCase]:
    """Run the CP attention check on ``cp_size`` gloo processes and return one :class:`CPCheckCase` per case.

    ``start_method="forkserver"`` (default) forks the ranks from a fresh server interpreter that has
    imported torch once (``multiprocessing``'s forkserver preload, set here for this process), so ranks
    share no state with the caller but skip re-importing torch; ``"spawn"`` starts each rank from scratch
    (several seconds per rank on a loaded machine). Raises if a rank fails.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    from longpack.runtime._processes import start_ranks

    if start_method not in ("forkserver", "spawn"):
        raise ConfigError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
    if start_method == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", __name__])
    if cp_size < 1:
        raise ConfigError(f"cp_size must be >= 1, got {cp_size}")
    for dtype_name in dtypes:
        if dtype_name not in TOLERANCE:
            raise ConfigError(f"dtype {dtype_name!r} not supported; use one of {sorted(TOLERANCE)}")
    try:
        with tempfile.TemporaryDirectory(prefix="longpack-cp-") as folder:
            init_file = os.path.join(folder, "init")
            result_file = os.path.join(folder, "result.json")
            start_ranks(
                _worker, (cp_size, init_file, result_file, seed, tuple(dtypes)), cp_size, start_method
            )
            with open(result_file) as handle:
                return [CPCheckCase(**entry) for entry in json.load(handle)]
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS | {errno.ENOENT}:
            raise
        raise _temp_folder_error(os.strerror(exc.errno or 0)) from exc
    except mp.ProcessRaisedException as exc:  # a rank could not write its files (the traceback as text)
        said = next((os.strerror(n) for n in WRITE_ERRNOS if f"[Errno {n}]" in str(exc)), None)
        if said is None:
            raise
        raise _temp_folder_error(said) from exc


def _temp_folder_error(reason: str) -> OutputError:
    """The ranks meet in files of a temporary folder: one that cannot be written is the user's to fix.

    >>> str(_temp_folder_error("No space left on device")).startswith("cp-check cannot write its temporary")
    True
    """
    return OutputError(
        f"cp-check cannot write its temporary folder in {tempfile.gettempdir()} ({reason}); the CP ranks "
        "meet through files there: free space, or set TMPDIR to a writable folder"
    )
