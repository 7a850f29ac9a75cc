"""Small packed folders for the verify tests: random pre-tokenized samples in the qwen3 vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

EOS = 151645  # qwen3's EOS id (longpack's "qwen3" tokenizer)
QWEN3 = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "qwen3_8b.json"


def write_samples(path: Path, n: int = 40, *, seed: int = 0, max_len: int = 40) -> Path:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        length = int(rng.integers(3, max_len))
        ids = [*rng.integers(10, 150000, size=length - 1).tolist(), EOS]
        prompt = int(rng.integers(1, length - 1))
        lines.append(json.dumps({"input_ids": ids, "loss_mask": [0] * prompt + [1] * (length - prompt)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def pack(tmp: Path, name: str, **options: Any) -> Path:
    from longpack.jobs import PackConfig

    data = write_samples(tmp / f"{name}.jsonl", seed=len(name))
    settings: dict[str, Any] = {"seq_length": 64, "pack_size": 64, **options}
    PackConfig(inputs=[str(data)], out=tmp / name, tokenizer="qwen3", **settings).run()
    return tmp / name
