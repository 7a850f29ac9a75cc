"""VLM benchmark: prepared-sample throughput, and Energon packing-buffer RSS vs buffer size.

Run: ``PYTHONPATH=src python benchmarks/vlm.py [--quick] [--repeats 3]`` (needs the ``vlm`` and ``energon``
extras; everything is generated locally, nothing is downloaded).

1. **Throughput**: ``QwenVLPreparer.prepare`` (render, tokenize, decode, transformers' ``Qwen2VLImageProcessor()``,
   expand, labels, 3-D positions) on generated samples with one image per sample at several resolutions,
   against the same processor call alone on the same images in the same process (the floor); median of
   ``--repeats`` runs. ``length()`` (header only, no decode) is timed on the same samples.
2. **Buffer RSS, deferred vs eager decoding**: a real WebDataset of those samples, ``energon prepare``-d,
   loaded with ``num_workers=0`` (everything in one process) and, side by side, ``QwenVLPackingEncoder``
   (deferred: the buffer holds encoded bytes and token counts, pixels decoded when a pack is emitted) and
   ``EagerQwenVLPackingEncoder`` (the previous path, as Bridge: the buffer holds prepared pixel tensors); for
   each ``packing_buffer_size`` a loader in a fresh interpreter (spawned, warmed up with two prepared samples)
   yields its first batch (the buffer is then full): the process RSS grown since before iterating, the
   first-batch latency, the epoch's time per pack; the estimate ``online-sim --vlm`` makes for the eager
   buffer (the prepared bytes of the buffered samples); then the epoch's bin fill (equal for both: same
   packs). Medians of ``--repeats`` loaders.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import multiprocessing
import statistics
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import psutil


def make_png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def samples(n: int, side: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = (int(side * f) for f in rng.uniform(0.75, 1.25, 2))
        answer = " ".join(["word"] * int(rng.integers(10, 200)))
        out.append(
            {
                "__key__": f"s{i:05d}",
                "messages": [
                    {"role": "user", "content": "<image>Describe the picture."},
                    {"role": "assistant", "content": answer},
                ],
                "images": [make_png(w, h, seed * 10000 + i)],
            }
        )
    return out


def throughput(prep, data: list[dict], repeats: int) -> tuple[float, float, float]:
    """(prepared samples/s, processor-only samples/s, length() samples/s), medians."""
    from PIL import Image

    decoded = [[Image.open(io.BytesIO(s["images"][0])).convert("RGB")] for s in data]
    size = {"shortest_edge": prep.vision.min_pixels, "longest_edge": prep.vision.max_pixels}
    prep_t, proc_t, len_t = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for s in data:
            prep.prepare(s)
        prep_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for images in decoded:
            prep.image_processor(images=images, return_tensors="pt", size=size)
        proc_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for s in data:
            prep.length(s)
        len_t.append(time.perf_counter() - t0)
    n = len(data)
    return n / statistics.median(prep_t), n / statistics.median(proc_t), n / statistics.median(len_t)


def write_dataset(root: Path, data: list[dict]) -> None:
    from click.testing import CliRunner
    from megatron.energon.tools.prepare import command as energon_prepare

    with tarfile.open(root / "shard_000.tar", "w") as tar:
        for s in data:
            members = {"json": json.dumps({"messages": s["messages"]}).encode(), "img0.png": s["images"][0]}
            for name, payload in members.items():
                info = tarfile.TarInfo(f"{s['__key__']}.{name}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    result = CliRunner().invoke(
        energon_prepare,
        ["--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset", "--num-workers",
         "1", "--no-progress", str(root)],
    )  # fmt: skip
    if result.exit_code != 0:
        raise RuntimeError(result.output)


def buffer_run(root: Path, buffer_size: int, seq_length: int, eager: bool) -> dict:
    """One loader in a fresh process (spawned): RSS growth until the first batch, latency, epoch fill."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from longpack.online.vlm import EagerQwenVLPackingEncoder, QwenVLPackingEncoder
    from longpack.vlm import QwenVLPreparer, VLMConfig

    prep = QwenVLPreparer("qwen3", config=VLMConfig(max_visual_tokens=None, max_images=None))
    for s in samples(2, 448, seed=1):  # warm up: tokenizer ranks, processor code paths
        prep.prepare(s)
    encoder_class = EagerQwenVLPackingEncoder if eager else QwenVLPackingEncoder
    encoder = encoder_class(prep, seq_length=seq_length, pad_to_multiple_of=8)
    ds = get_train_dataset(
        root, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1, packing_buffer_size=buffer_size, shuffle_buffer_size=None, max_samples_per_sequence=None,
        task_encoder=encoder, repeat=False,
    )  # fmt: skip
    loader = get_savable_loader(ds)
    gc.collect()
    process = psutil.Process()
    rss0 = process.memory_info().rss
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    latency = time.perf_counter() - t0
    rss1 = process.memory_info().rss
    held = buffer_size  # the first selection saw a full buffer (the pack it emitted is in `first`)
    tokens = first["total_tokens"]
    packs = 1
    t1 = time.perf_counter()
    for batch in it:
        tokens += batch["total_tokens"]  # physical tokens (aligned sequences, no fixed width)
        packs += 1
    per_pack = (time.perf_counter() - t1) / max(packs - 1, 1)
    del first, it, loader, ds
    gc.collect()
    return {
        "rss": rss1 - rss0, "latency": latency, "held": held, "packs": packs, "tokens": tokens, "per_pack": per_pack,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and sizes (about a minute)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--buffer-sizes", default="4,16,64", help="packing buffer sizes, comma-separated")
    parser.add_argument("--no-throughput", action="store_true", help="only the buffer table")
    args = parser.parse_args()

    from longpack.vlm import QwenVLPreparer, VLMConfig

    prep = QwenVLPreparer("qwen3", config=VLMConfig(max_visual_tokens=None, max_images=None))
    sides = () if args.no_throughput else (224, 448) if args.quick else (224, 448, 896)
    n = 16 if args.quick else 32
    print(
        f"## prepared-sample throughput ({n} samples per resolution, one image each, median of {args.repeats})"
    )
    print(
        f"{'image side':>10} {'visual tok':>10} {'prepared/s':>10} {'processor/s':>11} {'ratio':>6} {'length()/s':>10}"
    )
    for side in sides:
        data = samples(n, side, seed=side)
        visual = statistics.median(prep.length(s).visual_tokens for s in data)
        fast, floor, meta = throughput(prep, data, args.repeats)
        print(f"{side:>10} {visual:>10.0f} {fast:>10.1f} {floor:>11.1f} {fast / floor:>6.2f} {meta:>10.0f}")

    side = 448
    buffers = (4, 16) if args.quick else tuple(int(b) for b in args.buffer_sizes.split(","))
    n_data = 2 * max(buffers)
    data = samples(n_data, side, seed=7)
    nbytes = sorted(prep.length(s).prepared_nbytes for s in data)
    print(
        f"\n## Energon packing buffer, {n_data} samples of ~{side}px, seq_length {args.seq_length}, 0 workers, "
        f"median of {args.repeats} loaders; prepared MiB/sample median {statistics.median(nbytes) / 2**20:.2f}"
    )
    print(
        f"{'buffer':>7} {'eager RSS MiB':>13} {'deferred RSS MiB':>16} {'ratio':>6} {'eager est. MiB':>14} "
        f"{'1st batch s e/d':>15} {'s/pack e/d':>11} {'fill':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_dataset(root, data)
        median_bytes = statistics.median(nbytes)
        context = multiprocessing.get_context("spawn")
        for b in buffers:
            result = {}
            for eager in (True, False):
                runs = []
                for _ in range(args.repeats):
                    # A fresh interpreter per loader: RSS is not muddied by arenas freed by an earlier loader.
                    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                        runs.append(pool.submit(buffer_run, root, b, args.seq_length, eager).result())
                result[eager] = {
                    "rss": statistics.median(r["rss"] for r in runs) / 2**20,
                    "latency": statistics.median(r["latency"] for r in runs),
                    "per_pack": statistics.median(r["per_pack"] for r in runs),
                    "fill": runs[0]["tokens"] / (runs[0]["packs"] * args.seq_length),
                    "held": runs[0]["held"],
                }
            e, d = result[True], result[False]
            estimate = e["held"] * median_bytes / 2**20
            print(
                f"{b:>7} {e['rss']:>13.1f} {d['rss']:>16.1f} {d['rss'] / max(e['rss'], 1e-9):>6.2f} "
                f"{estimate:>14.1f} {e['latency']:>7.2f}/{d['latency']:<7.2f} "
                f"{e['per_pack']:>5.2f}/{d['per_pack']:<5.2f} {e['fill']:>7.4f}"
            )
            if abs(e["fill"] - d["fill"]) > 1e-12:
                raise RuntimeError(f"buffer {b}: eager fill {e['fill']} != deferred fill {d['fill']}")
        print(
            f"estimate per candidate: {median_bytes / 2**20:.2f} MiB (prepared tensors, as online-sim --vlm)"
        )


if __name__ == "__main__":
    main()
