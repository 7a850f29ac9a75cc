"""Qwen-VL rows: packed = unpacked with mRoPE (3-D) positions, image features and the text decoder; faults fail.

Sequences are prepared by longpack's ``QwenVLPreparer`` on transformers' real Qwen2-VL image processor, from
generated images; the model is a tiny random Qwen2.5-VL / Qwen2-VL built from the config alone.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from tests.vlm_helpers import preparer, random_samples

from longpack.errors import ConfigError
from longpack.runtime.verify_vlm import VISUAL_FAULTS, build_visual_model, verify_visual_row

pytestmark = pytest.mark.slow  # ~20 s: two tiny VL models, 8 rows checked with gradients

QWEN25_VL = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "qwen2_5_vl_7b.json"


def source(family: str) -> dict:
    config = json.loads(QWEN25_VL.read_text())
    if family == "qwen2_vl":  # Qwen2-VL-7B: the same text decoder, the Qwen2-VL vision tower
        config["model_type"] = "qwen2_vl"
        config["vision_config"] = {
            "depth": 32,
            "embed_dim": 1280,
            "mlp_ratio": 4,
            "num_heads": 16,
            "in_chans": 3,
            "hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
    return config


@cache
def model(family: str):
    return build_visual_model(source(family))


@cache
def sequences():
    prep = preparer()
    return tuple(prep.prepare(sample) for sample in random_samples(5, 3, max_side=120))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl"])
@pytest.mark.parametrize("multiple", [1, 8])
def test_qwen_vl_row_packed_equals_unpacked(family, multiple):
    seqs = sequences()
    assert any(s.visual_tokens for s in seqs) and len(seqs) >= 3
    report = verify_visual_row(seqs, model(family), pad_to_multiple_of=multiple)
    assert report.ok, report.failures
    assert report.loss_max_rel_diff <= 1e-12 and report.grad_max_rel_diff <= 1e-12
    assert report.embedding_grad_max_rel_diff <= 1e-12 and report.vision_max_rel_diff <= 1e-12
    assert report.leak_max_abs == 0.0


@pytest.mark.parametrize(
    ("fault", "check"),
    [("positions-not-restarted", "metadata"), ("positions-1d", "metadata"), ("drop-cu-seqlens", "isolation")],
)
def test_qwen_vl_faults_fail(fault, check):
    report = verify_visual_row(sequences(), model("qwen2_5_vl"), fault=fault)
    assert not report.ok
    assert check in {f.check for f in report.failures}
    assert "loss" in {f.check for f in report.failures}  # the model sees the difference too


def test_visual_fault_names_and_model_types_are_checked():
    assert set(VISUAL_FAULTS) == {"positions-not-restarted", "positions-1d", "drop-cu-seqlens"}
    with pytest.raises(ConfigError, match="fault must be one of"):
        verify_visual_row(sequences(), model("qwen2_5_vl"), fault="nope")
    with pytest.raises(ConfigError, match="Qwen-VL rows"):
        build_visual_model({"model_type": "llama"})
