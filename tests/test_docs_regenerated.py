"""The example outputs of ``longpack sweep``, ``plan`` and ``rollouts`` in the docs are what the commands print.

Every ``console`` block of the pages below whose command is ``longpack sweep``, ``plan`` or ``rollouts`` (with ``--model``) is run
and its output compared with the block, line for line (from the block's first output line on; a
``| head -n N`` after the command keeps the first N lines). ``LONGPACK_REGEN_DOCS=1`` rewrites the
blocks with what the commands print now, so a figure in the docs is a figure the command printed.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longpack.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "docs" / "guide" / page for page in ("sweep.md", "plan.md", "rollouts.md")]
REGEN = os.environ.get("LONGPACK_REGEN_DOCS") == "1"
BLOCK = re.compile(r"^```console\n(.*?)^```", flags=re.S | re.M)


def _examples(pages: list[Path] = PAGES) -> list[tuple[Path, int, str, list[str]]]:
    """``(page, start of the output in the page text, command, output lines)`` of each example."""
    out = []
    for page in pages:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            body = m.group(1)
            lines = body.split("\n")
            command = lines[0]
            i = 1
            while command.endswith("\\"):
                command = command[:-1] + " " + lines[i].strip()
                i += 1
            if not command.startswith("$ longpack "):
                continue
            argv = shlex.split(command[2:].split("|")[0])
            if argv[1] not in ("sweep", "plan", "rollouts") or "--json" in argv or "--model" not in argv:
                continue
            out.append((page, m.start(1) + len("\n".join(lines[:i])) + 1, command, lines[i:]))
    return out


EXAMPLES = _examples()


def _run(command: str, folder: Path) -> list[str]:
    head = re.search(r"\|\s*head -n (\d+)\s*$", command)
    argv = shlex.split(command[2:].split("|")[0])[1:]
    cwd = os.getcwd()
    if not (folder / "examples").exists():  # the pages' example inputs, as from the repository root
        (folder / "examples").symlink_to(ROOT / "examples")
    os.chdir(folder)
    try:
        result = CliRunner().invoke(app, argv, env={"COLUMNS": "150"})
    finally:
        os.chdir(cwd)
    lines = [line.rstrip() for line in result.output.splitlines()]
    return lines[: int(head.group(1))] if head else lines


def test_pages_have_examples() -> None:
    pages = {p for p, *_ in EXAMPLES}
    assert pages == set(PAGES), [str(p) for p in set(PAGES) - pages]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "offset", "command", "shown"),
    EXAMPLES,
    ids=[f"{p.name}:{p.read_text().count(chr(10), 0, o)}" for p, o, *_ in EXAMPLES],
)
def test_example_output_is_what_the_command_prints(page, offset, command, shown, tmp_path) -> None:
    actual = _run(command, tmp_path)
    shown = [line.rstrip() for line in shown if line.strip() or shown.index(line) < len(shown) - 1]
    while shown and not shown[-1].strip():
        shown.pop()
    # the block may start at a later line of the output (e.g. "only the planner table"): align on it
    first = shown[0].strip() if shown else ""
    start = next((k for k, line in enumerate(actual) if line.strip() == first), 0)
    actual = actual[start:]
    if REGEN and [a.strip() for a in actual] != [s.strip() for s in shown]:
        text = page.read_text()
        at = next(o for _, o, c, _ in _examples([page]) if c == command)  # offsets move as blocks change
        end = text.index("```", at)
        page.write_text(text[:at] + "\n".join(actual) + "\n" + text[end:])
        return
    assert [a.strip() for a in actual] == [s.strip() for s in shown], (
        f"{page.name}: `{command}` prints other lines than the page shows; rerun with LONGPACK_REGEN_DOCS=1"
    )
