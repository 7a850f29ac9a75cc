"""One test per rule: a config that triggers it (id, severity, the values in the message) and the nearest
config that does not."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from longpack.rules import RULES, declared_keys
from longpack.rules.config import DECLARED
from longpack.rules.packed_data import SegmentExample
from rule_bases import BASES, findings_of, packed_summary

PTML = "dataset.dataset_kwargs.pad_to_max_length=true"
PCU = "dataset.offline_packing_specs.pad_cu_seqlens=true"
HYBRIDEP = ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"]
NO_OFFLINE = ["dataset.enable_offline_packing=false", "~dataset.offline_packing_specs"]


def seq(n: int) -> list[str]:
    return [
        f"model.seq_length={n}",
        f"dataset.seq_length={n}",
        f"dataset.offline_packing_specs.packed_sequence_size={n}",
    ]


@dataclass(frozen=True)
class Case:
    rule_id: str
    base: str
    fail: list[str]
    fix: list[str]
    says: tuple[str, ...]
    packed_fail: dict[str, Any] | None = None
    packed_fix: dict[str, Any] | None = field(default=None)
    #: What the finding's fix must say: the key to change and/or the concrete value.
    fix_says: tuple[str, ...] = ()
    #: The Megatron-Bridge / Megatron-Core versions both configs are checked for.
    bridge: str = "main"
    mcore: str = "main"

    def __str__(self) -> str:
        return self.rule_id


CASES = [
    Case(
        "LP-CFG-001",
        "SFT",
        ["model.context_parallel_size=0"],
        ["model.context_parallel_size=2"],
        ("context_parallel_size=0",),
        fix_says=("model.context_parallel_size", ">= 1"),
    ),
    Case(
        "LP-CFG-001",
        "DHF",
        ["dataset.pad_to_multiple_of=-3"],
        ["dataset.pad_to_multiple_of=3"],
        ("pad_to_multiple_of=-3",),
        fix_says=("dataset.pad_to_multiple_of", ">= 1"),
    ),
    Case(
        "LP-CFG-002",
        "SFT",
        ["~longpack.world_size"],
        ["longpack.world_size=16"],
        ("world size unknown",),
        fix_says=("--gpus N", "longpack.world_size=N"),
    ),
    Case(
        "LP-CFG-003",
        "SFT",
        ["~longpack.model_family"],
        ["model.num_layers=32", "model.num_attention_heads=32"],
        ("num_layers=None",),
        fix_says=("model.num_layers", "--model"),
    ),
    Case(
        "LP-TOPO-001",
        "SFT",
        ["longpack.world_size=10"],
        ["longpack.world_size=24"],
        ("world size 10", "TP*CP*PP = 2*2*1 = 4"),
        fix_says=("multiple of 4 GPUs", "divides 10"),
    ),
    Case(
        "LP-TOPO-002",
        "MOE",
        ["model.expert_model_parallel_size=16", "model.expert_tensor_parallel_size=null"],
        ["model.expert_model_parallel_size=16", "model.expert_tensor_parallel_size=1"],
        ("EP*ETP = 16*2 = 32", "N/PP = 16/1 = 16", "defaults to TP=2"),
        fix_says=("model.expert_tensor_parallel_size=1",),
    ),
    Case(
        "LP-TOPO-003",
        "MOE",
        ["model.expert_model_parallel_size=3"],
        ["model.expert_model_parallel_size=8"],
        ("num_moe_experts=128", "EP=3"),
        fix_says=("divisors of 128", "1, 2, 4"),
    ),
    Case(
        "LP-TOPO-003",
        "SFT",
        ["model.expert_model_parallel_size=2"],
        ["model.expert_model_parallel_size=1"],
        ("expert_model_parallel_size=2", "no experts"),
        fix_says=("model.expert_model_parallel_size=1",),
    ),
    Case(
        "LP-TOPO-004",
        "SFT",
        ["model.tensor_model_parallel_size=3", "longpack.world_size=12"],
        ["model.tensor_model_parallel_size=4", "longpack.world_size=16"],
        ("num_attention_heads=32", "TP=3"),
        fix_says=("TP dividing 32",),
    ),
    Case(
        "LP-TOPO-005",
        "SFT",
        ["model.num_query_groups=2", "model.tensor_model_parallel_size=4"],
        ["model.num_query_groups=8", "model.tensor_model_parallel_size=4"],
        ("num_query_groups (KV heads)=2", "TP=4"),
        fix_says=("TP dividing 2",),
        mcore="0.15.3",
    ),
    Case(
        "LP-TOPO-007",
        "SFT",
        ["model.num_query_groups=6", "model.tensor_model_parallel_size=4", "model.num_attention_heads=48"],
        ["model.num_query_groups=2", "model.tensor_model_parallel_size=4", "model.num_attention_heads=48"],
        ("num_query_groups (KV heads)=6", "neither a multiple nor a divisor of TP=4"),
        fix_says=("TP dividing 6", "multiple of 6"),
    ),
    Case(
        "LP-TOPO-006",
        "SFT",
        ["model.tensor_model_parallel_size=1"],
        ["model.tensor_model_parallel_size=1", "model.sequence_parallel=false"],
        ("TP=1",),
        fix_says=("model.sequence_parallel=false",),
    ),
    Case(
        "LP-SP-001",
        "SFT",
        ["model.tensor_model_parallel_size=4", *seq(8196)],
        ["model.tensor_model_parallel_size=4", *seq(8192)],
        ("8196/2 = 4098", "TP=4"),
        fix_says=("divisible by CP*TP = 8",),
    ),
    Case(
        "LP-PP-001",
        "SFT",
        ["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=3"],
        ["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2"],
        ("num_layers=32", "PP*VPP = 2*3 = 6"),
        fix_says=("model.pipeline_model_parallel_layout='Et*4|(t*6|)*4t*4L'", "6 stages"),
    ),
    Case(
        "LP-PP-002",
        "SFT",
        ["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Et*16|t*15L"],
        ["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Et*16|t*16L"],
        ("places 31 decoder layers", "num_layers=32"),
        fix_says=("model.pipeline_model_parallel_layout='Et*16|t*16L'",),
    ),
    Case(
        "LP-PP-002",
        "SFT",
        ["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Ex*16|t*16L"],
        ["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Et*16|t*16L"],
        ("unknown layer character 'x'",),
        fix_says=("E, t, m, L",),
    ),
    Case(
        "LP-PP-003",
        "SFT",
        [
            "model.pipeline_model_parallel_size=4",
            "longpack.world_size=32",
            "model.num_layers_in_first_pipeline_stage=7",
        ],
        [
            "model.pipeline_model_parallel_size=4",
            "longpack.world_size=32",
            "model.num_layers_in_first_pipeline_stage=5",
        ],
        ("25 layers left for the 3 middle",),
        fix_says=("model.num_layers_in_first/last_pipeline_stage", "'Et*7|(t*9|)*2t*7L'"),
    ),
    Case(
        "LP-PP-004",
        "SFT",
        ["model.pipeline_model_parallel_size=2", "model.account_for_embedding_in_pipeline_split=true"],
        [
            "model.pipeline_model_parallel_size=2",
            "model.account_for_embedding_in_pipeline_split=true",
            "model.account_for_loss_in_pipeline_split=true",
        ],
        ("=33", "PP*VPP = 2*1 = 2"),
        fix_says=("model.pipeline_model_parallel_layout='Et*16|t*16L'",),
    ),
    Case(
        "LP-PP-005",
        "SFT",
        [
            "model.pipeline_model_parallel_size=2",
            "model.pipeline_model_parallel_layout=Et*16|t*16L",
            "model.account_for_loss_in_pipeline_split=true",
        ],
        ["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Et*16|t*16L"],
        ("pipeline_model_parallel_layout is combined",),
        fix_says=("keep only the layout",),
    ),
    Case(
        "LP-PP-006",
        "SFT",
        ["model.virtual_pipeline_model_parallel_size=2"],
        ["model.virtual_pipeline_model_parallel_size=null"],
        ("virtual_pipeline_model_parallel_size=2",),
        fix_says=("model.virtual_pipeline_model_parallel_size=null",),
    ),
    Case(
        "LP-CP-001",
        "SFT",
        seq(8190),
        seq(8192),
        ("seq_length=8190", "2*CP = 4"),
        fix_says=("model.seq_length", "multiple of 4 (e.g. 8192)"),
    ),
    Case(
        "LP-CP-002",
        "SFT",
        ["model.calculate_per_token_loss=false"],
        ["model.calculate_per_token_loss=true"],
        ("CP=2", "calculate_per_token_loss=False"),
        fix_says=("model.calculate_per_token_loss=true",),
    ),
    Case(
        "LP-CP-003",
        "SFT",
        ["ddp.average_in_collective=true"],
        ["ddp.average_in_collective=false"],
        ("CP=2", "average_in_collective=True"),
        fix_says=("ddp.average_in_collective=false",),
    ),
    Case(
        "LP-CP-004",
        "SFT",
        ["model.cp_comm_type=a2a", "model.num_query_groups=2"],
        ["model.cp_comm_type=p2p", "model.num_query_groups=2"],
        ("num_query_groups (KV heads)/TP = 2/2 = 1", "'a2a'"),
        fix_says=("cp_comm_type p2p", "dividing 1"),
    ),
    Case(
        "LP-CP-005",
        "SFT",
        ["model.cp_comm_type=a2a+p2p", "model.hierarchical_context_parallel_sizes=[2,2]"],
        ["model.cp_comm_type=a2a+p2p", "model.hierarchical_context_parallel_sizes=[2,1]"],
        ("[2, 2]", "CP=2"),
        fix_says=("product is 2", "[2, 1]"),
    ),
    Case(
        "LP-CP-006",
        "SFT",
        ["model.cp_comm_type=a2a+p2p"],
        ["model.cp_comm_type=a2a+p2p", "model.hierarchical_context_parallel_sizes=[2,1]"],
        ("a2a+p2p",),
        fix_says=("model.hierarchical_context_parallel_sizes=", "CP=2"),
    ),
    Case(
        "LP-CP-007",
        "DHF",
        ["model.tensor_model_parallel_size=4", "model.seq_length=8196", "dataset.seq_length=8196"],
        ["model.tensor_model_parallel_size=4", "model.seq_length=8192", "dataset.seq_length=8192"],
        ("dataset.seq_length=8196", "8 (= lcm(2*CP=4, CP*TP=8)"),
        fix_says=("dataset.seq_length", "multiple of 8"),
    ),
    Case(
        "LP-CP-008",
        "SFT",
        ["model.context_parallel_size=4", "longpack.world_size=32"],
        ["model.context_parallel_size=2", "longpack.world_size=32"],
        ("8192 / CP 4 = 2048",),
        fix_says=("CP=2",),
    ),
    Case(
        "LP-BATCH-001",
        "SFT",
        ["train.global_batch_size=10"],
        ["train.global_batch_size=12"],
        ("global_batch_size=10", "MBS*DP = 1*4 = 4"),
        fix_says=("GBS = 8 or 12",),
    ),
    Case(
        "LP-BATCH-002",
        "SFT",
        ["train.global_batch_size=2"],
        ["train.global_batch_size=4"],
        ("global_batch_size=2 < MBS*DP = 1*4 = 4",),
        fix_says=("train.global_batch_size", "multiple of 4"),
    ),
    Case(
        "LP-BATCH-003",
        "SFT",
        ["validation.eval_global_batch_size=6"],
        ["validation.eval_global_batch_size=8"],
        ("eval global batch 6", "1*4 = 4"),
        fix_says=("validation.eval_global_batch_size", "multiple of 4"),
    ),
    Case(
        "LP-PACK-001",
        "SFT",
        ["dataset.enable_in_batch_packing=true"],
        ["dataset.enable_in_batch_packing=false"],
        ("enable_in_batch_packing=True",),
        fix_says=("keep one", "offline packing", "in-batch packing"),
    ),
    Case(
        "LP-PACK-002",
        "SFT",
        ["~dataset.offline_packing_specs"],
        ["~dataset.offline_packing_specs", "dataset.enable_offline_packing=false"],
        ("offline_packing_specs is not set",),
        fix_says=("dataset.offline_packing_specs.packed_sequence_size=",),
    ),
    Case(
        "LP-PACK-003",
        "SFT",
        ["dataset.enable_offline_packing=false"],
        NO_OFFLINE,
        ("enable_offline_packing=False",),
        fix_says=("dataset.enable_offline_packing=true", "~dataset.offline_packing_specs"),
    ),
    Case(
        "LP-PACK-004",
        "SFT",
        ["dataset.offline_packing_specs.packed_sequence_size=0"],
        ["dataset.offline_packing_specs.packed_sequence_size=8192"],
        ("packed_sequence_size=0",),
        fix_says=("dataset.offline_packing_specs.packed_sequence_size",),
    ),
    Case(
        "LP-PACK-005",
        "SFT",
        ["train.micro_batch_size=4", "train.global_batch_size=32"],
        ["train.micro_batch_size=1", "train.global_batch_size=8"],
        ("micro_batch_size=4",),
        fix_says=("train.micro_batch_size=1", "train.global_batch_size=8", "packed_sequence_size=32768"),
    ),
    Case(
        "LP-PACK-006",
        "DHF",
        ["train.micro_batch_size=1", "train.global_batch_size=8"],
        ["train.micro_batch_size=2", "train.global_batch_size=16"],
        ("micro_batch_size=1",),
        fix_says=("train.micro_batch_size >= 2",),
    ),
    Case(
        "LP-PACK-007",
        "SFT",
        [PCU],
        [PCU, PTML],
        ("pad_cu_seqlens=True",),
        fix_says=("dataset.dataset_kwargs.pad_to_max_length=true",),
    ),
    Case(
        "LP-PACK-008",
        "SFT",
        ["dataset.offline_packing_specs.pad_seq_to_mult=2"],
        ["dataset.offline_packing_specs.pad_seq_to_mult=4"],
        ("pad_seq_to_mult=2", "2*CP = 4"),
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=4",),
    ),
    Case(
        "LP-PACK-008",
        "SFT",
        ["dataset.offline_packing_specs.pad_seq_to_mult=null"],
        ["dataset.offline_packing_specs.pad_seq_to_mult=4"],
        ("None",),
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=4",),
    ),
    Case(
        "LP-PACK-016",
        "SFT",
        ["model.tensor_model_parallel_size=4"],
        ["model.tensor_model_parallel_size=4", "dataset.offline_packing_specs.pad_seq_to_mult=8"],
        ("pad_seq_to_mult=4", "8 (= lcm(2*CP=4, CP*TP=8)", "TP=4"),
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=8",),
    ),
    Case(
        "LP-PACK-009",
        "SFT",
        ["dataset.offline_packing_specs.pad_seq_to_mult=8"],
        ["dataset.offline_packing_specs.pad_seq_to_mult=4"],
        ("pad_seq_to_mult=8", "the 4"),
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=4",),
    ),
    Case(
        "LP-PACK-017",
        "SFT",
        ["dataset.offline_packing_specs.pad_seq_to_mult=16384"],
        ["dataset.offline_packing_specs.pad_seq_to_mult=4"],
        ("pad_seq_to_mult=16384", "packed_sequence_size=8192"),
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=4",),
    ),
    Case(
        "LP-PACK-010",
        "SFT",
        ["dataset.offline_packing_specs.packed_sequence_size=16384"],
        ["dataset.offline_packing_specs.packed_sequence_size=8192"],
        ("packed_sequence_size=16384", "seq_length=8192"),
        fix_says=("dataset.offline_packing_specs.packed_sequence_size=8192",),
    ),
    Case(
        "LP-PACK-011",
        "SFT",
        ["dataset.offline_packing_specs.max_single_sequence_length=9000"],
        ["dataset.offline_packing_specs.max_single_sequence_length=8188"],
        ("max_single_sequence_length=9000", "packed_sequence_size=8192"),
        fix_says=("max_single_sequence_length <= 8192",),
    ),
    Case(
        "LP-PACK-012",
        "SFT",
        ["dataset.offline_packing_specs.packed_sequence_size=8190"],
        ["dataset.offline_packing_specs.packed_sequence_size=8192"],
        ("packed_sequence_size=8190", "multiple of 4"),
        fix_says=("packed_sequence_size", "multiple of 4"),
    ),
    Case(
        "LP-PACK-013",
        "SFT",
        ["dataset.dataset_kwargs.pad_seq_length_to_mult=6"],
        ["dataset.dataset_kwargs.pad_seq_length_to_mult=8"],
        ("pad_seq_length_to_mult=6",),
        fix_says=("dataset.dataset_kwargs.pad_seq_length_to_mult=12",),
    ),
    Case(
        "LP-PACK-014",
        "DHF",
        ["model.pipeline_model_parallel_size=2", "longpack.world_size=32"],
        ["model.pipeline_model_parallel_size=2", "longpack.world_size=32", "dataset.pad_to_max_length=true"],
        ("PP=2",),
        fix_says=("dataset.pad_to_max_length=true",),
    ),
    Case(
        "LP-PACK-019",
        "SFT",
        [
            *NO_OFFLINE,
            "dataset.enable_in_batch_packing=true",
            "train.micro_batch_size=2",
            "train.global_batch_size=16",
        ],
        [*NO_OFFLINE, "train.micro_batch_size=2", "train.global_batch_size=16"],
        ("on a GPT-SFT dataset", "PR #5493"),
        fix_says=("--bridge-version 0.7.0", "DirectHFSFTDatasetConfig"),
    ),
    Case(
        "LP-PACK-015",
        "SFT",
        [
            *NO_OFFLINE,
            "dataset.enable_in_batch_packing=true",
            "train.micro_batch_size=2",
            "train.global_batch_size=16",
            "dataset.dataloader_type=batch",
        ],
        [
            *NO_OFFLINE,
            "dataset.enable_in_batch_packing=true",
            "train.micro_batch_size=2",
            "train.global_batch_size=16",
            "dataset.dataloader_type=single",
        ],
        ("dataloader_type='batch'",),
        fix_says=("dataset.dataloader_type=single",),
        bridge="0.7.0",
    ),
    Case(
        "LP-MTP-001",
        "SFT",
        ["model.mtp_num_layers=1"],
        ["model.mtp_num_layers=null"],
        ("mtp_num_layers=1", "Megatron-Bridge 0.6.0"),
        fix_says=("model.mtp_num_layers=null",),
        bridge="0.6.0",
    ),
    Case(
        "LP-CG-001",
        "SFT",
        ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[mlp]"],
        ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[mlp]", PTML],
        ("cuda_graph_impl='transformer_engine'", "['mlp']"),
        fix_says=("dataset.dataset_kwargs.pad_to_max_length=true",),
    ),
    Case(
        "LP-CG-002",
        "SFT",
        ["model.cuda_graph_impl=transformer_engine", PTML],
        ["model.cuda_graph_impl=transformer_engine", PTML, PCU],
        ("whole layer", "pad_cu_seqlens=False"),
        fix_says=("dataset.offline_packing_specs.pad_cu_seqlens=true", "model.cuda_graph_scope=[mlp]"),
    ),
    Case(
        "LP-CG-003",
        "SFT",
        ["model.cuda_graph_impl=full_iteration", PTML, PCU],
        [
            "model.cuda_graph_impl=full_iteration",
            PTML,
            PCU,
            "rerun_state_machine.check_for_nan_in_loss=false",
        ],
        ("check_for_nan_in_loss=True",),
        fix_says=("rerun_state_machine.check_for_nan_in_loss=false",),
    ),
    Case(
        "LP-CG-004",
        "MOE",
        ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn,moe_router]", PTML, PCU],
        ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]", PTML, PCU],
        ("moe_router",),
        fix_says=("model.cuda_graph_scope=[attn]", "model.cuda_graph_impl=none"),
    ),
    Case(
        "LP-CG-005",
        "DHF",
        ["model.cuda_graph_impl=local"],
        ["model.cuda_graph_impl=none"],
        ("cuda_graph_impl='local'",),
        fix_says=("model.cuda_graph_impl=none",),
    ),
    Case(
        "LP-CG-005",
        "SFT",
        ["model.cuda_graph_impl=local"],
        ["model.cuda_graph_impl=local", PTML],
        ("cuda_graph_impl='local'",),
        fix_says=("dataset.dataset_kwargs.pad_to_max_length=true",),
    ),
    Case(
        "LP-EN-001",
        "ENERGON",
        ["train.micro_batch_size=2", "dataset.micro_batch_size=2"],
        ["train.micro_batch_size=1", "dataset.micro_batch_size=1"],
        ("train.micro_batch_size=2", "packing_buffer_size=16"),
        fix_says=("train.micro_batch_size=1",),
    ),
    Case(
        "LP-EN-002",
        "ENERGON",
        ["dataset.micro_batch_size=2"],
        ["dataset.micro_batch_size=1"],
        ("dataset.micro_batch_size=2",),
        fix_says=("dataset.micro_batch_size=1",),
    ),
    Case(
        "LP-EN-002",
        "ENERGON",
        ["validation.eval_micro_batch_size=2"],
        ["validation.eval_micro_batch_size=1"],
        ("validation.eval_micro_batch_size=2",),
        fix_says=("validation.eval_micro_batch_size=1",),
    ),
    Case(
        "LP-EN-003",
        "ENERGON",
        ["model.calculate_per_token_loss=false"],
        ["model.calculate_per_token_loss=true"],
        ("calculate_per_token_loss=False",),
        fix_says=("model.calculate_per_token_loss=true",),
    ),
    Case(
        "LP-EN-004",
        "ENERGON",
        ["ddp.average_in_collective=true"],
        ["ddp.average_in_collective=false"],
        ("average_in_collective=True",),
        fix_says=("ddp.average_in_collective=false",),
    ),
    Case(
        "LP-EN-005",
        "ENERGON",
        ["model.mtp_num_layers=1"],
        ["model.mtp_num_layers=null"],
        ("mtp_num_layers=1",),
        fix_says=("model.mtp_num_layers=null", "dataset.packing_buffer_size=null"),
    ),
    Case(
        "LP-EN-006",
        "ENERGON",
        ["model.cuda_graph_impl=local"],
        ["model.cuda_graph_impl=none"],
        ("cuda_graph_impl='local'",),
        fix_says=("model.cuda_graph_impl=none", "model.vision_cuda_graph_impl=none"),
    ),
    Case(
        "LP-EN-006",
        "ENERGON",
        ["model.vision_cuda_graph_impl=transformer_engine"],
        ["model.vision_cuda_graph_impl=none"],
        ("vision_cuda_graph_impl='transformer_engine'",),
        fix_says=("model.cuda_graph_impl=none", "model.vision_cuda_graph_impl=none"),
    ),
    Case(
        "LP-EN-007",
        "ENERGON",
        ["dist_train.use_dist_train=true"],
        ["dist_train.use_dist_train=false"],
        ("use_dist_train=True",),
        fix_says=("dist_train.use_dist_train=false",),
    ),
    Case(
        "LP-EN-008",
        "ENERGON",
        ["model.pipeline_model_parallel_size=2"],
        ["model.pipeline_model_parallel_size=1"],
        ("pipeline_model_parallel_size=2",),
        fix_says=("model.pipeline_model_parallel_size=1",),
    ),
    Case(
        "LP-EN-009",
        "ENERGON",
        ["model.overlap_moe_expert_parallel_comm=true"],
        ["model.overlap_moe_expert_parallel_comm=false"],
        ("overlap_moe_expert_parallel_comm",),
        fix_says=("model.overlap_moe_expert_parallel_comm=false", "model.delay_wgrad_compute=false"),
    ),
    Case(
        "LP-EN-010",
        "ENERGON",
        ["dataset.enable_in_batch_packing=true"],
        ["dataset.enable_in_batch_packing=false"],
        ("enable_in_batch_packing=True",),
        fix_says=("dataset.enable_in_batch_packing=false",),
    ),
    Case(
        "LP-EN-011",
        "ENERGON",
        ["dataset.defer_in_batch_packing_to_step=true"],
        ["dataset.defer_in_batch_packing_to_step=false"],
        ("defer_in_batch_packing_to_step=True",),
        fix_says=("dataset.defer_in_batch_packing_to_step=false",),
    ),
    Case(
        "LP-EN-012",
        "ENERGON",
        ["dataset.packing_buffer_size=0"],
        ["dataset.packing_buffer_size=16"],
        ("packing_buffer_size=0",),
        fix_says=("dataset.packing_buffer_size=16",),
    ),
    Case(
        "LP-EN-013",
        "ENERGON",
        ["dataset.task_encoder._target_=megatron.bridge.data.builders.energon.HFEnergonTaskEncoderConfig"],
        [
            "dataset.task_encoder._target_=megatron.bridge.data.builders.energon.QwenVLEnergonTaskEncoderConfig"
        ],
        ("HFEnergonTaskEncoderConfig",),
        fix_says=("QwenVLEnergonTaskEncoderConfig",),
    ),
    Case(
        "LP-EN-014",
        "ENERGON",
        ["dataset.dataset_kwargs={batch_size: 4}"],
        ["dataset.dataset_kwargs={handler: warn_and_continue}"],
        ("['batch_size']",),
        fix_says=("micro_batch_size, packing_buffer_size",),
    ),
    Case(
        "LP-EN-015",
        "ENERGON",
        ["dataset.packing_buffer_size=4"],
        ["dataset.packing_buffer_size=16"],
        ("packing_buffer_size=4",),
        fix_says=("8-16 candidates",),
    ),
    Case(
        "LP-VLM-001",
        "ENERGON",
        ["dataset.task_encoder.max_visual_tokens=0"],
        ["dataset.task_encoder.max_visual_tokens=4096"],
        ("max_visual_tokens=0 must be a positive integer",),
        fix_says=("dataset.task_encoder.max_visual_tokens", ">= 1 (or null)"),
    ),
    Case(
        "LP-VLM-001",
        "ENERGON",
        ["dataset.task_encoder.patch_size=-14"],
        ["dataset.task_encoder.patch_size=14"],
        ("patch_size=-14",),
        fix_says=("dataset.task_encoder.patch_size",),
    ),
    Case(
        "LP-VLM-002",
        "ENERGON",
        ["dataset.task_encoder.min_pixels=2000000"],
        ["dataset.task_encoder.min_pixels=200704"],
        ("min_pixels=2000000 > dataset.task_encoder.max_pixels=1003520",),
        fix_says=("dataset.task_encoder.min_pixels <= dataset.task_encoder.max_pixels",),
    ),
    Case(
        "LP-VLM-003",
        "ENERGON",
        ["dataset.task_encoder.max_visual_tokens=16384"],
        ["dataset.task_encoder.max_visual_tokens=6144"],
        ("max_visual_tokens=16384 >= seq_length=8192",),
        fix_says=("dataset.task_encoder.max_visual_tokens below 8192", "dataset.seq_length"),
    ),
    Case(
        "LP-VLM-004",
        "ENERGON",
        ["dataset.num_workers=4", "dataset.packing_buffer_size=64"],
        ["dataset.num_workers=4", "dataset.packing_buffer_size=16"],
        (
            "36.8 GiB per rank (the buffer holds prepared pixels): 4 worker(s) * packing_buffer_size=64 * 147.0 MiB "
            "per sample",
            "seq_length=8192",
        ),
        fix_says=(
            "_target_ to longpack's deferred-decoding QwenVLPackingEncoder",
            "dataset.packing_buffer_size",
        ),
    ),
    # The same buffer with longpack's deferred encoder holds one decoded pack per worker (147 MiB at 8192 tokens):
    # it fires only when the workers' packs pass 16 GiB.
    Case(
        "LP-VLM-004",
        "ENERGON",
        [
            "dataset.task_encoder._target_=longpack.online.vlm.QwenVLPackingEncoder",
            "dataset.num_workers=128",
            "dataset.packing_buffer_size=64",
        ],
        [
            "dataset.task_encoder._target_=longpack.online.vlm.QwenVLPackingEncoder",
            "dataset.num_workers=4",
            "dataset.packing_buffer_size=64",
        ],
        ("18.4 GiB per rank (deferred decoding): 128 worker(s) * one pack of seq_length=8192 tokens",),
        fix_says=("dataset.seq_length", "online-sim --vlm"),
    ),
    Case(
        "LP-MOE-001",
        "MOE",
        ["model.sequence_parallel=false"],
        ["model.sequence_parallel=true"],
        ("EP=8 and TP=2",),
        fix_says=("model.sequence_parallel=true",),
    ),
    Case(
        "LP-MOE-002",
        "MOE",
        [*HYBRIDEP, PTML, *seq(8196)],
        [*HYBRIDEP, PTML, *seq(8192)],
        ("8196 tokens", "128"),
        fix_says=("multiple of 128",),
    ),
    Case(
        "LP-MOE-003",
        "MOE",
        [*HYBRIDEP, "model.cuda_graph_impl=local"],
        [*HYBRIDEP, "model.cuda_graph_impl=local", PTML],
        ("HybridEP with CUDA graphs",),
        fix_says=("dataset.dataset_kwargs.pad_to_max_length=true",),
    ),
    Case(
        "LP-MOE-004",
        "MOE",
        ["model.moe_expert_capacity_factor=1.0"],
        ["model.moe_expert_capacity_factor=null"],
        ("moe_expert_capacity_factor=1.0",),
        fix_says=("model.moe_expert_capacity_factor=null",),
    ),
    Case(
        "LP-MODEL-001",
        "SFT",
        ["longpack.model_family=qwen3_next_80b_a3b"],
        ["longpack.model_family=qwen3_next_80b_a3b", *NO_OFFLINE],
        ("Qwen3-Next", "NOT supported"),
        fix_says=(
            "Qwen3-Next-80B-A3B unpacked",
            "dataset.enable_offline_packing=false",
            "~dataset.offline_packing_specs",
        ),
    ),
    Case(
        "LP-MODEL-001",
        "SFT",
        ["longpack.model_family=glm_4_5"],
        ["longpack.model_family=glm_4_5", *NO_OFFLINE],
        ("GLM-4.5", "offline packing"),
        fix_says=(
            "GLM-4.5 355B unpacked",
            "dataset.enable_offline_packing=false",
            "~dataset.offline_packing_specs",
        ),
    ),
    Case(
        "LP-MODEL-002",
        "DHF",
        ["longpack.model_family=qwen3_5_vl"],
        ["longpack.model_family=qwen3_5_vl", "dataset.defer_in_batch_packing_to_step=true"],
        ("Qwen3.5-VL",),
        fix_says=("dataset.defer_in_batch_packing_to_step=true",),
    ),
    Case(
        "LP-MODEL-002",
        "DHF",
        ["longpack.model_family=glm_4_5v"],
        ["longpack.model_family=glm_4_5v", "dataset.enable_in_batch_packing=false"],
        ("GLM-4.5V",),
        fix_says=("dataset.enable_in_batch_packing=false",),
    ),
    Case(
        "LP-MODEL-003",
        "DHF",
        ["longpack.model_family=qwen3_omni"],
        ["longpack.model_family=qwen3_omni", "dataset.enable_in_batch_packing=false"],
        ("Qwen3-Omni",),
        fix_says=("dataset.enable_offline_packing=false", "dataset.packing_buffer_size=null"),
    ),
    Case(
        "LP-MODEL-004",
        "SFT",
        ["longpack.model_family=qwen3_next_80b_a3b", *NO_OFFLINE],
        ["longpack.model_family=qwen3_next_80b_a3b", *NO_OFFLINE, "model.context_parallel_size=1"],
        ("Qwen3-Next", "Gated DeltaNet", "CP=2", "before 0.18.0"),
        fix_says=("model.context_parallel_size=1", ">= 0.18.0"),
        mcore="0.16.1",
    ),
    Case(
        "LP-SEQ-001",
        "SFT",
        ["dataset.seq_length=4096"],
        ["dataset.seq_length=8192"],
        ("model.seq_length=8192", "dataset.seq_length=4096"),
        fix_says=("model.seq_length=4096", "dataset.seq_length=8192"),
    ),
    Case(
        "LP-EN-016",
        "ENERGON",
        ["dataset.do_test=true"],
        ["dataset.do_test=false"],
        ("do_test=True",),
        fix_says=("dataset.do_test=false",),
    ),
    Case(
        "LP-EN-017",
        "ENERGON",
        ["dataset.shuffle_buffer_size=0"],
        ["dataset.shuffle_buffer_size=100"],
        ("shuffle_buffer_size=0",),
        fix_says=("dataset.shuffle_buffer_size", ">= 1"),
    ),
    Case(
        "LP-EN-017",
        "ENERGON",
        ["dataset.path=' '"],
        ["dataset.path=/data/energon"],
        ("dataset.path is empty",),
        fix_says=("dataset.path",),
    ),
    Case(
        "LP-EN-017",
        "ENERGON",
        ["dataset.num_workers=-1"],
        ["dataset.num_workers=0"],
        ("num_workers=-1",),
        fix_says=("dataset.num_workers", ">= 0"),
    ),
    # --- packed data (rules that also take the packed folder) ---
    Case(
        "LP-DATA-001",
        "SFT",
        [PCU, PTML],
        [PCU, PTML],
        ("no <N>_metadata.jsonl",),
        {"metadata_path": None},
        {},
        fix_says=("metadata file", "packed_metadata_path"),
    ),
    Case(
        "LP-DATA-002",
        "SFT",
        [],
        [],
        ("N=4096", "packed_sequence_size=8192"),
        {"pack_size": 4096},
        {},
        fix_says=("packed_sequence_size=8192", "dataset.offline_packing_specs.packed_sequence_size=4096"),
    ),
    Case(
        "LP-DATA-003",
        "SFT",
        ["dataset.offline_packing_specs.packed_sequence_size=16384"],
        [*seq(16384)],
        ("N=16384", "seq_length=8192"),
        {"pack_size": 16384},
        {"pack_size": 16384},
        fix_says=("N=8192",),
    ),
    Case(
        "LP-DATA-004",
        "SFT",
        [],
        [],
        ("3 of 400", "row 7 sequence 2 has 4094 tokens", "2*CP = 4"),
        {
            "misaligned_segments": 3,
            "segment_length_gcd": 2,
            "first_misaligned": SegmentExample(
                file="training_8192.idx.parquet", row=7, segment=2, runtime_length=4094
            ),
        },
        {},
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=4",),
    ),
    Case(
        "LP-DATA-004",
        "SFT",
        [],
        [],
        ("share only the factor 2",),
        {"checked_multiple": 1, "segment_length_gcd": 2},
        {"checked_multiple": 1, "segment_length_gcd": 8},
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=4",),
    ),
    Case(
        "LP-DATA-010",
        "SFT",
        ["model.tensor_model_parallel_size=4"],
        ["model.tensor_model_parallel_size=4"],
        ("5 of 400 packed sequences are not a multiple of 8", "row 3 sequence 0 has 4092 tokens"),
        {
            "misaligned_by_multiple": {4: 0, 8: 5},
            "first_misaligned_by_multiple": {
                8: SegmentExample(file="training_8192.idx.parquet", row=3, segment=0, runtime_length=4092)
            },
        },
        {"misaligned_by_multiple": {4: 0, 8: 0}},
        fix_says=("pad_seq_to_mult=8",),
    ),
    Case(
        "LP-DATA-005",
        "SFT",
        [],
        [],
        ("2 packed rows", "N=8192", "max 8200"),
        {"rows_over_pack_size": 2, "max_row_runtime_tokens": 8200},
        {},
        fix_says=("never exceed the pack size",),
    ),
    Case(
        "LP-DATA-006",
        "SFT",
        [PTML],
        [PTML],
        ("N=8190", "multiple of 4"),
        {"pack_size": 8190},
        {"pack_size": 8192},
        fix_says=("multiple of 4",),
    ),
    Case(
        "LP-DATA-007",
        "SFT",
        NO_OFFLINE,
        [],
        ("does not enable offline packing",),
        {},
        {},
        fix_says=("dataset.enable_offline_packing=true", "packed_sequence_size=8192"),
    ),
    Case(
        "LP-DATA-008",
        "SFT",
        [*NO_OFFLINE, "train.micro_batch_size=2", "train.global_batch_size=16"],
        [*NO_OFFLINE, "train.micro_batch_size=1", "train.global_batch_size=16"],
        ("micro_batch_size=2",),
        {},
        {},
        fix_says=("train.micro_batch_size=1",),
    ),
    Case(
        "LP-DATA-009",
        "SFT",
        [],
        [],
        ("pad_seq_to_mult=2", "another topology"),
        {"recorded_pad_seq_to_mult": 2},
        {},
        fix_says=("pad_seq_to_mult=4",),
    ),
    Case(
        "LP-DATA-011",
        "SFT",
        ["dataset.offline_packing_specs.pad_seq_to_mult=1"],
        ["dataset.offline_packing_specs.pad_seq_to_mult=8"],
        ("packed with pad_seq_to_mult=8", "pad_seq_to_mult=1"),
        {"recorded_pad_seq_to_mult": 8},
        {"recorded_pad_seq_to_mult": 8},
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=8",),
    ),
    Case(
        "LP-DATA-012",
        "SFT",
        [],
        [],
        ("training: row 3 holds more than pack_size=8192",),
        {"problems": ("training: row 3 holds more than pack_size=8192 runtime tokens",), "verified": True},
        {"problems": (), "verified": True},
        fix_says=("repack into a fresh folder",),
    ),
    Case(
        "LP-DATA-013",
        "SFT",
        [
            "++dataset.offline_packing_specs.packed_train_data_path=/nonexistent/longpack/training_8192.idx.parquet"
        ],
        [],
        (
            "packed_train_data_path=/nonexistent/longpack/training_8192.idx.parquet names no file",
            "FileNotFoundError",
        ),
        fix_says=("dataset.offline_packing_specs.packed_train_data_path",),
    ),
    Case(
        "LP-DATA-014",
        "SFT",
        ["train.global_batch_size=128"],
        ["train.global_batch_size=64"],
        ("balanced for GBS=64", "train.global_batch_size=128"),
        {"balanced_for": {"dp": 4, "gbs": 64}},
        {"balanced_for": {"dp": 4, "gbs": 64}},
        fix_says=("train.global_batch_size=64",),
    ),
]

HCP = ["model.hybrid_context_parallel=true"]
CAP = "model.max_seqlen_per_dp_cp_rank"
SCHED = ["model.sequence_packing_scheduler=dp_balanced"]
DCP = ["model.dynamic_context_parallel=true", "model.max_seqlen_per_dp_cp_rank=4096"]
CASES += [
    Case(
        "LP-VER-001",
        "SFT",
        ["model.hybrid_context_parallel=false"],
        ["model.context_parallel_size=2"],
        ("model.hybrid_context_parallel is set", "Megatron-Core 0.15.3", ">= 0.16.0"),
        fix_says=("drop model.hybrid_context_parallel",),
        mcore="0.15.3",
    ),
    Case(
        "LP-CP-010",
        "SFT",
        ["+model.cp_partition_mode=contiguous"],
        ["+model.cp_partition_mode=zigzag"],
        ("no sequence_packing_scheduler", "only does zigzag"),
        fix_says=("model.cp_partition_mode=zigzag",),
        mcore="dev",
    ),
    Case(
        "LP-CP-010",
        "SFT",
        ["+model.cp_partition_mode=striped"],
        ["+model.cp_partition_mode=zigzag"],
        ("'striped' is not one of zigzag, contiguous",),
        fix_says=("model.cp_partition_mode=zigzag",),
        mcore="dev",
    ),
    Case(
        "LP-CP-011",
        "PRETRAIN",
        ["+dataset.inter_document_masking=true"],
        ["+dataset.inter_document_masking=true", "model.context_parallel_size=1"],
        ("inter_document_masking with CP=2", "2*CP = 4"),
        fix_says=("dataset.inter_document_masking=false",),
    ),
    Case(
        "LP-PACK-018",
        "SFT",
        ["+model.fp8=e4m3", "+model.fp8_recipe=mxfp8"],
        ["+model.fp8=e4m3", "+model.fp8_recipe=mxfp8", "dataset.offline_packing_specs.pad_seq_to_mult=128"],
        ("MXFP8", "padded to 128", "32 * CP=2 * TP=2 (SP)"),
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=128",),
    ),
    Case(
        "LP-PACK-018",
        "SFT",
        [
            "+model.fp8=e4m3",
            "+model.fp8_recipe=mxfp8",
            "+dataset.dataset_kwargs.pad_to_max_length=true",
            "dataset.offline_packing_specs.packed_sequence_size=8100",
            "model.seq_length=8100",
            "dataset.seq_length=8100",
        ],
        ["+model.fp8=e4m3", "+model.fp8_recipe=mxfp8", "+dataset.dataset_kwargs.pad_to_max_length=true"],
        ("fixed-width packed rows of 8100 tokens", "a multiple of 128"),
        fix_says=("dataset.offline_packing_specs.packed_sequence_size=8192",),
    ),
    Case(
        "LP-VER-002",
        "SFT",
        ["+model.dynamic_context_paralel=true"],
        ["+model.dynamic_context_parallel=false"],
        (
            "model.dynamic_context_paralel is a key no known",
            "nearest known key is model.dynamic_context_parallel",
        ),
        fix_says=("rename model.dynamic_context_paralel to model.dynamic_context_parallel",),
        mcore="dev",
    ),
    Case(
        "LP-GBP-001",
        "SFT",
        [*DCP, "model.sequence_packing_scheduler=default_dynamic_cp"],
        [
            *DCP,
            "model.sequence_packing_scheduler=default_dynamic_cp",
            "+dataset.enable_global_batch_packing=true",
        ],
        ("without dataset.enable_global_batch_packing", ">= 0.7.0"),
        fix_says=("dataset.enable_global_batch_packing=true",),
        bridge="0.7.0",
        mcore="dev",
    ),
    Case(
        "LP-DCP-001",
        "SFT",
        [*DCP, "model.hybrid_context_parallel=true"],
        DCP,
        ("both set",),
        fix_says=("drop model.hybrid_context_parallel",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-002",
        "SFT",
        [*DCP, "model.sequence_packing_scheduler=dp_balanced"],
        [*DCP, "model.sequence_packing_scheduler=default_dynamic_cp"],
        ("requires sequence_packing_scheduler=default_dynamic_cp",),
        fix_says=("model.sequence_packing_scheduler=default_dynamic_cp",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-003",
        "SFT",
        [*DCP, "+model.min_dynamic_context_parallel_size=16"],
        [*DCP, "+model.min_dynamic_context_parallel_size=1"],
        ("min_dynamic_context_parallel_size=16", "DP*CP = 4*2 = 8"),
        fix_says=("model.min_dynamic_context_parallel_size=1",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-003",
        "SFT",
        [*DCP, "+model.min_dynamic_context_parallel_size=0"],
        [*DCP, "+model.min_dynamic_context_parallel_size=2"],
        ("must be >= 1",),
        fix_says=("model.min_dynamic_context_parallel_size=1",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-004",
        "SFT",
        [*DCP, "+model.pad_packed_seq_alignment=8192"],
        [*DCP, "+model.pad_packed_seq_alignment=128"],
        ("at most max_seqlen_per_dp_cp_rank=4096",),
        fix_says=("model.pad_packed_seq_alignment",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-004",
        "SFT",
        ["+model.pad_packed_seq_alignment=max"],
        ["+model.pad_packed_seq_alignment=max", "model.max_seqlen_per_dp_cp_rank=4096"],
        ("without max_seqlen_per_dp_cp_rank",),
        fix_says=("model.max_seqlen_per_dp_cp_rank",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-005",
        "SFT",
        [*DCP, "model.cuda_graph_impl=transformer_engine", "+model.thd_max_packed_sequences=64"],
        [
            *DCP,
            "model.cuda_graph_impl=transformer_engine",
            "+model.pad_packed_seq_alignment=max",
            "+model.thd_max_packed_sequences=64",
        ],
        ("THD CUDA graphs need 'max'",),
        fix_says=("model.pad_packed_seq_alignment=max",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-005",
        "SFT",
        [*DCP, "model.cuda_graph_impl=transformer_engine", "+model.pad_packed_seq_alignment=max"],
        [
            *DCP,
            "model.cuda_graph_impl=transformer_engine",
            "+model.pad_packed_seq_alignment=max",
            "+model.thd_max_packed_sequences=64",
        ],
        ("no thd_max_packed_sequences", "fixed number of sequences per pack"),
        fix_says=("model.thd_max_packed_sequences",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-006",
        "SFT",
        ["model.hybrid_context_parallel=true", "model.max_seqlen_per_dp_cp_rank=4096"],
        DCP,
        ("deprecated",),
        fix_says=("rename model.hybrid_context_parallel to model.dynamic_context_parallel",),
        mcore="dev",
    ),
    Case(
        "LP-DCP-007",
        "SFT",
        [*DCP, "+model.min_dynamic_context_parallel_size=3"],
        [*DCP, "+model.min_dynamic_context_parallel_size=4"],
        ("min_dynamic_context_parallel_size=3 is not a power of two", "start at 4"),
        fix_says=("model.min_dynamic_context_parallel_size=2",),
        bridge="0.7.0",
        mcore="dev",
    ),
    Case(
        "LP-DCP-008",
        "SFT",
        [*DCP, "+dist.use_decentralized_pg=true"],
        [*DCP, "+dist.use_decentralized_pg=false"],
        ("model.dynamic_context_parallel with dist.use_decentralized_pg=true",),
        fix_says=("dist.use_decentralized_pg=false",),
        bridge="0.7.0",
        mcore="dev",
    ),
    Case(
        "LP-HCP-001",
        "SFT",
        [*HCP, f"{CAP}=4096", "model.pipeline_model_parallel_size=2"],
        [*HCP, f"{CAP}=4096"],
        ("pipeline_model_parallel_size=2",),
        fix_says=("model.pipeline_model_parallel_size=1",),
    ),
    Case(
        "LP-HCP-002",
        "SFT",
        [*HCP, f"{CAP}=4096", "model.cuda_graph_impl=transformer_engine"],
        [*HCP, f"{CAP}=4096"],
        ("cuda_graph_impl=transformer_engine",),
        fix_says=("model.cuda_graph_impl=none",),
    ),
    Case(
        "LP-HCP-003",
        "SFT",
        [*HCP, f"{CAP}=4096", "model.calculate_per_token_loss=false"],
        [*HCP, f"{CAP}=4096"],
        ("calculate_per_token_loss",),
        fix_says=("model.calculate_per_token_loss=true",),
    ),
    Case(
        "LP-HCP-004",
        "SFT",
        [*HCP, f"{CAP}=4096", "+ddp.use_megatron_fsdp=true"],
        [*HCP, f"{CAP}=4096", "+ddp.use_megatron_fsdp=false"],
        ("Megatron FSDP",),
        fix_says=("ddp.use_megatron_fsdp=false",),
    ),
    Case(
        "LP-HCP-004",
        "SFT",
        [*HCP, f"{CAP}=4096", "dataset.dataloader_type=batch"],
        [*HCP, f"{CAP}=4096", "dataset.dataloader_type=single"],
        ("dataloader_type='batch'",),
        fix_says=("dataset.dataloader_type=single",),
    ),
    Case(
        "LP-HCP-005",
        "SFT",
        HCP,
        [*HCP, f"{CAP}=4096"],
        ("hybrid_context_parallel", "max_seqlen_per_dp_cp_rank"),
        fix_says=(f"{CAP}=4096",),
    ),
    Case(
        "LP-HCP-005",
        "SFT",
        SCHED,
        [*SCHED, f"{CAP}=4096"],
        ("sequence_packing_scheduler",),
        fix_says=(f"{CAP}=4096",),
    ),
    Case(
        "LP-HCP-006",
        "SFT",
        [*HCP, f"{CAP}=128"],
        [*HCP, f"{CAP}=1024", "dataset.offline_packing_specs.pad_seq_to_mult=16"],
        ("needs 64 ranks", "DP*CP = 4*2 = 8"),
        fix_says=(f"{CAP}>=1024",),
    ),
    Case(
        "LP-HCP-007",
        "SFT",
        [*HCP, f"{CAP}=8192"],
        [*HCP, f"{CAP}=4096"],
        (">= the pack width 8192",),
        fix_says=(f"{CAP}=4096",),
    ),
    Case(
        "LP-HCP-007",
        "SFT",
        [*HCP, f"{CAP}=1024", "dataset.offline_packing_specs.pad_seq_to_mult=16"],
        [*HCP, f"{CAP}=4096"],
        ("spread over 8 ranks",),
        fix_says=(f"{CAP}=4096",),
    ),
    Case(
        "LP-HCP-008",
        "SFT",
        [*HCP, f"{CAP}=2048"],
        [*HCP, f"{CAP}=2048", "dataset.offline_packing_specs.pad_seq_to_mult=8"],
        ("pad_seq_to_mult=4", "goes to 4 ranks", "8 equal chunks"),
        fix_says=("dataset.offline_packing_specs.pad_seq_to_mult=8",),
    ),
    Case(
        "LP-HCP-010",
        "SFT",
        [*HCP, f"{CAP}=4096", "model.context_parallel_size=1", "longpack.world_size=6"],
        [*HCP, f"{CAP}=4096", "model.context_parallel_size=1", "longpack.world_size=8"],
        ("DP*CP = 3*1 = 3 ranks", "even number of ranks"),
        fix_says=("longpack.world_size", "model.hybrid_context_parallel=false"),
    ),
    Case(
        "LP-HCP-009",
        "SFT",
        [*HCP, f"{CAP}=4096"],
        [f"{CAP}=4096"],
        ("model.hybrid_context_parallel set in a Megatron-Bridge config", "static CP"),
        fix_says=("pretrain_gpt.py",),
    ),
    Case(
        "LP-SCHED-001",
        "SFT",
        ["model.sequence_packing_scheduler=greedy", f"{CAP}=4096"],
        [*SCHED, f"{CAP}=4096"],
        ("'greedy'",),
        fix_says=("model.sequence_packing_scheduler=dp_balanced",),
    ),
    Case(
        "LP-SCHED-002",
        "SFT",
        [*SCHED, f"{CAP}=1024"],
        [*SCHED, f"{CAP}=4096"],
        ("up to 8192 tokens", "1024*2 = 2048"),
        fix_says=(f"{CAP}>=4096",),
    ),
    Case(
        "LP-SCHED-003",
        "SFT",
        [*SCHED, f"{CAP}=4096", "train.global_batch_size=2"],
        [*SCHED, f"{CAP}=4096"],
        ("global_batch_size=2", "DP=4"),
        fix_says=("train.global_batch_size>=4",),
    ),
    Case(
        "LP-MOE-005",
        "MOE",
        HYBRIDEP,
        [*HYBRIDEP, "model.moe_hybridep_pad_uneven_dispatch_inputs=true"],
        ("different token counts",),
        fix_says=("model.moe_hybridep_pad_uneven_dispatch_inputs=true",),
        bridge="0.5.1",
        mcore="0.19.0",
    ),
    Case(
        "LP-MOE-006",
        "MOE",
        HYBRIDEP,
        [*HYBRIDEP, PTML],
        ("without uneven-input padding",),
        fix_says=(PTML, "0.19.0"),
        mcore="0.18.2",
    ),
    Case(
        "LP-MOE-007",
        "MOE",
        [
            *HYBRIDEP,
            PTML,
            PCU,
            "model.cuda_graph_impl=transformer_engine",
            "model.moe_hybridep_pad_uneven_dispatch_inputs=true",
        ],
        [
            *HYBRIDEP,
            PTML,
            PCU,
            "model.cuda_graph_impl=transformer_engine",
            "model.moe_hybridep_pad_uneven_dispatch_inputs=false",
        ],
        ("not capture-safe",),
        fix_says=("model.moe_hybridep_pad_uneven_dispatch_inputs=false",),
    ),
    Case(
        "LP-MOE-008",
        "MOE",
        [PTML],
        ["dataset.offline_packing_specs.pad_seq_to_mult=1"],
        ("counts it in the load-balancing loss",),
        fix_says=("pad_to_max_length=false",),
        bridge="0.6.0",
    ),
    Case(
        "LP-MOE-009",
        "MOE",
        ["model.moe_router_load_balancing_type=quantile_balancing"],
        ["model.moe_router_load_balancing_type=aux_loss"],
        ("quantile_balancing with packed batches",),
        fix_says=("model.moe_router_load_balancing_type",),
    ),
    Case(
        "LP-CG-006",
        "SFT",
        [PTML, PCU, "model.cuda_graph_impl=transformer_engine"],
        [PTML, PCU],
        ("CP=2", "before 0.19.0"),
        fix_says=("model.cuda_graph_impl=none", ">= 0.19.0"),
        mcore="0.18.2",
    ),
    Case(
        "LP-CG-007",
        "SFT",
        ["model.cuda_graph_impl=local", "model.cuda_graph_scope=[attn]"],
        ["model.cuda_graph_impl=local", "model.cuda_graph_scope=[full_iteration]"],
        ('cuda_graph_impl="local" with scopes', "attn"),
        fix_says=('model.cuda_graph_impl="transformer_engine"',),
    ),
    Case(
        "LP-CP-009",
        "SFT",
        [],
        ["model.context_parallel_size=1", "dataset.offline_packing_specs.pad_seq_to_mult=2"],
        ("CP=2", "before 0.18.0"),
        fix_says=(">= 0.18.0",),
        mcore="0.17.1",
    ),
    Case(
        "LP-EN-002",
        "ENERGON",
        ["~dataset.packing_buffer_size", "dataset.micro_batch_size=2"],
        ["~dataset.packing_buffer_size"],
        ("dataset.micro_batch_size=2 differs",),
        fix_says=("dataset.micro_batch_size=1",),
    ),
]


# Severities as designed, written out here rather than read from the registry: run_rules copies the
# registry's severity into each finding, so comparing with the registry could never fail.
ERRORS = """
LP-CFG-001 LP-TOPO-001 LP-TOPO-002 LP-TOPO-003 LP-TOPO-004 LP-TOPO-005 LP-SP-001 LP-PP-001 LP-PP-002
LP-PP-003 LP-PP-004 LP-PP-005 LP-PP-006 LP-CP-001 LP-CP-002 LP-CP-003 LP-CP-004 LP-CP-005 LP-CP-006
LP-CP-007 LP-SEQ-001 LP-BATCH-001 LP-BATCH-002 LP-BATCH-003 LP-PACK-001 LP-PACK-002 LP-PACK-003
LP-PACK-004 LP-PACK-005 LP-PACK-006 LP-PACK-007 LP-PACK-008 LP-PACK-011 LP-PACK-012 LP-PACK-013
LP-PACK-015 LP-PACK-017 LP-PACK-019 LP-CG-001 LP-CG-002 LP-CG-003 LP-CG-004 LP-EN-001 LP-EN-002 LP-EN-003 LP-EN-004
LP-EN-005 LP-EN-006 LP-EN-007 LP-EN-008 LP-EN-010 LP-EN-011 LP-EN-012 LP-EN-013 LP-EN-014 LP-EN-016
LP-DATA-012 LP-DATA-013 LP-DATA-014
LP-EN-017 LP-VLM-001 LP-VLM-002 LP-MOE-001 LP-MOE-002 LP-MOE-003 LP-MODEL-001 LP-MODEL-002 LP-MODEL-003 LP-MODEL-004 LP-DATA-001
LP-DATA-002 LP-DATA-004 LP-DATA-005 LP-DATA-006 LP-DATA-008 LP-DATA-011 LP-VER-001 LP-HCP-001 LP-HCP-002
LP-HCP-003 LP-HCP-004 LP-HCP-005 LP-HCP-006 LP-HCP-008 LP-HCP-010 LP-SCHED-001 LP-SCHED-002 LP-SCHED-003 LP-MOE-005
LP-CP-010 LP-CP-011 LP-PACK-018 LP-VER-002 LP-GBP-001 LP-DCP-001 LP-DCP-002 LP-DCP-003 LP-DCP-004 LP-DCP-005 LP-DCP-007 LP-DCP-008
LP-MOE-006 LP-MOE-007 LP-MOE-009 LP-CG-006 LP-CG-007 LP-CP-009 LP-TOPO-007
"""
WARNINGS = """
LP-TOPO-006 LP-PACK-016 LP-PACK-010 LP-CG-005 LP-EN-009 LP-VLM-003 LP-VLM-004 LP-MOE-004 LP-DATA-003 LP-DATA-010 LP-DATA-007
LP-DATA-009 LP-HCP-007 LP-HCP-009 LP-MOE-008 LP-MTP-001 LP-DCP-006
"""
INFOS = "LP-CFG-002 LP-CFG-003 LP-CP-008 LP-PACK-009 LP-PACK-014 LP-EN-015"
EXPECTED_SEVERITY = {
    rule_id: severity
    for severity, ids in (("error", ERRORS), ("warning", WARNINGS), ("info", INFOS))
    for rule_id in ids.split()
}

# Config keys quoted in fixes: each must be one longpack reads (a typo would send users to a dead key).
KEY_RE = re.compile(
    r"(?<![\w/])(?:model|train|validation|dataset|ddp|dist|rerun_state_machine|comm_overlap|dist_train|longpack)"
    r"(?:\.[A-Za-z_]+)+(?![\w/])"
)


def _keys_named(text: str) -> list[str]:
    return KEY_RE.findall(text)


def _is_read(key: str) -> bool:
    # inside a mapping kept whole (dataset.dataset_kwargs.*) any key is the dataset's own
    return key in declared_keys() or any(key.startswith(k + ".") for k in DECLARED.leaves)


@pytest.mark.parametrize("base", sorted(BASES))
def test_every_base_config_is_clean(base: str) -> None:
    assert findings_of(base) == []


def test_every_rule_has_a_case_and_an_expected_severity() -> None:
    assert {c.rule_id for c in CASES} == set(RULES.ids()) == set(EXPECTED_SEVERITY)
    assert all(c.fix_says for c in CASES)


def test_registry_severities_are_the_designed_ones() -> None:
    assert {r.id: r.severity.value for r in RULES} == EXPECTED_SEVERITY


@pytest.mark.parametrize("rule", list(RULES), ids=RULES.ids())
def test_rule_records_document_the_rule(rule) -> None:
    assert rule.description and rule.title and rule.source and rule.fix
    assert rule.family in {f.name for f in RULES.families}
    for key in _keys_named(rule.fix):
        assert _is_read(key), f"{rule.id} fix names {key!r}, which no rule reads"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule_id}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_and_nearest_config_passes(case: Case) -> None:
    packed_fail = None if case.packed_fail is None else packed_summary(**case.packed_fail)
    packed_fix = None if case.packed_fix is None else packed_summary(**case.packed_fix)
    versions = {"bridge": case.bridge, "mcore": case.mcore}
    fired = [
        f for f in findings_of(case.base, case.fail, packed_fail, **versions) if f.rule_id == case.rule_id
    ]
    assert fired, f"{case.rule_id} did not fire for {case.fail}"
    finding = fired[0]
    assert finding.severity.value == EXPECTED_SEVERITY[case.rule_id]
    for text in case.says:
        assert text in finding.message, f"{text!r} not in {finding.message!r}"
    for text in case.fix_says:
        assert text in finding.fix, f"{text!r} not in fix {finding.fix!r}"
    for key in _keys_named(finding.fix):
        assert _is_read(key) or case.rule_id == "LP-VER-002", f"fix names {key!r}, which no rule reads"
    for key in finding.keys:  # the keys a finding points at are where its file:line comes from
        # (LP-VER-002 points at the misspelled key: by definition one nothing reads)
        assert _is_read(key) or case.rule_id == "LP-VER-002", (
            f"finding points at {key!r}, which no rule reads"
        )
    passing = findings_of(case.base, case.fix, packed_fix, **versions)
    assert case.rule_id not in [f.rule_id for f in passing], passing
