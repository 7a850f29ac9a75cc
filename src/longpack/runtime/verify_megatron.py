"""``longpack verify --backend megatron``: the packed = unpacked check with Megatron-Core's ``GPTModel`` and
TransformerEngine attention, on one CUDA device (bf16; what a Megatron training run executes).

Megatron-Core cannot run packed attention on the CPU (its RoPE asserts CUDA and ``DotProductAttention``
refuses packed sequences), so this backend needs a GPU, megatron-core and transformer-engine; the job says
which are missing (:func:`longpack.jobs.verify.megatron_backend_missing`). Per checked row: the Bridge
collate, ``PackedSeqParams`` from the batch (:func:`~longpack.runtime.megatron.to_packed_seq_params`), the
per-token loss of the packed row vs every sample run alone (no packed parameters); bf16 tolerances
(:data:`TOLERANCE`). The job (``longpack.jobs.verify``) drives it. Prepared script: ``benchmarks/gpu_verify.py`` (≤ 5 minutes on one GPU).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "HYBRID_PATTERNS",
    "TOLERANCE",
    "build_megatron_hybrid_model",
    "build_megatron_model",
    "sample_losses",
]

#: Megatron-Core ``HybridModel`` layer patterns the GPU script checks (``hybrid_layer_allocation.Symbols``:
#: ``G`` Gated DeltaNet, ``M`` Mamba-2, ``*`` attention, ``-`` MLP), by name.
HYBRID_PATTERNS = {"gdn": "G-*-", "mamba": "M-*-"}

#: Relative tolerance of a sample's mean loss, packed vs alone, in bf16 with TE kernels.
TOLERANCE = 2e-2


def build_megatron_model(vocab_size: int, seq_length: int, seed: int) -> Any:
    """A 2-layer bf16 ``GPTModel`` with TransformerEngine layers and RoPE on the current CUDA device."""
    import os

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(seed)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=256,
        bf16=True,
        params_dtype=torch.bfloat16,
        init_method_std=0.2,
        use_cpu_initialization=False,
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
        vocab_size=vocab_size,
        max_sequence_length=seq_length,
        position_embedding_type="rope",
    ).cuda()


def build_megatron_hybrid_model(vocab_size: int, seq_length: int, seed: int, pattern: str) -> Any:
    """A bf16 Megatron-Core ``HybridModel`` (``hybrid_stack_spec``: TE layers) with the layer ``pattern``
    (:data:`HYBRID_PATTERNS`) and RoPE on the current CUDA device; packed THD batches reach its GDN layers
    (FLA's chunked delta rule and causal conv1d with ``cu_seqlens``) and Mamba layers (``seq_idx``) through
    ``packed_seq_params``."""
    import torch
    from megatron.core.models.hybrid.hybrid_layer_specs import hybrid_stack_spec
    from megatron.core.models.hybrid.hybrid_model import HybridModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    build_megatron_model(vocab_size, seq_length, seed)  # process group, model parallel state and seeds
    config = TransformerConfig(
        num_layers=len(pattern),
        hidden_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=256,
        bf16=True,
        params_dtype=torch.bfloat16,
        init_method_std=0.2,
        use_cpu_initialization=False,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        mamba_state_dim=16,
        mamba_head_dim=32,
        mamba_num_groups=2,
    )
    return HybridModel(
        config=config,
        hybrid_stack_spec=hybrid_stack_spec,
        vocab_size=vocab_size,
        max_sequence_length=seq_length,
        hybrid_layer_pattern=pattern,
        position_embedding_type="rope",
    ).cuda()


def sample_losses(model: Any, batch: dict[str, Any], spans: Any) -> list[tuple[int, float, float]]:
    """``(sample, packed mean loss, alone mean loss)`` of every supervised sample of a one-row THD ``batch``
    (``spans``: the samples' runtime offsets, :func:`longpack.runtime.verify.expected_spans`)."""
    import torch

    from longpack.runtime.megatron import to_packed_seq_params

    out = []
    with torch.no_grad():
        packed = model(
            batch["tokens"].cuda(),
            batch["position_ids"].cuda(),
            None,
            labels=batch["labels"].cuda(),
            packed_seq_params=to_packed_seq_params(batch),
        )[0].float()
        for i in range(len(spans) - 1):
            a, b = int(spans[i]), int(spans[i + 1])
            mask = batch["loss_mask"][0, a:b].cuda().float()
            if not bool(mask.any()):
                continue
            alone = model(
                batch["tokens"][:, a:b].cuda(),
                torch.arange(b - a).view(1, -1).cuda(),
                None,
                labels=batch["labels"][:, a:b].cuda(),
            )[0].float()
            got = float((packed[a:b] * mask).sum() / mask.sum())
            want = float((alone * mask).sum() / mask.sum())
            out.append((i, got, want))
    return out
