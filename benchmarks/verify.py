"""``longpack verify`` CPU time: 100 rows of 8K tokens (the issue's target: <= 60 s on a 2-core machine).

Run from the repository root:

    PYTHONPATH=src python benchmarks/verify.py              # 100 rows, 3 repeats
    PYTHONPATH=src python benchmarks/verify.py --rows 20 --repeats 1

Data: the built-in demo (12,000 SFT samples, qwen3 tokenizer) packed at 8,192 tokens (``longpack pack --demo
--pack-size 8192 --seq-length 4096``). Model: a tiny Qwen3 from ``tests/data/hf_configs/qwen3_8b.json``
(float64, full 151,936-token vocabulary). Timed: ``VerifyConfig(..., max_rows=R, time_budget=None, cp=(),
pp=())`` (every single-process check of R rows; CP/PP are timed separately, one process start each).
Baseline in the same process: one packed forward + backward of the same rows (what one training step of the
tiny model costs), so the ratio says what the checks cost on top of it. Medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "hf_configs" / "qwen3_8b.json"


def baseline(folder: Path, rows: int) -> float:
    """CPU seconds for one packed forward + backward (THD attention) of the same rows, no reference, no checks."""
    from longpack.jobs.verify import load_hf_config
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset
    from longpack.runtime.verify import RowVerifier, batch_layout, run_thd, token_losses
    from longpack.runtime.verify_model import attention_plan, build_model

    model = build_model(load_hf_config(str(CONFIG)))
    ds = PackedDataset(folder, split="training")
    collate = PackedCollator.for_data(ds)
    verifier = RowVerifier(model, collate=collate)
    began = time.process_time()
    for i in range(rows):
        batch = collate([ds[i]])
        width = batch["tokens"].size(1)
        embeds = verifier.embed(batch["tokens"]).detach().requires_grad_(True)
        hidden = run_thd(model, embeds, batch["position_ids"][0], attention_plan(batch_layout(batch, width)))
        loss = token_losses(hidden, batch["labels"][0], batch["loss_mask"][0], verifier.head).sum()
        torch.autograd.grad(loss, [embeds, *verifier.params], allow_unused=True)
    return time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from longpack.jobs import PackConfig
    from longpack.jobs.verify import VerifyConfig

    with tempfile.TemporaryDirectory(prefix="longpack-verify-bench-") as tmp:
        out = Path(tmp) / "demo8k"
        PackConfig(demo=True, out=out, pack_size=8192, seq_length=4096).run()
        times, cpus, bases, tokens = [], [], [], 0
        for _ in range(args.repeats):
            began, cpu = time.perf_counter(), time.process_time()
            result = VerifyConfig(
                packed=out,
                model=str(CONFIG),
                split="training",
                max_rows=args.rows,
                time_budget=None,
                cp=(),
                pp=(),
            ).run()
            times.append(time.perf_counter() - began)
            cpus.append(time.process_time() - cpu)
            assert result.ok, result.verdict
            tokens = sum(r.tokens for r in result.rows)
            bases.append(baseline(out, args.rows))
        samples = sum(r.samples for r in result.rows)
        verify_s, base_s = statistics.median(times), statistics.median(bases)  # wall, CPU
        print(
            f"torch threads {torch.get_num_threads()}; rows {len(result.rows)}, {tokens} runtime tokens, {samples} samples"
        )
        print(f"{'what':<44}{'median s':>10}{'runs':>28}")
        print(
            f"{'verify (all single-process checks), wall':<44}{verify_s:>10.1f}{[round(t, 1) for t in times]!s:>28}"
        )
        cpu_s = statistics.median(cpus)
        print(f"{'verify, CPU seconds (all threads)':<44}{cpu_s:>10.1f}{[round(t, 1) for t in cpus]!s:>28}")
        print(
            f"{'baseline: packed fwd+bwd only, CPU seconds':<44}{base_s:>10.1f}{[round(t, 1) for t in bases]!s:>28}"
        )
        print(
            f"ratio verify / baseline (CPU): {cpu_s / base_s:.2f}; per row {cpu_s / len(result.rows):.2f} CPU-s"
        )
        print(
            f"target: {args.rows} rows of 8K in <= 60 s: wall {'met' if verify_s <= 60 else 'MISSED'}, "
            f"CPU {'met' if cpu_s <= 60 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
