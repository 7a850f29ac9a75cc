"""Golden tests for in-batch THD packing (docs/reference/thd-batch.md#in-batch) and the behaviours
Megatron-Bridge's ``test_in_batch.py`` asserts."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.runtime.in_batch import InBatchPackingError, build_thd_row, pack_right_padded_batch

F, T = False, True


def right_padded(lengths, width=None, *, labels=True, loss=True, start=1):
    width = width or max(lengths)
    tokens = torch.zeros(len(lengths), width, dtype=torch.long)
    value = start
    for i, n in enumerate(lengths):
        tokens[i, :n] = torch.arange(value, value + n)
        value += n
    batch = {"input_ids": tokens, "position_ids": torch.arange(width).repeat(len(lengths), 1)}
    if labels:
        lab = torch.full_like(tokens, -100)
        for i, n in enumerate(lengths):
            lab[i, : n - 1] = tokens[i, 1:n]
        batch["labels"] = lab
    if loss:
        batch["loss_mask"] = (batch["labels"] != -100).float() if labels else (tokens != 0).float()
    return batch


def test_right_padded_m1():
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 0]]),
        "position_ids": torch.arange(5).repeat(2, 1),
    }
    out = pack_right_padded_batch(batch)
    assert out["input_ids"].shape == (1, 7)
    assert out["cu_seqlens_q"].tolist() == [0, 3, 7]
    assert int(out["max_seqlen_q"]) == 4 and out["max_seqlen_q"].dim() == 0
    assert out["attention_mask"] is None
    assert "cu_seqlens_q_padded" not in out


def test_fixed_width_rows_3_and_2():
    rows = [
        {"input_ids": torch.tensor([1, 2, 3]), "position_ids": torch.arange(3), "labels": torch.tensor([2, 3, -100]),
         "loss_mask": torch.tensor([1, 1, 0])},
        {"input_ids": torch.tensor([4, 5]), "position_ids": torch.arange(2), "labels": torch.tensor([5, -100]),
         "loss_mask": torch.tensor([1, 0])},
    ]  # fmt: skip
    out = build_thd_row(rows, sequence_length=8, pad_to_max_length=True)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0, 0, 0]]
    assert out["labels"].tolist() == [[2, 3, -100, 5, -100, -100, -100, -100]]
    assert out["loss_mask"].tolist() == [[1, 1, 0, 1, 0, 0, 0, 0]]
    assert out["cu_seqlens_q"].tolist() == [0, 3, 5]
    assert out["cu_seqlens_q_padded"].tolist() == [0, 3, 8]
    assert int(out["max_seqlen_q"]) == 5
    assert out["total_tokens"] == 8


def test_fixed_width_too_long():
    rows = [{"input_ids": torch.arange(1, 6), "position_ids": torch.arange(5)},
            {"input_ids": torch.arange(1, 5), "position_ids": torch.arange(4)}]  # fmt: skip
    with pytest.raises(
        InBatchPackingError, match="Packed sequence length 9 exceeds configured sequence_length 8"
    ):
        build_thd_row(rows, sequence_length=8, pad_to_max_length=True)
    with pytest.raises(InBatchPackingError, match="row length 5 exceeds configured sequence_length 4"):
        build_thd_row(rows, sequence_length=4)


def test_lengths_3_and_5_m2():
    out = pack_right_padded_batch(right_padded([3, 5]), pad_to_multiple_of=2)
    assert out["input_ids"].shape == (1, 10)
    assert out["cu_seqlens_q_padded"].tolist() == [0, 4, 10]
    assert out["cu_seqlens_q"].tolist() == [0, 3, 8]
    assert int(out["max_seqlen_q"]) == 6


def test_attention_mask_lengths_with_padding_mask():
    batch = right_padded([3, 2], width=4)
    batch["attention_mask"] = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = pack_right_padded_batch(batch, pad_to_multiple_of=4, emit_padding_mask=True)
    assert out["padding_mask"].tolist() == [[F, F, F, T, F, F, T, T]]
    assert out["cu_seqlens_q"].tolist() == [0, 3, 5]
    assert out["cu_seqlens_q_padded"].tolist() == [0, 4, 8]
    assert out["attention_mask"] is None


def test_stale_padding_mask_removed():
    batch = right_padded([3, 2], width=4)
    batch["padding_mask"] = torch.zeros(2, 4, dtype=torch.bool)
    batch["cu_seqlens_q_padded"] = torch.tensor([0, 1])
    out = pack_right_padded_batch(batch)
    assert out["input_ids"].shape == (1, 5)
    assert "padding_mask" not in out and "cu_seqlens_q_padded" not in out


@pytest.mark.parametrize(
    ("lengths", "cu", "physical", "width", "max_len"),
    [([2, 3], [0, 2, 5], [0, 4, 8], 8, 4), ([5], [0, 5], [0, 8], 8, 8), ([4, 4], [0, 4, 8], [0, 4, 8], 8, 4)],
)
def test_m4_offsets(lengths, cu, physical, width, max_len):
    out = pack_right_padded_batch(right_padded(lengths), pad_to_multiple_of=4)
    assert out["cu_seqlens_q"].tolist() == cu
    assert out.get("cu_seqlens_q_padded", out["cu_seqlens_q"]).tolist() == physical
    assert out["input_ids"].shape == (1, width) and int(out["max_seqlen_q"]) == max_len


def test_loss_mask_zeros_preserved():
    batch = right_padded([3])
    batch["loss_mask"] = torch.tensor([[1.0, 0.0, 1.0]])
    out = pack_right_padded_batch(batch, pad_to_multiple_of=4)
    assert out["loss_mask"].tolist() == [[1.0, 0.0, 1.0, 0.0]]


def test_positions_restart_and_continue_in_gap():
    batch = {
        "input_ids": torch.tensor([[1, 2, 0, 0], [3, 4, 5, 0]]),
        "position_ids": torch.arange(4).repeat(2, 1),
    }
    assert pack_right_padded_batch(batch)["position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    batch = {"input_ids": torch.tensor([[1, 2, 3]]), "position_ids": torch.tensor([[0, 1, 2]])}
    assert pack_right_padded_batch(batch, pad_to_multiple_of=4)["position_ids"].tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("labels", [True, False])
def test_empty_row_rejected(labels):
    batch = right_padded([3, 1], width=3, labels=labels)
    batch["input_ids"][1] = 0
    with pytest.raises(InBatchPackingError, match="Cannot pack a batch containing an empty sequence row"):
        pack_right_padded_batch(batch)


def test_not_right_padded_rejected():
    batch = {"input_ids": torch.tensor([[0, 1, 2]]), "position_ids": torch.tensor([[0, 1, 2]])}
    with pytest.raises(InBatchPackingError, match="right-padded"):
        pack_right_padded_batch(batch)


def test_dtypes_preserved():
    out = pack_right_padded_batch(right_padded([3, 2]), pad_to_multiple_of=2)
    assert out["input_ids"].dtype == torch.long and out["labels"].dtype == torch.long
    assert out["position_ids"].dtype == torch.long and out["loss_mask"].dtype == torch.float32
    assert out["cu_seqlens_q"].dtype == torch.int32 and out["cu_seqlens_q_padded"].dtype == torch.int32
    assert out["max_seqlen_q"].dtype == torch.int32


def test_labels_and_loss_none_stay_none():
    batch = {"input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]]), "position_ids": torch.arange(4).repeat(2, 1),
             "labels": None, "loss_mask": None}  # fmt: skip
    out = pack_right_padded_batch(batch)
    assert out["labels"] is None and out["loss_mask"] is None
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]]),
        "position_ids": torch.arange(5).repeat(2, 1),
    }
    out = pack_right_padded_batch(batch, pad_to_multiple_of=4)
    assert out["input_ids"].shape == (1, 12)
    assert out["cu_seqlens_q_padded"].tolist() == [0, 4, 12] and int(out["max_seqlen_q"]) == 8


def test_tokens_key_autodetected_and_both_keys_written():
    batch = right_padded([2, 3])
    batch["tokens"] = batch["input_ids"].clone()
    out = pack_right_padded_batch(batch)
    assert out["tokens"].tolist() == out["input_ids"].tolist() == [[1, 2, 3, 4, 5]]


def test_extras_padded_with_their_value_and_reserved_keys_rejected():
    batch = right_padded([1, 2])
    batch["token_type"] = torch.tensor([[7, 0], [8, 9]])
    out = pack_right_padded_batch(batch, pad_to_multiple_of=2, sequence_tensor_pad_values={"token_type": -1})
    assert out["token_type"].tolist() == [[7, -1, 8, 9]]
    with pytest.raises(InBatchPackingError, match="built-in keys"):
        pack_right_padded_batch(right_padded([1, 2]), sequence_tensor_pad_values={"labels": 0})


def test_attention_mask_in_rows_must_be_all_true():
    rows = [
        {
            "input_ids": torch.tensor([1, 2]),
            "position_ids": torch.arange(2),
            "attention_mask": torch.tensor([1, 0]),
        }
    ]
    with pytest.raises(InBatchPackingError, match="unpadded input rows"):
        build_thd_row(rows)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=6), st.sampled_from([1, 2, 4, 8]), st.booleans())
def test_properties(lengths, m, emit):
    width = max(lengths) + 1
    out = pack_right_padded_batch(
        right_padded(lengths, width=width), pad_to_multiple_of=m, emit_padding_mask=emit
    )
    physical = out.get("cu_seqlens_q_padded", out["cu_seqlens_q"]).tolist()
    cu = out["cu_seqlens_q"].tolist()
    assert [b - a for a, b in itertools.pairwise(cu)] == lengths
    assert all(
        (b - a) % m == 0 and b - a >= n for a, b, n in zip(physical, physical[1:], lengths, strict=False)
    )
    assert physical[-1] == out["input_ids"].shape[1] == out["total_tokens"]
    positions = out["position_ids"][0].tolist()
    for a, b in itertools.pairwise(physical):
        assert positions[a:b] == list(range(b - a))  # restart per sequence, continue through the gap
    assert ("cu_seqlens_q_padded" in out) == any(n % m for n in lengths)
    if emit:
        assert int((~out["padding_mask"]).sum()) == sum(lengths)
    real = [t for t in out["input_ids"][0].tolist() if t != 0]
    assert real == list(range(1, sum(lengths) + 1))
