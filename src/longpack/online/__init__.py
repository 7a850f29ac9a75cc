"""Online (streaming) packing: a candidate-buffer packer with exact resume, and a Megatron-Energon adapter.

``longpack.online.OnlinePacker`` is pure numpy. The Energon task-encoder mixin lives in
``longpack.online.energon`` and the Qwen-VL packing task encoder in ``longpack.online.vlm``; both are imported
only when asked for (they need ``megatron-energon``, ``pip install 'longpack[energon]'``; VLM also ``[vlm]``).
"""

from longpack.choices import ONLINE_OVERLENGTH_POLICIES
from longpack.online.packer import (
    OnlinePack,
    OnlinePacker,
    OnlineStateError,
    OnlineStats,
    fill_ratio,
    select_packs,
    selection_seed,
)
from longpack.topology import align_up as aligned_length

__all__ = [
    "ONLINE_OVERLENGTH_POLICIES",
    "OnlinePack",
    "OnlinePacker",
    "OnlineStateError",
    "OnlineStats",
    "aligned_length",
    "fill_ratio",
    "select_packs",
    "selection_seed",
]
