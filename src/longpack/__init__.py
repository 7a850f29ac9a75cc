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
from longpack.errors import LongpackError as LongpackError

# The facade re-exports the jobs layer: its names are the jobs package's own list, each imported on first
# attribute access (PEP 562) through ``longpack.jobs``.
__all__ = sorted([*_jobs.__all__, "LongpackError", "__version__"])

if TYPE_CHECKING:
    from longpack.jobs import *  # noqa: F403


def __getattr__(name: str) -> Any:
    if name not in _jobs.__all__:
        raise AttributeError(f"module 'longpack' has no attribute {name!r}")
    value = getattr(_jobs, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
