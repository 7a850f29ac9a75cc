"""The jobs layer (``longpack.jobs``): configs validate in one place and name the field; ``.run()`` equals
the CLI byte for byte; tokenizer objects are accepted; worker processes work from plain scripts under every
multiprocessing start method; the README's three-line example runs; ``import longpack`` stays light."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import longpack
from longpack.cli.app import app
from longpack.errors import ConfigError, LongpackError
from longpack.jobs import CheckConfig, PackConfig, PlanConfig, SweepConfig
from longpack.text import inputs as inputs_mod

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def write_sft(path: Path, n: int = 300) -> Path:
    rows = [
        {"prompt": f"question {i} " * (1 + i % 5), "completion": f"answer {i} " * (1 + i % 7)}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def same_files(a: Path, b: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Same files with the same bytes (recursively); ``bridge_config.yaml`` names its own folder, so it
    is compared with each folder's path replaced."""
    names = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    for name in names:
        if name in skip:
            continue
        got_a, got_b = (a / name).read_bytes(), (b / name).read_bytes()
        if name == "bridge_config.yaml":
            got_a = got_a.replace(str(a.absolute()).encode(), b"<out>")
            got_b = got_b.replace(str(b.absolute()).encode(), b"<out>")
        assert got_a == got_b, name
    return names


# --- validation: one place, names the field -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "needle"),
    [
        ({"inputs": [], "tokenizer": "bytes", "seq_length": 8}, "inputs", "no inputs"),
        ({"demo": True, "inputs": ["a.jsonl"]}, "demo", "give no inputs"),
        ({"inputs": ["a"], "seq_length": 8}, "tokenizer", "tokenizer is required"),
        ({"inputs": ["a"], "tokenizer": "bytes"}, "seq_length", "seq_length is required"),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 0},
            "seq_length",
            "seq_length must be a positive integer",
        ),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 64, "pack_size": 32},
            "seq_length",
            "pack_size",
        ),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "pad_seq_to_mult": 4, "cp": 2},
            "pad_seq_to_mult",
            "not both",
        ),
        (
            {
                "inputs": ["a"],
                "tokenizer": "bytes",
                "seq_length": 8,
                "val_fraction": 0.1,
                "val_inputs": ["b"],
            },
            "val_inputs",
            "not both",
        ),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "val_fraction": 1.5},
            "val_fraction",
            "[0, 1)",
        ),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "overlength": "shrink"},
            "overlength",
            "shrink",
        ),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "algorithm": "magic"},
            "algorithm",
            "magic",
        ),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "ids_dtype": "uint8"},
            "ids_dtype",
            "uint8",
        ),
        ({"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "backend": "spark"}, "backend", "spark"),
        ({"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "workers": 0}, "workers", "workers"),
        (
            {"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "rows_per_shard": 0},
            "rows_per_shard",
            "rows_per_shard",
        ),
        ({"inputs": ["a"], "tokenizer": "bytes", "seq_length": 8, "balance": "dp=2"}, "balance", "gbs"),
        ({"inputs": 3, "tokenizer": "bytes", "seq_length": 8}, "inputs", "inputs must be"),
    ],
)
def test_pack_config_errors_name_the_field(kwargs: dict, field: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        PackConfig(out="never-written", **kwargs)
    assert field in info.value.fields and needle in str(info.value)
    assert "--" not in str(info.value)  # fields, not CLI flags
    assert not Path("never-written").exists()


def test_pack_config_is_frozen_and_normalized() -> None:
    config = PackConfig(inputs="a.jsonl", out="o", tokenizer="bytes", seq_length=64, tp=2, cp=2, sp=True)
    assert config.inputs == ("a.jsonl",) and config.out == Path("o")
    assert config.settings.pad_seq_to_mult == 4 and "TP=2 CP=2" in config.pad_seq_to_mult_source
    with pytest.raises(AttributeError):
        config.seq_length = 1  # type: ignore[misc]
    demo = PackConfig(demo=True, out="o")
    # the demo's defaults follow from demo=True: they are resolved, not written over the fields (issue 41)
    assert (demo.tokenizer, demo.seq_length) == (None, None)
    assert (demo.resolved.tokenizer, demo.resolved.seq_length) == ("qwen3", 4096)


def test_pack_derives_the_kernels_multiple_as_topology_suggests() -> None:
    # MXFP8's 32 tokens per rank (times CP) and HybridEP's 128-token chunk join pad_seq_to_mult's family: the
    # multiple pack writes is the one `longpack topology --fp8-recipe/--hybridep` prints
    from longpack.jobs.topology import TopologyConfig

    for kwargs in (
        {"cp": 2, "fp8_recipe": "mxfp8"},
        {"tp": 2, "sp": True, "hybridep": True},
        {"fp8_recipe": "delayed"},
    ):
        config = PackConfig(inputs="a.jsonl", out="o", tokenizer="bytes", seq_length=4096, **kwargs)
        shown = TopologyConfig(gpus=8, **kwargs).run().to_dict()["kernel_pad_multiple"]  # type: ignore[arg-type]
        assert config.settings.pad_seq_to_mult == shown, kwargs
        assert "kernels' multiple" in config.pad_seq_to_mult_source
    assert (
        PackConfig(
            inputs="a.jsonl", out="o", tokenizer="bytes", seq_length=64, cp=2, fp8_recipe="mxfp8"
        ).settings.pad_seq_to_mult
        == 64
    )
    with pytest.raises(ConfigError, match="not both"):
        PackConfig(
            inputs="a.jsonl", out="o", tokenizer="bytes", seq_length=64, pad_seq_to_mult=8, hybridep=True
        ).resolve()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"demo": True, "pack_lengths": "2048,x"}, "pack_lengths"),
        ({"demo": True, "pack_lengths": (3000,)}, "token_slots"),
        ({"demo": True, "model": "llama3_1_8b"}, "model"),
        ({"demo": True, "layout": "tp=2"}, "layout"),
        ({"demo": True, "algorithm": "magic"}, "algorithm"),
        ({"inputs": ["a"]}, "tokenizer"),
    ],
)
def test_sweep_config_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        SweepConfig(**kwargs)
    assert field in info.value.fields and "--" not in str(info.value)


def test_plan_and_check_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        PlanConfig(model="llama3_1_8b", gpu="H100_SXM", gpus=8, seq_length=4096, top=0)
    assert info.value.fields == ("top",)
    with pytest.raises(LongpackError, match="nope"):
        PlanConfig(model="nope", gpu="H100_SXM", gpus=8, seq_length=4096)
    with pytest.raises(ConfigError) as info:
        CheckConfig(gpus=0)
    assert info.value.fields == ("gpus",)


# --- run() == CLI ------------------------------------------------------------------------------------


def test_pack_config_run_equals_cli_byte_for_byte(tmp_path: Path) -> None:
    src = write_sft(tmp_path / "d.jsonl")
    val = write_sft(tmp_path / "v.jsonl", 40)
    cli = runner.invoke(
        app,
        ["pack", str(src), "--out", str(tmp_path / "cli"), "--tokenizer", "bytes", "--seq-length", "96",
         "--pack-size", "128", "--tp", "2", "--cp", "2", "--sp", "--val-input", str(val), "--overlength",
         "truncate", "--algorithm", "first_fit_shuffle", "--seed", "5", "--rows-per-shard", "7",
         "--workers", "1", "--json"],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    result = PackConfig(
        inputs=[str(src)],
        out=tmp_path / "py",
        tokenizer="bytes",
        seq_length=96,
        pack_size=128,
        tp=2,
        cp=2,
        sp=True,
        val_inputs=[str(val)],
        overlength="truncate",
        algorithm="first_fit_shuffle",
        seed=5,
        rows_per_shard=7,
        workers=1,
    ).run()
    names = same_files(tmp_path / "cli", tmp_path / "py")
    assert "manifest.json" in names and len([n for n in names if n.startswith("training")]) > 1
    summary = json.loads(cli.output)
    ours = result.to_dict()
    assert {**summary, "out": None, "megatron_bridge": None, "bridge_config": None} == {
        **ours,
        "out": None,
        "megatron_bridge": None,
        "bridge_config": None,
    }
    cli_dir, py_dir = str((tmp_path / "cli").resolve()), str((tmp_path / "py").resolve())
    assert json.loads(json.dumps(summary["bridge_config"]).replace(cli_dir, "<out>")) == json.loads(
        json.dumps(ours["bridge_config"]).replace(py_dir, "<out>")
    )
    assert result.out == (tmp_path / "py").resolve()
    assert result.counts["truncated"] > 0 and set(result.splits) == {"training", "validation"}
    assert result.megatron_bridge["packed_metadata_path"] == str(result.out / "128_metadata.jsonl")
    assert result.manifest.to_json_bytes() == (tmp_path / "py" / "manifest.json").read_bytes()


def test_sweep_plan_check_configs_equal_their_cli(tmp_path: Path) -> None:
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"input_ids": [5] * (2 + i * 7 % 500)}) + "\n" for i in range(200)))
    cli = runner.invoke(
        app, ["sweep", str(src), "--tokenizer", "bytes", "--pack-size", "512,1024", "--token-slots", "4096",
              "--gpus", "8", "--workers", "1", "--json"],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    swept = SweepConfig(
        inputs=[str(src)], tokenizer="bytes", pack_lengths=(1024, 512), token_slots=4096, gpus=8, workers=1
    ).run()
    assert json.loads(cli.output) == json.loads(json.dumps(swept.to_dict()))
    assert [c.pack_length for c in swept.candidates] == [512, 1024] and swept.input["rows_read"] == 200

    args = [
        "--model",
        "llama3_1_8b",
        "--gpu",
        "H100_SXM",
        "--gpus",
        "8",
        "--seq-length",
        "8192",
        "--top",
        "3",
    ]
    cli = runner.invoke(app, ["plan", *args, "--json"])
    assert cli.exit_code == 0, cli.output
    planned = PlanConfig(model="llama3_1_8b", gpu="H100_SXM", gpus=8, seq_length=8192, top=3).run()
    assert json.loads(cli.output) == json.loads(json.dumps(planned.to_dict()))

    config = REPO / "examples" / "check" / "llama3_8b_sft_cp4_broken.yaml"
    cli = runner.invoke(app, ["check", str(config), "--gpus", "8", "--json"])
    checked = CheckConfig(config=config, gpus=8).run()
    assert cli.exit_code == checked.exit_code == 1
    assert json.loads(cli.output) == json.loads(json.dumps(checked.to_dict()))


# --- tokenizer objects ----------------------------------------------------------------------------------


def _rust_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = ["question", "answer", *map(str, range(300))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return tok


def test_tokenizer_object_packs_the_same_rows_as_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs_mod, "JSONL_CHUNK_BYTES", 2048)  # many chunks: the worker pool really runs
    monkeypatch.setattr("longpack.text.pipeline.INLINE_BYTES", 0)
    src = write_sft(tmp_path / "d.jsonl")
    rust = _rust_tokenizer()
    folder = tmp_path / "tok"
    folder.mkdir()
    rust.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    common = {"inputs": [str(src)], "seq_length": 64, "val_fraction": 0.1}
    by_path = PackConfig(out=tmp_path / "path", tokenizer=str(folder), workers=1, **common).run()
    by_object = PackConfig(out=tmp_path / "object", tokenizer=rust, workers=2, **common).run()
    # Same rows; the manifest differs only in how it names the tokenizer.
    same_files(tmp_path / "path", tmp_path / "object", skip=("manifest.json",))
    assert by_path.counts == by_object.counts and by_object.counts["packed"] > 250
    assert by_path.tokenizer["eos_id"] == by_object.tokenizer["eos_id"] == rust.token_to_id("<|endoftext|>")
    assert "path" in by_path.tokenizer and "in-memory" in by_object.tokenizer["source"]
    assert by_object.tokenizer["files"]["tokenizer.json"] != by_path.tokenizer["files"]["tokenizer.json"]
    assert rust.post_processor is None and rust.to_str() == _rust_tokenizer().to_str()  # not changed


def test_longpack_tokenizer_object_and_bad_objects(tmp_path: Path) -> None:
    from longpack.text.tokenizers import BytesTokenizer

    src = write_sft(tmp_path / "d.jsonl", 50)
    spec = PackConfig(
        inputs=[str(src)], out=tmp_path / "a", tokenizer="bytes", seq_length=64, workers=1
    ).run()
    obj = PackConfig(inputs=[str(src)], out=tmp_path / "b", tokenizer=BytesTokenizer(), seq_length=64).run()
    same_files(tmp_path / "a", tmp_path / "b")
    assert spec.counts == obj.counts
    with pytest.raises(LongpackError, match="cannot use an object of type dict") as info:
        PackConfig(inputs=[str(src)], out=tmp_path / "c", tokenizer={"vocab": 1}, seq_length=64).run()
    assert info.value.fields == ("tokenizer",) and not (tmp_path / "c").exists()


def test_transformers_fast_tokenizer_is_accepted(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=_rust_tokenizer(), eos_token="<|endoftext|>")
    src = write_sft(tmp_path / "d.jsonl", 60)
    result = PackConfig(inputs=[str(src)], out=tmp_path / "o", tokenizer=fast, seq_length=64, workers=1).run()
    assert result.tokenizer["eos_id"] == fast.eos_token_id and result.counts["packed"] == 60


# --- the CLI around the jobs ----------------------------------------------------------------------------


def test_cli_translates_fields_to_flags_and_reports_internal_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_sft(tmp_path / "d.jsonl", 5)
    base = ["pack", str(src), "--out", str(tmp_path / "o"), "--tokenizer", "bytes"]
    res = runner.invoke(app, [*base, "--seq-length", "64", "--pack-size", "32"])
    assert res.exit_code == 2
    assert res.output.startswith("error: --seq-length (64) must not exceed --pack-size (32)")
    res = runner.invoke(app, [*base, "--seq-length", "64", "--ray-address", "auto"])
    assert res.exit_code == 2 and "--ray-address needs --backend ray" in res.output

    def broken(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    monkeypatch.setattr(PackConfig, "run", broken)
    res = runner.invoke(app, [*base, "--seq-length", "64"])
    assert res.exit_code == 3 and "internal error" in res.output and "RuntimeError: boom" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["--debug", *base, "--seq-length", "64"])
    assert res.exit_code == 3 and "Traceback" in res.output and "raise RuntimeError" in res.output


def test_cli_version_help_choices_flags_and_order() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == longpack.__version__
    top = runner.invoke(app, ["--help"]).output
    order = ["pack", "inspect", "sweep", "check", "plan", "balance", "online-sim", "thd-batch", "cp-check",
             "topology"]  # fmt: skip
    positions = [top.index(f"│ {name} ") for name in order]
    assert positions == sorted(positions), top
    helps = runner.invoke(app, ["pack", "--help"], terminal_width=200).output
    assert "drop|truncate|f" in helps and "local|ray" in helps and "int64|int32" in helps
    assert "<bool>" not in helps and "--overwrite " in helps
    balance_help = runner.invoke(app, ["balance", "--help"], terminal_width=200).output
    assert (
        "--model-shape" in balance_help and "--pack-size" in balance_help and "--capacity" not in balance_help
    )


def test_old_flag_spellings_still_work_with_a_warning(tmp_path: Path) -> None:
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(10 + i % 50) for i in range(200)))
    new = runner.invoke(app, ["online-sim", "--pack-size", "100", "--lengths", str(lengths), "--json"])
    old = runner.invoke(app, ["online-sim", "--capacity", "100", "--lengths", str(lengths), "--json"])
    assert new.exit_code == old.exit_code == 0
    assert "--capacity is deprecated; use --pack-size" in old.output

    def fills(doc: dict) -> list:  # every row but its timing (packs_per_s)
        return [{k: v for k, v in row.items() if k != "packs_per_s"} for row in doc["rows"]]

    old_doc, new_doc = json.loads(old.output.split("\n", 1)[1]), json.loads(new.output)
    assert fills(old_doc) == fills(new_doc) and old_doc["capacity"] == new_doc["capacity"] == 100


def test_the_librarys_choice_lists_are_longpack_choices() -> None:
    """Each choice list is written once (``longpack.choices``); the layers that act on a choice re-export it."""
    from longpack import choices
    from longpack.balance.schedule import SAMPLERS, SCHEDULES
    from longpack.binpack import ALGORITHMS
    from longpack.online.simulate import WORKLOADS
    from longpack.packed.align import OVERLENGTH_POLICIES
    from longpack.packed.pipeline import COMPAT_MODES, IDS_DTYPES, OUTPUT_FORMATS
    from longpack.planner.options import CP_COMM_TYPES, DISPATCHERS, OPTIMIZERS, PRECISIONS
    from longpack.rules.config import DatasetKind
    from longpack.text.rows import FORMATS

    assert ALGORITHMS is choices.ALGORITHMS and OVERLENGTH_POLICIES is choices.OVERLENGTH_POLICIES
    assert (IDS_DTYPES, OUTPUT_FORMATS, COMPAT_MODES) == (
        choices.IDS_DTYPES,
        choices.OUTPUT_FORMATS,
        choices.COMPAT_MODES,
    )
    assert FORMATS is choices.TEXT_FORMATS and WORKLOADS is choices.WORKLOADS
    assert (PRECISIONS, DISPATCHERS, OPTIMIZERS, CP_COMM_TYPES) == (
        choices.PRECISIONS,
        choices.DISPATCHERS,
        choices.OPTIMIZERS,
        choices.CP_COMM_TYPES,
    )
    assert SCHEDULES is choices.SCHEDULES and SAMPLERS is choices.SAMPLERS
    # the rules' dataset kinds are an enum (pydantic parses them): its values are the one list
    assert tuple(k.value for k in DatasetKind) == choices.DATASET_KINDS


# --- processes: plain scripts, start methods, light import ----------------------------------------------


def _run_script(path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    return subprocess.run(
        [sys.executable, str(path), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_plain_script_without_main_guard_tokenizes_with_workers(tmp_path: Path, start_method: str) -> None:
    """A script with no ``if __name__ == "__main__":`` guard, under a start method that would run it again
    in every multiprocessing child: the worker processes must not import it."""
    src = write_sft(tmp_path / "big.jsonl", 30_000)
    assert src.stat().st_size > 2 * inputs_mod.JSONL_CHUNK_BYTES  # more than one chunk
    script = tmp_path / "plain_script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import multiprocessing, sys
            multiprocessing.set_start_method({start_method!r})
            print("script body ran", flush=True)  # must print once: workers never run this file

            from longpack.text import TextConfig, tokenize_inputs, workers
            import longpack.text.pipeline
            longpack.text.pipeline.INLINE_BYTES = 0  # a few MB: with worker processes all the same

            started = []
            class CountingPool(workers.WorkerPool):
                def __init__(self, n, **kw):
                    started.append(n)
                    super().__init__(n, **kw)
            workers.WorkerPool = CountingPool

            r = tokenize_inputs([{str(src)!r}], tokenizer="bytes", config=TextConfig(), workers=2)
            import longpack
            p = longpack.PackConfig(inputs=[{str(src)!r}], out="packed", tokenizer="bytes", seq_length=1024,
                                    workers=2).run()
            print("pools", started, "samples", len(r.samples), "packed", p.counts["packed"])
            """
        )
    )
    done = _run_script(script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("script body ran") == 1, done.stdout
    assert "pools [2, 2] samples 30000 packed 30000" in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_readme_example_runs_as_a_script(tmp_path: Path, start_method: str) -> None:
    """``examples/pack_demo.py`` (the README's three lines), run as a plain script's body."""
    example = REPO / "examples" / "pack_demo.py"
    assert len([ln for ln in example.read_text().splitlines() if ln.strip()]) <= 3
    runner_script = tmp_path / "run_example.py"
    runner_script.write_text(
        f"import multiprocessing\nmultiprocessing.set_start_method({start_method!r})\n"
        f"exec(compile(open({str(example)!r}).read(), {str(example)!r}, 'exec'))\n"
    )
    done = _run_script(runner_script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out" / "demo"
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["samples_read"] == 12000 and counts["packed"] + counts["dropped"] == 12000
    printed_counts, printed_out = done.stdout.strip().rsplit(" ", 1)
    assert ast.literal_eval(printed_counts) == counts and printed_out == str(out.resolve())
    assert manifest["inputs"][0]["path"].startswith("<longpack-demo>")


def test_import_longpack_stays_light() -> None:
    code = (
        "import sys, longpack; heavy = [m for m in ('numba', 'pyarrow', 'torch', 'numpy', 'ray') "
        "if m in sys.modules]; c = longpack.CheckConfig; heavy2 = [m for m in ('numba', 'pyarrow', 'torch') "
        "if m in sys.modules]; print(heavy, heavy2)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "[] []"


def test_demo_reads_the_cached_data_and_its_manifest_does_not_depend_on_where_it_lies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import longpack.jobs.pack as pack_job
    from longpack.text import demo_folder

    monkeypatch.setenv("LONGPACK_CACHE", str(tmp_path / "cache"))

    def demo(out: str) -> bytes:
        PackConfig(demo=True, tokenizer="bytes", seq_length=8192, out=tmp_path / out).run()
        return (tmp_path / out / "manifest.json").read_bytes()

    cold = demo("cold")  # generates the cache
    cached = demo_folder()
    assert cached.is_relative_to(tmp_path / "cache")
    stamp = [(cached / f).stat().st_mtime_ns for f in ("chat.jsonl", "prompt_completion.jsonl")]
    warm = demo("warm")  # reads it: not generated again
    assert [(cached / f).stat().st_mtime_ns for f in ("chat.jsonl", "prompt_completion.jsonl")] == stamp

    def unwritable(*args: Any, **kwargs: Any) -> Path:
        raise PermissionError(13, "Permission denied", str(tmp_path / "cache"))

    monkeypatch.setattr("longpack.text.demo_folder", unwritable)
    fallback = demo("tmp")  # a cache that cannot be written: a temporary copy, as before
    assert cold == warm == fallback
    manifest = json.loads(cold)
    assert [i["path"] for i in manifest["inputs"]] == [
        "<longpack-demo>/longpack-demo/chat.jsonl",
        "<longpack-demo>/longpack-demo/prompt_completion.jsonl",
    ]
    for name in manifest["splits"]["training"]["files"]:
        assert (tmp_path / "cold" / name["name"]).read_bytes() == (
            tmp_path / "tmp" / name["name"]
        ).read_bytes()
    assert pack_job.DEMO_LABEL == "<longpack-demo>"
