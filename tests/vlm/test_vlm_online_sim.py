"""``online-sim --vlm``: lengths and prepared memory from image headers, bin fill and the packing buffer's host
memory per worker and per rank."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.online import OnlinePacker
from longpack.online.simulate import buffer_memory, simulate_vlm
from longpack.vlm import QwenVLPreparer, VisionConfig, VLMConfig
from longpack.vlm.metadata import read_vlm_metadata
from vlm_helpers import conversation, make_image, preparer, video_bytes

runner = CliRunner()


def write_dataset(folder, n: int = 30, seed: int = 0) -> tuple:
    """A JSONL with image files (relative paths) and some rows given by image_sizes; plus refusals."""
    rng = np.random.default_rng(seed)
    (folder / "img").mkdir()
    lines, expected = [], []
    for i in range(n):
        k = int(rng.integers(0, 3))
        sizes = [(int(rng.integers(30, 400)), int(rng.integers(30, 400))) for _ in range(k)]
        row = {"messages": conversation(rng, k)}
        if i % 3 == 0:
            row["image_sizes"] = [list(s) for s in sizes]
        else:
            names = []
            for j, (w, h) in enumerate(sizes):
                make_image(w, h, i * 10 + j).save(folder / "img" / f"{i}_{j}.png")
                names.append(f"img/{i}_{j}.png")
            row["images"] = names
        lines.append(json.dumps(row))
        expected.append((row, sizes))
    lines.append(json.dumps({"messages": conversation(rng, 3), "image_sizes": [[50, 50]] * 3}))  # too many
    lines.append(
        json.dumps({"messages": conversation(rng, 1), "image_sizes": [[4000, 4000]]})
    )  # visual tokens
    (folder / "broken.png").write_bytes(b"not a png")
    lines.append(json.dumps({"messages": conversation(rng, 1), "images": ["broken.png"]}))  # undecodable
    path = folder / "vlm.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, expected


def test_metadata_equals_prepared_sequences_and_counts_refusals(tmp_path) -> None:
    path, expected = write_dataset(tmp_path)
    prep = preparer(max_images=2, max_visual_tokens=1000)
    table = read_vlm_metadata(path, prep)
    assert {k: v for k, v in table.rejected.items() if v} == {
        "visual_tokens": 1,
        "too_many_images": 1,
        "undecodable": 1,
    }
    assert len(table.keys) == len(expected) and table.keys[0] == "vlm.jsonl:1"
    for i, (row, sizes) in enumerate(expected):
        images = [make_image(w, h, i * 10 + j) for j, (w, h) in enumerate(sizes)]
        seq = prep.prepare({"messages": row["messages"], "images": images})
        assert table.tokens[i] == seq.sequence_length
        assert table.visual_tokens[i] == seq.visual_tokens
        assert table.prepared_nbytes[i] == seq.nbytes  # the memory estimate is the real tensors' size
    too_long = read_vlm_metadata(path, prep, max_length=int(np.median(table.tokens)), pad_to_multiple_of=8)
    assert too_long.rejected["too_long"] > 0 and len(too_long.keys) + too_long.rejected["too_long"] == len(
        expected
    )


def test_metadata_needs_no_image_processor(tmp_path) -> None:
    path, _ = write_dataset(tmp_path, n=6)
    prep = QwenVLPreparer(
        "qwen3", config=VLMConfig(vision=VisionConfig(), max_images=2, max_visual_tokens=1000)
    )
    table = read_vlm_metadata(path, prep)
    assert prep._image_processor is None and len(table.keys) == 6


def reference_buffer_bytes(lengths, nbytes, capacity, buffer_size) -> list[int]:
    """Held bytes at each emission from the packer's saved state (buffered positions), plus the pack."""
    packer = OnlinePacker(capacity, buffer_size, algorithm="first_fit_decreasing")
    out = []
    for pack in packer.pack(list(lengths)):
        state = packer.state_dict()
        held = [*state["reading"], *(i for g in state["pending"] for i in g), *pack.sample_index.tolist()]
        out.append(sum(nbytes[i] for i in held))
    return out


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=80),
    buffer_size=st.integers(1, 20),
    seed=st.integers(0, 1000),
)
def test_buffer_memory_equals_the_packers_buffered_samples(lengths, buffer_size, seed) -> None:
    nbytes = np.random.default_rng(seed).integers(1, 10**6, len(lengths)).tolist()
    result = buffer_memory(lengths, nbytes, 100, buffer_size)
    reference = reference_buffer_bytes(lengths, nbytes, 100, buffer_size)
    assert result["peak_bytes"] == max(reference)
    assert result["mean_bytes"] == pytest.approx(float(np.mean(reference)))


def test_rank_memory_is_the_sum_of_its_workers() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 1000, 200)
    nbytes = rng.integers(2**20, 2**24, 200)
    one, two = (simulate_vlm(lengths, nbytes, 1024, [16], workers=w)[0] for w in (1, 2))
    halves = [
        buffer_memory(lengths[a:b], nbytes[a:b], 1024, 16)["peak_bytes"] for a, b in ((0, 100), (100, 200))
    ]
    assert two["buffer_peak_mib_rank"] == pytest.approx(sum(halves) / 2**20, abs=1e-3)
    assert two["buffer_peak_mib_worker"] == pytest.approx(max(halves) / 2**20, abs=1e-3)
    assert one["buffer_peak_mib_rank"] == one["buffer_peak_mib_worker"]


def test_cli_reports_fill_and_buffer_memory(tmp_path) -> None:
    path, expected = write_dataset(tmp_path)
    args = ["online-sim", "--vlm", str(path), "--pack-size", "1024", "--buffer-sizes", "1,4,16",
            "--max-images", "2", "--max-visual-tokens", "1000", "--min-pixels", "3136", "--loader-workers", "2"]  # fmt: skip
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["samples"]["samples"] == len(expected)
    assert report["samples"]["rejected"]["undecodable"] == 1 and report["algorithm"] == "first_fit_decreasing"
    peaks = [r["buffer_peak_mib_worker"] for r in report["rows"]]
    assert peaks == sorted(peaks) and peaks[-1] > peaks[0] > 0
    assert all(r["buffer_peak_mib_rank"] >= r["buffer_peak_mib_worker"] for r in report["rows"])
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "peak MiB/worker" in table.output and "refused: visual_tokens 1, too_many_images 1" in table.output
    # Every refused sample is named: its key and reason in --json, the first messages in the table.
    n = len(expected)
    assert report["samples"]["skipped"] == [
        {"key": f"vlm.jsonl:{n + 1}", "reason": "too_many_images"},
        {"key": f"vlm.jsonl:{n + 2}", "reason": "visual_tokens"},
        {"key": f"vlm.jsonl:{n + 3}", "reason": "undecodable"},
    ]
    assert f"  refused: sample vlm.jsonl:{n + 2}: " in table.output
    # The accepted samples' lengths as a --lengths file: one stream of them packs as one loader worker does.
    lengths_file = tmp_path / "out" / "lengths.txt"
    one_worker = [*args[:-1], "1", "--write-lengths", str(lengths_file), "--json"]
    written = runner.invoke(app, one_worker)
    assert written.exit_code == 0, written.output
    assert len(lengths_file.read_text().split()) == len(expected)
    replay = runner.invoke(
        app, ["online-sim", "--lengths", str(lengths_file), "--pack-size", "1024", "--buffer-sizes", "1,4,16",
              "--algorithm", "first_fit_decreasing", "--json"],
    )  # fmt: skip
    assert replay.exit_code == 0, replay.output
    vlm_rows, plain_rows = json.loads(written.output)["rows"], json.loads(replay.output)["rows"]
    assert [(r["online_packs"], r["online_fill"]) for r in vlm_rows] == [
        (r["online_packs"], r["online_fill"]) for r in plain_rows
    ]
    bad = runner.invoke(app, ["online-sim", "--vlm", str(tmp_path / "none.jsonl"), "--pack-size", "1024"])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_metadata_counts_videos_from_their_headers(tmp_path) -> None:
    """A JSONL row with a relative video path: tokens and prepared bytes from the container header equal
    the prepared sequence's."""
    pytest.importorskip("av")
    (tmp_path / "clip.mp4").write_bytes(video_bytes(12, 4, 64, 48))
    chat = [{"role": "user", "content": "<video>What moves?"}, {"role": "assistant", "content": "A cat."}]
    path = tmp_path / "meta.jsonl"
    path.write_text(json.dumps({"__key__": "v0", "messages": chat, "videos": ["clip.mp4"]}) + "\n")
    for i in range(3):
        make_image(64, 48, seed=i).save(tmp_path / f"f{i}.png")
    with path.open("a") as fh:  # a frame list of image files, relative to the JSONL too
        fh.write(
            json.dumps({"__key__": "v1", "messages": chat, "videos": [["f0.png", "f1.png", "f2.png"]]}) + "\n"
        )
    prep = preparer(max_visual_tokens=None)
    table = read_vlm_metadata(path, prep)
    sources = [str(tmp_path / "clip.mp4"), [str(tmp_path / f"f{i}.png") for i in range(3)]]
    for row, source in enumerate(sources):
        prepared = prep.prepare({"messages": chat, "videos": [source]}, key=f"v{row}")
        assert (int(table.tokens[row]), int(table.visual_tokens[row]), int(table.prepared_nbytes[row])) == (
            prepared.sequence_length,
            prepared.visual_tokens,
            prepared.nbytes,
        )


def test_cli_video_settings_change_the_video_counts(tmp_path) -> None:
    """``--video-fps``: a 4 s video sampled at 4 fps has twice the frame pairs of the default 2 fps; each
    count equals the preparer's with that ``VideoConfig``; a bad rate exits 2."""
    pytest.importorskip("av")
    from longpack.vlm.video import VideoConfig

    (tmp_path / "clip.mp4").write_bytes(video_bytes(40, 10, 64, 48))
    chat = [{"role": "user", "content": "<video>What moves?"}, {"role": "assistant", "content": "A cat."}]
    path = tmp_path / "meta.jsonl"
    path.write_text(json.dumps({"messages": chat, "videos": ["clip.mp4"]}) + "\n")
    args = ["online-sim", "--vlm", str(path), "--pack-size", "8192", "--buffer-sizes", "1", "--json"]
    counts = {}
    for fps in (None, 4.0):
        result = runner.invoke(app, [*args, *(["--video-fps", str(fps)] if fps else [])])
        assert result.exit_code == 0, result.output
        counts[fps] = json.loads(result.output)["samples"]["visual_tokens_mean"]
        video = VideoConfig() if fps is None else VideoConfig(fps=fps)
        prep = QwenVLPreparer(
            "qwen3", config=VLMConfig(vision=VisionConfig(min_pixels=200704, max_pixels=1003520), video=video)
        )
        assert (
            counts[fps]
            == prep.length({"messages": chat, "videos": [str(tmp_path / "clip.mp4")]}).visual_tokens
        )
    assert counts[4.0] == 2 * counts[None]
    bad = runner.invoke(app, [*args, "--video-fps", "0"])
    assert bad.exit_code == 2 and "--video-fps must be > 0" in bad.output


def test_cli_counts_qwen3_vl_videos_by_its_own_rule(tmp_path) -> None:
    """``--vlm-family qwen3_vl``: a video's tokens are Qwen3-VL's (its frame sampling and clip-level pixel
    limits, a timestamp and start/end tokens per frame pair), equal to the Qwen3-VL preparer's, not Qwen2-VL's."""
    pytest.importorskip("av")
    from longpack.vlm.families import vlm_family

    (tmp_path / "clip.mp4").write_bytes(video_bytes(40, 10, 64, 48))
    chat = [{"role": "user", "content": "<video>What moves?"}, {"role": "assistant", "content": "A cat."}]
    path = tmp_path / "meta.jsonl"
    path.write_text(json.dumps({"messages": chat, "videos": ["clip.mp4"]}) + "\n")
    args = ["online-sim", "--vlm", str(path), "--pack-size", "8192", "--buffer-sizes", "1", "--json"]
    result = runner.invoke(app, [*args, "--vlm-family", "qwen3_vl", "--patch-size", "16"])
    assert result.exit_code == 0, result.output
    samples = json.loads(result.output)["samples"]
    vision = VisionConfig(patch_size=16, min_pixels=200704, max_pixels=1003520)
    length = (
        vlm_family("qwen3_vl")
        .preparer(vision=vision)
        .length({"messages": chat, "videos": [str(tmp_path / "clip.mp4")]})
    )
    assert samples["visual_tokens_mean"] == length.visual_tokens
    qwen2 = QwenVLPreparer(
        "qwen3", config=VLMConfig(vision=VisionConfig(min_pixels=200704, max_pixels=1003520))
    )
    assert (
        length.visual_tokens
        != qwen2.length({"messages": chat, "videos": [str(tmp_path / "clip.mp4")]}).visual_tokens
    )
