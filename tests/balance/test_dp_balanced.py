"""longpack's DP-balanced packing schedule: Megatron-LM's invariants, and equality with its class when the
installed megatron-core has it (it arrived after 0.16; the lead's harness ran it against Megatron-LM main)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.balance.cp_modes import compare_cp_modes
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
