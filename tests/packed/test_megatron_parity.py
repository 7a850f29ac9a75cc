"""Where ``--output-format indexed`` used to differ from Megatron-LM's preprocessing, checked with the
installed ``megatron-core`` (0.16.1): empty text rows (no document, as ``tools/preprocess_data.py``), the
EOD token's literal text inside a document (``GPTDataset`` restarts positions there), the EOD id chosen
(``--eod``), and the hand-off (``--data-path`` with ``--split``, Bridge's ``GPTDatasetConfig`` fields)."""

from __future__ import annotations

import json
import shlex
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from longpack.jobs import PackConfig
from longpack.packed.gpt_samples import eod_cuts, gpt_indices, sample_cu_seqlens, split_documents
from longpack.packed.indexed import IndexedFile, inspect_indexed
from longpack.text import TextConfig
from longpack.text.tokenizers import load_tokenizer

megatron_indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
warnings.filterwarnings("ignore", message=".*Transformer Engine.*")


def write_rows(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def pack(tmp_path: Path, texts: list[str], tokenizer: str, name: str = "o", **kw: Any):
    src = write_rows(tmp_path / f"{name}.jsonl", texts)
    return PackConfig(
        inputs=[src], out=tmp_path / name, tokenizer=tokenizer, seq_length=16, output_format="indexed",
        workers=1, **kw,
    ).run()  # fmt: skip


def preprocess_data_files(tmp_path: Path, texts: list[str], tok: Any, eod: int) -> Path:
    """What ``tools/preprocess_data.py --append-eod --json-keys text`` writes: its ``Encoder.encode`` (ids
    of the text; EOD appended only to a document that has ids) into Megatron-Core's builder, document by
    document (``add_document(doc_ids, sentence_lens)``, empty lists for an empty row)."""
    prefix = tmp_path / "megatron"
    builder = megatron_indexed.IndexedDatasetBuilder(
        f"{prefix}.bin", dtype=megatron_indexed.DType.optimal_dtype(tok.vocab_size)
    )
    for text in texts:
        ids = tok.encode(text)
        lens = [len(ids)] if ids else []
        if ids:
            ids.append(eod)
            lens[-1] += 1
        builder.add_document(ids, lens)
    builder.finalize(f"{prefix}.idx")
    return prefix


TEXTS = ["alpha beta", "", "gamma", "", "", "delta epsilon zeta", "eta", ""]


@pytest.mark.parametrize("rows_per_shard", [None, 2])
def test_empty_rows_are_no_documents_as_preprocess_data(tmp_path: Path, rows_per_shard) -> None:
    texts = TEXTS * 3
    r = pack(tmp_path, texts, "bytes", rows_per_shard=rows_per_shard)
    tok = load_tokenizer("bytes")
    ref = preprocess_data_files(tmp_path, texts, tok, tok.eos_id)
    kept = [t for t in texts if t]
    c = r.manifest.counts
    assert c["empty"] == len(texts) - len(kept) and c["packed"] == len(kept)
    empty = r.manifest.extra["empty_documents"]
    lines = [i + 1 for i, t in enumerate(texts) if not t]
    assert empty["count"] == len(lines)
    assert empty["listed"] == [f"{tmp_path / 'o.jsonl'}:{n}" for n in lines]
    assert r.manifest.inputs[0]["packed"] == len(kept)
    if rows_per_shard is None:  # one prefix: the very bytes preprocess_data.py writes, index included
        prefix = r.out / "training_text_document"
        for ext in (".bin", ".idx"):
            assert Path(f"{prefix}{ext}").read_bytes() == Path(f"{ref}{ext}").read_bytes()
        assert (
            IndexedFile(prefix).document_indices.tolist()
            == megatron_indexed.IndexedDataset(str(ref)).document_indices.tolist()
        )
    else:  # shards: the same sequences, and the same document count (empty documents are kept in the index)
        got, docs = [], 0
        for p in r.manifest.to_dict()["megatron"]["prefixes"]:
            ds = megatron_indexed.IndexedDataset(str(r.out / p))
            got += [x.tolist() for x in ds]
            docs += len(ds.document_indices) - 1
        theirs = megatron_indexed.IndexedDataset(str(ref))
        assert got == [x.tolist() for x in theirs]
        assert docs == len(theirs.document_indices) - 1 == len(texts)


def test_only_empty_rows_is_a_clear_error(tmp_path: Path) -> None:
    from longpack.errors import InputError

    with pytest.raises(InputError, match="all 3 rows were empty documents"):
        pack(tmp_path, ["", "", ""], "bytes")


def megatron_gpt_dataset(tmp_path: Path, prefix: Path, tok: Any, eod: int, seq_length: int, seed: int):
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import Split

    class MegatronTokenizer:  # what GPTDatasetConfig reads of a tokenizer
        vocab_size, pad = tok.vocab_size, -1
        unique_identifiers: ClassVar[dict[str, str]] = {"class": tok.name}

    MegatronTokenizer.eod = eod  # type: ignore[attr-defined]
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=([str(prefix)], None), split="1,0,0",
        path_to_cache=str(tmp_path / f"cache-{eod}"), tokenizer=MegatronTokenizer(), reset_position_ids=True,
        reset_attention_mask=True, eod_mask_loss=False, create_attention_mask=False,
    )  # fmt: skip
    data = megatron_indexed.IndexedDataset(str(prefix))
    docs = split_documents("1,0,0", len(data))
    return GPTDataset(data, str(prefix), docs, None, Split.train, config), docs


@pytest.mark.parametrize("eod", [None, "<|endoftext|>"])
def test_cu_seqlens_restart_where_gpt_dataset_restarts_positions(tmp_path: Path, eod) -> None:
    rng = np.random.default_rng(5)
    words = ["alpha", "beta", "<|im_end|>", "<|endoftext|>", "gamma", "delta"]
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 30)))) for _ in range(80)]
    tok = load_tokenizer("qwen3")
    r = pack(tmp_path, texts, "qwen3", text=TextConfig(eod=eod))
    eod_id = tok.eos_id if eod is None else tok.special_tokens[eod]
    mg = r.manifest.to_dict()["megatron"]
    assert mg["eod_id"] == eod_id and mg["documents_with_inner_eod"] > 0
    prefix = r.out / "training_text_document"
    data = IndexedFile(prefix)
    assert all(int(data.document(i)[-1]) == eod_id for i in range(len(data)))  # the chosen EOD ends each
    seq_length, seed = 16, r.manifest.settings.seed
    ds, docs = megatron_gpt_dataset(tmp_path, prefix, tok, eod_id, seq_length, seed)
    sizes = np.asarray(data.sequence_lengths)
    starts = np.asarray(data.sequence_pointers) // data.dtype.itemsize
    cuts = eod_cuts(data.tokens, starts, sizes, eod_id)
    doc, sample, shuffle = gpt_indices(sizes, docs, seq_length=seq_length, seed=seed)
    report = inspect_indexed(r.out, sample=3)["prefixes"][str(prefix)]
    assert report["gpt_dataset"] == r.manifest.to_dict()["gpt_dataset"]
    work, inner = 0.0, 0
    for k in range(len(ds)):
        positions = ds[k]["position_ids"].numpy()  # Megatron's restarts: after every EOD token
        theirs = [*np.flatnonzero(positions == 0).tolist(), seq_length]
        ours = sample_cu_seqlens(sizes, doc, sample, int(shuffle[k]), seq_length=seq_length, cuts=cuts)
        assert ours.tolist() == theirs
        by_documents = sample_cu_seqlens(sizes, doc, sample, int(shuffle[k]), seq_length=seq_length)
        inner += by_documents.tolist() != theirs  # what document boundaries alone would have said
        work += float((np.diff(theirs).astype(np.float64) ** 2).sum()) / 2
        if k == 3:
            assert report["sample"]["cu_seqlens"] == theirs
    assert inner > 0
    assert report["gpt_dataset"]["attention_work_masked"] == work
    assert report["gpt_dataset"]["samples"] == len(ds)


def test_bad_eod_is_a_config_error(tmp_path: Path) -> None:
    from longpack.errors import ConfigError

    with pytest.raises(ConfigError, match=r"text.eod='two words' is not one token"):
        pack(tmp_path, ["a b"], "qwen3", text=TextConfig(eod="two words"))


def test_handoff_trains_on_the_reported_split(tmp_path: Path) -> None:
    """The printed Megatron-LM arguments, read back as Megatron-LM reads them (``get_blend_from_list``), and
    Bridge's fields, built by Megatron-Core's own builder: the samples the summary reports."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    texts = [f"document {i} " + "word " * (i % 9) for i in range(60)]
    tok = load_tokenizer("bytes")
    (tmp_path / "with space").mkdir()
    r = pack(tmp_path / "with space", texts, "bytes", rows_per_shard=25)
    summary = r.to_dict()
    argv = shlex.split(shlex.join(summary["megatron_args"]))
    i = argv.index("--split")
    data_path = argv[argv.index("--data-path") + 1 : i]
    assert argv[i + 1] == summary["gpt_dataset"]["split"] == "1,0,0"
    assert len(data_path) == 6  # three shards, weights and quoted prefixes with a space
    blend = get_blend_from_list(data_path)
    bridge = summary["bridge_dataset"]
    assert blend is not None and list(blend[0]) == bridge["blend"][0]
    assert list(blend[1]) == pytest.approx(bridge["blend"][1])

    class MegatronTokenizer:
        vocab_size, eod, pad = tok.vocab_size, tok.eos_id, -1
        unique_identifiers: ClassVar[dict[str, str]] = {"class": "bytes"}

    config = GPTDatasetConfig(
        random_seed=bridge["random_seed"], sequence_length=bridge["seq_length"], blend=tuple(bridge["blend"]),
        split=bridge["split"], path_to_cache=str(tmp_path / "cache"), tokenizer=MegatronTokenizer(),
        reset_position_ids=bridge["reset_position_ids"], reset_attention_mask=bridge["reset_attention_mask"],
        eod_mask_loss=False, create_attention_mask=False,
    )  # fmt: skip
    per_prefix = [
        inspect_indexed(p, seq_length=bridge["seq_length"], seed=bridge["random_seed"])["prefixes"][p]
        for p in bridge["blend"][0]
    ]
    # Megatron-Core's own reading of the split (GPTDatasetConfig.split_matrix): every document of every
    # prefix trains, as the summary reports (Megatron-LM's legacy 969,30,1 holds some back)
    lo, hi = config.split_matrix[0]
    for p, e in zip(bridge["blend"][0], per_prefix, strict=True):
        n = len(megatron_indexed.IndexedDataset(p))
        assert round(hi * n) - round(lo * n) == e["documents"] == n
    assert sum(e["documents"] for e in per_prefix) == summary["documents"]
    legacy = GPTDatasetConfig(
        random_seed=1, sequence_length=16, blend=tuple(bridge["blend"]), split="969, 30, 1",
        tokenizer=MegatronTokenizer(), reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=False,
    )  # fmt: skip
    assert legacy.split_matrix[0] != config.split_matrix[0]
