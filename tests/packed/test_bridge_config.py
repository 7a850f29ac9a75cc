"""``bridge_config.yaml`` and the printed overrides / Python snippet: complete, checkable, and pasteable.

For every combination the pack options allow (format, alignment given or derived from TP/CP/SP, a
validation split or none, pack size above seq length, fixed width and padded ``cu_seqlens``, int32 ids, the
compat mode), a tiny output is written and

- ``longpack check <out>/bridge_config.yaml --packed <out>`` passes (no error, no warning);
- the overrides, passed through a real shell (``bash -c``), parse back to the YAML's values with Hydra's
  own override parser (what Megatron-Bridge uses) and with ``longpack check``'s;
- the Python snippet, run against a stand-in ``PackedSequenceSpecs``, sets the same values.
"""

from __future__ import annotations

import itertools
import shlex
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from longpack.jobs.check import CheckConfig
from longpack.jobs.pack import PackConfig
from longpack.packed import Provenance, plan_splits, write_packed_output
from longpack.packed.bridge_config import (
    BRIDGE_CONFIG_NAME,
    LEGACY_BRIDGE_VERSION,
    BridgeHandoff,
    handoff_from_manifest,
)
from longpack.rules.config_file import apply_overrides
from packed_helpers import random_samples

EOS = 2


@dataclass(frozen=True)
class Combo:
    output_format: str
    layout: str  # "mult" (pad_seq_to_mult given), "tp_cp_sp" (derived), "none"
    validation: bool
    pack_gt_seq: bool
    fixed: str  # "", "pad_to_max_length", "pad_cu_seqlens"
    extra: str  # "", "int32", "compat"

    def allowed(self) -> bool:
        # ids_dtype is a Parquet setting
        return not (self.output_format == "npy" and self.extra == "int32")

    def config(self, out: Path) -> PackConfig:
        kw: dict[str, Any] = {}
        if self.layout == "mult":
            kw["pad_seq_to_mult"] = 4
        elif self.layout == "tp_cp_sp":
            kw.update(tp=2, cp=2, sp=True)
        if self.validation:
            kw["val_fraction"] = 0.2
        if self.fixed:
            kw[self.fixed] = True
        if self.extra == "int32":
            kw["ids_dtype"] = "int32"
        if self.extra == "compat":
            kw["compat"] = "megatron-bridge"
        seq = 32 if self.pack_gt_seq else 64
        return PackConfig(
            inputs=["unused.jsonl"],
            out=out,
            tokenizer="bytes",
            seq_length=seq,
            pack_size=64,
            output_format=self.output_format,
            **kw,
        )


COMBOS = [
    c
    for c in itertools.starmap(
        Combo,
        itertools.product(
            ("parquet", "npy"),
            ("mult", "tp_cp_sp", "none"),
            (False, True),
            (False, True),
            ("", "pad_to_max_length", "pad_cu_seqlens"),
            ("", "int32", "compat"),
        ),
    )
    if c.allowed()
]


def _write(combo: Combo, out: Path) -> dict[str, Any]:
    config = combo.config(out)
    samples, _, _ = random_samples(60, seed=3, max_len=30, eos=EOS)
    splits = plan_splits(samples, config.settings, eos_id=EOS)
    return write_packed_output(
        out,
        splits,
        config.settings,
        Provenance(tokenizer={"eos_id": EOS, "vocab_size": 259}),
        handoff=config.handoff_options,
    )


def _shell_argv(items: list[str]) -> list[str]:
    """What a shell passes on when the printed overrides are pasted after a command."""
    script = "printf '%s\\n' " + " ".join(items)
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(str(v) for v in vars(c).values()))
def test_written_config_checks_and_pastes(tmp_path: Path, combo: Combo) -> None:
    out = tmp_path / "out dir, with=odd chars"  # the paths must survive quoting
    manifest = _write(combo, out)
    text = (out / BRIDGE_CONFIG_NAME).read_text()
    mapping = yaml.safe_load(text)
    dataset = mapping["dataset"]
    specs = dataset["offline_packing_specs" if combo.output_format == "parquet" else "packed_sequence_specs"]
    # Complete: what a run needs to start on the first try.
    assert dataset["dataset_root"] == str(out.absolute())
    assert mapping["model"]["seq_length"] == dataset["seq_length"] == specs["packed_sequence_size"] == 64
    assert mapping["train"]["micro_batch_size"] == 1
    assert dataset["do_validation"] is combo.validation and dataset["do_test"] is False
    assert dataset["seed"] == (1234 if combo.extra == "compat" else 0)
    assert ("packed_val_data_path" in specs) is combo.validation
    for key in ("packed_train_data_path", "packed_val_data_path", "packed_metadata_path"):
        if key in specs:
            assert Path(specs[key]).is_file(), key
    assert specs["pad_seq_to_mult"] == manifest["alignment"]["pad_seq_to_mult"]
    if combo.output_format == "parquet":
        assert dataset["enable_offline_packing"] is True
        assert ("max_single_sequence_length" in specs) is combo.pack_gt_seq
    else:
        assert "max_single_sequence_length" not in specs  # Bridge <= 0.5.1's PackedSequenceSpecs lacks it
    assert specs["pad_cu_seqlens"] is (combo.fixed == "pad_cu_seqlens")
    assert (dataset.get("dataset_kwargs") == {"pad_to_max_length": True}) is bool(combo.fixed)
    if combo.layout == "tp_cp_sp":
        assert mapping["model"]["calculate_per_token_loss"] is True
        assert mapping["ddp"] == {"average_in_collective": False}
    # longpack check passes on it.
    # (the legacy form is checked for the Bridge it is written for, as the printed command says)
    version = {} if combo.output_format == "parquet" else {"bridge_version": LEGACY_BRIDGE_VERSION}
    result = CheckConfig(config=out / BRIDGE_CONFIG_NAME, packed=out, **version).run()
    bad = [f"{f.rule_id}: {f.message}" for f in result.findings if f.severity.value in ("error", "warning")]
    assert result.exit_code == 0 and not bad, bad
    # The overrides survive a shell and parse back to the same values, in Hydra and in longpack check.
    handoff = handoff_from_manifest(out, manifest, **manifest["bridge_config"]["options"])
    argv = _shell_argv(handoff.overrides())
    assert apply_overrides({}, argv) == mapping
    hydra_parser = pytest.importorskip("hydra.core.override_parser.overrides_parser")
    parsed = hydra_parser.OverridesParser.create().parse_overrides(overrides=argv)
    assert {o.key_or_group: o.value() for o in parsed} == handoff.flat()
    assert all(o.key_or_group.startswith(("model.", "train.", "ddp.", "dataset.")) for o in parsed)
    # The Python snippet sets the same values.
    assert _run_snippet(handoff) == mapping


def _run_snippet(handoff: BridgeHandoff) -> dict[str, Any]:
    """Execute the snippet with ``cfg`` a tree of namespaces and a stand-in ``PackedSequenceSpecs``."""
    module_name = (
        "megatron.bridge.data.packing"
        if handoff.api == "main"
        else ("megatron.bridge.data.datasets.packed_sequence")
    )
    target = (
        "megatron.bridge.data.packing.config.PackedSequenceSpecs"
        if handoff.api == "main"
        else "megatron.bridge.data.datasets.packed_sequence.PackedSequenceSpecs"
    )

    class PackedSequenceSpecs:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    stub = types.ModuleType(module_name)
    stub.PackedSequenceSpecs = PackedSequenceSpecs  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("megatron", module_name)}
    sys.modules[module_name] = stub
    try:
        cfg = types.SimpleNamespace(
            model=types.SimpleNamespace(),
            train=types.SimpleNamespace(),
            ddp=types.SimpleNamespace(),
            dataset=types.SimpleNamespace(dataset_kwargs=None),
        )
        exec(compile(handoff.python(), "<snippet>", "exec"), {"cfg": cfg})
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    out: dict[str, Any] = {}
    for section in ("model", "train", "ddp", "dataset"):
        values = dict(vars(getattr(cfg, section)))
        if section == "dataset":
            if values.get("dataset_kwargs") is None:
                values.pop("dataset_kwargs")
            for key, value in list(values.items()):
                if isinstance(value, PackedSequenceSpecs):
                    values[key] = {"_target_": target, **value.kwargs}
        if values:
            out[section] = values
    # Same keys in YAML order (dicts compare by value; order is checked by the flat form above).
    return out


def test_paths_that_need_quoting_reach_hydra_intact(tmp_path: Path) -> None:
    tricky = tmp_path / "a b,c=d 'q' \"dq\" [x]*?"
    h = BridgeHandoff(
        out=tricky,
        pack_size=8,
        seq_length=8,
        pad_seq_to_mult=1,
        seed=0,
        train_path="training_8.idx.parquet",
        metadata_path="8_metadata.jsonl",
    )
    argv = _shell_argv(h.overrides())
    assert len(argv) == len(h.flat())
    hydra_parser = pytest.importorskip("hydra.core.override_parser.overrides_parser")
    parsed = hydra_parser.OverridesParser.create().parse_overrides(overrides=argv)
    assert {o.key_or_group: o.value() for o in parsed}["dataset.dataset_root"] == str(tricky.absolute())
    assert apply_overrides({}, argv)["dataset"]["dataset_root"] == str(tricky.absolute())
    assert shlex.split(" ".join(h.overrides())) == argv


def test_no_validation_split_turns_validation_off_and_none_is_null(tmp_path: Path) -> None:
    h = BridgeHandoff(
        out=tmp_path,
        pack_size=8,
        seq_length=8,
        pad_seq_to_mult=1,
        seed=0,
        train_path="training_8.idx.parquet",
        metadata_path="8_metadata.jsonl",
    )
    assert "dataset.do_validation=false" in h.overrides()
    assert not any("None" in o for o in h.overrides())
