"""Start-up: how long a short ``longpack pack`` takes, cold (the first run after installing) and warm.

Each ``--python`` is the interpreter of a virtual environment with longpack installed (non-editable, as a user
installs it). For every one, in fresh processes:

- ``cold``: the first ``longpack pack`` of a 10-row JSON Lines file after removing every on-disk cache longpack
  or numba keeps in that install (numba's ``*.nbi`` / ``*.nbc`` kernel caches in the package's
  ``__pycache__``), i.e. what the first call after ``pip install`` pays;
- ``warm``: the same command again (median of ``--repeats``);
- ``3 items``: a process that imports ``longpack.binpack`` and packs three lengths
  (``python -c "from longpack.binpack import pack_lengths; pack_lengths([3, 5, 2], 8)"``).

Wall seconds and CPU seconds (user + sys of the child) for each, with the ``bytes`` tokenizer (no vocabulary
to load) and ``qwen3`` (tiktoken's 151k-token vocabulary). Set up the environments like this (offline wheels
in ``/tmp/wheels``; ``before`` = a checkout of the commit before issue 19):

    python3 -m venv /tmp/v-before && /tmp/v-before/bin/pip install --no-index -f /tmp/wheels "/path/before[pack]"
    python3 -m venv /tmp/v-after && /tmp/v-after/bin/pip install --no-index -f /tmp/wheels ".[pack]"
    python benchmarks/startup.py --python before=/tmp/v-before/bin/python --python after=/tmp/v-after/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _run(cmd: list[str], cwd: Path) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LONGPACK_KERNELS")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _clear_caches(python: str) -> int:
    """Remove numba's kernel caches from the install of longpack that ``python`` imports."""
    where = subprocess.run(
        [python, "-c", "import longpack, os; print(os.path.dirname(longpack.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout.strip()
    removed = 0
    for path in Path(where).rglob("*"):
        if path.suffix in (".nbi", ".nbc"):
            path.unlink()
            removed += 1
    return removed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", required=True, help="LABEL=/path/to/venv/bin/python")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs (shared)")
    print(
        f"{'install':<10} {'tokenizer':<9} {'cold wall':>9} {'cold CPU':>9} {'warm wall':>9} {'warm CPU':>9}"
    )
    with tempfile.TemporaryDirectory(prefix="longpack-startup-") as tmp:
        root = Path(tmp)
        rows = root / "ten.jsonl"
        rows.write_text(
            "".join(
                json.dumps({"prompt": f"question {i}", "completion": "answer " * (i + 3)}) + "\n"
                for i in range(10)
            )
        )
        three: dict[str, tuple[float, float]] = {}
        for spec in args.python:
            label, python = spec.split("=", 1)
            longpack = str(Path(python).with_name("longpack"))
            for tokenizer in ("bytes", "qwen3"):
                pack = [
                    longpack,
                    "pack",
                    str(rows),
                    "--tokenizer",
                    tokenizer,
                    "--seq-length",
                    "256",
                    "--overwrite",
                ]
                _clear_caches(python)
                cold = _run([*pack, "--out", str(root / f"cold-{label}-{tokenizer}")], root)
                warm = [
                    _run([*pack, "--out", str(root / f"warm-{label}-{tokenizer}")], root)
                    for _ in range(args.repeats)
                ]
                print(
                    f"{label:<10} {tokenizer:<9} {cold[0]:>9.2f} {cold[1]:>9.2f} "
                    f"{statistics.median(w[0] for w in warm):>9.2f} {statistics.median(w[1] for w in warm):>9.2f}",
                    flush=True,
                )
            code = "from longpack.binpack import pack_lengths; pack_lengths([3, 5, 2], 8)"
            runs = [_run([python, "-c", code], root) for _ in range(args.repeats)]
            three[label] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for label, (wall, cpu) in three.items():
            print(f"{label:<10} 3 items: {wall:.2f} s wall, {cpu:.2f} CPU-s (median of {args.repeats}, warm)")


if __name__ == "__main__":
    main()
