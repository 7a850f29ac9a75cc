"""Model-family opt-outs: packing paths a family's Megatron-Bridge recipes or collates refuse.

What each family supports is catalog data (``packing:`` in ``model_catalog.yaml``), not code.
"""

from __future__ import annotations

from collections.abc import Iterator

from longpack.rules.checks.common import K_BUF, K_IBP, K_OFF, K_SPECS, E, V
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("family", "Model-family opt-outs")


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
