"""A token store: tokenized samples kept on disk as memory-mappable arrays, so that packing again (another
pack size, ``pad_seq_to_mult``, algorithm, split, seed or output format) does not tokenize again.

A store is a folder (written by ``longpack tokenize`` / ``longpack.jobs.TokenizeConfig``, or by
``longpack pack --keep-store``)::

    tokens.npy        int32 (int64 past 2**31 ids): every sample's input_ids, concatenated
    loss_mask.npy     uint8, unshifted (aligned with tokens)
    offsets.npy       int64 [N + 1]: sample i is tokens[offsets[i]:offsets[i + 1]]
    source_file.npy   int32 [N]: index into the manifest's ``files`` (the sample's input file)
    source_row.npy    int64 [N]: the sample's line (JSONL, 1-based) or row (Parquet, 0-based)
    store.json        written last: what decided the tokens and how to check them

``store.json`` records the input files (path, size, modification time, sha256), the tokenizer's identity
(its files' sha256s, EOS id, vocabulary size), the text options, the longpack version and the rest of the
tokenization report (rows read, malformed rows, columns used), so that a pack from the store writes the
same files, manifest included, as a pack from the inputs. :meth:`TokenStore.changes` says what no longer
matches (an input edited, moved or deleted; another longpack version); the jobs refuse such a store.

This module is numpy only; it knows nothing of tokenizers or packing (``longpack.jobs`` joins them).

>>> import tempfile
>>> from longpack.samples import TokenizedSamples
>>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32), loss_mask=np.ones(5, np.uint8),
...     offsets=np.array([0, 3, 5]), source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]),
...     files=("a.jsonl",))
>>> folder = Path(tempfile.mkdtemp()) / "store"
>>> _ = write_store(folder, s, {"format": "pretokenized"})
>>> store = TokenStore.open(folder)
>>> store.samples.stored_lengths().tolist(), store.samples.provenance(1), store.record["format"]
([3, 2], 'a.jsonl:2', 'pretokenized')
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from longpack._version import __version__
from longpack.errors import InputError, OutputError, OutputExistsError
from longpack.outputs import atomic_write, atomic_write_bytes, sha256_file
from longpack.samples import TokenizedSamples

__all__ = [
    "STORE_FORMAT",
    "STORE_MANIFEST",
    "TokenStore",
    "file_identity",
    "is_store",
    "store_lengths",
    "write_store",
]

#: ``format`` of ``store.json``.
STORE_FORMAT = "longpack.store/1"
#: The store's manifest, written last (its absence marks an unfinished store).
STORE_MANIFEST = "store.json"
#: The arrays of a store, in :class:`~longpack.samples.TokenizedSamples` field order.
ARRAYS = ("tokens", "loss_mask", "offsets", "source_file", "source_row")


def is_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a finished token store (a folder with ``store.json``).

    >>> is_store("no/such/folder")
    False
    """
    return (Path(path) / STORE_MANIFEST).is_file()


def file_identity(path: str | os.PathLike[str], sha256: str | None = None) -> dict[str, Any]:
    """What a store records of an input file: absolute path, size, modification time and sha256 (hashed
    here unless given).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "a.txt"; _ = p.write_bytes(b"abc")
    >>> ident = file_identity(p); ident["size_bytes"], ident["sha256"][:12]
    (3, 'ba7816bf8f01')
    """
    p = Path(path).resolve()
    st = p.stat()
    return {
        "path": str(p),
        "size_bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": sha256 if sha256 is not None else sha256_file(p),
    }


def _save_npy(fh: IO[bytes], *, array: np.ndarray) -> None:
    np.save(fh, array, allow_pickle=False)


def _store_names() -> set[str]:
    return {f"{name}.npy" for name in ARRAYS} | {STORE_MANIFEST}


def write_store(
    path: str | os.PathLike[str],
    samples: TokenizedSamples,
    record: Mapping[str, Any],
    *,
    input_files: Sequence[Mapping[str, Any]] = (),
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``samples`` as a store at ``path``: each array atomically, ``store.json`` last; return the
    manifest. ``record``: the tokenization report to keep (JSON values: format, tokenizer, text options,
    inputs, ...); ``input_files``: :func:`file_identity` of every input file, checked when the store is used.

    An existing store is replaced only with ``overwrite`` (its manifest goes first, so a store being
    replaced never reads as finished); a folder holding other files is refused.
    """
    folder = Path(path)
    if folder.exists():
        if not folder.is_dir():
            raise OutputExistsError(f"store {folder} exists and is not a folder", fields="out")
        present = {p.name for p in folder.iterdir()}
        if present and not overwrite:
            raise OutputExistsError(
                f"store folder {folder} already exists; set overwrite=True (--overwrite) to replace it or "
                "choose a new out",
                fields=("out", "overwrite"),
            )
        foreign = sorted(n for n in present if n not in _store_names() and not n.startswith("."))
        if foreign:
            raise OutputExistsError(
                f"overwrite refused: {folder} holds files that are not a token store's ({', '.join(foreign[:5])})",
                fields=("out", "overwrite"),
            )
        (folder / STORE_MANIFEST).unlink(missing_ok=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {}
        for name in ARRAYS:
            array = np.ascontiguousarray(getattr(samples, name))
            atomic_write(folder / f"{name}.npy", functools.partial(_save_npy, array=array))
            arrays[name] = {"dtype": str(array.dtype), "shape": list(array.shape)}
        manifest = {
            "format": STORE_FORMAT,
            "longpack_version": __version__,
            "samples": len(samples),
            "tokens": int(samples.offsets[-1]),
            "files": list(samples.files),
            "arrays": arrays,
            "input_files": [dict(f) for f in input_files],
            "record": dict(record),
        }
        text = json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n"
        atomic_write_bytes(folder / STORE_MANIFEST, text.encode())
    except OSError as exc:
        raise OutputError(f"cannot write the token store {folder}: {exc}", fields="out") from exc
    return manifest


@dataclass(frozen=True)
class TokenStore:
    """An opened store: ``samples`` (read-only memory maps of its arrays), ``manifest`` (``store.json``) and
    ``record`` (the tokenization report it keeps)."""

    path: Path
    manifest: dict[str, Any]
    samples: TokenizedSamples

    @property
    def record(self) -> dict[str, Any]:
        return self.manifest.get("record", {})  # type: ignore[no-any-return]

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> TokenStore:
        """Open a finished store; a folder without ``store.json``, or with arrays that do not match it, is an
        :class:`~longpack.errors.InputError` naming the store and what is wrong."""
        folder = Path(path)
        manifest_path = folder / STORE_MANIFEST
        if not folder.is_dir():
            raise InputError(
                f"token store {folder}: no such folder (make one with `longpack tokenize`)", fields="store"
            )
        if not manifest_path.is_file():
            raise InputError(
                f"token store {folder}: no {STORE_MANIFEST} (an unfinished or interrupted `longpack tokenize`, "
                "or not a store); tokenize again",
                fields="store",
            )
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(
                f"token store {folder}: {STORE_MANIFEST} cannot be read ({exc})", fields="store"
            ) from exc
        if not isinstance(manifest, dict) or manifest.get("format") != STORE_FORMAT:
            raise InputError(
                f"token store {folder}: {STORE_MANIFEST} is not a {STORE_FORMAT} manifest", fields="store"
            )
        arrays = {}
        for name in ARRAYS:
            try:
                array = np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise InputError(
                    f"token store {folder}: {name}.npy cannot be read ({exc}); the store is damaged, tokenize again",
                    fields="store",
                ) from exc
            expected = manifest.get("arrays", {}).get(name, {})
            if str(array.dtype) != expected.get("dtype") or list(array.shape) != expected.get("shape"):
                raise InputError(
                    f"token store {folder}: {name}.npy is {array.dtype}{list(array.shape)}, the manifest says "
                    f"{expected.get('dtype')}{expected.get('shape')}; the store is damaged, tokenize again",
                    fields="store",
                )
            arrays[name] = array
        try:
            samples = TokenizedSamples(**arrays, files=tuple(manifest.get("files", ())))
        except ValueError as exc:
            raise InputError(
                f"token store {folder}: {exc}; the store is damaged, tokenize again", fields="store"
            ) from exc
        return cls(path=folder, manifest=manifest, samples=samples)

    def changes(self, *, hash_all: bool = False) -> list[str]:
        """What no longer matches what decided the tokens: input files changed, moved or deleted (size and
        modification time first; a file whose time changed is hashed, and kept if its bytes did not), and
        another longpack version. Empty: the store is current.

        ``hash_all``: hash every input file, whatever its size and time say.
        """
        problems = []
        version = self.manifest.get("longpack_version")
        if version != __version__:
            problems.append(
                f"tokenized by longpack {version}, this is {__version__} (tokenization may differ between versions)"
            )
        for recorded in self.manifest.get("input_files", ()):
            path = Path(recorded["path"])
            try:
                st = path.stat()
            except OSError:
                problems.append(f"{path}: the input is gone (moved or deleted)")
                continue
            if st.st_size != recorded["size_bytes"]:
                problems.append(
                    f"{path}: size {st.st_size} bytes, was {recorded['size_bytes']} (the input changed)"
                )
                continue
            if hash_all or st.st_mtime_ns != recorded["mtime_ns"]:
                try:
                    digest = sha256_file(path)
                except OSError as exc:
                    problems.append(f"{path}: cannot be read ({exc})")
                    continue
                if digest != recorded["sha256"]:
                    problems.append(
                        f"{path}: its bytes changed (sha256 {digest[:12]}..., was {recorded['sha256'][:12]}...)"
                    )
        return problems

    def report(self, *, verify: bool = False) -> dict[str, Any]:
        """:meth:`summary` plus sample-length figures and what no longer matches (``changes``; ``verify``
        hashes every input whatever its time says); ``ok`` is whether the store can be packed."""
        lengths = self.samples.stored_lengths()
        changes = self.changes(hash_all=verify)
        return {
            "kind": "token store",
            **self.summary(),
            "stored_length": {
                "min": int(lengths.min()) if lengths.size else 0,
                "mean": round(float(lengths.mean()), 1) if lengths.size else 0.0,
                "max": int(lengths.max()) if lengths.size else 0,
            },
            "supervised_tokens": int(np.count_nonzero(self.samples.loss_mask)),
            "text": self.record.get("text"),
            "changes": changes,
            "ok": not changes,
        }

    def summary(self) -> dict[str, Any]:
        """Samples, tokens, inputs and tokenizer in a few keys (what ``longpack tokenize`` prints)."""
        record = self.record
        return {
            "store": str(self.path),
            "samples": self.manifest.get("samples"),
            "tokens": self.manifest.get("tokens"),
            "inputs": len(self.manifest.get("input_files", ())),
            "tokenizer": (record.get("tokenizer") or {}).get("name"),
            "format": record.get("format"),
            "longpack_version": self.manifest.get("longpack_version"),
        }


def store_lengths(path: str | os.PathLike[str]) -> np.ndarray:
    """The runtime lengths (int64) of a store's samples that train on at least one position: what
    ``longpack balance`` and ``longpack online-sim`` take from a store instead of a lengths file."""
    lengths = TokenStore.open(path).samples.runtime_lengths()
    return np.asarray(lengths[lengths > 0], dtype=np.int64)


def remove_store(path: str | os.PathLike[str]) -> None:
    """Delete a store folder (its manifest first)."""
    folder = Path(path)
    (folder / STORE_MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
