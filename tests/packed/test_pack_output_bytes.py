"""Output bytes of fixed small pre-tokenized runs, against recorded sha256s. A change here means the packed
files changed: that is a format change, not a refactor. The hashes are of Parquet bytes, so a pyarrow upgrade
that changes its writer may move them too (re-record only after checking the rows with the
Megatron-exactness and round-trip tests).

History: recorded before the read/fill/write performance work (commit 108392b); re-recorded on purpose for
the hand-off work (issue 14), which changed only the encoding: dictionary pages for ``loss_mask`` (the
``use_dictionary`` leaf path; the rows are the same), row groups of about 65,536 tokens (here 256 rows;
``longpack.packed.files.default_row_group_size``), and the validation split moved into ``validation/``.
Writing the same plans with the old options still gives the old hashes (checked when re-recording).
Re-recorded on purpose for the reader work (issue 19), again an encoding change only: every row is its own
data page (``max_rows_per_page=1``, pages up to ``16 * pack_size`` bytes) and the file's schema metadata says
so (``longpack.one_row_per_page``), which lets a reader decode one row without its row group
(``longpack.packed.pages``). With the previous page options the previous hashes come out unchanged (checked
when re-recording).
Re-recorded on purpose for the memory-map reader (issue 26), an encoding change only: the pages are written
uncompressed (``compression="none"`` in ``longpack.packed.files.one_row_pages``), so a reader takes a row's
values straight from a memory map of the file. With snappy pages the previous hashes come out unchanged
(checked when re-recording); Megatron-Bridge's own reader reads the new files (reader harness, Bridge
067f987df: demo, tp2/cp4/sp, pad_cu_seqlens with fixed-width rows, int32 ids: PASS).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longpack.packed import PackSettings, Provenance, plan_splits, write_packed_output
from longpack.text import TextConfig, tokenize_inputs
from longpack.text import inputs as inputs_mod

N = 3000
EOS = 258  # the ``bytes`` tokenizer's EOS


def _rows(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(30), 0.9, size=N).round(), 2, 200).astype(int)
    ids = [rng.integers(0, 259, n).astype(np.int32) for n in lengths]
    masks = [(np.arange(n) >= rng.integers(0, n)).astype(np.int8) for n in lengths]
    return ids, masks


def _write_inputs(folder: Path) -> dict[str, Path]:
    ids, masks = _rows(0)
    folder.mkdir(parents=True, exist_ok=True)
    parquet = folder / "pre.parquet"
    table = pa.table(
        {
            "input_ids": pa.array([x.tolist() for x in ids], pa.list_(pa.int32())),
            "loss_mask": pa.array([m.tolist() for m in masks], pa.list_(pa.int8())),
        }
    )
    pq.write_table(table, parquet, row_group_size=700)
    jsonl = folder / "pre.jsonl"
    with open(jsonl, "w") as fh:
        for i, (x, m) in enumerate(zip(ids, masks, strict=True)):
            if i % 500 == 7:
                fh.write("\n")  # blank lines keep line numbers
            fh.write(json.dumps({"input_ids": x.tolist(), "loss_mask": m.tolist()}) + "\n")
    no_mask = folder / "nomask.parquet"
    pq.write_table(
        pa.table({"input_ids": pa.array([x.tolist() for x in ids[:500]], pa.list_(pa.int64()))}), no_mask
    )
    return {"parquet": parquet, "jsonl": jsonl, "nomask": no_mask}


def _digest(arrays: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(str(a.dtype).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _run(inputs: list[Path], out: Path, algorithm: str, workers: int) -> dict[str, str]:
    r = tokenize_inputs([str(p) for p in inputs], tokenizer="bytes", config=TextConfig(), workers=workers)
    s = r.samples
    got = {"samples": _digest([s.tokens, s.loss_mask, s.offsets, s.source_file, s.source_row])}
    settings = PackSettings(
        seq_length=256, pad_seq_to_mult=4, algorithm=algorithm, val_fraction=0.1, rows_per_shard=500
    )
    write_packed_output(out, plan_splits(s, settings, eos_id=EOS), settings, Provenance(inputs=r.inputs))
    assert (out / "bridge_config.yaml").is_file()  # names the folder's absolute path: not hashed here
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name not in ("manifest.json", "bridge_config.yaml"):
            got[p.relative_to(out).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return got


# pyarrow 26; see the module docstring for when and why these were recorded.
EXPECTED: dict[str, dict[str, str]] = {
    "parquet+jsonl:best_fit_decreasing": {
        "samples": "d91dafddc2768a13",
        "256_metadata.jsonl": "adb016e8de9ef2d2",
        "training_256.part-00000-of-00002.idx.parquet": "05eda55cad687cf5",
        "training_256.part-00001-of-00002.idx.parquet": "510b8c0cf286f3b2",
        "validation/validation_256.idx.parquet": "532546608700e2bf",
    },
    "parquet+nomask:first_fit_shuffle": {
        "samples": "47371df6c2279cdc",
        "256_metadata.jsonl": "2f674db4cc258bf4",
        "training_256.part-00000-of-00002.idx.parquet": "5fa8a53c00c8d9df",
        "training_256.part-00001-of-00002.idx.parquet": "e81638f2fa9d7871",
        "validation/validation_256.idx.parquet": "2120c8c480fedac2",
    },
}


@pytest.mark.parametrize("case", ["parquet+jsonl:best_fit_decreasing", "parquet+nomask:first_fit_shuffle"])
def test_packed_output_bytes_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.setattr(inputs_mod, "PARQUET_CHUNK_ROWS", 1024)  # chunk edges inside row groups
    monkeypatch.setattr(inputs_mod, "JSONL_CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr("longpack.text.pipeline.INLINE_BYTES", 0)  # the JSONL case with worker processes
    files = _write_inputs(tmp_path / "in")
    names, algorithm = case.split(":")
    # Parquet-only inputs with 2 workers (inline either way; the JSONL case would start processes).
    workers = 1 if "jsonl" in names else 2
    got = _run([files[n] for n in names.split("+")], tmp_path / "out", algorithm, workers)
    assert got == EXPECTED[case]


@pytest.mark.parametrize("reserve", [None, 0, 5, 1000])
def test_growable_buffer_fills_in_place_with_any_reserve(reserve: int | None) -> None:
    from longpack.text.pipeline import _Growable

    buf = _Growable(np.int32, reserve)
    parts = [np.arange(k, dtype=np.int64) for k in (3, 0, 70_000, 7)]  # cast while copying
    for p in parts:
        buf.extend(p)
    out = buf.finish()
    assert out.dtype == np.int32 and out.tolist() == np.concatenate(parts).tolist()
