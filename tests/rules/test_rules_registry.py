"""The rule set: built from an explicit list of family modules, importing changes nothing global."""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest

from longpack.rules import FAMILY_MODULES, RULES, RuleFamily, RuleSet, Severity, Violation
from longpack.rules.checks import cp, topology


def test_rule_set_is_the_families_in_the_listed_order() -> None:
    assert [r.id for r in RULES] == [r.id for m in FAMILY_MODULES for r in m.FAMILY.rules]
    assert [f.name for f in RULES.families] == [
        "inputs",
        "upstream",
        "topology",
        "pipeline",
        "cp",
        "hybrid_cp",
        "batch",
        "packing",
        "cuda_graphs",
        "energon",
        "vlm",
        "moe",
        "family",
        "packed_data",
    ]
    for module in FAMILY_MODULES:
        assert module.__name__.rsplit(".", 1)[1] == module.FAMILY.name
        assert all(r.family == module.FAMILY.name for r in module.FAMILY.rules)


def test_importing_a_family_module_again_registers_nothing() -> None:
    before = RULES.ids()
    spec = importlib.util.spec_from_file_location("longpack_cp_copy", cp.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)  # a second, independent import of the cp family
    assert RULES.ids() == before  # the rule set holds the records it was built from
    assert [r.id for r in fresh.FAMILY.rules] == [r.id for r in RULES if r.family == "cp"]
    assert fresh.FAMILY is not cp.FAMILY
    demo = RuleFamily("demo", "Demo")

    @demo.rule("LP-DEMO-001", Severity.INFO, "demo", "longpack", fix="nothing")
    def always(s):  # type: ignore[no-untyped-def]
        yield Violation(message="m", fix="nothing")

    assert "LP-DEMO-001" not in RULES
    assert RuleSet([demo]).ids() == ["LP-DEMO-001"]


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="declared by both"):
        RuleSet([topology.FAMILY, topology.FAMILY])
    family = RuleFamily("x", "X")
    family.rule("LP-X-001", Severity.INFO, "t", "s", fix="f")(lambda s: ())
    with pytest.raises(ValueError, match="duplicate rule id"):
        family.rule("LP-X-001", Severity.INFO, "t", "s", fix="f")(lambda s: ())


def test_records_have_the_shape_the_docs_read() -> None:
    for r in RULES:
        row = {
            "id": r.id,
            "family": r.family,
            "severity": r.severity.value,
            "title": r.title,
            "description": r.description,
            "fix": r.fix,
        }
        assert all(isinstance(v, str) and v for v in row.values()), row
        assert r.scope in ("config", "packed")
    assert json.dumps([r.id for r in RULES])  # plain data
    assert RULES["LP-CP-001"].check is cp.cp_seq_length
    with pytest.raises(KeyError, match="--list-rules"):
        RULES["LP-NOPE-001"]


def test_quoted_key_names_are_keys_longpack_reads() -> None:
    from longpack.rules import declared_keys
    from longpack.rules.checks import common
    from longpack.rules.config import DECLARED

    quoted = {name: value for name, value in vars(common).items() if name.startswith("K_")}
    unread = {
        name: key
        for name, key in quoted.items()
        if key not in declared_keys() and not any(key.startswith(leaf + ".") for leaf in DECLARED.leaves)
    }
    assert len(quoted) > 20 and unread == {}
