"""What Megatron will train on: Megatron-Core ``GPTDataset``'s document, sample and shuffle indices for an
indexed dataset, rebuilt in numpy, and the report ``longpack inspect`` prints for them.

``GPTDataset`` (``megatron/core/datasets/gpt_dataset.py``, with ``helpers.cpp``'s ``build_sample_idx``)
concatenates the split's documents in a shuffled order and cuts the stream every ``seq_length`` tokens:

- split: documents ``[round(lo * N), round(hi * N))`` of the split's bookends (``"969,30,1"`` normalized);
- epochs: ``1``, or as many as ``num_samples * seq_length + 1`` tokens need;
- document index: the split's document ids once per epoch, as ``int32``, shuffled in place with
  ``numpy.random.RandomState(seed)`` (the last epoch shuffled on its own when it would give fewer than 80 %
  of an epoch's samples);
- sample index: ``(position in the document index, offset in that document)`` of every sample start:
  sample ``k`` reads ``seq_length + 1`` tokens from global position ``k * seq_length`` (inputs and labels
  overlap by one token), so ``(total tokens - 1) // seq_length`` samples;
- shuffle index: ``arange(samples)`` (``uint32``) shuffled by the same random state.

With inter-document masking (``reset_attention_mask`` / ``reset_position_ids``, the THD path of
``pretrain_gpt.py``) a sample's attention restarts after every EOD token (``_get_ltor_masks_and_position_ids``
looks for ``tokens == eod`` among the sample's input tokens, not for document boundaries): its ``cu_seqlens``
are the positions after each EOD token inside the sample. :func:`eod_cuts` finds them in the tokens; a
document's own EOD (``append_eod``) is its end, and a document holding the EOD token's literal text
(``<|im_end|>`` in a chat transcript kept as pretraining text) restarts inside it too. Without the tokens
(``cuts=None``) every document is taken to end with EOD and nowhere else.

>>> lengths = np.array([5, 3, 8, 2], np.int32)
>>> doc, sample, shuffle = gpt_indices(lengths, np.arange(4, dtype=np.int32), seq_length=4, seed=1)
>>> doc.tolist(), sample.tolist(), shuffle.tolist()
([3, 2, 0, 1], [[0, 0], [1, 2], [1, 6], [2, 2], [3, 1]], [0, 2, 1, 3])
>>> sample_cu_seqlens(lengths, doc, sample, 0, seq_length=4).tolist()  # document 3 (2 tokens), then 2
[0, 2, 4]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "GptSamplesReport",
    "eod_cuts",
    "gpt_indices",
    "gpt_samples_report",
    "sample_cu_seqlens",
    "split_documents",
]

#: The ``--split`` of what ``pack --output-format indexed`` reports and hands off: every document trains (a
#: Megatron-LM run given ``--data-path`` without ``--split`` uses its legacy ``969, 30, 1`` instead).
GPT_REPORT_SPLIT = "1,0,0"
#: Megatron's threshold: the last epoch is shuffled apart when it gives fewer than this share of an epoch.
SEPARATE_FINAL_EPOCH_BELOW = 0.80


def split_documents(split: str, num_documents: int, which: int = 0) -> np.ndarray:
    """The document ids of split ``which`` (0 train, 1 valid, 2 test) for Megatron's ``--split`` string.

    >>> split_documents("969,30,1", 1000).shape, split_documents("969,30,1", 1000, 1)[:2].tolist()
    ((969,), [969, 970])
    """
    weights = [float(x) for x in re.findall(r"[.0-9]+", split)]
    weights += [0.0] * (3 - len(weights))
    if len(weights) != 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"split {split!r} must be up to three non-negative weights, e.g. '969,30,1'")
    w = (np.array(weights, dtype=np.float64) / np.sum(weights)).tolist()
    bounds = [0.0]
    for x in w:
        bounds.append(bounds[-1] + x)
    lo, hi = bounds[which], bounds[which + 1]
    if hi <= lo:
        return np.zeros(0, dtype=np.int32)
    beg = round(lo * float(num_documents))  # Python's round, as Megatron (half to even)
    end = round(hi * float(num_documents))
    return np.arange(beg, end, dtype=np.int32)


def _num_epochs(tokens_per_epoch: int, num_samples: int | None, seq_length: int, extra: int) -> int:
    if num_samples is None:
        return 1
    wanted = num_samples * seq_length + extra
    epochs, tokens = 1, tokens_per_epoch
    while tokens < wanted:
        epochs += 1
        tokens += tokens_per_epoch
    return epochs


def _document_index(
    documents: np.ndarray, epochs: int, rs: np.random.RandomState, separate: bool
) -> np.ndarray:
    if not separate or epochs == 1:
        index = np.tile(np.asarray(documents), epochs).astype(np.int32)
        rs.shuffle(index)
        return index
    first = _document_index(documents, epochs - 1, rs, False)
    last = _document_index(documents, 1, rs, False)
    return np.concatenate((first, last))


def _sample_index(
    sizes: np.ndarray, document_index: np.ndarray, seq_length: int, total: int, drop_last: bool, extra: int
) -> np.ndarray:
    """``helpers.build_sample_idx``: the ``(document index position, offset)`` of every sample boundary."""
    num_samples = (total - extra) // seq_length if drop_last else int(np.ceil((total - extra) / seq_length))
    ends = np.cumsum(sizes[document_index].astype(np.int64))
    starts = ends - sizes[document_index]
    p = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    # the walk stops in the first document whose end reaches the sample's last token (p + extra)
    pos = np.searchsorted(ends, p + extra, side="left")
    pos[0] = 0
    offset = p - starts[np.minimum(pos, len(ends) - 1)]
    offset[0] = 0
    past = pos >= len(ends)  # ran out of documents (only the last sample, without drop_last)
    if past.any():
        last = len(ends) - 1
        pos[past] = last
        offset[past] = int(sizes[document_index[last]]) - extra
    dtype = (
        np.int32
        if max(len(document_index), int(sizes.max(initial=0))) <= np.iinfo(np.int32).max
        else np.int64
    )
    return np.stack([pos, offset], axis=1).astype(dtype)


def gpt_indices(
    sizes: np.ndarray,
    documents: np.ndarray,
    *,
    seq_length: int,
    seed: int,
    num_samples: int | None = None,
    add_extra_token: bool = True,
    drop_last_partial: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(document_index, sample_index, shuffle_index)`` as ``GPTDataset`` builds them for documents
    ``documents`` of an indexed dataset whose sequence lengths are ``sizes`` (one sequence per document)."""
    extra = int(add_extra_token)
    sizes = np.asarray(sizes)
    tokens_per_epoch = int(sizes[documents].astype(np.int64).sum())
    epochs = _num_epochs(tokens_per_epoch, num_samples, seq_length, extra)
    separate = False
    if epochs > 1:
        assert num_samples is not None
        sans_final = ((epochs - 1) * tokens_per_epoch - extra) // seq_length
        from_final = num_samples - sans_final
        per_epoch = (tokens_per_epoch - extra) // seq_length
        separate = from_final < int(SEPARATE_FINAL_EPOCH_BELOW * per_epoch)
    rs = np.random.RandomState(seed)
    document_index = _document_index(documents, epochs, rs, separate)
    sample_index = _sample_index(
        sizes, document_index, seq_length, epochs * tokens_per_epoch, drop_last_partial, extra
    )
    n = len(sample_index) - 1
    dtype = np.uint32 if n < np.iinfo(np.uint32).max - 1 else np.int64
    first = sans_final if separate else n
    shuffle_first = np.arange(first, dtype=dtype)
    rs.shuffle(shuffle_first)
    if first == n:
        return document_index, sample_index, shuffle_first
    shuffle_last = np.arange(first, n, dtype=dtype)
    rs.shuffle(shuffle_last)
    return document_index, sample_index, np.concatenate((shuffle_first, shuffle_last))


#: Where positions restart inside each document: ``(pointers int64 [N + 1], offsets int64)``; document
#: ``d``'s restarts are ``offsets[pointers[d]:pointers[d + 1]]``, each the offset just after an EOD token.
EodCuts = tuple[np.ndarray, np.ndarray]


def eod_cuts(tokens: np.ndarray, sequence_starts: np.ndarray, sizes: np.ndarray, eod: int) -> EodCuts:
    """The :data:`EodCuts` of documents ``d`` = ``tokens[sequence_starts[d]:][:sizes[d]]`` (one pass over
    the tokens, in chunks): after every ``eod`` token, as ``GPTDataset`` resets position ids.

    >>> tokens = np.array([5, 2, 6, 2, 7, 8, 2], np.int32)  # document 0 holds a literal EOD (2)
    >>> ptr, rel = eod_cuts(tokens, np.array([0, 4]), np.array([4, 3]), 2)
    >>> ptr.tolist(), rel.tolist()
    ([0, 2, 3], [2, 4, 3])
    """
    starts = np.asarray(sequence_starts, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    found: list[np.ndarray] = []
    total = len(tokens)
    step = 1 << 24
    for lo in range(0, total, step):
        hit = np.flatnonzero(np.asarray(tokens[lo : lo + step]) == eod)
        if len(hit):
            found.append(hit.astype(np.int64) + lo)
    pos = np.concatenate(found) if found else np.zeros(0, np.int64)
    # the document each EOD lies in (documents are ordered by start; tokens between documents: none)
    doc = np.searchsorted(starts, pos, side="right") - 1
    keep = (doc >= 0) & (pos < starts[np.maximum(doc, 0)] + sizes[np.maximum(doc, 0)]) if n else doc < -1
    pos, doc = pos[keep], doc[keep]
    rel = pos - starts[doc] + 1
    pointers = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(doc, minlength=n), out=pointers[1:])
    return pointers, rel


def _stream_cuts(
    sizes: np.ndarray, document_index: np.ndarray, cuts: EodCuts | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(document ends, restart positions)`` in the stream of ``document_index``'s documents."""
    lens = sizes[document_index].astype(np.int64)
    ends = np.cumsum(lens)
    if cuts is None:
        return ends, ends
    pointers, rel = cuts
    first = pointers[document_index]
    counts = pointers[document_index + 1] - first
    before = np.cumsum(counts) - counts
    gather = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(first - before, counts)
    return ends, np.repeat(ends - lens, counts) + rel[gather]


def sample_cu_seqlens(
    sizes: np.ndarray,
    document_index: np.ndarray,
    sample_index: np.ndarray,
    k: int,
    *,
    seq_length: int,
    cuts: EodCuts | None = None,
) -> np.ndarray:
    """``cu_seqlens`` of sample ``k`` (before shuffling) with inter-document masking: 0, every restart
    (after an EOD token: :func:`eod_cuts`; ``None``: every document end) strictly inside the sample's
    ``seq_length`` input tokens, ``seq_length``."""
    (pos0, off0), (pos1, _) = sample_index[k], sample_index[k + 1]
    docs = np.asarray(document_index[int(pos0) : int(pos1) + 1])
    _, restarts = _stream_cuts(np.asarray(sizes), docs, cuts)
    bounds = restarts - int(off0)
    inside = bounds[(bounds > 0) & (bounds < seq_length)]
    return np.concatenate([[0], inside, [seq_length]]).astype(np.int32)


@dataclass(frozen=True, kw_only=True)
class GptSamplesReport:
    """What ``GPTDataset`` makes of an indexed dataset at one ``seq_length`` / ``seed`` / ``split``."""

    seq_length: int
    seed: int
    split: str
    documents: int
    tokens: int
    epochs: int
    samples: int
    #: documents a sample boundary cuts (they continue in the next sample, without their beginning); over
    #: all epochs (a document repeated by an epoch counts again)
    documents_cut: int
    #: segments per sample with inter-document masking (mean, max)
    segments_mean: float
    segments_max: int
    #: causal attention work (sum of squared segment lengths / 2) without and with document masking
    attention_work_unmasked: float
    attention_work_masked: float

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["attention_work_ratio"] = (
            round(self.attention_work_masked / self.attention_work_unmasked, 6)
            if self.attention_work_unmasked
            else 0.0
        )
        return d


def gpt_samples_report(
    sizes: np.ndarray,
    *,
    seq_length: int,
    seed: int,
    split: str = GPT_REPORT_SPLIT,
    num_samples: int | None = None,
    cuts: EodCuts | None = None,
) -> GptSamplesReport:
    """The :class:`GptSamplesReport` of documents of lengths ``sizes`` (training split of ``split``);
    segments restart after each EOD token (``cuts``, :func:`eod_cuts`; ``None``: at every document end).

    >>> r = gpt_samples_report(np.array([5, 3, 8, 2], np.int32), seq_length=4, seed=1)
    >>> r.samples, r.documents_cut, r.segments_max, r.attention_work_unmasked, r.attention_work_masked
    (4, 2, 2, 32.0, 21.0)
    """
    sizes = np.asarray(sizes)
    documents = split_documents(split, len(sizes))
    doc, sample, _ = gpt_indices(sizes, documents, seq_length=seq_length, seed=seed, num_samples=num_samples)
    n = len(sample) - 1
    lens = sizes[doc].astype(np.int64)
    ends, restarts = _stream_cuts(sizes, doc, cuts)
    starts = ends - lens
    # every document boundary in the token stream, and where the sample boundaries fall
    cut_at = np.arange(1, n, dtype=np.int64) * seq_length  # boundaries between consecutive samples
    inside = np.searchsorted(ends, cut_at, side="right")
    cut = inside < len(ends)
    cut &= starts[np.minimum(inside, len(ends) - 1)] < cut_at
    hit = inside[cut]  # ascending: count the distinct document positions
    documents_cut = int(len(hit) and 1 + np.count_nonzero(hit[1:] != hit[:-1]))
    # Every sample's segments at once: cut the stream [0, n * seq_length) at the sample boundaries and at
    # every restart inside it; a segment belongs to the sample its start lies in.
    span = n * seq_length
    inside = restarts[(restarts > 0) & (restarts < span)]
    bounds = np.concatenate([np.arange(n + 1, dtype=np.int64) * seq_length, inside])
    bounds.sort()
    bounds = bounds[np.concatenate([[True], bounds[1:] != bounds[:-1]])]  # (np.union1d hashes: 10x slower)
    seg = np.diff(bounds).astype(np.float64)
    owner = bounds[:-1] // seq_length
    segments = np.bincount(owner, minlength=n) if n else np.zeros(0, np.int64)
    squares_masked = float((seg * seg).sum()) / 2
    return GptSamplesReport(
        seq_length=seq_length,
        seed=seed,
        split=split,
        documents=len(documents),
        tokens=int(sizes[documents].astype(np.int64).sum()),
        epochs=int(len(doc) // max(len(documents), 1)),
        samples=n,
        documents_cut=documents_cut,
        segments_mean=round(float(segments.mean()), 4) if n else 0.0,
        segments_max=int(segments.max()) if n else 0,
        attention_work_unmasked=float(n) * seq_length * seq_length / 2,
        attention_work_masked=squares_masked,
    )
