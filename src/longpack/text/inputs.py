"""Finding input files and cutting them into chunks of rows (the unit of parallel work).

Input forms (each has a page in the docs' input guide):

- JSON Lines (``.jsonl``, ``.json``, ``.ndjson``), also compressed (``.gz``, ``.zst``/``.zstd``); a ``.json``
  file whose text is one JSON array of rows (a ShareGPT dump) is read element by element;
- Parquet (``.parquet``, ``.pq``), including ``datasets`` 5.x ``Json`` columns (JSON text per row);
- Hugging Face ``datasets`` folders written by ``save_to_disk`` (read through the ``datasets`` library, the
  ``hf`` extra), and hub dataset ids (``hf:org/name[:split]``) resolved offline from the local HF cache.

Folders are searched recursively, following symlinked folders (each real folder once, so a symlink loop
ends); globs (``data/**/*.jsonl``) are matched by the same walk. Nothing found there is skipped without a
word: :func:`find_inputs` returns every file it did not read, with the reason.

Chunk boundaries depend only on the file contents (JSONL: about ``JSONL_CHUNK_BYTES`` of decompressed text
cut at a newline; Parquet: ``PARQUET_CHUNK_ROWS`` rows), never on the worker count or the compression, so
the output is the same for any number of workers and for a file and its ``.gz``/``.zst`` copy.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import hashlib
import io
import json
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from longpack.text.errors import InputError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
#: Plain-text files: one document each (``format="text"``), read when named or globbed, not from folders.
TEXT_SUFFIXES = (".txt",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSONL_CHUNK_BYTES = 1 << 20
PARQUET_CHUNK_ROWS = 2048
#: Deepest JSON nesting a row may have; deeper rows are malformed (json.loads would hit Python's recursion
#: limit near 1,000 levels, and templates recurse over the values too).
MAX_JSON_DEPTH = 100
HF_DATASET_FILES = ("dataset_info.json", "state.json")
HF_DATASET_DICT_FILE = "dataset_dict.json"
HUB_PREFIX = "hf:"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.-]+)?$")
_SUPPORTED = ", ".join((*JSONL_SUFFIXES, *PARQUET_SUFFIXES)) + " (JSON Lines also as .gz / .zst)"


@dataclass(frozen=True)
class InputFile:
    """One input to read: a file, or a ``datasets`` folder (``kind="hf"``).

    ``label`` is how samples name their source (``label:row``): the absolute path, for hub datasets the
    file inside the local cache snapshot.
    """

    path: Path
    kind: str  # "jsonl" | "parquet" | "hf"
    compression: str | None = None  # "gzip" | "zstd"

    @property
    def label(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class InputListing:
    """What :func:`find_inputs` found: the inputs to read and every path it saw but does not read."""

    files: tuple[InputFile, ...]
    skipped: tuple[tuple[str, str], ...] = field(default=())

    def skipped_summary(self) -> dict[str, int]:
        """How many paths were skipped for each reason.

        >>> InputListing((), (("a.txt", "not a data file (.txt)"), ("b.txt", "not a data file (.txt)"))).skipped_summary()
        {'not a data file (.txt)': 2}
        """
        out: dict[str, int] = {}
        for _, reason in self.skipped:
            out[reason] = out.get(reason, 0) + 1
        return out


def compression_of(path: Path) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None`` from the last suffix.

    >>> compression_of(Path("a.jsonl.gz")), compression_of(Path("a.jsonl.ZST")), compression_of(Path("a.jsonl"))
    ('gzip', 'zstd', None)
    """
    return COMPRESSION_SUFFIXES.get(path.suffix.lower())


def _data_suffix(path: Path) -> str:
    name = path.name.lower()
    if compression_of(path) is not None:
        name = name[: -len(path.suffix)]
    return Path(name).suffix


def is_hf_dataset_folder(path: Path) -> bool:
    """A folder written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``)."""
    return path.is_dir() and (
        all((path / f).is_file() for f in HF_DATASET_FILES) or (path / HF_DATASET_DICT_FILE).is_file()
    )


def input_kind(path: Path) -> str:
    """``"jsonl"``, ``"parquet"``, ``"txt"`` (one plain-text document) or ``"hf"`` (a ``datasets`` folder)
    from the suffix (or the folder).

    >>> input_kind(Path("a/train.JSONL")), input_kind(Path("b.pq")), input_kind(Path("c.jsonl.gz"))
    ('jsonl', 'parquet', 'jsonl')
    >>> input_kind(Path("d.parquet.gz"))
    Traceback (most recent call last):
    ...
    longpack.errors.InputError: d.parquet.gz: a compressed Parquet file cannot be read; Parquet compresses its pages itself: decompress it (gunzip d.parquet.gz)
    """
    suffix = _data_suffix(path)
    compressed = compression_of(path) is not None
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        if compressed:
            tool = "gunzip" if compression_of(path) == "gzip" else "unzstd"
            raise InputError(
                f"{path}: a compressed Parquet file cannot be read; Parquet compresses its pages itself: "
                f"decompress it ({tool} {path})"
            )
        return "parquet"
    if suffix in TEXT_SUFFIXES and not compressed:
        return "txt"
    if is_hf_dataset_folder(path):
        return "hf"
    raise InputError(
        f"{path}: unsupported file type {''.join(path.suffixes[-2:]) or path.name!r}; inputs must be JSON Lines "
        f"or Parquet: {_SUPPORTED}, a datasets save_to_disk folder or a hub id (hf:org/name)"
    )


def _unsupported_reason(path: Path, *, in_folder: bool = False) -> str | None:
    try:
        kind = input_kind(path)
    except InputError:
        suffix = "".join(path.suffixes[-2:]) or "no suffix"
        return f"not a data file ({suffix})"
    if in_folder and kind == "txt":  # a README next to the data is no document: name or glob .txt files
        return "not a data file (.txt)"
    return None


# -- walking folders and globs (symlinks followed, loops cut) ----------------------------------------------


class _Walker:
    """A depth-first walk that follows symlinked folders and enters each real folder once."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.skipped: list[tuple[str, str]] = []

    def enter(self, folder: Path) -> list[os.DirEntry[str]] | None:
        try:
            st = folder.stat()
        except OSError as e:
            self.skipped.append((str(folder), f"cannot read ({e.strerror})"))
            return None
        key = (st.st_dev, st.st_ino)
        if key in self.seen:
            if folder.is_symlink():
                self.skipped.append(
                    (str(folder), "symlink to a folder already searched (loop or second link)")
                )
            return None
        self.seen.add(key)
        try:
            with os.scandir(folder) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError as e:
            self.skipped.append((str(folder), f"cannot list ({e.strerror})"))
            return None

    def entries(
        self, root: Path, prefix: tuple[str, ...] = ()
    ) -> Iterator[tuple[tuple[str, ...], Path, str]]:
        """``(relative parts, path, "file" | "dir" | "hf")`` of everything under ``root`` (hidden names and
        ``datasets`` folders are not descended into)."""
        listing = self.enter(root)
        if listing is None:
            return
        for entry in listing:
            path = Path(entry.path)
            parts = (*prefix, entry.name)
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
                is_file = not is_dir and entry.is_file(follow_symlinks=True)
            except OSError as e:
                self.skipped.append((str(path), f"cannot read ({e.strerror})"))
                continue
            if is_dir:
                if is_hf_dataset_folder(path):
                    yield parts, path, "hf"
                    continue
                yield parts, path, "dir"
                if entry.name.startswith("."):
                    self.skipped.append((str(path), "hidden folder, not searched"))
                    continue
                yield from self.entries(path, parts)
            elif is_file:
                yield parts, path, "file"
            elif entry.is_symlink():
                self.skipped.append((str(path), "broken symlink"))
            else:
                self.skipped.append((str(path), "not a regular file"))


def _segment_regex(segment: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(segment), re.DOTALL)


def _match_parts(parts: tuple[str, ...], pats: list[str], *, prefix_only: bool = False) -> bool:
    """Whether path parts match glob segments (``**``: any number of folders); with ``prefix_only``, whether
    some longer path starting with ``parts`` could match."""
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(parts):
            ok = prefix_only or all(p == "**" for p in pats[j:])
        elif j == len(pats):
            ok = False
        elif pats[j] == "**":
            ok = (not parts[i].startswith(".") and go(i + 1, j)) or go(i, j + 1)
        else:
            name, pat = parts[i], pats[j]
            hidden_ok = pat.startswith(".") or not name.startswith(".")
            ok = hidden_ok and bool(_segment_regex(pat).match(name)) and go(i + 1, j + 1)
        memo[(i, j)] = ok
        return ok

    return go(0, 0)


def _glob(spec: str, walker: _Walker) -> list[tuple[Path, str]]:
    """``(path, "file" | "dir" | "hf")`` matches of a glob, found by the symlink-safe walk."""
    pattern = os.path.expanduser(spec)
    parts = Path(pattern).parts
    split = next((k for k, p in enumerate(parts) if glob.has_magic(p)), len(parts))
    root = Path(*parts[:split]) if split else Path(".")
    pats = list(parts[split:])
    if not root.is_dir():
        return []
    out = []
    for rel, path, what in _pruned(walker, root, pats):
        if _match_parts(rel, pats):
            out.append((path, what))
    return out


def _pruned(walker: _Walker, root: Path, pats: list[str]) -> Iterator[tuple[tuple[str, ...], Path, str]]:
    """The walk below ``root``, entering only folders that some match could lie under."""
    listing = walker.enter(root)
    if listing is None:
        return
    stack: list[tuple[tuple[str, ...], list[os.DirEntry[str]]]] = [((), listing)]
    while stack:
        prefix, entries = stack.pop()
        subdirs = []
        for entry in entries:
            path = Path(entry.path)
            rel = (*prefix, entry.name)
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
                is_file = not is_dir and entry.is_file(follow_symlinks=True)
            except OSError as e:
                walker.skipped.append((str(path), f"cannot read ({e.strerror})"))
                continue
            if is_dir:
                hf = is_hf_dataset_folder(path)
                yield rel, path, "hf" if hf else "dir"
                if not hf and _match_parts(rel, pats, prefix_only=True):
                    sub = walker.enter(path)
                    if sub is not None:
                        subdirs.append((rel, sub))
            elif is_file:
                yield rel, path, "file"
            elif entry.is_symlink() and _match_parts(rel, pats):
                walker.skipped.append((str(path), "broken symlink"))
        stack.extend(reversed(subdirs))


def _folder_files(folder: Path, walker: _Walker) -> list[InputFile]:
    out = []
    for _, path, what in walker.entries(folder):
        if what == "hf":
            out += _hf_inputs(path, walker.skipped)
        elif what == "file":
            if path.name.startswith("."):
                walker.skipped.append((str(path), "hidden file"))
                continue
            reason = _unsupported_reason(path, in_folder=True)
            if reason is not None:
                walker.skipped.append((str(path), reason))
            else:
                out.append(_input_file(path))
    return out


def _hf_inputs(path: Path, skipped: list[tuple[str, str]]) -> list[InputFile]:
    """A ``save_to_disk`` folder as inputs: a ``Dataset`` itself; a ``DatasetDict`` its ``train`` split (the
    other splits are reported as not read: name ``FOLDER/SPLIT`` to read one)."""
    index = path / HF_DATASET_DICT_FILE
    if not index.is_file():
        return [InputFile(path, "hf")]
    try:
        splits = [str(s) for s in json.loads(index.read_text(encoding="utf-8")).get("splits", [])]
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(f"{index}: cannot read the DatasetDict's split list ({e})") from e
    if "train" not in splits:
        raise InputError(
            f"{path}: a DatasetDict folder without a 'train' split (splits: {splits}); pass the folder of the "
            f"split to read, e.g. {path / splits[0]}"
            if splits
            else f"{path}: a DatasetDict folder with no splits"
        )
    skipped += [
        (str(path / s), f"DatasetDict split {s!r} not read (name its folder to read it)")
        for s in splits
        if s != "train"
    ]
    return [InputFile(path / "train", "hf")]


def _input_file(path: Path) -> InputFile:
    kind = input_kind(path)
    return InputFile(path, kind, compression_of(path) if kind == "jsonl" else None)


def find_inputs(inputs: Sequence[str]) -> InputListing:
    """The inputs named by files, folders, globs and hub ids, and every path seen but not read.

    Folders are searched recursively, following symlinked folders (each real folder once); globs are matched
    by the same walk (``**`` crosses folders). A file named directly must be a supported type.

        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> for n in ("b.jsonl", "a.parquet", "notes.txt", "c.jsonl.gz"): _ = (d / n).write_text("")
        >>> found = find_inputs([str(d)])
        >>> [(f.path.name, f.kind, f.compression) for f in found.files]
        [('a.parquet', 'parquet', None), ('b.jsonl', 'jsonl', None), ('c.jsonl.gz', 'jsonl', 'gzip')]
        >>> found.skipped_summary()
        {'not a data file (.txt)': 1}
    """
    if not inputs:
        raise InputError("no inputs given; pass JSONL/Parquet files, folders, globs or hf:org/name")
    found: dict[str, InputFile] = {}
    skipped: list[tuple[str, str]] = []
    for spec in inputs:
        walker = _Walker()  # each spec walks on its own (two specs may name the same folder)
        walker.skipped = skipped
        spec = str(spec)
        path = Path(spec).expanduser()
        matched: list[InputFile] = []
        if spec.startswith(HUB_PREFIX):
            matched = hub_dataset_files(spec.removeprefix(HUB_PREFIX))
        elif _looks_like_hub_id(spec, path):
            try:
                matched = hub_dataset_files(spec)
            except InputError as e:
                raise InputError(
                    f"no input files: {spec!r} is not a file, folder or glob that exists, nor a hub dataset in "
                    f"the local cache ({e}); check the path"
                ) from e
        elif path.is_file():
            matched = [_input_file(path)]
        elif path.is_dir():
            if is_hf_dataset_folder(path):
                matched = _hf_inputs(path, walker.skipped)
            else:
                matched = _folder_files(path, walker)
                if not matched:
                    txt = any(why == "not a data file (.txt)" for _, why in walker.skipped)
                    raise InputError(
                        f"no input files: folder {spec!r} holds no {_SUPPORTED} files"
                        + _skip_note(walker.skipped)
                        + (
                            f"; plain-text documents (.txt, one document per file) are read when named or "
                            f"matched by a glob, e.g. '{Path(spec) / '*.txt'}' (a folder skips them: a README "
                            "next to the data is no document)"
                            if txt
                            else ""
                        )
                    )
        elif glob.has_magic(spec):
            for hit, what in sorted(_glob(spec, walker)):
                if what == "hf":
                    matched += _hf_inputs(hit, walker.skipped)
                elif what == "dir":
                    matched += _folder_files(hit, walker)
                elif _unsupported_reason(hit) is None:
                    matched.append(_input_file(hit))
                elif not hit.name.startswith("."):
                    walker.skipped.append((str(hit), _unsupported_reason(hit) or ""))
            if not matched:
                raise InputError(
                    f"no input files: {spec!r} matched no file with a suffix in {_SUPPORTED}; check the "
                    "pattern (quote it in the shell)" + _skip_note(walker.skipped)
                )
        elif path.is_symlink():
            raise InputError(f"input {spec!r} is a broken symlink (its target does not exist); fix the link")
        else:
            raise InputError(
                f"no input files: {spec!r} is not a file, folder, glob or hub id (hf:org/name) that exists; "
                "check the path"
            )
        for f in matched:
            key = str(f.path if f.kind == "hf" or "snapshots" in f.path.parts else f.path.resolve())
            if key not in found:
                resolved = (
                    f if "snapshots" in f.path.parts else InputFile(f.path.resolve(), f.kind, f.compression)
                )
                found[key] = resolved
    files = tuple(sorted(found.values(), key=lambda f: f.label))
    return InputListing(files=files, skipped=tuple(dict.fromkeys(skipped)))


def _looks_like_hub_id(spec: str, path: Path) -> bool:
    """``org/name[:split]`` that is no existing path and does not end like a data file name."""
    if path.exists() or glob.has_magic(spec) or not _HUB_ID.match(spec):
        return False
    name = spec.split(":", 1)[0]
    return _data_suffix(Path(name)) not in (*JSONL_SUFFIXES, *PARQUET_SUFFIXES)


def _skip_note(skipped: list[tuple[str, str]]) -> str:
    if not skipped:
        return ""
    counts = InputListing((), tuple(skipped)).skipped_summary()
    return " (seen but not read: " + ", ".join(f"{n} {why}" for why, n in counts.items()) + ")"


def resolve_inputs(inputs: Sequence[str]) -> list[Path]:
    """Input paths from files, folders (searched recursively) and globs: sorted, deduplicated, absolute.

    JSON Lines (``.jsonl``, ``.json``, ``.ndjson``, also ``.gz``/``.zst``) and Parquet (``.parquet``, ``.pq``).
    A folder or glob contributes only files with those suffixes (see :func:`find_inputs` for what it skips);
    a file named directly must have one.

        >>> import tempfile, os
        >>> d = Path(tempfile.mkdtemp())
        >>> for n in ("b.jsonl", "a.parquet", "notes.txt"): _ = (d / n).write_text("")
        >>> [p.name for p in resolve_inputs([str(d), str(d / "*.jsonl")])]
        ['a.parquet', 'b.jsonl']
        >>> resolve_inputs([str(d / "*.csv")])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        longpack.errors.InputError: no input files: '...*.csv' matched no file...
    """
    return [f.path for f in find_inputs(inputs).files]


# -- hub datasets from the local cache ---------------------------------------------------------------------


def hf_hub_cache() -> Path:
    """The local HF hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def hub_dataset_files(spec: str) -> list[InputFile]:
    """The data files of split ``split`` (default ``train``) of hub dataset ``org/name[:split]``, found in the
    local HF cache without the network (``huggingface_hub``'s snapshot, ``datasets``' split rules).

    Raises ``InputError`` if the dataset is not in the cache or the split does not exist.
    """
    from longpack._optional import require

    repo_id, _, split = spec.partition(":")
    split = split or "train"
    hub = require("huggingface_hub", "hf", purpose="hub dataset ids")
    cache = hf_hub_cache()
    try:
        snapshot = Path(
            hub.snapshot_download(repo_id, repo_type="dataset", local_files_only=True, cache_dir=str(cache))
        )
    except Exception as e:
        raise InputError(
            f"hub dataset {repo_id!r} is not in the local HF cache ({cache}); nothing is downloaded: fetch it "
            f"first (e.g. huggingface-cli download --repo-type dataset {repo_id}) or pass its files ({e})"
        ) from e
    datasets = require("datasets", "hf", purpose="hub dataset ids")
    try:
        builder = datasets.load_dataset_builder(str(snapshot))
        data_files = dict(builder.config.data_files or {})
    except Exception as e:
        raise InputError(
            f"hub dataset {repo_id!r} ({snapshot}): datasets cannot find its data files ({e})"
        ) from e
    if split not in data_files:
        raise InputError(
            f"hub dataset {repo_id!r} has no split {split!r}; it has {sorted(data_files)}: pass "
            f"hf:{repo_id}:SPLIT"
        )
    out = []
    for name in data_files[split]:
        path = Path(str(name))
        try:
            out.append(_input_file(path))
        except InputError as e:
            raise InputError(f"hub dataset {repo_id!r} split {split!r}: {e}") from e
    if not out:
        raise InputError(f"hub dataset {repo_id!r} split {split!r} lists no data files in {snapshot}")
    return out


# -- reading JSON Lines (plain, compressed, or one JSON array) ----------------------------------------------


class _HashingReader(io.RawIOBase):
    """The raw file, hashed as it is read; ``offset`` is how far in it the reader got."""

    def __init__(self, f: BinaryIO, hasher: Any) -> None:
        self._f = f
        self._hasher = hasher
        self.offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._f.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self._hasher.update(memoryview(buffer)[:n])
            self.offset += n
        return n or 0

    def drain(self) -> None:
        while block := self._f.read(1 << 20):
            self._hasher.update(block)
            self.offset += len(block)


_FIX = {
    "gzip": "the file is damaged or cut short: re-create or re-download it (gzip -t FILE checks it)",
    "zstd": "the file is damaged or cut short: re-create or re-download it (zstd -t FILE checks it)",
}


def _decompressed(path: Path, raw: _HashingReader, compression: str | None) -> BinaryIO:
    if compression is None:
        return raw  # type: ignore[return-value]
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[arg-type,return-value]
    from longpack._optional import require

    zstd = require("zstandard", "text", purpose=f"reading {path.name}")
    return _ZstdFrames(raw, zstd)  # type: ignore[return-value]


class _ZstdFrames(io.RawIOBase):
    """The frames of a ``.zst`` file, one after another, decompressed; a stream that ends inside a frame
    (a file cut short) raises ``ZstdError``. (zstandard's own readers return a cut file's first part as if
    it were the whole file, and the rows after the cut were lost without a word.)

    >>> import zstandard
    >>> frame = zstandard.ZstdCompressor().compress(b"row 1\\nrow 2\\n" * 100)
    >>> len(_ZstdFrames(io.BytesIO(frame * 2), zstandard).read())
    2400
    >>> _ZstdFrames(io.BytesIO(frame[:-3]), zstandard).read()
    Traceback (most recent call last):
    ...
    zstandard.backend_c.ZstdError: the stream ends inside a zstd frame: the file is cut short
    """

    #: Compressed bytes fed at a time: bounds what one step can expand to (a frame of zeros ~ 32000x).
    RAW_READ = 1 << 14

    def __init__(self, raw: Any, zstd: Any) -> None:
        self._raw, self._zstd = raw, zstd
        self._dctx = zstd.ZstdDecompressor()
        self._frame: Any = None  # the frame being decompressed, None between frames
        self._out = bytearray()
        self._error: Exception | None = None  # damage met, raised once the data before it is read

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = None if size is None or size < 0 else size
        while self._error is None and (want is None or len(self._out) < want):
            data = self._raw.read(self.RAW_READ)
            if not data:
                if self._frame is not None:
                    self._error = self._zstd.ZstdError(
                        "the stream ends inside a zstd frame: the file is cut short"
                    )
                break
            try:
                while data:
                    if self._frame is None:
                        self._frame = self._dctx.decompressobj()
                    self._out += self._frame.decompress(data)
                    if not self._frame.eof:
                        break
                    data, self._frame = self._frame.unused_data, None
            except self._zstd.ZstdError as e:
                self._error = e
        if self._error is not None and not self._out:  # what came before the damage is read first
            raise self._error
        cut = len(self._out) if want is None else min(want, len(self._out))
        out = bytes(self._out[:cut])
        del self._out[:cut]
        return out

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _corrupt_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [gzip.BadGzipFile, EOFError, zlib.error]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is in the text extra
        pass
    return tuple(errors)


def _complete_lines(path: Path, compression: str | None) -> int:
    """How many whole lines a damaged compressed file yields before its damage (read again, only when
    the damage was met: the error names the last good line)."""
    lines = 0
    with open(path, "rb") as f:
        raw = _HashingReader(f, hashlib.sha256())
        if compression == "gzip":  # zlib directly: GzipFile drops the last piece it decoded at an error
            decoder = zlib.decompressobj(wbits=31)
            try:
                while data := raw.read(1 << 16):
                    while data:
                        lines += decoder.decompress(data).count(b"\n")
                        data = decoder.unused_data if decoder.eof else b""
                        if decoder.eof:
                            decoder = zlib.decompressobj(wbits=31)
            except zlib.error:
                pass
            return lines
        stream = _decompressed(path, raw, compression)
        try:
            while piece := stream.read(1 << 16):
                lines += piece.count(b"\n")
        except _corrupt_errors():
            pass
    return lines


def _blocks(path: Path, hasher: Any, block_bytes: int, where: list[int]) -> Iterator[bytes]:
    """Decompressed blocks of a file; ``where[0]`` is the line number the caller is at (for errors)."""
    compression = compression_of(path)
    corrupt = _corrupt_errors()
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed in finally
    except OSError as e:
        raise InputError(
            f"{path}: cannot open ({e.strerror or e}); check the path and its permissions"
        ) from e
    try:
        raw = _HashingReader(f, hasher)
        stream = _decompressed(path, raw, compression)
        while True:
            try:
                # Full blocks only (a decompressor may return less at a frame boundary), so the chunks of
                # a compressed file are the chunks of its text.
                block = stream.read(block_bytes)
                while block and len(block) < block_bytes:
                    more = stream.read(block_bytes - len(block))
                    if not more:
                        break
                    block += more
            except corrupt as e:
                good = _complete_lines(path, compression)
                raise InputError(
                    f"{path}:{good + 1}: corrupt or cut-short {compression} data after line {good} (the last "
                    f"complete line; the rows after it cannot be read, so the file is refused, not packed "
                    f"short): {e}; {_FIX.get(compression or '', 'check the file')}"
                ) from e
            except OSError as e:
                raise InputError(
                    f"{path}: read error near byte {raw.offset} ({e.strerror or e}); check the disk or copy the "
                    "file again"
                ) from e
            if not block:
                break
            yield block
        raw.drain()
    finally:
        f.close()


_BOM = b"\xef\xbb\xbf"


def jsonl_chunks(
    path: Path, hasher: Any, chunk_bytes: int = JSONL_CHUNK_BYTES
) -> Iterator[tuple[int, bytes]]:
    """``(first_row, blob)`` pieces of a JSON Lines file (plain or ``.gz``/``.zst``), each ending at a
    newline (except maybe the last); ``first_row`` is the 1-based line of the blob's first line. A UTF-8
    byte-order mark at the start of the file is not part of any blob (``json.loads`` refuses it).

    A file whose text is one JSON array is read element by element instead: every blob line is one element
    (its inner line breaks, which JSON allows only as whitespace, turned into spaces) and ``first_row`` counts
    elements (1-based). Feeds every byte of the file as stored to ``hasher`` (the input's sha256 for free).

        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "x.jsonl"; _ = p.write_bytes(b'{"a":1}\\n{"a":2}\\n{"a":3}')
        >>> list(jsonl_chunks(p, hashlib.sha256(), chunk_bytes=10))
        [(1, b'{"a":1}\\n'), (2, b'{"a":2}\\n'), (3, b'{"a":3}')]
        >>> _ = p.write_bytes(b'[{"a": 1},\\n {"a":\\n 2}]\\n')
        >>> list(jsonl_chunks(p, hashlib.sha256()))
        [(1, b'{"a": 1}\\n{"a":  2}\\n')]
    """
    where = [1]
    blocks = _blocks(path, hasher, chunk_bytes, where)
    first = b""
    for block in blocks:  # at least the BOM's three bytes, whatever the block size
        first += block
        if len(first) >= len(_BOM):
            break
    head = first[3:] if first.startswith(_BOM) else first
    if head.lstrip(b" \t\r\n").startswith(b"["):
        yield from _array_chunks(path, head, blocks, chunk_bytes)
        return
    line_no = 1
    stream = _chain([head] if head else [], blocks)
    rest = b""
    while True:
        block = next(stream, b"")
        data = rest + block if rest else block
        if not block:
            if data:
                yield line_no, data
            return
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        chunk, rest = data[: cut + 1], data[cut + 1 :]
        yield line_no, chunk
        line_no += chunk.count(b"\n")
        where[0] = line_no


def _chain(first: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
    yield from first
    yield from rest


_WS = re.compile(r"[ \t\r\n]*")


def _array_chunks(
    path: Path, head: bytes, blocks: Iterator[bytes], chunk_bytes: int
) -> Iterator[tuple[int, bytes]]:
    """One JSON array's elements as JSONL blobs (one element per line), numbered from 1."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    json_decoder = json.JSONDecoder()
    eof = False

    def more(text: str, want: int) -> str:
        nonlocal eof
        got = 0
        while not eof and got < want:
            block = next(blocks, b"")
            if not block:
                eof = True
                try:
                    text += decoder.decode(b"", final=True)
                except UnicodeDecodeError as e:
                    raise InputError(
                        f"{path}: not UTF-8 at the end of the file ({e.reason}); fix the file"
                    ) from e
                break
            try:
                piece = decoder.decode(block)
            except UnicodeDecodeError as e:
                raise InputError(f"{path}: not UTF-8 ({e.reason}); fix the file's encoding") from e
            text += piece
            got += len(piece)
        return text

    try:
        buf = decoder.decode(head)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 ({e.reason}); fix the file's encoding") from e
    pos = _WS.match(buf).end() + 1  # type: ignore[union-attr]  # past "["
    line = 1 + buf.count("\n", 0, pos)
    element = 0
    first_in_chunk = 1
    out: list[bytes] = []
    size = 0
    expect_value = True  # after "[" or ","
    while True:
        end = _WS.match(buf, pos).end()  # type: ignore[union-attr]
        if end == len(buf) and not eof:
            line += buf.count("\n", pos, end)
            buf, pos = more(buf[end:], chunk_bytes), 0
            continue
        line += buf.count("\n", pos, end)
        pos = end
        if pos == len(buf):
            raise InputError(
                f"{path}:{line}: the JSON array is not closed (no ']' before the end of the file); the file is "
                "cut short: re-create it"
            )
        ch = buf[pos]
        if ch == "]" and (expect_value is False or element == 0):
            pos += 1
            break
        if not expect_value:
            if ch != ",":
                raise InputError(
                    f"{path}:{line}: expected ',' or ']' after element {element} of the JSON array, found "
                    f"{ch!r}; fix the file"
                )
            pos += 1
            expect_value = True
            continue
        while True:
            try:
                _, stop = json_decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError as e:
                if eof:
                    raise InputError(
                        f"{path}:{line}: element {element + 1} of the JSON array is not valid JSON ({e.msg}); "
                        "fix the file (the rest of the array cannot be read past it)"
                    ) from e
                buf = more(buf, max(chunk_bytes, len(buf) - pos))
            except RecursionError as e:
                raise InputError(
                    f"{path}:{line}: element {element + 1} of the JSON array is nested too deeply to read; "
                    f"rows may nest at most {MAX_JSON_DEPTH} levels"
                ) from e
        text = buf[pos:stop]
        line += text.count("\n")
        out.append(text.replace("\n", " ").replace("\r", " ").encode("utf-8") + b"\n")
        size += len(out[-1])
        element += 1
        expect_value = False
        pos = stop
        if size >= chunk_bytes:
            yield first_in_chunk, b"".join(out)
            first_in_chunk, out, size = element + 1, [], 0
        if pos > chunk_bytes:  # keep the buffer small
            buf, pos = buf[pos:], 0
    if out:
        yield first_in_chunk, b"".join(out)
    tail = buf[pos:]
    if tail.strip(" \t\r\n") or (not eof and _drain_nonblank(more, tail)):
        raise InputError(f"{path}:{line}: text after the JSON array's closing ']'; a file holds one array")


def _drain_nonblank(more: Any, tail: str) -> bool:
    text = more(tail, 1 << 30)
    return bool(text.strip(" \t\r\n"))


def first_jsonl_rows(path: Path, limit: int = 16, max_lines: int = 1000) -> tuple[list[dict[str, Any]], int]:
    """Up to ``limit`` parseable object rows from the first ``max_lines`` rows, and the non-blank row count seen.

    Unparseable lines are left for the chunk workers to report with their line numbers.
    """
    rows: list[dict[str, Any]] = []
    seen = 0
    first_line: bytes | None = None
    for _, blob in jsonl_chunks(path, hashlib.sha256(), chunk_bytes=1 << 16):
        for line in blob.split(b"\n"):
            if seen >= max_lines or len(rows) >= limit:
                return rows, seen
            if not line.strip():
                continue
            seen += 1
            if first_line is None:
                first_line = line
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(row, dict):
                rows.append(row)
        if seen >= max_lines or len(rows) >= limit:
            break
    if not rows and first_line is not None and first_line.lstrip(_BOM + b" \t").startswith(b"{"):
        raise InputError(
            f"{path}:1: the first lines are not JSON objects; if the file holds one JSON object spread over "
            'several lines (e.g. {"data": [rows]}), write its rows one per line (JSON Lines) or as a JSON array'
        )
    return rows, seen


def json_too_deep(line: bytes | str) -> bool:
    """Whether one JSON text nests deeper than :data:`MAX_JSON_DEPTH` (brackets inside strings ignored).
    Counted only when it could: a text with fewer brackets than the limit cannot nest deeper.

    >>> json_too_deep(b'{"a": [[1], "]]]"]}'), json_too_deep(b"[" * 200 + b"]" * 200)
    (False, True)
    """
    if isinstance(line, str):
        line = line.encode("utf-8", "surrogatepass")
    if line.count(b"[") + line.count(b"{") <= MAX_JSON_DEPTH:
        return False
    import numpy as np

    stripped = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', line)
    arr = np.frombuffer(stripped, dtype=np.uint8)
    step = np.isin(arr, (ord("["), ord("{"))).astype(np.int64) - np.isin(arr, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0)) > MAX_JSON_DEPTH


def input_file(path: Path) -> InputFile:
    """The :class:`InputFile` of one path: how it is read (its kind) and its compression. A public name for
    the readers outside this layer (the Ray backend).

    >>> f = input_file(Path("data/train.jsonl.zst"))
    >>> f.kind, f.compression
    ('jsonl', 'zstd')
    """
    return _input_file(path)
