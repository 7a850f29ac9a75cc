"""One verifier (issue 27): ``check --packed`` and ``inspect --verify`` run the same code
(``PackedFolder.validate(verify=True)``) and give the same verdict on every damaged folder; ``check`` also
checks the data paths a config names and a balanced pack's topology.

Before, ``check --packed`` passed folders ``inspect --verify`` refused (metadata edited, wrong hashes in the
manifest, a shard from another pack, a validation shard in the training files, a corrupt data page) and
neither noticed a manifest ``pack_size`` that disagreed with the files.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_helpers import assert_clean, examples, invoke

PACK = ["--tokenizer", "bytes", "--seq-length", "64"]
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


def _shards(out: Path) -> list[Path]:
    return sorted(out.glob("training_*.idx.parquet"))


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _damage(out: Path, how: str, rng: random.Random, other: Path) -> None:
    shards = _shards(out)
    shard = rng.choice(shards)
    if how == "metadata edited":
        meta = next(out.glob("*_metadata.jsonl"))
        entries = json.loads(meta.read_text())
        key = rng.choice(["max_samples_per_bin", "dataset_max_seqlen", "min_packed_seqlen"])
        entries[0][key] += rng.randint(1, 5)
        meta.write_text(json.dumps(entries))
    elif how == "wrong hash in the manifest":

        def edit(m):
            files = m["splits"]["training"]["files"]
            files[rng.randrange(len(files))]["sha256"] = "0" * 64

        _edit_json(out / "manifest.json", edit)
    elif how == "shard from another pack":
        shutil.copy(rng.choice(_shards(other)), shard)
    elif how == "validation shard in the training files":
        val = next((out / "validation").glob("*.parquet"))
        n = len(shards)
        shutil.copy(val, out / f"training_64.part-{n:05d}-of-{n:05d}.idx.parquet")
    elif how == "validation shard instead of a training shard":
        shutil.copy(next((out / "validation").glob("*.parquet")), shard)
    elif how == "corrupt data page":
        data = bytearray(shard.read_bytes())
        # inside the data pages: after the 4-byte magic, before the footer (its last ~40% is metadata)
        lo, hi = 4, max(5, int(len(data) * 0.55))
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
        shard.write_bytes(bytes(data))
    elif how == "manifest pack_size disagrees":
        section, key = rng.choice(
            [
                ("settings", "pack_size"),
                ("alignment", "pack_size"),
                ("megatron_bridge", "packed_sequence_size"),
            ]
        )
        value = rng.choice([32, 128, 4096])
        _edit_json(out / "manifest.json", lambda m: m[section].__setitem__(key, value))
    elif how == "manifest row count":
        _edit_json(
            out / "manifest.json",
            lambda m: m["splits"]["training"].__setitem__("rows", m["splits"]["training"]["rows"] + 1),
        )
    else:
        raise AssertionError(how)


DAMAGE = [
    "metadata edited",
    "wrong hash in the manifest",
    "shard from another pack",
    "validation shard in the training files",
    "validation shard instead of a training shard",
    "corrupt data page",
    "manifest pack_size disagrees",
    "manifest row count",
]


@pytest.fixture(scope="module")
def other_pack(world, tmp_path_factory) -> Path:
    """Another pack of other data, shards named as the world's are."""
    data = tmp_path_factory.mktemp("other") / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"z{i}", "completion": "b" * (i % 30 + 3)}) + "\n" for i in range(40))
    )
    out = data.parent / "packed"
    outcome = invoke(["pack", data, "--out", out, *PACK, "--val-fraction", "0.2", "--rows-per-shard", "5"])
    assert outcome.exit_code == 0, str(outcome)
    return out


def _verdicts(out: Path) -> tuple[int, list[str], int, list[str]]:
    inspected = assert_clean(invoke(["inspect", out, "--verify", "--json"]))
    checked = assert_clean(invoke(["check", "--packed", out, "--json"]))
    problems = json.loads(inspected.output)["problems"] if inspected.exit_code != 2 else [inspected.output]
    findings = []
    if checked.exit_code != 2:
        findings = [f["message"] for f in json.loads(checked.output)["findings"] if f["id"] == "LP-DATA-012"]
    return inspected.exit_code, problems, checked.exit_code, findings


@settings(max_examples=examples(16), deadline=None, suppress_health_check=FIXTURE_OK)
@given(how=st.sampled_from(DAMAGE), seed=st.integers(0, 2**16))
def test_check_packed_and_inspect_verify_give_one_verdict(
    world, other_pack, tmp_path_factory, how, seed
) -> None:
    out = world.copy_packed(tmp_path_factory.mktemp("verdict") / "p")
    _damage(out, how, random.Random(seed), other_pack)
    inspect_code, problems, check_code, findings = _verdicts(out)
    assert inspect_code in (1, 2) and check_code in (1, 2), (how, problems, findings)
    if inspect_code == 1 and check_code == 1:  # both read the folder: the same problems, word for word
        assert [f"{out}: {p}" for p in problems[:10]] == findings[:10], (how, problems, findings)
    else:  # a folder one cannot read at all, the other cannot either
        assert inspect_code == check_code == 2, (how, inspect_code, check_code)


@pytest.mark.parametrize("how", DAMAGE)
def test_each_damage_is_found_by_both(world, other_pack, tmp_path: Path, how: str) -> None:
    out = world.copy_packed(tmp_path / "p")
    _damage(out, how, random.Random(1), other_pack)
    inspect_code, problems, check_code, findings = _verdicts(out)
    assert inspect_code != 0 and check_code != 0, (problems, findings)
    if how == "manifest pack_size disagrees":
        assert any("pack size is stated differently" in p for p in problems), problems


def test_a_sound_folder_passes_both(world) -> None:
    inspect_code, problems, check_code, findings = _verdicts(world.packed)
    assert (inspect_code, problems, check_code, findings) == (0, [], 0, [])


# -- the data paths a config names ---------------------------------------------------------------------------


def test_check_refuses_config_paths_that_do_not_exist(world, tmp_path: Path) -> None:
    out = world.copy_packed(tmp_path / "p")
    config = out / "bridge_config.yaml"
    text = config.read_text().replace(str(world.packed), str(out))
    config.write_text(text.replace("training_64.part-*", "training_64.nope-*"))
    outcome = assert_clean(invoke(["check", config, "--packed", out, "--json"]))
    ids = {f["id"] for f in json.loads(outcome.output)["findings"] if f["severity"] == "error"}
    assert outcome.exit_code == 1 and ids == {"LP-DATA-013"}, outcome.output
    assert "FileNotFoundError" in outcome.output


@settings(max_examples=examples(6), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    which=st.sampled_from(["packed_train_data_path", "packed_val_data_path", "packed_metadata_path"]),
    to=st.sampled_from(["other pack", "validation in training", "missing"]),
)
def test_check_refuses_config_paths_outside_the_folder(
    world, other_pack, tmp_path_factory, which, to
) -> None:
    import yaml

    out = world.copy_packed(tmp_path_factory.mktemp("paths") / "p")
    config = yaml.safe_load((out / "bridge_config.yaml").read_text().replace(str(world.packed), str(out)))
    specs = config["dataset"]["offline_packing_specs"]
    if to == "other pack":
        specs[which] = specs[which].replace(str(out), str(other_pack))
    elif to == "validation in training":
        specs["packed_train_data_path"] = f"{out}/**/*_64*.idx.parquet"
    else:
        specs[which] = specs[which] + ".gone"
    path = out.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    outcome = assert_clean(invoke(["check", path, "--packed", out, "--json"]))
    errors = [f for f in json.loads(outcome.output)["findings"] if f["severity"] == "error"]
    assert outcome.exit_code == 1 and {f["id"] for f in errors} == {"LP-DATA-013"}, outcome.output


def test_the_config_pack_writes_passes_check(world) -> None:
    outcome = assert_clean(invoke(["check", world.packed / "bridge_config.yaml", "--packed", world.packed]))
    assert outcome.exit_code == 0, str(outcome)


# -- a balanced pack's topology -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def balanced(world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("balanced") / "p"
    spec = "dp=2,pp=2,gbs=4,linear=1.0,quadratic=0.001"
    outcome = invoke(["pack", world.good, "--out", out, *PACK, "--balance", spec])
    assert outcome.exit_code == 0, str(outcome)
    return out


def test_a_balanced_pack_pins_its_topology_in_bridge_config(balanced) -> None:
    import yaml

    config = yaml.safe_load((balanced / "bridge_config.yaml").read_text())
    assert config["train"]["global_batch_size"] == 4
    assert config["model"]["pipeline_model_parallel_size"] == 2
    assert "DP=2" in (balanced / "bridge_config.yaml").read_text()
    ok = assert_clean(invoke(["check", balanced / "bridge_config.yaml", "--packed", balanced, "--gpus", "4"]))
    assert ok.exit_code == 0, str(ok)


@settings(max_examples=examples(8), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    change=st.sampled_from(
        [
            ("train.global_batch_size", 8, "GBS=4"),
            ("train.global_batch_size", 2, "GBS=4"),
            ("model.pipeline_model_parallel_size", 1, "PP=2"),
            ("train.micro_batch_size", 2, "MBS=1"),
            ("longpack.world_size", 8, "DP=2"),
        ]
    )
)
def test_check_refuses_another_topology_for_a_balanced_pack(balanced, change) -> None:
    key, value, needle = change
    argv = ["check", balanced / "bridge_config.yaml", "--packed", balanced, "--json", f"{key}={value}"]
    if key != "longpack.world_size":
        argv += ["--gpus", str(2 * 2 * (value if key == "model.pipeline_model_parallel_size" else 2) // 2)]
    outcome = assert_clean(invoke(argv))
    found = [f for f in json.loads(outcome.output)["findings"] if f["id"] == "LP-DATA-014"]
    assert outcome.exit_code == 1 and any(needle in f["message"] for f in found), outcome.output
