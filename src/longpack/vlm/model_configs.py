"""Released VLM checkpoints' model configs that ship with longpack (``longpack/data/vlm_model_configs.yaml``),
so ``longpack verify --vlm SAMPLES --model qwen2_5_vl_7b`` runs with nothing downloaded. One entry per family
``verify --vlm`` builds (:data:`longpack.runtime.verify_vlm.VISUAL_MODEL_TYPES`), named by its checkpoint.

Pure Python + PyYAML.

>>> sorted(VLM_MODEL_CONFIGS)
['qwen2_5_vl_7b', 'qwen2_vl_7b']
>>> config = vlm_model_config("Qwen/Qwen2.5-VL-7B-Instruct")
>>> config["model_type"], config["vision_config"]["patch_size"], config["rope_scaling"]["mrope_section"]
('qwen2_5_vl', 14, [16, 24, 24])
>>> vlm_model_config("qwen3_8b") is None
True
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from typing import Any

import yaml


@functools.cache
def _entries() -> dict[str, dict[str, Any]]:
    text = resources.files("longpack").joinpath("data/vlm_model_configs.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return {str(name): dict(entry) for name, entry in data.items()}


VLM_MODEL_CONFIGS: tuple[str, ...] = tuple(sorted(_entries()))


def vlm_model_config(name: str) -> dict[str, Any] | None:
    """The ``config.json`` dict of a shipped VLM checkpoint named ``name`` (its key, e.g. ``qwen2_5_vl_7b``,
    any case, ``-`` or ``.`` for ``_``; or its hub id, e.g. ``Qwen/Qwen2.5-VL-7B-Instruct``), a fresh copy;
    ``None`` for any other name."""
    key = name.strip().lower().replace("-", "_").replace(".", "_")
    for entry_name, entry in _entries().items():
        if key == entry_name or name.strip().lower() == str(entry.get("hf_id", "")).lower():
            return copy.deepcopy(dict(entry["config"]))
    return None
