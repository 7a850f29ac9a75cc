"""Read a packed output folder back: summary, length / fill histograms, full verification.

Reads Parquet row groups as flat Arrow buffers (no per-row Python objects), so it scales with the files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from longpack.packed.files import (
    REQUIRED_COLUMNS,
    ROW_GROUP_SIZE,
    SPLITS,
    iter_row_groups,
    list_offsets_values,
    metadata_name,
    sha256_file,
    validate_rows,
)
from longpack.packed.manifest import MANIFEST_NAME
from longpack.packed.plan import PackPlan, pack_metadata

HISTOGRAM_BINS = 10


@dataclass(kw_only=True)
class SplitStats:
    """What the files of one split hold."""

    name: str
    files: list[str]
    rows: int = 0
    samples: int = 0
    stored_tokens: int = 0
    runtime_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    row_runtime: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    samples_per_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    supervised_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def split_files(out_dir: Path, split: str) -> list[Path]:
    """The split's ``*.idx.parquet`` files in the folder, sorted (= row order)."""
    return sorted(out_dir.glob(f"{split}_*.idx.parquet"))


def read_split(
    name: str, paths: list[Path], *, verify: bool, pad_seq_to_mult: int = 1, pack_size: int | None = None
) -> SplitStats:
    """Scan every row group of a split; with ``verify``, check §2.7 row invariants and alignment."""
    stats = SplitStats(name=name, files=[p.name for p in paths])
    lengths, row_runtime, per_row = [], [], []
    for path in paths:
        for group_index, table in enumerate(iter_row_groups(path, REQUIRED_COLUMNS)):
            where = f"{path.name} row group {group_index}"
            ids_off, _ = list_offsets_values(table.column("input_ids"))
            start_off, starts = list_offsets_values(table.column("seq_start_id"))
            _, mask = list_offsets_values(table.column("loss_mask"))
            if verify:
                stats.errors += [f"{where}: {e}" for e in validate_rows(table)]
                if table.num_rows > ROW_GROUP_SIZE:
                    stats.errors.append(f"{where}: {table.num_rows} rows > row group size {ROW_GROUP_SIZE}")
            row_len = np.diff(ids_off)
            n_starts = np.diff(start_off)
            row_of = np.repeat(np.arange(table.num_rows), n_starts)
            # Each sample ends where the next starts, the last one at the row's end.
            ends = np.empty_like(starts)
            if len(starts):
                ends[:-1] = starts[1:]
                last = start_off[1:][n_starts > 0] - 1
                ends[last] = row_len[n_starts > 0]
            seg_runtime = ends - starts - 1
            lengths.append(seg_runtime)
            per_row.append(n_starts)
            row_runtime.append(row_len - n_starts)
            stats.rows += table.num_rows
            stats.samples += len(starts)
            stats.stored_tokens += int(row_len.sum())
            stats.supervised_tokens += int(mask.sum())
            if verify and len(starts):
                if (seg_runtime < 1).any():
                    stats.errors.append(f"{where}: a sample has runtime length < 1")
                if pad_seq_to_mult > 1 and (seg_runtime % pad_seq_to_mult).any():
                    r = int(row_of[np.flatnonzero(seg_runtime % pad_seq_to_mult)[0]])
                    stats.errors.append(
                        f"{where}: row {r} has a sample whose runtime length is not a multiple of "
                        f"pad_seq_to_mult={pad_seq_to_mult}"
                    )
                if pack_size is not None and (row_len - n_starts > pack_size).any():
                    r = int(np.flatnonzero(row_len - n_starts > pack_size)[0])
                    stats.errors.append(
                        f"{where}: row {r} holds more than pack_size={pack_size} runtime tokens"
                    )
                if mask.size and (set(np.unique(mask).tolist()) - {0, 1}):
                    stats.errors.append(f"{where}: loss_mask holds values other than 0/1")
                if len(ends) and mask.size:
                    last_pos = ids_off[row_of] + ends - 1
                    if mask[last_pos].any():
                        stats.errors.append(f"{where}: a sample's last loss_mask position is not 0")
    if lengths:
        stats.runtime_lengths = np.concatenate(lengths)
        stats.row_runtime = np.concatenate(row_runtime)
        stats.samples_per_row = np.concatenate(per_row)
    return stats


def text_histogram(
    values: np.ndarray,
    *,
    bins: int = HISTOGRAM_BINS,
    lo: float | None = None,
    hi: float | None = None,
    width: int = 40,
) -> list[str]:
    """Lines of a text histogram.

    >>> text_histogram(np.array([1, 1, 2, 4]), bins=2, width=4)
    ['[1, 2.5)                 3 ####', '[2.5, 4]                 1 #']
    """
    if len(values) == 0:
        return ["(no values)"]
    lo = float(values.min()) if lo is None else lo
    hi = float(values.max()) if hi is None else hi
    if hi <= lo:
        hi = lo + 1
    counts, edges = np.histogram(values, bins=bins, range=(lo, hi))
    top = max(int(counts.max()), 1)
    lines = []
    for i, c in enumerate(counts.tolist()):
        right = "]" if i == bins - 1 else ")"
        label = f"[{edges[i]:.4g}, {edges[i + 1]:.4g}{right}"
        bar = "#" * max(1 if c else 0, round(c / top * width))
        lines.append(f"{label:<18} {c:>7} {bar}")
    return lines


def inspect_output(out_dir: str | Path, *, verify: bool = False) -> dict[str, Any]:
    """Summary of a packed output folder (and, with ``verify``, every check); JSON-ready.

    ``result["finished"]`` is False when the manifest is missing (an interrupted or running job);
    ``result["ok"]`` is False when any check failed.

    >>> import tempfile
    >>> from longpack.packed.pipeline import PackSettings, Provenance, plan_splits, write_packed_output
    >>> from longpack.samples import TokenizedSamples
    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1], np.uint8), offsets=np.array([0, 3, 5]),
    ...     source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]), files=("a.jsonl",))
    >>> out = Path(tempfile.mkdtemp()) / "packed"
    >>> _ = write_packed_output(out, plan_splits(s, PackSettings(seq_length=4), eos_id=2),
    ...                         PackSettings(seq_length=4), Provenance())
    >>> r = inspect_output(out, verify=True)
    >>> r["ok"], r["splits"]["training"]["rows"], r["splits"]["training"]["samples"]
    (True, 1, 2)
    """
    out = Path(out_dir)
    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a folder")
    manifest_path = out / MANIFEST_NAME
    manifest: dict[str, Any] | None = None
    problems: list[str] = []
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as exc:
            problems.append(f"{MANIFEST_NAME} is not valid JSON: {exc}")
    settings = (manifest or {}).get("settings", {})
    pack_size = settings.get("pack_size")
    m = int(settings.get("pad_seq_to_mult", 1))
    result: dict[str, Any] = {
        "folder": str(out),
        "finished": manifest is not None,
        "settings": settings,
        "splits": {},
    }
    if manifest is None:
        problems.append(
            f"no {MANIFEST_NAME}: this output is unfinished (an interrupted or still-running `longpack pack`); "
            "rerun the pack with --overwrite"
        )
    meta_list: list[dict[str, Any]] | None = None
    metas = sorted(out.glob("*_metadata.jsonl"))
    if metas:
        try:
            meta_list = json.loads(metas[0].read_text())
        except json.JSONDecodeError as exc:
            problems.append(f"{metas[0].name} is not valid JSON: {exc}")
    for index, split in enumerate(SPLITS):
        paths = split_files(out, split)
        if not paths:
            continue
        stats = read_split(split, paths, verify=verify, pad_seq_to_mult=m, pack_size=pack_size)
        size = pack_size or (int(stats.row_runtime.max()) if len(stats.row_runtime) else 1)
        info: dict[str, Any] = {
            "files": stats.files,
            "rows": stats.rows,
            "samples": stats.samples,
            "stored_tokens": stats.stored_tokens,
            "runtime_tokens": int(stats.row_runtime.sum()),
            "supervised_tokens": stats.supervised_tokens,
            "samples_per_row_mean": round(stats.samples / max(stats.rows, 1), 3),
            "fill_mean": round(float(stats.row_runtime.mean()) / size, 4) if stats.rows else 0.0,
            "runtime_length_histogram": text_histogram(stats.runtime_lengths, lo=0, hi=size),
            "fill_histogram": text_histogram(stats.row_runtime / size, lo=0.0, hi=1.0),
        }
        if verify:
            problems += [f"{split}: {e}" for e in stats.errors]
            if stats.samples:
                plan = PackPlan(
                    order=np.arange(stats.samples, dtype=np.int64),
                    row_offsets=np.concatenate([[0], np.cumsum(stats.samples_per_row)]).astype(np.int64),
                )
                recomputed = pack_metadata(stats.runtime_lengths, plan, size)
                if meta_list is not None and index < len(meta_list) and meta_list[index] != recomputed:
                    problems.append(
                        f"{split}: metadata file entry {meta_list[index]} != files give {recomputed}"
                    )
            if manifest is not None:
                problems += _check_manifest_split(out, manifest, split, stats)
        result["splits"][split] = info
    if verify and manifest is not None:
        problems += _check_manifest_files(out, manifest, meta_list)
    if manifest is not None:
        result["counts"] = manifest.get("counts", {})
        result["megatron_bridge"] = manifest.get("megatron_bridge", {})
        result["metadata"] = meta_list
    result["verified"] = verify
    result["problems"] = problems
    result["ok"] = not problems
    return result


def _check_manifest_split(out: Path, manifest: dict[str, Any], split: str, stats: SplitStats) -> list[str]:
    problems = []
    entry = manifest.get("splits", {}).get(split)
    if entry is None:
        return [f"{split}: files present but the manifest lists no such split"]
    listed = [f["name"] for f in entry.get("files", [])]
    if listed != stats.files:
        problems.append(f"{split}: manifest lists files {listed}, folder holds {stats.files}")
    for record in entry.get("files", []):
        path = out / record["name"]
        if not path.is_file():
            continue
        if path.stat().st_size != record.get("size_bytes") or sha256_file(path) != record.get("sha256"):
            problems.append(f"{split}: {record['name']} differs from the manifest (size or sha256)")
    if entry.get("rows") != stats.rows:
        problems.append(f"{split}: manifest says {entry.get('rows')} rows, files hold {stats.rows}")
    if entry.get("samples_packed") != stats.samples:
        problems.append(
            f"{split}: manifest says {entry.get('samples_packed')} samples, files hold {stats.samples}"
        )
    if entry.get("stored_tokens") != stats.stored_tokens:
        problems.append(
            f"{split}: manifest says {entry.get('stored_tokens')} stored tokens, files hold {stats.stored_tokens}"
        )
    return problems


def _check_manifest_files(
    out: Path, manifest: dict[str, Any], meta_list: list[dict[str, Any]] | None
) -> list[str]:
    problems = []
    for split in manifest.get("splits", {}):
        if not split_files(out, split):
            problems.append(f"{split}: the manifest lists this split but no files are present")
    record = manifest.get("metadata_file", {})
    pack_size = manifest.get("settings", {}).get("pack_size")
    name = record.get("name") or (metadata_name(pack_size) if pack_size else None)
    if name is None or not (out / name).is_file():
        problems.append(f"metadata file {name} is missing")
    elif sha256_file(out / name) != record.get("sha256"):
        problems.append(f"{name} differs from the manifest (sha256)")
    elif meta_list is not None:
        expected = [manifest["splits"][s]["metadata"] for s in SPLITS if s in manifest["splits"]]
        if meta_list != expected:
            problems.append(f"{name} does not match the manifest's per-split metadata")
    return problems


def plot_output(out_dir: str | Path, png_path: str | Path) -> None:
    """Save length and fill histograms of every split as a PNG (matplotlib, imported here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    manifest_path = out / MANIFEST_NAME
    pack_size = None
    if manifest_path.is_file():
        pack_size = json.loads(manifest_path.read_text()).get("settings", {}).get("pack_size")
    splits = [(s, split_files(out, s)) for s in SPLITS if split_files(out, s)]
    fig, axes = plt.subplots(len(splits) or 1, 2, figsize=(11, 3.6 * max(len(splits), 1)), squeeze=False)
    for row, (split, paths) in enumerate(splits):
        stats = read_split(split, paths, verify=False)
        size = pack_size or (int(stats.row_runtime.max()) if len(stats.row_runtime) else 1)
        axes[row][0].hist(stats.runtime_lengths, bins=50, range=(0, size), color="#3465a4")
        axes[row][0].set(title=f"{split}: sample runtime lengths", xlabel="tokens", ylabel="samples")
        axes[row][1].hist(stats.row_runtime / size, bins=50, range=(0, 1), color="#4e9a06")
        axes[row][1].set(title=f"{split}: row fill (pack size {size})", xlabel="fill", ylabel="rows")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110, metadata={"Software": None})
    plt.close(fig)
