"""The Ray executor of the pack job (``longpack pack --backend ray``, ``PackConfig(backend="ray")``):
tokenize everywhere, pack globally, write everywhere (Ray Data).

:class:`RayExecutor` runs the two heavy steps of ``longpack.jobs.PackConfig`` (see
``longpack.jobs.executors``); the job itself, its checks, the plan and the manifest are the same as on the
local executor. Three stages, each a Ray Data job; only lengths and sample ids ever reach the driver:

1. **Tokenize** (workers). The driver cuts the inputs into the same chunks as the local backend (JSONL:
   ~1 MiB cut at a newline, with its first line number; Parquet: one row group) while it hashes them for the
   manifest; it keeps only ``(file, offset, size, first line)`` per chunk. A dataset of these descriptors is
   mapped with ``map_batches``: each task reads its byte range / row group and runs
   ``longpack.text.pipeline.tokenize_chunk`` (the local backend's per-chunk code). The tokenized chunks stay
   in the Ray object store (spilled to disk when it fills); the driver pulls only the ``lengths`` and
   ``rows`` columns.
2. **Pack** (driver). :meth:`RayExecutor.tokenize` returns a :class:`~longpack.text.TokenizeResult` whose
   samples carry real offsets and provenance over a zero-byte token view (``np.broadcast_to``), so the local
   backend's ``plan_splits`` (alignment, over-long policy, validation carve-out, bin packing) runs unchanged.
3. **Route and write** (workers). Every packed sample gets ``(shard, position in shard)``; a ``map_batches``
   step cuts each tokenized chunk into per-shard pieces, ``groupby("shard").map_groups`` brings a shard's
   pieces together on one worker, which fills and writes the shard with the local backend's
   ``write_shard_file``. The job then writes metadata and the manifest on the driver, last.

Same inputs, settings and seed -> the same bytes as the local backend, for any worker count: chunks are cut
and numbered on the driver, samples are numbered by chunk, the plan is global, and each shard is written by
one task from its samples in plan order. A task whose worker dies is retried by Ray (``max_retries``); its
output is a pure function of its input, so a retry writes the same bytes. If retries run out, the error
propagates, the manifest is never written and the folder reads as unfinished.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from longpack import choices
from longpack.choices import DEFAULT_IDS_DTYPE
from longpack.errors import BackendError
from longpack.outputs import sha256_file
from longpack.packed.align import AlignedSamples
from longpack.packed.pipeline import PackSettings, SplitPlan, shard_layout, write_shard_file
from longpack.packed.plan import PackPlan
from longpack.samples import TokenizedSamples

MAX_TASK_RETRIES = 3


def _task_options() -> dict[str, Any]:
    # Ray Data retries tasks forever by default; a task that kills its worker every time must end the run.
    return {"max_retries": MAX_TASK_RETRIES}


class RayBackendError(BackendError):
    """A Ray stage failed after its retries; nothing was finished (no manifest)."""


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux ``ru_maxrss`` is in KiB).

    >>> peak_rss_bytes() > 0
    True
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def _worker_id() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _maybe_fail_once(fail: tuple[str, int] | None, stage: str, hit: bool) -> None:
    """Test hook: kill this worker unless ``<prefix>.<stage>.<k>`` exists for every ``k < times``."""
    if not fail or not hit:
        return
    prefix, times = fail
    for k in range(times):
        try:
            fd = os.open(f"{prefix}.{stage}.{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        os._exit(17)


# ---------------------------------------------------------------------------------------------- stage 1


@dataclass(frozen=True, kw_only=True)
class ChunkSpec:
    """Where one chunk of input rows lies: ``kind`` jsonl (``offset``/``size`` bytes, ``first_row`` = first
    line) or parquet (``row_group``, ``first_row`` = its first row)."""

    chunk: int
    file_index: int
    path: str
    kind: str
    fmt: str
    first_row: int
    offset: int = 0
    size: int = 0
    row_group: int = 0


def _chunk_specs(
    paths: list[Path], kinds: list[str], formats: list[str | None]
) -> tuple[list[ChunkSpec], list[str]]:
    """Chunk descriptors in global order and each file's sha256 (JSONL hashed while it is cut)."""
    from longpack.text import inputs as text_inputs

    specs: list[ChunkSpec] = []
    digests: list[str] = []
    for i, (path, kind, fmt) in enumerate(zip(paths, kinds, formats, strict=True)):
        if kind == "jsonl":
            hasher = hashlib.sha256()
            offset = 0
            for first, blob in text_inputs.jsonl_chunks(path, hasher, text_inputs.JSONL_CHUNK_BYTES):
                if fmt is not None:
                    specs.append(
                        ChunkSpec(
                            chunk=len(specs),
                            file_index=i,
                            path=str(path),
                            kind=kind,
                            fmt=fmt,
                            first_row=first,
                            offset=offset,
                            size=len(blob),
                        )
                    )
                offset += len(blob)
            digests.append(hasher.hexdigest())
        else:
            digests.append(sha256_file(path))
            if fmt is None:
                continue
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            first = 0
            for g in range(meta.num_row_groups):
                specs.append(
                    ChunkSpec(
                        chunk=len(specs),
                        file_index=i,
                        path=str(path),
                        kind=kind,
                        fmt=fmt,
                        first_row=first,
                        row_group=g,
                    )
                )
                first += meta.row_group(g).num_rows
    return specs, digests


def _chunk_payloads(spec: dict[str, Any]) -> Iterator[tuple[int, Any]]:
    """``(first_row, payload)`` pieces of one chunk, read on the worker."""
    if spec["kind"] == "jsonl":
        with open(spec["path"], "rb") as fh:
            fh.seek(int(spec["offset"]))
            yield int(spec["first_row"]), fh.read(int(spec["size"]))
        return
    import pyarrow.parquet as pq

    from longpack.text import inputs as text_inputs

    table = pq.ParquetFile(spec["path"]).read_row_group(int(spec["row_group"]))
    first = int(spec["first_row"])
    for batch in table.to_batches(max_chunksize=text_inputs.PARQUET_CHUNK_ROWS):
        yield first, batch
        first += batch.num_rows


def _tokenize_chunks(
    batch: dict[str, np.ndarray],
    *,
    config: Any,
    tokenizer: Any,
    token_dtype: str,
    fail_once: tuple[str, int] | None,
) -> dict[str, Any]:
    """map_batches UDF: chunk descriptors -> one row per chunk with its tokens as flat bytes."""
    from longpack.text.pipeline import tokenize_chunk

    out: dict[str, list[Any]] = {
        k: []
        for k in (
            "chunk",
            "tokens",
            "loss_mask",
            "lengths",
            "rows",
            "malformed",
            "rows_read",
            "worker",
            "columns",
            "empty",
        )
    }
    out["rss"] = []
    for j in range(len(batch["chunk"])):
        spec = {k: batch[k][j] for k in batch}
        _maybe_fail_once(fail_once, "tokenize", int(spec["chunk"]) == 0)
        parts = [
            tokenize_chunk(
                kind=str(spec["kind"]),
                file=str(spec["path"]),
                first_row=first,
                payload=payload,
                fmt=str(spec["fmt"]),
                config=config,
                tokenizer=tokenizer,
            )
            for first, payload in _chunk_payloads(spec)
        ]
        out["chunk"].append(int(spec["chunk"]))
        # One dtype for every chunk: readers may hand back int64 ids (e.g. straight from Parquet buffers).
        out["tokens"].append(b"".join(p.tokens.astype(token_dtype, copy=False).tobytes() for p in parts))
        out["loss_mask"].append(b"".join(p.loss_mask.tobytes() for p in parts))
        out["lengths"].append(b"".join(p.lengths.astype(np.int64).tobytes() for p in parts))
        out["rows"].append(b"".join(p.rows.astype(np.int64).tobytes() for p in parts))
        out["malformed"].append(json.dumps([m for p in parts for m in p.malformed]))
        empty, before = [], 0
        for p in parts:  # (row, samples of the chunk before it)
            empty += [(r, before + k) for r, k in p.empty]
            before += len(p.lengths)
        out["empty"].append(json.dumps(empty))
        out["rows_read"].append(sum(p.rows_read for p in parts))
        columns: dict[str, int] = {}
        for p in parts:
            for name, n in p.columns.items():
                columns[name] = columns.get(name, 0) + n
        out["columns"].append(json.dumps(columns))
        out["worker"].append(_worker_id())
        out["rss"].append(peak_rss_bytes())
    return {k: np.array(v, dtype=object) for k, v in out.items()}


@dataclass
class TokenizedDataset:
    """The tokenized chunks of one input set, held by the cluster, and where each chunk's samples start."""

    dataset: Any  # ray.data.MaterializedDataset
    token_dtype: str
    chunk_first_sample: np.ndarray  # int64 [C + 1]


# ---------------------------------------------------------------------------------------------- stage 3


def _route_chunks(batch: dict[str, np.ndarray], *, routes_ref: Any, token_dtype: str) -> dict[str, Any]:
    """map_batches UDF: one tokenized chunk -> one row per destination shard with that shard's samples."""
    import ray

    routes = ray.get(routes_ref)
    first_sample = routes["chunk_first_sample"]
    out: dict[str, list[Any]] = {k: [] for k in ("shard", "pos", "kept", "stored", "tokens", "loss_mask")}
    for j in range(len(batch["chunk"])):
        chunk = int(batch["chunk"][j])
        tokens = np.frombuffer(batch["tokens"][j], dtype=token_dtype)
        mask = np.frombuffer(batch["loss_mask"][j], dtype=np.uint8)
        lengths = np.frombuffer(batch["lengths"][j], dtype=np.int64)
        ids = np.arange(first_sample[chunk], first_sample[chunk + 1])
        shard = routes["shard"][ids]
        starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        # Packed samples grouped by shard (input order kept inside a shard): one sort, not a scan per shard.
        by_shard = np.argsort(shard, kind="stable")
        by_shard = by_shard[shard[by_shard] >= 0]
        bounds = np.flatnonzero(np.diff(shard[by_shard])) + 1
        for local in np.split(by_shard, bounds) if len(by_shard) else []:
            s = int(shard[local[0]])
            kept = routes["kept"][ids[local]]
            # Only the kept prefix travels (truncated tails never leave the worker).
            take = np.repeat(starts[local], kept) + (
                np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
            )
            out["shard"].append(s)
            out["pos"].append(routes["pos"][ids[local]].tobytes())
            out["kept"].append(kept.tobytes())
            out["stored"].append(routes["stored"][ids[local]].tobytes())
            out["tokens"].append(tokens[take].tobytes())
            out["loss_mask"].append(mask[take].tobytes())
    return {
        "shard": np.array(out["shard"], dtype=np.int64),
        **{k: np.array(v, dtype=object) for k, v in out.items() if k != "shard"},
    }


def _binary_values(column: Any, dtype: Any) -> np.ndarray:
    """All values of an Arrow binary column, back to back, as one numpy view (no copy for one chunk).

    >>> import pyarrow as pa
    >>> _binary_values(pa.chunked_array([pa.array([b"\\x01\\x00", b"\\x02\\x00"])]), np.int16).tolist()
    [1, 2]
    """
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offset_type = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=offset_type)[arr.offset : arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    if data is None:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=np.uint8)[int(offsets[0]) : int(offsets[-1])].view(dtype)


def _write_shard_group(
    group: Any,
    *,
    shards_ref: Any,
    out_dir: str,
    token_dtype: str,
    eos_id: int,
    fail_once: tuple[str, int] | None,
    ids_dtype: str = DEFAULT_IDS_DTYPE,
    writer_options: Any = None,
) -> dict[str, Any]:
    """map_groups UDF: every piece of one shard (an Arrow table) -> the shard's Parquet file, written by the
    local backend's ``write_shard_file``. Pieces are read in place from Arrow buffers (no per-piece copy)."""
    import ray

    shard = int(group.column("shard")[0].as_py())
    _maybe_fail_once(fail_once, "write", shard == 0)
    info = ray.get(shards_ref)[shard]
    pos = _binary_values(group.column("pos"), np.int64)
    kept = _binary_values(group.column("kept"), np.int64)
    stored = _binary_values(group.column("stored"), np.int64)
    tokens = _binary_values(group.column("tokens"), np.dtype(token_dtype))
    mask = _binary_values(group.column("loss_mask"), np.uint8)
    n = len(pos)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(kept, out=offsets[1:])
    samples = TokenizedSamples(
        tokens=tokens,
        loss_mask=mask,
        offsets=offsets,
        source_file=np.zeros(n, np.int32),
        source_row=np.zeros(n, np.int64),
        files=("",),
    )
    by_pos = np.argsort(pos, kind="stable")
    if not np.array_equal(pos[by_pos], np.arange(n)):
        raise RayBackendError(f"shard {info['name']}: got {n} samples whose positions are not 0..{n - 1}")
    aligned = AlignedSamples(
        samples=samples,
        eos_id=eos_id,
        max_seq_length=0,
        pad_seq_to_mult=1,
        cap=0,
        index=by_pos.astype(np.int64),
        kept=kept[by_pos],
        stored=stored[by_pos],
        truncated=np.zeros(0, np.int64),
        dropped=np.zeros(0, np.int64),
        dropped_reason=(),
    )
    plan = PackPlan(order=np.arange(n, dtype=np.int64), row_offsets=info["row_offsets"])
    record = write_shard_file(
        Path(out_dir) / info["name"],
        aligned,
        plan,
        0,
        plan.num_rows,
        ids_dtype=ids_dtype,
        options=writer_options,
        name=info["name"],
    )
    return {
        "shard": np.array([shard]),
        "record": np.array([json.dumps(record)], dtype=object),
        "worker": np.array([_worker_id()], dtype=object),
        "rss": np.array([peak_rss_bytes()]),
    }


# ---------------------------------------------------------------------------------------------- driver


def _unwrap(exc: BaseException, *, storage: bool = False) -> BaseException:
    """The user-level exception inside Ray's wrappers (RayTaskError, UserCodeException), if any: a
    ``LongpackError`` (a row's ``file:line``), or (``storage``, the write stage) an ``OSError`` of the
    storage (a full disk on a worker), which the job reports as an output error.

    Ray re-raises a task's exception as a ``RayTaskError(<its class>)``: an instance of both, whose
    message is the whole remote stack trace, with the original in ``.cause``. So ``.cause`` is followed
    first, and the original, not the wrapper, is returned (its own message, nothing buried).

    >>> from longpack.errors import InputError
    >>> class RayTaskError(Exception): ...
    >>> original = InputError("a.jsonl:2: missing key 'completion'")
    >>> wrapper = type("RayTaskError(InputError)", (RayTaskError, InputError), {})("Traceback ...")
    >>> wrapper.cause = original
    >>> try:
    ...     raise RuntimeError("Ray Data task failed") from wrapper
    ... except RuntimeError as exc:
    ...     _unwrap(exc) is original
    True
    """
    from longpack.errors import LongpackError
    from longpack.outputs import WRITE_ERRNOS

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        cause = getattr(cur, "cause", None)
        if isinstance(cause, BaseException):  # a Ray wrapper: look inside before trusting its type
            cur = cause
            continue
        if isinstance(cur, LongpackError):
            return cur
        if storage and isinstance(cur, OSError) and cur.errno in WRITE_ERRNOS:
            return cur
        cur = cur.__cause__ or cur.__context__
    return exc


@dataclass
class RayExecutor:
    """A connection to a Ray cluster that tokenizes and writes for the pack job.

    ``address=None`` joins the running cluster of this process (``ray.init`` already called) or starts a
    local one; ``"auto"`` or ``"ray://host:10001"`` joins an existing cluster. ``workers`` caps concurrent
    tasks per stage (``None``: as many as the cluster has CPUs). The job uses it as a context manager.

    >>> import longpack
    >>> config = longpack.PackConfig(demo=True, out="out/demo", backend=RayExecutor(address="auto"))
    >>> config.backend.name
    'ray'
    """

    address: str | None = None
    workers: int | None = None
    # Test hook: a marker path prefix. The first ``fail_times`` attempts of the task for chunk 0 (tokenize)
    # and for shard 0 (write) each create a marker ``<prefix>.<stage>.<k>`` and kill their worker process, as
    # a crashed node would; Ray retries the task up to MAX_TASK_RETRIES times.
    fail_once: str | None = None
    fail_times: int = 1
    _started: bool = False
    _rss: dict[str, int] = field(default_factory=dict)
    name = "ray"
    #: None of ``longpack.choices.EXECUTOR_CAPABILITIES``: the driver holds no tokens, and the workers write
    #: Parquet shards of whole samples.
    #: Indexed prefixes from a sharded store (``longpack.jobs.sharded_tokenize``): one Ray task per prefix.
    capabilities: ClassVar[frozenset[str]] = frozenset({choices.SHARDED_INDEXED})

    @classmethod
    def supports(cls, capability: str) -> bool:
        """``capability in capabilities``."""
        return capability in cls.capabilities

    @property
    def _fail(self) -> tuple[str, int] | None:
        return (self.fail_once, self.fail_times) if self.fail_once else None

    def __enter__(self) -> RayExecutor:
        try:
            import ray
            import ray.data
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RayBackendError(
                "--backend ray needs Ray Data: pip install 'longpack[ray]' (or 'ray[data]')"
            ) from exc
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            self._started = True
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = sys.stderr.isatty()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            import ray

            ray.shutdown()

    def _note(self, workers: Any, rss: Any) -> None:
        for w, r in zip(workers, rss, strict=True):
            self._rss[str(w)] = max(self._rss.get(str(w), 0), int(r))

    def report(self) -> dict[str, Any]:
        """For the job's result: :meth:`memory_report`."""
        return self.memory_report()

    def memory_report(self) -> dict[str, Any]:
        """Peak RSS in bytes: the driver, and every worker process that ran a task (``host:pid``)."""
        return {
            "driver_peak_rss_bytes": peak_rss_bytes(),
            "worker_peak_rss_bytes": dict(sorted(self._rss.items())),
        }

    def _run(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            with warnings.catch_warnings():
                # Ray Data 2.60 deprecates per-task options without a named replacement for max_retries;
                # pyproject pins ray < 2.64, where they are removed.
                warnings.filterwarnings("ignore", message=r".*ray_remote_args.* is deprecated")
                return fn()
        except Exception as exc:
            inner = _unwrap(exc, storage=what == "write")
            if inner is not exc:
                raise inner from exc
            raise RayBackendError(f"Ray {what} stage failed after retries: {exc}") from exc

    def tokenize(
        self, inputs: Sequence[str], *, tokenizer: Any, config: Any, progress: bool = False
    ) -> tuple[Any, TokenizedDataset]:
        """Tokenize ``inputs`` on the workers; return the local backend's ``TokenizeResult`` shape with a
        lengths-only sample set (offsets, provenance; tokens a zero-byte view) and the cluster-held tokens.
        ``tokenizer``: a spec or a loaded tokenizer (``longpack.text.tokenizers.as_tokenizer``); Ray Data
        draws its own progress bars (on a terminal), so ``progress`` is not used."""
        import ray.data

        from longpack.text import InputError, TokenizeResult, resolve_inputs
        from longpack.text.inputs import find_inputs, input_kind
        from longpack.text.pipeline import detect_file_format, is_json_array
        from longpack.text.tokenizers import as_tokenizer

        tok = as_tokenizer(tokenizer)
        from longpack.text.documents import eod_id

        eod = eod_id(tok, config.eod)  # a bad text.eod fails now, not on every worker
        listing = find_inputs(inputs)
        for f in listing.files:
            if f.kind == "hf" or f.compression or (f.kind == "jsonl" and is_json_array(f.path)):
                raise InputError(
                    f"{f.label}: the ray backend reads plain JSON Lines and Parquet files; use the local "
                    "backend for compressed files, JSON arrays and datasets folders, or convert them first"
                )
        paths = resolve_inputs(inputs)
        kinds = [input_kind(p) for p in paths]
        formats = [detect_file_format(p, config) for p in paths]
        specs, digests = _chunk_specs(paths, kinds, formats)
        files = tuple(str(p) for p in paths)
        token_dtype = "int32" if tok.vocab_size <= np.iinfo(np.int32).max else "int64"
        rows_per_file = [0] * len(paths)
        malformed_per_file = [0] * len(paths)
        columns_per_file: list[dict[str, int]] = [{} for _ in paths]
        lengths_parts: list[np.ndarray] = []
        rows_parts: list[np.ndarray] = []
        file_parts: list[np.ndarray] = []
        malformed: list[tuple[str, str]] = []
        empty: list[tuple[str, int]] = []  # (file:line, samples before it)
        counts: list[int] = []
        dataset = None
        if specs:
            items = [{k: getattr(s, k) for k in s.__dataclass_fields__} for s in specs]

            def run() -> Any:
                ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                    _tokenize_chunks,  # type: ignore[arg-type]
                    batch_size=1,
                    batch_format="numpy",
                    fn_kwargs={
                        "config": config,
                        "tokenizer": tok.portable(),
                        "token_dtype": token_dtype,
                        "fail_once": self._fail,
                    },
                    concurrency=self.workers,
                    ray_remote_args_fn=_task_options,
                )
                done = ds.materialize()
                small = done.select_columns(
                    [
                        "chunk",
                        "lengths",
                        "rows",
                        "malformed",
                        "rows_read",
                        "worker",
                        "rss",
                        "columns",
                        "empty",
                    ]
                )
                return done, small.take_all()

            dataset, meta = self._run("tokenize", run)
            meta.sort(key=lambda r: int(r["chunk"]))
            self._note([r["worker"] for r in meta], [r["rss"] for r in meta])
            for r in meta:
                spec = specs[int(r["chunk"])]
                lengths = np.frombuffer(r["lengths"], dtype=np.int64)
                lengths_parts.append(lengths)
                rows_parts.append(np.frombuffer(r["rows"], dtype=np.int64))
                file_parts.append(np.full(len(lengths), spec.file_index, dtype=np.int32))
                before = sum(counts)
                empty += [(f"{spec.path}:{row}", before + k) for row, k in json.loads(r["empty"])]
                counts.append(len(lengths))
                rows_per_file[spec.file_index] += int(r["rows_read"])
                chunk_malformed = json.loads(r["malformed"])
                malformed_per_file[spec.file_index] += len(chunk_malformed)
                malformed += [(f"{spec.path}:{row}", reason) for row, reason in chunk_malformed]
                seen = columns_per_file[spec.file_index]
                for name, n in json.loads(r["columns"]).items():
                    seen[name] = seen.get(name, 0) + n
        # The same checks and messages as tokenize_inputs.
        rows_read = sum(rows_per_file)
        if rows_read == 0:
            raise InputError(
                f"no rows in the inputs ({', '.join(files)}): every file is empty; check the inputs"
            )
        lengths = np.concatenate(lengths_parts) if lengths_parts else np.zeros(0, np.int64)
        if len(lengths) == 0:
            from longpack.text.pipeline import no_samples_message

            raise InputError(no_samples_message(rows_read, malformed, len(empty)))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        samples = TokenizedSamples(
            # The tokens stay on the workers: zero-byte views of the right length keep the shape checks.
            tokens=np.broadcast_to(np.zeros(1, dtype=token_dtype), (total,)),
            loss_mask=np.broadcast_to(np.zeros(1, dtype=np.uint8), (total,)),
            offsets=offsets,
            source_file=np.concatenate(file_parts),
            source_row=np.concatenate(rows_parts),
            files=files,
        )
        from longpack.text.inputs import input_file
        from longpack.text.pipeline import arrow_schema, column_report

        infos = []
        warnings: list[str] = []
        for i in range(len(paths)):
            col_counts = columns_per_file[i]
            if kinds[i] == "parquet":
                names, num_rows = arrow_schema(input_file(paths[i]))
                col_counts = dict.fromkeys(names, num_rows)
            columns, col_warnings = column_report(files[i], formats[i], config, col_counts, rows_per_file[i])
            warnings += col_warnings
            infos.append(
                {
                    "path": files[i],
                    "size_bytes": paths[i].stat().st_size,
                    "sha256": digests[i],
                    "format": formats[i],
                    "rows": rows_per_file[i],
                    "malformed": malformed_per_file[i],
                    "kind": kinds[i],
                    "compression": None,
                    "columns": columns,
                }
            )
        input_info = tuple(infos)
        first_sample = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=first_sample[1:])
        result = TokenizeResult(
            samples=samples,
            format=",".join(sorted({f for f in formats if f is not None})),
            rows_read=rows_read,
            malformed=tuple(malformed),
            tokenizer=tok.identity(),
            inputs=input_info,
            skipped_inputs=listing.skipped,
            warnings=(*warnings, *_skipped_warning(listing)),
            empty=tuple(e for e, _ in empty),
            empty_before=tuple(k for _, k in empty),
            eod_id=eod,
        )
        return result, TokenizedDataset(
            dataset=dataset, token_dtype=token_dtype, chunk_first_sample=first_sample
        )

    def write(
        self,
        out: Path,
        splits: Sequence[SplitPlan],
        settings: PackSettings,
        *,
        sources: Mapping[str, TokenizedDataset],
        progress: bool = False,
    ) -> dict[str, list[dict[str, Any]]]:
        """Route every packed sample to its shard and write the shards on the workers, into the existing
        folder ``out``; return split name -> shard file records. ``sources`` maps each split name to the
        tokenized set (from :meth:`tokenize`) its samples index."""
        import ray

        out = Path(out)
        shard_info: list[dict[str, Any]] = []
        shard_split: list[str] = []
        by_source: dict[int, tuple[TokenizedDataset, dict[str, np.ndarray]]] = {}
        eos_id = splits[0].aligned.eos_id
        for split in splits:
            if split.name not in sources or not isinstance(sources[split.name], TokenizedDataset):
                raise RayBackendError(
                    f"split {split.name!r}: no tokenized set from this executor's tokenize() was given for it"
                )
            src = sources[split.name]
            n_samples = len(split.aligned.samples)
            if id(src) not in by_source:
                by_source[id(src)] = (
                    src,
                    {
                        "shard": np.full(n_samples, -1, dtype=np.int64),
                        "pos": np.zeros(n_samples, dtype=np.int64),
                        "kept": np.zeros(n_samples, dtype=np.int64),
                        "stored": np.zeros(n_samples, dtype=np.int64),
                    },
                )
            routes = by_source[id(src)][1]
            plan, aligned = split.plan, split.aligned
            items = plan.order  # aligned positions, row after row
            sample_ids = aligned.index[items]
            for name, lo, hi in shard_layout(split.name, plan.num_rows, settings):
                first, last = int(plan.row_offsets[lo]), int(plan.row_offsets[hi])
                ids = sample_ids[first:last]
                routes["shard"][ids] = len(shard_info)
                routes["pos"][ids] = np.arange(last - first)
                routes["kept"][ids] = aligned.kept[items[first:last]]
                routes["stored"][ids] = aligned.stored[items[first:last]]
                shard_info.append({"name": name, "row_offsets": plan.row_offsets[lo : hi + 1] - first})
                shard_split.append(split.name)
        shards_ref = ray.put(shard_info)
        written: dict[int, dict[str, Any]] = {}
        for src, routes in by_source.values():
            routes_ref = ray.put({**routes, "chunk_first_sample": src.chunk_first_sample})
            n_shards = len(np.unique(routes["shard"][routes["shard"] >= 0]))

            def run(
                src: TokenizedDataset = src, routes_ref: Any = routes_ref, n_shards: int = n_shards
            ) -> Any:
                pieces = src.dataset.map_batches(
                    _route_chunks,
                    batch_size=1,
                    batch_format="numpy",
                    fn_kwargs={"routes_ref": routes_ref, "token_dtype": src.token_dtype},
                    concurrency=self.workers,
                    ray_remote_args_fn=_task_options,
                )
                return (
                    pieces.groupby("shard", num_partitions=max(1, n_shards))
                    .map_groups(
                        _write_shard_group,
                        batch_format="pyarrow",
                        fn_kwargs={
                            "shards_ref": shards_ref,
                            "out_dir": str(out.resolve()),
                            "token_dtype": src.token_dtype,
                            "eos_id": eos_id,
                            "fail_once": self._fail,
                            "ids_dtype": settings.ids_dtype,
                            "writer_options": settings.writer_options,
                        },
                        ray_remote_args_fn=_task_options,
                    )
                    .take_all()
                )

            results = self._run("write", run)
            self._note([r["worker"] for r in results], [r["rss"] for r in results])
            for r in results:
                written[int(r["shard"])] = json.loads(r["record"])
        missing = [shard_info[i]["name"] for i in range(len(shard_info)) if i not in written]
        if missing:
            raise RayBackendError(
                f"Ray write stage returned no record for shards {missing}; output unfinished"
            )
        files: dict[str, list[dict[str, Any]]] = {s.name: [] for s in splits}
        for i, name in enumerate(shard_split):
            files[name].append(written[i])
        return files


def _skipped_warning(listing: Any) -> tuple[str, ...]:
    """The same "not read" line the local backend reports for paths folders and globs held."""
    if not listing.skipped:
        return ()
    counts = listing.skipped_summary()
    return (
        "not read: "
        + ", ".join(f"{n} {why}" for why, n in counts.items())
        + " (each listed under skipped_inputs)",
    )


def _task(fn: Callable[..., Any], fail: tuple[str, int] | None, first: bool, *args: Any) -> Any:
    _maybe_fail_once(fail, "task", first)
    return fn(*args)


def run_ray_tasks(
    fn: Callable[..., Any],
    arguments: Sequence[tuple[Any, ...]],
    *,
    address: str | None = None,
    workers: int | None = None,
    fail_once: tuple[str, int] | None = None,
) -> list[Any]:
    """``fn(*args)`` for every ``args`` of ``arguments`` as Ray tasks (one CPU each, at most ``workers`` in
    flight, each retried up to :data:`MAX_TASK_RETRIES` times when its worker dies: ``fn`` must give the
    same result when run again), on the cluster at ``address`` (or the one this process joined, or a new
    local one); the results in completion order. A task's ``LongpackError`` is raised as itself.
    ``fail_once`` (tests): the first task's worker dies as a lost node would (see ``RayExecutor``)."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RayBackendError("--backend ray needs Ray: pip install 'longpack[ray]'") from exc
    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=MAX_TASK_RETRIES)(_task)
        pending = [(fn, fail_once, i == 0, *args) for i, args in enumerate(arguments)][::-1]
        limit = workers or len(pending) or 1
        in_flight: list[Any] = []
        out: list[Any] = []
        while pending or in_flight:
            while pending and len(in_flight) < limit:
                in_flight.append(remote.remote(*pending.pop()))
            ready, in_flight = ray.wait(in_flight, num_returns=1)
            try:
                out += ray.get(ready)
            except Exception as exc:
                inner = _unwrap(exc, storage=True)
                if inner is not exc:
                    raise inner from exc
                raise RayBackendError(f"a Ray task failed after retries: {exc}") from exc
        return out
    finally:
        if started:
            ray.shutdown()
