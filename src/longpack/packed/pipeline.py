"""Tokenized samples -> aligned -> planned -> Megatron-Bridge packed Parquet + metadata + manifest.

No tokenizer knowledge here: the caller hands over :class:`~longpack.samples.TokenizedSamples`, the EOS id
and whatever provenance (inputs, tokenizer identity, malformed rows) belongs in the manifest.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from longpack import choices
from longpack._version import __version__
from longpack.errors import ConfigError, InputError
from longpack.errors import OutputExistsError as _OutputExistsError
from longpack.outputs import (
    OutputLock,
    atomic_write_bytes,
    check_output_dir,
    commit_file,
    output_write_errors,
    sha256_file,
    temp_path,
)
from longpack.packed.align import AlignedSamples
from longpack.packed.files import (
    BRIDGE_ROW_GROUP_SIZE,
    VALIDATION_DIR,
    ParquetWriterOptions,
    metadata_name,
    open_parquet_writer,
    shard_names,
    split_relpath,
    split_spec,
)
from longpack.packed.formats import output_format
from longpack.packed.manifest import MANIFEST_FORMAT, MANIFEST_NAME, PackManifest
from longpack.packed.plan import (
    MEGATRON_ALGORITHM,
    PackPlan,
    pack_metadata,
    plan_rows,
)
from longpack.packed.rows import PackedRows, fill_rows
from longpack.packed.settings import PackSettings as PackSettings
from longpack.samples import TokenizedSamples

if TYPE_CHECKING:
    pass

#: The lists live in ``longpack.choices``: on-disk formats (``parquet``: Megatron-Bridge main's packed Parquet;
#: ``npy``: the pickled object array of row dicts that released Megatron-Bridge <= 0.3 and NeMo 2 read;
#: ``indexed``: Megatron-Core's ``.bin`` / ``.idx`` pairs for pretraining, ``longpack.packed.indexed``), and
#: ``compat`` presets (settings under which the output is byte-identical to the named tool's prepare step).
IDS_DTYPES = choices.IDS_DTYPES
OUTPUT_FORMATS = choices.OUTPUT_FORMATS
COMPAT_MODES = choices.COMPAT_MODES
# Entries listed one by one in the manifest; beyond this, counts only: ``<kind>_listed`` /
# ``<kind>_unlisted`` say how many of ``<kind>_count`` the list holds (the CLI says so).
MAX_LISTED = 100_000


#: The output folder exists and ``overwrite`` was not given: ``longpack.errors.OutputExistsError``.
OutputExistsError = _OutputExistsError


def check_ids_dtype(ids_dtype: str, vocab_size: int | None) -> None:
    """Refuse ``int32`` ``input_ids`` for a vocabulary whose ids do not all fit in int32.

    >>> check_ids_dtype("int32", 151_669)
    >>> check_ids_dtype("int32", 2**31 + 1)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: ids_dtype int32 cannot hold this tokenizer's ids (vocab_size 2147483649 > 2147483648); use ids_dtype int64
    """
    if ids_dtype == choices.INT32_IDS and vocab_size is not None and vocab_size > 2**31:
        raise ConfigError(
            f"ids_dtype int32 cannot hold this tokenizer's ids (vocab_size {vocab_size} > {2**31}); "
            "use ids_dtype int64",
            fields="ids_dtype",
        )


@dataclass(frozen=True, kw_only=True)
class SplitPlan:
    """One split, ready to write: aligned samples, their rows, and the pack metadata."""

    name: str
    aligned: AlignedSamples
    plan: PackPlan
    metadata: dict[str, Any]
    source_count: int

    def report(self) -> dict[str, Any]:
        """Counts, packing statistics and the list of every truncated / dropped sample with its source."""
        a = self.aligned
        src = a.samples
        stored_in = src.stored_lengths()
        lengths = a.runtime_lengths()
        row_sums = (
            np.add.reduceat(lengths[self.plan.order], self.plan.row_offsets[:-1]) if len(a) else np.zeros(0)
        )
        truncated = [
            {
                "source": src.provenance(int(i)),
                "stored_length": int(stored_in[i]),
                "kept_tokens": a.cap + 1,
            }
            for i in a.truncated[:MAX_LISTED].tolist()
        ]
        dropped = [
            {"source": src.provenance(int(i)), "stored_length": int(stored_in[i]), "reason": reason}
            for i, reason in zip(a.dropped[:MAX_LISTED].tolist(), a.dropped_reason, strict=False)
        ]
        pieces = np.bincount(a.index, minlength=len(src))[a.fragmented] if len(a.fragmented) else a.fragmented
        fragmented = [
            {"source": src.provenance(int(i)), "stored_length": int(stored_in[i]), "fragments": int(n)}
            for i, n in zip(a.fragmented[:MAX_LISTED].tolist(), pieces[:MAX_LISTED].tolist(), strict=True)
        ]
        pack_size = self.metadata["pack_size"]
        return {
            "samples_in": self.source_count,
            "samples_packed": len(a),
            "rows": self.plan.num_rows,
            "runtime_tokens": int(lengths.sum()),
            "stored_tokens": int(a.stored.sum()),
            "alignment_pad_tokens": int((a.stored - a.kept).sum()),
            "fill_mean": round(float(np.mean(row_sums)) / pack_size, 6) if len(row_sums) else 0.0,
            "truncated_count": len(a.truncated),
            "dropped_count": len(a.dropped),
            "truncated_listed": len(truncated),
            "truncated_unlisted": len(a.truncated) - len(truncated),
            "dropped_listed": len(dropped),
            "dropped_unlisted": len(a.dropped) - len(dropped),
            "truncated": truncated,
            "dropped": dropped,
            # over-long samples cut into fragments (overlength fragment): each is several packed sequences
            "fragmented_count": len(a.fragmented),
            "fragments": int(pieces.sum()),
            "fragmented_listed": len(fragmented),
            "fragmented_unlisted": len(a.fragmented) - len(fragmented),
            "fragmented": fragmented,
        }


def plan_split(
    name: str,
    samples: TokenizedSamples,
    settings: PackSettings,
    *,
    eos_id: int,
    aligned: AlignedSamples | None = None,
) -> SplitPlan:
    """Align (unless ``aligned`` is given) and plan one split.

    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1], np.uint8), offsets=np.array([0, 3, 5]),
    ...     source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]), files=("a",))
    >>> plan_split("training", s, PackSettings(seq_length=4), eos_id=2).metadata["packing_factor"]
    2.0
    """
    if aligned is None:
        aligned = settings.align(samples, eos_id=eos_id)
    if len(aligned) == 0:
        raise InputError(
            f"{name}: no samples left to pack ({len(samples)} read, {len(aligned.dropped)} dropped as too long "
            "or empty); check seq_length and overlength",
            fields=("seq_length", "overlength"),
        )
    lengths = aligned.runtime_lengths()
    plan = plan_rows(
        lengths,
        settings.resolved_pack_size,
        algorithm=settings.algorithm,
        seed=settings.seed,
        balance=settings.balance,
    )
    metadata = pack_metadata(lengths, plan, settings.resolved_pack_size)
    return SplitPlan(name=name, aligned=aligned, plan=plan, metadata=metadata, source_count=len(samples))


def plan_splits(
    train: TokenizedSamples,
    settings: PackSettings,
    *,
    eos_id: int,
    validation: TokenizedSamples | None = None,
) -> list[SplitPlan]:
    """Training (and validation) split plans. ``settings.val_fraction`` carves a validation split out of
    ``train`` after alignment, picked with ``np.random.default_rng(seed)``; it excludes ``validation``.

    >>> s = TokenizedSamples(tokens=np.array([5, 2, 6, 2, 7, 2], np.int32), loss_mask=np.ones(6, np.uint8),
    ...     offsets=np.array([0, 2, 4, 6]), source_file=np.zeros(3, np.int32), source_row=np.arange(1, 4),
    ...     files=("a.jsonl",))
    >>> [(p.name, len(p.aligned)) for p in plan_splits(s, PackSettings(seq_length=4, val_fraction=0.3), eos_id=2)]
    [('training', 2), ('validation', 1)]
    """
    if validation is not None and settings.val_fraction > 0:
        raise ConfigError(
            "give either val_inputs or val_fraction, not both", fields=("val_inputs", "val_fraction")
        )
    if validation is not None:
        return [
            plan_split("training", train, settings, eos_id=eos_id),
            plan_split("validation", validation, settings, eos_id=eos_id),
        ]
    aligned = settings.align(train, eos_id=eos_id)
    if settings.val_fraction == 0:
        return [plan_split("training", train, settings, eos_id=eos_id, aligned=aligned)]
    # Fragments of one sample stay in one split: the draw is over source samples when there are fragments.
    units, unit_of = (len(aligned), None) if aligned.start is None else _source_units(aligned.index)
    k = units
    n_val = min(max(1, round(settings.val_fraction * k)), k - 1)
    if k < 2:
        raise InputError(f"val_fraction needs at least 2 packable samples, got {k}", fields="val_fraction")
    chosen = np.zeros(k, dtype=bool)
    chosen[np.random.default_rng(settings.seed).permutation(k)[:n_val]] = True
    if unit_of is not None:
        chosen = chosen[unit_of]
    train_plan = plan_split(
        "training", train, settings, eos_id=eos_id, aligned=aligned.subset(np.flatnonzero(~chosen))
    )
    val_aligned = aligned.subset(np.flatnonzero(chosen))
    # Truncations and drops are reported once, with the training split.
    val_aligned = replace(
        val_aligned,
        truncated=np.zeros(0, np.int64),
        dropped=np.zeros(0, np.int64),
        dropped_reason=(),
        fragmented=np.zeros(0, np.int64),
    )
    val_plan = plan_split("validation", train, settings, eos_id=eos_id, aligned=val_aligned)
    return [
        SplitPlan(
            name="training",
            aligned=train_plan.aligned,
            plan=train_plan.plan,
            metadata=train_plan.metadata,
            source_count=len(train) - n_val,
        ),
        SplitPlan(
            name="validation",
            aligned=val_plan.aligned,
            plan=val_plan.plan,
            metadata=val_plan.metadata,
            source_count=n_val,
        ),
    ]


def _source_units(index: np.ndarray) -> tuple[int, np.ndarray]:
    """``(number of distinct source samples, unit of each kept sample)`` (``index`` is ascending)."""
    new = np.ones(len(index), dtype=bool)
    new[1:] = index[1:] != index[:-1]
    return int(new.sum()), np.cumsum(new) - 1


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """What the manifest records about where the samples came from."""

    inputs: tuple[dict[str, Any], ...] = ()
    tokenizer: dict[str, Any] = field(default_factory=dict)
    text_settings: dict[str, Any] = field(default_factory=dict)
    rows_read: int = 0
    malformed: tuple[tuple[str, str], ...] = ()
    #: More top-level manifest entries from the input side (``skipped_inputs``, ``warnings``, ``mix``).
    extra: dict[str, Any] = field(default_factory=dict)


def check_out_dir(out_dir: str | Path, overwrite: bool, *, inputs: tuple[str, ...] = ()) -> None:
    """Raise now (``OutputExistsError``, ``OutputError``, ``ConfigError``) if writing to ``out_dir`` would
    fail later: see :func:`longpack.outputs.check_output_dir` (``inputs``: the job's input specs)."""
    check_output_dir(out_dir, overwrite=overwrite, inputs=inputs)
    _prepare_out_dir(Path(out_dir), overwrite, dry_run=True)


def _prepare_out_dir(out_dir: Path, overwrite: bool, *, dry_run: bool = False) -> None:
    if out_dir.exists():
        if not overwrite:
            raise OutputExistsError(
                f"output folder {out_dir} already exists; set overwrite=True to replace it or choose a new out",
                fields=("out", "overwrite"),
            )
        if not out_dir.is_dir():
            raise OutputExistsError(f"out {out_dir} exists and is not a folder", fields="out")
        foreign = sorted(p.name for p in out_dir.iterdir() if not _is_ours_path(p))
        if foreign:
            shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
            raise OutputExistsError(
                f"overwrite refused: {out_dir} holds files longpack did not write ({shown}); "
                "choose an empty or new out",
                fields=("overwrite", "out"),
            )
        if dry_run:
            return
        # Manifest first: from here on the folder reads as unfinished.
        (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
        for p in out_dir.iterdir():
            if p.is_dir():
                for q in p.iterdir():
                    q.unlink()
                p.rmdir()
            else:
                p.unlink()
    if not dry_run:
        out_dir.mkdir(parents=True, exist_ok=True)


def _is_ours(name: str) -> bool:
    from longpack.packed.bridge_config import BRIDGE_CONFIG_NAME

    return (
        name in (MANIFEST_NAME, BRIDGE_CONFIG_NAME)
        or name.endswith(("_metadata.jsonl", ".idx.parquet", ".npy", "_document.bin", "_document.idx"))
        or name == "data_path.txt"
        or (name.endswith((".bin", ".idx")) and "_document.part-" in name)
        or (name.startswith(".") and ".tmp-" in name)
    )


def _is_ours_path(path: Path) -> bool:
    """A file longpack writes, or the validation folder holding only such files. A name that is gone by
    the time it is checked is nothing to refuse: another run writing the folder renamed its temp file.

    >>> _is_ours_path(Path("no/such/.4096_metadata.jsonl.tmp-1")), _is_ours_path(Path("no/such/notes.txt"))
    (True, True)
    """
    if not os.path.lexists(path):
        return True
    if path.is_dir() and not path.is_symlink():
        return path.name == VALIDATION_DIR and all(q.is_file() and _is_ours(q.name) for q in path.iterdir())
    return path.is_file() and _is_ours(path.name)


def shard_layout(split_name: str, num_rows: int, settings: PackSettings) -> list[tuple[str, int, int]]:
    """``(file name relative to the output folder, first row, end row)`` of every shard of a split.

    >>> shard_layout("training", 1200, PackSettings(seq_length=8, rows_per_shard=500))  # doctest: +NORMALIZE_WHITESPACE
    [('training_8.part-00000-of-00003.idx.parquet', 0, 500), ('training_8.part-00001-of-00003.idx.parquet', 500, 1000),
     ('training_8.part-00002-of-00003.idx.parquet', 1000, 1200)]
    >>> shard_layout("validation", 1200, PackSettings(seq_length=8, output_format="npy"))
    [('validation/validation_8.npy', 0, 1200)]
    """
    rows_per_shard = settings.resolved_rows_per_shard or max(1, num_rows)
    num_shards = max(1, -(-num_rows // rows_per_shard))
    names = shard_names(
        split_name, settings.resolved_pack_size, num_shards, output_format=settings.output_format
    )
    return [
        (split_relpath(split_name, names[i]), i * rows_per_shard, min(num_rows, (i + 1) * rows_per_shard))
        for i in range(num_shards)
    ]


def write_shard_file(
    path: Path,
    aligned: AlignedSamples,
    plan: PackPlan,
    lo: int,
    hi: int,
    progress: Callable[[int], None] | None = None,
    *,
    ids_dtype: str = choices.DEFAULT_IDS_DTYPE,
    options: ParquetWriterOptions | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Write rows ``lo:hi`` of ``plan`` to one Parquet file atomically, row groups of
    ``options.row_group_size`` rows counted from ``lo``; return its manifest record (``name``, ``rows``,
    ``stored_tokens``, ``size_bytes``, ``sha256``; ``name`` defaults to the file's name).
    ``ids_dtype`` is the Parquet type of ``input_ids`` (``int64`` or ``int32``)."""
    opts = options or ParquetWriterOptions()
    group_size = opts.row_group_size
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    tokens = 0
    groups = [(start, min(hi, start + group_size)) for start in range(lo, hi, group_size)]

    def fill(start: int, stop: int) -> PackedRows:
        return fill_rows(aligned, plan, start, stop, ids_dtype=ids_dtype)

    # The next row group is filled (compiled, no GIL) while this one is encoded. pyarrow writes the file
    # itself: a Python file object in between costs a call into Python per page, and with one row per
    # page that was more than the encoding. The file is hashed once written, from the page cache.
    filler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longpack-fill")
    try:
        with open_parquet_writer(tmp, ids_dtype=ids_dtype, options=opts) as writer:
            pending = filler.submit(fill, *groups[0]) if groups else None
            for k, (start, stop) in enumerate(groups):
                assert pending is not None
                rows = pending.result()
                pending = filler.submit(fill, *groups[k + 1]) if k + 1 < len(groups) else None
                tokens += len(rows.input_ids)
                writer.write_table(rows.to_arrow(), row_group_size=group_size)
                del rows
                if progress is not None:
                    progress(stop - start)
        digest = sha256_file(tmp)
        commit_file(tmp, path)
    finally:
        filler.shutdown(wait=True, cancel_futures=True)
        tmp.unlink(missing_ok=True)
    return {
        "name": path.name if name is None else name,
        "rows": hi - lo,
        "stored_tokens": tokens,
        "size_bytes": path.stat().st_size,
        "sha256": digest,
    }


def write_npy_file(
    path: Path,
    aligned: AlignedSamples,
    plan: PackPlan,
    progress: Callable[[int], None] | None = None,
    *,
    name: str | None = None,
) -> dict[str, Any]:
    """Write every row of ``plan`` to one ``.npy`` file atomically, as released Megatron-Bridge (<= 0.3) and
    NeMo 2 read packed data: ``np.save`` of a list of ``{"input_ids", "loss_mask", "seq_start_id"}`` dicts
    of Python int lists (a pickled 1-D object array). Returns the file's manifest record.

    >>> import tempfile
    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1], np.uint8), offsets=np.array([0, 3, 5]),
    ...     source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]), files=("a",))
    >>> split = plan_split("training", s, PackSettings(seq_length=4), eos_id=2)
    >>> p = Path(tempfile.mkdtemp()) / "training_4.npy"
    >>> write_npy_file(p, split.aligned, split.plan)["rows"]
    1
    >>> np.load(p, allow_pickle=True)[0]  # our own file; never allow_pickle on data you did not write
    {'input_ids': [5, 6, 2, 7, 2], 'loss_mask': [1, 1, 0, 1, 0], 'seq_start_id': [0, 3]}
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    rows: list[dict[str, list[int]]] = []
    tokens = 0
    step = BRIDGE_ROW_GROUP_SIZE
    for start in range(0, plan.num_rows, step):
        stop = min(plan.num_rows, start + step)
        packed = fill_rows(aligned, plan, start, stop)
        ids, mask = packed.input_ids.tolist(), packed.loss_mask.tolist()
        starts, ro, so = (
            packed.seq_start_id.tolist(),
            packed.row_offsets.tolist(),
            packed.start_offsets.tolist(),
        )
        for r in range(stop - start):
            rows.append(
                {
                    "input_ids": ids[ro[r] : ro[r + 1]],
                    "loss_mask": mask[ro[r] : ro[r + 1]],
                    "seq_start_id": starts[so[r] : so[r + 1]],
                }
            )
        tokens += len(ids)
        if progress is not None:
            progress(stop - start)
    from longpack.packed.npy import save_rows

    try:
        save_rows(tmp, rows)
        commit_file(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {
        "name": path.name if name is None else name,
        "rows": plan.num_rows,
        "stored_tokens": tokens,
        "size_bytes": path.stat().st_size,
        "sha256": sha256_file(path),
    }


def write_split_files(
    out_dir: Path,
    split: SplitPlan,
    settings: PackSettings,
    progress: Callable[[int], None] | None = None,
    *,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """Write one split's shards atomically, 500-row groups at a time; return a record per file.

    Shards are independent files, so up to ``threads`` of them (default: cores, at most 4) are written at
    once: the numba fill and pyarrow's encoder both run without the GIL. The bytes do not depend on it.
    The npy format writes one file per split.
    """
    layout = shard_layout(split.name, split.plan.num_rows, settings)
    num_shards = len(layout)
    if not output_format(settings.output_format).sharded:  # npy: one file per split
        name = layout[0][0]
        return [write_npy_file(out_dir / name, split.aligned, split.plan, progress, name=name)]

    def write_shard(shard: int) -> dict[str, Any]:
        name, lo, hi = layout[shard]
        return write_shard_file(
            out_dir / name,
            split.aligned,
            split.plan,
            lo,
            hi,
            progress,
            ids_dtype=settings.ids_dtype,
            options=settings.writer_options,
            name=name,
        )

    n_threads = min(num_shards, threads or min(4, os.cpu_count() or 1))
    if n_threads <= 1:
        return [write_shard(i) for i in range(num_shards)]
    pool = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="longpack-shard")
    try:
        futures = [pool.submit(write_shard, i) for i in range(num_shards)]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def versions() -> dict[str, str]:
    """Versions of the software that shaped the bytes of the output."""
    import pyarrow

    return {
        "longpack": __version__,
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
    }


def write_packed_output(
    out_dir: str | Path,
    splits: list[SplitPlan],
    settings: PackSettings,
    provenance: Provenance,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    handoff: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write shards, ``<N>_metadata.jsonl``, ``bridge_config.yaml`` and, last, ``manifest.json``; return the
    manifest (``handoff``: see :func:`finish_packed_output`).

    Same splits, settings and provenance give byte-identical files (nothing time- or host-dependent is
    written).

    >>> import tempfile
    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1], np.uint8), offsets=np.array([0, 3, 5]),
    ...     source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]), files=("a.jsonl",))
    >>> settings = PackSettings(seq_length=4)
    >>> out = Path(tempfile.mkdtemp()) / "packed"
    >>> m = write_packed_output(out, plan_splits(s, settings, eos_id=2), settings, Provenance())
    >>> sorted(p.name for p in out.iterdir()), m["megatron_bridge"]["packed_train_data_path"]  # doctest: +NORMALIZE_WHITESPACE
    (['4_metadata.jsonl', 'bridge_config.yaml', 'manifest.json', 'training_4.idx.parquet'],
     'training_4.idx.parquet')
    """
    out = Path(out_dir)
    check_output_dir(out, overwrite=overwrite)
    with OutputLock(out), output_write_errors(out):
        _prepare_out_dir(out, overwrite)
        files: dict[str, list[dict[str, Any]]] = {}
        for split in splits:
            files[split.name] = write_split_files(out, split, settings, progress)
        return finish_packed_output(out, splits, settings, provenance, files, handoff=handoff)


def prepare_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Create ``out_dir`` (or empty it with ``overwrite``; manifest removed first), or raise
    :class:`OutputExistsError`. Call it holding the folder's :class:`~longpack.outputs.OutputLock`."""
    _prepare_out_dir(out_dir, overwrite)


def finish_packed_output(
    out: Path,
    splits: list[SplitPlan],
    settings: PackSettings,
    provenance: Provenance,
    files: dict[str, list[dict[str, Any]]],
    *,
    handoff: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """After every shard is written (``files``: split name -> records of :func:`write_shard_file`), write
    ``<N>_metadata.jsonl``, ``bridge_config.yaml`` and then ``manifest.json``; return the manifest.

    ``handoff``: keyword arguments of :func:`longpack.packed.bridge_config.handoff_from_manifest` (``tp``,
    ``cp``, ``sp``, ``pad_to_max_length``, ``pad_cu_seqlens``): what only the written Bridge config needs.
    """
    from longpack.packed.bridge_config import BRIDGE_CONFIG_NAME, handoff_from_manifest

    pack_size = settings.resolved_pack_size
    meta_path = out / metadata_name(pack_size)
    # json.dumps' separators are json.dump's: the bytes Bridge's prepare step writes for the same entries.
    atomic_write_bytes(meta_path, json.dumps([s.metadata for s in splits]).encode())

    megatron: dict[str, Any] = {
        "packed_sequence_size": pack_size,
        "pad_seq_to_mult": settings.pad_seq_to_mult,
        "packed_metadata_path": metadata_name(pack_size),
    }
    if settings.seq_length != pack_size:
        megatron["max_single_sequence_length"] = settings.seq_length
    for split in splits:
        key = "packed_train_data_path" if split.name == "training" else "packed_val_data_path"
        megatron[key] = split_spec(
            split.name, pack_size, len(files[split.name]), output_format=settings.output_format
        )
    eos_ids = {s.aligned.eos_id for s in splits}
    reports = {s.name: s.report() for s in splits}
    manifest = {
        "format": MANIFEST_FORMAT,
        "versions": versions(),
        "settings": {
            **asdict(settings),
            "balance": settings.balance.spec if settings.balance is not None else None,
            "pack_size": pack_size,
            "rows_per_shard": settings.resolved_rows_per_shard,
            "row_group_size": settings.writer_options.row_group_size,
            "parquet_writer": settings.writer_options.to_dict(),
            "keep_single_token": settings.keep_single_token,
            "megatron_exact": settings.algorithm == MEGATRON_ALGORITHM,
            "text": provenance.text_settings,
        },
        # What a reader must collate with: the alignment travels with the data.
        "alignment": {
            "pack_size": pack_size,
            "pad_seq_to_mult": settings.pad_seq_to_mult,
            "eos_id": eos_ids.pop() if len(eos_ids) == 1 else None,
        },
        "inputs": list(provenance.inputs),
        "tokenizer": provenance.tokenizer,
        "counts": {
            "rows_read": provenance.rows_read,
            "malformed": len(provenance.malformed),
            "samples_read": sum(r["samples_in"] for r in reports.values()),
            # source samples packed (whole, truncated or fragmented); a split's samples_packed counts sequences
            "packed": sum(
                r["samples_packed"] - r["fragments"] + r["fragmented_count"] for r in reports.values()
            ),
            "truncated": sum(r["truncated_count"] for r in reports.values()),
            "fragmented": sum(r["fragmented_count"] for r in reports.values()),
            "dropped": sum(r["dropped_count"] for r in reports.values()),
            "rows": {name: r["rows"] for name, r in reports.items()},
        },
        "malformed": [{"source": s, "reason": r} for s, r in provenance.malformed[:MAX_LISTED]],
        "malformed_listed": min(len(provenance.malformed), MAX_LISTED),
        "malformed_unlisted": max(len(provenance.malformed) - MAX_LISTED, 0),
        "splits": {
            s.name: {"metadata": s.metadata, "files": files[s.name], **reports[s.name]} for s in splits
        },
        "metadata_file": {"name": meta_path.name, "sha256": sha256_file(meta_path)},
        "megatron_bridge": megatron,
        **provenance.extra,
    }
    # Built from the manifest as every reader of the folder builds it (``PackResult.bridge_config``): the
    # file written is the one a reader derives, by construction.
    config = handoff_from_manifest(out, manifest, **(handoff or {}))
    config_path = out / BRIDGE_CONFIG_NAME
    atomic_write_bytes(config_path, config.to_yaml().encode())
    # No sha256: the file names the folder's absolute path, and the manifest must not depend on it.
    manifest["bridge_config"] = {
        "name": BRIDGE_CONFIG_NAME,
        "api": config.api,
        "options": config.options,
    }
    atomic_write_bytes(out / MANIFEST_NAME, PackManifest.from_dict(manifest).to_json_bytes())
    return manifest
