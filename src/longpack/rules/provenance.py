"""Every rule's Megatron-Bridge / Megatron-Core version ranges and upstream sources, in one table.

Each entry names the ranges a rule applies to (:class:`~longpack.rules.versions.VersionRange`; open ends
are ``None``, ``"main"`` is the unreleased development branch) and its sources: repository, file, the
commit that introduced the check (``git log -S <probe>``, oldest first) and ``probe``, a literal the
file holds in every release where the source is in force. A source marked ``relaxes`` is the change
that ended the rule: its probe appears in the first release the rule no longer covers.
``scripts/rules_drift.py ranges`` recomputes each probe's range at every release tag and reports
disagreements; a probe is given only where it defines the range (documentation prose and hazards that
Bridge began to refuse later carry the commit alone: the problem they guard against is older).

The rules' own ``source`` strings say the same in words; this table is what ``longpack check`` uses.

>>> PROVENANCE["LP-HCP-001"].mcore.text, PROVENANCE["LP-HCP-001"].sources[0].commit
('>= 0.16.0, < dev', '98d8c56dbd')
>>> PROVENANCE["LP-MOE-005"].ranges_text()
'Megatron-Bridge < 0.6.0; Megatron-Core >= 0.19.0 (not dev)'
"""

from __future__ import annotations

# Megatron-Core dev (d48bd6be0a) lacks main's HybridEP uneven-dispatch padding, the THD-graph
# pad_between_seqs fix and quantile routing (rules_drift ranges): dev=True / dev=False below say so.
from longpack.rules.checks.family import GDN_CP_SINCE
from longpack.rules.registry import Provenance, Source
from longpack.rules.scheduling_keys import GLOBAL_BATCH_PACKING_SINCE, GPT_SFT_IN_BATCH_SINCE
from longpack.rules.versions import PRODUCTS, VersionRange

BRIDGE_REPO = PRODUCTS["bridge"].repo
MLM_REPO = PRODUCTS["mcore"].repo
LONGPACK = Source("longpack")

PROVENANCE: dict[str, Provenance] = {
    "LP-CFG-001": Provenance(sources=(LONGPACK,)),
    "LP-CFG-002": Provenance(sources=(LONGPACK,)),
    "LP-CFG-003": Provenance(sources=(LONGPACK,)),
    "LP-TOPO-001": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/parallel_state.py",
                commit="4003d70f18",
                probe="is not divisible by {model_size}",
            ),
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="958fb9b7d",
                probe="is not divisible by total_model_size",
            ),
        )
    ),
    "LP-TOPO-002": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/parallel_state.py",
                commit="7f22e210cd",
                probe="is not divisible by expert_tensor_model_pipeline_parallel size",
            ),
        )
    ),
    "LP-TOPO-003": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="7ab6a29f12",
                probe="num_moe_experts must be non None to use expert-parallel",
            ),
        )
    ),
    "LP-TOPO-004": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="6dd0c7bd71",
                probe="num_attention_heads ({self.num_attention_heads}) must be a multiple of",
            ),
        )
    ),
    "LP-TOPO-005": Provenance(
        mcore=VersionRange(until="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="6dd0c7bd71",
                probe='num_query_groups ({self.num_query_groups}) must be a multiple of "',
            ),
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="f7dfb99795",
                probe="must be a multiple or divisor of",
                relaxes=True,
            ),
        ),
    ),
    "LP-TOPO-007": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="f7dfb99795",
                probe="must be a multiple or divisor of",
            ),
        ),
    ),
    "LP-TOPO-006": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="e1993fa6f7",
                probe="Disabling sequence parallelism because tensor model parallelism is disabled",
            ),
        )
    ),
    "LP-SP-001": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/tensor_parallel/mappings.py",
                commit="c2ea914f7d",
                probe="First dimension of the tensor should be divisible by tensor parallel size",
            ),
        )
    ),
    "LP-PP-001": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="c0665e01cd",
                probe="number of middle layers: {num_layers} must be divisible by ",
            ),
        )
    ),
    "LP-PP-002": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/pipeline_parallel_layer_layout.py",
                commit="77732c3628",
                probe="class PipelineParallelLayerLayout",
            ),
        )
    ),
    "LP-PP-003": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="ef490839e8",
                probe="number of layers at middle stage: {num_layers} must be divisible by",
            ),
        )
    ),
    "LP-PP-004": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="ef490839e8",
                probe="account_for_loss_in_pipeline_split) must be divisible by",
            ),
        )
    ),
    "LP-PP-005": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="ef490839e8",
                probe="num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be",
            ),
        )
    ),
    "LP-PP-006": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/parallel_state.py",
                commit="3ee489d9ea",
                probe="pipeline-model-parallel size should be greater than 1 with interleaved schedule",
            ),
        )
    ),
    "LP-CP-001": Provenance(
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="159ddad31",
                probe="Sequence length must be divisible by 2 * context parallel size",
            ),
        )
    ),
    "LP-CP-002": Provenance(
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="159ddad31",
                probe="When finetuning with CP>1, calculate_per_token_loss must be True",
            ),
        )
    ),
    "LP-CP-003": Provenance(
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="159ddad31",
                probe="When finetuning with CP>1, average_in_collective must be False",
            ),
        )
    ),
    "LP-CP-004": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/extensions/transformer_engine.py",
                commit="645c329d07",
                probe='cp_comm_type == "a2a+p2p"',
            ),
        )
    ),
    "LP-CP-005": Provenance(
        sources=(Source(BRIDGE_REPO, "src/megatron/bridge/training/config.py", commit="91c39a0da"),)
    ),
    "LP-CP-006": Provenance(
        sources=(Source(BRIDGE_REPO, "src/megatron/bridge/training/config.py", commit="91c39a0da"),)
    ),
    "LP-CP-007": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="e577829e1",
                probe="must be divisible by the CP/SP collate padding multiple",
            ),
        ),
    ),
    "LP-CP-008": Provenance(sources=(LONGPACK,)),
    "LP-CP-009": Provenance(
        bridge=VersionRange(since="0.6.0"),
        mcore=VersionRange(until="0.18.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/utils/packed_seq_utils.py",
                commit="b5d121c54",
                probe="THD context-parallel partitioning requires Megatron-Core >= 0.18.0",
            ),
            Source(
                MLM_REPO,
                "megatron/core/utils.py",
                commit="5e4fc931ba",
                probe="is_hybrid_cp: bool",
                relaxes=True,
            ),
        ),
    ),
    "LP-SEQ-001": Provenance(
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="958fb9b7d",
                probe="Please ensure sequence length configuration in model config",
            ),
        )
    ),
    "LP-BATCH-001": Provenance(
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/samplers.py",
                commit="ddf3fb03b",
                probe="`global_batch_size` ({self._global_batch_size}) is not divisible by",
            ),
            Source(
                MLM_REPO,
                "megatron/core/num_microbatches_calculator.py",
                commit="ef6600903b",
                probe="is not divisible by micro batch size",
            ),
        )
    ),
    "LP-BATCH-002": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-BATCH-003": Provenance(
        # configurable eval batch sizes (validation.eval_*) arrived in 0.5.0
        bridge=VersionRange(since="0.5.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="6c78fba79",
                probe="eval_global_batch_size % eval_dp_product == 0",
            ),
        ),
    ),
    "LP-PACK-001": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="814ad79af",
                probe="enable_offline_packing and enable_in_batch_packing are mutually exclusive",
            ),
        ),
    ),
    "LP-PACK-002": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="814ad79af",
                probe="offline_packing_specs must be set when enable_offline_packing=True",
            ),
        ),
    ),
    "LP-PACK-003": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="814ad79af",
                probe="enable_offline_packing must be True when offline_packing_specs is set",
            ),
        ),
    ),
    "LP-PACK-004": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="814ad79af",
                probe="packed_sequence_size must be greater than 0",
            ),
        ),
    ),
    "LP-PACK-005": Provenance(
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="958fb9b7d",
                probe="Micro batch size should be 1 when training with packed sequence",
            ),
        )
    ),
    "LP-PACK-006": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="814ad79af",
                probe="micro_batch_size should be greater than 1 when using enable_in_batch_packing",
            ),
        ),
    ),
    "LP-PACK-007": Provenance(
        # the dataset refused it in every release; ConfigContainer.validate refuses it up front from 0.6.0
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/datasets/sft.py",
                commit="958fb9b7d",
                probe="'pad_to_max_length=True' is required when pad_cu_seqlens is enabled",
            ),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/config.py", commit="e4cb868dc"),
        ),
    ),
    "LP-PACK-008": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-PACK-016": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    # pad_seq_to_mult above the pack: every sample pads past the pack (longpack's alignment arithmetic)
    "LP-PACK-017": Provenance(sources=(LONGPACK,)),
    "LP-PACK-009": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-PACK-010": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-PACK-011": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/packing/config.py",
                commit="e4cb868dc",
                probe="max_single_sequence_length cannot exceed packed_sequence_size",
            ),
        ),
    ),
    "LP-PACK-012": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-PACK-013": Provenance(
        sources=(
            Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),
            # the packer pads each runtime segment to pad_seq_to_mult, so a row already a multiple of
            # pad_seq_length_to_mult gets no trailing segment (GLM-5.2 recipes: p=32, q=16); this file
            # exists from 0.6.0 and explains the exemption, not the rule's range: no probe
            Source(BRIDGE_REPO, "src/megatron/bridge/data/packing/offline.py", commit="067f987df"),
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/packing/gpt_sft.py",
                commit="067f987df",
                probe="self._ceil_to_nearest(max_length, self.pad_seq_length_to_mult)",
            ),
        )
    ),
    "LP-PACK-014": Provenance(
        bridge=VersionRange(since="0.5.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="ebd55d7bc",
                probe="requires_fixed_seq_len",
            ),
        ),
    ),
    # GPT-SFT in-batch packing: Bridge PR #5493 (its branch at 84275f53b; not in main 067f987df, whose
    # GPTSFTDatasetConfig has no enable_in_batch_packing), assumed in the release after main
    "LP-PACK-015": Provenance(
        bridge=VersionRange(since=GPT_SFT_IN_BATCH_SINCE),
        sources=(Source(BRIDGE_REPO, "src/megatron/bridge/data/builders/gpt_sft.py", commit="84275f53b"),),
    ),
    "LP-PACK-019": Provenance(
        bridge=VersionRange(until=GPT_SFT_IN_BATCH_SINCE),
        sources=(
            Source(BRIDGE_REPO, "src/megatron/bridge/data/builders/gpt_sft.py", commit="067f987df"),
            Source(
                BRIDGE_REPO, "src/megatron/bridge/data/builders/gpt_sft.py", commit="84275f53b", relaxes=True
            ),
        ),
    ),
    # Bridge main verifies MTP with offline packing (GLM-5.2 packed SFT, e4cb868dc): no longer a hazard there
    "LP-MTP-001": Provenance(
        bridge=VersionRange(until="main"),
        sources=(
            Source(BRIDGE_REPO, "docs/training/multi-token-prediction.md", commit="1e033749b"),
            Source(
                BRIDGE_REPO,
                "examples/model_verification_cards/glm5-2/card.yaml",
                commit="e4cb868dc",
                relaxes=True,
            ),
        ),
    ),
    "LP-CG-001": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="e4cb868dc",
                probe="Offline packing with CUDA graphs requires dataset pad_to_max_length=True",
            ),
        ),
    ),
    "LP-CG-002": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="e4cb868dc",
                probe="Packed attention CUDA graphs require offline_packing_specs.pad_cu_seqlens=True",
            ),
        ),
    ),
    "LP-CG-003": Provenance(
        bridge=VersionRange(since="0.3.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="b68dbe40a",
                probe="check_for_nan_in_loss must be disabled when using full_iteration CUDA graph",
            ),
        ),
    ),
    "LP-CG-004": Provenance(
        sources=(Source(BRIDGE_REPO, "src/megatron/bridge/training/gpt_step.py", commit="23743e2f7"),)
    ),
    "LP-CG-005": Provenance(sources=(LONGPACK,)),
    "LP-CG-006": Provenance(
        mcore=VersionRange(until="0.19.0", dev=True),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/packed_seq_params.py",
                commit="12c05a2d89",
                probe="pad_between_seqs: bool = None",
                relaxes=True,
            ),
            Source(MLM_REPO, "megatron/core/transformer/cuda_graphs.py", commit="d5a019accc"),
        ),
    ),
    "LP-CG-007": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/utils/cuda_graph.py",
                commit="7e8662c66",
                probe="full-iteration CUDA graphs{modules_msg}",
            ),
        ),
    ),
    "LP-EN-001": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Energon native sequence packing requires train.micro_batch_size=1",
            ),
        ),
    ),
    "LP-EN-002": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="8896e9027",
                probe="EnergonDatasetConfig.micro_batch_size must match train.micro_batch_size",
            ),
        ),
    ),
    "LP-EN-003": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Energon native sequence packing requires model.calculate_per_token_loss=True",
            ),
        ),
    ),
    "LP-EN-004": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Energon native sequence packing requires ddp.average_in_collective=False",
            ),
        ),
    ),
    "LP-EN-005": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Energon native sequence packing does not support MTP",
            ),
        ),
    ),
    "LP-EN-006": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Energon native sequence packing does not support CUDA graphs",
            ),
        ),
    ),
    "LP-EN-007": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Energon native sequence packing does not support Qwen3-VL DistTrain",
            ),
        ),
    ),
    "LP-EN-008": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Energon native sequence packing does not yet support pipeline parallelism",
            ),
        ),
    ),
    "LP-EN-009": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/config.py",
                commit="46d7e9f4f",
                probe="Disabling MoE expert-parallel communication overlap",
            ),
        ),
    ),
    "LP-EN-010": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/builders/energon.py",
                commit="46d7e9f4f",
                probe="packing_buffer_size and enable_in_batch_packing=True are mutually exclusive",
            ),
        ),
    ),
    "LP-EN-011": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/builders/energon.py",
                commit="46d7e9f4f",
                probe="incompatible with defer_in_batch_packing_to_step=True",
            ),
        ),
    ),
    "LP-EN-012": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/builders/energon.py",
                commit="8896e9027",
                probe="packing_buffer_size must be greater than 0 when set",
            ),
        ),
    ),
    "LP-EN-013": Provenance(
        bridge=VersionRange(since="main"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/builders/energon.py",
                commit="46d7e9f4f",
                probe="self.packing_buffer_size is not None and not isinstance(self.task_encoder, QwenVLEnergonTaskEncoderConfig)",
            ),
        ),
    ),
    "LP-EN-014": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/builders/energon.py",
                commit="8896e9027",
                probe="dataset_kwargs cannot override builder-owned arguments",
            ),
        ),
    ),
    "LP-EN-016": Provenance(
        sources=(Source(BRIDGE_REPO, "src/megatron/bridge/data/builders/energon.py", commit="8896e9027"),)
    ),
    "LP-EN-017": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/builders/energon.py",
                commit="8896e9027",
                probe="EnergonDatasetConfig.path must be set to a non-empty dataset path",
            ),
        ),
    ),
    "LP-EN-015": Provenance(
        bridge=VersionRange(since="main"),
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="46d7e9f4f"),),
    ),
    "LP-VLM-001": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/builders/energon.py",
                commit="8896e9027",
                probe='f"{field_name} must be greater than 0 when set."',
            ),
        ),
    ),
    "LP-VLM-002": Provenance(
        sources=(
            Source(
                "huggingface/transformers",
                "src/transformers/models/qwen2_vl/image_processing_qwen2_vl.py",
                commit="cb0fc56f3c",
            ),
        )
    ),
    "LP-VLM-003": Provenance(sources=(LONGPACK,)),
    "LP-VLM-004": Provenance(
        sources=(
            # where Bridge's Qwen-VL encoder takes part in Energon packing (main); the memory bound is
            # Energon's buffer and longpack's own encoders, in every version: no probe
            Source(BRIDGE_REPO, "src/megatron/bridge/models/qwen_vl/data/energon.py", commit="46d7e9f4f"),
            LONGPACK,
        )
    ),
    "LP-MOE-001": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="e8c22152ea",
                probe="if self.expert_model_parallel_size > 1 and self.tensor_model_parallel_size > 1:",
            ),
        )
    ),
    "LP-MOE-002": Provenance(
        # the docs page names a fixed combine chunk; the skill page beside it gives the 128
        sources=(
            Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),
            Source(BRIDGE_REPO, "skills/nemo-mbridge-perf-sequence-packing/SKILL.md", commit="6a33a2a95"),
        )
    ),
    "LP-MOE-003": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-MOE-004": Provenance(
        sources=(LONGPACK, Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="46d7e9f4f"))
    ),
    "LP-MOE-005": Provenance(
        bridge=VersionRange(until="0.6.0"),
        mcore=VersionRange(since="0.19.0", dev=False),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/moe/token_dispatcher.py",
                commit="81770cb015",
                probe="if self.config.moe_hybridep_pad_uneven_dispatch_inputs:",
            ),
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/models/transformer_config.py",
                commit="3ecb452af",
                probe="def _enable_safe_hybridep_dispatch",
                relaxes=True,
            ),
            Source(BRIDGE_REPO, "docs/parallelisms.md", commit="09907e74f"),
        ),
    ),
    "LP-MOE-006": Provenance(
        mcore=VersionRange(until="0.19.0", dev=True),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="81770cb015",
                probe="moe_hybridep_pad_uneven_dispatch_inputs: bool = False",
                relaxes=True,
            ),
        ),
    ),
    "LP-MOE-007": Provenance(
        bridge=VersionRange(since="0.6.0"),
        mcore=VersionRange(since="0.19.0", dev=False),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/moe/token_dispatcher.py",
                commit="81770cb015",
                probe="if self.config.moe_hybridep_pad_uneven_dispatch_inputs:",
            ),
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/models/transformer_config.py",
                commit="3ecb452af",
                probe="not capture-safe",
            ),
        ),
    ),
    "LP-MOE-008": Provenance(
        bridge=VersionRange(until="main"),
        sources=(
            # offline packs (#5470) and native Energon packs (#5285) carry a padding mask on main
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/packing/gpt_sft.py",
                commit="23743e2f7",
                probe='processed_batch["padding_mask"] = torch.BoolTensor(padding_masks)',
                relaxes=True,
            ),
            Source(
                BRIDGE_REPO,
                "docs/training/packed-sequences.md",
                commit="46d7e9f4f",
                probe="excludes fixed-width gaps",
                relaxes=True,
            ),
        ),
    ),
    "LP-MOE-009": Provenance(
        bridge=VersionRange(since="main"),
        mcore=VersionRange(since="0.19.0", dev=False),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/moe/router.py",
                commit="33706f968e",
                probe="Quantile balancing routing does not support padding masks yet.",
            ),
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/data/packing/gpt_sft.py",
                commit="23743e2f7",
                probe='processed_batch["padding_mask"] = torch.BoolTensor(padding_masks)',
            ),
        ),
    ),
    "LP-MODEL-001": Provenance(
        sources=(
            Source(BRIDGE_REPO, "src/megatron/bridge/recipes/qwen/h100/qwen3_next.py", commit="4d7ce7908"),
            Source(BRIDGE_REPO, "src/megatron/bridge/recipes/glm/h100/glm45.py", commit="e28e1ca37"),
        )
    ),
    "LP-MODEL-002": Provenance(
        sources=(
            Source(
                BRIDGE_REPO, "src/megatron/bridge/models/nemotron_vl/data/collate_fn.py", commit="59ae409f5"
            ),
        )
    ),
    "LP-MODEL-003": Provenance(
        sources=(
            Source(
                BRIDGE_REPO, "src/megatron/bridge/models/qwen_omni/data/collate_fn.py", commit="8896e9027"
            ),
        )
    ),
    "LP-MODEL-004": Provenance(
        mcore=VersionRange(until=GDN_CP_SINCE),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="20d66d5c7b",
                probe="Gated delta net does not support context parallel for now",
            ),
        ),
    ),
    "LP-DATA-001": Provenance(
        sources=(Source(BRIDGE_REPO, "src/megatron/bridge/data/packing/gpt_sft.py", commit="e577829e1"),)
    ),
    "LP-DATA-002": Provenance(sources=(LONGPACK,)),
    "LP-DATA-003": Provenance(sources=(LONGPACK,)),
    "LP-DATA-004": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-DATA-010": Provenance(
        sources=(Source(BRIDGE_REPO, "docs/training/packed-sequences.md", commit="6a33a2a95"),)
    ),
    "LP-DATA-005": Provenance(sources=(LONGPACK,)),
    "LP-DATA-006": Provenance(sources=(LONGPACK,)),
    "LP-DATA-007": Provenance(sources=(LONGPACK,)),
    "LP-DATA-008": Provenance(
        bridge=VersionRange(since="0.6.0"),
        sources=(
            Source(
                BRIDGE_REPO,
                "src/megatron/bridge/training/utils/packed_seq_utils.py",
                commit="e4cb868dc",
                probe="must contain exactly one value, got shape",
            ),
        ),
    ),
    "LP-DATA-009": Provenance(sources=(LONGPACK,)),
    "LP-DATA-011": Provenance(sources=(LONGPACK,)),
    # the same verification as `longpack inspect --verify` (longpack's own manifest, hashes and layout)
    "LP-DATA-012": Provenance(sources=(LONGPACK,)),
    # Bridge refuses a packed data path that does not exist when it resolves its packing config
    "LP-DATA-013": Provenance(
        sources=(
            LONGPACK,
            Source(BRIDGE_REPO, "src/megatron/bridge/data/packing/config.py", commit="e577829e1"),
        )
    ),
    # a --balance pack's order is only balanced for the topology it was made for (longpack's manifest)
    "LP-DATA-014": Provenance(sources=(LONGPACK,)),
    # Megatron-LM dev (d48bd6be0a) dropped the PP check for dynamic CP and allows THD CUDA graphs
    "LP-HCP-001": Provenance(
        mcore=VersionRange(since="0.16.0", until="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="98d8c56dbd",
                probe="Hybrid context parallelism not supported with pipeline parallelism",
            ),
        ),
    ),
    "LP-HCP-002": Provenance(
        mcore=VersionRange(since="0.16.0", until="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="98d8c56dbd",
                probe="Hybrid context parallelism not supported with CUDA Graph",
            ),
        ),
    ),
    # Megatron-Core dev (d48bd6be0a) keeps these checks under dynamic CP and rewords them ("Dynamic context
    # parallelism ..."): the probes are the words both spellings share, so rules_drift ranges sees them in dev
    "LP-HCP-003": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="98d8c56dbd",
                probe="context parallelism must be used with --calculate-per-token-loss",
            ),
        ),
    ),
    "LP-HCP-004": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="98d8c56dbd",
                probe="context parallelism not supported with Megatron FSDP",
            ),
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="98d8c56dbd",
                probe="context parallelism only supported with single dataloader type",
            ),
        ),
    ),
    "LP-HCP-005": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="98d8c56dbd",
                probe="Please set max_seqlen_per_dp_cp_rank",
            ),
        ),
    ),
    "LP-HCP-006": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/pipeline_parallel/hybrid_cp_schedule.py",
                commit="98d8c56dbd",
                probe="2 ** ceil(log2((seq_len / self.max_seq_len_per_rank)))",
            ),
        ),
    ),
    "LP-HCP-007": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="98d8c56dbd",
                probe="maximum sequence length / context parallel size",
            ),
        ),
    ),
    "LP-HCP-008": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/pipeline_parallel/hybrid_cp_schedule.py",
                commit="98d8c56dbd",
                probe="2 ** ceil(log2((seq_len / self.max_seq_len_per_rank)))",
            ),
        ),
    ),
    "LP-HCP-010": Provenance(
        mcore=VersionRange(since="0.16.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/parallel_state.py",
                commit="98d8c56dbd",
                probe="context parallel requires an even number of ranks",
            ),
        ),
    ),
    "LP-HCP-009": Provenance(
        bridge=VersionRange(until=GLOBAL_BATCH_PACKING_SINCE),
        sources=(
            Source(BRIDGE_REPO, "src/megatron/bridge/training/gpt_step.py", commit="92deeef43"),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/initialize.py", commit="bf8effe43"),
        ),
    ),
    "LP-SCHED-001": Provenance(
        mcore=VersionRange(since="main"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/datasets/data_schedule.py",
                commit="a9381be598",
                # main spells it DP_BALANCED = "dp_balanced"; dev registers "dp_balanced": DpBalancedScheduler
                probe='"dp_balanced"',
            ),
        ),
    ),
    "LP-SCHED-002": Provenance(
        mcore=VersionRange(since="main"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/datasets/data_schedule.py",
                commit="a9381be598",
                probe="self.max_seq_len_all_ranks = self.max_seqlen_per_dp_cp_rank * self.cp_size",
            ),
        ),
    ),
    "LP-SCHED-003": Provenance(
        mcore=VersionRange(since="main"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/datasets/data_schedule.py",
                commit="a9381be598",
                probe="Not enough samples to move",
            ),
        ),
    ),
    "LP-VER-002": Provenance(
        sources=(
            Source(BRIDGE_REPO, "src/megatron/bridge/training/config.py", commit="067f987df"),
            Source(MLM_REPO, "megatron/core/model_parallel_config.py", commit="d98e8a64dd"),
        )
    ),
    "LP-CP-010": Provenance(
        mcore=VersionRange(since="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="cae55c1f09",
                probe="cp_partition_mode='contiguous' with context parallelism requires THD",
            ),
        ),
    ),
    "LP-CP-011": Provenance(
        mcore=VersionRange(since="0.19.0"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/datasets/gpt_dataset.py",
                commit="f88b85f8c6",
                probe="inter_document_masking: bool = False",
            ),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/gpt_step.py", commit="067f987df"),
        ),
    ),
    "LP-PACK-018": Provenance(
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/fp8_utils.py",
                commit="92d68dae89",
                probe="def get_fp8_align_size(fp8_recipe: Fp8Recipe) -> int:",
            ),
        ),
    ),
    # global-batch packing: Megatron-Bridge PR #6127 (open on 2026-09-16, its branch at 7bdc5ef4ba; not in
    # main 067f987df)
    "LP-GBP-001": Provenance(
        bridge=VersionRange(since=GLOBAL_BATCH_PACKING_SINCE),
        sources=(
            Source(BRIDGE_REPO, "src/megatron/bridge/data/packing/global_batch.py", commit="7bdc5ef4ba"),
        ),
    ),
    # dynamic CP: Megatron-LM dev (read at d48bd6be0a)
    "LP-DCP-001": Provenance(
        mcore=VersionRange(since="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="cde56a4692",
                probe="Cannot set both hybrid_context_parallel and dynamic_context_parallel",
            ),
        ),
    ),
    "LP-DCP-002": Provenance(
        mcore=VersionRange(since="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="2d6e946bab",
                probe="sequence_packing_scheduler=default_dynamic_cp",
            ),
        ),
    ),
    "LP-DCP-003": Provenance(
        mcore=VersionRange(since="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="2d6e946bab",
                probe="min_dynamic_context_parallel_size must be >= 1",
            ),
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="2d6e946bab",
                probe="must be <= dp_size * cp_size",
            ),
        ),
    ),
    "LP-DCP-004": Provenance(
        mcore=VersionRange(since="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="7f9175207d",
                probe="pad_packed_seq_alignment must be 'max' or a positive integer",
            ),
        ),
    ),
    "LP-DCP-005": Provenance(
        mcore=VersionRange(since="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/training/arguments.py",
                commit="7f9175207d",
                probe="THD CUDA Graph requires --pad-packed-seq-alignment",
            ),
            Source(
                MLM_REPO,
                "megatron/core/transformer/transformer_config.py",
                commit="3ae5e6d9a6",
                probe="THD CUDA Graph requires --thd-max-packed-sequences to be set",
            ),
        ),
    ),
    "LP-DCP-006": Provenance(
        mcore=VersionRange(since="dev"),
        sources=(
            Source(
                MLM_REPO,
                "megatron/core/model_parallel_config.py",
                commit="cde56a4692",
                probe="hybrid_context_parallel is deprecated",
            ),
        ),
    ),
    # dynamic CP under global-batch packing: Megatron-Bridge's validation adds these to Megatron-Core's (its
    # docs page at 85b0c3de37 and the validation module of a branch of the same work at 736342b6cb; neither
    # in main 067f987df, so no probe: the range is the global-batch-packing assumption's)
    "LP-DCP-007": Provenance(
        bridge=VersionRange(since=GLOBAL_BATCH_PACKING_SINCE),
        mcore=VersionRange(since="dev"),
        sources=(
            Source(BRIDGE_REPO, "docs/training/dynamic-context-parallel.md", commit="85b0c3de37"),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/sequence_packing.py", commit="736342b6cb"),
            Source(MLM_REPO, "megatron/core/parallel_state.py", commit="d48bd6be0a"),
        ),
    ),
    "LP-DCP-008": Provenance(
        bridge=VersionRange(since=GLOBAL_BATCH_PACKING_SINCE),
        mcore=VersionRange(since="dev"),
        sources=(
            Source(BRIDGE_REPO, "docs/training/dynamic-context-parallel.md", commit="85b0c3de37"),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/sequence_packing.py", commit="736342b6cb"),
            Source(MLM_REPO, "megatron/core/parallel_state.py", commit="d48bd6be0a"),
        ),
    ),
    # where each key of longpack.rules.checks.upstream.KEYS_BY_VERSION appeared (or was renamed)
    "LP-VER-001": Provenance(
        sources=(
            Source(MLM_REPO, "megatron/core/model_parallel_config.py", commit="98d8c56dbd"),
            Source(MLM_REPO, "megatron/core/datasets/data_schedule.py", commit="a9381be598"),
            Source(MLM_REPO, "megatron/core/transformer/transformer_config.py", commit="81770cb015"),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/config.py", commit="b19f2e775"),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/config.py", commit="e577829e1"),
            Source(BRIDGE_REPO, "src/megatron/bridge/training/config.py", commit="814ad79af"),
        )
    ),
}
