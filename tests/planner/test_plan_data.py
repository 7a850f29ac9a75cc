"""longpack plan --data: the CP modes on a corpus's own packs, from the CLI and from Python."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import longpack
from longpack.balance.cp_modes import CP_MODES
from longpack.errors import ConfigError


@pytest.fixture(scope="module")
def long_tailed_pack(tmp_path_factory):
    """Pre-tokenized samples, most short, a few near the 16K pack, packed as longpack pack does."""
    root = tmp_path_factory.mktemp("plan_data")
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(np.log(900), 1.1, 600), 8, 16000).astype(int)
    with open(root / "train.jsonl", "w") as f:
        for n in lengths:
            f.write(json.dumps({"input_ids": [7] * int(n) + [2], "loss_mask": [1] * (int(n) + 1)}) + "\n")
    result = longpack.PackConfig(
        inputs=[root / "train.jsonl"], out=root / "packed", tokenizer="bytes", seq_length=16384
    ).run()
    return result.out


def test_plan_data_from_python_compares_the_four_modes(long_tailed_pack):
    result = longpack.PlanConfig(
        model="llama3_1_8b", gpu="h100", gpus=32, seq_length=16384, data=long_tailed_pack, top=3
    ).run()
    doc = result.to_dict()["cp_modes"]
    assert doc["data"] == "packed folder" and doc["samples"] == 600
    assert doc["sizes"]["gpus"] == 32 and "PP1" in doc["layout"]
    assert {c["max_seqlen_per_dp_cp_rank"] for c in doc["comparisons"]}
    for c in doc["comparisons"]:
        assert set(c["step_time_s"]) == set(CP_MODES) == {"static", "hybrid", "dp_balanced", "dynamic_cp"}
        assert c["step_time_s"]["static"] > 0
    rec = doc["recommended"]
    assert rec["mode"] in CP_MODES and 0 < rec["error_band"] < 1
    if rec["mode"] == "static":
        assert rec["gain_over_static"] - 1 <= rec["error_band"] or "no mode" in rec["reason"]


def test_plan_data_cli_text_and_json(long_tailed_pack):
    base = [sys.executable, "-m", "longpack.cli.app", "plan", "--model", "llama3_1_8b", "--gpu", "h100"]
    args = [*base, "--gpus", "32", "--seq-length", "16384", "--data", str(long_tailed_pack), "--top", "2"]
    text = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "CP modes on the data" in text.stdout and "Recommended:" in text.stdout
    js = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=300)
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout)["cp_modes"]["recommended"]["mode"] in CP_MODES


def test_plan_data_refuses_a_folder_packed_for_another_length(long_tailed_pack):
    with pytest.raises(ConfigError, match="packed at 16384 tokens but the plan is for seq_length 8192"):
        longpack.PlanConfig(
            model="llama3_1_8b", gpu="h100", gpus=32, seq_length=8192, data=long_tailed_pack
        ).run()


def test_a_cap_without_data_is_refused():
    with pytest.raises(ConfigError, match="give data"):
        longpack.PlanConfig(
            model="llama3_1_8b", gpu="h100", gpus=32, seq_length=16384, max_seqlen_per_dp_cp_rank=4096
        )


def test_plan_data_from_a_token_store_and_from_inputs_pack_the_same_samples(long_tailed_pack, tmp_path):
    from longpack.jobs.plan_data import corpus_packs

    source = long_tailed_pack.parent / "train.jsonl"
    longpack.TokenizeConfig(inputs=[source], out=tmp_path / "store", tokenizer="bytes").run()
    stored = corpus_packs([tmp_path / "store"], seq_length=16384, pad_seq_to_mult=4)
    read = corpus_packs([source], seq_length=16384, pad_seq_to_mult=4, tokenizer="bytes")
    assert (stored.source, read.source) == ("token store", "inputs")
    assert stored.packs == read.packs and stored.samples == read.samples == 600
    with pytest.raises(ConfigError, match="give a tokenizer"):
        corpus_packs([source], seq_length=16384, pad_seq_to_mult=4)


#: What ``longpack check`` says of a recommended mode's overrides, as docs/guide/plan-data.md documents it:
#: LP-HCP-009 for hybrid CP and DP-balanced packing (Bridge does not schedule them), LP-HCP-007 when the cap
#: is at most half of seq_length / CP, LP-CFG-003 (info) since the overrides carry no model architecture;
#: no error.
DOCUMENTED = {"LP-HCP-009", "LP-HCP-007", "LP-CFG-003"}


@pytest.mark.parametrize("mode", CP_MODES[1:])
def test_a_recommended_mode_is_checked_and_the_printed_command_agrees(mode):
    from typer.testing import CliRunner

    from longpack.cli.app import app
    from longpack.jobs.plan import CPModesOfData, cp_mode_lines, mode_check
    from longpack.planner.cp_modes import plan_cp_modes
    from longpack.planner.search import search

    config = longpack.PlanConfig(
        model="llama3_1_8b", gpu="h100", gpus=64, seq_length=131072, gbs=4, tp=1, cp=16, pp=1, top=1
    )
    pick = search(config.request, top_k=1).candidates[0]
    packs = [[131072], *[[1024] * 128] * 3] * 2  # full-length documents among packs of 1K chats
    plan = plan_cp_modes(
        packs, model="llama3_1_8b", gpu="h100", gpus=64, tp=1, cp=16, gbs=4, pack_size=131072
    )
    assert plan.recommended in ("hybrid", "dynamic_cp")  # the CP-group modes, within 2 % of each other
    if mode != plan.recommended:  # the pasted keys of every mode pass check; pick it at its fastest cap
        from dataclasses import replace

        plan = replace(plan, recommended=mode, recommended_cap=plan.best(mode).max_seqlen_per_rank)
    check = mode_check(pick, config.request, plan, gpus=64)
    assert check is not None and not check.errors
    ids = {f["id"] for f in check.findings}
    assert ids <= DOCUMENTED and ("LP-HCP-009" in ids) == (mode != "dynamic_cp")
    keys = [line.split("=", 1)[0] for line in check.overrides]
    assert (
        len(keys) == len(set(keys))
        and f"model.max_seqlen_per_dp_cp_rank={plan.recommended_cap}" in check.overrides
    )
    text = "\n".join(
        cp_mode_lines(CPModesOfData(layout=pick.plan.label, source="x", samples=1, plan=plan, check=check))
    )
    assert "LP-HCP-009" in text and "pretrain_gpt.py" in text and check.command in text
    # the printed command, pasted: the same findings, exit 0 (warnings only)
    import shlex

    res = CliRunner().invoke(app, [*shlex.split(check.command)[1:], "--json"])
    assert res.exit_code == 0, res.output
    assert sorted(f["id"] for f in json.loads(res.output)["findings"]) == sorted(
        f["id"] for f in check.findings
    )
