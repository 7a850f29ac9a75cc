"""The README and the docs site: size, commands that exist, links that resolve, the generated rules page.

The site itself is built by ``mkdocs build --strict`` in ``.ci/run`` (broken links and anchors fail it);
these tests cover what that build cannot see: the README (not part of the site), the CLI behind the
commands the docs show, and the rules page generator run against the real registry.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Command 1 installs what packing the demo needs (no torch, Ray, Energon or transformers); command 2 adds
# the rest once, into the same venv, with CI's constraints (torch as the CPU wheel).
INSTALL_AND_DEMO = 'pip install -c constraints/ci.txt -e ".[pack]" && longpack pack --demo --out out/demo'
INSTALL_THE_REST = '-c constraints/ci.txt -e ".[dev,all]"'
TEST_COMMAND = "python -m pytest -q -n 2"


def load_hook(name: str) -> ModuleType:
    path = DOCS / "hooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"longpack_docs_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def code_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", markdown, flags=re.S | re.M)


def shown_commands(block: str) -> set[str]:
    """Sub-commands of every ``longpack <cmd>`` in a shell block (comments ignored)."""
    code = "\n".join(line.split("#", 1)[0] for line in block.splitlines())
    return set(re.findall(r"\blongpack ([a-z][a-z-]*)", code))


def test_readme_is_small() -> None:
    size = len(README.read_bytes())
    assert size < 10_000, f"README.md is {size} bytes; move material into docs/ (limit 10,000)"


def test_readme_opens_with_install_demo_and_test_command() -> None:
    first = code_blocks(README.read_text())[0]
    lines = [line for line in first.splitlines() if not line.startswith("#")]
    assert INSTALL_AND_DEMO in lines[0], lines[0]
    assert lines[1].endswith(TEST_COMMAND) and INSTALL_THE_REST in lines[1], lines[1]
    # The README promises that this is the command CI runs, after the same install.
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()
    assert INSTALL_THE_REST in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("cmd", sorted(set().union(*map(shown_commands, code_blocks(README.read_text())))))
def test_readme_commands_exist(cmd: str) -> None:
    result = CliRunner().invoke(app, [cmd, "--help"])
    assert result.exit_code == 0, f"`longpack {cmd} --help` failed: {result.output}"


def test_readme_shows_the_first_commands() -> None:
    first = shown_commands(code_blocks(README.read_text())[0])
    assert first == {"pack"}, first
    assert {"check", "plan", "inspect"} <= set().union(*map(shown_commands, code_blocks(README.read_text())))


def test_every_guide_command_exists() -> None:
    guides = sorted((DOCS / "guide").glob("*.md"))
    topics = {
        "pretraining",
        "plan-data",
        "scale",
    }  # guide pages about a use, not one command (their commands are checked by flag)
    commands = {p.stem.removesuffix("-ray") for p in guides} - topics
    runner = CliRunner()
    for cmd in sorted(commands):
        result = runner.invoke(app, [cmd, "--help"])
        assert result.exit_code == 0, f"docs/guide/{cmd}.md: `longpack {cmd} --help` failed"


def test_readme_links_resolve() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the docs pages"
    for link in local:
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def test_readme_example_is_the_tested_script() -> None:
    text = README.read_text()
    python = [b for b in code_blocks(text) if "import longpack" in b]
    assert python, "the README shows packing the demo from Python"
    body = [line.split("#", 1)[0].strip() for line in python[0].splitlines()]
    body = [line for line in body if line]
    assert len(body) <= 3, body
    script = ROOT / "examples" / "pack_demo.py"
    if not script.exists():
        pytest.skip("examples/pack_demo.py is not there yet (the jobs layer adds it)")
    source = script.read_text()
    # The README's statements are the script's (which needs no __main__ guard: see tests/test_jobs.py).
    statements = [line.split("#", 1)[0].strip() for line in source.splitlines()]
    assert [line for line in statements if line] == body


def test_nav_and_pages_agree() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def walk(entries: list[object]) -> list[str]:
        pages: list[str] = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            pages += walk(value) if isinstance(value, list) else [str(value)]
        return pages

    rules_page = load_hook("rules_page").PAGE
    nav = set(walk(config["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.parts}
    assert rules_page in nav and not (DOCS / rules_page).exists(), "the rules page is generated, not stored"
    assert nav - {rules_page} == on_disk


# A citation of a file outside the repository: a section mark before a section ("\u00a72.7", "\u00a7 B.2",
# "\u00a7A"), "spec \u00a7", "spec D.4", a spec file name, "specs/" or "../shared". This file holds examples of
# them and is not searched.
OUTSIDE_CITATION = re.compile(
    r"\u00a7\s*(?:[A-F]\b|[A-F]?\.?\d)|\bspecs?\b[^\n]{0,40}\u00a7|\bspecs?\s+[A-F]\.\d"
    r"|specs/|\.\./shared|shared/(specs|data)|\b(megatron-packing|energon-thd-cp|planner-anchors)\.md"
)
CITING_FILES = (
    "src/**/*.py",
    "src/**/*.yaml",
    "tests/**/*.py",
    "benchmarks/**/*.py",
    "examples/**/*",
    "docs/**/*",
)


def citing_files() -> list[Path]:
    files = {
        p
        for pattern in CITING_FILES
        for p in ROOT.glob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    }
    return sorted((files | {README, ROOT / "mkdocs.yml"}) - {Path(__file__).resolve()})


def test_code_and_docs_cite_no_outside_files() -> None:
    """Code and docs cite their own docs pages or upstream sources by name, never notes outside the repo."""
    found = []
    for path in citing_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_CITATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert len(citing_files()) > 100 and not found, "\n".join(found)


def test_outside_citation_pattern() -> None:
    cited = [
        "spec \u00a72.7",
        "(\u00a7B.3.2 table)",
        "planner.md \u00a7A",
        "see specs/x.md",
        "../shared/a",
        "spec D.4",
        "`megatron-packing.md`",
    ]
    fine = [
        "docs/reference/packed-format.md#path-rules",
        "Megatron-Bridge `data/packing/parquet.py`",
        "path spec",
        "spec D",
        "api/planner.md",
        "/shared/sft/*.jsonl",
    ]
    assert all(OUTSIDE_CITATION.search(text) for text in cited)
    assert not any(OUTSIDE_CITATION.search(text) for text in fine)


def test_rules_page_lists_every_rule() -> None:
    hook = load_hook("rules_page")
    page = hook.render()
    for rule_id, rule in RULES.items():
        row = f'<a id="{rule_id.lower()}"></a>`{rule_id}` | {rule.severity.value} |'
        assert row in page, rule_id
    assert "\u00a7" not in page, "sources are shown in upstream terms"
    assert f"knows {len(RULES)} rules" in page


def test_rules_page_shows_fix_when_records_have_one() -> None:
    hook = load_hook("rules_page")
    rule = next(iter(RULES.values()))

    class WithFix:
        id, severity, title, source, scope = rule.id, rule.severity, rule.title, rule.source, rule.scope
        fix = "set model.x to 1"

    page = hook.render({rule.id: WithFix()})
    assert "| fix |" in page and "set model.x to 1 |" in page
    assert "| fix |" not in hook.render({rule.id: rule}) or getattr(rule, "fix", None)


@pytest.mark.parametrize("name", ["rules_page", "griffe_docstrings"])
def test_hook_doctests(name: str) -> None:
    pytest.importorskip("griffe") if name == "griffe_docstrings" else None
    result = doctest.testmod(load_hook(name))
    assert result.attempted > 0 and result.failed == 0
