"""``longpack verify`` across processes: context-parallel ranks and pipeline stages, over gloo on the CPU.

- :func:`run_cp_verify`: ``cp_size`` real processes (``torch.multiprocessing``, gloo). Every rank collates the
  row, keeps its zigzag shard (:func:`~longpack.runtime.context_parallel.shard_batch`: TE's THD split, the
  metadata replicated), runs the model on its own tokens with its own position ids, and attends over the
  all-gathered keys and values of every rank (TE's ``all_gather`` CP; the gather is differentiable). Checks:
  the rank's positions equal Megatron-Core's fused THD RoPE rule recomputed from ``cu_seqlens``; each rank's
  per-token losses equal the whole row's at the same tokens (names the rank); per-sample losses summed over
  ranks equal the unpacked samples'; parameter gradients summed over ranks equal the unpacked ones.
- :func:`run_pp_verify`: ``pp_size`` stage processes, one decoder-layer slice each; micro-batches go through
  the stages in order with hidden states sent point to point, and their gradients back (the last stage's
  weighted per-sample loss; each stage checks its layers' parameter gradients, the first stage the input
  embeddings' gradient per sample, against the unpacked ones). Each stage takes its view of
  the batch by Megatron-Bridge's ``get_batch`` rules (:func:`stage_batch`: first stage tokens and positions,
  last stage labels and loss mask, middle stages everything when the data is packed, the packed keys on
  every stage), derives its attention and RoPE positions from the ``cu_seqlens`` it received (as
  Megatron-Core's THD path does beyond the first stage), and checks them; the last stage compares every
  sample's loss with the unpacked one.

>>> b = {"tokens": 1, "position_ids": 2, "labels": 3, "loss_mask": 4, "cu_seqlens_q": 5}
>>> sorted(stage_batch(b, stage=1, stages=3))
['cu_seqlens_q', 'labels', 'loss_mask', 'position_ids', 'tokens']
>>> sorted(stage_batch(b, stage=1, stages=3, drop_packed=True))
[]
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longpack.outputs import atomic_write_bytes

__all__ = ["DistReport", "run_cp_verify", "run_pp_verify", "stage_batch"]

_PACKED_KEYS = (
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "cu_seqlens_q_padded",
    "cu_seqlens_kv_padded",
    "max_seqlen_q",
    "max_seqlen_kv",
    "padding_mask",
)


@dataclass(frozen=True, kw_only=True)
class DistReport:
    """One distributed check (``kind`` ``cp`` or ``pp`` at ``size``) over its rows: worst figures, failures."""

    kind: str
    size: int
    rows: int
    loss_max_rel_diff: float
    token_loss_max_rel_diff: float
    grad_max_rel_diff: float
    failures: tuple[dict[str, Any], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures


def stage_batch(
    batch: Mapping[str, Any], *, stage: int, stages: int, packed: bool = True, drop_packed: bool = False
) -> dict[str, Any]:
    """What pipeline stage ``stage`` of ``stages`` loads from a batch (Megatron-Bridge ``get_batch``).

    ``drop_packed``: the stage loses the packed metadata (Megatron-Bridge #2952: a middle stage took the
    pre-fix fast path and loaded nothing; a first or last stage keeps its own keys without it).
    """
    first, last = stage == 0, stage == stages - 1
    if first or last:
        keys = (("tokens", "position_ids") if first else ()) + (("labels", "loss_mask") if last else ())
    elif packed and not drop_packed:
        keys = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")
    else:
        keys = ()
    view = {k: batch[k] for k in keys if k in batch}
    if not drop_packed:
        view.update({k: batch[k] for k in _PACKED_KEYS if k in batch and batch[k] is not None})
    return view


class _Gather(torch.autograd.Function):
    """All-gather along dim 0 whose backward sums the gradients of every rank and keeps this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        import torch.distributed as dist

        size, rank = dist.get_world_size(), dist.get_rank()
        ctx.rank, ctx.n = rank, x.size(0)
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def _gather(x: torch.Tensor) -> torch.Tensor:
    return _Gather.apply(x)  # type: ignore[no-any-return]


def _setup(payload: dict[str, Any]) -> tuple[Any, Any]:
    from longpack.runtime.verify import RowVerifier
    from longpack.runtime.verify_model import build_model

    torch.set_num_threads(1)
    model = build_model(payload["model"], seed=payload["seed"], layers=payload.get("layers", 1))
    verifier = RowVerifier(model, collate=payload["collate"], seed=payload["seed"])
    return model, verifier


def _fail(check: str, where: Mapping[str, Any], sample: int | None, rank: str, detail: str) -> dict[str, Any]:
    return {"check": check, **where, "sample": sample, "rank": rank, "detail": detail}


def _cp_worker(rank: int, size: int, init_file: str, out_dir: str, payload: dict[str, Any]) -> None:
    import torch.distributed as dist

    from longpack.runtime.attention import TokenLayout, shard_layout
    from longpack.runtime.context_parallel import physical_cu_seqlens, shard_batch, thd_local_positions
    from longpack.runtime.verify import (
        TOLERANCE,
        batch_layout,
        expected_spans,
        run_thd,
        token_losses,
    )
    from longpack.runtime.verify_model import attention_plan

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        model, verifier = _setup(payload)
        failures: list[dict[str, Any]] = []
        worst = {"loss": 0.0, "token": 0.0, "grad": 0.0}
        label = f"cp rank {rank} of {size}"
        for row, where, index in payload["rows"]:
            spans = expected_spans(row)
            batch = verifier.collate([row])
            width = int(batch["tokens"].size(1))
            samples = verifier.samples(row)
            weights = verifier.weights(len(samples), index)
            ref = verifier.reference(samples, weights)
            with torch.no_grad():  # the whole row in one process: per-token reference of the shards
                whole = run_thd(
                    model,
                    verifier.embed(batch["tokens"]),
                    batch["position_ids"][0],
                    attention_plan(batch_layout(batch, width)),
                )
                whole_tokens = token_losses(whole, batch["labels"][0], batch["loss_mask"][0], verifier.head)
            shard = shard_batch(batch, size, rank)
            cu = batch["cu_seqlens_q"][0]
            padded = batch.get("cu_seqlens_q_padded")
            padded = None if padded is None else padded[0]
            index_t, local = shard_layout(cu, width, cu_seqlens_padded=padded, cp_size=size, cp_rank=rank)
            positions = shard["position_ids"][0].clone()
            if payload.get("fault") == "cp-positions-shifted" and rank > 0:
                positions = positions + rank  # what Megatron-LM #5243 did to later sequences
            physical = physical_cu_seqlens(batch)
            assert physical is not None
            rope = thd_local_positions(physical, cp_size=size, cp_rank=rank)
            real = local.real
            if not torch.equal(positions[real], rope[real]):
                bad = int((positions[real] != rope[real]).nonzero()[0])
                token = int(index_t[real][bad])
                sample = int(np.searchsorted(spans, token, side="right") - 1)
                failures.append(
                    _fail(
                        "cp",
                        where,
                        sample,
                        label,
                        f"position ids of the rank's shard differ from Megatron-Core's THD RoPE positions "
                        f"(token {token}: {int(positions[real][bad])} vs {int(rope[real][bad])})",
                    )
                )
            meta = torch.stack([local.seq_id, local.offset, local.real.to(torch.int64)])
            metas = [torch.empty_like(meta) for _ in range(size)]
            dist.all_gather(metas, meta)
            gathered = torch.cat(metas, dim=1)
            k_layout = TokenLayout(gathered[0], gathered[1], gathered[2].bool())
            plan = attention_plan(local, k_layout)
            embeds = verifier.embed(shard["tokens"]).detach().requires_grad_(True)
            if payload.get("fault") == "linear-cp-local":  # linear layers on the rank's shard alone
                own = attention_plan(local)
                hidden = run_thd(
                    model,
                    embeds,
                    positions,
                    plan,
                    gather=_gather,
                    linear_plan=own,
                    conv_plan=own,
                    thd_linear_local=True,
                )
            else:
                hidden = run_thd(model, embeds, positions, plan, gather=_gather)
            per_token = token_losses(hidden, shard["labels"][0], shard["loss_mask"][0], verifier.head)
            token_diff = (per_token.detach() - whole_tokens[index_t]).abs() / whole_tokens[
                index_t
            ].abs().clamp(min=1.0)
            if token_diff.numel() and float(token_diff.max()) > TOLERANCE:
                token = int(index_t[int(token_diff.argmax())])
                sample = int(np.searchsorted(spans, token, side="right") - 1)
                failures.append(
                    _fail(
                        "cp",
                        where,
                        sample,
                        label,
                        f"per-token loss of this rank's shard differs from the whole row (relative "
                        f"{float(token_diff.max()):.2e} at token {token})",
                    )
                )
            worst["token"] = max(worst["token"], float(token_diff.max()) if token_diff.numel() else 0.0)
            owner = torch.from_numpy(np.searchsorted(spans, index_t.numpy(), side="right") - 1)
            local_losses = torch.zeros(len(samples), dtype=torch.float64)
            inside = owner < len(samples)
            local_losses = local_losses.index_add(0, owner[inside], per_token[inside])
            grads = torch.autograd.grad((local_losses * weights).sum(), verifier.params, allow_unused=True)
            summed = local_losses.detach().clone()
            dist.all_reduce(summed)
            diffs = (summed - ref.losses).abs() / ref.losses.abs().clamp(min=1.0)
            worst["loss"] = max(worst["loss"], float(diffs.max()))
            if float(diffs.max()) > TOLERANCE and rank == 0:
                failures.append(
                    _fail(
                        "cp",
                        where,
                        int(diffs.argmax()),
                        f"cp {size}, summed over ranks",
                        f"per-sample loss over the CP ranks differs from unpacked (relative {float(diffs.max()):.2e})",
                    )
                )
            grad_diff = 0.0
            for g, r, p in zip(grads, ref.param_grads, verifier.params, strict=True):
                g = torch.zeros_like(p) if g is None else g.clone()
                dist.all_reduce(g)
                grad_diff = max(grad_diff, float((g - r).abs().max()) / max(1.0, float(r.abs().max())))
            worst["grad"] = max(worst["grad"], grad_diff)
            if grad_diff > TOLERANCE and rank == 0:
                failures.append(
                    _fail(
                        "cp",
                        where,
                        None,
                        f"cp {size}, summed over ranks",
                        f"parameter gradients summed over CP ranks differ from unpacked (relative {grad_diff:.2e})",
                    )
                )
        _write(out_dir, rank, worst, failures)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _pp_worker(rank: int, size: int, init_file: str, out_dir: str, payload: dict[str, Any]) -> None:
    import torch.distributed as dist

    from longpack.runtime.context_parallel import thd_local_positions
    from longpack.runtime.verify import (
        THD_ATTENTION,
        TOLERANCE,
        _rel,
        batch_layout,
        expected_spans,
        metadata_failures,
        token_losses,
    )
    from longpack.runtime.verify_model import attention_plan

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        model, verifier = _setup(payload)
        layers = list(model.layers)
        # Stage r holds layers [r * n // size, (r + 1) * n // size): every layer on some stage.
        mine = layers[rank * len(layers) // size : (rank + 1) * len(layers) // size]
        failures: list[dict[str, Any]] = []
        worst = {"loss": 0.0, "token": 0.0, "grad": 0.0}
        label = f"pp stage {rank} of {size}"
        drop_stage = 1 if payload.get("fault") == "drop-cu-seqlens" else -1
        for micro, (row, where, index) in enumerate(payload["rows"]):
            spans = expected_spans(row)
            full = verifier.collate([row])  # every stage reads the micro-batch from its own iterator
            width = int(full["tokens"].size(1))
            view = stage_batch(full, stage=rank, stages=size, drop_packed=rank == drop_stage)
            if rank == 0:
                positions = view["position_ids"][0]
            elif view.get("cu_seqlens_q") is not None:  # Megatron-Core's THD RoPE: from cu_seqlens
                physical = view.get("cu_seqlens_q_padded", view["cu_seqlens_q"])[0]
                positions = torch.zeros(width, dtype=torch.int64)
                rope = thd_local_positions(physical.to(torch.int64), cp_size=1, cp_rank=0)
                positions[: rope.numel()] = rope
            else:
                positions = torch.arange(width)
            stage_where = {**where, "rank": f"{label}, micro-batch {micro}"}
            for f in metadata_failures(view, spans, positions, stage_where):
                failures.append({"check": "pp", **{k: v for k, v in asdict(f).items() if k != "check"}})
            plan = attention_plan(batch_layout(view, width))
            samples = verifier.samples(row)
            weights = verifier.weights(len(samples), index)
            if rank == 0:
                received = verifier.embed(view["tokens"]).detach().requires_grad_(True)
            else:
                received = torch.empty(1, width, int(model.config.hidden_size), dtype=torch.float64)
                dist.recv(received, src=rank - 1)
                received.requires_grad_(True)
            hidden = received
            # RoPE tables (a family without RoPE, Nemotron-H, has no rotary_emb)
            rotary = model.rotary_emb(hidden, positions.view(1, -1)) if hasattr(model, "rotary_emb") else None
            model.config._attn_implementation = THD_ATTENTION
            try:
                for layer in mine:
                    hidden = layer(
                        hidden,
                        attention_mask=None,
                        position_embeddings=rotary,
                        position_ids=positions.view(1, -1),
                        thd_plan=plan,
                    )
                    hidden = hidden[0] if isinstance(hidden, tuple) else hidden
            finally:
                model.config._attn_implementation = "sdpa"
            params = [p for layer in mine for p in layer.parameters() if p.requires_grad]
            if rank < size - 1:  # send forward, then take the next stage's gradient of our output
                dist.send(hidden.detach().contiguous(), dst=rank + 1)
                incoming = torch.empty_like(hidden)
                dist.recv(incoming, src=rank + 1)
                grads = torch.autograd.grad(hidden, [received, *params], incoming, allow_unused=True)
                losses = None
            else:
                final_norm = model.norm if hasattr(model, "norm") else model.norm_f  # Nemotron-H: norm_f
                params += [p for p in final_norm.parameters() if p.requires_grad]
                out = final_norm(hidden)[0]
                per_token = token_losses(out, view["labels"][0], view["loss_mask"][0], verifier.head)
                losses = torch.stack([per_token[int(a) : int(b)].sum() for a, b in itertools.pairwise(spans)])
                grads = torch.autograd.grad((losses * weights).sum(), [received, *params], allow_unused=True)
            if rank > 0:  # the gradient of what we received goes back to the previous stage
                dist.send(grads[0].contiguous(), dst=rank - 1)
            ref = verifier.reference(samples, weights)
            slot = {id(p): i for i, p in enumerate(verifier.params)}
            grad_diff = max(
                (
                    _rel(torch.zeros_like(p) if g is None else g, ref.param_grads[slot[id(p)]])
                    for p, g in zip(params, grads[1:], strict=True)
                ),
                default=0.0,
            )
            if rank == 0:  # the input embeddings' gradient, sample by sample
                for i, sample in enumerate(samples):
                    got = grads[0][0, int(spans[i]) : int(spans[i]) + sample[0].numel()]
                    grad_diff = max(grad_diff, _rel(got, ref.embed_grads[i]))
            worst["grad"] = max(worst["grad"], grad_diff)
            if grad_diff > TOLERANCE:
                failures.append(
                    _fail(
                        "pp",
                        where,
                        None,
                        f"{label}, micro-batch {micro}",
                        f"this stage's gradients (its layers' parameters"
                        f"{', the input embeddings' if rank == 0 else ''}) differ from unpacked "
                        f"(relative {grad_diff:.2e})",
                    )
                )
            if losses is None:
                continue
            diffs = (losses.detach() - ref.losses).abs() / ref.losses.abs().clamp(min=1.0)
            worst["loss"] = max(worst["loss"], float(diffs.max()))
            if float(diffs.max()) > TOLERANCE:
                failures.append(
                    _fail(
                        "pp",
                        where,
                        int(diffs.argmax()),
                        f"{label} (last), micro-batch {micro}",
                        f"last-stage loss differs from unpacked (relative {float(diffs.max()):.2e})",
                    )
                )
        _write(out_dir, rank, worst, failures)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _write(out_dir: str, rank: int, worst: dict[str, float], failures: list[dict[str, Any]]) -> None:
    atomic_write_bytes(
        Path(out_dir) / f"rank{rank}.json", json.dumps({"worst": worst, "failures": failures}).encode()
    )


def _run(
    kind: str,
    worker: Any,
    size: int,
    rows: Sequence[tuple[Mapping[str, Any], Mapping[str, Any], int]],
    payload: dict[str, Any],
) -> DistReport:
    import multiprocessing

    from longpack.runtime._processes import start_ranks

    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", "transformers", __name__])
    payload = {**payload, "rows": [(dict(r), dict(w), i) for r, w, i in rows]}
    with tempfile.TemporaryDirectory(prefix=f"longpack-verify-{kind}-") as folder:
        init_file = os.path.join(folder, "init")
        start_ranks(worker, (size, init_file, folder, payload), size, "forkserver")  # unguarded scripts too
        results = []
        for rank in range(size):
            with open(os.path.join(folder, f"rank{rank}.json")) as handle:
                results.append(json.load(handle))
    failures = tuple(f for r in results for f in r["failures"])
    return DistReport(
        kind=kind,
        size=size,
        rows=len(rows),
        loss_max_rel_diff=max(r["worst"]["loss"] for r in results),
        token_loss_max_rel_diff=max(r["worst"]["token"] for r in results),
        grad_max_rel_diff=max(r["worst"]["grad"] for r in results),
        failures=failures,
    )


def run_cp_verify(
    cp_size: int,
    rows: Sequence[tuple[Mapping[str, Any], Mapping[str, Any], int]],
    *,
    model: Mapping[str, Any],
    collate: Any,
    seed: int = 0,
    fault: str | None = None,
) -> DistReport:
    """CP check of ``rows`` (``(row, where, index)``) on ``cp_size`` gloo processes."""
    payload = {"model": dict(model), "collate": collate, "seed": seed, "fault": fault}
    return _run("cp", _cp_worker, cp_size, rows, payload)


def run_pp_verify(
    pp_size: int,
    rows: Sequence[tuple[Mapping[str, Any], Mapping[str, Any], int]],
    *,
    model: Mapping[str, Any],
    collate: Any,
    seed: int = 0,
    fault: str | None = None,
) -> DistReport:
    """PP check of ``rows`` as ``pp_size`` stages (one decoder layer each at least), one micro-batch per row."""
    payload = {
        "model": dict(model),
        "collate": collate,
        "seed": seed,
        "fault": fault,
        "layers": max(2, pp_size),
    }
    return _run("pp", _pp_worker, pp_size, rows, payload)
