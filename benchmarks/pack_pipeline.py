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

Pre-tokenized JSON Lines (``--inputs jsonl``: ``{"input_ids": [...], "loss_mask": [...]}`` rows, median 650
runtime tokens, ~10 bytes per token, as in issue 19's 1M-row / 10 GB corpus) run against the **floor**
written here: a compiled byte scanner (numba, no validation: digit runs of a line's first list are
tokens, of its second list the mask) reading the file in blocks, then the same Parquet writer longpack uses
(``plan_splits`` + ``fill_rows`` + ``open_parquet_writer``, longpack's row groups, shards on threads) without the
hashes, the manifest or atomic renames. ``floor:1`` runs on one thread (the CPU floor), ``floor:2`` scans
the file's two halves on two threads and writes shards on two threads (the wall floor). Each row reports
CPU seconds (user + sys of the process and its reaped children) next to wall seconds, and longpack's
ratio to each floor: CPU vs ``floor:1``, wall vs ``floor:2``.

    python benchmarks/pack_pipeline.py --inputs jsonl --sizes 100000,1000000 --repeats 3 --baseline-max 0

Text (``--inputs text``: 60 % prompt/completion rows and 40 % chat conversations, qwen3) runs against the
**raw tokenizer**: tiktoken's encoder on exactly the strings longpack encodes (prompts, completions, the
rendered chat texts), on one thread; longpack's tokenizing CPU (all processes) is reported as a ratio to it.
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


def make_text_folder(folder: Path, n: int, seed: int = 0) -> None:
    """``n`` text rows in two files: 60 % prompt/completion, 40 % chat conversations (one or two exchanges,
    half with a system message), the same word mix and lengths as :func:`make_text`."""
    rng = np.random.default_rng(seed)
    words = np.array(_words())
    lengths = sft_lengths(n, seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "prompt_completion.jsonl", "w") as pc, open(folder / "chat.jsonl", "w") as chat:
        for length in lengths.tolist():
            n_words = max(4, int(length * 0.75))
            picked = words[rng.integers(0, len(words), size=n_words)]
            cut = max(1, int(n_words * rng.uniform(0.2, 0.7)))
            if rng.random() < 0.6:
                row = {"prompt": " ".join(picked[:cut]), "completion": " ".join(picked[cut:])}
                pc.write(json.dumps(row) + "\n")
                continue
            messages = (
                [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.5 else []
            )
            half = max(cut + 1, (cut + n_words) // 2) if rng.random() < 0.5 else n_words
            messages += [
                {"role": "user", "content": " ".join(picked[:cut])},
                {"role": "assistant", "content": " ".join(picked[cut:half])},
            ]
            if half < n_words:
                messages += [
                    {"role": "user", "content": "And then?"},
                    {"role": "assistant", "content": " ".join(picked[half:])},
                ]
            chat.write(json.dumps({"messages": messages}) + "\n")


def run_tokenizer_floor(path: Path) -> dict:
    """The tokenizing floor: the raw qwen3 encoder (tiktoken) on exactly the strings longpack encodes (the
    prompts and completions, the rendered chat texts), one after another on one thread. Rendering the chat
    template is done before the clock (reported apart as ``render_seconds``)."""
    from longpack.text import TextConfig, load_tokenizer
    from longpack.text.rows import chat_messages, row_tools

    tok = load_tokenizer("qwen3")
    tok.encode("warm up")  # the vocabulary is loaded before the clock
    config = TextConfig()
    texts: list[str] = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    with open(path / "prompt_completion.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            texts += [row["prompt"].strip(" "), row["completion"].strip(" ")]
    with open(path / "chat.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            pieces = tok.render_chat(chat_messages(row, "chat", config), tools=row_tools(row, config))
            texts.append("".join(t for t, _ in pieces))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    encode = tok._enc.encode  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    tokens = 0
    for text in texts:
        tokens += len(encode(text, allowed_special="all"))
    t1 = time.perf_counter()
    r2 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r2.ru_utime + r2.ru_stime) - (r1.ru_utime + r1.ru_stime)
    return {
        "seconds": t1 - t0,
        "tokenize_seconds": t1 - t0,
        "tokenize_cpu_seconds": cpu,
        "render_seconds": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
        "samples": len(texts),
        "stored_tokens": tokens,
        "rows": 0,
    }


# ---------------------------------------------------------------------------------------------------
# Pre-tokenized JSON Lines and the floor (compiled byte scanner + the same Parquet writer).

_JSONL_KERNELS: dict[str, object] = {}


def _jsonl_kernels() -> dict[str, object]:
    """numba kernels of this benchmark (compiled once per process, before any timing)."""
    if _JSONL_KERNELS:
        return _JSONL_KERNELS
    from numba import njit

    @njit(cache=True)
    def format_rows(tokens, mask, offsets, out):  # type: ignore[no-untyped-def]
        pos = 0
        head = b'{"input_ids": ['
        mid = b'], "loss_mask": ['
        tail = b"]}\n"
        digits = np.empty(20, np.uint8)
        for r in range(offsets.shape[0] - 1):
            for ch in head:
                out[pos] = ch
                pos += 1
            for j in range(offsets[r], offsets[r + 1]):
                if j > offsets[r]:
                    out[pos] = 44
                    out[pos + 1] = 32
                    pos += 2
                v = tokens[j]
                k = 0
                if v == 0:
                    digits[0] = 48
                    k = 1
                while v > 0:
                    digits[k] = 48 + v % 10
                    v //= 10
                    k += 1
                for q in range(k - 1, -1, -1):
                    out[pos] = digits[q]
                    pos += 1
            for ch in mid:
                out[pos] = ch
                pos += 1
            for j in range(offsets[r], offsets[r + 1]):
                if j > offsets[r]:
                    out[pos] = 44
                    out[pos + 1] = 32
                    pos += 2
                out[pos] = 48 + mask[j]
                pos += 1
            for ch in tail:
                out[pos] = ch
                pos += 1
        return pos

    @njit(nogil=True, cache=True)
    def floor_scan(data, tokens, mask, lengths, nt, nm, nr):  # type: ignore[no-untyped-def]
        """Digit runs -> ints: a line's first list -> tokens, its second -> mask; no validation at all."""
        lst = 0
        seen = 0
        v = 0
        innum = False
        row_start = nt
        for i in range(data.shape[0]):
            c = data[i]
            d = c - 48
            if d >= 0 and d <= 9:
                v = v * 10 + d
                innum = True
                continue
            if innum:
                if lst == 1:
                    tokens[nt] = v
                    nt += 1
                elif lst == 2:
                    mask[nm] = v
                    nm += 1
                v = 0
                innum = False
            if c == 91:  # [
                seen += 1
                lst = seen
            elif c == 93:  # ]
                lst = 0
            elif c == 10:  # newline: a row ends
                lengths[nr] = nt - row_start
                row_start = nt
                nr += 1
                seen = 0
        return nt, nm, nr

    floor_scan(np.frombuffer(b'{"input_ids": [1, 2]}\n', np.uint8), *_floor_buffers(64, np.int32), 0, 0, 0)
    _JSONL_KERNELS.update(format_rows=format_rows, floor_scan=floor_scan)
    return _JSONL_KERNELS


def jsonl_lengths(n: int, seed: int) -> np.ndarray:
    """Runtime lengths of the JSON Lines corpus: log-normal, median 650, clipped to 16..4096 (~950 mean)."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(650), 0.9, size=n)), 16, SEQ_LENGTH).astype(np.int64)


def make_pretokenized_jsonl(path: Path, n: int, seed: int = 0) -> int:
    """``{"input_ids": [...], "loss_mask": [...]}`` rows (qwen3-range ids, prompt masked); stored tokens."""
    fmt = _jsonl_kernels()["format_rows"]
    rng = np.random.default_rng(seed)
    lengths = jsonl_lengths(n, seed) + 1
    total = 0
    with open(path, "wb") as fh:
        for lo in range(0, n, 20_000):
            part = lengths[lo : lo + 20_000]
            offsets = np.zeros(len(part) + 1, np.int64)
            np.cumsum(part, out=offsets[1:])
            tokens = rng.integers(3, 150_000, int(offsets[-1])).astype(np.int64)
            tokens[offsets[1:] - 1] = QWEN3_EOS
            within = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], part)
            prompt = np.repeat((part * rng.uniform(0.2, 0.7, len(part))).astype(np.int64), part)
            mask = (within >= prompt).astype(np.int64)
            out = np.empty(int(offsets[-1]) * 12 + len(part) * 40, np.uint8)
            k = fmt(tokens, mask, offsets, out)  # type: ignore[operator]
            fh.write(out[:k].tobytes())
            total += int(offsets[-1])
    return total


def _lazy_pages(n: int, dtype: object) -> np.ndarray:
    """Anonymous pages committed only as written (what longpack's collector uses too)."""
    import mmap

    size = max(n * np.dtype(dtype).itemsize, 1)  # type: ignore[call-overload]
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype=dtype, count=n)  # type: ignore[call-overload]


def _floor_buffers(nbytes: int, dtype: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        _lazy_pages((nbytes + 1) // 2, dtype),
        _lazy_pages((nbytes + 1) // 2, np.uint8),
        _lazy_pages(nbytes // 19 + 2, np.int64),
    )


def _last_newline(buf: np.ndarray, end: int) -> int:
    """Position after the last newline in ``buf[:end]`` (0 if none), searching back from the end."""
    window = 1 << 12
    while True:
        lo = max(0, end - window)
        hits = np.flatnonzero(buf[lo:end] == 10)
        if len(hits):
            return lo + int(hits[-1]) + 1
        if lo == 0:
            return 0
        window *= 8


def _floor_scan_range(path: Path, lo: int, hi: int, block: int = 4 << 20) -> tuple[np.ndarray, ...]:
    """Scan bytes ``lo:hi`` of the file (both at line starts) in blocks; returns tokens, mask, lengths."""
    scan = _jsonl_kernels()["floor_scan"]
    tokens, mask, lengths = _floor_buffers(hi - lo, np.int32)
    nt = nm = nr = 0
    buf = np.empty(block, np.uint8)
    carry = 0
    with open(path, "rb", buffering=0) as fh:
        fh.seek(lo)
        left = hi - lo
        while True:
            if carry + block > len(buf):
                grown = np.empty(2 * (carry + block), np.uint8)
                grown[:carry] = buf[:carry]
                buf = grown
            want = min(block, left)
            got = fh.readinto(memoryview(buf)[carry : carry + want]) if want else 0
            left -= got
            end = carry + got
            last = left == 0 or got == 0
            cut = end if last else _last_newline(buf, end)
            nt, nm, nr = scan(buf[:cut], tokens, mask, lengths, nt, nm, nr)  # type: ignore[operator]
            carry = end - cut
            buf[:carry] = buf[cut:end].copy()
            if last:
                break
    return tokens[:nt], mask[:nm], lengths[:nr]


def run_floor(path: Path, out: Path, threads: int, ids_dtype: str = "int64") -> dict:
    """The floor: compiled scan (``threads`` halves of the file) + longpack's Parquet writer, nothing else."""
    from concurrent.futures import ThreadPoolExecutor

    from longpack.packed import PackSettings, plan_splits
    from longpack.packed.files import open_parquet_writer
    from longpack.packed.pipeline import shard_layout
    from longpack.packed.rows import fill_rows
    from longpack.samples import TokenizedSamples

    _jsonl_kernels()
    t0 = time.perf_counter()
    size = path.stat().st_size
    cuts = [0, size]
    if threads > 1:
        with open(path, "rb") as fh:
            fh.seek(size // 2)
            fh.readline()
            cuts = [0, fh.tell(), size]
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(lambda k: _floor_scan_range(path, cuts[k], cuts[k + 1]), range(len(cuts) - 1)))
    if len(parts) == 1:
        tokens, mask, lengths = parts[0]
    else:  # one buffer, as the packer wants it: the second half joins the first
        n_tok = sum(len(p[0]) for p in parts)
        tokens = _lazy_pages(n_tok, np.int32)
        mask = _lazy_pages(n_tok, np.uint8)
        pos = 0
        for ptok, pmask, _ in parts:
            tokens[pos : pos + len(ptok)] = ptok
            mask[pos : pos + len(ptok)] = pmask
            pos += len(ptok)
        lengths = np.concatenate([p[2] for p in parts])
        del parts
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    samples = TokenizedSamples(
        tokens=tokens,
        loss_mask=mask,
        offsets=offsets,
        source_file=np.zeros(len(lengths), np.int32),
        source_row=np.arange(1, len(lengths) + 1),
        files=(str(path),),
    )
    t1 = time.perf_counter()
    settings = PackSettings(seq_length=SEQ_LENGTH, overlength="drop", ids_dtype=ids_dtype)
    split = plan_splits(samples, settings, eos_id=QWEN3_EOS)[0]
    out.mkdir(parents=True, exist_ok=True)

    options = settings.writer_options  # the row groups and encoding longpack writes with
    group = options.row_group_size

    def write(shard: tuple[str, int, int]) -> int:
        name, lo, hi = shard
        with open_parquet_writer(out / name, ids_dtype=ids_dtype, options=options) as writer:
            for start in range(lo, hi, group):
                stop = min(hi, start + group)
                rows = fill_rows(split.aligned, split.plan, start, stop, ids_dtype=ids_dtype)
                writer.write_table(rows.to_arrow(), row_group_size=group)
        return hi - lo

    with ThreadPoolExecutor(threads) as pool:
        written = sum(pool.map(write, shard_layout("training", split.plan.num_rows, settings)))
    t2 = time.perf_counter()
    return {
        "seconds": t2 - t0,
        "tokenize_seconds": t1 - t0,
        "samples": len(samples),
        "stored_tokens": int(offsets[-1]),
        "rows": written,
    }


# ---------------------------------------------------------------------------------------------------
# Runs (each in its own process).


def run_ours(kind: str, path: Path, out: Path, algorithm: str, ids_dtype: str = "int64") -> dict:
    from longpack.packed import PackSettings, Provenance, plan_splits, write_packed_output
    from longpack.text import TextConfig, tokenize_inputs

    t0 = time.perf_counter()
    fmt = {"pretokenized": "pretokenized", "jsonl": "pretokenized", "text": "auto"}.get(
        kind, "prompt_completion"
    )
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    result = tokenize_inputs([str(path)], tokenizer="qwen3", config=TextConfig(format=fmt), workers=None)
    t1 = time.perf_counter()
    c1, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    tokenize_cpu = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) + kids.ru_utime + kids.ru_stime
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
        "tokenize_cpu_seconds": tokenize_cpu,
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
    if args.impl == "tokenizer":
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        result = run_tokenizer_floor(path)
    elif args.impl.startswith("floor"):
        _, threads, *dtype = args.impl.split(":")
        _jsonl_kernels()  # compiled (or loaded from the cache) before the clock starts
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        result = run_floor(path, out, int(threads), *dtype)
    elif args.impl == "baseline":
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        result = run_baseline(args.kind, path, out)
    else:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        _, algorithm, *dtype = args.impl.split(":")
        result = run_ours(args.kind, path, out, algorithm, *dtype)
    # Main process plus the largest *direct* child (ru_maxrss of children is the largest reaped child's peak).
    # The text layer's workers are forkserver children, not ours, so "+worker" reads 0 for them.
    # The main peak is VmHWM, the high-water mark of this process's own memory map: ru_maxrss survives
    # execve on Linux, so in a child spawned by this (data-generating) script it would report the parent's
    # peak whenever that is larger (it was: 1.3 GiB at 100k, twice this process's own peak).
    main_peak = _vm_hwm_bytes()
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result["cpu_seconds"] = (me.ru_utime + me.ru_stime - cpu0.ru_utime - cpu0.ru_stime) + (
        kids.ru_utime + kids.ru_stime
    )
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
    parser.add_argument(
        "--data-dir", default="", help="Keep the generated inputs here and reuse them in later invocations."
    )
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
    print(f"cores: {os.cpu_count()} (shared machine); seq_length {SEQ_LENGTH}; load average {_load()}")
    header = (
        f"{'input':<13}{'N':>9}  {'implementation':<32}{'seconds':>9}{'CPU s':>8}{'read+tok':>9}"
        f"{'pack+write':>11}{'samples/s':>11}{'RSS main':>10}{'+worker':>9}{'(main+w)/data':>15}"
    )
    print(header)
    with tempfile.TemporaryDirectory(prefix="longpack-bench-") as tmp:
        root = Path(tmp)
        data_dir = Path(args.data_dir) if args.data_dir else root
        data_dir.mkdir(parents=True, exist_ok=True)
        for n in [int(s) for s in args.sizes.split(",")]:
            for kind in args.inputs.split(","):
                suffix = {"pretokenized": "parquet", "jsonl": "pretok.jsonl", "text": "text"}.get(
                    kind, "jsonl"
                )
                src = data_dir / f"in_{n}.{suffix}"
                if not (args.data_dir and src.exists()):
                    if kind == "pretokenized":
                        make_pretokenized(src, n)
                    elif kind == "jsonl":
                        make_pretokenized_jsonl(src, n)
                    elif kind == "text":
                        make_text_folder(src, n)
                    else:
                        make_text(src, n)
                dtypes = args.ids_dtypes.split(",")
                impls = [
                    f"ours:{alg}" + ("" if dtype == "int64" else f":{dtype}")
                    for dtype in dtypes
                    for alg in args.algorithms.split(",")
                ]
                if kind == "jsonl":
                    impls = [
                        f"floor:{t}" + ("" if d == "int64" else f":{d}") for d in dtypes for t in (1, 2)
                    ] + impls
                if kind == "text":
                    impls = ["tokenizer", *impls]
                if n <= args.baseline_max:
                    impls.append("baseline")
                results = {}
                for impl in impls:
                    runs = [measure(impl, kind, src, root / "out") for _ in range(args.repeats)]
                    ok = [r for r in runs if r]
                    if not ok:
                        continue
                    r = sorted(ok, key=lambda x: x["seconds"])[len(ok) // 2]
                    r["cpu_seconds"] = sorted(x["cpu_seconds"] for x in ok)[len(ok) // 2]
                    results[impl] = r
                    data = r["stored_tokens"] * 5
                    print(
                        f"{kind:<13}{n:>9}  {impl:<32}{r['seconds']:>9.2f}{r['cpu_seconds']:>8.1f}"
                        f"{r['tokenize_seconds']:>9.2f}{r['seconds'] - r['tokenize_seconds']:>11.2f}"
                        f"{r['samples'] / r['seconds']:>11.0f}"
                        f"{r['peak_rss_main_bytes'] / 2**30:>9.2f}G{r['peak_rss_worker_bytes'] / 2**30:>8.2f}G"
                        f"{r['peak_rss_bytes'] / data:>15.2f}",
                        flush=True,
                    )
                for impl, r in results.items():
                    if not impl.startswith("ours"):
                        continue
                    dtype = impl.split(":")[2] if impl.count(":") == 2 else "int64"
                    tail = "" if dtype == "int64" else f":{dtype}"
                    raw = results.get("tokenizer")
                    if raw:
                        ours_cpu, raw_cpu = r["tokenize_cpu_seconds"], raw["tokenize_cpu_seconds"]
                        print(
                            f"{'':<22}{impl}: tokenizing {ours_cpu:.1f} CPU-s = {ours_cpu / raw_cpu:.2f}x the raw "
                            f"encoder's {raw_cpu:.1f} (target <= 1.3x; "
                            f"{ours_cpu / (raw_cpu + raw['render_seconds']):.2f}x raw encoder + chat rendering)"
                        )
                    f1, f2 = results.get(f"floor:1{tail}"), results.get(f"floor:2{tail}")
                    if f1 and f2:
                        print(
                            f"{'':<22}{impl}: CPU {r['cpu_seconds'] / f1['cpu_seconds']:.2f}x floor:1{tail}, "
                            f"wall {r['seconds'] / f2['seconds']:.2f}x floor:2{tail} (target <= 1.3x each)"
                        )
                if "baseline" in results:
                    base = results["baseline"]["seconds"]
                    for impl, r in results.items():
                        if impl.startswith("ours"):
                            b = results["baseline"]
                            print(
                                f"{'':<22}{impl}: {base / r['seconds']:.1f}x faster end to end, "
                                f"{(base - b['tokenize_seconds']) / (r['seconds'] - r['tokenize_seconds']):.1f}x "
                                "on pack+write"
                            )
                elif kind != "jsonl":
                    print(
                        f"{'':<22}baseline not run at N={n} (> --baseline-max {args.baseline_max}: its Python "
                        "lists need ~90 bytes per token)"
                    )
                print(f"{'':<22}load average after: {_load()}", flush=True)
                if not args.data_dir:
                    if src.is_dir():
                        for f in src.iterdir():
                            f.unlink()
                        src.rmdir()
                    else:
                        src.unlink()


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
