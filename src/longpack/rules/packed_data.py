"""Read what the packed-data rules need from packed data (``longpack check --packed``).

The data is opened with :class:`longpack.packed.PackedFolder`, the one reader of the format: the output
folder of ``longpack pack`` (``manifest.json`` required: a folder without one is unfinished and refused),
or the files Megatron-Bridge wrote, named by a file or a glob (Bridge writes no manifest). Both splits are
checked; only row lengths (``loss_mask`` offsets) and ``seq_start_id`` are read. ``<N>_metadata.jsonl`` holds
one JSON array of per-split dicts (``max_samples_per_bin``, ``dataset_max_seqlen``, ``min_packed_seqlen``,
``pack_size`` ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from longpack.errors import PackedDataError

__all__ = ["PackedDataError", "PackedDataSummary", "SegmentExample", "inspect_packed_dir"]


@dataclass(frozen=True, kw_only=True)
class SegmentExample:
    """One packed sequence, to quote in a message (``row``: the row within ``file``)."""

    file: str
    row: int
    segment: int
    runtime_length: int


@dataclass(frozen=True, kw_only=True)
class PackedDataSummary:
    """What the packed-data rules check, gathered in one pass over the folder."""

    path: str
    #: Pack size N of the data (manifest, else metadata, else file names); ``None`` if nowhere.
    pack_size: int | None
    metadata_path: str | None
    metadata: tuple[dict[str, Any], ...]
    parquet_files: tuple[str, ...]
    manifest: dict[str, Any] | None
    #: ``pad_seq_to_mult`` recorded in the manifest, else in the folder name (``..._pad_seq_to_mult<P>_sft_...``).
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


def inspect_packed_dir(
    path: str | Path,
    *,
    multiple: int | Sequence[int] = 1,
    pack_size_hint: int | None = None,
    allow_unfinished: bool = False,
    allow_no_manifest: bool = False,
) -> PackedDataSummary:
    """Summarize packed data: pack size, metadata, and segment alignment against ``multiple`` (one
    multiple, or several: the first is the primary one reported in ``misaligned_segments``).

    ``path`` is a folder, a file or a glob (see :class:`~longpack.packed.PackedFolder`); ``pack_size_hint``
    picks among several ``<N>_metadata.jsonl`` files. Raises :class:`PackedDataError` when the data cannot
    be read, or is an unfinished folder (no ``manifest.json``) and neither ``allow_unfinished`` nor
    ``allow_no_manifest`` (a folder Megatron-Bridge wrote) is set.

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = Path(tempfile.mkdtemp())
    >>> pq.write_table(pa.table({"input_ids": [[7, 7, 2, 7, 7, 7, 2]], "loss_mask": [[1] * 7],
    ...                          "seq_start_id": [[0, 3]]}), d / "training_8.idx.parquet")
    >>> s = inspect_packed_dir(d / "training_8.idx.parquet", multiple=2)
    >>> s.pack_size, s.rows, s.segments, s.misaligned_segments, s.first_misaligned.runtime_length
    (8, 1, 2, 1, 3)
    """
    from longpack.packed.folder import PackedFolder

    folder = PackedFolder.open(
        path, allow_unfinished=allow_unfinished, allow_no_manifest=allow_no_manifest, pack_size=pack_size_hint
    )
    pack_size = folder.pack_size
    wanted = [multiple] if isinstance(multiple, int) else list(multiple)
    checks = list(dict.fromkeys(max(1, int(m)) for m in wanted)) or [1]
    bad_counts = dict.fromkeys(checks, 0)
    firsts: dict[int, SegmentExample] = {}
    rows = segments = over = max_row = gcd = 0
    for split in folder.split_names:
        scan = folder.scan(split)
        runtime = scan.sample_runtime
        for m_check in checks:
            bad = np.flatnonzero(runtime % m_check != 0)
            if m_check not in firsts and bad.size:
                file, row, seg = scan.locate_sample(int(bad[0]))
                firsts[m_check] = SegmentExample(
                    file=file, row=row, segment=seg, runtime_length=int(runtime[bad[0]])
                )
            bad_counts[m_check] += int(bad.size)
        row_runtime = scan.row_runtime
        if pack_size is not None:
            over += int(np.count_nonzero(row_runtime > pack_size))
        if row_runtime.size:
            max_row = max(max_row, int(row_runtime.max()))
        if runtime.size:
            gcd = math.gcd(gcd, int(np.gcd.reduce(np.abs(runtime))))
        rows += scan.rows
        segments += scan.samples
    return PackedDataSummary(
        path=str(path),
        pack_size=pack_size,
        metadata_path=None if folder.metadata_path is None else str(folder.metadata_path),
        metadata=folder.metadata,
        parquet_files=tuple(str(p) for p in folder.all_files),
        manifest=None if folder.manifest is None else folder.manifest.to_dict(),
        recorded_pad_seq_to_mult=folder.pad_seq_to_mult,
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
