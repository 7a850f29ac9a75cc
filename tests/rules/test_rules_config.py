"""Reading configs: Megatron-Bridge YAML dumps with unknown keys, JSON, Hydra overrides, inference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longpack.rules import (
    ConfigError,
    DatasetKind,
    apply_overrides,
    load_setup,
    run_rules,
    setup_from_mapping,
)

BRIDGE_DUMP = """\
_target_: megatron.bridge.training.config.ConfigContainer
model:
  _target_: megatron.bridge.models.qwen.qwen_provider.Qwen3MoEModelProvider
  params_dtype:
    _target_: torch.bfloat16
    _call_: false
  activation_func: !!python/name:torch.nn.functional.silu ''
  num_layers: 48
  num_attention_heads: 32
  num_query_groups: 4
  num_moe_experts: 128
  tensor_model_parallel_size: 2
  context_parallel_size: 2
  expert_model_parallel_size: 8
  expert_tensor_parallel_size: 1
  sequence_parallel: true
  seq_length: 8192
  calculate_per_token_loss: true
  cuda_graph_scope: full
  hidden_dropout: 0.0
train:
  _target_: megatron.bridge.training.config.TrainingConfig
  micro_batch_size: 1
  global_batch_size: 64
  train_iters: 100
dataset:
  _target_: megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig
  seq_length: 8192
  seed: 1234
  enable_offline_packing: true
  offline_packing_specs:
    _target_: megatron.bridge.data.packing.config.PackedSequenceSpecs
    packed_sequence_size: 8192
    pad_seq_to_mult: 4
    pad_cu_seqlens: false
  dataset_kwargs:
    pad_to_max_length: true
ddp:
  average_in_collective: false
  overlap_grad_reduce: true
tokenizer:
  tokenizer_model: Qwen/Qwen3-30B-A3B
optimizer:
  lr: 3.0e-4
"""


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    p = tmp_path / "run_config.yaml"
    p.write_text(BRIDGE_DUMP)
    return p


def test_bridge_dump_loads_with_unknown_keys_listed(dump: Path) -> None:
    loaded = load_setup(dump, world_size=16)
    s = loaded.setup
    assert s.dataset.kind is DatasetKind.SFT
    assert s.family is not None and s.family.name == "qwen3_30b_a3b"
    assert (s.tp, s.cp, s.ep, s.etp, s.sp) == (2, 2, 8, 1, True)
    assert s.dataset.offline_packing and s.dataset.fixed_width
    assert s.model.cuda_graph_scope == ()
    for key in (
        "model.hidden_dropout",
        "optimizer.lr",
        "ddp.overlap_grad_reduce",
        "model.activation_func",
        "train.train_iters",
    ):
        assert key in loaded.ignored_keys
    assert "model.tensor_model_parallel_size" not in loaded.ignored_keys
    assert [f.rule_id for f in run_rules(s)] == []


def test_sources_carry_file_and_line(dump: Path) -> None:
    s = load_setup(dump, ["train.global_batch_size=30"], world_size=16).setup
    assert s.sources["model.context_parallel_size"] == "run_config.yaml:13"
    (f,) = [x for x in run_rules(s) if x.rule_id == "LP-BATCH-001"]
    assert any("override 'train.global_batch_size=30'" in w for w in f.where)


def test_json_config(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text(
        json.dumps(
            {
                "model": {"context_parallel_size": 4, "seq_length": 4096},
                "longpack": {"dataset_kind": "pretraining"},
            }
        )
    )
    s = load_setup(p).setup
    assert s.cp == 4 and s.dataset.kind is DatasetKind.PRETRAINING


@pytest.mark.parametrize(
    ("text", "match"),
    [("model: [1, 2\n", r"c\.yaml:\d+: invalid YAML"), ("- a\n- b\n", "top level must be a mapping")],
)
def test_unreadable_yaml_names_file(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_setup(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_setup(tmp_path / "nope.yaml")


def test_wrong_type_names_key_and_line(dump: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.micro_batch_size='four'.*expected an integer"):
        load_setup(dump, ["train.micro_batch_size=four"])
    dump.write_text(BRIDGE_DUMP.replace("context_parallel_size: 2", "context_parallel_size: two"))
    with pytest.raises(ConfigError, match=r"model\.context_parallel_size='two' \(run_config\.yaml:13\)"):
        load_setup(dump)


def test_overrides_parse_yaml_scalars() -> None:
    data = apply_overrides(
        {"model": {"cuda_graph_scope": "full"}},
        [
            "model.context_parallel_size=8",
            "model.sequence_parallel=true",
            "model.cuda_graph_scope=[attn,mlp]",
            "++model.mtp_num_layers=null",
            "+dataset.dataset_kwargs.pad_to_max_length=True",
            "model.cp_comm_type=a2a+p2p",
        ],
    )
    assert data["model"] == {
        "cuda_graph_scope": ["attn", "mlp"],
        "context_parallel_size": 8,
        "sequence_parallel": True,
        "mtp_num_layers": None,
        "cp_comm_type": "a2a+p2p",
    }
    assert data["dataset"] == {"dataset_kwargs": {"pad_to_max_length": True}}


def test_override_delete_and_errors() -> None:
    assert apply_overrides({"a": {"b": 1, "c": 2}}, ["~a.b"]) == {"a": {"c": 2}}
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["model.seq_length"])
    with pytest.raises(ConfigError, match="empty key part"):
        apply_overrides({}, ["model..seq_length=3"])


def test_overrides_do_not_mutate_input() -> None:
    data = {"model": {"context_parallel_size": 1}}
    apply_overrides(data, ["model.context_parallel_size=2"])
    assert data == {"model": {"context_parallel_size": 1}}


@pytest.mark.parametrize(
    ("dataset", "kind"),
    [
        ({"_target_": "megatron.bridge.training.config.GPTDatasetConfig"}, DatasetKind.PRETRAINING),
        ({"_target_": "x.EnergonDatasetConfig"}, DatasetKind.ENERGON),
        ({"_target_": "x.DirectHFSFTDatasetConfig"}, DatasetKind.DIRECT_HF),
        ({"_target_": "x.MockVLMSFTDatasetConfig"}, DatasetKind.MOCK_VLM),
        ({"packing_buffer_size": 8}, DatasetKind.ENERGON),
        ({"enable_offline_packing": True}, DatasetKind.SFT),
        ({"blend": None, "split": "99,1,0"}, DatasetKind.PRETRAINING),
        ({"enable_in_batch_packing": True}, DatasetKind.DIRECT_HF),
        ({}, DatasetKind.SFT),
    ],
)
def test_dataset_kind_inference(dataset: dict, kind: DatasetKind) -> None:
    assert setup_from_mapping({"dataset": dataset}).setup.dataset.kind is kind


def test_explicit_kind_and_family_win() -> None:
    loaded = setup_from_mapping(
        {"dataset": {"_target_": "x.GPTDatasetConfig"}, "longpack": {"model_family": "glm_4_5"}},
        dataset_kind="energon",
        model_family="qwen3_235b_a22b",
    )
    assert loaded.setup.dataset.kind is DatasetKind.ENERGON
    assert loaded.setup.family is not None and loaded.setup.family.name == "qwen3_235b_a22b"
    assert loaded.setup.model.num_layers == 94


def test_unknown_family_and_kind_are_input_errors() -> None:
    with pytest.raises(ConfigError, match="unknown family"):
        setup_from_mapping({"longpack": {"model_family": "gpt5"}})
    with pytest.raises(ConfigError, match=r"longpack\.dataset_kind='web'"):
        setup_from_mapping({"longpack": {"dataset_kind": "web"}})


def test_config_values_beat_family_defaults() -> None:
    s = setup_from_mapping({"model": {"num_layers": 4}, "longpack": {"model_family": "deepseek_v3"}}).setup
    assert s.model.num_layers == 4 and s.model.num_attention_heads == 128 and s.model.mtp_num_layers == 1


def test_legacy_packed_sequence_specs() -> None:
    s = setup_from_mapping(
        {"dataset": {"packed_sequence_specs": {"packed_sequence_size": 2048, "pad_seq_to_mult": 2}}}
    ).setup
    assert s.dataset.offline_packing and s.dataset.offline_packing_specs is not None
    assert s.dataset.offline_packing_specs.packed_sequence_size == 2048


def test_layout_as_list_of_lists() -> None:
    layout = [["embedding", "decoder"], ["decoder", "loss"]]
    s = setup_from_mapping(
        {
            "model": {
                "pipeline_model_parallel_layout": layout,
                "pipeline_model_parallel_size": 2,
                "num_layers": 2,
                "num_attention_heads": 8,
            }
        }
    ).setup
    assert not [f for f in run_rules(s) if f.rule_id.startswith("LP-PP")]


def test_dataset_kwargs_pad_to_max_length_is_a_bool() -> None:
    s = setup_from_mapping({"dataset": {"dataset_kwargs": {"pad_to_max_length": "false"}}}).setup
    assert s.dataset.fixed_width is False
    with pytest.raises(ConfigError, match="pad_to_max_length is true or false"):
        setup_from_mapping({"dataset": {"dataset_kwargs": {"pad_to_max_length": "maybe"}}})


# --- wrongly shaped values are errors with file:line, not silently OK --------------------------------


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            "model.context_parallel_size={a: 1}",
            r"model\.context_parallel_size=\{'a': 1\}.*expected an integer",
        ),
        ("model.sequence_parallel=[1]", r"model\.sequence_parallel=\[1\].*expected true or false"),
        ("model.cp_comm_type=[[a2a]]", r"model\.cp_comm_type=.*expected a string or a list of strings"),
        ("model.hierarchical_context_parallel_sizes=[2, x]", r"expected a list of integers"),
        (
            "dataset.offline_packing_specs=5",
            r"dataset\.offline_packing_specs=5 \(override .*\): expected a mapping",
        ),
        ("dataset.dataset_kwargs=[1]", r"dataset\.dataset_kwargs=\[1\].*expected a mapping"),
        ("train=5", r"train=5 \(override 'train=5'\): expected a mapping of train\.\* keys"),
        ("model.dist_train=yes", r"model\.dist_train=True \(override .*\): expected a mapping"),
        ("longpack.world_size=many", r"longpack\.world_size='many'.*expected an integer"),
        (
            "validation.eval_micro_batch_size=1.5",
            r"validation\.eval_micro_batch_size=1\.5.*expected an integer",
        ),
    ],
)
def test_wrongly_shaped_override_is_an_error(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        setup_from_mapping({}, overrides=[override])


def test_wrongly_shaped_file_values_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  seq_length: 4096\ntrain: 5\n")
    with pytest.raises(ConfigError, match=r"train=5 \(bad\.yaml:3\): expected a mapping"):
        load_setup(p)
    p.write_text("model:\n  context_parallel_size:\n    a: 1\n")
    with pytest.raises(ConfigError, match=r"model\.context_parallel_size=\{'a': 1\} \(bad\.yaml:2\)"):
        load_setup(p)
    p.write_text("model: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"model=\[1, 2\] \(bad\.yaml:1\): expected a mapping"):
        load_setup(p)


def test_null_sections_and_unknown_keys_are_still_fine() -> None:
    loaded = setup_from_mapping({"train": None, "model": {"foo": {"bar": 1}}, "dataset": {"kind": "x"}})
    assert loaded.setup.micro_batch_size == 1
    assert loaded.ignored_keys == ("dataset.kind", "model.foo.bar", "train")
    assert (
        loaded.setup.dataset.kind is DatasetKind.SFT
    )  # "kind" is not a Bridge key: never read from a config


def test_both_spellings_of_the_packing_specs_are_refused() -> None:
    with pytest.raises(ConfigError, match="keep one"):
        setup_from_mapping(
            {
                "dataset": {
                    "offline_packing_specs": {"packed_sequence_size": 8},
                    "packed_sequence_specs": {"packed_sequence_size": 8},
                }
            }
        )


def test_keys_read_for_inference_are_not_reported_as_ignored() -> None:
    loaded = setup_from_mapping({"tokenizer": {"hf_tokenizer_path": "Qwen/Qwen3-8B"}})
    assert loaded.setup.family is not None and loaded.setup.family.name == "qwen3_8b"
    assert loaded.ignored_keys == ()


def test_both_spellings_of_a_key_are_read() -> None:
    s = setup_from_mapping(
        {"model": {"cuda_graph_modules": ["attn"]}, "train": {"eval_micro_batch_size": 2}}
    ).setup
    assert s.model.cuda_graph_scope == ("attn",) and s.eval_micro_batch_size == 2
    s = setup_from_mapping({"validation": {"eval_micro_batch_size": 3}}).setup
    assert s.eval_micro_batch_size == 3


# --- YAML aliases --------------------------------------------------------------------------------


def _alias_bomb(levels: int) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [{','.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "bomb.yaml"
    p.write_text(_alias_bomb(9))  # 9**9 = 387M strings from < 400 bytes
    assert len(p.read_bytes()) < 400
    with pytest.raises(ConfigError, match=r"bomb\.yaml:\d+: YAML aliases expand this document to more than"):
        load_setup(p)
    with pytest.raises(ConfigError, match="YAML aliases expand"):
        apply_overrides(
            {},
            [
                "model.x=[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
                "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]"
            ],
        )


def test_yaml_recursive_alias_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "loop.yaml"
    p.write_text("model:\n  x: &a [1, *a]\n")
    with pytest.raises(ConfigError, match=r"loop\.yaml:2: a YAML alias refers to the node that contains it"):
        load_setup(p)


def test_ordinary_aliases_still_load(tmp_path: Path) -> None:
    p = tmp_path / "anchors.yaml"
    p.write_text(
        "defaults: &len {seq_length: 8192}\nmodel:\n  <<: *len\n  context_parallel_size: 2\n"
        "dataset:\n  <<: *len\n"
    )
    s = load_setup(p).setup
    assert s.model.seq_length == 8192 and s.dataset.seq_length == 8192 and s.cp == 2


# --- zero sizes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "model.context_parallel_size",
        "model.tensor_model_parallel_size",
        "model.pipeline_model_parallel_size",
        "model.expert_model_parallel_size",
    ],
)
def test_zero_sizes_are_findings_never_zero_division(key: str) -> None:
    s = setup_from_mapping({}, overrides=[f"{key}=0", "model.seq_length=4096"], world_size=8).setup
    assert s.layout is None and s.required_pad_seq_to_mult == 1
    assert (s.dp is None) == (key != "model.expert_model_parallel_size")
    findings = run_rules(s)
    assert [f.rule_id for f in findings if f.severity == "error"] == ["LP-CFG-001"]
    assert key in findings[0].message


def test_check_cli_reports_a_zero_size(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from longpack.cli.app import app

    result = CliRunner().invoke(app, ["check", "model.context_parallel_size=0", "--gpus", "8", "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["summary"]["dp"] is None
    assert [f["id"] for f in data["findings"] if f["severity"] == "error"] == ["LP-CFG-001"]
    result = CliRunner().invoke(app, ["check", "model.context_parallel_size=0", "--gpus", "8"])
    assert result.exit_code == 1 and "LP-CFG-001" in result.output
