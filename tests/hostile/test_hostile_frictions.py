"""Round three (issue 27): what a new user hit, run as the user runs it.

Alpaca rows (the error names the flags that pack them, and those flags work), a ``tokenizer.json`` with no
chat template (the error points at ``chat_template.jinja`` / ``--chat-template``, and both work), the note
that prompt and completion are joined with nothing between them, output files with normal permissions,
``balance``'s column legend.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hostile_helpers import assert_accounting, assert_clean, examples, invoke

PACK = ["--tokenizer", "bytes", "--seq-length", "128"]
FIXTURE_OK = [HealthCheck.function_scoped_fixture]
WORDS = st.text(alphabet="abcdefgh ?!", min_size=1, max_size=20)


@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=FIXTURE_OK,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each case packs twice: shrinking takes minutes
)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {"instruction": WORDS, "output": WORDS},
            optional={"input": st.one_of(st.just(""), WORDS), "id": st.integers(0, 99)},
        ),
        min_size=1,
        max_size=12,
    )
)
def test_alpaca_rows_get_the_flags_that_pack_them(tmp_path_factory, rows) -> None:
    folder = tmp_path_factory.mktemp("alpaca")
    data = folder / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    refused = assert_clean(invoke(["pack", data, "--out", folder / "o1", *PACK]))
    assert refused.exit_code == 2 and "Alpaca rows" in refused.output, str(refused)
    assert "--prompt-key" in refused.output and "--completion-key" in refused.output
    # the flags the message gives, taken as a user would copy them (and its advice for mixed rows followed)
    hint = refused.output.split("pack them as prompt_completion with ", 1)[1]
    hint = hint.split(" (some rows", 1)[0].split("; or pass format", 1)[0]
    assert hint.startswith("--prompt-key instruction --completion-key output --prompt-template "), hint
    flags = [a.replace("\\n", "\n") for a in shlex.split(hint)]
    if "(some rows have no 'input' key" in refused.output:
        data.write_text("".join(json.dumps({"input": "", **r}) + "\n" for r in rows))
    packed = assert_clean(invoke(["pack", data, "--out", folder / "o2", *PACK, *flags]), frozenset({0}))
    manifest = json.loads((folder / "o2" / "manifest.json").read_text())
    assert_accounting(manifest)
    assert manifest["counts"]["rows_read"] == len(rows), str(packed)


def _tokenizer_without_template(folder: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(
        models.WordLevel({"[UNK]": 0, "user": 1, "assistant": 2, "hi": 3, "yo": 4}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
)


@pytest.mark.parametrize("spec", ["folder", "tokenizer.json"])
def test_a_tokenizer_without_a_chat_template_says_where_one_goes(tmp_path: Path, spec: str) -> None:
    model = _tokenizer_without_template(tmp_path / "model")
    tokenizer = model if spec == "folder" else model / "tokenizer.json"
    data = tmp_path / "chat.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(json.dumps(row) + "\n")
    argv = ["pack", data, "--tokenizer", tokenizer, "--seq-length", "64"]
    refused = assert_clean(invoke([*argv, "--out", tmp_path / "o1"]))
    assert refused.exit_code == 2 and "chat_template.jinja" in refused.output, str(refused)
    assert "--chat-template" in refused.output
    template = tmp_path / "my_template.jinja"
    template.write_text(CHATML)
    assert_clean(invoke([*argv, "--out", tmp_path / "o2", "--chat-template", template]), frozenset({0}))
    manifest = json.loads((tmp_path / "o2" / "manifest.json").read_text())
    assert "my_template.jinja" in manifest["tokenizer"]["files"]
    (model / "chat_template.jinja").write_text(CHATML)  # where transformers saves it: read from there
    assert_clean(invoke([*argv, "--out", tmp_path / "o3"]), frozenset({0}))
    same = [(tmp_path / o / "training_64.idx.parquet").read_bytes() for o in ("o2", "o3")]
    assert same[0] == same[1]


def test_a_chat_template_for_a_builtin_tokenizer_is_refused(world, tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(CHATML)
    outcome = assert_clean(
        invoke(["pack", world.good, "--out", tmp_path / "o", *PACK, "--chat-template", template])
    )
    assert outcome.exit_code == 2 and "--chat-template" in outcome.output, str(outcome)


@pytest.mark.parametrize(
    ("extra", "noted"), [([], True), (["--separator", " "], False), (["--separator", "\\n"], False)]
)
def test_pack_says_how_prompt_and_completion_are_joined(world, tmp_path: Path, extra, noted) -> None:
    outcome = assert_clean(
        invoke(["pack", world.good, "--out", tmp_path / "o", *PACK, *extra]), frozenset({0})
    )
    said = "note: prompt and completion are joined with nothing between them" in outcome.output
    assert said == noted, str(outcome)
    if noted:
        assert "--separator" in outcome.output


def test_no_join_note_for_chat_data(tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(json.dumps(row) + "\n")
    outcome = assert_clean(
        invoke(["pack", data, "--out", tmp_path / "o", "--tokenizer", "qwen3", "--seq-length", "64"])
    )
    assert outcome.exit_code == 0 and "note:" not in outcome.output, str(outcome)


# -- output files: the mode open() gives them -----------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_plot_and_out_files_get_the_umask_mode(world, tmp_path: Path, umask: int) -> None:
    pytest.importorskip("matplotlib")
    previous = os.umask(umask)
    try:
        png = tmp_path / "plan.png"
        plan = ["plan", "--model", "qwen3_8b", "--gpu", "H100_SXM", "--gpus", "8", "--seq-length", "4096"]
        assert_clean(invoke([*plan, "--top", "1", "--plot", png]), frozenset({0}))
        npy = tmp_path / "bins.npy"
        balance = ["balance", world.lengths, "--pack-size", "64", "--dp", "2", "--gbs", "4", "--out", npy]
        assert_clean(invoke(balance), frozenset({0}))
    finally:
        os.umask(previous)
    for path in (png, npy):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, (path, oct(path.stat().st_mode))


def test_balance_explains_its_columns(world) -> None:
    from longpack.balance.report import COLUMNS

    outcome = assert_clean(invoke(["balance", world.lengths, "--pack-size", "64", "--dp", "2", "--gbs", "4"]))
    header = outcome.output.splitlines()[0]
    for column, meaning in COLUMNS.items():
        assert column in header and f"  {column}: {meaning}" in outcome.output, column
