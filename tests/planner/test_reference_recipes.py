"""Advice anchored on what NVIDIA ships (issue 34): the Megatron-Bridge recipe reference, recommending only
what is measured, feasibility for the user's Megatron-Core, memory headroom, bands that cover on sources
they never saw, and ``balance`` on the planner's step-time model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from longpack.jobs import PlanConfig
from longpack.planner.catalog import list_models, load_gpu, load_model
from longpack.planner.reference import recipe_layouts, reference_for
from longpack.planner.search import SearchRequest, search, vpp_choices
from longpack.planner.uncertainty import (
    COVERAGE,
    load_levels,
    load_residuals,
    memory_band,
    source_coverage,
)

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path("/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
SOURCE = re.compile(r"^NVIDIA-NeMo/Megatron-Bridge@[0-9a-f]{12}:src/megatron/bridge/[\w/]+\.py::\w+_config$")


def test_every_packaged_recipe_names_repo_commit_path_and_function() -> None:
    recipes = recipe_layouts()
    assert len(recipes) > 100
    models = set(list_models())
    for r in recipes:
        assert SOURCE.match(r["source"]), r["source"]
        assert r["model"] in models
        load_gpu(r["gpu"])
        assert r["num_gpus"] % (r["tp"] * r["cp"] * r["pp"]) == 0, r["id"]
    # the published long-context recipes of the library are read with their lengths and CP
    by_id = {r["id"]: r for r in recipes}
    r = by_id["llama3_8b_pretrain_64gpu_h100_bf16_128k_config"]
    assert (r["seq_length"], r["tp"], r["cp"], r["pp"]) == (131072, 4, 8, 2)


@pytest.mark.skipif(not MIRROR.exists(), reason="no Megatron-Bridge checkout on this machine")
def test_the_packaged_recipes_are_what_the_script_reads_from_a_bridge_checkout(tmp_path: Path) -> None:
    import yaml

    shipped = yaml.safe_load((ROOT / "src/longpack/data/bridge_recipe_layouts.yaml").read_text())
    out = tmp_path / "recipes.yaml"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/bridge_recipe_layouts.py"),
            str(MIRROR),
            "--commit",
            shipped["commit"],
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    assert yaml.safe_load(out.read_text()) == shipped


@pytest.mark.parametrize("model", list_models())
@pytest.mark.parametrize("gpu", ["H100", "GB200"])
def test_every_catalog_model_gets_a_ranked_reference_with_its_source(model: str, gpu: str) -> None:
    result = PlanConfig(model=model, gpu=gpu, gpus=64, seq_length=32768, top=1).run()
    if not result.candidates:
        pytest.skip(f"nothing fits {model} on 64 {gpu} at 32K")
    ref, cmp_ = result.reference, result.comparison
    assert ref is not None and ref.source and cmp_ is not None
    assert 1 <= cmp_.reference_rank <= cmp_.ranked_of + 1
    assert ref.kind in ("published", "Megatron-Bridge recipe", "seed rules")
    if ref.kind == "Megatron-Bridge recipe":
        assert SOURCE.match(ref.source)
    if not any(r["model"] == model for r in recipe_layouts()):
        assert ref.kind != "Megatron-Bridge recipe"
    doc = result.to_dict()
    assert doc["reference"]["rank"] == cmp_.reference_rank and doc["recommended"] is not None


def test_the_bridge_reference_keeps_the_recipe_and_scales_cp_with_the_length() -> None:
    req = SearchRequest(model=load_model("kimi_k2"), gpu=load_gpu("GB300"), num_gpus=256, seq_length=65536)
    ref = reference_for(req)
    assert ref is not None and ref.kind == "Megatron-Bridge recipe"
    lay = ref.candidate.plan.layout
    # kimi_k2_pretrain_256gpu_gb300_*: TP1 PP4 VPP4 EP64 at 4K and CP 1 -> CP 16 at 64K (4K tokens per rank)
    assert (lay.tp, lay.cp, lay.pp, lay.vpp, lay.ep) == (1, 16, 4, 4, 64)
    assert any("4096 tokens per CP rank" in n for n in ref.notes)


def test_any_vpp_the_layers_allow_is_searchable() -> None:
    assert 14 in vpp_choices(56, 4)  # Mixtral-8x22B's published PP 4 x VPP 14
    assert 24 in vpp_choices(48, 2)
    req = SearchRequest(
        model=load_model("qwen3_30b_a3b"), gpu=load_gpu("H100"), num_gpus=16, seq_length=4096, pp=2, vpp=24
    )
    found = search(req, top_k=1)
    assert found.candidates and found.candidates[0].plan.vpp == 24


def test_gated_deltanet_cp_follows_the_users_megatron_core() -> None:
    old = PlanConfig(
        model="qwen3_next_80b_a3b",
        gpu="GB200",
        gpus=32,
        seq_length=65536,
        top=10,
        megatron_core_version="0.16.1",
    ).run()
    assert old.candidates and all(c.plan.layout.cp == 1 for c in old.candidates)
    assert old.reference is not None and old.reference.candidate.plan.layout.cp == 1
    assert old.recommended.plan.layout.cp == 1
    # check of the pasted overrides agrees, for the same Megatron-Core: the pick passes LP-MODEL-004,
    # the same keys with CP 2 (what the planner picked before it read the version) do not
    from longpack.jobs.check import CheckConfig
    from longpack.jobs.plan import candidate_dict

    pasted = candidate_dict(old.recommended, old.request)["overrides"]
    ok = CheckConfig(
        overrides=tuple(pasted), gpus=32, model="qwen3_next_80b_a3b", megatron_core_version="0.16.1"
    )
    assert "LP-MODEL-004" not in [f.rule_id for f in ok.run().findings]
    cp2 = [o for o in pasted if not o.startswith("model.context_parallel_size=")]
    cp2 += ["model.context_parallel_size=2", "model.calculate_per_token_loss=true"]
    refused = CheckConfig(
        overrides=tuple(cp2), gpus=32, model="qwen3_next_80b_a3b", megatron_core_version="0.16.1"
    )
    assert "LP-MODEL-004" in [f.rule_id for f in refused.run().findings if f.severity == "error"]
    new = PlanConfig(
        model="qwen3_next_80b_a3b",
        gpu="GB200",
        gpus=32,
        seq_length=65536,
        top=10,
        megatron_core_version="0.18.0",
    ).run()
    assert any(c.plan.layout.cp > 1 for c in new.candidates)
    pinned = PlanConfig(
        model="qwen3_next_80b_a3b",
        gpu="GB200",
        gpus=32,
        seq_length=65536,
        cp=4,
        megatron_core_version="0.16.1",
    ).run()
    assert not pinned.candidates
    assert any("asserts CP = 1 for Gated DeltaNet" in k for k in pinned.search.rejected)


def test_a_pick_beats_the_reference_only_within_measured_territory() -> None:
    from longpack.planner.evidence import unmeasured_changes

    result = PlanConfig(model="deepseek_v3", gpu="H100", gpus=1024, seq_length=131072, precision="fp8").run()
    req, cmp_, ref = result.request, result.comparison, result.reference
    rec = result.recommended
    assert not unmeasured_changes(req.model, req.gpu, req.seq_length, rec, ref.candidate)
    if cmp_.pick is not None:
        assert cmp_.gain > cmp_.band
    # the fastest layout changes EP x ETP to a combination no point measures: exploratory, not recommended
    assert cmp_.exploratory is not None and cmp_.exploratory_unmeasured
    assert any("ETP" in u for u in cmp_.exploratory_unmeasured)
    explored = PlanConfig(
        model="deepseek_v3", gpu="H100", gpus=1024, seq_length=131072, precision="fp8", explore=True
    ).run()
    assert explored.recommended.plan == explored.candidates[0].plan


def test_every_ranked_layout_fits_with_the_memory_band() -> None:
    band = memory_band()
    assert 0 < band.width < 0.5 and band.n >= 5
    req = SearchRequest(
        model=load_model("qwen3_next_80b_a3b"), gpu=load_gpu("GB200"), num_gpus=32, seq_length=32768
    )
    found = search(req, top_k=10)
    assert found.candidates
    for c in found.ranked:
        assert c.memory.total_gib * (1 + band.width) <= req.memory_budget_gib + 1e-9


def test_the_stated_coverage_holds_on_sources_the_band_never_saw() -> None:
    residuals = load_residuals()
    levels = load_levels()
    assert {r.band for r in residuals} <= set(levels)
    for band, level in levels.items():
        cov, n = source_coverage(residuals, band, level)
        assert n > 0 and cov >= COVERAGE, (band, cov)
    # every residual is leave-one-source-out: it names the source it was held out with
    assert all(r.source for r in residuals)


def test_balance_costs_packs_with_the_planners_model_by_default(tmp_path: Path) -> None:
    import numpy as np

    from longpack.jobs.balance import BalanceConfig
    from longpack.planner.balance_costs import pack_cost_model

    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.array([4096, 1024, 2048, 8192] * 16))
    cfg = BalanceConfig(lengths_file=lengths, pack_size=8192, dp=2, gbs=8)
    planner = pack_cost_model(model="llama3_1_8b", gpu="H100", seq_length=8192)
    assert cfg.cost_model().pack_cost([8192]) == pytest.approx(planner.pack_cost([8192]))
    flat = BalanceConfig(lengths_file=lengths, pack_size=8192, dp=2, gbs=8, tflops=400.0)
    assert flat.cost_model().pack_cost([8192]) != pytest.approx(planner.pack_cost([8192]))
    assert cfg.run().ideal_time_s > 0
