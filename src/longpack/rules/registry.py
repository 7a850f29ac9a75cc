"""Rule registry: every rule has a stable id, a severity, a one-line title and its source.

Rules are plain functions that yield :class:`Violation` objects; :func:`run_rules` turns them into
:class:`Finding` objects carrying the rule's id and severity and where the offending keys came from.

>>> from longpack.rules import checks  # registers the rules
>>> RULES["LP-CP-001"].severity, RULES["LP-CP-001"].title
(<Severity.ERROR: 'error'>, 'model.seq_length divisible by 2*CP when CP > 1')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (stable keys, used by ``longpack check --json``)."""
        return {
            "id": self.rule_id,
            "severity": self.severity.value,
            "title": self.title,
            "message": self.message,
            "fix": self.fix,
            "keys": list(self.keys),
            "where": list(self.where),
        }


@dataclass(frozen=True, kw_only=True)
class Rule:
    """A registered rule. ``scope`` is ``"config"`` (needs a setup) or ``"packed"`` (also a packed dataset)."""

    id: str
    severity: Severity
    title: str
    source: str
    scope: str
    check: Callable[..., Iterable[Violation]]


RULES: dict[str, Rule] = {}


def rule(
    rule_id: str, severity: Severity, title: str, source: str, *, scope: str = "config"
) -> Callable[[Callable[..., Iterable[Violation]]], Callable[..., Iterable[Violation]]]:
    """Register a rule function under ``rule_id`` (ids are unique and never reused)."""

    def register(func: Callable[..., Iterable[Violation]]) -> Callable[..., Iterable[Violation]]:
        if rule_id in RULES:
            raise ValueError(f"duplicate rule id {rule_id}")
        RULES[rule_id] = Rule(
            id=rule_id, severity=severity, title=title, source=source, scope=scope, check=func
        )
        return func

    return register


def sorted_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then infos; by rule id inside a severity."""
    return sorted(findings, key=lambda f: (f.severity.rank, f.rule_id))
