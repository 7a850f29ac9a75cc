"""``longpack online-sim`` and the simulation helpers."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.online.simulate import offline_fill, simulate, synthetic_lengths

runner = CliRunner()


def test_online_sim_json_from_lengths_file(tmp_path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("# runtime lengths\n700\n500\n300\n500\n1000\n")
    result = runner.invoke(
        app, ["online-sim", "--pack-size", "1000", "--lengths", str(path), "--buffer-sizes", "2,5", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [r["online_packs"] for r in report["rows"]] == [4, 3]
    assert report["rows"][1]["fill_ratio"] == 1.0
    assert report["smallest_buffer_within_1pct"] == 5


def test_online_sim_bad_lengths_file_names_line(tmp_path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("12\nabc\n")
    result = runner.invoke(app, ["online-sim", "--pack-size", "100", "--lengths", str(path)])
    assert result.exit_code == 2
    assert f"{path}:2: expected one runtime length" in result.output


def test_online_sim_table_on_synthetic_workload() -> None:
    result = runner.invoke(
        app,
        [
            "online-sim",
            "--pack-size",
            "2048",
            "--workload",
            "bimodal",
            "--samples",
            "500",
            "--buffer-sizes",
            "8,64",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "smallest buffer within 1% of offline fill" in result.output


def test_fill_grows_with_buffer_and_never_beats_offline_by_much() -> None:
    lengths = synthetic_lengths("lognormal", 3000, 4096, seed=1)
    rows = simulate(lengths, 4096, [4, 64, 3000], pad_to_multiple_of=8)
    fills = [r["online_fill"] for r in rows]
    assert fills[0] < fills[1] <= fills[2] + 1e-9
    # A buffer holding the whole stream is one offline best-fit-decreasing run.
    assert rows[-1]["online_packs"] == rows[-1]["offline_packs"]


def test_synthetic_lengths_are_deterministic_and_in_range() -> None:
    a = synthetic_lengths("bimodal", 1000, 1024, seed=3)
    assert (a == synthetic_lengths("bimodal", 1000, 1024, seed=3)).all()
    assert a.min() >= 1 and a.max() <= 1024 and a.dtype == np.int64
    assert offline_fill([], 10, algorithm="best_fit_decreasing") == (0.0, 0)
