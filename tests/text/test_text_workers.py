"""``longpack.text.workers.WorkerPool``: plain-interpreter workers (no ``__main__`` re-import), errors with the
worker's traceback, a dead worker fails the pool instead of hanging it, large numpy results travel intact."""

from __future__ import annotations

import numpy as np
import pytest

from longpack.errors import InputError
from longpack.text.workers import WorkerError, WorkerPool


def test_results_in_order_and_large_buffers_intact() -> None:
    with WorkerPool(2, target="numpy:arange") as pool:
        futures = [pool.submit(n) for n in (5, 3_000_000, 0, 7)]
        got = [f.result() for f in futures]
    assert [len(g) for g in got] == [5, 3_000_000, 0, 7]
    assert np.array_equal(got[1], np.arange(3_000_000))


def test_an_exception_comes_back_with_the_worker_traceback() -> None:
    with WorkerPool(1, target="math:sqrt") as pool:
        with pytest.raises(ValueError, match="math domain error") as info:
            pool.submit(-1.0).result()
        assert "in the worker process" in str(info.value.__cause__)
        assert pool.submit(4.0).result() == 2.0  # the worker lives on


def test_longpack_errors_keep_their_fields_across_the_pipe() -> None:
    with (
        WorkerPool(1, target="longpack.text.tokenizers:load_tokenizer") as pool,
        pytest.raises(InputError, match="not found") as info,
    ):
        pool.submit("/no/such/tokenizer").result()
    assert info.value.fields == ("tokenizer",) and "in the worker process" in str(info.value.__cause__)


def test_a_dead_worker_fails_the_pool_instead_of_hanging() -> None:
    with WorkerPool(1, target="os:_exit") as pool:
        first = pool.submit(9)
        later = pool.submit(9)
        with pytest.raises(WorkerError, match="died"):
            first.result(timeout=60)
        with pytest.raises(WorkerError):
            later.result(timeout=60)
        with pytest.raises(WorkerError):
            pool.submit(1)


def test_the_initializer_runs_in_every_worker() -> None:
    with WorkerPool(
        2,
        target="longpack.text.tokenizers:load_tokenizer",
        initializer="longpack.text.tokenizers:register_tokenizer",
        initargs=("bytes",),
    ) as pool:
        assert [pool.submit("bytes").result().eos_id for _ in range(4)] == [258] * 4
