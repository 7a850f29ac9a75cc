"""The installed transformers decides the Qwen3-VL video text (``longpack.vlm.hf_versions``).

Oracle: each version's own ``Qwen3VLProcessor`` code (``replace_video_token`` and ``get_text_with_replacements``,
run on a bare processor object: no tokenizer, no weights) applied to the chat template's text, in a fresh
interpreter whose transformers is that version: 5.24 is the shared venv's, 5.25 its wheel installed by this test
into a temporary ``--target`` folder (skipped when the wheel cannot be fetched). In the same interpreter longpack
prepares the sample without being told the version, so what is tested is the detection too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from longpack.vlm.errors import VLMError
from longpack.vlm.hf_versions import TRANSFORMERS_SPEC, behaviour, parse_version

pytest.importorskip("transformers")
pytest.importorskip("av")

ROOT = Path(__file__).resolve().parents[2]

# Run in a child interpreter: prepare a Qwen3-VL video sample and the processor's own text for it.
ORACLE = r"""
import json, sys
from types import SimpleNamespace
import torch, transformers
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.video_utils import VideoMetadata
sys.path.insert(0, sys.argv[1])
from vlm_helpers import png_bytes, video_bytes
from longpack.vlm.chat import normalize_conversation, render_pieces
from longpack.vlm.families import vlm_family

prep = vlm_family("qwen3_vl").preparer(max_visual_tokens=None)
out = {"transformers": transformers.__version__, "outer": prep.qwen3_video_outer_wrapper, "cases": []}
for frames, fps, videos, image in [(20, 10, 1, False), (9, 3, 2, True)]:
    content = ("<image>" if image else "") + "<video>and" * videos + " what?"
    sample = {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "Grey."}],
              "videos": [video_bytes(frames, fps, 64, 48)] * videos}
    if image:
        sample["images"] = [png_bytes(64, 48)]
    seq = prep.prepare(sample, key="v")
    length = prep.length(sample, key="v")
    # the processor's text: its own methods on a bare Qwen3VLProcessor
    owner = object.__new__(Qwen3VLProcessor)
    owner.__dict__.update(image_token="<|image_pad|>", video_token="<|video_pad|>",
                          vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
                          video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                          image_processor=SimpleNamespace(merge_size=2))
    _, keep, _, _ = prep._qwen3_video(sample["videos"][0], "v")
    grids = seq.visual_values["video_grid_thw"]
    meta = [VideoMetadata(total_num_frames=frames, fps=float(fps), frames_indices=list(keep)) for _ in range(videos)]
    video_inputs = {"video_grid_thw": grids, "video_metadata": meta}
    replacements = [owner.replace_video_token(video_inputs, i) for i in range(videos)]
    images = []
    if image:
        images = [owner.replace_image_token({"image_grid_thw": seq.visual_values["image_grid_thw"]}, 0)]
    text = "".join(t for t, _ in render_pieces(normalize_conversation(sample)))
    (expanded,), _ = owner.get_text_with_replacements([text], images, replacements, [])
    out["cases"].append({
        "ids": seq.row["input_ids"].tolist(),
        "processor_ids": prep.tokenizer.encode(expanded),
        "length": [length.tokens, length.prepared_nbytes],
        "prepared": [seq.sequence_length, seq.nbytes],
        "videos": videos,
    })
print(json.dumps(out))
"""


def run_oracle(extra_path: str | None) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT / "src")]
    if extra_path is not None:
        paths.insert(0, extra_path)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", ORACLE, str(ROOT / "tests")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def transformers_5_25(tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("transformers-5.25")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         "transformers==5.25.0"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"transformers 5.25.0 wheel not installable here: {done.stderr[-300:]}")
    return str(target)


def test_pyproject_states_the_supported_range() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"transformers{TRANSFORMERS_SPEC}" in extras["vlm"]
    pinned = [
        line.split("==")[1]
        for line in (ROOT / "constraints/ci.txt").read_text().splitlines()
        if line.startswith("transformers==")
    ]
    assert [behaviour(v).version for v in pinned] == pinned  # CI's pin lies in the range


@pytest.mark.parametrize("version", ["5.23.0", "5.26.0", "4.57.1", "6.0"])
def test_a_version_outside_the_range_is_refused_with_the_range(version: str) -> None:
    from longpack.vlm.prepare import VLMConfig

    with pytest.raises(VLMError, match=rf"transformers {version} .*\(transformers>=5.24,<5.26\)"):
        VLMConfig(transformers_version=version)
    with pytest.raises(VLMError, match="not a version number"):
        parse_version("latest")


@pytest.mark.slow
def test_video_text_follows_the_installed_5_24_and_5_25(transformers_5_25: str) -> None:
    old, new = run_oracle(None), run_oracle(transformers_5_25)
    assert (old["transformers"], old["outer"]) == ("5.24.0", True)
    assert (new["transformers"], new["outer"]) == ("5.25.0", False)
    for result in (old, new):
        for case in result["cases"]:
            assert case["ids"] == case["processor_ids"]
            assert case["length"] == case["prepared"]  # from headers alone, no frame decoded
    for a, b in zip(old["cases"], new["cases"], strict=True):
        assert len(a["ids"]) - len(b["ids"]) == 2 * a["videos"]  # the outer pair per video


def test_an_installed_version_outside_the_range_is_refused_when_a_preparer_is_built(monkeypatch) -> None:
    from longpack.vlm import hf_versions
    from longpack.vlm.families import vlm_family
    from longpack.vlm.prepare import QwenVLPreparer, VLMConfig
    from longpack.vlm.vision import VisionConfig
    from vlm_helpers import gemma3_processor

    processor = gemma3_processor()
    monkeypatch.setattr(hf_versions, "installed_transformers_version", lambda: "5.30.0")
    for build in (
        lambda: QwenVLPreparer("qwen3", config=VLMConfig(vision=VisionConfig())),
        lambda: vlm_family("gemma3").preparer(processor=processor),
    ):
        with pytest.raises(VLMError, match=r"transformers 5\.30\.0 \(installed\) is outside the range"):
            build()
    # naming the training job's version overrides the installed one
    prep = QwenVLPreparer("qwen3", config=VLMConfig(vision=VisionConfig(), transformers_version="5.25.0"))
    assert prep.transformers_version == "5.25.0"
    monkeypatch.setattr(hf_versions, "installed_transformers_version", lambda: None)
    qwen3 = QwenVLPreparer(
        "qwen3", config=VLMConfig(vision=VisionConfig(patch_size=16, rope_variant="qwen3_vl"))
    )
    with pytest.raises(
        VLMError, match="depends on the transformers version and transformers is not installed"
    ):
        qwen3.qwen3_video_outer_wrapper  # noqa: B018
