"""Round four of hostile input (issue 40): one test per class that did not hold.

The silent-wrong classes first: scratch files of an out-of-core pack that a second scratch file truncated
while mapped (SIGBUS in the row fill), and a token store whose arrays were trusted blindly.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_helpers import assert_clean, examples, invoke

PACK = ["--tokenizer", "bytes", "--seq-length", "64"]
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


# -- out-of-core scratch files: never truncated while mapped, never mapped short ---------------------------


def test_a_second_spill_never_truncates_a_mapped_one(tmp_path: Path) -> None:
    """Each tokenize call of a pack (training inputs, then validation inputs) spills to its own files. Their
    names came from ``id()`` of a freed object, so the second call's ``open(..., "wb")`` truncated the files
    the first call's memory maps still read: SIGBUS in ``fill_tokens_and_mask`` (or rows silently holding
    the other split's tokens)."""
    from longpack.text.pipeline import _TokenStore

    maps = []
    for value in range(20):
        store = _TokenStore(np.int32, None, budget=1, spill_dir=tmp_path)
        store.extend(np.full(100 + value, value, np.int32), np.ones(100 + value, np.uint8))
        maps.append(store.finish())
        del store
        gc.collect()  # frees the store: its id() is free for the next one
    for value, (tokens, _mask) in enumerate(maps):
        assert len(tokens) == 100 + value and (np.asarray(tokens) == value).all(), value
    assert len(list(tmp_path.iterdir())) == 2 * len(maps)


def test_a_short_scratch_file_is_refused_not_mapped(tmp_path: Path) -> None:
    from longpack.errors import OutputError
    from longpack.outputs import map_scratch, new_scratch_file

    path, fh = new_scratch_file(tmp_path, "tokens")
    np.arange(10, dtype=np.int32).tofile(fh)
    fh.close()
    with pytest.raises(OutputError, match="holds 40 bytes where 44 were written"):
        map_scratch(path, np.int32, 11)
    assert map_scratch(path, np.int32, 10).tolist() == list(range(10))


# -- a token store is validated when opened, whatever command reads it ------------------------------------


def _damage(store: Path, name: str, array: np.ndarray) -> None:
    """Replace one array of ``store`` and make ``store.json`` agree with it (so only the values are wrong)."""
    np.save(store / f"{name}.npy", array)
    manifest = json.loads((store / "store.json").read_text())
    manifest["arrays"][name] = {"dtype": str(array.dtype), "shape": list(array.shape)}
    (store / "store.json").write_text(json.dumps(manifest))


def _damaged_stores(root: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """Damaged copies of the store ``good``, by case: (store, what the message must name)."""
    import shutil

    arrays = {
        n: np.load(good / f"{n}.npy") for n in ("tokens", "loss_mask", "offsets", "source_file", "source_row")
    }
    offsets, tokens = arrays["offsets"], arrays["tokens"]
    swapped = offsets.copy()
    swapped[1], swapped[2] = swapped[2], swapped[1]
    cases: dict[str, tuple[str, np.ndarray | None, str]] = {
        "offsets decrease": ("offsets", swapped, "offsets decrease at index 2"),
        "negative id": (
            "tokens",
            np.where(np.arange(len(tokens)) == 5, -3, tokens).astype(tokens.dtype),
            "index 5",
        ),
        "id past vocab": (
            "tokens",
            np.where(np.arange(len(tokens)) == 7, 259, tokens).astype(tokens.dtype),
            "vocab_size 259",
        ),
        "mask 2": (
            "loss_mask",
            np.where(np.arange(len(tokens)) == 4, 2, arrays["loss_mask"]).astype(np.uint8),
            "index 4",
        ),
        "source file": ("source_file", arrays["source_file"] + 3, "file index 3 of sample 0"),
        "source row": ("source_row", arrays["source_row"] - 100, "is negative"),
        "float tokens": ("tokens", tokens.astype(np.float32), "dtype float32"),
        "matrix mask": ("loss_mask", arrays["loss_mask"].reshape(1, -1), "shape [1,"),
        "no tokenizer": ("record", None, "record field 'tokenizer'"),
    }
    out = {}
    for case, (name, array, says) in cases.items():
        store = root / case.replace(" ", "_")
        shutil.copytree(good, store)
        if array is None:
            manifest = json.loads((store / "store.json").read_text())
            del manifest["record"]["tokenizer"]
            (store / "store.json").write_text(json.dumps(manifest))
        else:
            _damage(store, name, array)
        out[case] = (store, says)
    return out


def test_a_damaged_store_is_refused_by_every_command(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "completion": "a" * (i + 3)}) + "\n" for i in range(12))
    )
    good = tmp_path / "store"
    assert_clean(invoke(["tokenize", data, "--tokenizer", "bytes", "--out", good]), frozenset({0}))
    commands = {
        "pack": lambda s: [
            "pack",
            "--store",
            s,
            "--seq-length",
            "64",
            "--out",
            tmp_path / "out",
            "--overwrite",
        ],
        "sweep": lambda s: ["sweep", "--store", s, "--pack-lengths", "64"],
        "plan": lambda s: [
            "plan",
            "--data",
            s,
            "--model",
            "qwen3_8b",
            "--gpu",
            "H100",
            "--gpus",
            "8",
            "--seq-length",
            "4096",
        ],
        "balance": lambda s: ["balance", s, "--dp", "2", "--gbs", "2", "--pack-size", "64"],
        "inspect --verify": lambda s: ["inspect", s, "--verify"],
    }
    for name, argv in commands.items():  # the good store passes each command
        assert_clean(invoke(argv(good)), frozenset({0})), name
    # every damage against the fast readers; every reader against two damages (one check serves them all)
    everyone = ("negative id", "offsets decrease")
    for case, (store, says) in _damaged_stores(tmp_path / "bad", good).items():
        for name, argv in commands.items():
            if case not in everyone and name not in ("pack", "inspect --verify"):
                continue
            if case == "no tokenizer" and name in ("balance", "inspect --verify"):
                continue  # they read no tokenization report; the arrays are fine
            outcome = assert_clean(invoke(argv(store)), frozenset({2}))
            assert says in outcome.output and "tokenize again" in outcome.output, (case, name, str(outcome))


# -- indexed output: no silent loss-mask loss, damaged files found, GPTDataset settings checked -------------


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_rows_as_indexed_documents_are_refused_unless_every_token_trains(tmp_path: Path) -> None:
    """Megatron's indexed datasets carry no loss mask: prompts and user turns would be trained on."""
    pc = _write(tmp_path / "pc.jsonl", [{"prompt": f"q{i}", "completion": "answer"} for i in range(6)])
    chat = _write(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 4,
    )
    pre = _write(tmp_path / "pre.jsonl", [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}] * 3)
    out = tmp_path / "out"
    indexed = [*PACK, "--output-format", "indexed", "--out", out, "--overwrite"]
    for data in (pc, chat, pre):
        outcome = assert_clean(invoke(["pack", data, *indexed]), frozenset({2}))
        assert "outside the loss mask" in outcome.output and "--output-format parquet" in outcome.output
        assert not out.exists(), "nothing is written"
    # chats keep their template's special tokens out of the loss even with --chat-loss full
    assert_clean(invoke(["pack", chat, *indexed, "--chat-loss", "full"]), frozenset({2}))
    assert_clean(invoke(["pack", pc, *indexed, "--prompt-completion-loss", "full"]), frozenset({0}))


@settings(max_examples=examples(8), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7), suffix=st.sampled_from([".bin", ".idx"])
)
def test_inspect_verify_finds_a_flipped_bit_in_an_indexed_folder(
    tmp_path_factory: pytest.TempPathFactory, where: float, bit: int, suffix: str
) -> None:
    root = tmp_path_factory.mktemp("flip")
    docs = _write(root / "docs.jsonl", [{"text": f"document number {i} " * (i + 1)} for i in range(20)])
    out = root / "out"
    assert_clean(invoke(["pack", docs, *PACK, "--output-format", "indexed", "--out", out]), frozenset({0}))
    assert_clean(invoke(["inspect", out, "--verify"]), frozenset({0}))
    path = out / f"training_text_document{suffix}"
    data = bytearray(path.read_bytes())
    data[int(where * len(data))] ^= 1 << bit
    path.write_bytes(bytes(data))
    outcome = assert_clean(invoke(["inspect", out, "--verify"]), frozenset({1, 2}))
    assert path.name in outcome.output, str(outcome)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    split=st.one_of(
        st.text(max_size=12), st.sampled_from(["0,0,0", "1,2,3,4", "1e3,1", "-1,2", "0,1,0", ",", "1/1"])
    ),
    seed=st.one_of(st.integers(-(2**40), 2**40), st.just(2**32), st.just(-1)),
    num_samples=st.one_of(st.none(), st.integers(-5, 10**15)),
)
def test_gpt_dataset_settings_are_checked_not_crashed_or_hung(
    indexed_folder: Path, split: str, seed: int, num_samples: int | None
) -> None:
    argv = ["inspect", indexed_folder, "--split", split, "--seed", str(seed)]
    if num_samples is not None:
        argv += ["--num-samples", str(num_samples)]
    outcome = assert_clean(invoke(argv, seconds=20))
    if not 0 <= seed < 2**32:
        assert outcome.exit_code == 2 and "--seed" in outcome.output, str(outcome)


@pytest.fixture(scope="module")
def indexed_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("indexed")
    docs = _write(root / "docs.jsonl", [{"text": "x" * (i + 1)} for i in range(12)])
    out = root / "out"
    assert_clean(invoke(["pack", docs, *PACK, "--output-format", "indexed", "--out", out]), frozenset({0}))
    return out


def test_an_empty_training_part_is_an_error_not_a_hang(indexed_folder: Path) -> None:
    """Megatron's epoch count loops forever on a split without tokens; longpack says why instead."""
    outcome = assert_clean(
        invoke(["inspect", indexed_folder, "--split", "0,1,0", "--num-samples", "4"], seconds=20)
    )
    assert outcome.exit_code == 2 and "holds 0 tokens" in outcome.output, str(outcome)
    outcome = assert_clean(
        invoke(["inspect", indexed_folder, "--split", "0,1,0", "--sample", "0"], seconds=20)
    )
    assert outcome.exit_code == 2 and "draws no samples" in outcome.output, str(outcome)


# -- verify: odd model configs, certificate paths, the structural verifier first, unguarded scripts --------

QWEN3_CONFIG = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "qwen3_8b.json"
ODD_CONFIGS = {
    "zero layers": ({"num_hidden_layers": 0}, "num_hidden_layers is 0"),
    "NaN rms_norm_eps": ({"rms_norm_eps": float("nan")}, "rms_norm_eps is nan"),
    "zero rope factor": (
        {"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 0.0}},
        "rope_scaling.factor is 0.0",
    ),
    "unknown rope type": ({"rope_scaling": {"rope_type": "spiral", "factor": 2.0}}, "'spiral'"),
    "string size": ({"hidden_size": "4096"}, "hidden_size is '4096'"),
    "heads do not divide": ({"num_key_value_heads": 5}, "a divisor of num_attention_heads"),
    "VLM without hidden_size": (
        {"model_type": "qwen2_vl", "hidden_size": None, "text_config": {"vocab_size": 151936}},
        "hidden_size is None",
    ),
}


@pytest.mark.parametrize("case", list(ODD_CONFIGS))
def test_odd_model_configs_are_clear_errors(world, tmp_path: Path, case: str) -> None:
    edit, says = ODD_CONFIGS[case]
    config = json.loads(QWEN3_CONFIG.read_text()) | edit
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))  # NaN as JSON's NaN, as Python writes it
    outcome = assert_clean(
        invoke(["verify", world.packed, "--model", path, "--max-rows", "1"]), frozenset({2})
    )
    assert says in outcome.output and "--model" in outcome.output, str(outcome)


def test_a_certificate_path_that_cannot_be_written_is_refused_first(world, tmp_path: Path) -> None:
    for certificate in (tmp_path / "no" / "such" / "folder" / "cert.json", tmp_path):
        outcome = assert_clean(
            invoke(["verify", world.packed, "--model", QWEN3_CONFIG, "--certificate", certificate]),
            frozenset({2}),
        )
        assert "--certificate" in outcome.output, str(outcome)


def test_verify_runs_the_structural_verifier_first(world, tmp_path: Path) -> None:
    """A folder ``inspect --verify`` refuses (a shard's sha256 no longer the manifest's) fails verify too,
    however few rows the model checks."""
    from longpack.jobs import VerifyConfig

    folder = world.copy_packed(tmp_path / "packed")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["splits"]["training"]["files"][0]["sha256"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert assert_clean(invoke(["inspect", folder, "--verify"])).exit_code == 1
    result = VerifyConfig(
        packed=folder, model=str(QWEN3_CONFIG), max_rows=1, cp=(), pp=(), time_budget=None
    ).run()
    assert not result.ok and result.exit_code == 1
    assert any(f["check"] == "structure" and "sha256" in f["detail"] for f in result.failures), (
        result.failures
    )
    assert result.certificate["structure"]["problems"] and result.certificate["rows_not_checked"] > 0


@pytest.mark.slow
def test_rank_processes_work_from_an_unguarded_script(tmp_path: Path) -> None:
    """forkserver/spawn re-ran a script without an ``if __name__ == "__main__":`` guard in every rank."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "from longpack.runtime.cp_check import run_cp_check\n"
        "print('script ran')\n"
        "cases = run_cp_check(2, dtypes=('float64',))\n"
        "print('cases', len(cases))\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("script ran") == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr


# -- fragment accounting with a validation split -----------------------------------------------------------


@settings(max_examples=examples(6), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=4, max_size=30),
    val_fraction=st.sampled_from([0.2, 0.3, 0.5]),
)
def test_fragment_accounting_holds_with_a_validation_split(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], val_fraction: float
) -> None:
    root = tmp_path_factory.mktemp("frag")
    data = _write(root / "docs.jsonl", [{"text": "w" * n} for n in lengths])
    out = root / "out"
    argv = ["pack", data, "--format", "text", *PACK, "--overlength", "fragment", "--out", out]
    outcome = assert_clean(invoke([*argv, "--val-fraction", str(val_fraction)]), frozenset({0, 2}))
    if outcome.exit_code == 2:  # fewer than 2 packable samples for the split: said, nothing written
        assert "val_fraction" in outcome.output or "--val-fraction" in outcome.output, str(outcome)
        return
    manifest = json.loads((out / "manifest.json").read_text())
    c = manifest["counts"]
    assert c["packed"] + c["dropped"] + c["malformed"] == c["rows_read"] == len(lengths), c
    fragmented = 0
    for split in manifest["splits"].values():  # per split: sources = sequences - fragments + fragmented
        sources = split["samples_packed"] - split["fragments"] + split["fragmented_count"]
        assert sources == split["samples_in"] - split["dropped_count"], split
        assert split["fragmented_count"] <= split["samples_in"], split
        fragmented += split["fragmented_count"]
    assert fragmented == c["fragmented"] == manifest["inputs"][0].get("fragmented", 0)
    inspected = json.loads(invoke(["inspect", out, "--verify", "--json"]).output)
    assert inspected["ok"], inspected["problems"]
    for name, split in manifest["splits"].items():  # the shards hold exactly the sequences reported
        assert inspected["splits"][name]["samples"] == split["samples_packed"], (
            name,
            inspected["splits"][name],
        )


# -- check on things that are not configs; rules_drift.py on bad paths and dates ---------------------------


def test_check_refuses_what_is_not_a_config(world, tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    row = tmp_path / "row.json"
    row.write_text(json.dumps({"prompt": "q", "completion": "a"}))
    for path, says in (
        (empty, "empty"),
        (Path("/dev/null"), "empty"),
        (world.good, "a data file"),
        (row, "none of its top-level keys"),
    ):
        outcome = assert_clean(invoke(["check", path]), frozenset({2}))
        assert says in outcome.output and "OK" not in outcome.output, str(outcome)
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  seq_length: 4096\n")
    assert_clean(invoke(["check", config]), frozenset({0, 1}))


def test_rules_drift_says_what_is_wrong_with_its_arguments(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "rules_drift.py"
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README.md").write_text("x\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (tmp_path / "plain").mkdir()
    (tmp_path / "bytes.txt").write_bytes(b"\xff\xfe\x00")
    cases = {
        "missing path": (
            ["sites", "--repo", tmp_path / "none", "--from", "a", "--to", "b"],
            "no such folder",
        ),
        "a folder": (
            ["sites", "--repo", tmp_path / "plain", "--from", "a", "--to", "b"],
            "not a git checkout",
        ),
        "a non-UTF-8 file": (
            ["sites", "--repo", tmp_path / "bytes.txt", "--from", "a", "--to", "b"],
            "a file",
        ),
        "impossible date": (["sites", "--repo", repo, "--from", "2026-02-30", "--to", "HEAD"], "not a date"),
        "out is a folder": (
            ["sites", "--repo", repo, "--from", "HEAD", "--to", "HEAD", "--out", tmp_path / "plain"],
            "a folder",
        ),
        "ranges of a missing checkout": (["ranges", "--bridge", tmp_path / "none"], "no such folder"),
    }
    for case, (argv, says) in cases.items():
        proc = subprocess.run(
            [sys.executable, str(script), *map(str, argv)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (case, proc.stderr)
        assert says in proc.stderr, (case, proc.stderr)


# -- Python users get what the CLI says --------------------------------------------------------------------


def test_python_callers_get_the_warnings_the_cli_prints(tmp_path: Path) -> None:
    """A pack that drops most of its tokens: the CLI prints a warning; Python gets a LongpackWarning and
    ``result.notes()`` lists it."""
    import warnings

    from longpack.errors import LongpackWarning
    from longpack.jobs import PackConfig

    data = _write(
        tmp_path / "d.jsonl", [{"prompt": "q", "completion": "a" * n} for n in (5, 6, 7, 300, 400, 500)]
    )
    args = dict(inputs=[str(data)], tokenizer="bytes", seq_length=64, max_drop_fraction=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = PackConfig(out=tmp_path / "py", **args).run()
    said = [str(w.message) for w in caught if issubclass(w.category, LongpackWarning)]
    assert said and said == list(result.manifest.extra["warnings"]), said
    assert [f"warning: {w}" for w in said] == result.notes()[: len(said)]
    outcome = assert_clean(
        invoke(["pack", data, *PACK, "--max-drop-fraction", "1", "--out", tmp_path / "cli"]), frozenset({0})
    )
    assert outcome.output.count(said[0][:40]) == 1, str(outcome)  # printed once, not also as a Python warning


def test_a_nested_setting_given_at_the_top_names_its_config() -> None:
    from longpack.errors import ConfigError
    from longpack.jobs import PackConfig, SweepConfig, TokenizeConfig

    for cls in (PackConfig, TokenizeConfig, SweepConfig):
        with pytest.raises(
            ConfigError,
            match=r"belongs to TextConfig; give it as \w+\(text=TextConfig\(skip_malformed=True\)\)",
        ):
            cls(skip_malformed=True)
    with pytest.raises(ConfigError, match="did you mean seq_length"):
        PackConfig(seq_lenght=8)


def test_results_name_things_as_the_json_does(world) -> None:
    from longpack.jobs import CheckConfig, InspectConfig

    check = CheckConfig(overrides=("model.context_parallel_size=2",), gpus=8).run()
    finding = check.findings[0]
    assert finding.id == finding.rule_id == finding.to_dict()["id"]
    inspected = InspectConfig(folder=world.packed, verify=True).run()
    assert inspected.ok is True and inspected.problems == [] and inspected.exit_code == 0


# -- VLM bad inputs ----------------------------------------------------------------------------------------


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header promises ``width`` x ``height`` pixels (a decompression bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )
    return path


def _vlm_row(**extra: object) -> dict:
    return {
        "messages": [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "yo"}],
        **extra,
    }


def test_vlm_bad_media_are_refused_by_reason(tmp_path: Path) -> None:
    """A decompression bomb's header, an empty image file, an empty video file: refused per sample with the
    reason the docs name (never an internal error), the other samples counted."""
    from PIL import Image

    good = tmp_path / "good.png"
    Image.new("RGB", (64, 48)).save(good)
    _png_header_only(tmp_path / "bomb.png", 30000, 30000)
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "empty.mp4").write_bytes(b"")
    video_row = {
        "messages": [{"role": "user", "content": "<video>hi"}, {"role": "assistant", "content": "yo"}]
    }
    rows = [
        _vlm_row(images=["good.png"]),
        _vlm_row(images=["bomb.png"]),
        _vlm_row(images=["empty.png"]),
        {**video_row, "videos": ["empty.mp4"]},
    ]
    data = _write(tmp_path / "vlm.jsonl", rows)
    outcome = assert_clean(
        invoke(["online-sim", "--vlm", data, "--vlm-family", "qwen3_vl", "--pack-size", "4096", "--json"]),
        frozenset({0}),
    )
    rejected = json.loads(outcome.output)["samples"]["rejected"]
    assert (rejected["undecodable"], rejected["empty_image"], rejected["empty_video"]) == (1, 1, 1), rejected


def test_vlm_jsonl_gzip_and_bad_image_sizes(tmp_path: Path) -> None:
    import gzip

    rows = [_vlm_row(image_sizes=[[1920, 1080]])] + [
        _vlm_row(image_sizes=[[bad, 480]]) for bad in (float("nan"), float("inf"), "640", None, 640.5, True)
    ]
    plain = _write(tmp_path / "v.jsonl", rows)
    packed = tmp_path / "v.gz.jsonl"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for data in (plain, packed):
        outcome = assert_clean(
            invoke(
                ["online-sim", "--vlm", data, "--vlm-family", "qwen3_vl", "--pack-size", "4096", "--json"]
            ),
            frozenset({0}),
        )
        report = json.loads(outcome.output)
        assert report["samples"]["rejected"]["malformed"] == 6, report["samples"]
        # Qwen3-VL's own count for 1920x1080 (patch 16), not Qwen2-VL's patch 14 (1,222)
        assert report["samples"]["visual_tokens_mean"] == 943.0, report["samples"]


@settings(max_examples=examples(60), deadline=None)
@given(
    family=st.sampled_from(["qwen2_vl", "qwen3_vl", "gemma3", "nemotron_vl", "glm4v", "kimi_vl"]),
    width=st.one_of(
        st.integers(-5, 5000),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.none(),
        st.text(max_size=3),
    ),
)
def test_family_visual_tokens_refuse_sizes_that_are_not_pixels(family: str, width: object) -> None:
    from longpack.errors import LongpackError
    from longpack.vlm.families import vlm_family

    fam = vlm_family(family)
    whole = isinstance(width, int) and not isinstance(width, bool) and width >= 1
    integral = (
        isinstance(width, float)
        and width == width
        and abs(width) != float("inf")
        and width.is_integer()
        and width >= 1
    )
    try:
        tokens = fam.visual_tokens(width, 480)  # type: ignore[arg-type]
    except LongpackError as exc:
        assert (not whole and not integral) or getattr(exc, "reason", "") == "aspect_ratio", exc
        return
    assert whole or integral, (family, width, tokens)
    assert isinstance(tokens, int) and tokens >= 1


# -- full disks: tokenize, the store and indexed writes say it as pack to Parquet does ---------------------


@pytest.mark.slow  # four real processes under a file-size limit
def test_a_file_size_limit_is_the_same_clear_error_for_every_writer(tmp_path: Path) -> None:
    import random
    import resource
    import signal

    from hostile_helpers import run_subprocess

    rng = random.Random(0)
    ids = _write(
        tmp_path / "ids.jsonl", [{"input_ids": [rng.randrange(259) for _ in range(60)]} for _ in range(4000)]
    )
    docs = _write(
        tmp_path / "docs.jsonl",
        [{"text": "".join(chr(97 + rng.randrange(26)) for _ in range(60))} for _ in range(4000)],
    )

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    commands = {
        "tokenize": ["tokenize", ids, "--tokenizer", "bytes", "--out", tmp_path / "store"],
        "keep-store": ["pack", ids, *PACK, "--keep-store", tmp_path / "kept", "--out", tmp_path / "p1"],
        "indexed": [
            "pack",
            docs,
            "--format",
            "text",
            *PACK,
            "--output-format",
            "indexed",
            "--out",
            tmp_path / "ix",
        ],
        "parquet": ["pack", ids, *PACK, "--out", tmp_path / "p2"],
    }
    for name, argv in commands.items():
        outcome = run_subprocess(argv, preexec=small_files)
        assert_clean(outcome, frozenset({2}))
        assert "File too large" in outcome.output and "reads as unfinished" in outcome.output, (
            name,
            str(outcome),
        )


# -- output that can be pasted as printed ------------------------------------------------------------------


def test_sweep_override_line_is_one_line(tmp_path: Path) -> None:
    """Pasting a hard-wrapped override line runs its second half (``train.micro_batch_size=1``) as a command."""
    data = _write(
        tmp_path / "d.jsonl",
        [{"prompt": "q" * (i % 20 + 1), "completion": "a" * (i % 40 + 1)} for i in range(400)],
    )
    argv = ["sweep", data, "--tokenizer", "bytes", "--pack-lengths", "64,128", "--token-slots", "512"]
    outcome = assert_clean(
        invoke([*argv, "--model", "qwen3_8b", "--gpu", "H100", "--gpus", "8"]), frozenset({0})
    )
    line = next(x for x in outcome.output.splitlines() if "Megatron-Bridge:" in x)
    assert len(line) > 150 and "train.micro_batch_size=" in line, str(outcome)  # longer than the console


@settings(max_examples=examples(20), deadline=None)
@given(hi=st.sampled_from([64, 4096, 16384, 131072, 1 << 20]), n=st.integers(1, 300))
def test_inspect_histograms_stay_aligned_and_plain(hi: int, n: int) -> None:
    from longpack.packed.inspect import text_histogram

    lines = text_histogram(np.linspace(0, hi, n), lo=0, hi=hi)
    assert not any("e+" in line for line in lines), lines
    counts_end = {len(line.split("#")[0].rstrip()) for line in lines}
    assert len(counts_end) == 1, lines  # the counts end in one column


# -- plain-text pretraining: what a folder of .txt files does, which token ends a document -----------------


def test_text_folder_hint_and_the_end_of_document_token(tmp_path: Path) -> None:
    folder = tmp_path / "txts"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.txt").write_text(f"document {i}\n")
    base = ["--format", "text", *PACK, "--out", tmp_path / "out", "--overwrite"]
    outcome = assert_clean(invoke(["pack", folder, *base]), frozenset({2}))
    assert "matched by a glob" in outcome.output and "*.txt" in outcome.output, str(outcome)
    outcome = assert_clean(invoke(["pack", str(folder / "*.txt"), *base]), frozenset({0}))
    assert "documents end with <|im_end|> (id 258)" in outcome.output, str(outcome)
    outcome = assert_clean(invoke(["pack", str(folder / "*.txt"), *base, "--no-append-eod"]), frozenset({0}))
    assert "documents end with no EOD token" in outcome.output, str(outcome)
