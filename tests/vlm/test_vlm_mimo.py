"""MegatronMIMO in-batch packing (``pack_mimo_language_shard``) against a restatement of Bridge's
``megatron_mimo_step.forward_step`` packing (Bridge @a4916b8d0, ``data/megatron_mimo/sequence_pack.py``
``pack_language_shard`` with the step's ``attention_mask.sum(1)`` lengths): the shard's rows cut at their
real lengths and laid end to end; every key, dtype and shape. The same comparison against Bridge's own
function from a checkout is ``scripts/vlm_bridge_harness.py`` (``mimo`` rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.runtime.in_batch import InBatchPackingError, pack_mimo_language_shard


def mimo_shard(seed: int, *, mrope: bool = False, with_tokens: bool = True) -> dict:
    """A right-padded ``[B, S]`` shard as a MIMO collate gives it (pad 0, labels -100, loss 0)."""
    rng = np.random.default_rng(seed)
    rows, width = int(rng.integers(1, 6)), int(rng.integers(1, 40))
    lengths = rng.integers(0, width + 1, rows)
    if lengths.sum() == 0:
        lengths[0] = 1
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask, rng.integers(1, 1000, (rows, width)), 0)
    labels = np.where(mask, rng.integers(-100, 1000, (rows, width)), -100)
    loss = np.where(mask, rng.integers(0, 2, (rows, width)), 0).astype(np.float32)
    out = {
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss),
        "attention_mask": torch.from_numpy(mask).to(torch.bool if seed % 2 else torch.long),
        "modality_inputs": {"images": {"pixel_values": torch.ones(2, 3)}},
    }
    if with_tokens:
        out["input_ids"] = torch.from_numpy(ids)
    if mrope:
        out["position_ids"] = torch.from_numpy(rng.integers(0, 50, (3, rows, width)))
    else:
        out["position_ids"] = torch.arange(width).expand(rows, width).clone()
    return out


def bridge_reference(batch: dict) -> tuple[dict, dict]:
    """What Bridge's step does, restated with numpy: lengths = attention_mask ones per row; each row's first
    ``length`` entries concatenated; positions per row (``[3, 1, T]`` for MRoPE)."""
    lengths = batch["attention_mask"].to(torch.bool).sum(1).tolist()
    out = dict(batch)
    for key in ("input_ids", "labels", "loss_mask"):
        src = batch.get(key)
        if key == "input_ids" and src is None:
            continue
        out[key] = (
            None
            if src is None
            else torch.from_numpy(np.concatenate([src[i, :n].numpy() for i, n in enumerate(lengths)])[None])
        )
    pos = batch.get("position_ids")
    if pos is not None and pos.dim() == 3:
        out["position_ids"] = torch.from_numpy(
            np.concatenate([pos[:, i, :n].numpy() for i, n in enumerate(lengths)], axis=1)[:, None]
        )
    elif pos is not None:
        out["position_ids"] = torch.from_numpy(
            np.concatenate([pos[i, :n].numpy() for i, n in enumerate(lengths)])[None]
        )
    out["attention_mask"] = None
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    kwargs = {f"cu_seqlens_{a}{b}": cu for a in ("q", "kv") for b in ("", "_padded")}
    kwargs.update(max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
    return out, kwargs


def assert_same(theirs: dict, ours: dict) -> None:
    assert set(theirs) == set(ours)
    for key, value in theirs.items():
        mine = ours[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(mine, torch.Tensor), key
            assert value.dtype == mine.dtype and value.shape == mine.shape, key
            assert torch.equal(value, mine), key
        else:
            assert value == mine, key


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.booleans(), st.booleans())
def test_equals_bridge_step_packing(seed: int, mrope: bool, with_tokens: bool) -> None:
    batch = mimo_shard(seed, mrope=mrope, with_tokens=with_tokens)
    theirs, their_kwargs = bridge_reference(batch)
    ours, our_kwargs = pack_mimo_language_shard(batch)
    assert_same(theirs, ours)
    assert_same(their_kwargs, our_kwargs)
    assert ours["modality_inputs"] is batch["modality_inputs"]  # carried through unchanged


def test_golden_two_rows_mrope() -> None:
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
        "loss_mask": torch.tensor([[0.0, 1, 1, 0], [1, 1, 0, 0]]),
        "position_ids": torch.tensor([[[0, 1, 2, 3], [0, 1, 2, 3]]] * 3),
    }
    packed, kwargs = pack_mimo_language_shard(batch)
    assert packed["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert packed["loss_mask"].tolist() == [[0.0, 1, 1, 1, 1]]
    assert packed["labels"] is None
    assert packed["position_ids"].shape == (3, 1, 5)
    assert packed["position_ids"][0].tolist() == [[0, 1, 2, 0, 1]]
    assert kwargs["cu_seqlens_kv_padded"].tolist() == [0, 3, 5] and kwargs["max_seqlen_kv"] == 3


def test_explicit_lengths_override_the_mask() -> None:
    batch = mimo_shard(3)
    _packed, kwargs = pack_mimo_language_shard(batch, lengths=[1] * batch["labels"].size(0))
    assert kwargs["cu_seqlens_q"].tolist() == list(range(batch["labels"].size(0) + 1))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b.pop("attention_mask"), "attention_mask"),
        (lambda b: b.__setitem__("attention_mask", torch.ones(2, 3, 4)), "attention_mask"),
        (lambda b: b.__setitem__("attention_mask", torch.ones(2, 9)), "width 9"),
        (lambda b: b.__setitem__("attention_mask", torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])), "row 0"),
        (lambda b: b.__setitem__("attention_mask", torch.zeros(2, 4)), "length 0"),
        (lambda b: b.__setitem__("position_ids", torch.zeros(2, 2, 4)), "MRoPE"),
    ],
)
def test_refusals_name_the_cause(change, message) -> None:
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
    }
    change(batch)
    with pytest.raises(InBatchPackingError, match=message):
        pack_mimo_language_shard(batch)


def test_lengths_of_the_wrong_shape_or_too_long() -> None:
    batch = {"input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])}
    with pytest.raises(InBatchPackingError, match="2 rows"):
        pack_mimo_language_shard(batch, lengths=[1, 2, 3])
    with pytest.raises(InBatchPackingError, match="row 1: length 5"):
        pack_mimo_language_shard(batch, lengths=[1, 5])
