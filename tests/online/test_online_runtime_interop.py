"""Online rows go through the runtime collate (``longpack.runtime.collate_packed``) into correct THD batches.

Skipped while ``longpack.runtime`` has no ``collate_packed`` (it lands from the runtime branch).
"""

from __future__ import annotations

import numpy as np
import pytest

from longpack.online import OnlinePacker

try:
    from longpack.runtime import collate_packed  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on merge order
    collate_packed = None

EOS = 2


@pytest.mark.skipif(collate_packed is None, reason="longpack.runtime.collate_packed not available")
@pytest.mark.parametrize("multiple", [1, 4])
def test_online_rows_collate_to_thd(multiple: int) -> None:
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(30):
        n = int(rng.integers(3, 40))
        ids = rng.integers(10, 1000, n)
        ids[-1] = EOS
        samples.append({"input_ids": ids, "loss_mask": (rng.random(n) < 0.7).astype(np.int8)})
    packs = list(OnlinePacker(64, 8, pad_to_multiple_of=multiple, pad_id=EOS).pack(samples))
    batch = collate_packed(
        [p.row for p in packs[:3]], max_seq_length=64, eos_id=EOS, pad_seq_to_mult=multiple
    )
    for r, pack in enumerate(packs[:3]):
        logical = np.concatenate([[0], np.cumsum(pack.lengths)]).tolist()
        assert batch["cu_seqlens_q"][r].tolist()[: len(logical)] == logical
        if multiple > 1:
            physical = np.concatenate([[0], np.cumsum(pack.aligned_lengths)]).tolist()
            assert batch["cu_seqlens_q_padded"][r].tolist()[: len(physical)] == physical
        start = 0
        for i, n, a in zip(
            pack.sample_index.tolist(), pack.lengths.tolist(), pack.aligned_lengths.tolist(), strict=True
        ):
            assert (
                batch["labels"][r, start : start + n].tolist() == samples[i]["input_ids"][1 : n + 1].tolist()
            )
            assert (
                batch["loss_mask"][r, start : start + n].tolist()
                == samples[i]["loss_mask"][1 : n + 1].tolist()
            )
            start += a
