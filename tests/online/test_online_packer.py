"""OnlinePacker: exactly-once delivery, row format, Energon-compatible buffer semantics, exact resume."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack import binpack
from longpack.online import OnlinePacker, OnlineStateError, aligned_length

ALGOS = list(binpack.ALGORITHMS)
DEFAULT_ALGO = "first_fit_decreasing"


def token_stream(lengths: list[int], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Stored samples whose token ids encode (sample, position): id = 1000 * (i + 1) + j."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = 1000 * (i + 1) + np.arange(n, dtype=np.int64)
        out.append({"input_ids": ids, "loss_mask": rng.integers(0, 2, n).astype(np.int8)})
    return out


def signature(packs: list) -> list[tuple]:
    return [
        (
            p.sample_index.tolist(),
            p.lengths.tolist(),
            p.aligned_lengths.tolist(),
            None if p.row is None else {k: v.tolist() for k, v in p.row.items()},
            p.selection,
        )
        for p in packs
    ]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 80), min_size=0, max_size=120),
    capacity=st.integers(8, 64),
    buffer_size=st.integers(1, 20),
    multiple=st.sampled_from([1, 2, 4, 8]),
    overlength=st.sampled_from(["truncate", "drop"]),
    algorithm=st.sampled_from(ALGOS),
    seed=st.integers(0, 3),
)
def test_every_sample_exactly_once_and_packs_fit(
    lengths: list[int], capacity: int, buffer_size: int, multiple: int, overlength, algorithm: str, seed: int
) -> None:
    """Runtime lengths as bare ints: each sample is emitted once (or counted as dropped), no pack overflows."""
    packer = OnlinePacker(
        capacity,
        buffer_size,
        pad_to_multiple_of=multiple,
        algorithm=algorithm,
        seed=seed,
        overlength=overlength,
    )
    packs = list(packer.pack(lengths))
    seen = Counter(i for p in packs for i in p.sample_index.tolist())
    assert all(c == 1 for c in seen.values())
    limit = capacity // multiple * multiple
    too_long = {i for i, n in enumerate(lengths) if aligned_length(n, multiple) > capacity}
    expected = set(range(len(lengths))) - (too_long if overlength == "drop" else set())
    assert set(seen) == expected
    for p in packs:
        assert p.packed_length <= capacity
        assert all(a % multiple == 0 for a in p.aligned_lengths.tolist())
        for i, n, a in zip(
            p.sample_index.tolist(), p.lengths.tolist(), p.aligned_lengths.tolist(), strict=True
        ):
            assert n == (min(lengths[i], limit) if i in too_long else lengths[i])
            assert a == aligned_length(n, multiple)
    s = packer.stats
    assert s.samples_read == len(lengths)
    assert s.samples_packed == len(expected)
    assert (s.truncated, s.dropped) == (
        (len(too_long), 0) if overlength == "truncate" else (0, len(too_long))
    )
    assert s.packs == len(packs)
    # Energon's PackingDataset: every selection but the last sees exactly buffer_size samples.
    per_selection = Counter(p.selection for p in packs for _ in p.sample_index)
    sizes = [per_selection[k] for k in sorted(per_selection)]
    assert sorted(per_selection) == list(range(len(sizes)))
    assert all(n == buffer_size for n in sizes[:-1])


@settings(max_examples=40, deadline=None)
@given(
    stored=st.lists(st.integers(2, 40), min_size=1, max_size=50),
    capacity=st.integers(8, 48),
    buffer_size=st.integers(1, 12),
    multiple=st.sampled_from([1, 2, 4]),
    pad_id=st.integers(0, 3),
)
def test_rows_are_bridge_packed_rows(
    stored: list[int], capacity: int, buffer_size: int, multiple: int, pad_id: int
):
    """Rows: tokens of each member in order, pre-padded to aligned+1, loss_mask shifted left per sample."""
    samples = token_stream(stored)
    packer = OnlinePacker(
        capacity, buffer_size, pad_to_multiple_of=multiple, algorithm=DEFAULT_ALGO, pad_id=pad_id
    )
    seen = []
    for p in packer.pack(samples):
        row = p.row
        assert row is not None
        assert row["input_ids"].dtype == np.int64 and row["loss_mask"].dtype == np.int8
        assert row["seq_start_id"].dtype == np.int64
        assert len(row["input_ids"]) == len(row["loss_mask"]) == int((p.aligned_lengths + 1).sum())
        assert len(row["input_ids"]) <= capacity + len(p.sample_index)  # Bridge: pack_size + num_seqs
        starts = row["seq_start_id"].tolist()
        assert starts[0] == 0
        ends = [*starts[1:], len(row["input_ids"])]
        for i, n, lo, hi in zip(p.sample_index.tolist(), p.lengths.tolist(), starts, ends, strict=True):
            seen.append(i)
            src_ids, src_mask = samples[i]["input_ids"], samples[i]["loss_mask"]
            ids, mask = row["input_ids"][lo:hi], row["loss_mask"][lo:hi]
            kept = n + 1  # stored tokens kept after truncation
            assert ids[:kept].tolist() == src_ids[:kept].tolist()
            assert (ids[kept:] == pad_id).all()
            assert mask[: kept - 1].tolist() == src_mask[1:kept].tolist()
            assert (mask[kept - 1 :] == 0).all()
    assert sorted(seen) == list(range(len(stored)))


def test_energon_selection_sizes_golden() -> None:
    """Energon's refill rule: 200 samples, buffer 16 -> selections [16]*12 + [8]; buffer 7 -> [7]*28 + [4]."""
    lengths = np.random.default_rng(0).integers(3, 41, 200).tolist()
    for buffer_size, expected in ((16, [16] * 12 + [8]), (7, [7] * 28 + [4])):
        packs = list(OnlinePacker(64, buffer_size, algorithm=DEFAULT_ALGO).pack(lengths))
        per = Counter(p.selection for p in packs for _ in p.sample_index)
        assert [per[k] for k in sorted(per)] == expected


def test_selection_uses_ffd_groups_of_bridge() -> None:
    """Bridge's selection golden: FFD over [8, 4, 4] with capacity 12 -> groups [[0, 1], [2]]."""
    packs = list(OnlinePacker(12, 3, algorithm="first_fit_decreasing").pack([8, 4, 4]))
    assert [p.sample_index.tolist() for p in packs] == [[0, 1], [2]]


def test_overlength_error_first_offender() -> None:
    packer = OnlinePacker(16, 4, pad_to_multiple_of=4, overlength="error", algorithm=DEFAULT_ALGO)
    with pytest.raises(ValueError, match=r"sample 2: runtime length 17 .* exceeds capacity 16"):
        list(packer.pack([3, 14, 17]))


def test_truncation_counts_and_keeps_head() -> None:
    samples = token_stream([30, 5])
    packer = OnlinePacker(16, 4, pad_to_multiple_of=4, algorithm=DEFAULT_ALGO)
    rows = list(packer.rows(samples))
    assert packer.stats.truncated == 1 and packer.stats.tokens_truncated == 29 - 16
    first = rows[0]
    assert first["input_ids"][:17].tolist() == samples[0]["input_ids"][:17].tolist()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": 0, "buffer_size": 4}, "capacity must be an integer >= 1"),
        ({"capacity": 8, "buffer_size": 0}, "buffer_size must be an integer >= 1"),
        ({"capacity": 8, "buffer_size": 4, "pad_to_multiple_of": 16}, "pad_to_multiple_of=16 > capacity=8"),
        ({"capacity": 8, "buffer_size": 4, "algorithm": "nope"}, "algorithm='nope' is not one of"),
        ({"capacity": 8, "buffer_size": 4, "overlength": "split"}, "overlength='split' is not one of"),
    ],
)
def test_bad_config_is_named(kwargs: dict, message: str) -> None:
    kwargs.setdefault("algorithm", DEFAULT_ALGO)
    with pytest.raises(ValueError, match=message):
        OnlinePacker(**kwargs)


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (0, "sample 0: runtime length 0 < 1"),
        ({"ids": [1, 2]}, "no 'input_ids' key"),
        (([1, 2, 3], [1, 1]), r"len\(loss_mask\)=2 != len\(input_ids\)=3"),
        ({"input_ids": [7]}, "1 stored token"),
        ("abc", "expected an int"),
    ],
)
def test_bad_samples_are_named(sample, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        list(OnlinePacker(8, 2, algorithm=DEFAULT_ALGO).pack([sample]))


# ----------------------------------------------------------------------------------------------- resume


def reference_run(make, samples) -> tuple[list, object]:
    packer = make()
    packs = list(packer.pack(samples))
    return signature(packs), packer.stats


def check_resume(make, samples, k: int, reference, *, via_json: bool, replay_slice: bool) -> None:
    """Save after k packs, restore into a fresh packer, continue: same packs and counts as one run."""
    expected, expected_stats = reference
    first = make()
    it = first.pack(samples)
    head = [next(it) for _ in range(min(k, len(expected)))]
    state = first.state_dict()
    if via_json:
        state = json.loads(json.dumps(state))
    second = make()
    second.load_state_dict(state)
    start = state["replay_from"] if replay_slice else 0
    tail = list(second.pack(samples[start:], start=start))
    assert signature(head + tail) == expected
    assert second.stats == expected_stats


@pytest.mark.parametrize("algorithm", ALGOS)
@pytest.mark.parametrize("multiple", [1, 4])
def test_resume_after_every_k_packs_is_identical(algorithm: str, multiple: int) -> None:
    stored = np.random.default_rng(7).integers(2, 60, 90).tolist()
    samples = token_stream(stored, seed=1)

    def make():
        return OnlinePacker(64, 9, pad_to_multiple_of=multiple, algorithm=algorithm, seed=5)

    reference = reference_run(make, samples)
    for k in range(0, len(reference[0]) + 1):
        check_resume(make, samples, k, reference, via_json=k % 2 == 0, replay_slice=k % 3 == 0)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=60),
    buffer_size=st.integers(1, 10),
    k=st.integers(0, 30),
    overlength=st.sampled_from(["truncate", "drop"]),
)
def test_resume_property(lengths: list[int], buffer_size: int, k: int, overlength) -> None:
    def make():
        return OnlinePacker(
            32, buffer_size, pad_to_multiple_of=2, algorithm=DEFAULT_ALGO, overlength=overlength
        )

    check_resume(make, lengths, k, reference_run(make, lengths), via_json=True, replay_slice=True)


def test_state_file_round_trip(tmp_path) -> None:
    samples = token_stream(np.random.default_rng(3).integers(2, 30, 40).tolist())
    packer = OnlinePacker(32, 6, algorithm=DEFAULT_ALGO)
    it = packer.pack(samples)
    head = [next(it) for _ in range(5)]
    path = tmp_path / "sub" / "packer_state.json"
    packer.save_state(path)
    assert [p.name for p in path.parent.iterdir()] == ["packer_state.json"]  # no temp file left
    restored = OnlinePacker(32, 6, algorithm=DEFAULT_ALGO)
    restored.load_state(path)
    tail = list(restored.pack(samples))
    assert signature(head + tail) == signature(
        list(OnlinePacker(32, 6, algorithm=DEFAULT_ALGO).pack(samples))
    )


@pytest.mark.parametrize(
    ("other", "name"),
    [
        ({"capacity": 64}, "capacity"),
        ({"buffer_size": 8}, "buffer_size"),
        ({"pad_to_multiple_of": 2}, "pad_to_multiple_of"),
        ({"seed": 1}, "seed"),
        ({"overlength": "drop"}, "overlength"),
    ],
)
def test_mismatched_config_is_an_error_naming_it(other: dict, name: str) -> None:
    base = {"capacity": 32, "buffer_size": 4, "algorithm": DEFAULT_ALGO}
    state = OnlinePacker(**base).state_dict()
    with pytest.raises(OnlineStateError, match=rf"saved state has {name}=.* but this packer has {name}="):
        OnlinePacker(**{**base, **other}).load_state_dict(state)


def test_replay_checks_stream() -> None:
    lengths = [5, 6, 7, 8, 9, 10, 11, 12]
    packer = OnlinePacker(20, 4, algorithm=DEFAULT_ALGO)
    it = packer.pack(lengths)
    next(it)
    state = packer.state_dict()
    late = OnlinePacker(20, 4, algorithm=DEFAULT_ALGO)
    late.load_state_dict(state)
    start = state["replay_from"] + 1
    with pytest.raises(OnlineStateError, match="reopen the stream there"):
        list(late.pack(lengths[start:], start=start))
    wrong = OnlinePacker(20, 4, algorithm=DEFAULT_ALGO)
    wrong.load_state_dict(state)
    with pytest.raises(OnlineStateError, match="not the one the state was saved from"):
        list(wrong.pack([x + 1 for x in lengths]))
    short = OnlinePacker(20, 4, algorithm=DEFAULT_ALGO)
    short.load_state_dict(state)
    with pytest.raises(OnlineStateError, match="stream ended at sample 2"):
        list(short.pack(lengths[:2]))


def test_not_a_state() -> None:
    with pytest.raises(OnlineStateError, match="not an OnlinePacker state"):
        OnlinePacker(8, 2, algorithm=DEFAULT_ALGO).load_state_dict({"format": "x"})


def test_global_rng_untouched() -> None:
    before = np.random.get_state()[1].copy()
    list(OnlinePacker(32, 8, algorithm=ALGOS[-1], seed=3).pack(list(range(1, 30))))
    assert (np.random.get_state()[1] == before).all()


# ----------------------------------------------------------------------------------------------- input checks


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (
            {"input_ids": [5, 6, 7], "loss_mask": [0, 2, 1]},
            r"loss_mask\[1\]=2; a loss mask holds only 0 and 1",
        ),
        ({"input_ids": [5, 6, 7], "loss_mask": [1, 300, 1]}, r"loss_mask\[1\]=300"),
        (([5, 6, 7], [1.0, 0.5, 1.0]), r"loss_mask\[1\]=0.5"),
        ({"input_ids": [5.0, 6.7, 7.0]}, r"input_ids must hold integers, got dtype float64 \(a float array"),
        ({"input_ids": [5, -1, 7]}, r"input_ids\[1\]=-1; token ids are non-negative"),
        ({"input_ids": ["a", "b"]}, r"input_ids must hold integers, got dtype <U1"),
        ({"input_ids": [5, 6], "loss_mask": ["x", "y"]}, r"loss_mask must hold 0/1 values"),
        (True, "expected an int"),
    ],
)
def test_invalid_tokens_and_masks_are_refused(sample, message: str) -> None:
    """Casting used to store mask 2 and 300 as int8 44 and 1 and to truncate float ids; now each is an
    OnlineError naming the sample, the position and the value."""
    from longpack.errors import OnlineError

    with pytest.raises(OnlineError, match=message):
        list(OnlinePacker(8, 2, algorithm=DEFAULT_ALGO).pack([sample]))


def test_valid_masks_of_any_dtype_are_kept() -> None:
    for mask in ([0, 1, 1], [False, True, True], np.array([0.0, 1.0, 1.0], dtype=np.float32)):
        (row,) = OnlinePacker(8, 2, algorithm=DEFAULT_ALGO).rows([([4, 5, 6], mask)])
        assert row["loss_mask"].tolist() == [1, 1, 0]
        assert row["input_ids"].tolist() == [4, 5, 6]


def test_second_stream_needs_reset() -> None:
    """A reused packer used to treat a second stream as a replay of the first and skip its first N samples."""
    packer = OnlinePacker(10, 4, algorithm=DEFAULT_ALGO)
    assert [p.sample_index.tolist() for p in packer.pack([6, 4])] == [[0, 1]]
    with pytest.raises(OnlineStateError, match=r"already packed a stream \(2 samples read\); call reset\(\)"):
        list(packer.pack([3, 3, 3]))
    packer.reset()
    packs = list(packer.pack([3, 3, 3]))
    assert sorted(i for p in packs for i in p.sample_index.tolist()) == [0, 1, 2]
    assert packer.stats.samples_read == 3
    # A loaded state allows exactly one stream (the resumed one).
    state = OnlinePacker(10, 4, algorithm=DEFAULT_ALGO).state_dict()
    packer.load_state_dict(state)
    assert len(list(packer.pack([3]))) == 1
    with pytest.raises(OnlineStateError, match="already packed a stream"):
        list(packer.pack([3]))


def test_bad_pad_id_is_named() -> None:
    from longpack.errors import OnlineError

    with pytest.raises(OnlineError, match="pad_id must be a non-negative integer"):
        OnlinePacker(8, 2, algorithm=DEFAULT_ALGO, pad_id=-1)
