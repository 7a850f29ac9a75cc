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


MODEL_RELATIVE = "nemo_aligner/models/nlp/gpt/megatron_gpt_dpo_model.py"
MODEL_CLASS = "MegatronGPTDPOModel"
#: The methods of the model that turn per-token log-probs of a packed batch into the DPO loss.
LOSS_METHODS = ("get_reduced_masked_logps", "split_output_tensor", "loss_func")


def model_source_text() -> str | None:
    """``megatron_gpt_dpo_model.py`` from ``$LONGPACK_NEMO_ALIGNER`` (work tree, or git directory at HEAD)."""
    root = os.environ.get("LONGPACK_NEMO_ALIGNER")
    if not root:
        return None
    tree = Path(root) / MODEL_RELATIVE
    if tree.is_file():
        return tree.read_text()
    try:
        return subprocess.run(
            ["git", "--git-dir", root, "show", f"HEAD:{MODEL_RELATIVE}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def load_loss_methods(text: str) -> type:
    """``MegatronGPTDPOModel``'s loss methods, unmodified, on a plain class (needs torch)."""
    import torch

    tree = ast.parse(text)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == MODEL_CLASS)
    body = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in LOSS_METHODS]
    assert sorted(n.name for n in body) == sorted(LOSS_METHODS), "upstream methods renamed"
    cls = ast.ClassDef(name=MODEL_CLASS, bases=[], keywords=[], body=body, decorator_list=[])
    module = ast.fix_missing_locations(ast.Module(body=[cls], type_ignores=[]))
    dataset = types.SimpleNamespace(REWARDS_PAD_ID=-1000)
    namespace: dict[str, Any] = {"torch": torch, "DPOPackedDataset": dataset}
    exec(compile(module, f"{MODEL_RELATIVE}:{MODEL_CLASS}", "exec"), namespace)
    return namespace[MODEL_CLASS]


def run_upstream_loss(
    cls: Any, pi_logps: Any, ref_logps: Any, labels: Any, cu_seqlens: Any, *, beta: float
) -> dict[str, Any]:
    """NeMo-Aligner's packed DPO loss (``preference_loss: dpo``) and per-sequence rewards of one row."""
    obj = cls.__new__(cls)
    obj.preference_loss = "dpo"
    obj.ref_policy_kl_penalty = beta
    loss, acc = obj.loss_func(pi_logps, ref_logps, labels, None, cu_seqlens)
    rewards = obj.get_reduced_masked_logps(pi_logps - ref_logps, labels, cu_seqlens=cu_seqlens)
    return {"loss": float(loss), "acc": float(acc), "rewards": [float(x) for x in rewards]}
