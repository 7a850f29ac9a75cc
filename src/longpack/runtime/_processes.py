"""Rank processes that never run the caller's script again, whatever it guards.

``multiprocessing``'s ``spawn`` and ``forkserver`` start methods prepare every child by importing the
parent's main script again (as ``__mp_main__``; ``Process.start`` records its path, or its module name for
``python -m``). A plain script without an ``if __name__ == "__main__":`` guard that calls ``VerifyConfig(...)
.run()`` or ``run_cp_check`` then starts its own work again in every rank, which fails ("An attempt has been
made to start a new process before the current process has finished its bootstrapping phase", then a
``BrokenPipeError``). The rank functions live in longpack's modules and need nothing of the script, so while
the ranks are started the script is not named to them (:func:`ranks_started`); the tokenizer workers avoid
the same trap by being plain interpreters (``longpack.text.workers``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["main_script_hidden", "start_ranks"]

_MISSING = object()


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """While inside, ``__main__`` has no ``__file__`` and no ``__spec__``: a process started now is not told
    to import the caller's script (``multiprocessing.spawn.get_preparation_data``). Restored on exit.

    >>> import sys
    >>> main = sys.modules["__main__"]; before = getattr(main, "__file__", None)
    >>> with main_script_hidden():
    ...     getattr(main, "__file__", None), getattr(main, "__spec__", None)
    (None, None)
    >>> getattr(main, "__file__", None) == before
    True
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {name: main.__dict__.get(name, _MISSING) for name in ("__file__", "__spec__")}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _MISSING:
                main.__dict__.pop(name, None)
            else:
                main.__dict__[name] = value


def start_ranks(worker: Callable[..., Any], args: tuple[Any, ...], nprocs: int, start_method: str) -> None:
    """``torch.multiprocessing.start_processes(worker, args, nprocs, start_method)`` and wait for the ranks,
    started without naming the caller's script to them (:func:`main_script_hidden`); a rank's failure is
    raised as ``start_processes`` raises it."""
    import torch.multiprocessing as mp

    with main_script_hidden():
        context = mp.start_processes(worker, args=args, nprocs=nprocs, start_method=start_method, join=False)
    while not context.join():
        pass
