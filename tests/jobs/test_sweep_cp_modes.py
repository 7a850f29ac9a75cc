"""``longpack sweep --cp-modes``: pack length x CP mode with the one step-time model of ``plan --data``."""

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
    PlannerSetup,
    SweepConfig,
    SweepError,
    SweepSettings,
    real_rate,
    recommend,
    sweep,
)
from longpack.planner.catalog import load_gpu, load_model
from longpack.planner.cp_modes import plan_cp_modes
from longpack.samples import TokenizedSamples

runner = CliRunner()
LLAMA, H100 = load_model("llama3_1_8b"), load_gpu("h100_sxm")


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


def _planner(cp: int) -> PlannerSetup:
    return PlannerSetup(model=LLAMA, gpu=H100, num_gpus=8, pins={"tp": 1, "cp": cp, "pp": 1})


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    median=st.sampled_from([200, 800, 3000]),
    cp=st.sampled_from([1, 2]),
)
def test_static_column_is_sweeps_step_time(seed: int, median: int, cp: int) -> None:
    """Static CP's cell is the candidate's own estimate; every other cell is that step time over the mode's
    simulated speed-up (plan --data's), and real tokens/s follow from the same tokens per step."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), 1.0, 300).astype(np.int64), 8, 8193)
    mult = 2 * cp if cp > 1 else 1
    result = sweep(
        samples_of(lengths),
        SweepSettings(
            pack_lengths=(4096, 8192), token_slots=65536, pad_seq_to_mult=mult, overlength="truncate"
        ),
        eos_id=0,
        planner=_planner(cp),
        cp_modes=True,
    )
    for cand in result.candidates:
        est, modes = cand.estimate, cand.cp_modes
        assert est is not None and est.fits and modes is not None
        static = modes.cell("static")
        assert static.step_time_s == est.step_time_s and static.real_tokens_per_s == est.real_tokens_per_s
        plan = plan_cp_modes(
            cand.pack_rows(),
            model=LLAMA,
            gpu=H100,
            gpus=8,
            tp=1,
            cp=cp,
            gbs=cand.gbs,
            pack_size=cand.pack_length,
        )
        assert modes.recommended == plan.recommended and modes.error_band == plan.error_band
        per_step = cand.gbs * cand.real_tokens / cand.packs
        for cell in modes.cells[1:]:
            at = plan.best(cell.mode)
            if cell.step_time_s is None:
                assert not np.isfinite(at.times[cell.mode]) and cell.note
                continue
            assert cell.step_time_s == pytest.approx(est.step_time_s / at.speedup(cell.mode), rel=1e-12)
            assert cell.real_tokens_per_s == pytest.approx(per_step / cell.step_time_s, rel=1e-12)
            assert cell.max_seqlen_per_dp_cp_rank == at.max_seqlen_per_rank
            assert cell.rank_imbalance is not None and cell.rank_imbalance >= 1.0 - 1e-12
        # a tie (gain inside the band) stays static, and the recommendation's rate is that mode's
        if modes.recommended != "static":
            assert modes.gain - 1.0 > modes.error_band
        assert real_rate(cand) == modes.cell(modes.recommended).real_tokens_per_s


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_full_length_packs_make_the_modes_coincide(cp: int) -> None:
    """Every pack one sequence of the full pack length at cap = pack / CP: hybrid CP puts each on CP ranks
    and the DP-balanced scheduler re-makes the same packs, so the three modes take the same time."""
    size, dp = 8192, 8 // cp
    packs = [[size]] * (dp * 4 * 3)
    plan = plan_cp_modes(
        packs, model=LLAMA, gpu=H100, gpus=8, tp=1, cp=cp, gbs=dp * 4, pack_size=size, caps=[size // cp]
    )
    (c,) = plan.comparisons
    assert c.speedup("hybrid") == pytest.approx(1.0, rel=1e-9)
    assert c.speedup("dp_balanced") == pytest.approx(1.0, rel=1e-9)
    assert plan.recommended == "static"
    assert set(plan.step_times(0.5).values()) >= {(0.5, None)}
    assert all(t == pytest.approx(0.5, rel=1e-9) for t, _ in plan.step_times(0.5).values())


def test_pipeline_layouts_get_the_static_cell_only() -> None:
    lengths = np.random.default_rng(3).integers(100, 3000, 400)
    result = sweep(
        samples_of(lengths),
        SweepSettings(pack_lengths=(8192,), token_slots=65536, overlength="truncate"),
        eos_id=0,
        planner=PlannerSetup(model=LLAMA, gpu=H100, num_gpus=8, pins={"tp": 1, "cp": 1, "pp": 2}),
        cp_modes=True,
    )
    (cand,) = result.candidates
    assert cand.cp_modes is not None and cand.cp_modes.recommended == "static"
    static, hybrid, balanced, dynamic = cand.cp_modes.cells
    assert static.step_time_s == cand.estimate.step_time_s  # type: ignore[union-attr]
    assert hybrid.step_time_s is None and "PP 2" in hybrid.note and balanced.step_time_s is None
    assert dynamic.step_time_s is None and "PP 2" in dynamic.note
    assert result.recommendation is not None and result.recommendation.cp_mode == "static"


def test_recommendation_weighs_each_length_by_its_recommended_mode() -> None:
    """A pack length whose hybrid-CP gain is outside the band wins with hybrid CP's rate."""
    from dataclasses import replace

    from longpack.jobs.sweep import CandidateCPModes, ModeCell

    result = sweep(
        samples_of(np.random.default_rng(1).integers(100, 3000, 400)),
        SweepSettings(pack_lengths=(4096, 8192), token_slots=65536, overlength="truncate"),
        eos_id=0,
        planner=_planner(1),
        cp_modes=True,
    )
    a, b = result.candidates
    rate = max(real_rate(a), real_rate(b))
    fast = ModeCell(
        mode="hybrid",
        max_seqlen_per_dp_cp_rank=2048,
        step_time_s=0.1,
        speedup=3.0,
        rank_imbalance=1.0,
        real_tokens_per_s=3 * rate,
    )
    assert a.cp_modes is not None
    won = replace(
        a.cp_modes,
        cells=(a.cp_modes.cells[0], fast, a.cp_modes.cells[2]),
        recommended="hybrid",
        max_seqlen_per_dp_cp_rank=2048,
        gain=3.0,
    )
    assert isinstance(won, CandidateCPModes)
    rec = recommend([replace(a, cp_modes=won), b])
    assert rec is not None and (rec.pack_length, rec.cp_mode, rec.max_seqlen_per_dp_cp_rank) == (
        4096,
        "hybrid",
        2048,
    )
    assert "model.hybrid_context_parallel=true" in rec.bridge_overrides()
    assert rec.to_dict()["cp_mode"] == "hybrid"
    advice = rec.mode_advice()
    assert advice[0].startswith("LP-HCP-009") and "--max-seqlen-per-dp-cp-rank 2048" in advice[0]
    assert "needs: no pipeline parallelism (PP 1)" in advice
    assert replace(rec, cp_mode="static").mode_advice() == []


def test_cp_modes_needs_the_planner() -> None:
    with pytest.raises(SweepError, match="cp_modes times the CP modes with the planner"):
        SweepConfig(demo=True, cp_modes=True)
    res = runner.invoke(app, ["sweep", "--demo", "--cp-modes"])
    assert (
        res.exit_code == 2
        and "--cp-modes times the CP modes with the planner: give --model, --gpu and --gpus" in (res.output)
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    path = tmp_path / "rows.jsonl"
    rows = [{"input_ids": [5] * int(n)} for n in rng.integers(2, 900, 160)] + [{"input_ids": [5] * 4000}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_table_and_json(data: Path) -> None:
    args = ["sweep", str(data), "--tokenizer", "bytes", "--pack-size", "1024,2048", "--token-slots", "16384"]
    args += ["--model", "llama3_1_8b", "--gpu", "H100_SXM", "--gpus", "8", "--layout", "tp=1,cp=2,pp=1"]
    args += ["--overlength", "truncate", "--cp-modes", "--workers", "1"]
    res = runner.invoke(app, args, env={"COLUMNS": "150"})
    assert res.exit_code == 0, res.output
    assert "CP modes: llama3_1_8b on 8xH100_SXM" in res.output
    for name in ("static CP", "hybrid CP", "DP-balanced packing", "dynamic CP"):
        assert name in res.output
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for cand in doc["candidates"]:
        modes = cand["cp_modes"]
        assert [m["mode"] for m in modes["modes"]] == ["static", "hybrid", "dp_balanced", "dynamic_cp"]
        assert modes["modes"][0]["step_time_s"] == cand["estimate"]["step_time_s"]
        assert modes["recommended"]["error_band"] == cand["estimate"]["step_time_error_band"]
    assert doc["recommendation"]["cp_mode"] in ("static", "hybrid", "dp_balanced", "dynamic_cp")
