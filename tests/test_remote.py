"""Object storage (``longpack.remote``) against a real S3-compatible server: moto's server, started by the
tests on the loopback address (no network), read and written through s3fs with the credentials and the
endpoint taken from the environment. Stores and packs at ``s3://`` are byte-identical to local ones, their
manifests are uploaded last, and a missing bucket, denied access and an interrupted upload are clear errors
(the last one resumed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from longpack import remote  # noqa: E402
from longpack.errors import OutputExistsError, StorageError  # noqa: E402
from longpack.jobs import PackConfig, TokenizeConfig  # noqa: E402
from longpack.store import STORE_MANIFEST  # noqa: E402

BUCKET = "corpus"


@pytest.fixture(scope="module")
def server():
    s = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s.start()
    host, port = s.get_host_and_port()
    yield f"http://{host}:{port}"
    s.stop()


@pytest.fixture
def s3(server, monkeypatch, tmp_path):
    """The environment an AWS client reads (credentials, endpoint), a fresh bucket, and a file system on it."""
    import s3fs

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": server,
        remote.STAGE_ENV: str(tmp_path / "stage"),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if fs.exists(BUCKET):
        fs.rm(BUCKET, recursive=True)
    fs.mkdir(BUCKET)
    return fs


def rows(n: int) -> str:
    return "".join(json.dumps({"text": f"document {i} " + "w" * (i * 7 % 150)}) + "\n" for i in range(n))


@pytest.fixture
def corpus(tmp_path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.jsonl").write_text(rows(300))
    (d / "b.jsonl").write_text(rows(120))
    return d


def upload(fs, folder: Path, prefix: str) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{prefix}/{p.relative_to(folder).as_posix()}")


def download(fs, prefix: str, folder: Path) -> Path:
    for key in fs.find(prefix):
        target = folder / key[len(prefix) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(key, str(target))
    return folder


def same_files(a: Path, b: Path, *, except_json: bool = False, url: str = "") -> None:
    """The same files with the same bytes; text files with ``a``'s path written as ``url``."""
    names = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    for name in names:
        if except_json and name.endswith(".json"):
            continue
        want = (a / name).read_bytes()
        if url and Path(name).suffix in (".yaml", ".txt"):
            want = want.replace(str(a).encode(), url.encode())
        assert want == (b / name).read_bytes(), name


def test_tokenize_from_and_to_s3_is_the_local_store(s3, corpus, tmp_path) -> None:
    upload(s3, corpus, f"{BUCKET}/raw")
    local = tmp_path / "local"
    TokenizeConfig(inputs=[corpus], out=local, tokenizer="bytes", workers=1, shard_bytes="8K").run()
    r = TokenizeConfig(
        inputs=[f"s3://{BUCKET}/raw/"],
        out=f"s3://{BUCKET}/store",
        tokenizer="bytes",
        workers=1,
        shard_bytes="8K",
    ).run()
    assert str(r.out) == f"s3://{BUCKET}/store" and r.summary()["shards"] > 1
    got = download(s3, f"{BUCKET}/store", tmp_path / "got")
    same_files(local, got, except_json=True)  # arrays byte for byte
    manifest = json.loads((got / STORE_MANIFEST).read_text())
    assert [f["path"] for f in manifest["input_files"]] == [
        f"s3://{BUCKET}/raw/a.jsonl",
        f"s3://{BUCKET}/raw/b.jsonl",
    ]
    assert str(tmp_path / "stage") not in (got / STORE_MANIFEST).read_text()  # no stage path left
    assert not any((tmp_path / "stage").iterdir())  # the stage is removed once published


def test_pack_inputs_and_outputs_on_s3_are_the_local_pack(s3, corpus, tmp_path) -> None:
    """Parquet from s3 inputs to an s3 folder, and indexed .bin/.idx from an s3 store: the local bytes;
    the manifest names the URLs; ``manifest.json`` is the last object uploaded."""
    upload(s3, corpus, f"{BUCKET}/raw")
    common = {"tokenizer": "bytes", "seq_length": 256, "workers": 1}
    local = tmp_path / "local"
    PackConfig(inputs=[str(corpus / "*.jsonl")], out=local, **common).run()
    order: list[str] = []
    stage_upload = remote.Stage.upload

    def recorded(self, fs, src, dst) -> None:
        order.append(dst)
        stage_upload(self, fs, src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(remote.Stage, "upload", recorded)
        r = PackConfig(inputs=[f"s3://{BUCKET}/raw/*.jsonl"], out=f"s3://{BUCKET}/packed", **common).run()
    assert order[-1] == f"{BUCKET}/packed/manifest.json"
    got = download(s3, f"{BUCKET}/packed", tmp_path / "got")
    same_files(local, got, except_json=True, url=f"s3://{BUCKET}/packed")
    manifest = json.loads((got / "manifest.json").read_text())
    assert f"s3://{BUCKET}/raw/a.jsonl" in json.dumps(manifest) and str(tmp_path / "stage") not in json.dumps(
        manifest
    )
    assert r.to_dict()["out"] == f"s3://{BUCKET}/packed"

    # indexed output from a store at s3
    from longpack.text import TextConfig

    TokenizeConfig(
        inputs=[corpus], out=tmp_path / "store", tokenizer="bytes", workers=1, shard_bytes="8K",
        text=TextConfig(min_tokens=1),
    ).run()  # fmt: skip
    upload(s3, tmp_path / "store", f"{BUCKET}/store")
    idx = {"seq_length": 256, "output_format": "indexed", "workers": 1}
    PackConfig(store=tmp_path / "store", out=tmp_path / "idx-local", **idx).run()
    r = PackConfig(store=f"s3://{BUCKET}/store", out=f"s3://{BUCKET}/idx", **idx).run()
    same_files(
        tmp_path / "idx-local",
        download(s3, f"{BUCKET}/idx", tmp_path / "idx-got"),
        except_json=True,
        url=f"s3://{BUCKET}/idx",
    )
    assert r.to_dict()["prefixes"] and all(
        p.startswith(f"s3://{BUCKET}/idx/") for p in r.to_dict()["prefixes"]
    )


def test_missing_bucket_and_existing_output_are_clear_errors(s3, corpus) -> None:
    with pytest.raises(
        StorageError, match=r"s3://nobucket/store: cannot check the output: the bucket does not exist"
    ):
        TokenizeConfig(inputs=[corpus], out="s3://nobucket/store", tokenizer="bytes", workers=1).run()
    with pytest.raises(
        StorageError, match=r"s3://nobucket/raw/: cannot read the input: the bucket does not exist"
    ):
        TokenizeConfig(inputs=["s3://nobucket/raw/"], out=f"s3://{BUCKET}/s", tokenizer="bytes").run()
    with pytest.raises(StorageError, match=r"cannot read the input: not found"):
        TokenizeConfig(inputs=[f"s3://{BUCKET}/nothing/"], out=f"s3://{BUCKET}/s", tokenizer="bytes").run()
    s3.pipe(f"{BUCKET}/taken/x.txt", b"x")
    with pytest.raises(OutputExistsError, match=r"out s3://corpus/taken already holds 1 objects"):
        TokenizeConfig(inputs=[corpus], out=f"s3://{BUCKET}/taken", tokenizer="bytes", workers=1).run()
    # overwrite replaces the objects: the stray one is gone, the store is complete
    TokenizeConfig(
        inputs=[corpus], out=f"s3://{BUCKET}/taken", tokenizer="bytes", workers=1, overwrite=True
    ).run()
    assert not s3.exists(f"{BUCKET}/taken/x.txt") and s3.exists(f"{BUCKET}/taken/{STORE_MANIFEST}")


def test_denied_access_is_a_clear_error(s3, server, corpus) -> None:
    """moto checks signatures and IAM policies once its no-auth allowance is set to 0: a user without an
    S3 policy is denied."""
    import urllib.request

    import boto3

    iam = boto3.client("iam", endpoint_url=server, region_name="us-east-1")
    iam.create_user(UserName="reader")
    key = iam.create_access_key(UserName="reader")["AccessKey"]

    def allowance(n: bytes) -> None:
        req = urllib.request.Request(
            f"{server}/moto-api/reset-auth", data=n, method="POST", headers={"Content-Type": "text/plain"}
        )
        urllib.request.urlopen(req).read()

    allowance(b"0")
    try:
        os.environ["AWS_ACCESS_KEY_ID"] = key["AccessKeyId"]  # restored by the fixture's monkeypatch
        os.environ["AWS_SECRET_ACCESS_KEY"] = key["SecretAccessKey"]
        with pytest.raises(StorageError, match=r"s3://corpus/store: cannot check the output: access denied"):
            TokenizeConfig(inputs=[corpus], out=f"s3://{BUCKET}/store", tokenizer="bytes", workers=1).run()
    finally:
        allowance(b"inf")


def test_interrupted_upload_reads_unfinished_and_resumes(s3, corpus, tmp_path) -> None:
    """The connection drops after 8 files (shard 0 and its shard.json, part of shard 1): no store.json in
    the bucket (unfinished), a StorageError saying so. ``--resume`` from another machine (the stage gone) downloads the shards the bucket holds, tokenizes
    only the others and uploads only what it wrote; the store is byte-identical to an uninterrupted run."""
    import shutil

    common = {"inputs": [corpus], "tokenizer": "bytes", "workers": 1, "shard_bytes": "8K"}
    TokenizeConfig(out=tmp_path / "local", **common).run()
    url = f"s3://{BUCKET}/store"
    uploaded: list[str] = []
    stage_upload = remote.Stage.upload

    def drops_after_eight(self, fs, src, dst) -> None:
        if len(uploaded) == 8:
            raise ConnectionResetError("connection reset by peer")
        uploaded.append(dst)
        stage_upload(self, fs, src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(remote.Stage, "upload", drops_after_eight)
        with pytest.raises(StorageError, match=r"upload stopped after 8 of \d+ files.*--resume"):
            TokenizeConfig(out=url, **common).run()
    assert not s3.exists(f"{BUCKET}/store/{STORE_MANIFEST}")
    shutil.rmtree(tmp_path / "stage")  # resumed elsewhere: only the bucket's objects are there

    again: list[str] = []
    from longpack.jobs import sharded_tokenize

    tokenized: list[int] = []
    write_one = sharded_tokenize._write_one

    def counted(out, plan, k, tokenizer, config):
        tokenized.append(k)
        return write_one(out, plan, k, tokenizer, config)

    def recorded(self, fs, src, dst) -> None:
        again.append(dst)
        stage_upload(self, fs, src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(remote.Stage, "upload", recorded)
        mp.setattr(sharded_tokenize, "_write_one", counted)
        TokenizeConfig(out=url, resume=True, **common).run()
    assert not set(uploaded) & set(again)  # nothing uploaded twice
    download(s3, f"{BUCKET}/store", tmp_path / "got")
    got = tmp_path / "got"
    same_files(tmp_path / "local", got, except_json=True)
    manifest = json.loads((got / STORE_MANIFEST).read_text())
    assert 0 < len(tokenized) < len(manifest["shards"])  # the finished shards were kept


def test_cli_tokenize_to_s3_and_a_storage_failure_is_exit_2(s3, corpus) -> None:
    from typer.testing import CliRunner

    from longpack.cli.app import app

    runner = CliRunner()
    upload(s3, corpus, f"{BUCKET}/raw")
    ok = runner.invoke(
        app, ["tokenize", f"s3://{BUCKET}/raw/a.jsonl", "--tokenizer", "bytes", "--workers", "1",
              "--out", f"s3://{BUCKET}/cli-store", "--json"],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["store"] == f"s3://{BUCKET}/cli-store" and s3.exists(
        f"{BUCKET}/cli-store/{STORE_MANIFEST}"
    )
    bad = runner.invoke(app, ["pack", "--store", f"s3://{BUCKET}/cli-store", "--seq-length", "256",
                              "--out", "s3://missing-bucket/packed"])  # fmt: skip
    assert (
        bad.exit_code == 2
        and "s3://missing-bucket/packed: cannot check the output: the bucket does not exist" in bad.output
    )
    assert "Traceback" not in bad.output
