"""The megatron backend: runs where CUDA, megatron-core and transformer-engine are present; skips elsewhere."""

from __future__ import annotations

import pytest
from tests.runtime.verify_helpers import QWEN3, pack

from longpack.jobs.verify import VerifyConfig, megatron_backend_missing


@pytest.mark.skipif(
    bool(megatron_backend_missing()), reason="needs CUDA, megatron-core and transformer-engine"
)
def test_megatron_backend_passes_on_gpu(tmp_path):
    folder = pack(tmp_path, "gpu", cp=2)
    result = VerifyConfig(
        packed=folder, model=str(QWEN3), backend="megatron", max_rows=4, time_budget=None
    ).run()
    assert result.ok, result.failures
    assert result.certificate["backend"] == "megatron"
