"""longpack's dynamic-CP schedule equals Megatron-LM dev's DefaultDynamicCPScheduler, micro-batch for micro-batch.

Live: against the scheduler lifted unmodified from a Megatron-LM checkout (``LONGPACK_MEGATRON_LM``, see
``megatron_lm_source``). Always: against ``data/dynamic_cp_golden.json``, that code's output on seeded random
length sets (``LONGPACK_REGEN_GOLDEN=1`` with the checkout rewrites it).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import megatron_lm_source as upstream
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.balance.cp_groups import InfeasibleCPSchedule
from longpack.balance.dynamic_cp import schedule_dynamic_cp

GOLDEN = Path(__file__).parent / "data" / "dynamic_cp_golden.json"
UPSTREAM_FAILURES = (AssertionError, IndexError)


def megatron(lengths, cap, total, min_cp):
    ns = upstream.dynamic_cp()
    # dp_size x cp_size only enter as their product (total_hdp_gpus)
    scheduler = ns["DefaultDynamicCPScheduler"](cap, 1, total, None, min_cp_size=min_cp)
    try:
        groups = scheduler.get_groups_and_subsamples(list(enumerate(lengths)))
    except UPSTREAM_FAILURES as exc:
        return {"error": type(exc).__name__}
    return {"groups": [[list(r) for r in g] for g in groups]}


def longpack(lengths, cap, total, min_cp):
    try:
        s = schedule_dynamic_cp(lengths, max_seqlen_per_rank=cap, dp_cp_size=total, min_cp_size=min_cp)
    except InfeasibleCPSchedule:
        return {"error": True}
    return {"groups": [[list(r) for r in mb.sample_ids] for mb in s.micro_batches]}


def same(expected, got):
    if "error" in expected:
        return "error" in got
    return got == expected


def random_cases(seed: int, count: int):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        total = int(rng.choice([2, 4, 6, 8, 10, 12, 14, 16, 24, 32]))
        cap = int(rng.choice([256, 1000, 4096]))
        min_cp = int(rng.choice([1, 1, 2, 4]))
        n = int(rng.integers(1, 48))
        shape = rng.choice(["lognormal", "uniform", "bimodal"])
        if shape == "lognormal":
            lengths = np.minimum(rng.lognormal(math.log(cap / 3), 1.2, n), cap * total)
        elif shape == "uniform":
            lengths = rng.integers(1, cap * total + 1, n)
        else:
            lengths = np.where(
                rng.random(n) < 0.8, rng.integers(1, cap // 4 + 1, n), rng.integers(cap, cap * total + 1, n)
            )
        cases.append(([max(1, int(x)) for x in lengths], cap, total, min_cp))
    return cases


def test_equals_the_golden_outputs_of_megatron_lm_dev():
    data = json.loads(GOLDEN.read_text())
    assert data["commit"] == upstream.DEV_COMMIT and len(data["cases"]) >= 400
    errors = sum("error" in c["expected"] for c in data["cases"])
    assert 0 < errors < len(data["cases"]) // 2  # both outcomes are exercised
    for case in data["cases"]:
        got = longpack(case["lengths"], case["cap"], case["total"], case["min_cp"])
        assert same(case["expected"], got), case


@pytest.mark.skipif(upstream.git_dir() is None, reason="no Megatron-LM checkout (LONGPACK_MEGATRON_LM)")
def test_golden_outputs_are_megatron_lm_devs():
    cases = random_cases(20261207, 400)
    data = {
        "commit": upstream.DEV_COMMIT,
        "source": "megatron/core/datasets/data_schedule.py:DefaultDynamicCPScheduler.get_groups_and_subsamples",
        "cases": [
            {"lengths": ls, "cap": cap, "total": total, "min_cp": m, "expected": megatron(ls, cap, total, m)}
            for ls, cap, total, m in cases
        ],
    }
    if os.environ.get("LONGPACK_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    assert json.loads(GOLDEN.read_text()) == data


@pytest.mark.skipif(upstream.git_dir() is None, reason="no Megatron-LM checkout (LONGPACK_MEGATRON_LM)")
@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 16384), min_size=1, max_size=40),
    cap=st.sampled_from([128, 512, 1024, 4096]),
    total=st.sampled_from([2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32]),
    min_cp=st.sampled_from([1, 2, 4]),
)
def test_equals_megatron_lm_dev_live(lengths, cap, total, min_cp):
    assert same(megatron(lengths, cap, total, min_cp), longpack(lengths, cap, total, min_cp))


def test_every_sub_sample_runs_once_within_the_cap():
    lengths = [9000, 5000, 4000, 300, 200, 100, 7000, 2500, 50, 12000]
    s = schedule_dynamic_cp(lengths, max_seqlen_per_rank=4096, dp_cp_size=8)
    seen = []
    for mb in s.micro_batches:
        assert all(mb.sample_ids)  # no idle rank
        for ranks, lens in mb.cp_groups():
            assert sum(lens) / len(ranks) <= 4096 or len(ranks) == 8
            seen += [sid for sid in mb.sample_ids[ranks[0]]]
    assert sorted(seen) == list(range(len(lengths)))


def test_a_sub_sample_longer_than_all_ranks_can_hold_is_refused():
    with pytest.raises(InfeasibleCPSchedule, match=r"needs 4 ranks.*more than the 2 DP x CP ranks"):
        schedule_dynamic_cp([10_000], max_seqlen_per_rank=4096, dp_cp_size=2)


def test_bad_lengths_and_settings_are_named():
    from longpack.errors import ConfigError

    with pytest.raises(ConfigError, match=r"lengths\[1\] must be a non-negative integer, got -3"):
        schedule_dynamic_cp([10, -3], max_seqlen_per_rank=64, dp_cp_size=2)
    with pytest.raises(ConfigError, match="min_cp_size must be a positive integer"):
        schedule_dynamic_cp([10], max_seqlen_per_rank=64, dp_cp_size=2, min_cp_size=0)
    s = schedule_dynamic_cp([0, 10, 0, 20], max_seqlen_per_rank=64, dp_cp_size=2)
    assert sorted(sid for mb in s.micro_batches for ids in mb.sample_ids for sid in ids) == [1, 3]
