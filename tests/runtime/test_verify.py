"""``longpack verify`` in one process: passes on longpack's layouts, fails on every injected fault, names the row."""

from __future__ import annotations

import json

import pytest
from tests.runtime.verify_helpers import EOS, QWEN3, pack

from longpack.errors import ConfigError, MissingDependencyError
from longpack.jobs.verify import FAULT_NAMES, VerifyConfig, megatron_backend_missing
from longpack.runtime.verify import FAULTS


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    return {
        "plain": pack(tmp, "plain", val_fraction=0.2),
        "aligned": pack(tmp, "aligned", tp=2, cp=2, sp=True),
        "fixed": pack(tmp, "fixed", pad_seq_to_mult=4, pad_cu_seqlens=True),
        "npy": pack(tmp, "npy", output_format="npy"),
    }


def run(folder, **options):
    defaults = {"model": str(QWEN3), "max_rows": 3, "cp": (), "pp": (), "time_budget": None}
    return VerifyConfig(packed=folder, **{**defaults, **options}).run()


@pytest.mark.parametrize("name", ["plain", "aligned", "fixed", "npy"])
def test_verify_passes_on_longpack_layouts(packs, name, tmp_path):
    cert = tmp_path / "cert.json"
    result = run(packs[name], certificate=cert)
    assert result.ok, result.failures
    assert result.verdict.startswith("PASS")
    written = json.loads(cert.read_text())
    assert (
        written["verdict"] == "pass" and written["versions"]["torch"] and written["versions"]["transformers"]
    )
    assert written["model"]["kept"]["vocab_size"] == 151936
    assert written["worst"]["loss_rel_diff"] <= 1e-12
    assert written["worst"]["cross_sample_gradient"] == 0.0
    for report in result.rows:
        assert report.samples >= 1 and report.loss_max_rel_diff <= 1e-12 and report.grad_max_rel_diff <= 1e-12
    if name == "plain":  # the validation split is checked too
        assert set(written["rows_checked"]) == {"training", "validation"}
        assert written["rows_checked"]["validation"]
    if name == "fixed":
        assert written["data"]["collate"] == {"pad_to_max_length": True, "pad_cu_seqlens": True}


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ("loss-on-padding", "padding"),
        ("positions-not-restarted", "metadata"),
        ("token-across-boundary", "metadata"),
        ("drop-cu-seqlens", "metadata"),
    ],
)
def test_each_fault_fails_naming_the_row(packs, fault, check):
    result = run(packs["aligned"], fault=fault, max_rows=1, thorough=True)
    assert not result.ok
    assert result.verdict.startswith("FAIL")
    first = result.failures[0]
    assert first["check"] == check and first["split"] == "training" and first["row"] is not None
    assert first["file"].startswith("training_") and first["rank"] == "single process"
    checks = {f["check"] for f in result.failures}
    if fault in ("token-across-boundary", "drop-cu-seqlens"):
        assert {"loss", "isolation"} <= checks  # the model sees it, not only the metadata check
    if fault == "loss-on-padding":
        assert "loss" in checks


def test_supervised_token_outside_cu_seqlens_fails_and_pack_counts_it(tmp_path):
    from longpack.jobs import PackConfig

    data = tmp_path / "d.jsonl"
    rows = [
        {"input_ids": [100, 200, 300, EOS, EOS], "loss_mask": [0, 1, 1, 1, 1]},
        {"input_ids": [101, 201, 301, EOS], "loss_mask": [0, 1, 1, 1]},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "p"
    result = PackConfig(
        inputs=[str(data)], out=out, tokenizer="qwen3", seq_length=16, pack_size=16, pad_seq_to_mult=4
    ).run()
    counted = result.manifest.extra["supervised_outside_cu_seqlens"]["training"]
    assert counted == {"tokens": 1, "samples": 1, "listed": [f"{data}:1"]}
    assert any("outside cu_seqlens" in w for w in result.manifest.extra["warnings"])
    verdict = run(out)
    assert not verdict.ok and verdict.failures[0]["check"] == "padding" and verdict.failures[0]["sample"] == 0
    # --pad-seq-to-mult 1 (the fix) packs the same data without the class
    fixed = PackConfig(
        inputs=[str(data)], out=tmp_path / "p1", tokenizer="qwen3", seq_length=16, pack_size=16
    ).run()
    assert "supervised_outside_cu_seqlens" not in fixed.manifest.extra
    assert run(tmp_path / "p1").ok


def test_families_llama_rope_scaling_and_sliding_window(packs, tmp_path):
    llama = json.loads(QWEN3.read_text()) | {
        "model_type": "llama",
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(llama))
    assert run(packs["aligned"], model=str(tmp_path / "llama"), max_rows=1).ok
    mistral = {"model_type": "mistral", "vocab_size": 151936, "sliding_window": 8, "rope_theta": 1e6}
    (tmp_path / "mistral.json").write_text(json.dumps(mistral))
    result = run(packs["aligned"], model=str(tmp_path / "mistral.json"), max_rows=1)
    assert result.ok and result.certificate["model"]["kept"]["sliding_window"] == 8


def test_fault_names_are_the_runtime_faults():
    assert tuple(sorted(FAULTS)) == FAULT_NAMES


def test_bad_inputs_are_clear_errors(packs):
    with pytest.raises(ConfigError, match="fault must be one of"):
        VerifyConfig(packed=packs["plain"], model="qwen3_8b", fault="x")
    with pytest.raises(ConfigError, match=r"not a config\.json"):
        run(packs["plain"], model="no/such-model-anywhere")


@pytest.mark.skipif(not megatron_backend_missing(), reason="this machine can run the megatron backend")
def test_megatron_backend_says_what_is_missing(packs):
    with pytest.raises(MissingDependencyError, match="--backend megatron needs") as info:
        run(packs["plain"], backend="megatron")
    assert "CUDA" in str(info.value) or "transformer-engine" in str(info.value)
