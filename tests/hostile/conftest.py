"""Shared inputs of the hostile suite: good data, a finished packed folder (several shards, two splits)
and the corpora of bad files, built once per session; tests copy what they damage."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostile_helpers import bad_config_files, bad_input_files, bad_length_files, good_jsonl, invoke


@dataclass(frozen=True)
class World:
    root: Path
    good: Path  # 40 prompt/completion rows
    packed: Path  # `longpack pack` of `good`: training + validation splits, 5-row shards
    lengths: Path  # a valid length list
    inputs: dict[str, Path]
    length_files: dict[str, Path]
    configs: dict[str, Path]

    def __repr__(self) -> str:  # hypothesis prints the fixtures of a failing case
        return f"World({self.root})"

    def copy_packed(self, dest: Path) -> Path:
        shutil.copytree(self.packed, dest)
        return dest

    @property
    def manifest(self) -> dict:
        return json.loads((self.packed / "manifest.json").read_text())


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("hostile")
    good = good_jsonl(root / "good.jsonl")
    packed = root / "packed"
    args = ["pack", good, "--out", packed, "--tokenizer", "bytes", "--seq-length", "64"]
    outcome = invoke([*args, "--val-fraction", "0.2", "--rows-per-shard", "5"])
    assert outcome.exit_code == 0, str(outcome)
    lengths = root / "lengths.txt"
    lengths.write_text("".join(f"{n}\n" for n in (5, 17, 30, 64, 12, 40, 3, 60)))
    return World(
        root=root,
        good=good,
        packed=packed,
        lengths=lengths,
        inputs=bad_input_files(root / "bad_inputs"),
        length_files=bad_length_files(root / "bad_lengths"),
        configs=bad_config_files(root / "bad_configs"),
    )
