"""Per-sample alignment and the over-long policy (docs/reference/packed-format.md#alignment-padding).

Pure numpy; nothing is copied. A sample's alignment is described by three numbers (which source sample,
how many of its tokens are kept, its stored length after padding); the fill step materializes tokens only
for the rows it is writing, so aligning 1M samples costs a few int64 arrays, not a second token buffer.

Rules (``m = pad_seq_to_mult``, ``N = max_seq_length`` in runtime tokens, a stored sample of ``S`` tokens
trains on ``r = S - 1`` positions):

- ``m > 1``: ``cap = (N // m) * m`` (``cap == 0`` is an error); a sample with ``r <= cap`` is right-padded
  with the EOS id (loss 0) to stored length ``ceil(r / m) * m + 1``, i.e. ``k*m + 1``.
- ``m == 1``: ``cap = N`` and nothing is padded.
- ``r > cap`` is *over-long*: ``truncate`` keeps the first ``cap + 1`` tokens (as Megatron-Bridge's pre-pad
  step does for ``m > 1``, losing the EOS), ``drop`` removes the sample (as Megatron-Bridge's histogram step
  does for ``m == 1``), ``fragment`` cuts it into consecutive pieces of at most ``cap + 1`` stored tokens that
  are packed like samples (:func:`fragment_cuts`; every token is in exactly one piece, its loss mask with it;
  a later piece sees none of the earlier pieces' context and its first token is predicted by nothing),
  ``error`` stops. Every truncated, fragmented or dropped sample is reported.
- ``r == 0`` (a one-token sample) has nothing to train on and is dropped with reason ``empty``, unless
  ``keep_single_token`` (Megatron-Bridge keeps it: a stored length of 1, runtime length 0, in some row).
  A sample with no token at all is always dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longpack import choices
from longpack.errors import ConfigError, InputError
from longpack.samples import TokenizedSamples
from longpack.topology import align_up
from longpack.validate import one_of

OVERLENGTH_POLICIES = choices.OVERLENGTH_POLICIES
DEFAULT_OVERLENGTH = choices.DEFAULT_OVERLENGTH


class OverlengthError(InputError):
    """Over-long samples were found and the policy is ``error``."""


def runtime_cap(max_seq_length: int, pad_seq_to_mult: int) -> int:
    """Largest runtime length a sample may have after alignment.

    >>> runtime_cap(4096, 1), runtime_cap(4100, 8), runtime_cap(16, 8)
    (4096, 4096, 16)
    """
    if max_seq_length < 1:
        raise ConfigError(f"max_seq_length must be positive, got {max_seq_length}")
    if pad_seq_to_mult < 1:
        raise ConfigError(f"pad_seq_to_mult must be a positive integer, got {pad_seq_to_mult}")
    if pad_seq_to_mult == 1:
        return max_seq_length
    cap = (max_seq_length // pad_seq_to_mult) * pad_seq_to_mult
    if cap == 0:
        raise ConfigError(
            f"max_seq_length ({max_seq_length}) must be at least the effective padding multiple "
            f"({pad_seq_to_mult}); raise seq_length or lower pad_seq_to_mult",
            fields=("seq_length", "pad_seq_to_mult"),
        )
    return cap


@dataclass(frozen=True, kw_only=True)
class AlignedSamples:
    """The samples that will be packed, as views into a :class:`TokenizedSamples`.

    - ``index``: int64 ``[K]``, source sample of each kept sample (ascending = input order).
    - ``kept``: int64 ``[K]``, how many source tokens are kept (a prefix; ``< S`` only when truncated).
    - ``stored``: int64 ``[K]``, stored length after alignment (``kept`` plus EOS padding).
    - ``truncated`` / ``dropped``: int64 source indices; ``dropped_reason``: one of ``overlength``, ``empty``
      per dropped sample.
    - ``start``: int64 ``[K]``, first source token of each kept sample (``None``: 0 for all; only fragments
      start later); ``fragmented``: int64 source indices of the samples cut into fragments (``index``
      repeats such a sample once per fragment).
    """

    samples: TokenizedSamples
    eos_id: int
    max_seq_length: int
    pad_seq_to_mult: int
    cap: int
    index: np.ndarray
    kept: np.ndarray
    stored: np.ndarray
    truncated: np.ndarray
    dropped: np.ndarray
    dropped_reason: tuple[str, ...]
    start: np.ndarray | None = None
    fragmented: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.index)

    def runtime_lengths(self) -> np.ndarray:
        """Runtime length of every kept sample after alignment (int64; what the bin packer packs)."""
        return self.stored - 1

    def subset(self, positions: np.ndarray) -> AlignedSamples:
        """The kept samples at ``positions`` (used to split off a validation set). Truncations and drops stay
        global (reported once, with the training split); the fragmented samples are the subset's own: their
        fragments are packed in this split's rows, and a split's counts (sources packed = sequences -
        fragments + fragmented samples) hold only if both come from the same samples."""
        index = self.index[positions]
        return AlignedSamples(
            samples=self.samples,
            eos_id=self.eos_id,
            max_seq_length=self.max_seq_length,
            pad_seq_to_mult=self.pad_seq_to_mult,
            cap=self.cap,
            index=index,
            kept=self.kept[positions],
            stored=self.stored[positions],
            truncated=self.truncated,
            dropped=self.dropped,
            dropped_reason=self.dropped_reason,
            start=None if self.start is None else self.start[positions],
            fragmented=self.fragmented[np.isin(self.fragmented, index)],
        )

    def starts(self) -> np.ndarray:
        """First source token of every kept sample (int64; 0 unless it is a fragment)."""
        return np.zeros(len(self.index), np.int64) if self.start is None else self.start

    def sample(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, loss_mask)`` of kept sample ``k`` after alignment (unshifted mask; slow path).

        >>> s = TokenizedSamples(tokens=np.array([5, 6, 2], np.int32), loss_mask=np.array([0, 1, 1], np.uint8),
        ...     offsets=np.array([0, 3]), source_file=np.array([0], np.int32), source_row=np.array([1]),
        ...     files=("a.jsonl",))
        >>> ids, mask = align_samples(s, max_seq_length=8, pad_seq_to_mult=4, eos_id=2).sample(0)
        >>> ids.tolist(), mask.tolist()
        ([5, 6, 2, 2, 2], [0, 1, 1, 0, 0])
        """
        ids, mask = self.samples.sample(int(self.index[k]))
        lo = int(self.starts()[k])
        ids, mask = ids[lo:], mask[lo:]
        kept, stored = int(self.kept[k]), int(self.stored[k])
        pad = stored - kept
        ids_out = np.concatenate([ids[:kept], np.full(pad, self.eos_id, dtype=ids.dtype)])
        mask_out = np.concatenate([mask[:kept], np.zeros(pad, dtype=mask.dtype)])
        return ids_out, mask_out


def align_samples(
    samples: TokenizedSamples,
    *,
    max_seq_length: int,
    pad_seq_to_mult: int = 1,
    eos_id: int,
    overlength: str = DEFAULT_OVERLENGTH,
    keep_single_token: bool = False,
) -> AlignedSamples:
    """Apply the per-sample alignment and the over-long policy (vectorized).

    Stored lengths 17, 18, 20, 21 with ``m=8``: ``max_seq_length=16`` truncates 18..21 to 17;
    ``max_seq_length=40`` pads 18 to 25.

    >>> lens = np.array([17, 18, 20, 21])
    >>> offsets = np.concatenate([[0], np.cumsum(lens)])
    >>> s = TokenizedSamples(tokens=np.zeros(offsets[-1], np.int32), loss_mask=np.ones(offsets[-1], np.uint8),
    ...     offsets=offsets, source_file=np.zeros(4, np.int32), source_row=np.arange(1, 5), files=("a",))
    >>> a = align_samples(s, max_seq_length=16, pad_seq_to_mult=8, eos_id=0, overlength="truncate")
    >>> a.stored.tolist(), a.truncated.tolist()
    ([17, 17, 17, 17], [1, 2, 3])
    >>> align_samples(s, max_seq_length=40, pad_seq_to_mult=8, eos_id=0).stored.tolist()
    [17, 25, 25, 25]
    >>> a = align_samples(s, max_seq_length=16, pad_seq_to_mult=1, eos_id=0)
    >>> a.stored.tolist(), a.dropped.tolist(), a.dropped_reason
    ([17], [1, 2, 3], ('overlength', 'overlength', 'overlength'))

    A one-token sample is kept only with ``keep_single_token`` (as Megatron-Bridge does):

    >>> one = TokenizedSamples(tokens=np.array([7, 7, 2, 2]), loss_mask=np.ones(4, np.uint8),
    ...     offsets=np.array([0, 3, 4]), source_file=np.zeros(2, np.int32), source_row=np.arange(1, 3), files=("a",))
    >>> align_samples(one, max_seq_length=8, eos_id=2).dropped_reason
    ('empty',)
    >>> align_samples(one, max_seq_length=8, pad_seq_to_mult=2, eos_id=2, keep_single_token=True).stored.tolist()
    [3, 1]
    """
    one_of(overlength, OVERLENGTH_POLICIES, "overlength")
    m = int(pad_seq_to_mult)
    cap = runtime_cap(int(max_seq_length), m)
    stored_in = samples.stored_lengths()
    runtime = np.maximum(stored_in - 1, 0)
    empty = stored_in == 0 if keep_single_token else runtime == 0
    over = runtime > cap
    if overlength == choices.OVERLENGTH_ERROR and over.any():
        bad = np.flatnonzero(over)
        shown = ", ".join(f"{samples.provenance(int(i))} ({int(runtime[i])} tokens)" for i in bad[:5]) + (
            " ..." if len(bad) > 5 else ""
        )
        raise OverlengthError(
            f"{len(bad)} sample(s) are longer than the runtime cap {cap} (max_seq_length={max_seq_length}, "
            f"pad_seq_to_mult={m}): {shown}; use overlength truncate or drop, or raise seq_length",
            fields=("overlength", "seq_length"),
        )
    if overlength == choices.OVERLENGTH_FRAGMENT:
        if cap < 2:
            raise ConfigError(
                f"overlength fragment needs a runtime cap of at least 2 tokens, got {cap} (max_seq_length="
                f"{max_seq_length}): a 1-token piece trains on nothing; raise seq_length",
                fields=("overlength", "seq_length"),
            )
        return _with_fragments(
            samples,
            stored_in,
            runtime,
            empty,
            over,
            cap=cap,
            m=m,
            eos_id=eos_id,
            max_seq_length=max_seq_length,
        )
    if overlength == choices.OVERLENGTH_TRUNCATE:
        keep = ~empty
        truncated = np.flatnonzero(over & keep)
        drop_over = np.zeros(len(runtime), dtype=bool)
    else:
        keep = ~empty & ~over
        truncated = np.zeros(0, dtype=np.int64)
        drop_over = over & ~empty
    index = np.flatnonzero(keep)
    r = np.minimum(runtime[index], cap)
    target = align_up(r, m) if m > 1 else r
    stored = target + 1
    kept = np.minimum(stored_in[index], stored)
    dropped = np.flatnonzero(empty | drop_over)
    reasons = tuple("empty" if empty[i] else "overlength" for i in dropped.tolist())
    return AlignedSamples(
        samples=samples,
        eos_id=int(eos_id),
        max_seq_length=int(max_seq_length),
        pad_seq_to_mult=m,
        cap=cap,
        index=index.astype(np.int64),
        kept=kept.astype(np.int64),
        stored=stored.astype(np.int64),
        truncated=truncated.astype(np.int64),
        dropped=dropped.astype(np.int64),
        dropped_reason=reasons,
    )


def fragment_cuts(stored_lengths: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sample, start, length)`` of every fragment of samples of ``stored_lengths`` cut for runtime cap
    ``cap``: consecutive pieces of ``cap + 1`` stored tokens (runtime ``cap``), the rest in a last piece. A
    last piece of one token (nothing to train on) takes one token from the piece before it when that leaves
    the piece before at least 2 tokens. Every token of a sample is in exactly one of its pieces, in order.

    >>> [x.tolist() for x in fragment_cuts(np.array([9, 10]), 3)]
    [[0, 0, 0, 1, 1, 1], [0, 4, 7, 0, 4, 8], [4, 3, 2, 4, 4, 2]]
    """
    stored_lengths = np.asarray(stored_lengths, dtype=np.int64)
    piece = int(cap) + 1
    n = np.maximum(-(-stored_lengths // piece), 1)
    sample = np.repeat(np.arange(len(stored_lengths), dtype=np.int64), n)
    first = np.cumsum(n) - n
    k = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(first, n)
    start = k * piece
    length = np.minimum(piece, stored_lengths[sample] - start)
    if piece >= 3:
        # a one-token tail that follows a full piece: move the cut one token back (both pieces >= 2 tokens)
        tail = np.flatnonzero((length == 1) & (k > 0))
        start[tail] -= 1
        length[tail] = 2
        length[tail - 1] -= 1
    return sample, start, length


def _with_fragments(
    samples: TokenizedSamples,
    stored_in: np.ndarray,
    runtime: np.ndarray,
    empty: np.ndarray,
    over: np.ndarray,
    *,
    cap: int,
    m: int,
    eos_id: int,
    max_seq_length: int,
) -> AlignedSamples:
    """``align_samples`` with ``overlength="fragment"``: over-long samples become fragments (in input order,
    next to the samples around them); a fragment is never dropped as empty."""
    whole = np.flatnonzero(~empty & ~over)
    fragmented = np.flatnonzero(over & ~empty)
    which, frag_start, frag_len = fragment_cuts(stored_in[fragmented], cap)
    index = np.concatenate([whole, fragmented[which]])
    start = np.concatenate([np.zeros(len(whole), np.int64), frag_start])
    kept_in = np.concatenate([stored_in[whole], frag_len])
    order = np.lexsort((start, index))
    index, start, kept_in = index[order], start[order], kept_in[order]
    r = np.maximum(kept_in - 1, 0)
    target = align_up(r, m) if m > 1 else r
    stored = target + 1
    dropped = np.flatnonzero(empty)
    return AlignedSamples(
        samples=samples,
        eos_id=int(eos_id),
        max_seq_length=int(max_seq_length),
        pad_seq_to_mult=m,
        cap=cap,
        index=index.astype(np.int64),
        kept=kept_in.astype(np.int64),
        stored=stored.astype(np.int64),
        truncated=np.zeros(0, np.int64),
        dropped=dropped.astype(np.int64),
        dropped_reason=("empty",) * len(dropped),
        start=start.astype(np.int64),
        fragmented=fragmented.astype(np.int64),
    )


def supervised_outside_cu_seqlens(aligned: AlignedSamples, *, listed: int = 20) -> dict[str, Any]:
    """Supervised tokens the THD batch puts outside ``cu_seqlens`` (only when ``pad_seq_to_mult > 1``).

    Megatron-Bridge's collate ends a sample's logical sequence at its last input token that is not EOS
    (docs/reference/thd-batch.md), so a sample whose inputs end in a run of EOS tokens with a supervised
    label inside the run (``[..., c, EOS, EOS]`` with the last EOS in the loss) trains those positions
    although attention never reaches them (``padding_mask`` marks them). Counted here, the layout kept.

    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 2, 7, 2], np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1, 1], np.uint8), offsets=np.array([0, 4, 6]),
    ...     source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]), files=("a.jsonl",))
    >>> supervised_outside_cu_seqlens(align_samples(s, max_seq_length=8, pad_seq_to_mult=4, eos_id=2))
    {'tokens': 1, 'samples': 1, 'listed': ['a.jsonl:1']}
    """
    out: dict[str, Any] = {"tokens": 0, "samples": 0, "listed": []}
    if aligned.pad_seq_to_mult <= 1 or not len(aligned):
        return out
    src = aligned.samples
    starts = src.offsets[:-1][aligned.index].astype(np.int64) + aligned.starts()  # fragments start later
    kept = aligned.kept.astype(np.int64)
    real_inputs = np.minimum(kept, aligned.stored.astype(np.int64) - 1)
    last = starts + real_inputs - 1
    # Only a sample whose last real input token is EOS can have a label outside its logical sequence.
    candidates = np.flatnonzero((real_inputs >= 1) & (src.tokens[np.maximum(last, 0)] == aligned.eos_id))
    for k in candidates.tolist():
        begin, n_in, n_kept = int(starts[k]), int(real_inputs[k]), int(kept[k])
        ids = src.tokens[begin : begin + n_in]
        not_eos = np.flatnonzero(ids != aligned.eos_id)
        logical = int(not_eos[-1]) + 1 if not_eos.size else 0
        count = int(np.count_nonzero(src.loss_mask[begin + logical + 1 : begin + n_kept]))
        if count:
            out["tokens"] += count
            out["samples"] += 1
            if len(out["listed"]) < listed:
                out["listed"].append(src.provenance(int(aligned.index[k])))
    return out
