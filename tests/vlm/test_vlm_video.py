"""Videos: real frames decoded with PyAV from videos generated at test time; frame sampling, grids and patch
layout as transformers' ``Qwen2VLVideoProcessor`` computes them. Its module imports torchvision (no CPU wheel
here), so the processor's own ``sample_frames``, ``smart_resize`` and ``patchify`` are compiled from the
installed transformers source file and called directly (the real code, without the import it does not use);
token counts are also checked against the image processor run on each frame (one frame pair = one temporal
grid of that frame's image grid)."""

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
from longpack.vlm.vision import decode_image
from vlm_helpers import png_bytes, preparer, video_bytes

av = pytest.importorskip("av")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def transformers_video_functions():
    """``(sample_frames, smart_resize, VideoMetadata)`` from transformers' Qwen2-VL video processor source
    (its ``patchify`` is in the namespace as ``patchify``)."""
    from transformers.video_utils import VideoMetadata

    path = Path(transformers.__file__).parent / "models/qwen2_vl/video_processing_qwen2_vl.py"
    tree = ast.parse(path.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize"]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Qwen2VLVideoProcessor":
            wanted += [
                n
                for n in node.body
                if isinstance(n, ast.FunctionDef) and n.name in ("sample_frames", "patchify")
            ]
    for fn in wanted:  # annotations name types the module imports; they are not needed to run
        fn.returns = None
        for arg in [*fn.args.args, *fn.args.kwonlyargs]:
            arg.annotation = None
    namespace = {"math": math, "torch": torch}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    transformers_video_functions.patchify = namespace["patchify"]
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


CHAT = [
    {"role": "user", "content": "<video>What changes?"},
    {"role": "assistant", "content": "The grey level."},
]


@pytest.mark.parametrize(
    ("frames", "fps", "width", "height"), [(20, 10, 64, 48), (9, 3, 90, 30), (30, 24, 40, 40)]
)
def test_prepared_video_tokens_equal_the_processor_rule_and_the_image_processor_per_frame_pair(
    frames: int, fps: int, width: int, height: int
) -> None:
    sample_frames, smart_resize, metadata = transformers_video_functions()
    video_cfg = VideoConfig()

    class Settings:
        num_frames = None
        temporal_patch_size = 2
        min_frames, max_frames = video_cfg.min_frames, video_cfg.max_frames

    kept = len(
        sample_frames(Settings(), metadata(total_num_frames=frames, fps=fps, duration=frames / fps), fps=2.0)
    )
    rh, rw = smart_resize(
        height, width, factor=28, min_pixels=video_cfg.min_pixels, max_pixels=video_cfg.max_pixels
    )
    data = video_bytes(frames, fps, width, height)
    prep = preparer(max_visual_tokens=None)
    sample = {"messages": CHAT, "videos": [data]}
    prepared = prep.prepare(sample, key="v")
    grid = prepared.visual_values["video_grid_thw"].tolist()
    assert grid == [[math.ceil(kept / 2), rh // 14, rw // 14]]
    pads = int((prepared.row["input_ids"] == prep.video_token_id).sum())
    assert pads == prepared.visual_tokens == math.ceil(kept / 2) * rh * rw // 14**2 // 4
    # the image processor on one frame with the video pixel limits: one frame pair is one such grid
    frame = np.zeros((height, width, 3), dtype=np.uint8)
    size = {"shortest_edge": video_cfg.min_pixels, "longest_edge": video_cfg.max_pixels}
    one = prep.image_processor(images=[frame], return_tensors="pt", size=size)["image_grid_thw"].tolist()
    assert pads == math.ceil(kept / 2) * (one[0][1] * one[0][2] // 4)
    assert prepared.visual_values["pixel_values_videos"].shape == (
        math.ceil(kept / 2) * rh * rw // 14**2,
        1176,
    )
    # Qwen2.5-VL's seconds per temporal grid: temporal_patch_size / sampled fps
    assert prepared.visual_values["second_per_grid_ts"].tolist() == pytest.approx([2 / (kept / frames * fps)])
    length = prep.length(sample, key="v")  # from the container header, no frame decoded
    assert (length.tokens, length.visual_tokens, length.prepared_nbytes) == (
        prepared.sequence_length,
        prepared.visual_tokens,
        prepared.nbytes,
    )


def normalized(frames: np.ndarray, height: int, width: int) -> torch.Tensor:
    """Frames resized and normalized as the video processor does (``[n, 3, height, width]`` float32); the
    whole of it is checked against the real processors in ``test_vlm_video_pixels.py``."""
    from longpack.vlm.video import RESCALE_FACTOR, processor_resize

    mean = torch.tensor(VideoConfig().image_mean) * (1.0 / RESCALE_FACTOR)
    std = torch.tensor(VideoConfig().image_std) * (1.0 / RESCALE_FACTOR)
    resized = processor_resize(frames, (height, width)).to(torch.float32)
    return (resized - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)


def test_video_pixels_are_the_video_processors_patches_of_the_sampled_frames() -> None:
    """Each frame resized and normalized as the video processor does, stacked, and cut by the video
    processor's own ``patchify``: the preparer's ``pixel_values_videos`` (frames differ, so a swapped pair
    shows)."""
    _, smart_resize, _ = transformers_video_functions()
    patchify = transformers_video_functions.patchify
    prep = preparer(max_visual_tokens=None)
    data = video_bytes(20, 10, 64, 48)
    prepared = prep.prepare({"messages": CHAT, "videos": [data]}, key="v")
    frames = read_video(data, VideoConfig(), key="v")
    rh, rw = smart_resize(
        48, 64, factor=28, min_pixels=VideoConfig().min_pixels, max_pixels=VideoConfig().max_pixels
    )
    images = normalized(frames, rh, rw)
    expected, t, h, w = patchify(None, images[None], patch_size=14, merge_size=2, temporal_patch_size=2)
    assert (t, h, w) == tuple(prepared.visual_values["video_grid_thw"][0].tolist())
    torch.testing.assert_close(prepared.visual_values["pixel_values_videos"], expected[0], rtol=0, atol=0)
    pairs = prepared.visual_values["pixel_values_videos"].reshape(t, h * w, 3, 2, 14, 14)
    assert (pairs[:, :, :, 0] != pairs[:, :, :, 1]).any()


@pytest.mark.parametrize(
    ("make", "reason", "message"),
    [
        (lambda: b"not a video at all", "undecodable", "video cannot be read"),
        (lambda: video_bytes(20, 10, 64, 48)[:300], "undecodable", "video cannot be read"),
        (lambda: b"", "empty_video", "is empty"),
        (lambda: video_bytes(0, 10, 32, 32, container="avi"), "empty_video", "a video of 0 frames"),
        (lambda: video_bytes(1, 10, 32, 32), "empty_video", "no group of 2 frames"),
        (lambda: video_bytes(200, 10, 64, 48), "too_long", "max_length=512"),
    ],
    ids=["garbage", "truncated", "zero-bytes", "zero-frames", "one-frame", "too-long"],
)
def test_bad_videos_are_refused_naming_the_sample_and_reason(make, reason: str, message: str) -> None:
    prep = preparer(max_visual_tokens=None, max_length=512)
    sample = {"messages": CHAT, "videos": [make()]}
    for call in (prep.measure, prep.prepare):
        with pytest.raises(SampleRejected, match=rf"^sample bad-video: .*{message}") as info:
            call(sample, key="bad-video")
        assert info.value.reason == reason and info.value.key == "bad-video"


def test_frame_lists_are_kept_as_bridge_gives_them_to_the_video_processor() -> None:
    """Megatron-Bridge's Energon video samples are pre-extracted frames: the first ``max_num_frames`` (60) are
    kept, none is resampled (``do_sample_frames=False``), the last is repeated up to a frame pair; no
    ``second_per_grid_ts`` (Bridge passes no rate)."""
    transformers_video_functions()
    _, smart_resize, _ = transformers_video_functions()
    patchify = transformers_video_functions.patchify
    prep = preparer(max_visual_tokens=None)
    frames = [png_bytes(64, 48, seed=i) for i in range(5)]
    sample = {"messages": CHAT, "videos": [frames]}
    prepared = prep.prepare(sample, key="f")
    rh, rw = smart_resize(
        48, 64, factor=28, min_pixels=VideoConfig().min_pixels, max_pixels=VideoConfig().max_pixels
    )
    assert prepared.visual_values["video_grid_thw"].tolist() == [[3, rh // 14, rw // 14]]
    assert "second_per_grid_ts" not in prepared.visual_values
    length = prep.length(sample, key="f")
    assert (length.tokens, length.prepared_nbytes) == (prepared.sequence_length, prepared.nbytes)
    # pixels: the video processor's patchify of the 5 frames and the last one again
    decoded = np.stack([np.asarray(decode_image(f)) for f in frames])
    images = normalized(decoded, rh, rw)  # patchify repeats the last frame up to a pair
    expected = patchify(None, images[None], patch_size=14, merge_size=2, temporal_patch_size=2)[0]
    torch.testing.assert_close(prepared.visual_values["pixel_values_videos"], expected[0], rtol=0, atol=0)
    # 70 frames: the first 60 are kept
    many = prep.length({"messages": CHAT, "videos": [[frames[0]] * 70]}, key="m")
    assert many.video_grids == ((30, rh // 14, rw // 14),)


def test_bad_frame_lists_are_refused_naming_the_sample() -> None:
    prep = preparer(max_visual_tokens=None)
    with pytest.raises(
        SampleRejected, match=r"^sample f0: a video given as a frame list with no frame"
    ) as info:
        prep.prepare({"messages": CHAT, "videos": [[]]}, key="f0")
    assert info.value.reason == "empty_video"
    with pytest.raises(SampleRejected, match=r"^sample f1: video frames of different sizes") as info:
        prep.prepare({"messages": CHAT, "videos": [[png_bytes(64, 48), png_bytes(48, 64)]]}, key="f1")
    assert info.value.reason == "undecodable"
    with pytest.raises(SampleRejected, match=r"^sample f2: image <4 encoded bytes> cannot be read") as info:
        prep.prepare({"messages": CHAT, "videos": [[b"junk", png_bytes(64, 48)]]}, key="f2")
    assert info.value.reason == "undecodable"
