"""Property tests: the rules agree with the topology arithmetic, and the packed scan with a plain scan."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from longpack.rules import run_rules, setup_from_mapping
from longpack.rules.packed_data import inspect_packed_dir
from longpack.topology import ParallelLayout, TopologyError

sizes = st.sampled_from([1, 2, 3, 4, 8, 16])


@given(world=st.integers(1, 512), tp=sizes, cp=sizes, pp=sizes, ep=sizes, etp=st.sampled_from([None, 1, 2]))
def test_topology_rules_fire_iff_the_layout_is_impossible(
    world: int, tp: int, cp: int, pp: int, ep: int, etp: int | None
) -> None:
    model = {
        "tensor_model_parallel_size": tp,
        "context_parallel_size": cp,
        "pipeline_model_parallel_size": pp,
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": etp,
        "num_moe_experts": 64,
    }
    setup = setup_from_mapping({"model": model, "longpack": {"world_size": world}}).setup
    fired = {f.rule_id for f in run_rules(setup)} & {"LP-TOPO-001", "LP-TOPO-002"}
    try:
        ParallelLayout(world_size=world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
        possible = True
    except TopologyError:
        possible = False
    assert possible == (not fired)
    assert (setup.layout is not None) == possible


def _reference_scan(folder: Path, multiple: int) -> tuple[int, int, int]:
    bad = segments = rows = 0
    for file in sorted(folder.glob("*.parquet")):
        table = pq.read_table(file)
        for ids, starts in zip(
            table.column("input_ids").to_pylist(), table.column("seq_start_id").to_pylist(), strict=True
        ):
            rows += 1
            for a, b in itertools.pairwise([*starts, len(ids)]):
                segments += 1
                bad += (b - a - 1) % multiple != 0
    return rows, segments, bad


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=5), min_size=1, max_size=30),
    multiple=st.sampled_from([1, 2, 4, 8]),
    files=st.integers(1, 3),
)
def test_packed_scan_matches_plain_scan(rows: list[list[int]], multiple: int, files: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for f in range(files):
            part = rows[f::files] or rows[:1]
            ids, starts, masks = [], [], []
            for segs in part:
                row_starts = list(itertools.accumulate([0, *segs[:-1]]))
                ids.append([5] * sum(segs))
                masks.append([1] * sum(segs))
                starts.append(row_starts)
            pq.write_table(
                pa.table(
                    {
                        "input_ids": ids,
                        "loss_mask": pa.array(masks, type=pa.list_(pa.int8())),
                        "seq_start_id": starts,
                    }
                ),
                folder / f"training_{f}_64.idx.parquet",
                row_group_size=3,
            )
        summary = inspect_packed_dir(f"{folder}/*.parquet", multiple=multiple)
        assert (summary.rows, summary.segments, summary.misaligned_segments) == _reference_scan(
            folder, multiple
        )
        assert (summary.first_misaligned is None) == (summary.misaligned_segments == 0)
