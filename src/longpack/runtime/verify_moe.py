"""MoE router statistics of a packed row = the sum over its samples alone, padding left out (``longpack verify``).

A token's routing is a per-token function, so a packed row routes each real token as its sample alone does;
what packing can get wrong is the row's *statistics*: Megatron-Core computes the tokens per expert, the
load-balancing (aux) loss and the z-loss over every token of the micro-batch, and a packed THD row carries
padding tokens (per-sample alignment, ``pad_to_max_length``) that must stay out of them (Megatron-Bridge
#5470; Megatron-LM @723db5a727 passes the padding mask to the router). :func:`router_stats` takes the
router logits transformers records (``output_router_logits``) and sums, per MoE layer, over the tokens a
mask keeps: tokens per expert of the top-k choice, the routing probabilities per expert and the squared
log-sum-exp of the logits. These sums are additive over samples, and the losses follow from them:

- load balancing (Switch / Megatron-Core ``switch_load_balancing_loss_func``):
  ``E * sum_e (probs_e / N) * (tokens_e / (N * k))``;
- z-loss (ST-MoE, Megatron-Core ``z_loss_func``): ``sum logsumexp(logits)^2 / N``.

Softmax top-k routers only (:data:`ROUTER_FAMILIES`); the top-k choice is recomputed from the recorded
logits exactly as those families' routers make it.

>>> logits = (torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 1.0]], dtype=torch.float64),)
>>> stats = router_stats(logits, torch.tensor([True, False]), top_k=1)
>>> stats.counts.tolist(), stats.tokens
([[1, 0, 0]], 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MOE_FAULTS", "ROUTER_FAMILIES", "RouterStats", "router_stats", "routes"]

#: Families with a softmax top-k router whose logits transformers records (``output_router_logits``).
ROUTER_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next")
#: Faults of the router statistics -> what they model (``longpack.runtime.verify.FAULTS`` lists them too).
MOE_FAULTS = {
    "route-padding": "the router statistics (tokens per expert, load-balancing loss, z-loss) of a packed row "
    "count its padding tokens (Megatron-Bridge #5470, before Megatron-LM @723db5a727)",
}


def routes(config: Any) -> bool:
    """Whether verify checks the router statistics of this (transformers) config."""
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0
    return getattr(config, "model_type", None) in ROUTER_FAMILIES and int(experts) > 0


@dataclass(frozen=True)
class RouterStats:
    """Per MoE layer: ``counts [L, E]`` tokens per expert, ``probs [L, E]`` summed routing probabilities,
    ``z [L]`` summed squared log-sum-exp; ``tokens``: tokens counted."""

    counts: torch.Tensor
    probs: torch.Tensor
    z: torch.Tensor
    tokens: int

    def __add__(self, other: RouterStats) -> RouterStats:
        return RouterStats(
            self.counts + other.counts, self.probs + other.probs, self.z + other.z, self.tokens + other.tokens
        )

    def load_balancing_loss(self, top_k: int) -> torch.Tensor:
        """``[L]``: ``E * sum_e (probs_e / N) * (tokens_e / (N * k))``."""
        n = max(self.tokens, 1)
        experts = self.counts.size(1)
        return experts * (self.probs / n * self.counts.to(self.probs.dtype) / (n * top_k)).sum(dim=1)

    def z_loss(self) -> torch.Tensor:
        """``[L]``: mean squared log-sum-exp of the router logits."""
        return self.z / max(self.tokens, 1)


def router_stats(logits: tuple[torch.Tensor, ...], mask: torch.Tensor, *, top_k: int) -> RouterStats:
    """Sums over the tokens ``mask`` keeps of every MoE layer's ``logits [N, E]`` (softmax top-k router)."""
    counts, probs, z = [], [], []
    keep = mask.to(torch.bool).reshape(-1)
    for layer in logits:
        flat = layer.detach().reshape(-1, layer.size(-1))[keep]
        p = torch.softmax(flat, dim=-1)
        chosen = torch.topk(p, top_k, dim=-1).indices.reshape(-1)
        counts.append(torch.bincount(chosen, minlength=flat.size(1)))
        probs.append(p.sum(dim=0))
        z.append((torch.logsumexp(flat, dim=-1) ** 2).sum())
    return RouterStats(torch.stack(counts), torch.stack(probs), torch.stack(z), int(keep.sum()))
