"""``longpack verify`` under CP (2 and 4 gloo ranks) and PP (stage processes): passes, and fails naming the rank."""

from __future__ import annotations

import pytest
from tests.runtime.verify_helpers import QWEN3, pack

from longpack.jobs.verify import VerifyConfig

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def cp4_pack(tmp_path_factory):
    # --cp 4 aligns every sequence to a multiple of 8; fixed width keeps the trailing segment aligned too.
    return pack(tmp_path_factory.mktemp("verify-dist"), "cp4", cp=4, pad_to_max_length=True)


def run(folder, **options):
    defaults = {"model": str(QWEN3), "max_rows": 1, "dist_rows": 1, "time_budget": None}
    return VerifyConfig(packed=folder, **{**defaults, **options}).run()


def test_cp_2_and_4_and_pp_2_pass(cp4_pack):
    result = run(cp4_pack, cp=(2, 4), pp=(2,))
    assert result.ok, result.failures
    kinds = {(d.kind, d.size) for d in result.distributed}
    assert kinds == {("cp", 2), ("cp", 4), ("pp", 2)}
    for d in result.distributed:
        assert (
            d.loss_max_rel_diff <= 1e-12
            and d.token_loss_max_rel_diff <= 1e-12
            and d.grad_max_rel_diff <= 1e-12
        )


def test_cp_positions_shifted_fails_naming_the_rank(cp4_pack):
    result = run(cp4_pack, cp=(2,), pp=(), fault="cp-positions-shifted")
    assert not result.ok
    positions = {f["rank"] for f in result.failures if "position ids" in f["detail"]}
    assert positions == {"cp rank 1 of 2"}  # the shifted rank is named; rank 0's positions are right
    assert all(f["row"] is not None and f["split"] == "training" for f in result.failures)


def test_pp_stage_without_cu_seqlens_fails_naming_the_stage(cp4_pack):
    result = run(cp4_pack, cp=(), pp=(3,), fault="drop-cu-seqlens")
    assert not result.ok
    pp = [f for f in result.failures if f["check"] == "pp"]
    assert any(f["rank"].startswith("pp stage 1 of 3") and "no cu_seqlens_q" in f["detail"] for f in pp)
    assert any("last-stage loss differs" in f["detail"] for f in pp)
    # Stage 0 received every key it needs; its gradients, sent back through the broken stage, differ.
    assert any(f["rank"].startswith("pp stage 0 of 3") and "gradients" in f["detail"] for f in pp)
