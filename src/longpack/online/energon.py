"""Megatron-Energon adapter: a ``TaskEncoder`` mixin that packs with longpack's selection, and loader-state
helpers that refuse a state saved under a different configuration (Energon itself does not check).

Needs ``megatron-energon`` (``pip install 'longpack[energon]'``); ``import longpack.online`` does not import
this module.

How it plugs in (docs/guide/online-sim.md#algorithm): Energon calls ``select_samples_to_pack`` on every full
candidate buffer (``packing_buffer_size`` encoded samples per worker) and ``pack_selected_samples`` on every
selected group. The mixin implements both:

- ``select_samples_to_pack``: aligned runtime lengths -> ``longpack.binpack.pack_lengths`` -> groups in
  bin order (members in buffer order); every sample lands in exactly one group (Energon silently drops
  samples left out of all groups). Its randomness (for shuffled algorithms) is seeded from
  ``(seed, worker seed, current_sample_index)``: Energon saves the pre-packing sample index, so a restored
  loader reproduces the same selection; no global RNG is touched. Its output is saved by Energon, never
  recomputed, so it is deliberately **not** ``@stateless``.
- ``pack_selected_samples`` (``@stateless``: Energon re-runs it when restoring a saved pack) builds the
  Megatron-Bridge packed row: ``input_ids`` (int64, every sample pre-padded to ``aligned + 1`` stored
  tokens), ``loss_mask`` (int8, label-aligned) and ``seq_start_id`` (int64).
- ``batch`` (``@stateless``) returns ``{"rows": [row, ...], "sample_keys": [[key, ...], ...]}``;
  ``longpack.runtime.collate_packed(batch["rows"], max_seq_length=capacity, eos_id=EOS,
  pad_seq_to_mult=pad_to_multiple_of)`` turns the rows into a THD batch (pass ``pad_id=EOS`` to the mixin).

Your ``encode_sample`` must be ``@stateless`` (Energon restores buffered samples by re-encoding them) and
should return :meth:`LongpackPackingMixin.token_sample`, which applies the overlength policy where Energon
can skip a single sample.

Example::

    class MyEncoder(LongpackPackingMixin, DefaultTaskEncoder):
        @stateless
        def encode_sample(self, sample: TextSample) -> TokenSample:
            ids = tokenizer.encode(sample.text)
            return self.token_sample(sample, ids, loss_mask=None)

    encoder = MyEncoder(capacity=4096, pad_to_multiple_of=8)
    ds = get_train_dataset(path, worker_config=wc, batch_size=1, packing_buffer_size=64, task_encoder=encoder,
                           shuffle_buffer_size=100, max_samples_per_sequence=None)
    loader = get_savable_loader(ds)
    state = save_loader_state(loader)            # {"loader_config": ..., "energon_state": ...}
    restore_loader_state(new_loader, state)      # raises LoaderStateMismatch naming a changed setting
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from megatron.energon import Sample, SkipSample, stateless
from megatron.energon.errors import FatalSampleError
from megatron.energon.task_encoder.base import get_stateless
from megatron.energon.worker import WorkerConfig

from longpack import binpack, choices
from longpack.choices import ONLINE_OVERLENGTH_POLICIES
from longpack.errors import ConfigError, OnlineError
from longpack.online.packer import select_packs
from longpack.outputs import atomic_write_bytes
from longpack.topology import align_up

LOADER_STATE_FORMAT = "longpack.online.energon.loader_state/1"


@dataclass(kw_only=True, slots=True)
class TokenSample(Sample):
    """An encoded sample: stored ``input_ids`` (int64) and **unshifted** ``loss_mask`` (int8)."""

    input_ids: np.ndarray
    loss_mask: np.ndarray


@dataclass(kw_only=True, slots=True)
class PackedTokenSample(Sample):
    """One pack: a Megatron-Bridge packed row plus the member sample keys and runtime lengths."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    seq_start_id: np.ndarray
    sample_keys: list[str]
    lengths: np.ndarray

    def row(self) -> dict[str, np.ndarray]:
        """The row in Megatron-Bridge's packed-Parquet form."""
        return {"input_ids": self.input_ids, "loss_mask": self.loss_mask, "seq_start_id": self.seq_start_id}


class LongpackPackingMixin:
    """Energon ``TaskEncoder`` mixin: longpack's pack selection and Megatron-Bridge packed rows.

    Put it before the Energon base class: ``class Enc(LongpackPackingMixin, DefaultTaskEncoder)``.
    Keyword arguments: ``capacity`` (runtime tokens per pack, Bridge's ``seq_length``),
    ``pad_to_multiple_of`` (per-sample alignment, ``lcm(2*CP, CP*TP)``), ``algorithm`` (a name in
    ``longpack.binpack.ALGORITHMS``), ``seed``, ``overlength`` (``truncate``/``drop``/``error``, applied by
    :meth:`token_sample`) and ``pad_id``; the rest goes to the base class.
    """

    def __init__(
        self,
        *args: Any,
        capacity: int,
        pad_to_multiple_of: int = 1,
        algorithm: str = choices.DEFAULT_ALGORITHM,
        seed: int = 0,
        overlength: str = choices.OVERLENGTH_TRUNCATE,
        pad_id: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"capacity must be a positive integer, got {capacity!r}")
        if not isinstance(pad_to_multiple_of, int) or not 1 <= pad_to_multiple_of <= capacity:
            raise ConfigError(
                f"pad_to_multiple_of must be an integer in 1..capacity={capacity}, got {pad_to_multiple_of!r}"
            )
        if algorithm not in binpack.ALGORITHMS:
            raise ConfigError(
                f"algorithm={algorithm!r} is not one of longpack.binpack.ALGORITHMS {binpack.ALGORITHMS}"
            )
        if overlength not in ONLINE_OVERLENGTH_POLICIES:
            raise ConfigError(f"overlength={overlength!r} is not one of {ONLINE_OVERLENGTH_POLICIES}")
        if not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
        encode = getattr(self, "encode_sample", None)
        if encode is not None and self._overrides("encode_sample") and not get_stateless(encode):
            raise TypeError(
                f"{type(self).__name__}.encode_sample must be decorated with @stateless (or "
                "@stateless(restore_seeds=True) if it is random): Energon restores buffered samples by re-encoding "
                "them, and fails at restore time otherwise"
            )
        self.packing_capacity = capacity
        self.packing_pad_to_multiple_of = pad_to_multiple_of
        self.packing_algorithm = algorithm
        self.packing_seed = seed
        self.packing_overlength = overlength
        self.packing_pad_id = pad_id
        self.packing_max_runtime_length = capacity // pad_to_multiple_of * pad_to_multiple_of

    def _overrides(self, name: str) -> bool:
        for klass in type(self).__mro__:
            if name in vars(klass):
                return klass.__module__.split(".")[:2] != ["megatron", "energon"]
        return False

    def packing_config(self) -> dict[str, Any]:
        """The settings that decide which samples form a pack (stored with loader states)."""
        return {
            "capacity": self.packing_capacity,
            "pad_to_multiple_of": self.packing_pad_to_multiple_of,
            "algorithm": self.packing_algorithm,
            "seed": self.packing_seed,
            "overlength": self.packing_overlength,
            "pad_id": self.packing_pad_id,
        }

    # ------------------------------------------------------------------ encode helper
    def token_sample(self, source: Sample, input_ids: Any, loss_mask: Any = None) -> TokenSample:
        """Build the encoded sample for ``source`` and apply the overlength policy.

        ``truncate`` keeps the first ``capacity // m * m + 1`` stored tokens; ``drop`` raises Energon's
        ``SkipSample`` (silent, per sample); ``error`` raises ``FatalSampleError``. A stored sample needs at
        least 2 tokens (``ValueError`` otherwise, which Energon's error handler logs, counts and skips).
        """
        ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
        mask = (
            np.ones(len(ids), dtype=np.int8) if loss_mask is None else np.asarray(loss_mask).astype(np.int8)
        )
        if len(mask) != len(ids):
            raise ConfigError(
                f"sample {source.__key__}: len(loss_mask)={len(mask)} != len(input_ids)={len(ids)}"
            )
        if len(ids) < 2:
            # Not silent: Energon's error handler logs and counts it (a 1-token sample trains on nothing).
            raise ConfigError(
                f"sample {source.__key__}: {len(ids)} stored token(s); a sample needs at least 2"
            )
        runtime = len(ids) - 1
        if align_up(runtime, self.packing_pad_to_multiple_of) > self.packing_capacity:
            if self.packing_overlength == "drop":
                raise SkipSample()
            if self.packing_overlength == "error":
                raise FatalSampleError(
                    f"sample {source.__key__}: runtime length {runtime} aligned to {self.packing_pad_to_multiple_of} "
                    f"exceeds capacity {self.packing_capacity}; use overlength='truncate' or 'drop'"
                )
            keep = self.packing_max_runtime_length + 1
            ids, mask = ids[:keep], mask[:keep]
        return TokenSample.derive_from(source, input_ids=ids, loss_mask=mask)

    # ------------------------------------------------------------------ Energon packing hooks
    def select_samples_to_pack(self, samples: list[TokenSample]) -> list[list[TokenSample]]:
        """Partition one candidate buffer into packs (see the module docstring for seeding)."""
        m = self.packing_pad_to_multiple_of
        for s in samples:
            if not isinstance(s, TokenSample):
                raise FatalSampleError(
                    f"select_samples_to_pack got a {type(s).__name__}, not a TokenSample: encode_sample must return "
                    "LongpackPackingMixin.token_sample(sample, input_ids, loss_mask)"
                )
        lengths = np.array([align_up(len(s.input_ids) - 1, m) for s in samples], dtype=np.int64)
        too_long = np.flatnonzero(lengths > self.packing_capacity)
        if len(too_long):
            s = samples[int(too_long[0])]
            # Fatal on purpose: a handled error here would make Energon drop the whole buffer.
            raise FatalSampleError(
                f"sample {s.__key__}: aligned length {int(lengths[too_long[0]])} > capacity {self.packing_capacity}; "
                "build encoded samples with LongpackPackingMixin.token_sample(), which applies the overlength policy"
            )
        groups = select_packs(
            lengths, self.packing_capacity, algorithm=self.packing_algorithm, seed=self._selection_seed()
        )
        return [[samples[j] for j in g.tolist()] for g in groups]

    def _selection_seed(self) -> int:
        config = WorkerConfig.active_worker_config
        worker_seed = config.worker_seed() if config is not None else 0
        index = int(self.current_sample_index) if config is not None else 0  # type: ignore[attr-defined]
        words = np.random.SeedSequence([self.packing_seed, worker_seed, index]).generate_state(
            1, dtype=np.uint32
        )
        return int(words[0])

    @stateless
    def pack_selected_samples(self, samples: list[TokenSample]) -> PackedTokenSample:
        """One Megatron-Bridge packed row from a selected group (deterministic: Energon replays it on restore)."""
        m, pad_id = self.packing_pad_to_multiple_of, self.packing_pad_id
        ids_parts, mask_parts, starts, lengths = [], [], [], []
        offset = 0
        for s in samples:
            runtime = len(s.input_ids) - 1
            gap = align_up(runtime, m) - runtime
            ids = np.concatenate([s.input_ids, np.full(gap, pad_id, dtype=np.int64)])
            mask = np.zeros(len(ids), dtype=np.int8)
            mask[:runtime] = s.loss_mask[1:]  # label-aligned: position j trains iff token j+1 is a target
            ids_parts.append(ids)
            mask_parts.append(mask)
            starts.append(offset)
            lengths.append(runtime)
            offset += len(ids)
        return PackedTokenSample(
            __key__=",".join(s.__key__ for s in samples),
            __restore_key__=(),  # Energon overwrites it
            __subflavors__=samples[0].__subflavors__ if samples else None,
            input_ids=np.concatenate(ids_parts),
            loss_mask=np.concatenate(mask_parts),
            seq_start_id=np.array(starts, dtype=np.int64),
            sample_keys=[s.__key__ for s in samples],
            lengths=np.array(lengths, dtype=np.int64),
        )

    @stateless
    def batch(self, samples: list[PackedTokenSample]) -> dict[str, Any]:
        """``{"rows": [...], "sample_keys": [[...], ...]}``: rows for ``longpack.runtime.collate_packed``."""
        return {"rows": [p.row() for p in samples], "sample_keys": [list(p.sample_keys) for p in samples]}


# ---------------------------------------------------------------------------------------------- loader state


class LoaderStateMismatch(OnlineError):
    """A saved loader state whose configuration differs from the loader it is restored into."""


def _plain(value: Any) -> Any:
    """A comparable, picklable copy of a loader config (functions and objects become their repr)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _differences(saved: Any, current: Any, path: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current)):
            out += _differences(
                saved.get(key, "<absent>"), current.get(key, "<absent>"), f"{path}.{key}" if path else key
            )
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        out = []
        for i, (a, b) in enumerate(zip(saved, current, strict=True)):
            out += _differences(a, b, f"{path}[{i}]")
        return out
    return [] if saved == current else [f"{path}: saved {saved!r}, now {current!r}"]


def loader_config(loader: Any, task_encoder: Any = None) -> dict[str, Any]:
    """Energon's description of the whole loader stack (``loader.config()``), plus the packer settings."""
    config = {"energon": _plain(loader.config())}
    encoder = task_encoder
    if encoder is not None and hasattr(encoder, "packing_config"):
        config["longpack_packing"] = _plain(encoder.packing_config())
    return config


class LoaderStateReplay(OnlineError):
    """A saved loader state that Energon would restore by replaying samples (see :func:`replaying_workers`)."""


class ResumeReplayWarning(UserWarning):
    """A loader state saved (or restored with ``on_replay="warn"``) at a point Energon resumes by replaying."""


ON_REPLAY: tuple[str, ...] = ("raise", "warn")
# Dataset wrappers that start the reader's next pass on purpose: with them an ended pass is not an end.
_REPEATING_TYPES = ("RepeatDataset", "BlendDataset")
_READER_TYPE = "WebdatasetSampleLoaderDataset"


def _found(tree: Any, predicate: Any) -> list[Any]:
    """Every dict (Energon's ``FlexState`` is one) of a state or config tree for which ``predicate`` holds."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if predicate(node):
                out.append(node)
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
        else:
            for name in ("state", "dataset_state"):
                child = getattr(node, name, None)
                if child is not None:
                    stack.append(child)
    return out


def replaying_workers(state: dict[str, Any]) -> list[int]:
    """The loader workers of a :func:`save_loader_state` result that Energon would restore by replaying.

    Energon's WebDataset reader ends a pass by resetting itself to the start of its next pass
    (``_epoch_count`` 1, no pending slices). In a single-pass loader (``repeat=False``: no ``RepeatDataset``
    or ``BlendDataset`` in the stack) a state saved after some worker's reader ended its pass (that worker may
    still be emitting the packs left in its buffers) is restored as a new pass: the restored loader yields
    samples again (measured: 48 samples, 12 packs, saved after 10 packs, 0 workers -> 14 packs instead of 2;
    2 workers, saved after 9 -> 9 instead of 3). States saved earlier resume exactly. Returns the worker
    indexes (0 without worker processes), empty when the state resumes exactly or the loader repeats.

    >>> replaying_workers({"config": {"energon": {"type": "SavableDataLoader"}}, "energon_state": None})
    []
    """
    if _found(state.get("config"), lambda d: d.get("type") in _REPEATING_TYPES):
        return []
    energon_state = state.get("energon_state")
    workers = getattr(energon_state, "worker_states", None) or []
    out = []
    for index, worker in enumerate(workers):
        ended = _found(
            worker, lambda d: d.get("__class__") == _READER_TYPE and int(d.get("_epoch_count") or 0) > 0
        )
        if ended:
            out.append(index)
    return out


def _replay_message(workers: list[int]) -> str:
    return (
        f"this loader state was saved after loader worker(s) {workers} of this rank finished their pass over a "
        "single-pass dataset (repeat=False); Energon restores such a worker at the start of its next pass, so "
        "the restored loader would yield samples again"
    )


def _without_unstarted_sentinels(loader: Any, energon_state: Any) -> Any:
    """``energon_state`` with the checkpoint of every worker that had not stored its first checkpoint corrected.

    A worker answers a save with its newest checkpoint at or before the next sample it owes the rank, plus the
    samples to skip from there (``SavableDatasetWrapper.get_checkpoint``, megatron-energon 7.4.1 and main at
    bef8be2). Before its iteration stores the first checkpoint, its list holds only the constructor's
    placeholder (no state, ``sample_index`` -1), so a worker that has yielded nothing answers "start over and
    skip one sample": the restored loader loses that worker's first pack. This happens when the worker's
    command thread takes the lock before its iteration does, which on a loaded machine is common (measured on
    2 cores at load 8: 5 of 30 saves after the first pack of 2 workers). The placeholder is recognised by its
    missing state; the right answer is where the worker started: the state it was restored from with that
    state's skip, or the initial state with nothing to skip.
    """
    workers = getattr(energon_state, "worker_states", None)
    wrapper = getattr(loader, "dataset", None)
    restore_from = getattr(wrapper, "_workers_restore_from", None)
    skips = getattr(wrapper, "_workers_skip_samples", None)
    counters = getattr(loader, "_worker_sample_counters", None)
    if not workers or restore_from is None or skips is None or counters is None:
        return energon_state
    for index, checkpoint in enumerate(workers):
        if getattr(checkpoint, "state", True) is not None or index >= len(counters):
            continue
        # The placeholder's offset is the samples owed plus one (counted from sample -1).
        if checkpoint.offset != counters[index] + 2:
            continue
        if restore_from[index] is None:
            checkpoint.offset = counters[index] + 1
        else:
            checkpoint.state, checkpoint.offset = restore_from[index], skips[index]
    return energon_state


def save_loader_state(loader: Any, task_encoder: Any = None) -> dict[str, Any]:
    """Save a savable loader's rank state together with its configuration.

    The configuration includes the packing buffer size, the worker count and every wrapper of the stack; pass
    the ``task_encoder`` to include the packer settings too (capacity, alignment, algorithm, seed). A state
    that cannot resume exactly (:func:`replaying_workers`) warns with :class:`ResumeReplayWarning` and
    records the workers under ``"replay_workers"``.
    """
    state = {
        "format": LOADER_STATE_FORMAT,
        "config": loader_config(loader, task_encoder),
        "energon_state": _without_unstarted_sentinels(loader, loader.save_state_rank()),
    }
    state["replay_workers"] = replaying_workers(state)
    if state["replay_workers"]:
        warnings.warn(
            _replay_message(state["replay_workers"])
            + " if restored; keep an earlier state for resuming this pass",
            ResumeReplayWarning,
            stacklevel=2,
        )
    return state


def restore_loader_state(
    loader: Any, state: dict[str, Any], task_encoder: Any = None, *, on_replay: str = "raise"
) -> None:
    """Restore ``state`` into a fresh, not yet iterated loader; a different configuration is an error.

    Energon restores a state saved with another ``packing_buffer_size`` silently into a different stream and
    fails with a bare ``AssertionError`` for another worker count; this names the setting instead. A state
    Energon would restore by replaying samples (:func:`replaying_workers`) raises :class:`LoaderStateReplay`
    (``on_replay="raise"``) or restores with a :class:`ResumeReplayWarning` (``on_replay="warn"``).
    """
    if on_replay not in ON_REPLAY:
        raise OnlineError(f"on_replay={on_replay!r} is not one of {ON_REPLAY}", fields="on_replay")
    if not isinstance(state, dict) or state.get("format") != LOADER_STATE_FORMAT:
        raise LoaderStateMismatch(f"not a longpack loader state (expected format {LOADER_STATE_FORMAT!r})")
    diffs = _differences(state["config"], loader_config(loader, task_encoder))
    if diffs:
        shown = "; ".join(diffs[:8]) + (f"; and {len(diffs) - 8} more" if len(diffs) > 8 else "")
        raise LoaderStateMismatch(
            f"loader configuration differs from the saved state ({shown}); build the loader with the saved "
            "settings to resume exactly, or start without restoring"
        )
    replay = replaying_workers(state)
    if replay and on_replay == "raise":
        raise LoaderStateReplay(
            _replay_message(replay)
            + "; resume from an earlier state, start the next pass without restoring, "
            "or pass on_replay='warn' to restore it anyway",
            fields="on_replay",
        )
    if replay:
        warnings.warn(_replay_message(replay), ResumeReplayWarning, stacklevel=2)
    loader.restore_state_rank(state["energon_state"])


def _tensor_from_array(array: np.ndarray) -> Any:
    """Rebuild a CPU tensor saved by :class:`_StatePickler` (Energon keeps torch RNG states as tensors)."""
    import torch

    return torch.from_numpy(np.array(array))


class _StatePickler(pickle.Pickler):
    """Pickles torch tensors as numpy arrays, so reading needs no torch unpickling path (which nests an
    unrestricted ``torch.load``)."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return _tensor_from_array, (obj.detach().cpu().numpy(),)
        return NotImplemented


class _EnergonStateUnpickler(pickle.Unpickler):
    """Loads only Energon's state classes, plain containers and numpy arrays: a state file must not run code."""

    _ALLOWED = {
        ("builtins", name)
        for name in (
            "dict",
            "list",
            "tuple",
            "set",
            "frozenset",
            "int",
            "float",
            "str",
            "bytes",
            "bool",
            "slice",
        )
    } | {
        ("collections", "OrderedDict"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "_reconstruct"),
        (__name__, "_tensor_from_array"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if module.startswith("megatron.energon."):
            found = super().find_class(module, name)
            if isinstance(found, type):  # classes of Energon's state tree, never functions
                return found
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a loader state file")


def write_loader_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write a :func:`save_loader_state` result atomically (read it back with :func:`read_loader_state`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    _StatePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    atomic_write_bytes(path, buffer.getvalue())


def read_loader_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a state file with a restricted unpickler (Energon state classes and plain containers only)."""
    data = Path(path).read_bytes()
    state = _EnergonStateUnpickler(io.BytesIO(data)).load()
    if not isinstance(state, dict) or state.get("format") != LOADER_STATE_FORMAT:
        raise LoaderStateMismatch(f"{path}: not a longpack loader state file")
    return state


def rows_of(batches: Sequence[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """All rows of a list of mixin batches, in order."""
    return [row for b in batches for row in b["rows"]]
