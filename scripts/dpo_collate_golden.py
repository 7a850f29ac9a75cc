"""Record what NeMo-Aligner's ``DPOPackedDataset.global_collate_fn`` makes of seeded packed DPO rows.

    LONGPACK_NEMO_ALIGNER=/path/to/NeMo-Aligner python scripts/dpo_collate_golden.py

packs seeded random preference pairs with ``longpack.packed.preference.pack_preference_pairs``, runs the
upstream method (``tests/nemo_aligner_dpo_harness.py``) on batches of the rows and writes
``tests/data/nemo_aligner_dpo_collate_golden.json`` (inputs, upstream batch, commit).
``tests/packed/test_preference.py`` checks ``collate_packed_dpo`` against it on every run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import nemo_aligner_dpo_harness as harness  # noqa: E402
from longpack.packed.preference import PreferencePair, pack_preference_pairs  # noqa: E402


def random_pairs(rng: np.random.Generator, count: int) -> list[PreferencePair]:
    def toks(lo: int, hi: int) -> list[int]:
        return [int(t) for t in rng.integers(1, 30_000, size=int(rng.integers(lo, hi)))]

    return [
        PreferencePair(toks(0, 12), toks(1, 20), toks(1, 20), float(rng.normal()), float(rng.normal()))
        for _ in range(count)
    ]


def cases(seed: int = 20261207, count: int = 16) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pack_size = int(rng.integers(24, 96))
        packing = pack_preference_pairs(
            random_pairs(rng, int(rng.integers(1, 12))), pack_size, seed=int(rng.integers(0, 9))
        )
        if not packing.rows:
            continue
        rows = packing.rows[: int(rng.integers(1, 5))]
        seq_length = int(rng.choice([pack_size, 128]))
        out.append({"rows": rows, "eos_id": 2, "seq_length": seq_length})
    return out


def main() -> None:
    text = harness.source_text()
    if text is None:
        raise SystemExit("set LONGPACK_NEMO_ALIGNER to a NeMo-Aligner checkout (work tree or git directory)")
    cls = harness.load_class(text)
    records = [
        {**c, "batch": harness.run_upstream(cls, c["rows"], eos_id=c["eos_id"], seq_length=c["seq_length"])}
        for c in cases()
    ]
    target = ROOT / "tests" / "data" / "nemo_aligner_dpo_collate_golden.json"
    doc = {
        "source": f"NVIDIA/NeMo-Aligner@{harness.source_commit()}:{harness.RELATIVE}:{harness.CLASS}",
        "cases": records,
    }
    target.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{len(records)} cases from {doc['source']} -> {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
