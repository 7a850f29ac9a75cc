"""Damaged packed folders: rows, bytes and manifests, through every reader (inspect, inspect --verify,
thd-batch, check --packed, PackedFolder, PackedDataset). A damaged folder is never reported as sound and
never crashes a reader."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_helpers import assert_clean, deadline, examples, invoke
from longpack.errors import LongpackError
from longpack.packed import PackedFolder

READERS = [
    ["inspect", "{out}"],
    ["inspect", "{out}", "--verify", "--json"],
    ["thd-batch", "{out}", "--pack-size", "64", "--batch-size", "2"],
    ["check", "--packed", "{out}"],
]


def _read_everything(out: Path) -> None:
    """Every reader of a packed folder, CLI and Python: clean exits, LongpackError or success only."""
    for argv in READERS:
        assert_clean(invoke([a.format(out=out) for a in argv]))
    with deadline():
        try:
            folder = PackedFolder.open(out, allow_unfinished=True)
            folder.validate(verify=True)
            for split in folder.split_names:
                folder.scan(split, verify=True)
                folder.sample_lengths(split)
        except LongpackError:
            pass


def _verify_exit(out: Path) -> int:
    return assert_clean(invoke(["inspect", out, "--verify"])).exit_code


def _first_shard(out: Path) -> Path:
    return sorted(out.glob("training_*.idx.parquet"))[0]


ROW_DAMAGE = st.one_of(
    st.tuples(st.just("seq_start_id"), st.lists(st.integers(-(2**40), 2**40), max_size=6)),
    st.tuples(st.just("seq_start_id"), st.lists(st.integers(-3, 80), max_size=6)),
    st.tuples(st.just("input_ids"), st.lists(st.integers(-5, 2**31), max_size=90)),
    st.tuples(st.just("loss_mask"), st.lists(st.integers(-3, 300), max_size=90)),
)


@settings(
    max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(row=st.integers(0, 4), damage=ROW_DAMAGE)
def test_damaged_rows_are_found_by_verify_and_never_crash_a_reader(
    world, tmp_path_factory, row, damage
) -> None:
    out = world.copy_packed(tmp_path_factory.mktemp("rows") / "p")
    shard = _first_shard(out)
    table = pq.read_table(shard)
    column, values = damage
    rows = table.to_pylist()
    row = min(row, len(rows) - 1)
    if rows[row][column] == values:
        return  # not a change
    rows[row][column] = values
    schema = table.schema  # the damaged column widened, so any integer fits
    i = schema.get_field_index(column)
    schema = schema.set(i, pa.field(column, pa.list_(pa.int64())))
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), shard)
    assert _verify_exit(out) in (1, 2)  # a damaged file is never "all checks passed"
    _read_everything(out)


@settings(
    max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 40), cut=st.booleans())
def test_corrupt_shard_bytes(world, tmp_path_factory, seed: int, flips: int, cut: bool) -> None:
    """Random byte flips (or a cut) in a shard: a damaged data page, footer or header."""
    out = world.copy_packed(tmp_path_factory.mktemp("bytes") / "p")
    shard = _first_shard(out)
    data = bytearray(shard.read_bytes())
    rng = random.Random(seed)
    if cut:
        data = data[: rng.randrange(len(data))]
    else:
        for _ in range(flips):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    shard.write_bytes(bytes(data))
    assert _verify_exit(out) in (1, 2)
    _read_everything(out)


def _damage_folder(out: Path, how: str) -> None:
    shard = _first_shard(out)
    if how == "missing shard":
        shard.unlink()
    elif how == "missing shard and manifest":
        shard.unlink()
        (out / "manifest.json").unlink()
    elif how == "missing metadata":
        next(out.glob("*_metadata.jsonl")).unlink()
    elif how == "metadata not json":
        next(out.glob("*_metadata.jsonl")).write_text("{nope")
    elif how == "metadata wrong shape":
        next(out.glob("*_metadata.jsonl")).write_text('[{"pack_size": "x"}, 5]')
    elif how == "extra shard":
        shutil.copy(shard, out / "training_64.part-00099-of-00100.idx.parquet")
    elif how == "shard is a folder":
        shard.unlink()
        shard.mkdir()
    elif how == "empty shard":
        shard.write_bytes(b"")
    elif how == "missing column":
        pq.write_table(pq.read_table(shard).drop(["seq_start_id"]), shard)
    elif how == "nulls":
        t = pq.read_table(shard).to_pylist()
        t[0]["input_ids"] = None
        pq.write_table(pa.Table.from_pylist(t, schema=pq.read_schema(shard)), shard)
    elif how == "strings":
        t = pq.read_table(shard)
        pq.write_table(t.set_column(0, "input_ids", pa.array([["a"]] * t.num_rows)), shard)
    elif how == "zero rows":
        t = pq.read_table(shard)
        pq.write_table(t.slice(0, 0), shard)
    else:
        raise AssertionError(how)


FOLDER_DAMAGE = [
    "missing shard",
    "missing shard and manifest",
    "missing metadata",
    "metadata not json",
    "metadata wrong shape",
    "extra shard",
    "shard is a folder",
    "empty shard",
    "missing column",
    "nulls",
    "strings",
    "zero rows",
]


@pytest.mark.parametrize("how", FOLDER_DAMAGE)
def test_damaged_folder(world, tmp_path: Path, how: str) -> None:
    out = world.copy_packed(tmp_path / "p")
    _damage_folder(out, how)
    assert _verify_exit(out) in (1, 2)
    _read_everything(out)


def test_check_packed_refuses_a_half_output(world, tmp_path: Path) -> None:
    """A missing shard and no manifest: `check --packed` does not say OK (inspect does not either)."""
    out = world.copy_packed(tmp_path / "p")
    _damage_folder(out, "missing shard and manifest")
    outcome = assert_clean(invoke(["check", "--packed", out]))
    assert outcome.exit_code == 2 and "unfinished" in outcome.output, str(outcome)


MANIFESTS = {
    "not json": "{nope",
    "a list": "[1, 2]",
    "a string": '"manifest"',
    "deep": "[" * 100_000 + "]" * 100_000,
    "splits a number": json.dumps({"splits": 5}),
    "files a number": json.dumps({"splits": {"training": {"files": 5}}}),
    "file name a number": json.dumps({"splits": {"training": {"files": [{"name": 5}]}}}),
    "file name a path": json.dumps({"splits": {"training": {"files": [{"name": "../../etc/passwd"}]}}}),
    "rows a string": json.dumps({"splits": {"training": {"rows": "x", "files": []}}}),
    "truncated a number": json.dumps({"splits": {"training": {"truncated": 5}}}),
    "settings a number": json.dumps({"settings": 3, "splits": {}}),
    "counts a list": json.dumps({"counts": [1], "splits": {}}),
    "pack_size a string": json.dumps({"settings": {"pack_size": "x"}, "splits": {}}),
    "eos a float": json.dumps({"tokenizer": {"eos_id": 1.5}, "splits": {}}),
    "empty object": "{}",
    "not utf-8": b"\xff\xfe{}",
}


@pytest.mark.parametrize("name", list(MANIFESTS))
def test_malformed_manifest(world, tmp_path: Path, name: str) -> None:
    out = world.copy_packed(tmp_path / "p")
    text = MANIFESTS[name]
    (out / "manifest.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    assert _verify_exit(out) in (1, 2)
    _read_everything(out)


@pytest.mark.parametrize("name", ["not json", "file name a number", "settings a number", "deep"])
def test_a_malformed_manifest_is_refused_by_name_when_reading_strictly(
    world, tmp_path: Path, name: str
) -> None:
    out = world.copy_packed(tmp_path / "p")
    (out / "manifest.json").write_text(MANIFESTS[name])
    with pytest.raises(LongpackError, match="manifest"):
        PackedFolder.open(out)


def test_packed_dataset_on_damaged_data(world, tmp_path: Path) -> None:
    """The runtime reader (torch) on damaged folders: a LongpackError (or IndexError for a row out of
    range, as a Sequence), never anything else."""
    pytest.importorskip("torch")
    from longpack.runtime.dataset import PackedDataset

    for how in ("missing shard", "strings", "nulls", "zero rows", "missing column"):
        out = world.copy_packed(tmp_path / how.replace(" ", "_"))
        _damage_folder(out, how)
        with deadline():
            try:
                ds = PackedDataset(PackedFolder.open(out, allow_unfinished=True), split="training")
                for i in range(len(ds)):
                    ds[i]
            except (LongpackError, IndexError):
                pass


def test_inspect_names_a_damaged_manifest_as_damaged_not_missing(world, tmp_path: Path) -> None:
    out = world.copy_packed(tmp_path / "p")
    (out / "manifest.json").write_text('{"counts": 5')
    outcome = assert_clean(invoke(["inspect", str(out)]))
    assert outcome.exit_code == 1, str(outcome)
    assert "manifest.json cannot be read" in outcome.output and "not valid JSON" in outcome.output
    assert "no manifest.json" not in outcome.output
