"""longpack.packed: alignment, Megatron-exact packing, row fill, files, manifest, inspect."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.binpack.megatron import create_packing_strategy_arrays
from longpack.packed import (
    MANIFEST_NAME,
    OutputExistsError,
    OverlengthError,
    PackPlan,
    PackSettings,
    Provenance,
    align_samples,
    fill_rows,
    inspect_output,
    pack_metadata,
    plan_rows,
    plan_splits,
    resolve_packed_parquet_paths,
    validate_rows,
    write_packed_output,
)
from packed_helpers import (
    assert_same_output,
    make_samples,
    random_samples,
    spec_collate,
    spec_read_rows,
    unpack_rows,
)

EOS = 2


def pack_to(out: Path, samples, **kw) -> dict:
    overwrite = kw.pop("overwrite", False)
    s = PackSettings(**kw)
    return write_packed_output(out, plan_splits(samples, s, eos_id=EOS), s, Provenance(), overwrite=overwrite)


# ---------------------------------------------------------------------------------------------------
# Alignment (docs/reference/packed-format.md#alignment-padding)


def test_alignment_examples_from_spec() -> None:
    # m=8: stored 17 stays 17; 18 -> 25 (max 40); 20/21 with cap 16 -> 17 by truncation (test_offline).
    s = make_samples([[5] * 16 + [EOS], [5] * 17 + [EOS], [5] * 19 + [EOS], [5] * 20 + [EOS]])
    a = align_samples(s, max_seq_length=16, pad_seq_to_mult=8, eos_id=EOS, overlength="truncate")
    assert a.stored.tolist() == [17, 17, 17, 17]
    assert a.truncated.tolist() == [1, 2, 3]
    ids, mask = a.sample(2)
    assert ids.tolist() == [5] * 17  # the EOS is cut off with the tail
    a = align_samples(s, max_seq_length=40, pad_seq_to_mult=8, eos_id=EOS)
    assert a.stored.tolist() == [17, 25, 25, 25]
    ids, mask = a.sample(1)
    assert ids.tolist() == [5] * 17 + [EOS] * 8 and mask.tolist() == [1] * 18 + [0] * 7
    with pytest.raises(ValueError, match="at least the effective padding multiple"):
        align_samples(s, max_seq_length=7, pad_seq_to_mult=8, eos_id=EOS)


def test_overlength_policies_and_empty_samples() -> None:
    s = make_samples([[1, EOS], [1, 1, 1, 1, 1, EOS], [7], [1, 1, EOS]])
    a = align_samples(s, max_seq_length=3, eos_id=EOS)  # default: drop
    assert a.index.tolist() == [0, 3]
    assert a.dropped.tolist() == [1, 2] and a.dropped_reason == ("overlength", "empty")
    a = align_samples(s, max_seq_length=3, eos_id=EOS, overlength="truncate")
    assert a.index.tolist() == [0, 1, 3] and a.kept.tolist() == [2, 4, 3]
    with pytest.raises(OverlengthError, match=r"data\.jsonl:2 \(5 tokens\)"):
        align_samples(s, max_seq_length=3, eos_id=EOS, overlength="error")


# ---------------------------------------------------------------------------------------------------
# Round trip: every packed segment is a sample (aligned), every kept sample appears exactly once.


def check_round_trip(samples_tokens, samples_masks, rows, *, m: int, cap: int, overlength: str) -> None:
    segments = unpack_rows(rows)
    by_id = {}
    for ids, mask in segments:
        assert ids[0] not in by_id
        by_id[ids[0]] = (ids, mask)
    for i, (ids, mask) in enumerate(zip(samples_tokens, samples_masks, strict=True)):
        r = len(ids) - 1
        if r > cap and overlength == "drop":
            assert ids[0] not in by_id
            continue
        got_ids, got_mask = by_id.pop(ids[0])
        kept = min(len(ids), cap + 1)
        target = min(cap, -(-r // m) * m) + 1
        assert len(got_ids) == target, i
        assert got_ids[:kept] == ids[:kept]
        assert got_ids[kept:] == [EOS] * (target - kept)
        aligned_mask = [*(mask[:kept] + [0] * (target - kept))[1:], 0]
        assert got_mask == aligned_mask
    assert not by_id


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 2**16),
    m=st.sampled_from([1, 2, 4, 8]),
    algorithm=st.sampled_from(["best_fit_decreasing", "first_fit_shuffle", "first_fit_decreasing"]),
    overlength=st.sampled_from(["drop", "truncate"]),
    extra=st.integers(0, 16),
)
def test_round_trip_in_memory(n, seed, m, algorithm, overlength, extra) -> None:
    samples, tokens, masks = random_samples(n, seed=seed, max_len=40)
    seq_length = 24
    settings_ = PackSettings(
        seq_length=seq_length,
        pack_size=seq_length + extra,
        pad_seq_to_mult=m,
        algorithm=algorithm,
        seed=seed,
        overlength=overlength,
    )
    a = align_samples(
        samples, max_seq_length=seq_length, pad_seq_to_mult=m, eos_id=EOS, overlength=overlength
    )
    if len(a) == 0:
        return
    plan = plan_rows(a.runtime_lengths(), settings_.resolved_pack_size, algorithm=algorithm, seed=seed)
    rows_flat = fill_rows(a, plan)
    reference = fill_rows(a, plan, compiled=False)
    assert np.array_equal(rows_flat.input_ids, reference.input_ids)
    assert np.array_equal(rows_flat.loss_mask, reference.loss_mask)
    rows = []
    for j in range(plan.num_rows):
        lo, hi = rows_flat.row_offsets[j], rows_flat.row_offsets[j + 1]
        starts = rows_flat.seq_start_id[rows_flat.start_offsets[j] : rows_flat.start_offsets[j + 1]].tolist()
        rows.append(
            {
                "input_ids": rows_flat.input_ids[lo:hi].tolist(),
                "loss_mask": rows_flat.loss_mask[lo:hi].tolist(),
                "seq_boundaries": [*starts, int(hi - lo)],
            }
        )
        assert (hi - lo) - len(starts) <= settings_.resolved_pack_size
    check_round_trip(tokens, masks, rows, m=m, cap=a.cap, overlength=overlength)


def test_round_trip_through_files_with_shards(tmp_path: Path) -> None:
    samples, tokens, masks = random_samples(1500, seed=3, max_len=70)
    manifest = pack_to(
        tmp_path / "out",
        samples,
        seq_length=64,
        pack_size=96,
        pad_seq_to_mult=4,
        overlength="truncate",
        rows_per_shard=250,
    )
    files = manifest["splits"]["training"]["files"]
    assert len(files) > 1 and files[0]["name"] == f"training_96.part-00000-of-{len(files):05d}.idx.parquet"
    for f in files:
        meta = pq.ParquetFile(tmp_path / "out" / f["name"]).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(size == min(500, 250) for size in sizes[:-1]) and sizes[-1] <= 250
    rows = spec_read_rows(str(tmp_path / "out" / manifest["megatron_bridge"]["packed_train_data_path"]))
    assert len(rows) == manifest["counts"]["rows"]["training"]
    check_round_trip(tokens, masks, rows, m=4, cap=64, overlength="truncate")
    truncated = manifest["splits"]["training"]["truncated"]
    assert len(truncated) == sum(len(t) - 1 > 64 for t in tokens) > 0
    first = next(i for i, t in enumerate(tokens) if len(t) - 1 > 64)
    assert truncated[0] == {
        "source": f"data.jsonl:{first + 1}",
        "stored_length": len(tokens[first]),
        "kept_tokens": 65,
    }
    schema = pq.read_schema(tmp_path / "out" / files[0]["name"])
    assert schema.field("loss_mask").type == pa.list_(pa.int8())
    assert schema.field("input_ids").type == pa.list_(pa.int64())
    assert schema.field("seq_start_id").type == pa.list_(pa.int64())


# ---------------------------------------------------------------------------------------------------
# first_fit_shuffle == Megatron-Bridge, replaying its prepare step (data/packing/offline.py) step by step.


def megatron_reference(tokens, masks, *, max_seq_length, pack_size, m, eos, seed):
    samples = []
    for ids, mask in zip(tokens, masks, strict=True):
        d = {"input_ids": list(ids), "loss_mask": list(mask)}
        if m > 1:  # Bridge's _pre_pad_data_point
            cap = (max_seq_length // m) * m
            r = max(len(ids) - 1, 0)
            target = min(cap, -(-r // m) * m) + 1
            for key, pad in (("input_ids", eos), ("loss_mask", 0)):
                v = d[key]
                d[key] = v + [pad] * (target - len(v)) if len(v) <= target else v[:target]
        samples.append(d)
    sequences = defaultdict(list)  # Bridge's create_hist
    histogram = [0] * (max_seq_length + 1)
    for d in samples:
        length = len(d["input_ids"]) - 1
        if length > max_seq_length:
            continue
        sequences[length].append(d)
        histogram[length] += 1
    rng = np.random.RandomState(seed)  # Bridge seeds the global RNG: np.random.seed(seed)
    seqlens = [length for length, count in enumerate(histogram) for _ in range(count)]
    shuffled = list(seqlens)
    rng.shuffle(shuffled)  # Bridge's first_fit_shuffle
    bins: list[list[int]] = []
    room: list[int] = []
    for length in shuffled:  # first fit, linear scan (NeMo)
        for k in range(len(bins)):
            if room[k] >= length:
                bins[k].append(length)
                room[k] -= length
                break
        else:
            bins.append([length])
            room.append(pack_size - length)
    ids_by_len, mask_by_len = {}, {}
    for length in range(pack_size + 1):  # Bridge's fill_packing_strategy
        if not sequences.get(length):
            continue
        perm = rng.permutation(len(sequences[length]))
        ids_by_len[length] = [sequences[length][i]["input_ids"] for i in perm]
        mask_by_len[length] = [[*sequences[length][i]["loss_mask"][1:], 0] for i in perm]
    rows = []
    for b in bins:
        row = {"input_ids": [], "loss_mask": [], "seq_start_id": []}
        for length in b:
            row["seq_start_id"].append(len(row["input_ids"]))
            row["input_ids"] += ids_by_len[length].pop()
            row["loss_mask"] += mask_by_len[length].pop()
        rows.append(row)
    assert all(not v for v in ids_by_len.values()), "Error: There are items left over from the assignment"
    return rows


@pytest.mark.parametrize(("m", "overlength", "seed"), [(1, "drop", 0), (1, "drop", 1234), (4, "truncate", 7)])
def test_first_fit_shuffle_equals_megatron_bridge(tmp_path: Path, m, overlength, seed) -> None:
    samples, tokens, masks = random_samples(400, seed=seed, max_len=60, first_token_base=7)
    # 400 samples over ~60 lengths: many equal lengths, so the per-length permutation matters.
    expected = megatron_reference(tokens, masks, max_seq_length=48, pack_size=64, m=m, eos=EOS, seed=seed)
    ambient = np.random.get_state()
    manifest = pack_to(
        tmp_path / "o",
        samples,
        seq_length=48,
        pack_size=64,
        pad_seq_to_mult=m,
        algorithm="first_fit_shuffle",
        seed=seed,
        overlength=overlength,
    )
    after = np.random.get_state()
    assert ambient[0] == after[0] and np.array_equal(ambient[1], after[1])  # global RNG untouched
    table = pq.read_table(tmp_path / "o" / "training_64.idx.parquet")
    assert table.to_pylist() == expected
    # The metadata dict equals Megatron's (recomputed from the reference bins).
    lengths = np.array(
        [len(s) - 1 for r in expected for s in np.split(r["input_ids"], r["seq_start_id"][1:])]
    )
    counts = [len(r["seq_start_id"]) for r in expected]
    plan = PackPlan(order=np.arange(len(lengths)), row_offsets=np.concatenate([[0], np.cumsum(counts)]))
    meta_file = json.loads((tmp_path / "o" / "64_metadata.jsonl").read_text())
    assert meta_file == [pack_metadata(lengths, plan, 64)] == [manifest["splits"]["training"]["metadata"]]


def test_metadata_matches_binpack_megatron_layer() -> None:
    lengths = np.random.default_rng(0).integers(1, 33, size=500)
    plan = plan_rows(lengths, 64, algorithm="first_fit_shuffle", seed=5)
    _, _, meta = create_packing_strategy_arrays(
        np.bincount(lengths, minlength=65), 64, "first_fit_shuffle", rng=np.random.RandomState(5)
    )
    assert pack_metadata(lengths, plan, 64) == meta


# ---------------------------------------------------------------------------------------------------
# A reader written from the format reproduces the collate's worked examples from our files.


def test_worked_example_a_m1(tmp_path: Path) -> None:
    p1, p2, c1, c2, q1, d1, E = 11, 12, 13, 14, 15, 16, EOS
    samples = make_samples([[p1, p2, c1, c2, E], [q1, d1, E]], [[0, 0, 1, 1, 1], [0, 1, 1]])
    pack_to(tmp_path / "a", samples, seq_length=8, algorithm="first_fit_decreasing")
    items = spec_read_rows(str(tmp_path / "a"))  # a folder spec
    assert items == [
        {
            "input_ids": [p1, p2, c1, c2, E, q1, d1, E],
            "seq_boundaries": [0, 5, 8],
            "loss_mask": [0, 1, 1, 1, 0, 1, 1, 0],
        }
    ]
    out = spec_collate(items, eos_id=E, width=8, m=1)
    assert out["tokens"] == [[p1, p2, c1, c2, q1, d1, E, E]]
    assert out["labels"] == [[p2, c1, c2, E, d1, E, E, E]]
    assert out["loss_mask"] == [[0, 1, 1, 1, 1, 1, 0, 0]]
    assert out["position_ids"] == [[0, 1, 2, 3, 0, 1, 0, 0]]
    assert out["cu_seqlens_q"] == [[0, 4, 6, 8]] and out["max_seqlen_q"] == [[4]]
    assert out["padding_mask"] == [[False] * 6 + [True] * 2] and out["token_count"] == [6]


def test_worked_example_b_m4(tmp_path: Path) -> None:
    samples = make_samples([[10, 11, 12, EOS], [20, 21, EOS]])
    manifest = pack_to(
        tmp_path / "b", samples, seq_length=8, pad_seq_to_mult=4, algorithm="first_fit_decreasing"
    )
    spec = str(tmp_path / "b" / "training_8*.idx.parquet")  # the glob form works for one file too
    items = spec_read_rows(spec)
    assert items[0]["input_ids"] == [10, 11, 12, 2, 2, 20, 21, 2, 2, 2]
    assert items[0]["seq_boundaries"] == [0, 5, 10]
    out = spec_collate(items, eos_id=EOS, width=8, m=4)
    assert out["tokens"] == [[10, 11, 12, 2, 20, 21, 2, 2]]
    assert out["cu_seqlens_q"] == [[0, 3, 5]] and out["cu_seqlens_q_padded"] == [[0, 4, 8]]
    assert out["padding_mask"] == [[False, False, False, True, False, False, True, True]]
    assert manifest["megatron_bridge"]["pad_seq_to_mult"] == 4
    assert json.loads((tmp_path / "b" / "8_metadata.jsonl").read_text()) == [
        {
            "dataset_max_seqlen": 4,
            "max_samples_per_bin": 2,
            "packing_factor": 2.0,
            "packing_efficiency": 100.0,
            "pack_size": 8,
            "min_packed_seqlen": 8,
        }
    ]


# ---------------------------------------------------------------------------------------------------
# Files: determinism, validation split, refusal, interruption, verification.


def test_same_inputs_give_byte_identical_files(tmp_path: Path) -> None:
    samples, _, _ = random_samples(800, seed=1, max_len=48)
    kw = dict(seq_length=48, pack_size=64, pad_seq_to_mult=2, val_fraction=0.1, rows_per_shard=200, seed=9)
    pack_to(tmp_path / "one", samples, **kw)
    pack_to(tmp_path / "two", samples, **kw)
    names = assert_same_output(tmp_path / "one", tmp_path / "two")
    assert "validation/validation_64.idx.parquet" in names and MANIFEST_NAME in names
    meta = json.loads((tmp_path / "one" / "64_metadata.jsonl").read_text())
    assert isinstance(meta, list) and len(meta) == 2
    manifest = json.loads((tmp_path / "one" / MANIFEST_NAME).read_text())
    assert manifest["counts"]["packed"] == 800 and manifest["splits"]["validation"]["samples_packed"] == 80


def test_validation_input_split(tmp_path: Path) -> None:
    train, _, _ = random_samples(50, seed=1, max_len=20)
    val, _, _ = random_samples(10, seed=2, max_len=20)
    s = PackSettings(seq_length=32)
    manifest = write_packed_output(
        tmp_path / "o", plan_splits(train, s, eos_id=EOS, validation=val), s, Provenance()
    )
    assert manifest["megatron_bridge"]["packed_val_data_path"] == "validation/validation_32.idx.parquet"
    assert manifest["splits"]["validation"]["samples_packed"] == 10
    with pytest.raises(ValueError, match="not both"):
        plan_splits(train, PackSettings(seq_length=32, val_fraction=0.1), eos_id=EOS, validation=val)


def test_existing_output_refused_and_overwrite_guard(tmp_path: Path) -> None:
    samples = make_samples([[1, 2, EOS], [3, EOS]])
    pack_to(tmp_path / "o", samples, seq_length=8)
    with pytest.raises(OutputExistsError, match="overwrite=True"):
        pack_to(tmp_path / "o", samples, seq_length=8)
    pack_to(tmp_path / "o", samples, seq_length=8, overwrite=True)
    (tmp_path / "o" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"notes\.txt"):
        pack_to(tmp_path / "o", samples, seq_length=8, overwrite=True)


def test_interrupted_run_leaves_no_manifest(tmp_path: Path, monkeypatch) -> None:
    import longpack.packed.pipeline as pipeline

    samples, _, _ = random_samples(600, seed=0, max_len=30)
    calls = {"n": 0}
    real = pipeline.fill_rows

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "fill_rows", failing)
    with pytest.raises(KeyboardInterrupt):
        pack_to(tmp_path / "o", samples, seq_length=32, rows_per_shard=100)
    assert not (tmp_path / "o" / MANIFEST_NAME).exists()
    assert not [p for p in (tmp_path / "o").iterdir() if ".tmp-" in p.name]
    report = inspect_output(tmp_path / "o", verify=True)
    assert not report["finished"] and not report["ok"]
    assert "unfinished" in report["problems"][0]


def test_inspect_verify_passes_then_catches_tampering(tmp_path: Path) -> None:
    samples, _, _ = random_samples(300, seed=4, max_len=40)
    pack_to(
        tmp_path / "o", samples, seq_length=32, pad_seq_to_mult=4, overlength="truncate", val_fraction=0.2
    )
    report = inspect_output(tmp_path / "o", verify=True)
    assert report["ok"], report["problems"]
    assert report["splits"]["training"]["samples"] + report["splits"]["validation"]["samples"] == 300
    path = tmp_path / "o" / "training_32.idx.parquet"
    table = pq.read_table(path)
    ids = table.column("input_ids").to_pylist()
    ids[0] = ids[0][:-1]
    pq.write_table(table.set_column(0, "input_ids", pa.array(ids, pa.list_(pa.int64()))), path)
    problems = " | ".join(inspect_output(tmp_path / "o", verify=True)["problems"])
    assert "loss_mask length" in problems and "sha256" in problems


def test_empty_split_and_bad_settings() -> None:
    samples = make_samples([[1, 1, 1, 1, 1, EOS]])
    with pytest.raises(ValueError, match="no samples left to pack"):
        plan_splits(samples, PackSettings(seq_length=3), eos_id=EOS)
    with pytest.raises(ValueError, match="must not exceed pack_size"):
        PackSettings(seq_length=10, pack_size=8)


# ---------------------------------------------------------------------------------------------------
# Behaviours Megatron-Bridge's test_parquet.py / test_paths.py assert.


def _table(ids, mask, starts) -> pa.Table:
    return pa.table({"input_ids": [ids], "loss_mask": [mask], "seq_start_id": [starts]})


def test_validate_rows_cases_from_spec() -> None:
    assert validate_rows(_table([1, 2, 3], [0, 1, 0], [0, 1])) == []
    assert "loss_mask length" in validate_rows(_table([1, 2, 3], [0, 1], [0]))[0]
    assert "must start with 0" in validate_rows(_table([1, 2, 3], [0, 1, 0], [1]))[0]
    assert "must start with 0" in validate_rows(_table([1, 2, 3], [0, 1, 0], []))[0]
    assert ">=" in validate_rows(_table([1, 2, 3], [0, 1, 0], [0, 5]))[0]
    assert "not non-decreasing" in validate_rows(_table([1, 2, 3, 4], [0] * 4, [0, 3, 1]))[0]


def test_resolve_packed_parquet_paths_cases(tmp_path: Path) -> None:
    for i in range(3):
        pq.write_table(_table([1, 2], [0, 0], [0]), tmp_path / f"shard_{i}.idx.parquet")
    names = lambda spec: [Path(p).name for p in resolve_packed_parquet_paths(spec)]  # noqa: E731
    assert resolve_packed_parquet_paths(tmp_path / "shard_1.idx.parquet") == [
        str(tmp_path / "shard_1.idx.parquet")
    ]
    assert names(str(tmp_path / "shard_*.idx.parquet")) == [
        "shard_0.idx.parquet",
        "shard_1.idx.parquet",
        "shard_2.idx.parquet",
    ]
    assert names(str(tmp_path / "shard_[01].idx.parquet")) == ["shard_0.idx.parquet", "shard_1.idx.parquet"]
    assert len(resolve_packed_parquet_paths(tmp_path)) == 3
    with pytest.raises(ValueError, match="not found"):
        resolve_packed_parquet_paths(tmp_path / "missing.idx.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="No Parquet files found"):
        resolve_packed_parquet_paths(tmp_path / "empty")
