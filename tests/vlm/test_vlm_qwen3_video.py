"""Qwen3-VL videos: frame sampling, resize, timestamps, expanded text and 3-D positions against transformers
5.24's own Qwen3-VL code. Its video processor module imports torchvision (no CPU wheel here), so its
``sample_frames`` and ``smart_resize`` are compiled from the installed source file and called directly; the
timestamp text is the processor's own ``replace_video_token`` / ``_calculate_timestamps`` (its module imports
without torchvision); positions are ``Qwen3VLModel.get_rope_index`` on the prepared ids."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from longpack.vlm import SampleRejected, VisionConfig
from longpack.vlm.chat import normalize_conversation, render_pieces
from longpack.vlm.families import vlm_family
from longpack.vlm.video import (
    QWEN3_VL_VIDEO,
    VideoConfig,
    qwen3_frame_timestamps,
    qwen3_sample_frame_indices,
    qwen3_smart_resize,
    qwen3_video_grid_thw,
)
from vlm_helpers import png_bytes, video_bytes

av = pytest.importorskip("av")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VISION = VisionConfig(patch_size=16, rope_variant="qwen3_vl")
CHAT = [
    {"role": "user", "content": "<video>What changes?"},
    {"role": "assistant", "content": "The grey level."},
]


def qwen3_video_functions():
    """``(sample_frames, smart_resize)`` compiled from transformers' ``video_processing_qwen3_vl.py``."""
    path = Path(transformers.__file__).parent / "models/qwen3_vl/video_processing_qwen3_vl.py"
    tree = ast.parse(path.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize"]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Qwen3VLVideoProcessor":
            wanted += [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames"]
    for fn in wanted:
        fn.returns = None
        for arg in [*fn.args.args, *fn.args.kwonlyargs]:
            arg.annotation = None
    namespace = {"math": math, "np": np, "logger": None}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["sample_frames"], namespace["smart_resize"]


def metadata(total: int, fps: float):
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps)


def preparer(**config):
    return vlm_family("qwen3_vl").preparer(**config)


@pytest.mark.parametrize(
    ("total", "fps", "config"),
    [(20, 10.0, QWEN3_VL_VIDEO), (7, 30.0, QWEN3_VL_VIDEO), (301, 30.0, QWEN3_VL_VIDEO), (3, 1.0, QWEN3_VL_VIDEO),
     (1000, 24.0, VideoConfig(max_frames=16)), (9, 1.0, VideoConfig(fps=0.5, min_frames=2)),
     (101, 25.0, VideoConfig(fps=3.0))],
)  # fmt: skip
def test_sampling_equals_the_qwen3_processor(total: int, fps: float, config: VideoConfig) -> None:
    sample_frames, _ = qwen3_video_functions()
    settings = SimpleNamespace(fps=2, min_frames=config.min_frames, max_frames=config.max_frames)
    expected = sample_frames(settings, metadata(total, fps), fps=config.fps)
    assert qwen3_sample_frame_indices(total, fps, config).tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("frames", "width", "height"),
    [(4, 64, 48), (3, 64, 48), (9, 640, 360), (32, 1920, 1080), (600, 1920, 1080), (2, 30, 500), (5, 10, 20)],
)
def test_resize_and_grid_equal_the_qwen3_processor(frames: int, width: int, height: int) -> None:
    _, smart_resize = qwen3_video_functions()
    limits = {"min_pixels": QWEN3_VL_VIDEO.min_pixels, "max_pixels": QWEN3_VL_VIDEO.max_pixels}
    expected = smart_resize(frames, height, width, temporal_factor=2, factor=32, **limits)
    assert qwen3_smart_resize(frames, height, width, temporal_factor=2, factor=32, **limits) == expected
    assert qwen3_video_grid_thw(frames, width, height, VISION, QWEN3_VL_VIDEO) == (
        math.ceil(frames / 2),
        expected[0] // 16,
        expected[1] // 16,
    )


def processor_placeholder(grid, indices, fps: float) -> str:
    """transformers' ``Qwen3VLProcessor.replace_video_token`` run on one video's grid and metadata."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    owner = SimpleNamespace(
        video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
        vision_start_token="<|vision_start|>",
        vision_end_token="<|vision_end|>",
        video_token="<|video_pad|>",
    )
    owner._calculate_timestamps = lambda *a: Qwen3VLProcessor._calculate_timestamps(owner, *a)
    meta = VideoMetadata(total_num_frames=0, fps=fps, frames_indices=list(indices))
    inputs = {"video_grid_thw": torch.tensor([grid]), "video_metadata": [meta]}
    return Qwen3VLProcessor.replace_video_token(owner, inputs, 0)


@pytest.mark.parametrize(
    ("frames", "fps", "width", "height"), [(20, 10, 64, 48), (9, 3, 90, 30), (31, 24, 40, 40), (5, 2, 64, 64)]
)
def test_prepared_video_text_counts_and_positions_equal_transformers(
    frames: int, fps: int, width: int, height: int
) -> None:
    from test_vlm_rope import hf_positions

    sample_frames, smart_resize = qwen3_video_functions()
    keep = sample_frames(SimpleNamespace(fps=2, min_frames=4, max_frames=768), metadata(frames, fps), fps=2.0)
    rh, rw = smart_resize(len(keep), height, width, temporal_factor=2, factor=32,
                          min_pixels=QWEN3_VL_VIDEO.min_pixels, max_pixels=QWEN3_VL_VIDEO.max_pixels)  # fmt: skip
    grid = [math.ceil(len(keep) / 2), rh // 16, rw // 16]
    prep = preparer(max_visual_tokens=None)
    sample = {"messages": CHAT, "videos": [video_bytes(frames, fps, width, height)]}
    prepared = prep.prepare(sample, key="v")
    assert prepared.visual_values["video_grid_thw"].tolist() == [grid]
    assert "second_per_grid_ts" not in prepared.visual_values  # Qwen3-VL's processor gives none
    assert prepared.visual_values["pixel_values_videos"].shape == (
        grid[0] * grid[1] * grid[2],
        3 * 2 * 16 * 16,
    )
    assert prepared.visual_tokens == grid[0] * grid[1] * grid[2] // 4
    # the text: the chat template's video placeholder with its pad replaced as the processor replaces it
    text = "".join(t for t, _ in render_pieces(normalize_conversation(sample)))
    text = text.replace("<|video_pad|>", processor_placeholder(grid, keep, float(fps)))
    assert prepared.row["input_ids"].tolist() == prep.tokenizer.encode(text)
    assert int((prepared.row["input_ids"] == prep.video_token_id).sum()) == prepared.visual_tokens
    assert float(prepared.row["loss_mask"].sum()) > 0
    ids = prepared.row["input_ids"].numpy()
    np.testing.assert_array_equal(
        prepared.mrope_position_ids.numpy(),
        hf_positions("qwen3_vl", ids, None, prepared.visual_values["video_grid_thw"]),
    )
    length = prep.length(sample, key="v")  # from the header, no frame decoded
    assert (length.tokens, length.visual_tokens, length.prepared_nbytes) == (
        prepared.sequence_length,
        prepared.visual_tokens,
        prepared.nbytes,
    )


def test_timestamps_equal_the_processor() -> None:
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    for indices, fps in [([0, 6, 13, 19], 10.0), ([0, 6, 13, 19, 25], 10.0), (list(range(0, 90, 7)), 29.97)]:
        expected = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2)
        assert qwen3_frame_timestamps(indices, fps) == expected


def test_images_and_videos_mixed_and_in_batch_packing() -> None:
    from test_vlm_rope import hf_positions

    from longpack.runtime.in_batch import VisualInBatchCollator

    prep = preparer(max_visual_tokens=None)
    mixed = {
        "__key__": "m",
        "messages": [{"role": "user", "content": "<image>then<video>and?"}, CHAT[1]],
        "images": [png_bytes(64, 48)],
        "videos": [video_bytes(12, 6, 64, 48)],
    }
    seq = prep.prepare(mixed)
    np.testing.assert_array_equal(
        seq.mrope_position_ids.numpy(),
        hf_positions("qwen3_vl", seq.row["input_ids"].numpy(), seq.visual_values["image_grid_thw"],
                     seq.visual_values["video_grid_thw"]),
    )  # fmt: skip
    video = {"__key__": "v", "messages": CHAT, "videos": [video_bytes(20, 10, 64, 48)]}
    frames = {"__key__": "f", "messages": CHAT, "videos": [[png_bytes(64, 48)] * 4]}
    batch = VisualInBatchCollator(prep.prepare, sequence_length=8192)([mixed, frames, video])
    assert batch["sample_keys"] == ["m", "v"]
    assert [(r["key"], r["reason"]) for r in batch["skipped"]] == [("f", "unsupported_video")]
    assert batch["visual_inputs"]["video_grid_thw"].tolist() == [
        *seq.visual_values["video_grid_thw"].tolist(),
        *prep.prepare(video).visual_values["video_grid_thw"].tolist(),
    ]
    # the packed row's 3-D positions restart per sequence: each equals transformers' index of its sequence
    cu = batch["cu_seqlens_q"].tolist()
    second = batch["input_ids"][0, cu[1] : cu[2]].numpy()
    np.testing.assert_array_equal(
        batch["mrope_position_ids"][:, 0, cu[1] : cu[2]].numpy(),
        hf_positions("qwen3_vl", second, None, prep.prepare(video).visual_values["video_grid_thw"]),
    )


@pytest.mark.parametrize(
    ("make", "reason", "message"),
    [
        (lambda: video_bytes(1, 10, 32, 32), "empty_video", "Qwen3-VL's video resize needs 2"),
        (lambda: b"not a video", "undecodable", "video cannot be read"),
        (lambda: [png_bytes(32, 32)] * 2, "unsupported_video", "a frame list has no frame rate"),
    ],
    ids=["one-frame", "garbage", "frame-list"],
)
def test_bad_qwen3_videos_are_refused_naming_the_sample(make, reason: str, message: str) -> None:
    prep = preparer(max_visual_tokens=None)
    sample = {"messages": CHAT, "videos": [make()]}
    for call in (prep.measure, prep.prepare):
        with pytest.raises(SampleRejected, match=rf"^sample q: .*{message}") as info:
            call(sample, key="q")
        assert info.value.reason == reason and info.value.key == "q"
