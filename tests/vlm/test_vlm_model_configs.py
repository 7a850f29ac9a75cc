"""The VLM model configs that ship with longpack: one per family ``verify --vlm`` builds, each a config
transformers reads as that family, and ``verify --vlm --model NAME`` runs on them with nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.jobs.verify import load_hf_config
from longpack.vlm.model_configs import VLM_MODEL_CONFIGS, vlm_model_config
from vlm_helpers import conversation, png_bytes

transformers = pytest.importorskip("transformers")
DATA = Path(__file__).resolve().parents[1] / "data" / "hf_configs"


def test_every_family_verify_builds_has_a_shipped_config() -> None:
    from longpack.runtime.verify_vlm import VISUAL_MODEL_TYPES

    types = sorted(vlm_model_config(name)["model_type"] for name in VLM_MODEL_CONFIGS)
    assert types == sorted(VISUAL_MODEL_TYPES)
    for name in VLM_MODEL_CONFIGS:
        source = vlm_model_config(name)
        assert load_hf_config(name) == source == load_hf_config(name.upper().replace("_", "-"))
        config = transformers.AutoConfig.for_model(**source)  # transformers reads it as its family
        assert type(config).__name__ == source["architectures"][0].replace(
            "ForConditionalGeneration", "Config"
        )
        assert config.vision_config.patch_size == 14 and config.text_config.vocab_size == 152064
        assert config.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
        # the vision merger's output feeds the text model: its width is the text width
        merged = source["vision_config"].get("out_hidden_size", source["vision_config"]["hidden_size"])
        assert merged == source["hidden_size"] == config.text_config.hidden_size
    # the Qwen2.5-VL entry is the checkpoint's config.json as the tests' copy has it
    tests_copy = json.loads((DATA / "qwen2_5_vl_7b.json").read_text())
    assert vlm_model_config("Qwen/Qwen2.5-VL-7B-Instruct") == tests_copy | vlm_model_config("qwen2_5_vl_7b")
    assert {k: v for k, v in vlm_model_config("qwen2_5_vl_7b").items() if k in tests_copy} == tests_copy


@pytest.mark.parametrize("name", VLM_MODEL_CONFIGS)
def test_verify_vlm_runs_offline_with_a_shipped_config(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))  # nothing cached either
    rng = np.random.default_rng(3)
    lines = []
    for i in range(3):
        (tmp_path / f"img{i}.png").write_bytes(png_bytes(40 + 10 * i, 30, seed=i))
        lines.append({"messages": conversation(rng, 1), "images": [f"img{i}.png"]})
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(app, ["verify", "--vlm", str(samples), "--model", name, "--pack-size", "128"])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("PASS: ") for line in result.output.splitlines()), result.output
