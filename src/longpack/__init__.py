"""longpack: packed sequences, THD batches, config checks and layout planning for Megatron-style training.

The jobs are one import away and load their dependencies only when used (``import longpack`` stays
light: no numba, pyarrow or torch)::

    import longpack
    result = longpack.PackConfig(demo=True, out="out/demo").run()
    print(result.counts)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from longpack import jobs as _jobs
from longpack._version import __version__ as __version__

# name -> module that defines it; imported on first attribute access (PEP 562). The facade re-exports the
# jobs layer: its names are the jobs package's own list, plus the one exception base.
_LAZY = {**_jobs._LAZY, "LongpackError": "longpack.errors"}

__all__ = sorted([*_jobs.__all__, "LongpackError", "__version__"])

if TYPE_CHECKING:
    from longpack.errors import LongpackError as LongpackError
    from longpack.jobs import *  # noqa: F403


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'longpack' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
