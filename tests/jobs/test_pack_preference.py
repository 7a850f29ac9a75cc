"""``longpack pack --output-format dpo``: preference rows tokenized as NeMo-Aligner's DPOModelDataset tokenizes a
string prompt, packed whole into its packed DPO ``.npy``, provenance by file:line, and checked by verify --dpo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.errors import ConfigError
from longpack.jobs import PackConfig
from longpack.packed.preference import LABELS_PAD_ID, read_packed_dpo
from longpack.text.tokenizers import load_tokenizer

ROWS = [
    {"prompt": "Question: what is 2+2?\nAnswer:", "chosen_response": " 4", "rejected_response": " 5"},
    {"prompt": "Name a colour.\n", "chosen": "Blue", "rejected": "Table", "chosen_reward": 3.5},
    {"prompt": ["a", "conversation"], "chosen": "x", "rejected": "y"},
    {"prompt": "Hello", "chosen": "world", "rejected": " there"},  # qwen3 merges "Helloworld"
    {"prompt": "Say hi.\n", "chosen": "Hi there, friend.", "rejected": "No."},
    {"prompt": "Long.\n", "chosen": " word" * 80, "rejected": "short"},
    {"prompt": "", "chosen": "A", "rejected": "No, not that."},  # one token: trains on nothing
]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return path


def test_pairs_packed_as_nemo_aligner_tokenizes_them(data, tmp_path):
    with pytest.warns(UserWarning):
        result = PackConfig(
            inputs=[str(data)], out=tmp_path / "o", tokenizer="qwen3", pack_size=64, output_format="dpo"
        ).run()
    summary = result.to_dict()
    assert summary["counts"] == {
        "rows_read": 7, "malformed": 3, "pairs_read": 4, "packed": 3, "dropped": 1, "rows": summary["counts"]["rows"]
    }  # fmt: skip
    reasons = {m["source"]: m["reason"] for m in result.manifest.malformed}
    assert "prompt is a list" in reasons[f"{data}:3"] and "seam" in reasons[f"{data}:4"]
    assert "has 1 token(s); it needs 2" in reasons[f"{data}:7"]
    assert summary["dropped"] == [f"{data}:6"]
    rows = read_packed_dpo(summary["file"])
    assert Path(summary["file"]).name == "packed_64_seed0.npy"
    sources = result.manifest.extra["preference"]["row_sources"]
    tok = load_tokenizer("qwen3")
    seen = []
    for i, row in enumerate(rows):
        for k, (pair, label) in enumerate(zip(row["pair_ids"], sources[str(i)], strict=True)):
            line = int(label.rsplit(":", 1)[1])
            src = ROWS[line - 1]
            prompt = tok.encode(src["prompt"])
            a, b, c = row["seq_boundaries"][2 * k : 2 * k + 3]
            for (lo, hi), side in (((a, b), "chosen"), ((b, c), "rejected")):
                text = src.get(f"{side}_response", src.get(side))
                assert row["input_ids"][lo:hi] == tok.encode(src["prompt"] + text)
                assert row["labels"][lo : lo + len(prompt)] == [LABELS_PAD_ID] * len(prompt)
                assert row["labels"][lo + len(prompt) : hi] == row["input_ids"][lo + len(prompt) : hi]
            assert row["reward"][2 * k : 2 * k + 2] == [src.get("chosen_reward", 1.0), 0.0]
            seen.append(line)
            assert pair >= 0
    assert sorted(seen) == [1, 2, 5]
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["settings"]["output_format"] == "dpo"


def test_refusals_name_the_setting(data, tmp_path):
    with pytest.raises(ConfigError, match="output_format dpo: drop val_fraction"):
        PackConfig(
            inputs=[str(data)], out=tmp_path / "o", tokenizer="qwen3", pack_size=64, output_format="dpo",
            val_fraction=0.1,
        )  # fmt: skip


def test_cli_pack_then_verify(data, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli"
    packed = runner.invoke(
        app,
        [
            "pack",
            str(data),
            "--out",
            str(out),
            "--tokenizer",
            "qwen3",
            "--pack-size",
            "64",
            "--output-format",
            "dpo",
        ],
    )
    assert packed.exit_code == 0, packed.output
    assert "packed DPO pairs ->" in packed.output and "dropped 1" in packed.output
    verified = runner.invoke(
        app, ["verify", "--dpo", str(out / "packed_64_seed0.npy"), "--model", "qwen3_8b"]
    )
    assert verified.exit_code == 0, verified.output
    assert verified.output.startswith("PASS: ")
    as_sft = runner.invoke(app, ["verify", str(out), "--model", "qwen3_8b"])
    assert as_sft.exit_code == 2 and "verify them with --dpo" in as_sft.output
    broken = runner.invoke(
        app,
        ["verify", "--dpo", str(out / "packed_64_seed0.npy"), "--model", "qwen3_8b", "--inject-fault",
         "dpo-pairs-misaligned"],
    )  # fmt: skip
    assert broken.exit_code in (1, 2), broken.output  # 2: every row holds one pair at this size
