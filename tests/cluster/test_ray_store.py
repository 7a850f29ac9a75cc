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


@pytest.mark.parametrize("rows_per_shard", [None, 150])
def test_ray_indexed_output_is_byte_identical_to_local(ray_cluster, tmp_path: Path, rows_per_shard) -> None:
    from longpack.jobs import PackConfig
    from packed_helpers import output_files

    src = tmp_path / "docs.jsonl"
    rng = np.random.default_rng(3)
    src.write_text(
        "".join(
            json.dumps({"text": "" if i % 23 == 5 else "word<|im_end|> " * int(rng.integers(1, 30))}) + "\n"
            for i in range(700)
        )
    )
    common = {"inputs": [src], "tokenizer": "qwen3", "seq_length": 64, "output_format": "indexed"}
    local = PackConfig(**common, out=tmp_path / "local", workers=1, rows_per_shard=rows_per_shard).run()
    kept = tmp_path / "kept-store"
    on_ray = PackConfig(
        **common,
        out=tmp_path / "ray",
        backend="ray",
        workers=2,
        rows_per_shard=rows_per_shard,
        keep_store=kept,
    ).run()
    names = output_files(local.out)
    assert names == output_files(on_ray.out) and "data_path.txt" in names
    for name in names:
        a, b = (local.out / name).read_bytes(), (on_ray.out / name).read_bytes()
        if name == "data_path.txt":
            a, b = a.replace(str(local.out).encode(), b"<out>"), b.replace(str(on_ray.out).encode(), b"<out>")
        assert a == b, name
    assert on_ray.manifest.counts["empty"] == sum(i % 23 == 5 for i in range(700))
    from_store = PackConfig(
        store=kept, out=tmp_path / "from-store", seq_length=64, output_format="indexed", backend="ray",
        rows_per_shard=rows_per_shard,
    ).run()  # fmt: skip
    for name in names:
        if name.endswith((".bin", ".idx")):
            assert (from_store.out / name).read_bytes() == (local.out / name).read_bytes(), name


def test_a_lost_ray_worker_is_retried_and_the_store_is_the_same(ray_cluster, tmp_path: Path) -> None:
    from longpack.jobs.sharded_tokenize import tokenize_sharded
    from longpack.text import TextConfig

    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i} " * (1 + i % 30)}) + "\n" for i in range(500)))
    marker = tmp_path / "kill"
    common = {"tokenizer": "bytes", "config": TextConfig(), "shard_bytes": 4096}
    tokenize_sharded(
        [str(src)], tmp_path / "ray", backend="ray", workers=2, fail_once=(str(marker), 1), **common
    )
    assert Path(f"{marker}.task.0").exists()  # the first shard's worker died once
    tokenize_sharded([str(src)], tmp_path / "local", workers=1, **common)
    names = sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*") if p.is_file())
    for name in names:
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
