"""Weighted mixing: shares met by epochs, seeded, every row accounted for per source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.errors import ConfigError
from longpack.text import TextConfig
from longpack.text.mix import draw, mix_counts, parse_mix


def write_pc(path: Path, n: int, width: int = 1, bad: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"prompt": f"q{i}", "completion": "a" * (width + i % 3)}) for i in range(n)]
    rows += ['{"prompt": 1}'] * bad
    path.write_text("\n".join(rows) + "\n")
    return path


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 100), min_size=1, max_size=6), st.integers(0, 10_000))
def test_counts_add_up_and_follow_the_weights(weights: list[float], total: int) -> None:
    counts = mix_counts(weights, total)
    assert counts.sum() == total and (counts >= 0).all()
    exact = np.array(weights) / sum(weights) * total
    assert (np.abs(counts - exact) < 1).all()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.integers(0, 200), st.integers(0, 2**32 - 1))
def test_draw_is_epochs_plus_a_seeded_subset(available: int, wanted: int, seed: int) -> None:
    got = draw(available, wanted, np.random.default_rng(seed))
    assert len(got) == wanted
    uses = np.bincount(got, minlength=available)
    assert uses.max() - uses.min() <= 1  # no sample used twice more than another
    assert np.array_equal(got, draw(available, wanted, np.random.default_rng(seed)))


def test_bad_mixes_are_config_errors(tmp_path: Path) -> None:
    for spec, match in (
        (["a.jsonl=0"], "must be a number > 0"),
        (["a.jsonl=-1"], "must be a number > 0"),
        (["a.jsonl=nan"], "must be a number > 0"),
        (["a.jsonl"], "needs a weight: write PATH=WEIGHT"),
        (["a.jsonl=x"], "is not a number"),
    ):
        with pytest.raises(ConfigError, match=match):
            parse_mix(spec)
    f = tmp_path / "mix.yaml"
    f.write_text("sources:\n  - path: a.jsonl\n    weight: 0\n")
    with pytest.raises(
        ConfigError, match=r"mix\.yaml: sources\[0\]: mix weight of .*a\.jsonl must be a number > 0"
    ):
        parse_mix([str(f)])
    f.write_text("sources:\n  - {path: a.jsonl, weight: 1, epochs: 2}\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['epochs'\]"):
        parse_mix(str(f))


def test_pack_with_a_mix_accounts_for_every_row(tmp_path: Path) -> None:
    from longpack.jobs import PackConfig

    a = write_pc(tmp_path / "a.jsonl", 40, bad=2)
    write_pc(tmp_path / "b" / "b.jsonl", 10, width=62)  # 64+ tokens: some are dropped at seq 64
    mix_file = tmp_path / "mix.yaml"
    mix_file.write_text(
        "seed: 3\nsamples: 100\nsources:\n  - {path: a.jsonl, weight: 0.7, name: small}\n  - {path: b/, weight: 0.3}\n"
    )
    text = TextConfig(skip_malformed=True)
    r = PackConfig(mix=str(mix_file), out=tmp_path / "out", tokenizer="bytes", seq_length=64, text=text).run()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    mix = manifest["mix"]
    assert mix["samples"] == 100 and mix["seed"] == 3
    small, big = mix["sources"]
    assert (small["name"], small["drawn"], big["drawn"]) == ("small", 70, 30)
    assert small["rows_read"] == 42 and small["malformed"] == 2 and small["samples"] == 40
    assert big["epochs"] == 3.0 and big["repeated"] == 20 and big["unused"] == 0
    for s in mix["sources"]:
        assert s["rows_read"] == s["malformed"] + s["samples"]
        assert s["drawn"] == s["samples"] - s["unused"] + s["repeated"]
        assert s["drawn"] == s["packed"] + s["dropped"]
    assert sum(s["packed"] for s in mix["sources"]) == r.counts["packed"]
    assert big["dropped"] > 0 and small["dropped"] == 0
    # the same mix from the command-line form, and the same seed: the same rows
    r2 = PackConfig(
        mix=[f"{a}=0.7", f"{tmp_path / 'b'}=0.3"],
        out=tmp_path / "out2",
        tokenizer="bytes",
        seq_length=64,
        seed=3,
        text=text,
    ).run()
    assert [s["drawn"] for s in r2.manifest.extra["mix"]["sources"]] == [35, 15]  # 50 samples by default
    with pytest.raises(ConfigError, match="give either mix or inputs"):
        PackConfig(mix=[f"{a}=1"], inputs=[str(a)], out=tmp_path / "o3", tokenizer="bytes", seq_length=64)
    with pytest.raises(ConfigError, match="is in two mix sources"):
        PackConfig(
            mix=[f"{a}=1", f"{tmp_path}/*.jsonl=1"],
            out=tmp_path / "o4",
            tokenizer="bytes",
            seq_length=64,
            text=text,
        ).run()


def test_cli_mix_and_escapes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from longpack.cli.app import app

    a = write_pc(tmp_path / "a.jsonl", 6)
    b = write_pc(tmp_path / "b.jsonl", 6)
    res = CliRunner().invoke(
        app,
        [
            "pack",
            "--out",
            str(tmp_path / "o"),
            "--tokenizer",
            "bytes",
            "--seq-length",
            "64",
            "--prompt-template",
            r"Q: {prompt}\nA:",
            "--mix",
            f"{a}=2",
            f"{b}=1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "mix: 12 samples" in res.output and "columns used: completion, prompt" in res.output
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["settings"]["text"]["prompt_template"] == "Q: {prompt}\nA:"
    assert [s["drawn"] for s in manifest["mix"]["sources"]] == [8, 4]
    res = CliRunner().invoke(
        app,
        [
            "pack",
            "--out",
            str(tmp_path / "o2"),
            "--tokenizer",
            "bytes",
            "--seq-length",
            "64",
            "--mix",
            f"{a}=0",
        ],
    )
    assert res.exit_code == 2 and "--mix" in res.output and "must be a number > 0" in res.output
