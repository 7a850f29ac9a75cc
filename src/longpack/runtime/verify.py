"""Proof that a model sees what was packed: packed = unpacked, row by row (``longpack verify``).

For each checked row of a packed folder, :class:`RowVerifier` collates it exactly as Megatron-Bridge does
(:class:`~longpack.runtime.collate.PackedCollator`), runs a small random model of the real family
(:mod:`longpack.runtime.verify_model`, float64) on the packed THD row with the attention built from the
batch's ``cu_seqlens*`` and position ids from the batch, and compares with every sample run on its own
(transformers' own ``sdpa`` path, no THD metadata). Checks, each naming the row, sample and rank that fails:

- ``metadata``: the batch has ``cu_seqlens_q``; its physical boundaries are the row's samples
  (from ``seq_start_id``, independently of the collate); positions restart at 0 in every sample.
- ``padding``: no ``loss_mask`` on a token the batch marks as padding (``padding_mask``), i.e. no loss on a
  token outside ``cu_seqlens`` (attention never reaches it).
- ``loss``: every sample's packed loss equals its unpacked loss (relative :data:`TOLERANCE`).
- ``gradients``: parameter gradients and each sample's input-embedding gradients equal the unpacked ones.
- ``isolation``: the gradient of the even samples' losses w.r.t. the odd samples' embeddings (even rows;
  the reverse on odd rows, both with ``thorough``) is exactly zero: no attention across samples
  (neighbours always differ in parity; other pairs are covered by the gradient equality, with random
  per-sample weights so leaks cannot cancel).
- ``in-batch``: the row's samples as a right-padded micro-batch (MBS = samples in the row) packed in-batch
  (:func:`~longpack.runtime.in_batch.pack_right_padded_batch`) give the unpacked losses.

Context parallelism and pipeline stages run in real processes: :mod:`longpack.runtime.verify_dist`.

Faults (:data:`FAULTS`) change the batch as a broken training stack would; each must fail the verdict.

>>> sorted(FAULTS)[:2]
['conv-state-leak', 'cp-positions-shifted']
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from longpack.runtime.attention import TokenLayout, token_layout
from longpack.runtime.collate import row_boundaries
from longpack.runtime.verify_linear import LINEAR_CP_FAULTS, LINEAR_FAULTS, has_linear_layers
from longpack.runtime.verify_model import HEAD_CLASSES, THD_ATTENTION, AttentionPlan, attention_plan
from longpack.runtime.verify_moe import MOE_FAULTS, RouterStats, router_stats, routes
from longpack.runtime.verify_mtp import (
    MTP_FAULTS,
    MTPHead,
    mtp_depth,
    roll_alone,
    roll_global,
    roll_per_sequence,
)
from longpack.topology import align_up

__all__ = [
    "CHECKS",
    "DPO_FAULTS",
    "FAULTS",
    "THREADS",
    "TOLERANCE",
    "Failure",
    "RowReport",
    "RowVerifier",
    "apply_fault",
    "batch_layout",
    "expected_spans",
    "metadata_failures",
]

#: Relative tolerance of loss and gradient equality (float64; measured differences are ~1e-14).
TOLERANCE = 1e-9
#: Intra-op threads for the row checks: the tiny model's kernels are too small to gain from threads, and on
#: a busy machine waiting threads cost more than they do (8K demo rows: 0.2-0.4 CPU-s on one thread, 1.8-3.3
#: on two with the 2 cores shared). The CP and PP checks run one process per rank, one thread each.
THREADS = 1
#: Samples at least this long run in the unpacked reference without padding (batches of equal length).
SHORT_SAMPLE = 256
#: What each check proves (the certificate lists them).
CHECKS = {
    "metadata": "cu_seqlens present and equal to the row's samples; positions restart at 0 in every sample",
    "padding": "no loss_mask on a token outside cu_seqlens (padding_mask)",
    "loss": "per-sample packed loss = the sample's unpacked loss",
    "gradients": "parameter and input-embedding gradients packed = unpacked",
    "isolation": "gradient of one sample's loss w.r.t. another sample's embeddings is exactly zero",
    "in-batch": "in-batch THD packing of the row's samples (MBS > 1) = unpacked",
    "moe": "MoE routers (softmax top-k families): every sample's tokens per expert, routing probabilities and "
    "z-loss sums in the packed row = the sample's alone; the packed row's tokens per expert, load-balancing "
    "loss and z-loss (padding left out) = those of the sum over its samples alone",
    "mtp": "multi-token prediction (depth 1, Megatron-Core's MTP layer): the packed row's MTP inputs, labels "
    "and loss mask rolled per sequence = each sample's own roll; per-sample MTP loss packed = alone; the "
    "gradient of one sample's MTP loss w.r.t. another sample's MTP inputs is exactly zero",
    "cp": "context-parallel zigzag shards (gloo ranks, all-gathered K/V) = the whole row; positions per rank",
    "pp": "every pipeline stage receives cu_seqlens and positions for every micro-batch; last-stage loss; "
    "every stage's parameter gradients (and the first stage's input-embedding gradients) after the backward "
    "pass through the stages",
}
#: Faults of packed preference pairs (``verify --dpo``, :mod:`longpack.runtime.verify_dpo`); each crosses pairs.
DPO_FAULTS = {
    "dpo-attention-across-pairs": "the attention's cu_seqlens lose the boundary between two pairs: the second "
    "pair's chosen sequence attends to the first pair's rejected one (positions and loss split still right)",
    "dpo-pairs-misaligned": "the loss reads each pair's chosen sequence with the next pair's rejected one (a "
    "chosen/rejected interleaving off by one pair)",
}
#: Injected faults (what a broken stack does) -> what they model. Each must fail ``verify``.
FAULTS = {
    "drop-cu-seqlens": "a pipeline stage receives no cu_seqlens (Megatron-Bridge #2952); without PP the "
    "attention receives none",
    "positions-not-restarted": "position ids run on across samples instead of restarting at 0",
    "cp-positions-shifted": "a CP rank's position ids are shifted (Megatron-LM #5243; needs CP)",
    "loss-on-padding": "loss_mask 1 on a padding token",
    "token-across-boundary": "a sample's last token counted in the next sample (boundary moved by one)",
    **LINEAR_FAULTS,
    **LINEAR_CP_FAULTS,
    **MOE_FAULTS,
    **MTP_FAULTS,
    **DPO_FAULTS,
}


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One difference: which check, where (split, file, row in file, sample in row, rank) and by how much."""

    check: str
    split: str
    file: str
    row: int
    sample: int | None
    rank: str
    detail: str

    def line(self) -> str:
        sample = "" if self.sample is None else f" sample {self.sample}"
        return f"{self.check}: {self.split} {self.file} row {self.row}{sample} ({self.rank}): {self.detail}"


@dataclass(frozen=True, kw_only=True)
class RowReport:
    """Figures of one checked row (worst over its samples) and its failures."""

    split: str
    file: str
    row: int
    index: int
    tokens: int
    samples: int
    loss_max_rel_diff: float
    grad_max_rel_diff: float
    embedding_grad_max_rel_diff: float
    leak_max_abs: float
    padding_loss_tokens: int
    in_batch_max_rel_diff: float
    failures: tuple[Failure, ...] = field(default=())
    router_max_rel_diff: float = 0.0
    router_padding_tokens: int = 0
    mtp_loss_max_rel_diff: float = 0.0
    mtp_leak_max_abs: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


def expected_spans(row: Mapping[str, Any]) -> np.ndarray:
    """Runtime offsets of the row's samples, from its stored boundaries alone (not from any collate).

    >>> expected_spans({"input_ids": [1, 2, 3, 4, 5], "seq_start_id": [0, 3]}).tolist()
    [0, 2, 3]
    """
    b = row_boundaries(row)
    runtime = np.diff(b) - 1
    return np.concatenate([[0], np.cumsum(runtime)]).astype(np.int64)


def _first_row(value: Any) -> torch.Tensor:
    tensor = torch.as_tensor(value)
    return tensor[0] if tensor.dim() == 2 else tensor


def batch_layout(batch: Mapping[str, Any], width: int) -> TokenLayout:
    """The token labels the attention derives from a batch's THD metadata (physical ``cu_seqlens_q_padded``
    when present); a batch without ``cu_seqlens_q`` is one causal sequence over the row, as attention
    without packed parameters treats it.

    >>> lay = batch_layout({"cu_seqlens_q": torch.tensor([[0, 2, 4]])}, 4)
    >>> lay.seq_id.tolist()
    [0, 0, 1, 1]
    """
    cu = batch.get("cu_seqlens_q")
    if cu is None:
        return token_layout([0, width], width)
    padded = batch.get("cu_seqlens_q_padded")
    return token_layout(
        _first_row(cu), width, cu_seqlens_padded=None if padded is None else _first_row(padded)
    )


def metadata_failures(
    batch: Mapping[str, Any], spans: np.ndarray, positions: torch.Tensor | None, where: dict[str, Any]
) -> list[Failure]:
    """Exact checks of what a stage received: ``cu_seqlens_q`` present, its physical boundaries equal to the
    samples' spans, and ``positions`` (if given) restarting at 0 in every sample."""
    out: list[Failure] = []
    cu = batch.get("cu_seqlens_q")
    if cu is None:
        out.append(Failure(check="metadata", sample=None, detail="the batch has no cu_seqlens_q", **where))
    else:
        padded = batch.get("cu_seqlens_q_padded")
        physical = _first_row(cu if padded is None else padded).to(torch.int64).numpy()
        got = physical[: spans.size]
        if got.size < spans.size or not np.array_equal(got, spans):
            bad = int(np.argmax(got != spans[: got.size])) if got.size else 0
            out.append(
                Failure(
                    check="metadata",
                    sample=max(bad - 1, 0),
                    detail=f"physical cu_seqlens {got.tolist()[:8]}... differ from the samples' offsets "
                    f"{spans.tolist()[:8]}... at entry {bad}",
                    **where,
                )
            )
    if positions is not None:
        pos = positions.to(torch.int64).numpy()
        for i in range(spans.size - 1):
            start, end = int(spans[i]), int(spans[i + 1])
            if end > start and not np.array_equal(pos[start:end], np.arange(end - start)):
                first = int(np.argmax(pos[start:end] != np.arange(end - start)))
                out.append(
                    Failure(
                        check="metadata",
                        sample=i,
                        detail=f"position ids do not restart at 0 in this sample: token {first} has position "
                        f"{int(pos[start + first])}, expected {first}",
                        **where,
                    )
                )
                break
    return out


def apply_fault(batch: dict[str, Any], fault: str | None, spans: np.ndarray) -> dict[str, Any]:
    """The batch as a broken stack would hand it to the model (``fault`` one of :data:`FAULTS`; the CP and PP
    faults act in :mod:`longpack.runtime.verify_dist` and leave the single-process batch alone)."""
    if (
        fault is None
        or fault == "cp-positions-shifted"
        or fault in {**LINEAR_FAULTS, **LINEAR_CP_FAULTS, **MOE_FAULTS, **MTP_FAULTS}
    ):
        return batch
    out = dict(batch)
    if fault == "drop-cu-seqlens":
        for key in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
            out.pop(key, None)
    elif fault == "positions-not-restarted":
        width = out["position_ids"].size(1)
        out["position_ids"] = torch.arange(width).unsqueeze(0).repeat(out["position_ids"].size(0), 1)
    elif fault == "loss-on-padding":
        pad = out["padding_mask"][0].nonzero().flatten()
        if pad.numel():
            mask = out["loss_mask"].clone()
            mask[0, int(pad[0])] = 1
            out["loss_mask"] = mask
    elif fault == "token-across-boundary":
        if spans.size > 2:
            for key in ("cu_seqlens_q", "cu_seqlens_q_padded"):
                if key in out:
                    cu = out[key].clone()
                    cu[0, 1] -= 1  # the first sample's last token now opens the second sample
                    out[key] = cu
            out["cu_seqlens_kv"] = out["cu_seqlens_q"]
            if "cu_seqlens_q_padded" in out:
                out["cu_seqlens_kv_padded"] = out["cu_seqlens_q_padded"]
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(sorted(FAULTS))}")
    return out


#: How each layer type runs packed (the certificate's ``coverage``).
LAYER_TYPE_RUNS = {
    "full_attention": f"softmax attention: {THD_ATTENTION} (causal SDPA per cu_seqlens sequence)",
    "sliding_attention": f"sliding-window attention: {THD_ATTENTION} with the window per sequence",
    "chunked_attention": f"chunked attention: {THD_ATTENTION}",
    "linear_attention": "Gated DeltaNet: transformers' own causal_conv1d_fn and torch_chunk_gated_delta_rule "
    "run per cu_seqlens sequence (zero convolution history and zero recurrent state at every sequence start, "
    "chunks from the sequence's first token, as FLA and Megatron-Core with cu_seqlens)",
    "moe": "MoE feed-forward (per token)",
    "mlp": "MLP (per token)",
}
#: Family-specific entries of :data:`LAYER_TYPE_RUNS` (Nemotron-H calls its Mamba-2 layers linear_attention).
FAMILY_LAYER_TYPE_RUNS = {
    "nemotron_h": {
        "linear_attention": "Mamba-2: transformers' own causal_conv1d_fn and mamba2_chunk_scan run per "
        "cu_seqlens sequence (zero convolution history and zero SSM state at every sequence start, chunks "
        "from the sequence's first token, as mamba-ssm with seq_idx and Megatron-Core with cu_seqlens)",
    },
}
#: What verify does not prove (the certificate's ``coverage.not_covered``); entries that depend on the model
#: are added by :func:`coverage`.
NOT_COVERED = (
    "SSM families other than Nemotron-H (Falcon-H1, Jamba, Bamba, Zamba, plain Mamba): no packed path yet; "
    "verify refuses them",
    "the fused GPU kernels themselves (FLA, causal-conv1d, TransformerEngine): the CPU runs transformers' torch "
    "fallbacks; benchmarks/gpu_verify.py (prepared, not yet run on a GPU) runs Megatron-Core's GDN and Mamba",
    "expert parallelism and token dispatch (one process: every expert local)",
    "MoE router statistics and MTP under CP and PP (single process only)",
)


def coverage(config: Any, *, cp: Sequence[int] = (), pp: Sequence[int] = ()) -> dict[str, Any]:
    """What this run covered and what it could not, for the tiny model's ``config``.

    >>> from types import SimpleNamespace
    >>> c = coverage(SimpleNamespace(model_type="qwen3", layer_types=None), cp=(2,))
    >>> c["layer_types"], c["parts"]["cp"], c["parts"]["moe_router"]["covered"]
    (['full_attention'], [2], False)
    """
    types = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]))
    linear = has_linear_layers(config)
    depth = mtp_depth(config)
    routed = routes(config)
    experts = (  # DeepSeek-V3 / Kimi K2 / GLM-4.5 name their routed experts n_routed_experts
        getattr(config, "num_experts", None)
        or getattr(config, "num_local_experts", None)
        or getattr(config, "n_routed_experts", None)
        or 0
    )
    not_covered = list(NOT_COVERED)
    if experts and not routed:
        not_covered.append(
            f"the router statistics of {config.model_type} (router not softmax top-k: not recomputed here)"
        )
    if depth > 1:
        not_covered.append(f"MTP depths 2..{depth} (the tiny model has one MTP layer)")
    return {
        "family": getattr(config, "model_type", None),
        "layer_types": types,
        "layer_type_runs": {
            t: FAMILY_LAYER_TYPE_RUNS.get(getattr(config, "model_type", ""), {}).get(
                t, LAYER_TYPE_RUNS.get(t, "?")
            )
            for t in types
        },
        "parts": {
            "cp": list(cp),
            "pp": list(pp),
            "linear_attention_cp": (
                None
                if not (linear and cp)
                else "Mamba-2: every rank runs the whole gathered sequences (all heads) and keeps its tokens"
                if getattr(config, "model_type", None) == "nemotron_h"
                else "head split (each rank runs whole sequences for its heads / conv channels, all-gathered back)"
            ),
            "moe_router": {
                "covered": routed,
                "experts": int(experts),
                "top_k": getattr(config, "num_experts_per_tok", None),
            },
            "mtp": {"covered": depth > 0, "depth_declared": depth, "depth_checked": 1 if depth else 0},
        },
        "not_covered": not_covered,
    }


def layer_masks(model: Any) -> dict[str, None]:
    """``attention_mask`` for every layer type: ``None`` (masking is the THD plan's)."""
    kinds = set(getattr(model.config, "layer_types", None) or ())
    return dict.fromkeys(kinds | {"full_attention", "sliding_attention", "chunked_attention"})


def run_thd(
    model: Any,
    embeds: torch.Tensor,
    positions: torch.Tensor,
    plan: AttentionPlan,
    *,
    gather: Any = None,
    linear_plan: AttentionPlan | None = None,
    conv_plan: AttentionPlan | None = None,
    **extra: Any,
) -> torch.Tensor:
    """The model's last hidden states ``[T, hidden]`` for one THD row ``embeds [1, T, hidden]``; ``positions``
    ``[T]``, or ``[3, 1, T]`` (mRoPE). ``linear_plan`` / ``conv_plan``: the sequences the Gated DeltaNet's
    delta rule / causal conv1d see (default: ``plan``'s; the linear faults hand them other ones)."""
    return run_thd_outputs(
        model, embeds, positions, plan, gather=gather, linear_plan=linear_plan, conv_plan=conv_plan, **extra
    ).last_hidden_state[0]


def run_thd_outputs(
    model: Any,
    embeds: torch.Tensor,
    positions: torch.Tensor,
    plan: AttentionPlan,
    *,
    gather: Any = None,
    linear_plan: AttentionPlan | None = None,
    conv_plan: AttentionPlan | None = None,
    **extra: Any,
) -> Any:
    """:func:`run_thd`, returning the model's whole output (``extra``: e.g. ``output_router_logits``)."""
    model.config._attn_implementation = THD_ATTENTION
    try:
        return model(
            inputs_embeds=embeds,
            position_ids=positions.view(1, -1) if positions.dim() == 1 else positions,
            attention_mask=layer_masks(model),
            thd_plan=plan,
            thd_gather=gather,
            thd_linear_plan=linear_plan,
            thd_conv_plan=conv_plan,
            **extra,
        )
    finally:
        model.config._attn_implementation = "sdpa"


def token_losses(
    hidden: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor, head: torch.Tensor
) -> torch.Tensor:
    """Masked per-token cross-entropy of a hashed-label head (:data:`HEAD_CLASSES` classes)."""
    logits = hidden @ head
    target = torch.remainder(labels.to(torch.int64), HEAD_CLASSES)
    ce = F.cross_entropy(logits, target, reduction="none")
    return ce * loss_mask.to(ce.dtype)


def _rel(a: torch.Tensor | float, b: torch.Tensor | float) -> float:
    a_t, b_t = torch.as_tensor(a), torch.as_tensor(b)
    scale = max(1.0, float(b_t.abs().max()) if b_t.numel() else 1.0)
    return float((a_t - b_t).abs().max()) / scale if a_t.numel() else 0.0


@dataclass
class Reference:
    """Each sample run on its own: losses, parameter gradients and input-embedding gradients."""

    losses: torch.Tensor
    param_grads: list[torch.Tensor]
    embed_grads: list[torch.Tensor]
    router: list[RouterStats] | None = None
    hidden: list[torch.Tensor] | None = None


class RowVerifier:
    """Checks rows with one model: ``verify(row, where)`` -> :class:`RowReport`.

    ``collate``: a callable ``[row] -> batch`` (a :class:`~longpack.runtime.collate.PackedCollator`);
    ``in_batch_multiple``: the alignment of the in-batch check (the folder's ``pad_seq_to_mult``).
    """

    def __init__(
        self,
        model: Any,
        *,
        collate: Any,
        seed: int = 0,
        fault: str | None = None,
        in_batch_multiple: int = 1,
        reference_tokens: int = 8192,
        thorough: bool = False,
    ) -> None:
        self.model = model
        self.collate = collate
        self.fault = fault
        self.in_batch_multiple = in_batch_multiple
        self.reference_tokens = reference_tokens
        self.thorough = thorough
        self.routes = routes(model.config)
        if fault in MOE_FAULTS and not self.routes:
            from longpack.errors import ConfigError

            raise ConfigError(
                f"fault {fault!r} acts on MoE routers and model_type {model.config.model_type!r} has none that "
                "verify checks; inject it with a MoE model (qwen3_30b_a3b, qwen3_next_80b_a3b)",
                fields="fault",
            )
        if (fault in LINEAR_FAULTS or fault in LINEAR_CP_FAULTS) and not has_linear_layers(model.config):
            from longpack.errors import ConfigError

            raise ConfigError(
                f"fault {fault!r} acts on Gated DeltaNet / Mamba-2 layers and model_type "
                f"{model.config.model_type!r} has none; inject it with a hybrid model (qwen3_next, nemotron_h)",
                fields="fault",
            )
        if fault in DPO_FAULTS:
            from longpack.errors import ConfigError

            raise ConfigError(
                f"fault {fault!r} crosses preference pairs; inject it with --dpo PACKED.npy (NeMo-Aligner's "
                "packed DPO rows), not on SFT rows",
                fields="fault",
            )
        self.mtp = MTPHead(model, seed=seed) if mtp_depth(model.config) else None
        if fault in MTP_FAULTS and self.mtp is None:
            from longpack.errors import ConfigError

            raise ConfigError(
                f"fault {fault!r} acts on MTP layers and model_type {model.config.model_type!r} declares none "
                "(mtp_num_hidden_layers / num_nextn_predict_layers); inject it with qwen3_next_80b_a3b",
                fields="fault",
            )
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.embed = model.get_input_embeddings()
        gen = torch.Generator().manual_seed(seed + 1)
        hidden = int(model.config.hidden_size)
        self.head = torch.randn(hidden, HEAD_CLASSES, generator=gen, dtype=torch.float64) / hidden**0.5
        self.seed = seed

    # -- pieces ----------------------------------------------------------------------------------------
    def samples(self, row: Mapping[str, Any]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each sample alone: ``(input tokens, labels, loss mask)`` after the next-token shift."""
        ids = torch.from_numpy(np.array(row["input_ids"], dtype=np.int64))
        mask = torch.from_numpy(np.array(row["loss_mask"], dtype=np.int64))
        b = row_boundaries(row).tolist()
        out = []
        for start, end in itertools.pairwise(b):
            out.append((ids[start : end - 1], ids[start + 1 : end], mask[start : end - 1]))
        return out

    def weights(self, count: int, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return 0.5 + torch.rand(count, generator=gen, dtype=torch.float64)

    def reference(
        self,
        samples: Sequence[tuple[torch.Tensor, ...]],
        weights: torch.Tensor,
        with_grad: Sequence[bool] | None = None,
        *,
        router: bool = False,
        real_lengths: Sequence[int] | None = None,
        keep_hidden: bool = False,
    ) -> Reference:
        """Run the samples unpacked (transformers' ``sdpa``, no THD metadata); gradients (of the weighted
        losses) only through the samples ``with_grad`` marks (default: all).

        Samples of :data:`SHORT_SAMPLE` tokens or more run in batches of equal length (no padding, so
        transformers hands SDPA ``is_causal`` and no mask: its flash kernel); shorter ones as right-padded
        batches with transformers' own padding mask (its masked kernel, cheap at these lengths)."""
        losses = torch.zeros(len(samples), dtype=torch.float64)
        stats: list[Any] = [None] * len(samples)
        kept_hidden: list[torch.Tensor] = [torch.zeros(0)] * len(samples)
        top_k = int(getattr(self.model.config, "num_experts_per_tok", 1) or 1)
        param_grads = [torch.zeros_like(p) for p in self.params]
        embed_grads: list[torch.Tensor] = [torch.zeros(0)] * len(samples)
        marks = [True] * len(samples) if with_grad is None else list(with_grad)
        groups: list[tuple[bool, list[int]]] = []
        for grad in (True, False):
            order = sorted(
                (i for i in range(len(samples)) if marks[i] == grad), key=lambda i: samples[i][0].numel()
            )
            current: list[int] = []
            for i in order:
                n = samples[i][0].numel()
                if current and (
                    n * (len(current) + 1) > self.reference_tokens
                    or (n >= SHORT_SAMPLE and samples[current[0]][0].numel() != n)
                ):
                    groups.append((grad, current))
                    current = []
                current.append(i)
            if current:
                groups.append((grad, current))
        for grad, group in groups:
            width = max(samples[i][0].numel() for i in group)
            tokens = torch.zeros(len(group), width, dtype=torch.int64)
            labels = torch.zeros(len(group), width, dtype=torch.int64)
            mask = torch.zeros(len(group), width, dtype=torch.int64)
            attend = torch.zeros(len(group), width, dtype=torch.int64)
            for j, i in enumerate(group):
                t, lab, m = samples[i]
                tokens[j, : t.numel()] = t
                labels[j, : t.numel()] = lab
                mask[j, : t.numel()] = m
                attend[j, : t.numel()] = 1
            embeds = self.embed(tokens).detach().requires_grad_(grad)
            padded = bool((attend == 0).any())
            with torch.set_grad_enabled(grad):
                extra = {"output_router_logits": True} if router else {}
                output = self.model(inputs_embeds=embeds, attention_mask=attend if padded else None, **extra)
                hidden = output.last_hidden_state
                if keep_hidden:
                    for j, i in enumerate(group):
                        kept_hidden[i] = hidden[j, : samples[i][0].numel()].detach()
                if router:
                    per_layer = [x.reshape(len(group), width, -1) for x in output.router_logits]
                    for j, i in enumerate(group):
                        keep = attend[j] != 0
                        if (
                            real_lengths is not None
                        ):  # the sample's own tokens, its alignment padding left out
                            keep = keep & (torch.arange(width) < int(real_lengths[i]))
                        stats[i] = router_stats(tuple(x[j] for x in per_layer), keep, top_k=top_k)
                per_token = token_losses(
                    hidden.reshape(-1, hidden.size(-1)), labels.flatten(), mask.flatten(), self.head
                ).view(len(group), width)
                sample_losses = per_token.sum(dim=1)
            if not grad:
                losses[group] = sample_losses.detach()
                continue
            w = weights[group]
            grads = torch.autograd.grad((sample_losses * w).sum(), [embeds, *self.params], allow_unused=True)
            for j, i in enumerate(group):
                losses[i] = sample_losses[j].detach()
                embed_grads[i] = grads[0][j, : samples[i][0].numel()].detach()
            for acc, g in zip(param_grads, grads[1:], strict=True):
                if g is not None:
                    acc += g
        return Reference(
            losses=losses,
            param_grads=param_grads,
            embed_grads=embed_grads,
            router=stats if router else None,
            hidden=kept_hidden if keep_hidden else None,
        )

    def in_batch(self, samples: Sequence[tuple[torch.Tensor, ...]]) -> torch.Tensor:
        """Per-sample losses of the samples packed in-batch (MBS = number of samples)."""
        from longpack.runtime.in_batch import pack_right_padded_batch

        width = max(s[0].numel() for s in samples)
        n = len(samples)
        batch: dict[str, Any] = {
            "tokens": torch.zeros(n, width, dtype=torch.int64),
            "labels": torch.full((n, width), -100, dtype=torch.int64),
            "loss_mask": torch.zeros(n, width, dtype=torch.int64),
            "position_ids": torch.arange(width).repeat(n, 1),
            "attention_mask": torch.zeros(n, width, dtype=torch.int64),
        }
        for j, (t, lab, m) in enumerate(samples):
            batch["tokens"][j, : t.numel()] = t
            batch["labels"][j, : t.numel()] = lab
            batch["loss_mask"][j, : t.numel()] = m
            batch["attention_mask"][j, : t.numel()] = 1
        packed = pack_right_padded_batch(
            batch, pad_to_multiple_of=self.in_batch_multiple, emit_padding_mask=True
        )
        total = int(packed["total_tokens"])
        layout = token_layout(
            packed["cu_seqlens_q"], total, cu_seqlens_padded=packed.get("cu_seqlens_q_padded")
        )
        multiple = self.in_batch_multiple
        spans = np.concatenate([[0], np.cumsum([align_up(s[0].numel(), multiple) for s in samples])])
        with torch.no_grad():
            embeds = self.embed(packed["tokens"])
            hidden = run_thd(self.model, embeds, packed["position_ids"][0], attention_plan(layout))
            per_token = token_losses(hidden, packed["labels"][0], packed["loss_mask"][0], self.head)
        return torch.stack([per_token[int(a) : int(b)].sum() for a, b in itertools.pairwise(spans)])

    # -- one row ---------------------------------------------------------------------------------------
    def verify(
        self, row: Mapping[str, Any], where: dict[str, Any], index: int, *, in_batch: bool = True
    ) -> RowReport:
        """All single-process checks of one row (the in-batch one if ``in_batch``); ``where``: ``split``,
        ``file``, ``row`` (in the file); ``index``: the row's number in its split (seeds its weights)."""
        where = {**where, "rank": "single process"}
        spans = expected_spans(row)
        batch = apply_fault(self.collate([row]), self.fault, spans)
        tokens, labels = batch["tokens"][0], batch["labels"][0]
        loss_mask, positions = batch["loss_mask"][0], batch["position_ids"][0]
        width = tokens.numel()
        failures = metadata_failures(batch, spans, positions, where)
        padding = batch["padding_mask"][0]
        supervised_pad = (padding & (loss_mask != 0)).nonzero().flatten()
        if supervised_pad.numel():
            first = int(supervised_pad[0])
            sample = int(np.searchsorted(spans, first, side="right") - 1)
            failures.append(
                Failure(
                    check="padding",
                    sample=sample if sample < spans.size - 1 else None,
                    detail=f"{supervised_pad.numel()} padding token(s) carry loss (first: token {first} of the "
                    "row); attention never reaches them",
                    **where,
                )
            )
        samples = self.samples(row)
        weights = self.weights(len(samples), index)
        layout = batch_layout(batch, width)
        embeds = self.embed(tokens.view(1, -1)).detach().requires_grad_(True)
        plan = attention_plan(layout)
        # The linear faults: the Gated DeltaNet (or only its convolution) sees the whole row as one sequence.
        leaked = attention_plan(token_layout([0, width], width)) if self.fault in LINEAR_FAULTS else None
        output = run_thd_outputs(
            self.model,
            embeds,
            positions,
            plan,
            linear_plan=leaked if self.fault == "linear-state-leak" else None,
            conv_plan=leaked,
            **({"output_router_logits": True} if self.routes else {}),
        )
        hidden = output.last_hidden_state[0]
        per_token = token_losses(hidden, labels, loss_mask, self.head)
        packed_losses = torch.stack([per_token[int(a) : int(b)].sum() for a, b in itertools.pairwise(spans)])
        parity = torch.arange(len(samples)) % 2
        owner = torch.full((width,), -1, dtype=torch.int64)
        for i in range(len(samples)):
            owner[int(spans[i]) : int(spans[i + 1])] = i
        # Both parities (thorough), or the row's own parity: even rows check the even samples' gradients (and
        # that they reach no odd sample), odd rows the odd ones; one backward pass per row instead of two.
        wanted = (0, 1) if self.thorough else (index % 2 if len(samples) > 1 else 0,)
        grads_by_parity: list[Any] = [None, None]
        for p in wanted:
            chosen = parity == p
            objective = (packed_losses * weights * chosen).sum()
            grads = torch.autograd.grad(
                objective, [embeds, *self.params], retain_graph=p != wanted[-1], allow_unused=True
            )
            grads_by_parity[p] = grads
        real_lengths = [int((layout.real & (owner == i)).sum()) for i in range(len(samples))]
        ref = self.reference(
            samples,
            weights,
            with_grad=[int(q) in wanted for q in parity.tolist()],
            router=self.routes,
            real_lengths=real_lengths,
            keep_hidden=self.mtp is not None,
        )
        router_diff, router_padding = 0.0, 0
        if self.routes:
            assert ref.router is not None
            router_diff, router_padding, found = self.router_failures(
                output.router_logits, layout.real & ~padding.to(torch.bool), owner, ref.router, where
            )
            failures += found
        mtp_diff, mtp_leak = 0.0, 0.0
        if self.mtp is not None:
            mtp_diff, mtp_leak, found = self.mtp_failures(
                hidden.detach(), batch, layout, plan, samples, real_lengths, ref, owner, index, where
            )
            failures += found

        loss_diffs = [
            abs(float(a) - float(b)) / max(1.0, abs(float(b)))
            for a, b in zip(packed_losses.detach(), ref.losses, strict=True)
        ]
        worst = int(np.argmax(loss_diffs)) if loss_diffs else 0
        if loss_diffs and loss_diffs[worst] > TOLERANCE:
            failures.append(
                Failure(
                    check="loss",
                    sample=worst,
                    detail=f"packed loss {float(packed_losses[worst].detach()):.12g} != unpacked "
                    f"{float(ref.losses[worst]):.12g} (relative difference {loss_diffs[worst]:.2e})",
                    **where,
                )
            )
        param_diff = 0.0
        embed_diff = 0.0
        leak = 0.0
        leak_sample: int | None = None
        summed = []
        for j in range(len(self.params)):
            parts = [g[j + 1] for g in grads_by_parity if g is not None and g[j + 1] is not None]
            summed.append(sum(parts) if parts else torch.zeros_like(self.params[j]))
        param_diff = max((_rel(a, b) for a, b in zip(summed, ref.param_grads, strict=True)), default=0.0)
        for p, grads in enumerate(grads_by_parity):
            if grads is None:
                continue
            g_embed = grads[0][0]  # [T, hidden]
            foreign = (owner >= 0) & (parity[owner.clamp(min=0)] != p) | (owner < 0)
            if bool(foreign.any()):
                size = float(g_embed[foreign].abs().max())
                if size > leak:
                    leak = size
                    bad = (g_embed.abs().amax(dim=1) > 0) & foreign
                    hit = int(bad.nonzero()[0]) if bool(bad.any()) else -1
                    leak_sample = int(owner[hit]) if hit >= 0 else None
            for i in range(p, len(samples), 2):
                n = samples[i][0].numel()
                got = g_embed[int(spans[i]) : int(spans[i]) + n]
                d = _rel(got, ref.embed_grads[i])
                if d > embed_diff:
                    embed_diff = d
                    if d > TOLERANCE:
                        failures.append(
                            Failure(
                                check="gradients",
                                sample=i,
                                detail=f"input-embedding gradient differs from unpacked (relative {d:.2e})",
                                **where,
                            )
                        )
        if param_diff > TOLERANCE:
            failures.append(
                Failure(
                    check="gradients",
                    sample=None,
                    detail=f"parameter gradients differ from unpacked (relative {param_diff:.2e})",
                    **where,
                )
            )
        if leak > 0.0:
            failures.append(
                Failure(
                    check="isolation",
                    sample=leak_sample,
                    detail=f"another sample's loss has a gradient of up to {leak:.2e} w.r.t. this sample's "
                    "input embeddings (attention or a linear-attention state crosses a sample boundary)",
                    **where,
                )
            )
        in_batch_diff = 0.0
        if in_batch and len(samples) > 1:
            got = self.in_batch(samples)
            diffs = (got - ref.losses).abs() / ref.losses.abs().clamp(min=1.0)
            in_batch_diff = float(diffs.max())
            if in_batch_diff > TOLERANCE:
                failures.append(
                    Failure(
                        check="in-batch",
                        sample=int(diffs.argmax()),
                        detail=f"in-batch packed loss differs from unpacked (relative {in_batch_diff:.2e})",
                        **where,
                    )
                )
        kept: list[Failure] = []
        for failure in failures:  # the first failure of each check, in order
            if all(k.check != failure.check for k in kept):
                kept.append(failure)
        return RowReport(
            split=where["split"],
            file=where["file"],
            row=where["row"],
            index=index,
            tokens=int(spans[-1]),
            samples=len(samples),
            loss_max_rel_diff=max(loss_diffs, default=0.0),
            grad_max_rel_diff=param_diff,
            embedding_grad_max_rel_diff=embed_diff,
            leak_max_abs=leak,
            padding_loss_tokens=int(supervised_pad.numel()),
            in_batch_max_rel_diff=in_batch_diff,
            failures=tuple(kept),
            router_max_rel_diff=router_diff,
            router_padding_tokens=router_padding,
            mtp_loss_max_rel_diff=mtp_diff,
            mtp_leak_max_abs=mtp_leak,
        )

    def mtp_failures(
        self,
        hidden: torch.Tensor,
        batch: Mapping[str, Any],
        layout: TokenLayout,
        plan: AttentionPlan,
        samples: Sequence[tuple[torch.Tensor, ...]],
        real_lengths: Sequence[int],
        ref: Reference,
        owner: torch.Tensor,
        index: int,
        where: dict[str, Any],
    ) -> tuple[float, float, list[Failure]]:
        """The ``mtp`` check (see :data:`CHECKS`): the rolled inputs, per-sample MTP losses and isolation."""
        assert self.mtp is not None and ref.hidden is not None
        out: list[Failure] = []
        tokens, labels = batch["tokens"][0], batch["labels"][0]
        loss_mask, positions = batch["loss_mask"][0], batch["position_ids"][0]
        seq = torch.where(layout.real, layout.seq_id, torch.full_like(layout.seq_id, -1))
        roll = roll_global if self.fault == "mtp-global-roll" else (lambda v: roll_per_sequence(v, seq))
        rolled = {"input token": roll(tokens), "label": roll(labels), "loss mask": roll(loss_mask)}
        for i, (t, lab, m) in enumerate(samples):
            n = int(real_lengths[i])
            mine = ((owner == i) & layout.real).nonzero().flatten()
            alone = {
                "input token": roll_alone(t[:n]),
                "label": roll_alone(lab[:n]),
                "loss mask": roll_alone(m[:n]),
            }
            for name, values in rolled.items():
                got = values[mine]
                if not torch.equal(got, alone[name].to(got.dtype)):
                    k = int((got != alone[name].to(got.dtype)).nonzero()[0])
                    out.append(
                        Failure(
                            check="mtp",
                            sample=i,
                            detail=f"MTP {name} at token {k} of the sample is {int(got[k])}, the sample's own "
                            f"roll gives {int(alone[name][k])} (rolled across a sample boundary?)",
                            **where,
                        )
                    )
                    break
        h = hidden.detach().unsqueeze(0).requires_grad_(True)
        nxt = self.embed(rolled["input token"].view(1, -1)).detach().requires_grad_(True)
        mtp_hidden = run_thd(self.mtp.layer, self.mtp.combine(h, nxt), positions, plan)
        per_token = token_losses(mtp_hidden, rolled["label"], rolled["loss mask"], self.head)
        packed = torch.zeros(len(samples), dtype=torch.float64)
        packed = packed.index_add(0, owner.clamp(min=0), per_token * (owner >= 0))
        want = torch.zeros(len(samples), dtype=torch.float64)
        with torch.no_grad():
            for i, (t, lab, m) in enumerate(samples):
                n = int(real_lengths[i])
                if n == 0:
                    continue
                x = self.mtp.combine(
                    ref.hidden[i][:n].unsqueeze(0), self.embed(roll_alone(t[:n]).view(1, -1))
                )
                alone_hidden = self.mtp.layer(inputs_embeds=x).last_hidden_state[0]
                want[i] = token_losses(alone_hidden, roll_alone(lab[:n]), roll_alone(m[:n]), self.head).sum()
        diffs = (packed.detach() - want).abs() / want.abs().clamp(min=1.0)
        worst = float(diffs.max()) if diffs.numel() else 0.0
        if worst > TOLERANCE:
            out.append(
                Failure(
                    check="mtp",
                    sample=int(diffs.argmax()),
                    detail=f"packed MTP loss {float(packed.detach()[int(diffs.argmax())]):.12g} != alone "
                    f"{float(want[int(diffs.argmax())]):.12g} (relative {worst:.2e})",
                    **where,
                )
            )
        parity = torch.arange(len(samples)) % 2
        p = index % 2 if len(samples) > 1 else 0
        objective = (packed * self.weights(len(samples), index) * (parity == p)).sum()
        leak = 0.0
        if objective.requires_grad:
            g_h, g_n = torch.autograd.grad(objective, [h, nxt])
            foreign = (owner < 0) | (parity[owner.clamp(min=0)] != p)
            if bool(foreign.any()):
                size = torch.maximum(g_h[0].abs().amax(dim=1), g_n[0].abs().amax(dim=1))[foreign]
                leak = float(size.max())
                if leak > 0.0:
                    hit = int(foreign.nonzero().flatten()[int(size.argmax())])
                    out.append(
                        Failure(
                            check="mtp",
                            sample=int(owner[hit]) if int(owner[hit]) >= 0 else None,
                            detail=f"another sample's MTP loss has a gradient of up to {leak:.2e} w.r.t. this "
                            "sample's MTP inputs",
                            **where,
                        )
                    )
        return worst, leak, out

    def router_failures(
        self,
        logits: tuple[torch.Tensor, ...],
        real: torch.Tensor,
        owner: torch.Tensor,
        alone: Sequence[RouterStats],
        where: dict[str, Any],
    ) -> tuple[float, int, list[Failure]]:
        """The ``moe`` check: per-sample and whole-row router statistics, packed vs alone (see :data:`CHECKS`);
        ``real``: the row's tokens inside ``cu_seqlens`` and not marked by ``padding_mask`` (a trailing
        padding segment of the collate is in ``cu_seqlens`` but is padding). Returns the worst relative
        difference, the padding tokens of the row and the failures."""
        top_k = int(getattr(self.model.config, "num_experts_per_tok", 1) or 1)
        out: list[Failure] = []
        worst = 0.0
        real = real.to(torch.bool)
        for i, want in enumerate(alone):
            got = router_stats(logits, real & (owner == i), top_k=top_k)
            diff = max(_rel(got.probs, want.probs), _rel(got.z, want.z))
            worst = max(worst, diff)
            if not torch.equal(got.counts, want.counts) or diff > TOLERANCE:
                out.append(
                    Failure(
                        check="moe",
                        sample=i,
                        detail=f"router statistics of the sample in the packed row differ from the sample alone "
                        f"(tokens per expert {got.counts.tolist()} vs {want.counts.tolist()}; probabilities / "
                        f"z-loss relative {diff:.2e})",
                        **where,
                    )
                )
        # What the stack counts for the row's aux losses: its real tokens (the fault: every token).
        counted = torch.ones_like(real) if self.fault == "route-padding" else real
        row = router_stats(logits, counted, top_k=top_k)
        total = alone[0]
        for stats in alone[1:]:
            total = total + stats
        lb = _rel(row.load_balancing_loss(top_k), total.load_balancing_loss(top_k))
        z = _rel(row.z_loss(), total.z_loss())
        worst = max(worst, lb, z)
        if not torch.equal(row.counts, total.counts) or max(lb, z) > TOLERANCE:
            out.append(
                Failure(
                    check="moe",
                    sample=None,
                    detail=f"the packed row's router statistics differ from the sum over its samples alone: "
                    f"{row.tokens} tokens counted vs {total.tokens}, tokens per expert (first MoE layer) "
                    f"{row.counts[0].tolist()} vs {total.counts[0].tolist()}, load-balancing loss relative "
                    f"{lb:.2e}, z-loss relative {z:.2e} (padding tokens routed into the statistics?)",
                    **where,
                )
            )
        return worst, int((~real).sum()), out
