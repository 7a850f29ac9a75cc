"""Model-family opt-outs: packing paths a family's Megatron-Bridge recipes or collates refuse.

What each family supports is catalog data (``packing:`` in ``model_catalog.yaml``), not code.
"""

from __future__ import annotations

from collections.abc import Iterator

from longpack.rules.checks.common import K_BUF, K_CP, K_IBP, K_OFF, K_SPECS, E, V
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation
from longpack.rules.versions import MCORE, VersionRange

FAMILY = RuleFamily("family", "Model-family opt-outs")

#: First Megatron-Core release whose ``TransformerConfig`` lets Gated DeltaNet run with CP > 1: 0.16.x and
#: 0.17.x assert ``context_parallel_size == 1`` for ``experimental_attention_variant == "gated_delta_net"``
#: ("Gated delta net does not support context parallel for now", added in NVIDIA/Megatron-LM@20d66d5c7b,
#: megatron/core/transformer/transformer_config.py; core_v0.16.1 = 55ac708251 holds it); NVIDIA/Megatron-LM@
#: 20ba03fec0 ("Gated delta net context parallel (CP)", first in core_v0.18.0) drops it.
GDN_CP_SINCE = "0.18.0"


def gdn_cp_supported(mcore_version: str) -> bool:
    """Whether Megatron-Core ``mcore_version`` runs Gated DeltaNet layers with CP > 1 (rule LP-MODEL-004;
    the planner searches only layouts this allows).

    >>> gdn_cp_supported("0.16.1"), gdn_cp_supported("0.17.1"), gdn_cp_supported("0.18.0"), gdn_cp_supported("main")
    (False, False, True, True)
    """
    return VersionRange(since=GDN_CP_SINCE).contains(mcore_version, MCORE)


@FAMILY.rule(
    "LP-MODEL-001",
    E,
    "family supports offline packing (Qwen3-Next, GLM-4.5 do not)",
    "Bridge recipes (model opt-outs)",
    fix="train the model unpacked: dataset.enable_offline_packing=false and no offline_packing_specs",
)
def family_offline(s: TrainingSetup) -> Iterator[Violation]:
    """The Qwen3-Next and GLM-4.5 SFT recipes train unpacked and say packed sequences are not supported."""
    f = s.family
    if f and f.any_packing and not f.offline_packing and s.dataset.offline_packing:
        yield V(
            f"{f.display_name} with offline packing: {f.opt_out_reason}",
            f"train {f.display_name} unpacked: {K_OFF}=false ~{K_SPECS} (the recipes use pad_seq_to_mult=1, MBS 1)",
            K_OFF,
            K_SPECS,
        )


@FAMILY.rule(
    "LP-MODEL-002",
    E,
    "family supports collate in-batch packing (Qwen3.5-VL, GLM-4.5V, Nemotron-VL do not)",
    "Bridge recipes (model opt-outs)",
    fix="set dataset.enable_in_batch_packing=false (Qwen3.5-VL: defer_in_batch_packing_to_step=true)",
)
def family_inbatch(s: TrainingSetup) -> Iterator[Violation]:
    """Some vision-language recipes and collates refuse collate-time in-batch packing (Qwen3.5-VL packs in
    its step instead)."""
    f = s.family
    if f and f.any_packing and not f.in_batch_packing and s.dataset.collate_in_batch_packing:
        fix = f.in_batch_fix or f"set {K_IBP}=false"
        yield V(f"{f.display_name} with collate in-batch packing: {f.opt_out_reason}", fix, K_IBP)


@FAMILY.rule(
    "LP-MODEL-003",
    E,
    "family supports packing at all (Qwen3-Omni does not)",
    "Bridge recipes (model opt-outs)",
    fix="turn packing off (offline, in-batch and Energon)",
)
def family_any(s: TrainingSetup) -> Iterator[Violation]:
    """Qwen3-Omni supports neither in-batch nor packed sequences."""
    f = s.family
    if f and not f.any_packing and s.dataset.any_packing:
        yield V(
            f"{f.display_name} with packed sequences: {f.opt_out_reason}",
            f"turn packing off ({K_OFF}=false, {K_IBP}=false, {K_BUF}=null)",
            K_OFF,
            K_IBP,
        )


@FAMILY.rule(
    "LP-MODEL-004",
    E,
    "Gated DeltaNet layers (Qwen3-Next) run with CP = 1 before Megatron-Core 0.18.0",
    "Megatron-Core TransformerConfig (gated_delta_net asserts context_parallel_size == 1 before 0.18.0)",
    fix=f"set {K_CP}=1 (or use Megatron-Core >= {GDN_CP_SINCE}, which splits the GDN heads over CP ranks)",
)
def family_gdn_cp(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core 0.16.x / 0.17.x assert ``context_parallel_size == 1`` in ``TransformerConfig`` when
    the model has Gated DeltaNet layers (``experimental_attention_variant="gated_delta_net"``): the run
    stops before the first step."""
    f = s.family
    if f and f.spec is not None and f.spec.gdn is not None and s.cp > 1:
        yield V(
            f"{f.display_name} has Gated DeltaNet layers and CP={s.cp}: Megatron-Core before "
            f"{GDN_CP_SINCE} asserts context_parallel_size == 1 for gated_delta_net",
            f"set {K_CP}=1, or train on Megatron-Core >= {GDN_CP_SINCE}",
            K_CP,
        )
