"""``eod_cuts`` / ``sample_cu_seqlens`` / ``gpt_samples_report`` against a brute-force walk of the token
stream as ``GPTDataset`` reads it: a sample's segments restart after every EOD token among its input
tokens (a literal EOD inside a document too; none at a document end without EOD)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.packed.gpt_samples import eod_cuts, gpt_indices, gpt_samples_report, sample_cu_seqlens

EOD = 2


@st.composite
def corpora(draw):
    n = draw(st.integers(1, 25))
    docs = [draw(st.lists(st.sampled_from([EOD, 5, 6, 7]), min_size=1, max_size=30)) for _ in range(n)]
    seq_length = draw(st.integers(1, 20))
    seed = draw(st.integers(0, 5))
    return docs, seq_length, seed


@settings(max_examples=200, deadline=None)
@given(corpora())
def test_segments_restart_after_every_eod_token(corpus) -> None:
    docs, seq_length, seed = corpus
    sizes = np.array([len(d) for d in docs], np.int32)
    tokens = np.concatenate([np.array(d, np.int32) for d in docs])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    cuts = eod_cuts(tokens, starts, sizes, EOD)
    doc, sample, _ = gpt_indices(
        sizes, np.arange(len(docs), dtype=np.int32), seq_length=seq_length, seed=seed
    )
    stream = np.concatenate([np.array(docs[d], np.int32) for d in doc])
    work = 0.0
    for k in range(len(sample) - 1):
        inputs = stream[k * seq_length : (k + 1) * seq_length]
        theirs = [0, *[i + 1 for i in np.flatnonzero(inputs == EOD) if i + 1 < seq_length], seq_length]
        assert sample_cu_seqlens(sizes, doc, sample, k, seq_length=seq_length, cuts=cuts).tolist() == theirs
        work += float((np.diff(theirs).astype(np.float64) ** 2).sum()) / 2
    report = gpt_samples_report(sizes, seq_length=seq_length, seed=seed, cuts=cuts)
    assert report.samples == len(sample) - 1
    assert report.attention_work_masked == work
