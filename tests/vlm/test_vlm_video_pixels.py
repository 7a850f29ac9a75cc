"""Video pixels as transformers' video processors make them (``longpack.vlm.video.processor_pixel_values``).

Oracle: the real ``Qwen2VLVideoProcessor`` and ``Qwen3VLVideoProcessor`` (the shared venv's transformers) run in
a child interpreter on the frames the preparer sampled. They need torchvision, whose only wheels here are CUDA
builds: the test installs torchvision 0.28.0 (torch 2.13's) into a temporary ``--target`` folder, and the child
skips its C-operator registrations (``torchvision._meta_registrations``, which need the CUDA extension) — the
transforms the processors call (``resize``, ``normalize``) are pure torch. Without the wheel the test is skipped;
the constants are checked against transformers' source either way.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from longpack.vlm.video import (
    IMAGENET_STANDARD_MEAN,
    IMAGENET_STANDARD_STD,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    QWEN3_VL_VIDEO,
    RESCALE_FACTOR,
    VideoConfig,
    qwen3_sample_frame_indices,
    read_video,
)
from vlm_helpers import png_bytes, video_bytes

av = pytest.importorskip("av")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def preparer(family: str):
    from longpack.vlm.families import vlm_family

    return vlm_family(family).preparer(max_visual_tokens=None)


TORCHVISION = "torchvision==0.28.0"
CHAT = [
    {"role": "user", "content": "<video>What changes?"},
    {"role": "assistant", "content": "The grey level."},
]
ORACLE = r"""
import sys, types
import numpy as np, torch
sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
import torchvision
from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor
from transformers.video_utils import VideoMetadata
data = np.load(sys.argv[1])
out = {}
for name in data.files:
    family, _ = name.split("-", 1)
    frames = data[name]
    if family == "qwen3":
        meta = VideoMetadata(total_num_frames=len(frames), fps=2.0, duration=len(frames) / 2.0)
        got = Qwen3VLVideoProcessor()(videos=[frames], video_metadata=[meta], do_sample_frames=False,
                                      cap_pixels_per_frame=False, return_tensors="pt")
    else:
        got = Qwen2VLVideoProcessor()(videos=[frames], do_sample_frames=False, cap_pixels_per_frame=False,
                                      return_tensors="pt")
    out[name] = got["pixel_values_videos"].numpy()
    out[name + "-grid"] = got["video_grid_thw"].numpy()
np.savez(sys.argv[2], **out)
print(torchvision.__version__)
"""


def _class_attribute(path: Path, cls: str, name: str) -> str:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.Assign) and any(getattr(t, "id", None) == name for t in item.targets):
                    return ast.unparse(item.value)
    raise AssertionError(f"{cls}.{name} not in {path}")


def test_normalization_constants_are_the_video_processors() -> None:
    from transformers.utils import constants

    root = Path(transformers.__file__).parent
    assert tuple(constants.OPENAI_CLIP_MEAN) == OPENAI_CLIP_MEAN
    assert tuple(constants.OPENAI_CLIP_STD) == OPENAI_CLIP_STD
    assert tuple(constants.IMAGENET_STANDARD_MEAN) == IMAGENET_STANDARD_MEAN
    assert tuple(constants.IMAGENET_STANDARD_STD) == IMAGENET_STANDARD_STD
    for family, config in (("qwen2_vl", VideoConfig()), ("qwen3_vl", QWEN3_VL_VIDEO)):
        path = root / f"models/{family}/video_processing_{family}.py"
        cls = "Qwen2VLVideoProcessor" if family == "qwen2_vl" else "Qwen3VLVideoProcessor"
        mean, std = (_class_attribute(path, cls, n) for n in ("image_mean", "image_std"))
        assert (getattr(constants, mean), getattr(constants, std)) == (
            list(config.image_mean),
            list(config.image_std),
        )
        assert _class_attribute(path, cls, "resample") == "PILImageResampling.BICUBIC"
    assert (
        _class_attribute(root / "video_processing_utils.py", "VideoProcessorMixin", "rescale_factor")
        == "1 / 255"
    )
    assert RESCALE_FACTOR == 1 / 255


@pytest.fixture(scope="module")
def torchvision_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("torchvision")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), TORCHVISION],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"{TORCHVISION} not installable here: {done.stderr[-300:]}")
    return str(target)


def run_processors(frames: dict[str, np.ndarray], target: str, tmp_path: Path) -> dict[str, np.ndarray]:
    np.savez(tmp_path / "frames.npz", **frames)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([target, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", ORACLE, str(tmp_path / "frames.npz"), str(tmp_path / "out.npz")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as out:
        return {k: out[k] for k in out.files}


@pytest.mark.slow
def test_video_pixels_equal_the_real_video_processors(torchvision_target: str, tmp_path: Path) -> None:
    cases = {  # name -> (family, video bytes or frame list)
        "qwen3-small": ("qwen3_vl", video_bytes(20, 10, 64, 48)),
        "qwen3-odd": ("qwen3_vl", video_bytes(9, 3, 90, 30)),
        "qwen3-large": ("qwen3_vl", video_bytes(12, 6, 320, 240)),
        "qwen2-small": ("qwen2_vl", video_bytes(20, 10, 64, 48)),
        "qwen2-large": ("qwen2_vl", video_bytes(12, 6, 320, 240)),
        "qwen2-frames": ("qwen2_vl", [png_bytes(64, 48, seed=i) for i in range(5)]),
    }
    prepared, frames = {}, {}
    for name, (family, source) in cases.items():
        prep = preparer(family)
        prepared[name] = prep.prepare({"messages": CHAT, "videos": [source]}, key=name).visual_values
        if isinstance(source, list):
            from longpack.vlm.video import read_frame_list

            frames[name] = read_frame_list(source, prep.video)
        elif family == "qwen3_vl":
            info = av.open(__import__("io").BytesIO(source)).streams.video[0]
            keep = qwen3_sample_frame_indices(info.frames, float(info.average_rate), prep.video)
            frames[name] = read_video(source, prep.video, indices=keep)
        else:
            frames[name] = read_video(source, prep.video)
    expected = run_processors(frames, torchvision_target, tmp_path)
    for name, values in prepared.items():
        assert values["video_grid_thw"].tolist() == expected[name + "-grid"].tolist(), name
        np.testing.assert_array_equal(values["pixel_values_videos"].numpy(), expected[name], err_msg=name)


def test_qwen3_video_pixels_use_the_video_processors_mean_and_std() -> None:
    """The first frame of the generated video is a flat black (level 0): Qwen3-VL's video mean = std = 0.5 give
    -1.0 there and every value lies in [-1, 1]; Qwen2-VL's (CLIP's, as its images) give -0.4815 / 0.2686 =
    -1.79 for the red channel."""
    data = video_bytes(8, 4, 64, 64)
    qwen3 = preparer("qwen3_vl").prepare({"messages": CHAT, "videos": [data]}, key="g")
    values = qwen3.visual_values["pixel_values_videos"]
    assert float(values.min()) == pytest.approx(-1.0, abs=0.02)
    assert float(values.min()) >= -1.0 and float(values.max()) <= 1.0
    qwen2 = preparer("qwen2_vl").prepare({"messages": CHAT, "videos": [data]}, key="g")
    values = qwen2.visual_values["pixel_values_videos"]
    assert float(values.min()) == pytest.approx(-OPENAI_CLIP_MEAN[0] / OPENAI_CLIP_STD[0], abs=0.03)
