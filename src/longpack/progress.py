"""Progress bars of long work (tokenizing inputs, writing packed rows): rich on a terminal when asked, and
nothing in pipes and CI (DESIGN.md: conventions). One bar class for every layer.

>>> bar = ProgressBar("writing packed rows", total=10, enabled=False)
>>> with bar as advance:  # not shown: no callback, nothing to stop
...     advance is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ProgressBar"]


class ProgressBar:
    """A rich progress bar on stderr over ``total`` units (``in_bytes``: shown as sizes, else ``n/total``),
    shown only when ``enabled`` and stderr is a terminal. ``transient``: erased when done.

    Use it as a context manager (``with bar as advance``: ``advance(n)``, or ``None`` when not shown) or
    with :meth:`start`, :meth:`advance` (a no-op when not shown) and :meth:`close`.
    """

    def __init__(
        self, label: str, total: int, *, enabled: bool, in_bytes: bool = False, transient: bool = False
    ) -> None:
        self._progress: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            console = Console(stderr=True)
            if console.is_terminal:
                self._progress = Progress(
                    TextColumn(label),
                    BarColumn(),
                    DownloadColumn() if in_bytes else MofNCompleteColumn(),
                    TimeRemainingColumn(),
                    console=console,
                    transient=transient,
                )
                self._task = self._progress.add_task(label, total=total)

    def start(self) -> Callable[[int], None] | None:
        """Show the bar; return :meth:`advance`, or ``None`` when it is not shown."""
        if self._progress is None:
            return None
        self._progress.start()
        return self.advance

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __enter__(self) -> Callable[[int], None] | None:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
