"""`longpack pack` / `longpack inspect` end to end through the CLI (bytes tokenizer, one worker)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from longpack.cli.app import app
from packed_helpers import assert_same_output, spec_read_rows

runner = CliRunner()
BYTES_EOS = 258  # the bytes tokenizer's EOS id (256 + 2 specials before it)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def pack(*args: str):
    return runner.invoke(app, ["pack", "--tokenizer", "bytes", "--workers", "1", *args])


def sft_rows(n: int) -> list[dict]:
    return [
        {"prompt": f"question {i} " * (1 + i % 5), "completion": f"answer {i}" * (1 + i % 3)}
        for i in range(n)
    ]


def test_pack_then_inspect_verify(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", sft_rows(200))
    out = tmp_path / "out"
    result = pack(
        str(src),
        "--out",
        str(out),
        "--seq-length",
        "96",
        "--pack-size",
        "128",
        "--tp",
        "2",
        "--cp",
        "2",
        "--sp",
        "--val-fraction",
        "0.1",
        "--json",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["pad_seq_to_mult"] == 4  # lcm(2*CP, CP*TP) = lcm(4, 4)
    assert summary["counts"]["packed"] + summary["counts"]["dropped"] == 200
    assert set(summary["splits"]) == {"training", "validation"}
    mb = summary["megatron_bridge"]
    assert mb["packed_sequence_size"] == 128 and Path(mb["packed_metadata_path"]).is_file()
    rows = spec_read_rows(mb["packed_train_data_path"])
    for row in rows:
        b = row["seq_boundaries"]
        assert all((b[i + 1] - b[i] - 1) % 4 == 0 for i in range(len(b) - 1))
        assert row["input_ids"][-1] == BYTES_EOS
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"][0]["sha256"] and manifest["inputs"][0]["size_bytes"] == src.stat().st_size
    assert manifest["tokenizer"]["eos_id"] == BYTES_EOS
    assert manifest["settings"]["seed"] == 0 and manifest["versions"]["pyarrow"]
    check = runner.invoke(app, ["inspect", str(out), "--verify"])
    assert check.exit_code == 0, check.output
    assert "all checks passed" in check.output and "row fill" in check.output
    as_json = json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).output)
    assert as_json["splits"]["training"]["rows"] == len(rows)


def test_malformed_json_names_file_line_and_exits_2(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "bad.jsonl", [*sft_rows(3), '{"prompt": "x", "completion": ', *sft_rows(2)])
    result = pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "64")
    assert result.exit_code == 2
    assert "bad.jsonl:4" in result.output and "error:" in result.output
    assert not (tmp_path / "o").exists()
    ok = pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "64", "--skip-malformed", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["counts"]["malformed"] == 1
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["malformed"][0]["source"].endswith("bad.jsonl:4")


def test_missing_key_names_key_and_row_keys(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "a", "answer": "b"}]
    )
    result = pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "64")
    assert result.exit_code == 2
    assert "d.jsonl:2" in result.output and "completion" in result.output and "answer" in result.output


def test_empty_input_and_no_input(tmp_path: Path) -> None:
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    result = pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "64")
    assert result.exit_code == 2 and "empty" in result.output
    result = pack("--out", str(tmp_path / "o"), "--seq-length", "64")
    assert result.exit_code == 2 and "INPUT" in result.output


def test_existing_output_folder_refused(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", sft_rows(10))
    (tmp_path / "o").mkdir()
    result = pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "64")
    assert result.exit_code == 2 and "--overwrite" in result.output
    result = pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "64", "--overwrite")
    assert result.exit_code == 0, result.output


def test_overlength_policies_through_cli(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "completion": "c" * 100}, *sft_rows(5)])
    result = pack(str(src), "--out", str(tmp_path / "e"), "--seq-length", "64", "--overlength", "error")
    assert result.exit_code == 2 and "d.jsonl:1" in result.output and "--overlength" in result.output
    result = pack(str(src), "--out", str(tmp_path / "t"), "--seq-length", "64", "--overlength", "truncate")
    assert result.exit_code == 0 and "d.jsonl:1: 102 tokens, kept 65 tokens" in result.output
    rows = pq.read_table(tmp_path / "t" / "training_64.idx.parquet").to_pylist()
    assert max(len(r["input_ids"]) - len(r["seq_start_id"]) for r in rows) <= 64
    result = pack(str(src), "--out", str(tmp_path / "d"), "--seq-length", "64")
    assert result.exit_code == 0 and "d.jsonl:1: 102 tokens, overlength" in result.output


def test_bad_options_exit_2(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", sft_rows(4))
    out = str(tmp_path / "o")
    for extra, needle in [
        (["--pad-seq-to-mult", "4", "--cp", "2"], "not both"),
        (["--algorithm", "magic"], "magic"),
        (["--pack-size", "32"], "must not exceed --pack-size"),
        (["--overlength", "shrink"], "overlength"),
    ]:
        result = pack(str(src), "--out", out, "--seq-length", "64", *extra)
        assert result.exit_code == 2 and needle in result.output, (extra, result.output)


def test_inspect_reports_unfinished_output(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", sft_rows(10))
    assert pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "64").exit_code == 0
    (tmp_path / "o" / "manifest.json").unlink()
    result = runner.invoke(app, ["inspect", str(tmp_path / "o")])
    assert result.exit_code == 1 and "UNFINISHED" in result.output


def test_val_input_split_and_plot(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", sft_rows(60))
    val = write_jsonl(tmp_path / "val.jsonl", sft_rows(8))
    result = pack(
        str(train), "--out", str(tmp_path / "o"), "--seq-length", "128", "--val-input", str(val), "--json"
    )
    assert result.exit_code == 0, result.output
    splits = json.loads(result.output)["splits"]
    assert splits["validation"]["samples_packed"] == 8 and splits["validation"]["files"] == [
        "validation/validation_128.idx.parquet"
    ]
    meta = json.loads((tmp_path / "o" / "128_metadata.jsonl").read_text())
    assert [m["pack_size"] for m in meta] == [128, 128]
    png = tmp_path / "fill.png"
    result = runner.invoke(app, ["inspect", str(tmp_path / "o"), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_output_bytes_independent_of_worker_count(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", sft_rows(120))
    for name, workers in (("one", "1"), ("two", "2")):
        result = runner.invoke(
            app,
            [
                "pack",
                str(src),
                "--tokenizer",
                "bytes",
                "--workers",
                workers,
                "--out",
                str(tmp_path / name),
                "--seq-length",
                "64",
                "--algorithm",
                "first_fit_shuffle",
                "--seed",
                "3",
            ],
        )
        assert result.exit_code == 0, result.output
    assert_same_output(tmp_path / "one", tmp_path / "two")


def test_overwrite_refuses_foreign_files_before_tokenizing(tmp_path: Path) -> None:
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    missing = tmp_path / "missing.jsonl"  # never read: the refusal comes first
    result = pack(str(missing), "--out", str(tmp_path / "o"), "--seq-length", "64", "--overwrite")
    assert result.exit_code == 2 and "notes.txt" in result.output
    assert (tmp_path / "o" / "notes.txt").exists()


def test_pack_balance_writes_rows_in_balanced_training_order(tmp_path: Path) -> None:
    from longpack.balance import simulate_schedule
    from longpack.planner.balance_costs import parse_balance_spec

    rows = [
        {"prompt": "q" * (5 + (i * 37) % 200), "completion": "a" * (3 + (i * 53) % 300)} for i in range(400)
    ]
    src = write_jsonl(tmp_path / "d.jsonl", rows)
    spec = "dp=2,gbs=8,pp=2,linear=1.0,quadratic=0.01"
    outs = {}
    for name, extra in (("bfd", []), ("balanced", ["--balance", spec])):
        out = tmp_path / name
        result = pack(str(src), "--out", str(out), "--seq-length", "1024", "--json", *extra)
        assert result.exit_code == 0, result.output
        outs[name] = out
    manifest = json.loads((outs["balanced"] / "manifest.json").read_text())
    assert manifest["settings"]["algorithm"] == "balanced"
    assert manifest["settings"]["balance"] == spec

    target = parse_balance_spec(spec)

    def step_time(out: Path) -> tuple[float, int]:
        table = pq.read_table(out / "training_1024.idx.parquet")
        costs = []
        for ids, starts in zip(
            table.column("input_ids").to_pylist(), table.column("seq_start_id").to_pylist(), strict=True
        ):
            bounds = [*starts, len(ids)]
            lengths = [b - a - 1 for a, b in itertools.pairwise(bounds)]  # runtime lengths
            costs.append(target.cost_model.pack_cost(lengths))
        return simulate_schedule(costs, dp=2, pp=2, gbs=8).total_time, table.num_rows

    balanced_time, balanced_rows = step_time(outs["balanced"])
    bfd_time, bfd_rows = step_time(outs["bfd"])
    assert balanced_rows <= bfd_rows * 1.005 + 1
    assert balanced_time <= bfd_time


def test_pack_balance_errors(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", sft_rows(20))
    bad = pack(str(src), "--out", str(tmp_path / "o"), "--seq-length", "128", "--balance", "dp=2")
    assert bad.exit_code == 2 and "needs gbs=" in bad.output
    # "balanced" is not an --algorithm choice: --balance alone chooses the balanced packer.
    lone = pack(str(src), "--out", str(tmp_path / "o2"), "--seq-length", "128", "--algorithm", "balanced")
    assert lone.exit_code == 2 and "'balanced' is not one of" in lone.output
