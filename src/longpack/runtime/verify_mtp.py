"""Multi-token prediction (MTP) on packed rows for ``longpack verify``: labels roll per sequence.

Megatron-Core's MTP layer k (``megatron/core/transformer/multi_token_prediction.py``) combines the hidden state
of token ``i`` with the embedding of token ``i + k``: it rolls ``input_ids``, ``position_ids``, the labels and
the loss mask left by one (``roll_tensor``) and, for a packed batch, rolls each sequence of ``cu_seqlens``
on its own, zeroing the position that would cross into the next sequence (``_roll_tensor_packed_seq``;
Megatron-LM PRs #4494 / #4495). A global roll instead hands the last token of every sample the first token
of the next one, as input and as label.

:class:`MTPHead` is that layer for a tiny family model (depth 1): ``enorm`` / ``hnorm`` (RMSNorm), ``eh_proj``
(``2H -> H``) and one decoder layer of the family built by transformers (a one-layer model of the family, its
final norm the MTP final norm; softmax attention, packed through longpack's THD attention), with the row
verifier's loss head shared. :func:`roll_per_sequence` is the packed roll; the unpacked reference rolls the
sample alone (``torch.roll``, last position zeroed).

>>> roll_per_sequence(torch.tensor([1, 2, 3, 4, 5, 0]), torch.tensor([0, 0, 0, 1, 1, -1])).tolist()
[2, 3, 0, 5, 0, 0]
"""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["MTP_FAULTS", "MTPHead", "mtp_depth", "roll_alone", "roll_global", "roll_per_sequence"]

#: Faults of the MTP inputs -> what they model (``longpack.runtime.verify.FAULTS`` lists them too).
MTP_FAULTS = {
    "mtp-global-roll": "the MTP inputs, labels and loss mask roll over the whole packed row instead of per "
    "sequence: a sample's last token gets the next sample's first token (Megatron-LM PRs #4494 / #4495)",
}
#: Config keys that give the MTP depth (Qwen3-Next: ``mtp_num_hidden_layers``; DeepSeek-V3, GLM-4.5:
#: ``num_nextn_predict_layers``).
MTP_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")


def mtp_depth(config: Any) -> int:
    """The MTP depth a config declares (0: none)."""
    for key in MTP_KEYS:
        value = getattr(config, key, None)
        if value:
            return int(value)
    return 0


def roll_per_sequence(values: torch.Tensor, seq_id: torch.Tensor) -> torch.Tensor:
    """Left roll by one inside every sequence (``seq_id`` per token, ``-1`` outside every sequence, sequences
    contiguous): each sequence's last position and every token outside a sequence get 0."""
    out = torch.zeros_like(values)
    same = (seq_id[:-1] == seq_id[1:]) & (seq_id[:-1] >= 0)
    out[:-1] = torch.where(same, values[1:], torch.zeros_like(values[1:]))
    return out


def roll_global(values: torch.Tensor) -> torch.Tensor:
    """Left roll by one over the whole row, the last position 0 (what the fault does)."""
    out = torch.roll(values, -1, dims=0)
    out[-1] = 0
    return out


def roll_alone(values: torch.Tensor) -> torch.Tensor:
    """A sample on its own: :func:`roll_global` of the sample."""
    return roll_global(values)


class MTPHead(torch.nn.Module):
    """One MTP layer of the family ``model`` (see the module text); weights from ``seed``."""

    def __init__(self, model: Any, *, seed: int) -> None:
        super().__init__()
        from transformers import AutoModel

        from longpack.runtime.verify_model import run_in_float64

        config = copy.deepcopy(model.config)
        config.num_hidden_layers = 1
        if getattr(config, "layer_types", None):
            config.layer_types = ["full_attention"]
        hidden = int(config.hidden_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 7)
            self.enorm = torch.nn.RMSNorm(hidden, eps=1e-6, dtype=torch.float64)
            self.hnorm = torch.nn.RMSNorm(hidden, eps=1e-6, dtype=torch.float64)
            self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False, dtype=torch.float64)
            self.layer = AutoModel.from_config(config, dtype=torch.float64)
        self.layer.eval()
        self.layer.config._attn_implementation = "sdpa"
        run_in_float64(self.layer)

    def combine(self, hidden: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """``eh_proj([enorm(e_{i+1}); hnorm(h_i)])`` (Megatron-Core's ``_concat_embeddings`` order)."""
        return self.eh_proj(torch.cat([self.enorm(next_embeds), self.hnorm(hidden)], dim=-1))
