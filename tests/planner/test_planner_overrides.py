"""Planner overrides: every assumption emitted, Hydra grammar, shell-safe, YAML and Python forms, parsed
back by longpack's own override parser and accepted by ``longpack check``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longpack.jobs.check import CheckConfig
from longpack.jobs.plan import candidate_dict
from longpack.planner.catalog import load_gpu, load_model
from longpack.planner.options import PlanLayout, TrainingOptions
from longpack.planner.overrides import format_override, parse_overrides, to_overrides, to_shell
from longpack.planner.search import SearchRequest, evaluate_layout
from longpack.rules.config_file import apply_overrides, flatten
from longpack.topology import ParallelLayout


def _dsv3_candidate(**opts):
    req = SearchRequest(
        model=load_model("deepseek_v3"),
        gpu=load_gpu("H100"),
        num_gpus=256,
        seq_length=131072,
        precision="fp8",
    )
    plan = PlanLayout(layout=ParallelLayout(world_size=256, tp=1, cp=32, pp=8, vpp=4, ep=32, etp=1))
    options = TrainingOptions(
        precision="fp8",
        recompute=("mla_up_proj", "layernorm", "moe", "mlp"),
        optimizer_offload=1.0,
        dispatcher="deepep",
        cp_comm_type="a2a+p2p",
        **opts,
    )
    return req, evaluate_layout(req, plan, options)


def _shell_words(shell_text: str) -> list[str]:
    """What a real shell hands a program for the printed overrides."""
    script = f"{sys.executable} -c 'import sys; print(\"\\0\".join(sys.argv[1:]))' {shell_text}"
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout
    return out.rstrip("\n").split("\0")


def test_every_assumption_is_an_override() -> None:
    req, cand = _dsv3_candidate()
    d = candidate_dict(cand, req)
    values = flatten(apply_overrides({}, d["overrides"]))
    assert values["model.cp_comm_type"] == "a2a+p2p"
    assert values["model.hierarchical_context_parallel_sizes"] == [8, 4]
    assert values["model.recompute_granularity"] == "selective"
    assert values["model.recompute_modules"] == ["layernorm", "mla_up_proj", "mlp", "moe"]
    assert values["optimizer.optimizer_cpu_offload"] is True
    assert values["optimizer.optimizer_offload_fraction"] == 1.0
    assert values["model.moe_token_dispatcher_type"] == "flex"
    assert values["model.moe_flex_dispatcher_backend"] == "deepep"
    assert values["comm_overlap.tp_comm_overlap"] is False  # TP 1
    assert values["ddp.overlap_grad_reduce"] is True and values["ddp.overlap_param_gather"] is True
    assert values["model.cuda_graph_impl"] == "none" and values["model.cuda_graph_scope"] == []
    assert values["model.pipeline_model_parallel_layout"] == "Et|(tt|)*30mL"
    assert values["mixed_precision"] == "bf16_with_fp8_subchannel_scaling_mixed"


def test_tp_overlap_and_graph_scope_are_emitted_when_assumed() -> None:
    plan = PlanLayout(layout=ParallelLayout(world_size=64, tp=4, pp=2, ep=8, etp=1, sp=True))
    opts = TrainingOptions(tp_comm_overlap=True, cuda_graphs="partial", dispatcher="hybridep")
    values = flatten(apply_overrides({}, to_overrides(plan, opts, seq_length=8192, gbs=64)))
    assert values["comm_overlap.tp_comm_overlap"] is True
    assert values["model.cuda_graph_impl"] == "transformer_engine"
    assert values["model.cuda_graph_scope"] == ["attn", "moe_router", "moe_preprocess"]
    assert values["model.virtual_pipeline_model_parallel_size"] is None
    assert values["model.recompute_granularity"] is None


def test_printed_overrides_survive_a_real_shell_and_parse_back() -> None:
    req, cand = _dsv3_candidate()
    d = candidate_dict(cand, req)
    words = _shell_words(d["overrides_shell"].replace("\\\n", " "))
    assert words == d["overrides"]
    plan, options, values = parse_overrides(words, world_size=256)
    assert plan == cand.plan
    for name in ("precision", "recompute", "optimizer_offload", "dispatcher", "cp_comm_type", "cuda_graphs"):
        assert getattr(options, name) == getattr(cand.options, name), name
    assert values["model.pipeline_model_parallel_layout"] == cand.pipeline_layout
    assert values["train.global_batch_size"] == req.global_batch


def test_unquoted_hydra_specials_are_quoted() -> None:
    assert format_override("k", "Et|(tt|)*32tt|(tt|)*13mL") == 'k="Et|(tt|)*32tt|(tt|)*13mL"'
    assert format_override("k", "null") == 'k="null"'  # the string, not None
    assert format_override("k", 'a"b') == 'k="a\\"b"'
    assert apply_overrides({}, [format_override("k", 'a"b')]) == {"k": 'a"b'}
    line = to_shell([format_override("k", "x y")])
    assert line == "'k=\"x y\"'"


def test_yaml_and_python_forms_carry_the_same_values() -> None:
    req, cand = _dsv3_candidate()
    d = candidate_dict(cand, req)
    expected = flatten(apply_overrides({}, d["overrides"]))
    assert flatten(yaml.safe_load(d["overrides_yaml"])) == expected
    python: dict[str, object] = {}
    for line in d["overrides_python"].splitlines():
        target, value = ast.parse(line).body[0].targets[0], ast.parse(line).body[0].value  # type: ignore[attr-defined]
        python[ast.unparse(target).removeprefix("cfg.")] = ast.literal_eval(value)
    assert python == expected


def test_longpack_check_passes_on_the_printed_overrides(tmp_path: Path) -> None:
    req, cand = _dsv3_candidate()
    d = candidate_dict(cand, req)
    # in-process: the key=value lines, and the nested YAML file
    result = CheckConfig(overrides=tuple(d["overrides"]), gpus=256, model="deepseek_v3").run()
    assert result.exit_code == 0, [f.message for f in result.findings if f.severity == "error"]
    cfg = tmp_path / "plan.yaml"
    cfg.write_text(d["overrides_yaml"])
    result = CheckConfig(config=str(cfg), gpus=256, model="deepseek_v3").run()
    assert result.exit_code == 0
    # through a real shell: the printed line pasted after `longpack check`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = (
        f"{sys.executable} -c 'import sys; from longpack.cli.app import main; sys.argv[0] = \"longpack\"; main()' "
        "check --gpus 256 --model deepseek_v3 " + d["overrides_shell"].replace("\\\n", " ")
    )
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("cp_comm_type", ["p2p", "a2a", "allgather"])
def test_cp_comm_types_round_trip(cp_comm_type: str) -> None:
    plan = PlanLayout(layout=ParallelLayout(world_size=64, tp=1, cp=8, pp=1, ep=8, etp=1))
    opts = TrainingOptions(cp_comm_type=cp_comm_type, dispatcher="deepep")
    _, back, values = parse_overrides(to_overrides(plan, opts, seq_length=65536, gbs=8), world_size=64)
    assert back.cp_comm_type == cp_comm_type
    assert "model.hierarchical_context_parallel_sizes" not in values
