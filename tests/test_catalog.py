"""The one model catalog: the rules and the planner read the same entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longpack.catalog import (
    ModelFamily,
    family_names,
    find_family,
    list_families,
    list_models,
    load_model,
    model_from_hf_config,
)
from longpack.rules import run_rules, setup_from_mapping

HF = Path(__file__).parent / "data" / "hf_configs"

# What longpack check knew of each family before the catalog held it (layers, heads, KV heads, experts,
# MTP layers, offline packing, in-batch packing), written out independently of the YAML.
KNOWN = {
    "deepseek_v3": (61, 128, 128, 256, 1, True, True),
    "kimi_k2": (61, 64, 64, 384, 0, True, True),
    "glm_4_5": (92, 96, 8, 160, 1, False, True),
    "glm_4_5v": (None, None, None, None, 0, True, False),
    "qwen3_235b_a22b": (94, 64, 4, 128, 0, True, True),
    "qwen3_30b_a3b": (48, 32, 4, 128, 0, True, True),
    "qwen3_next_80b_a3b": (48, 16, 2, 512, 1, False, True),
    "qwen3_5_vl": (None, None, None, None, 0, True, False),
    "qwen3_omni": (None, None, None, None, 0, False, False),
    "nemotron_vl": (None, None, None, None, 0, True, False),
    "mixtral_8x7b": (32, 32, 8, 8, 0, True, True),
    "llama3_1_8b": (32, 32, 8, None, 0, True, True),
    "llama3_1_70b": (80, 64, 8, None, 0, True, True),
    "llama3_1_405b": (126, 128, 8, None, 0, True, True),
    "qwen3_8b": (36, 32, 8, None, 0, True, True),
}


def test_every_family_is_known_with_the_same_facts() -> None:
    assert set(family_names()) == set(KNOWN)
    for family in list_families():
        facts = (
            family.num_layers,
            family.num_attention_heads,
            family.num_query_groups,
            family.num_moe_experts,
            family.mtp_num_layers,
            family.offline_packing and family.any_packing,
            family.in_batch_packing and family.any_packing,
        )
        assert facts == KNOWN[family.name], family.name


def test_rules_and_planner_read_the_same_architecture() -> None:
    planned = set(list_models())
    assert planned == {f.name for f in list_families() if f.spec is not None}
    for name in planned:
        family = find_family(name)
        assert family is not None and family.spec == load_model(name)
        s = setup_from_mapping({"longpack": {"model_family": name}}).setup
        spec = load_model(name)
        assert s.model.num_layers == spec.num_layers
        assert s.model.num_attention_heads == spec.attention.num_heads
        assert s.model.num_moe_experts == (spec.moe.num_experts if spec.moe else None)


@pytest.mark.parametrize("family", list_families(), ids=lambda f: f.name)
def test_each_family_is_found_by_its_name_and_hf_id(family: ModelFamily) -> None:
    assert find_family(family.name) is family
    if family.hf_id:
        assert find_family(family.hf_id) is family
    assert family.patterns, "a family needs name patterns to be recognized in a config"


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Qwen/Qwen3-8B", "qwen3_8b"),
        ("Qwen/Qwen3-8B-Base", "qwen3_8b"),
        ("megatron.bridge.models.qwen.Qwen3ModelProvider8B", "qwen3_8b"),
        ("Qwen/Qwen3-30B-A3B", "qwen3_30b_a3b"),
        ("Qwen/Qwen3.5-VL-8B", "qwen3_5_vl"),
        ("Qwen/Qwen3-Omni-30B-A3B", "qwen3_omni"),
        ("zai-org/GLM-4.5-Air", None),
        ("Qwen/Qwen3-VL-8B-Instruct", None),
    ],
)
def test_name_patterns(text: str, name: str | None) -> None:
    found = find_family(text)
    assert (None if found is None else found.name) == name


def test_qwen3_8b_is_the_published_config() -> None:
    published = json.loads((HF / "qwen3_8b.json").read_text())
    m = load_model("qwen3_8b")
    assert (m.hidden_size, m.num_layers, m.vocab_size, m.ffn_hidden_size, m.tie_embeddings) == (
        published["hidden_size"],
        published["num_hidden_layers"],
        published["vocab_size"],
        published["intermediate_size"],
        published["tie_word_embeddings"],
    )
    a = m.attention
    assert (a.kind, a.num_heads, a.num_kv_heads, a.head_dim, a.qk_layernorm) == ("gqa", 32, 8, 128, True)
    assert m.moe is None and m.mtp_layers == 0


def test_check_accepts_qwen3_8b() -> None:
    loaded = setup_from_mapping(
        {"model": {"seq_length": 8192, "tensor_model_parallel_size": 8}},
        model_family="qwen3_8b",
        world_size=8,
        dataset_kind="pretraining",
    )
    assert loaded.setup.family is not None and loaded.setup.family.name == "qwen3_8b"
    assert loaded.setup.model.num_layers == 36
    assert [f.rule_id for f in run_rules(loaded.setup) if f.severity == "error"] == []
    # TP 6 neither divides the 8 KV heads nor is a multiple of them: the catalog's numbers reach the rules
    bad = setup_from_mapping({"model": {"tensor_model_parallel_size": 6}}, model_family="qwen3_8b").setup
    assert "LP-TOPO-007" in {f.rule_id for f in run_rules(bad)}


def test_family_of_a_config_json_model() -> None:
    assert ModelFamily.of_model(load_model("llama3_1_8b")) is find_family("llama3_1_8b")
    own = ModelFamily.of_model(model_from_hf_config(HF / "llama3_1_8b.json", name="llama3_1_8b"))
    assert own.patterns == find_family("llama3_1_8b").patterns and own.num_query_groups == 8
    changed = model_from_hf_config(
        {**json.loads((HF / "llama3_1_8b.json").read_text()), "num_hidden_layers": 16}, name="llama-3.1-8b"
    )
    family = ModelFamily.of_model(changed)
    assert family.name == "llama3_1_8b" and family.num_layers == 16  # the family's facts, the file's shape
