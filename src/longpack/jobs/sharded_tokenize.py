"""``longpack tokenize --shard-bytes N`` (and ``--backend ray``): the inputs tokenized shard by shard
(:mod:`longpack.text.shards`), every shard written by the worker that tokenized it
(:func:`longpack.store.write_shard`), the store's manifest written last by the driver
(:func:`longpack.store.finish_store`). Memory: a worker holds one shard; the driver holds the plan and the
shards' small reports. With ``resume`` a shard already written from the same chunks is kept, so a killed run
redoes only the unfinished shards; the store is the same bytes either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from longpack.text import TextConfig

__all__ = ["tokenize_sharded"]


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
    backend: str = "local",
    ray_address: str | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into the sharded store ``out``; return its manifest (``store.json``)."""
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
    if backend == "ray":
        from longpack.cluster.ray_pack import run_ray_tasks

        for k, n, meta in run_ray_tasks(
            _write_one, [(str(out), plan, k, portable, config) for k in todo], address=ray_address,
            workers=workers,
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
                futures = [pool.submit(_write_one, str(out), plan, k, portable, config) for k in todo]
                for f in futures:
                    k, n, meta = f.result()
                    results[k] = (n, meta)
    order = range(len(plan.shards))
    fields_ = join_reports(
        plan, [results[k][1] for k in order], [results[k][0] for k in order], tokenizer=tok, config=config
    )
    result = TokenizeResult(samples=None, **fields_)  # type: ignore[arg-type]
    return finish_store(
        out, len(plan.shards), plan.files, record_of(result, config), input_files=store_identities(result)
    )
