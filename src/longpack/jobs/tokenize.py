"""The tokenize job: inputs -> a token store (``longpack.store``), and the seam through which the pack job
reads a store instead of tokenizing.

``TokenizeConfig(inputs=..., out=..., tokenizer=...).run()`` tokenizes exactly as ``longpack pack`` does
(same text options, same worker-count-independent result) and writes the samples and the tokenization
report as a store. ``PackConfig(store=...)`` then packs from it at any pack size, ``pad_seq_to_mult``,
algorithm, split, seed or output format: the files are byte-identical to packing from the inputs with the
same settings (the manifest adds where the tokens came from, under ``store``).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "rows.jsonl").write_text('{"prompt": "hi", "completion": "there"}\\n' * 3)
>>> r = TokenizeConfig(inputs=[d / "rows.jsonl"], out=d / "store", tokenizer="bytes", workers=1).run()
>>> r.summary()["samples"], r.summary()["inputs"]
(3, 1)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from longpack import choices
from longpack.errors import ConfigError
from longpack.jobs.options import inputs_option, tokenizer_option, workers_option
from longpack.option import option, refuse_unknown_settings
from longpack.text import TextConfig
from longpack.validate import flag, optional_positive_int

__all__ = ["TokenizeConfig", "TokenizeStoreResult"]


@dataclass(frozen=True, kw_only=True)
class TokenizeStoreResult:
    """What :meth:`TokenizeConfig.run` returns: the store's folder and manifest (``store.json``)."""

    out: Path
    manifest: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """``{"store", "samples", "tokens", "inputs", "tokenizer", "format", "longpack_version"}``."""
        from longpack.store import TokenStore

        return TokenStore(path=self.out, manifest=self.manifest, samples=None).summary()  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """What ``longpack tokenize --json`` prints: :meth:`summary`."""
        return self.summary()


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig:
    """Everything ``longpack tokenize`` takes; validated on construction, run with :meth:`run`.

    - ``inputs``: JSONL / Parquet files, folders or globs (as ``PackConfig.inputs``).
    - ``out``: the store folder to write (``overwrite`` to replace a store there).
    - ``tokenizer``, ``text``: as ``PackConfig`` (the store records both).
    - ``workers``: tokenizer processes (default all cores; the store is the same for any count).
    - ``shard_bytes``: write a sharded store, about this much input per shard (``"256M"``), each shard
      tokenized and written by one worker (memory: a shard per worker); ``backend="ray"`` writes the shards
      on a Ray cluster (``ray_address``), sharded by default. ``resume``: finish an interrupted run, redoing
      only the shards not written. Packs from a sharded store are byte-identical to packs from one store.
    """

    inputs: Sequence[str | Path] | str | Path = inputs_option(
        "JSONL / Parquet files, folders or globs.", metavar="INPUT...", required=True
    )
    out: str | Path = option(
        help="Store folder to write (must not exist unless --overwrite); a URL (s3://...) is uploaded.",
        cli_type=str,
    )
    tokenizer: Any = tokenizer_option()
    text: TextConfig = option(default_factory=TextConfig, help="How rows become samples.", nested_except=())
    workers: int | None = workers_option()
    overwrite: bool = option(False, help="Replace an existing store.")
    progress: bool = False
    shard_bytes: int | str | None = option(
        None,
        help="Write a sharded store: about this much input per shard (e.g. 256M), one worker per shard "
        "(default with --backend ray: 256M).",
        cli_type=str | None,
    )
    backend: str = option(
        choices.LOCAL_BACKEND, help="local: this machine; ray: tokenize and write the shards on a Ray cluster.",
        choices=choices.BACKENDS,
    )  # fmt: skip
    ray_address: str | None = option(
        None, help="Ray cluster to join ('auto', 'ray://host:10001'); default: start one."
    )
    resume: bool = option(
        False, help="Finish an interrupted sharded tokenize: keep the shards written, redo the rest."
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        from longpack.jobs.pack import _paths

        set_ = object.__setattr__
        set_(self, "inputs", _paths(self.inputs, "inputs"))
        if not self.inputs:
            raise ConfigError("no inputs: give at least one input file, folder or glob", fields="inputs")
        if not isinstance(self.out, str | os.PathLike) or not str(self.out):
            raise ConfigError(f"out must be a folder path, got {self.out!r}", fields="out")
        from longpack.remote import as_path

        set_(self, "out", as_path(self.out))
        if self.tokenizer is None:
            raise ConfigError(
                "tokenizer is required ('qwen3', 'bytes', a tokenizer.json, an HF model folder)",
                fields="tokenizer",
            )
        if not isinstance(self.text, TextConfig):
            raise ConfigError(
                f"text must be a longpack.text.TextConfig, got {type(self.text).__name__}", fields="text"
            )
        set_(self, "workers", optional_positive_int(self.workers, "workers"))
        for name in ("overwrite", "progress", "resume"):
            flag(getattr(self, name), name)
        from longpack.jobs.out_of_core import parse_memory_budget
        from longpack.option import check_choices

        check_choices(self)
        shard_bytes = parse_memory_budget(self.shard_bytes, "shard_bytes")
        if shard_bytes is None and self.backend == choices.RAY_BACKEND:
            from longpack.text.shards import SHARD_BYTES

            shard_bytes = SHARD_BYTES
        set_(self, "shard_bytes", shard_bytes)
        if self.resume and shard_bytes is None:
            raise ConfigError(
                "resume finishes a sharded store: give shard_bytes (--shard-bytes) as the first run did",
                fields=("resume", "shard_bytes"),
            )

    def run(self) -> TokenizeStoreResult:
        """Tokenize the inputs and write the store (arrays first, ``store.json`` last); inputs and ``out`` at
        URLs go through a local stage (:mod:`longpack.remote`)."""
        from longpack.remote import has_urls

        if has_urls(self.inputs, str(self.out)):
            return self._run_staged()
        return self._run()

    def _run_staged(self) -> TokenizeStoreResult:
        import json
        from dataclasses import replace

        from longpack.remote import is_url, stage_inputs, staged

        out = str(self.out)
        key = out if is_url(out) else json.dumps([*cast(tuple[str, ...], self.inputs), out])
        with staged(key) as stage:
            inputs = stage_inputs(stage, cast(tuple[str, ...], self.inputs))
            local_out = (
                stage.output(out, name="out", overwrite=self.overwrite, resume=self.resume)
                if is_url(out)
                else Path(out)
            )
            result = replace(self, inputs=inputs, out=local_out)._run()
            stage.publish()
            manifest = json.loads(stage.to_urls(json.dumps(result.manifest)))
        return TokenizeStoreResult(out=cast(Path, self.out) if is_url(out) else result.out, manifest=manifest)

    def _run(self) -> TokenizeStoreResult:
        from longpack.jobs.executors import LocalExecutor
        from longpack.jobs.stores import save_store
        from longpack.outputs import OutputLock, check_output_dir
        from longpack.text.tokenizers import as_tokenizer

        out = Path(self.out)
        inputs = list(cast(tuple[str, ...], self.inputs))  # normalized in __post_init__
        check_output_dir(out, overwrite=self.overwrite or self.resume, inputs=tuple(inputs))
        if self.shard_bytes is not None:
            from longpack.jobs.sharded_tokenize import tokenize_sharded

            with OutputLock(out):
                manifest = tokenize_sharded(
                    inputs, out, tokenizer=as_tokenizer(self.tokenizer), config=self.text,
                    shard_bytes=cast(int, self.shard_bytes), workers=self.workers, backend=self.backend,
                    ray_address=self.ray_address, overwrite=self.overwrite, resume=self.resume,
                )  # fmt: skip
            return TokenizeStoreResult(out=out.resolve(), manifest=manifest)
        with contextlib.ExitStack() as stack:
            stack.enter_context(OutputLock(out))
            tokenizer = as_tokenizer(self.tokenizer)
            executor = stack.enter_context(LocalExecutor(workers=self.workers))
            result, _ = executor.tokenize(
                inputs, tokenizer=tokenizer, config=self.text, progress=self.progress
            )
            manifest = save_store(out, result, self.text, overwrite=self.overwrite)
        return TokenizeStoreResult(out=out.resolve(), manifest=manifest)


# A setting of a nested config given at the top (PackConfig(skip_malformed=True)) names where it belongs.
refuse_unknown_settings(TokenizeConfig)
