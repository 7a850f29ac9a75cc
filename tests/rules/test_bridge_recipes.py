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


def test_every_error_is_one_bridge_or_megatron_core_refuses() -> None:
    from longpack.rules.recipes import EXPECTED_ERRORS

    errors = {(r["recipe"], e) for r in bridge_recipes() for e in r["errors"]}
    assert errors == set(EXPECTED_ERRORS), (errors - set(EXPECTED_ERRORS), set(EXPECTED_ERRORS) - errors)
    assert all("@" in why and ".py:" in why for why in EXPECTED_ERRORS.values())


def test_the_harness_reads_what_the_recipe_files_leave_to_constants_helpers_and_locals() -> None:
    by = _by_name()
    # NEMOTRON_3_ULTRA_OPENMATHINSTRUCT2_SEQ_LENGTH = 4096 at module level -> the packing specs
    ultra = by["nemotron_3_ultra_sft_192gpu_h100_bf16_openmathinstruct2_packed_config"]["keys"]
    assert ultra["dataset.offline_packing_specs.packed_sequence_size"] == 4096
    # deepseek_v4_flash_sft_32gpu_h100_bf16_config imported as deepseek_v4_flash_sft_config
    ds = by["deepseek_v4_flash_sft_openmath_thinking_packed_config"]["keys"]
    assert ds["dataset.offline_packing_specs.packed_sequence_size"] == ds["model.seq_length"] == 4096
    # _apply_k_exaone_2_0_topology(cfg, pipeline_model_parallel_size=16, ...)
    assert (
        by["exaone_moe_2_0_750b_a37_sft_512gpu_h100_bf16_config"]["keys"][
            "model.pipeline_model_parallel_size"
        ]
        == 16
    )
    # model_cfg = WanModelProvider(...); model_cfg.context_parallel_size = 8; dataset = WanDatasetConfig(...)
    wan = by["wan_1_3b_pretrain_8gpu_h100_bf16_config"]["keys"]
    assert wan["model.context_parallel_size"] == 8 and wan["dataset._target_"] == "WanDatasetConfig"


def test_cp_loss_rules_skip_datasets_bridge_does_not_assert_on() -> None:
    r = _by_name()["wan_1_3b_text2video_pretrain_4gpu_h100_bf16_config"]
    assert r["keys"]["model.context_parallel_size"] == 4 and r["keys"]["ddp.average_in_collective"]
    assert {"LP-CP-002", "LP-CP-003"}.isdisjoint(f.rule_id for f in check_recipe(r))
    sft = dict(r, keys={k: v for k, v in r["keys"].items() if k != "dataset._target_"})
    assert {"LP-CP-002", "LP-CP-003"} <= {f.rule_id for f in check_recipe(sft)}


def test_dynamic_width_rounding_that_divides_the_pad_multiple_adds_no_segment() -> None:
    r = _by_name()["glm52_sft_416gpu_h100_bf16_config"]  # CP=16: rows of 32-multiples, rounded to 16
    assert r["keys"]["dataset.offline_packing_specs.pad_seq_to_mult"] == 32
    assert "LP-PACK-013" not in {f.rule_id for f in check_recipe(r)}
    coarse = dict(r, keys=dict(r["keys"], **{"dataset.dataset_kwargs.pad_seq_length_to_mult": 48}))
    assert "LP-PACK-013" in {f.rule_id for f in check_recipe(coarse)}  # 32 -> 48 adds 16 tokens


def test_the_global_batch_packing_dynamic_cp_recipe_passes_and_its_variants_are_refused() -> None:
    # Bridge's reference recipe for global-batch packing with dynamic CP (PR #6127's branch @ 7bdc5ef4ba):
    # its keys call for Bridge >= 0.7.0 and Megatron-Core dev, and it gets no finding at all (LP-HCP-009,
    # "Bridge does not run the schedulers", ends where global-batch packing starts)
    r = _by_name()["pr6127:qwen35_text_35b_a3b_sft_8gpu_gb200_bf16_dynamic_cp_config"]
    assert r["keys"]["dataset.enable_global_batch_packing"] and r["keys"]["model.dynamic_context_parallel"]
    assert [f for f in check_recipe(r) if f.severity.value != "info"] == []
    assert r["recipe"] in recipes_exercising("LP-GBP-001")  # --explain names it: it sets the switch

    def ids(**changes: object) -> set[str]:
        keys = {k: v for k, v in {**r["keys"], **changes}.items() if v is not None}
        return {f.rule_id for f in check_recipe(dict(r, keys=keys)) if f.severity.value == "error"}

    # the rules Bridge's validation adds for dynamic CP refuse what it refuses
    assert ids(**{"model.min_dynamic_context_parallel_size": 3}) == {"LP-DCP-007"}
    assert ids(**{"dist.use_decentralized_pg": True}) == {"LP-DCP-008"}
    assert ids(**{"model.max_seqlen_per_dp_cp_rank": 2048}) == {"LP-HCP-006"}  # 8 ranks x 2048 < 32768
    # without the dataset switch the keys call for Bridge main, which builds the groups but schedules
    # nothing: the warning, not an error
    off = dict(r, keys={k: v for k, v in r["keys"].items() if k != "dataset.enable_global_batch_packing"})
    found = check_recipe(off)
    assert [f.rule_id for f in found if f.severity.value in ("error", "warning")] == ["LP-HCP-009"]


def test_the_docs_quote_the_totals_of_the_recorded_recipes() -> None:
    # docs/guide/check.md quotes the harness's closing line; the records hold each recipe's findings, so
    # the line follows from them (LONGPACK_REGEN_DOCS=1 rewrites it)
    import os
    import re
    from pathlib import Path

    from longpack.rules.recipes import recipes_source, totals

    commit = re.search(r"@([0-9a-f]+):", recipes_source()).group(1)  # type: ignore[union-attr]
    want = totals(bridge_recipes(), "main", commit)
    page = Path(__file__).resolve().parents[2] / "docs" / "guide" / "check.md"
    text = page.read_text()
    quoted = re.findall(r"^Megatron-Bridge main @ .*$", text, flags=re.M)
    assert len(quoted) == 1, quoted
    if os.environ.get("LONGPACK_REGEN_DOCS") == "1":
        page.write_text(text.replace(quoted[0], want))
    else:
        assert quoted[0] == want


def test_the_packing_settings_bridge_documents_get_no_finding() -> None:
    # the offline-SFT-with-CP, VLM in-batch and Energon online packing settings of Bridge's packing skill page
    docs = [r for r in bridge_recipes() if r["recipe"].startswith("docs:")]
    assert len(docs) == 3
    for r in docs:
        assert [f.rule_id for f in check_recipe(r) if f.severity.value != "info"] == [], r["recipe"]
    cp2 = _by_name()["docs:sequence_packing_skill_offline_sft_cp2"]
    wrong = dict(cp2, keys=dict(cp2["keys"], **{"dataset.offline_packing_specs.pad_seq_to_mult": 1}))
    assert "LP-PACK-008" in {f.rule_id for f in check_recipe(wrong)}  # the snippet's formula matters
