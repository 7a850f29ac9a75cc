"""The examples of the README and the docs run as shown.

- Every ``longpack ...`` line of a shell block names a command and options that exist.
- The cheap ones (``topology``, ``check``, ``plan``, ``online-sim``) whose inputs are in the repository
  run, with the exit code the page gives (``# exit 1``, or an ``error:`` output), the finding counts it
  gives (``7 errors, 1 warning``) and, in ``console`` blocks, the output lines it shows.
- ``python`` blocks after a ``<!-- test: run -->`` line run in a fresh folder; ``pycon`` blocks are
  doctests (one namespace per page, so a page imports once).
"""

from __future__ import annotations

import doctest
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from longpack.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
RUN_MARK = "<!-- test: run -->"
CLI = typer.main.get_command(app)
#: Commands fast enough to run from every page (well under a second each, in-process).
CHEAP = {"topology", "check", "plan", "estimate", "online-sim"}
PATH_LIKE = re.compile(r"/|\.(ya?ml|jsonl?|npy|txt|parquet|png|pq)$")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    marked: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass
class Shown:
    """One ``longpack`` command line of a shell block, its trailing comment and the output shown under it."""

    block: Block
    argv: list[str]
    comment: str
    output: list[str] = field(default_factory=list)


def blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            line = text.count("\n", 0, m.start()) + 2
            out.append(Block(page, line, m.group(1), m.group(2), before.strip() == RUN_MARK))
    return out


def longpack_argv(line: str) -> tuple[list[str], str] | None:
    """``longpack ...`` of a shell line (after the last ``&&``, up to a pipe), and its ``# comment``."""
    comment = re.search(r"(?:^|\s)#\s?(.*)$", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    if "&&" in tokens:
        tokens = tokens[len(tokens) - tokens[::-1].index("&&") :]
    stop = next((i for i, t in enumerate(tokens) if t in ("|", ";", ">", ">>", "&")), len(tokens))
    tokens = tokens[:stop]
    if not tokens or tokens[0] != "longpack":
        return None
    return tokens, comment.group(1) if comment else ""


def shown_commands() -> list[Shown]:
    shown: list[Shown] = []
    for block in blocks():
        if block.lang not in SHELL:
            continue
        current: Shown | None = None
        for raw in block.body.replace("\\\n", " ").splitlines():
            line = raw.strip()
            is_command = line.startswith("$ ") if block.lang == "console" else not line.startswith("#")
            if not is_command:
                if current is not None and block.lang == "console":
                    current.output.append(raw.rstrip())
                continue
            parsed = longpack_argv(line.removeprefix("$ "))
            current = Shown(block, *parsed) if parsed else None
            if current is not None:
                shown.append(current)
    return shown


SHOWN = shown_commands()


def resolve(argv: list[str]) -> tuple[Any, list[str], list[str]]:
    """The click command a ``longpack ...`` line runs, the global options before it and its arguments."""
    args = [a.strip("[]") for a in argv[1:]]
    globals_ = []
    while args and args[0] in ("--version", "--debug"):
        globals_.append(args.pop(0))
    command: Any = CLI
    while hasattr(command, "get_command") and args:  # a group (typer bundles its own click)
        sub = command.get_command(command.context_class(command), args[0])
        if sub is None:
            break
        command = sub
        args.pop(0)
    return command, globals_, args


def options(command: Any) -> set[str]:
    """The options a page may show: not the hidden ones (deprecated spellings kept for old scripts)."""
    names = {"--help"}
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        names.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("-"))
    return names


def test_pages_show_commands() -> None:
    assert len(SHOWN) > 40 and {"pack", "check", "plan", "topology"} <= {s.argv[1] for s in SHOWN}


@pytest.mark.parametrize("shown", SHOWN, ids=lambda s: f"{s.block.where} {' '.join(s.argv[1:3])}")
def test_shown_command_and_options_exist(shown: Shown) -> None:
    command, _, args = resolve(shown.argv)
    assert command is not CLI, f"{shown.block.where}: no command in {shown.argv}"
    known = options(command)
    unknown = [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0] not in known]
    assert not unknown, f"{shown.block.where}: `{' '.join(shown.argv)}`: {unknown} not among {sorted(known)}"


def runnable(shown: Shown) -> bool:
    command, globals_, args = resolve(shown.argv)
    if command.name not in CHEAP or globals_ or any(a in ("--plot", "--out", "...") for a in args):
        return False
    values = [a for a in args if not a.startswith("-")]
    return not any(PATH_LIKE.search(v) and not (ROOT / v).exists() for v in values) and not any(
        "<" in v or "..." in v for v in values
    )


RUNNABLE = [s for s in SHOWN if runnable(s)]


def test_some_shown_commands_run() -> None:
    assert len(RUNNABLE) >= 10, [" ".join(s.argv) for s in RUNNABLE]


@pytest.mark.parametrize("shown", RUNNABLE, ids=lambda s: f"{s.block.where} {' '.join(s.argv[1:3])}")
def test_cheap_shown_command_runs_as_shown(shown: Shown, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, shown.argv[1:])
    where = f"{shown.block.where}: `{' '.join(shown.argv)}`"
    said = re.search(r"exit (\d)", shown.comment)
    errors = any(line.lstrip().startswith("error:") for line in shown.output)
    expected = int(said.group(1)) if said else 2 if errors else 0
    assert result.exit_code == expected, (
        f"{where}: exit {result.exit_code}, the page says {expected}\n{result.output}"
    )
    counts = dict(re.findall(r"(\d+) (error|warning)s?\b", shown.comment))
    if counts:
        report = json.loads(CliRunner().invoke(app, [*shown.argv[1:], "--json"]).output)
        shown_counts = {kind: int(n) for n, kind in counts.items()}
        assert {k: report["counts"][k] for k in shown_counts} == shown_counts, where
    if shown.output and not any("..." in line for line in shown.output):
        actual = iter(line.rstrip() for line in result.output.splitlines())
        missing = [
            line for line in shown.output if line.strip() and line.strip() not in (a.strip() for a in actual)
        ]
        assert not missing, f"{where}: the page shows lines the command no longer prints: {missing}"


RUN_BLOCKS = [b for b in blocks() if b.lang == "python" and b.marked]


def test_pages_mark_runnable_python() -> None:
    assert len(RUN_BLOCKS) >= 3, [b.where for b in RUN_BLOCKS]


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.where)
def test_marked_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = compile("\n" * (block.line - 1) + block.body, str(block.page), "exec")
    exec(code, {"__name__": "__docs__"})


PYCON_PAGES = sorted({b.page for b in blocks() if b.lang == "pycon"})


@pytest.mark.parametrize("page", PYCON_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pycon_blocks_are_doctests(page: Path) -> None:
    page_blocks = [b for b in blocks() if b.page == page and b.lang == "pycon"]
    if any("longpack.runtime" in b.body for b in page_blocks):
        pytest.importorskip("torch")
    globs: dict[str, object] = {"__name__": "__docs__"}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    parser = doctest.DocTestParser()
    for block in page_blocks:
        test = parser.get_doctest(block.body, globs, block.where, str(page), block.line - 1)
        assert test.examples, block.where
        runner.run(test, clear_globs=False)
        globs = test.globs  # a DocTest works on a copy: carry the page's names to its next block
    assert runner.failures == 0, f"{page.relative_to(ROOT)}: {runner.failures} example(s) differ (see above)"


def test_getting_started_shows_the_readme_example() -> None:
    def example(page: Path) -> str:
        return next(
            b.body for b in blocks() if b.page == page and b.lang == "python" and "import longpack" in b.body
        )

    assert example(ROOT / "docs" / "getting-started.md") == example(ROOT / "README.md")


def every_option(command: Any) -> set[str]:
    names = options(command)
    if hasattr(command, "list_commands"):
        ctx = command.context_class(command)
        for name in command.list_commands(ctx):
            names |= every_option(command.get_command(ctx, name))
    return names


#: Lines that show another tool's flags.
OTHER_TOOLS = re.compile(
    r"\b(ruff|mkdocs|ray start|pytest|pip|huggingface-cli|energon prepare|run_recipe\.py|benchmarks/|scripts/|"
    r"Megatron-LM|SBATCH|srun)"
)


def test_every_flag_the_pages_name_exists() -> None:
    """A flag named anywhere in the prose or tables (`--pack-size`) is an option of some longpack command."""
    known = every_option(CLI)
    stale = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if OTHER_TOOLS.search(line):
                continue
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
                if flag not in known:
                    stale.append(f"{page.relative_to(ROOT)}:{number}: {flag}")
    assert not stale, stale
