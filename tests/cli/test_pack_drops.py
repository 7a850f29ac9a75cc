"""Drops are never quiet: ``longpack pack`` as a user runs it (a subprocess) warns past 5 % of samples or
tokens lost, with length percentiles and the pack size that keeps 99 %; ``--max-drop-fraction`` exits 1
before anything is written; ``--overlength fragment`` loses nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from longpack.cli.app import app

runner = CliRunner()


def long_rows(path: Path) -> Path:
    # 100 samples; 78 of them are longer than 64 bytes-tokenizer tokens
    rows = [{"prompt": "q" * 10, "completion": "a" * (10 if i < 22 else 80 + i)} for i in range(100)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def longpack(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    return subprocess.run(
        [sys.executable, "-m", "longpack.cli.app", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_max_drop_fraction_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    src = long_rows(tmp_path / "chat.jsonl")
    out = tmp_path / "out"
    common = [
        "pack",
        str(src),
        "--tokenizer",
        "bytes",
        "--seq-length",
        "64",
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    p = longpack(*common, "--max-drop-fraction", "0.1")
    assert p.returncode == 1, p.stderr
    assert "--max-drop-fraction 0.1 exceeded, no packed rows written: 78 of 100 samples (78.0 %)" in p.stderr
    assert "p50 " in p.stderr and "p99 " in p.stderr
    assert "a larger pack size keeps them: --seq-length 188 keeps 99 % of the samples" in p.stderr
    assert not out.exists()
    # without the limit: packed, with the warning in the report (and the manifest)
    p = longpack(*common)
    assert p.returncode == 0, p.stderr
    assert "warning: 78 of 100 samples (78.0 %)" in p.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["drops"]["keep_99_pack_size"] == 188
    assert manifest["warnings"][0].startswith("78 of 100 samples")


def test_no_warning_under_five_percent_and_fragment_keeps_everything(tmp_path: Path) -> None:
    src = long_rows(tmp_path / "chat.jsonl")
    base = ["pack", str(src), "--tokenizer", "bytes", "--workers", "1", "--json"]
    r = runner.invoke(app, [*base, "--seq-length", "256", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert not any("dropped or truncated" in w for w in json.loads(r.output)["warnings"])
    r = runner.invoke(
        app,
        [
            *base,
            "--seq-length",
            "64",
            "--overlength",
            "fragment",
            "--max-drop-fraction",
            "0",
            "--out",
            str(tmp_path / "b"),
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["counts"]["fragmented"] == 78 and summary["counts"]["dropped"] == 0
    assert summary["counts"]["packed"] == 100
    assert summary["splits"]["training"]["fragmented"] == 78
