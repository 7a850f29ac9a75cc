"""Where longpack writes: output paths checked before any work starts, the lock an output folder is
written under, and write failures (a full disk) reported as what they are.

- :func:`check_output_dir` (a folder ``longpack pack`` fills) and :func:`check_output_file` (a PNG, a
  ``.npy``, a YAML) refuse, before tokenizing or computing anything, a path that cannot be written: a
  file where a folder is needed (or the reverse), a parent that is a file, a dangling symbolic link, a
  folder without write permission, a name longer than the file system allows, and (folders) an output
  inside one of the inputs, which a later run over that input would read back as data. Output folders
  are created with their parents; an output file's folder must exist.
- :class:`OutputLock` is an advisory lock (``flock``) on a lock file beside the output folder
  (``.<name>.longpack-lock``, holding the owner's pid and host) while it is written: a second writer gets a
  clear error instead of deleting or interleaving the first one's files. The kernel releases it when the
  owner exits, even by ``kill -9``, so a left-over lock file never blocks a later run.
- :func:`output_write_errors` turns an ``OSError`` of the storage (disk full, quota, read-only file system,
  permission, I/O error) raised while writing into an :class:`~longpack.errors.OutputError` naming the
  folder and saying that it reads as unfinished.
- :func:`atomic_write` (and :func:`atomic_write_bytes`, :func:`commit_file`) write every file longpack
  leaves behind: a temporary sibling (:func:`temp_path`), fsync, rename, fsync of the folder, so a reader
  sees the old file or the whole new one; :func:`sha256_file` is the digest manifests record of a file.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> (root / "data").mkdir()
>>> check_output_dir(root / "packed", overwrite=False, inputs=[str(root / "data")])
>>> check_output_dir(root / "data" / "packed", overwrite=False, inputs=[str(root / "data")])
Traceback (most recent call last):
...
longpack.errors.ConfigError: out .../data/packed is inside the input folder .../data: a later run over that input would read the packed files as data; choose an out outside it
>>> with OutputLock(root / "packed"):
...     with OutputLock(root / "packed"):
...         pass  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
longpack.errors.OutputError: out .../packed is being written by another longpack run (pid ... on ...; lock file .../.packed.longpack-lock); wait for it to finish, or choose another out
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from longpack.errors import ConfigError, LongpackError, OutputError, OutputExistsError

__all__ = [
    "LOCK_SUFFIX",
    "WRITE_ERRNOS",
    "ArrayWriter",
    "OutputLock",
    "atomic_write",
    "atomic_write_bytes",
    "check_output_dir",
    "check_output_file",
    "commit_file",
    "fsync_dir",
    "map_scratch",
    "new_scratch_file",
    "output_write_errors",
    "resolved_path",
    "sha256_file",
    "temp_path",
    "write_array",
    "write_error",
]

LOCK_SUFFIX = ".longpack-lock"
#: ``OSError`` numbers that mean the storage refused a write (not a bug in longpack): what it means, the fix.
_WRITE_ERROR_HINTS = {
    errno.ENOSPC: (" (the disk is full)", "free space"),
    errno.EDQUOT: (" (the disk quota is used up)", "free space or raise the quota"),
    errno.EFBIG: (" (a file would exceed the file-size limit)", "raise the limit or lower rows_per_shard"),
    errno.EROFS: ("", "write to a writable file system"),
    errno.EACCES: ("", "make the folder writable"),
    errno.EPERM: ("", "make the folder writable"),
    errno.EIO: (" (the storage reported an I/O error)", "check the storage"),
}
WRITE_ERRNOS = frozenset(_WRITE_ERROR_HINTS)
_GLOB_CHARS = frozenset("*?[")


def _name_limits(existing: Path) -> tuple[int, int]:
    """``(longest name, longest path)`` the file system holding ``existing`` allows."""
    try:
        return os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # not POSIX, or the limit is not reported
        return 255, 4096


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up, a folder we may not enter: nothing usable there
        return False


def _is_symlink(path: Path) -> bool:
    try:
        return path.is_symlink()
    except OSError:
        return False


def _nearest_existing(path: Path, field: str) -> Path:
    """The closest ancestor of ``path`` that exists; a dangling link on the way is an error."""
    current = path.parent
    while not _exists(current):
        if _is_symlink(current):
            raise OutputError(
                f"{field} {path}: {current} is a symbolic link to {os.readlink(current)}, which does not "
                f"exist; create its target or choose another {field}",
                fields=field,
            )
        if current.parent == current:
            break
        current = current.parent
    return current


def _check_path_text(path: Path, field: str, existing: Path) -> None:
    name_max, path_max = _name_limits(existing)
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise OutputError(
                f"{field} {str(path)[:80]}...: the name {part[:40]!r}... is {len(os.fsencode(part))} bytes "
                f"long; this file system allows at most {name_max}; choose a shorter {field}",
                fields=field,
            )
    if len(os.fsencode(str(path.absolute()))) > path_max:
        raise OutputError(
            f"{field} {str(path)[:80]}...: the path is longer than the {path_max} bytes this file system "
            f"allows; choose a shorter {field}",
            fields=field,
        )


def _check_parent(path: Path, field: str, *, create: bool) -> Path:
    """Check that ``path``'s folder exists (or, ``create``, can be made) and is writable; return the
    nearest existing ancestor."""
    existing = _nearest_existing(path, field)
    _check_path_text(path, field, existing)
    if not existing.is_dir():
        raise OutputError(
            f"{field} {path}: {existing} is a file, not a folder; choose another {field}", fields=field
        )
    if not create and existing != path.parent:
        raise OutputError(
            f"{field} {path}: folder {path.parent} does not exist; create it first or choose another {field}",
            fields=field,
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(
            f"{field} {path}: folder {existing} is not writable by this user; choose another {field}",
            fields=field,
        )
    return existing


def resolved_path(path: Path, field: str) -> Path:
    """``path.resolve()``, with a symbolic-link loop (``a -> b -> a``) a :class:`ConfigError` naming it.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); (d / "a").symlink_to(d / "b"); (d / "b").symlink_to(d / "a")
    >>> resolved_path(d / "a", "inputs")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: inputs .../a is a loop of symbolic links (it never reaches a file or folder); remove the loop or give the real path
    """
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: Python < 3.13's "Symlink loop"; ELOOP after
        raise ConfigError(
            f"{field} {path} is a loop of symbolic links (it never reaches a file or folder); remove the loop "
            "or give the real path"
            if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
            else f"{field} {path} cannot be resolved ({exc}); give another path",
            fields=field,
        ) from None


def _input_base(text: str) -> Path:
    """The part of an input spec before its first glob character (the folder a glob walks)."""
    parts = Path(text).parts
    plain = []
    for part in parts:
        if _GLOB_CHARS & set(part):
            break
        plain.append(part)
    return Path(*plain) if plain else Path(".")


#: Names of files a pack writes that an input spec could pick up again (all are readable as input).
_WRITTEN_NAMES = ("training_8.idx.parquet", "validation_8.idx.parquet", "8_metadata.jsonl", "manifest.json")


def _would_read(spec: str, out: Path) -> bool:
    """Whether input ``spec`` (a file, a folder, a glob), read by a later run, would take in the files a
    pack writes into the (resolved) folder ``out``: a folder is read with its subfolders, ``**`` too; a
    plain glob only where its pattern matches.

    >>> _would_read("/data/*.jsonl", Path("/data/packed")), _would_read("/data/*/*.parquet", Path("/data/packed"))
    (False, True)
    """
    plain = _input_base(spec)
    base = resolved_path(plain, "inputs")
    if not _GLOB_CHARS & set(spec):
        return base.is_dir() and (out == base or base in out.parents)
    if "**" in spec:
        return out == base or base in out.parents
    pattern = base.parts + Path(spec).parts[len(plain.parts) :]
    for name in _WRITTEN_NAMES:
        candidate = (out / name).parts
        if len(candidate) == len(pattern) and all(map(fnmatch.fnmatchcase, candidate, pattern)):
            return True
    return False


def check_output_dir(
    out: str | Path, *, overwrite: bool, inputs: Sequence[str | Path] = (), field: str = "out"
) -> None:
    """Refuse an output folder that cannot be written, before any work starts (see the module docstring).

    Whether an existing folder may be replaced (``overwrite``) is the writer's rule; this checks what no
    writer could get past. ``inputs`` are input files, folders or globs.
    """
    path = Path(out)
    _check_path_text(path, field, _nearest_existing(path, field))
    if path.is_symlink() and not path.exists():
        raise OutputError(
            f"{field} {path} is a symbolic link to {os.readlink(path)}, which does not exist; remove the "
            f"link or choose another {field}",
            fields=field,
        )
    if path.exists():
        if not path.is_dir():
            raise OutputExistsError(
                f"{field} {path} exists and is not a folder; choose another {field}", fields=field
            )
        if overwrite and not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(
                f"{field} {path} is not writable by this user; choose another {field}", fields=field
            )
    _check_parent(path, field, create=True)
    resolved = resolved_path(path, field)
    for spec in inputs:
        base = resolved_path(_input_base(str(spec)), "inputs")
        if _would_read(str(spec), resolved):
            raise ConfigError(
                f"{field} {path} is inside the input folder {base}: a later run over that input would read "
                f"the packed files as data; choose an {field} outside it",
                fields=(field, "inputs"),
            )
        if resolved == base or resolved in base.parents:
            raise ConfigError(
                f"input {spec} is inside {field} {path}: writing {field} would replace or delete it; "
                f"choose an {field} that holds no input",
                fields=(field, "inputs"),
            )


def check_output_file(path: str | Path, *, field: str) -> Path:
    """Refuse an output file path that cannot be written (before the work that produces it); return it.

    >>> check_output_file("/proc/definitely/not/here.png", field="plot")
    Traceback (most recent call last):
    ...
    longpack.errors.OutputError: plot /proc/definitely/not/here.png: folder /proc/definitely/not does not exist; create it first or choose another plot
    """
    p = Path(path)
    _check_path_text(p, field, _nearest_existing(p, field))
    if p.is_dir():
        raise OutputError(
            f"{field} {p} is a folder; give a file name (e.g. {p / 'out'}{p.suffix})", fields=field
        )
    _check_parent(p, field, create=False)
    return p


class OutputLock:
    """Advisory lock on ``out_dir`` while it is written (see the module docstring); a context manager.

    The lock file sits beside the folder (so taking it creates the folder's parents, never the folder);
    it is removed again on release.
    """

    def __init__(self, out_dir: str | Path, *, field: str = "out") -> None:
        self.out = Path(out_dir)
        resolved = resolved_path(self.out, field)
        self.path = resolved.parent / f".{resolved.name or 'root'}{LOCK_SUFFIX}"
        self.field = field
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no advisory locks, write unlocked
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._cannot(exc) from exc
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise self._cannot(exc) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "owner unknown"
                os.close(fd)
                raise OutputError(
                    f"{self.field} {self.out} is being written by another longpack run ({owner}; lock file "
                    f"{self.path}); wait for it to finish, or choose another {self.field}",
                    fields=self.field,
                ) from None
            # The previous owner may have removed the file between our open and our flock: then the lock
            # is on a file nobody else can see; take the one at the path instead.
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                os.close(fd)
                continue
            held = os.fstat(fd)
            if (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
                os.close(fd)
                continue
            break
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still held: a waiter that opened it re-checks the path and retries
        os.close(self._fd)  # releases the flock
        self._fd = None

    def _cannot(self, exc: OSError) -> OutputError:
        return OutputError(
            f"{self.field} {self.out}: cannot create the lock file {self.path} ({exc.strerror}); longpack "
            f"locks an output folder while it writes it, beside the folder: make {self.path.parent} "
            f"writable or choose another {self.field}",
            fields=self.field,
        )


def write_array(fh: IO[bytes], array: Any) -> None:
    """Write ``array``'s bytes (C order) to the open binary file ``fh`` through ``fh.write``, in chunks.
    ``numpy.ndarray.tofile`` (and ``numpy.save`` onto a real file, which calls it) reports a full disk or a
    file-size limit as a bare ``OSError("N requested and M written")`` without its errno, which no caller
    can tell from a bug; ``fh.write`` raises the kernel's ``ENOSPC`` / ``EFBIG`` / ``EDQUOT``.

    >>> import io, numpy as np
    >>> buf = io.BytesIO(); write_array(buf, np.arange(3, dtype=np.int32))
    >>> np.frombuffer(buf.getvalue(), np.int32).tolist()
    [0, 1, 2]
    """
    import numpy as np

    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    step = 1 << 24
    for lo in range(0, len(flat), step):
        fh.write(flat[lo : lo + step].data)


class ArrayWriter:
    """A file object that :func:`numpy.save` writes through ``write`` only (not ``tofile``), so that a full
    disk keeps its errno (:func:`write_array`)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh

    def write(self, data: Any) -> int:
        return self.fh.write(data)


@contextlib.contextmanager
def output_write_errors(out: str | Path, *, field: str = "out") -> Iterator[None]:
    """Report a storage failure while writing ``out`` as an :class:`OutputError` (the folder stays
    unfinished: its manifest is written last, so none was written).

    >>> with output_write_errors("/data/packed"):
    ...     raise OSError(errno.ENOSPC, "No space left on device", "/data/packed/training_8.idx.parquet")
    Traceback (most recent call last):
    ...
    longpack.errors.OutputError: out /data/packed: cannot write /data/packed/training_8.idx.parquet: No space left on device (the disk is full); the folder has no manifest.json and reads as unfinished: free space, then pack again with overwrite=True
    """
    try:
        yield
    except LongpackError:
        raise
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise write_error(exc, out, field=field) from exc


def write_error(
    exc: OSError,
    out: str | Path,
    *,
    field: str = "out",
    manifest: str = "manifest.json",
    again: str = "pack",
    option: str = "overwrite",
) -> OutputError:
    """The :class:`OutputError` of a refused write (``exc.errno`` in :data:`WRITE_ERRNOS`) into the folder
    ``out`` whose ``manifest`` is written last: what failed, why, and the fix (``again``: the command to run
    again, e.g. ``pack`` or ``tokenize``, with ``option``: ``overwrite``, or ``resume`` where the finished
    parts are kept).

    >>> str(write_error(OSError(errno.ENOSPC, "x", "/s/tokens.npy"), "/s", manifest="store.json", again="tokenize"))
    'out /s: cannot write /s/tokens.npy: No space left on device (the disk is full); the folder has no store.json and reads as unfinished: free space, then tokenize again with overwrite=True'
    """
    assert exc.errno is not None
    what = f" {exc.filename}" if exc.filename else ""
    hint, fix = _WRITE_ERROR_HINTS.get(exc.errno, ("", "fix the storage"))
    return OutputError(
        f"{field} {out}: cannot write{what}: {os.strerror(exc.errno)}{hint}; the folder has no "
        f"{manifest} and reads as unfinished: {fix}, then {again} again with {option}=True",
        fields=(field, option),
    )


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that a rename in it is durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """Temporary sibling of ``path`` (same folder, so the final rename is atomic).

    >>> temp_path(Path("out/manifest.json")).name.startswith(".manifest.json.tmp-")
    True
    """
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def commit_file(tmp: Path, path: Path) -> None:
    """fsync ``tmp`` (a finished file a writer such as pyarrow closed), rename it onto ``path``, fsync the
    folder."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` atomically: ``write(fh)`` fills a binary temp file in the same folder, which is
    fsynced and renamed onto ``path`` (then the folder is fsynced); on any error no temp file is left.

    >>> import json, tempfile
    >>> p = Path(tempfile.mkdtemp()) / "x.json"
    >>> atomic_write(p, lambda fh: fh.write(json.dumps([1]).encode())); p.read_text()
    '[1]'
    """
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "x.json"
    >>> atomic_write_bytes(p, b"[]"); p.read_bytes(), sorted(q.name for q in p.parent.iterdir())
    (b'[]', ['x.json'])
    """
    atomic_write(path, lambda fh: fh.write(data))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "a.txt"; _ = p.write_bytes(b"abc")
    >>> sha256_file(p)[:12]
    'ba7816bf8f01'
    """
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def new_scratch_file(folder: Path, stem: str) -> tuple[Path, IO[bytes]]:
    """A new, empty scratch file ``folder/STEM-*.bin`` opened for writing: created exclusively
    (``O_EXCL``), so it never truncates a file that exists, whoever made it. A name made from the process
    id and an object's ``id()`` did: ``id()`` is reused once an object is freed, and a second scratch file
    truncated the first while its memory map was still being read (SIGBUS in the row fill, or its bytes
    silently replaced).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> (a, fa), (b, fb) = new_scratch_file(d, "tokens"), new_scratch_file(d, "tokens")
    >>> a != b, a.name.startswith("tokens-"), a.suffix
    (True, True, '.bin')
    >>> fa.close(); fb.close()
    """
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{stem}-", suffix=".bin", dir=folder)
    return Path(name), os.fdopen(fd, "wb")


def map_scratch(path: Path, dtype: Any, n: int) -> Any:
    """A read-only memory map of the ``n`` values of ``dtype`` in the finished (closed) scratch file
    ``path``, after checking that the file holds exactly that many bytes: a map past a file's end, or of a
    file that shrinks, ends the process by SIGBUS when read; a short file is refused here instead.

    >>> import tempfile, numpy as np
    >>> d = Path(tempfile.mkdtemp()); p, fh = new_scratch_file(d, "t")
    >>> np.arange(4, dtype=np.int32).tofile(fh); fh.close()
    >>> map_scratch(p, np.int32, 4).tolist()
    [0, 1, 2, 3]
    >>> map_scratch(p, np.int32, 5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    longpack.errors.OutputError: ... holds 16 bytes where 20 were written (another process changed the scratch file or the disk refused a write); free space there and run again
    """
    import numpy as np

    dtype = np.dtype(dtype)
    want = n * dtype.itemsize
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise OutputError(f"{path}: the scratch file is gone ({exc.strerror}); run again") from exc
    if size != want:
        raise OutputError(
            f"{path}: holds {size} bytes where {want} were written (another process changed the scratch "
            "file or the disk refused a write); free space there and run again"
        )
    if n == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))
