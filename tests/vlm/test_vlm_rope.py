"""3-D (mRoPE) positions equal transformers' ``get_rope_index`` on each sequence alone.

Oracles: the ``get_rope_index`` methods of transformers' ``Qwen2VLModel``, ``Qwen2_5_VLModel`` and
``Qwen3VLModel``, each built without weights from a tiny config (one layer, hidden size 16).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.vlm import VLMError, mrope_position_ids
from vlm_helpers import preparer, random_samples

pytest.importorskip("transformers")

IMAGE, VIDEO, START, END = 151655, 151656, 151652, 151653
TINY_TEXT = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 151936,
}


@cache
def hf_model(variant: str):
    import transformers

    if variant == "qwen2_vl":
        config = transformers.Qwen2VLConfig(
            text_config={**TINY_TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
            vision_config={"depth": 1, "embed_dim": 16, "hidden_size": 16, "num_heads": 2, "mlp_ratio": 1},
        )
        return transformers.Qwen2VLModel(config)
    vision = {"depth": 1, "hidden_size": 16, "out_hidden_size": 16, "num_heads": 2, "intermediate_size": 16}
    if variant == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(
            text_config=TINY_TEXT, vision_config={**vision, "tokens_per_second": 2}
        )
        return transformers.Qwen2_5_VLModel(config)
    config = transformers.Qwen3VLConfig(
        text_config={**TINY_TEXT, "head_dim": 8}, vision_config={**vision, "deepstack_visual_indexes": []}
    )
    return transformers.Qwen3VLModel(config)


def hf_positions(variant: str, ids, image_grid=None, video_grid=None, seconds=None) -> np.ndarray:
    model = hf_model(variant)
    ids_t = torch.as_tensor(np.asarray(ids), dtype=torch.long).unsqueeze(0)
    types = torch.zeros_like(ids_t, dtype=torch.int32)
    types[ids_t == IMAGE] = 1
    types[ids_t == VIDEO] = 2
    kwargs = {}
    if variant == "qwen2_5_vl" and seconds is not None:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds)
    grid = lambda g: None if g is None else torch.as_tensor(np.asarray(g), dtype=torch.long)  # noqa: E731
    positions, _ = model.get_rope_index(
        ids_t, types, image_grid_thw=grid(image_grid), video_grid_thw=grid(video_grid), **kwargs
    )
    return positions[:, 0].numpy()


def synthetic_sequence(rng: np.random.Generator, variant: str):
    """Text runs with images and videos between them (videos of Qwen3-VL: one run per frame, timestamps
    as text between frames, as its processor writes them)."""
    ids: list[int] = []
    images, videos, seconds = [], [], []
    for _ in range(int(rng.integers(1, 5))):
        ids += rng.integers(0, 1000, int(rng.integers(1, 6))).tolist()
        if rng.random() < 0.5:
            g = (1, 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 6)))
            images.append(g)
            ids += [START] + [IMAGE] * (g[1] * g[2] // 4) + [END]
        else:
            g = (int(rng.integers(1, 5)), 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4)))
            videos.append(g)
            seconds.append(float(rng.choice([0.5, 1.0, 1.5])))
            frames = 1 if variant == "qwen3_vl" else g[0]
            for _ in range(g[0] // frames):
                if variant == "qwen3_vl":
                    ids += rng.integers(0, 1000, 2).tolist()  # "<t seconds>" text
                ids += [START] + [VIDEO] * (frames * g[1] * g[2] // 4) + [END]
    ids += rng.integers(0, 1000, int(rng.integers(1, 4))).tolist()
    return ids, images or None, videos or None, seconds or None


@pytest.mark.parametrize("variant", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_synthetic_sequences_equal_transformers(variant: str, seed: int) -> None:
    ids, images, videos, seconds = synthetic_sequence(np.random.default_rng(seed), variant)
    ours = mrope_position_ids(
        ids, images, videos, seconds, image_token_id=IMAGE, video_token_id=VIDEO, merge_size=2,
        rope_variant=variant, tokens_per_second=2.0,
    )  # fmt: skip
    np.testing.assert_array_equal(ours, hf_positions(variant, ids, images, videos, seconds))


def test_prepared_sequences_equal_transformers() -> None:
    """Real prepared samples (processor grids, expanded pads) against Qwen2-VL's index, sample by sample."""
    prep = preparer()
    for sample in random_samples(12, seed=4):
        seq = prep.prepare(sample)
        ids = seq.row["input_ids"].numpy()
        expected = hf_positions("qwen2_vl", ids, seq.visual_values.get("image_grid_thw"))
        np.testing.assert_array_equal(seq.mrope_position_ids.numpy(), expected)


def test_grid_and_tokens_must_belong_together() -> None:
    with pytest.raises(VLMError, match=r"image 0: 3 pad tokens but its grid 1x4x4 \(merge 2\) needs 4"):
        mrope_position_ids([1, IMAGE, IMAGE, IMAGE, 2], [[1, 4, 4]], image_token_id=IMAGE, video_token_id=VIDEO,
                           merge_size=2)  # fmt: skip
    with pytest.raises(VLMError, match="2 image grids but 1 image token runs"):
        mrope_position_ids([1, IMAGE, 2], [[1, 2, 2], [1, 2, 2]], image_token_id=IMAGE, video_token_id=VIDEO,
                           merge_size=2)  # fmt: skip
