"""Videos: real frames decoded with PyAV from videos generated at test time; frame sampling and grids as
transformers' ``Qwen2VLVideoProcessor`` computes them. Its module imports torchvision (no CPU wheel here), so
the processor's own ``sample_frames`` and ``smart_resize`` are compiled from the installed transformers source
file and called directly (the real code, without the import it does not use)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from longpack.vlm import SampleRejected, VisionConfig
from longpack.vlm.video import (
    VideoConfig,
    read_video,
    sample_frame_indices,
    video_grid_thw,
    video_info,
    video_token_count,
)

av = pytest.importorskip("av")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def transformers_video_functions():
    """``(sample_frames, smart_resize, VideoMetadata)`` from transformers' Qwen2-VL video processor source."""
    from transformers.video_utils import VideoMetadata

    path = Path(transformers.__file__).parent / "models/qwen2_vl/video_processing_qwen2_vl.py"
    tree = ast.parse(path.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize"]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Qwen2VLVideoProcessor":
            wanted += [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames"]
    for fn in wanted:  # annotations name types the module imports; they are not needed to run
        fn.returns = None
        for arg in [*fn.args.args, *fn.args.kwonlyargs]:
            arg.annotation = None
    namespace = {"math": math, "torch": torch}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["sample_frames"], namespace["smart_resize"], VideoMetadata


def write_video(path: Path, frames: int, fps: int, width: int, height: int) -> list[int]:
    """An mpeg4 video whose frame i is a flat grey of level 10 * i (returned), written with PyAV."""
    levels = [(10 * i) % 250 for i in range(frames)]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for level in levels:
            image = np.full((height, width, 3), level, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return levels


@pytest.mark.parametrize(
    ("total", "fps", "config"),
    [(20, 10.0, VideoConfig()), (7, 30.0, VideoConfig()), (300, 30.0, VideoConfig()), (1000, 24.0, VideoConfig(max_frames=16)),
     (9, 1.0, VideoConfig(fps=0.5, min_frames=2)), (100, 25.0, VideoConfig(fps=3.0))],
)  # fmt: skip
def test_sampling_equals_the_processor(total: int, fps: float, config: VideoConfig) -> None:
    sample_frames, _, metadata = transformers_video_functions()

    class Settings:  # the processor attributes sample_frames reads
        num_frames = None
        temporal_patch_size = 2
        min_frames, max_frames = config.min_frames, config.max_frames

    expected = sample_frames(
        Settings(), metadata(total_num_frames=total, fps=fps, duration=total / fps), fps=config.fps
    )
    assert sample_frame_indices(total, fps, config).tolist() == expected.tolist()


def test_grids_equal_the_processor_rule() -> None:
    _, smart_resize, _ = transformers_video_functions()
    vision, video = VisionConfig(), VideoConfig()
    for w, h, n in [(64, 48, 4), (640, 360, 9), (1920, 1080, 32), (30, 500, 2)]:
        rh, rw = smart_resize(h, w, factor=28, min_pixels=video.min_pixels, max_pixels=video.max_pixels)
        assert video_grid_thw(n, w, h, vision, video) == (math.ceil(n / 2), rh // 14, rw // 14)
        assert video_token_count(n, w, h, vision, video) == math.ceil(n / 2) * rh * rw // 14**2 // 4


def test_frames_decoded_are_the_sampled_ones(tmp_path) -> None:
    path = tmp_path / "clip.mp4"
    levels = write_video(path, frames=20, fps=10, width=64, height=48)
    info = video_info(path)
    assert (info.frames, info.fps, info.width, info.height) == (20, 10.0, 64, 48)
    assert video_info(path.read_bytes()) == info
    frames = read_video(path, VideoConfig(), key="clip")
    keep = sample_frame_indices(20, 10.0, VideoConfig())
    assert frames.shape == (len(keep), 48, 64, 3) and frames.dtype == np.uint8
    # lossy codec: each decoded frame is its own flat level within a few grey steps
    assert np.abs(frames.reshape(len(keep), -1).mean(axis=1) - np.array(levels)[keep]).max() < 4


def test_an_unreadable_video_is_refused_with_its_key() -> None:
    with pytest.raises(SampleRejected, match=r"^sample v1: video cannot be read") as info:
        video_info(b"not a video", key="v1")
    assert info.value.reason == "undecodable"
