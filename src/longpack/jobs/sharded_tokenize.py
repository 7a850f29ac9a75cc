"""``longpack tokenize --shard-bytes N`` (and ``--backend ray``): the inputs tokenized shard by shard
(:mod:`longpack.text.shards`), every shard written by the worker that tokenized it
(:func:`longpack.store.write_shard`), the store's manifest written last by the driver
(:func:`longpack.store.finish_store`). Memory: a worker holds one shard; the driver holds the plan and the
shards' small reports. With ``resume`` a shard already written from the same chunks is kept, so a killed run
redoes only the unfinished shards; the store is the same bytes either way.

``pack --output-format indexed --backend ray`` goes through such a store (``--store``, ``--keep-store``, or
a scratch one next to ``--out``): each Megatron prefix is written by one Ray task from the store's memory
maps (:func:`write_indexed_from_store`), with the same prefix layout, bytes and manifest as the local
backend; the driver holds only the documents' lengths and EOD positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from longpack.choices import LOCAL_BACKEND, RAY_BACKEND
from longpack.text import TextConfig

__all__ = ["pack_indexed_sharded", "tokenize_sharded", "write_indexed_from_store"]


def _write_one(
    out: str, plan: Any, k: int, tokenizer: Any, config: TextConfig
) -> tuple[int, int, dict[str, Any]]:
    """Tokenize shard ``k`` and write it (in a worker); ``(k, samples, report part)``."""
    from longpack.store import write_shard
    from longpack.text.shards import tokenize_shard

    samples, meta = tokenize_shard(plan, k, tokenizer=tokenizer, config=config)
    write_shard(out, k, samples, {"key": plan.shard_key(k), "report": meta})
    return k, len(samples), meta


def _prepare(out: Path, *, overwrite: bool, resume: bool) -> None:
    from longpack.errors import OutputExistsError
    from longpack.store import SHARDS_DIR, STORE_MANIFEST, remove_store

    if not out.exists():
        return
    present = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    if not present or resume:
        if resume and present - {SHARDS_DIR, STORE_MANIFEST}:
            raise OutputExistsError(
                f"resume: {out} holds files that are not a sharded token store's; resume a store folder",
                fields=("out", "resume"),
            )
        return
    if not overwrite:
        raise OutputExistsError(
            f"store folder {out} already exists; set overwrite=True (--overwrite) to replace it, resume=True "
            "(--resume) to finish an interrupted run, or choose a new out",
            fields=("out", "overwrite"),
        )
    foreign = sorted(
        n for n in present if n not in {SHARDS_DIR, STORE_MANIFEST, *(f"{a}.npy" for a in _arrays())}
    )
    if foreign:
        raise OutputExistsError(
            f"overwrite refused: {out} holds files that are not a token store's ({', '.join(foreign[:5])})",
            fields=("out", "overwrite"),
        )
    remove_store(out)


def _arrays() -> tuple[str, ...]:
    from longpack.store import ARRAYS

    return ARRAYS


def tokenize_sharded(
    inputs: Sequence[str],
    out: Path,
    *,
    tokenizer: Any,
    config: TextConfig,
    shard_bytes: int,
    workers: int | None = None,
    backend: str = LOCAL_BACKEND,
    ray_address: str | None = None,
    overwrite: bool = False,
    resume: bool = False,
    fail_once: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into the sharded store ``out``; return its manifest (``store.json``).
    ``fail_once`` (tests, Ray): the first shard's worker dies once, as a lost node would."""
    from longpack.jobs.stores import record_of, store_identities
    from longpack.store import STORE_MANIFEST, finish_store, finished_shards
    from longpack.text.documents import eod_id
    from longpack.text.pipeline import TokenizeResult
    from longpack.text.shards import join_reports, plan_shards
    from longpack.text.tokenizers import as_tokenizer

    tok = as_tokenizer(tokenizer)
    eod_id(tok, config.eod)  # a bad text.eod fails before any work
    _prepare(out, overwrite=overwrite, resume=resume)
    (out / STORE_MANIFEST).unlink(missing_ok=True)  # resumed: published again at the end
    plan = plan_shards(list(inputs), config, shard_bytes=shard_bytes)
    done = finished_shards(out) if resume else {}
    results: dict[int, tuple[int, dict[str, Any]]] = {}
    for k, m in done.items():
        if k < len(plan.shards) and m.get("meta", {}).get("key") == plan.shard_key(k):
            results[k] = (int(m["samples"]), m["meta"]["report"])
    todo = [k for k in range(len(plan.shards)) if k not in results]
    portable = tok.portable()
    if backend == RAY_BACKEND:
        from longpack.cluster.ray_pack import run_ray_tasks

        for k, n, meta in run_ray_tasks(
            _write_one, [(str(out), plan.only(k), k, portable, config) for k in todo], address=ray_address,
            workers=workers, fail_once=fail_once,
        ):  # fmt: skip
            results[k] = (n, meta)
    else:
        from longpack.text.pipeline import default_workers

        n_workers = min(default_workers() if workers is None else workers, max(len(todo), 1))
        if n_workers <= 1:
            for k in todo:
                _, n, meta = _write_one(str(out), plan, k, portable, config)
                results[k] = (n, meta)
        else:
            with ProcessPoolExecutor(n_workers) as pool:
                futures = [pool.submit(_write_one, str(out), plan.only(k), k, portable, config) for k in todo]
                for f in futures:
                    k, n, meta = f.result()
                    results[k] = (n, meta)
    order = range(len(plan.shards))
    fields_ = join_reports(
        plan, [results[k][1] for k in order], [results[k][0] for k in order], tokenizer=tok, config=config
    )
    result = TokenizeResult(samples=None, **fields_)  # type: ignore[arg-type]
    import shutil

    from longpack.store import shard_folder

    for k in done:  # shards of an earlier plan (the inputs changed since): not this store's
        if k >= len(plan.shards):
            shutil.rmtree(shard_folder(out, k), ignore_errors=True)
    return finish_store(
        out, len(plan.shards), plan.files, record_of(result, config), input_files=store_identities(result)
    )


def _write_prefix(
    j: int, store: str, prefix: str, lo: int, hi: int, empty: Any, vocab_size: int, eod_id: int
) -> tuple[int, dict[str, Any], Any]:
    """One prefix (documents ``lo .. hi - 1`` of the store) written by one worker."""
    from longpack.packed.indexed import write_indexed_part
    from longpack.store import TokenStore

    samples = TokenStore.open(store, join=False).samples_pieces(lo, hi)  # views: nothing joined
    record, cuts = write_indexed_part(
        Path(prefix), samples, vocab_size=vocab_size, eod_id=eod_id, empty_before=empty
    )
    return j, record, cuts


def write_indexed_from_store(
    store: Path,
    out: Path,
    settings: Any,
    provenance: Any,
    *,
    vocab_size: int,
    eod_id: int,
    backend: str = LOCAL_BACKEND,
    ray_address: str | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The indexed output of every sample of the store at ``store`` into the prepared folder ``out``: one
    writer per prefix (Ray tasks, or one after the other here: one prefix in memory at a time), then
    ``data_path.txt`` and the manifest (``longpack.packed.indexed.finish_indexed_output``)."""
    import numpy as np

    from longpack.packed.indexed import finish_indexed_output, indexed_layout
    from longpack.store import TokenStore

    opened = TokenStore.open(store, join=False)
    lengths = opened.lengths()
    empty_before = np.asarray([int(k) for _, k in opened.record.get("empty", ())], dtype=np.int64)
    layout = indexed_layout(lengths, settings.rows_per_shard, empty_before)
    tasks = [
        (j, str(store), str(out / name), lo, hi, empty, vocab_size, eod_id)
        for j, (name, (lo, hi), empty) in enumerate(layout)
    ]
    if backend == RAY_BACKEND:
        from longpack.cluster.ray_pack import run_ray_tasks

        results = run_ray_tasks(_write_prefix, tasks, address=ray_address, workers=workers)
    else:
        results = [_write_prefix(*t) for t in tasks]
    results.sort(key=lambda r: r[0])
    written = [(record, cuts) for _, record, cuts in results]
    return finish_indexed_output(
        out, written, lengths, settings, provenance, vocab_size=vocab_size, eos_id=eod_id,
        empty=len(empty_before),
    )  # fmt: skip


def pack_indexed_sharded(job: Any, out: Path, tokenizer: Any, stack: Any) -> Any:
    """``PackConfig.run`` for ``output_format="indexed"`` on Ray, or locally within ``memory_budget``: the
    inputs tokenized into a sharded store (``job.keep_store``, or a scratch folder next to ``out``; on the
    cluster, or by local worker processes with shards of a quarter of the budget per worker), or
    ``job.store`` read; then every prefix written by a Ray task, or one after the other here
    (:func:`write_indexed_from_store`)."""
    from longpack import choices
    from longpack.jobs.out_of_core import parse_memory_budget, spill_folder
    from longpack.jobs.stores import open_store
    from longpack.text.shards import SHARD_BYTES

    backend = LOCAL_BACKEND if job._supports(choices.ONE_FILE_PER_SPLIT) else RAY_BACKEND
    ray_address = job.ray_address if isinstance(job.backend, str) else getattr(job.backend, "address", None)
    ray_workers = job.workers if isinstance(job.backend, str) else getattr(job.backend, "workers", None)
    shard_bytes = SHARD_BYTES
    if backend == LOCAL_BACKEND:
        from longpack.text.pipeline import default_workers

        workers = ray_workers or default_workers()
        shard_bytes = max(
            1 << 20,
            min(SHARD_BYTES, int(parse_memory_budget(job.memory_budget) or SHARD_BYTES) // (4 * workers)),
        )
    if job.store is not None:
        store = Path(job.store)
    else:
        store = Path(job.keep_store) if job.keep_store is not None else stack.enter_context(spill_folder(out))
        tokenize_sharded(
            list(job.resolved.inputs), store, tokenizer=tokenizer, config=job.resolved.text, shard_bytes=shard_bytes,
            workers=ray_workers, backend=backend, ray_address=ray_address, overwrite=job.overwrite,
        )  # fmt: skip
    result, _, _ = open_store(
        store, tokenizer=job.resolved.tokenizer if job.store else None, text=job.resolved.text, join=False
    )
    eod = int(result.eod_id if result.eod_id is not None else result.tokenizer["eos_id"])
    from longpack.packed.indexed import check_trains_everywhere
    from longpack.store import TokenStore

    for part in TokenStore.open(store, join=False).parts:  # every shard, before anything is written
        check_trains_everywhere(part, result.format)

    def write(folder: Path, provenance: Any) -> dict[str, Any]:
        return write_indexed_from_store(
            store, folder, job.settings, provenance, vocab_size=int(result.tokenizer["vocab_size"]), eod_id=eod,
            backend=backend, ray_address=ray_address, workers=ray_workers,
        )  # fmt: skip

    return job._write_indexed(out, result, eod, "", None, write=write)
