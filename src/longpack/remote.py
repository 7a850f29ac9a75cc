"""Object storage (``s3://`` and any other fsspec URL) for a job's inputs, token stores and outputs.

A job given a URL runs on a **local stage**: its remote inputs (files, folders, globs, a ``store``) are
downloaded into a folder on this machine, the job runs there exactly as on local paths, and its outputs
(``out``, ``keep_store``) are then uploaded: every data file first, every manifest (``shard.json``,
``store.json``, ``manifest.json``) last, so a reader of the bucket sees an output as finished only once all of
it is there, as on a local disk. Paths of the stage that a manifest or an error message holds are written as
the URLs they stand for, and the staged inputs keep their objects' modification times: the manifests are
the ones a run on local copies would write, with the URLs in place of the local paths.

- The stage sits in ``$LONGPACK_STAGE_DIR`` (default: the system's temporary folder), one folder per
  output URL, and is removed once the upload finished. A run that stopped keeps it: ``tokenize --resume``
  with the same ``out`` URL keeps the shards the stage holds, downloads the ones only the bucket holds, and
  redoes the rest. With Ray on several machines, put the stage on a file system every node sees.
- Credentials and the endpoint come from the environment, as for any AWS client (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` for an S3-compatible server).
- A storage failure (a missing bucket, denied access, a dropped connection, an interrupted upload) is a
  :class:`~longpack.errors.StorageError` naming the URL, what was being done and the fix (the CLI: exit 2).
  An upload that stopped leaves no manifest, so the output reads as unfinished.

>>> is_url("s3://bucket/corpus/"), is_url("/data/corpus"), is_url("file:///data"), is_url(Path("s3://b"))
(True, False, False, False)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longpack.errors import LongpackError, OutputExistsError, StorageError

__all__ = ["STAGE_ENV", "Stage", "UrlPath", "as_path", "is_url", "read_text", "staged"]

#: Environment variable: the folder local stages are made in (default: ``tempfile.gettempdir()``).
STAGE_ENV = "LONGPACK_STAGE_DIR"

_GLOB_CHARS = frozenset("*?[")
#: Small text files of an output whose stage paths are written as URLs before the upload (besides manifests).
_TEXT_SUFFIXES = frozenset({".json", ".yaml", ".yml", ".txt"})


def is_url(value: object) -> bool:
    """Whether ``value`` is a URL text naming remote storage (``proto://...``, not ``file://``)."""
    if not isinstance(value, str) or "://" not in value:
        return False
    proto = value.split("://", 1)[0]
    return proto.replace("+", "").replace("-", "").replace(".", "").isalnum() and proto != "file"


class UrlPath(str):
    """A URL that joins like a :class:`~pathlib.Path` (``/``, ``name``, ``resolve``), for the results and
    summaries of an output at a URL (``Path("s3://b/x")`` would lose a slash).

    >>> p = UrlPath("s3://bucket/packed/")
    >>> str(p / "training_8.idx.parquet"), p.name, p.resolve() == p
    ('s3://bucket/packed/training_8.idx.parquet', 'packed', True)
    """

    __slots__ = ()

    def __truediv__(self, other: object) -> UrlPath:
        return UrlPath(self.rstrip("/") + "/" + str(other).lstrip("/"))

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    def resolve(self) -> UrlPath:
        return self


def as_path(value: str | os.PathLike[str]) -> Path:
    """A config's folder field in its canonical type: a :class:`UrlPath` for a URL, else a ``Path``."""
    return UrlPath(value) if is_url(value) else Path(value)  # type: ignore[return-value]


def _manifest_names() -> frozenset[str]:
    from longpack.packed.manifest import MANIFEST_NAME
    from longpack.store import SHARD_MANIFEST, STORE_MANIFEST

    return frozenset({MANIFEST_NAME, SHARD_MANIFEST, STORE_MANIFEST})


def _filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec file system, path in it)`` for ``url``; a fresh instance, so the environment's credentials
    are the ones of now (fsspec caches instances by their arguments)."""
    from longpack._optional import require

    fsspec = require("fsspec", "remote", purpose=f"reading or writing {url}")
    try:
        return fsspec.core.url_to_fs(url, skip_instance_cache=True)  # type: ignore[no-any-return]
    except (ImportError, ValueError) as exc:
        from longpack.errors import MissingDependencyError

        proto = url.split("://", 1)[0]
        if isinstance(exc, ImportError) or "Protocol not known" in str(exc):
            raise MissingDependencyError(
                f"{url}: the {proto}:// file system is not available ({exc}); for s3:// install "
                "pip install 'longpack[remote]'"
            ) from exc
        raise StorageError(f"{url}: not a storage URL fsspec can open ({exc})") from exc


def _storage_error(exc: BaseException, url: str, doing: str, fix: str) -> StorageError:
    """The :class:`StorageError` of a failed storage call: what, where, why (a missing bucket, denied
    access, anything else the client said) and the fix."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        why = f"access denied ({text}): check the credentials in the environment (AWS_ACCESS_KEY_ID, ...)"
    elif "bucket does not exist" in text or "NoSuchBucket" in text:
        why = f"the bucket does not exist ({text}): create it or fix the URL"
    elif isinstance(exc, FileNotFoundError):
        why = f"not found ({text})"
    else:
        why = f"{type(exc).__name__}: {text}"
    return StorageError(f"{url}: cannot {doing}: {why}; {fix}")


@contextlib.contextmanager
def _storage(url: str, doing: str, fix: str = "fix the storage, then run again") -> Iterator[None]:
    try:
        yield
    except LongpackError:
        raise
    except Exception as exc:  # the clients raise OSError, botocore / aiohttp errors and more
        raise _storage_error(exc, url, doing, fix) from exc


def read_text(path: str | os.PathLike[str]) -> str:
    """A small file's text, local or at a URL (a store's ``store.json`` read while a config is checked)."""
    if not is_url(path):
        return Path(path).read_text(encoding="utf-8")
    url = str(path)
    fs, p = _filesystem(url)
    try:
        return fs.cat_file(p).decode("utf-8")  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise _storage_error(exc, url, "read it", "fix the URL or the storage") from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _join(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel if rel else base.rstrip("/")


@dataclass
class Stage:
    """The local stage of one run (see the module docstring): ``input(url)`` downloads and gives the local
    path to read, ``output(url)`` the local folder to write, ``publish()`` uploads the outputs, manifests
    last.

    >>> s = Stage(Path("/tmp/stage"))
    >>> s.mapped["/tmp/stage/in/s3/"] = "s3://"
    >>> s.to_urls("cannot read /tmp/stage/in/s3/bucket/rows.jsonl:3")
    'cannot read s3://bucket/rows.jsonl:3'
    """

    root: Path
    #: local path prefix -> the URL prefix it stands for (longest first when rewritten)
    mapped: dict[str, str] = field(default_factory=dict)
    outputs: list[tuple[Path, str]] = field(default_factory=list)
    #: per output: remote relative path -> sha256 of the bytes downloaded from it (kept: not uploaded again)
    downloaded: dict[str, dict[str, str]] = field(default_factory=dict)

    def upload(self, fs: Any, local: Path, remote: str) -> None:
        """Put one local file at ``remote`` (the one place an object is written; tests interrupt it)."""
        fs.put_file(str(local), remote)

    # paths <-> URLs ---------------------------------------------------------------------------------------
    def to_urls(self, text: str) -> str:
        for local in sorted(self.mapped, key=len, reverse=True):
            text = text.replace(local, self.mapped[local])
        return text

    def to_local(self, text: str) -> str:
        for local, url in sorted(self.mapped.items(), key=lambda kv: len(kv[1]), reverse=True):
            text = text.replace(url, local)
        return text

    def _rewrite_text(self, path: Path, convert: Callable[[str], str]) -> None:
        text = path.read_text(encoding="utf-8")
        new = convert(text)
        if new != text:
            tmp = path.with_name(path.name + ".stage-tmp")
            tmp.write_text(new, encoding="utf-8")
            os.replace(tmp, path)

    # inputs ----------------------------------------------------------------------------------------------
    def input(self, url: str) -> str:
        """Download the file, folder or glob ``url`` into the stage; the local path (or glob) to read."""
        proto = url.split("://", 1)[0]
        base = self.root / "in" / proto
        self.mapped[f"{base}/"] = f"{proto}://"
        fs, path = _filesystem(url)
        with _storage(url, "read the input", "fix the URL, the bucket or the credentials"):
            if any(c in path for c in _GLOB_CHARS):
                found = sorted(fs.glob(path))
                keys = [p for p in found if fs.isfile(p)]
            elif fs.isfile(path):
                keys = [path]
            else:
                keys = sorted(fs.find(path))
                if not keys:
                    raise FileNotFoundError(f"no object at or under {url}")
            for key in keys:
                self._download(fs, key, base / key.lstrip("/"))
        return str(base / path.lstrip("/")) + ("/" if url.endswith("/") else "")

    def _download(self, fs: Any, key: str, local: Path) -> None:
        info = fs.info(key)
        size = int(info.get("size") or 0)
        mtime = _mtime(info)
        if (
            local.is_file()
            and local.stat().st_size == size
            and (mtime is None or local.stat().st_mtime == mtime)
        ):
            return  # staged by an earlier try of this run (resume)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".stage-tmp")
        fs.get_file(key, str(tmp))
        os.replace(tmp, local)
        if mtime is not None:  # the object's time, as a local copy would keep (store.json records it)
            os.utime(local, (mtime, mtime))

    # outputs ---------------------------------------------------------------------------------------------
    def output(
        self, url: str, *, name: str, overwrite: bool, resume: bool = False, field: str = "out"
    ) -> Path:
        """The local folder the job writes for ``url`` (checked now: the bucket exists and can be read; an
        existing output is refused unless ``overwrite`` or ``resume``). With ``resume`` what the bucket holds
        and the stage lacks is downloaded first, so the job keeps it."""
        local = self.root / name
        self.mapped[f"{local}"] = url.rstrip("/")
        fs, path = _filesystem(url)
        with _storage(url, "check the output", "create the bucket, fix the URL or the credentials"):
            existing = self._listing(fs, path)
        self.outputs.append((local, url))
        if local.exists() and not resume:
            shutil.rmtree(local)  # an earlier, stopped try's stage: this run starts over
        have: dict[str, str] = {}
        self.downloaded[url] = have
        if existing and not (overwrite or resume):
            raise OutputExistsError(
                f"{field} {url} already holds {len(existing)} objects; set overwrite=True (--overwrite) to replace "
                f"them{', resume=True (--resume) to finish an interrupted run' if field == 'out' else ''}, or "
                f"choose a new {field}",
                fields=(field, "overwrite"),
            )
        if resume and existing:
            with _storage(url, "download the finished shards", "run again with --resume"):
                for key in existing:
                    rel = key[len(path.rstrip("/")) + 1 :]
                    target = local / rel
                    if not target.is_file():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        fs.get_file(key, str(target))
                        have[rel] = _sha256(target)  # the bucket's bytes: not uploaded again if the same
                        if target.suffix in _TEXT_SUFFIXES:
                            self._rewrite_text(target, self.to_local)
        return local

    @staticmethod
    def _listing(fs: Any, path: str) -> list[str]:
        """The objects under ``path``; a missing bucket or denied access raise (``exists`` would say
        ``False`` to both)."""
        bucket, _, key = path.strip("/").partition("/")
        if not key:  # the bucket itself
            fs.ls(bucket, refresh=True)
            return sorted(fs.find(bucket))
        return sorted(fs.find(f"{bucket}/{key}/"))  # the trailing slash: a listing that raises

    def publish(self) -> None:
        """Upload every output folder, a folder at a time: its data files, then its manifest
        (``shard.json``), the top folder last, so ``store.json`` / ``manifest.json`` is the last object
        written; then remove the objects the new output does not hold. A shard whose ``shard.json`` made it
        is whole in the bucket, so ``--resume`` keeps it even when the upload stopped later."""
        manifests = _manifest_names()
        for local, url in self.outputs:
            fs, path = _filesystem(url)
            files = sorted(p for p in local.rglob("*") if p.is_file() and not p.name.endswith(".stage-tmp"))
            rels = sorted(
                (p.relative_to(local).as_posix() for p in files),
                key=lambda r: ("/" not in r, r.rpartition("/")[0], Path(r).name in manifests, r),
            )
            have = self.downloaded.get(url, {})
            fix = (
                "the output has no manifest and reads as unfinished; run again with the same out (tokenize: "
                "--resume keeps the shards uploaded)"
            )
            with _storage(url, "upload the output", fix):
                remote = set(self._listing(fs, path))
                prefix = path.rstrip("/") + "/"
                todo = []
                for rel in rels:
                    src = local / rel
                    if src.suffix in _TEXT_SUFFIXES:  # manifests, bridge_config.yaml, data_path.txt: URLs
                        self._rewrite_text(src, self.to_urls)
                    if not (rel in have and f"{prefix}{rel}" in remote and have[rel] == _sha256(src)):
                        todo.append(rel)  # else: downloaded from the bucket on resume, unchanged
                # a folder about to change reads as unfinished first (its manifest removed), the top one too
                changing = {r.rpartition("/")[0] for r in todo} | {""}
                stale_manifests = [
                    k
                    for k in remote
                    if Path(k).name in manifests and k[len(prefix) :].rpartition("/")[0] in changing
                ]
                if stale_manifests:
                    fs.rm(sorted(stale_manifests, key=lambda k: k.count("/")))
                keep = {f"{prefix}{r}" for r in rels}
                stale = sorted(k for k in remote if k not in keep and Path(k).name not in manifests)
                for done, rel in enumerate(todo):
                    if rel == todo[-1] and stale:  # before the last manifest: the old objects go
                        fs.rm(stale)
                    try:
                        self.upload(fs, local / rel, f"{prefix}{rel}")
                    except Exception as exc:
                        raise StorageError(
                            f"{url}: upload stopped after {done} of {len(todo)} files, at {rel} "
                            f"({type(exc).__name__}: {exc}); {fix}"
                        ) from exc

    def close(self, *, success: bool) -> None:
        """Remove the stage after a published run (a failed one keeps it for ``--resume``)."""
        if success:
            shutil.rmtree(self.root, ignore_errors=True)


def _mtime(info: dict[str, Any]) -> float | None:
    value = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def stage_root(key: str) -> Path:
    """The stage folder of a run writing ``key`` (its output URL): the same folder on every try, so a
    resumed run finds what a stopped one staged."""
    base = Path(os.environ.get(STAGE_ENV) or tempfile.gettempdir())
    return base / f"longpack-stage-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def staged(key: str) -> Iterator[Stage]:
    """A :class:`Stage` for one run (``key``: its output URL, or its inputs when only they are remote);
    the job's :class:`LongpackError` messages name the URLs, not the stage's paths."""
    stage = Stage(stage_root(key))
    stage.root.mkdir(parents=True, exist_ok=True)
    ok = False
    try:
        yield stage
        ok = True
    except LongpackError as exc:
        message = stage.to_urls(str(exc))
        if message == str(exc):
            raise
        new = type(exc).__new__(type(exc))
        LongpackError.__init__(new, message, fields=exc.fields)
        new.__dict__.update({k: v for k, v in exc.__dict__.items() if k != "fields"})
        raise new from exc
    finally:
        stage.close(success=ok)


def stage_inputs(stage: Stage, values: Sequence[str]) -> tuple[str, ...]:
    """Each remote input downloaded into ``stage`` (its local path); local inputs as given."""
    return tuple(stage.input(v) if is_url(v) else v for v in values)


def has_urls(*values: object) -> bool:
    """Whether any value (a path, or a sequence of paths) is a URL."""
    for value in values:
        items = value if isinstance(value, tuple | list) else (value,)
        if any(is_url(v) for v in items):
            return True
    return False
