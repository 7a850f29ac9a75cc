"""Packed DPO preference pairs (NeMo-Aligner layout) and their THD collate vs NeMo-Aligner's own method."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.errors import InputError
from longpack.packed.preference import (
    LABELS_PAD_ID,
    PreferencePair,
    collate_packed_dpo,
    pack_preference_pairs,
    read_packed_dpo,
    write_packed_dpo,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import nemo_aligner_dpo_harness as harness

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "nemo_aligner_dpo_collate_golden.json"

toks = st.lists(st.integers(1, 1000), max_size=10)
pairs_st = st.lists(
    st.builds(
        PreferencePair,
        toks,
        st.lists(st.integers(1, 1000), min_size=1, max_size=10),
        st.lists(st.integers(1, 1000), min_size=1, max_size=10),
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(
    pairs=pairs_st,
    pack_size=st.integers(2, 60),
    alg=st.sampled_from(["best_fit_decreasing", "first_fit_shuffle", "first_fit_decreasing"]),
)
def test_every_pair_whole_adjacent_once(pairs: list[PreferencePair], pack_size: int, alg: str) -> None:
    out = pack_preference_pairs(pairs, pack_size, algorithm=alg)
    seen = [k for row in out.rows for k in row["pair_ids"]]
    assert sorted(seen + list(out.dropped)) == list(range(len(pairs)))
    for k in out.dropped:
        p = pairs[k]
        assert 2 * len(p.prompt) + len(p.chosen) + len(p.rejected) > pack_size
    for row in out.rows:
        b = row["seq_boundaries"]
        assert len(row["input_ids"]) == len(row["labels"]) == b[-1] <= pack_size
        assert (
            len(b) == 2 * len(row["pair_ids"]) + 1 and len(row["lengths"]) == len(row["reward"]) == len(b) - 1
        )
        for j, k in enumerate(row["pair_ids"]):
            c, cl, r, rl = pairs[k].sequences()
            start, mid, end = b[2 * j], b[2 * j + 1], b[2 * j + 2]
            assert row["input_ids"][start:mid] == c.tolist() and row["input_ids"][mid:end] == r.tolist()
            assert row["labels"][start:mid] == cl.tolist() and row["labels"][mid:end] == rl.tolist()
            assert row["labels"][start : start + len(pairs[k].prompt)] == [LABELS_PAD_ID] * len(
                pairs[k].prompt
            )
            assert row["lengths"][2 * j : 2 * j + 2] == [c.size, r.size]


def test_bad_input_named() -> None:
    with pytest.raises(InputError, match="pack_size"):
        pack_preference_pairs([], 1)
    with pytest.raises(InputError, match=r"pairs\[0\]"):
        pack_preference_pairs([PreferencePair([], [], [1])], 8)
    rows = pack_preference_pairs([PreferencePair([1] * 10, [2], [3])], 32).rows
    with pytest.raises(InputError, match="seq_length"):
        collate_packed_dpo(rows, eos_id=0, seq_length=8)


def test_npy_round_trip_is_object_array(tmp_path: Path) -> None:
    packing = pack_preference_pairs([PreferencePair([1], [2, 3], [4]), PreferencePair([5], [6], [7, 8])], 16)
    path = write_packed_dpo(packing, tmp_path / "packed_16_seed0.npy")
    arr = np.load(path, allow_pickle=True)
    assert arr.dtype == object and arr.ndim == 1
    assert read_packed_dpo(path) == packing.rows
    assert [p.name for p in tmp_path.iterdir()] == ["packed_16_seed0.npy"]  # no temp file left


def _same(ours: dict[str, np.ndarray], theirs: dict[str, list]) -> None:
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(
            np.asarray(ours[key]), np.asarray(value, dtype=ours[key].dtype), err_msg=key
        )


@pytest.mark.parametrize("case", json.loads(GOLDEN.read_text())["cases"] if GOLDEN.exists() else [])
def test_collate_equals_recorded_nemo_aligner(case: dict) -> None:
    _same(
        collate_packed_dpo(case["rows"], eos_id=case["eos_id"], seq_length=case["seq_length"]), case["batch"]
    )


def test_golden_is_present() -> None:
    assert GOLDEN.exists() and "NeMo-Aligner@" in json.loads(GOLDEN.read_text())["source"]


@pytest.mark.skipif(
    harness.source_text() is None, reason="LONGPACK_NEMO_ALIGNER names no NeMo-Aligner checkout"
)
def test_collate_equals_live_nemo_aligner() -> None:
    import dpo_collate_golden as golden

    cls = harness.load_class(harness.source_text() or "")
    for case in golden.cases(seed=7, count=30):
        theirs = harness.run_upstream(cls, case["rows"], eos_id=case["eos_id"], seq_length=case["seq_length"])
        _same(collate_packed_dpo(case["rows"], eos_id=case["eos_id"], seq_length=case["seq_length"]), theirs)
