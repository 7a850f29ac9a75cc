"""Reading packed rows in training order: random vs sequential rows/s, by pack size and row-group size, for
longpack's reader (``longpack.runtime.PackedDataset``) and a Megatron-Bridge-style reader on the same files.

Run from the repository root:

    PYTHONPATH=src python benchmarks/reader.py --quick      # small files, a couple of minutes
    PYTHONPATH=src python benchmarks/reader.py              # 8K and 32K packs, ~270 MiB per file

Files: rows packed by ``longpack.packed`` from SFT-like samples (``benchmarks/row_groups.py``'s generator:
lognormal lengths, median 600 tokens, ids over a 151,669-token vocabulary), written with longpack's writer
at each row-group size, with one row per data page (``pages=row``: longpack's default, which lets its reader
decode a row alone) and with pyarrow's ~1 MiB pages (``pages=1M``: what Bridge's writer makes).

Orders (every run reads as many rows as it can in ``--budget`` seconds, median of ``--repeats`` runs, a fresh
reader per run):

- ``seq``: rows in file order (``ds[0], ds[1], ...``);
- ``random``: a random permutation of the rows (``ds[perm[0]], ...``: an unknown order, e.g. a shuffling
  sampler);
- ``mapped``: Megatron's training order: ``max_num_samples`` gives the dataset its ``samples_mapping`` (a
  seeded shuffle of every row per epoch) and indices are read one after another, so longpack's reader sees
  what comes next and decodes ahead (``prefetch``).

The **floor** (``memmap floor``) is a numpy memory map of the same tokens: the file's ``input_ids``,
``loss_mask`` and ``seq_start_id`` stored once as flat ``.npy`` arrays plus row offsets, each item the same
dict longpack's reader returns (``input_ids`` int64 as a view of the map, ``loss_mask`` int64,
``seq_boundaries``), built with nothing but slicing. Every reader's items are consumed the same way (the
ids summed, so each byte is touched); the last column is each reader's random rate over the floor's.

The Bridge-style reader does exactly what ``GPTSFTPackedParquetDataset.__getitem__`` does (one cached row
group, ``read_row_group`` on a miss, ``as_py()`` per column; ``row_groups.bridge_random_access``).
longpack's decoded-group cache is limited to ``--cache-mib`` (default 64 MiB, well below the files), so a
file is never served from memory as a whole.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from longpack.packed import PackSettings, plan_splits
from longpack.packed.files import ParquetWriterOptions, one_row_pages
from longpack.packed.pipeline import write_shard_file
from longpack.runtime.dataset import PackedDataset
from row_groups import EOS, bridge_random_access, make_samples  # this folder: the script's own

#: ``cpu``: rows per CPU-second of this process (prefetch thread included), what a shared machine's load
#: does not change much; ``wall``: rows per second. Set by ``--clock``.
CLOCK = {"name": "cpu"}


def _clock() -> float:
    return time.process_time() if CLOCK["name"] == "cpu" else time.perf_counter()


def longpack_rows_per_s(
    path: Path, order: np.ndarray, *, mapped: bool, prefetch: int, cache: int, budget: float
) -> float:
    ds = PackedDataset(
        path, max_num_samples=len(order) if mapped else None, seed=1234, prefetch=prefetch, cache_bytes=cache
    )
    indices = np.arange(len(order)) if mapped else order
    start, clock = time.perf_counter(), _clock()
    done = 0
    for i in indices.tolist():
        int(ds[i]["input_ids"].sum())
        done += 1
        if done >= 10 and time.perf_counter() - start > budget:
            break
    rate = done / (_clock() - clock)
    ds.close()
    return rate


class MemmapFloor:
    """The same items as ``PackedDataset`` from numpy memory maps of the file's values (see the docstring)."""

    def __init__(self, path: Path, folder: Path) -> None:
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["input_ids", "loss_mask", "seq_start_id"])
        ids = table.column("input_ids").combine_chunks()
        starts = table.column("seq_start_id").combine_chunks()
        np.save(folder / "ids.npy", ids.values.to_numpy())
        np.save(
            folder / "mask.npy", table.column("loss_mask").combine_chunks().values.to_numpy().astype(np.int8)
        )
        np.save(folder / "starts.npy", starts.values.to_numpy())
        self.offsets = ids.offsets.to_numpy().astype(np.int64)
        self.start_offsets = starts.offsets.to_numpy().astype(np.int64)
        self.ids = np.load(folder / "ids.npy", mmap_mode="r")
        self.mask = np.load(folder / "mask.npy", mmap_mode="r")
        self.starts = np.load(folder / "starts.npy", mmap_mode="r")

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        ids = self.ids[a:b].astype(np.int64, copy=False)
        starts = self.starts[self.start_offsets[i] : self.start_offsets[i + 1]]
        return {
            "input_ids": ids,
            "seq_boundaries": np.append(starts.astype(np.int64), ids.size),
            "loss_mask": self.mask[a:b].astype(np.int64),
        }


def floor_rows_per_s(floor: MemmapFloor, indices: np.ndarray, budget: float) -> float:
    start, clock = time.perf_counter(), _clock()
    done = 0
    for i in indices.tolist():
        int(floor[i]["input_ids"].sum())
        done += 1
        if done >= 10 and time.perf_counter() - start > budget:
            break
    return done / (_clock() - clock)


def regimes(pack: int, tokens: float, repeats: int, short: int, steady: int) -> None:
    """``--regimes``: open time of ``PackedDataset`` on a packed folder, and random rows per CPU-second over
    the floor's in two regimes, each from a fresh reader and a fresh floor map: ``short`` (the first
    ``short`` reads right after opening) and ``steady`` (``steady`` reads after those). Same rows, same
    order for both readers; medians of ``repeats``."""
    from longpack.jobs import PackConfig  # noqa: F401  (import cost outside the clocks)

    with tempfile.TemporaryDirectory(prefix="longpack-regimes-") as tmp:
        folder = Path(tmp) / "packed"
        folder.mkdir()
        samples = make_samples(int(tokens))
        settings = PackSettings(seq_length=pack, algorithm="first_fit_shuffle", seed=1234)
        split = plan_splits(samples, settings, eos_id=EOS)[0]
        n = split.plan.num_rows
        path = folder / f"training_{pack}.idx.parquet"
        write_shard_file(
            path, split.aligned, split.plan, 0, n, options=ParquetWriterOptions(**one_row_pages(pack))
        )
        floor_dir = Path(tmp) / "floor"
        floor_dir.mkdir()
        reference = MemmapFloor(path, floor_dir)  # written once; every run below maps its arrays afresh
        order = np.random.default_rng(0).permutation(n)
        order = np.resize(order, short + steady)
        opens, got = [], {"longpack short": [], "longpack steady": [], "floor short": [], "floor steady": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            ds = PackedDataset(folder, allow_no_manifest=True, prefetch=0)
            opens.append(time.perf_counter() - t0)
            floor = MemmapFloor.__new__(MemmapFloor)
            floor.offsets, floor.start_offsets = reference.offsets, reference.start_offsets
            for name in ("ids", "mask", "starts"):
                setattr(floor, name, np.load(floor_dir / f"{name}.npy", mmap_mode="r"))
            for reader, get in (("longpack", ds.__getitem__), ("floor", floor.__getitem__)):
                for regime, idx in (("short", order[:short]), ("steady", order[short:])):
                    clock = _clock()
                    for i in idx.tolist():
                        int(get(i)["input_ids"].sum())
                    got[f"{reader} {regime}"].append(len(idx) / (_clock() - clock))
            ds.close()
        med = {k: statistics.median(v) for k, v in got.items()}
        import pyarrow.parquet as pq

        groups = pq.ParquetFile(path).metadata.num_row_groups
        print(f"regimes: pack {pack}, {n} rows, {path.stat().st_size / 2**20:.0f} MiB, {groups} row groups; "
              f"short = first {short} random reads after opening, steady = the next {steady}; medians of {repeats}")  # fmt: skip
        print(
            f"  PackedDataset open: {statistics.median(opens) * 1000:.1f} ms (median), max {max(opens) * 1000:.1f} ms"
        )
        for regime in ("short", "steady"):
            a, b = med[f"longpack {regime}"], med[f"floor {regime}"]
            print(
                f"  {regime:<7} longpack {a:>8.0f}  floor {b:>8.0f} rows/{CLOCK['name']}-s  longpack/floor {a / b:.2f}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--packs", default="8192,32768")
    ap.add_argument("--tokens", type=float, default=60e6, help="stored tokens per file")
    ap.add_argument("--sizes", default="1,2,8,500", help="rows per row group")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per run, at most")
    ap.add_argument("--cache-mib", type=int, default=64)
    ap.add_argument("--prefetch", default="0,32", help="longpack prefetch settings to run")
    ap.add_argument("--pages", default="row,1M", help="page layouts: row (one row per page), 1M (pyarrow's)")
    ap.add_argument(
        "--clock", default="cpu", choices=["cpu", "wall"], help="rows per CPU-second or per second"
    )
    ap.add_argument("--regimes", action="store_true", help="only open time and the short / steady regimes")
    ap.add_argument("--short", type=int, default=300, help="--regimes: reads right after opening")
    ap.add_argument("--steady", type=int, default=6000, help="--regimes: reads after those")
    args = ap.parse_args()
    CLOCK["name"] = args.clock
    if args.regimes:
        for pack in [int(p) for p in args.packs.split(",")]:
            regimes(pack, 8e6 if args.quick else args.tokens, args.repeats, args.short, args.steady)
        return
    tokens = 8e6 if args.quick else args.tokens
    cache = args.cache_mib * 2**20
    prefetches = [int(p) for p in args.prefetch.split(",")]
    print(
        f"{os.cpu_count()} CPUs (shared), load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{tokens / 1e6:.0f}M stored tokens per file; longpack cache {args.cache_mib} MiB; median of "
        f"{args.repeats} runs of <= {args.budget} s; rows per {'CPU-second' if args.clock == 'cpu' else 'second'}"
    )
    head = f"{'pack':>6} {'rows':>6} {'rg':>4} {'pages':>5} {'MiB':>6} | {'reader':<20} {'seq':>7} {'random':>7} {'mapped':>7} | {'random/seq':>10} {'mapped/seq':>10} {'rand/floor':>10}"
    print(head)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="longpack-reader-") as tmp:
        for pack in [int(p) for p in args.packs.split(",")]:
            samples = make_samples(int(tokens))
            settings = PackSettings(seq_length=pack, algorithm="first_fit_shuffle", seed=1234)
            split = plan_splits(samples, settings, eos_id=EOS)[0]
            n = split.plan.num_rows
            for rg, pages in [(int(x), p) for x in args.sizes.split(",") for p in args.pages.split(",")]:
                path = Path(tmp) / f"training_{pack}.rg{rg}.{pages}.idx.parquet"
                extra = one_row_pages(pack) if pages == "row" else {}
                options = ParquetWriterOptions(row_group_size=rg, **extra)  # type: ignore[arg-type]
                write_shard_file(path, split.aligned, split.plan, 0, n, options=options)
                size = path.stat().st_size / 2**20
                seq, perm = np.arange(n), rng.permutation(n)

                def med(fn) -> float:  # type: ignore[no-untyped-def]
                    return statistics.median(fn() for _ in range(args.repeats))

                rows = []
                for pf in prefetches:
                    rates = [
                        med(
                            lambda o=o, m=m, pf=pf, path=path: longpack_rows_per_s(
                                path, o, mapped=m, prefetch=pf, cache=cache, budget=args.budget
                            )
                        )
                        for o, m in ((seq, False), (perm, False), (seq, True))
                    ]
                    rows.append((f"longpack prefetch={pf}", *rates))
                mapping = PackedDataset(path, max_num_samples=n, seed=1234).samples_mapping
                assert mapping is not None
                bridge = [
                    med(lambda o=o, path=path: bridge_random_access(path, o, args.budget, args.clock))
                    for o in (seq, perm, mapping)
                ]
                rows.append(("bridge-style", *bridge))
                floor_dir = Path(tmp) / "floor"
                floor_dir.mkdir(exist_ok=True)
                floor = MemmapFloor(path, floor_dir)
                floor_rates = [
                    med(lambda o=o, f=floor: floor_rows_per_s(f, o, args.budget))
                    for o in (seq, perm, mapping)
                ]
                rows.insert(0, ("memmap floor", *floor_rates))
                for name, s, r, m in rows:
                    print(
                        f"{pack:>6} {n:>6} {rg:>4} {pages:>5} {size:>6.0f} | {name:<20} {s:>7.0f} {r:>7.0f} {m:>7.0f} | "
                        f"{r / s:>10.2f} {m / s:>10.2f} {r / floor_rates[1]:>10.3f}",
                        flush=True,
                    )
                path.unlink()


if __name__ == "__main__":
    main()
