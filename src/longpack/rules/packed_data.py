"""Read what the packed-data rules need from a packed output folder (Megatron-Bridge layout).

The folder holds ``training_<N>.idx.parquet`` / ``validation_<N>.idx.parquet`` (columns ``input_ids``,
``loss_mask``, ``seq_start_id``), ``<N>_metadata.jsonl`` (one JSON array of per-split dicts with
``max_samples_per_bin``, ``dataset_max_seqlen``, ``min_packed_seqlen``, ``pack_size`` ...; spec
``megatron-packing.md`` §2.5 and §2.7) and, when longpack wrote it, a ``manifest.json``. The metadata
file is the key; a missing manifest is fine. Only row lengths (from ``loss_mask``, else ``input_ids``) and
``seq_start_id`` are read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from longpack.errors import PackedDataError as _PackedDataError


class PackedDataError(_PackedDataError):
    """The packed folder cannot be read (missing, no Parquet and no metadata, bad columns)."""


@dataclass(frozen=True, kw_only=True)
class SegmentExample:
    """One packed sequence, to quote in a message."""

    file: str
    row: int
    segment: int
    runtime_length: int


@dataclass(frozen=True, kw_only=True)
class PackedDataSummary:
    """What the packed-data rules check, gathered in one pass over the folder."""

    path: str
    #: Pack size N (``pack_size`` in the metadata, else from file names); ``None`` if nowhere.
    pack_size: int | None
    metadata_path: str | None
    metadata: tuple[dict[str, Any], ...]
    parquet_files: tuple[str, ...]
    manifest: dict[str, Any] | None
    #: ``pad_seq_to_mult`` recorded in the folder name (``..._pad_seq_to_mult<P>_sft_...``) or manifest.
    recorded_pad_seq_to_mult: int | None
    rows: int
    segments: int
    #: The multiple segment runtime lengths were checked against.
    checked_multiple: int
    misaligned_segments: int
    first_misaligned: SegmentExample | None
    #: Greatest common divisor of all segment runtime lengths (0 when there are none).
    segment_length_gcd: int
    rows_over_pack_size: int
    max_row_runtime_tokens: int
    #: Misaligned-sequence counts (and first example) for every multiple that was scanned.
    misaligned_by_multiple: Mapping[int, int] = field(default_factory=dict)
    first_misaligned_by_multiple: Mapping[int, SegmentExample] = field(default_factory=dict)

    def misaligned_count(self, multiple: int) -> int | None:
        """Sequences whose runtime length is not a multiple of ``multiple``; ``None`` if not scanned for it."""
        if multiple == self.checked_multiple:
            return self.misaligned_segments
        return self.misaligned_by_multiple.get(multiple)


_META_RE = re.compile(r"^(\d+)_metadata\.jsonl$")
_PARQUET_RE = re.compile(r"_(\d+)\.idx\.(parquet|pq)$", re.IGNORECASE)
_DIR_MULT_RE = re.compile(r"_pad_seq_to_mult(\d+|None)_")


def _find_key(obj: Any, names: tuple[str, ...]) -> Any:
    if isinstance(obj, dict):
        for name in names:
            if name in obj:
                return obj[name]
        for value in obj.values():
            found = _find_key(value, names)
            if found is not None:
                return found
    return None


def inspect_packed_dir(
    path: str | Path, *, multiple: int | Sequence[int] = 1, pack_size_hint: int | None = None
) -> PackedDataSummary:
    """Summarize a packed folder: pack size, metadata, and segment alignment against ``multiple`` (one
    multiple, or several: the first is the primary one reported in ``misaligned_segments``).

    ``pack_size_hint`` picks among several ``<N>_metadata.jsonl`` files. Raises
    :class:`PackedDataError` when there is nothing to check.
    """
    import pyarrow.parquet as pq

    root = Path(path)
    if not root.exists():
        raise PackedDataError(f"packed data {root}: no such file or folder")
    if root.is_file():
        folder, parquet = root.parent, [root]
    else:
        folder = root
        parquet = sorted(
            p for p in folder.iterdir() if p.suffix.lower() in (".parquet", ".pq") and p.is_file()
        )
    metas = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _META_RE.match(p.name)))
    if not parquet and not metas:
        raise PackedDataError(
            f"packed data {root}: no *.parquet files and no <N>_metadata.jsonl; point --packed at the "
            "folder `longpack pack` (or Megatron-Bridge) wrote"
        )
    meta_path: Path | None = None
    if metas:
        chosen = [p for n, p in metas if n == pack_size_hint] or [metas[0][1]]
        meta_path = chosen[0]
    metadata: list[dict[str, Any]] = []
    if meta_path is not None:
        try:
            loaded = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise PackedDataError(f"{meta_path}: not a JSON array of metadata dicts ({exc})") from exc
        if not isinstance(loaded, list) or not all(isinstance(x, dict) for x in loaded):
            raise PackedDataError(
                f"{meta_path}: must hold one JSON array of dicts (Bridge: 'invalid packing_metadata_file!')"
            )
        metadata = loaded

    pack_size: int | None = None
    for entry in metadata:
        if isinstance(entry.get("pack_size"), int):
            pack_size = entry["pack_size"]
            break
    if pack_size is None and meta_path is not None:
        pack_size = int(_META_RE.match(meta_path.name).group(1))  # type: ignore[union-attr]
    if pack_size is None:
        for p in parquet:
            if m := _PARQUET_RE.search(p.name):
                pack_size = int(m.group(1))
                break

    manifest: dict[str, Any] | None = None
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        try:
            loaded_manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            manifest = loaded_manifest if isinstance(loaded_manifest, dict) else None
        except (OSError, json.JSONDecodeError):
            manifest = None
    if pack_size is None and manifest is not None:
        value = _find_key(manifest, ("pack_size", "packed_sequence_size"))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            pack_size = value
    recorded: int | None = None
    if manifest is not None:
        value = _find_key(manifest, ("pad_seq_to_mult",))
        if isinstance(value, int) and not isinstance(value, bool):
            recorded = value
    if recorded is None and (m := _DIR_MULT_RE.search(folder.name + "_")) and m.group(1) != "None":
        recorded = int(m.group(1))

    wanted = [multiple] if isinstance(multiple, int) else list(multiple)
    checks = list(dict.fromkeys(max(1, int(m)) for m in wanted)) or [1]
    bad_counts = dict.fromkeys(checks, 0)
    firsts: dict[int, SegmentExample] = {}
    rows = segments = over = 0
    max_row = 0
    gcd = 0
    for file in parquet:
        try:
            pf = pq.ParquetFile(file)
            names = set(pf.schema_arrow.names)
            missing = {"input_ids", "seq_start_id"} - names
            if missing:
                raise PackedDataError(f"{file}: missing required columns {sorted(missing)}")
            # Row lengths come from loss_mask (int8, same length as input_ids in Bridge's format) when it is
            # there: decoding it costs a quarter of the int64 input_ids.
            length_column = "loss_mask" if "loss_mask" in names else "input_ids"
            batches = pf.iter_batches(columns=[length_column, "seq_start_id"], batch_size=4096)
            for batch in batches:
                ids = batch.column(0)
                starts_col = batch.column(1)
                row_len = np.asarray(ids.value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
                counts = np.asarray(starts_col.value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
                starts = np.asarray(starts_col.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
                n = len(row_len)
                row_of = np.repeat(np.arange(n), counts)
                ends = np.empty_like(starts)
                ends[:-1] = starts[1:]
                last = np.cumsum(counts) - 1
                ends[last[counts > 0]] = row_len[counts > 0]
                runtime = ends - starts - 1
                for m_check in checks:
                    bad = np.flatnonzero(runtime % m_check != 0)
                    if m_check not in firsts and bad.size:
                        i = int(bad[0])
                        r = int(row_of[i])
                        seg = i - int(np.cumsum(counts)[r] - counts[r])
                        firsts[m_check] = SegmentExample(
                            file=file.name, row=rows + r, segment=seg, runtime_length=int(runtime[i])
                        )
                    bad_counts[m_check] += int(bad.size)
                row_runtime = row_len - counts
                if pack_size is not None:
                    over += int(np.count_nonzero(row_runtime > pack_size))
                if n:
                    max_row = max(max_row, int(row_runtime.max()))
                if runtime.size:
                    gcd = math.gcd(gcd, int(np.gcd.reduce(np.abs(runtime))))
                rows += n
                segments += int(starts.size)
        except PackedDataError:
            raise
        except Exception as exc:  # pyarrow raises many types for unreadable files
            raise PackedDataError(f"{file}: cannot read packed Parquet ({exc})") from exc

    return PackedDataSummary(
        path=str(root),
        pack_size=pack_size,
        metadata_path=str(meta_path) if meta_path is not None else None,
        metadata=tuple(metadata),
        parquet_files=tuple(str(p) for p in parquet),
        manifest=manifest,
        recorded_pad_seq_to_mult=recorded,
        rows=rows,
        segments=segments,
        checked_multiple=checks[0],
        misaligned_segments=bad_counts[checks[0]],
        first_misaligned=firsts.get(checks[0]),
        segment_length_gcd=gcd,
        rows_over_pack_size=over,
        max_row_runtime_tokens=max_row,
        misaligned_by_multiple=bad_counts,
        first_misaligned_by_multiple=firsts,
    )
