"""``VisualInBatchEncoder``: Energon micro-batches (``batch_size`` 4, no packing buffer) packed into one THD row
each, as Bridge's generic HF-encoder task encoder (``HFTaskEncoder(enable_in_batch_packing=True)``) does, on the
generated WebDataset of test_online_vlm_energon.py (good and bad samples), for Qwen2-VL and Gemma3-VL
preparers: every sample packed or reported once, each batch the in-batch row of its members prepared alone
(= ``VisualInBatchCollator`` on the same records), exact resume at a save point, Energon packing refused.
Bridge's own ``HFTaskEncoder.batch`` on the same examples: ``scripts/vlm_bridge_harness.py`` (``hf_encoder``
rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

energon = pytest.importorskip("megatron.energon")
pytest.importorskip("transformers")

from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset  # noqa: E402
from megatron.energon.errors import FatalSampleError  # noqa: E402
from test_online_vlm_energon import (  # noqa: E402
    BAD,
    LOADER_OPTIONS,
    N_SAMPLES,
    accounting,
    sample_members,
    signature,
    write_dataset,
)
from test_online_vlm_energon_gemma3 import GEMMA3_BAD, gemma3_preparer  # noqa: E402

from longpack.errors import OnlineError  # noqa: E402
from longpack.online.energon import restore_loader_state, save_loader_state  # noqa: E402
from longpack.online.vlm import HF_ENCODER_BATCH_KEYS, VisualInBatchEncoder  # noqa: E402
from longpack.runtime.in_batch import VisualInBatchCollator  # noqa: E402
from vlm_helpers import preparer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
MBS = 4
MULTIPLE = 8
FAMILIES = {
    "qwen2_vl": (lambda: preparer(max_visual_tokens=200), 128, BAD),
    "gemma3": (gemma3_preparer, 1024, GEMMA3_BAD),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("energon_in_batch_ds"), sample_members, N_SAMPLES)


def make_loader(root: Path, family: str, *, packing_buffer_size: int | None = None, **kwargs):
    make_prep, seq_length, _ = FAMILIES[family]
    encoder = VisualInBatchEncoder(make_prep(), seq_length=seq_length, pad_to_multiple_of=MULTIPLE, **kwargs)
    ds = get_train_dataset(
        root,
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=MBS,
        packing_buffer_size=packing_buffer_size,
        shuffle_buffer_size=4,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        repeat=False,
    )
    return get_savable_loader(ds, **LOADER_OPTIONS), encoder


def raw_record(key: str) -> dict:
    raw = sample_members(int(key[1:]))
    images = [raw[k] for k in sorted(k for k in raw if k.startswith("img"))]
    return {"__key__": key, **json.loads(raw["json"]), "images": images}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_micro_batch_is_the_in_batch_row_of_its_members_and_resume_is_exact(
    dataset: Path, family: str
) -> None:
    make_prep, seq_length, bad = FAMILIES[family]
    loader, encoder = make_loader(dataset, family)
    it = iter(loader)
    batches = [next(it)]
    state = save_loader_state(loader, encoder)
    batches += list(it)
    keys = accounting(batches)
    assert len(keys) == N_SAMPLES and set(keys.values()) == {1}
    assert {r["key"]: r["reason"] for b in batches for r in b["skipped"]} == bad
    assert all(len(b["sample_keys"]) + len(b["skipped"]) <= MBS for b in batches)
    collate = VisualInBatchCollator(
        make_prep().prepare, sequence_length=seq_length, pad_to_multiple_of=MULTIPLE
    )
    for b in batches:
        assert b["input_ids"].shape[0] == 1
        expected = collate([raw_record(k) for k in b["sample_keys"]])
        expected["skipped"] = b["skipped"]  # the refused members' records (from Energon's sample order)
        expected.pop("padding_mask")  # the collator's default (alignment > 1); the encoder's: Bridge's (none)
        for key in HF_ENCODER_BATCH_KEYS:
            expected.setdefault(key, None)
        assert signature(expected) == signature(b)
    restored, again = make_loader(dataset, family)
    restore_loader_state(restored, state, again)
    assert [signature(b) for b in restored] == [signature(b) for b in batches[1:]]


def test_a_micro_batch_of_refused_samples_is_a_padding_row_carrying_the_records(dataset: Path) -> None:
    encoder = VisualInBatchEncoder(preparer(max_visual_tokens=200), seq_length=128, pad_to_multiple_of=8)
    bad = [encoder.encode_sample(_chat(key)) for key in sorted(BAD)[:3]]
    out = encoder.batch(bad)
    assert out["sample_keys"] == [] and [r["key"] for r in out["skipped"]] == sorted(BAD)[:3]
    assert float(out["loss_mask"].sum()) == 0.0


def test_fixed_width_rows_must_fit_seq_length() -> None:
    encoder = VisualInBatchEncoder(preparer(), seq_length=128, pad_to_multiple_of=8, pad_to_max_length=True)
    good = [k for k in (f"s{i:05d}" for i in range(N_SAMPLES)) if k not in BAD]
    one = encoder.batch([encoder.encode_sample(_chat(good[0]))])
    assert one["input_ids"].shape == (1, 128)
    with pytest.raises(OnlineError, match="exceeds seq_length=128"):
        encoder.batch([encoder.encode_sample(_chat(k)) for k in good[:4]])


def test_energon_packing_is_refused(dataset: Path) -> None:
    loader, _ = make_loader(dataset, "qwen2_vl", packing_buffer_size=8)
    with pytest.raises(FatalSampleError, match="VisualInBatchEncoder packs each micro-batch"):
        next(iter(loader))


def _chat(key: str):
    from longpack.online.vlm import cook_vlm_sample

    raw = sample_members(int(key[1:]))
    return cook_vlm_sample(
        {"__key__": key, "__restore_key__": (), "__subflavors__": {}, "__sources__": (), **raw}
    )
