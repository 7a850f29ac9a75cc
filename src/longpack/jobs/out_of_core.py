"""Packing corpora larger than memory on one machine: two passes, the same bytes.

``longpack pack`` holds every token in memory by default (token data ~5 bytes per token). Past a memory
budget (``--memory-budget``, ``PackConfig.memory_budget``; default half of this machine's memory) it packs
in two passes instead:

1. **read**: the inputs are read and tokenized as always, but tokens and loss masks go to two scratch files
   (a hidden folder next to the output) once they would exceed the budget; what the planner needs (lengths,
   source file and row of every sample, the plan) stays in memory: about 90 bytes per sample, whatever the
   lengths;
2. **write**: the rows are planned exactly as in memory, and every shard is filled from the scratch files
   through read-only memory maps. Pages read are handed back to the page cache every
   :data:`TRIM_BYTES` of written tokens, so the process's own memory holds no tokens: it grows with the
   number of samples only (``benchmarks/pack_memory.py``: 0.99 GiB for 10M samples of 3.3 GiB of tokens).

The output files and the manifest are byte-identical to the in-memory run (the same code fills the same rows;
only where the token buffers live differs). Both passes show their progress bars. The scratch folder is
removed when the job ends, failed or not. Tokens are read back from the scratch files, not tokenized again:
a second tokenization would cost as much CPU as the first.

>>> parse_memory_budget("8G"), parse_memory_budget("512M"), parse_memory_budget(1000)
(8589934592, 536870912, 1000)
>>> parse_memory_budget("lots")
Traceback (most recent call last):
...
longpack.errors.ConfigError: memory_budget 'lots' is not a size; give bytes or a number with K, M, G or T (e.g. 8G)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longpack.errors import ConfigError

__all__ = [
    "TRIM_BYTES",
    "PageTrimmer",
    "default_memory_budget",
    "parse_memory_budget",
    "spill_folder",
]

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: Written token bytes between two hand-backs of memory-mapped token pages to the page cache.
TRIM_BYTES = 256 * 2**20


def parse_memory_budget(value: Any, name: str = "memory_budget") -> int | None:
    """Bytes from ``8G`` / ``512M`` / ``1.5T`` / an integer (``None`` stays ``None``: the default budget)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a size such as 8G, got {value!r}", fields=name)
    if isinstance(value, int):
        size = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(value), re.I)
        if m is None:
            raise ConfigError(
                f"{name} {value!r} is not a size; give bytes or a number with K, M, G or T (e.g. 8G)",
                fields=name,
            )
        size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size < 1:
        raise ConfigError(f"{name} must be positive, got {value!r}", fields=name)
    return size


def default_memory_budget() -> int:
    """Half of this machine's physical memory (what the token data may take before packing goes two-pass).

    >>> default_memory_budget() > 0
    True
    """
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        total = 16 * 2**30
    return max(1, total // 2)


@contextlib.contextmanager
def spill_folder(out: Path) -> Iterator[Path]:
    """The path of a hidden scratch folder next to ``out`` (the output's file system, which has room for
    the data); created only if tokens are spilled, removed on exit whatever happened: an exception, or
    SIGTERM (``kill``, a scheduler's preemption), whose default action would end the process before any
    ``finally`` runs. Scratch folders of ``out`` that an earlier run left (``kill -9``) are removed first:
    the caller holds ``out``'s lock (:class:`~longpack.outputs.OutputLock`), so no live run owns them.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "packed"
    >>> stale = out.parent / ".packed.spill-1-1"; stale.mkdir()
    >>> with spill_folder(out) as folder:
    ...     folder.mkdir(); stale.exists()
    False
    >>> folder.exists()
    False
    """
    parent = out.resolve().parent
    folder = parent / f".{out.name}.spill-{os.getpid()}-{threading.get_ident():x}"
    for old in parent.glob(f".{glob_escape(out.name)}.spill-*"):
        shutil.rmtree(old, ignore_errors=True)
    with _removed_on_sigterm(folder):
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def glob_escape(name: str) -> str:
    """``name`` as a glob pattern that matches only itself.

    >>> glob_escape("a[1]*")
    'a[[]1][*]'
    """
    return re.sub(r"([*?\[])", r"[\1]", name)


@contextlib.contextmanager
def _removed_on_sigterm(folder: Path) -> Iterator[None]:
    """While inside, SIGTERM removes ``folder`` and then does what it did before (by default: ends the
    process, killed by the signal, as a caller expects). Only the main thread can set a handler; in
    another thread nothing changes."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class PageTrimmer:
    """Hands the pages of memory-mapped token buffers back to the page cache every ``every`` bytes of
    written tokens (``MADV_DONTNEED`` on a read-only file mapping: the data stays in the page cache and is
    read again from it if needed; the process's resident memory drops).

    ``rows(n)`` is the writer's progress callback (called from writer threads); ``then`` is called too.
    """

    def __init__(
        self, arrays: Sequence[np.ndarray], bytes_per_row: int, every: int = TRIM_BYTES, then: Any = None
    ) -> None:
        self.maps = [m for a in arrays if (m := _mapping(a)) is not None]
        self.bytes_per_row = max(1, bytes_per_row)
        self.every = every
        self.then: Callable[[int], None] | None = then
        self._pending = 0
        self._lock = threading.Lock()
        self.trims = 0

    def rows(self, n: int) -> None:
        if self.then is not None:
            self.then(n)
        if not self.maps:
            return
        with self._lock:
            self._pending += n * self.bytes_per_row
            if self._pending < self.every:
                return
            self._pending = 0
            self.trim()

    def trim(self) -> None:
        for m in self.maps:
            with contextlib.suppress(OSError, ValueError):
                m.madvise(mmap.MADV_DONTNEED)
        self.trims += 1


def _mapping(array: np.ndarray) -> mmap.mmap | None:
    """The file mapping behind a read-only ``numpy.memmap`` (or a view of one), else ``None``. Only those:
    ``MADV_DONTNEED`` on anonymous memory (the in-memory buffers) would discard the data."""
    base: Any = array
    while base is not None:
        if isinstance(base, np.memmap):
            m = getattr(base, "_mmap", None)
            if isinstance(m, mmap.mmap) and base.filename is not None and base.mode == "r":
                return m
        base = getattr(base, "base", None)
    return None


def take(samples: Any, indices: np.ndarray, folder: Path | None, *, chunk: int = 1 << 20) -> Any:
    """``samples.take(indices)`` (a mix's draw); for spilled samples (memory-mapped tokens) the drawn tokens
    go to new scratch files in ``folder`` chunk by chunk instead of into memory. Same values either way.

    >>> from longpack.samples import TokenizedSamples
    >>> s = TokenizedSamples(tokens=np.array([5, 2, 6, 7, 2], np.int32), loss_mask=np.ones(5, np.uint8),
    ...     offsets=np.array([0, 2, 5]), source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]),
    ...     files=("a.jsonl",))
    >>> take(s, np.array([1, 0, 1]), None).tokens.tolist()
    [6, 7, 2, 5, 2, 6, 7, 2]
    """
    from longpack.samples import TokenizedSamples

    if folder is None or _mapping(samples.tokens) is None:
        return samples.take(indices)
    from longpack.outputs import map_scratch, new_scratch_file, write_array

    indices = np.asarray(indices, dtype=np.int64)
    # New files, created exclusively: never one that a live memory map still reads.
    (tokens_path, ft), (mask_path, fm) = (
        new_scratch_file(folder, "mixed-tokens"),
        new_scratch_file(folder, "mixed-loss_mask"),
    )
    with ft, fm:
        for lo in range(0, len(indices), chunk):
            part = samples.take(indices[lo : lo + chunk])
            write_array(ft, part.tokens)  # fh.write: a full disk keeps its errno
            write_array(fm, part.loss_mask)
            del part
    lengths = samples.stored_lengths()[indices]
    offsets = np.zeros(len(indices) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    tokens = map_scratch(tokens_path, samples.tokens.dtype, n) if n else samples.tokens[:0]
    mask = map_scratch(mask_path, np.uint8, n) if n else samples.loss_mask[:0]
    return TokenizedSamples(
        tokens=tokens,
        loss_mask=mask,
        offsets=offsets,
        source_file=samples.source_file[indices],
        source_row=samples.source_row[indices],
        files=samples.files,
    )
