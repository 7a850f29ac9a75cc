"""Round three (issue 27): values that were accepted and gave a silently wrong result.

Duplicate keys in a config file (the last one won without a word), an override key with Hydra's group
syntax (set, and read by nothing), ``pad_seq_to_mult`` larger than the pack (an info), nested / 2-D
``input_ids`` for the online packer (flattened into one sample), float and string indices for
``PackedDataset`` (``int(1.7)`` read row 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_helpers import assert_clean, examples, invoke
from longpack.errors import OnlineError

FIXTURE_OK = [HealthCheck.function_scoped_fixture]
KEYS = st.sampled_from(["seq_length", "context_parallel_size", "micro_batch_size", "seed", "a", "b_c"])
SCALARS = st.one_of(st.integers(1, 9999), st.booleans(), st.sampled_from(["x", "bf16"]))


@st.composite
def configs_with_a_duplicate(draw) -> tuple[list, str]:
    """A nested config as a list of (key, value) pairs, one mapping holding one key twice; and the
    dotted path of the duplicate."""
    sections = draw(
        st.lists(st.sampled_from(["model", "train", "dataset", "ddp"]), min_size=1, max_size=3, unique=True)
    )
    doc: list = []
    for section in sections:
        keys = draw(st.lists(KEYS, min_size=1, max_size=4, unique=True))
        doc.append((section, [(k, draw(SCALARS)) for k in keys]))
    where = draw(st.integers(-1, len(doc) - 1))  # -1: a duplicate top-level section
    if where < 0:
        first = doc[0]
        doc.insert(draw(st.integers(1, len(doc))), (first[0], [(k, draw(SCALARS)) for k, _ in first[1]]))
        return doc, first[0]
    section, pairs = doc[where]
    key, _ = draw(st.sampled_from(pairs))
    pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(SCALARS)))
    # the first occurrence is the one earlier in the list
    return doc, f"{section}.{key}"


def _yaml(doc: list) -> str:
    lines = []
    for section, pairs in doc:
        lines.append(f"{section}:")
        lines += [f"  {k}: {json.dumps(v)}" for k, v in pairs]
    return "\n".join(lines) + "\n"


def _json(doc: list) -> str:
    sections = []
    for section, pairs in doc:
        body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in pairs)
        sections.append(f"  {json.dumps(section)}: {{\n{body}\n  }}")
    return "{\n" + ",\n".join(sections) + "\n}\n"


@settings(max_examples=examples(25), deadline=None, suppress_health_check=FIXTURE_OK)
@given(case=configs_with_a_duplicate(), kind=st.sampled_from(["yaml", "json"]))
def test_a_key_given_twice_in_a_config_is_refused_naming_both_lines(tmp_path_factory, case, kind) -> None:
    doc, dotted = case
    text = _yaml(doc) if kind == "yaml" else _json(doc)
    path = tmp_path_factory.mktemp("dup") / f"config.{kind}"
    path.write_text(text)
    outcome = assert_clean(invoke(["check", path]))
    assert outcome.exit_code == 2 and f"'{dotted}' is given twice" in outcome.output, (text, str(outcome))
    lines = _lines_of(text, dotted, kind)
    assert f"(lines {lines[0]} and {lines[1]})" in outcome.output, (text, lines, str(outcome))


def _lines_of(text: str, dotted: str, kind: str) -> list[int]:
    """The lines where ``dotted`` (``section`` or ``section.key``) is written, in the text drawn above."""
    quote = json.dumps if kind == "json" else str
    section, _, key = dotted.partition(".")
    found, inside = [], False
    for n, line in enumerate(text.splitlines(), 1):
        depth = len(line) - len(line.lstrip())
        if depth == (2 if kind == "json" else 0) and line.strip().endswith(("{", ":")):
            inside = line.strip().startswith(f"{quote(section)}:")
            if inside and not key:
                found.append(n)
        elif inside and key and line.strip().startswith(f"{quote(key)}:"):
            found.append(n)
    return found


@settings(max_examples=examples(15), deadline=None)
@given(
    parts=st.lists(st.sampled_from(["model", "train", "seq_length", "cp", "x"]), min_size=2, max_size=4),
    joiner=st.sampled_from(["/", "@"]),
    prefix=st.sampled_from(["", "+", "++", "~"]),
    value=st.sampled_from(["8192", "true", "[1, 2]", "abc"]),
)
def test_an_override_key_with_group_syntax_is_refused(parts, joiner, prefix, value) -> None:
    key = parts[0] + joiner + ".".join(parts[1:])
    override = f"{prefix}{key}" if prefix == "~" else f"{prefix}{key}={value}"
    outcome = assert_clean(invoke(["check", override]))
    assert outcome.exit_code == 2 and "would go unused" in outcome.output, str(outcome)


@settings(max_examples=examples(15), deadline=None)
@given(
    exponent=st.integers(6, 14),
    over=st.integers(1, 4),
    cp=st.sampled_from([1, 2, 4]),
)
def test_pad_seq_to_mult_larger_than_the_pack_is_an_error(exponent, over, cp) -> None:
    pack = 2**exponent
    mult = pack * 2**over
    overrides = [
        f"model.seq_length={pack}",
        f"dataset.seq_length={pack}",
        "dataset.enable_offline_packing=true",
    ]
    overrides += [f"dataset.offline_packing_specs.packed_sequence_size={pack}"]
    overrides += [
        f"dataset.offline_packing_specs.pad_seq_to_mult={mult}",
        f"model.context_parallel_size={cp}",
    ]
    outcome = assert_clean(invoke(["check", *overrides, "--json"]))
    findings = {f["id"]: f for f in json.loads(outcome.output)["findings"]}
    assert outcome.exit_code == 1 and findings["LP-PACK-017"]["severity"] == "error", findings
    assert "LP-PACK-009" not in findings  # one finding, not "only wasteful" beside it


def test_pad_seq_to_mult_larger_than_the_pack_is_refused_by_pack(world, tmp_path: Path) -> None:
    outcome = assert_clean(
        invoke(
            [
                "pack",
                world.good,
                "--out",
                tmp_path / "o",
                "--tokenizer",
                "bytes",
                "--seq-length",
                "64",
                "--pad-seq-to-mult",
                "128",
            ]
        )
    )
    assert outcome.exit_code == 2 and "--pad-seq-to-mult" in outcome.output, str(outcome)


# -- OnlinePacker: one sample per item ------------------------------------------------------------------------


@settings(max_examples=examples(25), deadline=None)
@given(
    shape=st.one_of(
        st.just(()),
        st.tuples(st.integers(1, 4), st.integers(1, 6)),
        st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
    ),
    as_list=st.booleans(),
    field=st.sampled_from(["input_ids", "loss_mask"]),
)
def test_online_packer_refuses_a_sample_that_is_not_flat(shape, as_list, field) -> None:
    from longpack.online.packer import OnlinePacker

    n = int(np.prod(shape)) if shape else 1
    bad = np.ones(shape, dtype=np.int64)
    sample = {"input_ids": list(range(1, n + 1)), "loss_mask": [1] * n}
    sample[field] = bad.tolist() if as_list else bad
    with pytest.raises(OnlineError, match=r"1-D|flat"):
        list(OnlinePacker(64, 2).rows([sample]))


def test_online_packer_refuses_ragged_nested_ids() -> None:
    from longpack.online.packer import OnlinePacker

    with pytest.raises(OnlineError, match="input_ids"):
        list(OnlinePacker(64, 2).rows([{"input_ids": [[1, 2], [3]]}]))


# -- PackedDataset: integer indices only -------------------------------------------------------------------------


@settings(max_examples=examples(20), deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    index=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(0, 3).map(float),
        st.text(max_size=3),
        st.booleans(),
        st.just(np.float32(1.0)),
        st.just(np.bool_(True)),
        st.just(None),
    ),
    batch=st.booleans(),
)
def test_packed_dataset_refuses_indices_that_are_not_integers(world, index, batch) -> None:
    pytest.importorskip("torch")
    from longpack.runtime.dataset import PackedDataset

    ds = PackedDataset(world.packed, split="training")
    with pytest.raises(TypeError, match="indices must be integers"):
        ds.__getitems__([0, index]) if batch else ds[index]


def test_packed_dataset_takes_numpy_and_tensor_integers(world) -> None:
    torch = pytest.importorskip("torch")
    from longpack.runtime.dataset import PackedDataset

    ds = PackedDataset(world.packed, split="training")
    want = ds[1]["input_ids"]
    for index in (np.int32(1), np.int64(1), torch.tensor(1), 1):
        assert np.array_equal(ds[index]["input_ids"], want)
