"""Packed VLM batches: equal, key by key, to what Megatron-Bridge's ``build_qwen_vl_packed_batch`` builds from
the same prepared sequences; 3-D positions restart per sequence; the MoE padding mask; in-batch packed loss
equals the unpacked loss per token with the reference attention.

``bridge_packed_batch`` below is written from reading Bridge's source (``models/qwen_vl/data/collate_fn.py``
``build_qwen_vl_packed_batch`` and ``data/packing/in_batch.py`` ``build_mcore_thd_sequence_batch_from_rows``,
commit 067f987): rows concatenated with segment ``i`` taking ``ceil(L_i / m) * m`` slots, pad id 0,
labels -100, loss mask 0, positions continuing in gaps, the last segment absorbing the slack to
``sequence_length`` when fixed width, int32 offsets (padded ones only when some segment has a gap),
``max_seqlen`` = largest physical segment as a 0-d int32 tensor, ``total_tokens``, ``attention_mask=None``,
and each visual key concatenated over the sequences in order.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.runtime.attention import varlen_attention
from longpack.runtime.in_batch import (
    InBatchPackingError,
    VisualInBatchCollator,
    build_visual_thd_batch,
    packed_padding_mask,
)
from longpack.vlm import PreparedSequence, SampleRejected
from vlm_helpers import preparer, random_samples

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

BRIDGE_VISUAL_KEYS = (
    "pixel_values",
    "pixel_values_videos",
    "image_grid_thw",
    "video_grid_thw",
    "second_per_grid_ts",
)


def bridge_packed_batch(
    sequences, *, sequence_length, pad_to_multiple_of, pad_to_max_length=False, pad_token_id=0
) -> dict:
    rows = [s.row for s in sequences]
    lengths = [int(r["input_ids"].numel()) for r in rows]
    m = pad_to_multiple_of
    physical = [n if m <= 1 else -(-n // m) * m for n in lengths]
    if pad_to_max_length:
        if sum(physical) > sequence_length:
            raise ValueError(f"Packed sequence length {sum(physical)} exceeds configured sequence_length")
        physical[-1] += sequence_length - sum(physical)
    total = sum(physical)
    out = {
        "input_ids": torch.full((1, total), pad_token_id, dtype=rows[0]["input_ids"].dtype),
        "position_ids": torch.zeros((1, total), dtype=rows[0]["position_ids"].dtype),
        "attention_mask": None,
        "labels": torch.full((1, total), -100, dtype=rows[0]["labels"].dtype),
        "loss_mask": torch.zeros((1, total), dtype=rows[0]["loss_mask"].dtype),
    }
    at = 0
    for row, n, p in zip(rows, lengths, physical, strict=True):
        for key in ("input_ids", "position_ids", "labels", "loss_mask"):
            out[key][0, at : at + n] = row[key]
        last = int(row["position_ids"][-1])
        out["position_ids"][0, at + n : at + p] = torch.arange(last + 1, last + 1 + p - n)
        at += p
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out["cu_seqlens_q"] = out["cu_seqlens_kv"] = cu
    if physical != lengths:
        out["cu_seqlens_q_padded"] = out["cu_seqlens_kv_padded"] = torch.tensor(
            [0, *torch.tensor(physical).cumsum(0).tolist()], dtype=torch.int32
        )
    out["max_seqlen_q"] = out["max_seqlen_kv"] = torch.tensor(max(physical), dtype=torch.int32)
    out["total_tokens"] = total
    out["visual_inputs"] = {
        key: torch.cat([s.visual_values[key] for s in sequences if key in s.visual_values])
        for key in BRIDGE_VISUAL_KEYS
        if any(key in s.visual_values for s in sequences)
    }
    return out


def assert_same_batch(ours: dict, bridge: dict) -> None:
    extras = {"mrope_position_ids", "padding_mask"}
    assert set(ours) - extras == set(bridge)
    for key, expected in bridge.items():
        got = ours[key]
        if key == "visual_inputs":
            assert set(got) == set(expected)
            for k in expected:
                assert got[k].dtype == expected[k].dtype and torch.equal(got[k], expected[k]), k
        elif isinstance(expected, torch.Tensor):
            assert (
                got.dtype == expected.dtype and got.shape == expected.shape and torch.equal(got, expected)
            ), key
        else:
            assert got == expected, key


_PREPARED: list = []


def prepared_pool() -> list:
    if not _PREPARED:
        _PREPARED.extend(preparer().prepare(s) for s in random_samples(16, seed=21, max_images=2))
    return _PREPARED


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.integers(0, 15), min_size=1, max_size=4),
    multiple=st.sampled_from([1, 2, 4, 8, 16]),
    fixed=st.booleans(),
    slack=st.sampled_from([0, 1, 7, 16]),
)
def test_equals_bridge_key_by_key_on_real_prepared_sequences(picks, multiple, fixed, slack) -> None:
    group = [prepared_pool()[i] for i in picks]
    aligned_total = sum(-(-s.sequence_length // multiple) * multiple for s in group)
    length = aligned_total + slack * multiple if fixed else max(s.sequence_length for s in group) + slack
    kwargs = {"sequence_length": length, "pad_to_multiple_of": multiple, "pad_to_max_length": fixed}
    ours = build_visual_thd_batch(group, **kwargs)
    assert_same_batch(ours, bridge_packed_batch(group, **kwargs))
    # 3-D positions: every sequence restarts (its own index), gaps continue on each axis.
    starts = ours.get("cu_seqlens_q_padded", ours["cu_seqlens_q"]).tolist()
    rope = ours["mrope_position_ids"]
    assert rope.shape == (3, 1, ours["total_tokens"])
    for seq, start, stop in zip(group, starts, starts[1:], strict=False):
        n = seq.sequence_length
        assert torch.equal(rope[:, 0, start : start + n], seq.mrope_position_ids)
        gap = rope[:, 0, start + n : stop]
        assert torch.equal(gap, seq.mrope_position_ids[:, -1:] + torch.arange(1, stop - start - n + 1))


def synthetic(key: str, length: int, value: float) -> PreparedSequence:
    """Bridge's unit-test style prepared row: ``pixel_values`` filled with a per-sample value."""
    ids = torch.arange(1, length + 1)
    return PreparedSequence(
        key=key,
        row={
            "input_ids": ids,
            "attention_mask": torch.ones(length, dtype=torch.int64),
            "position_ids": torch.arange(length),
            "labels": torch.cat([ids[1:], torch.tensor([-100])]),
            "loss_mask": torch.ones(length),
        },
        visual_values={
            "pixel_values": torch.full((1, 4), value),
            "image_grid_thw": torch.tensor([[1, 2, 2]]),
        },
        mrope_position_ids=torch.arange(length).repeat(3, 1),
        visual_tokens=1,
    )


def test_bridge_unit_test_expectations() -> None:
    """Bridge's ``test_pack_and_batch_emit_canonical_thd_metadata_and_visual_order`` and
    ``test_native_pack_honors_fixed_final_width`` (tests/unit_tests/models/qwen_vl/data/test_energon.py)."""
    out = build_visual_thd_batch(
        [synthetic("five", 5, 5.0), synthetic("four", 4, 4.0)], sequence_length=12, pad_to_multiple_of=4
    )
    assert out["input_ids"].shape == (1, 12)
    assert out["cu_seqlens_q"].tolist() == [0, 5, 9] and out["cu_seqlens_q_padded"].tolist() == [0, 8, 12]
    assert int(out["max_seqlen_q"]) == 8 and out["total_tokens"] == 12
    assert out["labels"][0, 5:8].tolist() == [-100] * 3 and out["loss_mask"][0, 5:8].tolist() == [0.0] * 3
    assert int(out["position_ids"][0, 8]) == 0
    assert out["visual_inputs"]["pixel_values"][:, 0].tolist() == [5.0, 4.0]
    fixed = build_visual_thd_batch(
        [synthetic("four", 4, 1.0)], sequence_length=12, pad_to_multiple_of=4, pad_to_max_length=True
    )
    assert fixed["cu_seqlens_q"].tolist() == [0, 4] and fixed["cu_seqlens_q_padded"].tolist() == [0, 12]
    assert int(fixed["max_seqlen_q"]) == 12 and fixed["total_tokens"] == 12
    assert fixed["labels"][0, 4:].tolist() == [-100] * 8
    with pytest.raises(
        InBatchPackingError, match="Packed sequence length 24 exceeds configured sequence_length 12"
    ):
        build_visual_thd_batch(
            [synthetic("a", 9, 1.0), synthetic("b", 9, 1.0)],
            sequence_length=12,
            pad_to_multiple_of=4,
            pad_to_max_length=True,
        )


def reference_padding_mask(cu, cu_padded, total):
    """Bridge's ``_get_packed_seq_padding_mask`` rule, as read: token t is valid iff it lies in physical
    segment i at an offset below the logical length L_i; the mask is ~valid (True = padding)."""
    valid = torch.zeros(total, dtype=torch.bool)
    for i in range(len(cu) - 1):
        start, n = int(cu_padded[i]), int(cu[i + 1] - cu[i])
        valid[start : start + n] = True
    return ~valid


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    gaps=st.lists(st.integers(0, 5), min_size=6, max_size=6),
    tail=st.integers(0, 4),
)
def test_padding_mask_marks_gaps_and_tail(lengths, gaps, tail) -> None:
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    physical = [n + g for n, g in zip(lengths, gaps, strict=False)]
    cu_padded = torch.tensor([0, *torch.tensor(physical).cumsum(0).tolist()])
    total = int(cu_padded[-1]) + tail
    mask = packed_padding_mask(cu, cu_padded, total)
    expected = reference_padding_mask(cu, cu_padded, total)
    if not expected.any():
        assert mask is None
    else:
        assert torch.equal(mask[0], expected)


def test_padding_mask_rejects_inconsistent_offsets() -> None:
    with pytest.raises(InBatchPackingError, match="no physical length may be shorter"):
        packed_padding_mask(torch.tensor([0, 5]), torch.tensor([0, 4]), 8)
    with pytest.raises(InBatchPackingError, match="past the row's 6 tokens"):
        packed_padding_mask(torch.tensor([0, 5]), torch.tensor([0, 8]), 6)


# ---- in-batch (collate-time) packing: packed loss == unpacked loss, per token -----------------------------


def mrope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with the head dim split in three sections rotated by the t/h/w positions."""
    dim = x.size(-1)
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=x.dtype) / dim))
    section = torch.arange(dim // 2) % 3  # which axis drives each frequency
    angles = positions.to(x.dtype)[section].T * inv  # [T, dim/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class TinyVLM(torch.nn.Module):
    """Token embeddings with each image's merged patches projected into its pad positions, 3-D rope,
    attention through the reference ``varlen_attention``."""

    def __init__(self, vocab=997, dim=16, heads=2, patch_dim=1176 * 4, image_token=151655):
        super().__init__()
        self.heads, self.vocab, self.image_token = heads, vocab, image_token
        self.embed = torch.nn.Embedding(vocab, dim)
        self.vision = torch.nn.Linear(patch_dim, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids, positions, pixel_values, cu, cu_padded=None):
        x = self.embed(ids % self.vocab)
        at = ids == self.image_token
        if pixel_values is not None and at.any():
            merged = pixel_values.to(x.dtype).reshape(-1, 4 * pixel_values.size(-1))  # merge 2x2 patches
            x = x.clone()
            x[at] = self.vision(merged)
        t = ids.numel()
        q, k, v = self.qkv(x).view(t, 3, self.heads, -1).unbind(1)
        att = varlen_attention(mrope(q, positions), mrope(k, positions), v, cu, cu_seqlens_padded=cu_padded)
        return self.head(x + self.proj(att.reshape(t, -1)))


def per_token_loss(model, ids, labels, loss_mask, positions, pixels, cu, cu_padded=None):
    logits = model(ids, positions, pixels, cu, cu_padded)
    ce = torch.nn.functional.cross_entropy(
        logits, (labels % model.vocab).where(labels >= 0, 0), reduction="none"
    )
    return ce * loss_mask.to(ce.dtype)


@pytest.mark.parametrize("multiple", [1, 4])
def test_in_batch_packed_loss_equals_unpacked_per_token(multiple: int) -> None:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = TinyVLM().double()
    prep = preparer()
    samples = random_samples(3, seed=8, max_images=2)
    collate = VisualInBatchCollator(prep.prepare, sequence_length=4096, pad_to_multiple_of=multiple)
    batch = collate(samples)  # MBS 3 -> one THD row
    assert batch["sample_keys"] == [s["__key__"] for s in samples] and batch["skipped"] == []
    cu, cu_padded = batch["cu_seqlens_q"], batch.get("cu_seqlens_q_padded")
    packed = per_token_loss(
        model, batch["input_ids"][0], batch["labels"][0], batch["loss_mask"][0], batch["mrope_position_ids"][:, 0],
        batch["visual_inputs"].get("pixel_values"), cu, cu_padded,
    )  # fmt: skip
    packed.sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    physical = (cu_padded if cu_padded is not None else cu).tolist()
    total = torch.zeros((), dtype=torch.float64)
    for i, sample in enumerate(samples):
        seq = prep.prepare(sample)
        n = seq.sequence_length
        alone = per_token_loss(
            model, seq.row["input_ids"], seq.row["labels"], seq.row["loss_mask"], seq.mrope_position_ids,
            seq.visual_values.get("pixel_values"), [0, n],
        )  # fmt: skip
        torch.testing.assert_close(packed[physical[i] : physical[i] + n], alone, rtol=0, atol=1e-12)
        total = total + alone.sum()
    total.backward()
    for packed_grad, param in zip(packed_grads, model.parameters(), strict=True):
        torch.testing.assert_close(packed_grad, param.grad, rtol=0, atol=1e-10)
    if multiple > 1 and "padding_mask" in batch:
        assert batch["loss_mask"][0][batch["padding_mask"][0]].abs().sum() == 0  # gaps never train


def test_collator_lists_refused_samples_and_refuses_an_empty_batch() -> None:
    samples = random_samples(3, seed=9, max_images=1)

    def prepare(sample):
        if sample["__key__"] == "s00001":
            raise SampleRejected("s00001", "visual_tokens", "999 visual tokens > max_visual_tokens=10")
        return preparer().prepare(sample)

    batch = VisualInBatchCollator(prepare, sequence_length=4096)(samples)
    assert batch["sample_keys"] == ["s00000", "s00002"]
    assert batch["skipped"] == [
        {
            "key": "s00001",
            "reason": "visual_tokens",
            "message": "sample s00001: 999 visual tokens > max_visual_tokens=10",
        }
    ]
    lengths = [preparer().prepare(s).sequence_length for s in samples]
    limit = sorted(lengths)[1]  # some samples fit, the longest does not
    short = VisualInBatchCollator(preparer().prepare, sequence_length=limit)(samples)
    assert short["sample_keys"] == [s["__key__"] for s, n in zip(samples, lengths, strict=True) if n <= limit]
    assert [r["reason"] for r in short["skipped"]] == ["too_long"] * sum(n > limit for n in lengths) != []
    with pytest.raises(
        InBatchPackingError, match="every sample of this micro-batch was refused: sample s00001"
    ):
        VisualInBatchCollator(prepare, sequence_length=4096)([samples[1]])
