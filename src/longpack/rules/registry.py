"""Rule records, rule families and the rule set.

A rule is a function ``check(setup) -> Iterable[Violation]`` declared with its metadata (stable id,
severity, one-line title, upstream source, the generic fix) through the :class:`RuleFamily` of its module.
Declaring a rule adds it to that family object only: nothing global changes on import. The rule set
(:data:`longpack.rules.RULES`) is built from an explicit list of family modules in
:mod:`longpack.rules.runner`; :func:`~longpack.rules.run_rules` turns violations into :class:`Finding`
objects carrying the rule's id and severity and where the offending keys came from.

>>> family = RuleFamily("demo", "Demo rules")
>>> @family.rule("LP-DEMO-001", Severity.INFO, "always says hello", "longpack", fix="nothing to change")
... def hello(s):
...     '''Greets every setup.'''
...     yield Violation(message="hello", fix="nothing to change")
>>> rules = RuleSet([family])
>>> [(r.id, r.family, r.severity.value, r.description) for r in rules]
[('LP-DEMO-001', 'demo', 'info', 'Greets every setup.')]
>>> rules["LP-DEMO-001"].fix, "LP-DEMO-001" in rules, len(rules)
('nothing to change', True, 1)
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from longpack.rules.versions import BRIDGE, MCORE, PRODUCTS, UpstreamVersions, VersionRange

if TYPE_CHECKING:
    from longpack.rules.config import TrainingSetup


class Severity(StrEnum):
    """``error`` stops a run (exit code 1); ``warning`` is a likely problem; ``info`` is advice."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "info": 2}[self.value]


@dataclass(frozen=True, kw_only=True)
class Violation:
    """What a rule function reports: the message (quoting the values) and a concrete fix."""

    message: str
    fix: str
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One fired rule, ready to print."""

    rule_id: str
    severity: Severity
    title: str
    message: str
    fix: str
    keys: tuple[str, ...] = ()
    where: tuple[str, ...] = ()
    #: The versions the finding is for and the rule's range there: ``Megatron-Bridge 0.6.0 (rule: >= 0.4.0)``.
    applies_to: str = ""

    @property
    def id(self) -> str:
        """The rule's id, as ``Rule.id`` and the JSON ``id`` name it (``rule_id`` is the same).

        >>> Finding(rule_id="LP-CP-002", severity=Severity.ERROR, title="t", message="m", fix="f").id
        'LP-CP-002'
        """
        return self.rule_id

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (stable keys, used by ``longpack check --json``; ``id`` is :attr:`rule_id`)."""
        return {
            "id": self.rule_id,
            "severity": self.severity.value,
            "title": self.title,
            "message": self.message,
            "fix": self.fix,
            "keys": list(self.keys),
            "where": list(self.where),
            "applies_to": self.applies_to,
        }


@dataclass(frozen=True)
class Source:
    """Where a rule comes from upstream: repository, file, commit (the one that introduced or last
    changed the check) and ``probe``, a literal that file holds wherever the rule applies (the drift
    script, ``scripts/rules_drift.py``, looks for it). ``repo="longpack"`` is the checker's own advice."""

    repo: str
    path: str = ""
    commit: str = ""
    probe: str = ""
    #: The change that ended (relaxed) the rule: the probe appears where the rule's range ends.
    relaxes: bool = False

    @property
    def text(self) -> str:
        """``NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py @ 8896e9027``."""
        if self.repo == "longpack":
            return "longpack"
        text = f"{self.repo} {self.path}".rstrip() + (f" @ {self.commit}" if self.commit else "")
        return text + (" (relaxed it)" if self.relaxes else "")


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """A rule's versions and sources (one entry per rule in :mod:`longpack.rules.provenance`):
    ``bridge`` and ``mcore`` are the Megatron-Bridge and Megatron-Core ranges it applies to."""

    bridge: VersionRange = dataclasses.field(default_factory=VersionRange)
    mcore: VersionRange = dataclasses.field(default_factory=VersionRange)
    sources: tuple[Source, ...] = ()

    def applies(self, versions: UpstreamVersions) -> bool:
        """Whether both ranges contain the versions checked for."""
        return self.bridge.contains(versions.bridge, BRIDGE) and self.mcore.contains(versions.mcore, MCORE)

    def ranges_text(self) -> str:
        """``Megatron-Bridge >= 0.4.0; Megatron-Core all`` (only the bounded ranges, or ``all versions``)."""
        parts = [
            f"{PRODUCTS[p].name} {r.text}"
            for p, r in ((BRIDGE, self.bridge), (MCORE, self.mcore))
            if not r.everywhere
        ]
        return "; ".join(parts) or "all versions"

    def applies_to(self, versions: UpstreamVersions) -> str:
        """What a finding says about versions: the versions checked for and the rule's ranges."""
        return (
            f"Megatron-Bridge {versions.bridge} ({versions.origin('bridge')}), Megatron-Core {versions.mcore} "
            f"({versions.origin('mcore')}) (rule: {self.ranges_text()})"
        )


#: The one rule signature: the setup in, violations out (packed-data rules read ``setup.packed``).
Check = Callable[["TrainingSetup"], Iterable[Violation]]


@dataclass(frozen=True, kw_only=True)
class Rule:
    """A declared rule.

    ``scope`` is ``"config"`` (the setup alone) or ``"packed"`` (runs only when the setup carries a
    packed-data summary, ``longpack check --packed``). ``description`` is the rule function's docstring;
    ``fix`` says in general what to change (each finding's own fix names the concrete value).
    ``source`` names where the rule comes from upstream, one or more names joined by ``"; "``: a
    Megatron-Core / Megatron-Bridge / TransformerEngine function or class (``Bridge
    ConfigContainer.validate``), Megatron-Bridge's documentation (``Bridge docs (recommended settings)``),
    or ``longpack`` for the checker's own advice.
    """

    id: str
    family: str
    severity: Severity
    title: str
    source: str
    scope: str
    description: str
    fix: str
    check: Check
    provenance: Provenance = dataclasses.field(default_factory=Provenance)


class RuleFamily:
    """The rules of one family (one module of :mod:`longpack.rules.checks`), in declaration order."""

    def __init__(self, name: str, title: str) -> None:
        self.name = name
        self.title = title
        self._rules: list[Rule] = []

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(self._rules)

    def rule(
        self, rule_id: str, severity: Severity, title: str, source: str, *, fix: str, scope: str = "config"
    ) -> Callable[[Check], Check]:
        """Declare the decorated function as rule ``rule_id`` of this family (returns it unchanged)."""
        if scope not in ("config", "packed"):
            raise ValueError(f"{rule_id}: scope must be 'config' or 'packed', got {scope!r}")

        def declare(func: Check) -> Check:
            if any(r.id == rule_id for r in self._rules):
                raise ValueError(f"duplicate rule id {rule_id}")
            self._rules.append(
                Rule(
                    id=rule_id,
                    family=self.name,
                    severity=severity,
                    title=title,
                    source=source,
                    scope=scope,
                    description=inspect.cleandoc(func.__doc__ or ""),
                    fix=fix,
                    check=func,
                )
            )
            return func

        return declare


class RuleSet:
    """An ordered, read-only set of rules built from rule families.

    Iterating yields :class:`Rule` records (not ids, as a dict would); ``rules[id]`` looks one up.
    """

    def __init__(
        self, families: Iterable[RuleFamily], provenance: Mapping[str, Provenance] | None = None
    ) -> None:
        self.families: tuple[RuleFamily, ...] = tuple(families)
        by_id: dict[str, Rule] = {}
        for family in self.families:
            for r in family.rules:
                if r.id in by_id:
                    raise ValueError(
                        f"rule {r.id} is declared by both {by_id[r.id].family} and {family.name}"
                    )
                if provenance is not None:
                    if r.id not in provenance:
                        raise ValueError(f"rule {r.id} has no versions and source in the provenance table")
                    r = dataclasses.replace(r, provenance=provenance[r.id])
                by_id[r.id] = r
        if provenance is not None and (stale := sorted(set(provenance) - set(by_id))):
            raise ValueError(f"the provenance table names rules that do not exist: {stale}")
        self._by_id = by_id

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, rule_id: object) -> bool:
        return rule_id in self._by_id

    def __getitem__(self, rule_id: str) -> Rule:
        try:
            return self._by_id[rule_id]
        except KeyError:
            raise KeyError(f"no rule {rule_id!r}; `longpack check --list-rules` lists them") from None

    def ids(self) -> list[str]:
        """Rule ids in order."""
        return list(self._by_id)

    def values(self) -> list[Rule]:
        """The rules in order (as ``iter(rules)``; for callers written against a mapping)."""
        return list(self._by_id.values())

    def items(self) -> list[tuple[str, Rule]]:
        """``(id, rule)`` pairs in order."""
        return list(self._by_id.items())


def sorted_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then infos; by rule id inside a severity."""
    return sorted(findings, key=lambda f: (f.severity.rank, f.rule_id))
