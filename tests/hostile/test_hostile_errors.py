"""The error contract of every command: a LongpackError is ``error: <message>`` and exit 2; anything else
is a bug, reported as ``internal error`` with exit 3 and a traceback only under ``--debug``; a Ray task's
error reaches the user as its own message, not buried in a remote stack trace."""

from __future__ import annotations

import pytest

from hostile_helpers import invoke, run_subprocess
from longpack.errors import InputError, LongpackError

BOOM = "an unexpected failure inside longpack"


def _explode(*args, **kwargs):
    raise RuntimeError(BOOM)


# One entry point of each command (and of plan's sub-commands) made to fail with a non-longpack error.
COMMANDS = {
    "pack": (
        "longpack.jobs.pack.PackConfig.run",
        ["pack", "x.jsonl", "--out", "o", "--tokenizer", "bytes", "--seq-length", "8"],
    ),
    "inspect": ("longpack.packed.inspect_output", ["inspect", "somewhere"]),
    "sweep": (
        "longpack.jobs.sweep.SweepConfig.run",
        ["sweep", "x.jsonl", "--tokenizer", "bytes", "--pack-size", "64"],
    ),
    "check": ("longpack.jobs.check.CheckConfig.run", ["check", "model.seq_length=8"]),
    "plan": (
        "longpack.jobs.plan.PlanConfig.run",
        ["plan", "--model", "qwen3_8b", "--gpu", "H100_SXM", "--gpus", "8", "--seq-length", "4096"],
    ),
    "plan estimate": (
        "longpack.planner.search.evaluate_layout",
        [
            "plan",
            "estimate",
            "--model",
            "qwen3_8b",
            "--gpu",
            "H100_SXM",
            "--gpus",
            "8",
            "--seq-length",
            "4096",
            "--layout",
            "tp=1",
        ],
    ),
    "plan evaluate": ("longpack.planner.calibration.evaluate", ["plan", "evaluate"]),
    "plan fit": ("longpack.planner.calibration.fit_params", ["plan", "fit", "--out", "{tmp}/fit.yaml"]),
    "balance": (
        "longpack.balance.report.compare_packings",
        ["balance", "{lengths}", "--pack-size", "64", "--dp", "2", "--gbs", "4"],
    ),
    "online-sim": (
        "longpack.online.simulate.simulate",
        ["online-sim", "--pack-size", "64", "--samples", "10"],
    ),
    "thd-batch": ("longpack.packed.folder.PackedFolder.open", ["thd-batch", "{packed}", "--pack-size", "64"]),
    "cp-check": ("longpack.runtime.cp_check.run_cp_check", ["cp-check", "--cp", "2"]),
    "topology": ("longpack.topology.ParallelLayout", ["topology", "--gpus", "8"]),
}


def _argv(world, tmp_path, argv: list[str]) -> list[str]:
    return [a.format(tmp=tmp_path, lengths=world.lengths, packed=world.packed) for a in argv]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_internal_error_is_exit_3_with_the_traceback_only_under_debug(
    world, tmp_path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    target, argv = COMMANDS[name]
    if name == "cp-check":
        pytest.importorskip("torch")
    if name == "inspect":
        monkeypatch.setattr("longpack.packed.inspect_output", _explode)
    else:
        monkeypatch.setattr(target, _explode)
    argv = _argv(world, tmp_path, argv)
    plain = invoke(argv)
    assert plain.exit_code == 3, str(plain)
    assert "internal error, please report it" in plain.output and BOOM in plain.output
    assert "Traceback" not in plain.output and "--debug" in plain.output
    debug = invoke(["--debug", *argv])
    assert debug.exit_code == 3 and "Traceback" in debug.output and BOOM in debug.output


@pytest.mark.parametrize("name", ["pack", "check", "plan", "plan estimate", "balance", "topology"])
def test_a_longpack_error_is_exit_2_with_its_message(
    world, tmp_path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    target, argv = COMMANDS[name]

    def refuse(*args, **kwargs):
        raise InputError("rows.jsonl:7: the row is broken; fix it", fields="seq_length")

    monkeypatch.setattr(target, refuse)
    outcome = invoke(_argv(world, tmp_path, argv))
    assert outcome.exit_code == 2, str(outcome)
    assert "error: rows.jsonl:7: the row is broken; fix it" in outcome.output
    assert "Traceback" not in outcome.output


def test_a_real_process_prints_no_traceback_for_a_user_error(world, tmp_path) -> None:
    outcome = run_subprocess(
        ["pack", world.good, "--out", tmp_path / "a_file" / "x", "--tokenizer", "bytes", "--seq-length", "0"]
    )
    assert outcome.exit_code == 2 and "Traceback" not in outcome.output, str(outcome)
    assert "--seq-length must be a positive integer" in outcome.output


# -- Ray: the user's message, not a remote stack trace ---------------------------------------------------


class FakeRayTaskError(Exception):
    """What Ray raises on the driver for a task's exception (``ray.exceptions.RayTaskError``): the class is
    made an instance of the original's class too, its message is the whole remote stack trace, and the
    original is kept in ``.cause``."""


def _ray_style(original: BaseException) -> BaseException:
    dual = type(f"RayTaskError({type(original).__name__})", (FakeRayTaskError, type(original)), {})
    wrapper = dual.__new__(dual)
    Exception.__init__(
        wrapper, "Traceback (most recent call last):\n  File ... in tokenize_chunk\n" + str(original)
    )
    wrapper.cause = original
    return wrapper


def test_ray_stage_errors_are_unwrapped_to_the_users_message() -> None:
    from longpack.cluster.ray_pack import RayExecutor

    original = InputError("data/a.jsonl:2: missing key 'completion'; fix the row or pass --skip-malformed")

    def stage():
        try:
            raise _ray_style(original)
        except Exception as exc:  # Ray Data raises its own error from the task's
            raise RuntimeError("Ray Data: a task failed") from exc

    with pytest.raises(LongpackError) as info:
        RayExecutor()._run("tokenize", stage)
    assert info.value is original
    assert str(info.value).startswith("data/a.jsonl:2: missing key")


def test_a_full_disk_on_a_ray_worker_is_an_output_error_in_the_write_stage(tmp_path) -> None:
    import errno

    from longpack.cluster.ray_pack import RayBackendError, RayExecutor
    from longpack.errors import OutputError
    from longpack.outputs import output_write_errors

    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "training_8.idx.parquet"))

    def stage():
        raise RuntimeError("Ray Data: a task failed") from _ray_style(full)

    with pytest.raises(OutputError, match="No space left on device"), output_write_errors(tmp_path):
        RayExecutor()._run("write", stage)
    with pytest.raises(RayBackendError):  # reading inputs is not the output's problem
        RayExecutor()._run("tokenize", stage)
