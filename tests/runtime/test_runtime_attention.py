"""No cross-contamination: varlen attention and a tiny GPT on packed batches equal the sequences one by one."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.runtime.attention import (
    block_attention,
    merge_partial_attention,
    shard_layout,
    token_layout,
    varlen_attention,
)
from longpack.runtime.collate import collate_packed
from longpack.runtime.in_batch import build_thd_row

EOS = 2


def manual_causal(q, k, v):
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.size(-1))
    mask = torch.triu(torch.ones(q.size(0), q.size(0), dtype=torch.bool), 1)
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(mask, float("-inf")).softmax(-1), v)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=5), st.sampled_from([1, 2, 4]), st.integers(0, 2**16))
def test_varlen_equals_each_sequence_alone(lengths, m, seed):
    gen = torch.Generator().manual_seed(seed)
    padded = [-(-n // m) * m for n in lengths]
    total = sum(padded) + m  # plus a tail past the last boundary
    q, k, v = (torch.randn(total, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    cu = [0]
    pcu = [0]
    for n, p in zip(lengths, padded, strict=True):
        cu.append(cu[-1] + n)
        pcu.append(pcu[-1] + p)
    out = varlen_attention(q, k, v, cu, cu_seqlens_padded=pcu)
    lay = token_layout(cu, total, cu_seqlens_padded=pcu)
    masked, _ = block_attention(q, k, v, lay, lay)
    torch.testing.assert_close(out, masked, rtol=0, atol=1e-12)
    for i, n in enumerate(lengths):
        s = slice(pcu[i], pcu[i] + n)
        if n:
            torch.testing.assert_close(out[s], manual_causal(q[s], k[s], v[s]), rtol=0, atol=1e-12)
        if padded[i] > n:
            assert out[pcu[i] + n : pcu[i + 1]].abs().max().item() == 0.0  # gaps get zeros
    assert out[pcu[-1] :].abs().max().item() == 0.0


def test_perturbing_one_sequence_changes_nothing_else():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 2, 4, generator=gen) for _ in range(3))
    cu = [0, 5, 9, 12]
    base = varlen_attention(q, k, v, cu)
    k2, v2 = k.clone(), v.clone()
    k2[5:9] += 10
    v2[5:9] -= 3
    moved = varlen_attention(q, k2, v2, cu)
    assert torch.equal(base[:5], moved[:5]) and torch.equal(base[9:], moved[9:])
    assert not torch.allclose(base[5:9], moved[5:9])


def test_merge_of_blocks_equals_full():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(16, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    lay = token_layout([0, 3, 11, 14], 16, cu_seqlens_padded=[0, 4, 12, 16])
    full, full_lse = block_attention(q, k, v, lay, lay)
    parts = [slice(0, 5), slice(5, 9), slice(9, 16)]
    out, lse = block_attention(q, k[parts[0]], v[parts[0]], lay, lay.select(torch.arange(0, 5)))
    for p in parts[1:]:
        idx = torch.arange(p.start, p.stop)
        o, ls = block_attention(q, k[p], v[p], lay, lay.select(idx))
        out, lse = merge_partial_attention(out, lse, o, ls)
    torch.testing.assert_close(out, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, full_lse, rtol=0, atol=1e-12)


def test_shard_layout_union_covers_row():
    seen = torch.zeros(16, dtype=torch.long)
    for rank in range(2):
        index, lay = shard_layout(
            [0, 3, 11, 14], 16, cu_seqlens_padded=[0, 4, 12, 16], cp_size=2, cp_rank=rank
        )
        seen[index] += 1
        assert lay.real.sum() > 0
    assert seen.eq(1).all()


def test_varlen_rejects_bad_offsets():
    x = torch.zeros(4, 1, 2)
    with pytest.raises(ValueError, match="exceeds the row length"):
        varlen_attention(x, x, x, [0, 8])
    with pytest.raises(ValueError, match="do not fit"):
        varlen_attention(x, x, x, [0, 3, 4], cu_seqlens_padded=[0, 2, 4])


# ---- a tiny GPT: 2 layers, RoPE from the (restarted) position ids, attention through varlen_attention ----


def rope(x, positions):
    dim = x.size(-1)
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=x.dtype) / dim))
    angles = positions.to(x.dtype)[:, None] * inv[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=40, dim=16, heads=2, layers=2):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "norm1": torch.nn.LayerNorm(dim),
                    "qkv": torch.nn.Linear(dim, 3 * dim),
                    "proj": torch.nn.Linear(dim, dim),
                    "norm2": torch.nn.LayerNorm(dim),
                    "mlp": torch.nn.Sequential(
                        torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
                    ),
                }
            )
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, positions, cu, cu_padded=None):
        x = self.embed(tokens)
        t = tokens.numel()
        for block in self.blocks:
            q, k, v = block["qkv"](block["norm1"](x)).view(t, 3, self.heads, -1).unbind(1)
            att = varlen_attention(rope(q, positions), rope(k, positions), v, cu, cu_seqlens_padded=cu_padded)
            x = x + block["proj"](att.reshape(t, -1))
            x = x + block["mlp"](block["norm2"](x))
        return self.head(x)


def per_token_loss(model, tokens, labels, loss_mask, positions, cu, cu_padded=None):
    logits = model(tokens, positions, cu, cu_padded)
    ce = torch.nn.functional.cross_entropy(logits, labels.clamp(min=0), reduction="none")
    return ce * loss_mask.to(ce.dtype)


@pytest.mark.parametrize("multiple", [1, 4])
def test_tiny_gpt_packed_equals_one_by_one_losses_and_gradients(multiple):
    with torch.random.fork_rng():  # seeded init without leaving the global RNG changed
        torch.manual_seed(0)
        model = TinyGPT().double()
    gen = torch.Generator().manual_seed(3)
    samples = [[*torch.randint(3, 40, (n,), generator=gen).tolist(), EOS] for n in (6, 2, 11, 4)]
    ids, mask, starts = [], [], []
    for s in samples:
        runtime = len(s) - 1
        aligned = -(-runtime // multiple) * multiple
        starts.append(len(ids))
        ids += s + [EOS] * (aligned - runtime)
        mask += [0] + [1] * (runtime - 1) + [0] * (aligned - runtime + 1)
    width = -(-(len(ids) - len(samples)) // 8) * 8 + 8
    batch = collate_packed(
        [{"input_ids": ids, "loss_mask": mask, "seq_start_id": starts}],
        max_seq_length=width,
        eos_id=EOS,
        pad_seq_to_mult=multiple,
        pad_to_max_length=True,
    )
    cu = batch["cu_seqlens_q"][0]
    cu_padded = batch.get("cu_seqlens_q_padded")
    cu_padded = cu_padded[0] if cu_padded is not None else None
    packed = per_token_loss(
        model,
        batch["tokens"][0],
        batch["labels"][0],
        batch["loss_mask"][0],
        batch["position_ids"][0],
        cu,
        cu_padded,
    )
    packed.sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    physical = (cu_padded if cu_padded is not None else cu).tolist()
    total = 0.0
    for i, s in enumerate(samples):
        tokens = torch.tensor(s[:-1])
        labels = torch.tensor(s[1:])
        loss_mask = torch.tensor([0] + [1] * (len(s) - 2))
        alone = per_token_loss(model, tokens, labels, loss_mask, torch.arange(len(tokens)), [0, len(tokens)])
        start = physical[i]
        torch.testing.assert_close(packed[start : start + len(tokens)], alone, rtol=0, atol=1e-12)
        total = total + alone.sum()
    total.backward()
    for packed_grad, param in zip(packed_grads, model.parameters(), strict=True):
        torch.testing.assert_close(packed_grad, param.grad, rtol=0, atol=1e-10)
    assert packed[physical[len(samples)] :].abs().max().item() == 0.0  # nothing trains on the tail


def test_in_batch_row_attention_matches_rows():
    gen = torch.Generator().manual_seed(5)
    rows = [
        {"input_ids": torch.randint(3, 40, (n,), generator=gen), "position_ids": torch.arange(n)}
        for n in (3, 7, 1)
    ]
    packed = build_thd_row(rows, pad_to_multiple_of=4)
    emb = torch.randn(40, 2, 4, generator=gen, dtype=torch.float64)
    x = emb[packed["input_ids"][0]]
    out = varlen_attention(x, x, x, packed["cu_seqlens_q"], cu_seqlens_padded=packed["cu_seqlens_q_padded"])
    for i, row in enumerate(rows):
        start = int(packed["cu_seqlens_q_padded"][i])
        y = emb[row["input_ids"]]
        torch.testing.assert_close(out[start : start + len(y)], manual_causal(y, y, y), rtol=0, atol=1e-12)
