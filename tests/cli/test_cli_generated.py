"""The CLI is generated from the job configs: every option of a generated command is a config field (its
flag, default, choices and help come from the field), and the shared text options are ``TextConfig``'s."""

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
from longpack.jobs import PackConfig, PreviewConfig, SweepConfig
from longpack.option import option_of
from longpack.text import TextConfig

GENERATED = {"pack": PackConfig, "sweep": SweepConfig, "preview": PreviewConfig}
COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def _options(command: str) -> dict[str, object]:
    """``--flag`` -> click parameter, every spelling (hidden aliases too), ``--help`` left out."""
    out: dict[str, object] = {}
    for param in COMMANDS[command].params:
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--"):
                out[opt] = param
    return out


@pytest.mark.parametrize("command", sorted(GENERATED))
def test_every_cli_option_is_a_config_field(command: str) -> None:
    config_cls = GENERATED[command]
    fields = list(cli_fields(config_cls))
    from_fields = {flag for f in fields if not f.spec.positional for flag in f.flags}
    from_fields |= {f.spec.negative for f in fields if f.spec.negative}
    assert set(_options(command)) == from_fields | {JSON_FLAG}
    # positional arguments are fields too
    arguments = {p.name for p in COMMANDS[command].params if isinstance(p, typer.core.TyperArgument)}
    assert arguments == {f.param for f in fields if f.spec.positional}
    # each option's help and default is its field's
    for item in fields:
        param = _options(command).get(item.flags[0])
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
