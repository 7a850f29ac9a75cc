"""Compiled inner loop of the row fill (numba, cached on disk): one pass over the output tokens.

The numpy formulation in ``rows.py`` makes ~10 passes over int64 temporaries; this writes each output
token and mask value once, which is what makes filling 1M samples take seconds, not minutes.
"""

from __future__ import annotations

import numpy as np

from longpack._optional import require

njit = require("numba", "pack", purpose="packing (longpack's compiled kernels)").njit


@njit(cache=True, nogil=True)
def fill_tokens_and_mask(
    tokens: np.ndarray,
    mask: np.ndarray,
    src_start: np.ndarray,
    kept: np.ndarray,
    stored: np.ndarray,
    eos_id: int,
    out_ids: np.ndarray,
    out_mask: np.ndarray,
) -> None:
    pos = 0
    for i in range(len(stored)):
        s = stored[i]
        k = kept[i]
        base = src_start[i]
        for j in range(k):
            out_ids[pos + j] = tokens[base + j]
        for j in range(k, s):
            out_ids[pos + j] = eos_id
        # Label-aligned mask: position j is trained iff token j+1 is a target; pads and the last are 0.
        for j in range(k - 1):
            out_mask[pos + j] = mask[base + j + 1]
        for j in range(max(k - 1, 0), s):
            out_mask[pos + j] = 0
        pos += s
