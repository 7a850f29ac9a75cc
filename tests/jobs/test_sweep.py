"""``longpack.jobs.sweep`` and ``longpack sweep``: counts, batch rules, planner recommendation, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.jobs.sweep import (
    PACK_LENGTH_WARNING,
    Candidate,
    Estimate,
    PlannerSetup,
    SweepError,
    SweepSettings,
    batch_rule_findings,
    parse_pack_lengths,
    recommend,
    sweep,
)
from longpack.packed.pipeline import PackSettings, plan_split
from longpack.planner.catalog import load_gpu, load_model
from longpack.samples import TokenizedSamples
from longpack.topology import ParallelLayout

runner = CliRunner()
EOS = 0


def samples_of(stored_lengths: list[int] | np.ndarray) -> TokenizedSamples:
    lens = np.asarray(stored_lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    n = len(lens)
    return TokenizedSamples(
        tokens=np.ones(int(offsets[-1]), np.int32),
        loss_mask=np.ones(int(offsets[-1]), np.uint8),
        offsets=offsets,
        source_file=np.zeros(n, np.int32),
        source_row=np.arange(1, n + 1),
        files=("data.jsonl",),
    )


def skewed_samples(n: int = 2000, seed: int = 0) -> TokenizedSamples:
    rng = np.random.default_rng(seed)
    return samples_of(np.minimum(rng.lognormal(6, 1.2, n).astype(np.int64) + 2, 30000))


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=60),
    exponents=st.sets(st.integers(3, 8), min_size=1, max_size=4),
    mult=st.sampled_from([1, 2, 4, 8]),
    overlength=st.sampled_from(["drop", "truncate"]),
    algorithm=st.sampled_from(["best_fit_decreasing", "first_fit_shuffle"]),
)
def test_counts_add_up_per_candidate(
    lengths: list[int], exponents: set[int], mult: int, overlength: str, algorithm: str
) -> None:
    pack_lengths = tuple(sorted(2**e for e in exponents))
    slots = 2 ** max(exponents) * 4
    s = samples_of(lengths)
    runtime = np.maximum(np.asarray(lengths) - 1, 0)
    cfg = SweepSettings(
        pack_lengths=pack_lengths,
        token_slots=slots,
        pad_seq_to_mult=mult,
        overlength=overlength,
        algorithm=algorithm,
    )
    result = sweep(s, cfg, eos_id=EOS)
    assert [c.pack_length for c in result.candidates] == list(pack_lengths)
    for c in result.candidates:
        assert c.kept + c.truncated + c.dropped == c.read == len(lengths)
        # every runtime token is trained on, cut by truncation, or dropped with its sample
        assert c.real_tokens + c.truncated_tokens_lost + c.dropped_tokens == int(runtime.sum())
        assert c.gbs * c.pack_length == slots
        assert c.steps_per_epoch * c.gbs + c.leftover_packs == c.packs
        assert 0 <= c.real_fill <= c.fill <= 1
        if overlength == "drop":
            assert c.truncated == 0
        if c.packs:
            # the very rows `longpack pack --seq-length L` would write
            packed = plan_split(
                "training",
                s,
                PackSettings(
                    seq_length=c.pack_length, pad_seq_to_mult=mult, overlength=overlength, algorithm=algorithm
                ),
                eos_id=EOS,
            )
            assert packed.plan.num_rows == c.packs
            assert c.attention_work_per_step >= c.linear_work_per_step
    # a longer pack never truncates or drops more
    cut = [c.truncated + c.dropped for c in result.candidates]
    assert cut == sorted(cut, reverse=True)


def test_attention_and_linear_work_per_step() -> None:
    # runtime lengths 4, 4, 2 at L=4 -> 3 packs; GBS 2 -> per step 2 * (16+16+4)/3 and 2 * 10/3
    c = sweep(samples_of([5, 5, 3]), SweepSettings(pack_lengths=(4,), token_slots=8), eos_id=EOS).candidates[
        0
    ]
    assert (c.packs, c.gbs) == (3, 2)
    assert c.attention_work_per_step == pytest.approx(24.0)
    assert c.linear_work_per_step == pytest.approx(20 / 3)


def test_batch_rules_per_candidate() -> None:
    s = skewed_samples(400)
    cfg = SweepSettings(pack_lengths=(2048, 4096, 8192, 16384), token_slots=65536, overlength="truncate")
    # DP 12: GBS 32 and 16 not divisible by 12, GBS 8 and 4 smaller than 12
    result = sweep(s, cfg, eos_id=EOS, layout=ParallelLayout(world_size=12))
    ids = {c.pack_length: [f["id"] for f in c.batch_rules or ()] for c in result.candidates}
    assert ids == {
        2048: ["LP-BATCH-001"],
        4096: ["LP-BATCH-001"],
        8192: ["LP-BATCH-002"],
        16384: ["LP-BATCH-002"],
    }
    assert all(c.dp == 12 and not c.ok for c in result.candidates)
    # DP 8 (16 GPUs, TP 2, SP): 8K/GBS8 is the longest that works, 16K/GBS4 < DP
    lay = ParallelLayout(world_size=16, tp=2, sp=True)
    result = sweep(s, SweepSettings(pack_lengths=cfg.pack_lengths, pad_seq_to_mult=2), eos_id=EOS, layout=lay)
    assert [c.ok for c in result.candidates] == [True, True, True, False]
    assert "LP-BATCH-002" in result.candidates[-1].problems[0]
    assert result.recommendation is None  # no planner, no recommendation


def test_alignment_must_match_the_layout() -> None:
    with pytest.raises(SweepError, match="pad_seq_to_mult 1 is not a multiple of 4"):
        sweep(
            samples_of([10, 20]),
            SweepSettings(pack_lengths=(64,), token_slots=64),
            eos_id=EOS,
            layout=ParallelLayout(world_size=8, cp=2),
        )


def test_batch_rule_findings_name_the_fix() -> None:
    (f,) = batch_rule_findings(ParallelLayout(world_size=24), pack_length=2048, gbs=32)
    assert f["id"] == "LP-BATCH-001" and "use GBS = 24 or 48" in f["fix"]


def _planner(headroom: float) -> PlannerSetup:
    return PlannerSetup(
        model=load_model("llama3_1_8b"),
        gpu=load_gpu("H100_SXM"),
        num_gpus=8,
        pins={"pp": 1, "vpp": 1},
        headroom=headroom,
        recompute=(),
        allow_offload=False,
    )


def test_recommendation_changes_when_memory_rules_out_the_longer_pack() -> None:
    s = skewed_samples()
    cfg = SweepSettings(pack_lengths=(2048, 4096, 8192), token_slots=131072, overlength="truncate")
    roomy = sweep(s, cfg, eos_id=EOS, planner=_planner(0.95))
    tight = sweep(s, cfg, eos_id=EOS, planner=_planner(0.75))
    by_len = {c.pack_length: c for c in roomy.candidates}
    assert roomy.recommendation is not None and roomy.recommendation.pack_length == 4096
    assert by_len[4096].estimate is not None and by_len[4096].estimate.fits
    assert by_len[8192].estimate is not None and not by_len[8192].estimate.fits
    assert "8192 is out" in roomy.recommendation.reason
    # 4096 needs more memory than the tighter budget: the recommendation falls back to 2048
    t4096 = next(c for c in tight.candidates if c.pack_length == 4096)
    assert t4096.estimate is not None and not t4096.estimate.fits
    assert (by_len[4096].estimate.memory_gib or 0) > t4096.estimate.memory_budget_gib
    # the infeasible candidate still reports what it needs: the same options, so the same memory
    assert t4096.estimate.memory_gib == pytest.approx(by_len[4096].estimate.memory_gib)
    assert "needs" in t4096.problems[0] and "no offload" in t4096.problems[0]
    assert tight.recommendation is not None and tight.recommendation.pack_length == 2048
    for c in roomy.candidates:
        if c.estimate is not None and c.estimate.fits:
            assert c.batch_rules == ()  # the planner only picks layouts whose DP divides GBS
            assert c.estimate.real_tokens_per_s == pytest.approx(
                c.gbs * c.real_tokens / c.packs / (c.estimate.step_time_s or 1)
            )
    assert roomy.to_dict()["warning"] == PACK_LENGTH_WARNING


def test_planner_reports_gbs_below_dp() -> None:
    # 16384 at 65,536 slots is GBS 4; TP1 CP1 PP1 on 8 GPUs is DP 8: no layout can run it
    s = skewed_samples(300)
    planner = PlannerSetup(
        model=load_model("llama3_1_8b"), gpu=load_gpu("H100_SXM"), num_gpus=8, pins={"pp": 1, "vpp": 1}
    )
    result = sweep(s, SweepSettings(pack_lengths=(8192, 16384)), eos_id=EOS, planner=planner)
    last = result.candidates[-1]
    assert not last.ok and "divides GBS 4" in last.problems[0]


def _candidate(length: int, rate: float | None, fits: bool, rules: tuple[dict[str, str], ...]) -> Candidate:
    est = Estimate(
        fits=fits,
        reason="fits" if fits else "no layout fits 75.0 GiB per GPU",
        real_tokens_per_s=rate if fits else None,
        memory_gib=50.0,
    )
    return Candidate(
        pack_length=length,
        gbs=65536 // length,
        pad_seq_to_mult=1,
        cap=length,
        read=10,
        kept=10,
        truncated=0,
        truncated_tokens_lost=0,
        dropped=0,
        dropped_tokens=0,
        packs=64,
        fill=0.9,
        real_fill=0.9,
        real_tokens=1000,
        steps_per_epoch=64 // (65536 // length),
        leftover_packs=0,
        attention_work_per_step=0.0,
        linear_work_per_step=0.0,
        batch_rules=rules,
        estimate=est,
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(1e3, 1e6), st.booleans(), st.booleans()),
        min_size=1,
        max_size=5,
    )
)
def test_recommendation_is_the_fastest_candidate_that_fits(rows: list[tuple[float, bool, bool]]) -> None:
    bad_rule = ({"id": "LP-BATCH-002", "message": "GBS < DP"},)
    cands = [
        _candidate(2 ** (11 + i), rate, fits, () if rule_ok else bad_rule)
        for i, (rate, fits, rule_ok) in enumerate(rows)
    ]
    rec = recommend(cands)
    usable = [c for c in cands if c.ok]
    if not usable:
        assert rec is None
        return
    assert rec is not None
    best = max(c.estimate.real_tokens_per_s or 0.0 for c in usable if c.estimate is not None)
    chosen = next(c for c in cands if c.pack_length == rec.pack_length)
    assert chosen.ok and chosen.estimate is not None and chosen.estimate.real_tokens_per_s == best
    for c in cands:
        if not c.ok and c.pack_length > rec.pack_length:
            assert f"{c.pack_length} is out" in rec.reason


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "pack_lengths is empty"),
        ("2048,abc", "'abc' is not a positive integer"),
        ("2048,0", "'0' is not a positive integer"),
        ("4096,4k", "4096 more than once"),
    ],
)
def test_parse_pack_lengths_errors(text: str, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        parse_pack_lengths(text)


def test_settings_errors() -> None:
    with pytest.raises(SweepError, match="not divisible by pack length 3000"):
        SweepSettings(pack_lengths=(2048, 3000))
    with pytest.raises(SweepError, match="shorter than pad_seq_to_mult 8"):
        SweepSettings(pack_lengths=(4, 8), token_slots=8, pad_seq_to_mult=8)
    with pytest.raises(SweepError, match="overlength must be one of"):
        SweepSettings(pack_lengths=(8,), token_slots=8, overlength="split")


# --- CLI -------------------------------------------------------------------------------------------


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    path = tmp_path / "data.jsonl"
    rows = [{"input_ids": [5] * int(n)} for n in rng.integers(2, 600, 120)] + [{"input_ids": [5] * 1500}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_json(data: Path) -> None:
    res = runner.invoke(
        app,
        [
            "sweep",
            str(data),
            "--tokenizer",
            "bytes",
            "--pack-size",
            "256,512,1k",
            "--token-slots",
            "4096",
            "--overlength",
            "truncate",
            "--gpus",
            "4",
            "--json",
            "--workers",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["samples_read"] == 121 and doc["input"]["format"] == "pretokenized"
    assert [c["pack_length"] for c in doc["candidates"]] == [256, 512, 1024]
    assert [c["gbs"] for c in doc["candidates"]] == [16, 8, 4]
    for c in doc["candidates"]:
        n = c["samples"]
        assert n["kept"] + n["truncated"] + n["dropped"] == n["read"] == 121
        assert c["dp"] == 4 and c["batch_rules"] == [] and c["ok"]
    assert doc["candidates"][-1]["samples"]["truncated"] == 1  # only the 1500-token row is longer than 1024
    assert doc["recommendation"] is None and "rerun the loss" in doc["warning"]


def test_cli_planner_and_plot(data: Path, tmp_path: Path) -> None:
    png = tmp_path / "sweep.png"
    args = [
        "sweep",
        str(data),
        "--tokenizer",
        "bytes",
        "--pack-size",
        "1024,2048",
        "--token-slots",
        "8192",
    ]
    args += [
        "--model",
        "llama3_1_8b",
        "--gpu",
        "H100_SXM",
        "--gpus",
        "4",
        "--plot",
        str(png),
        "--workers",
        "1",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "Recommendation: pack length" in res.output and "Warning: changing the pack length" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pack-size", "2048,x"], "'x' is not a positive integer"),
        (["--pack-size", "3000"], "--token-slots 65536 is not divisible by pack length 3000"),
        (["--token-slots", "0"], "--token-slots must be a positive integer"),
        (["--tp", "2", "--pad-seq-to-mult", "4"], "either --pad-seq-to-mult or --tp, --cp, --sp"),
        (["--model", "llama3_1_8b"], "--model, --gpu and --gpus go together"),
        (["--layout", "tp=2"], "--layout needs --gpus"),
        (["--layout", "tp=1,mbs=2", "--gpus", "8"], "micro_batch_size 1"),
        (["--gpus", "8", "--tp", "3"], "world_size=8 is not divisible"),
        (["--model", "nope", "--gpu", "H100_SXM", "--gpus", "8"], "nope"),
        (["--overlength", "split"], "'split' is not one of"),
        (["--plot", "/no/such/folder/x.png"], "does not exist"),
        (["--pack-size", "256", "--token-slots", "4096", "--overlength", "error"], "pack length 256: "),
    ],
)
def test_cli_bad_input(data: Path, extra: list[str], message: str) -> None:
    res = runner.invoke(app, ["sweep", str(data), "--tokenizer", "bytes", "--workers", "1", *extra])
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_cli_pinned_layout_json(data: Path) -> None:
    args = [
        "sweep",
        str(data),
        "--tokenizer",
        "bytes",
        "--pack-size",
        "1024,2048",
        "--token-slots",
        "8192",
    ]
    args += ["--model", "llama3_1_8b", "--gpu", "H100_SXM", "--gpus", "8", "--layout", "tp=2,pp=2", "--json"]
    res = runner.invoke(app, [*args, "--workers", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["settings"]["pad_seq_to_mult"] == 2  # TP 2 with SP
    first, second = doc["candidates"]
    assert first["dp"] == 2 and first["ok"] and first["estimate"]["layout"].startswith("TP2 CP1")
    # GBS 4 at 2048 still divides DP 2
    assert second["gbs"] == 4 and second["batch_rules"] == []
    assert doc["recommendation"]["pack_length"] in (1024, 2048)


def test_cli_needs_input() -> None:
    res = runner.invoke(app, ["sweep", "--tokenizer", "bytes"])
    assert res.exit_code == 2 and "no INPUT: give at least one input" in res.output


def test_cli_tools_key_counts_the_tools_pack_renders(tmp_path: Path) -> None:
    """sweep reads the text options pack reads: a renamed tools column makes every sample longer by the
    rendered tool definitions, in sweep's counts as in pack's."""
    tools = [{"type": "function", "function": {"name": "lookup", "description": "find a word " * 5}}]
    rows = [
        {
            "messages": [{"role": "user", "content": "hi " * k}, {"role": "assistant", "content": "yo"}],
            "fns": tools,
        }
        for k in range(1, 30)
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def runtime_tokens(*extra: str) -> int:
        args = ["sweep", str(path), "--tokenizer", "bytes", "--pack-size", "4k", "--gpus", "1", "--json"]
        res = runner.invoke(app, [*args, "--workers", "1", *extra])
        assert res.exit_code == 0, res.output
        return int(json.loads(res.output)["candidates"][0]["real_tokens"])

    packed = tmp_path / "packed"
    args = ["pack", str(path), "--out", str(packed), "--tokenizer", "bytes", "--seq-length", "4096"]
    assert runner.invoke(app, [*args, "--tools-key", "fns"]).exit_code == 0
    manifest = json.loads((packed / "manifest.json").read_text())
    assert runtime_tokens("--tools-key", "fns") > runtime_tokens()
    assert runtime_tokens("--tools-key", "fns") == manifest["splits"]["training"]["runtime_tokens"]
