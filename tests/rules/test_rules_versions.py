"""Version-aware rules: ranges, the versions a check runs for, version boundaries (rules added, and rules
a later version relaxed), and the same versions in plan and sweep."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from longpack.errors import ConfigError
from longpack.jobs.check import CheckConfig
from longpack.rules import RULES, run_rules, setup_from_mapping
from longpack.rules.checks.upstream import versions_for
from longpack.rules.config import TrainingSetup
from longpack.rules.runner import rules_outside
from longpack.rules.versions import (
    BRIDGE,
    ENV_VARS,
    MCORE,
    PRODUCTS,
    UpstreamVersions,
    VersionRange,
    version_key,
)
from longpack.topology import ParallelLayout
from rule_bases import findings_of

HYBRIDEP = ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"]
PTML = "dataset.dataset_kwargs.pad_to_max_length=true"
PCU = "dataset.offline_packing_specs.pad_cu_seqlens=true"
TE_GRAPH = "model.cuda_graph_impl=transformer_engine"


def ids(findings) -> set[str]:
    return {f.rule_id for f in findings}


# --- versions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lower", "higher"),
    [("0.5.1", "0.6.0"), ("0.6.0rc2", "0.6.0"), ("v0.6.0", "main"), ("0.6.1", "main"), ("main", "0.7.0")],
)
def test_bridge_versions_order(lower: str, higher: str) -> None:
    assert version_key(lower, BRIDGE) < version_key(higher, BRIDGE)


def test_mcore_versions_order_including_dev_builds() -> None:
    assert (
        version_key("0.19.0", MCORE) < version_key("0.20.0.dev0+abc123", MCORE) == version_key("main", MCORE)
    )
    # Megatron-Core's development branch orders after main (it merges main)
    assert version_key("main", MCORE) < version_key("dev", MCORE) < version_key("0.20.0", MCORE)


@pytest.mark.parametrize(("tag", "version"), [("core_v0.19.0", "0.19.0"), ("core_r0.16.0", "0.16.0")])
def test_a_git_tag_is_refused_with_the_version_to_give(tag: str, version: str) -> None:
    with pytest.raises(ConfigError, match=f"is a git tag, not a version: give {version}"):
        CheckConfig(megatron_core_version=tag)
    from longpack.cli.app import app

    result = CliRunner().invoke(app, ["check", "model.seq_length=4096", "--megatron-core-version", tag])
    assert result.exit_code == 2 and "give " + version in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("bad", ["26.04", "latest-ish", "", "1.2.3.4.5x"])
def test_a_version_that_does_not_parse_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not a version"):
        CheckConfig(bridge_version=bad)


def test_ranges() -> None:
    r = VersionRange(since="0.16.0", until="0.19.0")
    assert [r.contains(v, MCORE) for v in ("0.15.3", "0.16.0", "0.18.2", "0.19.0", "main")] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert VersionRange(since="main").contains("main") and not VersionRange(since="main").contains("0.6.0")
    assert VersionRange().text == "all" and r.text == ">= 0.16.0, < 0.19.0"


def _installed(monkeypatch, bridge: str | None, mcore: str | None) -> None:
    from longpack.rules import versions as v

    monkeypatch.delenv(ENV_VARS[BRIDGE], raising=False)
    monkeypatch.delenv(ENV_VARS[MCORE], raising=False)
    monkeypatch.setattr(v, "installed_version", lambda product: bridge if product == BRIDGE else mcore)


def test_versions_given_beat_the_environment_variables_and_what_is_installed(monkeypatch) -> None:
    _installed(monkeypatch, "0.4.2", "0.17.1")
    monkeypatch.setenv(ENV_VARS[BRIDGE], "0.5.1")
    got = versions_for({"dataset.enable_offline_packing"})
    assert (got.bridge, got.bridge_origin) == ("0.5.1", "$LONGPACK_BRIDGE_VERSION")
    # megatron-bridge is installed, so the megatron-core beside it is the Core it runs on
    assert (got.mcore, got.mcore_origin) == ("0.17.1", "installed, beside megatron-bridge")
    got = UpstreamVersions.resolve(bridge="0.6.0", mcore="main")
    assert (got.bridge_origin, got.mcore_origin) == ("given", "given")


def test_an_installed_megatron_bridge_beats_the_config_keys(monkeypatch) -> None:
    _installed(monkeypatch, "0.5.1", "0.18.2")
    got = versions_for({"dataset.enable_offline_packing"})
    assert (got.bridge, got.bridge_origin, got.mcore) == ("0.5.1", "installed", "0.18.2")


def test_megatron_core_alone_never_decides_the_bridge_version(monkeypatch) -> None:
    # longpack's own [all] extras install megatron-core 0.16.1; Bridge 0.3.1 was paired with it, but the
    # checking environment is not the training container
    _installed(monkeypatch, None, "0.16.1")
    got = UpstreamVersions.resolve()
    assert (got.bridge, got.bridge_origin) == ("main", "newest known")
    assert (got.mcore, got.mcore_origin) == ("main", "paired with Megatron-Bridge main")
    got = UpstreamVersions.resolve(mcore="0.17.1")
    assert (got.bridge, got.bridge_origin, got.mcore) == ("main", "newest known", "0.17.1")
    assert "067f987df" in got.describe(BRIDGE)
    # a given Bridge brings its own Core (its 3rdparty/Megatron-LM submodule), not the installed one
    got = UpstreamVersions.resolve(bridge="0.6.0")
    assert (got.mcore, got.mcore_origin) == ("0.19.0", "paired with Megatron-Bridge 0.6.0")
    assert "c81012934" in UpstreamVersions.resolve(bridge="0.4.2").describe(BRIDGE)


def test_config_with_only_0_6_keys_and_megatron_core_0_16_1_installed_is_checked_for_0_6(monkeypatch) -> None:
    _installed(monkeypatch, None, "0.16.1")
    keys = {"dataset.enable_offline_packing", "dataset.offline_packing_specs.packed_sequence_size"}
    got = versions_for(keys)
    # newest known release in the range the keys leave (>= 0.6.0): main, and the Core it is built on
    assert got.bridge == "main" and got.mcore == "main"
    assert "inferred from the config's keys dataset.enable_offline_packing (>= 0.6.0)" in got.bridge_origin
    setup = setup_from_mapping(
        {
            "dataset": {
                "enable_offline_packing": True,
                "offline_packing_specs": {"packed_sequence_size": 4096, "pad_seq_to_mult": 1},
            },
            "model": {"seq_length": 4096},
        }
    ).setup
    found = run_rules(setup)
    assert not [f for f in found if f.rule_id == "LP-VER-001"]
    assert (
        CheckConfig(overrides=tuple(f"{k}=1" for k in ("model.seq_length",))).run().versions.bridge == "main"
    )


def test_a_removed_key_bounds_the_version_from_above(monkeypatch) -> None:
    _installed(monkeypatch, None, None)
    got = versions_for({"dataset.packed_sequence_specs.packed_sequence_size"})
    assert (got.bridge, got.mcore) == ("0.5.1", "0.18.2")
    assert (
        "dataset.packed_sequence_specs (< 0.6.0): < 0.6.0, the newest known in that range"
        in got.bridge_origin
    )
    assert got.mcore_origin == "paired with Megatron-Bridge 0.5.1"


def test_megatron_core_keys_move_the_paired_core_into_their_range(monkeypatch) -> None:
    _installed(monkeypatch, None, "0.16.1")
    got = versions_for({"model.dynamic_context_parallel", "dataset.enable_offline_packing"})
    assert (got.bridge, got.mcore) == ("main", "dev")
    assert "model.dynamic_context_parallel (>= dev)" in got.mcore_origin
    assert "d48bd6be0a" in got.describe(MCORE)


def test_keys_of_no_single_version_fall_back_to_the_newest_and_say_so(monkeypatch) -> None:
    _installed(monkeypatch, None, None)
    got = versions_for(
        {"dataset.packed_sequence_specs.packed_sequence_size", "dataset.enable_offline_packing"}
    )
    assert got.bridge == "main" and "fit no single version" in got.bridge_origin


def test_check_names_the_inferred_version_and_its_evidence(monkeypatch) -> None:
    _installed(monkeypatch, None, "0.16.1")
    r = CheckConfig(overrides=("dataset.enable_offline_packing=true", "model.seq_length=4096")).run()
    assert r.versions.bridge == "main"
    assert "inferred from the config's keys" in r.versions.describe(BRIDGE)


def test_installed_version_is_read_from_package_metadata() -> None:
    from importlib import metadata

    from longpack.rules.versions import installed_version

    try:
        expected = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        expected = None
    assert installed_version(MCORE) == expected


def test_option_help_names_the_environment_variables() -> None:
    from longpack.jobs.options import BRIDGE_VERSION_HELP, MCORE_VERSION_HELP

    assert ENV_VARS[BRIDGE] in BRIDGE_VERSION_HELP and ENV_VARS[MCORE] in MCORE_VERSION_HELP
    # the help says the order UpstreamVersions.resolve follows: the config's keys before the newest, and
    # megatron-core alone never picks the Bridge (the help once said "the release built on the
    # Megatron-Core used")
    order = [
        BRIDGE_VERSION_HELP.index(s) for s in ("$LONGPACK", "installed megatron-bridge", "own keys", "newest")
    ]
    assert order == sorted(order)
    assert "never inferred from megatron-core alone" in BRIDGE_VERSION_HELP
    assert "beside a megatron-bridge" in MCORE_VERSION_HELP


# --- the registry -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", list(RULES), ids=RULES.ids())
def test_every_rule_records_versions_and_sources(rule) -> None:
    p = rule.provenance
    assert p.sources, f"{rule.id} has no source"
    repos = {info.repo for info in PRODUCTS.values()} | {"longpack", "huggingface/transformers"}
    for src in p.sources:
        assert src.repo in repos
        if src.repo != "longpack":  # an upstream source names the file and the commit it was read from
            assert src.path and re.fullmatch(r"[0-9a-f]{9,10}", src.commit), (rule.id, src)
        if src.probe:
            assert src.path and src.commit, f"{rule.id}: a probe needs the file and commit it was read from"
    for product, r in ((BRIDGE, p.bridge), (MCORE, p.mcore)):
        for end in (r.since, r.until):
            if end is not None:
                version_key(end, product)
        if not r.everywhere:  # a bounded range says where it comes from
            assert any(s.repo == PRODUCTS[product].repo and s.commit for s in p.sources), rule.id


def test_rules_outside_a_version_are_listed() -> None:
    old = UpstreamVersions.resolve(bridge="0.5.1", mcore="0.18.2")
    outside = {r.id for r in rules_outside(old)}
    assert {"LP-EN-001", "LP-CG-007", "LP-HCP-001", "LP-MOE-005", "LP-MOE-007"} - {
        "LP-HCP-001",
        "LP-MOE-005",
    } <= outside
    assert "LP-HCP-001" not in outside and "LP-MOE-006" not in outside
    assert {r.id for r in rules_outside(UpstreamVersions.resolve(bridge="main", mcore="main"))} >= {
        "LP-MOE-005",
        "LP-MOE-006",
        "LP-MOE-008",
        "LP-CG-006",
        "LP-CP-009",
    }


# --- version boundaries -----------------------------------------------------------------------------

# (rule, base, overrides, versions where it applies, versions where it does not)
BOUNDARIES = [
    # added: hybrid CP exists from Megatron-Core 0.16.0
    (
        "LP-HCP-001",
        "SFT",
        [
            "model.hybrid_context_parallel=true",
            "model.max_seqlen_per_dp_cp_rank=4096",
            "model.pipeline_model_parallel_size=2",
        ],
        ("main", "0.16.0"),
        ("main", "0.15.3"),
    ),
    # added: the DP-balanced scheduler is on Megatron-LM main only (#6684)
    (
        "LP-SCHED-002",
        "SFT",
        ["model.sequence_packing_scheduler=dp_balanced", "model.max_seqlen_per_dp_cp_rank=1024"],
        ("main", "main"),
        ("main", "0.19.0"),
    ),
    # relaxed: Bridge 0.6.0 pads uneven eager HybridEP inputs itself
    ("LP-MOE-005", "MOE", HYBRIDEP, ("0.5.1", "0.19.0"), ("0.6.0", "0.19.0")),
    # relaxed: Megatron-Core 0.19.0 can pad uneven HybridEP inputs
    ("LP-MOE-006", "MOE", HYBRIDEP, ("0.6.0", "0.18.2"), ("0.6.0", "0.19.0")),
    # relaxed: Megatron-Core 0.19.0 replays training graphs with CP > 1 on packed inputs (#5894)
    ("LP-CG-006", "SFT", [PTML, PCU, TE_GRAPH], ("main", "0.18.2"), ("main", "0.19.0")),
    # relaxed: Bridge main masks packed padding out of MoE router statistics (#5285)
    ("LP-MOE-008", "MOE", [PTML], ("0.6.0", "main"), ("main", "main")),
    # added: Bridge main sends packed padding masks (#5470), Core 0.19's quantile balancing refuses them
    (
        "LP-MOE-009",
        "MOE",
        ["model.moe_router_load_balancing_type=quantile_balancing"],
        ("main", "0.19.0"),
        ("0.6.0", "0.19.0"),
    ),
    # added by Bridge 0.6.0, relaxed by Megatron-Core 0.18.0
    ("LP-CP-009", "SFT", [], ("0.6.0", "0.17.1"), ("0.6.0", "0.18.0")),
    ("LP-CP-009", "SFT", [], ("0.6.0", "0.17.1"), ("0.5.1", "0.17.1")),
    # added: Bridge 0.6.0 checks the Energon dataset's micro-batch size for every Energon dataset
    (
        "LP-EN-002",
        "ENERGON",
        ["~dataset.packing_buffer_size", "dataset.micro_batch_size=2"],
        ("0.6.0", "main"),
        ("0.5.1", "main"),
    ),
    # added: native Energon packing (Qwen3-VL, #5285) is on Bridge main only
    (
        "LP-EN-001",
        "ENERGON",
        ["train.micro_batch_size=2", "dataset.micro_batch_size=2"],
        ("main", "main"),
        ("0.6.0", "main"),
    ),
    # relaxed: Bridge main verifies MTP with offline packing (GLM-5.2 packed SFT, e4cb868dc)
    ("LP-MTP-001", "SFT", ["model.mtp_num_layers=1"], ("0.6.0", "0.19.0"), ("main", "main")),
    # relaxed: global-batch packing (Bridge PR #6127, assumed 0.7.0) runs the schedulers
    (
        "LP-HCP-009",
        "SFT",
        ["model.dynamic_context_parallel=true", "model.max_seqlen_per_dp_cp_rank=4096"],
        ("main", "dev"),
        ("0.7.0", "dev"),
    ),
    # added: Megatron-Core dev registers default_dynamic_cp (dynamic CP)
    (
        "LP-SCHED-001",
        "SFT",
        ["model.sequence_packing_scheduler=default_dynamic_cp", "model.max_seqlen_per_dp_cp_rank=4096"],
        ("main", "main"),
        ("main", "dev"),
    ),
    # relaxed: Megatron-LM dev allows dynamic CP with pipeline parallelism
    (
        "LP-HCP-001",
        "SFT",
        [
            "model.hybrid_context_parallel=true",
            "model.max_seqlen_per_dp_cp_rank=4096",
            "model.pipeline_model_parallel_size=2",
        ],
        ("main", "main"),
        ("main", "dev"),
    ),
    # added: Bridge 0.6.0 refuses locally captured scoped graphs (#4607)
    ("LP-CG-007", "SFT", ["model.cuda_graph_impl=local"], ("0.6.0", "main"), ("0.5.1", "main")),
]


@pytest.mark.parametrize(
    ("rule_id", "base", "overrides", "inside", "outside"),
    BOUNDARIES,
    ids=[f"{b[0]}-{b[4]}" for b in BOUNDARIES],
)
def test_version_boundary(rule_id, base, overrides, inside, outside) -> None:
    fired = [
        f for f in findings_of(base, overrides, bridge=inside[0], mcore=inside[1]) if f.rule_id == rule_id
    ]
    assert fired, f"{rule_id} did not fire for Bridge {inside[0]} / MCore {inside[1]}"
    assert f"Megatron-Bridge {inside[0]} (given), Megatron-Core {inside[1]} (given)" in fired[0].applies_to
    assert rule_id not in ids(findings_of(base, overrides, bridge=outside[0], mcore=outside[1]))


def test_hybrid_cp_key_on_an_older_megatron_core_is_named() -> None:
    found = [
        f
        for f in findings_of("SFT", ["model.hybrid_context_parallel=true"], mcore="0.15.3")
        if f.rule_id == "LP-VER-001"
    ]
    assert [f.keys for f in found] == [("model.hybrid_context_parallel",)]
    assert "Megatron-Core 0.15.3 (given) has no such setting" in found[0].message


def test_bridge_packing_keys_follow_the_rename() -> None:
    # 0.5.1 spells the specs packed_sequence_specs and has no enable_offline_packing
    old_style = [
        "~dataset.enable_offline_packing",
        "~dataset.offline_packing_specs",
        "+dataset.packed_sequence_specs.packed_sequence_size=8192",
        "+dataset.packed_sequence_specs.pad_seq_to_mult=4",
    ]
    assert "LP-VER-001" not in ids(findings_of("SFT", old_style, bridge="0.5.1", mcore="0.18.2"))
    on_main = [f for f in findings_of("SFT", old_style) if f.rule_id == "LP-VER-001"]
    assert [f.keys for f in on_main] == [("dataset.packed_sequence_specs",)]
    new_style_on_old = [
        f.keys for f in findings_of("SFT", bridge="0.5.1", mcore="0.18.2") if f.rule_id == "LP-VER-001"
    ]
    assert new_style_on_old == [("dataset.enable_offline_packing",), ("dataset.offline_packing_specs",)]


def test_must_fail_must_pass_and_must_warn_on_the_2026_rules() -> None:
    hcp = ["model.hybrid_context_parallel=true", "model.max_seqlen_per_dp_cp_rank=4096"]
    # pass: a valid hybrid-CP setup; the one warning says Bridge itself never runs the scheduler
    assert [(f.rule_id, f.severity.value) for f in findings_of("SFT", hcp)] == [("LP-HCP-009", "warning")]
    warned = findings_of(
        "SFT", ["model.hybrid_context_parallel=true", "model.max_seqlen_per_dp_cp_rank=8192"]
    )
    assert sorted((f.rule_id, f.severity.value) for f in warned) == [  # warn: the cap is above the width
        ("LP-HCP-007", "warning"),
        ("LP-HCP-009", "warning"),
    ]
    failed = findings_of("SFT", [*hcp, "model.calculate_per_token_loss=false"])
    assert {f.rule_id for f in failed if f.severity.value == "error"} >= {"LP-HCP-003"}  # fail


def test_hybrid_cp_keys_are_read_not_ignored() -> None:
    loaded = setup_from_mapping(
        {
            "model": {
                "hybrid_context_parallel": True,
                "max_seqlen_per_dp_cp_rank": 4096,
                "sequence_packing_scheduler": "dp_balanced",
                "moe_hybridep_pad_uneven_dispatch_inputs": True,
            }
        }
    )
    assert loaded.ignored_keys == ()
    assert loaded.setup.model.max_seqlen_per_dp_cp_rank == 4096


# --- check, plan and sweep use the same versions --------------------------------------------------


def test_check_result_and_json_name_the_versions() -> None:
    result = CheckConfig(
        overrides=("model.context_parallel_size=2", "model.seq_length=8192", *HYBRIDEP),
        gpus=8,
        bridge_version="0.5.1",
        megatron_core_version="0.18.2",
    ).run()
    out = result.to_dict()
    assert out["versions"]["megatron_bridge"] == "0.5.1" and out["versions"]["megatron_core_from"] == "given"
    assert {"LP-EN-001", "LP-SCHED-001"} <= {r["id"] for r in out["rules_not_applied"]}
    assert all(
        "Megatron-Bridge 0.5.1 (given), Megatron-Core 0.18.2 (given)" in f["applies_to"]
        for f in out["findings"]
    )


def test_check_cli_verbose_lists_rules_not_applied() -> None:
    from longpack.cli.app import app

    args = ["check", "model.context_parallel_size=2", "model.seq_length=8192", "--gpus", "8"]
    runner = CliRunner()
    plain = runner.invoke(app, [*args, "--bridge-version", "0.5.1", "--megatron-core-version", "0.18.2"])
    assert "Megatron-Bridge 0.5.1" in plain.output and "--verbose lists them" in plain.output
    assert "LP-EN-001" not in plain.output
    verbose = runner.invoke(app, [*args, "--bridge-version", "0.5.1", "--verbose"])
    assert "Rules not applied to these versions" in verbose.output and "LP-EN-001" in verbose.output
    as_json = runner.invoke(app, [*args, "--megatron-core-version", "0.17.1", "--json"])
    assert json.loads(as_json.output)["versions"]["megatron_core"] == "0.17.1"


def test_plan_checks_candidates_for_the_versions_given() -> None:
    from longpack.jobs.plan import PlanConfig
    from longpack.planner.search import layout_findings, search

    config = PlanConfig(
        model="llama3_1_8b", gpu="H100", gpus=16, seq_length=8192, top=1, megatron_core_version="0.18.2"
    )
    assert config.request.rule_versions.mcore == "0.18.2"
    best = search(config.request, top_k=1).candidates[0]
    setup_versions = [f.applies_to for f in layout_findings(config.request, best)]
    assert all("Megatron-Core 0.18.2" in a for a in setup_versions)


def test_sweep_batch_rules_carry_the_versions() -> None:
    from longpack.jobs.sweep import batch_rule_findings

    versions = UpstreamVersions.resolve(bridge="0.4.2", mcore="0.17.1")
    found = batch_rule_findings(ParallelLayout(world_size=16), pack_length=16384, gbs=4, versions=versions)
    assert [f["id"] for f in found] == ["LP-BATCH-002"]
    assert "Megatron-Bridge 0.4.2" in found[0]["applies_to"]


@pytest.mark.parametrize("job", ["sweep", "plan"])
def test_sweep_and_plan_refuse_a_version_before_work(job: str) -> None:
    from longpack.jobs.plan import PlanConfig
    from longpack.jobs.sweep import SweepConfig

    with pytest.raises(ConfigError, match=r"Megatron-Bridge version '26\.04' is not a version"):
        if job == "sweep":
            SweepConfig(demo=True, bridge_version="26.04")
        else:
            PlanConfig(model="llama3_1_8b", gpu="H100", gpus=8, seq_length=8192, bridge_version="26.04")


def test_from_layout_carries_versions_into_run_rules() -> None:
    versions = UpstreamVersions.resolve(bridge="main", mcore="0.17.1")
    setup = TrainingSetup.from_layout(ParallelLayout(world_size=8, cp=2), seq_length=8192, versions=versions)
    assert all("Megatron-Core 0.17.1" in f.applies_to for f in run_rules(setup))


def test_megatron_core_dev_is_an_exception_where_it_lacks_main_changes() -> None:
    # dev (d48bd6be0a) has no moe_hybridep_pad_uneven_dispatch_inputs (main and 0.19.0 have it)
    r = VersionRange(since="0.19.0", dev=False)
    assert [r.contains(v, MCORE) for v in ("0.18.2", "0.19.0", "main", "dev")] == [False, True, True, False]
    assert r.text == ">= 0.19.0 (not dev)"
    found = findings_of("SFT", ["+model.moe_hybridep_pad_uneven_dispatch_inputs=true"], mcore="dev")
    assert "Megatron-Core dev (given) has no such setting" in next(
        f.message for f in found if f.rule_id == "LP-VER-001"
    )
    assert not [
        f
        for f in findings_of("SFT", ["+model.moe_hybridep_pad_uneven_dispatch_inputs=true"])
        if f.rule_id == "LP-VER-001"
    ]
    # and the rules main relaxed with it still apply on dev
    assert "LP-MOE-006" not in {r.id for r in rules_outside(UpstreamVersions(bridge="main", mcore="dev"))}
    assert "LP-MOE-006" in {r.id for r in rules_outside(UpstreamVersions(bridge="main", mcore="main"))}


def test_in_batch_packing_on_a_gpt_sft_dataset_calls_for_the_bridge_that_has_it(monkeypatch) -> None:
    # the key exists on the direct-HF / VLM datasets from 0.6.0 but on GPTSFTDatasetConfig only with Bridge
    # PR #5493 (assumed 0.7.0): the dataset it is set on bounds the version, and a Bridge without it refuses it
    _installed(monkeypatch, None, "0.16.1")
    gpt_sft = (
        "+dataset._target_=megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig",
        "+dataset.enable_in_batch_packing=true",
        "train.micro_batch_size=2",
        "model.seq_length=4096",
    )
    r = CheckConfig(overrides=gpt_sft).run()
    assert r.versions.bridge == "0.7.0"
    assert "dataset.enable_in_batch_packing on a GPT-SFT dataset (>= 0.7.0)" in r.versions.bridge_origin
    assert "LP-PACK-019" not in {f.rule_id for f in r.findings}
    pinned = CheckConfig(overrides=gpt_sft, bridge_version="main").run()
    assert "LP-PACK-019" in {f.rule_id for f in pinned.findings if f.severity.value == "error"}
    # the same key on a direct-HF dataset is 0.6.0's
    direct = CheckConfig(
        overrides=("+dataset.enable_in_batch_packing=true", "train.micro_batch_size=2")
    ).run()
    assert direct.versions.bridge == "main" and "GPT-SFT" not in direct.versions.bridge_origin
