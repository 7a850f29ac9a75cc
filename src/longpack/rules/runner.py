"""The rule set (built from an explicit list of family modules) and the runner.

>>> from longpack.rules.config import setup_from_mapping
>>> s = setup_from_mapping({"model": {"context_parallel_size": 3, "seq_length": 256, "calculate_per_token_loss": True}}).setup
>>> [f.rule_id for f in run_rules(s) if f.severity == "error"]
['LP-CP-001']
>>> RULES["LP-CP-001"].family, len(RULES) == sum(len(f.rules) for f in RULES.families)
('cp', True)
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterable

from longpack.rules.checks import (
    batch,
    cp,
    cuda_graphs,
    energon,
    family,
    hybrid_cp,
    inputs,
    moe,
    packed_data,
    packing,
    pipeline,
    topology,
    upstream,
    vlm,
)
from longpack.rules.config import TrainingSetup
from longpack.rules.packed_data import PackedDataSummary
from longpack.rules.provenance import PROVENANCE
from longpack.rules.registry import Finding, Rule, RuleSet, Severity, sorted_findings
from longpack.rules.versions import UpstreamVersions

#: The rule families, in the order ``longpack check --list-rules`` prints them.
FAMILY_MODULES = (
    inputs,
    upstream,
    topology,
    pipeline,
    cp,
    hybrid_cp,
    batch,
    packing,
    cuda_graphs,
    energon,
    vlm,
    moe,
    family,
    packed_data,
)

#: Every rule: iterate for :class:`~longpack.rules.registry.Rule` records, ``RULES[id]`` for one.
RULES = RuleSet((module.FAMILY for module in FAMILY_MODULES), provenance=PROVENANCE)


@functools.lru_cache(maxsize=64)
def _applicable(bridge: str, mcore: str) -> frozenset[str]:
    # the ranges are fixed per process: work the set out once per pair of versions
    versions = UpstreamVersions(bridge=bridge, mcore=mcore)
    return frozenset(r.id for r in RULES if r.provenance.applies(versions))


def rules_outside(versions: UpstreamVersions) -> list[Rule]:
    """The rules whose version ranges leave out ``versions`` (``longpack check --verbose`` lists them).

    >>> old, new = UpstreamVersions.resolve(bridge="0.5.1", mcore="0.16.1"), UpstreamVersions.resolve(bridge="main", mcore="main")
    >>> sorted(r.id for r in rules_outside(old) if r.family == "moe")  # need Megatron-Core 0.19
    ['LP-MOE-005', 'LP-MOE-007', 'LP-MOE-009']
    >>> sorted(r.id for r in rules_outside(new) if r.family == "moe")  # relaxed by later versions
    ['LP-MOE-005', 'LP-MOE-006', 'LP-MOE-008']
    """
    applicable = _applicable(versions.bridge, versions.mcore)
    return [r for r in RULES if r.id not in applicable]


def run_rules(
    setup: TrainingSetup,
    packed: PackedDataSummary | None = None,
    *,
    select: set[str] | None = None,
    versions: UpstreamVersions | None = None,
) -> list[Finding]:
    """Run every rule (or those in ``select``) whose version ranges hold ``versions`` and return
    findings, errors first.

    ``versions`` (default: ``setup.versions``, else :func:`~longpack.rules.checks.upstream.versions_for`:
    the given, environment or installed versions, else the ones the config's keys bound) decides which rules apply; each finding names
    them. ``packed`` (a summary of the packed folder the run reads) enables the packed-data rules; it may
    also come in as ``setup.packed``. When a size is not positive (``LP-CFG-001``), only the ``LP-CFG``
    rules run: the others would divide by it.
    """
    versions = versions or setup.versions or upstream.versions_for(setup.given_keys, setup=setup)
    if setup.versions != versions:
        # a shallow copy, not dataclasses.replace: re-validating the whole setup costs more than the rules
        setup = copy.copy(setup)
        object.__setattr__(setup, "versions", versions)
    if packed is not None:
        setup = dataclasses.replace(setup, packed=packed)
    findings: list[Finding] = []
    basic_broken = bool(inputs.non_positive_sizes(setup))
    applicable = _applicable(versions.bridge, versions.mcore)
    for r in RULES:
        if select is not None and r.id not in select:
            continue
        if r.id not in applicable:
            continue
        if basic_broken and r.family != inputs.FAMILY.name:
            continue
        if r.scope == "packed" and setup.packed is None:
            continue
        for v in r.check(setup):
            findings.append(
                Finding(
                    rule_id=r.id,
                    severity=r.severity,
                    title=r.title,
                    message=v.message,
                    fix=v.fix,
                    keys=v.keys,
                    where=tuple(setup.where(*v.keys)),
                    applies_to=r.provenance.applies_to(versions),
                )
            )
    return sorted_findings(findings)


def has_errors(findings: Iterable[Finding]) -> bool:
    """Whether any finding is an error (``longpack check`` then exits 1)."""
    return any(f.severity is Severity.ERROR for f in findings)
