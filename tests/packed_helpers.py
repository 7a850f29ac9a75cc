"""Test helpers for longpack.packed: sample builders and a reader written from the format, not from longpack.

The reader follows the path rules and columns of docs/reference/packed-format.md and Megatron-Bridge's
packed ``collate_fn`` (current main contract, docs/reference/thd-batch.md#collate) with plain Python
lists, as Megatron-Bridge does.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from longpack.samples import TokenizedSamples


def make_samples(
    token_lists: list[list[int]], mask_lists: list[list[int]] | None = None, file: str = "data.jsonl"
) -> TokenizedSamples:
    """TokenizedSamples from Python lists (JSONL-style 1-based source rows)."""
    masks = mask_lists if mask_lists is not None else [[1] * len(t) for t in token_lists]
    lengths = [len(t) for t in token_lists]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = [x for t in token_lists for x in t]
    flat_mask = [x for m in masks for x in m]
    return TokenizedSamples(
        tokens=np.array(flat, dtype=np.int32),
        loss_mask=np.array(flat_mask, dtype=np.uint8),
        offsets=offsets,
        source_file=np.zeros(len(lengths), dtype=np.int32),
        source_row=np.arange(1, len(lengths) + 1, dtype=np.int64),
        files=(file,),
    )


def random_samples(
    n: int, *, seed: int, max_len: int, eos: int = 2, vocab: int = 5000, first_token_base: int = 100_000
) -> tuple[TokenizedSamples, list[list[int]], list[list[int]]]:
    """``n`` samples whose first token ``first_token_base + i`` identifies sample ``i``; each ends in EOS."""
    rng = np.random.default_rng(seed)
    tokens, masks = [], []
    for i in range(n):
        length = int(rng.integers(2, max_len + 1))
        body = rng.integers(3, vocab, size=length - 2).tolist()
        ids = [first_token_base + i, *body, eos]
        prompt = int(rng.integers(1, length))
        tokens.append(ids)
        masks.append([0] * prompt + [1] * (length - prompt))
    return make_samples(tokens, masks), tokens, masks


# ---------------------------------------------------------------------------------------------------
# Reader from the format (path rules): resolution and rows as Python lists.


def spec_resolve(spec: str) -> list[str]:
    if os.path.isdir(spec):
        return sorted(glob.glob(os.path.join(spec, "*.parquet")) + glob.glob(os.path.join(spec, "*.pq")))
    if glob.has_magic(spec):
        return sorted(p for p in glob.glob(spec) if p.lower().endswith((".parquet", ".pq")))
    return [spec]


def spec_read_rows(spec: str) -> list[dict[str, Any]]:
    """Every row as Megatron-Bridge's ``__getitem__`` returns it (input_ids, seq_boundaries, loss_mask)."""
    rows = []
    for path in spec_resolve(spec):
        table = pq.read_table(path, columns=["input_ids", "seq_start_id", "loss_mask"])
        for row in table.to_pylist():
            rows.append(
                {
                    "input_ids": row["input_ids"],
                    "seq_boundaries": [*row["seq_start_id"], len(row["input_ids"])],
                    "loss_mask": row["loss_mask"],
                }
            )
    return rows


def spec_collate(items: list[dict[str, Any]], *, eos_id: int, width: int, m: int) -> dict[str, Any]:
    """Collate steps 1-5, 7-9 for ``answer_only_loss=True`` and a fixed width ``W`` (pad_to_max_length)."""
    out: dict[str, Any] = {
        "tokens": [],
        "labels": [],
        "loss_mask": [],
        "position_ids": [],
        "token_count": [],
        "padding_mask": [],
        "cu_seqlens_q": [],
        "cu_seqlens_q_padded": [],
    }
    for item in items:
        ids, b, mask = item["input_ids"], item["seq_boundaries"], item["loss_mask"]
        tokens, labels, loss, pos, lengths = [], [], [], [], []
        for i in range(len(b) - 1):
            tokens += ids[b[i] : b[i + 1] - 1]
            labels += ids[b[i] + 1 : b[i + 1]]
            loss += mask[b[i] : b[i + 1] - 1]
            pos += list(range(b[i + 1] - b[i] - 1))
            lengths.append(b[i + 1] - b[i] - 1)
        out["token_count"].append(len(tokens))
        assert len(tokens) <= width
        cu_phys = [0]
        for length in lengths:
            cu_phys.append(cu_phys[-1] + length)
        if m == 1:
            cu = list(cu_phys)
            if cu[-1] != width:
                cu.append(width)
            padding = [False] * len(tokens) + [True] * (width - len(tokens))
            out["cu_seqlens_q"].append(cu)
        else:
            if cu_phys[-1] != width:
                cu_phys.append(width)
            logical = []
            for i in range(len(b) - 1):
                seg = ids[b[i] : b[i + 1] - 1]
                last = max((j for j, t in enumerate(seg) if t != eos_id), default=-1)
                logical.append(last + 1)
            cu = [0]
            for length in logical:
                cu.append(cu[-1] + length)
            if len(cu_phys) > len(cu):
                cu.append(cu[-1])
            padding = [True] * width
            for i in range(len(cu_phys) - 1):
                for j in range(cu_phys[i], cu_phys[i] + (cu[i + 1] - cu[i])):
                    padding[j] = False
            out["cu_seqlens_q"].append(cu)
            out["cu_seqlens_q_padded"].append(cu_phys)
        pad = width - len(tokens)
        out["tokens"].append(tokens + [eos_id] * pad)
        out["labels"].append(labels + [eos_id] * pad)
        out["loss_mask"].append(loss + [0] * pad)
        out["position_ids"].append(pos + [0] * pad)
        out["padding_mask"].append(padding)
    for key in ("cu_seqlens_q", "cu_seqlens_q_padded"):
        arrays = out[key]
        if arrays:
            k = max(len(a) for a in arrays)
            out[key] = [a + [a[-1]] * (k - len(a)) for a in arrays]
    physical = out["cu_seqlens_q_padded"] if m > 1 else out["cu_seqlens_q"]
    out["max_seqlen_q"] = [[max(a[i + 1] - a[i] for i in range(len(a) - 1))] for a in physical]
    if m == 1:
        del out["cu_seqlens_q_padded"]
    return out


def unpack_rows(rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """Every packed segment as (stored tokens, label-aligned loss mask)."""
    segments = []
    for row in rows:
        b = row["seq_boundaries"]
        for i in range(len(b) - 1):
            segments.append((row["input_ids"][b[i] : b[i + 1]], row["loss_mask"][b[i] : b[i + 1]]))
    return segments


def output_files(out: Any) -> list[str]:
    """Every file of a packed output folder, relative to it (the validation split is in ``validation/``)."""
    from pathlib import Path

    root = Path(out)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def assert_same_output(a: Any, b: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """Two output folders hold the same files with the same bytes; ``bridge_config.yaml`` names its own
    folder, so it is compared with each folder's path replaced. Returns the relative names."""
    from pathlib import Path

    names = output_files(a)
    assert names == output_files(b)
    for name in names:
        if name in skip:
            continue
        got_a, got_b = (Path(a) / name).read_bytes(), (Path(b) / name).read_bytes()
        if name == "bridge_config.yaml":
            got_a = got_a.replace(str(Path(a).absolute()).encode(), b"<out>")
            got_b = got_b.replace(str(Path(b).absolute()).encode(), b"<out>")
        assert got_a == got_b, name
    return names
