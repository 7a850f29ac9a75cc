"""LP-VLM-004's memory estimate and the packers count the same bytes: the rule's pixel term is the
``pixel_values`` term of :func:`longpack.vlm.prepare.prepared_nbytes` (the rules layer may not import the VLM
layer, so this test binds the two), and the encoders the rule treats as deferred are the deferred ones."""

from __future__ import annotations

import pytest

from longpack.choices import DEFERRED_VLM_ENCODERS
from longpack.rules.checks.vlm import pixel_bytes, worst_case_sample_bytes
from longpack.rules.config import setup_from_mapping
from longpack.vlm import VisionConfig
from longpack.vlm.prepare import prepared_nbytes


@pytest.mark.parametrize(("patch", "temporal"), [(14, 2), (16, 2), (14, 1)])
@pytest.mark.parametrize("patches", [1, 1024, 32768])
def test_the_rules_pixel_bytes_are_the_packers(patch: int, temporal: int, patches: int) -> None:
    setup = setup_from_mapping(
        {"dataset": {"task_encoder": {"patch_size": patch, "temporal_patch_size": temporal}}}
    ).setup
    vision = VisionConfig(patch_size=patch, temporal_patch_size=temporal)
    one_image = prepared_nbytes(0, [(1, patches, 1)], vision) - 3 * 8  # less the image's int64 grid row
    assert pixel_bytes(setup, patches) == one_image


def test_the_worst_sample_is_its_pixel_bytes() -> None:
    setup = setup_from_mapping({"dataset": {"seq_length": 4096}}).setup
    nbytes, patches, why = worst_case_sample_bytes(setup)
    assert nbytes == pixel_bytes(setup, patches) and patches == 4096 * 4 and "seq_length=4096" in why


def test_the_deferred_encoders_are_the_ones_that_defer() -> None:
    pytest.importorskip("megatron.energon")
    from longpack.online.vlm import EagerQwenVLPackingEncoder, QwenVLPackingEncoder

    def path(cls: type) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    assert path(QwenVLPackingEncoder) in DEFERRED_VLM_ENCODERS
    assert path(EagerQwenVLPackingEncoder) not in DEFERRED_VLM_ENCODERS
    assert hasattr(QwenVLPackingEncoder, "preencode_sample") and hasattr(
        QwenVLPackingEncoder, "postencode_sample"
    )
