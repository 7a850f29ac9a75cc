"""Every choice list of longpack's settings, in one module (pure constants), so each list is written once and every layer, the job configs and the CLI read the same tuple; the defaults sit next to
their lists. The layer that acts on a choice re-exports its list (``longpack.binpack.ALGORITHMS`` is
:data:`ALGORITHMS`).

>>> DEFAULT_ALGORITHM in ALGORITHMS and MEGATRON_ALGORITHM in ALGORITHMS, DEFAULT_OVERLENGTH
(True, 'drop')
"""

from __future__ import annotations

from typing import Final

#: Bin packing (``longpack.binpack.pack_lengths``). The three ``first_fit*`` reproduce Megatron-Bridge's
#: bins exactly; ``best_fit_decreasing`` packs tightest and is the default.
BEST_FIT_DECREASING: Final = "best_fit_decreasing"
FIRST_FIT: Final = "first_fit"
FIRST_FIT_DECREASING: Final = "first_fit_decreasing"
FIRST_FIT_SHUFFLE: Final = "first_fit_shuffle"
ALGORITHMS: tuple[str, ...] = (BEST_FIT_DECREASING, FIRST_FIT, FIRST_FIT_DECREASING, FIRST_FIT_SHUFFLE)
DEFAULT_ALGORITHM = BEST_FIT_DECREASING
#: Megatron-Bridge's packing algorithms (``create_packing_strategy``'s names, ``longpack.binpack.megatron``).
MEGATRON_ALGORITHMS: tuple[str, ...] = (FIRST_FIT, FIRST_FIT_DECREASING, FIRST_FIT_SHUFFLE)
#: Megatron-Bridge's prepare step packs with this one (``--compat megatron-bridge``).
MEGATRON_ALGORITHM = FIRST_FIT_SHUFFLE
#: Workload-balanced rows for a training topology: chosen by a balance target, never named alone.
BALANCED_ALGORITHM: Final = "balanced"

#: How the RL rollout packer gives bins to DP ranks (``longpack.balance.rollouts``): Megatron-LM's two orders
#: (``distribute_packed_bins``: contiguous runs, or every DP-th bin) and longpack's cost-balanced one.
ROLLOUT_DISTRIBUTIONS: tuple[str, ...] = ("fifo", "round-robin", "balanced")
DEFAULT_ROLLOUT_DISTRIBUTION = "fifo"
#: How the RL rollout packer fills bins: Megatron-LM's ``SequencePacker`` (longest first, the current bin or
#: a new one), or best-fit decreasing (longest first, into the fullest bin it fits) under the same caps.
ROLLOUT_FILLS: tuple[str, ...] = ("next_fit_decreasing", BEST_FIT_DECREASING)
DEFAULT_ROLLOUT_FILL = "next_fit_decreasing"

#: VLM model families (``longpack.vlm.families.FAMILIES``, one module each); Qwen2-VL is the default.
VLM_FAMILIES: tuple[str, ...] = (
    "gemma3",
    "glm4v",
    "kimi_vl",
    "nemotron_vl",
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_5_vl",
    "qwen3_vl",
)
DEFAULT_VLM_FAMILY: Final = "qwen2_vl"

#: What happens to a sample longer than ``seq_length`` (``longpack.packed.align``; ``fragment``: pack-sized
#: pieces packed like samples).
OVERLENGTH_DROP: Final = "drop"
OVERLENGTH_TRUNCATE: Final = "truncate"
OVERLENGTH_FRAGMENT: Final = "fragment"
OVERLENGTH_ERROR: Final = "error"
OVERLENGTH_POLICIES: tuple[str, ...] = (
    OVERLENGTH_DROP,
    OVERLENGTH_TRUNCATE,
    OVERLENGTH_FRAGMENT,
    OVERLENGTH_ERROR,
)
DEFAULT_OVERLENGTH = OVERLENGTH_DROP
#: The online packer's (``longpack.online.OnlinePacker``, Energon's encoder): no ``fragment`` (a sample is
#: one buffer entry); ``truncate`` first, its default.
ONLINE_OVERLENGTH_POLICIES: tuple[str, ...] = (OVERLENGTH_TRUNCATE, OVERLENGTH_DROP, OVERLENGTH_ERROR)

#: Packed output on disk: ``parquet`` (Megatron-Bridge v0.4.0+ and main), ``npy`` (Bridge <= 0.3.x, NeMo 2) or
#: ``indexed`` (Megatron's ``.bin`` / ``.idx`` document datasets for pretraining, ``longpack.packed.indexed``).
#: (``longpack.packed.formats.OUTPUT_FORMAT`` holds what each format is and can do.)
PARQUET: Final = "parquet"
NPY: Final = "npy"
INDEXED: Final = "indexed"
#: Preference pairs (prompt, chosen, rejected) in NeMo-Aligner's packed DPO ``.npy`` (``longpack.jobs.preference``).
DPO: Final = "dpo"
OUTPUT_FORMATS: tuple[str, ...] = (PARQUET, NPY, INDEXED, DPO)
DEFAULT_OUTPUT_FORMAT = PARQUET
#: The splits of a packed output (``validation`` only with ``val_fraction`` or ``val_inputs``).
SPLITS: tuple[str, ...] = ("training", "validation")
#: Parquet type of ``input_ids`` (``int64``: what Megatron-Bridge's own packer writes).
INT64_IDS: Final = "int64"
INT32_IDS: Final = "int32"
IDS_DTYPES: tuple[str, ...] = (INT64_IDS, INT32_IDS)
DEFAULT_IDS_DTYPE = INT64_IDS
#: Megatron-Bridge's ``dataset.seed`` default (``GPTSFTDatasetConfig``), the seed of its prepare step; also
#: Megatron-LM's ``--seed`` default.
BRIDGE_DEFAULT_SEED: Final = 1234
#: ``compat`` presets: settings under which the output is byte-identical to the named tool's prepare step.
MEGATRON_BRIDGE_COMPAT: Final = "megatron-bridge"
COMPAT_MODES: tuple[str, ...] = (MEGATRON_BRIDGE_COMPAT,)
#: Where the pack job runs (or an executor object, from Python).
LOCAL_BACKEND: Final = "local"
RAY_BACKEND: Final = "ray"
BACKENDS: tuple[str, ...] = (LOCAL_BACKEND, RAY_BACKEND)
#: What an executor of the pack job can do beyond tokenizing and writing Parquet shards
#: (``PackExecutor.supports``): resample a ``mix`` in memory, read and write token stores, cut over-long
#: samples into fragments, write a split as one file in the driver's process (``npy``, ``indexed``).
MIX: Final = "mix"
TOKEN_STORE: Final = "token_store"
ONE_FILE_PER_SPLIT: Final = "one_file_per_split"
#: ... and write Megatron indexed prefixes from a sharded token store, one task per prefix (``indexed`` on Ray).
SHARDED_INDEXED: Final = "sharded_indexed"
EXECUTOR_CAPABILITIES: tuple[str, ...] = (
    MIX,
    TOKEN_STORE,
    OVERLENGTH_FRAGMENT,
    ONE_FILE_PER_SPLIT,
    SHARDED_INDEXED,
)
#: What ``longpack verify`` runs its tiny model with (transformers on CPU, or Megatron-Core + TE on CUDA).
HF_BACKEND: Final = "hf"
MEGATRON_BACKEND: Final = "megatron"
VERIFY_BACKENDS: tuple[str, ...] = (HF_BACKEND, MEGATRON_BACKEND)

#: How rows are read (``longpack.text``; ``auto``: detected per file).
AUTO_FORMAT: Final = "auto"
PROMPT_COMPLETION_FORMAT: Final = "prompt_completion"
CHAT_FORMAT: Final = "chat"
SHAREGPT_FORMAT: Final = "sharegpt"
PRETOKENIZED_FORMAT: Final = "pretokenized"
TEXT_FORMAT: Final = "text"
TEXT_FORMATS: tuple[str, ...] = (
    AUTO_FORMAT,
    PROMPT_COMPLETION_FORMAT,
    CHAT_FORMAT,
    SHAREGPT_FORMAT,
    PRETOKENIZED_FORMAT,
    TEXT_FORMAT,
)
#: Which tokens train: the completion, the assistant turns, the last assistant turn, or every token.
COMPLETION_LOSS: Final = "completion"
ASSISTANT_LOSS: Final = "assistant"
LAST_TURN_LOSS: Final = "last_turn"
FULL_LOSS: Final = "full"
PROMPT_COMPLETION_LOSSES: tuple[str, ...] = (COMPLETION_LOSS, FULL_LOSS)
CHAT_LOSSES: tuple[str, ...] = (ASSISTANT_LOSS, LAST_TURN_LOSS, FULL_LOSS)

#: Planner training options (``longpack.planner.options``).
PRECISIONS: tuple[str, ...] = ("bf16", "fp8", "mxfp8", "nvfp4")
#: Those the balance cost model (``longpack.planner.balance_costs``) has GEMM rates for.
BALANCE_PRECISIONS: tuple[str, ...] = PRECISIONS[:3]
DISPATCHERS: tuple[str, ...] = ("alltoall", "allgather", "deepep", "hybridep")
#: Context-parallel communication (``auto``: the fastest the layout allows).
CP_COMM_TYPES: tuple[str, ...] = ("p2p", "a2a", "a2a+p2p", "allgather", "auto")
OPTIMIZERS: tuple[str, ...] = ("adam", "adam_bf16_states", "muon")

#: Synthetic sample-length workloads of the online-packing simulation (``longpack.online.simulate``).
LOGNORMAL_WORKLOAD: Final = "lognormal"
BIMODAL_WORKLOAD: Final = "bimodal"
WORKLOADS: tuple[str, ...] = (LOGNORMAL_WORKLOAD, BIMODAL_WORKLOAD)

#: Megatron-Bridge dataset configs the rules tell apart (``longpack.rules.config.DatasetKind``'s values).
DATASET_KINDS: tuple[str, ...] = ("sft", "direct_hf", "energon", "mock_vlm", "pretraining")

#: Pipeline schedules and samplers of the balance simulation (``longpack.balance.schedule``).
SCHEDULE_1F1B: Final = "1f1b"
SCHEDULE_INTERLEAVED: Final = "interleaved"
SCHEDULES: tuple[str, ...] = (SCHEDULE_1F1B, SCHEDULE_INTERLEAVED)
BATCH_SAMPLER: Final = "batch"
SINGLE_SAMPLER: Final = "single"
SAMPLERS: tuple[str, ...] = (BATCH_SAMPLER, SINGLE_SAMPLER)

#: Energon task encoders (``dataset.task_encoder._target_``) whose packing buffer holds encoded media and token
#: counts, pixels decoded only for the pack being emitted (deferred decoding, ``longpack.online.vlm``); every
#: other Qwen-VL encoder (Megatron-Bridge's ``QwenVLTaskEncoder``, longpack's eager one) buffers prepared pixels.
DEFERRED_VLM_ENCODERS: tuple[str, ...] = ("longpack.online.vlm.QwenVLPackingEncoder",)
