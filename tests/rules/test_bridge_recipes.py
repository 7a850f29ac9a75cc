"""Megatron-Bridge's own recipes (values read from Bridge main @ 067f987df by scripts/recipe_harness.py, kept
in longpack/data/bridge_recipes.json) get exactly the findings recorded for them: a rule change that gives
one a new error or warning fails here (update the data with the harness, and say why in the rule's docs)."""

from __future__ import annotations

from longpack.rules.recipes import bridge_recipes, check_recipe, recipes_exercising


def _by_name() -> dict[str, dict]:
    return {r["recipe"]: r for r in bridge_recipes()}


def test_every_recipe_gets_the_findings_recorded_for_it() -> None:
    changed = []
    for r in bridge_recipes():
        found = check_recipe(r)
        errors = sorted(f.rule_id for f in found if f.severity.value == "error")
        warnings = sorted(f.rule_id for f in found if f.severity.value == "warning")
        if (errors, warnings) != (r["errors"], r["warnings"]):
            changed.append((r["recipe"], errors, r["errors"], warnings, r["warnings"]))
    assert not changed, changed
    assert len(bridge_recipes()) > 200


def test_no_recipe_trips_a_version_or_a_scheduler_rule() -> None:
    # the version rules and the rules the issue found contradicting Bridge's recipes
    bad = {"LP-VER-001", "LP-VER-002", "LP-MTP-001", "LP-SCHED-001", "LP-DCP-002"}
    hits = [(r["recipe"], sorted(bad & {*r["errors"], *r["warnings"]})) for r in bridge_recipes()]
    assert [h for h in hits if h[1]] == []


def test_glm52_128k_packed_sft_with_mtp_passes() -> None:
    r = _by_name()["glm52_sft_192gpu_gb200_bf16_128k_config"]
    assert r["keys"]["model.mtp_num_layers"] == 1 and r["keys"]["dataset.enable_offline_packing"]
    assert r["keys"]["model.context_parallel_size"] == 32 and r["gpus"] == 192
    assert [f for f in check_recipe(r) if f.severity.value != "info"] == []


def test_the_dynamic_cp_example_gets_only_the_not_scheduled_warning() -> None:
    r = _by_name()["example:dynamic_context_parallel"]
    found = check_recipe(r)
    assert [f.rule_id for f in found if f.severity.value in ("error", "warning")] == ["LP-HCP-009"]
    # a Megatron-Core without dynamic CP would refuse its keys
    from longpack.rules import run_rules, setup_from_mapping
    from longpack.rules.recipes import nested
    from longpack.rules.versions import UpstreamVersions

    setup = setup_from_mapping(nested(r["keys"]), world_size=r["gpus"]).setup
    old = run_rules(setup, versions=UpstreamVersions.resolve(bridge="main", mcore="main"))
    assert {"LP-VER-001", "LP-SCHED-001"} <= {f.rule_id for f in old if f.severity.value == "error"}


def test_explain_names_the_recipes_that_exercise_a_rule() -> None:
    assert "glm52_sft_192gpu_gb200_bf16_128k_config" in recipes_exercising("LP-MTP-001")


def test_check_explain_prints_sources_versions_and_recipes() -> None:
    import json

    from typer.testing import CliRunner

    from longpack.cli.app import app

    out = CliRunner().invoke(app, ["check", "--explain", "LP-MTP-001"])
    assert out.exit_code == 0, out.output
    assert (
        "NVIDIA-NeMo/Megatron-Bridge@e4cb868dc:examples/model_verification_cards/glm5-2/card.yaml"
        in out.output
    )
    assert "Megatron-Bridge < main (known versions inside: 0.2.0" in out.output
    assert "glm52_sft_192gpu_gb200_bf16_128k_config" in out.output
    as_json = json.loads(CliRunner().invoke(app, ["check", "--explain", "lp-dcp-002", "--json"]).output)
    assert as_json["versions"]["Megatron-Core"] == {"range": ">= dev", "known": ["dev"]}
    assert as_json["sources"] == ["NVIDIA/Megatron-LM@2d6e946bab:megatron/core/model_parallel_config.py"]
    bad = CliRunner().invoke(app, ["check", "--explain", "LP-MTP-01"])
    assert bad.exit_code == 2 and "nearest: LP-MTP-001" in bad.output and "Traceback" not in bad.output
