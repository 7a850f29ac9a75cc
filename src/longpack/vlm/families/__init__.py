"""VLM model families: one module per family, one interface (:class:`VLMFamily`), looked up by name.

A family says how many LLM tokens an image becomes (from its width and height, which an image header gives
without decoding), how a prepared sample is made, what positions a sequence gets, and which keys its packed
batch carries. Families whose samples longpack prepares (``can_prepare``) plug into the in-batch collator
and the Energon encoders (Gemma3-VL's preparer runs a transformers ``Gemma3Processor``); the others count
visual tokens (planning, ``online-sim``), and Nemotron-VL has a preparer of its own
(:class:`~longpack.vlm.families.nemotron_vl.NemotronVLPreparer`) whose rows pack only for Bridge's
``llava_step`` (their budget is the length after the model expands each ``<image>``).

>>> sorted(FAMILIES)
['gemma3', 'glm4v', 'kimi_vl', 'nemotron_vl', 'qwen2_5_vl', 'qwen2_vl', 'qwen3_5_vl', 'qwen3_vl']
>>> [vlm_family(n).visual_tokens(640, 480) for n in ("qwen2_vl", "gemma3", "nemotron_vl")]
[391, 256, 3328]
>>> vlm_family("llava")
Traceback (most recent call last):
...
longpack.errors.ConfigError: unknown VLM family 'llava'; one of gemma3, glm4v, kimi_vl, nemotron_vl, qwen2_5_vl, qwen2_vl, qwen3_5_vl, qwen3_vl
"""

from __future__ import annotations

from typing import Any, Protocol

from longpack.errors import ConfigError
from longpack.vlm.families.gemma3 import Gemma3Family, Gemma3Preparer
from longpack.vlm.families.glm4v import Glm4vFamily
from longpack.vlm.families.kimi_vl import KimiVLFamily
from longpack.vlm.families.nemotron_vl import NemotronVLFamily
from longpack.vlm.families.qwen3_5_vl import Qwen35VLFamily
from longpack.vlm.families.qwen_vl import QwenVLFamily


class VLMFamily(Protocol):
    """The interface every family module implements."""

    name: str
    can_prepare: (
        bool  # longpack prepares this family's samples for the in-batch collator and Energon encoders
    )
    batch_keys: tuple[str, ...]  # visual keys of its packed batch, besides the THD text keys
    position_dims: int  # rows of its positions: 3 (multimodal rope, ``[3, L]``) or 1 (``[L]``)
    #: The :class:`~longpack.vlm.VLMConfig` fields its :meth:`preparer` reads (``vision`` / ``video``: the
    #: Qwen-VL resize and video settings; a processor-read family reads its own from the processor).
    config_fields: tuple[str, ...]

    def visual_tokens(self, width: int, height: int) -> int:
        """LLM tokens of one image of ``width`` x ``height`` pixels (the processor's count)."""
        ...

    def position_ids(self, input_ids: Any, visual_values: dict[str, Any]) -> Any:
        """Positions of one unpadded prepared sequence (``[L]`` or ``[3, L]``)."""
        ...

    def preparer(self, tokenizer: Any = "qwen3", image_processor: Any = None, **config: Any) -> Any:
        """A preparer of this family's samples (``prepare``, ``measure``, ``length``)."""
        ...

    def reported_settings(self, preparer: Any) -> dict[str, int | bool]:
        """The image settings a report names for samples ``preparer`` (one of this family's) counted."""
        ...


# Keyed by ``longpack.choices.VLM_FAMILIES`` (the one list of names; tests/vlm/test_vlm_families.py).
FAMILIES: dict[str, VLMFamily] = {
    "qwen2_vl": QwenVLFamily("qwen2_vl"),
    "qwen2_5_vl": QwenVLFamily("qwen2_5_vl"),
    "qwen3_vl": QwenVLFamily("qwen3_vl"),
    "qwen3_5_vl": Qwen35VLFamily(),
    "gemma3": Gemma3Family(),
    "nemotron_vl": NemotronVLFamily(),
    "glm4v": Glm4vFamily(),
    "kimi_vl": KimiVLFamily(),
}


def vlm_family(name: str) -> VLMFamily:
    """The registered family ``name`` (a :class:`~longpack.errors.ConfigError` listing them otherwise)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown VLM family {name!r}; one of {', '.join(sorted(FAMILIES))}", fields="family"
        ) from None


__all__ = [
    "FAMILIES",
    "Gemma3Family",
    "Gemma3Preparer",
    "Glm4vFamily",
    "KimiVLFamily",
    "NemotronVLFamily",
    "Qwen35VLFamily",
    "QwenVLFamily",
    "VLMFamily",
    "vlm_family",
]
