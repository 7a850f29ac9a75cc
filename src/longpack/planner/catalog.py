"""The planner's view of :mod:`longpack.catalog` (kept so ``from longpack.planner.catalog import
load_model`` keeps working; new code imports :mod:`longpack.catalog`).

>>> load_model("llama3_1_8b").num_layers, load_gpu("H100").nvlink_domain
(32, 8)
"""

from __future__ import annotations

from longpack.catalog import (
    AttentionSpec,
    CatalogError,
    GatedDeltaNetSpec,
    GPUSpec,
    ModelSpec,
    MoESpec,
    catalog_entry,
    list_gpus,
    list_models,
    load_gpu,
    load_model,
    model_from_hf_config,
)

__all__ = [
    "AttentionSpec",
    "CatalogError",
    "GPUSpec",
    "GatedDeltaNetSpec",
    "MoESpec",
    "ModelSpec",
    "catalog_entry",
    "list_gpus",
    "list_models",
    "load_gpu",
    "load_model",
    "model_from_hf_config",
]
