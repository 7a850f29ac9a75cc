"""Proof that a packed DPO row gives every preference pair the loss it has alone (``longpack verify --dpo``).

A row of NeMo-Aligner's packed DPO layout (:mod:`longpack.packed.preference`) is collated as
NeMo-Aligner's ``DPOPackedDataset.global_collate_fn`` does (:func:`~longpack.packed.preference.collate_packed_dpo`),
and run as one THD sequence stream through two tiny float64 models of the family, the policy and a frozen
reference (other weights), with the attention built from the batch's ``cu_seqlens`` (cut at
``cu_seqlens_argmin``, as NeMo-Aligner's ``MegatronGPTDPOModel`` cuts it) and the batch's position ids. The
per-token log-probabilities are reduced as ``MegatronGPTDPOModel.get_reduced_masked_logps`` reduces a packed
batch (:func:`reduce_packed_logps`: split at ``cu_seqlens``, sum where the label is not ``-100``, chosen =
even sequences, rejected = odd) and turned into the DPO loss of ``loss_func`` with ``preference_loss: dpo``
(:func:`dpo_losses`: ``-logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` per pair;
NVIDIA/NeMo-Aligner@af2b3bd96ad78190f6ebfb552b9e599e313ce027, ``nemo_aligner/models/nlp/gpt/megatron_gpt_dpo_model.py``).

The same pairs run unpacked: each chosen and each rejected sequence on its own (transformers' ``sdpa``, no
THD metadata, positions from 0), labels shifted as a trainer without packing shifts them. Checks
(:data:`DPO_CHECKS`), each naming the row and the pair (its input index) that fails:

- ``dpo-metadata``: the row's ``lengths`` are its ``seq_boundaries`` steps, two per pair of ``pair_ids``;
- ``dpo-logps``: each pair's chosen and rejected log-probability sums (policy and reference) packed = alone;
- ``dpo-loss``: each pair's log-ratio ``(pi_c - ref_c) - (pi_r - ref_r)`` and DPO loss packed = alone;
- ``dpo-gradients``: the policy's parameter gradients of the row's mean DPO loss packed = alone.

Faults (:data:`~longpack.runtime.verify.DPO_FAULTS`) cross pairs as a broken stack would; each must fail.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from longpack.errors import ConfigError, InputError
from longpack.packed.preference import DPO_BETA
from longpack.runtime.attention import token_layout
from longpack.runtime.verify import DPO_FAULTS, TOLERANCE, Failure, _rel, run_thd
from longpack.runtime.verify_model import HEAD_CLASSES, attention_plan

__all__ = [
    "DPO_CHECKS",
    "DPORowReport",
    "DPOVerifier",
    "dpo_losses",
    "reduce_packed_logps",
]

#: What each DPO check proves (the certificate lists them).
DPO_CHECKS = {
    "dpo-metadata": "each row's lengths are its seq_boundaries steps, two sequences (chosen, rejected) per pair",
    "dpo-logps": "per pair, the chosen and rejected log-probability sums of the policy and of the reference "
    "model, reduced as NeMo-Aligner reduces a packed batch, packed = each sequence alone",
    "dpo-loss": "per pair, the log-ratio (pi_c - ref_c) - (pi_r - ref_r) and the DPO loss packed = alone",
    "dpo-gradients": "the policy's parameter gradients of the row's mean DPO loss packed = alone",
}


def reduce_packed_logps(logps: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-sequence sums of ``logps`` where ``labels > -1``, chosen sequences first then rejected ones, as
    NeMo-Aligner's ``get_reduced_masked_logps`` reduces one packed row (``cu_seqlens`` cut at its argmin; a
    final entry past an even count is the padded tail and is left out of the split).

    >>> lp = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    >>> reduce_packed_logps(lp, torch.tensor([-100, 1, 1, 1, -100, 1]), torch.tensor([0, 1, 3, 4, 6])).tolist()
    [0.0, 8.0, 6.0, 32.0]
    """
    cu = [int(x) for x in cu_seqlens.tolist()]
    split = cu[1:-1] if len(cu) % 2 == 1 else cu[1:-2]
    mask = (labels > -1).to(logps.dtype)
    sums = [piece.sum() for piece in torch.tensor_split(logps * mask, split)]
    return torch.stack(sums[0::2] + sums[1::2])


def dpo_losses(
    policy: torch.Tensor, reference: torch.Tensor, *, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair ``(log-ratio, DPO loss)`` from sequence log-prob sums ``[chosen..., rejected...]`` of the policy
    and of the reference (NeMo-Aligner ``loss_func``, ``preference_loss: dpo``, before its mean over pairs).

    >>> d, loss = dpo_losses(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -2.0]), beta=0.5)
    >>> d.tolist(), round(float(loss[0]), 6)
    ([2.0], 0.313262)
    """
    ratios = policy - reference
    half = ratios.numel() // 2
    delta = ratios[:half] - ratios[half:]
    return delta, -F.logsigmoid(beta * delta)


@dataclass(frozen=True, kw_only=True)
class DPORowReport:
    """Figures of one checked DPO row (worst over its pairs) and its failures."""

    file: str
    row: int
    pairs: tuple[int, ...]
    tokens: int
    logps_max_rel_diff: float
    logratio_max_rel_diff: float
    loss_max_rel_diff: float
    grad_max_rel_diff: float
    failures: tuple[Failure, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.failures


def _metadata_failures(row: Mapping[str, Any], where: dict[str, Any]) -> list[Failure]:
    bounds = np.asarray(row["seq_boundaries"], dtype=np.int64)
    lengths = np.asarray(row["lengths"], dtype=np.int64)
    pairs = list(row.get("pair_ids", range(lengths.size // 2)))
    problems = []
    if (
        bounds.size < 3
        or bounds[0] != 0
        or bounds[-1] != len(row["input_ids"])
        or np.any(np.diff(bounds) < 2)
    ):
        problems.append(
            f"seq_boundaries {bounds.tolist()[:8]} do not cut the row's {len(row['input_ids'])} tokens into "
            "sequences of 2 tokens or more"
        )
    elif not np.array_equal(np.diff(bounds), lengths):
        problems.append(f"lengths {lengths.tolist()[:8]} are not the seq_boundaries steps")
    if lengths.size % 2 or lengths.size != 2 * len(pairs):
        problems.append(f"{lengths.size} sequences for {len(pairs)} pairs (two a pair: chosen, rejected)")
    if len(row["labels"]) != len(row["input_ids"]):
        problems.append(f"{len(row['labels'])} labels for {len(row['input_ids'])} input_ids")
    return [Failure(check="dpo-metadata", sample=None, detail=p, **where) for p in problems]


class DPOVerifier:
    """Checks packed DPO rows with a policy and a reference model: ``verify(row, where)`` -> :class:`DPORowReport`.

    ``seq_length``: the trainer's ``model.encoder_seq_length`` (the collate pads rows to a multiple of 16
    capped at it); ``eos_id``: the padding token; ``fault``: one of :data:`~longpack.runtime.verify.DPO_FAULTS`.
    """

    def __init__(
        self,
        policy: Any,
        reference: Any,
        *,
        seq_length: int,
        eos_id: int = 0,
        beta: float = DPO_BETA,
        seed: int = 0,
        fault: str | None = None,
    ) -> None:
        if fault is not None and fault not in DPO_FAULTS:
            raise ConfigError(
                f"with DPO rows the injected fault must be one of {', '.join(sorted(DPO_FAULTS))}, got {fault!r}",
                fields="fault",
            )
        self.policy, self.reference = policy, reference
        self.seq_length, self.eos_id, self.beta, self.fault = seq_length, eos_id, beta, fault
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.vocab = int(policy.config.vocab_size)
        hidden = int(policy.config.hidden_size)
        heads = []
        for k in (1, 2):  # a hashed-label head per model (the tiny models have no LM head of the vocabulary)
            gen = torch.Generator().manual_seed(seed + k)
            heads.append(torch.randn(hidden, HEAD_CLASSES, generator=gen, dtype=torch.float64) / hidden**0.5)
        self.heads = heads

    def _logps(self, hidden: torch.Tensor, labels: torch.Tensor, which: int) -> torch.Tensor:
        logits = torch.log_softmax(hidden @ self.heads[which], dim=-1)
        target = torch.remainder(labels.clamp(min=0), HEAD_CLASSES)
        return logits.gather(-1, target.view(-1, 1)).view(-1)

    def _packed(self, row: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence log-prob sums ``[chosen..., rejected...]`` of the policy (with grad) and the reference."""
        from longpack.packed.preference import collate_packed_dpo

        batch = collate_packed_dpo([dict(row)], eos_id=self.eos_id, seq_length=self.seq_length)
        cu = batch["cu_seqlens"][0][: int(batch["cu_seqlens_argmin"][0, 0])].astype(np.int64)
        tokens = torch.from_numpy(batch["input_ids"][0])
        labels = torch.from_numpy(batch["labels"][0])
        positions = torch.from_numpy(batch["position_ids"][0])
        width = tokens.numel()
        attend = cu
        if self.fault == "dpo-attention-across-pairs":
            attend = np.delete(cu, 2)  # pair 1's chosen sequence runs on from pair 0's rejected one
        plan = attention_plan(token_layout(attend, width))
        sums = []
        for which, model in enumerate((self.policy, self.reference)):
            with torch.set_grad_enabled(which == 0):
                embeds = model.get_input_embeddings()(tokens.view(1, -1))
                hidden = run_thd(model, embeds, positions, plan)
                sums.append(
                    reduce_packed_logps(self._logps(hidden, labels, which), labels, torch.from_numpy(cu))
                )
        if self.fault == "dpo-pairs-misaligned":  # rejected sequences read one pair late
            half = sums[0].numel() // 2
            order = torch.cat([torch.arange(half), half + torch.roll(torch.arange(half), -1)])
            sums = [s[order] for s in sums]
        return sums[0], sums[1]

    def _alone(self, row: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The same sums with every sequence run on its own (inputs = tokens[:-1], targets = labels[1:])."""
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        labs = np.asarray(row["labels"], dtype=np.int64)
        spans = list(itertools.pairwise(int(b) for b in row["seq_boundaries"]))
        out = []
        for which, model in enumerate((self.policy, self.reference)):
            per_seq = []
            with torch.set_grad_enabled(which == 0):
                for a, b in spans:
                    tokens = torch.from_numpy(ids[a : b - 1]).view(1, -1)
                    target = torch.from_numpy(labs[a + 1 : b])
                    hidden = model(inputs_embeds=model.get_input_embeddings()(tokens)).last_hidden_state[0]
                    mask = (target > -1).to(torch.float64)
                    per_seq.append((self._logps(hidden, target, which) * mask).sum())
            out.append(torch.stack(per_seq[0::2] + per_seq[1::2]))
        return out[0], out[1]

    def verify(self, row: Mapping[str, Any], where: dict[str, Any]) -> DPORowReport:
        """All checks of one row; ``where``: ``split``, ``file``, ``row`` (in the file)."""
        where = {**where, "rank": "single process"}
        failures = _metadata_failures(row, where)
        pairs = tuple(int(p) for p in row.get("pair_ids", range(len(row["lengths"]) // 2)))
        report = {"file": where["file"], "row": where["row"], "pairs": pairs, "tokens": len(row["input_ids"])}
        if failures:
            return DPORowReport(
                **report,
                logps_max_rel_diff=0.0,
                logratio_max_rel_diff=0.0,
                loss_max_rel_diff=0.0,
                grad_max_rel_diff=0.0,
                failures=tuple(failures),
            )
        top = int(np.max(row["input_ids"]))
        if top >= self.vocab:
            raise InputError(
                f"{where['file']} row {where['row']}: token id {top} >= the model's vocab_size {self.vocab}; "
                "verify with the model the pairs were tokenized for",
                fields="model",
            )
        if self.fault is not None and len(pairs) < 2:
            raise ConfigError(
                f"fault {self.fault!r} crosses pairs and {where['file']} row {where['row']} holds one pair; "
                "inject it on rows of two pairs or more (a larger pack size)",
                fields="fault",
            )
        pi_packed, ref_packed = self._packed(row)
        pi_alone, ref_alone = self._alone(row)
        delta_packed, loss_packed = dpo_losses(pi_packed, ref_packed, beta=self.beta)
        delta_alone, loss_alone = dpo_losses(pi_alone, ref_alone, beta=self.beta)
        n = len(pairs)
        logps_worst = ratio_worst = loss_worst = 0.0
        for i, pair in enumerate(pairs):
            got = torch.stack([pi_packed[i], pi_packed[n + i], ref_packed[i], ref_packed[n + i]]).detach()
            want = torch.stack([pi_alone[i], pi_alone[n + i], ref_alone[i], ref_alone[n + i]]).detach()
            d_logps = _rel(got, want)
            d_ratio = _rel(delta_packed[i].detach(), delta_alone[i].detach())
            d_loss = _rel(loss_packed[i].detach(), loss_alone[i].detach())
            logps_worst, ratio_worst = max(logps_worst, d_logps), max(ratio_worst, d_ratio)
            loss_worst = max(loss_worst, d_loss)
            if d_logps > TOLERANCE:
                failures.append(
                    Failure(
                        check="dpo-logps",
                        sample=pair,
                        detail=f"log-prob sums (policy chosen, rejected, reference chosen, rejected) packed "
                        f"{_fmt(got)} != alone {_fmt(want)} (relative {d_logps:.2e})",
                        **where,
                    )
                )
            if max(d_ratio, d_loss) > TOLERANCE:
                failures.append(
                    Failure(
                        check="dpo-loss",
                        sample=pair,
                        detail=f"log-ratio packed {float(delta_packed[i].detach()):.9g} != alone "
                        f"{float(delta_alone[i].detach()):.9g}, DPO loss {float(loss_packed[i].detach()):.9g} != "
                        f"{float(loss_alone[i].detach()):.9g} (relative {max(d_ratio, d_loss):.2e})",
                        **where,
                    )
                )
        g_packed = torch.autograd.grad(loss_packed.mean(), self.params, allow_unused=True)
        g_alone = torch.autograd.grad(loss_alone.mean(), self.params, allow_unused=True)
        grad_worst = 0.0
        for p, a, b in zip(self.params, g_packed, g_alone, strict=True):
            a = torch.zeros_like(p) if a is None else a
            b = torch.zeros_like(p) if b is None else b
            grad_worst = max(grad_worst, _rel(a, b))
        if grad_worst > TOLERANCE:
            failures.append(
                Failure(
                    check="dpo-gradients",
                    sample=None,
                    detail=f"policy parameter gradients of the row's mean DPO loss differ (relative {grad_worst:.2e})",
                    **where,
                )
            )
        return DPORowReport(
            **report,
            logps_max_rel_diff=logps_worst,
            logratio_max_rel_diff=ratio_worst,
            loss_max_rel_diff=loss_worst,
            grad_max_rel_diff=grad_worst,
            failures=tuple(failures),
        )


def _fmt(values: Sequence[float] | torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(v):.6g}" for v in values) + "]"
