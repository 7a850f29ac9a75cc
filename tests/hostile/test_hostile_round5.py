"""Round five of hostile input (issue 40, what round four left): one test per class that did not hold.

Help that cuts option names at 80 columns; damaged packed files that `inspect --verify` / `verify` called a
bad setting (exit 2) where the docs promise a failed check (exit 1); ...
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from hostile_helpers import assert_clean, invoke
from longpack.cli.app import app

# -- `--help` never cuts an option name, a choice or a word ------------------------------------------------


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)] if path else []
    if hasattr(command, "commands"):  # a group (typer carries its own copy of click's classes)
        for name, sub in command.commands.items():
            if not sub.hidden:
                found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(get_command(app))


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
@pytest.mark.parametrize("width", [60, 80, 120])
def test_help_shows_every_option_whole(path: tuple[str, ...], width: int) -> None:
    """typer's rich table cut 25 cells of `pack --help` at 80 columns (`--pad-seq-to-mu…`,
    `best_fit_decrea…`): every option name now appears whole, and nothing is replaced by an ellipsis."""
    command = dict(COMMANDS)[path]
    text = CliRunner().invoke(app, [*path, "--help"], terminal_width=width).output
    assert "…" not in text, text
    for param in command.params:
        if param.param_type_name == "option" and not param.hidden:
            for name in [*param.opts, *param.secondary_opts]:
                assert name in text, (path, width, name)


# -- a damaged packed file is a failed check (exit 1) for every verifier, with the file named ---------------


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))


def _cut_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _not_parquet(path: Path) -> None:
    path.write_text('{"prompt": "a text file where a shard was"}\n')


DAMAGE = {"bytes overwritten": _flip_middle, "cut in half": _cut_half, "replaced by text": _not_parquet}


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_shard_is_a_failed_check_everywhere(world, tmp_path: Path, how: str) -> None:
    out = world.copy_packed(tmp_path / "p")
    shard = sorted(out.glob("training_*.parquet"))[1]
    DAMAGE[how](shard)
    inspected = assert_clean(invoke(["inspect", out, "--verify", "--json"]))
    report = json.loads(inspected.output)
    assert inspected.exit_code == 1 and report["ok"] is False, str(inspected)
    assert (
        report["damaged"] and shard.name in report["problems"][0] and "copy it again" in report["problems"][0]
    )
    human = assert_clean(invoke(["inspect", out, "--verify"]))
    assert human.exit_code == 1 and "DAMAGED" in human.output and shard.name in human.output, str(human)
    checked = assert_clean(invoke(["check", "--packed", out, "--json"]))
    findings = [f for f in json.loads(checked.output)["findings"] if f["id"] == "LP-DATA-012"]
    assert checked.exit_code == 1 and shard.name in findings[0]["message"], str(checked)
    verified = assert_clean(invoke(["verify", out, "--model", "qwen3_8b", "--json"]))
    certificate = json.loads(verified.output)
    assert verified.exit_code == 1 and certificate["verdict"] == "fail", str(verified)
    assert shard.name in certificate["summary"] and certificate["structure"]["problems"], certificate


def test_a_damaged_npy_pack_is_a_failed_check_named_as_npy(world, tmp_path: Path) -> None:
    out = tmp_path / "npy"
    assert_clean(invoke(["pack", world.good, "--out", out, "--tokenizer", "bytes", "--seq-length", "64",
                         "--output-format", "npy"]), frozenset({0}))  # fmt: skip
    _cut_half(next(out.glob("training_*.npy")))
    outcome = assert_clean(invoke(["inspect", out]))
    assert outcome.exit_code == 1 and "DAMAGED" in outcome.output and "format npy" in outcome.output, str(
        outcome
    )
    assert "cannot read as a packed .npy file" in outcome.output, str(outcome)


def test_a_damaged_manifest_fails_verify_without_running_the_model(world, tmp_path: Path) -> None:
    from longpack.jobs import VerifyConfig

    out = world.copy_packed(tmp_path / "p")
    (out / "manifest.json").write_text('{"format": ')
    result = VerifyConfig(packed=str(out), model="qwen3_8b").run()
    assert result.exit_code == 1 and not result.ok and "manifest.json is not valid JSON" in result.verdict
    assert result.rows == () and "no row was run through the model" in result.notes[0]
    outcome = assert_clean(invoke(["verify", out, "--model", "qwen3_8b"]))
    assert outcome.exit_code == 1 and outcome.output.startswith("FAIL: "), str(outcome)


# -- balance takes the pack job's over-length policies (a store with one long sample was refused) -----------


@pytest.mark.parametrize("policy", ["error", "drop", "truncate", "fragment"])
def test_balance_handles_over_long_lengths_as_pack_does(tmp_path: Path, policy: str) -> None:
    from longpack.errors import LongpackWarning
    from longpack.jobs import BalanceConfig

    data = tmp_path / "rows.jsonl"
    texts = ["a" * 10, "b" * 20, "c" * 300, "d" * 30, "e" * 40, "f" * 12]
    data.write_text("".join(json.dumps({"prompt": "p", "completion": t}) + "\n" for t in texts))
    store = tmp_path / "store"
    assert_clean(invoke(["tokenize", data, "--tokenizer", "bytes", "--out", store]), frozenset({0}))
    args = ["balance", store, "--pack-size", "64", "--dp", "1", "--gbs", "2", "--overlength", policy]
    outcome = assert_clean(invoke(args))
    if policy == "error":
        assert outcome.exit_code == 2 and "--overlength drop, truncate or fragment" in outcome.output, str(
            outcome
        )
        return
    assert (
        outcome.exit_code == 0
        and "warning: 1 of 6 lengths are longer than the pack size (64)" in outcome.output
    )
    config = BalanceConfig(lengths_file=store, pack_size=64, dp=1, gbs=2, overlength=policy)
    with pytest.warns(LongpackWarning, match=f"overlength {policy}"):
        result = config.run()
    packed_tokens = {r["packing"]: round(r["fill"] * r["packs"] * 64) for r in result.packings}
    assert len(set(packed_tokens.values())) == 1, packed_tokens  # every packer packs the same lengths
    total = next(iter(packed_tokens.values()))
    short = sum(len(t) + 2 - 1 for t in texts if len(t) < 200)  # prompt + completion + end token, runtime
    assert total == {"drop": short, "truncate": short + 64, "fragment": short + 300 + 2 - 1 - 4}[policy]
    assert json.loads(assert_clean(invoke([*args, "--json"])).output)["warnings"] == list(result.warnings)
    if policy != "truncate":
        refused = assert_clean(invoke([*args, "--out", tmp_path / "bins.npy"]))
        assert refused.exit_code == 2 and "--out" in refused.output and "--overlength" in refused.output


# -- the drop warning never names a pack size at or below the pack's own as the fix --------------------------


@pytest.mark.parametrize("long_rows", [2, 40])
def test_drop_warning_names_only_larger_pack_sizes(tmp_path: Path, long_rows: int) -> None:
    """A 16K pack losing 10 % of its tokens to a few long samples was told "the smallest pack size that keeps
    99 % of the samples is 1760": advice to shrink. With few long rows 99 % already fit (the warning says
    the loss is in the longest samples); with many, the sizes it names are larger than the pack's."""
    import re
    import warnings

    from longpack.errors import LongpackWarning
    from longpack.jobs import PackConfig

    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": "q", "completion": "a" * (5 + i % 20)} for i in range(200)]
    rows += [{"prompt": "q", "completion": "z" * 900}] * long_rows
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = PackConfig(inputs=[str(data)], out=str(tmp_path / "out"), tokenizer="bytes", seq_length=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config.run()
    text = next(str(w.message) for w in caught if issubclass(w.category, LongpackWarning))
    named = [int(n) for n in re.findall(r"seq_length (\d+) keeps", text)]
    assert named and all(n > 64 for n in named), text
    if long_rows == 2:
        assert "99 % of the samples already fit in seq_length 64" in text, text
    outcome = assert_clean(
        invoke(["pack", data, "--out", tmp_path / "cli", "--tokenizer", "bytes", "--seq-length", "64"])
    )
    assert outcome.exit_code == 0 and f"warning: {text}" in outcome.output, str(
        outcome
    )  # the CLI says the same


# -- sweep says when its default token slots give batches smaller than the GPU count ------------------------


def test_sweep_notes_a_default_batch_smaller_than_the_gpus(world) -> None:
    """`sweep` at the default 65,536 token slots gave GBS 2-16 on 64 GPUs without a word (the layouts it
    then picks trade DP for PP to fit the tiny batch)."""
    base = ["sweep", world.good, "--tokenizer", "bytes", "--pack-size", "2048,4096", "--model", "llama3_1_8b"]
    base += ["--gpu", "H100"]
    small = json.loads(assert_clean(invoke([*base, "--gpus", "64", "--json"]), frozenset({0, 1})).output)
    assert small["notes"] and "GBS 16 to 32 on 64 GPUs" in small["notes"][0], small["notes"]
    assert "token_slots 262144 for GBS 64 to 128" in small["notes"][0], small["notes"]  # smallest GBS >= GPUs
    human = assert_clean(invoke([*base, "--gpus", "64"]), frozenset({0, 1}))
    assert "Note: --token-slots is the default 65,536" in human.output, str(human)
    chosen = json.loads(
        assert_clean(
            invoke([*base, "--gpus", "64", "--token-slots", "262144", "--json"]), frozenset({0, 1})
        ).output
    )
    enough = json.loads(assert_clean(invoke([*base, "--gpus", "8", "--json"]), frozenset({0, 1})).output)
    assert chosen["notes"] == enough["notes"] == [], (chosen["notes"], enough["notes"])


# -- every job config from Python: a huge integer or one value for a list is a LongpackError or taken ------


def _job_configs() -> list[type]:
    import dataclasses

    import longpack.jobs as jobs

    return [
        getattr(jobs, name)
        for name in sorted(dir(jobs))
        if name.endswith("Config") and dataclasses.is_dataclass(getattr(jobs, name))
    ]


def _required(cls: type, world) -> dict[str, Any]:
    """Keyword arguments that make a valid config of ``cls`` (for the fields without a default)."""
    given = {
        "inputs": [str(world.good)],
        "out": str(world.root / "never-written"),
        "tokenizer": "bytes",
        "seq_length": 64,
        "folder": str(world.packed),
        "packed": str(world.packed),
        "lengths_file": str(world.lengths),
        "pack_size": 64,
        "dp": 1,
        "gbs": 2,
        "model": "qwen3_8b",
        "gpu": "H100",
        "gpus": 8,
        "config": str(world.root / "none.yaml"),
        "layout": "tp=1,cp=1,pp=1",
        "bin_size": 64,
        "path": str(world.packed),
    }
    import dataclasses

    return {
        f.name: given[f.name]
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name in given
    }


@pytest.mark.parametrize("cls", _job_configs(), ids=lambda c: c.__name__)
def test_job_configs_take_huge_integers_and_lone_values_cleanly(cls: type, world) -> None:
    """`CpCheckConfig(cp=4)` was a bare `TypeError` ('int' object is not iterable) and
    `CpCheckConfig(dtype="float64")` refused the letter 'f': a field that takes a list takes one value as a
    list of one. Every integer field given 10**30 or -10**30 is refused with a LongpackError or taken."""
    import dataclasses
    import typing

    from longpack.errors import LongpackError
    from longpack.validate import _list_only

    base = _required(cls, world)
    try:
        cls(**base)
    except TypeError as exc:  # a required field this table does not know
        pytest.skip(f"{cls.__name__}: {exc}")
    except LongpackError:
        pass
    hints = typing.get_type_hints(cls)
    tried = 0
    for f in dataclasses.fields(cls):
        kind = str(hints.get(f.name))
        values: list[Any] = []
        if "int" in kind:
            values += [10**30, -(10**30)]
        if _list_only(f.type):
            values += [7, "x"]
        for value in values:
            tried += 1
            try:
                config = cls(**{**base, f.name: value})
            except LongpackError:
                continue
            if _list_only(f.type):
                assert getattr(config, f.name) == (value,), (f.name, value)
    assert tried or cls.__name__ in {"InspectConfig"}, cls


# -- a damaged pack size or alignment multiple in the manifest is a failed check ------------------------------


@pytest.mark.parametrize(
    ("key", "value", "found"),
    [
        ("pack_size", "abc", "settings: pack_size must be an integer, got str 'abc'"),
        ("pack_size", -5, "settings.pack_size is '-5', not a positive integer"),
        ("pack_size", 10**30, "settings.pack_size is '1000000000000000000000000000000'"),
        ("pad_seq_to_mult", 0, "settings.pad_seq_to_mult is '0', not a positive integer"),
        ("pad_seq_to_mult", "x", "settings: pad_seq_to_mult must be an integer, got str 'x'"),
        ("pad_seq_to_mult", True, "settings: pad_seq_to_mult must be an integer, got bool True"),
        ("pad_seq_to_mult", 2, "pad_seq_to_mult is stated differently"),
    ],
)
def test_damaged_pack_settings_fail_every_verifier(
    world, tmp_path: Path, key: str, value: object, found: str
) -> None:
    """A manifest whose settings.pad_seq_to_mult was 0, 'x' or 10**30 (or pack_size 'abc') passed
    `inspect --verify`, `check --packed` and `verify`. A value of the wrong type makes the manifest unreadable
    (read-time checks), a wrong integer is a verification problem: a failed check (exit 1) either way, the
    same verdict from all three (check --packed said exit 2 for an unreadable manifest)."""
    from longpack.jobs import VerifyConfig

    out = world.copy_packed(tmp_path / "p")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["settings"][key] = value
    (out / "manifest.json").write_text(json.dumps(manifest))
    inspected = assert_clean(invoke(["inspect", out, "--verify", "--json"]))
    problems = json.loads(inspected.output)["problems"]
    assert inspected.exit_code == 1 and any(found in p for p in problems), problems
    checked = assert_clean(invoke(["check", "--packed", out, "--json"]))
    assert checked.exit_code == 1 and found in checked.output, str(checked)
    result = VerifyConfig(packed=str(out), model="qwen3_8b", max_rows=1, dist_rows=0).run()
    assert not result.ok and result.exit_code == 1 and found in result.verdict, result.verdict


# -- verify builds multi-latent-attention families (DeepSeek-V3) from their own config.json ------------------


@pytest.mark.parametrize("q_lora_rank", [1536, None], ids=["v3", "no-q-lora"])
def test_verify_builds_a_deepseek_v3_config(world, tmp_path: Path, q_lora_rank: int | None) -> None:
    """A DeepSeek-V3 config.json (MLA: kv_lora_rank 512, qk_rope_head_dim 64, ...) was an internal error
    (`RuntimeError: The size of tensor a (32) must match the size of tensor b (4)`): the shrunk model kept
    the family's MLA widths against the shrunk heads."""
    transformers = pytest.importorskip("transformers")
    from longpack.jobs import VerifyConfig

    config = transformers.DeepseekV3Config().to_dict()  # the family's defaults: DeepSeek-V3's shape
    config["q_lora_rank"] = q_lora_rank
    config["rope_scaling"] = {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                              "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}  # fmt: skip
    (tmp_path / "dsv3").mkdir()
    (tmp_path / "dsv3" / "config.json").write_text(json.dumps(config))
    result = VerifyConfig(
        packed=str(world.packed), model=str(tmp_path / "dsv3"), max_rows=1, dist_rows=0
    ).run()
    assert result.ok and result.verdict.startswith("PASS") and "deepseek_v3" in result.verdict, result.verdict
    coverage = result.certificate["coverage"]  # its sigmoid group-limited router is not recomputed: said so
    assert coverage["parts"]["moe_router"]["experts"] == 4, coverage
    assert coverage["parts"]["moe_router"]["covered"] or any("router" in n for n in coverage["not_covered"])


@pytest.mark.parametrize("pack_size", [1, 2, 8, 15])
def test_balance_costs_packs_smaller_than_16_tokens(world, pack_size: int) -> None:
    """The planner cost model was fitted on lengths 16..pack size: a pack size under 16 ended in "sequences
    must be positive lengths <= 8 with positive counts"; it is now refused by its flag, with the minimum."""
    args = [
        "balance",
        world.lengths,
        "--pack-size",
        pack_size,
        "--dp",
        "1",
        "--gbs",
        "2",
        "--overlength",
        "truncate",
    ]
    outcome = assert_clean(invoke(args))
    assert outcome.exit_code == 2 and "--pack-size must be an integer >= 16" in outcome.output, str(outcome)
