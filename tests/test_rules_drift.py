"""The maintainer's drift script (scripts/rules_drift.py) on a tiny Megatron-LM-shaped git repository
made here: sites that appear, change and disappear between two dates, and the rules that cite them."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "rules_drift.py"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _load():
    spec = importlib.util.spec_from_file_location("rules_drift", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rules_drift"] = module
    spec.loader.exec_module(module)
    return module


def _commit(repo: Path, files: dict[str, str], date: str) -> None:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {**os.environ, "GIT_AUTHOR_DATE": f"{date}T12:00:00Z", "GIT_COMMITTER_DATE": f"{date}T12:00:00Z"}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", date],
        check=True,
        env=env,
    )


ARGS_OLD = """
def validate_args(args):
    if args.context_parallel_size > 1:
        assert args.seq_length % (2 * args.context_parallel_size) == 0, "seq_length must be divisible by 2*CP"
    assert args.micro_batch_size == 1, "micro-batch-size must be 1 for packing"
"""
ARGS_NEW = """
def validate_args(args):
    if args.context_parallel_size > 1:
        assert args.seq_length % (2 * args.context_parallel_size) == 0 or args.sft, "seq_length must be divisible by 2*CP"
    if args.hybrid_context_parallel:
        assert not args.pipeline_model_parallel_size > 1, 'Hybrid context parallelism not supported with pipeline parallelism'
"""
SCHED = """
class DpBalancedScheduler:
    def get_groups_and_subsamples(self, groups, i):
        assert i > 0, "Not enough samples to move"
        raise ValueError(f"unknown scheduler {groups}")
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mlm")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    _commit(root, {"megatron/training/arguments.py": ARGS_OLD, "README.md": "x"}, "2026-01-15")
    _commit(root, {"megatron/training/arguments.py": ARGS_NEW}, "2026-03-10")
    _commit(root, {"megatron/core/datasets/data_schedule.py": SCHED, "other/ignored.py": SCHED}, "2026-08-20")
    return root


def test_sites_between_two_dates(repo: Path) -> None:
    drift = _load()
    text = drift.report(repo, "2026-02-01", "2026-08-31")
    assert text.startswith("# NVIDIA/Megatron-LM: assert/raise drift 2026-02-01")
    assert "appeared 3, changed 1, disappeared 1" in text
    appeared = text.split("## Appeared")[1].split("## Disappeared")[0]
    assert (
        "Hybrid context parallelism not supported with pipeline parallelism  [rules: LP-HCP-001]" in appeared
    )
    assert "Not enough samples to move  [rules: LP-SCHED-003]" in appeared
    assert "unknown scheduler {}  [no longpack rule]" in appeared
    assert "other/ignored.py" not in text  # not a watched file
    disappeared = text.split("## Disappeared")[1].split("## Changed")[0]
    assert "micro-batch-size must be 1 for packing" in disappeared
    changed = text.split("## Changed")[1]
    assert "seq_length must be divisible by 2*CP" in changed and "condition was:" in changed


def test_commits_and_cli(repo: Path, tmp_path: Path) -> None:
    drift = _load()
    first = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--max-parents=0", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    out = tmp_path / "drift.md"
    assert drift.main(["sites", "--repo", str(repo), "--from", first, "--to", "HEAD", "--out", str(out)]) == 0
    assert "appeared 3, changed 1, disappeared 1" in out.read_text()
    # nothing changes between a commit and itself
    assert "appeared 0, changed 0, disappeared 0" in drift.report(repo, "HEAD", "HEAD")
    assert drift.probe_present(repo, "HEAD", "Not enough samples to move", "megatron")
    assert not drift.probe_present(repo, "HEAD~2", "Not enough samples to move", "megatron")
    with pytest.raises(SystemExit, match="no commit"):
        drift.resolve(repo, "2025-01-01")


def test_sources_mode_checks_each_source_at_its_own_commit(repo: Path) -> None:
    drift = _load()
    head = drift.resolve(repo, "HEAD")
    first = drift.resolve(repo, "HEAD~2")
    schedule = "megatron/core/datasets/data_schedule.py"
    assert drift.source_problem(repo, head, schedule, "Not enough samples to move") is None
    assert drift.source_problem(repo, head, schedule, None) is None
    assert drift.source_problem(repo, first, schedule, None) == "file not at this commit"
    assert (
        drift.source_problem(repo, first, "megatron/training/arguments.py", "Hybrid context parallelism")
        == "probe not in the file at this commit"
    )
    assert drift.source_problem(repo, "0" * 40, schedule, None) == "commit not in this checkout"
    # the rules cite commits of the real Megatron-LM: none is in this tiny repository, so none is wrong
    text, wrong = drift.sources(None, repo)
    assert wrong == 0 and "0 do not hold" in text and "## Commit not in this checkout" in text
    assert "LP-SCHED-003: NVIDIA/Megatron-LM@a9381be598:megatron/core/datasets/data_schedule.py" in text
    with pytest.raises(SystemExit, match="sources needs --bridge and/or --mcore"):
        drift.main(["sources"])
