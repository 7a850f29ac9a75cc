"""Megatron-Bridge packed Parquet: alignment, packing plans, row filling, output folders, inspection.

numpy + pyarrow only (no torch). Pipeline: :func:`align_samples` -> :func:`plan_rows`
(``longpack.binpack``; ``first_fit_shuffle`` = Megatron-Bridge's exact rows) -> :func:`fill_rows` ->
:func:`write_packed_output` (Parquet files, ``<N>_metadata.jsonl``, ``manifest.json`` last) ->
:func:`inspect_output`. :class:`PackedFolder` is the one reader of that output (folder, file or glob).
"""

from longpack.packed.align import (
    DEFAULT_OVERLENGTH,
    OVERLENGTH_POLICIES,
    AlignedSamples,
    OverlengthError,
    align_samples,
    runtime_cap,
)
from longpack.packed.files import resolve_packed_parquet_paths
from longpack.packed.folder import PackedFolder, validate_row, validate_rows
from longpack.packed.inspect import inspect_output, plot_output
from longpack.packed.manifest import MANIFEST_NAME, PackManifest
from longpack.packed.pipeline import (
    OutputExistsError,
    PackSettings,
    Provenance,
    SplitPlan,
    plan_split,
    plan_splits,
    write_packed_output,
)
from longpack.packed.plan import DEFAULT_ALGORITHM, MEGATRON_ALGORITHM, PackPlan, pack_metadata, plan_rows
from longpack.packed.rows import PackedRows, fill_rows

__all__ = [
    "DEFAULT_ALGORITHM",
    "DEFAULT_OVERLENGTH",
    "MANIFEST_NAME",
    "MEGATRON_ALGORITHM",
    "OVERLENGTH_POLICIES",
    "AlignedSamples",
    "OutputExistsError",
    "OverlengthError",
    "PackManifest",
    "PackPlan",
    "PackSettings",
    "PackedFolder",
    "PackedRows",
    "Provenance",
    "SplitPlan",
    "align_samples",
    "fill_rows",
    "inspect_output",
    "pack_metadata",
    "plan_rows",
    "plan_split",
    "plan_splits",
    "plot_output",
    "resolve_packed_parquet_paths",
    "runtime_cap",
    "validate_row",
    "validate_rows",
    "write_packed_output",
]
