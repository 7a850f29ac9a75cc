"""Megatron indexed datasets out (``output_format="indexed"``): the ``.bin`` / ``.idx`` pair Megatron-Core's
``IndexedDataset`` (``megatron/core/datasets/indexed_dataset.py``) memory-maps, and that Megatron-LM's
``tools/preprocess_data.py`` writes; what ``GPTDataset`` then trains on is :mod:`longpack.packed.gpt_samples`.

The format, as Megatron-Core 0.16 reads and writes it (one document = one sequence, as ``preprocess_data.py``
writes without ``--split-sentences``):

- ``<prefix>.bin``: every document's token ids back to back, in the token dtype: ``uint16`` when the
  vocabulary has fewer than 65,500 ids, else ``int32`` (Megatron's ``DType.optimal_dtype``).
- ``<prefix>.idx``: the 9-byte magic ``MMIDIDX\\x00\\x00``, version ``1`` (``<Q``), the dtype code (``<B``:
  ``uint16`` 8, ``int32`` 4), the sequence count and the document-index count (``<Q`` each), then the
  sequence lengths (``int32``), the byte offset of each sequence in ``.bin`` (``int64``) and the document
  indices (``int64``: ``0, 1, ..., N``: document ``d`` is sequences ``[idx[d], idx[d+1])``). A row whose text
  tokenizes to nothing is a document without a sequence, as ``preprocess_data.py`` writes it (its builder's
  ``add_document`` of no ids appends the document index again): ``..., k, k, ...``.

A pack writes one prefix per shard (``training_text_document.part-00000-of-00002``: whole documents, about
:data:`TOKENS_PER_SHARD` tokens each) and a ready ``--data-path`` (weights = each shard's share of the
tokens, so sampling across shards follows the data). Documents are written whole, in input order: indexed
data is cut into samples by Megatron's ``GPTDataset`` at training time, so nothing is dropped for length.

>>> import tempfile
>>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32), loss_mask=np.ones(5, np.uint8),
...     offsets=np.array([0, 3, 5]), source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]),
...     files=("a.jsonl",))
>>> prefix = Path(tempfile.mkdtemp()) / "docs"
>>> r = write_indexed(prefix, s, np.arange(2), vocab_size=300); r["rows"], r["stored_tokens"], r["size_bytes"]
(2, 5, 92)
>>> d = IndexedFile(prefix)
>>> d.dtype, len(d), d.document(1).tolist(), d.document_indices.tolist()
(dtype('uint16'), 2, [7, 2], [0, 1, 2])
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longpack import choices
from longpack.errors import PackedDataError
from longpack.outputs import atomic_write, atomic_write_bytes, sha256_file, write_array
from longpack.samples import TokenizedSamples

__all__ = [
    "INDEX_MAGIC",
    "TOKENS_PER_SHARD",
    "IndexedFile",
    "check_trains_everywhere",
    "data_path",
    "indexed_shards",
    "inspect_indexed",
    "is_indexed",
    "token_dtype",
    "verify_indexed",
    "write_indexed",
]

#: The ``.idx`` file's first bytes (Megatron-Core ``_INDEX_HEADER``).
INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
#: Megatron-Core's ``DType`` codes of the token dtypes longpack writes.
DTYPE_CODES: dict[np.dtype, int] = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
#: Megatron-Core ``DType.optimal_dtype``: ``uint16`` below this vocabulary size.
UINT16_BELOW = 65500
#: Tokens per shard by default (about 512 MiB of ``int32`` tokens), cut at document boundaries.
TOKENS_PER_SHARD = 2**27
#: The prefix stem of a split's shards, as ``preprocess_data.py`` names its output (``<prefix>_text_document``).
DOCUMENT_STEM = "{split}_text_document"


def token_dtype(vocab_size: int) -> np.dtype:
    """The ``.bin`` dtype Megatron picks for a vocabulary (``DType.optimal_dtype``).

    >>> token_dtype(32000), token_dtype(151669)
    (dtype('uint16'), dtype('int32'))
    """
    return np.dtype(np.uint16 if vocab_size < UINT16_BELOW else np.int32)


def indexed_shards(
    lengths: np.ndarray, tokens_per_shard: int | None = None, docs_per_shard: int | None = None
) -> list[tuple[int, int]]:
    """``(first document, end document)`` of every shard: whole documents, ``docs_per_shard`` each when
    given, else as many as keep a shard within ``tokens_per_shard`` (default :data:`TOKENS_PER_SHARD`; a
    longer document gets a shard of its own).

    >>> indexed_shards(np.array([4, 4, 4, 9, 1]), tokens_per_shard=8)
    [(0, 2), (2, 3), (3, 4), (4, 5)]
    >>> indexed_shards(np.array([4, 4, 4]), docs_per_shard=2)
    [(0, 2), (2, 3)]
    """
    n = len(lengths)
    if n == 0:
        return [(0, 0)]
    if docs_per_shard is not None:
        return [(lo, min(n, lo + docs_per_shard)) for lo in range(0, n, docs_per_shard)]
    budget = tokens_per_shard or TOKENS_PER_SHARD
    ends = np.cumsum(lengths)
    shards, lo, base = [], 0, 0
    while lo < n:
        # the last document that still fits (at least one document per shard)
        hi = max(lo + 1, int(np.searchsorted(ends, base + budget, side="right")))
        shards.append((lo, hi))
        base, lo = int(ends[hi - 1]), hi
    return shards


def _atomic_write(path: Path, chunks: Iterable[bytes | np.ndarray]) -> None:
    def write(f: Any) -> None:
        for chunk in chunks:
            if isinstance(chunk, np.ndarray):
                write_array(f, chunk)  # fh.write: a full disk keeps its errno
            else:
                f.write(chunk)

    atomic_write(path, write)


def write_indexed(
    prefix: Path,
    samples: TokenizedSamples,
    documents: np.ndarray,
    *,
    vocab_size: int,
    chunk_tokens: int = 1 << 24,
    empty_before: np.ndarray | None = None,
) -> dict[str, Any]:
    """Write samples ``documents`` (indices, in this order) as one Megatron indexed dataset ``<prefix>.bin`` /
    ``<prefix>.idx`` (each atomically, ``.idx`` last); return the shard's manifest record.

    ``empty_before``: for each empty document (no sequence) between them, how many of ``documents`` come
    before it (ascending), so the document index is the one ``preprocess_data.py`` writes."""
    dtype = token_dtype(vocab_size)
    documents = np.asarray(documents, dtype=np.int64)
    lengths = samples.stored_lengths()[documents]
    starts = samples.offsets[:-1][documents]
    contiguous = bool((np.diff(documents) == 1).all())  # one slice of the token buffer, copied in chunks

    def chunks() -> Iterator[np.ndarray]:
        if contiguous and len(documents):
            lo, hi = int(starts[0]), int(starts[-1] + lengths[-1])
            for a in range(lo, hi, chunk_tokens):
                yield np.asarray(samples.tokens[a : min(hi, a + chunk_tokens)]).astype(dtype)
        elif len(documents):
            yield samples.take(documents).tokens.astype(dtype)

    return _write_index_files(prefix, lengths, chunks(), dtype, empty_before)


def _write_index_files(
    prefix: Path, lengths: np.ndarray, chunks: Iterable[np.ndarray], dtype: np.dtype, empty_before: Any
) -> dict[str, Any]:
    """``<prefix>.bin`` from ``chunks`` (the documents' tokens in order, already in ``dtype``; written as
    they come) and ``<prefix>.idx`` (last) for documents of ``lengths``; the prefix's manifest record."""
    if len(lengths) and int(lengths.max()) > np.iinfo(np.int32).max:
        raise PackedDataError(
            f"{prefix}: a document of {int(lengths.max())} tokens does not fit Megatron's int32 length"
        )
    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    _atomic_write(bin_path, chunks)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths):
        np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    doc_index = document_index(len(lengths), empty_before)
    header = (
        INDEX_MAGIC
        + struct.pack("<Q", INDEX_VERSION)
        + struct.pack("<B", DTYPE_CODES[dtype])
        + struct.pack("<Q", len(lengths))
        + struct.pack("<Q", len(doc_index))
    )
    _atomic_write(idx_path, [header, lengths.astype(np.int32), pointers, doc_index])
    tokens = int(lengths.sum())
    record = {
        "name": prefix.name,
        "rows": len(lengths),  # documents
        "stored_tokens": tokens,
        "size_bytes": bin_path.stat().st_size + idx_path.stat().st_size,
        "sha256": sha256_file(bin_path),
        "idx_sha256": sha256_file(idx_path),
        "dtype": dtype.name,
    }
    if len(doc_index) != len(lengths) + 1:
        record["empty_documents"] = len(doc_index) - len(lengths) - 1
    return record


def document_index(sequences: int, empty_before: np.ndarray | None = None) -> np.ndarray:
    """The ``.idx`` document index of ``sequences`` one-sequence documents with empty documents (no
    sequence) after ``empty_before[j]`` of them: what Megatron-Core's ``IndexedDatasetBuilder`` writes when
    ``add_document`` is called for each in order (it appends the sequence count after every document).

    >>> document_index(3).tolist(), document_index(3, np.array([0, 2, 2])).tolist()
    ([0, 1, 2, 3], [0, 0, 1, 2, 2, 2, 3])
    """
    kept = np.arange(1, sequences + 1, dtype=np.int64)
    if empty_before is not None and len(empty_before):
        before = np.asarray(empty_before, dtype=np.int64)
        kept = np.insert(kept, before, before)
    return np.concatenate([np.zeros(1, np.int64), kept])


def _ends_with(cuts: tuple[np.ndarray, np.ndarray], lengths: np.ndarray) -> np.ndarray:
    """1 where a document's last restart is its end (it ends with EOD), else 0."""
    pointers, rel = cuts
    out = np.zeros(len(lengths), dtype=np.int64)
    has = pointers[1:] > pointers[:-1]
    out[has] = rel[pointers[1:][has] - 1] == np.asarray(lengths)[has]
    return out


def data_path_args(prefixes: Sequence[tuple[str, int]]) -> list[str]:
    """:func:`data_path` as the separate arguments of ``--data-path`` (``nargs='*'``).

    >>> data_path_args([("/d/a b", 300), ("/d/c", 100)])
    ['0.75', '/d/a b', '0.25', '/d/c']
    """
    if len(prefixes) == 1:
        return [prefixes[0][0]]
    total = sum(t for _, t in prefixes) or 1
    return [x for p, t in prefixes for x in (f"{round(t / total, 8):g}", p)]


def megatron_args(
    prefixes: Sequence[tuple[str, int]], *, split: str, seq_length: int, seed: int
) -> list[str]:
    """The Megatron-LM ``pretrain_gpt.py`` arguments that train on the samples ``longpack`` reports: the
    prefixes with their weights, and the ``--split`` / ``--seq-length`` / ``--seed`` of the report (without
    ``--split`` Megatron-LM falls back to its legacy ``969, 30, 1``; with ``--data-args-path`` it needs
    ``--split`` too). Shell-quote them with :func:`shlex.join`.

    >>> import shlex
    >>> shlex.join(megatron_args([("/d/my corpus", 9)], split="1,0,0", seq_length=8192, seed=1234))
    "--data-path '/d/my corpus' --split 1,0,0 --seq-length 8192 --seed 1234"
    """
    return [
        "--data-path",
        *data_path_args(prefixes),
        "--split",
        split,
        "--seq-length",
        str(seq_length),
        "--seed",
        str(seed),
    ]


def bridge_dataset(
    prefixes: Sequence[tuple[str, int]], *, split: str, seq_length: int, seed: int
) -> dict[str, Any]:
    """The fields of Megatron-Bridge's ``GPTDatasetConfig`` (Megatron-Core's, with ``seq_length``) that
    train on the samples ``longpack`` reports: ``blend`` = ``(prefixes, weights or None)``, ``split``,
    ``seq_length``, ``random_seed``, and the document masking the reported ``cu_seqlens`` assume.

    >>> bridge_dataset([("/d/a", 3), ("/d/b", 1)], split="1,0,0", seq_length=64, seed=1)["blend"]
    [['/d/a', '/d/b'], [0.75, 0.25]]
    """
    total = sum(t for _, t in prefixes) or 1
    weights = None if len(prefixes) == 1 else [round(t / total, 8) for _, t in prefixes]
    return {
        "blend": [[p for p, _ in prefixes], weights],
        "split": split,
        "seq_length": seq_length,
        "random_seed": seed,
        "reset_position_ids": True,
        "reset_attention_mask": True,
    }


def check_trains_everywhere(samples: TokenizedSamples, format_name: str) -> None:
    """Refuse samples whose loss mask leaves tokens out (SFT prompts, user turns, a pre-tokenized
    ``loss_mask``): a Megatron indexed dataset has no loss mask, ``GPTDataset`` trains on every token, so
    writing them would train on what the mask excluded, without a word.

    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1], np.uint8), offsets=np.array([0, 3, 5]),
    ...     source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]), files=("a.jsonl",))
    >>> check_trains_everywhere(s, "prompt_completion")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: output_format indexed: 1 of 5 tokens of these prompt_completion rows are outside the loss mask (prompts, user turns), but Megatron's indexed datasets have no loss mask and GPTDataset trains on every token; pack SFT data as packed rows (output_format parquet), or train on every token (format text, or prompt_completion_loss full; chats keep their template's special tokens out of the loss)
    """
    from longpack.errors import ConfigError

    total = len(samples.loss_mask)
    masked = total - int(np.count_nonzero(samples.loss_mask))
    if masked:
        raise ConfigError(
            f"output_format indexed: {masked:,} of {total:,} tokens of these {format_name} rows are outside "
            "the loss mask (prompts, user turns), but Megatron's indexed datasets have no loss mask and "
            "GPTDataset trains on every token; pack SFT data as packed rows (output_format parquet), or train "
            "on every token (format text, or prompt_completion_loss full; chats keep their template's "
            "special tokens out of the loss)",
            fields=("output_format", "format", "prompt_completion_loss"),
        )


def verify_indexed(folder: Path, manifest: Mapping[str, Any]) -> list[str]:
    """What ``inspect --verify`` finds wrong with an indexed pack folder: every shard's ``.bin`` / ``.idx``
    against the sha256s and sizes of the manifest, and the ``.idx`` against its ``.bin`` (lengths, pointers,
    token ids below the vocabulary). Empty: all hold."""
    problems: list[str] = []
    vocab = (manifest.get("megatron") or {}).get("vocab_size")
    for record in manifest["splits"]["training"]["files"]:
        prefix = folder / record["name"]
        for suffix, key in ((".bin", "sha256"), (".idx", "idx_sha256")):
            path = Path(f"{prefix}{suffix}")
            try:
                digest = sha256_file(path)
            except OSError as exc:
                problems.append(f"{path.name}: cannot be read ({exc.strerror or exc})")
                continue
            if key in record and digest != record[key]:
                problems.append(
                    f"{path.name}: sha256 {digest[:12]}... differs from the manifest's {str(record[key])[:12]}... "
                    "(the file changed after it was written): pack again"
                )
        try:
            data = IndexedFile(prefix)
        except (PackedDataError, OSError, ValueError) as exc:
            problems.append(f"{prefix.name}: {exc}")
            continue
        if len(data) != record.get("rows"):
            problems.append(f"{prefix.name}: {len(data)} documents, the manifest says {record.get('rows')}")
        tokens = data.tokens
        if isinstance(vocab, int) and tokens.size and int(tokens.max()) >= vocab:
            i = int(np.flatnonzero(np.asarray(tokens) >= vocab)[0])
            problems.append(
                f"{prefix.name}.bin: token id {int(tokens[i])} at index {i} is not below vocab_size {vocab}"
            )
    return problems


def data_path(prefixes: Sequence[tuple[str, int]]) -> str:
    """Megatron-LM's ``--data-path`` (Megatron-Bridge ``dataset.blend``) for shards ``(prefix, tokens)``:
    ``weight prefix`` pairs, each weight the shard's share of the tokens (one shard: its prefix alone).

    >>> data_path([("/d/a", 300), ("/d/b", 100)])
    '0.75 /d/a 0.25 /d/b'
    >>> data_path([("/d/a", 300)])
    '/d/a'
    """
    if len(prefixes) == 1:
        return prefixes[0][0]
    total = sum(t for _, t in prefixes) or 1
    return " ".join(f"{round(t / total, 8):g} {p}" for p, t in prefixes)


class IndexedFile:
    """One Megatron indexed dataset read back (``prefix`` without ``.bin`` / ``.idx``): the index arrays and
    each document's tokens (a view of the memory-mapped ``.bin``). Refuses a file that is not one."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        idx = Path(f"{self.prefix}.idx")
        try:
            raw = np.memmap(idx, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise PackedDataError(f"{idx}: cannot read ({exc}); give the prefix of a .bin/.idx pair") from exc
        if len(raw) < 34 or bytes(raw[:9]) != INDEX_MAGIC:
            raise PackedDataError(f"{idx}: not a Megatron indexed dataset index (no MMIDIDX header)")
        version, code, n_seq, n_doc = struct.unpack("<QBQQ", bytes(raw[9:34]))
        by_code = {c: d for d, c in DTYPE_CODES.items()}
        if version != INDEX_VERSION or code not in by_code:
            raise PackedDataError(f"{idx}: version {version}, dtype code {code}: not one longpack reads")
        need = 34 + 4 * n_seq + 8 * n_seq + 8 * n_doc
        if len(raw) < need:
            raise PackedDataError(
                f"{idx}: {len(raw)} bytes, the header promises {need}: the file is cut short"
            )
        o = 34
        self.dtype: np.dtype = by_code[code]
        self.sequence_lengths: np.ndarray = raw[o : o + 4 * n_seq].view(np.int32)
        o += 4 * n_seq
        self.sequence_pointers: np.ndarray = raw[o : o + 8 * n_seq].view(np.int64)
        o += 8 * n_seq
        self.document_indices: np.ndarray = raw[o : o + 8 * n_doc].view(np.int64)
        bin_path = Path(f"{self.prefix}.bin")
        size = bin_path.stat().st_size if bin_path.exists() else -1
        expected = int(self.sequence_lengths.astype(np.int64).sum()) * self.dtype.itemsize
        if size != expected:
            raise PackedDataError(f"{bin_path}: {size} bytes, the index says {expected}")
        self.tokens: np.ndarray = (
            np.memmap(bin_path, dtype=self.dtype, mode="r") if size else np.zeros(0, self.dtype)
        )

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def document(self, i: int) -> np.ndarray:
        """The tokens of sequence (document) ``i``."""
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize
        return self.tokens[start : start + int(self.sequence_lengths[i])]


def indexed_prefixes(manifest: Mapping[str, Any], out: Path, split: str = "training") -> list[Path]:
    """The absolute shard prefixes of a split of an indexed pack folder."""
    return [out / f["name"] for f in manifest["splits"][split]["files"]]


#: The file holding the ready ``--data-path`` (absolute prefixes) of an indexed pack folder.
DATA_PATH_NAME = "data_path.txt"


def write_indexed_output(
    out: Path,
    samples: TokenizedSamples,
    settings: Any,
    provenance: Any,
    *,
    vocab_size: int,
    eos_id: int,
    empty_before: np.ndarray | None = None,
) -> dict[str, Any]:
    """Write every sample of ``samples`` as a document into sharded Megatron indexed datasets in the prepared
    folder ``out``, then ``data_path.txt`` and, last, ``manifest.json``; return the manifest.

    ``eos_id``: the EOD id (where ``GPTDataset`` restarts positions); ``empty_before``: for each empty
    document (a text row that tokenized to nothing), how many samples come before it (see
    :func:`document_index`); each goes into the shard that holds the next document (the last one at the end).

    ``settings``: the job's ``PackSettings`` (``seq_length``, ``seed`` and ``rows_per_shard`` = documents per
    shard); ``provenance``: its ``Provenance``. The manifest has the layout of a packed folder's (counts,
    inputs, malformed rows, one record per shard) plus ``megatron`` (prefixes, ``data_path``, dtype, EOD id)
    and ``gpt_dataset``: what ``GPTDataset`` makes of the data at ``seq_length`` / ``seed``.
    """
    lengths = samples.stored_lengths()
    layout = indexed_layout(lengths, settings.rows_per_shard, empty_before)
    written = [
        write_indexed_part(out / name, samples_of(samples, lo, hi), vocab_size=vocab_size, eod_id=eos_id,
                           empty_before=empty)
        for name, (lo, hi), empty in layout
    ]  # fmt: skip
    return finish_indexed_output(
        out, written, lengths, settings, provenance, vocab_size=vocab_size, eos_id=eos_id,
        empty=0 if empty_before is None else len(empty_before),
    )  # fmt: skip


def samples_of(samples: TokenizedSamples, lo: int, hi: int) -> TokenizedSamples:
    """Samples ``lo .. hi - 1`` re-based (views; a memory map stays one)."""
    a, b = int(samples.offsets[lo]), int(samples.offsets[hi])
    return TokenizedSamples(
        tokens=samples.tokens[a:b],
        loss_mask=samples.loss_mask[a:b],
        offsets=np.asarray(samples.offsets[lo : hi + 1]) - a,
        source_file=samples.source_file[lo:hi],
        source_row=samples.source_row[lo:hi],
        files=samples.files,
    )


def indexed_layout(
    lengths: np.ndarray, rows_per_shard: int | None, empty_before: np.ndarray | None = None
) -> list[tuple[str, tuple[int, int], np.ndarray]]:
    """``(prefix name, (first document, end document), empty documents of the shard)`` of every prefix of
    an indexed output of documents of ``lengths``: what each writer (a process, a Ray task) writes with
    :func:`write_indexed_part`. Empty documents (``empty_before``: samples before each) go to the shard
    holding the next document (the last shard at the end), counted from its first document.

    >>> [(n, s, e.tolist()) for n, s, e in indexed_layout(np.array([4, 4, 4]), 2, np.array([0, 2, 3]))]
    [('training_text_document.part-00000-of-00002', (0, 2), [0]), ('training_text_document.part-00001-of-00002', (2, 3), [0, 1])]
    """
    shards = indexed_shards(lengths, docs_per_shard=rows_per_shard)
    stem = DOCUMENT_STEM.format(split="training")
    names = (
        [stem]
        if len(shards) == 1
        else [f"{stem}.part-{i:05d}-of-{len(shards):05d}" for i in range(len(shards))]
    )
    empties = np.zeros(0, np.int64) if empty_before is None else np.asarray(empty_before, np.int64)
    out = []
    for j, (name, (lo, hi)) in enumerate(zip(names, shards, strict=True)):
        last = j == len(shards) - 1
        mine = empties[(empties >= lo) & ((empties <= hi) if last else (empties < hi))] - lo
        out.append((name, (lo, hi), mine))
    return out


def write_indexed_part(
    prefix: Path,
    samples: TokenizedSamples | Sequence[TokenizedSamples],
    *,
    vocab_size: int,
    eod_id: int,
    empty_before: np.ndarray,
    chunk_tokens: int = 1 << 24,
) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]]:
    """Every sample of ``samples`` (one prefix's documents; or several pieces of them in order, e.g. views of
    a store's shards, streamed without joining them) into ``<prefix>.bin`` / ``.idx``: the prefix's manifest
    record, and where its documents restart after EOD (``gpt_samples.eod_cuts``) for the report. Memory:
    ``chunk_tokens`` at a time and the index."""
    from longpack.packed.gpt_samples import eod_cuts

    pieces = [samples] if isinstance(samples, TokenizedSamples) else list(samples)
    if len(pieces) == 1:
        one = pieces[0]
        record = write_indexed(
            prefix, one, np.arange(len(one)), vocab_size=vocab_size, empty_before=empty_before,
            chunk_tokens=chunk_tokens,
        )  # fmt: skip
        return record, eod_cuts(one.tokens, one.offsets[:-1], one.stored_lengths(), int(eod_id))
    # several pieces: their lengths joined (small), their tokens streamed piece by piece, chunk by chunk
    lengths = np.concatenate([p.stored_lengths() for p in pieces]) if pieces else np.zeros(0, np.int64)
    dtype = token_dtype(vocab_size)

    def chunks() -> Iterator[np.ndarray]:
        for p in pieces:
            n = int(p.offsets[-1])
            for a in range(0, n, chunk_tokens):
                yield np.asarray(p.tokens[a : min(n, a + chunk_tokens)]).astype(dtype)

    record = _write_index_files(prefix, lengths, chunks(), dtype, empty_before)
    pointers, rel = [np.zeros(1, np.int64)], []
    for p in pieces:
        ptr, r = eod_cuts(p.tokens, p.offsets[:-1], p.stored_lengths(), int(eod_id))
        pointers.append(ptr[1:] + pointers[-1][-1])
        rel.append(r)
    return record, (np.concatenate(pointers), np.concatenate(rel) if rel else np.zeros(0, np.int64))


def finish_indexed_output(
    out: Path,
    written: list[tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]]],
    lengths: np.ndarray,
    settings: Any,
    provenance: Any,
    *,
    vocab_size: int,
    eos_id: int,
    empty: int = 0,
) -> dict[str, Any]:
    """``data_path.txt`` and, last, ``manifest.json`` of an indexed output whose prefixes are written
    (``written``: :func:`write_indexed_part`'s results in prefix order; ``lengths``: every document's);
    returns the manifest (see :func:`write_indexed_output`)."""
    from longpack.packed.gpt_samples import GPT_REPORT_SPLIT, gpt_samples_report
    from longpack.packed.manifest import MANIFEST_FORMAT, MANIFEST_NAME, PackManifest
    from longpack.packed.pipeline import MAX_LISTED, versions

    files = [record for record, _ in written]
    pointers, rel = [np.zeros(1, np.int64)], []
    for _, (ptr, r) in written:  # the prefixes' restarts joined into the whole output's
        pointers.append(ptr[1:] + pointers[-1][-1])
        rel.append(r)
    cuts = (np.concatenate(pointers), np.concatenate(rel) if rel else np.zeros(0, np.int64))
    prefixes = [(str((out / f["name"]).resolve()), f["stored_tokens"]) for f in files]
    atomic_write_bytes(out / DATA_PATH_NAME, (data_path(prefixes) + "\n").encode())
    samples_count = len(lengths)
    report = gpt_samples_report(
        lengths.astype(np.int32), seq_length=settings.seq_length, seed=settings.seed, cuts=cuts
    )
    tokens = int(lengths.sum())
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "versions": versions(),
        "settings": {
            "output_format": choices.INDEXED,
            "seq_length": settings.seq_length,
            "seed": settings.seed,
            "rows_per_shard": settings.rows_per_shard,
            "tokens_per_shard": None if settings.rows_per_shard else TOKENS_PER_SHARD,
            "text": provenance.text_settings,
        },
        "inputs": list(provenance.inputs),
        "tokenizer": provenance.tokenizer,
        "counts": {
            "rows_read": provenance.rows_read,
            "malformed": len(provenance.malformed),
            "samples_read": samples_count,
            "packed": samples_count,
            "truncated": 0,
            "dropped": 0,
            "empty": int(empty),
            "rows": {"training": samples_count},
        },
        "malformed": [{"source": s, "reason": r} for s, r in provenance.malformed[:MAX_LISTED]],
        "malformed_listed": min(len(provenance.malformed), MAX_LISTED),
        "malformed_unlisted": max(len(provenance.malformed) - MAX_LISTED, 0),
        "splits": {
            "training": {
                "files": files,
                "samples_in": samples_count,
                "samples_packed": samples_count,
                "rows": samples_count,
                "documents": samples_count,
                "runtime_tokens": tokens,
                "stored_tokens": tokens,
                "truncated_count": 0,
                "dropped_count": 0,
            }
        },
        "megatron": {
            "prefixes": [f["name"] for f in files],
            "weights": [round(f["stored_tokens"] / (tokens or 1), 8) for f in files],
            "data_path_file": DATA_PATH_NAME,
            "dtype": files[0]["dtype"],
            "eod_id": int(eos_id),
            "vocab_size": int(vocab_size),
            # the split the gpt_dataset report (and the hand-off) assume: every document trains
            "split": GPT_REPORT_SPLIT,
            # documents holding the EOD token inside them (its literal text): GPTDataset restarts there too
            "documents_with_inner_eod": int(np.count_nonzero(np.diff(cuts[0]) > _ends_with(cuts, lengths))),
        },
        "gpt_dataset": report.to_dict(),
        **provenance.extra,
    }
    atomic_write_bytes(out / MANIFEST_NAME, PackManifest.from_dict(manifest).to_json_bytes())
    return manifest


def indexed_summary(out: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What ``longpack pack --json`` prints for an indexed output (``data_path`` with absolute prefixes),
    with the hand-off: ``megatron_args`` (:func:`megatron_args`) and ``bridge_dataset``
    (:func:`bridge_dataset`), at the split, sequence length and seed of ``gpt_dataset``."""
    from longpack.packed.gpt_samples import GPT_REPORT_SPLIT

    mg = manifest["megatron"]
    prefixes = [str(out / p) for p in mg["prefixes"]]
    files = manifest["splits"]["training"]["files"]
    weighted = list(zip(prefixes, [f["stored_tokens"] for f in files], strict=True))
    g = manifest["gpt_dataset"]
    at = {"split": mg.get("split", GPT_REPORT_SPLIT), "seq_length": g["seq_length"], "seed": g["seed"]}
    return {
        "out": str(out),
        "finished": True,
        "output_format": choices.INDEXED,
        "format": manifest["settings"]["text"].get("detected_format"),
        "tokenizer": manifest["tokenizer"],
        "seed": manifest["settings"]["seed"],
        "counts": manifest["counts"],
        "documents": manifest["splits"]["training"]["documents"],
        "tokens": manifest["splits"]["training"]["stored_tokens"],
        "prefixes": prefixes,
        "data_path": data_path(weighted),
        "megatron_args": megatron_args(weighted, **at),
        "data_args_path": str(out / mg.get("data_path_file", DATA_PATH_NAME)),
        "bridge_dataset": bridge_dataset(weighted, **at),
        "eod_id": mg.get("eod_id"),
        "dtype": mg["dtype"],
        "gpt_dataset": manifest["gpt_dataset"],
        "malformed_listed": len(manifest["malformed"]),
        "warnings": list(manifest.get("warnings", [])),
        "skipped_inputs": len(manifest.get("skipped_inputs", [])),
    }


def indexed_summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """What ``longpack pack`` prints for an indexed (Megatron ``.bin``/``.idx``) pack, from
    :func:`indexed_summary`."""
    c, g = summary["counts"], summary["gpt_dataset"]
    lines: list[str] = []
    lines.append(f"indexed -> {summary['out']}")
    lines.append(
        f"  format: {summary['format']}   tokenizer: {summary['tokenizer'].get('name')}   dtype: {summary['dtype']}"
    )
    lines.append(
        f"  rows read {c['rows_read']}, malformed {c['malformed']}, documents {summary['documents']}, "
        f"tokens {summary['tokens']}, in {len(summary['prefixes'])} prefix(es)"
        + (f"; {c['empty']} empty row(s): no document, as preprocess_data.py" if c.get("empty") else "")
    )
    lines.append(
        f"  GPTDataset at seq_length {g['seq_length']}, seed {g['seed']}: {g['samples']} samples, "
        f"{g['documents_cut']} documents cut at sample boundaries, attention work with document masking "
        f"{g['attention_work_ratio']:.1%} of without"
    )
    for warning in summary["warnings"]:
        lines.append(f"  warning: {warning}")
    import shlex

    args = summary["megatron_args"]
    lines.append("Megatron-LM: " + shlex.join(args))
    rest = args[args.index("--split") :]
    if not any(ch.isspace() for p in summary["prefixes"] for ch in p):  # the file is split at whitespace
        lines.append(f"  or: {shlex.join(['--data-args-path', summary['data_args_path'], *rest])}")
    b = summary["bridge_dataset"]
    lines.append(
        "Megatron-Bridge GPTDatasetConfig: "
        + ", ".join(f"{k}={tuple(v) if k == 'blend' else v!r}" for k, v in b.items())
    )
    lines.append(f"  inspect it: longpack inspect {shlex.quote(summary['out'])}")
    return lines


def is_indexed(path: Path) -> bool:
    """Whether ``path`` is a Megatron indexed dataset prefix (``<path>.idx`` exists) or a folder that
    ``pack --output-format indexed`` wrote."""
    import json

    if Path(f"{path}.idx").is_file():
        return True
    manifest = Path(path) / "manifest.json"
    try:
        settings = json.loads(manifest.read_text()).get("settings", {}) if manifest.is_file() else {}
    except (OSError, ValueError, AttributeError, RecursionError):
        return False  # not ours to judge: the packed-folder reader reports a damaged manifest
    return isinstance(settings, dict) and settings.get("output_format") == choices.INDEXED


def inspect_indexed(
    path: str | Any,
    *,
    seq_length: int | None = None,
    seed: int | None = None,
    split: str = "1,0,0",
    num_samples: int | None = None,
    sample: int | None = None,
    eod_id: int | None = None,
    verify: bool = False,
) -> dict[str, Any]:
    """``longpack inspect`` of a Megatron indexed dataset: ``path`` is a prefix (``<path>.idx`` exists) or an
    indexed pack folder (its prefixes; ``seq_length`` and ``seed`` default to the manifest's). Per prefix:
    documents, tokens, dtype and the :class:`GptSamplesReport`; with ``sample``, that sample (the
    ``sample``-th GPTDataset returns, after shuffling): its documents and ``cu_seqlens``. Segments restart
    after every ``eod_id`` token, as ``GPTDataset``'s position ids (a folder: its manifest's EOD id by
    default; a bare prefix without ``eod_id``: at every document end). ``verify``: the folder's files
    against the manifest's hashes and the index (:func:`verify_indexed`); ``ok`` is false and ``problems``
    lists what does not hold."""
    import json

    from longpack.errors import ConfigError
    from longpack.packed.gpt_samples import (
        check_gpt_settings,
        eod_cuts,
        gpt_indices,
        gpt_samples_report,
        sample_cu_seqlens,
        split_documents,
    )

    path = Path(path)
    manifest: dict[str, Any] = {}
    if Path(f"{path}.idx").is_file():
        prefixes = [path]
    elif (path / "manifest.json").is_file():
        manifest = json.loads((path / "manifest.json").read_text())
        if manifest.get("settings", {}).get("output_format") != choices.INDEXED:
            raise PackedDataError(f"{path} is not an indexed pack folder", fields="folder")
        prefixes = [path / p for p in manifest["megatron"]["prefixes"]]
        seq_length = manifest["settings"]["seq_length"] if seq_length is None else seq_length
        seed = manifest["settings"]["seed"] if seed is None else seed
        eod_id = manifest["megatron"].get("eod_id") if eod_id is None else eod_id
    else:
        raise PackedDataError(
            f"{path}: neither a .bin/.idx prefix nor an indexed pack folder", fields="folder"
        )
    if seq_length is None:
        raise ConfigError(
            "seq_length is required to inspect a prefix (GPTDataset's sequence length)", fields="seq_length"
        )
    seed = choices.BRIDGE_DEFAULT_SEED if seed is None else seed
    check_gpt_settings(seq_length=seq_length, seed=seed, split=split, num_samples=num_samples)
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 0):
        raise ConfigError(f"sample {sample!r} must be a sample number >= 0", fields="sample")
    problems = verify_indexed(path, manifest) if verify and manifest else []
    out: dict[str, Any] = {
        "folder": str(path),
        "ok": not problems,
        "finished": True,
        "format": "indexed",
        "prefixes": {},
        "problems": problems,
        "verified": bool(verify and manifest),
    }
    if problems:
        return out
    for prefix in prefixes:
        data = IndexedFile(prefix)
        sizes = np.asarray(data.sequence_lengths)
        starts = np.asarray(data.sequence_pointers) // data.dtype.itemsize
        cuts = None if eod_id is None else eod_cuts(data.tokens, starts, sizes, int(eod_id))
        report = gpt_samples_report(
            sizes, seq_length=seq_length, seed=seed, split=split, num_samples=num_samples, cuts=cuts
        )
        entry: dict[str, Any] = {
            "documents": len(data),
            "tokens": int(sizes.astype(np.int64).sum()),
            "dtype": data.dtype.name,
            "gpt_dataset": report.to_dict(),
        }
        if sample is not None:
            docs = split_documents(split, len(sizes))
            doc, sidx, shuffle = gpt_indices(
                sizes, docs, seq_length=seq_length, seed=seed, num_samples=num_samples
            )
            if not len(shuffle):
                raise ConfigError(
                    f"sample {sample}: GPTDataset draws no samples from {prefix.name} at seq_length {seq_length} "
                    f"(split {split})",
                    fields="sample",
                )
            if not 0 <= sample < len(shuffle):
                raise ConfigError(f"sample {sample} is outside 0..{len(shuffle) - 1}", fields="sample")
            k = int(shuffle[sample])
            (p0, o0), (p1, _) = sidx[k], sidx[k + 1]
            entry["sample"] = {
                "index": sample,
                "unshuffled_index": k,
                "documents": [int(d) for d in doc[int(p0) : int(p1) + 1]],
                "first_document_offset": int(o0),
                "cu_seqlens": sample_cu_seqlens(
                    sizes, doc, sidx, k, seq_length=seq_length, cuts=cuts
                ).tolist(),
            }
        out["prefixes"][str(prefix)] = entry
    return out
