"""``longpack inspect``: summary, length / fill histograms and full verification of a packed output folder.

Everything is read through :class:`~longpack.packed.folder.PackedFolder` (flat Arrow buffers, no per-row
Python objects), so it scales with the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from longpack.errors import DamagedDataError, PackedDataError
from longpack.packed.folder import PackedFolder
from longpack.packed.manifest import MANIFEST_NAME

HISTOGRAM_BINS = 10


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
    labels = [
        f"[{_edge(edges[i])}, {_edge(edges[i + 1])}{']' if i == bins - 1 else ')'}"
        for i in range(len(counts))
    ]
    pad = max(18, *(len(label) for label in labels))  # every bar starts in one column, however long the edges
    lines = []
    for label, c in zip(labels, counts.tolist(), strict=True):
        bar = "#" * max(1 if c else 0, round(c / top * width))
        lines.append(f"{label:<{pad}} {c:>7} {bar}")
    return lines


def _edge(x: float) -> str:
    """A bin edge as read: 4 significant digits, but a number of 1,000 or more as a whole number (never
    ``1.147e+04``).

    >>> _edge(2.5), _edge(0.125), _edge(11468.8), _edge(131072.0)
    ('2.5', '0.125', '11469', '131072')
    """
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def inspect_output(
    out_dir: str | Path, *, verify: bool = False, no_manifest_ok: bool = False
) -> dict[str, Any]:
    """Summary of a packed output folder (and, with ``verify``, every check); JSON-ready.

    ``result["finished"]`` is False when the manifest is missing (an interrupted or running job);
    ``result["ok"]`` is False when any check failed. The checks are :meth:`PackedFolder.validate`'s.

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
        raise PackedDataError(f"{out} is not a folder; point at the output folder of `longpack pack`")
    try:
        return _inspect_folder(out, verify=verify, no_manifest_ok=no_manifest_ok)
    except DamagedDataError as exc:  # a damaged file is what a check finds (exit 1), as a changed sha256 is
        return {
            "folder": str(out),
            "finished": (out / MANIFEST_NAME).is_file(),
            "no_manifest_ok": no_manifest_ok,
            "manifest_unreadable": False,
            "damaged": True,
            "format": _recorded_format(out),
            "settings": {},
            "splits": {},
            "verified": verify,
            "problems": [str(exc)],
            "ok": False,
        }


def _recorded_format(out: Path) -> str | None:
    """The output format ``manifest.json`` records (``settings.output_format``), or ``None`` when it cannot
    be read: what a damaged folder was written as."""
    import json

    try:
        settings = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8")).get("settings")
        value = settings.get("output_format") if isinstance(settings, dict) else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _inspect_folder(out: Path, *, verify: bool, no_manifest_ok: bool) -> dict[str, Any]:
    # A folder without a manifest reads as unfinished (a problem), unless it is declared Bridge's own.
    folder = PackedFolder.open(out, allow_unfinished=True, allow_no_manifest=no_manifest_ok)
    manifest = folder.manifest
    result: dict[str, Any] = {
        "folder": str(out),
        "finished": folder.finished,
        "no_manifest_ok": no_manifest_ok,
        "manifest_unreadable": manifest is None and (out / MANIFEST_NAME).is_file(),
        "damaged": False,
        "format": folder.format,
        "settings": manifest.settings.to_dict() if manifest is not None else {},
        "splits": {},
    }
    problems = folder.validate(verify=verify)
    for split in folder.split_names:
        scan = folder.scan(split, verify=verify)
        size = folder.pack_size or (int(scan.row_runtime.max()) if scan.rows else 1)
        result["splits"][split] = {
            "files": list(scan.files),
            "rows": scan.rows,
            "samples": scan.samples,
            "stored_tokens": scan.stored_tokens,
            "runtime_tokens": int(scan.row_runtime.sum()),
            "supervised_tokens": scan.supervised_tokens,
            "samples_per_row_mean": round(scan.samples / max(scan.rows, 1), 3),
            "fill_mean": round(float(scan.row_runtime.mean()) / size, 4) if scan.rows else 0.0,
            "runtime_length_histogram": text_histogram(scan.sample_runtime, lo=0, hi=size),
            "fill_histogram": text_histogram(scan.row_runtime / size, lo=0.0, hi=1.0),
        }
    if manifest is not None:
        result["counts"] = manifest.counts
        result["megatron_bridge"] = manifest.megatron_bridge
        result["metadata"] = list(folder.metadata) if folder.metadata_path is not None else None
        result["supervised_outside_cu_seqlens"] = manifest.extra.get("supervised_outside_cu_seqlens")
    result["verified"] = verify
    result["problems"] = problems
    result["ok"] = not problems
    return result


def plot_output(out_dir: str | Path, png_path: str | Path) -> None:
    """Save length and fill histograms of every split as a PNG (matplotlib, imported here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = PackedFolder.open(out_dir, allow_unfinished=True)
    splits = folder.split_names
    fig, axes = plt.subplots(len(splits) or 1, 2, figsize=(11, 3.6 * max(len(splits), 1)), squeeze=False)
    for row, split in enumerate(splits):
        scan = folder.scan(split)
        size = folder.pack_size or (int(scan.row_runtime.max()) if scan.rows else 1)
        axes[row][0].hist(scan.sample_runtime, bins=50, range=(0, size), color="#3465a4")
        axes[row][0].set(title=f"{split}: sample runtime lengths", xlabel="tokens", ylabel="samples")
        axes[row][1].hist(scan.row_runtime / size, bins=50, range=(0, 1), color="#4e9a06")
        axes[row][1].set(title=f"{split}: row fill (pack size {size})", xlabel="fill", ylabel="rows")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110, metadata={"Software": None})
    plt.close(fig)
