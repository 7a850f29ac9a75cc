"""End-to-end `longpack pack` pipeline vs a faithful re-implementation of Megatron-Bridge's offline packing.

Each measurement runs in a fresh subprocess (so peak RSS is that run's own). Inputs are generated here:

* pre-tokenized: a Parquet file of ``input_ids`` (list<int32>) + ``loss_mask`` (list<int8>) rows with
  SFT-like runtime lengths (log-normal, median 350 tokens, clipped to 16..4096);
* text (qwen3): a JSONL of prompt/completion rows made of English words from the standard library's
  docstrings, tokenized with the built-in ``qwen3`` tokenizer.

longpack: ``tokenize_inputs`` -> ``plan_splits`` (best_fit_decreasing, and first_fit_shuffle) ->
``write_packed_output`` (``input_ids`` int64 by default; ``--ids-dtypes int64,int32`` adds the opt-in
``--ids-dtype int32`` runs). Baseline (Megatron-Bridge ``data/packing``): rows read into Python
dicts of lists (pre-tokenized) or tokenized one sample at a time (text, serial, as ``num_tokenizer_workers``
defaults on main), ``create_hist`` into per-length lists, ``first_fit_shuffle`` with the O(N log N) segment
tree first fit, ``fill_packing_strategy`` with per-length permutations and Python list extends, one
``pq.write_table(row_group_size=500)`` of a list of dicts.

    python benchmarks/pack_pipeline.py                        # 100k, both inputs, ours + baseline
    python benchmarks/pack_pipeline.py --sizes 1000000 --inputs pretokenized --baseline-max 300000
    python benchmarks/pack_pipeline.py --inputs pretokenized --repeats 3 --ids-dtypes int64,int32
    python benchmarks/pack_pipeline.py --pack-only 1000000 --algorithm first_fit_shuffle   # pack stage alone

Peak RSS is compared with the token data size (int32 tokens + uint8 mask = 5 bytes per stored token). It is
the main process's peak; tokenizer workers (forkserver processes) are not included.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SEQ_LENGTH = 4096
QWEN3_EOS = 151645  # <|im_end|>; pre-tokenized rows use the qwen3 vocabulary


def sft_lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(350), 0.9, size=n)), 16, SEQ_LENGTH).astype(np.int64)


def make_pretokenized(path: Path, n: int, seed: int = 0) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    lengths = sft_lengths(n, seed) + 1  # stored = runtime + 1
    writer = None
    total = 0
    for lo in range(0, n, 50_000):
        part = lengths[lo : lo + 50_000]
        offsets = np.zeros(len(part) + 1, dtype=np.int32)
        np.cumsum(part, out=offsets[1:])
        tokens = rng.integers(3, 150_000, size=int(offsets[-1]), dtype=np.int32)
        tokens[offsets[1:] - 1] = QWEN3_EOS
        within = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], part)
        prompt = np.repeat((part * rng.uniform(0.2, 0.7, size=len(part))).astype(np.int64), part)
        mask = (within >= prompt).astype(np.int8)
        table = pa.table(
            {
                "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
                "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
            }
        )
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
        total += int(offsets[-1])
    assert writer is not None
    writer.close()
    return total


def _words() -> list[str]:
    import collections
    import json as json_mod
    import os as os_mod
    import pathlib
    import re

    text = " ".join(
        (obj.__doc__ or "")
        for mod in (collections, json_mod, os_mod, pathlib, re, argparse, subprocess)
        for obj in [mod, *(getattr(mod, a) for a in dir(mod) if not a.startswith("_"))]
    )
    words = re.findall(r"[A-Za-z][a-z]+", text)
    return words or ["word"]


def make_text(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = np.array(_words())
    lengths = sft_lengths(n, seed)
    with open(path, "w") as fh:
        for length in lengths.tolist():
            n_words = max(4, int(length * 0.75))  # ~1.3 tokens per word
            picked = words[rng.integers(0, len(words), size=n_words)]
            cut = max(1, int(n_words * rng.uniform(0.2, 0.7)))
            fh.write(
                json.dumps({"prompt": " ".join(picked[:cut]), "completion": " ".join(picked[cut:])}) + "\n"
            )


# ---------------------------------------------------------------------------------------------------
# Runs (each in its own process).


def run_ours(kind: str, path: Path, out: Path, algorithm: str, ids_dtype: str = "int64") -> dict:
    from longpack.packed import PackSettings, Provenance, plan_splits, write_packed_output
    from longpack.text import TextConfig, tokenize_inputs

    t0 = time.perf_counter()
    fmt = "pretokenized" if kind == "pretokenized" else "prompt_completion"
    result = tokenize_inputs([str(path)], tokenizer="qwen3", config=TextConfig(format=fmt), workers=None)
    t1 = time.perf_counter()
    eos = int(result.tokenizer["eos_id"])
    settings = PackSettings(
        seq_length=SEQ_LENGTH, algorithm=algorithm, overlength="drop", ids_dtype=ids_dtype
    )
    splits = plan_splits(result.samples, settings, eos_id=eos)
    manifest = write_packed_output(out, splits, settings, Provenance(inputs=result.inputs), overwrite=True)
    t2 = time.perf_counter()
    return {
        "seconds": t2 - t0,
        "tokenize_seconds": t1 - t0,
        "samples": len(result.samples),
        "stored_tokens": int(result.samples.offsets[-1]),
        "rows": manifest["counts"]["rows"]["training"],
        "efficiency": manifest["splits"]["training"]["metadata"]["packing_efficiency"],
    }


def _segment_tree_first_fit(seqlens: list[int], pack_size: int) -> list[list[int]]:
    """Megatron-Bridge's first_fit: max segment tree over remaining capacity, leftmost fit."""
    n = max(len(seqlens), 1)
    size = 1
    while size < n:
        size *= 2
    tree = [0] * (2 * size)
    bins: list[list[int]] = []
    for length in seqlens:
        node = 1
        if tree[1] >= length:
            while node < size:
                node = 2 * node if tree[2 * node] >= length else 2 * node + 1
            index = node - size
        else:
            index = -1
        if index == -1 or index >= len(bins):
            index = len(bins)
            bins.append([])
            node = index + size
            tree[node] = pack_size - length
        else:
            node = index + size
            tree[node] -= length
        bins[index].append(length)
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return bins


def run_baseline(kind: str, path: Path, out: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    if kind == "pretokenized":
        table = pq.read_table(path)
        dataset = [
            {"input_ids": ids, "loss_mask": mask}
            for ids, mask in zip(
                table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), strict=True
            )
        ]
        del table
    else:
        from longpack.text import load_tokenizer

        tok = load_tokenizer("qwen3")
        eos = int(tok.identity()["eos_id"])
        dataset = []
        with open(path) as fh:
            for line in fh:
                row = json.loads(line)
                prompt = tok.encode(row["prompt"].strip(" "))
                completion = tok.encode(row["completion"].strip(" "))
                ids = prompt + completion + [eos]
                dataset.append(
                    {"input_ids": ids, "loss_mask": [0] * len(prompt) + [1] * (len(completion) + 1)}
                )
    t1 = time.perf_counter()
    stored_tokens = sum(len(d["input_ids"]) for d in dataset)
    # create_hist
    sequences: dict[int, list[dict]] = {}
    histogram = [0] * (SEQ_LENGTH + 1)
    for item in dataset:
        length = len(item["input_ids"]) - 1
        if length > SEQ_LENGTH:
            continue
        sequences.setdefault(length, []).append(item)
        histogram[length] += 1
    state = np.random.get_state()
    np.random.seed(0)
    seqlens = [length for length, count in enumerate(histogram) for _ in range(count)]
    shuffled = list(seqlens)
    np.random.shuffle(shuffled)
    assignments = _segment_tree_first_fit(shuffled, SEQ_LENGTH)
    # fill_packing_strategy
    ids_by_len, mask_by_len = {}, {}
    for length in range(SEQ_LENGTH + 1):
        items = sequences.get(length)
        if not items:
            continue
        perm = np.random.permutation(len(items))
        ids_by_len[length] = [items[i]["input_ids"] for i in perm]
        mask_by_len[length] = [[*items[i]["loss_mask"][1:], 0] for i in perm]
    rows = []
    for assignment in assignments:
        row: dict[str, list[int]] = {"input_ids": [], "loss_mask": [], "seq_start_id": []}
        for length in assignment:
            row["seq_start_id"].append(len(row["input_ids"]))
            row["input_ids"].extend(ids_by_len[length].pop())
            row["loss_mask"].extend(mask_by_len[length].pop())
        rows.append(row)
    np.random.set_state(state)
    # write_packed_parquet: one write_table call, row groups of 500
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(
        [
            {
                "input_ids": r["input_ids"],
                "loss_mask": [int(v) for v in r["loss_mask"]],
                "seq_start_id": r["seq_start_id"],
            }
            for r in rows
        ],
        schema=pa.schema(
            [
                ("input_ids", pa.list_(pa.int64())),
                ("loss_mask", pa.list_(pa.int8())),
                ("seq_start_id", pa.list_(pa.int64())),
            ]
        ),
    )
    pq.write_table(table, out / f"training_{SEQ_LENGTH}.idx.parquet", row_group_size=500)
    t2 = time.perf_counter()
    return {
        "seconds": t2 - t0,
        "tokenize_seconds": t1 - t0,
        "samples": len(dataset),
        "stored_tokens": stored_tokens,
        "rows": len(rows),
    }


def pack_stage_only(n: int, algorithm: str) -> None:
    """Align + plan + fill + write + hashes on in-memory samples (no reading): time and RSS over the data."""
    from longpack.packed import PackSettings, Provenance, plan_splits, write_packed_output
    from longpack.samples import TokenizedSamples

    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    rng = np.random.default_rng(0)
    lengths = sft_lengths(n, 0) + 1
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), np.int32)
    for lo in range(0, len(tokens), 50_000_000):
        chunk = tokens[lo : lo + 50_000_000]
        chunk[:] = rng.integers(3, 150_000, size=len(chunk), dtype=np.int32)
    samples = TokenizedSamples(
        tokens=tokens,
        loss_mask=np.ones(len(tokens), np.uint8),
        offsets=offsets,
        source_file=np.zeros(n, np.int32),
        source_row=np.arange(n),
        files=("synthetic",),
    )
    base = peak()
    settings = PackSettings(seq_length=SEQ_LENGTH, algorithm=algorithm)
    t0 = time.perf_counter()
    splits = plan_splits(samples, settings, eos_id=QWEN3_EOS)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="longpack-bench-") as tmp:
        write_packed_output(Path(tmp) / "o", splits, settings, Provenance())
    t2 = time.perf_counter()
    print(
        f"pack stage, N={n}, {len(tokens)} tokens ({len(tokens) * 5 / 2**30:.2f} GiB token data), {algorithm}: "
        f"align+plan {t1 - t0:.2f} s, fill+write+hash {t2 - t1:.2f} s, {n / (t2 - t0):.0f} samples/s; "
        f"peak RSS {peak():.2f} GiB = samples {base:.2f} GiB + {peak() - base:.2f} GiB"
    )


def _vm_hwm_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux


def child(args: argparse.Namespace) -> None:
    path, out = Path(args.path), Path(args.out)
    if args.impl == "baseline":
        result = run_baseline(args.kind, path, out)
    else:
        _, algorithm, *dtype = args.impl.split(":")
        result = run_ours(args.kind, path, out, algorithm, *dtype)
    # Main process plus the largest *direct* child (ru_maxrss of children is the largest reaped child's peak).
    # The text layer's workers are forkserver children, not ours, so "+worker" reads 0 for them.
    # The main peak is VmHWM, the high-water mark of this process's own memory map: ru_maxrss survives
    # execve on Linux, so in a child spawned by this (data-generating) script it would report the parent's
    # peak whenever that is larger (it was: 1.3 GiB at 100k, twice this process's own peak).
    main_peak = _vm_hwm_bytes()
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    result["peak_rss_main_bytes"] = main_peak
    result["peak_rss_worker_bytes"] = worker_peak
    result["peak_rss_bytes"] = main_peak + worker_peak
    print("RESULT " + json.dumps(result))


def measure(impl: str, kind: str, path: Path, out: Path) -> dict | None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--impl",
            impl,
            "--kind",
            kind,
            "--path",
            str(path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"  {impl} {kind}: failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}", file=sys.stderr)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000")
    parser.add_argument("--inputs", default="pretokenized,qwen3")
    parser.add_argument(
        "--baseline-max",
        type=int,
        default=300_000,
        help="Largest size the baseline runs at (its Python lists need ~90 bytes per token).",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--ids-dtypes",
        default="int64",
        help="input_ids types to run ours with (int64, int32 or both: 'int64,int32'); int32 rows are "
        "named ours:ALGORITHM:int32.",
    )
    parser.add_argument(
        "--algorithms", default="best_fit_decreasing,first_fit_shuffle", help="Our algorithms to run."
    )
    parser.add_argument(
        "--pack-only", type=int, default=0, help="Only the pack stage on N in-memory samples (no reading)."
    )
    parser.add_argument("--algorithm", default="best_fit_decreasing", help="With --pack-only.")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--impl", default="")
    parser.add_argument("--kind", default="")
    parser.add_argument("--path", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.pack_only:
        pack_stage_only(args.pack_only, args.algorithm)
        return
    print(f"cores: {os.cpu_count()} (shared machine); seq_length {SEQ_LENGTH}")
    header = (
        f"{'input':<13}{'N':>9}  {'implementation':<32}{'seconds':>9}{'read+tok':>9}{'pack+write':>11}"
        f"{'samples/s':>11}{'RSS main':>10}{'+worker':>9}{'(main+w)/data':>15}"
    )
    print(header)
    with tempfile.TemporaryDirectory(prefix="longpack-bench-") as tmp:
        root = Path(tmp)
        for n in [int(s) for s in args.sizes.split(",")]:
            for kind in args.inputs.split(","):
                src = root / (f"in_{n}.parquet" if kind == "pretokenized" else f"in_{n}.jsonl")
                if kind == "pretokenized":
                    make_pretokenized(src, n)
                else:
                    make_text(src, n)
                impls = [
                    f"ours:{alg}" + ("" if dtype == "int64" else f":{dtype}")
                    for dtype in args.ids_dtypes.split(",")
                    for alg in args.algorithms.split(",")
                ]
                if n <= args.baseline_max:
                    impls.append("baseline")
                results = {}
                for impl in impls:
                    runs = [measure(impl, kind, src, root / "out") for _ in range(args.repeats)]
                    ok = [r for r in runs if r]
                    if not ok:
                        continue
                    r = sorted(ok, key=lambda x: x["seconds"])[len(ok) // 2]
                    results[impl] = r
                    data = r["stored_tokens"] * 5
                    print(
                        f"{kind:<13}{n:>9}  {impl:<32}{r['seconds']:>9.2f}{r['tokenize_seconds']:>9.2f}"
                        f"{r['seconds'] - r['tokenize_seconds']:>11.2f}{r['samples'] / r['seconds']:>11.0f}"
                        f"{r['peak_rss_main_bytes'] / 2**30:>9.2f}G{r['peak_rss_worker_bytes'] / 2**30:>8.2f}G"
                        f"{r['peak_rss_bytes'] / data:>15.2f}",
                        flush=True,
                    )
                if "baseline" in results:
                    base = results["baseline"]["seconds"]
                    for impl, r in results.items():
                        if impl != "baseline":
                            b = results["baseline"]
                            print(
                                f"{'':<22}{impl}: {base / r['seconds']:.1f}x faster end to end, "
                                f"{(base - b['tokenize_seconds']) / (r['seconds'] - r['tokenize_seconds']):.1f}x "
                                "on pack+write"
                            )
                else:
                    print(
                        f"{'':<22}baseline not run at N={n} (> --baseline-max {args.baseline_max}: its Python "
                        "lists need ~90 bytes per token)"
                    )
                src.unlink()


if __name__ == "__main__":
    main()
