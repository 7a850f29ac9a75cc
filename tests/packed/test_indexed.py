"""``--output-format indexed`` read back by Megatron-Core itself (the installed ``megatron-core``): its
``IndexedDataset`` sees longpack's tokenization document by document, its own builder writes the same
bytes, and its ``GPTDataset`` builds the document / sample / shuffle indices and (with inter-document
masking) the segment boundaries that ``longpack.packed.gpt_samples`` and ``longpack inspect`` report."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from longpack.jobs import PackConfig
from longpack.packed.gpt_samples import gpt_indices, sample_cu_seqlens, split_documents
from longpack.packed.indexed import IndexedFile, inspect_indexed
from longpack.text.tokenizers import load_tokenizer

megatron_indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
warnings.filterwarnings("ignore", message=".*Transformer Engine.*")


def documents(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "long-context", "pack", "Megatron", "\n", "42"]
    return [" ".join(rng.choice(words, int(rng.integers(1, 60)))) for _ in range(n)]


def pack_indexed(tmp_path: Path, docs: list[str], tokenizer: str, name: str = "o", **kw):
    src = tmp_path / "docs.jsonl"
    if not src.exists():
        src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return PackConfig(
        inputs=[src],
        out=tmp_path / name,
        tokenizer=tokenizer,
        seq_length=64,
        output_format="indexed",
        workers=1,
        **kw,
    ).run()


@pytest.mark.parametrize("tokenizer,dtype", [("bytes", np.uint16), ("qwen3", np.int32)])
def test_megatron_reads_our_documents_and_writes_the_same_bytes(tmp_path: Path, tokenizer, dtype) -> None:
    docs = documents(120)
    r = pack_indexed(tmp_path, docs, tokenizer)
    tok = load_tokenizer(tokenizer)
    prefix = str(r.out / "training_text_document")
    ds = megatron_indexed.IndexedDataset(prefix)
    assert ds.index.dtype == dtype and len(ds) == len(docs)
    for i, doc in enumerate(docs):
        assert ds[i].tolist() == [*tok.encode(doc), tok.eos_id]
    # Megatron's own builder (what tools/preprocess_data.py calls) on the same documents: identical files
    ref = tmp_path / "ref"
    builder = megatron_indexed.IndexedDatasetBuilder(
        f"{ref}.bin", dtype=megatron_indexed.DType.optimal_dtype(tok.vocab_size)
    )
    for doc in docs:
        ids = [*tok.encode(doc), tok.eos_id]
        builder.add_document(ids, [len(ids)])
    builder.finalize(f"{ref}.idx")
    assert Path(f"{ref}.bin").read_bytes() == Path(f"{prefix}.bin").read_bytes()
    assert Path(f"{ref}.idx").read_bytes() == Path(f"{prefix}.idx").read_bytes()
    summary = r.to_dict()
    assert summary["data_path"] == prefix and summary["documents"] == len(docs)
    assert r.manifest.counts["packed"] == len(docs)


def test_shards_data_path_and_determinism(tmp_path: Path) -> None:
    docs = documents(50, seed=3)
    r = pack_indexed(tmp_path, docs, "bytes", rows_per_shard=20)
    prefixes = [r.out / f"training_text_document.part-0000{i}-of-00003" for i in range(3)]
    got = []
    for p in prefixes:
        got += [x.tolist() for x in megatron_indexed.IndexedDataset(str(p))]
    tok = load_tokenizer("bytes")
    assert got == [[*tok.encode(d), tok.eos_id] for d in docs]
    weights = [float(w) for w in r.to_dict()["data_path"].split()[::2]]
    assert sum(weights) == pytest.approx(1.0) and len(weights) == 3
    assert (r.out / "data_path.txt").read_text().strip() == r.to_dict()["data_path"]
    again = pack_indexed(tmp_path, docs, "bytes", name="again", rows_per_shard=20)
    for p in prefixes:
        for ext in (".bin", ".idx"):
            assert Path(f"{p}{ext}").read_bytes() == Path(f"{again.out / p.name}{ext}").read_bytes()


@pytest.mark.parametrize(
    "seq_length,seed,split,num_samples",
    [(64, 1234, "1,0,0", None), (32, 7, "969,30,1", None), (16, 3, "90,10", 2000)],
)
def test_gpt_dataset_samples_and_cu_seqlens_equal_our_report(
    tmp_path: Path, seq_length, seed, split, num_samples
) -> None:
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import Split

    docs = documents(150, seed=seed)
    r = pack_indexed(tmp_path, docs, "bytes")
    prefix = r.out / "training_text_document"
    tok = load_tokenizer("bytes")

    class MegatronTokenizer:  # what GPTDatasetConfig reads of a tokenizer
        vocab_size, eod, pad = tok.vocab_size, tok.eos_id, -1
        unique_identifiers: ClassVar[dict[str, str]] = {"class": "bytes"}

    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=([str(prefix)], None), split=split,
        path_to_cache=str(tmp_path / "cache"), tokenizer=MegatronTokenizer(), reset_position_ids=True,
        reset_attention_mask=True, eod_mask_loss=False, create_attention_mask=False,
    )  # fmt: skip
    data = megatron_indexed.IndexedDataset(str(prefix))
    docs_train = split_documents(split, len(docs))
    ds = GPTDataset(data, str(prefix), docs_train, num_samples, Split.train, config)
    sizes = IndexedFile(prefix).sequence_lengths
    doc, sample, shuffle = gpt_indices(
        sizes, docs_train, seq_length=seq_length, seed=seed, num_samples=num_samples
    )
    assert np.array_equal(ds.document_index, doc)
    assert np.array_equal(ds.sample_index, sample)
    assert np.array_equal(ds.shuffle_index, shuffle)
    report = inspect_indexed(prefix, seq_length=seq_length, seed=seed, split=split, num_samples=num_samples,
                             sample=5)["prefixes"][str(prefix)]  # fmt: skip
    assert report["gpt_dataset"]["samples"] == len(ds)
    masked_work = 0.0
    for k in range(len(ds)):
        item = ds[k]
        assert item["tokens"].numel() == seq_length  # tokens per sample
        positions = item["position_ids"].numpy()  # restarts after every EOD: Megatron's document boundaries
        theirs = [*np.flatnonzero(positions == 0).tolist(), seq_length]
        assert (
            sample_cu_seqlens(sizes, doc, sample, int(shuffle[k]), seq_length=seq_length).tolist() == theirs
        )
        masked_work += float((np.diff(theirs).astype(np.float64) ** 2).sum()) / 2
        if k == 5:
            assert report["sample"]["cu_seqlens"] == theirs
    # attention work with document masking: the segments Megatron's position ids give, squared
    assert report["gpt_dataset"]["attention_work_masked"] == masked_work
    # documents cut at sample boundaries: a sample that starts inside a document (offset > 0); a document
    # repeated by a second epoch counts again
    starts_inside = {int(p) for p, o in sample[1:-1] if o > 0}
    assert report["gpt_dataset"]["documents_cut"] == len(starts_inside)
