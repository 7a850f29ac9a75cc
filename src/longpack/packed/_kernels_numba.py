"""The row fill in numba (cached on disk): the fallback of ``_native.c`` when the extension is not built
(see ``_kernels.py``), and the reference the tests compare it with."""

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
