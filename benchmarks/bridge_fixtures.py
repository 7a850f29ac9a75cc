"""Write the byte-compatibility fixtures of ``tests/data/bridge_compat/`` by running Megatron-Bridge's own prepare
step (``prepare_gpt_sft_packed_data``) on fixed tokenized samples.

Run from the repository root with a Megatron-Bridge source checkout (its ``src`` folder):

    PYTHONPATH=src python benchmarks/bridge_fixtures.py --bridge-src /path/to/Megatron-Bridge/src \\
        --out tests/data/bridge_compat

Bridge's code is imported from that checkout, unmodified: ``data/packing/offline.py`` (tokenized samples ->
pre-pad -> histogram -> seeded ``first_fit_shuffle`` -> fill -> write), ``data/packing/algorithms.py``,
``data/packing/parquet.py`` (``write_packed_parquet``), ``data/packing/paths.py`` and ``utils/safe_pickle.py``;
``megatron.core.msc_utils`` comes from the installed megatron-core. Only what the prepare step does not
execute is stubbed, so the package ``__init__`` files (which import every model) are not run: the
``MegatronTokenizer`` type hint, and the runtime dataset class ``parquet.py`` subclasses
(``GPTSFTPackedDataset``; not used to write). The tokenized samples come from a ``dataset_builder`` that
returns them as they are, which is the hook Bridge's prepare step takes for its tokenizing dataset: both
Bridge and the CI test start from the same tokenized samples (``samples_training.jsonl``,
``samples_validation.jsonl``, written here too).

The samples (seeded) hold over-long samples (dropped at ``pad_seq_to_mult`` 1, truncated at 8), one-token
samples, samples that end in EOS and samples that do not. Two cases are written, each with a training and a
validation split prepared as Bridge's builder does (same seed, metadata appended):

* ``m1``: ``packed_sequence_size`` 32, ``max_seq_length`` 24, ``pad_seq_to_mult`` 1;
* ``m8``: ``packed_sequence_size`` 32, ``max_seq_length`` 32, ``pad_seq_to_mult`` 8.

The README written next to the files names the Bridge commit, numpy and pyarrow.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

EOS = 258  # the ``bytes`` tokenizer's EOS, so the samples are valid pretokenized rows for longpack too
VOCAB = 259
SEED = 1234
CASES = {
    "m1": {"pack_size": 32, "seq_length": 24, "mult": 1},
    "m8": {"pack_size": 32, "seq_length": 32, "mult": 8},
}


def make_samples(n: int, seed: int) -> list[dict[str, list[int]]]:
    """Tokenized samples: lognormal lengths (median 7), 4 % one-token, 4 % over-long (40-60 tokens),
    most ending in EOS; loss on the answer (the part after a random prompt)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 0.04:
            length = 1
        elif u < 0.08:
            length = int(rng.integers(40, 61))
        else:
            length = int(np.clip(round(rng.lognormal(np.log(7), 0.6)), 2, 30))
        ids = rng.integers(0, EOS, length).tolist()
        if rng.random() < 0.85:
            ids[-1] = EOS
        prompt = int(rng.integers(0, length))
        mask = [0] * prompt + [1] * (length - prompt)
        out.append({"input_ids": ids, "loss_mask": mask})
    return out


def load_bridge(src: Path) -> types.ModuleType:
    """Bridge's ``offline`` module from the checkout, with only the stubs named in the module docstring."""
    root = src / "megatron" / "bridge"
    if not (root / "data" / "packing" / "offline.py").is_file():
        raise SystemExit(f"{src}: no megatron/bridge/data/packing/offline.py; pass the checkout's src folder")
    import megatron.core.msc_utils  # noqa: F401  (installed megatron-core)

    def package(name: str, path: Path | None) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__path__ = [str(path)] if path is not None else []
        sys.modules[name] = module
        return module

    package("megatron.bridge", root)
    package("megatron.bridge.data", root / "data")
    package("megatron.bridge.data.packing", root / "data" / "packing")
    package("megatron.bridge.utils", root / "utils")
    package("megatron.bridge.training", None)
    package("megatron.bridge.training.tokenizers", None)
    tokenizer = types.ModuleType("megatron.bridge.training.tokenizers.tokenizer")

    class MegatronTokenizer:  # type hint only
        pass

    tokenizer.MegatronTokenizer = MegatronTokenizer  # type: ignore[attr-defined]
    sys.modules[tokenizer.__name__] = tokenizer
    runtime = types.ModuleType("megatron.bridge.data.packing.gpt_sft")

    class GPTSFTPackedDataset:  # the runtime reader parquet.py subclasses; writing never touches it
        pass

    runtime.GPTSFTPackedDataset = GPTSFTPackedDataset  # type: ignore[attr-defined]
    sys.modules[runtime.__name__] = runtime
    return importlib.import_module("megatron.bridge.data.packing.offline")


class _Samples:
    """What Bridge's ``tokenize_dataset`` needs from its dataset: ``tokenizer.eod``, the multiple, items."""

    def __init__(self, rows: list[dict[str, list[int]]], multiple: int) -> None:
        self.rows = rows
        self.tokenizer = types.SimpleNamespace(eod=EOS, eos_id=EOS)
        self.pad_seq_length_to_mult = multiple

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        row = self.rows[i]
        # A fresh dict per access (the pre-pad step mutates it); the mask as bools, as the chat path gives it.
        return {"input_ids": list(row["input_ids"]), "loss_mask": [bool(v) for v in row["loss_mask"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bridge-src", type=Path, required=True, help="the src folder of a Megatron-Bridge checkout"
    )
    ap.add_argument("--out", type=Path, default=Path("tests/data/bridge_compat"))
    ap.add_argument(
        "--bridge-commit", default=None, help="commit to record (default: git rev-parse in the checkout)"
    )
    args = ap.parse_args()
    offline = load_bridge(args.bridge_src)
    import pyarrow

    args.out.mkdir(parents=True, exist_ok=True)
    splits = {"training": make_samples(2400, 0), "validation": make_samples(300, 1)}
    for split, rows in splits.items():
        with open(args.out / f"samples_{split}.jsonl", "w") as fh:
            for row in rows:
                fh.write(json.dumps(row, separators=(",", ":")) + "\n")
    tok = types.SimpleNamespace(eos_id=EOS, eod=EOS)
    for case, c in CASES.items():
        folder = args.out / case
        folder.mkdir(exist_ok=True)
        for p in folder.iterdir():
            p.unlink()
        meta = folder / f"{c['pack_size']}_metadata.jsonl"
        for split, rows in splits.items():
            offline.prepare_gpt_sft_packed_data(
                input_path=Path(f"<{split} samples>"),
                output_path=folder / f"{split}_{c['pack_size']}.idx.parquet",
                output_metadata_path=meta,
                packed_sequence_size=c["pack_size"],
                tokenizer=tok,
                max_seq_length=c["seq_length"],
                seed=SEED,
                pad_seq_to_mult=c["mult"],
                dataset_builder=lambda *_a, _rows=rows, _m=c["mult"], **_k: _Samples(_rows, _m),
            )
    commit = args.bridge_commit or "unknown"
    git = subprocess.run(
        ["git", "-C", str(args.bridge_src), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if git.returncode == 0 and args.bridge_commit is None:
        commit = git.stdout.strip()
    lines = [
        "# Megatron-Bridge byte-compatibility fixtures",
        "",
        "Written by `benchmarks/bridge_fixtures.py`, which runs Megatron-Bridge's own prepare step",
        "(`megatron.bridge.data.packing.offline.prepare_gpt_sft_packed_data`, imported unmodified from a source",
        "checkout) on the tokenized samples `samples_training.jsonl` / `samples_validation.jsonl` (pretokenized",
        f"rows, EOS id {EOS}, seed {SEED}).",
        "",
        f"- Megatron-Bridge commit: `{commit}`",
        f"- numpy {np.__version__}, pyarrow {pyarrow.__version__} (the Parquet bytes depend on pyarrow's writer)",
        "",
        "| case | packed_sequence_size | max_seq_length | pad_seq_to_mult |",
        "|---|---|---|---|",
        *(f"| `{k}` | {c['pack_size']} | {c['seq_length']} | {c['mult']} |" for k, c in CASES.items()),
        "",
        '`tests/packed/test_bridge_compat.py` packs the same samples with `compat="megatron-bridge"` and',
        "compares the files byte for byte. Regenerate with:",
        "",
        "    PYTHONPATH=src python benchmarks/bridge_fixtures.py --bridge-src <Megatron-Bridge>/src",
        "",
    ]
    (args.out / "README.md").write_text("\n".join(lines))
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            print(f"{p}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
