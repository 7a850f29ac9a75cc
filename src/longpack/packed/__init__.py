"""Megatron-Bridge packed Parquet: alignment, packing plans, row filling, output folders, inspection.

numpy + pyarrow only (no torch). Pipeline: :func:`align_samples` -> :func:`plan_rows`
(``longpack.binpack``; ``first_fit_shuffle`` = Megatron-Bridge's exact rows) -> :func:`fill_rows` ->
:func:`write_packed_output` (Parquet files, ``<N>_metadata.jsonl``, ``manifest.json`` last) ->
:func:`inspect_output`. :class:`PackedFolder` is the one reader of that output (folder, file or glob).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        Provenance,
        SplitPlan,
        plan_split,
        plan_splits,
        write_packed_output,
    )
    from longpack.packed.plan import DEFAULT_ALGORITHM, MEGATRON_ALGORITHM, PackPlan, pack_metadata, plan_rows
    from longpack.packed.rows import PackedRows, fill_rows
    from longpack.packed.settings import PackSettings

#: Where each name lives: the package imports a module when one of its names is first used (PEP 562), so
#: ``import longpack.packed.settings`` (a job config's ``PackSettings``) loads no pyarrow.
_WHERE: dict[str, str] = {
    "AlignedSamples": "longpack.packed.align",
    "DEFAULT_ALGORITHM": "longpack.packed.plan",
    "DEFAULT_OVERLENGTH": "longpack.packed.align",
    "MANIFEST_NAME": "longpack.packed.manifest",
    "MEGATRON_ALGORITHM": "longpack.packed.plan",
    "OVERLENGTH_POLICIES": "longpack.packed.align",
    "OutputExistsError": "longpack.packed.pipeline",
    "OverlengthError": "longpack.packed.align",
    "PackManifest": "longpack.packed.manifest",
    "PackPlan": "longpack.packed.plan",
    "PackSettings": "longpack.packed.settings",
    "PackedFolder": "longpack.packed.folder",
    "PackedRows": "longpack.packed.rows",
    "Provenance": "longpack.packed.pipeline",
    "SplitPlan": "longpack.packed.pipeline",
    "align_samples": "longpack.packed.align",
    "fill_rows": "longpack.packed.rows",
    "inspect_output": "longpack.packed.inspect",
    "pack_metadata": "longpack.packed.plan",
    "plan_rows": "longpack.packed.plan",
    "plan_split": "longpack.packed.pipeline",
    "plan_splits": "longpack.packed.pipeline",
    "plot_output": "longpack.packed.inspect",
    "resolve_packed_parquet_paths": "longpack.packed.files",
    "runtime_cap": "longpack.packed.align",
    "validate_row": "longpack.packed.folder",
    "validate_rows": "longpack.packed.folder",
    "write_packed_output": "longpack.packed.pipeline",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


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
