"""Valid base configs the rule tests start from (each is clean: no finding at all)."""

from __future__ import annotations

import copy
from typing import Any

from longpack.rules import Finding, run_rules, setup_from_mapping
from longpack.rules.config import TrainingSetup
from longpack.rules.packed_data import PackedDataSummary
from longpack.rules.versions import UpstreamVersions

# Llama-3.1-8B packed SFT, 16 GPUs, TP2 CP2 SP (DP 4), required multiple lcm(4, 4) = 4.
SFT: dict[str, Any] = {
    "longpack": {"world_size": 16, "model_family": "llama3_1_8b", "dataset_kind": "sft"},
    "model": {
        "seq_length": 8192,
        "tensor_model_parallel_size": 2,
        "context_parallel_size": 2,
        "sequence_parallel": True,
        "calculate_per_token_loss": True,
    },
    "train": {"micro_batch_size": 1, "global_batch_size": 8},
    "dataset": {
        "seq_length": 8192,
        "enable_offline_packing": True,
        "offline_packing_specs": {"packed_sequence_size": 8192, "pad_seq_to_mult": 4},
        "dataset_kwargs": {},
    },
    "ddp": {"average_in_collective": False},
}

# Qwen3-30B-A3B packed SFT: as SFT plus EP8 ETP1 (expert DP 2).
MOE: dict[str, Any] = copy.deepcopy(SFT)
MOE["longpack"]["model_family"] = "qwen3_30b_a3b"
MOE["model"].update({"expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1})

# Direct-HF in-batch packing: MBS 2, GBS 16.
DHF: dict[str, Any] = copy.deepcopy(SFT)
DHF["longpack"]["dataset_kind"] = "direct_hf"
DHF["dataset"] = {"seq_length": 8192, "enable_in_batch_packing": True}
DHF["train"] = {"micro_batch_size": 2, "global_batch_size": 16}

# Energon native packing (Qwen-VL style), 8 GPUs, CP2 (DP 4).
ENERGON: dict[str, Any] = {
    "longpack": {"world_size": 8, "dataset_kind": "energon"},
    "model": {
        "num_layers": 28,
        "num_attention_heads": 16,
        "num_query_groups": 8,
        "seq_length": 8192,
        "context_parallel_size": 2,
        "calculate_per_token_loss": True,
    },
    "train": {"micro_batch_size": 1, "global_batch_size": 8},
    "dataset": {"seq_length": 8192, "packing_buffer_size": 16, "micro_batch_size": 1},
    "ddp": {"average_in_collective": False},
}

# Pretraining (GPTDatasetConfig), 8 GPUs, CP2.
PRETRAIN: dict[str, Any] = {
    "longpack": {"world_size": 8, "dataset_kind": "pretraining", "model_family": "llama3_1_8b"},
    "model": {"seq_length": 8192, "context_parallel_size": 2},
    "train": {"micro_batch_size": 1, "global_batch_size": 8},
    "dataset": {"seq_length": 8192},
}

BASES = {"SFT": SFT, "MOE": MOE, "DHF": DHF, "ENERGON": ENERGON, "PRETRAIN": PRETRAIN}


def setup_of(base: str | dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> TrainingSetup:
    data = BASES[base] if isinstance(base, str) else base
    return setup_from_mapping(data, overrides=overrides).setup


def findings_of(
    base: str | dict[str, Any],
    overrides: list[str] | tuple[str, ...] = (),
    packed: PackedDataSummary | None = None,
    *,
    bridge: str = "main",
    mcore: str = "main",
) -> list[Finding]:
    """The findings for the Megatron-Bridge / Megatron-Core versions given (default: ``main`` of both)."""
    versions = UpstreamVersions.resolve(bridge=bridge, mcore=mcore)
    return run_rules(setup_of(base, overrides), packed, versions=versions)


def packed_summary(**changes: Any) -> PackedDataSummary:
    """A clean packed-folder summary matching the SFT base (N = 8192, multiple 4)."""
    values: dict[str, Any] = {
        "path": "/data/packed/tok_pad_seq_to_mult4_sft_0123456789ab",
        "pack_size": 8192,
        "metadata_path": "/data/packed/8192_metadata.jsonl",
        "metadata": ({"max_samples_per_bin": 5, "dataset_max_seqlen": 4096, "min_packed_seqlen": 7000},),
        "parquet_files": ("/data/packed/training_8192.idx.parquet",),
        "manifest": None,
        "recorded_pad_seq_to_mult": 4,
        "rows": 100,
        "segments": 400,
        "checked_multiple": 4,
        "misaligned_segments": 0,
        "first_misaligned": None,
        "segment_length_gcd": 4,
        "rows_over_pack_size": 0,
        "max_row_runtime_tokens": 8192,
    }
    values.update(changes)
    return PackedDataSummary(**values)
