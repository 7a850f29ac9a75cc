"""Compiled inner loop of the row fill: one pass over the output tokens.

The numpy formulation in ``rows.py`` makes ~10 passes over int64 temporaries; this writes each output
token and mask value once, which is what makes filling 1M samples take seconds, not minutes. It runs from
the C extension ``_native.c`` built with the package (no compile at run time, no numba import), else from
the numba kernel in ``_kernels_numba.py`` (a source checkout never built; ``LONGPACK_KERNELS=numba``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from longpack._optional import native

_FILL: Callable[..., None] | None = None


def _fill() -> Callable[..., None]:
    global _FILL
    if _FILL is None:
        module: Any = native("longpack.packed._native")
        if module is None:
            from longpack.packed import _kernels_numba as module
        _FILL = module.fill_tokens_and_mask
    return _FILL


def fill_tokens_and_mask(
    tokens: Any,
    mask: Any,
    src_start: Any,
    kept: Any,
    stored: Any,
    eos_id: int,
    out_ids: Any,
    out_mask: Any,
) -> None:
    """Write the samples ``src_start[i] : src_start[i] + kept[i]`` of ``tokens`` one after another into
    ``out_ids``, each padded with ``eos_id`` to ``stored[i]`` tokens, and their label-aligned ``mask`` (moved
    left by one; pads and each sample's last position 0) into ``out_mask``.

    >>> import numpy as np
    >>> ids, m = np.empty(5, np.int64), np.empty(5, np.int8)
    >>> fill_tokens_and_mask(np.array([5, 6, 2, 7], np.int32), np.array([0, 1, 1, 1], np.uint8),
    ...     np.array([0, 3]), np.array([3, 1]), np.array([3, 2]), 2, ids, m)
    >>> ids.tolist(), m.tolist()
    ([5, 6, 2, 7, 2], [1, 1, 0, 0, 0])
    """
    _fill()(tokens, mask, src_start, kept, stored, eos_id, out_ids, out_mask)
