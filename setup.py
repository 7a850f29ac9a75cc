"""The compiled kernels; everything else about the package is in pyproject.toml.

Plain C against Python's headers (numpy arrays go through the buffer protocol, outputs come from
``numpy.empty``), built by the normal wheel build and by ``pip install -e .``, so an installed longpack
compiles nothing at run time. A source checkout that was never built falls back to the numba kernels
(``longpack._optional.native``). Rebuild a checkout in place with ``python setup.py build_ext --inplace``.
"""

from setuptools import Extension, setup

COMMON = ["src/longpack/_native_common.h"]

setup(
    ext_modules=[
        Extension("longpack.binpack._native", ["src/longpack/binpack/_native.c"], depends=COMMON),
        Extension("longpack.packed._native", ["src/longpack/packed/_native.c"], depends=COMMON),
        Extension("longpack.text._native", ["src/longpack/text/_native.c"], depends=COMMON),
    ]
)
