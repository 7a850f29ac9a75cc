"""Energon online packing of Qwen-VL samples on a real WebDataset of generated image+text samples, prepared
with ``energon prepare`` (``CrudeWebdataset``: a ``json`` conversation and ``img<N>.png`` members per sample),
and on a second one with ``vid<N>.mp4`` members (videos generated with PyAV, good and bad).

Loaders run on finite streams and are exhausted (an abandoned worker loader stalls the next gc for ~10 s).
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

energon = pytest.importorskip("megatron.energon")
pytest.importorskip("transformers")

import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset, stateless  # noqa: E402
from megatron.energon.tools.prepare import command as energon_prepare  # noqa: E402

from longpack.binpack.megatron import first_fit_decreasing  # noqa: E402
from longpack.online.energon import (  # noqa: E402
    LoaderStateMismatch,
    LoaderStateReplay,
    ResumeReplayWarning,
    read_loader_state,
    replaying_workers,
    restore_loader_state,
    save_loader_state,
    write_loader_state,
)
from longpack.online.vlm import EagerQwenVLPackingEncoder, QwenVLPackingEncoder  # noqa: E402
from longpack.runtime.in_batch import build_visual_thd_batch  # noqa: E402
from longpack.vlm.video import VideoConfig  # noqa: E402
from vlm_helpers import conversation, png_bytes, preparer, video_bytes  # noqa: E402

N_SAMPLES = 24
SEQ_LENGTH = 128
MULTIPLE = 8
BROKEN = {"s00007", "s00015"}  # an image member that is not an image
HUGE = {"s00019"}  # one image far above max_visual_tokens
ASPECT = {"s00003"}  # a 402x2 image: aspect ratio above 200
MISMATCH = {"s00011"}  # two <image> placeholders, one image
EMPTY = {"s00023"}  # a 0-byte image member
MALFORMED = {"s00021"}  # a json member that is not JSON
BAD = {
    **dict.fromkeys(BROKEN, "undecodable"),
    **dict.fromkeys(HUGE, "visual_tokens"),
    **dict.fromkeys(ASPECT, "aspect_ratio"),
    **dict.fromkeys(MISMATCH, "placeholder_mismatch"),
    **dict.fromkeys(EMPTY, "empty_image"),
    **dict.fromkeys(MALFORMED, "malformed"),
}
# Energon's loader runs a full gc.collect() when each worker starts iterating and every 10 batches: about 0.7 s
# each in a test process that has imported torch and transformers (a production loader pays it once per
# epoch). Its GcDataset wrapper is transparent (no state, no config), so the tests turn it off.
LOADER_OPTIONS = {
    "checkpoint_every_sec": 0.0,
    "watchdog_timeout_seconds": None,
    "gc_collect_every_n_steps": 0,
}
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def sample_members(i: int) -> dict[str, bytes]:
    rng = np.random.default_rng(i)
    key = f"s{i:05d}"
    n_images = int(rng.integers(0, 3)) or (1 if key in set(BAD) - MALFORMED else 0)
    members = {"json": json.dumps({"messages": conversation(rng, n_images)}).encode()}
    for j in range(n_images):
        w, h = (int(x) for x in rng.integers(20, 120, 2))
        members[f"img{j}.png"] = png_bytes(w, h, seed=i * 10 + j)
    if key in BROKEN:
        members["img0.png"] = b"\x89PNG\r\n\x1a\n but not really an image"
    if key in HUGE:
        members["img0.png"] = png_bytes(900, 900, seed=i)
    if key in ASPECT:
        members["img0.png"] = png_bytes(402, 2, seed=i)
    if key in MISMATCH:
        members = {
            "json": json.dumps({"messages": conversation(rng, 2)}).encode(),
            "img0.png": png_bytes(30, 30),
        }
    if key in EMPTY:
        members["img0.png"] = b""
    if key in MALFORMED:
        members["json"] = b'{"messages": [ not json'
    return members


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("energon_vlm_ds"), sample_members, N_SAMPLES)


def write_dataset(root: Path, members_of, n: int, shards: int = 3) -> Path:
    """A crude WebDataset of ``n`` samples (``members_of(i)``) prepared with ``energon prepare``."""
    per_shard = n // shards
    for shard in range(shards):
        with tarfile.open(root / f"shard_{shard:03d}.tar", "w") as tar:
            for i in range(shard * per_shard, (shard + 1) * per_shard):
                for name, data in members_of(i).items():
                    info = tarfile.TarInfo(f"s{i:05d}.{name}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    result = CliRunner().invoke(
        energon_prepare,
        ["--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset", "--num-workers", "1",
         "--no-progress", str(root)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return root


def make_loader(
    root: Path, *, workers: int, buffer_size: int = 8, rank: int = 0, world: int = 1, eager: bool = False,
    prep=None, **kwargs,
):  # fmt: skip
    encoder = (EagerQwenVLPackingEncoder if eager else QwenVLPackingEncoder)(
        prep or preparer(max_visual_tokens=200), seq_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE, **kwargs
    )
    ds = get_train_dataset(
        root,
        split_part="train",
        worker_config=WorkerConfig(rank=rank, world_size=world, num_workers=workers),
        batch_size=1,
        packing_buffer_size=buffer_size,
        shuffle_buffer_size=4,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        repeat=False,
    )
    return get_savable_loader(ds, **LOADER_OPTIONS), encoder


def signature(batch: dict) -> tuple:
    """Everything a batch holds, as plain values (tensors by content)."""
    out = []
    for key in sorted(batch):
        value = batch[key]
        if key == "visual_inputs":
            value = tuple((k, v.tolist()) for k, v in sorted(value.items()))
        elif isinstance(value, torch.Tensor):
            value = (str(value.dtype), value.tolist())
        elif isinstance(value, list):
            value = json.dumps(value, sort_keys=True)
        out.append((key, value))
    return tuple(out)


def accounting(batches: list[dict]) -> Counter:
    """How often each sample key appears, packed or reported as skipped."""
    keys: Counter[str] = Counter()
    for b in batches:
        keys.update(b["sample_keys"])
        keys.update(r["key"] for r in b["skipped"])
    return keys


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_exactly_once_and_batches_are_bridge_rows(dataset: Path, workers: int) -> None:
    loader, _ = make_loader(dataset, workers=workers)
    batches = list(loader)
    keys = accounting(batches)
    assert len(keys) == N_SAMPLES and set(keys.values()) == {1}
    skipped = {r["key"]: r for b in batches for r in b["skipped"]}
    assert {key: r["reason"] for key, r in skipped.items()} == BAD
    assert all(r["message"].startswith(f"sample {r['key']}: ") for r in skipped.values())
    for key in BROKEN:
        assert skipped[key]["reason"] == "undecodable" and "cannot be read" in skipped[key]["message"]
    (huge,) = HUGE
    assert (
        skipped[huge]["reason"] == "visual_tokens" and "> max_visual_tokens=200" in skipped[huge]["message"]
    )
    # Each batch is the THD row of its members prepared on their own (from the tar members, not via Energon).
    prep = preparer(max_visual_tokens=200)
    for b in batches:
        members = []
        for key in b["sample_keys"]:
            raw = sample_members(int(key[1:]))
            images = [raw[k] for k in sorted(k for k in raw if k.startswith("img"))]
            members.append(prep.prepare({**json.loads(raw["json"]), "images": images}, key=key))
        expected = build_visual_thd_batch(
            members, sequence_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE, emit_padding_mask=True
        )
        assert signature({**expected, "sample_keys": b["sample_keys"], "skipped": b["skipped"]}) == signature(
            b
        )
        assert b["total_tokens"] <= SEQ_LENGTH and b["input_ids"].shape == (1, b["total_tokens"])


@pytest.mark.parametrize("eager", [False, True])
def test_groups_are_bridge_first_fit_decreasing(dataset: Path, eager: bool) -> None:
    """One worker: each selection of 8 buffered samples is Bridge's FFD of their aligned lengths (refused
    samples take buffer slots but no room). Deferred: the buffer holds no prepared tensors."""
    order: list = []

    class Recording(QwenVLPackingEncoder):
        @stateless(failure_tolerance=100)
        def preencode_sample(self, sample):
            encoded = super().preencode_sample(sample)
            order.append(encoded)
            return encoded

    class EagerRecording(EagerQwenVLPackingEncoder):
        @stateless(failure_tolerance=100)
        def encode_sample(self, sample):
            encoded = super().encode_sample(sample)
            order.append(encoded)
            return encoded

    encoder = (EagerRecording if eager else Recording)(
        preparer(max_visual_tokens=200), seq_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE
    )
    ds = get_train_dataset(
        dataset, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=1,
        packing_buffer_size=8, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=encoder,
        repeat=False,
    )  # fmt: skip
    packs = [b["sample_keys"] for b in get_savable_loader(ds, **LOADER_OPTIONS)]
    assert len(order) == N_SAMPLES
    expected = []
    for lo in range(0, N_SAMPLES, 8):
        buffer = [s for s in order[lo : lo + 8] if s.rejected is None]
        assert all((s.prepared is not None) == eager for s in buffer)
        lengths = [-(-s.length // MULTIPLE) * MULTIPLE for s in buffer]
        expected += first_fit_decreasing([s.__key__ for s in buffer], SEQ_LENGTH, item_lengths=lengths)
    assert packs == expected
    # The prepared lengths are the metadata lengths (image headers only).
    prep = preparer(max_visual_tokens=200)
    for s in order:
        if s.rejected is None:
            raw = sample_members(int(s.__key__[1:]))
            images = [raw[k] for k in sorted(raw) if k.startswith("img")]
            assert prep.length({**json.loads(raw["json"]), "images": images}).tokens == s.length


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_restore_after_k_packs_continues_identically(dataset: Path, workers: int, tmp_path) -> None:
    first, enc = make_loader(dataset, workers=workers)
    it = iter(first)
    reference, states = [], {}
    for k in range(6):
        if k in (1, 5):
            states[k] = tmp_path / f"state_{k}.pkl"
            write_loader_state(states[k], save_loader_state(first, enc))
        reference.append(signature(next(it)))
    reference += [signature(b) for b in it]
    for k, path in states.items():
        restored, encoder = make_loader(dataset, workers=workers)
        restore_loader_state(restored, read_loader_state(path), encoder)
        assert [signature(b) for b in restored] == reference[k:], f"continuation differs after k={k}"


def test_a_save_before_a_worker_stored_its_first_checkpoint_resumes_exactly(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Energon's race made certain: worker 1 answers the save (after worker 0's first pack) as it does when
    its command thread wins the lock before its iteration stores the first checkpoint, with the constructor's
    placeholder. Uncorrected, the restored loader skips worker 1's first pack (seen in CI at load 8)."""
    from megatron.energon.savable_loader import SavableCheckpoint, SavableDatasetWrapper

    original = SavableDatasetWrapper.get_checkpoint

    def as_if_not_started(self, last_sample_indexes):  # runs in the (forked) worker process
        if self._worker_id == 1 and last_sample_indexes[1] == -1:
            kept = self._last_checkpoints
            self._last_checkpoints = [SavableCheckpoint(state=None, checkpoint_time=0.0, sample_index=-1)]
            try:
                return original(self, last_sample_indexes)
            finally:
                self._last_checkpoints = kept
        return original(self, last_sample_indexes)

    monkeypatch.setattr(SavableDatasetWrapper, "get_checkpoint", as_if_not_started)
    first, enc = make_loader(dataset, workers=2)
    it = iter(first)
    reference = [signature(next(it))]
    path = tmp_path / "state.pkl"
    write_loader_state(path, save_loader_state(first, enc))
    reference += [signature(b) for b in it]
    restored, encoder = make_loader(dataset, workers=2)
    restore_loader_state(restored, read_loader_state(path), encoder)
    assert [signature(b) for b in restored] == reference[1:]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_state_saved_after_a_workers_pass_ended_is_refused_not_replayed(
    dataset: Path, workers: int
) -> None:
    """Saved after every pack: states up to the first worker's end of pass resume exactly; later ones (Energon
    restores that worker at the start of a new pass) are named by replaying_workers, warned about when saved,
    refused on restore, and with on_replay="warn" restored with a warning (and they do replay)."""
    first, enc = make_loader(dataset, workers=workers)
    it = iter(first)
    reference = [signature(next(it))]  # (a loader with workers is saved once it has yielded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResumeReplayWarning)
        states = [save_loader_state(first, enc)]
        for batch in it:
            reference.append(signature(batch))
            states.append(save_loader_state(first, enc))
    # states[i]: saved after i + 1 packs
    replays = [bool(replaying_workers(st)) for st in states]
    k = replays.index(True)  # the first replaying save point; every later one replays too
    assert 0 < k < len(states) - 1 and not any(replays[:k]) and all(replays[k:])
    assert [st["replay_workers"] for st in states] == [replaying_workers(st) for st in states]
    assert sum(issubclass(w.category, ResumeReplayWarning) for w in caught) == len(states) - k
    exact, _ = make_loader(dataset, workers=workers)
    restore_loader_state(exact, states[k - 1], enc)
    assert [signature(b) for b in exact] == reference[k:]
    refused, encoder = make_loader(dataset, workers=workers)
    with pytest.raises(LoaderStateReplay, match=r"finished their pass over a single-pass dataset"):
        restore_loader_state(refused, states[k], encoder)
    list(refused)  # (exhaust it: an abandoned loader stalls the next gc)
    replayed, encoder = make_loader(dataset, workers=workers)
    with pytest.warns(ResumeReplayWarning, match="would yield samples again"):
        restore_loader_state(replayed, states[k], encoder, on_replay="warn")
    assert len(list(replayed)) > len(reference) - (k + 1)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_qwen3_vl_family_packs_every_sample_once_into_its_own_rows_and_resumes_exactly(
    dataset: Path, workers: int
) -> None:
    """Qwen3-VL (patch 16, its rope variant), from the family registry: Bridge's Qwen3-VL Energon packing is the
    same ``QwenVLTaskEncoder`` with ``patch_size=16``; every sample once, each batch the THD row of its members
    prepared alone, positions by the Qwen3-VL rope index; a state saved after 2 packs resumes exactly."""
    from transformers import Qwen2VLImageProcessor

    from longpack.vlm.families import vlm_family

    family = vlm_family("qwen3_vl")
    prep = family.preparer(image_processor=Qwen2VLImageProcessor(patch_size=16), max_visual_tokens=200)
    loader, enc = make_loader(dataset, workers=workers, prep=prep)
    it = iter(loader)
    batches = [next(it), next(it)]
    state = save_loader_state(loader, enc)
    assert (
        not replaying_workers(state)
        and state["config"]["longpack_packing"]["preparer"]["vision"]["rope_variant"] == "qwen3_vl"
    )
    batches += list(it)
    restored, encoder = make_loader(dataset, workers=workers, prep=prep)
    restore_loader_state(restored, state, encoder)
    assert [signature(b) for b in restored] == [signature(b) for b in batches[2:]]
    keys = accounting(batches)
    assert len(keys) == N_SAMPLES and set(keys.values()) == {1}
    for b in batches:
        members = []
        for key in b["sample_keys"]:
            raw = sample_members(int(key[1:]))
            images = [raw[k] for k in sorted(k for k in raw if k.startswith("img"))]
            members.append(prep.prepare({**json.loads(raw["json"]), "images": images}, key=key))
        assert all(
            m.visual_values.get("pixel_values", torch.zeros(0, 1536)).shape[1] == 1536 for m in members
        )
        expected = build_visual_thd_batch(
            members, sequence_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE, emit_padding_mask=True
        )
        assert signature({**expected, "sample_keys": b["sample_keys"], "skipped": b["skipped"]}) == signature(
            b
        )


@pytest.mark.parametrize("eager", [False, True])
def test_a_setting_that_fails_every_sample_stops_the_loader_naming_it(dataset: Path, eager: bool) -> None:
    """Not a per-sample refusal: a preparer whose resize rule differs from its processor fails fatally at the
    first prepared sample (Energon's handler would otherwise drop samples one by one)."""
    from megatron.energon.errors import FatalSampleError

    from longpack.vlm import QwenVLPreparer, VisionConfig, VLMConfig
    from vlm_helpers import image_processor

    wrong = QwenVLPreparer(
        "qwen3",
        image_processor(),
        config=VLMConfig(vision=VisionConfig(patch_size=16), max_visual_tokens=200),
    )
    loader, _ = make_loader(dataset, workers=0, prep=wrong, eager=eager)
    with pytest.raises(
        FatalSampleError, match=r"failed due to system exception: sample s\d+: the image processor made grids"
    ):
        list(loader)


def test_deferred_decoding_gives_the_eager_batches(dataset: Path) -> None:
    """The buffer of encoded bytes and token counts gives the batches (and refusal records) of the buffer of
    prepared tensors."""
    deferred, _ = make_loader(dataset, workers=0)
    eager, _ = make_loader(dataset, workers=0, eager=True)
    assert [signature(b) for b in deferred] == [signature(b) for b in eager]


def test_two_data_parallel_ranks_split_the_epoch(dataset: Path) -> None:
    keys: Counter[str] = Counter()
    for rank in range(2):
        loader, _ = make_loader(dataset, workers=0, rank=rank, world=2)
        rank_keys = accounting(list(loader))
        assert sum(rank_keys.values()) == N_SAMPLES // 2
        keys.update(rank_keys)
    assert len(keys) == N_SAMPLES and set(keys.values()) == {1}


def test_changed_packing_settings_are_named_on_restore(dataset: Path) -> None:
    loader, encoder = make_loader(dataset, workers=0)
    it = iter(loader)
    next(it)
    state = save_loader_state(loader, encoder)
    list(it)
    other, other_encoder = make_loader(dataset, workers=0, pad_to_max_length=True)
    with pytest.raises(
        LoaderStateMismatch, match=r"longpack_packing.pad_to_max_length: saved False, now True"
    ):
        restore_loader_state(other, state, other_encoder)


def test_a_buffer_of_refused_samples_reports_them_in_a_padding_batch(tmp_path) -> None:
    """3 samples, all refused, one buffer: one batch that trains nothing carries the three records."""
    chat = json.dumps(
        {"messages": [{"role": "user", "content": "<image>Q"}, {"role": "assistant", "content": "A"}]}
    )

    def members(i: int) -> dict[str, bytes]:
        return {"json": chat.encode(), "img0.png": [b"", png_bytes(402, 2), b"oops"][i]}

    root = write_dataset(tmp_path, members, 3)
    loader, _ = make_loader(root, workers=0)
    (batch,) = list(loader)
    assert batch["sample_keys"] == []
    assert sorted((r["key"], r["reason"]) for r in batch["skipped"]) == [
        ("s00000", "empty_image"),
        ("s00001", "aspect_ratio"),
        ("s00002", "undecodable"),
    ]
    assert batch["total_tokens"] == MULTIPLE and batch["loss_mask"].sum() == 0
    assert (batch["labels"] == -100).all() and batch["visual_inputs"] == {}


VIDEO_SAMPLES = 11  # s00009: Bridge's pickled frame list (``mp4s``); s00010: a broken one
BAD_VIDEOS = {
    "s00010": "malformed",  # a ``videos`` member that is not a pickled frame list
    "s00002": "undecodable",  # not a video
    "s00004": "empty_video",  # 0 bytes
    "s00005": "empty_video",  # a readable header, no frame
    "s00007": "too_long",  # 400 frames: more video tokens than the pack holds
}
# Small frames (at most 16 merged tokens per frame pair) so that several videos fit a 256-token pack.
VIDEO_CONFIG = VideoConfig(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)


def video_members(i: int) -> dict[str, bytes]:
    """Image, video and image+video samples; videos of 8-24 frames at 4 fps, 32-64 px."""
    key = f"s{i:05d}"
    rng = np.random.default_rng(100 + i)
    kind = ("video", "video+image", "image")[i % 3] if key not in BAD_VIDEOS else "video"
    frames, side = int(rng.integers(8, 25)), int(rng.integers(32, 65))
    bad = {
        "s00002": lambda: b"\x00\x00\x00 ftypmp42 not a video",
        "s00004": lambda: b"",
        "s00005": lambda: video_bytes(0, 4, 32, 32, container="avi"),
        "s00007": lambda: video_bytes(400, 4, 56, 56),
    }
    media = bad[key]() if key in bad else video_bytes(frames, 4, side, side - 8)
    question = ("<video>" if "video" in kind else "") + ("<image>" if "image" in kind else "") + "What moves?"
    members = {
        "json": json.dumps(
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": "Nothing."},
                ]
            }
        ).encode()
    }
    if i >= 9:  # Bridge's video members: pickled lists of encoded frames, one list per video
        frames = [png_bytes(40, 32, seed=i * 10 + j) for j in range(5)]
        members["mp4s" if i == 9 else "videos"] = pickle.dumps([frames]) if i == 9 else b"not a pickle"
    elif "video" in kind:
        members["vid0.mp4"] = media
    if "image" in kind:
        members["img0.png"] = png_bytes(int(rng.integers(20, 60)), int(rng.integers(20, 60)), seed=i)
    return members


@pytest.fixture(scope="module")
def video_dataset(tmp_path_factory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp("energon_vlm_video_ds"), video_members, VIDEO_SAMPLES, shards=1
    )


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_video_samples_pack_once_each_bad_ones_named_and_deferred_equals_eager(
    video_dataset: Path, workers: int
) -> None:
    """Video members (``vid0.mp4``) measured from their headers in the buffer, decoded when their pack is
    emitted: every sample packed or reported once, the bad videos by reason, each batch the THD row of its
    members prepared alone (``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``), and the
    eager encoder gives the same batches."""
    prep = preparer(max_visual_tokens=None, video=VIDEO_CONFIG)
    deferred, _ = make_loader(video_dataset, workers=workers, buffer_size=4, prep=prep)
    batches = list(deferred)
    keys = accounting(batches)
    assert len(keys) == VIDEO_SAMPLES and set(keys.values()) == {1}
    skipped = {r["key"]: r for b in batches for r in b["skipped"]}
    assert {k: r["reason"] for k, r in skipped.items()} == BAD_VIDEOS
    assert all(r["message"].startswith(f"sample {k}: ") for k, r in skipped.items())
    videos = 0
    for b in batches:
        members = []
        for key in b["sample_keys"]:
            raw = video_members(int(key[1:]))
            sample = {**json.loads(raw["json"]), "images": [raw[k] for k in raw if k.startswith("img")]}
            sample["videos"] = [raw[k] for k in raw if k.startswith("vid")]
            sample["videos"] += pickle.loads(raw["mp4s"]) if "mp4s" in raw else []
            members.append(prep.prepare(sample, key=key))
        if not members:  # a buffer of refused samples: one padding sequence carries their records
            assert b["skipped"] and b["loss_mask"].sum() == 0
            continue
        expected = build_visual_thd_batch(
            members, sequence_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE, emit_padding_mask=True
        )
        assert signature({**expected, "sample_keys": b["sample_keys"], "skipped": b["skipped"]}) == signature(
            b
        )
        videos += len(b["visual_inputs"].get("video_grid_thw", []))
    assert videos == sum(1 for i in range(VIDEO_SAMPLES) if i % 3 < 2 and f"s{i:05d}" not in BAD_VIDEOS) == 5
    if workers == 0:
        eager, _ = make_loader(video_dataset, workers=0, buffer_size=4, prep=prep, eager=True)
        assert [signature(b) for b in eager] == [signature(b) for b in batches]


def test_qwen3_vl_video_samples_pack_once_each_and_deferred_equals_eager(video_dataset: Path) -> None:
    """Qwen3-VL video members: counted from their headers in the buffer (Qwen3-VL frame sampling, clip-level
    resize, timestamp text per frame group), decoded when their pack is emitted; every sample packed or
    reported once, Bridge's pickled frame list refused (``unsupported_video``: no frame rate for the
    timestamps), each batch the THD row of its members prepared alone, the eager encoder the same."""
    from transformers import Qwen2VLImageProcessor

    from longpack.vlm.families import vlm_family

    video = VideoConfig(min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 24)
    prep = vlm_family("qwen3_vl").preparer(
        image_processor=Qwen2VLImageProcessor(patch_size=16), max_visual_tokens=None, video=video
    )
    deferred, _ = make_loader(video_dataset, workers=0, buffer_size=4, prep=prep)
    batches = list(deferred)
    keys = accounting(batches)
    assert len(keys) == VIDEO_SAMPLES and set(keys.values()) == {1}
    skipped = {r["key"]: r["reason"] for b in batches for r in b["skipped"]}
    assert skipped == {**BAD_VIDEOS, "s00009": "unsupported_video"}
    videos = 0
    for b in batches:
        members = []
        for key in b["sample_keys"]:
            raw = video_members(int(key[1:]))
            sample = {**json.loads(raw["json"]), "images": [raw[k] for k in raw if k.startswith("img")]}
            sample["videos"] = [raw[k] for k in raw if k.startswith("vid")]
            members.append(prep.prepare(sample, key=key))
        if not members:
            continue
        expected = build_visual_thd_batch(
            members, sequence_length=SEQ_LENGTH, pad_to_multiple_of=MULTIPLE, emit_padding_mask=True
        )
        assert signature({**expected, "sample_keys": b["sample_keys"], "skipped": b["skipped"]}) == signature(
            b
        )
        videos += len(b["visual_inputs"].get("video_grid_thw", []))
    assert videos == 4  # the Qwen2-VL test's 5 less the refused frame list
    eager, _ = make_loader(video_dataset, workers=0, buffer_size=4, prep=prep, eager=True)
    assert [signature(b) for b in eager] == [signature(b) for b in batches]
