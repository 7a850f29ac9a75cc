"""Every choice list of longpack's settings, in one module (pure constants, no imports), so each list is
written once and every layer, the job configs and the CLI read the same tuple; the defaults sit next to
their lists. The layer that acts on a choice re-exports its list (``longpack.binpack.ALGORITHMS`` is
:data:`ALGORITHMS`).

>>> DEFAULT_ALGORITHM in ALGORITHMS and MEGATRON_ALGORITHM in ALGORITHMS, DEFAULT_OVERLENGTH
(True, 'drop')
"""

from __future__ import annotations

#: Bin packing (``longpack.binpack.pack_lengths``). The three ``first_fit*`` reproduce Megatron-Bridge's
#: bins exactly; ``best_fit_decreasing`` packs tightest and is the default.
ALGORITHMS: tuple[str, ...] = (
    "best_fit_decreasing",
    "first_fit",
    "first_fit_decreasing",
    "first_fit_shuffle",
)
DEFAULT_ALGORITHM = "best_fit_decreasing"
#: Megatron-Bridge's prepare step packs with this one (``--compat megatron-bridge``).
MEGATRON_ALGORITHM = "first_fit_shuffle"
#: Workload-balanced rows for a training topology: chosen by a balance target, never named alone.
BALANCED_ALGORITHM = "balanced"

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
DEFAULT_VLM_FAMILY = "qwen2_vl"

#: What happens to a sample longer than ``seq_length`` (``longpack.packed.align``; ``fragment``: pack-sized
#: pieces packed like samples).
OVERLENGTH_POLICIES: tuple[str, ...] = ("drop", "truncate", "fragment", "error")
DEFAULT_OVERLENGTH = "drop"

#: Packed output on disk: ``parquet`` (Megatron-Bridge v0.4.0+ and main), ``npy`` (Bridge <= 0.3.x, NeMo 2) or
#: ``indexed`` (Megatron's ``.bin`` / ``.idx`` document datasets for pretraining, ``longpack.packed.indexed``).
OUTPUT_FORMATS: tuple[str, ...] = ("parquet", "npy", "indexed")
DEFAULT_OUTPUT_FORMAT = "parquet"
#: Parquet type of ``input_ids`` (``int64``: what Megatron-Bridge's own packer writes).
IDS_DTYPES: tuple[str, ...] = ("int64", "int32")
DEFAULT_IDS_DTYPE = "int64"
#: ``compat`` presets: settings under which the output is byte-identical to the named tool's prepare step.
COMPAT_MODES: tuple[str, ...] = ("megatron-bridge",)
#: Where the pack job runs (or an executor object, from Python).
BACKENDS: tuple[str, ...] = ("local", "ray")

#: How rows are read (``longpack.text``).
TEXT_FORMATS: tuple[str, ...] = ("auto", "prompt_completion", "chat", "sharegpt", "pretokenized", "text")
PROMPT_COMPLETION_LOSSES: tuple[str, ...] = ("completion", "full")
CHAT_LOSSES: tuple[str, ...] = ("assistant", "last_turn", "full")

#: Planner training options (``longpack.planner.options``).
PRECISIONS: tuple[str, ...] = ("bf16", "fp8", "mxfp8", "nvfp4")
DISPATCHERS: tuple[str, ...] = ("alltoall", "allgather", "deepep", "hybridep")
#: Context-parallel communication (``auto``: the fastest the layout allows).
CP_COMM_TYPES: tuple[str, ...] = ("p2p", "a2a", "a2a+p2p", "allgather", "auto")
OPTIMIZERS: tuple[str, ...] = ("adam", "adam_bf16_states", "muon")

#: Synthetic sample-length workloads of the online-packing simulation (``longpack.online.simulate``).
WORKLOADS: tuple[str, ...] = ("lognormal", "bimodal")

#: Megatron-Bridge dataset configs the rules tell apart (``longpack.rules.config.DatasetKind``'s values).
DATASET_KINDS: tuple[str, ...] = ("sft", "direct_hf", "energon", "mock_vlm", "pretraining")

#: Pipeline schedules and samplers of the balance simulation (``longpack.balance.schedule``).
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved")
SAMPLERS: tuple[str, ...] = ("batch", "single")

#: Energon task encoders (``dataset.task_encoder._target_``) whose packing buffer holds encoded media and token
#: counts, pixels decoded only for the pack being emitted (deferred decoding, ``longpack.online.vlm``); every
#: other Qwen-VL encoder (Megatron-Bridge's ``QwenVLTaskEncoder``, longpack's eager one) buffers prepared pixels.
DEFERRED_VLM_ENCODERS: tuple[str, ...] = ("longpack.online.vlm.QwenVLPackingEncoder",)
