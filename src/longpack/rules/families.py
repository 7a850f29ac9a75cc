"""Model families: the architecture numbers the rules need, and the packing opt-outs of their recipes.

Architecture numbers come from ``shared/data/model_catalog.yaml`` (HF ``config.json`` of each released
checkpoint, cross-checked there). Packing opt-outs come from Megatron-Bridge's recipes and collates
(spec ``megatron-packing.md`` §6.17). Values given in a config (``model.num_layers`` ...) always win over
the family defaults.

>>> family = find_family("deepseek_v3")
>>> family.num_layers, family.num_attention_heads, family.num_moe_experts, family.mtp_num_layers
(61, 128, 256, 1)
>>> find_family("Qwen/Qwen3-235B-A22B").name
'qwen3_235b_a22b'
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """One model family: architecture (``None`` when it varies by size) and packing support."""

    name: str
    display_name: str
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    num_moe_experts: int | None = None
    mtp_num_layers: int = 0
    #: Offline packed SFT supported by the family's recipes.
    offline_packing: bool = True
    #: Collate-level in-batch packing supported (``enable_in_batch_packing`` without deferral).
    in_batch_packing: bool = True
    #: Any packing (offline, in-batch, Energon) supported.
    any_packing: bool = True
    #: Why packing is refused, quoted from Megatron-Bridge.
    opt_out_reason: str = ""
    #: Regular expressions matched (case-insensitively) against HF ids and ``_target_`` class paths.
    patterns: tuple[str, ...] = ()


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily(
        name="deepseek_v3",
        display_name="DeepSeek-V3",
        num_layers=61,
        num_attention_heads=128,
        num_query_groups=128,
        num_moe_experts=256,
        mtp_num_layers=1,
        patterns=(r"deepseek-?v3", r"deepseekv3"),
    ),
    ModelFamily(
        name="kimi_k2",
        display_name="Kimi-K2",
        num_layers=61,
        num_attention_heads=64,
        num_query_groups=64,
        num_moe_experts=384,
        patterns=(r"kimi-?k2",),
    ),
    ModelFamily(
        name="glm_4_5",
        display_name="GLM-4.5 355B",
        num_layers=92,
        num_attention_heads=96,
        num_query_groups=8,
        num_moe_experts=160,
        mtp_num_layers=1,
        offline_packing=False,
        opt_out_reason="GLM-4.5 does NOT support offline packing (Megatron-Bridge GLM-4.5 SFT/PEFT recipes)",
        patterns=(r"glm-?4\.?5(?!v)(?![0-9])(?!-air)", r"glm45(?!v)(?!air)"),
    ),
    ModelFamily(
        name="glm_4_5v",
        display_name="GLM-4.5V",
        in_batch_packing=False,
        opt_out_reason="GLM-4.5V recipes set enable_in_batch_packing=False",
        patterns=(r"glm-?4\.?5-?v", r"glm45v"),
    ),
    ModelFamily(
        name="qwen3_235b_a22b",
        display_name="Qwen3-235B-A22B",
        num_layers=94,
        num_attention_heads=64,
        num_query_groups=4,
        num_moe_experts=128,
        patterns=(r"qwen3-235b-a22b",),
    ),
    ModelFamily(
        name="qwen3_30b_a3b",
        display_name="Qwen3-30B-A3B",
        num_layers=48,
        num_attention_heads=32,
        num_query_groups=4,
        num_moe_experts=128,
        patterns=(r"qwen3-30b-a3b",),
    ),
    ModelFamily(
        name="qwen3_next_80b_a3b",
        display_name="Qwen3-Next-80B-A3B",
        num_layers=48,
        num_attention_heads=16,
        num_query_groups=2,
        num_moe_experts=512,
        mtp_num_layers=1,
        offline_packing=False,
        opt_out_reason="Packed sequence is NOT supported for Qwen3-Next (Megatron-Bridge Qwen3-Next SFT recipe)",
        patterns=(r"qwen3-?next",),
    ),
    ModelFamily(
        name="qwen3_5_vl",
        display_name="Qwen3.5-VL",
        in_batch_packing=False,
        opt_out_reason=(
            "Qwen3.5-VL recipes set defer_in_batch_packing_to_step=True: the Qwen3.5-VL step packs, "
            "not the collate"
        ),
        patterns=(r"qwen3\.?[56]-?vl", r"qwen3[56]vl", r"qwen3\.[56]-\d+b"),
    ),
    ModelFamily(
        name="qwen3_omni",
        display_name="Qwen3-Omni",
        in_batch_packing=False,
        offline_packing=False,
        any_packing=False,
        opt_out_reason="Qwen3-Omni: 'does not support in-batch packing' / 'packed sequence support is not implemented yet'",
        patterns=(r"qwen3-?omni",),
    ),
    ModelFamily(
        name="nemotron_vl",
        display_name="Nemotron-VL",
        in_batch_packing=False,
        opt_out_reason="the Nemotron-VL collate does not support in-batch packing",
        patterns=(r"nemotron-?(nano-?)?vl",),
    ),
    ModelFamily(
        name="mixtral_8x7b",
        display_name="Mixtral-8x7B",
        num_layers=32,
        num_attention_heads=32,
        num_query_groups=8,
        num_moe_experts=8,
        patterns=(r"mixtral-8x7b",),
    ),
    ModelFamily(
        name="llama3_1_8b",
        display_name="Llama-3.1-8B",
        num_layers=32,
        num_attention_heads=32,
        num_query_groups=8,
        patterns=(r"llama-?3(\.1)?-8b",),
    ),
    ModelFamily(
        name="llama3_1_70b",
        display_name="Llama-3.1-70B",
        num_layers=80,
        num_attention_heads=64,
        num_query_groups=8,
        patterns=(r"llama-?3(\.1)?-70b",),
    ),
    ModelFamily(
        name="llama3_1_405b",
        display_name="Llama-3.1-405B",
        num_layers=126,
        num_attention_heads=128,
        num_query_groups=8,
        patterns=(r"llama-?3(\.1)?-405b",),
    ),
)

_BY_NAME = {f.name: f for f in FAMILIES}


def find_family(text: str) -> ModelFamily | None:
    """The family named ``text`` (a catalog name such as ``qwen3_235b_a22b``), or whose pattern matches
    an HF id or a Megatron-Bridge provider path in it; ``None`` when nothing matches.

    >>> find_family("megatron.bridge.models.qwen.Qwen3NextModelProvider80B_A3B").name
    'qwen3_next_80b_a3b'
    >>> find_family("zai-org/GLM-4.5V").name, find_family("zai-org/GLM-4.5").name
    ('glm_4_5v', 'glm_4_5')
    >>> find_family("zai-org/GLM-4.5-Air") is None  # another architecture: not guessed
    True
    >>> find_family("gpt2") is None
    True
    """
    key = text.strip().lower()
    if key in _BY_NAME:
        return _BY_NAME[key]
    for family in FAMILIES:
        if any(re.search(p, key) for p in family.patterns):
            return family
    return None


def family_names() -> list[str]:
    """Names accepted by ``--model`` and ``longpack.model_family``.

    >>> "deepseek_v3" in family_names()
    True
    """
    return [f.name for f in FAMILIES]
