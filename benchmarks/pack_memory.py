"""Peak memory of ``longpack pack`` against corpus size, in memory and out of core (``--memory-budget``).

Each run is one fresh process running ``longpack.PackConfig(...).run()`` on a pre-tokenized JSON Lines file
(``{"input_ids": [...], "loss_mask": [...]}`` rows) and reports its peak resident memory (``VmHWM``), and
apart, sampled every 20 ms, the peaks of its own memory (``RssAnon``) and of resident file pages it maps
(``RssFile``: the input's and the scratch files' memory maps, page cache the kernel can take back), wall and
CPU seconds. ``in-memory`` holds every token (the default below half of the machine's memory);
``out-of-core`` sets ``memory_budget`` to ``--budget`` (64 MiB): tokens go to a scratch folder in pass 1 and
rows are filled from its memory maps in pass 2; ``from-store`` packs a token store of the same rows
(``longpack.TokenizeConfig``, made beforehand in another process, not measured): the tokens are read from the
store's memory maps. The outputs are compared file by file (sha256) with the first mode's: they must be
identical (the manifest's ``store`` entry aside).

Samples are short (lognormal, median 48 tokens, 4..512; pack size 4096) so that 10M samples fit this
machine's disk and, in memory, its RAM: the point is how peak memory grows with the number of samples and
tokens. Token data = 5 bytes per stored token (int32 id + uint8 mask).

    python benchmarks/pack_memory.py --sizes 1000000,5000000,10000000 --data-dir /tmp/pack-memory
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PACK = 4096


def make_input(path: Path, n: int, seed: int = 0) -> int:
    from pack_pipeline import _jsonl_kernels  # this folder: the same row formatter

    fmt = _jsonl_kernels()["format_rows"]
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(48), 0.9, size=n)), 4, 512).astype(np.int64)
    total = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        for lo in range(0, n, 200_000):
            part = lengths[lo : lo + 200_000]
            offsets = np.zeros(len(part) + 1, np.int64)
            np.cumsum(part, out=offsets[1:])
            tokens = rng.integers(3, 150_000, int(offsets[-1])).astype(np.int64)
            mask = (rng.random(int(offsets[-1])) < 0.6).astype(np.int64)
            out = np.empty(int(offsets[-1]) * 12 + len(part) * 40, np.uint8)
            k = fmt(tokens, mask, offsets, out)  # type: ignore[operator]
            fh.write(out[:k].tobytes())
            total += int(offsets[-1])
    tmp.rename(path)
    return total


def _status_kib(*keys: str) -> dict[str, int]:
    found: dict[str, int] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name = line.split(":", 1)[0]
            if name in keys:
                found[name] = int(line.split()[1])
    return found


class PeakSampler:
    """Peak ``RssAnon`` (the process's own memory: what the OOM killer counts) and ``RssFile`` (file pages
    mapped and resident: input and scratch-file memory maps; the kernel can drop them at will), sampled
    every 20 ms on a thread. ``VmHWM`` counts both together."""

    def __init__(self) -> None:
        import threading

        self.anon = self.file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.sample()

    def sample(self) -> None:
        now = _status_kib("RssAnon", "RssFile")
        self.anon = max(self.anon, now.get("RssAnon", 0) * 1024)
        self.file = max(self.file, now.get("RssFile", 0) * 1024)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def child(args: argparse.Namespace) -> None:
    import longpack
    from longpack.text import TextConfig

    budget = None if args.mode == "in-memory" else args.budget
    store = Path(args.path).with_suffix(".store")
    if args.mode == "from-store" and not (store / "store.json").exists():
        longpack.TokenizeConfig(
            inputs=[args.path],
            out=store,
            tokenizer="qwen3",
            text=TextConfig(format="pretokenized"),
            overwrite=True,
        ).run()
        return
    sampler = PeakSampler()
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if args.mode == "from-store":
        result = longpack.PackConfig(store=store, out=args.out, seq_length=PACK, overwrite=True).run()
    else:
        result = longpack.PackConfig(
            inputs=[args.path],
            out=args.out,
            tokenizer="qwen3",
            seq_length=PACK,
            text=TextConfig(format="pretokenized"),
            memory_budget=budget if budget is not None else 10**15,
            overwrite=True,
        ).run()
    wall = time.perf_counter() - t0
    sampler.stop()
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    hwm = _status_kib("VmHWM")["VmHWM"] * 1024
    out = Path(args.out)
    digests = {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
        and p.name not in ("bridge_config.yaml", "manifest.json")  # absolute paths; store entry
    }
    print(
        "RESULT "
        + json.dumps(
            {
                "wall": wall,
                "cpu": (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime),
                "peak": hwm,
                "peak_anon": sampler.anon,
                "peak_file": sampler.file,
                "samples": result.counts["samples_read"],
                "spilled": (result.backend or {}).get("out_of_core", {}).get("spilled_tokens", 0),
                "digests": digests,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,5000000,10000000")
    ap.add_argument("--budget", type=int, default=64 * 2**20)
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--modes", default="in-memory,out-of-core,from-store")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="")
    ap.add_argument("--path", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs (shared)")
    print(
        f"{'samples':>10} {'tokens':>12} {'data GiB':>9} {'mode':<12} {'VmHWM GiB':>9} {'peak/data':>10} "
        f"{'anon GiB':>9} {'anon/data':>9} {'anon B/tok':>10} {'file GiB':>9} {'wall s':>8} {'CPU s':>8}  output"
    )
    with tempfile.TemporaryDirectory(prefix="longpack-mem-") as tmp:
        data_dir = Path(args.data_dir) if args.data_dir else Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        for n in [int(x) for x in args.sizes.split(",")]:
            src = data_dir / f"short_{n}.pretok.jsonl"
            if not src.exists():
                make_input(src, n)
            results = {}
            for mode in args.modes.split(","):
                out = Path(tmp) / f"out-{mode}"
                env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--mode",
                    mode,
                    "--path",
                    str(src),
                    "--out",
                    str(out),
                ]
                if mode == "from-store":  # tokenize into the store first (not measured)
                    subprocess.run(cmd, env=env, check=True, capture_output=True)
                proc = subprocess.run(
                    [*cmd, "--budget", str(args.budget)],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=False,
                )
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(f"{n:>10} {mode}: failed ({proc.returncode}) {proc.stderr[-600:]}", flush=True)
                    continue
                r = json.loads(line[7:])
                results[mode] = r
                same = ""
                if len(results) >= 2:
                    a, b = results[next(iter(results))]["digests"], r["digests"]
                    same = "identical" if a == b else "DIFFERENT"
                data = _token_bytes(src)
                print(
                    f"{n:>10} {data // 5:>12} {data / 2**30:>9.2f} {mode:<12} {r['peak'] / 2**30:>9.2f} "
                    f"{r['peak'] / data:>10.2f} {r['peak_anon'] / 2**30:>9.2f} {r['peak_anon'] / data:>9.2f} "
                    f"{r['peak_anon'] / (data / 5):>10.2f} "
                    f"{r['peak_file'] / 2**30:>9.2f} {r['wall']:>8.1f} {r['cpu']:>8.1f}  {same}",
                    flush=True,
                )
                for p in sorted(out.rglob("*"), reverse=True):
                    p.unlink() if p.is_file() else p.rmdir()
            if not args.data_dir:
                src.unlink()
                shutil.rmtree(src.with_suffix(".store"), ignore_errors=True)


def _token_bytes(src: Path) -> int:
    """Token data of a generated file (5 bytes per token), from its digit and comma counts."""
    cache = src.with_suffix(".tokens")
    if cache.exists():
        return int(cache.read_text())
    commas = 0
    rows = 0
    with open(src, "rb") as fh:
        while block := fh.read(1 << 24):
            commas += block.count(b",")
            rows += block.count(b"\n")
    # per row: (n - 1) commas in each of the two lists, plus the one between them
    tokens = (commas - rows) // 2 + rows
    cache.write_text(str(tokens * 5))
    return tokens * 5


if __name__ == "__main__":
    main()
