"""Record what NeMo-Aligner's packed DPO loss makes of seeded packed rows and per-token log-probs.

    LONGPACK_NEMO_ALIGNER=/path/to/NeMo-Aligner python scripts/dpo_loss_golden.py

packs seeded preference pairs (``scripts/dpo_collate_golden.py``'s), collates each row with
``longpack.packed.preference.collate_packed_dpo``, draws per-token policy and reference log-probs, and runs
``MegatronGPTDPOModel.loss_func`` / ``get_reduced_masked_logps`` (``tests/nemo_aligner_dpo_harness.py``, the
upstream methods unmodified) on them; writes ``tests/data/nemo_aligner_dpo_loss_golden.json``.
``tests/runtime/test_verify_dpo.py`` checks ``longpack.runtime.verify_dpo``'s reduction against it on every run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

import dpo_collate_golden  # noqa: E402

import nemo_aligner_dpo_harness as harness  # noqa: E402
from longpack.packed.preference import collate_packed_dpo  # noqa: E402

BETA = 0.2


def cases(seed: int = 20261208, count: int = 12) -> list[dict]:
    """One row a case: the collated labels and ``cu_seqlens`` cut at the argmin, per-token log-probs."""
    rng = np.random.default_rng(seed)
    out = []
    for case in dpo_collate_golden.cases(seed=seed, count=count):
        row = case["rows"][0]
        batch = collate_packed_dpo([row], eos_id=case["eos_id"], seq_length=case["seq_length"])
        cu = batch["cu_seqlens"][0][: int(batch["cu_seqlens_argmin"][0, 0])]
        width = batch["labels"].shape[1]
        out.append(
            {
                "labels": batch["labels"][0].tolist(),
                "cu_seqlens": cu.tolist(),
                "pi_logps": (-rng.exponential(2.0, width)).tolist(),
                "ref_logps": (-rng.exponential(2.0, width)).tolist(),
                "beta": BETA,
            }
        )
    return out


def main() -> None:
    import torch

    text = harness.model_source_text()
    if text is None:
        raise SystemExit("set LONGPACK_NEMO_ALIGNER to a NeMo-Aligner checkout (work tree or git directory)")
    cls = harness.load_loss_methods(text)
    records = []
    for c in cases():
        t = {k: torch.tensor(c[k], dtype=torch.float64) for k in ("pi_logps", "ref_logps")}
        upstream = harness.run_upstream_loss(
            cls,
            t["pi_logps"],
            t["ref_logps"],
            torch.tensor(c["labels"]),
            torch.tensor(c["cu_seqlens"], dtype=torch.int32),
            beta=c["beta"],
        )
        records.append({**c, "upstream": upstream})
    target = ROOT / "tests" / "data" / "nemo_aligner_dpo_loss_golden.json"
    doc = {
        "source": f"NVIDIA/NeMo-Aligner@{harness.source_commit()}:{harness.MODEL_RELATIVE}:{harness.MODEL_CLASS}",
        "cases": records,
    }
    target.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{len(records)} cases from {doc['source']} -> {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
