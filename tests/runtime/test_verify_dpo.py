"""``longpack verify --dpo``: a tiny policy and reference model give every packed preference pair the DPO
loss it has alone; faults that cross pairs fail; the loss reduction is NeMo-Aligner's own."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.runtime.verify_helpers import QWEN3

from longpack.errors import ConfigError, InputError
from longpack.jobs.verify import VerifyConfig
from longpack.packed.preference import (
    PreferencePair,
    collate_packed_dpo,
    pack_preference_pairs,
    write_packed_dpo,
)
from longpack.runtime.verify import DPO_FAULTS
from longpack.runtime.verify_dpo import dpo_losses, reduce_packed_logps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nemo_aligner_dpo_harness as harness

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "nemo_aligner_dpo_loss_golden.json"


def pairs(count: int, seed: int = 0) -> list[PreferencePair]:
    rng = np.random.default_rng(seed)

    def toks(lo: int, hi: int) -> list[int]:
        return [int(t) for t in rng.integers(1, 30_000, size=int(rng.integers(lo, hi)))]

    return [PreferencePair(toks(0, 10), toks(1, 16), toks(1, 16)) for _ in range(count)]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dpo") / "packed_96_seed0.npy"
    write_packed_dpo(pack_preference_pairs(pairs(10), 96), path)
    return path


def run(path: Path, **options):
    defaults = {"model": str(QWEN3), "max_rows": 2, "time_budget": None}
    return VerifyConfig(dpo=path, **{**defaults, **options}).run()


def test_dpo_packed_equals_unpacked(packed, tmp_path):
    cert = tmp_path / "cert.json"
    result = run(packed, certificate=cert)
    assert result.ok, result.failures
    assert result.verdict.startswith("PASS: 2 of ")
    written = json.loads(cert.read_text())
    assert written["data"]["format"] == "nemo-aligner-packed-dpo" and written["model"]["beta"] == 0.2
    assert max(written["worst"].values()) < 1e-9
    assert sum(len(p) for p in written["row_pairs"].values()) == written["data"]["pairs_checked"] >= 3


@pytest.mark.parametrize("fault", sorted(DPO_FAULTS))
def test_each_fault_that_crosses_pairs_fails(packed, fault):
    result = run(packed, fault=fault, max_rows=1)
    assert not result.ok and result.verdict.startswith("FAIL")
    checks = {f["check"] for f in result.failures}
    assert {"dpo-logps", "dpo-loss"} <= checks
    first = result.failures[0]
    row_pairs = result.certificate["row_pairs"][str(first["row"])]
    assert first["sample"] in row_pairs and len(row_pairs) >= 2


def test_dpo_faults_only_on_dpo_rows_and_refusals(packed, tmp_path):
    with pytest.raises(ConfigError, match="with --dpo, the injected fault must be one of"):
        run(packed, fault="loss-on-padding")
    one = tmp_path / "one.npy"
    alone = [PreferencePair([1] * 5, [2] * 5, [3] * 5)] * 3  # 20 tokens a pair: one pair a row of 25
    write_packed_dpo(pack_preference_pairs(alone, 25), one)
    with pytest.raises(ConfigError, match="crosses pairs"):
        run(one, fault="dpo-pairs-misaligned")
    with pytest.raises(ConfigError, match="beta of --dpo rows"):
        VerifyConfig(packed=tmp_path, model="qwen3_8b", dpo_beta=0.5)
    with pytest.raises(ConfigError, match="exactly one input"):
        VerifyConfig(dpo=packed, packed=tmp_path, model="qwen3_8b")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.arange(4))
    with pytest.raises(InputError, match="not the 1-D object array"):
        run(bad)
    with pytest.raises(InputError, match="no such file"):
        run(tmp_path / "missing.npy")
    rows = pack_preference_pairs(pairs(2), 96).as_array()
    rows[0] = {**rows[0], "labels": "not a list"}
    np.save(tmp_path / "typed.npy", rows, allow_pickle=True)
    with pytest.raises(InputError, match="row 0 key 'labels' is not a non-empty list of integers"):
        run(tmp_path / "typed.npy")


def test_inconsistent_row_fails_the_metadata_check(tmp_path):
    rows = pack_preference_pairs(pairs(4), 96).as_array()
    rows[0] = {**rows[0], "lengths": [*rows[0]["lengths"][:-1], rows[0]["lengths"][-1] + 1]}
    np.save(tmp_path / "bad.npy", rows, allow_pickle=True)
    result = run(tmp_path / "bad.npy", max_rows=1)
    assert not result.ok and result.failures[0]["check"] == "dpo-metadata" and result.failures[0]["row"] == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=6))
def test_reduction_is_the_per_sequence_sum(shapes):
    ps = [PreferencePair([7] * p, [8] * c, [9] * r) for p, c, r in shapes]
    row = pack_preference_pairs(ps, 10_000).rows[0]
    batch = collate_packed_dpo([row], eos_id=0, seq_length=10_000)
    cu = batch["cu_seqlens"][0][: int(batch["cu_seqlens_argmin"][0, 0])]
    labels = torch.from_numpy(batch["labels"][0])
    logps = torch.arange(labels.numel(), dtype=torch.float64)
    got = reduce_packed_logps(logps, labels, torch.from_numpy(cu.astype(np.int64)))
    spans = list(itertools.pairwise(cu))
    sums = [float((logps[a:b] * (labels[a:b] > -1)).sum()) for a, b in spans]
    assert got.tolist() == sums[0::2] + sums[1::2]


def _check_case(case: dict, upstream: dict) -> None:
    pi = torch.tensor(case["pi_logps"], dtype=torch.float64)
    ref = torch.tensor(case["ref_logps"], dtype=torch.float64)
    labels = torch.tensor(case["labels"])
    cu = torch.tensor(case["cu_seqlens"])
    rewards = reduce_packed_logps(pi, labels, cu) - reduce_packed_logps(ref, labels, cu)
    _, loss = dpo_losses(
        reduce_packed_logps(pi, labels, cu), reduce_packed_logps(ref, labels, cu), beta=case["beta"]
    )
    assert rewards.tolist() == pytest.approx(upstream["rewards"], rel=1e-12, abs=1e-12)
    # NeMo-Aligner's split_output_tensor casts the rewards to float32 (.float()) before the loss
    assert float(loss.mean()) == pytest.approx(upstream["loss"], rel=1e-6)


def test_reduction_equals_recorded_nemo_aligner():
    doc = json.loads(GOLDEN.read_text())
    assert doc["source"].startswith("NVIDIA/NeMo-Aligner@af2b3bd96ad78190f6ebfb552b9e599e313ce027:")
    assert len(doc["cases"]) >= 10 and any(len(c["cu_seqlens"]) >= 5 for c in doc["cases"])
    for case in doc["cases"]:
        _check_case(case, case["upstream"])


@pytest.mark.skipif(
    harness.model_source_text() is None, reason="LONGPACK_NEMO_ALIGNER names no NeMo-Aligner checkout"
)
def test_reduction_equals_live_nemo_aligner():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import dpo_loss_golden

    cls = harness.load_loss_methods(harness.model_source_text() or "")
    for case in dpo_loss_golden.cases(seed=11, count=20):
        upstream = harness.run_upstream_loss(
            cls,
            torch.tensor(case["pi_logps"], dtype=torch.float64),
            torch.tensor(case["ref_logps"], dtype=torch.float64),
            torch.tensor(case["labels"]),
            torch.tensor(case["cu_seqlens"], dtype=torch.int32),
            beta=case["beta"],
        )
        _check_case(case, upstream)


def test_dpo_fault_on_sft_rows_is_refused(tmp_path):
    from tests.runtime.verify_helpers import pack

    folder = pack(tmp_path, "sft")
    with pytest.raises(ConfigError, match="crosses preference pairs; inject it with --dpo"):
        VerifyConfig(
            packed=folder, model=str(QWEN3), fault="dpo-pairs-misaligned", cp=(), pp=(), max_rows=1
        ).run()
