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
  indices (``int64``: ``0, 1, ..., N``: document ``d`` is sequences ``[idx[d], idx[d+1])``).

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
from collections.abc import Mapping, Sequence
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


def _atomic_write(path: Path, chunks: Sequence[bytes | np.ndarray]) -> None:
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
) -> dict[str, Any]:
    """Write samples ``documents`` (indices, in this order) as one Megatron indexed dataset ``<prefix>.bin`` /
    ``<prefix>.idx`` (each atomically, ``.idx`` last); return the shard's manifest record."""
    dtype = token_dtype(vocab_size)
    documents = np.asarray(documents, dtype=np.int64)
    lengths = samples.stored_lengths()[documents]
    if len(lengths) and int(lengths.max()) > np.iinfo(np.int32).max:
        raise PackedDataError(
            f"{prefix}: a document of {int(lengths.max())} tokens does not fit Megatron's int32 length"
        )
    starts = samples.offsets[:-1][documents]
    contiguous = bool((np.diff(documents) == 1).all())  # one slice of the token buffer, copied in chunks
    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    pieces: list[np.ndarray] = []
    if contiguous and len(documents):
        lo, hi = int(starts[0]), int(starts[-1] + lengths[-1])
        for a in range(lo, hi, chunk_tokens):
            pieces.append(np.asarray(samples.tokens[a : min(hi, a + chunk_tokens)]).astype(dtype))
    elif len(documents):
        pieces.append(samples.take(documents).tokens.astype(dtype))
    _atomic_write(bin_path, pieces)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths):
        np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    doc_index = np.arange(len(lengths) + 1, dtype=np.int64)
    header = (
        INDEX_MAGIC
        + struct.pack("<Q", INDEX_VERSION)
        + struct.pack("<B", DTYPE_CODES[dtype])
        + struct.pack("<Q", len(lengths))
        + struct.pack("<Q", len(doc_index))
    )
    _atomic_write(idx_path, [header, lengths.astype(np.int32), pointers, doc_index])
    tokens = int(lengths.sum())
    return {
        "name": prefix.name,
        "rows": len(lengths),  # documents
        "stored_tokens": tokens,
        "size_bytes": bin_path.stat().st_size + idx_path.stat().st_size,
        "sha256": sha256_file(bin_path),
        "idx_sha256": sha256_file(idx_path),
        "dtype": dtype.name,
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
) -> dict[str, Any]:
    """Write every sample of ``samples`` as a document into sharded Megatron indexed datasets in the prepared
    folder ``out``, then ``data_path.txt`` and, last, ``manifest.json``; return the manifest.

    ``settings``: the job's ``PackSettings`` (``seq_length``, ``seed`` and ``rows_per_shard`` = documents per
    shard); ``provenance``: its ``Provenance``. The manifest has the layout of a packed folder's (counts,
    inputs, malformed rows, one record per shard) plus ``megatron`` (prefixes, ``data_path``, dtype, EOD id)
    and ``gpt_dataset``: what ``GPTDataset`` makes of the data at ``seq_length`` / ``seed``.
    """
    from longpack.packed.gpt_samples import gpt_samples_report
    from longpack.packed.manifest import MANIFEST_FORMAT, MANIFEST_NAME, PackManifest
    from longpack.packed.pipeline import MAX_LISTED, versions

    lengths = samples.stored_lengths()
    shards = indexed_shards(lengths, docs_per_shard=settings.rows_per_shard)
    stem = DOCUMENT_STEM.format(split="training")
    names = (
        [stem]
        if len(shards) == 1
        else [f"{stem}.part-{i:05d}-of-{len(shards):05d}" for i in range(len(shards))]
    )
    files = [
        write_indexed(out / name, samples, np.arange(lo, hi), vocab_size=vocab_size)
        for name, (lo, hi) in zip(names, shards, strict=True)
    ]
    prefixes = [(str((out / f["name"]).resolve()), f["stored_tokens"]) for f in files]
    atomic_write_bytes(out / DATA_PATH_NAME, (data_path(prefixes) + "\n").encode())
    report = gpt_samples_report(lengths.astype(np.int32), seq_length=settings.seq_length, seed=settings.seed)
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
            "samples_read": len(samples),
            "packed": len(samples),
            "truncated": 0,
            "dropped": 0,
            "rows": {"training": len(samples)},
        },
        "malformed": [{"source": s, "reason": r} for s, r in provenance.malformed[:MAX_LISTED]],
        "malformed_listed": min(len(provenance.malformed), MAX_LISTED),
        "malformed_unlisted": max(len(provenance.malformed) - MAX_LISTED, 0),
        "splits": {
            "training": {
                "files": files,
                "samples_in": len(samples),
                "samples_packed": len(samples),
                "rows": len(samples),
                "documents": len(samples),
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
        },
        "gpt_dataset": report.to_dict(),
        **provenance.extra,
    }
    atomic_write_bytes(out / MANIFEST_NAME, PackManifest.from_dict(manifest).to_json_bytes())
    return manifest


def indexed_summary(out: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What ``longpack pack --json`` prints for an indexed output (``data_path`` with absolute prefixes)."""
    mg = manifest["megatron"]
    prefixes = [str(out / p) for p in mg["prefixes"]]
    files = manifest["splits"]["training"]["files"]
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
        "data_path": data_path(list(zip(prefixes, [f["stored_tokens"] for f in files], strict=True))),
        "dtype": mg["dtype"],
        "gpt_dataset": manifest["gpt_dataset"],
        "malformed_listed": len(manifest["malformed"]),
        "warnings": list(manifest.get("warnings", [])),
        "skipped_inputs": len(manifest.get("skipped_inputs", [])),
    }


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
    verify: bool = False,
) -> dict[str, Any]:
    """``longpack inspect`` of a Megatron indexed dataset: ``path`` is a prefix (``<path>.idx`` exists) or an
    indexed pack folder (its prefixes; ``seq_length`` and ``seed`` default to the manifest's). Per prefix:
    documents, tokens, dtype and the :class:`GptSamplesReport`; with ``sample``, that sample (the
    ``sample``-th GPTDataset returns, after shuffling): its documents and ``cu_seqlens``. ``verify``: the
    folder's files against the manifest's hashes and the index (:func:`verify_indexed`); ``ok`` is false
    and ``problems`` lists what does not hold."""
    import json

    from longpack.errors import ConfigError
    from longpack.packed.gpt_samples import (
        check_gpt_settings,
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
        report = gpt_samples_report(
            sizes, seq_length=seq_length, seed=seed, split=split, num_samples=num_samples
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
                "cu_seqlens": sample_cu_seqlens(sizes, doc, sidx, k, seq_length=seq_length).tolist(),
            }
        out["prefixes"][str(prefix)] = entry
    return out
