"""Megatron-Bridge's own recipes as longpack checks them: the values of every packed-sequence,
long-context and VLM recipe of a Bridge checkout (``longpack/data/bridge_recipes.json``, read from the
recipe files by ``scripts/recipe_harness.py``), checked the way ``longpack check`` checks a config.

A rule change that gives one of them a new error or warning fails ``tests/rules/test_bridge_recipes.py``;
``longpack check --explain RULE`` names the recipes that exercise a rule.

>>> r = next(r for r in bridge_recipes() if r["recipe"] == "glm52_sft_192gpu_gb200_bf16_128k_config")
>>> r["keys"]["model.mtp_num_layers"], r["keys"]["dataset.enable_offline_packing"]
(1, True)
>>> [f.rule_id for f in check_recipe(r) if f.severity.value == "error"]
[]
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

from longpack.rules.checks.upstream import versions_for
from longpack.rules.registry import Finding

__all__ = [
    "EXPECTED_ERRORS",
    "NEEDS_ARCHITECTURE",
    "bridge_recipes",
    "check_recipe",
    "nested",
    "recipes_exercising",
    "totals",
]

_BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987df:src/megatron/bridge/training/config.py"
_EVAL_GBS = (
    f"Bridge refuses it: ConfigContainer.validate takes eval_global_batch_size = global_batch_size and "
    f"eval_micro_batch_size = micro_batch_size when unset and asserts the first divisible by "
    f"MBS * DP ({_BRIDGE}:1437,1474) for the GPU count the recipe is named for"
)
_IN_BATCH = (
    f"Bridge refuses it: 'micro_batch_size should be greater than 1 when using enable_in_batch_packing=True' "
    f"({_BRIDGE}:1619)"
)
_SEQ = (
    f"Bridge refuses it: model.seq_length 131072 (HybridModelProvider) against dataset.seq_length 8192 on a "
    f"GPTDatasetConfig, 'Please ensure sequence length configuration in model config and dataset config "
    f"match' ({_BRIDGE}:1644)"
)

#: The errors longpack gives Bridge's own recipes that are right, each with why: (recipe, rule) -> reason.
#: Every other error a recipe gets is a false one (``tests/rules/test_bridge_recipes.py``).
EXPECTED_ERRORS: dict[tuple[str, str], str] = {
    ("qwen35_vl_122b_a10b_sft_48gpu_h100_bf16_config", "LP-BATCH-001"): _EVAL_GBS,
    ("qwen35_vl_122b_a10b_peft_8gpu_h100_bf16_config", "LP-BATCH-001"): _EVAL_GBS,
    ("qwen35_vl_397b_a17b_sft_128gpu_h100_bf16_config", "LP-BATCH-002"): _EVAL_GBS,
    ("qwen35_vl_397b_a17b_peft_32gpu_h100_bf16_config", "LP-BATCH-002"): _EVAL_GBS,
    ("exaone45_vl_33b_sft_16gpu_h100_bf16_config", "LP-PACK-006"): _IN_BATCH,
    ("exaone45_vl_33b_peft_4gpu_h100_bf16_config", "LP-PACK-006"): _IN_BATCH,
    ("gemma4_vl_26b_peft_4gpu_h100_bf16_config", "LP-PACK-006"): _IN_BATCH,
    ("nemotron_nano_9b_v2_pretrain_2gpu_h100_bf16_config", "LP-SEQ-001"): _SEQ,
    ("nemotron_nano_12b_v2_pretrain_4gpu_h100_bf16_config", "LP-SEQ-001"): _SEQ,
    ("nemotron_3_super_sft_16gpu_h100_bf16_32k_config", "LP-PACK-008"): (
        "a real failure Bridge's validate does not catch: the recipe sets CP=2 on _sft_common()'s packing "
        "specs (pad_seq_to_mult=1, NVIDIA-NeMo/Megatron-Bridge@067f987df:src/megatron/bridge/recipes/common.py "
        ":166; recipes/nemotronh/h100/nemotron_3_super.py:381), and the THD CP split "
        "(src/megatron/bridge/training/gpt_step.py _partition_packed_batch_for_cp) needs every document "
        "length divisible by 2*CP = 4 (NVIDIA/Megatron-LM@d98e8a64dd:megatron/core/utils.py:2461, "
        "tex.thd_get_partitioned_indices at :2489)"
    ),
}

#: Rules that read the model's architecture (the expert count), which a recipe whose model is built from a
#: Hugging Face config does not write: not run for those recipes (the config the recipe builds has it).
NEEDS_ARCHITECTURE = frozenset({"LP-TOPO-002", "LP-TOPO-003", "LP-MOE-001"})


@functools.cache
def _data() -> dict[str, Any]:
    text = resources.files("longpack").joinpath("data/bridge_recipes.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def bridge_recipes() -> list[dict[str, Any]]:
    """Every recipe record: ``recipe``, ``file``, ``why`` (packed / long-context / vlm), ``gpus``,
    ``model_from_hf``, ``keys`` (dotted key -> value), and the ``errors`` / ``warnings`` it gets."""
    return list(_data()["recipes"])


def recipes_source() -> str:
    """``NVIDIA-NeMo/Megatron-Bridge@<commit>:src/megatron/bridge/recipes (...)``."""
    return str(_data()["source"])


def totals(rows: list[dict[str, Any]], rev: str, commit: str) -> str:
    """The harness's closing line over records with ``errors`` / ``warnings`` (the one place it is
    written: ``scripts/recipe_harness.py`` prints it, ``docs/guide/check.md`` quotes it, a test compares).

    >>> totals([{"errors": ["LP-A"], "warnings": []}, {"errors": [], "warnings": ["LP-B"]}], "main", "abc")
    'Megatron-Bridge main @ abc: 2 recipes checked, 1 errors (LP-A x1), 1 warnings (LP-B x1)'
    """
    from collections import Counter

    errors = Counter(e for r in rows for e in r["errors"])
    warnings = Counter(w for r in rows for w in r["warnings"])

    def by_rule(c: Counter[str]) -> str:
        return ", ".join(f"{k} x{v}" for k, v in sorted(c.items()))

    return (
        f"Megatron-Bridge {rev} @ {commit}: {len(rows)} recipes checked, {sum(errors.values())} errors"
        f"{' (' + by_rule(errors) + ')' if errors else ''}, "
        f"{sum(warnings.values())} warnings ({by_rule(warnings) or '-'})"
    )


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"model.seq_length": 8}`` -> ``{"model": {"seq_length": 8}}``.

    >>> nested({"model.seq_length": 8, "model.cp": 2})
    {'model': {'cp': 2, 'seq_length': 8}}
    """
    out: dict[str, Any] = {}
    for key, value in sorted(flat.items()):
        node = out
        *path, leaf = key.split(".")
        for part in path:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                break
            node = nxt
        else:
            node[leaf] = value
    return out


def check_recipe(recipe: dict[str, Any]) -> list[Finding]:
    """``longpack check``'s findings for a recipe record, for the versions its keys imply (whatever this
    environment has installed or sets)."""
    from longpack.rules.config import setup_from_mapping
    from longpack.rules.runner import RULES, run_rules

    setup = setup_from_mapping(nested(recipe["keys"]), world_size=recipe["gpus"]).setup
    hf = recipe.get("model_from_hf") and "model.num_moe_experts" not in recipe["keys"]
    select = {r.id for r in RULES} - (NEEDS_ARCHITECTURE if hf else set())
    return run_rules(
        setup, select=select, versions=versions_for(setup.given_keys, environment=False, setup=setup)
    )


_KEY = re.compile(r"(?<![\w/])(?:model|train|dataset|ddp|dist)(?:\.[A-Za-z_]+)+")


def recipes_exercising(rule_id: str) -> list[str]:
    """The recipes a rule fires on, then those that set a key the rule's fix names (what exercises it).

    >>> "example:dynamic_context_parallel" in recipes_exercising("LP-HCP-009")
    True
    """
    from longpack.rules.runner import RULES

    rule = RULES[rule_id]
    keys = set(_KEY.findall(rule.fix))
    fired = [r["recipe"] for r in bridge_recipes() if rule_id in (*r["errors"], *r["warnings"])]
    setting = [
        r["recipe"]
        for r in bridge_recipes()
        if r["recipe"] not in fired and any(k in r["keys"] for k in keys)
    ]
    return fired + setting


def explain_rule(rule_id: str) -> dict[str, Any]:
    """What ``longpack check --explain RULE`` prints: the rule, its sources (``repo@commit:path``), the
    version ranges it applies to and the known versions inside them, and the Bridge recipes that exercise
    it. An unknown id is a :class:`~longpack.errors.ConfigError` naming the nearest ids.

    >>> e = explain_rule("lp-mtp-001")
    >>> e["id"], e["sources"][0]
    ('LP-MTP-001', 'NVIDIA-NeMo/Megatron-Bridge@1e033749b:docs/training/multi-token-prediction.md')
    >>> e["versions"]["Megatron-Bridge"]["range"], e["versions"]["Megatron-Bridge"]["known"][-1]
    ('< main', '0.6.0')
    """
    import difflib

    from longpack.errors import ConfigError
    from longpack.rules.runner import RULES
    from longpack.rules.versions import PRODUCTS, known_versions

    wanted = rule_id.strip().upper()
    if wanted not in RULES.ids():
        near = difflib.get_close_matches(wanted, RULES.ids(), n=3, cutoff=0.6)
        raise ConfigError(
            f"--explain {rule_id!r}: no such rule"
            + (f"; nearest: {', '.join(near)}" if near else "")
            + " (longpack check --list-rules lists them)",
            fields="explain",
        )
    rule = RULES[wanted]
    p = rule.provenance
    versions = {}
    for product, r in (("bridge", p.bridge), ("mcore", p.mcore)):
        versions[PRODUCTS[product].name] = {  # type: ignore[index]
            "range": r.text,
            "known": [v for v in known_versions(product) if r.contains(v, product)],  # type: ignore[arg-type]
        }
    sources = [
        "longpack"
        if s.repo == "longpack"
        else f"{s.repo}@{s.commit}:{s.path}" + (" (relaxed it)" if s.relaxes else "")
        for s in p.sources
    ]
    return {
        "id": rule.id,
        "severity": rule.severity.value,
        "title": rule.title,
        "description": rule.description,
        "fix": rule.fix,
        "source": rule.source,
        "sources": sources,
        "versions": versions,
        "recipes": recipes_exercising(rule.id),
        "recipes_from": recipes_source(),
    }
