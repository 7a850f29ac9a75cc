"""Configuration rules for packed, long-context and MoE training with Megatron-Bridge.

Load a config (:func:`load_setup`) or build a setup from a layout (:meth:`TrainingSetup.from_layout`),
then :func:`run_rules`. Every rule lives in :mod:`longpack.rules.checks` and is listed in :data:`RULES`.

>>> from longpack.topology import ParallelLayout
>>> setup = TrainingSetup.from_layout(ParallelLayout(world_size=8, cp=2), seq_length=4094)
>>> [f.rule_id for f in run_rules(setup) if f.severity == "error"]
['LP-CP-001', 'LP-CP-002']
"""

from longpack.rules import checks as _checks  # noqa: F401  (registers the rules)
from longpack.rules.checks import has_errors, run_rules, suggest_layout
from longpack.rules.config import (
    ConfigError,
    DatasetKind,
    DatasetSettings,
    LoadedSetup,
    ModelSettings,
    OfflinePackingSpecs,
    TrainingSetup,
    apply_overrides,
    load_setup,
    setup_from_mapping,
)
from longpack.rules.families import FAMILIES, ModelFamily, find_family
from longpack.rules.packed_data import PackedDataError, PackedDataSummary, inspect_packed_dir
from longpack.rules.registry import RULES, Finding, Rule, Severity, Violation

__all__ = [
    "FAMILIES",
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
    "Severity",
    "TrainingSetup",
    "Violation",
    "apply_overrides",
    "find_family",
    "has_errors",
    "inspect_packed_dir",
    "load_setup",
    "run_rules",
    "setup_from_mapping",
    "suggest_layout",
]
