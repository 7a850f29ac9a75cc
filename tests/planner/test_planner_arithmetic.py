"""Golden parameter counts and Megatron FLOPs per token (docs/reference/planner-model.md#flops)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.planner.arithmetic import (
    effective_context,
    flops_breakdown,
    flops_per_token,
    param_counts,
)
from longpack.planner.catalog import (
    CatalogError,
    catalog_entry,
    list_models,
    load_gpu,
    load_model,
    model_from_hf_config,
)

HF = Path(__file__).resolve().parents[1] / "data" / "hf_configs"

# Published "Model TFLOP/s/GPU ÷ tokens/s/GPU" of the Megatron-Bridge performance tables (issue 6).
PUBLISHED_GFLOPS = {
    "deepseek_v3": 260.0,  # with MTP, s = 4096
    "qwen3_235b_a22b": 148.0,
    "qwen3_30b_a3b": 23.0,
    "kimi_k2": 204.5,
}


@pytest.mark.parametrize(("name", "gflops"), sorted(PUBLISHED_GFLOPS.items()))
def test_published_gflops_per_token_within_one_percent(name: str, gflops: float) -> None:
    got = flops_per_token(load_model(name), 4096) / 1e9
    assert abs(got / gflops - 1) < 0.01, (name, got)


def test_long_context_growth_matches_spec() -> None:
    dsv3 = load_model("deepseek_v3")
    expected = {4096: 260, 16384: 354, 32768: 478, 65536: 728, 131072: 1227, 262144: 2226}
    for s, g in expected.items():
        assert round(flops_per_token(dsv3, s) / 1e9) == g
    assert round(flops_per_token(load_model("qwen3_235b_a22b"), 131072) / 1e9) == 735
    nxt = load_model("qwen3_next_80b_a3b")
    assert [round(flops_per_token(nxt, s, include_mtp=False) / 1e9, 1) for s in (4096, 32768, 65536)] == [
        22.7,
        31.2,
        40.9,
    ]


@pytest.mark.parametrize("name", list_models())
def test_catalog_derived_figures_reproduced(name: str) -> None:
    model = load_model(name)
    derived = catalog_entry(name)["derived"]
    counts = param_counts(model)
    checks = {
        "total_params_B": counts.total_main,
        "total_params_B_main": counts.total_main,
        "total_params_B_with_mtp": counts.total_with_mtp,
        "active_params_B": counts.active_main,
        "active_params_B_main": counts.active_main,
        "routed_expert_params_B": counts.routed_expert,
        "embedding_params_B_in_plus_out": counts.embedding,
    }
    seen = 0
    for key, value in checks.items():
        if key in derived:
            assert value / 1e9 == pytest.approx(derived[key], rel=0.002, abs=0.01), key
            seen += 1
    for key, value in derived.items():
        if key.startswith("megatron_gflops_per_token_s"):
            s = int(key.split("_s")[1].split("_")[0])
            got = flops_per_token(model, s, include_mtp=not key.endswith("no_mtp")) / 1e9
            assert got == pytest.approx(value, rel=0.0005, abs=0.051), key
            seen += 1
    assert seen >= 2


def test_packed_context_uses_sum_of_squares() -> None:
    model = load_model("qwen3_30b_a3b")
    packed = flops_per_token(model, sub_lengths=[1024, 1024, 2048])
    assert packed == pytest.approx(flops_per_token(model, 1536))
    assert packed < flops_per_token(model, 4096)
    with pytest.raises(ValueError, match="sub_lengths"):
        effective_context(sub_lengths=[0, 5])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=65536), min_size=1, max_size=20))
def test_packed_flops_never_exceed_one_long_sequence(lengths: list[int]) -> None:
    model = load_model("deepseek_v3")
    packed = flops_per_token(model, sub_lengths=lengths)
    assert packed <= flops_per_token(model, sum(lengths)) * (1 + 1e-12)
    assert packed >= flops_per_token(model, 1) * (1 - 1e-12)
    b = flops_breakdown(model, sub_lengths=lengths)
    assert b.total == pytest.approx(packed)


@pytest.mark.parametrize(
    "name", ["deepseek_v3", "qwen3_30b_a3b", "llama3_1_8b", "qwen3_8b", "qwen3_next_80b_a3b"]
)
def test_hf_config_matches_catalog(name: str) -> None:
    from_hf = load_model(str(HF / f"{name}.json"))
    catalog = load_model(name)
    assert param_counts(from_hf) == param_counts(catalog)
    assert flops_per_token(from_hf, 8192) == flops_per_token(catalog, 8192)


def test_hf_config_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(CatalogError, match="num_hidden_layers"):
        model_from_hf_config(bad)
    with pytest.raises(CatalogError, match="unknown model"):
        load_model("nope_model")
    with pytest.raises(CatalogError, match="unknown GPU"):
        load_gpu("TPUv5")
    # a folder holding config.json works too
    (tmp_path / "config.json").write_text((HF / "llama3_1_8b.json").read_text())
    assert load_model(str(tmp_path)).num_layers == 32


def test_active_is_less_than_total_for_moe_and_equal_for_dense() -> None:
    for name in list_models():
        c = param_counts(load_model(name))
        if load_model(name).moe is None:
            assert c.active_main == c.total_main
        else:
            assert c.active_main < c.total_main
