"""Hostile values for the Python APIs: every config either constructs or raises ``LongpackError`` naming
the field; nothing else escapes (no TypeError from comparing a string with 0, no ZeroDivisionError)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_helpers import deadline, examples
from longpack.errors import LongpackError
from longpack.topology import (
    MAX_LAYOUT_TEXT,
    ParallelLayout,
    TopologyError,
    parse_pipeline_layout,
    pipeline_split,
)

HOSTILE_VALUES = [
    0,
    -1,
    1,
    2**70,
    -(2**70),
    True,
    False,
    None,
    1.5,
    2.0,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "8",
    "abc",
    "\x00",
    [],
    [0],
    {},
    {"a": 1},
    (),
    object(),
    b"bytes",
]
hostile = st.sampled_from(HOSTILE_VALUES)


def _constructs_or_refuses(build, field: str, value: Any) -> Any:
    """``build()`` succeeds or raises a LongpackError; a refusal of ``field`` names it."""
    with deadline(30):
        try:
            return build()
        except LongpackError as exc:
            text = str(exc)
            assert text and "Traceback" not in text
            return exc


PACK_FIELDS = [
    "seq_length",
    "pack_size",
    "pad_seq_to_mult",
    "tp",
    "cp",
    "sp",
    "algorithm",
    "seed",
    "overlength",
    "val_fraction",
    "rows_per_shard",
    "overwrite",
    "ids_dtype",
    "backend",
    "workers",
    "demo",
    "progress",
    "balance",
    "out",
    "inputs",
    "val_inputs",
    "text",
    "tokenizer",
]


@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(PACK_FIELDS), value=hostile)
def test_pack_config(world, field: str, value: Any) -> None:
    from longpack.jobs import PackConfig

    kwargs = {
        "inputs": [str(world.good)],
        "out": str(world.root / "never"),
        "tokenizer": "bytes",
        "seq_length": 64,
    }
    kwargs[field] = value
    _constructs_or_refuses(lambda: PackConfig(**kwargs), field, value)


def test_pack_config_zero_sizes_are_refused_not_defaulted() -> None:
    from longpack.jobs import PackConfig

    for field in ("seq_length", "pack_size", "pad_seq_to_mult", "tp", "cp", "rows_per_shard", "workers"):
        with pytest.raises(LongpackError, match=field):
            PackConfig(
                **{"inputs": ["x.jsonl"], "out": "o", "tokenizer": "bytes", "seq_length": 64, field: 0}
            )


def test_pack_config_runs_with_hostile_but_valid_values(world, tmp_path: Path) -> None:
    """numpy integers and Path objects are fine, and the result accounts for every row."""
    import numpy as np

    from longpack.jobs import PackConfig

    result = PackConfig(
        inputs=[world.good], out=tmp_path / "o", tokenizer="bytes", seq_length=np.int64(64), seed=np.int32(3)
    ).run()
    c = result.counts
    assert c["packed"] + c["dropped"] + c["malformed"] == c["rows_read"] == 40


SWEEP_FIELDS = [
    "pack_lengths",
    "token_slots",
    "pad_seq_to_mult",
    "tp",
    "cp",
    "sp",
    "layout",
    "algorithm",
    "seed",
    "overlength",
    "workers",
    "gpus",
    "headroom",
    "offload",
    "progress",
    "demo",
    "cp_modes",
    "store",
]


@settings(
    max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(SWEEP_FIELDS), value=hostile)
def test_sweep_config(world, field: str, value: Any) -> None:
    from longpack.jobs import SweepConfig

    kwargs: dict[str, Any] = {"inputs": [str(world.good)], "tokenizer": "bytes", "pack_lengths": "64,128"}
    kwargs[field] = value
    _constructs_or_refuses(lambda: SweepConfig(**kwargs), field, value)


CHECK_FIELDS = ["config", "overrides", "gpus", "model", "dataset_kind", "packed"]


@settings(
    max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(CHECK_FIELDS), value=hostile)
def test_check_config(world, field: str, value: Any) -> None:
    from longpack.jobs import CheckConfig

    kwargs: dict[str, Any] = {"overrides": ("model.seq_length=4096",), field: value}
    if field == "overrides" and isinstance(value, str):
        kwargs[field] = (value,)
    _constructs_or_refuses(lambda: CheckConfig(**kwargs).run(), field, value)


# Fields whose zero / non-finite values the planner's own issue settles (see tests/hostile/test_hostile_cli.py).
PLAN_FIELDS = [
    "model",
    "gpu",
    "precision",
    "dispatcher",
    "recompute",
    "optimizer",
    "top",
    "headroom",
    "data",
    "tokenizer",
    "max_seqlen_per_dp_cp_rank",
]


@settings(
    max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(PLAN_FIELDS), value=hostile)
def test_plan_config(field: str, value: Any) -> None:
    from longpack.jobs import PlanConfig

    kwargs: dict[str, Any] = {
        "model": "qwen3_8b",
        "gpu": "H100_SXM",
        "gpus": 8,
        "seq_length": 4096,
        field: value,
    }
    _constructs_or_refuses(lambda: PlanConfig(**kwargs), field, value)


ONLINE_SIM_FIELDS = [
    "vlm",
    "vlm_family",
    "tokenizer",
    "loader_workers",
    "patch_size",
    "max_images",
    "video_fps",
    "write_lengths",
    "buffer_sizes",
]


@settings(
    max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(ONLINE_SIM_FIELDS), value=hostile, with_vlm=st.booleans())
def test_online_sim_config(world, field: str, value: Any, with_vlm: bool) -> None:
    """With and without ``vlm``: a VLM-only value without it is refused naming the field, never ignored."""
    from longpack.jobs import OnlineSimConfig

    kwargs: dict[str, Any] = {
        "pack_size": 4096,
        **({"vlm": str(world.good)} if with_vlm else {}),
        field: value,
    }
    _constructs_or_refuses(lambda: OnlineSimConfig(**kwargs), field, value)


@pytest.mark.parametrize(
    "field",
    [
        "tp",
        "cp",
        "pp",
        "ep",
        "mbs",
        "gbs",
        "imbalance",
        "headroom",
        "gpus",
        "seq_length",
    ],
)
def test_plan_config_sizes(field: str) -> None:
    from longpack.jobs import PlanConfig

    for value in (0, -1, math.nan, True, "8"):
        kwargs: dict[str, Any] = {"model": "qwen3_8b", "gpu": "H100_SXM", "gpus": 8, "seq_length": 4096}
        kwargs[field] = value
        with deadline(20):
            try:
                PlanConfig(**kwargs).run()
            except LongpackError:
                continue
        pytest.fail(f"PlanConfig({field}={value!r}) was accepted")


LAYOUT_FIELDS = ["world_size", "tp", "cp", "pp", "vpp", "ep", "etp", "sp"]


@settings(max_examples=examples(120), deadline=None)
@given(field=st.sampled_from(LAYOUT_FIELDS), value=hostile)
def test_parallel_layout(field: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"world_size": 16, field: value}
    result = _constructs_or_refuses(lambda: ParallelLayout(**kwargs), field, value)
    if isinstance(result, ParallelLayout):
        assert all(isinstance(getattr(result, f), int) for f in ("world_size", "tp", "cp", "pp", "ep"))
        assert result.dp >= 1 and result.pad_seq_to_mult >= 1


@settings(max_examples=examples(200), deadline=None)
@given(text=st.text(alphabet="Etm L|()*,0123456789x", max_size=80))
def test_layout_strings_parse_or_are_refused_quickly(text: str) -> None:
    start = time.perf_counter()
    with deadline(10):
        try:
            stages = parse_pipeline_layout(text)
        except TopologyError as exc:
            assert len(str(exc)) < 400  # a long layout is cut in the message
        else:
            assert sum(map(len, stages)) <= 100_000
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize(
    "layout",
    [
        "Et*99999999999|L",
        "E" + "(" * 40 + "t" + ")*2" * 40 + "L",
        "E(((t*99)*99)*99)*99L",
        "Et*" + "9" * 5000 + "L",
        "E" + "t" * (MAX_LAYOUT_TEXT + 1) + "L",
        [["embedding"]] * 200_000,
        [["decoder"] * 200_000],
        "not a layout",
        42,
        [[1, 2]],
        ["Et", "L"],
    ],
    ids=lambda v: repr(v)[:30],
)
def test_pathological_layouts_are_refused(layout: Any) -> None:
    with deadline(10), pytest.raises(TopologyError):
        pipeline_split(num_layers=4, pp=2, layout=layout)


@pytest.mark.parametrize(
    "spec",
    ["", "/", "/nonexistent/*.parquet", "**", "[", "x" * 5000, "\x00", "*.idx.parquet"],
    ids=lambda v: repr(v)[:20],
)
def test_packed_folder_open_on_hostile_specs(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from longpack.packed import PackedFolder

    monkeypatch.chdir(tmp_path)
    with deadline(20), pytest.raises(LongpackError):
        PackedFolder.open(spec)


# -- the online packer ---------------------------------------------------------


@pytest.mark.parametrize("mask", [[0, 2, 1], [0, 300, 1], [0, -1, 1], [0.5, 1, 1]])
def test_online_packer_refuses_mask_values_other_than_0_and_1(mask: list) -> None:
    pytest.importorskip("torch")
    from longpack.online.packer import OnlinePacker

    packer = OnlinePacker(16, 2, algorithm="first_fit_decreasing")
    with pytest.raises(LongpackError, match="loss_mask"):
        list(packer.rows([{"input_ids": [5, 6, 7], "loss_mask": mask}]))


@pytest.mark.parametrize("ids", [[5.5, 6.0, 7.0], [-1, 2, 3], ["a", "b", "c"]])
def test_online_packer_refuses_non_integer_or_negative_ids(ids: list) -> None:
    pytest.importorskip("torch")
    from longpack.online.packer import OnlinePacker

    packer = OnlinePacker(16, 2, algorithm="first_fit_decreasing")
    with pytest.raises(LongpackError, match="input_ids"):
        list(packer.rows([{"input_ids": ids}]))


def test_online_packer_refuses_a_second_stream_unless_reset() -> None:
    pytest.importorskip("torch")
    from longpack.online.packer import OnlinePacker

    packer = OnlinePacker(8, 2, algorithm="first_fit_decreasing")
    first = [x.sample_index.tolist() for x in packer.pack([3, 4, 5])]
    assert sum(map(len, first)) == 3
    with pytest.raises(LongpackError):
        list(packer.pack([3, 4, 5]))


@settings(max_examples=examples(60), deadline=None)
@given(
    field=st.sampled_from(
        ["capacity", "buffer_size", "pad_to_multiple_of", "seed", "algorithm", "overlength", "pad_id"]
    ),
    value=hostile,
)
def test_online_packer_constructor(field: str, value: Any) -> None:
    pytest.importorskip("torch")
    from longpack.online.packer import OnlinePacker

    kwargs: dict[str, Any] = {"capacity": 16, "buffer_size": 4, field: value}
    capacity, buffer_size = kwargs.pop("capacity"), kwargs.pop("buffer_size")
    _constructs_or_refuses(lambda: OnlinePacker(capacity, buffer_size, **kwargs), field, value)


@pytest.mark.parametrize("field", ["prefetch", "cache_bytes"])
@pytest.mark.parametrize("value", [-1, 1.5, True, "8", None])
def test_packed_dataset_reader_settings(world, field: str, value: Any) -> None:
    pytest.importorskip("torch")
    from longpack.runtime.dataset import PackedDataset

    with pytest.raises(LongpackError, match=field):
        PackedDataset(world.packed, split="training", **{field: value})


def test_an_unknown_kernel_choice_in_the_environment_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hostile_helpers import assert_clean, run_subprocess

    src = tmp_path / "d.jsonl"
    src.write_text('{"prompt": "a", "completion": "b"}\n')
    monkeypatch.setenv("LONGPACK_KERNELS", "bogus")  # read once per process: a fresh one
    outcome = assert_clean(
        run_subprocess(["pack", src, "--out", tmp_path / "o", "--tokenizer", "bytes", "--seq-length", "64"])
    )
    assert outcome.exit_code == 2 and "LONGPACK_KERNELS='bogus'" in outcome.output, str(outcome)
