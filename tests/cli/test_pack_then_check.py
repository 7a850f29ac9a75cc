"""``longpack pack`` writes a Bridge config and prints the ``longpack check`` command for it: that command
exits 0 in every checking environment, with megatron-core installed (longpack's ``[all]`` extras bring
0.16.1, which once made check assume Megatron-Bridge 0.3.1) and without it (a laptop, a login node).

Each environment is a real subprocess; "without" hides megatron-core and megatron-bridge with a
``sitecustomize`` that blocks their imports and their package metadata (nothing is uninstalled).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HIDE = textwrap.dedent(
    """
    import importlib.metadata as _md
    import sys as _sys

    _HIDDEN = {"megatron-core", "megatron_core", "megatron-bridge", "megatron_bridge"}
    _version, _distribution = _md.version, _md.distribution

    def _no(name):
        raise _md.PackageNotFoundError(name)

    _md.version = lambda name: _no(name) if name.lower() in _HIDDEN else _version(name)
    _md.distribution = lambda name: _no(name) if name.lower() in _HIDDEN else _distribution(name)

    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name == "megatron" or name.startswith("megatron."):
                raise ImportError(f"{name} is hidden by the test's sitecustomize")
            return None

    _sys.meta_path.insert(0, _Block())
    """
)

PROBE = (
    "import importlib.util as u, importlib.metadata as m\n"
    "try:\n    v = m.version('megatron-core')\nexcept m.PackageNotFoundError:\n    v = None\n"
    "try:\n    import megatron.core; ok = True\nexcept ImportError:\n    ok = False\n"
    "print(v, ok)"
)


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from longpack.cli.app import main; sys.argv = ['longpack', *sys.argv[1:]]; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _env(tmp_path: Path, hide: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGPACK_")}
    paths = [p for p in (env.get("PYTHONPATH", ""), *sys.path) if p]
    if hide:
        site = tmp_path / "hide"
        site.mkdir()
        (site / "sitecustomize.py").write_text(HIDE)
        paths.insert(0, str(site))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["COLUMNS"] = "200"
    return env


@pytest.mark.slow
@pytest.mark.parametrize("hide", [False, True], ids=["megatron-core-as-installed", "megatron-hidden"])
def test_pack_prints_a_check_command_that_passes(tmp_path: Path, hide: bool) -> None:
    env = _env(tmp_path, hide)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    version, importable = probe.stdout.split()
    if hide:
        assert (version, importable) == ("None", "False"), probe.stdout
    out = tmp_path / "demo"
    packed = _run(["pack", "--demo", "--out", str(out)], env, tmp_path)
    assert packed.returncode == 0, packed.stderr
    lines = [ln for ln in packed.stdout.splitlines() if ln.strip().startswith("check it:")]
    assert len(lines) == 1, packed.stdout
    command = shlex.split(lines[0].split("check it:", 1)[1])
    assert command[:2] == ["longpack", "check"]
    checked = _run(command[1:], env, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "LP-VER-001" not in checked.stdout and "OK: 0 errors" in checked.stdout
    # the same config without the pinned version: its keys say which Bridge it is for
    at = command.index("--bridge-version")
    free = _run(command[1:at] + command[at + 2 :], env, tmp_path)
    assert free.returncode == 0, free.stdout + free.stderr
    assert "inferred from the config's keys" in free.stdout and "LP-VER-001" not in free.stdout
