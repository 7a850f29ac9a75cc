"""The output getting-started shows for ``longpack pack --demo`` is what the command prints today.

The page's ``console`` block is rendered from a real run (paths as ``/abs/path``, the dropped list and the
Python snippet shortened); ``LONGPACK_REFRESH_DOCS=1 python -m pytest tests/test_getting_started.py``
rewrites it after a change to the command's output.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longpack.cli.app import app

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
COMMAND = "$ longpack pack --demo --out out/demo"
BLOCK = re.compile(r"```console\n" + re.escape(COMMAND) + r"\n(.*?)```\n", re.S)


def shown(output: str, root: Path) -> str:
    """What the page shows of ``output``: absolute paths as ``/abs/path``, the first dropped sample and
    ``...`` for the rest, the Python snippet as ``...``."""
    lines = output.replace(str(root), "/abs/path").splitlines()
    out: list[str] = []
    skipping = None
    for line in lines:
        if skipping == "dropped":
            if line.startswith("    "):
                continue
            skipping = None
        if skipping == "python":
            if line.startswith("    ") or not line.strip():
                continue
            skipping = None
        if re.match(r"  \w+: \d+ dropped \(", line):
            out.append(line)
            skipping = "first dropped"
            continue
        if skipping == "first dropped":
            out += [line, "    ..."]
            skipping = "dropped"
            continue
        if line.startswith("  in a recipe (Python):"):
            out += [line, "    ..."]
            skipping = "python"
            continue
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.slow
def test_getting_started_shows_what_pack_demo_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["pack", "--demo", "--out", "out/demo"])
    assert result.exit_code == 0, result.output
    text = PAGE.read_text()
    match = BLOCK.search(text)
    assert match is not None, f"{PAGE.name} has no console block for {COMMAND!r}"
    want = shown(result.output, tmp_path)
    if os.environ.get("LONGPACK_REFRESH_DOCS") == "1":
        PAGE.write_text(text[: match.start(1)] + want + text[match.end(1) :])
        return
    assert match.group(1) == want, "getting-started's output is stale: rerun with LONGPACK_REFRESH_DOCS=1"


def test_readme_names_the_bridge_version_bridge_config_is_written_for() -> None:
    """README and ``bridge_config.yaml`` name one Megatron-Bridge version (the README said v0.4.0+ while
    the config said v0.6.0)."""
    from longpack.packed.bridge_config import BRIDGE_CONFIG_VERSION

    readme = (PAGE.parents[1] / "README.md").read_text()
    intro = readme.split("\n\n")[1]
    assert f"Megatron-Bridge ({BRIDGE_CONFIG_VERSION}+, main" in intro, intro
