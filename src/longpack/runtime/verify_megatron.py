"""``longpack verify --backend megatron``: the packed = unpacked check with Megatron-Core's ``GPTModel`` and
TransformerEngine attention, on one CUDA device (bf16; what a Megatron training run executes).

Megatron-Core cannot run packed attention on the CPU (its RoPE asserts CUDA and ``DotProductAttention``
refuses packed sequences), so this backend needs a GPU, megatron-core and transformer-engine; the job says
which are missing (:func:`longpack.jobs.verify.megatron_backend_missing`). Per checked row: the Bridge
collate, ``PackedSeqParams`` from the batch (:func:`~longpack.runtime.megatron.to_packed_seq_params`), the
per-token loss of the packed row vs every sample run alone (no packed parameters); bf16 tolerances
(:data:`TOLERANCE`). Prepared script: ``benchmarks/gpu_verify.py`` (≤ 5 minutes on one GPU).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["TOLERANCE", "run_megatron_verify"]

#: Relative tolerance of a sample's mean loss, packed vs alone, in bf16 with TE kernels.
TOLERANCE = 2e-2


def _model(vocab_size: int, seq_length: int, seed: int) -> Any:
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


def run_megatron_verify(config: Any) -> Any:
    """Run ``config`` (a :class:`longpack.jobs.verify.VerifyConfig`) on Megatron-Core; a ``VerifyResult``."""
    import torch

    from longpack.jobs.verify import VerifyResult, _locate, _order_rows, _versions
    from longpack.packed.folder import PackedFolder
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset
    from longpack.runtime.megatron import to_packed_seq_params
    from longpack.runtime.verify import expected_spans
    from longpack.runtime.verify_model import load_hf_config

    began = time.perf_counter()
    source = load_hf_config(config.model)
    folder = PackedFolder.open(config.packed, allow_no_manifest=config.allow_no_manifest)
    split = config.split or folder.split_names[0]
    collate = PackedCollator.for_data(folder, split=split)
    model = _model(int(source["vocab_size"]), collate.max_seq_length, config.seed)
    model.eval()
    dataset = PackedDataset(folder, split=split, prefetch=0)
    scan = folder.scan(split)
    failures: list[dict[str, Any]] = []
    checked: list[int] = []
    worst = 0.0
    deadline = None if config.time_budget is None else began + config.time_budget
    for index in _order_rows(scan, config.seed):
        if (config.max_rows is not None and len(checked) >= config.max_rows) or (
            deadline is not None and checked and time.perf_counter() > deadline
        ):
            break
        file, row_in_file = _locate(scan, index)
        row = dataset[index]
        spans = expected_spans(row)
        batch = collate([row])
        params = to_packed_seq_params(batch)
        with torch.no_grad():
            packed = model(
                batch["tokens"].cuda(),
                batch["position_ids"].cuda(),
                None,
                labels=batch["labels"].cuda(),
                packed_seq_params=params,
            )[0].float()
            for i in range(spans.size - 1):
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
                diff = abs(got - want) / max(1.0, abs(want))
                worst = max(worst, diff)
                if diff > TOLERANCE:
                    failures.append(
                        {
                            "check": "loss",
                            "split": split,
                            "file": file,
                            "row": row_in_file,
                            "sample": i,
                            "rank": "megatron-core GPTModel, TE attention",
                            "detail": f"packed mean loss {got:.6g} != alone {want:.6g} (relative {diff:.2e})",
                        }
                    )
        checked.append(index)
    ok = not failures
    seconds = time.perf_counter() - began
    verdict = (
        f"PASS: {len(checked)} of {scan.rows} rows, packed = unpacked with Megatron-Core GPTModel + TE attention "
        f"(bf16, worst relative {worst:.1e}; {seconds:.1f} s)"
        if ok
        else f"FAIL: {len(failures)} difference(s); first: {failures[0]['file']} row {failures[0]['row']} "
        f"sample {failures[0]['sample']}: {failures[0]['detail']}"
    )
    certificate = {
        "verdict": "pass" if ok else "fail",
        "summary": verdict,
        "backend": "megatron",
        "versions": _versions(),
        "device": torch.cuda.get_device_name(0),
        "rows_checked": {split: checked},
        "rows_total": scan.rows,
        "worst": {"loss_rel_diff": worst},
        "tolerance": TOLERANCE,
        "failures": failures[:100],
        "seconds": round(seconds, 2),
    }
    return VerifyResult(
        ok=ok,
        verdict=verdict,
        rows=(),
        distributed=(),
        failures=tuple(failures),
        notes=(),
        certificate=certificate,
        seconds=seconds,
    )
