"""Energon adapter on a real local WebDataset prepared with ``energon prepare``.

Each sample ``sNNNNN.txt`` holds words ``w<i>_<j>``: token id ``i * 1000 + j``, so every packed token can be
traced back to its sample and position. Loaders with workers run on finite streams and are exhausted (an
abandoned worker loader costs ~10 s at the next ``gc.collect()``).
"""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

energon = pytest.importorskip("megatron.energon")

from click.testing import CliRunner  # noqa: E402
from megatron.energon import (  # noqa: E402
    DefaultTaskEncoder,
    SkipSample,
    TextSample,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    stateless,
)
from megatron.energon.errors import FatalSampleError  # noqa: E402
from megatron.energon.tools.prepare import command as energon_prepare  # noqa: E402

from longpack import binpack  # noqa: E402
from longpack.online.energon import (  # noqa: E402
    LoaderStateMismatch,
    LongpackPackingMixin,
    TokenSample,
    read_loader_state,
    restore_loader_state,
    save_loader_state,
    write_loader_state,
)

N_SAMPLES = 200
CAPACITY = 64
MULTIPLE = 2
ALGORITHM = "first_fit_shuffle" if "first_fit_shuffle" in binpack.ALGORITHMS else "first_fit_decreasing"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def sample_lengths() -> list[int]:
    rng = np.random.default_rng(0)
    return [int(n) for n in rng.integers(3, 81, N_SAMPLES)]  # some exceed the capacity: truncated


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("energon_ds")
    lengths = sample_lengths()
    per_shard = N_SAMPLES // 4
    for shard in range(4):
        with tarfile.open(root / f"shard_{shard:03d}.tar", "w") as tar:
            for i in range(shard * per_shard, (shard + 1) * per_shard):
                data = " ".join(f"w{i}_{j}" for j in range(lengths[i])).encode()
                info = tarfile.TarInfo(f"s{i:05d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    result = CliRunner().invoke(
        energon_prepare,
        [
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--sample-type",
            "TextSample",
            "--field-map",
            '{"text": "txt"}',
            "--num-workers",
            "1",
            "--no-progress",
            str(root),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (root / ".nv-meta" / "index.sqlite").exists()
    return root


class WordEncoder(LongpackPackingMixin, DefaultTaskEncoder):
    @stateless
    def encode_sample(self, sample: TextSample):
        words = [w[1:].split("_") for w in sample.text.split()]
        ids = [int(i) * 1000 + int(j) for i, j in words]
        mask = [int(j) % 3 != 0 for _, j in words]
        return self.token_sample(sample, ids, mask)


def make_loader(
    root: Path, *, workers: int, buffer_size: int = 16, repeat: bool = True, capacity: int = CAPACITY
):
    encoder = WordEncoder(capacity=capacity, pad_to_multiple_of=MULTIPLE, algorithm=ALGORITHM, seed=3)
    dataset = get_train_dataset(
        root,
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=1,
        packing_buffer_size=buffer_size,
        shuffle_buffer_size=8,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        repeat=repeat,
    )
    return get_savable_loader(dataset, checkpoint_every_sec=0.0, watchdog_timeout_seconds=None), encoder


def signature(batch: dict) -> tuple:
    rows = tuple(
        (r["input_ids"].tolist(), r["loss_mask"].tolist(), r["seq_start_id"].tolist()) for r in batch["rows"]
    )
    return rows, tuple(tuple(k) for k in batch["sample_keys"])


def check_row(row: dict, keys: list[str], lengths: list[int]) -> None:
    """Members' tokens in order, each pre-padded to aligned+1, loss mask label-aligned, pack within capacity."""
    starts = row["seq_start_id"].tolist()
    ends = [*starts[1:], len(row["input_ids"])]
    total = 0
    for key, lo, hi in zip(keys, starts, ends, strict=True):
        i = int(key[1:])
        kept = min(lengths[i], CAPACITY // MULTIPLE * MULTIPLE + 1)
        runtime = kept - 1
        aligned = -(-runtime // MULTIPLE) * MULTIPLE
        assert hi - lo == aligned + 1
        total += aligned
        ids, mask = row["input_ids"][lo:hi], row["loss_mask"][lo:hi]
        assert ids[:kept].tolist() == [i * 1000 + j for j in range(kept)]
        assert (ids[kept:] == 0).all()
        assert mask[:runtime].tolist() == [int(j % 3 != 0) for j in range(1, kept)]
        assert (mask[runtime:] == 0).all()
    assert total <= CAPACITY


def test_restore_after_k_packs_is_identical_without_workers(dataset: Path) -> None:
    """States saved after k packs (k in 0..14, spread over several selections of the 16-sample
    buffer); a fresh loader restored from each continues identically."""
    loader, encoder = make_loader(dataset, workers=0)
    stream = iter(loader)
    states, reference = [], []
    for _ in range(15):
        states.append(save_loader_state(loader, encoder))  # with 0 workers saving is synchronous and exact
        reference.append(signature(next(stream)))
    reference += [signature(next(stream)) for _ in range(8)]
    for k in (0, 1, 2, 3, 5, 7, 10, 14):  # each restored loader costs ~0.1-1 s; these cover the cases
        state = states[k]
        restored, restored_encoder = make_loader(dataset, workers=0)
        restore_loader_state(restored, state, restored_encoder)
        it = iter(restored)
        tail = [signature(next(it)) for _ in range(8)]
        assert tail == reference[k : k + 8], f"continuation differs after k={k}"
    lengths = sample_lengths()
    for rows, keys in reference:
        for row, member_keys in zip(rows, keys, strict=True):
            as_arrays = {
                "input_ids": np.array(row[0]),
                "loss_mask": np.array(row[1]),
                "seq_start_id": np.array(row[2]),
            }
            check_row(as_arrays, list(member_keys), lengths)


@pytest.mark.parametrize("workers", [0, 2])
def test_finite_stream_every_sample_once_and_resume_through_file(
    dataset: Path, workers: int, tmp_path
) -> None:
    """Finite epoch: all 200 samples exactly once; with 0 and 2 workers, states saved after k = 2 and 7
    packs, written to files and read back, restore the identical rest of the epoch."""
    first, enc1 = make_loader(dataset, workers=workers, repeat=False)
    it = iter(first)
    reference, paths = [], {}
    for k in range(7 + 1):
        if k in (2, 7):
            paths[k] = tmp_path / f"dataloader_state_{k}.pkl"
            write_loader_state(paths[k], save_loader_state(first, enc1))
        if k < 7:
            reference.append(signature(next(it)))
    reference += [signature(b) for b in it]  # exhausted, so the workers shut down
    keys = Counter(k for _, batch_keys in reference for member in batch_keys for k in member)
    assert len(keys) == N_SAMPLES and set(keys.values()) == {1}

    for k, path in paths.items():
        restored, encoder = make_loader(dataset, workers=workers, repeat=False)
        restore_loader_state(restored, read_loader_state(path), encoder)
        tail = [signature(b) for b in restored]
        assert tail == reference[k:], f"continuation differs after k={k} with {workers} workers"


def test_mismatched_buffer_size_workers_or_capacity_is_named(dataset: Path) -> None:
    loader, encoder = make_loader(dataset, workers=0)
    it = iter(loader)
    next(it)
    state = save_loader_state(loader, encoder)
    for kwargs, needle in (
        ({"buffer_size": 32}, r"buffer_size: saved 16, now 32"),
        ({"workers": 2}, r"num_workers: saved 0, now 2"),
        ({"capacity": 128}, r"longpack_packing.capacity: saved 64, now 128"),
    ):
        other, enc = make_loader(dataset, **{"workers": 0, **kwargs})
        with pytest.raises(LoaderStateMismatch, match=needle):
            restore_loader_state(other, state, enc)


def test_unsafe_state_file_is_refused(tmp_path) -> None:
    import os
    import pickle

    class Evil:
        # os.getcwd, not print: once Ray ran in this process, builtins.print is Ray's safe_print.
        def __reduce__(self):
            return (os.getcwd, ())

    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps({"format": "x", "payload": Evil()}))
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load (posix|os)\.getcwd"):
        read_loader_state(path)


def test_encode_sample_must_be_stateless() -> None:
    class Forgetful(LongpackPackingMixin, DefaultTaskEncoder):
        def encode_sample(self, sample):
            return sample

    with pytest.raises(TypeError, match=r"encode_sample must be decorated with @stateless"):
        Forgetful(capacity=64, algorithm="first_fit_decreasing")


def test_token_sample_overlength_policies() -> None:
    source = TextSample(__key__="s00007", __restore_key__=("Webdataset", 7), text="")
    ids = np.arange(40)
    truncating = WordEncoder(capacity=16, pad_to_multiple_of=4, algorithm="first_fit_decreasing")
    out = truncating.token_sample(source, ids, None)
    assert out.input_ids.tolist() == list(range(17)) and out.__key__ == "s00007"
    dropping = WordEncoder(
        capacity=16, pad_to_multiple_of=4, algorithm="first_fit_decreasing", overlength="drop"
    )
    with pytest.raises(SkipSample):
        dropping.token_sample(source, ids, None)
    strict = WordEncoder(
        capacity=16, pad_to_multiple_of=4, algorithm="first_fit_decreasing", overlength="error"
    )
    with pytest.raises(FatalSampleError, match="sample s00007: runtime length 39"):
        strict.token_sample(source, ids, None)
    with pytest.raises(ValueError, match="sample s00007: 1 stored token"):
        strict.token_sample(source, ids[:1], None)
    with pytest.raises(FatalSampleError, match="got a TextSample, not a TokenSample"):
        strict.select_samples_to_pack([source])
    with pytest.raises(FatalSampleError, match="aligned length 40 > capacity 16"):
        strict.select_samples_to_pack(
            [
                dropping.token_sample(source, ids[:5], None),
                out.derive_from(source, input_ids=ids, loss_mask=np.ones(40, dtype=np.int8)),
            ]
        )


def test_two_data_parallel_ranks_split_the_epoch(dataset: Path) -> None:
    """Two DP ranks (one loader each, rank/world_size in WorkerConfig): each packs its own half of the
    epoch; together every sample exactly once."""
    keys: Counter[str] = Counter()
    for rank in range(2):
        encoder = WordEncoder(capacity=CAPACITY, pad_to_multiple_of=MULTIPLE, algorithm=ALGORITHM, seed=3)
        ds = get_train_dataset(
            dataset,
            split_part="train",
            worker_config=WorkerConfig(rank=rank, world_size=2, num_workers=0),
            batch_size=1,
            packing_buffer_size=16,
            shuffle_buffer_size=8,
            max_samples_per_sequence=None,
            task_encoder=encoder,
            repeat=False,
        )
        rank_keys = [k for batch in get_savable_loader(ds) for member in batch["sample_keys"] for k in member]
        assert len(rank_keys) == N_SAMPLES // 2
        keys.update(rank_keys)
    assert len(keys) == N_SAMPLES and set(keys.values()) == {1}


def test_pure_packer_reproduces_energon_packs(dataset: Path) -> None:
    """The pure OnlinePacker implements Energon's PackingDataset semantics: fed the encoded samples in the
    order Energon encoded them, it forms the same packs in the same order. First fit decreasing: its output
    does not depend on the seed, which the two derive differently (selection number vs. sample index)."""
    from longpack.online import OnlinePacker

    order: list[TokenSample] = []

    class RecordingEncoder(WordEncoder):
        @stateless
        def encode_sample(self, sample: TextSample):
            encoded = super().encode_sample(sample)
            order.append(encoded)
            return encoded

    encoder = RecordingEncoder(
        capacity=CAPACITY, pad_to_multiple_of=MULTIPLE, algorithm="first_fit_decreasing"
    )
    ds = get_train_dataset(
        dataset,
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1,
        packing_buffer_size=16,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        repeat=False,
    )
    energon_packs = [tuple(member) for batch in get_savable_loader(ds) for member in batch["sample_keys"]]
    assert len(order) == N_SAMPLES
    packer = OnlinePacker(CAPACITY, 16, pad_to_multiple_of=MULTIPLE, algorithm="first_fit_decreasing")
    stream = [{"input_ids": s.input_ids, "loss_mask": s.loss_mask} for s in order]
    pure_packs = [tuple(order[i].__key__ for i in p.sample_index.tolist()) for p in packer.pack(stream)]
    assert pure_packs == energon_packs
