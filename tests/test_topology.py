import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longpack.topology import ParallelLayout, TopologyError, pad_seq_to_mult


@pytest.mark.parametrize(
    ("tp", "cp", "sp", "expected"),
    [
        (1, 1, False, 1),
        (1, 2, False, 4),
        (1, 4, False, 8),
        (4, 1, True, 4),
        (4, 1, False, 1),
        (4, 2, True, 8),  # Bridge test: cp=2, tp=4, SP -> lcm(4, 8) = 8
        (2, 8, True, 16),
        (8, 1, True, 8),
    ],
)
def test_pad_seq_to_mult_matches_bridge_formula(tp: int, cp: int, sp: bool, expected: int) -> None:
    assert pad_seq_to_mult(tp=tp, cp=cp, sp=sp) == expected


@given(tp=st.integers(1, 16), cp=st.integers(1, 16), sp=st.booleans())
def test_pad_seq_to_mult_is_divisible_by_both_requirements(tp: int, cp: int, sp: bool) -> None:
    m = pad_seq_to_mult(tp=tp, cp=cp, sp=sp)
    if cp > 1:
        assert m % (2 * cp) == 0
    if sp and tp > 1:
        assert m % (cp * tp) == 0
    assert m == math.lcm(2 * cp if cp > 1 else 1, cp * tp if sp and tp > 1 else 1)


def test_layout_dp_and_edp() -> None:
    layout = ParallelLayout(world_size=64, tp=2, cp=4, pp=2, ep=8, sp=True)
    assert layout.dp == 4
    assert layout.expert_tp == 2
    assert layout.edp == 2
    assert layout.pad_seq_to_mult == 8


def test_layout_rejects_non_dividing_sizes_with_the_numbers() -> None:
    with pytest.raises(TopologyError, match=r"TP\*CP\*PP = 3\*1\*1 = 3"):
        ParallelLayout(world_size=8, tp=3)
    with pytest.raises(TopologyError, match="ETP\\*EP\\*PP"):
        ParallelLayout(world_size=8, ep=16)
    with pytest.raises(TopologyError, match="vpp"):
        ParallelLayout(world_size=8, vpp=2)
    with pytest.raises(TopologyError, match="tp must be a positive integer"):
        ParallelLayout(world_size=8, tp=0)


# --- pipeline layouts --------------------------------------------------------------------------------

from longpack.rules import suggest_layout  # noqa: E402
from longpack.topology import collate_pad_multiple, parse_pipeline_layout, pipeline_split  # noqa: E402


def test_megatron_doc_layout_dsv3_pp16_vpp2() -> None:
    # Megatron-LM docs: DeepSeek-V3 (61 layers + 1 MTP) on PP16 VPP2 with "Et*3|(tt|)*29,m|L".
    split = pipeline_split(num_layers=61, pp=16, mtp_num_layers=1, layout="Et*3|(tt|)*29,m|L")
    assert split.vpp == 2 and split.method == "layout"
    assert split.decoder[0] == (3, 2)  # PP rank 0: embedding + 3 layers, then 2 layers
    assert split.decoder[14] == (2, 0) and split.mtp[14] == (0, 1)  # PP rank 14 holds the MTP layer
    assert split.decoder[15] == (2, 0)  # PP rank 15: 2 layers, then the loss
    assert sum(map(sum, split.decoder)) == 61


def test_layout_errors_name_the_problem() -> None:
    with pytest.raises(TopologyError, match="33 stages, not divisible by PP=8"):
        pipeline_split(num_layers=61, pp=8, mtp_num_layers=1, layout="Et|(tt|)*30m|L")
    with pytest.raises(TopologyError, match="VPP to 4"):
        pipeline_split(num_layers=61, pp=8, vpp=2, mtp_num_layers=1, layout="Et|(tt|)*30mL")
    with pytest.raises(TopologyError, match="places 0 MTP layers"):
        pipeline_split(num_layers=61, pp=8, mtp_num_layers=1, layout="Et|(tt|)*30L")
    with pytest.raises(TopologyError, match="must start with exactly one 'E'"):
        pipeline_split(num_layers=2, pp=2, layout="t|tL")


def test_first_last_and_account_for_splits() -> None:
    split = pipeline_split(num_layers=61, pp=8, first_stage_layers=5, last_stage_layers=2)
    assert [row[0] for row in split.decoder] == [5, 9, 9, 9, 9, 9, 9, 2]
    with pytest.raises(TopologyError, match="not divisible by VPP=2"):
        pipeline_split(num_layers=61, pp=8, vpp=2, first_stage_layers=5)
    split = pipeline_split(num_layers=94, pp=4, vpp=12, account_for_embedding=True, account_for_loss=True)
    assert split.decoder[0][0] == 1 and split.decoder[3][11] == 1
    assert sum(map(sum, split.decoder)) == 94


def test_collate_pad_multiple_over_eval_cp() -> None:
    assert collate_pad_multiple(tp=2, cp_sizes=(2, 4), sp=True) == 8
    assert collate_pad_multiple(tp=1, cp_sizes=(2, 3)) == 12


@given(
    num_layers=st.integers(1, 130),
    pp=st.integers(1, 16),
    vpp=st.integers(1, 6),
    mtp=st.integers(0, 2),
)
def test_suggested_layout_is_valid(num_layers: int, pp: int, vpp: int, mtp: int) -> None:
    text = suggest_layout(num_layers, pp, vpp, mtp)
    split = pipeline_split(num_layers=num_layers, pp=pp, vpp=vpp, mtp_num_layers=mtp, layout=text)
    assert split.vpp == vpp
    assert sum(map(sum, split.decoder)) == num_layers
    assert len(parse_pipeline_layout(text)) == pp * vpp


@given(stages=st.lists(st.lists(st.sampled_from("tm"), max_size=4).map("".join), min_size=1, max_size=12))
def test_layout_repetition_grammar_matches_expanded_form(stages: list[str]) -> None:
    expanded = "E" + "|".join(stages) + "L"
    grouped = "E" + "|".join(f"({s})*1" if s else s for s in stages) + "L"
    assert parse_pipeline_layout(grouped) == parse_pipeline_layout(expanded)


def test_bridge_llama3_70b_perf_layout() -> None:
    # Megatron-Bridge perf recipe llama3_70b_pretrain_64gpu_h100 (longpack/data/calibration_points.yaml):
    # PP8 VPP5 with "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL" for 80 layers.
    split = pipeline_split(num_layers=80, pp=8, vpp=5, layout="Et*2|(t*2|)*34,t*3|(t*2|)*3,tL")
    assert split.vpp == 5 and sum(map(sum, split.decoder)) == 80
    assert split.max_layers_per_stage == 3


@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    cp=st.sampled_from([1, 2, 4, 16, 32]),
    sp=st.booleans(),
    recipe=st.sampled_from([None, "mxfp8", "delayed", "tensorwise"]),
    hybridep=st.booleans(),
)
def test_kernel_pad_multiple_holds_every_requirement_and_no_more(tp, cp, sp, recipe, hybridep) -> None:
    import math

    from longpack.topology import HYBRIDEP_CHUNK, MXFP8_BLOCK, kernel_pad_multiple, pad_seq_to_mult

    m = kernel_pad_multiple(tp=tp, cp=cp, sp=sp, fp8_recipe=recipe, hybridep=hybridep)
    needs = [pad_seq_to_mult(tp=tp, cp=cp, sp=sp)]
    if recipe:
        per_rank = cp * (tp if sp else 1)
        needs.append((MXFP8_BLOCK if recipe == "mxfp8" else 16) * per_rank)
        # every rank's share of a row of m tokens is a whole number of FP8 blocks
        assert (m // per_rank) % (MXFP8_BLOCK if recipe == "mxfp8" else 16) == 0
    if hybridep:
        needs.append(HYBRIDEP_CHUNK)
    assert all(m % n == 0 for n in needs) and m == math.lcm(*needs)


def test_topology_prints_the_kernel_multiple_only_when_asked() -> None:
    from longpack.jobs import TopologyConfig

    plain = TopologyConfig(gpus=16, tp=2, cp=2, sp=True).run().to_dict()
    assert "kernel_pad_multiple" not in plain
    mx = TopologyConfig(gpus=16, tp=2, cp=2, sp=True, fp8_recipe="mxfp8", hybridep=True).run().to_dict()
    assert mx["pad_seq_to_mult"] == 4 and mx["kernel_pad_multiple"] == 128
