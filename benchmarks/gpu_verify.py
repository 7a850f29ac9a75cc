"""``longpack verify --backend megatron`` on one GPU: Megatron-Core GPTModel + TransformerEngine attention,
packed rows vs every sample alone (bf16), in <= 5 minutes.

Run from the repository root on a CUDA machine with megatron-core and transformer-engine installed:

    PYTHONPATH=src python benchmarks/gpu_verify.py [--rows 50] [--out /tmp/gpu-verify]

It packs the built-in demo twice (``--pack-size 8192`` plain, and ``--cp 2`` aligned), verifies each with the
megatron backend and prints the verdicts and the certificate path. Then the hybrid layers: Megatron-Core's
``HybridModel`` with Gated DeltaNet (pattern ``G-*-``) and with Mamba-2 (``M-*-``) layers, THD rows of the
plain pack (``packed_seq_params`` from the Bridge collate) vs every sample alone, worst relative difference of
a sample's mean loss (``--hybrid-rows`` rows each; a layer type this Megatron-Core cannot build, e.g. without
FLA or mamba-ssm, is reported as skipped with the reason). Without CUDA it prints what is missing and exits
with status 2 (the same message as ``longpack verify --backend megatron``).

Not yet run on a GPU (none was lent while it was written): the hybrid part is ready, unmeasured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "hf_configs" / "qwen3_8b.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("/tmp/longpack-gpu-verify"))
    parser.add_argument("--hybrid-rows", type=int, default=10)
    args = parser.parse_args()
    from longpack.jobs import PackConfig
    from longpack.jobs.verify import VerifyConfig, megatron_backend_missing

    missing = megatron_backend_missing()
    if missing:
        print("gpu_verify: cannot run: missing " + "; ".join(missing), file=sys.stderr)
        return 2
    began = time.perf_counter()
    status = 0
    for name, options in (("plain", {}), ("cp2", {"cp": 2})):
        out = args.out / name
        PackConfig(demo=True, out=out, pack_size=8192, seq_length=4096, overwrite=True, **options).run()
        result = VerifyConfig(
            packed=out,
            model=str(CONFIG),
            backend="megatron",
            max_rows=args.rows,
            time_budget=120.0,
            certificate=args.out / f"{name}.verify.json",
        ).run()
        print(f"{name}: {result.verdict}")
        status = max(status, result.exit_code)
    status = max(status, hybrid(args.out / "plain", args.hybrid_rows))
    print(json.dumps({"seconds": round(time.perf_counter() - began, 1)}))
    return status


def hybrid(folder: Path, rows: int) -> int:
    """Megatron-Core's GDN and Mamba layers on THD rows: packed = each sample alone (bf16 tolerance)."""
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset
    from longpack.runtime.verify import expected_spans
    from longpack.runtime.verify_megatron import (
        HYBRID_PATTERNS,
        TOLERANCE,
        build_megatron_hybrid_model,
        sample_losses,
    )

    dataset = PackedDataset(folder, split="training", prefetch=0)
    collate = PackedCollator.for_data(dataset)
    status = 0
    for name, pattern in HYBRID_PATTERNS.items():
        try:
            model = build_megatron_hybrid_model(151936, collate.max_seq_length, 0, pattern)
        except Exception as exc:  # a layer type this install cannot build: say so, go on
            print(f"{name} ({pattern}): skipped: {type(exc).__name__}: {exc}")
            continue
        model.eval()
        worst, failed = 0.0, []
        try:
            for index in range(min(rows, len(dataset))):
                row = dataset[index]
                for sample, got, want in sample_losses(model, collate([row]), expected_spans(row)):
                    diff = abs(got - want) / max(1.0, abs(want))
                    worst = max(worst, diff)
                    if diff > TOLERANCE:
                        failed.append((index, sample, diff))
        except Exception as exc:  # a packed forward this install refuses: an error, not a pass
            print(f"{name} ({pattern}): ERROR on row {index}: {type(exc).__name__}: {exc}")
            status = 1
            continue
        verdict = "PASS" if not failed else f"FAIL: first row {failed[0][0]} sample {failed[0][1]}"
        print(f"{name} ({pattern}): {verdict}: {min(rows, len(dataset))} rows, worst relative {worst:.1e}")
        status = max(status, 1 if failed else 0)
    dataset.close()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
