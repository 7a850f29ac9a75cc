"""CP partitioning (docs/reference/thd-batch.md#cp-split): TransformerEngine's own index vectors, the RoPE
positions rule and the behaviours Megatron-Bridge's ``test_gpt_step.py`` asserts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.runtime.collate import collate_packed
from longpack.runtime.context_parallel import (
    ContextParallelError,
    check_thd_alignment,
    physical_cu_seqlens,
    shard_batch,
    thd_local_positions,
    thd_partition_indices,
    zigzag_indices,
)
from longpack.runtime.in_batch import pack_right_padded_batch


def r(a, b):
    return list(range(a, b))


def test_zigzag_vectors_d3():
    assert zigzag_indices(16, 2, 0).tolist() == r(0, 4) + r(12, 16)
    assert zigzag_indices(16, 2, 1).tolist() == r(4, 12)
    expected = {
        0: r(0, 4) + r(28, 32),
        1: r(4, 8) + r(24, 28),
        2: r(8, 12) + r(20, 24),
        3: r(12, 16) + r(16, 20),
    }
    for rank, idx in expected.items():
        assert zigzag_indices(32, 4, rank).tolist() == idx
    # D.7: hierarchical CP keeps the cp=4 zigzag.
    assert [zigzag_indices(16, 4, k).tolist() for k in range(4)] == [
        [0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]
    ]  # fmt: skip


def test_zigzag_indivisible():
    with pytest.raises(ContextParallelError, match="not divisible by 2\\*cp_size=4"):
        zigzag_indices(10, 2, 0)


def test_thd_vectors_d4():
    assert thd_partition_indices([0, 8, 16], 16, cp_size=2, cp_rank=0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert thd_partition_indices([0, 8, 16], 16, cp_size=2, cp_rank=1).tolist() == [
        2,
        3,
        4,
        5,
        10,
        11,
        12,
        13,
    ]
    assert thd_partition_indices([0, 8, 12], 12, cp_size=2, cp_rank=0).tolist() == [0, 1, 6, 7, 8, 11]
    assert thd_partition_indices([0, 8, 12], 12, cp_size=2, cp_rank=1).tolist() == [2, 3, 4, 5, 9, 10]
    assert thd_partition_indices(
        torch.tensor([[0, 8, 16]], dtype=torch.int32), 16, cp_size=1, cp_rank=0
    ).tolist() == r(0, 16)


def test_thd_errors_name_the_sequence():
    with pytest.raises(
        ContextParallelError, match="sequence 1 has padded length 6, not a multiple of 2\\*cp_size=4"
    ):
        thd_partition_indices([0, 8, 14, 16], 16, cp_size=2, cp_rank=0)
    with pytest.raises(ContextParallelError, match="tokens after the last boundary"):
        thd_partition_indices([0, 8], 16, cp_size=2, cp_rank=0)  # tokens past the last offset: an error
    with pytest.raises(ContextParallelError, match="cp_rank"):
        thd_partition_indices([0, 8], 8, cp_size=2, cp_rank=2)


def _segments(draw, cp):
    m = 2 * cp
    return [draw(st.integers(0, 5)) * m for _ in range(draw(st.integers(1, 6)))]


@settings(max_examples=80, deadline=None)
@given(st.data(), st.sampled_from([1, 2, 3, 4, 8]))
def test_thd_partition_is_exact_permutation_and_per_segment_zigzag(data, cp):
    lengths = _segments(data.draw, cp)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    total = cu[-1]
    shards = [thd_partition_indices(cu, total, cp_size=cp, cp_rank=k) for k in range(cp)]
    assert all(s.numel() == total // cp for s in shards)
    assert sorted(torch.cat(shards).tolist()) == r(0, total)
    for k, shard in enumerate(shards):
        expected = []
        for start, n in zip(cu, lengths, strict=False):
            if n:
                expected += (zigzag_indices(n, cp, k) + start).tolist()
        assert shard.tolist() == expected
        # D.6: positions recomputed from the local stream equal the selected global positions.
        positions = (
            torch.cat([torch.arange(n) for n in lengths]) if total else torch.zeros(0, dtype=torch.long)
        )
        assert thd_local_positions(cu, cp_size=cp, cp_rank=k).tolist() == positions[shard].tolist()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(0, 6))
def test_zigzag_partitions_bshd(cp, chunks):
    seq = 2 * cp * chunks
    shards = [zigzag_indices(seq, cp, k) for k in range(cp)]
    assert sorted(torch.cat(shards).tolist()) == r(0, seq)


def test_shard_batch_offline_collate_slices_every_token_tensor():
    # Two samples, CP=2 -> pad_seq_to_mult=4, fixed width 12 (trailing pseudo-segment of 4).
    row = {
        "input_ids": [10, 11, 12, 2, 2, 20, 21, 2, 2, 2],
        "loss_mask": [1] * 10,
        "seq_boundaries": [0, 5, 10],
    }
    batch = collate_packed([row], max_seq_length=12, eos_id=2, pad_seq_to_mult=4, pad_to_max_length=True)
    assert batch["cu_seqlens_q_padded"].tolist() == [[0, 4, 8, 12]]
    index = thd_partition_indices([0, 4, 8, 12], 12, cp_size=2, cp_rank=1)
    shard = shard_batch(batch, 2, 1)
    for key in ("tokens", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert shard[key].shape == (1, 6)
        assert torch.equal(shard[key], batch[key][:, index])
    for key in ("cu_seqlens_q", "cu_seqlens_q_padded", "max_seqlen_q", "token_count", "attention_mask"):
        assert shard[key] is batch[key]  # metadata stays whole on every rank
    assert shard["position_ids"].tolist() == [[1, 2, 1, 2, 0, 0]]  # trailing pad positions are 0


def test_shard_batch_uses_padded_offsets_from_in_batch_packing():
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]),
        "position_ids": torch.arange(4).repeat(2, 1),
    }
    packed = pack_right_padded_batch(batch, pad_to_multiple_of=4, emit_padding_mask=True)
    packed["cu_seqlens_q"] = packed["cu_seqlens_q"].unsqueeze(0)
    packed["cu_seqlens_q_padded"] = packed["cu_seqlens_q_padded"].unsqueeze(0)
    assert physical_cu_seqlens(packed).tolist() == [0, 4, 8]
    shard = shard_batch(packed, 2, 0)
    assert shard["input_ids"].tolist() == [[1, 0, 4, 0]]
    assert shard["padding_mask"].tolist() == [[False, True, False, True]]


def test_shard_batch_rejects_mbs_over_one():
    batch = {
        "tokens": torch.zeros(2, 8, dtype=torch.long),
        "cu_seqlens_q": torch.tensor([[0, 4, 8], [0, 3, 8]]),
    }
    with pytest.raises(ContextParallelError, match="expect micro-batch size 1"):
        shard_batch(batch, 2, 0)
    legacy = {
        "tokens": torch.zeros(2, 8, dtype=torch.long),
        "cu_seqlens": torch.tensor([[0, 4, 8], [0, 3, 8]]),
    }
    with pytest.raises(ContextParallelError, match="expect micro-batch size 1"):
        shard_batch(legacy, 2, 0)


def test_shard_batch_legacy_keys_trim_at_minus_one():
    batch = {"tokens": torch.arange(8).view(1, 8), "cu_seqlens": torch.tensor([[0, 4, 6, 8, -1, -1]]),
             "cu_seqlens_argmin": torch.tensor([[4]]), "max_seqlen": torch.tensor([[4]]), "attention_mask": None}  # fmt: skip
    with pytest.raises(ContextParallelError, match="sequence 1 has padded length 2"):
        shard_batch(batch, 2, 0)
    batch["cu_seqlens"] = torch.tensor([[0, 4, 8, -1]])
    del batch["cu_seqlens_argmin"]
    out = shard_batch(batch, 2, 0)
    assert out["tokens"].tolist() == [[0, 3, 4, 7]] and out["attention_mask"] is None


def test_shard_batch_bshd_zigzag_splits_query_axis_of_mask():
    batch = {
        "tokens": torch.arange(16).view(1, 16),
        "attention_mask": torch.ones(1, 1, 16, 16, dtype=torch.bool),
    }
    out = shard_batch(batch, 2, 0)
    assert out["tokens"].tolist() == [r(0, 4) + r(12, 16)]
    assert out["attention_mask"].shape == (1, 1, 8, 16)


def test_shard_batch_rejects_odd_token_tensor_and_keeps_input():
    batch = {
        "tokens": torch.arange(8).view(1, 8),
        "cu_seqlens_q": torch.tensor([[0, 8]]),
        "weird": torch.zeros(1, 3),
    }
    with pytest.raises(ContextParallelError, match="batch\\['weird'\\] has shape"):
        shard_batch(batch, 2, 0)
    ok = {"tokens": torch.arange(8).view(1, 8), "cu_seqlens_q": torch.tensor([[0, 8]])}
    shard_batch(ok, 2, 0)
    assert ok["tokens"].shape == (1, 8)


def test_sequence_parallel_alignment_d8():
    # CP=2, TP=4 with SP: each CP shard (T/2) must split over 4 TP ranks -> segments multiple of lcm(4, 8) = 8.
    assert check_thd_alignment([0, 8, 24], 24, cp_size=2, tp_size=4, sequence_parallel=True) == 8
    with pytest.raises(ContextParallelError, match="sequence 1 has padded length 4, not a multiple of 8"):
        check_thd_alignment([0, 8, 12, 16], 16, cp_size=2, tp_size=4, sequence_parallel=True)
    assert check_thd_alignment([0, 4, 12], 12, cp_size=2, tp_size=4, sequence_parallel=False) == 4
    for rank in range(2):  # and with the SP multiple, every rank's shard divides by TP
        assert thd_partition_indices([0, 8, 24], 24, cp_size=2, cp_rank=rank).numel() % 4 == 0
    with pytest.raises(ContextParallelError, match="end at the row width 32"):
        check_thd_alignment([0, 8, 24], 32, cp_size=2)
