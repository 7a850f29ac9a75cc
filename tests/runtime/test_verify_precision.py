"""The tiny model computes in float64 throughout, so packed and unpacked differ by float64 round-off only.

Regression: a 100-row verify of the 8K demo pack failed at row 103 (216 samples of 19-39 tokens), sample 97,
input-embedding gradient relative difference 2.7e-8. transformers' Qwen3 RMSNorm casts its float64 input to
float32. Before the final norm, token 27 of sample 97 held 0.17606205493211735 packed and
0.17606205493211752 alone (float64 round-off of two valid evaluation orders, 2.2e-16); the two round to
adjacent float32 numbers, so the norm's outputs differed by one float32 unit (2^-25 = 3e-8), which the
backward pass carried to the gradient. Packing was right; the float32 rounding amplified round-off by 1e8.
"""

from __future__ import annotations

import pytest
import torch
from tests.runtime.verify_helpers import QWEN3
from torch.utils._python_dispatch import TorchDispatchMode

from longpack.jobs.verify import load_hf_config
from longpack.runtime.verify_model import Float64Mode, build_model


class _FloatDtypes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set[torch.dtype]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.seen.setdefault(str(func), set()).add(t.dtype)
        return out


@pytest.mark.parametrize("config", ["qwen3", "llama3"])
def test_no_float32_anywhere_in_forward_and_backward(config):
    source = load_hf_config(str(QWEN3) if config == "qwen3" else "llama3_1_8b")
    model = build_model(source)
    embeds = model.get_input_embeddings()(torch.arange(1, 40).view(1, -1)).detach().requires_grad_(True)
    with _FloatDtypes() as mode:
        hidden = model(inputs_embeds=embeds, position_ids=torch.arange(39).view(1, -1)).last_hidden_state
        torch.autograd.grad(hidden.square().sum(), [embeds, *model.parameters()], allow_unused=True)
    lower = {op: dtypes for op, dtypes in mode.seen.items() if dtypes - {torch.float64}}
    assert not lower, lower


def test_float64_mode_promotes_every_spelling_of_float32():
    x = torch.ones(3)
    with Float64Mode():
        got = [
            x.float().dtype,
            x.to(torch.float32).dtype,
            x.to(dtype=torch.float32).dtype,
            torch.softmax(x.double(), -1, dtype=torch.float32).dtype,
            torch.zeros(2, dtype=torch.float32).dtype,
        ]
    assert got == [torch.float64] * 5
    assert x.to(torch.float32).dtype == torch.float32  # outside the mode nothing changes


@pytest.mark.slow
def test_demo_8k_row_of_216_short_samples_passes(tmp_path):
    """The row that failed (8K demo pack, row 103): every figure at float64 round-off now."""
    from longpack.jobs import PackConfig
    from longpack.packed.folder import PackedFolder
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset
    from longpack.runtime.verify import RowVerifier

    out = tmp_path / "demo8k"
    PackConfig(demo=True, out=out, pack_size=8192, seq_length=4096).run()
    folder = PackedFolder.open(out)
    dataset = PackedDataset(folder, split="training", prefetch=0)
    collate = PackedCollator.for_data(folder, split="training")
    verifier = RowVerifier(build_model(load_hf_config(str(QWEN3))), collate=collate)
    row = dataset[103]
    report = verifier.verify(row, {"split": "training", "file": "f", "row": 103}, 103, in_batch=False)
    dataset.close()
    assert report.samples == 216 and report.ok, report.failures
    assert report.embedding_grad_max_rel_diff < 1e-12 and report.grad_max_rel_diff < 1e-12
    assert report.loss_max_rel_diff < 1e-12
