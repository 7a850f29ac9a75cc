"""``longpack verify --backend megatron`` on one GPU: Megatron-Core GPTModel + TransformerEngine attention,
packed rows vs every sample alone (bf16), in <= 5 minutes.

Run from the repository root on a CUDA machine with megatron-core and transformer-engine installed:

    PYTHONPATH=src python benchmarks/gpu_verify.py [--rows 50] [--out /tmp/gpu-verify]

It packs the built-in demo twice (``--pack-size 8192`` plain, and ``--cp 2`` aligned), verifies each with the
megatron backend and prints the verdicts and the certificate path. Without CUDA it prints what is missing and
exits with status 2 (the same message as ``longpack verify --backend megatron``).
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
    print(json.dumps({"seconds": round(time.perf_counter() - began, 1)}))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
