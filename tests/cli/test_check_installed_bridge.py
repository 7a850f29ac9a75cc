"""``longpack check`` in a real Megatron-Bridge environment: the released megatron-bridge and megatron-core
wheels installed by this test (``pip install --no-deps --target``, package metadata and code as shipped;
skipped when a wheel cannot be fetched) decide the versions the rules run for.

Two environments, each a child interpreter with the target folder first on its path:

- megatron-bridge 0.3.1 with megatron-core 0.16.1 (its submodule's Core): the config ``pack`` writes uses
  Bridge 0.6.0's keys, so checked for the installed 0.3.1 it is refused (``LP-VER-001``, naming the version
  and that it is the installed one); the command ``pack`` prints pins 0.6.0 and passes.
- megatron-bridge 0.6.0 with megatron-core 0.19.0: the same config passes unpinned, checked for the
  installed pair, and a key only a later Bridge has (global-batch packing) is refused naming 0.6.0.

Bridge 0.4.0 and later declare Python 3.12; their wheels are pure Python, so ``--python-version 3.12``
fetches them for this interpreter (nothing of them is imported: ``check`` reads package metadata only).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIRS = {"0.3.1": "0.16.1", "0.6.0": "0.19.0"}


def _install(target: Path, bridge: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
         "3.12", "--target", str(target), f"megatron-bridge=={bridge}", f"megatron-core=={PAIRS[bridge]}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"megatron-bridge {bridge} wheels not installable here: {done.stderr[-300:]}")


@pytest.fixture(scope="module", params=sorted(PAIRS))
def bridge_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    bridge = request.param
    target = tmp_path_factory.mktemp(f"megatron-bridge-{bridge}")
    _install(target, bridge)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGPACK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "300"
    return bridge, env


def _run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from longpack.cli.app import main; sys.argv = ['longpack', *sys.argv[1:]]; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_the_installed_bridge_decides_and_the_printed_command_passes(
    bridge_env: tuple[str, dict], tmp_path: Path
) -> None:
    bridge, env = bridge_env
    versions = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('megatron-bridge'), "
         "m.version('megatron-core'))"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert versions == [bridge, PAIRS[bridge]]  # the child sees the installed wheels' metadata

    out = tmp_path / "demo"
    packed = _run(["pack", "--demo", "--out", str(out)], env, tmp_path)
    assert packed.returncode == 0, packed.stderr
    line = next(ln for ln in packed.stdout.splitlines() if ln.strip().startswith("check it:"))
    command = shlex.split(line.split("check it:", 1)[1])
    pinned = _run(command[1:], env, tmp_path)
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert "Megatron-Bridge 0.6.0" in pinned.stdout and "given" in pinned.stdout

    at = command.index("--bridge-version")
    free = _run([*command[1:at], *command[at + 2 :], "--json"], env, tmp_path)
    report = json.loads(free.stdout)
    assert report["versions"] == {
        "megatron_bridge": bridge,
        "megatron_bridge_from": "installed",
        "megatron_core": PAIRS[bridge],
        "megatron_core_from": "installed, beside megatron-bridge",
    }
    refused = sorted({f["keys"][0] for f in report["findings"] if f["id"] == "LP-VER-001"})
    if bridge == "0.3.1":
        # the training environment is 0.3.1, which spells them packed_sequence_specs: a true refusal
        assert free.returncode == 1
        assert refused == ["dataset.enable_offline_packing", "dataset.offline_packing_specs"]
        ver = next(f for f in report["findings"] if f["id"] == "LP-VER-001")
        assert "Megatron-Bridge 0.3.1 (installed)" in ver["message"] + ver.get("applies_to", "")
    else:
        assert free.returncode == 0 and refused == [], free.stdout
        later = _run(
            [*command[1:at], *command[at + 2 :], "+dataset.enable_global_batch_packing=true"], env, tmp_path
        )
        assert later.returncode == 1
        assert "LP-VER-001" in later.stdout and "dataset.enable_global_batch_packing" in later.stdout
        assert "Megatron-Bridge 0.6.0" in later.stdout and "installed" in later.stdout
