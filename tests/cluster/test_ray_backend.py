"""`longpack pack --backend ray` on a real local Ray cluster (2 CPUs): byte-identical to the local backend.

The cluster is started once for the module (``ray.init(num_cpus=2)``, 200 MB object store, no dashboard).
Skipped when Ray Data is not installed (``pip install 'longpack[ray]'``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from packed_helpers import assert_same_output

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

runner = CliRunner()


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(
        num_cpus=2,
        object_store_memory=200 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    """Three JSONL files (two formats, one over 1 MiB so it is cut into several chunks), one Parquet file
    of pretokenized rows in three row groups, a blank line and a malformed row."""
    d = tmp_path_factory.mktemp("inputs")
    pc = [
        json.dumps({"prompt": f"question {i} " * (1 + i % 7), "completion": f"answer {i} " * (1 + i % 11)})
        for i in range(9000)
    ]
    pc.insert(50, "")  # blank line: line numbers must still match
    pc.insert(70, '{"prompt": "no completion"}')  # malformed, skipped and reported with its line
    (d / "a.jsonl").write_text("\n".join(pc) + "\n")
    chat = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"hi {i} " * (1 + i % 13)},
                    {"role": "assistant", "content": f"yo {i} " * (1 + i % 29)},
                ]
            }
        )
        for i in range(600)
    ]
    (d / "b.jsonl").write_text("\n".join(chat) + "\n")
    (d / "c.jsonl").write_text("")  # empty file: hashed and listed, no rows
    ids = [[1 + (i * 7 + j) % 250 for j in range(2 + (i * 37) % 300)] for i in range(1500)]
    table = pa.table({"input_ids": ids})
    pq.write_table(table, d / "p.parquet", row_group_size=600)
    val = tmp_path_factory.mktemp("val") / "val.jsonl"
    val.write_text(
        "".join(json.dumps({"prompt": f"v{i} " * (i % 40), "completion": "ok"}) + "\n" for i in range(400))
    )
    return [str(d)]


@pytest.fixture(scope="module")
def val_input(inputs) -> str:
    return str(next(Path(inputs[0]).parent.glob("val*/val.jsonl")))


def pack(out: Path, inputs: list[str], *extra: str) -> dict:
    result = runner.invoke(
        app,
        [
            "pack",
            *inputs,
            "--out",
            str(out),
            "--tokenizer",
            "bytes",
            "--seq-length",
            "1024",
            "--skip-malformed",
            "--rows-per-shard",
            "60",
            "--json",
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def assert_same_bytes(a: Path, b: Path) -> None:
    # bridge_config.yaml names its own folder: compared with the folder paths replaced.
    names = assert_same_output(a, b)
    assert any(n.endswith(".idx.parquet") for n in names) and "manifest.json" in names


@pytest.mark.parametrize(
    "extra",
    [
        ("--algorithm", "first_fit_shuffle", "--val-fraction", "0.1", "--seed", "3"),
        ("--pad-seq-to-mult", "8", "--overlength", "truncate", "--seq-length", "200", "--val-input", "VAL"),
        ("--ids-dtype", "int32", "--pad-seq-to-mult", "4"),
    ],
    ids=["megatron-exact-val-fraction", "truncate-mult8-val-input", "ids-int32"],
)
def test_ray_output_is_byte_identical_to_local(ray_cluster, inputs, val_input, tmp_path: Path, extra) -> None:
    extra = tuple(val_input if x == "VAL" else x for x in extra)
    local = pack(tmp_path / "local", inputs, "--workers", "1", *extra)
    remote = pack(tmp_path / "ray", inputs, "--backend", "ray", *extra)
    assert_same_bytes(tmp_path / "local", tmp_path / "ray")
    assert len(local["splits"]["training"]["files"]) > 2  # several shards, written by different tasks
    assert local["counts"]["malformed"] == 1
    if "int32" in extra:
        first = tmp_path / "ray" / local["splits"]["training"]["files"][0]
        assert pq.read_schema(first).field("input_ids").type == pa.list_(pa.int32())
    mem = remote["backend"]
    assert mem["name"] == "ray" and mem["driver_peak_rss_bytes"] > 0
    assert mem["worker_peak_rss_bytes"] and all(v > 0 for v in mem["worker_peak_rss_bytes"].values())


def test_one_worker_killed_once_gives_the_same_bytes(ray_cluster, inputs, tmp_path: Path) -> None:
    from longpack.cluster import RayExecutor
    from longpack.jobs import PackConfig
    from longpack.text import TextConfig

    pack(tmp_path / "local", inputs, "--workers", "1")
    marker = tmp_path / "killed-once"
    PackConfig(
        inputs=inputs,
        out=tmp_path / "killed",
        tokenizer="bytes",
        seq_length=1024,
        rows_per_shard=60,
        text=TextConfig(skip_malformed=True),
        backend=RayExecutor(workers=1, fail_once=str(marker)),
    ).run()
    # A tokenize task and a write task each killed their worker once; Ray retried them.
    assert Path(f"{marker}.tokenize.0").exists() and Path(f"{marker}.write.0").exists()
    assert_same_bytes(tmp_path / "local", tmp_path / "killed")


def test_errors_leave_no_manifest(ray_cluster, inputs, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "only"}\n')
    result = runner.invoke(
        app,
        [
            "pack",
            str(bad),
            "--out",
            str(tmp_path / "o"),
            "--tokenizer",
            "bytes",
            "--seq-length",
            "64",
            "--backend",
            "ray",
        ],
    )
    assert result.exit_code == 2
    assert f"{bad}:2: missing key 'completion'" in result.output
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_a_write_task_that_keeps_dying_fails_cleanly_without_manifest(ray_cluster, tmp_path: Path) -> None:
    from longpack.cluster import RayBackendError, RayExecutor
    from longpack.cluster.ray_pack import MAX_TASK_RETRIES
    from longpack.jobs import PackConfig

    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": "a"}) + "\n" for i in range(100)))
    marker = tmp_path / "dies"

    class DiesWhileWriting(RayExecutor):
        def write(self, *args, **kwargs):  # tokenizing succeeds; every write attempt of shard 0 dies
            self.fail_once, self.fail_times = str(marker), MAX_TASK_RETRIES + 1
            return super().write(*args, **kwargs)

    config = PackConfig(inputs=[str(src)], out=tmp_path / "out", tokenizer="bytes", seq_length=64)
    with pytest.raises(RayBackendError, match="write stage failed after retries: The worker died"):
        replace(config, backend=DiesWhileWriting()).run()
    assert len(list(tmp_path.glob("dies.write.*"))) == MAX_TASK_RETRIES + 1  # every attempt ran and died
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_val_inputs_and_object_tokenizer_on_ray_match_local(
    ray_cluster, inputs, val_input, tmp_path: Path
) -> None:
    """The validation split indexes its own tokenized set (no call-order rule), and a tokenizer object
    travels to the Ray workers."""
    from longpack.cluster import RayExecutor
    from longpack.jobs import PackConfig
    from longpack.text import TextConfig
    from longpack.text.tokenizers import BytesTokenizer

    common = dict(
        inputs=inputs,
        val_inputs=[val_input],
        tokenizer=BytesTokenizer(),
        seq_length=512,
        rows_per_shard=40,
        text=TextConfig(skip_malformed=True),
    )
    local = PackConfig(out=tmp_path / "local", workers=1, **common).run()
    remote = PackConfig(out=tmp_path / "ray", backend=RayExecutor(workers=2), **common).run()
    assert_same_bytes(tmp_path / "local", tmp_path / "ray")
    assert local.counts == remote.counts and set(remote.splits) == {"training", "validation"}
    assert remote.backend is not None and remote.backend["name"] == "ray" and local.backend is None


def test_in_memory_tokenizer_object_is_shipped_to_ray_workers(ray_cluster, tmp_path: Path) -> None:
    """A ``tokenizers.Tokenizer`` that exists only in this process reaches the Ray tasks (pickled) and gives
    the rows the local pool gives."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from longpack.cluster import RayExecutor
    from longpack.jobs import PackConfig

    words = ["q", "a", *map(str, range(100))]
    rust = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.add_special_tokens([AddedToken("</s>", special=True)])
    src = tmp_path / "a.jsonl"
    src.write_text(
        "".join(
            json.dumps({"prompt": f"q {i % 100} " * (1 + i % 9), "completion": "a " * (1 + i % 13)}) + "\n"
            for i in range(3000)
        )
    )
    common = dict(inputs=[str(src)], tokenizer=rust, seq_length=128, rows_per_shard=50)
    local = PackConfig(out=tmp_path / "local", workers=1, **common).run()
    PackConfig(out=tmp_path / "ray", backend=RayExecutor(workers=2), **common).run()
    assert_same_bytes(tmp_path / "local", tmp_path / "ray")
    assert local.tokenizer["eos_id"] == rust.token_to_id("</s>") and local.counts["packed"] == 3000
