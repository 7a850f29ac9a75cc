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

A *sharded* store (``longpack.store/2``, written by ``longpack tokenize --shard-bytes`` / ``--backend ray``)
holds the same arrays per shard, each shard written by whichever writer (process, Ray task, machine) took
it, with its own ``shard.json`` written last::

    shards/00000/tokens.npy ... source_row.npy, shard.json     (shard 0: its samples, in input order)
    shards/00001/...
    store.json        written last, by one process, once every shard is there (:func:`finish_store`)

A shard's ``source_file`` indexes the store's ``files`` (the whole input list, the same in every shard), so
readers see one store: :meth:`TokenStore.open` gives the samples of every shard in shard order (one shard:
its memory maps; several: joined once into memory), the same samples whatever the number of shards or
writers. A single-array store (``longpack.store/1``) still reads.

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
from longpack.outputs import (
    WRITE_ERRNOS,
    ArrayWriter,
    atomic_write,
    atomic_write_bytes,
    sha256_file,
    write_error,
)
from longpack.samples import TokenizedSamples

__all__ = [
    "SHARDED_FORMAT",
    "SHARD_MANIFEST",
    "STORE_FORMAT",
    "STORE_MANIFEST",
    "TokenStore",
    "check_record",
    "check_store",
    "file_identity",
    "finish_store",
    "finished_shards",
    "is_store",
    "shard_folder",
    "store_lengths",
    "write_shard",
    "write_store",
]

#: ``format`` of ``store.json``.
STORE_FORMAT = "longpack.store/1"
#: ``format`` of a sharded store's ``store.json``.
SHARDED_FORMAT = "longpack.store/2"
#: The store's manifest, written last (its absence marks an unfinished store).
STORE_MANIFEST = "store.json"
#: A shard's manifest, written last by the shard's writer (its absence marks an unfinished shard).
SHARD_MANIFEST = "shard.json"
#: The folder of a sharded store's shards.
SHARDS_DIR = "shards"
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
    np.save(ArrayWriter(fh), array, allow_pickle=False)  # fh.write: a full disk keeps its errno


def _store_names() -> set[str]:
    return {f"{name}.npy" for name in ARRAYS} | {STORE_MANIFEST, SHARDS_DIR}


def _write_arrays(folder: Path, samples: TokenizedSamples) -> dict[str, Any]:
    """Every array of ``samples`` into ``folder`` (each atomically); their dtypes and shapes."""
    arrays: dict[str, Any] = {}
    for name in ARRAYS:
        array = np.ascontiguousarray(getattr(samples, name))
        atomic_write(folder / f"{name}.npy", functools.partial(_save_npy, array=array))
        arrays[name] = {"dtype": str(array.dtype), "shape": list(array.shape)}
    return arrays


def _files_key(files: Sequence[str]) -> str:
    """A short digest of the input list (every shard of a store must index the same one)."""
    import hashlib

    return hashlib.sha256(json.dumps(list(files)).encode()).hexdigest()[:16]


def shard_folder(store: str | os.PathLike[str], index: int) -> Path:
    """The folder of shard ``index`` of the (sharded) store at ``store``.

    >>> shard_folder("s", 3).as_posix()
    's/shards/00003'
    """
    return Path(store) / SHARDS_DIR / f"{index:05d}"


def write_shard(
    store: str | os.PathLike[str],
    index: int,
    samples: TokenizedSamples,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write shard ``index`` of a sharded store (any writer, any process or machine that sees the folder):
    its arrays, then its ``shard.json`` (``meta``: JSON values the writer keeps with it, e.g. its share of
    the tokenization report). A shard written again is replaced whole (its manifest goes first). Returns
    the shard manifest. ``samples.files`` must be the store's whole input list."""
    folder = shard_folder(store, index)
    try:
        (folder / SHARD_MANIFEST).unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = _write_arrays(folder, samples)
        manifest = {
            "format": SHARDED_FORMAT,
            "index": int(index),
            "samples": len(samples),
            "tokens": int(samples.offsets[-1]),
            "files_key": _files_key(samples.files),
            "arrays": arrays,
            "meta": dict(meta or {}),
        }
        text = json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n"
        atomic_write_bytes(folder / SHARD_MANIFEST, text.encode())
    except OSError as exc:
        from longpack.outputs import WRITE_ERRNOS, write_error

        if exc.errno in WRITE_ERRNOS:  # a full disk: the shards finished before are kept by resume
            error = write_error(exc, Path(store), manifest=STORE_MANIFEST, again="tokenize", option="resume")
            raise type(error)(f"shard {index}: {error}", fields=error.fields) from exc
        raise OutputError(
            f"cannot write shard {index} of the token store {store}: {exc}", fields="out"
        ) from exc
    return manifest


def finished_shards(store: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Shard index -> shard manifest of every shard of ``store`` whose ``shard.json`` is there and reads
    (what a resumed run keeps; an unreadable one counts as unfinished)."""
    root = Path(store) / SHARDS_DIR
    out: dict[int, dict[str, Any]] = {}
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir()):
        try:
            manifest = json.loads((folder / SHARD_MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("format") == SHARDED_FORMAT:
            out[int(manifest["index"])] = manifest
    return out


def finish_store(
    store: str | os.PathLike[str],
    shards: int,
    files: Sequence[str],
    record: Mapping[str, Any],
    *,
    input_files: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Publish a sharded store: check that shards ``0 .. shards - 1`` are all there and index ``files``,
    then write ``store.json`` (last). Returns the manifest. A missing shard is an :class:`OutputError`
    naming it (the run is unfinished: run it again with resume)."""
    folder = Path(store)
    done = finished_shards(folder)
    missing = [i for i in range(shards) if i not in done]
    if missing:
        raise OutputError(
            f"token store {folder}: shard(s) {missing[:10]} of {shards} are not finished; run the tokenize "
            "again with resume (--resume) to write them",
            fields="out",
        )
    key = _files_key(files)
    listed = []
    dtype = None
    for i in range(shards):
        m = done[i]
        if m["files_key"] != key:
            raise OutputError(
                f"token store {folder}: shard {i} indexes another input list than this store's; its "
                "writers did not tokenize the same inputs",
                fields="out",
            )
        token_dtype = m["arrays"]["tokens"]["dtype"]
        if dtype not in (None, token_dtype):
            raise OutputError(
                f"token store {folder}: shard {i} holds {token_dtype} tokens, shard 0 {dtype}", fields="out"
            )
        dtype = token_dtype
        listed.append({"name": f"{SHARDS_DIR}/{i:05d}", "samples": m["samples"], "tokens": m["tokens"]})
    manifest = {
        "format": SHARDED_FORMAT,
        "longpack_version": __version__,
        "samples": sum(s["samples"] for s in listed),
        "tokens": sum(s["tokens"] for s in listed),
        "files": list(files),
        "shards": listed,
        "token_dtype": dtype,
        "input_files": [dict(f) for f in input_files],
        "record": dict(record),
    }
    text = json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n"
    try:
        atomic_write_bytes(folder / STORE_MANIFEST, text.encode())
    except OSError as exc:
        raise OutputError(f"cannot write the token store {folder}: {exc}", fields="out") from exc
    return manifest


def write_store(
    path: str | os.PathLike[str],
    samples: TokenizedSamples,
    record: Mapping[str, Any],
    *,
    input_files: Sequence[Mapping[str, Any]] = (),
    overwrite: bool = False,
    field: str = "out",
) -> dict[str, Any]:
    """Write ``samples`` as a store at ``path``: each array atomically, ``store.json`` last; return the
    manifest. ``record``: the tokenization report to keep (JSON values: format, tokenizer, text options,
    inputs, ...); ``input_files``: :func:`file_identity` of every input file, checked when the store is used.

    An existing store is replaced only with ``overwrite`` (its manifest goes first, so a store being
    replaced never reads as finished); a folder holding other files is refused. ``field``: the setting
    that named the folder (``out``, or ``keep_store`` for a pack that keeps its tokens), named in errors.
    """
    folder = Path(path)
    if folder.exists():
        if not folder.is_dir():
            raise OutputExistsError(f"{field} {folder} exists and is not a folder", fields=field)
        present = {p.name for p in folder.iterdir()}
        if present and not overwrite:
            raise OutputExistsError(
                f"{field} {folder}: a store folder already exists there; set overwrite=True to replace it or "
                f"choose a new {field}",
                fields=(field, "overwrite"),
            )
        foreign = sorted(n for n in present if n not in _store_names() and not n.startswith("."))
        if foreign:
            raise OutputExistsError(
                f"overwrite refused: {field} {folder} holds files that are not a token store's "
                f"({', '.join(foreign[:5])}); choose a new {field}",
                fields=(field, "overwrite"),
            )
        (folder / STORE_MANIFEST).unlink(missing_ok=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(folder / SHARDS_DIR, ignore_errors=True)  # a sharded store replaced by one set
        arrays = _write_arrays(folder, samples)
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
        if exc.errno in WRITE_ERRNOS:  # a full disk, a quota, a file-size limit: as pack says it
            raise write_error(exc, folder, field=field, manifest=STORE_MANIFEST, again="run") from exc
        raise OutputError(f"{field} {folder}: cannot write the token store: {exc}", fields=field) from exc
    return manifest


def _join_into(parts: Sequence[TokenizedSamples], folder: Path) -> TokenizedSamples:
    """The shards' samples joined into memory-mapped ``.npy`` files in ``folder`` (one shard in memory at a
    time); the same values as ``TokenizedSamples.concatenate``. Every shard indexes the same ``files``."""
    folder.mkdir(parents=True, exist_ok=True)
    lengths = np.concatenate([p.stored_lengths() for p in parts])
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out: dict[str, np.ndarray] = {"offsets": offsets}
    for name in ("tokens", "loss_mask", "source_file", "source_row"):
        dtype = np.result_type(*[getattr(p, name).dtype for p in parts])
        total = sum(len(getattr(p, name)) for p in parts)
        path = folder / f"joined-{name}.npy"
        target = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(total,))
        at = 0
        for p in parts:
            values = getattr(p, name)
            target[at : at + len(values)] = values
            at += len(values)
        target.flush()
        del target
        out[name] = np.load(path, mmap_mode="r")
    return TokenizedSamples(**out, files=parts[0].files)


def _slice(part: TokenizedSamples, a: int, b: int) -> TokenizedSamples:
    """Samples ``a .. b - 1`` of ``part``, re-based (views of its arrays)."""
    lo, hi = int(part.offsets[a]), int(part.offsets[b])
    return TokenizedSamples(
        tokens=part.tokens[lo:hi],
        loss_mask=part.loss_mask[lo:hi],
        offsets=np.asarray(part.offsets[a : b + 1]) - lo,
        source_file=part.source_file[a:b],
        source_row=part.source_row[a:b],
        files=part.files,
    )


def _open_arrays(
    folder: Path,
    manifest: Mapping[str, Any],
    files: tuple[str, ...],
    *,
    where: str,
    check: Any = None,
) -> TokenizedSamples:
    """The memory-mapped arrays of one array set (a store, or one shard of it), checked against its
    manifest's dtypes and shapes. (Checks of the values belong here too: every reader comes through it.)"""
    arrays = {}
    for name in ARRAYS:
        try:
            array = np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(
                f"token store {where}: {name}.npy cannot be read ({exc}); the store is damaged, tokenize again",
                fields="store",
            ) from exc
        expected = manifest.get("arrays", {}).get(name, {})
        if str(array.dtype) != expected.get("dtype") or list(array.shape) != expected.get("shape"):
            raise InputError(
                f"token store {where}: {name}.npy is {array.dtype}{list(array.shape)}, the manifest says "
                f"{expected.get('dtype')}{expected.get('shape')}; the store is damaged, tokenize again",
                fields="store",
            )
        arrays[name] = array
    if check is not None:  # the values, before the arrays are taken as samples
        check(arrays)
    try:
        samples = TokenizedSamples(**arrays, files=files)
    except ValueError as exc:
        raise InputError(
            f"token store {where}: {exc}; the store is damaged, tokenize again", fields="store"
        ) from exc
    return samples


@dataclass(frozen=True)
class TokenStore:
    """An opened store: ``samples`` (read-only memory maps of its arrays), ``manifest`` (``store.json``) and
    ``record`` (the tokenization report it keeps)."""

    path: Path
    manifest: dict[str, Any]
    samples: TokenizedSamples
    #: The store's array sets in order (one per shard; a one-array store: its samples), memory-mapped.
    parts: tuple[TokenizedSamples, ...] = ()

    @property
    def record(self) -> dict[str, Any]:
        return self.manifest.get("record", {})  # type: ignore[no-any-return]

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, join: bool = True, join_into: Path | None = None
    ) -> TokenStore:
        """Open a finished store; a folder without ``store.json``, or with arrays that do not match it, is an
        :class:`~longpack.errors.InputError` naming the store and what is wrong. ``join=False``: a sharded
        store's ``samples`` stay unjoined (``None``; read it by :attr:`parts` / :meth:`samples_range`).
        ``join_into``: a scratch folder where several shards are joined into memory-mapped files (copied
        shard by shard) instead of into memory."""
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
        if not isinstance(manifest, dict) or manifest.get("format") not in (STORE_FORMAT, SHARDED_FORMAT):
            raise InputError(
                f"token store {folder}: {STORE_MANIFEST} is not a {STORE_FORMAT} or {SHARDED_FORMAT} manifest",
                fields="store",
            )
        files = tuple(manifest.get("files", ()))
        if manifest["format"] == SHARDED_FORMAT:
            parts = []
            for shard in manifest.get("shards", ()):
                sub = folder / str(shard.get("name"))
                try:
                    shard_manifest = json.loads((sub / SHARD_MANIFEST).read_text(encoding="utf-8"))
                except (OSError, ValueError) as exc:
                    raise InputError(
                        f"token store {folder}: {sub.name}/{SHARD_MANIFEST} cannot be read ({exc}); the store "
                        "is damaged, tokenize again",
                        fields="store",
                    ) from exc
                parts.append(
                    _open_arrays(
                        sub,
                        shard_manifest,
                        files,
                        where=f"{folder} shard {sub.name}",
                        check=lambda arrays: _check_part(folder, manifest, arrays),
                    )
                )
            if not join:
                return cls(path=folder, manifest=manifest, samples=None, parts=tuple(parts))  # type: ignore[arg-type]
            if len(parts) == 1:
                samples = parts[0]
            elif join_into is not None:
                samples = _join_into(parts, Path(join_into))
            else:
                samples = TokenizedSamples.concatenate(parts)
            return cls(path=folder, manifest=manifest, samples=samples, parts=tuple(parts))
        samples = _open_arrays(
            folder,
            manifest,
            files,
            where=str(folder),
            check=lambda arrays: check_store(folder, manifest, arrays),
        )
        return cls(path=folder, manifest=manifest, samples=samples, parts=(samples,))

    def lengths(self) -> np.ndarray:
        """Every sample's stored length (int64), read from the shards' offsets (no tokens read)."""
        parts = [p.stored_lengths() for p in self.parts]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def samples_pieces(self, lo: int, hi: int) -> list[TokenizedSamples]:
        """Samples ``lo .. hi - 1`` of the store (in store order) as views of the shards that hold them, one
        piece per shard: nothing is copied."""
        pieces = []
        start = 0
        for part in self.parts:
            n = len(part)
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                pieces.append(_slice(part, a - start, b - start))
            start += n
        return pieces

    def samples_range(self, lo: int, hi: int) -> TokenizedSamples:
        """Samples ``lo .. hi - 1`` as one set: memory maps of one shard when they lie in one, else their
        slices of each shard joined (a copy of just those)."""
        pieces = self.samples_pieces(lo, hi)
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:
            return _slice(self.parts[0], 0, 0)
        return TokenizedSamples.concatenate(pieces)

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
        lengths = self.lengths()  # from the shards' offsets: no shard is joined to report
        changes = self.changes(hash_all=verify)
        return {
            "kind": "token store",
            **self.summary(),
            "stored_length": {
                "min": int(lengths.min()) if lengths.size else 0,
                "mean": round(float(lengths.mean()), 1) if lengths.size else 0.0,
                "max": int(lengths.max()) if lengths.size else 0,
            },
            "supervised_tokens": sum(int(np.count_nonzero(p.loss_mask)) for p in self.parts),
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
            **({"shards": len(self.manifest["shards"])} if "shards" in self.manifest else {}),
        }


def store_lengths(path: str | os.PathLike[str]) -> np.ndarray:
    """The runtime lengths (int64) of a store's samples that train on at least one position: what
    ``longpack balance`` and ``longpack online-sim`` take from a store instead of a lengths file."""
    lengths = TokenStore.open(path).samples.runtime_lengths()
    return np.asarray(lengths[lengths > 0], dtype=np.int64)


#: What ``check_store`` accepts of each array: its dtypes (as ``write_store`` writes them).
_DTYPES = {
    "tokens": ("int32", "int64"),
    "loss_mask": ("uint8",),
    "offsets": ("int64",),
    "source_file": ("int32",),
    "source_row": ("int64",),
}
#: The record keys a pack from the store reads, and their JSON types.
_RECORD_KEYS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "rows_read": int,
    "malformed": list,
    "tokenizer": dict,
    "inputs": list,
    "skipped_inputs": list,
    "warnings": list,
    "text": dict,
}
_CHUNK = 1 << 24  # values per pass when looking for the first bad one (bounded temporaries)


def _first(mask_of: Any, array: np.ndarray) -> int:
    """Index of the first value of ``array`` where ``mask_of(chunk)`` holds (chunked), else -1."""
    for lo in range(0, len(array), _CHUNK):
        hits = np.flatnonzero(mask_of(np.asarray(array[lo : lo + _CHUNK])))
        if hits.size:
            return lo + int(hits[0])
    return -1


def check_store(folder: Path, manifest: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Refuse a token store whose arrays or manifest cannot be what ``write_store`` wrote: every array's
    dtype and shape, ``offsets`` (start at 0, never decrease, end at the token count), token ids (in
    ``[0, vocab_size)`` of the recorded tokenizer), the loss mask (0 or 1), the source indices (a file
    the manifest lists, a row >= 0) and the manifest keys a pack reads. One :class:`InputError` naming the
    file, the field, the first bad index and value, and the fix; nothing is packed, swept, planned or
    balanced from such a store. :meth:`TokenStore.open` calls it, so every command that reads a store
    (``pack --store``, ``sweep``, ``plan --data``, ``balance``, ``online-sim``, ``inspect --verify``) does.

    >>> from longpack.samples import TokenizedSamples
    >>> import tempfile
    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32), loss_mask=np.ones(5, np.uint8),
    ...     offsets=np.array([0, 3, 5]), source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]),
    ...     files=("a.jsonl",))
    >>> folder = Path(tempfile.mkdtemp()) / "store"
    >>> m = write_store(folder, s, {"tokenizer": {"vocab_size": 7}})  # id 7 is past this vocabulary
    >>> check_store(folder, m, {n: getattr(s, n) for n in ARRAYS})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    longpack.errors.InputError: token store ...: tokens.npy: token id 7 at index 3 is not below the tokenizer's vocab_size 7; ...
    """

    def bad(where: str, what: str) -> InputError:
        return InputError(
            f"token store {folder}: {where}: {what}; the store is damaged or was not written by longpack: "
            "tokenize again (longpack tokenize ... --overwrite)",
            fields="store",
        )

    for key in ("samples", "tokens"):
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(STORE_MANIFEST, f"{key!r} is {value!r}, not a count")
    files = manifest.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise bad(STORE_MANIFEST, f"'files' is {files!r}, not a list of paths")
    inputs = manifest.get("input_files", [])
    keys = ("path", "size_bytes", "mtime_ns", "sha256")
    if not isinstance(inputs, list) or not all(
        isinstance(i, dict) and all(k in i for k in keys) for i in inputs
    ):
        raise bad(STORE_MANIFEST, f"'input_files' must list {{{', '.join(keys)}}} of each input")
    record = manifest.get("record")
    if not isinstance(record, dict):
        raise bad(STORE_MANIFEST, f"'record' is {type(record).__name__}, not the tokenization report")
    n, n_tokens = manifest["samples"], manifest["tokens"]
    want = {"tokens": n_tokens, "loss_mask": n_tokens, "offsets": n + 1, "source_file": n, "source_row": n}
    for name in ARRAYS:
        array = arrays[name]
        if str(array.dtype) not in _DTYPES[name]:
            raise bad(f"{name}.npy", f"dtype {array.dtype}, expected {' or '.join(_DTYPES[name])}")
        if array.shape != (want[name],):
            raise bad(
                f"{name}.npy", f"shape {list(array.shape)}, expected [{want[name]}] (from {STORE_MANIFEST})"
            )
    offsets = np.asarray(arrays["offsets"])
    if int(offsets[0]) != 0:
        raise bad("offsets.npy", f"offsets[0] is {int(offsets[0])}, not 0")
    if int(offsets[-1]) != n_tokens:
        raise bad("offsets.npy", f"offsets[{n}] is {int(offsets[-1])}, not the token count {n_tokens}")
    steps = np.diff(offsets)
    if steps.size and int(steps.min()) < 0:
        i = int(np.flatnonzero(steps < 0)[0])
        raise bad(
            "offsets.npy",
            f"offsets decrease at index {i + 1} ({int(offsets[i])} then {int(offsets[i + 1])}): "
            "sample offsets must never decrease",
        )
    tokens = arrays["tokens"]
    vocab = (
        (record.get("tokenizer") or {}).get("vocab_size")
        if isinstance(record.get("tokenizer"), dict)
        else None
    )
    if tokens.size:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0:
            i = _first(lambda c: c < 0, tokens)
            raise bad("tokens.npy", f"token id {int(tokens[i])} at index {i} is negative")
        if isinstance(vocab, int) and high >= vocab:
            i = _first(lambda c: c >= vocab, tokens)
            raise bad(
                "tokens.npy",
                f"token id {int(tokens[i])} at index {i} is not below the tokenizer's vocab_size {vocab}",
            )
    mask = arrays["loss_mask"]
    if mask.size and int(mask.max()) > 1:
        i = _first(lambda c: c > 1, mask)
        raise bad("loss_mask.npy", f"value {int(mask[i])} at index {i}; a loss mask holds 0 or 1")
    source_file, source_row = arrays["source_file"], arrays["source_row"]
    if source_file.size and (int(source_file.min()) < 0 or int(source_file.max()) >= len(files)):
        i = _first(lambda c: (c < 0) | (c >= len(files)), source_file)
        raise bad(
            "source_file.npy",
            f"file index {int(source_file[i])} of sample {i} is not one of the {len(files)} files listed",
        )
    if source_row.size and int(source_row.min()) < 0:
        i = _first(lambda c: c < 0, source_row)
        raise bad("source_row.npy", f"row {int(source_row[i])} of sample {i} is negative")


def _check_part(folder: Path, manifest: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """:func:`check_store` on one shard: the store's manifest with the shard's own counts."""
    offsets = np.asarray(arrays["offsets"])
    counts = {
        "samples": int(offsets.size - 1) if offsets.ndim == 1 else -1,
        "tokens": int(offsets[-1]) if offsets.ndim == 1 and offsets.size else 0,
    }
    check_store(folder, {**manifest, **counts}, arrays)


def check_record(folder: Path, record: Mapping[str, Any]) -> None:
    """Refuse a store whose tokenization report lacks what a pack from it reads (format, rows read,
    malformed rows, tokenizer, inputs, warnings, text options): an :class:`InputError` naming the field.

    >>> check_record(Path("st"), {"format": "pretokenized"})
    Traceback (most recent call last):
    ...
    longpack.errors.InputError: token store st: store.json: record field 'rows_read' is None, not a int; the store is damaged or was not written by longpack: tokenize again (longpack tokenize ... --overwrite)
    """
    for key, kind in _RECORD_KEYS.items():
        value = record.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InputError(
                f"token store {folder}: {STORE_MANIFEST}: record field {key!r} is {value!r}, not a "
                f"{getattr(kind, '__name__', kind)}; the store is damaged or was not written by longpack: "
                "tokenize again (longpack tokenize ... --overwrite)",
                fields="store",
            )


def remove_store(path: str | os.PathLike[str]) -> None:
    """Delete a store folder (its manifest first)."""
    folder = Path(path)
    (folder / STORE_MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
