"""Tokenize once, re-pack anywhere: packing from a token store writes the same files as packing from the
inputs with the same settings (any pack size, pad_seq_to_mult, algorithm, split, seed, output format), the
manifest differing only by where the tokens came from; a store whose inputs changed is refused, naming
what changed; a store is written atomically, manifest last."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from longpack.errors import ConfigError, InputError, OutputExistsError
from longpack.jobs import PackConfig, TokenizeConfig
from longpack.store import STORE_MANIFEST, TokenStore
from longpack.text import TextConfig


def _inputs(folder: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    a, b = folder / "pc.jsonl", folder / "chat.jsonl"
    with open(a, "w") as fh:
        for i in range(300):
            n = int(rng.integers(1, 120))
            fh.write(json.dumps({"prompt": "p" * n, "completion": "c" * int(rng.integers(1, 60))}) + "\n")
            if i % 97 == 5:
                fh.write("\n")
    with open(b, "w") as fh:
        for _ in range(200):
            turns = [
                {"role": "user", "content": "u" * int(rng.integers(1, 80))},
                {"role": "assistant", "content": "a" * int(rng.integers(1, 80))},
            ]
            fh.write(json.dumps({"messages": turns}) + "\n")
    return [a, b]


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> tuple[list[Path], Path]:
    root = tmp_path_factory.mktemp("store")
    inputs = _inputs(root / "in")
    TokenizeConfig(inputs=inputs, out=root / "store", tokenizer="bytes", workers=1).run()
    return inputs, root / "store"


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in ("manifest.json", "bridge_config.yaml")
    }


CASES = [
    {"seq_length": 256},
    {"seq_length": 512, "pad_seq_to_mult": 8, "algorithm": "first_fit_shuffle", "seed": 7},
    {"seq_length": 300, "pack_size": 384, "tp": 2, "cp": 2, "sp": True, "val_fraction": 0.1},
    {"seq_length": 256, "output_format": "npy", "val_fraction": 0.2, "seed": 3},
    {"seq_length": 256, "ids_dtype": "int32", "row_group_size": 3, "overlength": "truncate"},
    {"seq_length": 256, "compat": "megatron-bridge"},
]


@pytest.mark.parametrize("settings", CASES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_pack_from_store_is_byte_identical(
    tmp_path: Path, data: tuple[list[Path], Path], settings: dict[str, Any]
) -> None:
    inputs, store = data
    text = TextConfig(min_tokens=1) if settings.get("compat") else TextConfig()
    if settings.get("compat"):  # Bridge keeps one-token samples: the store must be tokenized so
        store = tmp_path / "store1"
        TokenizeConfig(inputs=inputs, out=store, tokenizer="bytes", text=text, workers=1).run()
    direct = PackConfig(
        inputs=inputs, out=tmp_path / "direct", tokenizer="bytes", workers=1, **settings
    ).run()
    again = PackConfig(store=store, out=tmp_path / "again", **settings).run()
    assert _files(tmp_path / "direct") == _files(tmp_path / "again")
    a = json.loads((tmp_path / "direct" / "manifest.json").read_text())
    b = json.loads((tmp_path / "again" / "manifest.json").read_text())
    assert b.pop("store")["samples"] == len(TokenStore.open(store).samples)
    assert a == b
    assert direct.counts == again.counts


def test_keep_store_then_repack(tmp_path: Path, data: tuple[list[Path], Path]) -> None:
    inputs, store = data
    PackConfig(
        inputs=inputs,
        out=tmp_path / "first",
        tokenizer="bytes",
        seq_length=256,
        keep_store=tmp_path / "kept",
        workers=1,
    ).run()
    kept, made = TokenStore.open(tmp_path / "kept"), TokenStore.open(store)
    for name in ("tokens", "loss_mask", "offsets", "source_file", "source_row"):
        assert np.array_equal(getattr(kept.samples, name), getattr(made.samples, name))
    PackConfig(store=tmp_path / "kept", out=tmp_path / "second", seq_length=256).run()
    assert _files(tmp_path / "first") == _files(tmp_path / "second")


def test_changed_inputs_are_refused_with_what_changed(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path / "in")
    TokenizeConfig(inputs=inputs, out=tmp_path / "s", tokenizer="bytes", workers=1).run()
    PackConfig(store=tmp_path / "s", out=tmp_path / "ok", seq_length=256).run()
    text = inputs[0].read_bytes()
    inputs[0].write_bytes(text.replace(b'"p', b'"q', 1))  # same size, other bytes
    with pytest.raises(InputError, match=r"pc\.jsonl: its bytes changed"):
        PackConfig(store=tmp_path / "s", out=tmp_path / "no", seq_length=256).run()
    inputs[0].write_bytes(text + b"\n")
    with pytest.raises(InputError, match=r"pc\.jsonl: size"):
        PackConfig(store=tmp_path / "s", out=tmp_path / "no", seq_length=256).run()
    inputs[0].write_bytes(text)  # back to the bytes it was tokenized from: accepted (time differs, hash same)
    PackConfig(store=tmp_path / "s", out=tmp_path / "ok2", seq_length=256).run()
    inputs[1].unlink()
    with pytest.raises(InputError, match=r"chat\.jsonl: the input is gone"):
        PackConfig(store=tmp_path / "s", out=tmp_path / "no", seq_length=256).run()


def test_other_text_options_or_tokenizer_are_refused(tmp_path: Path, data: tuple[list[Path], Path]) -> None:
    _, store = data
    with pytest.raises(ConfigError, match=r"min_tokens=2.*min_tokens=1"):
        PackConfig(store=store, out=tmp_path / "o", seq_length=256, text=TextConfig(min_tokens=1))
    PackConfig(
        store=store, out=tmp_path / "o", seq_length=256, text=TextConfig(min_tokens=2)
    )  # the same: fine
    with pytest.raises(ConfigError, match="not the one the store was tokenized with"):
        PackConfig(store=store, out=tmp_path / "o", seq_length=256, tokenizer="qwen3").run()
    with pytest.raises(ConfigError, match=r"local backend"):
        PackConfig(store=store, out=tmp_path / "o", seq_length=256, backend="ray")
    with pytest.raises(ConfigError, match=r"store replaces inputs"):
        PackConfig(store=store, inputs=["x.jsonl"], out=tmp_path / "o", seq_length=256)


def test_unfinished_or_damaged_stores_are_refused(tmp_path: Path, data: tuple[list[Path], Path]) -> None:
    inputs, _ = data
    TokenizeConfig(inputs=inputs, out=tmp_path / "s", tokenizer="bytes", workers=1).run()
    with pytest.raises(OutputExistsError):
        TokenizeConfig(inputs=inputs, out=tmp_path / "s", tokenizer="bytes", workers=1).run()
    (tmp_path / "s" / "offsets.npy").write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"offsets\.npy cannot be read"):
        TokenStore.open(tmp_path / "s")
    (tmp_path / "s" / STORE_MANIFEST).unlink()
    with pytest.raises(InputError, match="unfinished"):
        TokenStore.open(tmp_path / "s")
    with pytest.raises(InputError, match=r"no readable store\.json"):
        PackConfig(store=tmp_path / "s", out=tmp_path / "o", seq_length=256)
    r = TokenizeConfig(inputs=inputs, out=tmp_path / "s", tokenizer="bytes", workers=1, overwrite=True).run()
    assert r.summary()["samples"] == len(TokenStore.open(tmp_path / "s").samples)


def test_sweep_from_store_equals_sweep_from_inputs(data: tuple[list[Path], Path]) -> None:
    from longpack.jobs import SweepConfig

    inputs, store = data
    kwargs: dict[str, Any] = {"pack_lengths": [128, 256, 512], "token_slots": 4096, "pad_seq_to_mult": 4}
    direct = SweepConfig(inputs=inputs, tokenizer="bytes", workers=1, **kwargs).run().to_dict()
    stored = SweepConfig(store=store, **kwargs).run().to_dict()
    assert direct == stored
