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
    #: What :meth:`PackedFolder.validate` finds (``verify=True``: the checks of ``inspect --verify``, the
    #: same code, so ``check --packed`` and ``inspect --verify`` give one verdict); empty = sound.
    problems: tuple[str, ...] = ()
    #: Whether ``problems`` come from the full verification (every row, hashes, metadata, pack size).
    verified: bool = False
    #: The files of each split, resolved (what a config's data paths must name, exactly).
    split_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The folder the data is in (``None``: files or a glob were named).
    root: str | None = None
    #: The topology a ``balance``-d pack was ordered for (``gbs``, ``dp``, ``pp``...), from the manifest.
    balanced_for: Mapping[str, Any] | None = None

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
    verify: bool = True,
) -> PackedDataSummary:
    """Summarize packed data: pack size, metadata, and segment alignment against ``multiple`` (one
    multiple, or several: the first is the primary one reported in ``misaligned_segments``).

    ``path`` is a folder, a file or a glob (see :class:`~longpack.packed.PackedFolder`); ``pack_size_hint``
    picks among several ``<N>_metadata.jsonl`` files. Raises :class:`PackedDataError` when the data cannot
    be read, or is an unfinished folder (no ``manifest.json``) and neither ``allow_unfinished`` nor
    ``allow_no_manifest`` (a folder Megatron-Bridge wrote) is set. ``verify`` runs
    :meth:`PackedFolder.validate` with ``verify=True`` (the checks of ``longpack inspect --verify``) into
    ``problems``.

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = Path(tempfile.mkdtemp())
    >>> pq.write_table(pa.table({"input_ids": [[7, 7, 2, 7, 7, 7, 2]], "loss_mask": [[1] * 7],
    ...                          "seq_start_id": [[0, 3]]}), d / "training_8.idx.parquet")
    >>> s = inspect_packed_dir(d / "training_8.idx.parquet", multiple=2)
    >>> s.pack_size, s.rows, s.segments, s.misaligned_segments, s.first_misaligned.runtime_length
    (8, 1, 2, 1, 3)
    """
    from longpack.errors import DamagedDataError

    wanted = [multiple] if isinstance(multiple, int) else list(multiple)
    try:
        return _summary(path, wanted, pack_size_hint, allow_unfinished, allow_no_manifest, verify)
    except DamagedDataError as exc:
        if not verify:
            raise
        # A damaged file is what the verification finds (LP-DATA-012, exit 1), as ``inspect --verify``
        # reports it: one verdict on one folder. Nothing else about the data is known.
        first = max(1, int(wanted[0])) if wanted else 1
        return PackedDataSummary(
            path=str(path),
            pack_size=None,
            metadata_path=None,
            metadata=(),
            parquet_files=(),
            manifest=None,
            recorded_pad_seq_to_mult=None,
            rows=0,
            segments=0,
            checked_multiple=first,
            misaligned_segments=0,
            first_misaligned=None,
            segment_length_gcd=0,
            rows_over_pack_size=0,
            max_row_runtime_tokens=0,
            problems=(str(exc),),
            verified=True,
        )


def _summary(
    path: str | Path,
    wanted: list[int],
    pack_size_hint: int | None,
    allow_unfinished: bool,
    allow_no_manifest: bool,
    verify: bool,
) -> PackedDataSummary:
    from longpack.packed.folder import PackedFolder

    folder = PackedFolder.open(
        path, allow_unfinished=allow_unfinished, allow_no_manifest=allow_no_manifest, pack_size=pack_size_hint
    )
    pack_size = folder.pack_size
    checks = list(dict.fromkeys(max(1, int(m)) for m in wanted)) or [1]
    bad_counts = dict.fromkeys(checks, 0)
    firsts: dict[int, SegmentExample] = {}
    rows = segments = over = max_row = gcd = 0
    problems = tuple(folder.validate(verify=verify))  # scans every split (verified), cached for below
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
        problems=problems,
        verified=verify,
        split_files={s: tuple(str(f.resolve()) for f in folder.files(s)) for s in folder.split_names},
        root=None if folder.root is None else str(folder.root.resolve()),
        balanced_for=_balanced_for(folder.manifest.to_dict() if folder.manifest is not None else None),
    )


def _balanced_for(manifest: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The topology a balanced pack's order was made for (the manifest's ``settings.balance``), or ``None``."""
    from longpack.packed.bridge_config import balance_topology

    settings = manifest.get("settings") if manifest else None
    return balance_topology(settings.get("balance")) if isinstance(settings, Mapping) else None
