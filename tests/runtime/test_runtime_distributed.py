"""CP correctness with real processes: ring / all-gather attention over 2 and 4 gloo ranks.

Ranks are separate processes forked from a fresh forkserver interpreter (torch preloaded once), not from the
test process; ``test_spawn_start_method`` runs the same check with plain ``spawn``.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from longpack.runtime.context_parallel import zigzag_indices
from longpack.runtime.cp_check import run_cp_check


@pytest.mark.distributed
@pytest.mark.parametrize("cp_size", [2, 4])
def test_cp_attention_equals_unsharded(cp_size):
    cases = run_cp_check(cp_size, seed=11 + cp_size)
    assert {c.case for c in cases} == {"offline-fixed-width", "in-batch", "in-batch-fixed-width"}
    assert {c.dtype for c in cases} == {"float64", "float32"}
    for c in cases:
        worst = max(c.ring_max_abs_diff, c.allgather_max_abs_diff, c.reassembled_max_abs_diff)
        assert worst <= (1e-9 if c.dtype == "float64" else 1e-4), c
        assert c.loss_abs_diff <= c.tolerance * max(1.0, abs(c.loss)), c
        assert c.isolation_max_change_outside == 0.0, c  # no token attends across a sequence boundary
        assert c.isolation_min_change_inside > 0.0, c  # ... and the perturbation did reach its own sequence
        assert c.ok


@pytest.mark.distributed
def test_spawn_start_method():
    cases = run_cp_check(2, seed=3, dtypes=("float64",), start_method="spawn")
    assert cases and all(c.ok for c in cases)


def _mcore_worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from megatron.core.utils import get_batch_on_this_cp_rank

    from longpack.runtime.collate import collate_packed
    from longpack.runtime.megatron import to_packed_seq_params

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1])
        seq = 16
        batch = {
            "tokens": torch.arange(seq).view(1, seq) + 100,
            "labels": torch.arange(seq).view(1, seq) + 200,
            "position_ids": torch.arange(seq).view(1, seq),
            "attention_mask": torch.ones(1, 1, seq, seq, dtype=torch.bool),
        }
        got = get_batch_on_this_cp_rank(dict(batch), cp_group=group)
        row = {
            "input_ids": [10, 11, 12, 2, 2, 20, 21, 2, 2, 2],
            "loss_mask": [1] * 10,
            "seq_boundaries": [0, 5, 10],
        }
        params = to_packed_seq_params(collate_packed([row], max_seq_length=8, eos_id=2, pad_seq_to_mult=4))
        got["params"] = {
            "type": type(params).__name__,
            "qkv_format": params.qkv_format,
            "cu_seqlens_q": params.cu_seqlens_q.tolist(),
            "cu_seqlens_kv_padded": params.cu_seqlens_kv_padded.tolist(),
            "max_seqlen_q": params.max_seqlen_q,
        }
        torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_bshd_zigzag_and_packed_seq_params_against_megatron_core():
    pytest.importorskip(
        "megatron.core", reason="megatron-core not installed: pip install 'longpack[megatron]'"
    )
    import torch.multiprocessing as mp

    from longpack.runtime.context_parallel import shard_batch

    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            _mcore_worker, args=(os.path.join(folder, "init"), folder), nprocs=2, start_method="forkserver"
        )
        for rank in range(2):
            got = torch.load(os.path.join(folder, f"rank{rank}.pt"))
            assert got.pop("params") == {
                "type": "PackedSeqParams",
                "qkv_format": "thd",
                "cu_seqlens_q": [0, 3, 5],
                "cu_seqlens_kv_padded": [0, 4, 8],
                "max_seqlen_q": 4,
            }
            seq = 16
            batch = {
                "tokens": torch.arange(seq).view(1, seq) + 100,
                "labels": torch.arange(seq).view(1, seq) + 200,
                "position_ids": torch.arange(seq).view(1, seq),
                "attention_mask": torch.ones(1, 1, seq, seq, dtype=torch.bool),
            }
            ours = shard_batch(batch, 2, rank)
            assert got["position_ids"][0].tolist() == zigzag_indices(16, 2, rank).tolist()
            for key in batch:
                assert torch.equal(got[key], ours[key]), key
