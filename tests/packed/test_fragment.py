"""``overlength="fragment"``: an over-long sample is cut into pack-sized fragments, every token (and its loss
mask value) in exactly one fragment, packed like samples and counted in the manifest with ``file:line``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.jobs import PackConfig
from longpack.packed.align import OVERLENGTH_POLICIES, align_samples, fragment_cuts
from longpack.packed.pipeline import PackSettings, plan_splits
from longpack.packed.rows import fill_rows
from longpack.samples import TokenizedSamples


def samples_of(lengths: list[int], seed: int = 0) -> TokenizedSamples:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    return TokenizedSamples(
        tokens=rng.integers(3, 1000, n).astype(np.int32),
        loss_mask=rng.integers(0, 2, n).astype(np.uint8),
        offsets=offsets,
        source_file=np.zeros(len(lengths), np.int32),
        source_row=np.arange(1, len(lengths) + 1),
        files=("a.jsonl",),
    )


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 80), min_size=1, max_size=25),
    cap=st.integers(2, 20),
    mult=st.sampled_from([1, 2, 4]),
)
def test_every_token_of_an_overlong_sample_is_in_exactly_one_fragment(lengths, cap, mult) -> None:
    cap = max(cap, mult, 2)  # fragments need a cap of 2 (pieces of >= 2 tokens); 1 is refused
    s = samples_of(lengths)
    a = align_samples(s, max_seq_length=cap, pad_seq_to_mult=mult, eos_id=2, overlength="fragment")
    runtime = s.runtime_lengths()
    assert a.fragmented.tolist() == np.flatnonzero(runtime > a.cap).tolist()
    assert len(a.truncated) == 0
    assert (a.stored - 1 <= a.cap).all()  # every fragment fits
    starts = a.starts()
    for i in a.fragmented.tolist():
        ids, mask = s.sample(i)
        mine = np.flatnonzero(a.index == i)
        covered = np.concatenate([np.arange(starts[k], starts[k] + a.kept[k]) for k in mine])
        assert covered.tolist() == list(range(len(ids)))  # each token once, in order
        got_ids = np.concatenate([a.sample(int(k))[0][: a.kept[k]] for k in mine])
        got_mask = np.concatenate([a.sample(int(k))[1][: a.kept[k]] for k in mine])
        assert got_ids.tolist() == ids.tolist() and got_mask.tolist() == mask.tolist()
    # and the same through the packed rows the writer fills
    if len(a):
        split = plan_splits(
            s, PackSettings(seq_length=a.cap, pad_seq_to_mult=mult, overlength="fragment"), eos_id=2
        )[0]
        rows = fill_rows(split.aligned, split.plan)
        assert len(rows.input_ids) == int(split.aligned.stored.sum())
        packed = np.unique(split.aligned.index)
        assert int(split.aligned.kept.sum()) == int(s.stored_lengths()[packed].sum())  # no token twice


def test_fragment_cuts_leave_no_one_token_tail() -> None:
    sample, start, length = fragment_cuts(np.array([9, 5]), 3)
    assert sample.tolist() == [0, 0, 0, 1, 1]
    assert length.tolist() == [4, 3, 2, 3, 2]  # 9 = 4+4+1 -> 4+3+2; 5 = 4+1 -> 3+2
    assert start.tolist() == [0, 4, 7, 0, 3]


def test_overlength_policies_are_defined_once() -> None:
    import dataclasses

    from longpack import choices
    from longpack.option import option_of

    assert OVERLENGTH_POLICIES is choices.OVERLENGTH_POLICIES and "fragment" in OVERLENGTH_POLICIES
    field = next(f for f in dataclasses.fields(PackConfig) if f.name == "overlength")
    assert option_of(field).choices is choices.OVERLENGTH_POLICIES  # the CLI's --overlength choices


def test_pack_fragment_manifest_counts_and_rows(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    rows = [
        {"input_ids": list(range(3, 3 + n)), "loss_mask": [i % 2 for i in range(n)]} for n in (5, 40, 7, 100)
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = PackConfig(
        inputs=[src],
        out=tmp_path / "o",
        tokenizer="bytes",
        seq_length=16,
        overlength="fragment",
        backend="local",
        workers=1,
    ).run()
    m = r.manifest.to_dict()
    assert m["counts"]["fragmented"] == 2 and m["counts"]["packed"] == 4 and m["counts"]["dropped"] == 0
    listed = m["splits"]["training"]["fragmented"]
    assert [e["source"].rsplit(":", 1)[1] for e in listed] == ["2", "4"]
    assert [e["fragments"] for e in listed] == [3, 6]  # 40 = 17+17+6; 100 = 5*17+15
    assert m["inputs"][0]["fragmented"] == 2
    table = pq.read_table(next((r.out).glob("training_*.parquet")))
    all_ids = [t for row in table.column("input_ids").to_pylist() for t in row]
    for row in rows:  # every token of every sample is in the files, once
        for t in row["input_ids"]:
            assert t in all_ids
    assert sum(len(x) for x in table.column("input_ids").to_pylist()) == sum(
        len(x["input_ids"]) for x in rows
    )


def test_fragment_refuses_a_cap_of_one() -> None:
    import pytest

    from longpack.errors import ConfigError

    with pytest.raises(ConfigError, match="fragment"):
        align_samples(samples_of([5]), max_seq_length=1, eos_id=2, overlength="fragment")
