"""Job configs keep what they are given (issue 41): what follows from the fields comes from ``resolve()``, so
``dataclasses.replace`` works and a derived value never leaks into a later copy; executors say what they can
do (``supports``) and output formats are records (``longpack.packed.formats``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from longpack import choices
from longpack.cluster.ray_pack import RayExecutor
from longpack.errors import ConfigError
from longpack.jobs import LocalExecutor, PackConfig, SweepConfig
from longpack.jobs.pack import DEMO_SEQ_LENGTH, DEMO_TOKENIZER
from longpack.packed import files
from longpack.packed.formats import OUTPUT_FORMAT, load


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p in (a, b):
        p.write_text(json.dumps({"prompt": "q", "completion": "a"}) + "\n")
    return a, b


def test_replace_of_a_mix_config_keeps_the_mix(two_files: tuple[Path, Path]) -> None:
    """The defect of the issue: ``replace`` passed the mix's inputs back as ``inputs`` ("give either mix or
    inputs")."""
    a, b = two_files
    config = PackConfig(mix=[f"{a}=0.7", f"{b}=0.3"], out="o", tokenizer="bytes", seq_length=64)
    again = dataclasses.replace(config, seed=1)
    assert again.seed == 1 and again.inputs == () and again.mix == config.mix
    assert again.resolved.inputs == (str(a), str(b)) == config.resolved.inputs
    assert again.settings == dataclasses.replace(config.settings, seed=1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"demo": True},
        {"demo": True, "compat": "megatron-bridge"},
        {"demo": True, "pad_cu_seqlens": True},
        {"demo": True, "output_format": "indexed"},
        {"demo": True, "tp": 2, "cp": 2, "sp": True, "memory_budget": "8G"},
    ],
)
def test_replace_round_trips(kwargs: dict[str, object]) -> None:
    config = PackConfig(out="o", **kwargs)  # type: ignore[arg-type]
    assert dataclasses.replace(config) == config
    assert dataclasses.replace(config).resolve() == config.resolve()


def test_derived_values_do_not_leak_into_a_copy() -> None:
    """Each derived value sits in ``resolved``, not over the field it follows from, so a copy with the cause
    removed loses it too."""
    demo = PackConfig(demo=True, out="o")
    assert demo.tokenizer is None and demo.seq_length is None  # as given
    assert (demo.resolved.tokenizer, demo.resolved.seq_length) == (DEMO_TOKENIZER, DEMO_SEQ_LENGTH)

    compat = PackConfig(
        demo=True, out="o", compat="megatron-bridge", text=dataclasses.replace(demo.text, min_tokens=2)
    )
    assert compat.text.min_tokens == 2 and compat.resolved.text.min_tokens == 1
    assert dataclasses.replace(compat, compat=None).resolved.text.min_tokens == 2

    cuda_graphs = PackConfig(demo=True, out="o", pad_cu_seqlens=True)
    assert cuda_graphs.pad_to_max_length is False and cuda_graphs.handoff_options["pad_to_max_length"] is True
    assert (
        dataclasses.replace(cuda_graphs, pad_cu_seqlens=False).handoff_options["pad_to_max_length"] is False
    )


def test_sweep_replace_round_trips() -> None:
    config = SweepConfig(demo=True, pack_lengths="512,256")
    assert config.pack_lengths == (256, 512) and config.tokenizer is None
    again = dataclasses.replace(config, seed=3)
    assert again.resolved.settings == dataclasses.replace(config.resolved.settings, seed=3)
    assert again.resolved.tokenizer == DEMO_TOKENIZER


class MyLocal(LocalExecutor):
    pass


class NoSupports:
    """An executor object of the protocol before ``supports``: it is taken to support nothing."""

    name = "mine"


SETTINGS_NEEDING = {
    choices.MIX: {"mix": ["{a}=0.5", "{b}=0.5"]},
    choices.ONE_FILE_PER_SPLIT: {"output_format": "npy"},
    choices.OVERLENGTH_FRAGMENT: {"overlength": "fragment"},
    choices.TOKEN_STORE: {"keep_store": "kept"},
}


def _config(two_files: tuple[Path, Path], backend: object, extra: dict[str, object]) -> PackConfig:
    a, b = two_files
    extra = {k: [v.format(a=a, b=b) for v in val] if k == "mix" else val for k, val in extra.items()}
    inputs = {} if "mix" in extra else {"inputs": [str(a)]}
    return PackConfig(out="o", tokenizer="bytes", seq_length=64, backend=backend, **inputs, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize("need", list(SETTINGS_NEEDING))
def test_executor_capabilities_are_asked_alike(two_files: tuple[Path, Path], need: str) -> None:
    """The six capability checks are one question (``supports``): a LocalExecutor subclass is accepted for
    every setting (before, mix, stores, fragment and indexed refused it and npy took it), Ray and an object
    without ``supports`` are refused, with the setting's own message."""
    extra = SETTINGS_NEEDING[need]
    for backend in ("local", LocalExecutor(), MyLocal()):
        _config(two_files, backend, extra)
    messages = set()
    for backend in ("ray", RayExecutor(), NoSupports()):
        with pytest.raises(ConfigError, match="local backend") as caught:
            _config(two_files, backend, extra)
        messages.add(str(caught.value))
    assert len(messages) == 1


def test_indexed_needs_sharded_indexed(two_files: tuple[Path, Path]) -> None:
    """Indexed output is written locally, or from a sharded store on Ray (``sharded_indexed``); an executor
    object without that capability is refused."""
    for backend in ("local", LocalExecutor(), MyLocal(), "ray", RayExecutor()):
        _config(two_files, backend, {"output_format": "indexed"})
    with pytest.raises(ConfigError, match="written by backend local or ray"):
        _config(two_files, NoSupports(), {"output_format": "indexed"})


def test_every_output_format_has_a_record() -> None:
    assert tuple(OUTPUT_FORMAT) == choices.OUTPUT_FORMATS
    for name, fmt in OUTPUT_FORMAT.items():
        assert fmt.name == name and callable(load(fmt.writer))
        assert fmt.summary is None or callable(load(fmt.summary))
        assert fmt.summary_lines is None or callable(load(fmt.summary_lines))
        assert fmt.suffix is None or files.shard_names("training", 8, 1, output_format=name)[0].endswith(
            fmt.suffix
        )
        for refusal in fmt.refused:  # each names a real setting of the pack job
            assert refusal.setting in {f.name for f in dataclasses.fields(PackConfig)}


@pytest.mark.parametrize("name", choices.VLM_FAMILIES)
def test_vlm_families_say_what_they_read(name: str) -> None:
    """A caller asks the family (positions' rows, the ``VLMConfig`` fields it reads), never its name or
    class: the rows are the ones ``position_ids`` gives, and a preparer's agree with its family's."""
    import numpy as np

    from longpack.vlm import QwenVLPreparer, VLMConfig
    from longpack.vlm.families import Gemma3Preparer, vlm_family

    family = vlm_family(name)
    positions = np.asarray(family.position_ids([1, 2, 3], {}))
    assert positions.shape == ((3, 3) if family.position_dims == 3 else (3,))
    assert set(family.config_fields) <= {f.name for f in dataclasses.fields(VLMConfig)}
    assert family.can_prepare or not family.config_fields  # only a family longpack prepares reads them
    preparer_class = {"gemma3": Gemma3Preparer}.get(name, QwenVLPreparer)
    if family.can_prepare:
        assert preparer_class.position_dims == family.position_dims


def _every_job_config(tmp_path: Path) -> dict[str, dict[str, object]]:
    """Each job config with the least it needs to construct."""
    lengths, rows = tmp_path / "lengths.txt", tmp_path / "a.jsonl"
    lengths.write_text("5\n7\n")
    rows.write_text(json.dumps({"text": "hello"}) + "\n")
    plan = {"model": "deepseek_v3", "gpu": "H100", "gpus": 256, "seq_length": 131072}
    return {
        "BalanceConfig": {"lengths_file": str(lengths), "dp": 2, "gbs": 4, "pack_size": 16},
        "CheckConfig": {"overrides": ("model.context_parallel_size=2",), "gpus": 8},
        "CpCheckConfig": {},
        "EstimateConfig": {**plan, "layout": "tp=1"},
        "EvaluateConfig": {},
        "FitConfig": {"out": "o"},
        "InspectConfig": {"folder": str(tmp_path)},
        "OnlineSimConfig": {"pack_size": 64, "buffer_sizes": "8,64"},
        # the defect: the mix's inputs were written over ``inputs``
        "PackConfig": {
            "out": "o",
            "mix": [f"{rows}=0.7", f"{lengths}=0.3"],
            "tokenizer": "bytes",
            "seq_length": 64,
        },
        "PlanConfig": plan,
        "PreviewConfig": {"inputs": str(rows), "tokenizer": "bytes", "index": [0]},
        "RolloutsConfig": {"lengths_file": str(lengths), "bin_size": 16},
        "SweepConfig": {"demo": True, "pack_lengths": "512,256"},
        "ThdBatchConfig": {"path": str(tmp_path)},
        "TokenizeConfig": {"inputs": [str(rows)], "out": "o", "tokenizer": "bytes"},
        "TopologyConfig": {"gpus": 8},
        "VerifyConfig": {"model": "tiny", "packed": str(tmp_path), "cp": [2]},
    }


def test_every_job_config_survives_replace(tmp_path: Path) -> None:
    """The generic form of the defect: a config whose construction wrote a derived value over a given field
    (or dropped one) breaks ``replace`` with every field passed back as read; each job config keeps what it
    is given, up to normalising its form (a list to a tuple, a path to a string)."""
    import longpack.jobs as jobs

    table = _every_job_config(tmp_path)
    assert set(table) == {n for n in jobs._LAZY if n.endswith("Config")}  # a new job config joins the table
    for name, kwargs in table.items():
        config = getattr(jobs, name)(**kwargs)
        given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
        assert dataclasses.replace(config) == config, name
        assert dataclasses.replace(config, **given) == config, name
        assert type(config)(**given) == config, name


def _family_switches(src: Path) -> list[str]:
    """Where code outside ``longpack.vlm`` tells VLM families apart by name prefix or preparer/family class."""
    import ast

    prefixes = tuple(sorted({name.split("_")[0].rstrip("0123456789") for name in choices.VLM_FAMILIES}))
    found = []
    for path in sorted(src.rglob("*.py")):
        if "vlm" in path.relative_to(src).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f, args = node.func, node.args
            by_prefix = (
                isinstance(f, ast.Attribute)
                and f.attr == "startswith"
                and args
                and isinstance(args[0], ast.Constant)
                and isinstance(args[0].value, str)
                and args[0].value.startswith(prefixes)
            )
            by_class = (
                isinstance(f, ast.Name)
                and f.id == "isinstance"
                and len(args) == 2
                and any(
                    isinstance(n, ast.Name) and n.id.endswith(("Preparer", "Family"))
                    for n in ast.walk(args[1])
                )
            )
            if by_prefix or by_class:
                found.append(f"{path.relative_to(src)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_caller_tells_vlm_families_apart_by_name_or_class() -> None:
    """Outside ``longpack.vlm`` a caller asks the family (``position_dims``, ``config_fields``, ...). Left: the
    Energon encoders' check that what they were given is a preparer at all, and the catalog's Gemma MLP (a
    text-model fact, not a VLM family)."""
    src = Path(choices.__file__).parent
    allowed = {
        "online/vlm.py: isinstance(preparer, QwenVLPreparer | Gemma3Preparer)",
        "catalog.py: model_type.startswith('gemma')",
    }
    found = [f for f in _family_switches(src) if f.split(":")[0] + ":" + f.split(":", 2)[2] not in allowed]
    assert not found, "\n".join(found)


def test_the_family_walk_finds_a_switch(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "vlm").mkdir()
    switch = "if family.startswith('qwen'): pass\nif isinstance(p, QwenVLPreparer): pass\n"
    (tmp_path / "jobs" / "a.py").write_text(switch + "name.startswith('x')\nisinstance(p, str)\n")
    (tmp_path / "vlm" / "b.py").write_text(switch)  # inside longpack.vlm: the family's own code
    assert [f.split(":")[1] for f in _family_switches(tmp_path)] == ["1", "2"]


def test_a_bad_image_sizes_row_is_named_once(tmp_path: Path) -> None:
    """``image_sizes`` checked in its own step: the error names the file and the sample once (it named them
    twice before)."""
    from longpack.vlm import QwenVLPreparer, VLMConfig
    from longpack.vlm.errors import VLMError
    from longpack.vlm.metadata import read_vlm_metadata

    rows = tmp_path / "vlm.jsonl"
    sample = {"__key__": "s0", "messages": [{"role": "user", "content": "<image> hi"}], "image_sizes": [[1]]}
    rows.write_text(json.dumps(sample) + "\n")
    with pytest.raises(VLMError) as caught:
        read_vlm_metadata(rows, QwenVLPreparer("qwen3", config=VLMConfig()))
    assert str(caught.value).count(str(rows)) == 1 and "image_sizes must be [[width, height], ...]" in str(
        caught.value
    )


_FORMAT_CONSTANTS = {"PARQUET", "NPY", "INDEXED", "DPO"}  # choices' names of the output formats


def _format_name_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare a value with an output format's name (its literal or its choices
    constant): what a field of the format's ``OutputFormat`` record says instead."""
    import ast

    def names_a_format(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_format(e) for e in node.elts)
        return (
            (isinstance(node, ast.Constant) and node.value in choices.OUTPUT_FORMATS)
            or (isinstance(node, ast.Attribute) and node.attr in _FORMAT_CONSTANTS)
            or (isinstance(node, ast.Name) and node.id in _FORMAT_CONSTANTS)
        )

    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare) and any(map(names_a_format, [node.left, *node.comparators]))
    ]


def test_jobs_and_cli_ask_the_format_record_not_its_name() -> None:
    import longpack

    root = Path(longpack.__file__).parent
    # inspect also reads a bare Megatron prefix, which has no pack manifest (so no format record)
    allowed = {"cli/inspect_cmd.py"}
    found = {
        f"{path.relative_to(root)}:{line}"
        for package in ("jobs", "cli")
        for path in sorted((root / package).rglob("*.py"))
        if str(path.relative_to(root)) not in allowed
        for line in _format_name_comparisons(path.read_text())
    }
    assert not found, (
        f"compare no output format name; add a field to its OutputFormat record: {sorted(found)}"
    )


def test_the_format_name_scan_finds_a_comparison() -> None:
    source = "if fmt == choices.DPO:\n    pass\nx = name in ('npy', 'csv')\ny = kind == 'jsonl'\n"
    assert _format_name_comparisons(source) == [1, 3]
