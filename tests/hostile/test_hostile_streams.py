"""Round three (issue 27): data that vanished without a word, and scratch files left behind.

- A compressed input (``.gz``, ``.zst``) cut short or damaged is an error naming the file and the last
  complete line, strict or ``--skip-malformed`` (zstandard's readers returned the part before the cut as
  the whole file: the rows after it were lost, exit 0).
- SIGTERM during an out-of-core pack removes the spill folder (and still ends the process by the signal);
  a rerun removes a spill folder a ``kill -9`` left.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_helpers import assert_accounting, assert_clean, examples, invoke

zstandard = pytest.importorskip("zstandard")
PACK = ["--tokenizer", "bytes", "--seq-length", "64"]
ROWS = 240


def _data() -> bytes:
    return b"".join(
        json.dumps({"prompt": f"q{i}", "completion": "a" * (i % 40 + 1)}).encode() + b"\n"
        for i in range(ROWS)
    )


def _compress(kind: str, data: bytes, frames: int) -> bytes:
    """``frames`` gzip members / zstd frames, one after another (both formats allow it)."""
    lines = data.splitlines(keepends=True)  # frames end at line ends, as a writer's flushes do
    step = max(1, len(lines) // frames)
    parts = [b"".join(lines[i : i + step]) for i in range(0, len(lines), step)]
    if kind == "gz":
        return b"".join(gzip.compress(p) for p in parts)
    return b"".join(zstandard.ZstdCompressor(write_checksum=True).compress(p) for p in parts)


def _decodable_lines(kind: str, blob: bytes) -> tuple[int, bool]:
    """(complete lines before the damage, whether the stream is whole), decoded independently."""
    lines = 0
    if kind == "gz":
        decoder = zlib.decompressobj(wbits=31)
        try:
            while blob:
                lines += decoder.decompress(blob).count(b"\n")
                if not decoder.eof:
                    return lines, False
                blob, decoder = decoder.unused_data, zlib.decompressobj(wbits=31)
        except zlib.error:
            return lines, False
        return lines, True
    dctx = zstandard.ZstdDecompressor()
    try:
        while blob:
            obj = dctx.decompressobj()
            lines += obj.decompress(blob).count(b"\n")
            if not obj.eof:
                return lines, False
            blob = obj.unused_data
    except zstandard.ZstdError:
        return lines, False
    return lines, True


@settings(
    max_examples=examples(8), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["gz", "zst"]),
    frames=st.integers(1, 4),
    cut=st.floats(0.02, 0.999),
    flips=st.integers(0, 3),
    seed=st.integers(0, 2**16),
    skip=st.booleans(),
)
def test_a_damaged_compressed_stream_is_never_packed_short(
    tmp_path_factory, kind, frames, cut, flips, seed, skip
):
    import random

    folder = tmp_path_factory.mktemp("stream")
    blob = bytearray(_compress(kind, _data(), frames))
    rng = random.Random(seed)
    for _ in range(flips):
        blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
    blob = blob[: max(1, int(len(blob) * cut))] if flips == 0 else blob
    path = folder / f"rows.jsonl.{kind}"
    path.write_bytes(bytes(blob))
    good, whole = _decodable_lines(kind, bytes(blob))
    out = folder / "out"
    outcome = assert_clean(
        invoke(["pack", path, "--out", out, *PACK, *(["--skip-malformed"] if skip else [])]),
        frozenset({0, 2}),
    )
    if outcome.exit_code == 0:  # only a stream that decodes whole (a cut exactly between frames)
        assert whole, str(outcome)
        manifest = json.loads((out / "manifest.json").read_text())
        assert_accounting(manifest)
        assert manifest["counts"]["rows_read"] == good
    else:
        assert not whole or flips, str(outcome)
        assert path.name in outcome.output, str(outcome)
        if not whole and "after line" in outcome.output:
            assert f"after line {good} " in outcome.output, (good, str(outcome))
        assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_cut_stream_names_the_last_complete_line(tmp_path: Path, kind: str) -> None:
    blob = _compress(kind, _data(), 3)
    path = tmp_path / f"rows.jsonl.{kind}"
    path.write_bytes(blob[: len(blob) * 5 // 6])  # inside the last frame: two frames decode whole
    good, whole = _decodable_lines(kind, path.read_bytes())
    assert not whole and good >= 2 * ROWS // 3 - 1
    for skip in ([], ["--skip-malformed"]):
        outcome = assert_clean(invoke(["pack", path, "--out", tmp_path / "o", *PACK, *skip]))
        assert outcome.exit_code == 2 and f"{path.name}:{good + 1}" in outcome.output, str(outcome)
        assert f"after line {good} (the last complete line" in outcome.output


# -- SIGTERM during an out-of-core pack ----------------------------------------------------------------------


def _spills(parent: Path) -> list[Path]:
    return sorted(parent.glob(".out.spill-*"))


def test_sigterm_during_an_out_of_core_pack_removes_the_spill_folder(tmp_path: Path) -> None:
    data = tmp_path / "big.jsonl"
    rows = [json.dumps({"input_ids": list(range(i % 50 + 5))}) for i in range(60_000)]
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    argv = [sys.executable, "-m", "longpack.cli.app", "pack", str(data), "--out", str(out), *PACK]
    argv += ["--memory-budget", "1K", "--rows-per-shard", "50"]
    # the suite may run with SIGTERM's disposition inherited as anything: the child starts from the default
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not _spills(tmp_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"pack never spilled: {proc.stdout.read()}")  # type: ignore[union-attr]
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    output = proc.stdout.read()  # type: ignore[union-attr]
    assert code == -signal.SIGTERM, output
    assert "Traceback" not in output, output
    assert not _spills(tmp_path), list(tmp_path.iterdir())
    assert not (out / "manifest.json").exists()


def test_a_rerun_removes_a_spill_folder_a_killed_run_left(world, tmp_path: Path) -> None:
    stale = tmp_path / ".out.spill-99999-7f"
    (stale / "tokens").mkdir(parents=True)
    (stale / "tokens" / "ids.bin").write_bytes(b"\0" * 4096)
    other = tmp_path / ".other.spill-1-1"  # another output's scratch folder: not ours to remove
    other.mkdir()
    assert_clean(invoke(["pack", world.good, "--out", tmp_path / "out", *PACK]), frozenset({0}))
    assert not stale.exists() and other.exists()
