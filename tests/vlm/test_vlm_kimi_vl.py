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
from PIL import Image

from longpack import choices
from longpack.vlm import SampleError, VLMError
from longpack.vlm.families import FAMILIES, KimiVLFamily, vlm_family
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
