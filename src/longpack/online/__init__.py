"""Online (streaming) packing: a candidate-buffer packer with exact resume, and a Megatron-Energon adapter.

``longpack.online.OnlinePacker`` is pure numpy. The Energon task-encoder mixin lives in
``longpack.online.energon`` and is imported only when asked for (it needs ``megatron-energon``,
``pip install 'longpack[energon]'``).
"""

from longpack.online.packer import (
    OVERLENGTH_POLICIES,
    OnlinePack,
    OnlinePacker,
    OnlineStateError,
    OnlineStats,
    aligned_length,
    fill_ratio,
    select_packs,
    selection_seed,
)

__all__ = [
    "OVERLENGTH_POLICIES",
    "OnlinePack",
    "OnlinePacker",
    "OnlineStateError",
    "OnlineStats",
    "aligned_length",
    "fill_ratio",
    "select_packs",
    "selection_seed",
]
