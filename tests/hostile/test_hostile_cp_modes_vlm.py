"""Hostile input to what issue 29 and issue 25 added: ``sweep --cp-modes``, ``plan --data`` and
``online-sim --vlm-family``, from the CLI and from Python.

Each refusal is exit 2 with a message that names the option and the fix; nothing is dropped or ignored
silently (a sample left out of ``plan --data``'s packs is counted; a VLM-only option without ``--vlm`` is
refused); every number printed for a mode Megatron's scheduler refuses is absent, with the reason beside it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hostile_helpers import assert_clean, invoke
from longpack.errors import LongpackError

PLANNER = ["--model", "llama3_1_8b", "--gpu", "H100_SXM", "--gpus", "8"]
SWEEP = ["sweep", "--tokenizer", "bytes", "--pack-size", "4k,8k", "--cp-modes"]
PLAN = ["plan", *PLANNER, "--seq-length", "4096"]


def _rows(path: Path, lengths: list[int]) -> Path:
    path.write_text("".join(json.dumps({"prompt": "p" * n, "completion": "c"}) + "\n" for n in lengths))
    return path


def _json(outcome: Any) -> dict[str, Any]:
    return json.loads(outcome.output[outcome.output.index("{") :])


# -- sweep --cp-modes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "planner", [[], ["--model", "llama3_1_8b"], ["--model", "llama3_1_8b", "--gpu", "H100_SXM"]]
)
def test_sweep_cp_modes_without_the_planner_names_the_three_options(world, planner: list[str]) -> None:
    outcome = assert_clean(invoke([*SWEEP, world.good, *planner]), frozenset({2}))
    assert all(flag in outcome.output for flag in ("--model", "--gpu", "--gpus")), str(outcome)


def test_sweep_cp_modes_with_a_pipeline_layout_says_why_only_static_is_timed(world) -> None:
    outcome = assert_clean(invoke([*SWEEP, world.good, *PLANNER, "--layout", "tp=1,pp=2", "--json"]))
    for cand in _json(outcome)["candidates"]:
        if cand.get("cp_modes") is None:
            continue
        static, *others = cand.get("cp_modes")["modes"]
        assert static["mode"] == "static" and static["step_time_s"] is not None
        for cell in others:  # no time for a mode Megatron-LM refuses under PP, and the reason
            assert cell["step_time_s"] is None and cell["speedup_over_static"] is None
            assert "pipeline" in cell["note"] and "pp=1" in cell["note"]
        assert cand.get("cp_modes")["recommended"]["mode"] == "static"


@pytest.mark.parametrize("cp", ["1", "2"])
def test_sweep_cp_modes_on_one_sample_reports_the_refused_scheduler(tmp_path: Path, cp: str) -> None:
    """One sample cannot fill a DP group: Megatron's DP-balanced scheduler refuses every batch. The cell has
    no time, its note says why, and the table says the candidate fits in memory but cannot run."""
    data = _rows(tmp_path / "one.jsonl", [40])
    argv = [*SWEEP, data, *PLANNER, "--cp", cp]
    doc = _json(assert_clean(invoke([*argv, "--json"]), frozenset({1})))
    assert doc["recommendation"] is None
    refused = [
        cell
        for cand in doc["candidates"]
        if cand.get("cp_modes") is not None
        for cell in cand.get("cp_modes")["modes"]
        if cell["mode"] == "dp_balanced" and cell["step_time_s"] is None
    ]
    assert refused, doc
    for cell in refused:  # no figure for what was not timed, and the reason
        assert cell["note"] and cell["real_tokens_per_s"] is None and cell["speedup_over_static"] is None
        assert cell["max_seqlen_per_dp_cp_rank"] is None and cell["rank_imbalance"] is None
    text = assert_clean(invoke(argv), frozenset({1})).output
    assert "yes, see below" in text and "fewer than GBS" in text, text
    assert "No pack length can be recommended" in text and "No candidate fits" not in text, text


# -- plan --data ----------------------------------------------------------------------------------------


def test_plan_data_on_an_empty_folder_names_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    outcome = assert_clean(invoke([*PLAN, "--data", empty, "--tokenizer", "bytes"]), frozenset({2}))
    assert "empty" in outcome.output and "holds no" in outcome.output, str(outcome)


@pytest.mark.parametrize("tokenizer", [[], ["--tokenizer", "bytes"]], ids=["no-tokenizer", "tokenizer"])
def test_plan_data_on_a_missing_path_says_it_does_not_exist(tmp_path: Path, tokenizer: list[str]) -> None:
    """Not 'give a --tokenizer': the path is what is wrong."""
    missing = tmp_path / "nowhere.jsonl"
    outcome = assert_clean(invoke([*PLAN, "--data", missing, *tokenizer]), frozenset({2}))
    assert "nowhere.jsonl" in outcome.output and "exists" in outcome.output, str(outcome)
    assert "--tokenizer" not in outcome.output, str(outcome)


def test_plan_data_longer_than_the_pack_names_the_longest_sample(tmp_path: Path) -> None:
    data = _rows(tmp_path / "long.jsonl", [5000, 6000])
    outcome = assert_clean(invoke([*PLAN, "--data", data, "--tokenizer", "bytes"]), frozenset({2}))
    text = outcome.output
    assert "--seq-length 4096" in text and "runtime length is 6001 tokens" in text, str(outcome)
    assert "--overlength" not in text, str(outcome)  # plan has no such option


def test_plan_data_counts_the_samples_it_drops(tmp_path: Path) -> None:
    data = _rows(tmp_path / "mixed.jsonl", [100, 300, 900, 5000, 6000])
    outcome = assert_clean(invoke([*PLAN, "--data", data, "--tokenizer", "bytes", "--json"]), frozenset({0}))
    modes = _json(outcome)["cp_modes"]
    assert (modes["samples"], modes["samples_dropped"]) == (5, 2)
    text = assert_clean(invoke([*PLAN, "--data", data, "--tokenizer", "bytes"])).output
    assert "5 samples from inputs, 2 of them dropped" in text, text


def test_plan_data_from_a_store_of_one_sample_says_why_a_mode_is_infeasible(tmp_path: Path) -> None:
    data = _rows(tmp_path / "one.jsonl", [40])
    store = tmp_path / "store"
    assert_clean(invoke(["tokenize", data, "--out", store, "--tokenizer", "bytes"]), frozenset({0}))
    outcome = assert_clean(invoke([*PLAN, "--data", store]), frozenset({0}))
    assert "(1 sample from token store; 1 of 1 step simulated)" in outcome.output, str(outcome)
    # one sample cannot fill a DP group: refused at every cap, the reason printed once with the caps
    assert re.search(
        r"dp_balanced infeasible at max_seqlen_per_dp_cp_rank \d+, \d+, \d+: 1 samples", outcome.output
    ), str(outcome)


def test_plan_tokenizer_without_data_is_refused() -> None:
    outcome = assert_clean(invoke([*PLAN, "--tokenizer", "bytes"]), frozenset({2}))
    assert "--tokenizer" in outcome.output and "--data" in outcome.output, str(outcome)


@pytest.mark.parametrize("data", [42, ["a.jsonl", "b.jsonl"], "", "  ", b"x.jsonl", 1.5])
def test_plan_config_data_of_a_wrong_type_is_refused(data: Any) -> None:
    from longpack.jobs import PlanConfig

    with pytest.raises(LongpackError, match="data"):
        PlanConfig(model="qwen3_8b", gpu="H100_SXM", gpus=8, seq_length=4096, data=data, tokenizer="bytes")


def test_plan_config_numpy_cap_is_made_plain(world) -> None:
    from longpack.jobs import PlanConfig

    config = PlanConfig(
        model="qwen3_8b",
        gpu="H100_SXM",
        gpus=8,
        seq_length=4096,
        data=str(world.good),
        tokenizer="bytes",
        max_seqlen_per_dp_cp_rank=np.int64(1024),
    )
    assert type(config.max_seqlen_per_dp_cp_rank) is int
    for bad in (0, -1, 1.5, "1k", math.nan, True):
        with pytest.raises(LongpackError, match="max_seqlen_per_dp_cp_rank"):
            PlanConfig(
                model="qwen3_8b",
                gpu="H100_SXM",
                gpus=8,
                seq_length=4096,
                data=str(world.good),
                tokenizer="bytes",
                max_seqlen_per_dp_cp_rank=bad,
            )


# -- SweepConfig from Python ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 0, "yes", None, np.int64(1), math.nan, [True]])
def test_sweep_config_cp_modes_must_be_a_bool(world, value: Any) -> None:
    from longpack.jobs import SweepConfig

    with pytest.raises(LongpackError, match="cp_modes"):
        SweepConfig(
            inputs=[world.good], tokenizer="bytes", cp_modes=value, model="qwen3_8b", gpu="H100", gpus=8
        )


def test_sweep_config_numpy_bool_cp_modes_is_made_plain(world) -> None:
    from longpack.jobs import SweepConfig

    config = SweepConfig(
        inputs=[world.good], tokenizer="bytes", cp_modes=np.bool_(True), model="qwen3_8b", gpu="H100", gpus=8
    )
    assert config.cp_modes is True


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"demo": True, "inputs": ["x.jsonl"]}, "demo=True {verb} the built-in data set"),
        ({}, "no inputs: give at least one input file"),
        ({"inputs": ["x.jsonl"], "tokenizer": None}, "tokenizer is required"),
    ],
)
def test_pack_and_sweep_refuse_a_data_source_with_one_message(kwargs: dict[str, Any], words: str) -> None:
    """The data-source rules are one function (``jobs.pack.settle_data_source``): the same words."""
    from longpack.jobs import PackConfig, SweepConfig

    for config, verb, extra in (
        (PackConfig, "packs", {"out": "o", "seq_length": 64}),
        (SweepConfig, "sweeps", {}),
    ):
        with pytest.raises(LongpackError, match=words.format(verb=verb).replace("(", r"\(")):
            config(**{"tokenizer": "bytes", **extra, **kwargs})


# -- online-sim --vlm-family ----------------------------------------------------------------------------

VLM_ROWS = [
    {"messages": [{"role": "user", "content": "<image>what"}, {"role": "assistant", "content": "a cat"}],
     "image_sizes": [[448, 448]]},
]  # fmt: skip


@pytest.fixture()
def vlm_file(tmp_path: Path) -> Path:
    path = tmp_path / "vlm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in VLM_ROWS))
    return path


def _online(vlm: Path, *args: Any) -> list[Any]:
    return ["online-sim", "--pack-size", "4096", "--buffer-sizes", "2", "--vlm", vlm, *args]


@pytest.mark.parametrize(
    "tokenizer", [[], ["--tokenizer", "/nonexistent/gemma3"]], ids=["default", "missing"]
)
def test_gemma3_without_a_processor_folder_names_the_tokenizer_option(
    vlm_file: Path, tokenizer: list
) -> None:
    outcome = assert_clean(invoke(_online(vlm_file, "--vlm-family", "gemma3", *tokenizer)), frozenset({2}))
    assert "--tokenizer" in outcome.output and "save_pretrained" in outcome.output, str(outcome)
    assert "processor=" not in outcome.output, str(outcome)  # Python keyword names are not CLI options


@pytest.mark.parametrize("content", [None, "{", '{"processor_class": "Gemma3Processor"}'], ids=str)
def test_gemma3_with_a_broken_processor_folder_is_refused(vlm_file: Path, tmp_path: Path, content) -> None:
    folder = tmp_path / "proc"
    folder.mkdir()
    if content is not None:
        (folder / "preprocessor_config.json").write_text(content)
    outcome = assert_clean(invoke(_online(vlm_file, "--vlm-family", "gemma3", "--tokenizer", folder)))
    assert outcome.exit_code == 2 and "not a saved Gemma3Processor folder" in outcome.output, str(outcome)


def test_nemotron_vl_is_refused_naming_the_option_and_the_families_that_work(vlm_file: Path) -> None:
    outcome = assert_clean(invoke(_online(vlm_file, "--vlm-family", "nemotron_vl")), frozenset({2}))
    assert "--vlm-family nemotron_vl" in outcome.output and "qwen2_vl" in outcome.output, str(outcome)


@pytest.mark.parametrize(
    "setting", [["--patch-size", "16"], ["--video-fps", "1"], ["--video-max-num-frames", "8"]]
)
def test_qwen_settings_with_gemma3_are_refused_not_ignored(
    vlm_file: Path, tmp_path: Path, setting: list
) -> None:
    argv = _online(vlm_file, "--vlm-family", "gemma3", "--tokenizer", tmp_path, *setting)
    outcome = assert_clean(invoke(argv), frozenset({2}))
    assert setting[0] in outcome.output and "drop" in outcome.output, str(outcome)


@pytest.mark.parametrize(
    "args",
    [["--vlm-family", "gemma3"], ["--loader-workers", "3"], ["--tokenizer", "bytes"], ["--max-images", "2"]],
    ids=lambda a: a[0],
)
def test_vlm_only_options_without_vlm_are_refused_not_ignored(args: list[str]) -> None:
    argv = ["online-sim", "--pack-size", "4096", "--samples", "50", "--buffer-sizes", "8", *args]
    outcome = assert_clean(invoke(argv), frozenset({2}))
    assert args[0] in outcome.output and "--vlm" in outcome.output, str(outcome)


def test_online_sim_config_vlm_family_from_python(vlm_file: Path) -> None:
    from longpack.jobs import OnlineSimConfig

    config = OnlineSimConfig(pack_size=4096, vlm=vlm_file, vlm_family=np.str_("qwen3_vl"), buffer_sizes="2")
    assert type(config.vlm_family) is str
    for bad in (3, "GEMMA3", None, ["gemma3"]):
        with pytest.raises(LongpackError, match="vlm_family"):
            OnlineSimConfig(pack_size=4096, vlm=vlm_file, vlm_family=bad)
    with pytest.raises(LongpackError, match="tokenizer"):
        OnlineSimConfig(pack_size=4096, vlm=vlm_file, vlm_family="gemma3", tokenizer=None)


# -- scripts/vlm_bridge_harness.py ----------------------------------------------------------------------


@pytest.mark.parametrize("what", ["missing", "not-git", "not-bridge"])
def test_bridge_harness_on_a_folder_that_is_not_bridge_says_so(
    tmp_path: Path, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error (exit 2) naming --bridge and the fix, not git's CalledProcessError traceback."""
    import importlib.util
    import subprocess

    folder = tmp_path / "bridge"
    if what != "missing":
        folder.mkdir()
    if what == "not-bridge":  # a git repository without src/megatron/bridge
        (folder / "README").write_text("x\n")
        git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "README"], check=True)
        subprocess.run([*git, "commit", "-qm", "x"], check=True)
    script = Path(__file__).resolve().parents[2] / "scripts" / "vlm_bridge_harness.py"
    spec = importlib.util.spec_from_file_location("vlm_bridge_harness", script)
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    with pytest.raises(SystemExit) as exit_info:
        harness.main(["--bridge", str(folder)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert f"--bridge {folder}" in err and "Megatron-Bridge" in err, err


def test_numpy_arrays_of_sizes_are_read_as_lists(world) -> None:
    """``pack_lengths`` / ``buffer_sizes`` from numpy (a user's ``np.array([...])``) as the sizes they hold;
    a 2-D array or fractional sizes are still refused naming the field."""
    from longpack.jobs import OnlineSimConfig, SweepConfig

    config = SweepConfig(inputs=[world.good], tokenizer="bytes", pack_lengths=np.array([4096, 2048]))
    assert config.pack_lengths == (2048, 4096)
    assert OnlineSimConfig(pack_size=4096, buffer_sizes=np.array([2, 8])).sizes == (2, 8)
    for bad in (np.array([[2048, 4096]]), np.array([4096.5]), np.array(["4096"])):
        with pytest.raises(LongpackError, match="pack_lengths"):
            SweepConfig(inputs=[world.good], tokenizer="bytes", pack_lengths=bad)


def test_online_sim_write_lengths_to_a_folder_is_refused_before_reading(
    vlm_file: Path, tmp_path: Path
) -> None:
    outcome = assert_clean(invoke(_online(vlm_file, "--write-lengths", tmp_path)), frozenset({2}))
    assert f"--write-lengths {tmp_path} is a folder" in outcome.output, str(outcome)


def test_online_sim_vlm_folder_is_named_as_a_folder(tmp_path: Path) -> None:
    outcome = assert_clean(invoke(_online(tmp_path)), frozenset({2}))
    assert f"--vlm {tmp_path} is a folder" in outcome.output, str(outcome)


@pytest.mark.parametrize("rows", [[], VLM_ROWS * 2], ids=["empty", "all-too-long"])
def test_online_sim_with_no_sample_to_pack_says_why_not_zeros(tmp_path: Path, rows: list) -> None:
    """Not a table of 0 / 0 fills with exit 0: an error naming the file and, when samples were refused,
    the reasons and the first keys."""
    path = tmp_path / "vlm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["online-sim", "--pack-size", "64", "--buffer-sizes", "2", "--vlm", path]
    outcome = assert_clean(invoke(argv), frozenset({2}))
    assert "no sample to pack" in outcome.output, str(outcome)
    if rows:
        assert "too_long 2" in outcome.output and "vlm.jsonl:1" in outcome.output, str(outcome)
        assert "--pack-size" in outcome.output, str(outcome)


def test_online_sim_vlm_output_names_the_family_that_counted(vlm_file: Path) -> None:
    outcome = assert_clean(
        invoke(_online(vlm_file, "--vlm-family", "qwen3_vl", "--patch-size", "16")), frozenset({0})
    )
    assert "family qwen3_vl (patch_size 16, merge_size 2," in outcome.output, str(outcome)


def test_sweep_with_nothing_left_to_pack_says_so_once(world) -> None:
    argv = ["sweep", world.good, "--tokenizer", "bytes", "--pack-size", "2", "--token-slots", "16", *PLANNER]
    text = assert_clean(invoke(argv), frozenset({1})).output
    assert text.count("left to pack") == 1, text


def test_plan_data_when_no_layout_fits_keeps_the_plans_explanation(tmp_path: Path) -> None:
    """Exit 1 with why nothing fits, as without --data; not a data error (exit 2) in its place."""
    data = _rows(tmp_path / "d.jsonl", [100, 200])
    argv = ["plan", "--model", "llama3_1_70b", "--gpu", "H100_SXM", "--gpus", "1", "--seq-length", "4096"]
    outcome = assert_clean(invoke([*argv, "--data", data, "--tokenizer", "bytes", "--json"]), frozenset({1}))
    doc = _json(outcome)
    assert doc["why_nothing_fits"] and "cp_modes" not in doc, str(outcome)


@pytest.mark.parametrize(
    "data", ["x" * 5000, "[", "\x00"], ids=["name-too-long", "glob-matching-nothing", "nul"]
)
@pytest.mark.parametrize("tokenizer", [None, "bytes"])
def test_plan_data_hostile_paths_from_python(data: str, tokenizer: str | None) -> None:
    from longpack.jobs import PlanConfig

    config = PlanConfig(
        model="llama3_1_8b", gpu="H100_SXM", gpus=8, seq_length=4096, data=data, tokenizer=tokenizer
    )
    with pytest.raises(LongpackError) as info:  # an OSError (file name too long) escaped before
        config.run()
    assert "data" in str(info.value) or repr(data[:20])[1:-1] in str(info.value), info.value


def test_online_sim_vlm_name_too_long_is_an_input_error() -> None:
    from longpack.jobs import OnlineSimConfig

    with pytest.raises(LongpackError, match="vlm"):
        OnlineSimConfig(pack_size=4096, vlm="x" * 5000).run()


def test_names_too_long_for_the_file_system_are_named_not_oserrors(vlm_file: Path, world) -> None:
    from longpack.jobs import OnlineSimConfig, SweepConfig

    long = "x" * 5000
    with pytest.raises(LongpackError, match="plot"):
        SweepConfig(inputs=[world.good], tokenizer="bytes", plot=long)
    with pytest.raises(LongpackError, match="tokenizer"):
        SweepConfig(inputs=[world.good], tokenizer=long).run()
    with pytest.raises(LongpackError, match="tokenizer"):
        OnlineSimConfig(pack_size=4096, vlm=vlm_file, tokenizer=long).run()
    with pytest.raises(LongpackError, match="tokenizer"):
        OnlineSimConfig(pack_size=4096, vlm=vlm_file, vlm_family="gemma3", tokenizer=long)
