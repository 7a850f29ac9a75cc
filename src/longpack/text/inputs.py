"""Finding input files and cutting them into chunks of rows (the unit of parallel work).

Chunk boundaries depend only on the file contents (JSONL: about ``JSONL_CHUNK_BYTES`` cut at a newline;
Parquet: ``PARQUET_CHUNK_ROWS`` rows), never on the worker count, so the output is the same for any
number of workers.
"""

from __future__ import annotations

import glob
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from longpack.text.errors import InputError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_CHUNK_BYTES = 1 << 20
PARQUET_CHUNK_ROWS = 2048


def input_kind(path: Path) -> str:
    """``"jsonl"`` or ``"parquet"`` from the suffix.

    >>> input_kind(Path("a/train.JSONL")), input_kind(Path("b.pq"))
    ('jsonl', 'parquet')
    """
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise InputError(
        f"{path}: unsupported file type {path.suffix!r}; inputs must be JSON Lines "
        f"({', '.join(JSONL_SUFFIXES)}) or Parquet ({', '.join(PARQUET_SUFFIXES)})"
    )


def _supported(path: Path) -> bool:
    return path.suffix.lower() in JSONL_SUFFIXES + PARQUET_SUFFIXES


def resolve_inputs(inputs: Sequence[str]) -> list[Path]:
    """Input files from files, folders (searched recursively) and globs: sorted, deduplicated, absolute.

    JSON Lines (``.jsonl``, ``.json``, ``.ndjson``) and Parquet (``.parquet``, ``.pq``). A folder or glob
    contributes only files with those suffixes; a file named directly must have one.

        >>> import tempfile, os
        >>> d = Path(tempfile.mkdtemp())
        >>> for n in ("b.jsonl", "a.parquet", "notes.txt"): _ = (d / n).write_text("")
        >>> [p.name for p in resolve_inputs([str(d), str(d / "*.jsonl")])]
        ['a.parquet', 'b.jsonl']
        >>> resolve_inputs([str(d / "*.csv")])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        longpack.text.errors.InputError: no input files: '...*.csv' matched no file...
    """
    if not inputs:
        raise InputError("no inputs given; pass JSONL/Parquet files, folders or globs")
    found: set[Path] = set()
    for spec in inputs:
        path = Path(spec).expanduser()
        matched: list[Path] = []
        if path.is_file():
            input_kind(path)
            matched = [path]
        elif path.is_dir():
            matched = [p for p in path.rglob("*") if p.is_file() and _supported(p)]
            if not matched:
                raise InputError(
                    f"no input files: folder {spec!r} holds no {', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)} files"
                )
        elif glob.has_magic(spec):
            for hit in sorted(glob.glob(str(path), recursive=True)):
                p = Path(hit)
                if p.is_dir():
                    matched += [q for q in p.rglob("*") if q.is_file() and _supported(q)]
                elif p.is_file() and _supported(p):
                    matched.append(p)
            if not matched:
                raise InputError(
                    f"no input files: {spec!r} matched no file with a suffix in "
                    f"{', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)}; check the pattern (quote it in the shell)"
                )
        else:
            raise InputError(
                f"no input files: {spec!r} is not a file, folder or glob that exists; check the path"
            )
        found.update(p.resolve() for p in matched)
    return sorted(found, key=str)


def jsonl_chunks(
    path: Path, hasher: Any, chunk_bytes: int = JSONL_CHUNK_BYTES
) -> Iterator[tuple[int, bytes]]:
    """``(first_line_number, blob)`` pieces of a JSONL file, each ending at a newline (except maybe the last).

    Feeds every byte read to ``hasher`` (the input's sha256 comes for free).

        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "x.jsonl"; _ = p.write_bytes(b'{"a":1}\\n{"a":2}\\n{"a":3}')
        >>> list(jsonl_chunks(p, hashlib.sha256(), chunk_bytes=10))
        [(1, b'{"a":1}\\n'), (2, b'{"a":2}\\n'), (3, b'{"a":3}')]
    """
    line_no = 1
    rest = b""
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk_bytes)
            if block:
                hasher.update(block)
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


def first_jsonl_rows(path: Path, limit: int = 16, max_lines: int = 1000) -> tuple[list[dict[str, Any]], int]:
    """Up to ``limit`` parseable object rows from the first ``max_lines`` lines, and the non-blank line count seen.

    Unparseable lines are left for the chunk workers to report with their line numbers.
    """
    rows: list[dict[str, Any]] = []
    seen = 0
    with open(path, "rb") as f:
        head = f.read(1 << 16).lstrip()
        if head.startswith(b"["):
            raise InputError(
                f"{path}:1: the file holds one JSON array, not JSON Lines (one object per line); convert it, "
                'e.g. python -c "import json,sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]" < IN > OUT.jsonl'
            )
        f.seek(0)
        for i, line in enumerate(f):
            if i >= max_lines or len(rows) >= limit:
                break
            if not line.strip():
                continue
            seen += 1
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows, seen


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
