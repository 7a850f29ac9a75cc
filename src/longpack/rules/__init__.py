"""Configuration rules for packed, long-context and MoE training with Megatron-Bridge.

Load a config (:func:`load_setup`) or build a setup from a layout (:meth:`TrainingSetup.from_layout`),
then :func:`run_rules`. The rules live in :mod:`longpack.rules.checks`, one module per family, and are
listed in :data:`RULES` (iterate it for :class:`Rule` records: id, family, severity, title, source,
scope, description, fix).

>>> from longpack.topology import ParallelLayout
>>> setup = TrainingSetup.from_layout(ParallelLayout(world_size=8, cp=2), seq_length=4094)
>>> [f.rule_id for f in run_rules(setup) if f.severity == "error"]
['LP-CP-001', 'LP-CP-002']
"""

from typing import Any

from longpack.catalog import ModelFamily, find_family, list_families
from longpack.rules.checks.pipeline import suggest_layout
from longpack.rules.config import (
    ConfigError,
    DatasetKind,
    DatasetSettings,
    LoadedSetup,
    ModelSettings,
    OfflinePackingSpecs,
    TrainingSetup,
    apply_overrides,
    declared_keys,
    load_setup,
    setup_from_mapping,
)
from longpack.rules.packed_data import PackedDataError, PackedDataSummary, inspect_packed_dir
from longpack.rules.registry import Finding, Rule, RuleFamily, RuleSet, Severity, Violation
from longpack.rules.runner import FAMILY_MODULES, RULES, has_errors, run_rules


def __getattr__(name: str) -> Any:
    # FAMILIES reads the catalog; do it on first use, not on import
    if name == "FAMILIES":
        return list_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FAMILIES",
    "FAMILY_MODULES",
    "RULES",
    "ConfigError",
    "DatasetKind",
    "DatasetSettings",
    "Finding",
    "LoadedSetup",
    "ModelFamily",
    "ModelSettings",
    "OfflinePackingSpecs",
    "PackedDataError",
    "PackedDataSummary",
    "Rule",
    "RuleFamily",
    "RuleSet",
    "Severity",
    "TrainingSetup",
    "Violation",
    "apply_overrides",
    "declared_keys",
    "find_family",
    "has_errors",
    "inspect_packed_dir",
    "list_families",
    "load_setup",
    "run_rules",
    "setup_from_mapping",
    "suggest_layout",
]
