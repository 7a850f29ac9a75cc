"""Run Megatron-LM's own RL sequence packer (``megatron/rl/sequence_packing_utils.py``) on the CPU.

The module lives in Megatron-LM's repository, not in the ``megatron-core`` wheel, and imports a few
training-side helpers; those are replaced by stand-ins that do what Megatron's do for this code path (the
tokenizer's pad id, a no-op NVTX range, the DP rank / size), and the file itself runs unmodified.
``LONGPACK_MEGATRON_LM`` (a Megatron-LM checkout or a ``git`` directory of one) says where it is; the
tests that use it are skipped without it. ``scripts/rl_packer_golden.py`` records its outputs for CI.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import tempfile
import types
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

RELATIVE = "megatron/rl/sequence_packing_utils.py"


def source_path() -> Path | None:
    """The file from ``$LONGPACK_MEGATRON_LM`` (a work tree, or a bare git directory read at HEAD)."""
    root = os.environ.get("LONGPACK_MEGATRON_LM")
    if not root:
        return None
    tree = Path(root) / RELATIVE
    if tree.is_file():
        return tree
    try:
        text = subprocess.run(
            ["git", "--git-dir", root, "show", f"HEAD:{RELATIVE}"], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    out = Path(tempfile.mkdtemp()) / "sequence_packing_utils.py"
    out.write_text(text)
    return out


def source_commit() -> str:
    """``HEAD`` of the checkout in ``$LONGPACK_MEGATRON_LM``."""
    root = os.environ["LONGPACK_MEGATRON_LM"]
    git = ["git", "--git-dir", root] if not (Path(root) / ".git").exists() else ["git", "-C", root]
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def load(path: Path, *, pad_id: int) -> types.ModuleType:
    """Import the upstream file with the training helpers it names replaced."""
    import megatron.core.utils as core_utils

    if not hasattr(core_utils, "round_up_to_nearest_multiple"):  # megatron-core 0.16.1 predates it
        core_utils.round_up_to_nearest_multiple = lambda value, multiple: (
            math.ceil(value / multiple) * multiple
        )  # type: ignore[attr-defined]
    training = types.ModuleType("megatron.training")
    global_vars = types.ModuleType("megatron.training.global_vars")
    global_vars.get_tokenizer = lambda: types.SimpleNamespace(pad=pad_id)  # type: ignore[attr-defined]
    utils = types.ModuleType("megatron.training.utils")
    utils.get_nvtx_range = lambda: lambda *a, **k: nullcontext()  # type: ignore[attr-defined]
    sys.modules.setdefault("megatron.training", training)
    sys.modules["megatron.training.global_vars"] = global_vars
    sys.modules["megatron.training.utils"] = utils
    spec = importlib.util.spec_from_file_location("megatron_rl_sequence_packing_utils", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    # megatron-core 0.16.1's PackedSeqParams has no total_tokens field yet; a plain record holds the values
    module.PackedSeqParams = types.SimpleNamespace  # type: ignore[attr-defined]
    return module


def run_upstream(
    module: types.ModuleType,
    rollouts: list[list[int]],
    masks: list[list[int]],
    *,
    bin_size: int,
    max_sequences_per_bin: int,
    seq_length_multiple: int,
    dp: int,
    distribution: str,
    pad_id: int,
) -> list[dict[str, Any]]:
    """Megatron-LM's packing and distribution of ``rollouts`` for every DP rank, as plain lists."""
    import torch

    width = max(len(r) for r in rollouts)
    trajs = torch.full((len(rollouts), width), pad_id, dtype=torch.long)
    gen = torch.zeros((len(rollouts), width), dtype=torch.long)
    for i, (r, m) in enumerate(zip(rollouts, masks, strict=True)):
        trajs[i, : len(r)] = torch.tensor(r)
        gen[i, : len(m)] = torch.tensor(m)
    packer = module.SequencePacker(
        bin_size=bin_size,
        pad_token=pad_id,
        max_sequences_per_bin=max_sequences_per_bin,
        seq_length_multiple=seq_length_multiple,
    )
    packed, positions, loss, info = packer.pack_sequences(trajs, gen)
    info.packing_algo = distribution
    out = []
    for rank in range(dp):
        module.mpu = types.SimpleNamespace(
            get_data_parallel_rank=lambda rank=rank: rank, get_data_parallel_world_size=lambda: dp
        )
        t, p, m, rank_info = module.distribute_packed_bins(packed, positions, loss, info)
        params = [
            module.create_packed_seq_params_for_bin(
                packing_info=rank_info,
                bin_idx=b,
                bin_size=bin_size,
                max_sequences_per_bin=max_sequences_per_bin,
                device="cpu",
                seq_length_multiple=seq_length_multiple,
            )
            for b in range(t.shape[0])
        ]
        out.append(
            {
                "tokens": t.tolist(),
                "position_ids": p.tolist(),
                "loss_mask": m.tolist(),
                "seq_indices": [list(s) for s in rank_info.bin_seq_indices],
                "seq_starts": [list(rank_info.seq_starts[b]) for b in range(t.shape[0])],
                "cu_seqlens": [None if q is None else q.cu_seqlens_q.tolist() for q in params],
                "cu_seqlens_padded": [
                    None if q is None or q.cu_seqlens_q_padded is None else q.cu_seqlens_q_padded.tolist()
                    for q in params
                ],
            }
        )
    return out


def longpack_view(packing: Any) -> list[dict[str, Any]]:
    """longpack's ``RolloutPacking`` in ``run_upstream``'s shape (empty bins: no ``PackedSeqParams``)."""
    out = []
    for rank in packing.ranks:
        empty = [not s for s in rank.seq_indices]
        multiple_one = packing.seq_length_multiple == 1
        out.append(
            {
                "tokens": rank.tokens.tolist(),
                "position_ids": rank.position_ids.tolist(),
                "loss_mask": rank.loss_mask.astype(np.float64).tolist(),
                "seq_indices": [list(s) for s in rank.seq_indices],
                "seq_starts": [list(s) for s in rank.seq_starts],
                "cu_seqlens": [
                    None if e else row.tolist() for e, row in zip(empty, rank.cu_seqlens, strict=True)
                ],
                "cu_seqlens_padded": [
                    None if e or multiple_one else row.tolist()
                    for e, row in zip(empty, rank.cu_seqlens_padded, strict=True)
                ],
            }
        )
    return out
