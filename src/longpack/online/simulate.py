"""What an online packer's buffer size costs: fill against offline packing of the same samples (pure numpy).

Workloads (runtime lengths, clipped to ``1..capacity``; seeded, deterministic):

- ``lognormal``: SFT-like chat data, median ``capacity / 16``, sigma 1.0 (a long right tail);
- ``bimodal``: 70 % short turns (lognormal, median ``capacity / 32``, sigma 0.6) and 30 % long documents
  (uniform in ``0.4 .. 0.95 * capacity``), the mix where small buffers hurt most.

>>> synthetic_lengths("lognormal", 5, 4096, seed=0).tolist()
[290, 224, 486, 284, 150]
>>> row = simulate([700, 500, 300, 500, 1000], 1000, [2], algorithm="first_fit_decreasing")[0]
>>> row["buffer_size"], row["online_packs"], row["offline_packs"], row["online_fill"]
(2, 4, 3, 0.75)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from longpack import binpack, choices
from longpack.errors import ConfigError
from longpack.online.packer import OnlinePacker
from longpack.topology import align_up

WORKLOADS = choices.WORKLOADS


def synthetic_lengths(workload: str, n: int, capacity: int, *, seed: int) -> np.ndarray:
    """``n`` runtime lengths of a named workload (int64), see the module docstring."""
    if workload not in WORKLOADS:
        raise ConfigError(f"workload={workload!r} is not one of {WORKLOADS}")
    rng = np.random.default_rng(seed)
    if workload == choices.LOGNORMAL_WORKLOAD:
        raw = rng.lognormal(np.log(capacity / 16), 1.0, n)
    else:
        short = rng.lognormal(np.log(capacity / 32), 0.6, n)
        long = rng.uniform(0.4 * capacity, 0.95 * capacity, n)
        raw = np.where(rng.random(n) < 0.7, short, long)
    return np.clip(np.rint(raw), 1, capacity).astype(np.int64)


def offline_fill(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    *,
    pad_to_multiple_of: int = 1,
    algorithm: str,
    seed: int = 0,
) -> tuple[float, int]:
    """``(fill, packs)`` of packing all samples at once (lengths truncated and aligned as the online packer does).

    >>> offline_fill([6, 4, 5, 5], 10, algorithm="best_fit_decreasing")
    (1.0, 2)
    """
    m = pad_to_multiple_of
    limit = capacity // m * m
    aligned = np.array([align_up(min(int(x), limit), m) for x in lengths], dtype=np.int64)
    if len(aligned) == 0:
        return 0.0, 0
    bins = binpack.pack_lengths(aligned, capacity, algorithm=algorithm, seed=seed)
    packs = int(bins.max()) + 1
    return float(aligned.sum()) / (packs * capacity), packs


def _fill_columns(
    buffer_size: int, fill: float, packs: int, off_fill: float, off_packs: int
) -> dict[str, Any]:
    """The columns every simulation row starts with: buffer size, online and offline fill and packs, and
    the online/offline fill ratio (0 where offline packed nothing).

    >>> _fill_columns(8, 0.45, 10, 0.9, 5)
    {'buffer_size': 8, 'online_fill': 0.45, 'online_packs': 10, 'offline_fill': 0.9, 'offline_packs': 5, 'fill_ratio': 0.5}
    """
    return {
        "buffer_size": buffer_size,
        "online_fill": round(fill, 4),
        "online_packs": packs,
        "offline_fill": round(off_fill, 4),
        "offline_packs": off_packs,
        "fill_ratio": round(fill / off_fill, 4) if off_fill else 0.0,
    }


def simulate(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    buffer_sizes: Iterable[int],
    *,
    pad_to_multiple_of: int = 1,
    algorithm: str = choices.DEFAULT_ALGORITHM,
    offline_algorithm: str = choices.DEFAULT_ALGORITHM,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per buffer size: online fill and packs, offline fill and packs, fill ratio, packs/s.

    Lengths longer than the capacity are truncated (the online packer's default policy), in both runs.
    """
    values = [int(x) for x in lengths]
    off_fill, off_packs = offline_fill(
        values, capacity, pad_to_multiple_of=pad_to_multiple_of, algorithm=offline_algorithm, seed=seed
    )
    out = []
    for b in buffer_sizes:
        packer = OnlinePacker(
            capacity, int(b), pad_to_multiple_of=pad_to_multiple_of, algorithm=algorithm, seed=seed
        )
        start = time.perf_counter()
        packs = sum(1 for _ in packer.pack(values))
        elapsed = time.perf_counter() - start
        fill = packer.stats.fill(capacity)
        out.append(
            {
                **_fill_columns(int(b), fill, packs, off_fill, off_packs),
                "truncated": packer.stats.truncated,
                "packs_per_s": round(packs / elapsed, 1) if elapsed > 0 else float("inf"),
            }
        )
    return out


def smallest_buffer_within(rows: Sequence[dict[str, Any]], tolerance: float = 0.01) -> int | None:
    """Smallest buffer whose fill is within ``tolerance`` (relative) of offline fill, or ``None``.

    >>> smallest_buffer_within([{"buffer_size": 8, "fill_ratio": 0.9}, {"buffer_size": 64, "fill_ratio": 0.995}])
    64
    """
    ok = [r["buffer_size"] for r in rows if r["fill_ratio"] >= 1 - tolerance]
    return min(ok) if ok else None


def worker_slices(n: int, workers: int) -> list[range]:
    """Contiguous slices of ``n`` samples over ``max(workers, 1)`` loader workers (remainders to the first
    workers), the way Energon splits a rank's share: every worker runs its own packing buffer.

    >>> [list(r) for r in worker_slices(5, 2)]
    [[0, 1, 2], [3, 4]]
    """
    w = max(int(workers), 1)
    base, extra = divmod(n, w)
    out, start = [], 0
    for i in range(w):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def buffer_memory(
    lengths: Sequence[int] | np.ndarray,
    nbytes: Sequence[int] | np.ndarray,
    capacity: int,
    buffer_size: int,
    *,
    pad_to_multiple_of: int = 1,
    algorithm: str = choices.FIRST_FIT_DECREASING,
    seed: int = 0,
) -> dict[str, Any]:
    """Pack one worker's stream and track the host bytes its buffer holds: every read sample's prepared
    bytes from its read until its pack is emitted (Energon keeps prepared candidates in the buffer).

    Returns packs, fill, and the buffer's peak and mean bytes over the emissions.

    >>> r = buffer_memory([4, 4, 4, 4], [10, 20, 30, 40], 8, 2)
    >>> r["packs"], r["peak_bytes"], r["mean_bytes"]
    (2, 70, 50.0)
    """
    values = [int(x) for x in lengths]
    held = np.concatenate([[0], np.cumsum(np.asarray(nbytes, dtype=np.int64))])
    packer = OnlinePacker(
        capacity, buffer_size, pad_to_multiple_of=pad_to_multiple_of, algorithm=algorithm, seed=seed
    )
    emitted = 0
    samples: list[int] = []
    nb = np.asarray(nbytes, dtype=np.int64)
    for pack in packer.pack(values):
        # At each emission the buffer holds what was read and not yet emitted (the pack included).
        samples.append(int(held[packer.stats.samples_read]) - emitted)
        emitted += int(nb[pack.sample_index].sum())
    return {
        "packs": packer.stats.packs,
        "aligned_tokens": packer.stats.aligned_tokens,
        "peak_bytes": max(samples, default=0),
        "mean_bytes": round(float(np.mean(samples)), 1) if samples else 0.0,
    }


def simulate_vlm(
    lengths: Sequence[int] | np.ndarray,
    nbytes: Sequence[int] | np.ndarray,
    capacity: int,
    buffer_sizes: Iterable[int],
    *,
    workers: int = 1,
    pad_to_multiple_of: int = 1,
    algorithm: str = choices.FIRST_FIT_DECREASING,
    offline_algorithm: str = choices.DEFAULT_ALGORITHM,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per buffer size for VLM samples: bin fill (online vs offline) **and** the packing buffer's host
    memory (prepared token rows and pixel tensors): the peak of one worker and the sum over a rank's
    ``workers`` (each worker packs its own contiguous share with its own buffer).

    ``lengths`` are the samples' tokens after image-pad expansion (each takes ``ceil(L / m) * m`` of the
    ``capacity``); samples longer than the capacity must be refused before (they are in Bridge's encoder).

    >>> rows = simulate_vlm([300, 500, 200, 700], [2**20, 2**21, 2**20, 2**22], 1000, [1, 4], workers=2)
    >>> [(r["buffer_size"], r["online_packs"], r["buffer_peak_mib_rank"]) for r in rows]
    [(1, 4, 6.0), (4, 2, 8.0)]
    """
    values = np.asarray(lengths, dtype=np.int64)
    sizes = np.asarray(nbytes, dtype=np.int64)
    if len(values) != len(sizes):
        raise ConfigError(f"{len(values)} lengths but {len(sizes)} byte counts")
    if len(values) and int(values.max()) > capacity:
        raise ConfigError(
            f"a sample of {int(values.max())} tokens exceeds the pack size {capacity}; refuse such samples first"
        )
    off_fill, off_packs = offline_fill(
        values, capacity, pad_to_multiple_of=pad_to_multiple_of, algorithm=offline_algorithm, seed=seed
    )
    slices = worker_slices(len(values), workers)
    out = []
    for b in buffer_sizes:
        per_worker = [
            buffer_memory(
                values[sl.start : sl.stop],
                sizes[sl.start : sl.stop],
                capacity,
                int(b),
                pad_to_multiple_of=pad_to_multiple_of,
                algorithm=algorithm,
                seed=seed,
            )
            for sl in slices
            if len(sl)
        ]
        packs = sum(r["packs"] for r in per_worker)
        tokens = sum(r["aligned_tokens"] for r in per_worker)
        fill = tokens / (packs * capacity) if packs else 0.0
        out.append(
            {
                **_fill_columns(int(b), fill, packs, off_fill, off_packs),
                "buffer_peak_mib_worker": round(
                    max((r["peak_bytes"] for r in per_worker), default=0) / 2**20, 3
                ),
                "buffer_mean_mib_worker": round(
                    max((r["mean_bytes"] for r in per_worker), default=0.0) / 2**20, 3
                ),
                "buffer_peak_mib_rank": round(sum(r["peak_bytes"] for r in per_worker) / 2**20, 3),
            }
        )
    return out


def vlm_report(
    path: str,
    capacity: int,
    buffer_sizes: Sequence[int],
    *,
    tokenizer: str = "qwen3",
    family: str = "qwen2_vl",
    vision: Any = None,
    video: Any = None,
    max_images: int | None = 10,
    max_visual_tokens: int | None = 16384,
    workers: int = 1,
    pad_to_multiple_of: int = 1,
    algorithm: str = choices.FIRST_FIT_DECREASING,
    seed: int = 0,
) -> dict[str, Any]:
    """``online-sim`` for a VLM JSONL file (``longpack.vlm.metadata``): the samples' token and memory
    distribution, the refusals by reason, and per buffer size the bin fill and the buffer's host memory.
    ``family``: a :mod:`longpack.vlm.families` name (Qwen-VL families count with ``vision`` and ``video``, a
    :class:`~longpack.vlm.video.VideoConfig`; ``gemma3`` with
    the Gemma3 processor saved in the folder ``tokenizer``)."""
    from longpack.vlm.families import vlm_family
    from longpack.vlm.metadata import read_vlm_metadata
    from longpack.vlm.vision import VisionConfig

    kind = vlm_family(family)
    given = {
        "vision": vision or VisionConfig(),  # the family sets how videos are sampled, written and numbered
        "video": video,
        "max_images": max_images,
        "max_visual_tokens": max_visual_tokens,
    }
    preparer = kind.preparer(tokenizer, **{k: v for k, v in given.items() if k in kind.config_fields})
    settings = kind.reported_settings(preparer)
    table = read_vlm_metadata(path, preparer, max_length=capacity, pad_to_multiple_of=pad_to_multiple_of)
    rows = simulate_vlm(
        table.tokens,
        table.prepared_nbytes,
        capacity,
        buffer_sizes,
        workers=workers,
        pad_to_multiple_of=pad_to_multiple_of,
        algorithm=algorithm,
        seed=seed,
    )
    return {
        "source": str(path),
        "capacity": capacity,
        "workers": max(int(workers), 1),
        "algorithm": algorithm,
        "family": family,
        "vision": settings,
        "samples": table.summary(),
        "rows": rows,
        "smallest_buffer_within_1pct": smallest_buffer_within(rows),
        "lengths": table.tokens.tolist(),  # per accepted sample, in file order
    }
