"""The RL rollout packer: Megatron-LM's own packer's output (recorded, and live where a checkout is given),
its invariants on random rollouts, the CP split, and the cost-balanced order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megatron_rl_harness as harness
from longpack.balance.cost import PackCostModel
from longpack.balance.rollouts import RolloutPackingError, pack_rollouts

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "megatron_rl_packer_golden.json"
SETTINGS = ("bin_size", "max_sequences_per_bin", "seq_length_multiple", "dp", "distribution", "pad_id")


def _longpack(case: dict) -> list[dict]:
    packing = pack_rollouts(case["rollouts"], loss_masks=case["masks"], **{k: case[k] for k in SETTINGS})
    return harness.longpack_view(packing)


def test_equals_megatron_lm_recorded_output():
    document = json.loads(GOLDEN.read_text())
    assert document["source"].startswith("NVIDIA/Megatron-LM@")
    assert len(document["cases"]) >= 20
    for number, case in enumerate(document["cases"]):
        assert _longpack(case) == case["ranks"], f"case {number} differs from {document['source']}"


def test_a_changed_fill_fails_the_recorded_comparison():
    """The comparison can fail: packing shortest first (a plausible slip) differs on the recorded cases."""
    document = json.loads(GOLDEN.read_text())
    differs = 0
    for case in document["cases"]:
        order = sorted(range(len(case["rollouts"])), key=lambda i: len(case["rollouts"][i]))
        flipped = {
            **case,
            "rollouts": [case["rollouts"][i] for i in order],
            "masks": [case["masks"][i] for i in order],
        }
        differs += _longpack(flipped) != case["ranks"]
    assert differs > 0


rollout_sets = st.integers(1, 3).flatmap(
    lambda cp_exp: st.tuples(
        st.just(1 if cp_exp == 1 else 2 ** (cp_exp - 1) * 2),
        st.integers(4, 24),
        st.lists(st.integers(1, 96), min_size=1, max_size=30),
        st.integers(1, 4),
        st.integers(1, 5),
        st.sampled_from(["fifo", "round-robin", "balanced"]),
        st.sampled_from(["next_fit_decreasing", "best_fit_decreasing"]),
    )
)


@pytest.mark.skipif(
    harness.source_path() is None, reason="LONGPACK_MEGATRON_LM names no Megatron-LM checkout"
)
@settings(max_examples=60, deadline=None)
@given(drawn=rollout_sets, seed=st.integers(0, 2**16))
def test_equals_megatron_lm_live(drawn, seed):
    multiple, slots, lengths, dp, max_per_bin, distribution, _ = drawn
    if distribution == "balanced":
        distribution = "fifo"
    bin_size = multiple * slots
    lengths = [n for n in lengths if -(-n // multiple) * multiple <= bin_size] or [1]
    rng = np.random.default_rng(seed)
    rollouts = [[int(t) for t in rng.integers(1, 1000, size=n)] for n in lengths]
    masks = [[int(m) for m in rng.integers(0, 2, size=n)] for n in lengths]
    module = harness.load(harness.source_path(), pad_id=0)
    case = {
        "bin_size": bin_size,
        "max_sequences_per_bin": max_per_bin,
        "seq_length_multiple": multiple,
        "dp": dp,
        "distribution": distribution,
        "pad_id": 0,
        "rollouts": rollouts,
        "masks": masks,
    }
    upstream = harness.run_upstream(module, rollouts, masks, **{k: case[k] for k in SETTINGS})
    assert _longpack(case) == upstream


@settings(max_examples=120, deadline=None)
@given(drawn=rollout_sets, seed=st.integers(0, 2**16))
def test_every_rollout_once_in_an_aligned_slot_with_its_values(drawn, seed):
    multiple, slots, lengths, dp, max_per_bin, distribution, fill = drawn
    bin_size = multiple * slots
    lengths = [n for n in lengths if -(-n // multiple) * multiple <= bin_size] or [1]
    rng = np.random.default_rng(seed)
    rollouts = [rng.integers(1, 1000, size=n) for n in lengths]
    masks = [rng.integers(0, 2, size=n) for n in lengths]
    logprobs = [rng.normal(size=n) for n in lengths]
    p = pack_rollouts(
        rollouts,
        loss_masks=masks,
        token_side={"logprobs": logprobs},
        bin_size=bin_size,
        dp=dp,
        max_sequences_per_bin=max_per_bin,
        seq_length_multiple=multiple,
        distribution=distribution,
        fill=fill,
    )
    seen = sorted(i for rank in p.ranks for b in rank.seq_indices for i in b)
    assert seen == list(range(len(lengths)))
    assert len({rank.num_bins for rank in p.ranks}) == 1  # every rank runs the same number of micro-batches
    for r, rank in enumerate(p.ranks):
        assert rank.tokens.shape == (rank.num_bins, bin_size)
        for b, (members, starts) in enumerate(zip(rank.seq_indices, rank.seq_starts, strict=True)):
            assert len(members) <= max_per_bin
            covered = np.zeros(bin_size, dtype=bool)
            for i, s in zip(members, starts, strict=False):
                n = lengths[i]
                assert s % multiple == 0
                assert rank.tokens[b, s : s + n].tolist() == rollouts[i].tolist()
                assert rank.position_ids[b, s : s + n].tolist() == list(range(n))
                assert rank.loss_mask[b, s : s + n].tolist() == masks[i].tolist()
                assert np.allclose(rank.token_side["logprobs"][b, s : s + n], logprobs[i])
                assert p.rank_of_rollout[i] == r and p.bin_of_rollout[i] == b
                covered[s : s + n] = True
            assert not rank.loss_mask[b, ~covered].any()  # nothing trains outside a rollout
            assert rank.cu_seqlens.shape[1] == max_per_bin + 2
            assert rank.cu_seqlens_padded[b, -1] == bin_size
            if members:
                # real lengths, then the bin's tail after the last slot as one ghost sequence
                tail = bin_size - starts[-1]
                assert np.diff(rank.cu_seqlens[b])[: len(members) + 1].tolist() == [
                    *(lengths[i] for i in members),
                    tail,
                ]
                assert rank.cu_seqlens_padded[b, : len(members) + 2].tolist() == [*starts, bin_size]
            # the CP split gives every column of the bin to exactly one CP rank
            cp = multiple // 2 if multiple > 1 else 1
            columns = np.concatenate([rank.cp_indices(b, cp, c) for c in range(cp)])
            assert sorted(columns.tolist()) == list(range(bin_size))
        unpacked = p.unpack(r, rank.token_side["logprobs"])
        for i, values in unpacked.items():
            assert np.allclose(values, logprobs[i])
    bins = [[lengths[i] for i in b] for rank in p.ranks for b in rank.seq_indices if b]
    empty = sum(1 for rank in p.ranks for b in rank.seq_indices if not b)
    expected = sum(p.cost_model.pack_cost(b) for b in bins) + empty * p.cost_model.pack_cost([bin_size])
    assert np.isclose(sum(p.rank_costs), expected)


@settings(max_examples=100, deadline=None)
@given(drawn=rollout_sets)
def test_balanced_is_never_busier_than_megatrons_orders(drawn):
    multiple, slots, lengths, dp, max_per_bin, _, fill = drawn
    bin_size = multiple * slots
    lengths = [n for n in lengths if -(-n // multiple) * multiple <= bin_size] or [1]
    rollouts = [np.ones(n, dtype=np.int64) for n in lengths]
    common = {
        "bin_size": bin_size,
        "dp": dp,
        "max_sequences_per_bin": max_per_bin,
        "seq_length_multiple": multiple,
    }
    by = {
        d: pack_rollouts(rollouts, distribution=d, fill=fill, **common)
        for d in ("fifo", "round-robin", "balanced")
    }
    busiest = {d: max(p.rank_costs) for d, p in by.items()}
    assert busiest["balanced"] <= min(busiest["fifo"], busiest["round-robin"]) * (1 + 1e-12)


def test_balanced_evens_out_work_that_fifo_leaves_uneven():
    """One long rollout per bin at the front, short ones behind: FIFO gives DP rank 0 all the long ones."""
    lengths = [4000] * 4 + [300] * 52
    rollouts = [np.ones(n, dtype=np.int64) for n in lengths]
    model = PackCostModel(linear=1.0, quadratic=1 / 512)
    fifo = pack_rollouts(rollouts, bin_size=4096, dp=4, cost_model=model)
    even = pack_rollouts(rollouts, bin_size=4096, dp=4, cost_model=model, distribution="balanced")
    assert fifo.imbalance > 1.5
    assert even.imbalance < 1.1
    assert sorted(even.lengths.tolist()) == sorted(lengths)


def test_default_alignment_is_pad_seq_to_mult_and_megatron_2cp_when_given():
    p = pack_rollouts([[1] * 5], bin_size=32, tp=2, cp=2, sp=True)
    assert p.seq_length_multiple == 4  # lcm(2*CP=4, CP*TP=4)
    p = pack_rollouts([[1] * 5], bin_size=48, tp=4, cp=2, sp=True)
    assert p.seq_length_multiple == 8
    assert (
        pack_rollouts([[1] * 5], bin_size=48, tp=4, cp=2, sp=True, seq_length_multiple=4).seq_length_multiple
        == 4
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token_ids": [[1] * 9], "bin_size": 8}, "rollout 0 needs a slot of 9"),
        ({"token_ids": [[1] * 5], "bin_size": 4, "cp": 2}, "rollout 0 needs a slot of 8"),
        ({"token_ids": [[]], "bin_size": 8}, "rollout 0 is empty"),
        ({"token_ids": [], "bin_size": 8}, "no rollouts"),
        ({"token_ids": [[1.5]], "bin_size": 8}, "integer token ids"),
        ({"token_ids": [[1]], "bin_size": 6, "cp": 2}, "not a multiple of seq_length_multiple 4"),
        ({"token_ids": [[1]], "bin_size": 8, "distribution": "lpt"}, "distribution must be one of"),
        ({"token_ids": [[1, 2]], "bin_size": 8, "loss_masks": [[1]]}, "loss_masks[0] has shape (1,)"),
        ({"token_ids": [[1]], "bin_size": 0}, "bin_size must be a positive integer"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, message):
    token_ids = kwargs.pop("token_ids")
    with pytest.raises(RolloutPackingError) as info:
        pack_rollouts(token_ids, **kwargs)
    assert message in str(info.value)


def test_balanced_on_the_planners_step_time_model():
    """The planner's seconds (``pack_cost_model``, the model plan / sweep / balance use) as the bin cost: the
    balanced order evens out the predicted seconds that FIFO leaves uneven, and reports them."""
    from longpack.planner.balance_costs import pack_cost_model

    seconds = pack_cost_model(model="qwen3_8b", gpu="H100_SXM", cp=2, seq_length=16384)
    lengths = [16000] * 8 + [500] * 248
    rollouts = [np.ones(n, dtype=np.int64) for n in lengths]
    common = {"bin_size": 16384, "dp": 8, "seq_length_multiple": 4, "cost_model": seconds}
    fifo = pack_rollouts(rollouts, **common)
    even = pack_rollouts(rollouts, distribution="balanced", **common)
    assert fifo.imbalance > 1.2 and even.imbalance < 1.01
    for packing in (fifo, even):  # each rank's cost is the planner's seconds of its bins (empty: a ghost)
        for rank, cost in zip(packing.ranks, packing.rank_costs, strict=True):
            want = sum(seconds.pack_cost([lengths[i] for i in b] or [16384]) for b in rank.seq_indices)
            assert cost == pytest.approx(want, rel=1e-12)


def test_fp8_needs_every_ranks_share_of_a_bin_a_multiple_of_the_block():
    from longpack.balance.rollouts import RolloutPackingError
    from longpack.errors import ConfigError
    from longpack.jobs import RolloutsConfig

    rollouts = [np.ones(100, dtype=np.int64)] * 3
    ok = pack_rollouts(rollouts, bin_size=512, cp=2, sp=True, tp=2, fp8_recipe="mxfp8")  # 512 / 2 / 2 = 128
    assert ok.ranks[0].tokens.shape == (1, 512)
    with pytest.raises(
        RolloutPackingError, match=r"bin_size a multiple of 128 \(CP 2, TP 2, SP on\); 320 is not"
    ):
        pack_rollouts(rollouts, bin_size=320, cp=2, sp=True, tp=2, fp8_recipe="mxfp8")
    pack_rollouts(rollouts, bin_size=320, cp=2, sp=True, tp=2)  # without FP8 the CP / SP alignment (4) is all
    with pytest.raises(ConfigError, match="multiple of 32"):  # FP8 16 tokens per rank, CP 2
        RolloutsConfig(lengths_file="x.txt", bin_size=16400, cp=2, fp8_recipe="delayed")


@settings(max_examples=40, deadline=None)
@given(
    cp=st.sampled_from([2, 4]),
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=12),
    dp=st.integers(1, 3),
)
def test_cp_split_is_the_runtime_thd_split_of_the_bins_padded_offsets(cp, lengths, dp):
    """Megatron-LM's RL path hands each bin's ``cu_seqlens_q_padded`` and width to TE's
    ``thd_get_partitioned_indices`` (``rl_utils._build_cp_scatter_cache``); ``cp_indices`` is
    ``longpack.runtime``'s statement of that kernel (the split verify's CP checks run) on the same arrays."""
    torch = pytest.importorskip("torch")
    from longpack.runtime.context_parallel import thd_partition_indices

    bin_size = 64 * cp
    p = pack_rollouts([np.ones(n, dtype=np.int64) for n in lengths], bin_size=bin_size, dp=dp, cp=cp)
    for rank in p.ranks:
        for b in range(rank.tokens.shape[0]):
            padded = rank.cu_seqlens_padded[b].tolist()
            columns = [rank.cp_indices(b, cp_size=cp, cp_rank=r) for r in range(cp)]
            for r, mine in enumerate(columns):
                te = thd_partition_indices(padded, bin_size, cp_size=cp, cp_rank=r)
                assert torch.equal(torch.from_numpy(mine.astype(np.int64)), te.to(torch.int64))
            assert sorted(np.concatenate(columns).tolist()) == list(range(bin_size))
