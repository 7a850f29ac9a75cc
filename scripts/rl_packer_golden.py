"""Record what Megatron-LM's own RL sequence packer makes of seeded random rollouts, for CI.

    LONGPACK_MEGATRON_LM=/path/to/Megatron-LM python scripts/rl_packer_golden.py

runs ``megatron/rl/sequence_packing_utils.py`` from that checkout (``tests/megatron_rl_harness.py``
stands in for the training helpers it imports) and writes ``tests/data/megatron_rl_packer_golden.json``:
the inputs, Megatron's packed bins per DP rank, and the commit. ``tests/balance/test_rollouts.py`` checks
``longpack.balance.rollouts.pack_rollouts`` against the file on every run and against the live code when
the variable is set.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import megatron_rl_harness as harness  # noqa: E402


def cases(seed: int = 20261207, count: int = 24) -> list[dict]:
    """Seeded settings and rollouts: CP 1/2/4 slot multiples, DP 1-4, both orders, 1-5 rollouts a bin."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        cp = int(rng.choice([1, 2, 4]))
        multiple = 2 * cp if cp > 1 else 1
        bin_size = multiple * int(rng.integers(4, 24))
        rollouts = [
            [int(t) for t in rng.integers(1, 50_000, size=int(rng.integers(1, bin_size + 1)))]
            for _ in range(int(rng.integers(1, 24)))
        ]
        rollouts = [r for r in rollouts if -(-len(r) // multiple) * multiple <= bin_size]
        if not rollouts:
            continue
        out.append(
            {
                "bin_size": bin_size,
                "max_sequences_per_bin": int(rng.integers(1, 6)),
                "seq_length_multiple": multiple,
                "dp": int(rng.integers(1, 5)),
                "distribution": str(rng.choice(["fifo", "round-robin"])),
                "pad_id": 0,
                "rollouts": rollouts,
                "masks": [[int(m) for m in rng.integers(0, 2, size=len(r))] for r in rollouts],
            }
        )
    return out


def main() -> None:
    path = harness.source_path()
    if path is None:
        raise SystemExit("set LONGPACK_MEGATRON_LM to a Megatron-LM checkout (work tree or git directory)")
    warnings.simplefilter("ignore")
    module = harness.load(path, pad_id=0)
    records = []
    for case in cases():
        settings = {k: v for k, v in case.items() if k not in ("rollouts", "masks")}
        ranks = harness.run_upstream(module, case["rollouts"], case["masks"], **settings)
        records.append({**case, "ranks": ranks})
    target = ROOT / "tests" / "data" / "megatron_rl_packer_golden.json"
    document = {
        "source": f"NVIDIA/Megatron-LM@{harness.source_commit()}:{harness.RELATIVE}",
        "cases": records,
    }
    target.write_text(json.dumps(document, separators=(",", ":")) + "\n")
    print(f"{len(records)} cases from {document['source']} -> {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
