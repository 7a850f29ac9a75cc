"""Which compiled bin-packing kernels run: the C extension built with the package, else numba.

Both expose the same functions with the same arguments and results (``_native.c`` is a port of
``_kernels.py``; the tests compare them on random inputs). The extension is built by the normal wheel build,
so an installed longpack never compiles anything at run time and never imports numba for packing; a source
checkout that was never built falls back to the numba kernels (compiled on first use and cached on disk).
``LONGPACK_KERNELS=numba`` forces the fallback (see :data:`longpack._optional.KERNELS_ENV`).
"""

from __future__ import annotations

from types import ModuleType

from longpack._optional import native

_KERNELS: ModuleType | None = None


def kernels() -> ModuleType:
    """The kernel module in use (``longpack.binpack._native`` or ``longpack.binpack._kernels``).

    >>> kernels().count_invalid(__import__("numpy").array([1, 9, 0]), 1, 8)
    (2, 1)
    """
    global _KERNELS
    module = _KERNELS
    if module is None:
        module = native("longpack.binpack._native")
        if module is None:
            from longpack.binpack import _kernels  # numba: compiled on first call, cached on disk

            module = _kernels
        _KERNELS = module
    return module


def backend() -> str:
    """``"native"`` or ``"numba"``: which kernels :func:`kernels` returns.

    >>> backend() in ("native", "numba")
    True
    """
    return "native" if kernels().__name__.endswith("._native") else "numba"
