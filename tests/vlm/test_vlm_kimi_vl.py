"""Kimi-VL (Kimi K2.5) on the family registry: visual token counts from image headers equal transformers'
``Kimi_K25ImageProcessor`` (built offline from its defaults; the grid it returns, and its tokens per image as
``Kimi_K25Processor.replace_image_token`` and Bridge's ``_expand_image_tokens`` count them: ``t * h/2 * w/2``).

That processor is torchvision-only (no PIL backend in transformers 5.24) and torchvision has no CPU wheel
here, so where it cannot be imported its own ``navit_resize`` is taken from the installed file with ``ast``
and run on the image sizes, with the grid and count arithmetic of its ``get_number_of_image_patches`` and
``Kimi_K25Processor._get_num_multimodal_tokens``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from longpack import choices
from longpack.vlm import SampleError, VLMError
from longpack.vlm.families import FAMILIES, KimiVLFamily, vlm_family
from longpack.vlm.families.kimi_vl import MEDIA_TOKEN_ID
from longpack.vlm.vision import image_size

KIMI_MODULE = "transformers.models.kimi_k25.image_processing_kimi_k25"

SIZES = [(1, 1), (13, 13), (14, 14), (27, 29), (33, 20), (100, 1000), (1000, 100), (224, 224), (300, 250),
         (640, 480), (480, 640), (20, 3000), (57, 113)]  # fmt: skip
LARGE = [(1920, 1080), (2000, 2000), (8000, 100)]  # over max_patches; a side over 512 patches


def solid_png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 60)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def installed_navit_resize():
    """transformers' ``navit_resize``, compiled from the installed file (its module imports torchvision), and
    the processor class's literal defaults (``patch_size``, ``merge_size``, ``max_patches``, ``size``)."""
    spec = importlib.util.find_spec(KIMI_MODULE)
    if spec is None or spec.origin is None:
        pytest.skip("transformers without kimi_k25")
    tree = ast.parse(Path(spec.origin).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "navit_resize")
    namespace: dict = {"math": math}
    exec(compile(ast.Module(body=[node], type_ignores=[]), spec.origin, "exec"), namespace)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Kimi_K25ImageProcessor")
    defaults = {
        a.targets[0].id: ast.literal_eval(a.value)
        for a in cls.body
        if isinstance(a, ast.Assign) and isinstance(a.targets[0], ast.Name)
        and a.targets[0].id in ("patch_size", "merge_size", "max_patches", "size")
    }  # fmt: skip
    return namespace["navit_resize"], defaults


def assert_counts_equal_the_processor(sizes: list[tuple[int, int]]) -> None:
    family = vlm_family("kimi_vl")
    try:
        processor = importlib.import_module(KIMI_MODULE).Kimi_K25ImageProcessor()  # defaults; no download
    except ImportError:  # no torchvision: the processor's resize function and its defaults
        navit_resize, d = installed_navit_resize()
        assert len(d) == 4
        for w, h in sizes:
            _, (pad_h, pad_w) = navit_resize(
                h, w, patch_size=d["patch_size"], merge_kernel_size=d["merge_size"],
                max_patches=d["max_patches"], max_size_per_side=d["size"]["max_height"],
            )  # fmt: skip
            grid_h, grid_w = pad_h // d["patch_size"], pad_w // d["patch_size"]
            assert family.grid(*image_size(solid_png(w, h))) == (1, grid_h, grid_w), (w, h)
            assert family.visual_tokens(w, h) == grid_h * grid_w // d["merge_size"] ** 2, (w, h)
        return
    for w, h in sizes:
        data = solid_png(w, h)
        out = processor(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
        grid = out["image_grid_thw"][0].tolist()
        assert family.grid(*image_size(data)) == tuple(grid), (w, h)
        t, gh, gw = grid
        assert family.visual_tokens(w, h) == t * (gh // 2) * (gw // 2), (w, h)
        assert family.visual_tokens(w, h) == processor.get_number_of_image_patches(h, w) // 4
        assert out["pixel_values"].shape[0] == int(np.prod(grid))


def test_registered() -> None:
    assert "kimi_vl" in choices.VLM_FAMILIES and isinstance(FAMILIES["kimi_vl"], KimiVLFamily)
    with pytest.raises(VLMError, match="not prepared"):
        vlm_family("kimi_vl").preparer()
    with pytest.raises(SampleError) as caught:
        vlm_family("kimi_vl").visual_tokens(0, 3)
    assert caught.value.reason == "empty_image"
    assert vlm_family("kimi_vl").position_ids([5, 6, 7], {}).tolist() == [0, 1, 2]


def test_counts_from_headers_equal_the_processor() -> None:
    assert_counts_equal_the_processor(SIZES)


@pytest.mark.slow  # the processor resizes multi-megapixel images
def test_counts_equal_the_processor_when_scaled_down() -> None:
    assert_counts_equal_the_processor(LARGE)


def kimi_sample(seed: int) -> dict:
    """A Kimi K2.5 processor output as Bridge's collate reads it: ids with one ``<|media_pad|>`` per image
    (0-2 images of random grids), its attention mask, an assistant loss mask, ``grid_thws`` and pixels."""
    rng = np.random.default_rng(seed)
    ids: list[int] = rng.integers(1, 9000, 3).tolist()
    grids = []
    for _ in range(int(rng.integers(0, 3))):
        grids.append([1, 2 * int(rng.integers(1, 5)), 2 * int(rng.integers(1, 5))])
        ids += [MEDIA_TOKEN_ID, *rng.integers(1, 9000, int(rng.integers(1, 4))).tolist()]
    ids += rng.integers(1, 9000, int(rng.integers(2, 12))).tolist()
    n = len(ids)
    out = {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.ones(n, dtype=torch.long),
        "loss_mask": torch.tensor((np.arange(n) >= n // 2).astype(np.int64)),  # the assistant's half
    }
    if grids:
        out["grid_thws"] = torch.tensor(grids)
        out["pixel_values"] = torch.rand(int(sum(np.prod(g) for g in grids)), 3, 14, 14)
    return out


def bridge_kimi_packed(samples: list[dict], *, sequence_length, pad_to_multiple_of: int, pad_token_id: int):
    """Bridge's ``kimi_k25_vl_collate_fn(enable_in_batch_packing=True)`` after its processor call, restated
    (``models/kimi_vl/data/collate_fn.py`` @067f987): ``_expand_image_tokens_and_aligned_mask`` token by token,
    the rows it builds, ``build_mcore_thd_sequence_batch_from_rows`` (restated in test_vlm_batch.py) and
    ``GenericVisualInputs(pixel_values, image_grid_thw)``. ``scripts/vlm_bridge_harness.py`` runs the real one."""
    from test_vlm_batch import bridge_packed_batch

    seqs = []
    for s in samples:
        counts = [t * (h // 2) * (w // 2) for t, h, w in s["grid_thws"].tolist()] if "grid_thws" in s else []
        ids, attention, loss, k = [], [], [], 0
        columns = (s["input_ids"].tolist(), s["attention_mask"].tolist(), s["loss_mask"].tolist())
        for token, a, m in zip(*columns, strict=True):
            if token == MEDIA_TOKEN_ID and k < len(counts):
                ids += [token] * counts[k]
                attention += [1] * counts[k]
                loss += [m] * counts[k]
                k += 1
                continue
            ids.append(token)
            attention.append(a)
            loss.append(m)
        input_ids, mask = torch.tensor(ids), torch.tensor(loss, dtype=torch.float32)
        shifted = torch.cat([mask[1:], mask.new_zeros(1)])
        labels = torch.cat([input_ids[1:], input_ids.new_full((1,), -100)])
        row = {"input_ids": input_ids, "attention_mask": torch.tensor(attention), "loss_mask": shifted,
               "position_ids": torch.arange(len(ids)), "labels": labels.masked_fill(shifted == 0, -100)}  # fmt: skip
        seqs.append(type("Seq", (), {"row": row, "visual_values": {}})())
    out = bridge_packed_batch(
        seqs,
        sequence_length=sequence_length,
        pad_to_multiple_of=pad_to_multiple_of,
        pad_token_id=pad_token_id,
    )
    visual = {}
    if any("pixel_values" in s for s in samples):
        visual["pixel_values"] = torch.cat([s["pixel_values"] for s in samples if "pixel_values" in s])
    if any("grid_thws" in s for s in samples):
        visual["image_grid_thw"] = torch.cat([s["grid_thws"] for s in samples if "grid_thws" in s])
    out["visual_inputs"] = visual
    return out


@pytest.mark.parametrize(("multiple", "length", "pad_id"), [(1, None, 0), (8, 4096, 163838)])
def test_per_row_packing_equals_bridges_kimi_collate(multiple: int, length, pad_id: int) -> None:
    from test_vlm_batch import assert_same_batch

    from longpack.runtime.in_batch import build_kimi_thd_batch

    samples = [kimi_sample(seed) for seed in range(10)]
    assert sum("grid_thws" in s for s in samples) >= 3
    kwargs = {"sequence_length": length, "pad_to_multiple_of": multiple, "pad_token_id": pad_id}
    ours = build_kimi_thd_batch(samples, **kwargs)
    assert_same_batch(ours, bridge_kimi_packed(samples, **kwargs))
    # every image's placeholders are its count of KimiVLFamily tokens' rule (t * h/2 * w/2)
    placed = int((ours["input_ids"] == MEDIA_TOKEN_ID).sum())
    assert placed == sum(
        t * h * w // 4 for s in samples for t, h, w in s.get("grid_thws", torch.zeros(0, 3)).tolist()
    )


def test_per_row_packing_refuses_placeholders_that_do_not_match_the_grids() -> None:
    from longpack.runtime.in_batch import InBatchPackingError, build_kimi_thd_batch

    sample = kimi_sample(1)
    while "grid_thws" not in sample:
        sample = kimi_sample(int(sample["input_ids"][0]))
    broken = {**sample, "grid_thws": torch.cat([sample["grid_thws"], sample["grid_thws"][:1]])}
    with pytest.raises(
        InBatchPackingError, match=r"sample 0: \d+ <\|media_pad\|> placeholders for \d+ grid_thws"
    ):
        build_kimi_thd_batch([broken])
