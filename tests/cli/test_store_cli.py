"""`longpack tokenize` and the commands that take its store (pack, sweep, balance, online-sim, inspect) through
the CLI;
a changed input is exit 2 with what changed."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longpack.cli.app import app

runner = CliRunner()


def _rows(path: Path, n: int) -> Path:
    path.write_text(
        "".join(
            json.dumps({"prompt": f"question {i} " * (1 + i % 7), "completion": f"answer {i} " * (1 + i % 4)})
            + "\n"
            for i in range(n)
        )
    )
    return path


def test_tokenize_then_pack_sweep_balance_online_sim(tmp_path: Path) -> None:
    src = _rows(tmp_path / "d.jsonl", 300)
    store = tmp_path / "store"
    r = runner.invoke(
        app, ["tokenize", str(src), "--tokenizer", "bytes", "--workers", "1", "--out", str(store), "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["samples"] == 300
    direct = runner.invoke(
        app,
        [
            "pack",
            str(src),
            "--tokenizer",
            "bytes",
            "--workers",
            "1",
            "--seq-length",
            "512",
            "--out",
            str(tmp_path / "a"),
        ],
    )
    stored = runner.invoke(
        app, ["pack", "--store", str(store), "--seq-length", "512", "--out", str(tmp_path / "b")]
    )
    assert direct.exit_code == 0 and stored.exit_code == 0, stored.output
    assert (tmp_path / "a" / "training_512.idx.parquet").read_bytes() == (
        tmp_path / "b" / "training_512.idx.parquet"
    ).read_bytes()
    r = runner.invoke(app, ["sweep", "--store", str(store), "--pack-size", "256,512", "--json"])
    assert r.exit_code == 0, r.output
    assert [c["pack_length"] for c in json.loads(r.output)["candidates"]] == [256, 512]
    r = runner.invoke(app, ["balance", str(store), "--pack-size", "512", "--dp", "2", "--gbs", "4"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        app, ["online-sim", "--lengths", str(store), "--pack-size", "512", "--buffer-sizes", "8"]
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["inspect", str(store), "--verify", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["changes"] == [], r.output
    src.write_text(src.read_text() + "\n")  # the input changed
    r = runner.invoke(app, ["inspect", str(store)])
    assert r.exit_code == 1 and "changed: " in r.output and "d.jsonl: size" in r.output
    r = runner.invoke(
        app, ["pack", "--store", str(store), "--seq-length", "512", "--out", str(tmp_path / "c")]
    )
    assert r.exit_code == 2 and "d.jsonl: size" in r.output and "Traceback" not in r.output
