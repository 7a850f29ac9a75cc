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
