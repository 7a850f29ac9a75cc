"""longpack's DP-balanced packing schedule: Megatron-LM's invariants, and equality with its class: the
installed megatron-core's where it has it (it arrived after 0.16), Megatron-LM main's lifted from a checkout
(``LONGPACK_MEGATRON_LM``, see ``megatron_lm_source``), and always that code's golden outputs
(``data/dp_balanced_golden.json``) on global batches gathered in Megatron's order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import megatron_lm_source as upstream
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.balance.cp_modes import compare_cp_modes, gather_order
from longpack.balance.dp_balanced import dp_balanced_packs
from longpack.errors import ConfigError

layouts = st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([None, 2, 4]))


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 2048), min_size=1, max_size=120), layout=layouts)
def test_every_sample_once_in_order_and_within_the_limit(lengths, layout):
    dp, cp, vpp = layout
    try:
        packs = dp_balanced_packs(
            lengths, max_seqlen_per_rank=512, cp=cp, dp=dp, microbatch_group_size_per_vp_stage=vpp
        )
    except ConfigError as exc:
        assert "Not enough samples" in str(exc) or "more than max_seqlen" in str(exc)
        return
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    assert len(packs) % (dp * (vpp or 1)) == 0
    assert all(p for p in packs)
    assert all(sum(lengths[i] for i in p) <= 512 * cp for p in packs)
    # packs before the moved tail hold consecutive samples in their original order
    for p in packs:
        assert p == sorted(p)


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 2048), min_size=1, max_size=120), layout=layouts)
def test_equals_megatron_lm_where_installed(lengths, layout):
    data_schedule = pytest.importorskip("megatron.core.datasets.data_schedule")
    if not hasattr(data_schedule, "DpBalancedScheduler"):
        pytest.skip("the installed megatron-core predates the DP-balanced scheduler (Megatron-LM PR #6684)")
    dp, cp, vpp = layout
    try:
        groups = data_schedule.DpBalancedScheduler(512, cp, dp, vpp).get_groups_and_subsamples(
            list(enumerate(lengths))
        )
    except AssertionError:
        with pytest.raises(ConfigError):
            dp_balanced_packs(
                lengths, max_seqlen_per_rank=512, cp=cp, dp=dp, microbatch_group_size_per_vp_stage=vpp
            )
        return
    packs = dp_balanced_packs(
        lengths, max_seqlen_per_rank=512, cp=cp, dp=dp, microbatch_group_size_per_vp_stage=vpp
    )
    assert [[packs[i * dp + d] for d in range(dp)] for i in range(len(packs) // dp)] == [
        [list(groups[i][d * cp]) for d in range(dp)] for i in range(len(groups))
    ]


def test_an_over_long_sample_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"sample 1 has 5000 tokens.*512 x 4 = 2048"):
        dp_balanced_packs([10, 5000], max_seqlen_per_rank=512, cp=4, dp=1)


def test_hybrid_cp_wins_on_a_long_tailed_batch_and_ties_on_uniform_full_packs():
    def cost(lengths, ranks):
        # work split over the ranks, plus CP's exposed communication: a share of each token's time when a
        # sequence is split (what hybrid CP saves by keeping short sequences on one rank)
        return sum(n + n * n / 4096 + (0.5 * n if ranks > 1 else 0.0) for n in lengths) / ranks

    long_tailed = [[16384], *([[512] * 32] * 7)]  # one full-length document, seven packs of short chats
    c = compare_cp_modes(long_tailed, dp=2, cp=4, gbs=8, max_seqlen_per_rank=4096, seconds=cost)
    assert c.speedup("hybrid") > 1.2
    uniform = [[16384]] * 8
    u = compare_cp_modes(uniform, dp=2, cp=4, gbs=8, max_seqlen_per_rank=4096, seconds=cost)
    assert u.times["hybrid"] == pytest.approx(u.times["static"])
    assert u.times["dp_balanced"] == pytest.approx(u.times["static"])


# --- Megatron-LM main's DpBalancedScheduler, lifted from a checkout, driven in Megatron's gather order ---

GOLDEN = Path(__file__).parent / "data" / "dp_balanced_golden.json"


def _megatron_packs(lengths, cap, cp, dp, vpp):
    ns = upstream.dp_balanced_main()
    try:
        groups = ns["DpBalancedScheduler"](cap, cp, dp, vpp).get_groups_and_subsamples(
            list(enumerate(lengths))
        )
    except AssertionError:
        return {"error": True}
    # micro-batch i, DP rank d (its first CP rank d * cp): pack i * dp + d
    return {"packs": [list(groups[i][d * cp]) for i in range(len(groups)) for d in range(dp)]}


def _longpack_packs(lengths, cap, cp, dp, vpp):
    try:
        return {
            "packs": dp_balanced_packs(
                lengths, max_seqlen_per_rank=cap, cp=cp, dp=dp, microbatch_group_size_per_vp_stage=vpp
            )
        }
    except ConfigError:
        return {"error": True}


def _gathered_cases(seed, count):
    """Global batches of packs (reading order) gathered as Megatron does, with the layout."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        dp, cp = int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 2, 4]))
        cap = int(rng.choice([512, 1024, 4096]))
        gbs = dp * int(rng.integers(1, 5))
        packs = []
        for _ in range(gbs):
            lens, room = [], cap * cp
            while room > 0 and rng.random() < 0.9:
                n = int(min(room, max(1, rng.lognormal(np.log(cap * cp / 6), 1.0))))
                lens.append(n)
                room -= n
            packs.append(lens or [1])
        gathered = [n for k in gather_order(len(packs), dp=dp, gbs=gbs) for n in packs[k]]
        out.append({"packs": packs, "gathered": gathered, "cap": cap, "cp": cp, "dp": dp, "gbs": gbs})
    return out


def test_gather_order_is_each_dp_ranks_own_packs_rank_0_first():
    # the sampler gives DP rank d packs d, d + DP, ...; get_batch_and_global_seqlens concatenates rank 0's first
    assert gather_order(6, dp=3, gbs=6) == [0, 3, 1, 4, 2, 5]
    assert gather_order(4, dp=1, gbs=4) == [0, 1, 2, 3]


def test_equals_the_golden_outputs_of_megatron_lm_main_in_gather_order():
    data = json.loads(GOLDEN.read_text())
    assert data["commit"] == upstream.MAIN_COMMIT and len(data["cases"]) >= 300
    assert any("error" in c["expected"] for c in data["cases"])
    for case in data["cases"]:
        got = _longpack_packs(case["gathered"], case["cap"], case["cp"], case["dp"], None)
        assert ("error" in got) if "error" in case["expected"] else got == case["expected"], case


@pytest.mark.skipif(upstream.git_dir() is None, reason="no Megatron-LM checkout (LONGPACK_MEGATRON_LM)")
def test_golden_outputs_are_megatron_lm_mains():
    data = {
        "commit": upstream.MAIN_COMMIT,
        "source": "megatron/core/datasets/data_schedule.py:DpBalancedScheduler.get_groups_and_subsamples",
        "cases": [
            {**c, "expected": _megatron_packs(c["gathered"], c["cap"], c["cp"], c["dp"], None)}
            for c in _gathered_cases(20261207, 300)
        ],
    }
    if os.environ.get("LONGPACK_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    assert json.loads(GOLDEN.read_text()) == data


@pytest.mark.skipif(upstream.git_dir() is None, reason="no Megatron-LM checkout (LONGPACK_MEGATRON_LM)")
@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 2048), min_size=1, max_size=120), layout=layouts)
def test_equals_megatron_lm_main_live(lengths, layout):
    dp, cp, vpp = layout
    if max(lengths) > 512 * cp:  # Megatron builds an empty and an over-long pack; longpack refuses
        assert _longpack_packs(lengths, 512, cp, dp, vpp) == {"error": True}
        return
    assert _megatron_packs(lengths, 512, cp, dp, vpp) == _longpack_packs(lengths, 512, cp, dp, vpp)


def test_the_speed_up_is_the_one_of_megatrons_packs_in_gather_order():
    """compare_cp_modes's DP-balanced time is the time of the packs Megatron builds from the gathered
    lengths (golden outputs), not of packs rebuilt in reading order."""
    data = json.loads(GOLDEN.read_text())

    def cost(lengths, ranks):
        return sum(n + n * n / 2048 for n in lengths) / ranks + 5.0

    checked = differs = 0
    for case in data["cases"]:
        if "error" in case["expected"]:
            continue
        dp, cp, gbs, g = case["dp"], case["cp"], case["gbs"], case["gathered"]
        c = compare_cp_modes(
            case["packs"], dp=dp, cp=cp, gbs=gbs, max_seqlen_per_rank=case["cap"], seconds=cost
        )
        packs = case["expected"]["packs"]
        per_rank = [
            sum(cost([g[i] for i in packs[k]], cp) for k in range(d, len(packs), dp)) for d in range(dp)
        ]
        assert c.times["dp_balanced"] == pytest.approx(max(per_rank)), case
        reading = (
            dp_balanced_packs(
                [n for p in case["packs"] for n in p], max_seqlen_per_rank=case["cap"], cp=cp, dp=dp
            )
            if dp > 1
            else None
        )
        differs += reading is not None and reading != packs
        checked += 1
    assert checked > 200 and differs > 20
