"""``compat="megatron-bridge"`` writes the bytes Megatron-Bridge's own prepare step writes.

The fixtures in ``tests/data/bridge_compat/`` were written by running Bridge's real
``prepare_gpt_sft_packed_data`` (``benchmarks/bridge_fixtures.py``; commit and versions in the README there)
on the tokenized samples stored next to them: over-long samples (dropped at ``pad_seq_to_mult`` 1, truncated
at 8), one-token samples (kept, as Bridge keeps them), samples with and without a final EOS. Bridge is not
needed here: the files are compared byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from longpack.jobs.pack import PackConfig
from longpack.packed import PackSettings, Provenance, plan_splits, write_packed_output
from longpack.packed.folder import PackedFolder
from packed_helpers import make_samples

DATA = Path(__file__).resolve().parents[1] / "data" / "bridge_compat"
EOS = 258
CASES = {"m1": (32, 24, 1), "m8": (32, 32, 8)}


def _samples(split: str):  # type: ignore[no-untyped-def]
    rows = [json.loads(line) for line in (DATA / f"samples_{split}.jsonl").read_text().splitlines()]
    return make_samples([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], file=f"{split}.jsonl")


@pytest.mark.parametrize("case", sorted(CASES))
def test_compat_files_are_byte_identical_to_bridges(tmp_path: Path, case: str) -> None:
    pack_size, seq_length, mult = CASES[case]
    config = PackConfig(
        inputs=["unused.jsonl"],
        out=tmp_path / "unused",
        tokenizer="bytes",
        seq_length=seq_length,
        pack_size=pack_size,
        pad_seq_to_mult=mult,
        compat="megatron-bridge",
    )
    settings = config.settings  # the job's resolution of the compat mode
    assert (settings.algorithm, settings.seed, settings.overlength) == (
        "first_fit_shuffle",
        1234,
        "drop" if mult == 1 else "truncate",
    )
    train, val = _samples("training"), _samples("validation")
    assert (train.stored_lengths() == 1).sum() > 50  # the samples hold what the mode must get right
    splits = plan_splits(train, settings, eos_id=EOS, validation=val)
    out = tmp_path / "out"
    manifest = write_packed_output(out, splits, settings, Provenance(tokenizer={"eos_id": EOS}))
    expected = DATA / case
    pairs = {
        f"training_{pack_size}.idx.parquet": f"training_{pack_size}.idx.parquet",
        f"validation/validation_{pack_size}.idx.parquet": f"validation_{pack_size}.idx.parquet",
        f"{pack_size}_metadata.jsonl": f"{pack_size}_metadata.jsonl",
    }
    for ours, bridges in pairs.items():
        assert (out / ours).read_bytes() == (expected / bridges).read_bytes(), ours
    reports = manifest["splits"]["training"]
    if mult == 1:
        assert reports["dropped_count"] > 0 and reports["truncated_count"] == 0
    else:
        assert reports["truncated_count"] > 0 and reports["dropped_count"] == 0
    # One-token samples are packed (runtime length 0), and the folder still verifies.
    assert (PackedFolder.open(out).sample_lengths("training") == 0).any()
    assert PackedFolder.open(out).validate(verify=True) == []


def test_default_mode_differs_from_bridge_where_it_says_so(tmp_path: Path) -> None:
    """Without compat the same plan gives the same rows but longpack's own encoding (dictionary only on
    the mask, smaller row groups), so the bytes differ and the rows do not."""
    pack_size, seq_length, mult = CASES["m8"]
    train = _samples("training")
    settings = PackSettings(
        seq_length=seq_length,
        pack_size=pack_size,
        pad_seq_to_mult=mult,
        algorithm="first_fit_shuffle",
        seed=1234,
        overlength="truncate",
    )
    out = tmp_path / "out"
    write_packed_output(out, plan_splits(train, settings, eos_id=EOS), settings, Provenance())
    ours = pq.read_table(out / f"training_{pack_size}.idx.parquet")
    bridge = pq.read_table(DATA / "m8" / f"training_{pack_size}.idx.parquet")

    # Bridge keeps one-token samples; without compat they are dropped, so fewer samples are packed.
    def samples(table) -> int:  # type: ignore[no-untyped-def]
        return sum(len(x) for x in table.column("seq_start_id").to_pylist())

    assert samples(ours) < samples(bridge)
    assert (out / f"training_{pack_size}.idx.parquet").read_bytes() != (
        DATA / "m8" / f"training_{pack_size}.idx.parquet"
    ).read_bytes()
    assert pq.ParquetFile(out / f"training_{pack_size}.idx.parquet").metadata.num_row_groups > 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_compat_from_files_end_to_end(tmp_path: Path, case: str) -> None:
    """The same samples as pre-tokenized JSONL through the whole pack job: one-token rows are kept (not
    malformed) in compat mode, and the files are still Bridge's bytes."""
    pack_size, seq_length, mult = CASES[case]
    result = PackConfig(
        inputs=[DATA / "samples_training.jsonl"],
        val_inputs=[DATA / "samples_validation.jsonl"],
        out=tmp_path / "out",
        tokenizer="bytes",
        seq_length=seq_length,
        pack_size=pack_size,
        pad_seq_to_mult=mult,
        compat="megatron-bridge",
        workers=1,
    ).run()
    assert result.counts["malformed"] == 0
    expected = DATA / case
    out = tmp_path / "out"
    assert (out / f"training_{pack_size}.idx.parquet").read_bytes() == (
        expected / f"training_{pack_size}.idx.parquet"
    ).read_bytes()
    assert (out / "validation" / f"validation_{pack_size}.idx.parquet").read_bytes() == (
        expected / f"validation_{pack_size}.idx.parquet"
    ).read_bytes()


def test_default_mode_refuses_one_token_rows(tmp_path: Path) -> None:
    """Outside compat a one-token row trains on nothing and is a malformed row (file:line)."""
    data = tmp_path / "one.jsonl"
    data.write_text('{"input_ids": [5, 258]}\n{"input_ids": [7]}\n')
    with pytest.raises(Exception, match=r"one\.jsonl:2: .*1 token\(s\); a stored sample needs at least 2"):
        PackConfig(inputs=[data], out=tmp_path / "out", tokenizer="bytes", seq_length=8, workers=1).run()
