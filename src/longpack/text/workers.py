"""Worker processes that never import the caller's ``__main__``, whatever the multiprocessing start method.

``multiprocessing`` (and so ``ProcessPoolExecutor``) starts a ``spawn`` or ``forkserver`` child by running
the parent's main script again as ``__mp_main__``. A plain script without an ``if __name__ == "__main__":``
guard that tokenizes with several workers then starts its own work again in every child and fails
("An attempt has been made to start a new process before the current process has finished its
bootstrapping phase"). These workers are plain interpreters (``python -c``) that import only longpack: the
caller's script, its start method and its threads do not matter.

Each worker talks to the parent over two pipes of its own (jobs in, results out; stdout and stderr stay
the worker's). A message is a pickle (protocol 5) whose large buffers, numpy arrays and Arrow batches,
travel out of band: written and read straight from their memory, never copied into the pickle.

>>> with WorkerPool(2, target="operator:neg") as pool:
...     [f.result() for f in [pool.submit(3), pool.submit(-4)]]
[-3, 4]
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, BinaryIO

from longpack.errors import BackendError

__all__ = ["WorkerError", "WorkerPool"]

_HEADER = struct.Struct("<QI")  # pickle length, number of out-of-band buffers
_LENGTH = struct.Struct("<Q")


class WorkerError(BackendError):
    """A worker process died (killed, out of memory) before it answered; the pool cannot go on. A
    ``LongpackError`` (the CLI: exit 2): the message says which process and the fix (fewer ``workers``)."""


class _RemoteTraceback(Exception):
    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f"\n(in the worker process)\n{self.tb}"


def _send(fh: BinaryIO, obj: Any) -> None:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    fh.write(_HEADER.pack(len(data), len(raws)))
    fh.write(data)
    for raw in raws:
        fh.write(_LENGTH.pack(raw.nbytes))
        fh.write(raw)
    fh.flush()


def _read_exact(fh: BinaryIO, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = fh.readinto(view[got:])  # type: ignore[attr-defined]
        if not k:
            raise EOFError("pipe closed")
        got += k
    return buf


def _recv(fh: BinaryIO) -> Any:
    size, n_buffers = _HEADER.unpack(_read_exact(fh, _HEADER.size))
    data = _read_exact(fh, size)
    buffers = [_read_exact(fh, _LENGTH.unpack(_read_exact(fh, _LENGTH.size))[0]) for _ in range(n_buffers)]
    return pickle.loads(data, buffers=buffers)


def _resolve(name: str) -> Callable[..., Any]:
    module, _, attr = name.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), attr)
    return fn


def _serve(job_fd: int, result_fd: int) -> None:
    """The worker's loop: ``(target, initializer, initargs)`` first, then one answer per job until EOF."""
    jobs = os.fdopen(job_fd, "rb")
    results = os.fdopen(result_fd, "wb")
    try:
        target_name, init_name, initargs = _recv(jobs)
        if init_name is not None:
            _resolve(init_name)(*initargs)
        target = _resolve(target_name)
        while True:
            try:
                job = _recv(jobs)
            except EOFError:
                return
            try:
                answer: tuple[Any, ...] = ("ok", target(job))
            except Exception as exc:
                answer = ("err", exc, traceback.format_exc())
            try:
                _send(results, answer)
            except Exception as exc:  # the answer would not pickle: say so, with what it was
                if answer[0] == "ok":
                    raise
                _send(results, ("err", RuntimeError(f"{type(exc).__name__}: {answer[1]!r}"), answer[2]))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        return
    except (BrokenPipeError, EOFError):  # the parent is gone
        return


class WorkerPool:
    """``n`` worker processes running ``target`` (``"module:function"``) on submitted jobs.

    ``initializer`` (``"module:function"``) runs once per worker with ``initargs`` (pickled) before its
    first job. Results come back as futures; a job that raises passes its exception (with the worker's
    traceback as ``__cause__``). If a worker dies, every pending and later job fails with
    :class:`WorkerError`. Use as a context manager; leaving it ends the workers.
    """

    def __init__(
        self,
        n: int,
        *,
        target: str,
        initializer: str | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        if n < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {n}")
        self._queue: queue.SimpleQueue[tuple[Future[Any], Any] | None] = queue.SimpleQueue()
        self._broken: str | None = None
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        try:
            for _ in range(n):
                self._start_one((target, initializer, initargs))
        except BaseException:
            self.shutdown(cancel=True)
            raise

    def _start_one(self, hello: tuple[Any, ...]) -> None:
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        code = (
            f"import sys; sys.path[:] = {sys.path!r}; "
            f"from longpack.text.workers import _serve; _serve({job_r}, {res_w})"
        )
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.DEVNULL,
                pass_fds=(job_r, res_w),
                close_fds=True,
            )
        finally:
            os.close(job_r)
            os.close(res_w)
        jobs = os.fdopen(job_w, "wb")
        results = os.fdopen(res_r, "rb")
        self._procs.append(proc)
        thread = threading.Thread(
            target=self._feed, args=(proc, jobs, results, hello), name="longpack-worker-io", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = reason

    def _feed(self, proc: subprocess.Popen[bytes], jobs: BinaryIO, results: BinaryIO, hello: Any) -> None:
        """One thread per worker: send it a job, wait for the answer, settle the future, repeat."""
        try:
            try:
                _send(jobs, hello)
            except OSError:
                self._fail(f"worker process {proc.pid} did not start")
            while True:
                item = self._queue.get()
                if item is None:
                    return
                future, job = item
                if not future.set_running_or_notify_cancel():
                    continue
                if self._broken is not None:
                    future.set_exception(WorkerError(self._broken, fields="workers"))
                    continue
                try:
                    _send(jobs, job)
                    answer = _recv(results)
                except (OSError, EOFError):
                    code = proc.wait()
                    self._fail(
                        f"worker process {proc.pid} died (exit code {code}) before finishing a job; "
                        "if it ran out of memory, use fewer workers"
                    )
                    future.set_exception(WorkerError(self._broken, fields="workers"))
                    continue
                except (
                    BaseException
                ) as exc:  # a job that does not pickle, or an answer that does not unpickle
                    future.set_exception(exc)
                    continue
                if answer[0] == "ok":
                    future.set_result(answer[1])
                else:
                    raised = answer[1]
                    raised.__cause__ = _RemoteTraceback(answer[2])
                    future.set_exception(raised)
        finally:
            with contextlib.suppress(OSError):
                jobs.close()
            with contextlib.suppress(OSError):
                results.close()

    def submit(self, job: Any) -> Future[Any]:
        """Queue ``job`` for the next free worker; its answer arrives in the returned future."""
        if self._closed:
            raise RuntimeError("the worker pool is shut down")
        if self._broken is not None:
            raise WorkerError(self._broken, fields="workers")
        future: Future[Any] = Future()
        self._queue.put((future, job))
        return future

    def shutdown(self, *, cancel: bool = False) -> None:
        """Stop the workers: after the queued jobs (default), or at once with ``cancel`` (queued jobs are
        cancelled, running ones killed)."""
        if self._closed:
            return
        self._closed = True
        if cancel:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for proc in self._procs:
                with contextlib.suppress(OSError):
                    proc.kill()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.shutdown(cancel=exc_type is not None)
