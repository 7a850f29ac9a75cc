"""Round three of hostile input (issue 27): the classes that still reached an internal error (exit 3).

Each class has a generator (hypothesis draws the cases) and runs the command as a user would: lone
surrogates in text (escaped or raw, plain or gzip, strict or ``--skip-malformed``), chat templates that
recurse, Hugging Face ``config.json`` files with impossible counts, ``--layout`` sizes, output paths with a
colon, symbolic-link loops, a full temporary folder for ``cp-check`` and numpy scalars in ``*Config``
fields.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_helpers import assert_accounting, assert_clean, examples, invoke

PACK = ["--tokenizer", "bytes", "--seq-length", "64"]
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


# -- lone surrogates in a text field ------------------------------------------------------------------------

SURROGATES = st.integers(0xD800, 0xDFFF)


def _escaped(code: int) -> str:
    return f"\\u{code:04x}"


def _row_with_surrogate(draw_code: int, where: str, raw: bool) -> bytes:
    """A JSON Lines row whose ``where`` text holds one lone surrogate, as a ``\\udXXX`` escape or as the
    three bytes Python's ``surrogatepass`` writes (``json.loads`` of bytes lets both through)."""
    marker = "@@S@@"
    if where == "chat":
        row = {
            "messages": [{"role": "user", "content": f"hi{marker}"}, {"role": "assistant", "content": "yo"}]
        }
    else:
        row = {"prompt": "q", "completion": "a"}
        row[where] = f"x{marker}y"
    text = json.dumps(row)
    if raw:
        return text.replace(marker, chr(draw_code)).encode("utf-8", "surrogatepass")
    return text.replace(marker, _escaped(draw_code)).encode()


@settings(max_examples=examples(12), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    code=SURROGATES,
    where=st.sampled_from(["prompt", "completion"]),
    raw=st.booleans(),
    gz=st.booleans(),
    skip=st.booleans(),
    position=st.integers(0, 39),
)
def test_a_lone_surrogate_is_a_malformed_row(world, tmp_path_factory, code, where, raw, gz, skip, position):
    folder = tmp_path_factory.mktemp("surrogate")
    lines = world.good.read_bytes().splitlines()
    lines.insert(position, _row_with_surrogate(code, where, raw))
    data = b"\n".join(lines) + b"\n"
    path = folder / ("rows.jsonl.gz" if gz else "rows.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    out = folder / "out"
    outcome = assert_clean(
        invoke(["pack", path, "--out", out, *PACK, *(["--skip-malformed"] if skip else [])]),
        frozenset({0, 2}),
    )
    if skip:
        assert outcome.exit_code == 0, str(outcome)
        manifest = _manifest(out)
        assert_accounting(manifest)
        assert manifest["counts"]["malformed"] == 1
        assert manifest["malformed"][0]["source"].endswith(f"{path.name}:{position + 1}")
        assert "surrogate" in manifest["malformed"][0]["reason"]
    else:
        assert outcome.exit_code == 2 and f"{path.name}:{position + 1}" in outcome.output, str(outcome)
        assert f"U+{code:04X}" in outcome.output and "surrogate" in outcome.output


def test_a_lone_surrogate_in_chat_content_is_a_malformed_row(world, tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_bytes(_row_with_surrogate(0xDC80, "chat", raw=False) + b"\n")
    outcome = assert_clean(
        invoke(["pack", data, "--out", tmp_path / "o", "--tokenizer", "qwen3", "--seq-length", "64"])
    )
    assert outcome.exit_code == 2 and "messages[0].content" in outcome.output, str(outcome)


# -- chat templates that recurse, or cannot be parsed ------------------------------------------------------


def _hf_folder(folder: Path, template: str) -> Path:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "yo": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": template})
    )
    return folder


RECURSING_TEMPLATES = st.one_of(
    st.builds(
        lambda name, arg, prefix: (
            f"{{% macro {name}(x) %}}{prefix}{{{{ {name}({arg}) }}}}{{% endmacro %}}"
            f"{{{{ {name}(messages) }}}}"
        ),
        st.sampled_from(["f", "render", "m_1"]),
        st.sampled_from(["x", "x[:1]", "messages"]),
        st.sampled_from(["", "a", "{{ x }}"]),
    ),
    st.builds(
        lambda body: f"{{% for m in messages recursive %}}{body}{{{{ loop(messages) }}}}{{% endfor %}}",
        st.sampled_from(["", "{{ m['role'] }}", "<|im_start|>"]),
    ),
    st.integers(500, 3000).map(lambda n: "{{" + "(" * n + "1" + ")" * n + "}}"),
)


@settings(max_examples=examples(6), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    template=RECURSING_TEMPLATES, skip=st.booleans(), command=st.sampled_from(["pack", "preview", "sweep"])
)
def test_a_recursing_chat_template_is_an_error_naming_the_template(tmp_path_factory, template, skip, command):
    folder = tmp_path_factory.mktemp("tpl")
    tok = _hf_folder(folder / "model", template)
    data = folder / "chat.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(json.dumps(row) + "\n")
    argv = {
        "pack": ["pack", data, "--out", folder / "out", "--tokenizer", tok, "--seq-length", "64"],
        "preview": ["preview", data, "--tokenizer", tok],
        "sweep": ["sweep", data, "--tokenizer", tok, "--pack-size", "64"],
    }[command]
    skip_flag = ["--skip-malformed"] if skip and command != "preview" else []  # preview shows bad rows
    outcome = assert_clean(invoke([*argv, *skip_flag]))
    assert outcome.exit_code == 2 and "tokenizer_config.json" in outcome.output, str(outcome)
    assert "chat template" in outcome.output or "chat_template" in outcome.output


# -- Hugging Face config.json given to plan --model --------------------------------------------------------

DENSE = {
    "model_type": "llama",
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "intermediate_size": 2816,
    "vocab_size": 32000,
}
MOE = {
    **DENSE,
    "model_type": "qwen3_moe",
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
}
BAD_COUNTS = [0, -1, math.nan, math.inf, -math.inf, True, False, 1.5, 31.9, "16", [16], {"n": 16}]
PLAN = ["--gpu", "H100_SXM", "--gpus", "8", "--seq-length", "4096"]


def _json_text(config: dict) -> str:
    return json.dumps(config)  # NaN / Infinity as Python writes them (what the campaign fed)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    base=st.sampled_from([DENSE, MOE]),
    data=st.data(),
    value=st.sampled_from(BAD_COUNTS),
    command=st.sampled_from(["plan", "estimate"]),
)
def test_an_impossible_count_in_config_json_is_refused_by_field(tmp_path_factory, base, data, value, command):
    field = data.draw(st.sampled_from(sorted(k for k in base if k != "model_type")), label="field")
    config = {**base, field: value}
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(_json_text(config))
    argv = ["plan", "--model", path, *PLAN]
    if command == "estimate":
        argv = ["plan", "estimate", "--model", path, *PLAN, "--layout", "tp=1"]
    outcome = assert_clean(invoke(argv))
    if (
        value == 0
        and value is not False
        and (field == "num_experts" or (field == "intermediate_size" and base is MOE))
    ):
        return  # 0 experts is a dense model; an MoE model's experts may carry all of the FFN
    assert outcome.exit_code == 2 and field in outcome.output and "config.json" in outcome.output, str(
        outcome
    )


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"num_key_value_heads": 32}, "must divide"),
        ({"num_key_value_heads": 5}, "must divide"),
        ({"num_hidden_layers": 7.5}, "num_hidden_layers"),
        ({"num_experts_per_tok": 9}, "more than the number of experts"),
        ({"first_k_dense_replace": 9}, "first_k_dense_replace"),
    ],
)
def test_a_model_that_cannot_exist_is_refused(tmp_path: Path, change: dict, needle: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MOE, **change}))
    outcome = assert_clean(invoke(["plan", "--model", path, *PLAN]))
    assert outcome.exit_code == 2 and needle in outcome.output, str(outcome)


@settings(max_examples=examples(15), deadline=None)
@given(
    key=st.sampled_from(["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "dp"]),
    value=st.integers(-(2**40), 0),
    others=st.sampled_from(["", "tp=2,", "pp=2,mbs=1,"]),
)
def test_a_layout_size_below_one_is_refused(key: str, value: int, others: str) -> None:
    argv = ["plan", "estimate", "--model", "qwen3_8b", *PLAN, "--layout", f"{others}{key}={value}"]
    outcome = assert_clean(invoke(argv))
    assert outcome.exit_code == 2 and "--layout" in outcome.output and f"{key}=" in outcome.output, str(
        outcome
    )


# -- paths: a colon in an output folder, a symbolic-link loop named as input -----------------------------


@settings(max_examples=examples(6), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    name=st.sampled_from(["a:b", "s3:x", "file:out", "C:packed", "hdfs:", "x:/y", "gs:b"]),
    relative=st.booleans(),
)
def test_an_output_path_with_a_colon_is_a_local_folder(
    world, tmp_path_factory, monkeypatch_module, name, relative
):
    folder = tmp_path_factory.mktemp("colon")
    out = Path(name) if relative else folder / name
    monkeypatch_module.chdir(folder)
    outcome = assert_clean(invoke(["pack", world.good, "--out", out, *PACK]), frozenset({0}))
    assert (folder / name / "manifest.json").is_file(), str(outcome)
    assert_clean(invoke(["inspect", out, "--verify"]), frozenset({0}))


@pytest.fixture
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("command", ["pack", "sweep", "preview"])
@pytest.mark.parametrize("length", [1, 2, 3])
def test_a_symlink_loop_named_as_input_is_an_error(tmp_path: Path, command: str, length: int) -> None:
    links = [tmp_path / f"loop{i}.jsonl" for i in range(length)]
    for i, link in enumerate(links):
        link.symlink_to(links[(i + 1) % length])
    argv = {
        "pack": ["pack", links[0], "--out", tmp_path / "out", *PACK],
        "sweep": ["sweep", links[0], "--tokenizer", "bytes", "--pack-size", "64"],
        "preview": ["preview", links[0], "--tokenizer", "bytes"],
    }[command]
    outcome = assert_clean(invoke(argv))
    assert outcome.exit_code == 2 and "loop0.jsonl" in outcome.output, str(outcome)


def test_an_output_under_a_symlink_loop_is_an_error(world, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    outcome = assert_clean(invoke(["pack", world.good, "--out", tmp_path / "a" / "out", *PACK]))
    assert outcome.exit_code == 2 and "--out" in outcome.output, str(outcome)


# -- cp-check with a temporary folder it cannot write -----------------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES])
def test_cp_check_with_a_full_temp_folder_says_so(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    pytest.importorskip("torch")
    import tempfile

    class Unwritable:
        def __init__(self, *args, **kwargs):
            raise OSError(code, "refused", "/tmp/longpack-cp-x")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", Unwritable)
    outcome = assert_clean(invoke(["cp-check", "--cp", "2", "--dtype", "float64"]))
    assert outcome.exit_code == 2 and "TMPDIR" in outcome.output, str(outcome)


# -- numpy scalars in *Config fields -----------------------------------------------------------------------

NUMPY_INTS = st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32])


@settings(max_examples=examples(10), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    kind=NUMPY_INTS,
    field=st.sampled_from(
        ["seq_length", "tp", "cp", "pad_seq_to_mult", "seed", "rows_per_shard", "pack_size"]
    ),
    frac=st.sampled_from([np.float16, np.float32, np.float64]),
    sp=st.sampled_from([np.bool_(False), False]),
)
def test_numpy_scalars_in_pack_config_are_written_as_plain_values(
    world, tmp_path_factory, kind, field, frac, sp
):
    """A config built from numpy values (an array's element) packs and writes bridge_config.yaml and the
    manifest; before, the writers failed after the work was done."""
    import yaml

    from longpack.jobs.pack import PackConfig
    from longpack.text.rows import TextConfig

    values = {
        "seq_length": 64,
        "tp": 1,
        "cp": 1,
        "pad_seq_to_mult": 1,
        "seed": 3,
        "rows_per_shard": 8,
        "pack_size": 64,
    }
    kwargs = {field: kind(values[field])}
    if field in ("tp", "cp"):
        kwargs["sp"] = sp
    out = tmp_path_factory.mktemp("np") / "out"
    config = PackConfig(
        inputs=[str(world.good)],
        out=out,
        tokenizer="bytes",
        **({"seq_length": 64} | kwargs),
        val_fraction=frac(0.25),
        text=TextConfig(min_tokens=kind(1)),
    )
    assert type(getattr(config, field)) is int and type(config.val_fraction) is float
    config.run()
    assert yaml.safe_load((out / "bridge_config.yaml").read_text())
    assert _manifest(out)["counts"]["packed"] > 0


def test_every_config_makes_numpy_scalars_plain() -> None:
    """Every ``*Config`` dataclass calls validate.plain_fields first (the one place numpy is unwrapped)."""
    import dataclasses
    import importlib
    import inspect
    import pkgutil

    import longpack.jobs

    modules = [f"longpack.jobs.{m.name}" for m in pkgutil.iter_modules(longpack.jobs.__path__)]
    modules += ["longpack.text.rows", "longpack.vlm.vision", "longpack.vlm.prepare"]
    found = 0
    for name in modules:
        module = importlib.import_module(name)
        for cls_name, cls in vars(module).items():
            if cls_name.endswith("Config") and dataclasses.is_dataclass(cls) and cls.__module__ == name:
                found += 1
                assert "plain_fields(self)" in inspect.getsource(cls.__post_init__), cls_name
    assert found >= 13
