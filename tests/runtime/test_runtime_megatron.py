"""PackedSeqParams fields (docs/reference/thd-batch.md#packed-seq-params) and the behaviours Megatron-Bridge's
``test_packed_seq_utils.py`` / ``test_gpt_step.py`` assert.

``to_packed_seq_params`` against the real Megatron-Core dataclass runs inside the 2-process Megatron-Core
test in test_runtime_distributed.py (one import of megatron.core, in the ranks only).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from longpack.runtime.collate import collate_packed
from longpack.runtime.megatron import (
    logical_and_physical_offsets,
    packed_seq_params_kwargs,
    repack_thd,
    sequence_index,
    unpack_thd,
)


def test_physical_offsets():
    q, padded = torch.tensor([0, 6, 14]), torch.tensor([0, 8, 16])
    got = logical_and_physical_offsets(SimpleNamespace(cu_seqlens_q=q, cu_seqlens_q_padded=padded))
    assert got[0] is q and got[1] is padded
    got = logical_and_physical_offsets(SimpleNamespace(cu_seqlens_q=q, cu_seqlens_q_padded=None))
    assert got[0] is q and got[1] is q


def test_unpack_repack():
    rows, mask, starts, lengths = unpack_thd(
        torch.tensor([[10, 11, 0, 0, 20, 21, 22, 0]]), [0, 2, 5], [0, 4, 8]
    )
    assert rows.tolist() == [[10, 11, 0], [20, 21, 22]]
    assert mask.tolist() == [[True, True, False], [True, True, True]]
    assert starts.tolist() == [0, 4] and lengths.tolist() == [2, 3]
    positions = torch.tensor([[0, 1, 0], [0, 1, 2]])
    assert repack_thd(positions, [0, 2, 5], [0, 4, 8]).tolist() == [[0, 1, 0, 0, 0, 1, 2, 0]]


def test_current_keys_pass_through():
    batch = {
        "cu_seqlens_q": torch.tensor([0, 120, 245, 370], dtype=torch.int32),
        "cu_seqlens_q_padded": torch.tensor([0, 128, 256, 384], dtype=torch.int32),
        "max_seqlen_q": torch.tensor(128),
    }
    kw = packed_seq_params_kwargs(batch)
    assert (
        torch.equal(kw["cu_seqlens_q"], batch["cu_seqlens_q"]) and kw["cu_seqlens_kv"] is kw["cu_seqlens_q"]
    )
    assert torch.equal(kw["cu_seqlens_q_padded"], batch["cu_seqlens_q_padded"])
    assert kw["max_seqlen_q"] == 128 and isinstance(kw["max_seqlen_q"], int) and kw["max_seqlen_kv"] == 128
    assert kw["qkv_format"] == "thd"


def test_max_seqlen_must_be_one_value():
    with pytest.raises(ValueError, match="max_seqlen_q must contain exactly one value"):
        packed_seq_params_kwargs(
            {"cu_seqlens_q": torch.tensor([0, 64]), "max_seqlen_q": torch.IntTensor([64, 64])}
        )


def test_legacy_keys():
    kw = packed_seq_params_kwargs(
        {
            "cu_seqlens": torch.tensor([0, 128, 256, 384, -1, -1]),
            "cu_seqlens_argmin": torch.tensor(4),
            "max_seqlen": torch.tensor(128),
        }
    )
    assert kw["cu_seqlens_q"].tolist() == kw["cu_seqlens_kv"].tolist() == [0, 128, 256, 384]
    assert (
        kw["cu_seqlens_q_padded"] is None and kw["cu_seqlens_kv_padded"] is None and kw["max_seqlen_q"] == 128
    )
    kw = packed_seq_params_kwargs(
        {"cu_seqlens": torch.tensor([0, 128, 256, 384, -1, -1]), "cu_seqlens_argmin": torch.tensor(4),
         "cu_seqlens_unpadded": torch.tensor([0, 120, 245, 370, -1, -1]), "cu_seqlens_unpadded_argmin": torch.tensor(4)}
    )  # fmt: skip
    assert kw["cu_seqlens_q"].tolist() == [0, 120, 245, 370] and kw["cu_seqlens_q_padded"].tolist() == [
        0,
        128,
        256,
        384,
    ]
    assert kw["max_seqlen_q"] is None
    assert packed_seq_params_kwargs({"cu_seqlens": torch.tensor([0, 128, 256, -1, -1])})[
        "cu_seqlens_q"
    ].tolist() == [0, 128, 256]
    kw = packed_seq_params_kwargs(
        {
            "cu_seqlens": torch.tensor([0, 128, 256, -1]),
            "cu_seqlens_unpadded": torch.tensor([0, 120, 240, -1]),
        }
    )
    assert kw["cu_seqlens_q"].tolist() == [0, 120, 240]
    kw = packed_seq_params_kwargs(
        {
            "cu_seqlens": torch.tensor([[0, 64, 128, -1]]),
            "cu_seqlens_argmin": torch.tensor([[3]]),
            "max_seqlen": torch.tensor([[64]]),
        }
    )
    assert kw["cu_seqlens_q"].tolist() == [0, 64, 128] and kw["max_seqlen_q"] == 64
    kw = packed_seq_params_kwargs(
        {"cu_seqlens": torch.tensor([0, 512, -1]), "cu_seqlens_argmin": torch.tensor(2)}
    )
    assert kw["cu_seqlens_q"].tolist() == [0, 512] and kw["cu_seqlens_q_padded"] is None
    kw = packed_seq_params_kwargs({"cu_seqlens": torch.tensor([[[0, 5, 12, 20, -1, -1]]], dtype=torch.int64),
                                   "max_seqlen": torch.tensor([[15]])})  # fmt: skip
    assert kw["cu_seqlens_q"].tolist() == [0, 5, 12, 20] and kw["cu_seqlens_q"].dtype == torch.int64
    assert kw["max_seqlen_q"] == 15
    kw = packed_seq_params_kwargs(
        {"cu_seqlens": torch.tensor([[-1, -1]]), "cu_seqlens_argmin": torch.tensor([[0]])}
    )
    assert kw["cu_seqlens_q"].numel() == 0


def test_no_max_seqlen_and_seq_idx():
    kw = packed_seq_params_kwargs({"cu_seqlens_q": torch.tensor([0, 5, 7, 11])})
    assert kw["max_seqlen_q"] is None and kw["max_seqlen_kv"] is None and "seq_idx" not in kw
    kw = packed_seq_params_kwargs({"cu_seqlens_q": torch.tensor([0, 5, 7, 11]), "total_tokens": 16})
    assert kw["seq_idx"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]]
    assert sequence_index([0, 5, 7, 11, -1], 16).tolist() == kw["seq_idx"].tolist()


def test_collate_output_feeds_packed_seq_params():
    row = {
        "input_ids": [10, 11, 12, 2, 2, 20, 21, 2, 2, 2],
        "loss_mask": [1] * 10,
        "seq_boundaries": [0, 5, 10],
    }
    batch = collate_packed([row], max_seq_length=8, eos_id=2, pad_seq_to_mult=4)
    kw = packed_seq_params_kwargs(batch)
    assert kw["cu_seqlens_q"].tolist() == [0, 3, 5] and kw["cu_seqlens_q_padded"].tolist() == [0, 4, 8]
    assert kw["max_seqlen_q"] == 4
    legacy = collate_packed([row], max_seq_length=8, eos_id=2, pad_seq_to_mult=4, legacy_keys=True)
    kw = packed_seq_params_kwargs(legacy)
    assert kw["cu_seqlens_q"].tolist() == [0, 3, 5] and kw["cu_seqlens_q_padded"].tolist() == [0, 4, 8]
