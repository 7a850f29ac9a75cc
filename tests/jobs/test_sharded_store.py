"""The sharded token store (``longpack.store/2``): shards written by several writers, one manifest last,
readers see one store; packs from it are byte-identical to packs from one store whatever the number of
shards or writers; ``--resume`` after a SIGKILL redoes only the unfinished shards."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longpack.errors import OutputError
from longpack.jobs import PackConfig, TokenizeConfig
from longpack.store import SHARDED_FORMAT, TokenStore, finish_store, finished_shards, write_shard
from longpack.text import TextConfig
from packed_helpers import assert_same_output

SRC = Path(__file__).resolve().parents[2] / "src"


def rows(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(json.dumps({"text": "" if i % 9 == 0 else "doc " * int(rng.integers(1, 40))}))
        else:
            out.append(json.dumps({"text": f"row {i} " + "w" * int(rng.integers(0, 200))}))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    (d / "a.jsonl").write_text("\n".join(rows(700, 1)) + "\n")
    (d / "b.jsonl").write_text("\n".join(rows(300, 2)) + "\n\n")  # a trailing blank line
    (d / "c.jsonl").write_text("")  # empty: hashed and listed, no rows
    return d


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory) -> TokenStore:
    out = tmp_path_factory.mktemp("single") / "store"
    TokenizeConfig(inputs=[corpus], out=out, tokenizer="bytes", workers=1).run()
    return TokenStore.open(out)


def same_store(a: TokenStore, b: TokenStore) -> None:
    for name in ("tokens", "loss_mask", "offsets", "source_file", "source_row"):
        x, y = getattr(a.samples, name), getattr(b.samples, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.samples.files == b.samples.files
    assert a.record == b.record and a.manifest["input_files"] == b.manifest["input_files"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shard_bytes=st.integers(min_value=2_000, max_value=200_000))
def test_any_number_of_shards_reads_as_the_one_store(corpus, single, tmp_path_factory, shard_bytes) -> None:
    out = tmp_path_factory.mktemp("sharded") / "store"
    r = TokenizeConfig(inputs=[corpus], out=out, tokenizer="bytes", workers=1, shard_bytes=shard_bytes).run()
    store = TokenStore.open(out)
    assert store.manifest["format"] == SHARDED_FORMAT
    assert r.summary()["shards"] == len(store.manifest["shards"]) >= 1
    same_store(single, store)


def test_packs_from_a_sharded_store_written_by_two_workers_are_byte_identical(
    corpus, single, tmp_path
) -> None:
    out = tmp_path / "store"
    TokenizeConfig(inputs=[corpus], out=out, tokenizer="bytes", workers=2, shard_bytes="8K").run()
    sharded = TokenStore.open(out)
    assert len(sharded.manifest["shards"]) > 4
    same_store(single, sharded)
    for fmt in ("parquet", "npy"):
        a = PackConfig(store=single.path, out=tmp_path / f"one-{fmt}", seq_length=256, output_format=fmt)
        b = PackConfig(store=out, out=tmp_path / f"many-{fmt}", seq_length=256, output_format=fmt)
        ra, rb = a.run(), b.run()
        skip = ("manifest.json",)  # names its store
        assert_same_output(ra.out, rb.out, skip=skip)
        ma, mb = ra.manifest.to_dict(), rb.manifest.to_dict()
        ma.pop("store"), mb.pop("store")
        assert ma == mb


def _writer(args: tuple[str, int, int, int]) -> int:
    """One writer process: its own shard of a store (every shard indexes the same input list)."""
    from longpack.samples import TokenizedSamples

    store, k, n, seed = args
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 9, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    samples = TokenizedSamples(
        tokens=rng.integers(0, 300, int(offsets[-1])).astype(np.int32),
        loss_mask=np.ones(int(offsets[-1]), np.uint8), offsets=offsets,
        source_file=np.full(n, k % 2, np.int32), source_row=np.arange(n) + 100 * k, files=("x.jsonl", "y.jsonl"),
    )  # fmt: skip
    write_shard(store, k, samples)
    return n


def test_writers_in_other_processes_and_the_manifest_last(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with ProcessPoolExecutor(2) as pool:
        counts = list(pool.map(_writer, [(str(store), k, 5 + k, k) for k in (2, 0, 1)]))
    assert sorted(finished_shards(store)) == [0, 1, 2]
    assert not (store / "store.json").exists()  # no reader sees it before the manifest
    with pytest.raises(OutputError, match=r"shard\(s\) \[3\] of 4 are not finished"):
        finish_store(store, 4, ("x.jsonl", "y.jsonl"), {})
    with pytest.raises(OutputError, match="another input list"):
        finish_store(store, 3, ("z.jsonl",), {})
    finish_store(store, 3, ("x.jsonl", "y.jsonl"), {"format": "pretokenized"})
    s = TokenStore.open(store)
    assert len(s.samples) == sum(counts) and s.samples.source_row[:5].tolist() == list(range(5))
    assert s.samples.provenance(5) == "y.jsonl:100"  # shard 1's first sample


def _tokenize_cmd(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "longpack.cli.app", "tokenize", str(corpus), "--tokenizer", "bytes", "--out",
        str(out), "--workers", "1", "--shard-bytes", "2K", *extra,
    ]  # fmt: skip


def test_resume_after_sigkill_redoes_only_unfinished_shards(corpus, single, tmp_path: Path) -> None:
    out = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        _tokenize_cmd(corpus, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while len(finished_shards(out)) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = finished_shards(out)
    assert proc.returncode == -signal.SIGKILL and kept, "the run finished before it could be killed"
    assert not (out / "store.json").exists()  # killed: the store reads as unfinished
    stamps = {k: (out / "shards" / f"{k:05d}" / "shard.json").stat().st_mtime_ns for k in kept}
    again = subprocess.run(_tokenize_cmd(corpus, out), env=env, capture_output=True, text=True)
    assert again.returncode == 2 and "--resume" in again.stderr  # refused without --resume
    done = subprocess.run(_tokenize_cmd(corpus, out, "--resume"), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for k, stamp in stamps.items():  # the shards written before the kill were kept, not redone
        assert (out / "shards" / f"{k:05d}" / "shard.json").stat().st_mtime_ns == stamp
    resumed = TokenStore.open(out)
    assert len(resumed.manifest["shards"]) > len(kept)
    same_store(single, resumed)
    whole = tmp_path / "whole"
    subprocess.run(_tokenize_cmd(corpus, whole), env=env, check=True, capture_output=True)
    for path in sorted(p.relative_to(whole) for p in whole.rglob("*") if p.is_file()):
        assert (out / path).read_bytes() == (whole / path).read_bytes(), path


def test_resume_needs_shards_and_text_options_are_kept(corpus, tmp_path: Path) -> None:
    from longpack.errors import ConfigError

    with pytest.raises(ConfigError, match="resume finishes a sharded store"):
        TokenizeConfig(inputs=[corpus], out=tmp_path / "s", tokenizer="bytes", resume=True)
    out = tmp_path / "eod"
    TokenizeConfig(
        inputs=[corpus], out=out, tokenizer="qwen3", shard_bytes="16K", text=TextConfig(eod="<|endoftext|>")
    ).run()
    s = TokenStore.open(out)
    ends = s.samples.offsets[1:] - 1
    assert set(np.asarray(s.samples.tokens)[ends].tolist()) == {151643}
    assert s.record["eod_id"] == 151643 and s.record["empty"]


def test_indexed_within_a_memory_budget_is_byte_identical(corpus, tmp_path: Path) -> None:
    """``--memory-budget`` with indexed output: through a scratch sharded store (prefixes that span
    several shards are streamed from their views), the same files as in memory; no scratch left."""
    common = {"inputs": [corpus], "tokenizer": "bytes", "seq_length": 128, "output_format": "indexed"}
    a = PackConfig(**common, out=tmp_path / "mem", rows_per_shard=170, workers=1).run()
    b = PackConfig(**common, out=tmp_path / "budget", rows_per_shard=170, workers=2, memory_budget="8M").run()
    names = sorted(p.name for p in a.out.iterdir())
    assert names == sorted(p.name for p in b.out.iterdir()) and len(names) > 6
    for name in names:
        x, y = (a.out / name).read_bytes(), (b.out / name).read_bytes()
        if name == "data_path.txt":
            x, y = x.replace(str(a.out).encode(), b""), y.replace(str(b.out).encode(), b"")
        assert x == y, name
    assert not [p for p in tmp_path.iterdir() if ".spill" in p.name]


def test_prefix_streamed_from_shard_views(corpus, single, tmp_path: Path) -> None:
    from longpack.packed.indexed import write_indexed_part

    out = tmp_path / "store"
    TokenizeConfig(inputs=[corpus], out=out, tokenizer="bytes", workers=1, shard_bytes="4K").run()
    store = TokenStore.open(out, join=False)
    pieces = store.samples_pieces(10, 600)
    assert len(pieces) > 3  # the range spans shards
    empty = np.zeros(0, np.int64)
    got = write_indexed_part(
        tmp_path / "a", pieces, vocab_size=300, eod_id=258, empty_before=empty, chunk_tokens=999
    )
    ref = write_indexed_part(tmp_path / "b", single.samples.take(np.arange(10, 600)), vocab_size=300, eod_id=258,
                             empty_before=empty)  # fmt: skip
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"b{ext}").read_bytes()
    assert all(np.array_equal(x, y) for x, y in zip(got[1], ref[1], strict=True))


def test_resume_redoes_the_shards_of_a_changed_input(corpus, tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "in"
    shutil.copytree(corpus, src)
    out = tmp_path / "store"
    config = {"inputs": [src], "tokenizer": "bytes", "workers": 1, "shard_bytes": "4K"}
    TokenizeConfig(**config, out=out).run()
    a_shards = {
        k for k, m in finished_shards(out).items() if m["meta"]["report"]["rows_read"].keys() == {"0"}
    }
    stamps = {k: (out / "shards" / f"{k:05d}" / "shard.json").stat().st_mtime_ns for k in a_shards}
    with open(src / "b.jsonl", "a") as fh:  # b.jsonl changes: its shards (and only they) are redone
        fh.write("\n".join(rows(200, 9)) + "\n")
    TokenizeConfig(**config, out=out, resume=True).run()
    assert stamps and all(
        (out / "shards" / f"{k:05d}" / "shard.json").stat().st_mtime_ns == t for k, t in stamps.items()
    )
    fresh = tmp_path / "fresh"
    TokenizeConfig(**config, out=fresh).run()
    names = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    for name in names:
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name


@contextlib.contextmanager
def _small_disk(folder: Path, mode: str, nbytes: int):
    """A disk that fills up after about ``nbytes`` of shards: a real tmpfs of that size (``tmpfs``, where
    this process may mount one; grown with a remount to "free space"), or ``fh.write`` refusing with ENOSPC
    past that many bytes (``simulated``, anywhere). Yields a function that frees the space."""
    if mode == "tmpfs":
        folder.mkdir()
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={nbytes}", "tmpfs", str(folder)], capture_output=True
        )
        if mount.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({mount.stderr.decode().strip()}); the simulated run covers it"
            )
        try:
            yield lambda: subprocess.run(["mount", "-o", "remount,size=64M", str(folder)], check=True)
        finally:
            subprocess.run(["umount", str(folder)], check=False)
        return
    from longpack import outputs

    written = [0]
    write = outputs.ArrayWriter.write

    def full(self, data):
        written[0] += memoryview(data).nbytes
        if written[0] > nbytes:
            raise OSError(errno.ENOSPC, "No space left on device", getattr(self.fh, "name", None))
        return write(self, data)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(outputs.ArrayWriter, "write", full)
        yield lambda: mp.setattr(outputs.ArrayWriter, "write", write)


@pytest.mark.parametrize("mode", ["tmpfs", "simulated"])
def test_resume_after_a_full_disk_redoes_only_unfinished_shards(corpus, single, tmp_path: Path, mode) -> None:
    """A disk fills up mid-way: the run stops with the disk-full error (no store.json: unfinished), the
    shards finished before it are kept by ``--resume`` once space is freed, and the store is byte-identical
    to an uninterrupted run's."""
    common = {"inputs": [corpus], "tokenizer": "bytes", "workers": 1, "shard_bytes": "8K"}
    whole = tmp_path / "whole"
    TokenizeConfig(out=whole, **common).run()
    disk = tmp_path / "disk"
    with _small_disk(disk, mode, 200_000) as free:
        out = disk / "store" if mode == "tmpfs" else tmp_path / "store"
        with pytest.raises(OutputError, match=r"No space left on device \(the disk is full\).*store\.json"):
            TokenizeConfig(out=out, **common).run()
        kept = finished_shards(out)
        assert kept and not (out / "store.json").exists()
        stamps = {k: (out / "shards" / f"{k:05d}" / "shard.json").stat().st_mtime_ns for k in kept}
        free()
        TokenizeConfig(out=out, resume=True, **common).run()
        for k, stamp in stamps.items():
            assert (out / "shards" / f"{k:05d}" / "shard.json").stat().st_mtime_ns == stamp
        assert len(TokenStore.open(out).manifest["shards"]) > len(kept)
        for path in sorted(p.relative_to(whole) for p in whole.rglob("*") if p.is_file()):
            assert (out / path).read_bytes() == (whole / path).read_bytes(), path


def test_compressed_and_json_array_inputs_shard_as_their_plain_copy(corpus, tmp_path: Path) -> None:
    """.gz / .zst JSON Lines and a JSON array are sharded too (streamed from their start): the sharded
    store equals the one-array store of the same files, record included."""
    import gzip

    zstandard = pytest.importorskip("zstandard")
    data = (corpus / "a.jsonl").read_bytes()
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (d / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    lines = [line for line in data.decode().splitlines() if line]
    (d / "c.json").write_text("[\n" + ",\n".join(lines[:200]) + "\n]\n")
    one = tmp_path / "one"
    TokenizeConfig(inputs=[d], out=one, tokenizer="bytes", workers=1).run()
    sharded = tmp_path / "sharded"
    TokenizeConfig(inputs=[d], out=sharded, tokenizer="bytes", workers=2, shard_bytes="8K").run()
    store = TokenStore.open(sharded)
    assert len(store.manifest["shards"]) > 3
    same_store(TokenStore.open(one), store)
    assert [i["kind"] for i in store.record["inputs"]] == ["jsonl", "jsonl", "json_array"]
