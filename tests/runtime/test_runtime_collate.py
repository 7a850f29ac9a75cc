"""Golden tests for collate_packed: the worked examples of docs/reference/thd-batch.md#collate, the legacy
keys and the behaviours Megatron-Bridge's packed-dataset unit tests assert."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.runtime.collate import CollateError, PackedCollator, collate_packed

F, T = False, True
E = 2


def test_worked_example_a_fixed_width():
    # p1,p2,c1,c2,E | q1,d1,E ; rolled loss mask [0,1,1,1,0, 1,1,0]
    row = {
        "input_ids": [31, 32, 41, 42, E, 51, 61, E],
        "loss_mask": [0, 1, 1, 1, 0, 1, 1, 0],
        "seq_start_id": [0, 5],
    }
    b = collate_packed([row], max_seq_length=8, eos_id=E, pad_to_max_length=True)
    assert b["tokens"].tolist() == [[31, 32, 41, 42, 51, 61, E, E]]
    assert b["labels"].tolist() == [[32, 41, 42, E, 61, E, E, E]]
    assert b["loss_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 0, 0]]
    assert b["cu_seqlens_q"].tolist() == [[0, 4, 6, 8]]
    assert b["max_seqlen_q"].tolist() == [[4]]
    assert b["padding_mask"].tolist() == [[F, F, F, F, F, F, T, T]]
    assert b["token_count"] == [6]
    assert b["attention_mask"] is None
    assert b["cu_seqlens_kv"] is b["cu_seqlens_q"]
    assert "cu_seqlens_q_padded" not in b
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert b[key].dtype == torch.int64
    assert b["cu_seqlens_q"].dtype == torch.int32 and b["max_seqlen_q"].dtype == torch.int32
    assert b["padding_mask"].dtype == torch.bool


def test_worked_example_b_logical_vs_physical():
    row = {
        "input_ids": [10, 11, 12, 2, 2, 20, 21, 2, 2, 2],
        "loss_mask": [1] * 10,
        "seq_boundaries": [0, 5, 10],
    }
    b = collate_packed([row], max_seq_length=8, eos_id=2, pad_seq_to_mult=4)
    assert b["tokens"].tolist() == [[10, 11, 12, 2, 20, 21, 2, 2]]
    assert b["cu_seqlens_q"].tolist() == [[0, 3, 5]]
    assert b["cu_seqlens_q_padded"].tolist() == [[0, 4, 8]]
    assert b["cu_seqlens_kv_padded"] is b["cu_seqlens_q_padded"]
    assert b["padding_mask"].tolist() == [[F, F, F, T, F, F, T, T]]
    assert b["max_seqlen_q"].tolist() == [[4]]


def test_gpt_sft_two_rows_ragged_equalization():
    rows = [
        {"input_ids": list(range(3, 11)), "loss_mask": [1] * 8, "seq_boundaries": [0, 4, 8]},
        {"input_ids": list(range(3, 11)), "loss_mask": [1] * 8, "seq_boundaries": [0, 8]},
    ]
    b = collate_packed(rows, max_seq_length=8, eos_id=E, pad_seq_length_to_mult=1)
    assert b["cu_seqlens_q"].tolist() == [[0, 3, 6, 7], [0, 7, 7, 7]]
    assert b["cu_seqlens_kv"].tolist() == [[0, 3, 6, 7], [0, 7, 7, 7]]
    assert b["max_seqlen_q"].tolist() == [[3], [7]]
    assert b["padding_mask"].tolist() == [[F] * 6 + [T], [F] * 7]
    assert b["tokens"].shape == (2, 7)


def test_gpt_sft_pad_to_max_length():
    row = {"input_ids": [10, 11, 12, 2], "loss_mask": [1, 1, 1, 0], "seq_boundaries": [0, 4]}
    b = collate_packed([row], max_seq_length=8, eos_id=2, pad_to_max_length=True)
    assert b["tokens"].tolist() == [[10, 11, 12, 2, 2, 2, 2, 2]]
    assert b["cu_seqlens_q"].tolist() == [[0, 3, 8]]
    assert "cu_seqlens_q_padded" not in b
    assert b["padding_mask"].tolist() == [[F, F, F, T, T, T, T, T]]


def test_gpt_sft_short_and_full_rows_have_same_mask_shape():
    short = {"input_ids": [10, 11, 12, 2], "loss_mask": [1] * 4, "seq_start_id": [0]}
    full = {"input_ids": list(range(3, 12)), "loss_mask": [1] * 9, "seq_start_id": [0]}
    kw = {"max_seq_length": 8, "eos_id": 2, "pad_to_max_length": True}
    a, b = collate_packed([short], **kw), collate_packed([full], **kw)
    assert a["padding_mask"].shape == b["padding_mask"].shape == (1, 8)
    assert a["padding_mask"].any() and not b["padding_mask"].any()


def test_chat_template_m2_all_eos_tail():
    row = {"input_ids": [7, 0, 0, 0, 0], "loss_mask": [1] * 5, "seq_start_id": [0]}
    b = collate_packed([row], max_seq_length=4, eos_id=0, pad_seq_to_mult=2)
    assert b["cu_seqlens_q"].tolist() == [[0, 1]]
    assert b["cu_seqlens_kv"].tolist() == [[0, 1]]
    assert b["attention_mask"] is None


def test_chat_template_pad_cu_seqlens(tmp_path):
    meta = tmp_path / "metadata.jsonl"
    meta.write_text(json.dumps([{"max_samples_per_bin": 3, "dataset_max_seqlen": 8, "min_packed_seqlen": 4}]))
    row = {"input_ids": [7, 0, 0, 0, 0], "loss_mask": [1] * 5, "seq_start_id": [0]}
    b = collate_packed(
        [row],
        max_seq_length=8,
        eos_id=0,
        pad_seq_to_mult=2,
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        pack_metadata=meta,
    )
    assert b["cu_seqlens_q"].tolist() == [[0, 1, 1, 1, 1]]
    assert b["cu_seqlens_q_padded"].tolist() == [[0, 4, 8, 8, 8]]
    assert b["max_seqlen_q"].tolist() == [8] and b["max_seqlen_q"].shape == (1,)


def test_nan_fix_formula():
    row = {"input_ids": [*list(range(3, 53)), 2], "loss_mask": [1] * 51, "seq_start_id": [0]}
    meta = [{"max_samples_per_bin": 5, "dataset_max_seqlen": 100, "min_packed_seqlen": 50}]
    b = collate_packed(
        [row, row],
        max_seq_length=512,
        eos_id=2,
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        pack_metadata=meta,
    )
    assert b["max_seqlen_q"].tolist() == [462, 462]
    assert b["cu_seqlens_q"].shape == (2, 7)  # M + 2


def test_chat_template_m1_no_padded_keys():
    row = {"input_ids": [7, 8, 9, 0, 0], "loss_mask": [1] * 5, "seq_start_id": [0]}
    b = collate_packed([row], max_seq_length=4, eos_id=0)
    assert b["cu_seqlens_q"].tolist() == [[0, 4]]
    assert "cu_seqlens_q_padded" not in b and "cu_seqlens_kv_padded" not in b


def test_full_loss_internal_eos_is_not_zeroed_on_main_but_is_in_legacy():
    row = {"input_ids": [10, E, 20, E], "loss_mask": [1, 1, 1, 1], "seq_start_id": [0]}
    b = collate_packed([row], max_seq_length=3, eos_id=E)
    assert b["tokens"].tolist() == [[10, E, 20]]
    assert b["labels"].tolist() == [[E, 20, E]]
    assert b["loss_mask"].tolist() == [[1, 1, 1]]
    legacy = collate_packed([row], max_seq_length=3, eos_id=E, legacy_keys=True)
    assert legacy["loss_mask"].tolist() == [[1, 0, 1]]


def test_logical_cu_with_eos_999():
    ids = [5, 999, 999, 999, 1, 3, 999, 999, 999, 4]
    row = {"input_ids": ids, "loss_mask": [1] * 10, "seq_boundaries": [0, 5, 10]}
    b = collate_packed([row], max_seq_length=8, eos_id=999, pad_seq_to_mult=2)
    assert b["cu_seqlens_q"].tolist() == [[0, 1, 2]]
    assert b["cu_seqlens_q_padded"].tolist() == [[0, 4, 8]]


def test_answer_only_loss_false_masks_eos_inputs():
    row = {"input_ids": [10, E, 20, E], "loss_mask": [0, 0, 0, 0], "seq_start_id": [0]}
    b = collate_packed([row], max_seq_length=4, eos_id=E, answer_only_loss=False, pad_to_max_length=True)
    assert b["loss_mask"].tolist() == [[1, 0, 1, 0]]


def test_width_rounding_and_power_of_two():
    row = {"input_ids": list(range(3, 24)), "loss_mask": [1] * 21, "seq_start_id": [0]}  # 20 inputs
    assert collate_packed([row], max_seq_length=64, eos_id=E)["tokens"].shape == (1, 32)
    assert collate_packed([row], max_seq_length=64, eos_id=E, pad_seq_length_to_mult=8)["tokens"].shape == (
        1,
        24,
    )
    assert collate_packed([row], max_seq_length=24, eos_id=E)["tokens"].shape == (1, 24)
    assert collate_packed([row], max_seq_length=64, eos_id=E, ceil_to_power_2=True)["tokens"].shape == (1, 32)


def test_legacy_key_set_with_unpadded():
    row = {
        "input_ids": [10, 11, 12, 2, 2, 20, 21, 2, 2, 2],
        "loss_mask": [1] * 10,
        "seq_boundaries": [0, 5, 10],
    }
    b = collate_packed(
        [row], max_seq_length=12, eos_id=2, pad_seq_to_mult=4, pad_to_max_length=True, legacy_keys=True
    )
    assert set(b) == {
        "tokens", "labels", "loss_mask", "position_ids", "token_count", "attention_mask", "cu_seqlens",
        "cu_seqlens_argmin", "max_seqlen", "cu_seqlens_unpadded", "cu_seqlens_unpadded_argmin",
    }  # fmt: skip
    assert b["cu_seqlens"].tolist() == [[0, 4, 8, 12, -1]]
    assert b["cu_seqlens_unpadded"].tolist() == [[0, 3, 5, 5, -1]]
    assert b["cu_seqlens_argmin"].tolist() == [[4]] and b["cu_seqlens_argmin"].dtype == torch.int64
    assert b["max_seqlen"].tolist() == [[4]] and b["max_seqlen"].dtype == torch.int32


def test_legacy_key_set_m1_every_row_has_minus_one():
    rows = [
        {"input_ids": list(range(3, 11)), "loss_mask": [1] * 8, "seq_boundaries": [0, 4, 8]},
        {"input_ids": list(range(3, 11)), "loss_mask": [1] * 8, "seq_boundaries": [0, 8]},
    ]
    b = collate_packed(rows, max_seq_length=8, eos_id=E, pad_seq_length_to_mult=1, legacy_keys=True)
    assert b["cu_seqlens"].tolist() == [[0, 3, 6, 7, -1], [0, 7, -1, -1, -1]]
    assert b["cu_seqlens_argmin"].tolist() == [[4], [2]]
    assert "cu_seqlens_unpadded" not in b and "padding_mask" not in b


def test_return_cu_seqlen_false_gives_causal_masks():
    row = {"input_ids": [5, 6, 7, E], "loss_mask": [1] * 4, "seq_start_id": [0]}
    b = collate_packed([row, row], max_seq_length=4, eos_id=E, return_cu_seqlen=False, pad_to_max_length=True)
    assert b["attention_mask"].shape == (2, 1, 4, 4) and b["attention_mask"].dtype == torch.bool
    assert b["attention_mask"][0, 0].tolist()[0] == [F, T, T, T]
    assert "cu_seqlens_q" not in b


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pad_cu_seqlens": True, "pad_to_max_length": True}, "metadata json file is required"),
        ({"pad_cu_seqlens": True, "pack_metadata": [{"max_samples_per_bin": 1}]}, "pad_to_max_length=True"),
        ({"max_seq_length": 2}, "exceed the batch width"),
        ({"pad_seq_to_mult": 4}, "not a multiple of pad_seq_to_mult=4"),
    ],
)
def test_errors(kwargs, match):
    row = {"input_ids": [5, 6, 7, E], "loss_mask": [1] * 4, "seq_start_id": [0]}
    base = {"max_seq_length": 8, "eos_id": E}
    with pytest.raises(CollateError, match=match):
        collate_packed([row], **{**base, **kwargs})


def test_bad_rows_are_named():
    with pytest.raises(CollateError, match="row 1: loss_mask length 2"):
        collate_packed(
            [
                {"input_ids": [1, 2], "loss_mask": [1, 1], "seq_start_id": [0]},
                {"input_ids": [1, 2, 3], "loss_mask": [1, 1], "seq_start_id": [0]},
            ],
            max_seq_length=8,
            eos_id=E,
        )
    with pytest.raises(CollateError, match="segment 1 is empty"):
        collate_packed(
            [{"input_ids": [1, 2], "loss_mask": [1, 1], "seq_start_id": [0, 2, 2]}],
            max_seq_length=8,
            eos_id=E,
        )


def test_collator_is_picklable_and_matches_function():
    import pickle

    collate = pickle.loads(
        pickle.dumps(PackedCollator(max_seq_length=8, eos_id=E, pad_seq_to_mult=2, pad_to_max_length=True))
    )
    row = {
        "input_ids": np.array([5, 6, 7, E, E]),
        "loss_mask": np.array([1, 1, 1, 0, 0]),
        "seq_start_id": np.array([0]),
    }
    expected = collate_packed([row], max_seq_length=8, eos_id=E, pad_seq_to_mult=2, pad_to_max_length=True)
    got = collate([row])
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, got[key])


@st.composite
def packed_rows(draw):
    m = draw(st.sampled_from([1, 2, 4, 8]))
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        ids, mask, starts = [], [], []
        for _ in range(draw(st.integers(1, 5))):
            content = draw(st.integers(1, 20))
            aligned = -(-content // m) * m
            starts.append(len(ids))
            ids += draw(st.lists(st.integers(3, 99), min_size=content, max_size=content)) + [E] * (
                aligned - content + 1
            )
            mask += draw(st.lists(st.integers(0, 1), min_size=aligned + 1, max_size=aligned + 1))
        rows.append({"input_ids": ids, "loss_mask": mask, "seq_start_id": starts})
    return m, rows


@settings(max_examples=60, deadline=None)
@given(packed_rows(), st.booleans())
def test_properties_positions_restart_and_offsets_consistent(data, fixed):
    m, rows = data
    longest = max(len(r["input_ids"]) - len(r["seq_start_id"]) for r in rows)
    width = -(-longest // m) * m + (m if fixed else 0)
    b = collate_packed(rows, max_seq_length=width, eos_id=E, pad_seq_to_mult=m, pad_to_max_length=fixed)
    W = b["tokens"].shape[1]
    physical = b.get("cu_seqlens_q_padded", b["cu_seqlens_q"])
    for r, row in enumerate(rows):
        n = len(row["input_ids"]) - len(row["seq_start_id"])
        assert b["token_count"][r] == n
        cu, pcu = b["cu_seqlens_q"][r].tolist(), physical[r].tolist()
        assert cu[0] == 0 and pcu[-1] == W and len(cu) == len(pcu)
        assert all(a <= c for a, c in itertools.pairwise(cu))
        assert all(a <= c for a, c in itertools.pairwise(pcu))
        lengths = [c - a for a, c in itertools.pairwise(cu)]
        plengths = [c - a for a, c in itertools.pairwise(pcu)]
        assert all(lg <= p for lg, p in zip(lengths, plengths, strict=True))
        if m > 1:
            assert all(p % m == 0 for p in plengths[:-1])
        pos = b["position_ids"][r].tolist()
        pad = b["padding_mask"][r].tolist()
        for start, end, lg in zip(pcu, pcu[1:], lengths, strict=False):
            if end <= n:  # a real segment: positions restart at 0 and run through its alignment pad
                assert pos[start:end] == list(range(end - start))
                assert pad[start : start + lg] == [False] * lg
                assert pad[start + lg : end] == [True] * (end - start - lg)
        assert pad[n:] == [True] * (W - n)  # the trailing pseudo-segment is pure padding
        assert pos[n:] == [0] * (W - n)
        assert b["tokens"][r, n:].eq(E).all() and b["loss_mask"][r, n:].eq(0).all()
        assert b["max_seqlen_q"][r, 0] == max(plengths)
