"""Nemotron-VL on the family registry (no transformers processor: its processor is remote code). Tokens per
tile equal megatron-core's ``get_num_image_embeddings`` (the installed function, as ``LLaVAModel`` sizes
``img_seq_len``); tile counts equal a restatement of Megatron-LM's ``dynamic_preprocess``
(``examples/multimodal/image_processing.py``: it resizes and crops a real image here, and the tiles are
counted); the collapsed row equals Bridge's ``adjust_image_tokens`` and the expanded boundaries Bridge's
``_expand_packed_metadata_for_visual_embeddings`` (``training/llava_step.py``, commit 067f987), both restated
below; ``scripts/vlm_bridge_harness.py`` runs Bridge's own two functions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.vlm import SampleError, VLMError
from longpack.vlm.families import FAMILIES, NemotronVLFamily, vlm_family
from longpack.vlm.families.nemotron_vl import collapse_image_tokens, expand_packed_boundaries

IMG, START, END = 131072, 131073, 131074


@pytest.mark.slow  # megatron-core's import takes ~10 s on a loaded 2-core machine
def test_tokens_per_tile_equal_megatron_core() -> None:
    clip = pytest.importorskip("megatron.core.models.vision.clip_vit_model")
    expected = clip.get_num_image_embeddings(512, 512, 16, "radio", True, 0, True)
    assert vlm_family("nemotron_vl").tokens_per_tile == expected == 256
    assert NemotronVLFamily(pixel_shuffle=False).tokens_per_tile == 1024
    assert "nemotron_vl" in FAMILIES


def megatron_tiles(width: int, height: int, *, max_num: int = 12, size: int = 512) -> int:
    """Megatron-LM's dynamic_preprocess, restated: resize, crop into tiles, add a thumbnail; count."""
    from PIL import Image

    image = Image.new("RGB", (width, height))
    ratios = sorted({(i, j) for n in range(1, max_num + 1) for i in range(1, n + 1) for j in range(1, n + 1)
                     if 1 <= i * j <= max_num}, key=lambda r: r[0] * r[1])  # fmt: skip
    aspect, best, best_diff = width / height, (1, 1), float("inf")
    for r in ratios:
        diff = abs(aspect - r[0] / r[1])
        if diff < best_diff:
            best_diff, best = diff, r
        elif diff == best_diff and width * height > 0.5 * size * size * r[0] * r[1]:
            best = r
    resized = image.resize((size * best[0], size * best[1]))
    cols = resized.size[0] // size
    crops = [resized.crop(((i % cols) * size, (i // cols) * size, (i % cols + 1) * size, (i // cols + 1) * size))
             for i in range(best[0] * best[1])]  # fmt: skip
    if len(crops) != 1:
        crops.append(image.resize((size, size)))
    assert all(c.size == (size, size) for c in crops)
    return len(crops)


SIZES = [(1, 1), (512, 512), (1024, 512), (513, 512), (1920, 1080), (1080, 1920), (640, 480), (100, 1000),
         (3000, 40), (40, 3000), (800, 600), (1023, 767), (2048, 2048), (300, 250), (7, 5), (1536, 1024)]  # fmt: skip


def test_tiles_equal_megatron_dynamic_preprocess() -> None:
    family = NemotronVLFamily()
    for w, h in SIZES:
        assert family.tiles(w, h) == megatron_tiles(w, h), (w, h)
        assert family.visual_tokens(w, h) == megatron_tiles(w, h) * 256
    with pytest.raises(SampleError, match="at least 1 pixel"):
        family.tiles(0, 5)


@settings(max_examples=40, deadline=None)
@given(w=st.integers(1, 2500), h=st.integers(1, 2500), max_num=st.sampled_from([1, 4, 6, 12]))
def test_tiles_equal_megatron_on_random_sizes(w: int, h: int, max_num: int) -> None:
    assert NemotronVLFamily(max_num_tiles=max_num).tiles(w, h) == megatron_tiles(w, h, max_num=max_num)


def test_collapse_keeps_one_media_token_per_tile_and_names_bad_regions() -> None:
    row = [1, 2, START, *[IMG] * 5, END, 3, START, *[IMG] * 2, END]
    assert collapse_image_tokens(row, [3, 1]).tolist() == [
        1,
        2,
        START,
        IMG,
        IMG,
        IMG,
        END,
        3,
        START,
        IMG,
        END,
    ]
    with pytest.raises(SampleError, match="2 <img> and 2 </img> regions for 1 tile counts") as info:
        collapse_image_tokens(row, [3])
    assert info.value.reason == "placeholder_mismatch"
    with pytest.raises(SampleError) as info:
        collapse_image_tokens([START, END], [1])
    assert info.value.reason == "malformed"
    with pytest.raises(VLMError, match=r"NemotronVLPreparer\.from_checkpoint"):
        vlm_family("nemotron_vl").preparer()


def bridge_expand(cu, cu_padded, input_ids, *, img_seq_len, max_len):
    """Bridge's llava_step boundary expansion, restated from its source."""
    physical = cu_padded if cu_padded is not None else cu
    n = cu.numel() - 1
    where = torch.nonzero(input_ids.squeeze(0) == IMG, as_tuple=True)[0]
    counts = torch.zeros(n, dtype=cu.dtype)
    if where.numel():
        counts = torch.bincount(torch.bucketize(where, physical[1:], right=True), minlength=n).to(cu.dtype)
    lengths = cu.diff() + counts * (img_seq_len - 1)
    spans = physical.diff() + counts * (img_seq_len - 1)
    if max_len is not None:
        ends = torch.cumsum(spans, 0).clamp(max=max_len)
        kept = torch.diff(torch.cat((physical[:1], ends)))
        spans, lengths = kept[kept > 0], torch.minimum(lengths[kept > 0], kept[kept > 0])
    out = {"cu_seqlens_q": torch.cat((cu[:1], torch.cumsum(lengths, 0).to(cu.dtype)))}
    if cu_padded is not None:
        out["cu_seqlens_q_padded"] = torch.cat((physical[:1], torch.cumsum(spans, 0).to(cu.dtype)))
    out["max_seqlen_q"] = int(spans.max())
    return out


@settings(max_examples=80, deadline=None)
@given(
    segments=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=5
    ),
    img_seq_len=st.sampled_from([1, 2, 256]),
    max_len=st.one_of(st.none(), st.integers(1, 3000)),
    padded=st.booleans(),
)
def test_expanded_boundaries_equal_bridge(segments, img_seq_len, max_len, padded) -> None:
    ids, lengths, spans = [], [], []
    for n, images, gap in segments:
        images = min(images, n)
        ids += [IMG] * images + [7] * (n - images) + [0] * (gap if padded else 0)
        lengths.append(n)
        spans.append(n + (gap if padded else 0))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    cu_padded = (
        torch.tensor([0, *torch.tensor(spans).cumsum(0).tolist()], dtype=torch.int32) if padded else None
    )
    input_ids = torch.tensor([ids])
    expected = bridge_expand(cu, cu_padded, input_ids, img_seq_len=img_seq_len, max_len=max_len)
    got = expand_packed_boundaries(
        cu, cu_padded, input_ids, tokens_per_tile=img_seq_len, language_max_sequence_length=max_len
    )
    assert (
        torch.equal(got["cu_seqlens_q"], expected["cu_seqlens_q"]) and got["cu_seqlens_q"].dtype == cu.dtype
    )
    assert torch.equal(got["cu_seqlens_kv"], expected["cu_seqlens_q"])
    assert ("cu_seqlens_q_padded" in got) == padded
    if padded:
        assert torch.equal(got["cu_seqlens_q_padded"], expected["cu_seqlens_q_padded"])
    assert got["max_seqlen_q"] == got["max_seqlen_kv"] == expected["max_seqlen_q"]


def test_llm_tokens_budget_the_expanded_row() -> None:
    family = NemotronVLFamily()
    row = [1, START, IMG, IMG, IMG, END, 2, START, IMG, END]
    cu = torch.tensor([0, len(row)], dtype=torch.int32)
    out = expand_packed_boundaries(cu, None, torch.tensor([row]))
    assert int(out["cu_seqlens_q"][-1]) == family.llm_tokens(len(row), [3, 1]) == len(row) + 4 * 255
