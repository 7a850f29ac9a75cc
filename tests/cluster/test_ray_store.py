"""``longpack tokenize --backend ray`` on a real local Ray cluster (2 CPUs): every shard of the store is
tokenized and written by a Ray task; the store is byte-identical to the local sharded one, and reads as the
same samples as the one-array store. Skipped without Ray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from longpack.jobs import TokenizeConfig
from longpack.store import TokenStore

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(
        num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False, log_to_driver=False,
        configure_logging=False,
    )  # fmt: skip
    yield
    ray.shutdown()


def test_ray_tokenize_writes_the_same_sharded_store(ray_cluster, tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(0)
    (d / "a.jsonl").write_text(
        "".join(
            json.dumps({"text": "" if i % 17 == 0 else "tok " * int(rng.integers(1, 60))}) + "\n"
            for i in range(900)
        )
    )
    (d / "b.jsonl").write_text('{"text": "last one"}\n{"oops": 1}\n')
    common = {"inputs": [d], "tokenizer": "bytes", "shard_bytes": "6K", "text": _skip()}
    on_ray = TokenizeConfig(**common, out=tmp_path / "ray", backend="ray", workers=2).run()
    local = TokenizeConfig(**common, out=tmp_path / "local", workers=1).run()
    one = TokenizeConfig(inputs=[d], tokenizer="bytes", text=_skip(), out=tmp_path / "one", workers=1).run()
    assert on_ray.summary()["shards"] > 4
    files = sorted(p.relative_to(local.out) for p in local.out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(on_ray.out) for p in on_ray.out.rglob("*") if p.is_file())
    for name in files:
        assert (on_ray.out / name).read_bytes() == (local.out / name).read_bytes(), name
    a, b = TokenStore.open(on_ray.out), TokenStore.open(one.out)
    assert np.array_equal(a.samples.tokens, b.samples.tokens)
    assert np.array_equal(a.samples.source_row, b.samples.source_row)
    assert a.record == b.record and len(a.record["empty"]) == 53 and len(a.record["malformed"]) == 1


def _skip():
    from longpack.text import TextConfig

    return TextConfig(skip_malformed=True)
