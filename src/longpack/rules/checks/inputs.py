"""Inputs: whether the values the other rules compute with are usable and known.

When a size is not positive (``LP-CFG-001``) only these rules run: the others would divide by it.
"""

from __future__ import annotations

from collections.abc import Iterator

from longpack.rules.checks.common import (
    INFO,
    K_CP,
    K_DSEQ,
    K_EP,
    K_ETP,
    K_GBS,
    K_MBS,
    K_PP,
    K_SEQ,
    K_TP,
    K_VPP,
    E,
    V,
)
from longpack.rules.config import TrainingSetup
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("inputs", "Inputs the rules need")


def non_positive_sizes(s: TrainingSetup) -> list[tuple[str, int]]:
    """``(key, value)`` of every parallel size, batch size or length that is set but not >= 1.

    >>> from longpack.rules.config import ModelSettings
    >>> non_positive_sizes(TrainingSetup(model=ModelSettings(context_parallel_size=0)))
    [('model.context_parallel_size', 0)]
    """
    m = s.model
    values = {
        K_TP: m.tensor_model_parallel_size,
        K_CP: m.context_parallel_size,
        K_PP: m.pipeline_model_parallel_size,
        K_EP: m.expert_model_parallel_size,
        K_ETP: m.expert_tensor_parallel_size,
        K_VPP: m.virtual_pipeline_model_parallel_size,
        K_MBS: s.micro_batch_size,
        K_GBS: s.global_batch_size,
        K_SEQ: m.seq_length,
        K_DSEQ: s.dataset.seq_length,
        "longpack.world_size": s.world_size,
        "dist.eval_context_parallel_size": s.eval_context_parallel_size,
        "dataset.pad_to_multiple_of": s.dataset.pad_to_multiple_of,
        "dataset.in_batch_packing_pad_to_multiple_of": s.dataset.in_batch_packing_pad_to_multiple_of,
    }
    return [(key, value) for key, value in values.items() if value is not None and value < 1]


@FAMILY.rule(
    "LP-CFG-001",
    E,
    "parallel sizes, batch sizes and lengths are positive integers",
    "MCore / Bridge",
    fix="set the named size to an integer >= 1",
)
def sizes_positive(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Core divides by every parallel size and Bridge by the batch sizes and lengths; a zero or
    negative value fails at start-up, usually as a division by zero far from the config."""
    for key, value in non_positive_sizes(s):
        yield V(f"{key}={value} must be a positive integer", f"set {key} to a value >= 1", key)


@FAMILY.rule(
    "LP-CFG-002",
    INFO,
    "world size known (topology and batch rules need it)",
    "longpack",
    fix="pass --gpus N or set longpack.world_size",
)
def world_size_known(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge configs do not store the GPU count; without it the data-parallel size is unknown and
    the rules that need it are skipped."""
    if s.world_size is None:
        yield V(
            "world size unknown: rules on DP, expert DP and GBS divisibility were skipped",
            "pass --gpus N (or longpack.world_size=N)",
        )


@FAMILY.rule(
    "LP-CFG-003",
    INFO,
    "model architecture known (layer/head/expert rules need it)",
    "longpack",
    fix="set model.num_layers and model.num_attention_heads, or name the model family with --model",
)
def architecture_known(s: TrainingSetup) -> Iterator[Violation]:
    """Layer, head and expert counts come from the config or from the model family in the catalog; when
    neither has them the pipeline-split and head-divisibility rules are skipped."""
    m = s.model
    if m.num_layers is None or m.num_attention_heads is None:
        yield V(
            f"model architecture incomplete (num_layers={m.num_layers}, num_attention_heads="
            f"{m.num_attention_heads}): pipeline-split and head-divisibility rules were skipped",
            "set model.num_layers / model.num_attention_heads / model.num_query_groups / "
            "model.num_moe_experts, or name a family with --model (see --list-families)",
            "model.num_layers",
        )
