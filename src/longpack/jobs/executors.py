"""Who runs the heavy steps of the pack job: this machine (:class:`LocalExecutor`) or a Ray cluster
(``longpack.cluster.RayExecutor``). Both are handed to the same job (:class:`longpack.jobs.PackConfig`).

The pack job has five steps; an executor runs the two that scale with the data, the driver the rest:

1. check the settings and the output folder (driver);
2. **tokenize** the inputs in chunks (executor): :meth:`PackExecutor.tokenize` returns the
   ``TokenizeResult`` the driver plans with, and a handle to the tokens wherever the executor keeps them;
3. align and **plan** the rows of every split (driver, ``longpack.packed.plan_splits``);
4. **write** the shards of every split (executor): :meth:`PackExecutor.write` is told which tokenized set
   each split's samples index (``sources``), so nothing depends on the order of earlier calls;
5. write ``<N>_metadata.jsonl`` and, last, ``manifest.json`` (driver).

The same inputs and settings give the same bytes on every executor and for any worker count.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from longpack import choices
from longpack.errors import InputError, LongpackError
from longpack.progress import ProgressBar

if TYPE_CHECKING:
    from longpack.packed.pipeline import PackSettings, SplitPlan
    from longpack.text.pipeline import TokenizeResult
    from longpack.text.rows import TextConfig
    from longpack.text.tokenizers import Tokenizer

__all__ = ["LocalExecutor", "PackExecutor", "executor_class", "input_read_errors"]


@contextlib.contextmanager
def input_read_errors() -> Iterator[None]:
    """Report an ``OSError`` about a file while reading the inputs (no permission, a file that vanished
    or turned into a folder, an I/O error) as an :class:`~longpack.errors.InputError` naming the file.

    >>> with input_read_errors():
    ...     raise PermissionError(13, "Permission denied", "data/rows.jsonl")
    Traceback (most recent call last):
    ...
    longpack.errors.InputError: data/rows.jsonl: cannot read the input (Permission denied); check the file and its permissions
    """
    try:
        yield
    except LongpackError:
        raise
    except OSError as exc:
        if exc.filename is None:
            raise
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise InputError(
            f"{exc.filename}: cannot read the input ({reason}); check the file and its permissions"
        ) from exc


@runtime_checkable
class PackExecutor(Protocol):
    """What the pack job needs from an executor. Used as a context manager around the job's steps."""

    #: Short name (``"local"``, ``"ray"``), shown in results.
    name: str

    def supports(self, capability: str) -> bool:
        """Whether it can do ``capability`` (one of ``longpack.choices.EXECUTOR_CAPABILITIES``: resample a
        mix, read and write token stores, fragment over-long samples, write a split as one file); the pack
        job refuses the settings that need what its executor cannot do. An executor object without this
        method is taken to support none of them."""
        ...

    def __enter__(self) -> PackExecutor: ...

    def __exit__(self, *exc: object) -> bool | None: ...

    def tokenize(
        self, inputs: Sequence[str], *, tokenizer: Tokenizer, config: TextConfig, progress: bool = False
    ) -> tuple[TokenizeResult, Any]:
        """``(TokenizeResult, handle)``: the samples the driver plans with (their tokens may stay with the
        executor) and what :meth:`write` needs to find those tokens again."""
        ...

    def write(
        self,
        out: Path,
        splits: Sequence[SplitPlan],
        settings: PackSettings,
        *,
        sources: Mapping[str, Any],
        progress: bool = False,
    ) -> dict[str, list[dict[str, Any]]]:
        """Write every shard of every split (``SplitPlan``) into the existing folder ``out``; ``sources``
        maps each split name to the handle :meth:`tokenize` returned for the samples it indexes. Returns
        split name -> one manifest record per shard file, in shard order."""
        ...

    def report(self) -> dict[str, Any] | None:
        """What the executor wants in the job's result (e.g. peak memory per worker), or ``None``."""
        ...


class LocalExecutor:
    """This machine: tokenizer worker processes (``workers``, default all cores) and shard-writer threads.

    ``memory_budget`` (bytes; default half of the machine's memory) caps the token data held in memory:
    past it, tokens go to a scratch folder ``spill_dir`` and the shards are filled from there in a second
    pass (``longpack.jobs.out_of_core``); the output is the same. Without ``spill_dir`` everything stays in
    memory.

    >>> ex = LocalExecutor(workers=2)
    >>> ex.name, ex.workers, isinstance(ex, PackExecutor)
    ('local', 2, True)
    """

    name = "local"
    #: Everything: the tokens are in this process (or its scratch folder).
    capabilities: ClassVar[frozenset[str]] = frozenset(choices.EXECUTOR_CAPABILITIES)

    @classmethod
    def supports(cls, capability: str) -> bool:
        """``capability in capabilities`` (a class method: the job asks before it makes one)."""
        return capability in cls.capabilities

    def __init__(
        self,
        *,
        workers: int | None = None,
        write_threads: int | None = None,
        memory_budget: int | None = None,
        spill_dir: Path | None = None,
    ) -> None:
        self.workers = workers
        self.write_threads = write_threads
        self.memory_budget = memory_budget
        self.spill_dir = spill_dir
        self._held = 0  # token bytes the tokenize calls so far keep in memory
        self._spilled = 0  # tokens they sent to the scratch folder

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def tokenize(
        self, inputs: Sequence[str], *, tokenizer: Tokenizer, config: TextConfig, progress: bool = False
    ) -> tuple[TokenizeResult, Any]:
        from longpack.text import tokenize_inputs

        budget = None
        if self.spill_dir is not None:
            from longpack.jobs.out_of_core import default_memory_budget

            total = self.memory_budget if self.memory_budget is not None else default_memory_budget()
            budget = max(0, total - self._held)
        with input_read_errors():
            result = tokenize_inputs(
                list(inputs),
                tokenizer=tokenizer,
                config=config,
                workers=self.workers,
                progress=progress,
                memory_budget=budget,
                spill_dir=self.spill_dir,
            )
        samples = result.samples
        if result.spilled_tokens:
            self._spilled += result.spilled_tokens
        else:
            self._held += samples.tokens.nbytes + samples.loss_mask.nbytes
        return result, samples

    def write(
        self,
        out: Path,
        splits: Sequence[SplitPlan],
        settings: PackSettings,
        *,
        sources: Mapping[str, Any],
        progress: bool = False,
    ) -> dict[str, list[dict[str, Any]]]:
        from longpack.packed.pipeline import write_split_files

        # The split plans carry their samples (tokens included): ``sources`` is not needed here.
        total = sum(s.plan.num_rows for s in splits)
        with ProgressBar("writing packed rows", total, enabled=progress, transient=True) as advance:
            if self._spilled:  # second pass: the rows' tokens come from the scratch files' memory maps
                from longpack.jobs.out_of_core import PageTrimmer

                arrays = [a for s in splits for a in (s.aligned.samples.tokens, s.aligned.samples.loss_mask)]
                per_token = max(a.itemsize for a in arrays) + 1  # token + mask bytes read per row token
                trimmer = PageTrimmer(
                    arrays, bytes_per_row=settings.resolved_pack_size * per_token, then=advance
                )
                advance = trimmer.rows
            return {
                split.name: write_split_files(out, split, settings, advance, threads=self.write_threads)
                for split in splits
            }

    def report(self) -> dict[str, Any] | None:
        """``{"out_of_core": {"spilled_tokens": N}}`` when the tokens went through the scratch folder."""
        if not self._spilled:
            return None
        return {"out_of_core": {"spilled_tokens": self._spilled, "memory_budget": self.memory_budget}}


def executor_class(name: str) -> type | None:
    """The executor class a ``backend`` name stands for (``None``: no such name); its ``supports`` says
    what it can do before one is made.

    >>> executor_class("local").supports("mix"), executor_class("ray").supports("mix"), executor_class("x")
    (True, False, None)
    """
    if name == choices.LOCAL_BACKEND:
        return LocalExecutor
    if name == choices.RAY_BACKEND:
        from longpack.cluster.ray_pack import RayExecutor

        return RayExecutor
    return None
