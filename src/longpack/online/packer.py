"""Streaming sequence packer with a candidate buffer and exact state save/restore (pure numpy).

The packer follows Megatron-Energon's ``PackingDataset`` algorithm (docs/guide/online-sim.md#algorithm)
so that numbers measured here carry over to an Energon pipeline that uses the same selection:

- a *reading buffer* is topped up from the stream until it and the not-yet-emitted selected samples hold
  ``buffer_size`` samples together; refill is incremental (one emitted pack frees its members' slots);
- a new *selection* runs only when every group of the previous selection has been emitted, and it sees
  exactly ``buffer_size`` fresh samples: ``longpack.binpack.pack_lengths`` partitions them into packs;
- at the end of a finite stream the pending packs are emitted, then the partial buffer is selected and
  emitted: no sample is ever lost.

Lengths are **runtime tokens** (docs/reference/packed-format.md#runtime-tokens): a stored sample of ``S``
tokens trains on ``S - 1`` positions, and ``capacity`` counts runtime tokens. With ``pad_to_multiple_of=m``
every sample's runtime length is padded up to a multiple of ``m`` (Bridge's pre-pad: stored length
``k*m + 1``), which is what THD context parallelism needs (``m = 2*CP``, or ``lcm(2*CP, CP*TP)`` with
sequence parallelism).

Rows have the form Megatron-Bridge's packed Parquet uses (docs/reference/packed-format.md#columns):
``input_ids`` (int64), ``loss_mask`` (int8, *label-aligned*: each sample's mask shifted left by one, its last
position 0) and ``seq_start_id`` (int64 start offset of every sample, first 0).

Example (bare runtime lengths; capacity 10, buffer of 4 samples)::

    >>> packer = OnlinePacker(10, 4, algorithm="first_fit_decreasing")
    >>> [p.sample_index.tolist() for p in packer.pack([6, 3, 5, 4, 7, 2])]
    [[0, 3], [1, 2], [4, 5]]
    >>> packer.stats.samples_packed, packer.stats.packs
    (6, 3)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np

from longpack import binpack, choices
from longpack.choices import ONLINE_OVERLENGTH_POLICIES
from longpack.errors import OnlineError
from longpack.outputs import atomic_write_bytes
from longpack.topology import align_up

Overlength = Literal["truncate", "drop", "error"]
STATE_FORMAT = "longpack.online.OnlinePacker/1"
# The settings a saved state is only valid for (a different value changes which samples form a pack).
STATE_CONFIG_FIELDS: tuple[str, ...] = (
    "capacity",
    "buffer_size",
    "pad_to_multiple_of",
    "algorithm",
    "seed",
    "overlength",
    "pad_id",
)


class OnlineStateError(OnlineError):
    """A saved packer state that does not fit this packer or this stream."""


@dataclass(frozen=True, kw_only=True)
class OnlinePack:
    """One emitted pack.

    - ``sample_index``: stream position (0-based) of every member, in row order (int64).
    - ``lengths``: runtime length of every member after truncation, before alignment (int64).
    - ``aligned_lengths``: the lengths the selection packed (multiples of ``pad_to_multiple_of``).
    - ``row``: ``{"input_ids", "loss_mask", "seq_start_id"}`` when the stream carried tokens, else ``None``.
    - ``selection``: number of the selection (0-based) that formed this pack.
    """

    sample_index: np.ndarray
    lengths: np.ndarray
    aligned_lengths: np.ndarray
    row: dict[str, np.ndarray] | None
    selection: int

    @property
    def packed_length(self) -> int:
        """Runtime tokens the pack occupies (sum of aligned lengths), at most the capacity."""
        return int(self.aligned_lengths.sum())


@dataclass(kw_only=True)
class OnlineStats:
    """Counts since the start of the stream (they travel with the state).

    ``truncated``/``dropped`` count samples longer than the capacity handled by the overlength policy;
    ``tokens_truncated`` counts the runtime tokens truncation removed.
    """

    samples_read: int = 0
    samples_packed: int = 0
    truncated: int = 0
    tokens_truncated: int = 0
    dropped: int = 0
    packs: int = 0
    selections: int = 0
    runtime_tokens: int = 0
    aligned_tokens: int = 0

    def fill(self, capacity: int) -> float:
        """Aligned tokens / (packs * capacity): Bridge's ``packing_efficiency`` / 100."""
        return self.aligned_tokens / (self.packs * capacity) if self.packs else 0.0


@dataclass
class _Item:
    index: int
    runtime_length: int
    aligned_length: int
    stored_length: int  # fingerprint of the source sample, checked on replay
    input_ids: np.ndarray | None = None
    loss_mask: np.ndarray | None = None


@dataclass
class _Progress:
    next_index: int = 0  # stream position of the next sample to read
    selection_index: int = 0
    pending_selection: int = -1  # selection that formed the pending packs
    reading: list[int] = field(default_factory=list)
    pending: list[list[int]] = field(default_factory=list)
    items: dict[int, _Item] = field(default_factory=dict)


def selection_seed(seed: int, selection_index: int) -> int:
    """Seed of the ``selection_index``-th selection: a pure function, so a restored packer needs no RNG state.

    >>> selection_seed(0, 0) == selection_seed(0, 0), selection_seed(0, 0) != selection_seed(0, 1)
    (True, True)
    """
    return int(np.random.SeedSequence([seed, selection_index]).generate_state(1, dtype=np.uint32)[0])


def select_packs(
    aligned_lengths: np.ndarray, capacity: int, *, algorithm: str, seed: int
) -> list[np.ndarray]:
    """Partition buffer positions into packs with ``longpack.binpack.pack_lengths``.

    Packs come in bin-id order; members keep their buffer order. Every position is in exactly one pack.

    >>> [g.tolist() for g in select_packs(np.array([8, 4, 4]), 12, algorithm="first_fit_decreasing", seed=0)]
    [[0, 1], [2]]
    """
    if len(aligned_lengths) == 0:
        return []
    bin_of_item = np.asarray(
        binpack.pack_lengths(
            np.asarray(aligned_lengths, dtype=np.int64), capacity, algorithm=algorithm, seed=seed
        )
    )
    order = np.argsort(bin_of_item, kind="stable")
    bins = bin_of_item[order]
    cuts = np.flatnonzero(np.diff(bins)) + 1
    return list(np.split(order, cuts))


def _int_array(raw: Any, position: int, name: str) -> np.ndarray:
    """``raw`` as a 1-D int64 array; refuses what a cast would change (floats, bools, strings, objects)."""
    try:
        array = np.asarray(raw)
    except (TypeError, ValueError) as exc:
        raise OnlineError(f"sample {position}: {name} is not an array of integers ({exc})") from None
    if array.ndim != 1:  # a batch ([[...], [...]]) or a scalar: flattening would join or invent samples
        raise OnlineError(
            f"sample {position}: {name} must be a flat list of token ids (1-D), got {array.ndim}-D shape "
            f"{array.shape}; pass one sample per item (split a batch into its rows)",
            fields=name,
        )
    if array.size and array.dtype.kind not in "iu":
        hint = ""
        if array.dtype.kind == "f":
            hint = " (a float array: casting would truncate the values; pass integer ids)"
        raise OnlineError(
            f"sample {position}: {name} must hold integers, got dtype {array.dtype}{hint}", fields=name
        )
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise OnlineError(f"sample {position}: {name} has values past int64", fields=name)
    return array.astype(np.int64, copy=False).reshape(-1)


def _mask_array(raw: Any, position: int) -> np.ndarray:
    """``raw`` as a 1-D int8 mask with values in {0, 1} (bools, integers or 0.0/1.0 floats)."""
    try:
        array = np.asarray(raw)
    except (TypeError, ValueError) as exc:
        raise OnlineError(f"sample {position}: loss_mask is not an array of 0/1 values ({exc})") from None
    if array.size and array.dtype.kind not in "biuf":
        raise OnlineError(
            f"sample {position}: loss_mask must hold 0/1 values, got dtype {array.dtype}", fields="loss_mask"
        )
    if array.ndim != 1:
        raise OnlineError(
            f"sample {position}: loss_mask must be a flat list (1-D), got {array.ndim}-D shape {array.shape}",
            fields="loss_mask",
        )
    flat = array.reshape(-1)
    bad = np.flatnonzero((flat != 0) & (flat != 1))
    if len(bad):
        j = int(bad[0])
        raise OnlineError(
            f"sample {position}: loss_mask[{j}]={flat[j].item()!r}; a loss mask holds only 0 and 1 "
            f"({len(bad)} other value(s) in this sample)",
            fields="loss_mask",
        )
    return flat.astype(np.int8)


def _as_tokens(sample: Any, position: int) -> tuple[np.ndarray | None, np.ndarray | None, int]:
    """``(input_ids, loss_mask, stored_length)``; ids are ``None`` for a bare runtime length."""
    if isinstance(sample, int | np.integer) and not isinstance(sample, bool | np.bool_):
        length = int(sample)
        if length < 1:
            raise OnlineError(
                f"sample {position}: runtime length {length} < 1; a sample must train on at least one token "
                "(filter empty samples before packing)"
            )
        return None, None, length + 1
    if isinstance(sample, Mapping):
        if "input_ids" not in sample:
            raise OnlineError(f"sample {position}: mapping has no 'input_ids' key (keys: {sorted(sample)})")
        ids_raw, mask_raw = sample["input_ids"], sample.get("loss_mask")
    elif isinstance(sample, tuple) and len(sample) == 2:
        ids_raw, mask_raw = sample
    else:
        raise OnlineError(
            f"sample {position}: expected an int (runtime length), a mapping with 'input_ids' (and 'loss_mask'), "
            f"or an (input_ids, loss_mask) tuple; got {type(sample).__name__}"
        )
    ids = _int_array(ids_raw, position, "input_ids")
    if len(ids) and int(ids.min()) < 0:
        j = int(np.argmax(ids < 0))
        raise OnlineError(
            f"sample {position}: input_ids[{j}]={int(ids[j])}; token ids are non-negative integers",
            fields="input_ids",
        )
    mask = np.ones(len(ids), dtype=np.int8) if mask_raw is None else _mask_array(mask_raw, position)
    if len(mask) != len(ids):
        raise OnlineError(f"sample {position}: len(loss_mask)={len(mask)} != len(input_ids)={len(ids)}")
    if len(ids) < 2:
        raise OnlineError(
            f"sample {position}: {len(ids)} stored token(s); a sample needs at least 2 (input = ids[:-1], "
            "labels = ids[1:]); filter such samples before packing"
        )
    return ids, mask, len(ids)


class OnlinePacker:
    """Streaming packer: a candidate buffer of ``buffer_size`` samples, packs chosen by longpack's algorithms.

    ``capacity`` is in runtime tokens; ``pad_to_multiple_of`` aligns every sample's runtime length;
    ``algorithm`` is any name in ``longpack.binpack.ALGORITHMS`` (randomized ones get a fresh seed per
    selection, derived from ``seed`` and the selection number); ``overlength`` decides what happens to a
    sample whose aligned length exceeds the capacity: ``"truncate"`` keeps its first
    ``capacity // m * m`` runtime tokens (as Bridge's pre-pad step does), ``"drop"`` skips it, ``"error"``
    raises. Both are counted in :attr:`stats`. ``pad_id`` fills alignment padding: pass the EOS id, as
    Megatron-Bridge's collate finds each sample's logical end by it (it assumes pad == EOS).

    Samples are ints (bare runtime lengths: packs carry no row), mappings with ``input_ids`` and an optional
    unshifted ``loss_mask`` (default all ones), or ``(input_ids, loss_mask)`` tuples.

    >>> packer = OnlinePacker(8, 2, pad_to_multiple_of=2, algorithm="first_fit_decreasing")
    >>> rows = list(packer.rows([{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, ([8, 9], [1, 1])]))
    >>> {k: v.tolist() for k, v in rows[0].items()}
    {'input_ids': [5, 6, 7, 8, 9, 0], 'loss_mask': [1, 1, 0, 1, 0, 0], 'seq_start_id': [0, 3]}
    """

    def __init__(
        self,
        capacity: int,
        buffer_size: int,
        *,
        pad_to_multiple_of: int = 1,
        algorithm: str = choices.DEFAULT_ALGORITHM,
        seed: int = 0,
        overlength: Overlength = choices.OVERLENGTH_TRUNCATE,
        pad_id: int = 0,
    ) -> None:
        for name, value, low in (
            ("capacity", capacity, 1),
            ("buffer_size", buffer_size, 1),
            ("pad_to_multiple_of", pad_to_multiple_of, 1),
            ("seed", seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
                raise OnlineError(f"{name} must be an integer >= {low}, got {value!r}", fields=name)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int | np.integer) or pad_id < 0:
            raise OnlineError(
                f"pad_id must be a non-negative integer token id, got {pad_id!r}", fields="pad_id"
            )
        if pad_to_multiple_of > capacity:
            raise OnlineError(
                f"pad_to_multiple_of={pad_to_multiple_of} > capacity={capacity}: no sample fits; "
                "use a capacity that is a multiple of pad_to_multiple_of"
            )
        if algorithm not in binpack.ALGORITHMS:
            raise OnlineError(
                f"algorithm={algorithm!r} is not one of longpack.binpack.ALGORITHMS {binpack.ALGORITHMS}",
                fields="algorithm",
            )
        if overlength not in ONLINE_OVERLENGTH_POLICIES:
            raise OnlineError(
                f"overlength={overlength!r} is not one of {ONLINE_OVERLENGTH_POLICIES}", fields="overlength"
            )
        self.capacity = int(capacity)
        self.buffer_size = int(buffer_size)
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        self.algorithm = algorithm
        self.seed = int(seed)
        self.overlength: Overlength = overlength
        self.pad_id = int(pad_id)
        # Longest runtime length that fits after alignment.
        self.max_runtime_length = capacity // pad_to_multiple_of * pad_to_multiple_of
        self.stats = OnlineStats()
        self._progress = _Progress()
        self._replay_needed: dict[int, int] = {}  # sample index -> stored length, after load_state_dict
        self._running = False
        self._started = False  # a stream was given to pack(); a second one needs reset() or a loaded state

    def reset(self) -> None:
        """Forget the stream: empty buffers, zero counts. The next :meth:`pack` starts a new stream at 0.

        >>> p = OnlinePacker(10, 4, algorithm="first_fit_decreasing")
        >>> _ = list(p.pack([6, 4]))
        >>> p.reset()
        >>> [x.sample_index.tolist() for x in p.pack([3, 3])], p.stats.samples_read
        ([[0, 1]], 2)
        """
        if self._running:
            raise OnlineStateError("cannot reset the packer while it is packing a stream")
        self.stats = OnlineStats()
        self._progress = _Progress()
        self._replay_needed = {}
        self._started = False

    # ------------------------------------------------------------------ configuration
    def config(self) -> dict[str, Any]:
        """The settings a state depends on.

        >>> OnlinePacker(16, 4, algorithm="first_fit_decreasing").config()["buffer_size"]
        4
        """
        return {name: getattr(self, name) for name in STATE_CONFIG_FIELDS}

    # ------------------------------------------------------------------ streaming
    def rows(self, samples: Iterable[Any], *, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Like :meth:`pack` but yields only the rows (samples must carry tokens)."""
        for pack in self.pack(samples, start=start):
            if pack.row is None:
                raise OnlineError("rows() needs samples with input_ids; bare lengths make packs without rows")
            yield pack.row

    def pack(self, samples: Iterable[Any], *, start: int = 0) -> Iterator[OnlinePack]:
        """Pack a stream; ``start`` is the stream position of the first element of ``samples``.

        After :meth:`load_state_dict`, pass the same stream reopened at any position ``<=``
        ``state["replay_from"]`` (its earlier samples are skipped, buffered ones re-read by position): the
        packer then yields exactly what the saved packer would have yielded next.

        >>> p = OnlinePacker(10, 3, algorithm="first_fit_decreasing")
        >>> it = p.pack([6, 3, 5, 4, 7, 2])
        >>> next(it).sample_index.tolist()
        [0, 1]
        >>> state = p.state_dict()
        >>> q = OnlinePacker(10, 3, algorithm="first_fit_decreasing")
        >>> q.load_state_dict(state)
        >>> [x.sample_index.tolist() for x in q.pack([6, 3, 5, 4, 7, 2])]
        [[2], [4, 5], [3]]
        >>> [x.sample_index.tolist() for x in it]  # the original packer continues identically
        [[2], [4, 5], [3]]
        """
        if self._running:
            raise RuntimeError("this OnlinePacker is already packing a stream; use one packer per stream")
        if self._started:
            raise OnlineStateError(
                f"this OnlinePacker already packed a stream ({self.stats.samples_read} samples read); call "
                "reset() to pack a new stream from its start, or load_state_dict() to resume a saved one"
            )
        self._started = True
        self._running = True
        try:
            yield from self._pack(iter(samples), start)
        finally:
            self._running = False

    def _replay(self, source: Iterator[Any], start: int) -> int:
        """Skip what a restored state already consumed and re-read its buffered samples by position; the
        position reading goes on from."""
        prog = self._progress
        if start < 0:
            raise OnlineError(f"start={start} must be >= 0", fields="start")
        position = start
        needed = self._replay_needed
        first_needed = min(needed, default=prog.next_index)
        if position > min(first_needed, prog.next_index):
            raise OnlineStateError(
                f"stream starts at sample {position} but the restored state needs sample {first_needed} "
                f"(replay_from={min(first_needed, prog.next_index)}); reopen the stream there"
            )
        # Replay: skip what was already consumed, re-read the buffered samples by position.
        while position < prog.next_index:
            try:
                sample = next(source)
            except StopIteration:
                missing = sorted(i for i in needed if i >= position)
                raise OnlineStateError(
                    f"stream ended at sample {position} before the restored state's read position "
                    f"{prog.next_index}; buffered samples never re-read: {missing[:10]}"
                ) from None
            if position in needed:
                item = self._make_item(sample, position, count=False)
                if item is None or item.stored_length != needed[position]:
                    got = "dropped" if item is None else f"{item.stored_length} stored tokens"
                    raise OnlineStateError(
                        f"replayed sample {position} does not match the saved state (saved {needed[position]} "
                        f"stored tokens, got {got}): the stream is not the one the state was saved from"
                    )
                prog.items[position] = item
                del needed[position]
            position += 1
        return position

    def _pack(self, source: Iterator[Any], start: int) -> Iterator[OnlinePack]:
        prog = self._progress
        position = self._replay(source, start)
        exhausted = False
        while True:
            # Top up the reading buffer (incremental refill, as Energon's ``PackingDataset``).
            while not exhausted and len(prog.reading) + sum(map(len, prog.pending)) < self.buffer_size:
                try:
                    sample = next(source)
                except StopIteration:
                    exhausted = True
                    break
                item = self._make_item(sample, position, count=True)
                position += 1
                prog.next_index = position
                if item is not None:
                    prog.items[item.index] = item
                    prog.reading.append(item.index)
            if exhausted:
                break
            if not prog.pending:
                self._select()
            yield self._emit()
        while prog.pending:
            yield self._emit()
        if prog.reading:
            self._select()
            while prog.pending:
                yield self._emit()

    def _make_item(self, sample: Any, position: int, *, count: bool) -> _Item | None:
        ids, mask, stored = _as_tokens(sample, position)
        runtime = stored - 1
        stats = self.stats
        if count:
            stats.samples_read += 1
        if align_up(runtime, self.pad_to_multiple_of) > self.capacity:
            if self.overlength == choices.OVERLENGTH_ERROR:
                raise OnlineError(
                    f"sample {position}: runtime length {runtime} (aligned to {self.pad_to_multiple_of}: "
                    f"{align_up(runtime, self.pad_to_multiple_of)}) exceeds capacity {self.capacity}; "
                    "use overlength='truncate' or 'drop', or a larger capacity"
                )
            if self.overlength == choices.OVERLENGTH_DROP:
                if count:
                    stats.dropped += 1
                return None
            if count:
                stats.truncated += 1
                stats.tokens_truncated += runtime - self.max_runtime_length
            runtime = self.max_runtime_length
            if ids is not None and mask is not None:
                ids, mask = ids[: runtime + 1], mask[: runtime + 1]
        aligned = align_up(runtime, self.pad_to_multiple_of)
        if ids is not None and mask is not None and aligned > runtime:
            gap = aligned - runtime
            ids = np.concatenate([ids, np.full(gap, self.pad_id, dtype=np.int64)])
            mask = np.concatenate([mask, np.zeros(gap, dtype=np.int8)])
        return _Item(position, runtime, aligned, stored, ids, mask)

    def _select(self) -> None:
        prog = self._progress
        buffered = prog.reading
        lengths = np.array([prog.items[i].aligned_length for i in buffered], dtype=np.int64)
        groups = select_packs(
            lengths,
            self.capacity,
            algorithm=self.algorithm,
            seed=selection_seed(self.seed, prog.selection_index),
        )
        prog.pending = [[buffered[j] for j in g.tolist()] for g in groups]
        prog.pending_selection = prog.selection_index
        prog.reading = []
        prog.selection_index += 1
        self.stats.selections += 1

    def _emit(self) -> OnlinePack:
        prog = self._progress
        members = [prog.items.pop(i) for i in prog.pending.pop(0)]
        lengths = np.array([m.runtime_length for m in members], dtype=np.int64)
        aligned = np.array([m.aligned_length for m in members], dtype=np.int64)
        row = None
        if members[0].input_ids is not None:
            ids = np.concatenate([m.input_ids for m in members if m.input_ids is not None])
            shifted = []
            for m in members:
                assert m.loss_mask is not None
                rolled = np.zeros_like(m.loss_mask)
                rolled[:-1] = m.loss_mask[1:]  # label-aligned: position j trains iff token j+1 is a target
                shifted.append(rolled)
            starts = np.concatenate([[0], np.cumsum(aligned[:-1] + 1)]).astype(np.int64)
            row = {"input_ids": ids, "loss_mask": np.concatenate(shifted), "seq_start_id": starts}
        stats = self.stats
        stats.packs += 1
        stats.samples_packed += len(members)
        stats.runtime_tokens += int(lengths.sum())
        stats.aligned_tokens += int(aligned.sum())
        return OnlinePack(
            sample_index=np.array([m.index for m in members], dtype=np.int64),
            lengths=lengths,
            aligned_lengths=aligned,
            row=row,
            selection=prog.pending_selection,
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """A JSON-able state: configuration, read position, buffered and pending samples by stream
        position (with their stored lengths as a fingerprint), selection counter, counts.

        Randomness is a pure function of ``(seed, selection number)``, so the counter is the whole RNG state.

        >>> p = OnlinePacker(10, 4, algorithm="first_fit_decreasing")
        >>> _ = next(p.pack([6, 3, 5, 4, 7]))
        >>> s = p.state_dict()
        >>> s["next_sample_index"], s["reading"], s["pending"], s["replay_from"]
        (4, [], [[1, 2]], 1)
        """
        prog = self._progress
        stored = dict(self._replay_needed)  # restored but not yet replayed samples
        for i, item in prog.items.items():
            stored[i] = item.stored_length
        buffered = [*prog.reading, *(i for g in prog.pending for i in g)]
        return {
            "format": STATE_FORMAT,
            "config": self.config(),
            "next_sample_index": prog.next_index,
            "replay_from": min(buffered, default=prog.next_index),
            "selection_index": prog.selection_index,
            "reading": list(prog.reading),
            "pending": [list(g) for g in prog.pending],
            "stored_lengths": {str(i): stored[i] for i in sorted(buffered)},
            "stats": asdict(self.stats),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (also after a JSON round trip).

        The packer must have the same configuration; a difference is an :class:`OnlineStateError` naming it.

        >>> s = OnlinePacker(10, 4, algorithm="first_fit_decreasing").state_dict()
        >>> OnlinePacker(10, 8, algorithm="first_fit_decreasing").load_state_dict(s)
        Traceback (most recent call last):
        ...
        longpack.online.packer.OnlineStateError: saved state has buffer_size=4 but this packer has buffer_size=8; ...
        """
        if self._running:
            raise RuntimeError("cannot load a state while the packer is packing a stream")
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise OnlineStateError(f"not an OnlinePacker state: format={got!r}, expected {STATE_FORMAT!r}")
        saved = state["config"]
        for name in STATE_CONFIG_FIELDS:
            if saved.get(name) != getattr(self, name):
                raise OnlineStateError(
                    f"saved state has {name}={saved.get(name)!r} but this packer has {name}={getattr(self, name)!r}; "
                    f"construct the packer with {name}={saved.get(name)!r} to resume, or start a fresh packer"
                )
        reading = [int(i) for i in state["reading"]]
        pending = [[int(i) for i in g] for g in state["pending"]]
        stored = {int(k): int(v) for k, v in state["stored_lengths"].items()}
        buffered = [*reading, *(i for g in pending for i in g)]
        if sorted(buffered) != sorted(stored) or len(set(buffered)) != len(buffered):
            raise OnlineStateError(
                "corrupt state: 'stored_lengths' does not list each buffered sample exactly once"
            )
        if len(buffered) > self.buffer_size:
            raise OnlineStateError(
                f"corrupt state: {len(buffered)} buffered samples > buffer_size={self.buffer_size}"
            )
        known = {f.name for f in fields(OnlineStats)}
        self.stats = OnlineStats(**{k: int(v) for k, v in state["stats"].items() if k in known})
        self._progress = _Progress(
            next_index=int(state["next_sample_index"]),
            selection_index=int(state["selection_index"]),
            pending_selection=int(state["selection_index"]) - 1,
            reading=reading,
            pending=pending,
        )
        self._replay_needed = stored
        self._started = False

    def save_state(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`state_dict` as JSON, atomically (temp file in the same folder, fsync, rename)."""
        write_json_atomic(Path(path), self.state_dict())

    def load_state(self, path: str | os.PathLike[str]) -> None:
        """Read a state written by :meth:`save_state` and :meth:`load_state_dict` it."""
        path = Path(path)
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise OnlineStateError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
        self.load_state_dict(state)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (its folder created if needed)."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (its folder created if needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode("utf-8"))


def fill_ratio(packs: Iterable[OnlinePack], capacity: int) -> float:
    """Aligned tokens / (number of packs * capacity).

    >>> fill_ratio(OnlinePacker(10, 4, algorithm="first_fit_decreasing").pack([6, 4, 5, 5]), 10)
    1.0
    """
    total = n = 0
    for p in packs:
        total += p.packed_length
        n += 1
    return total / (n * capacity) if n else math.nan
