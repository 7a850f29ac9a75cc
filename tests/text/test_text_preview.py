"""``longpack preview`` and ``PreviewConfig``: what trains is shown, selected by index, file:row or seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.errors import ConfigError
from longpack.jobs import PreviewConfig

ROWS = [
    {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"answer {i}"}]}
    for i in range(30)
]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    p = tmp_path / "chat.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "not json\n")
    return p


def test_marked_text_holds_exactly_the_supervised_tokens(data: Path) -> None:
    r = PreviewConfig(inputs=[str(data)], tokenizer="qwen3", index=[4]).run()
    (s,) = r.samples
    assert s.source.endswith("chat.jsonl:5")
    text = r.text(color=False)
    assert "[[<think>\n\n</think>\n\nanswer 4<|im_end|>]]" in text
    assert f"{s.tokens} tokens, {s.supervised} supervised ({s.trained} trained targets)" in text
    assert (
        "".join(seg.text for seg in s.segments if seg.supervised)
        == "<think>\n\n</think>\n\nanswer 4<|im_end|>"
    )
    assert [seg.text for seg in s.segments if seg.special][:2] == ["<|im_start|>", "<|im_end|>"]


def test_selection_by_at_random_and_errors(data: Path) -> None:
    at = PreviewConfig(inputs=[str(data)], tokenizer="bytes", at=["chat.jsonl:2", f"{data}:31"]).run()
    assert [s.source.rsplit(":", 1)[1] for s in at.samples] == ["2", "31"]
    assert at.samples[1].error is not None and "invalid JSON" in at.samples[1].error
    a = PreviewConfig(inputs=[str(data)], tokenizer="bytes", random=4, seed=1).run()
    b = PreviewConfig(inputs=[str(data)], tokenizer="bytes", random=4, seed=1).run()
    c = PreviewConfig(inputs=[str(data)], tokenizer="bytes", random=4, seed=2).run()
    assert [s.source for s in a.samples] == [s.source for s in b.samples] != [s.source for s in c.samples]
    assert len(a.samples) == 4 and a.rows_total == 31
    with pytest.raises(ConfigError, match=r"no row chat\.jsonl:99"):
        PreviewConfig(inputs=[str(data)], tokenizer="bytes", at=["chat.jsonl:99"]).run()
    with pytest.raises(ConfigError, match="index 40 is past the last row"):
        PreviewConfig(inputs=[str(data)], tokenizer="bytes", index=[40]).run()
    with pytest.raises(ConfigError, match="must be FILE:ROW"):
        PreviewConfig(inputs=[str(data)], tokenizer="bytes", at=["nope"])


def test_cli_markers_when_piped_and_html_page(data: Path, tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    res = CliRunner().invoke(
        app, ["preview", str(data), "--tokenizer", "bytes", "--limit", "2", "--html", str(page)]
    )
    assert res.exit_code == 0, res.output
    assert res.output.count("[[answer") == 2 and "\x1b[" not in res.output
    doc = page.read_text()
    assert doc.count('class="sup"') >= 2 and '<span class="ctx special">&lt;|im_start|&gt;</span>' in doc
    res = CliRunner().invoke(
        app, ["preview", str(data), "--tokenizer", "bytes", "--at", "chat.jsonl:3", "--json"]
    )
    got = json.loads(res.output)["samples"][0]
    assert got["source"].endswith(":3") and got["supervised"] == sum(got["loss_mask"])


def test_colours_on_a_terminal(data: Path) -> None:
    from rich.console import Console

    r = PreviewConfig(inputs=[str(data)], tokenizer="bytes", limit=1).run()
    console = Console(force_terminal=True, color_system="standard", width=200)
    with console.capture() as cap:
        console.print(r.text(color=True))
    out = cap.get()
    assert "\x1b[32m" in out and "[[" not in out  # green supervised text, no markers
