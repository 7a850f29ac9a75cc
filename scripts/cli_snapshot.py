"""Record what the CLI prints, so a refactor can prove it changed nothing: ``--help`` of every command and
sub-command, the ``--json`` output of representative commands and the bytes of the files they write.

    PYTHONPATH=src python scripts/cli_snapshot.py OUT.json     # record (the longpack on PYTHONPATH)
    diff <(PYTHONPATH=src python scripts/cli_snapshot.py -) before.json

Temp paths are replaced by ``<TMP>`` and the values of timing keys (``seconds``, ``*_s``) by ``<t>``, so two
runs of the same code give the same file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

TIMING = re.compile(r"(seconds|_s|_sec|elapsed|wall|time|duration|_ms|per_s|tokens_per_second|throughput)$")


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    if hasattr(group, "list_commands"):
        ctx = type(group).context_class(group)
        for name in group.list_commands(ctx):
            out += _commands(group.get_command(ctx, name), (*prefix, name))
    return out


def helps() -> dict[str, str]:
    """``--help`` of every command and sub-command, at 100 columns."""
    import typer.main
    from typer.testing import CliRunner

    from longpack.cli.app import app

    root = typer.main.get_command(app)
    runner = CliRunner()
    env = {"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}
    got = {}
    for path in _commands(root):
        r = runner.invoke(app, [*path, "--help"], env=env, terminal_width=100)
        got[" ".join(path) or "<root>"] = f"rc={r.exit_code}\n{r.output}"
    return got


def _scrub(value: Any, tmp: str) -> Any:
    if isinstance(value, dict):
        return {
            k: ("<t>" if TIMING.search(k) and isinstance(v, int | float) else _scrub(v, tmp))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_scrub(v, tmp) for v in value]
    if isinstance(value, str):
        return value.replace(tmp, "<TMP>").replace(os.path.realpath(tmp), "<TMP>")
    return value


def _files(folder: Path, tmp: str) -> dict[str, str]:
    got = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.name.endswith(".lock"):
            data = p.read_bytes()
            if p.suffix in (".json", ".yaml", ".jsonl", ".md", ".txt"):
                text = data.decode().replace(os.path.realpath(tmp), "<TMP>").replace(tmp, "<TMP>")
                if p.suffix == ".json":
                    text = json.dumps(_scrub(json.loads(text), tmp), sort_keys=True)
                data = text.encode()
            got[p.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()[:16]
    return got


def _data(tmp: Path) -> dict[str, Path]:
    rows = [
        {"prompt": f"question {i} " * (1 + i % 5), "completion": "answer " * (1 + i % 13)} for i in range(300)
    ]
    sft = tmp / "sft.jsonl"
    sft.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft2 = tmp / "sft2.jsonl"
    sft2.write_text("".join(json.dumps(r) + "\n" for r in rows[:120]))
    chat = tmp / "chat.jsonl"
    chat.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"hi {i}"},
                        {"role": "assistant", "content": "yo " * i},
                    ]
                }
            )
            + "\n"
            for i in range(1, 40)
        )
    )
    docs = tmp / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": "word " * (3 + i % 40)}) + "\n" for i in range(200)))
    lengths = tmp / "lengths.txt"
    lengths.write_text("".join(f"{(i * 37) % 900 + 5}\n" for i in range(400)))
    return {"sft": sft, "sft2": sft2, "chat": chat, "docs": docs, "lengths": lengths}


def json_runs() -> dict[str, Any]:
    """``--json`` output (and written files' hashes) of representative commands."""
    from typer.testing import CliRunner

    from longpack.cli.app import app

    runner = CliRunner()
    got: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        d = _data(tmp)
        B = ["--tokenizer", "bytes", "--workers", "1"]
        runs: list[tuple[str, list[str], str | None]] = [
            (
                "pack parquet",
                ["pack", str(d["sft"]), *B, "--seq-length", "256", "--out", str(tmp / "p1")],
                "p1",
            ),
            (
                "pack parquet tp/cp/sp val",
                [
                    "pack",
                    str(d["sft"]),
                    *B,
                    "--seq-length",
                    "256",
                    "--tp",
                    "2",
                    "--cp",
                    "2",
                    "--sp",
                    "--val-fraction",
                    "0.1",
                    "--seed",
                    "3",
                    "--out",
                    str(tmp / "p2"),
                ],
                "p2",
            ),
            (
                "pack compat",
                [
                    "pack",
                    str(d["sft"]),
                    *B,
                    "--seq-length",
                    "256",
                    "--compat",
                    "megatron-bridge",
                    "--out",
                    str(tmp / "p3"),
                ],
                "p3",
            ),
            (
                "pack npy",
                [
                    "pack",
                    str(d["sft"]),
                    *B,
                    "--seq-length",
                    "256",
                    "--output-format",
                    "npy",
                    "--out",
                    str(tmp / "p4"),
                ],
                "p4",
            ),
            (
                "pack indexed",
                [
                    "pack",
                    str(d["docs"]),
                    *B,
                    "--seq-length",
                    "128",
                    "--output-format",
                    "indexed",
                    "--format",
                    "text",
                    "--out",
                    str(tmp / "p5"),
                ],
                "p5",
            ),
            (
                "pack mix",
                [
                    "pack",
                    *B,
                    "--seq-length",
                    "256",
                    "--mix",
                    f"{d['sft']}=0.7",
                    "--mix",
                    f"{d['sft2']}=0.3",
                    "--out",
                    str(tmp / "p6"),
                ],
                "p6",
            ),
            (
                "pack fragment int32 first_fit",
                [
                    "pack",
                    str(d["sft"]),
                    *B,
                    "--seq-length",
                    "64",
                    "--overlength",
                    "fragment",
                    "--ids-dtype",
                    "int32",
                    "--algorithm",
                    "first_fit",
                    "--out",
                    str(tmp / "p7"),
                ],
                "p7",
            ),
            (
                "pack chat",
                ["pack", str(d["chat"]), *B, "--seq-length", "128", "--out", str(tmp / "p8")],
                "p8",
            ),
            ("tokenize", ["tokenize", str(d["sft"]), *B, "--out", str(tmp / "store")], None),
            (
                "pack store",
                ["pack", "--store", str(tmp / "store"), "--seq-length", "128", "--out", str(tmp / "p9")],
                "p9",
            ),
            ("inspect", ["inspect", str(tmp / "p1"), "--verify"], None),
            ("inspect npy", ["inspect", str(tmp / "p4"), "--verify"], None),
            ("inspect store", ["inspect", str(tmp / "store"), "--verify"], None),
            ("sweep", ["sweep", str(d["sft"]), *B, "--pack-size", "256,512", "--token-slots", "2048"], None),
            ("sweep store", ["sweep", "--store", str(tmp / "store"), "--pack-size", "256,512"], None),
            ("preview", ["preview", str(d["chat"]), "--tokenizer", "bytes", "--at", "chat.jsonl:3"], None),
            ("check packed", ["check", "--packed", str(tmp / "p1")], None),
            ("check overrides", ["check", "model.context_parallel_size=2", "--gpus", "8"], None),
            ("thd-batch", ["thd-batch", str(tmp / "p1")], None),
            ("topology", ["topology", "--gpus", "16", "--tp", "2", "--cp", "2", "--sp"], None),
            (
                "plan",
                ["plan", "--model", "deepseek_v3", "--gpu", "H100", "--gpus", "8", "--seq-length", "4096"],
                None,
            ),
            (
                "online-sim",
                [
                    "online-sim",
                    "--pack-size",
                    "1000",
                    "--lengths",
                    str(d["lengths"]),
                    "--buffer-sizes",
                    "2,5",
                ],
                None,
            ),
            (
                "balance",
                ["balance", str(d["lengths"]), "--pack-size", "1000", "--dp", "2", "--gbs", "4"],
                None,
            ),
        ]
        for label, args, folder in runs:
            r = runner.invoke(app, [*args, "--json"], env={"COLUMNS": "100"})
            try:
                out: Any = _scrub(json.loads(r.stdout), name)
            except (json.JSONDecodeError, ValueError):
                out = r.output.replace(name, "<TMP>")
            got[label] = {"rc": r.exit_code, "json": out}
            if folder is not None and (tmp / folder).is_dir():
                got[label]["files"] = _files(tmp / folder, name)
    return got


def main() -> None:
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    snap: dict[str, Any] = {}
    if which in ("all", "help"):
        snap["help"] = helps()
    if which in ("all", "json"):
        snap["json"] = json_runs()
    text = json.dumps(snap, indent=1, sort_keys=True, default=str) + "\n"
    if len(sys.argv) < 2 or sys.argv[1] == "-":
        sys.stdout.write(text)
    else:
        Path(sys.argv[1]).write_text(text)


if __name__ == "__main__":
    main()
