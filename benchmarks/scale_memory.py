"""Peak memory of ``longpack tokenize`` and of ``pack --output-format indexed`` against corpus size: in
memory, and bounded (a sharded store: ``tokenize --shard-bytes``; ``pack --memory-budget``).

Each run is a fresh ``longpack`` process (``python -m longpack.cli.app``) on the same text documents
(``{"text": ...}`` rows, the built-in ``bytes`` tokenizer: one token per byte, so tokens = input bytes), at
1x, 4x and 16x the base size. Its peak memory is sampled every 10 ms from ``/proc/<pid>/status``:
``RssAnon`` (its own memory: what the OOM killer counts; the exponent is taken of it) and ``RssFile`` (file
pages it maps and has resident: the input's and the store's memory maps, page cache the kernel takes back
when it needs the room); ``VmHWM``, the kernel's high-water mark, counts both. The growth exponent is the slope of log(peak) against log(size) from 1x to 16x: about 1 when
memory follows the corpus, about 0 when it does not. Bounded outputs are compared with the in-memory ones
byte for byte (``.bin`` / ``.idx``; store arrays read back equal) or the run stops.

    PYTHONPATH=src python benchmarks/scale_memory.py [--base-mb 4] [--scales 1,4,16] [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_docs(path: Path, megabytes: float, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    words = np.array(["alpha", "beta", "gamma", "delta", "long", "context", "pack", "token", "42"])
    target, size, n = int(megabytes * 2**20), 0, 0
    with open(path, "w") as fh:
        while size < target:
            k = int(rng.integers(20, 400))
            line = json.dumps({"text": " ".join(words[rng.integers(0, len(words), k)])}) + "\n"
            fh.write(line)
            size += len(line)
            n += 1
    return n


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key = line.split(":", 1)[0]
                if key in ("RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def run(cmd: list[str]) -> tuple[float, int, int, int]:
    """``(wall seconds, peak RssAnon, peak RssFile, VmHWM)`` of one child process (bytes)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    anon = file = hwm = 0
    while proc.poll() is None:
        now = _status(proc.pid)
        anon, file = max(anon, now.get("RssAnon", 0)), max(file, now.get("RssFile", 0))
        hwm = max(hwm, now.get("VmHWM", 0))
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, anon, file, hwm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-mb", type=float, default=4.0)
    ap.add_argument("--scales", default="1,4,16")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--shard-bytes", default="4M")
    ap.add_argument("--budget", default="32M")
    args = ap.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    lp = [sys.executable, "-m", "longpack.cli.app"]
    w = ["--workers", str(args.workers)]
    rows: dict[str, list[tuple[int, float, int, int, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        for scale in scales:
            data = tmp / f"docs{scale}.jsonl"
            make_docs(data, args.base_mb * scale)
            runs = {
                "tokenize (one array set)": [*lp, "tokenize", str(data), "--tokenizer", "bytes", *w,
                                             "--out", str(tmp / f"s{scale}")],
                f"tokenize --shard-bytes {args.shard_bytes}": [*lp, "tokenize", str(data), "--tokenizer", "bytes",
                                                               *w, "--shard-bytes", args.shard_bytes,
                                                               "--out", str(tmp / f"t{scale}")],
                "pack indexed (in memory)": [*lp, "pack", str(data), "--tokenizer", "bytes", *w,
                                             "--output-format", "indexed", "--seq-length", "4096",
                                             "--out", str(tmp / f"i{scale}")],
                f"pack indexed --memory-budget {args.budget}": [*lp, "pack", str(data), "--tokenizer", "bytes", *w,
                                                                "--output-format", "indexed", "--seq-length",
                                                                "4096", "--memory-budget", args.budget,
                                                                "--out", str(tmp / f"j{scale}")],
            }  # fmt: skip
            for name, cmd in runs.items():
                rows.setdefault(name, []).append((scale, *run(cmd)))
            # every prefix (past about 2^27 tokens the output has several) byte for byte
            names = sorted(p.name for p in (tmp / f"i{scale}").iterdir() if p.suffix in (".bin", ".idx"))
            got_names = sorted(p.name for p in (tmp / f"j{scale}").iterdir() if p.suffix in (".bin", ".idx"))
            if not names or names != got_names:
                raise SystemExit(f"the prefixes differ at {scale}x: {names} vs {got_names}")
            for name in names:
                if (tmp / f"i{scale}" / name).read_bytes() != (tmp / f"j{scale}" / name).read_bytes():
                    raise SystemExit(f"{name} differs at {scale}x: not the same output")
            from longpack.store import TokenStore

            s, t = TokenStore.open(tmp / f"s{scale}"), TokenStore.open(tmp / f"t{scale}")
            if not np.array_equal(s.samples.tokens, t.samples.tokens) or s.record != t.record:
                raise SystemExit(f"the sharded store differs at {scale}x")
    print(f"base corpus {args.base_mb} MiB of text documents (bytes tokenizer), workers {args.workers}")
    print(
        "peak MiB per corpus size: RssAnon / RssFile / VmHWM, wall s; exponent of RssAnon from the first to the last size"
    )
    header = "".join(f"{f'{s}x':>22}{'':>6}" for s in scales)
    print(f"{'run':<44}{header}{'exponent':>10}")
    for name, got in rows.items():
        cells = "".join(
            f"{f'{a / 2**20:.0f} / {f / 2**20:.0f} / {h / 2**20:.0f}':>22}{wall:>6.1f}"
            for _, wall, a, f, h in got
        )
        (s0, _, p0, _, _), (s1, _, p1, _, _) = got[0], got[-1]
        exponent = math.log(p1 / p0) / math.log(s1 / s0) if s1 != s0 else float("nan")
        print(f"{name:<44}{cells}{exponent:>10.2f}")


if __name__ == "__main__":
    main()
