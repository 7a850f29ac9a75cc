"""THD runtime benchmark: collate throughput, CP partition cost, packed vs padded CPU attention.

Run: ``PYTHONPATH=src python benchmarks/runtime.py [--quick]``. Prints three tables (medians of several
runs, ratios against reference implementations run in the same process):

1. ``collate_packed`` packs/s for 8K, 32K and 128K packs vs a straightforward list-based collate written the
   way Megatron-Bridge's ``GPTSFTPackedDataset.collate_fn`` does it (per-segment Python slicing).
2. ``thd_partition_indices`` for a 128K row vs a per-segment loop of ``zigzag_indices``.
3. CPU attention over the same samples, packed into THD rows (``varlen_attention``) vs right-padded into a
   ``[B, max_len]`` batch (one SDPA call with a padding + causal mask): the padding compute packing saves.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
import torch.nn.functional as F

from longpack.runtime.attention import varlen_attention
from longpack.runtime.collate import collate_packed
from longpack.runtime.context_parallel import thd_partition_indices, zigzag_indices
from timing import median_time

EOS = 2


def synthetic_pack(pack_size: int, rng: np.random.Generator, multiple: int = 1) -> dict[str, np.ndarray]:
    """A full pack of SFT-like samples (log-normal lengths, median ~500 runtime tokens)."""
    ids, mask, starts = [], [], []
    used = 0
    while True:
        length = int(np.clip(rng.lognormal(6.2, 0.8), 8, pack_size))
        aligned = -(-length // multiple) * multiple
        if used + aligned > pack_size:
            break
        starts.append(sum(len(a) for a in ids))
        ids.append(np.concatenate([rng.integers(3, 50_000, size=length), np.full(aligned - length + 1, EOS)]))
        mask.append(np.concatenate([np.ones(length, np.int8), np.zeros(aligned - length + 1, np.int8)]))
        used += aligned
    return {
        "input_ids": np.concatenate(ids),
        "loss_mask": np.concatenate(mask),
        "seq_start_id": np.array(starts),
    }


def reference_collate(rows: list[dict], max_seq_length: int, eos_id: int) -> dict:
    """List-based collate in the style of Megatron-Bridge's packed collate_fn (m=1, pad_to_max_length)."""
    tokens, labels, loss_mask, position_ids, cu_seqlens = [], [], [], [], []
    for row in rows:
        ids = list(row["input_ids"])
        mask = list(row["loss_mask"])
        b = [*list(row["seq_start_id"]), len(ids)]
        t, lab, lm, pos, cu = [], [], [], [], [0]
        for i in range(len(b) - 1):
            t.extend(ids[b[i] : b[i + 1] - 1])
            lab.extend(ids[b[i] + 1 : b[i + 1]])
            lm.extend(mask[b[i] : b[i + 1] - 1])
            pos.extend(range(b[i + 1] - b[i] - 1))
            cu.append(cu[-1] + b[i + 1] - b[i] - 1)
        if cu[-1] != max_seq_length:
            cu.append(max_seq_length)
        pad = max_seq_length - len(t)
        tokens.append(t + [eos_id] * pad)
        labels.append(lab + [eos_id] * pad)
        loss_mask.append(lm + [0] * pad)
        position_ids.append(pos + [0] * pad)
        cu_seqlens.append(cu)
    width = max(len(c) for c in cu_seqlens)
    return {
        "tokens": torch.LongTensor(tokens),
        "labels": torch.LongTensor(labels),
        "loss_mask": torch.LongTensor(loss_mask),
        "position_ids": torch.LongTensor(position_ids),
        "cu_seqlens_q": torch.IntTensor([c + [c[-1]] * (width - len(c)) for c in cu_seqlens]),
    }


def bench_collate(quick: bool) -> None:
    rng = np.random.default_rng(0)
    print("\n## collate throughput (1 pack per call, pad_to_max_length, m=1)")
    print(
        f"{'pack size':>10} {'seqs/pack':>10} {'longpack packs/s':>17} {'reference packs/s':>18} {'ratio':>7}"
    )
    for pack_size in (8192, 32768, 131072):
        packs = [synthetic_pack(pack_size, rng) for _ in range(4)]
        seqs = statistics.mean(len(p["seq_start_id"]) for p in packs)
        repeats = 3 if quick else 7

        def ours(packs=packs, pack_size=pack_size):
            for p in packs:
                collate_packed([p], max_seq_length=pack_size, eos_id=EOS, pad_to_max_length=True)

        def ref(packs=packs, pack_size=pack_size):
            for p in packs:
                reference_collate([p], pack_size, EOS)

        got = collate_packed([packs[0]], max_seq_length=pack_size, eos_id=EOS, pad_to_max_length=True)
        want = reference_collate([packs[0]], pack_size, EOS)
        for key in want:
            assert torch.equal(got[key].to(want[key].dtype), want[key]), key
        t_ours = median_time(ours, repeats, warmup=True) / len(packs)
        t_ref = median_time(ref, repeats, warmup=True) / len(packs)
        print(f"{pack_size:>10} {seqs:>10.1f} {1 / t_ours:>17.1f} {1 / t_ref:>18.1f} {t_ref / t_ours:>6.1f}x")


def bench_partition(quick: bool) -> None:
    rng = np.random.default_rng(1)
    print("\n## CP partition indices, one 128K THD row")
    print(f"{'cp':>3} {'segments':>9} {'longpack ms':>12} {'per-segment loop ms':>20} {'ratio':>7}")
    for cp in (2, 4, 8):
        m = 2 * cp
        lengths = []
        while sum(lengths) < 131072:
            lengths.append(-(-int(np.clip(rng.lognormal(6.2, 0.8), 8, 8192)) // m) * m)
        lengths[-1] -= sum(lengths) - 131072
        lengths = [n for n in lengths if n > 0]
        cu = np.concatenate([[0], np.cumsum(lengths)])
        total = int(cu[-1])

        def ours(cu=cu, total=total, cp=cp):
            for rank in range(cp):
                thd_partition_indices(cu, total, cp_size=cp, cp_rank=rank)

        def loop(cu=cu, lengths=lengths, cp=cp):
            for rank in range(cp):
                torch.cat(
                    [zigzag_indices(n, cp, rank) + int(s) for s, n in zip(cu[:-1], lengths, strict=True)]
                )

        for rank in range(cp):
            a = thd_partition_indices(cu, total, cp_size=cp, cp_rank=rank)
            b = torch.cat(
                [zigzag_indices(n, cp, rank) + int(s) for s, n in zip(cu[:-1], lengths, strict=True)]
            )
            assert torch.equal(a, b)
        repeats = 3 if quick else 9
        t_ours = median_time(ours, repeats, warmup=True) / cp
        t_loop = median_time(loop, repeats, warmup=True) / cp
        print(
            f"{cp:>3} {len(lengths):>9} {t_ours * 1e3:>12.2f} {t_loop * 1e3:>20.2f} {t_loop / t_ours:>6.1f}x"
        )


def padded_attention(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    batch = len(lengths)
    width = max(lengths)
    q = torch.zeros(batch, x.size(1), width, x.size(2), dtype=x.dtype)
    start = 0
    for i, n in enumerate(lengths):
        q[i, :, :n] = x[start : start + n].transpose(0, 1)
        start += n
    keep = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    mask = causal[None, None] & keep[:, None, None, :]
    return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def bench_attention(quick: bool) -> None:
    rng = np.random.default_rng(2)
    heads, dim = 4, 32
    print(
        f"\n## CPU attention, same samples: packed THD vs right-padded batch (heads={heads}, head_dim={dim})"
    )
    print(
        f"{'samples':>8} {'max len':>8} {'tokens':>7} {'padded slots':>13} {'packed ms':>10} {'padded ms':>10} {'ratio':>7}"
    )
    for count in (16,) if quick else (16, 64):
        lengths = [int(np.clip(rng.lognormal(5.8, 0.9), 8, 2048)) for _ in range(count)]
        total = sum(lengths)
        x = torch.from_numpy(rng.standard_normal((total, heads, dim)).astype(np.float32))
        cu = torch.tensor([0, *np.cumsum(lengths).tolist()])
        repeats = 2 if quick else 3
        t_packed = median_time(lambda x=x, cu=cu: varlen_attention(x, x, x, cu), repeats, warmup=True)
        t_padded = median_time(
            lambda x=x, lengths=lengths: padded_attention(x, lengths), repeats, warmup=True
        )
        print(
            f"{count:>8} {max(lengths):>8} {total:>7} {count * max(lengths):>13} {t_packed * 1e3:>10.1f} "
            f"{t_padded * 1e3:>10.1f} {t_padded / t_packed:>6.1f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 intra-op thread; medians of repeated runs")
    bench_collate(args.quick)
    bench_partition(args.quick)
    bench_attention(args.quick)


if __name__ == "__main__":
    main()
