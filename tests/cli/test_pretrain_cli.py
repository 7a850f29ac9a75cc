"""``longpack pack --format text --output-format indexed`` and ``longpack inspect`` on the prefix, via the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longpack.cli.app import app

runner = CliRunner()


def test_pack_indexed_then_inspect_the_prefix(tmp_path: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": f"document {i} " * (i % 9 + 1)}) + "\n" for i in range(80)))
    out = tmp_path / "out"
    r = runner.invoke(
        app,
        ["pack", str(src), "--format", "text", "--text-key", "body", "--tokenizer", "bytes", "--workers", "1",
         "--seq-length", "32", "--output-format", "indexed", "--out", str(out), "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["documents"] == 80 and summary["dtype"] == "uint16"
    assert summary["data_path"] == str(out.resolve() / "training_text_document")
    r = runner.invoke(
        app, ["inspect", summary["prefixes"][0], "--seq-length", "32", "--sample", "0", "--json"]
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)["prefixes"][summary["prefixes"][0]]
    assert report["documents"] == 80 and report["gpt_dataset"] == summary["gpt_dataset"]
    cu = report["sample"]["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == 32 and cu == sorted(cu)
    r = runner.invoke(app, ["inspect", str(out)])  # the folder: its manifest's seq_length and seed
    assert r.exit_code == 0 and "documents cut at sample boundaries" in r.output, r.output
    # settings that mean nothing for indexed data are refused, with the reason
    r = runner.invoke(
        app,
        ["pack", str(src), "--format", "text", "--text-key", "body", "--tokenizer", "bytes", "--seq-length", "32",
         "--output-format", "indexed", "--overlength", "truncate", "--out", str(tmp_path / "x")],
    )  # fmt: skip
    assert r.exit_code == 2 and "documents are written whole" in r.output
