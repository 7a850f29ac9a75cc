"""Run NeMo-Aligner's own ``DPOPackedDataset.global_collate_fn`` (``nemo_aligner/data/nlp/datasets.py``).

The class's methods are cut out of the upstream file with ``ast`` and run unmodified on a bare object
(the class's base needs NeMo). ``LONGPACK_NEMO_ALIGNER`` (a checkout or a ``git`` directory) says where
it is; without it the live test is skipped. torch is used when installed; otherwise a numpy stand-in
for the torch calls this method makes (LongTensor/IntTensor/FloatTensor, argmin, max(dim, keepdim)).
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import types
from pathlib import Path
from typing import Any

import numpy as np

RELATIVE = "nemo_aligner/data/nlp/datasets.py"
CLASS = "DPOPackedDataset"


def source_text() -> str | None:
    """The upstream file from ``$LONGPACK_NEMO_ALIGNER`` (work tree, or git directory read at HEAD)."""
    root = os.environ.get("LONGPACK_NEMO_ALIGNER")
    if not root:
        return None
    tree = Path(root) / RELATIVE
    if tree.is_file():
        return tree.read_text()
    try:
        return subprocess.run(
            ["git", "--git-dir", root, "show", f"HEAD:{RELATIVE}"], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def source_commit() -> str:
    root = os.environ["LONGPACK_NEMO_ALIGNER"]
    git = ["git", "-C", root] if (Path(root) / ".git").exists() else ["git", "--git-dir", root]
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


class _T(np.ndarray):
    def max(self, dim: int, keepdim: bool = False) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[override]
        a = np.asarray(self)
        return np.max(a, axis=dim, keepdims=keepdim), np.argmax(a, axis=dim, keepdims=keepdim)


def _torch_standin() -> types.SimpleNamespace:
    def make(dtype: Any) -> Any:
        return lambda x: np.asarray(x, dtype=dtype).view(_T)

    return types.SimpleNamespace(
        LongTensor=make(np.int64),
        IntTensor=make(np.int32),
        FloatTensor=make(np.float32),
        argmin=lambda t, dim, keepdim=False: np.argmin(np.asarray(t), axis=dim, keepdims=keepdim),
    )


def load_class(text: str) -> type:
    """``DPOPackedDataset``'s methods and constants, unmodified, on a plain class."""
    tree = ast.parse(text)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    body = [n for n in node.body if not (isinstance(n, ast.FunctionDef) and n.name == "__init__")]
    cls = ast.ClassDef(name=CLASS, bases=[], keywords=[], body=body, decorator_list=[])
    module = ast.fix_missing_locations(ast.Module(body=[cls], type_ignores=[]))
    torch: Any
    try:
        import torch
    except ImportError:
        torch = _torch_standin()
    namespace: dict[str, Any] = {"np": np, "torch": torch, "math": math, "List": list}
    exec(compile(module, f"{RELATIVE}:{CLASS}", "exec"), namespace)
    return namespace[CLASS]


def run_upstream(cls: Any, rows: list[dict[str, Any]], *, eos_id: int, seq_length: int) -> dict[str, Any]:
    obj = cls.__new__(cls)
    obj.seq_length = seq_length
    obj.tokenizer = types.SimpleNamespace(eos_id=eos_id)
    out = obj.global_collate_fn(rows, eos_id=eos_id)
    return {k: np.asarray(v).tolist() for k, v in out.items()}
