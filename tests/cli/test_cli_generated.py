"""The CLI is generated from the job configs: every command has one, every option of every command is a config
field (its flag, default, choices and help come from the field), and the shared text options are
``TextConfig``'s."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from longpack.choices import ALGORITHMS, OVERLENGTH_POLICIES, TEXT_FORMATS
from longpack.cli.app import app
from longpack.cli.generate import JSON_FLAG, cli_fields
from longpack.option import option_of
from longpack.text import TextConfig

ROOT = typer.main.get_command(app)
COMMANDS = ROOT.commands  # type: ignore[attr-defined]


def _every_command() -> dict[str, object]:
    """``"plan estimate"`` -> click command, for every command and sub-command (the hidden ``version`` aside)."""
    out: dict[str, object] = {}
    for name, command in COMMANDS.items():
        if name == "version":
            continue
        out[name] = command
        for sub_name, sub in getattr(command, "commands", {}).items():
            out[f"{name} {sub_name}"] = sub
    return out


EVERY = _every_command()


def _options_of(command: object) -> dict[str, object]:
    """``--flag`` -> click parameter, every spelling (hidden aliases too), ``--help`` left out."""
    out: dict[str, object] = {}
    for param in command.params:  # type: ignore[attr-defined]
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--"):
                out[opt] = param
    return out


def _options(command: str) -> dict[str, object]:
    return _options_of(COMMANDS[command])


def test_every_command_is_generated_from_a_job_config() -> None:
    assert len(EVERY) >= 14 and {"pack", "plan", "plan estimate", "check", "online-sim"} <= set(EVERY)
    for name, command in EVERY.items():
        assert hasattr(command.callback, "longpack_configs"), f"{name} is written by hand"  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", sorted(EVERY))
def test_every_cli_option_is_a_config_field(command: str) -> None:
    click_command = EVERY[command]
    configs = click_command.callback.longpack_configs  # type: ignore[attr-defined]
    fields = [item for config_cls in configs for item in cli_fields(config_cls)]
    from_fields = {flag for f in fields if not f.spec.positional for flag in f.flags}
    from_fields |= {f.spec.negative for f in fields if f.spec.negative}
    options = _options_of(click_command)
    assert set(options) == from_fields | {JSON_FLAG}
    # positional arguments are fields too
    arguments = {p.name for p in click_command.params if isinstance(p, typer.core.TyperArgument)}  # type: ignore[attr-defined]
    assert arguments == {f.param for f in fields if f.spec.positional}
    # each option's help and default is its field's
    for item in fields:
        param = options.get(item.flags[0])
        if param is None:
            continue
        assert param.help == item.spec.help  # type: ignore[attr-defined]
        if item.default is inspect.Parameter.empty:
            assert param.required, item.flags[0]  # type: ignore[attr-defined]
        elif not isinstance(item.default, tuple):
            assert param.default == item.default, item.flags[0]  # type: ignore[attr-defined]


def test_the_text_options_are_textconfigs_fields_in_every_command_that_reads_text() -> None:
    text_flags = {
        option_of(f).flags(f.name)[0]  # type: ignore[union-attr]
        for f in dataclasses.fields(TextConfig)
        if option_of(f) is not None
    }
    assert {"--format", "--prompt-key", "--tools-key", "--chat-loss", "--skip-malformed"} <= text_flags
    assert text_flags <= set(_options("pack")) and text_flags <= set(_options("sweep"))
    # preview shows malformed rows as such: its config leaves that one option out, and says so
    assert text_flags - set(_options("preview")) == {"--skip-malformed"}


def test_choices_come_from_the_one_list() -> None:
    assert tuple(_options("pack")["--algorithm"].type_descriptor.choices) == ALGORITHMS  # type: ignore[attr-defined]
    assert tuple(_options("sweep")["--overlength"].type_descriptor.choices) == OVERLENGTH_POLICIES  # type: ignore[attr-defined]
    assert tuple(_options("preview")["--format"].type_descriptor.choices) == TEXT_FORMATS  # type: ignore[attr-defined]


def test_row_group_size_help_states_the_writers_default() -> None:
    from longpack.packed.files import ROW_GROUP_SIZE, ROW_GROUP_TOKENS

    text = _options("pack")["--row-group-size"].help  # type: ignore[attr-defined]
    assert f"about {ROW_GROUP_TOKENS:,} tokens per group, at most {ROW_GROUP_SIZE}" in text


def test_a_deprecated_spelling_still_works_and_warns(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    src.write_text('{"prompt": "q", "completion": "a"}\n' * 20)
    args = ["sweep", str(src), "--tokenizer", "bytes", "--workers", "1", "--token-slots", "256", "--json"]
    res = CliRunner().invoke(app, [*args, "--pack-lengths", "64,128"])
    assert res.exit_code == 0, res.output
    assert "--pack-lengths is deprecated; use --pack-size" in res.output
    assert '"pack_lengths": [\n      64,\n      128\n    ]' in res.output
