"""Golden tests: Megatron-Bridge's test_config.py packing/CP cases and the
three long-context recipes of the issue."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from longpack.catalog import find_family
from longpack.rules import DatasetKind, DatasetSettings, TrainingSetup, load_setup, run_rules
from longpack.topology import ParallelLayout
from rule_bases import findings_of, setup_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "check"


def ids(findings: list, severity: str = "error") -> set[str]:
    return {f.rule_id for f in findings if f.severity == severity}


# --- offline packing and MBS -------------------------------------------------------------------------

OFFLINE_512 = [
    "dataset.offline_packing_specs.packed_sequence_size=512",
    "model.seq_length=512",
    "dataset.seq_length=512",
]


def test_offline_packing_mbs4_gbs32_raises_and_suggests_equivalent() -> None:
    found = findings_of("SFT", [*OFFLINE_512, "train.micro_batch_size=4", "train.global_batch_size=32"])
    (f,) = [x for x in found if x.rule_id == "LP-PACK-005"]
    assert "micro_batch_size=4" in f.message
    assert "train.global_batch_size=8" in f.fix
    assert "packed_sequence_size=2048" in f.fix


def test_offline_packing_mbs1_passes() -> None:
    assert "LP-PACK-005" not in ids(findings_of("SFT", [*OFFLINE_512, "train.global_batch_size=32"]))


def test_specs_none_with_mbs4_passes_the_mbs_rule() -> None:
    found = findings_of(
        "SFT",
        [
            "dataset.enable_offline_packing=false",
            "~dataset.offline_packing_specs",
            "train.micro_batch_size=4",
            "train.global_batch_size=32",
        ],
    )
    assert "LP-PACK-005" not in ids(found)


def test_gpt_dataset_with_mbs4_passes() -> None:
    assert ids(findings_of("PRETRAIN", ["train.micro_batch_size=4", "train.global_batch_size=32"])) == set()


# --- in-batch packing ---------------------------------------------------------------------------------


def test_in_batch_packing_mbs1_raises_and_mbs4_passes() -> None:
    assert "LP-PACK-006" in ids(findings_of("DHF", ["train.micro_batch_size=1", "train.global_batch_size=8"]))
    assert "LP-PACK-006" not in ids(
        findings_of("DHF", ["train.micro_batch_size=4", "train.global_batch_size=16"])
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [
                "model.context_parallel_size=2",
                "model.tensor_model_parallel_size=4",
                "model.sequence_parallel=true",
            ],
            8,
        ),
        (
            [
                "model.context_parallel_size=2",
                "model.tensor_model_parallel_size=2",
                "model.sequence_parallel=true",
                "dist.eval_context_parallel_size=4",
            ],
            8,
        ),
    ],
)
def test_in_batch_packing_multiple(overrides: list[str], expected: int) -> None:
    assert setup_of("DHF", overrides).required_pad_seq_to_mult == expected


def test_non_packed_pad_to_multiple_of_combines_with_cp_sp() -> None:
    unpacked = ["dataset.enable_in_batch_packing=false", "dataset.pad_to_multiple_of=3"]
    s = setup_of(
        "DHF",
        [
            *unpacked,
            "model.context_parallel_size=2",
            "model.tensor_model_parallel_size=4",
            "model.sequence_parallel=true",
        ],
    )
    assert s.effective_pad_to_multiple_of == 24
    s = setup_of(
        "DHF",
        [
            *unpacked,
            "model.tensor_model_parallel_size=1",
            "model.sequence_parallel=false",
            "dist.eval_context_parallel_size=2",
        ],
    )
    assert s.effective_pad_to_multiple_of == 12


def test_direct_hf_seq_length_20_with_cp2_tp4_sp_raises() -> None:
    found = findings_of(
        "DHF",
        [
            "model.context_parallel_size=2",
            "model.tensor_model_parallel_size=4",
            "model.seq_length=20",
            "dataset.seq_length=20",
        ],
    )
    assert "LP-CP-007" in ids(found)


def test_direct_hf_negative_pad_to_multiple_of_raises() -> None:
    found = findings_of("DHF", ["dataset.pad_to_multiple_of=-3"])
    assert ids(found) == {"LP-CFG-001"}


# --- Energon ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "rule_id"),
    [
        ("model.calculate_per_token_loss=false", "LP-EN-003"),
        ("ddp.average_in_collective=true", "LP-EN-004"),
        ("model.mtp_num_layers=1", "LP-EN-005"),
        ("model.cuda_graph_impl=local", "LP-EN-006"),
        ("model.vision_cuda_graph_impl=transformer_engine", "LP-EN-006"),
        ("model.pipeline_model_parallel_size=2", "LP-EN-008"),
    ],
)
def test_energon_packing_rejections(override: str, rule_id: str) -> None:
    assert rule_id in ids(findings_of("ENERGON", [override]))


def test_energon_ep8_alltoall_is_allowed_and_ep_overlap_warns() -> None:
    moe = [
        "model.num_moe_experts=64",
        "model.expert_model_parallel_size=8",
        "model.moe_token_dispatcher_type=alltoall",
    ]
    assert ids(findings_of("ENERGON", moe)) == set()
    warned = findings_of("ENERGON", [*moe, "model.overlap_moe_expert_parallel_comm=true"])
    assert ids(warned) == set() and ids(warned, "warning") == {"LP-EN-009"}


# --- offline flags, CUDA graphs -------------------------------------------------------------------------


def test_offline_flag_and_specs_rules() -> None:
    assert "LP-PACK-002" in ids(findings_of("SFT", ["~dataset.offline_packing_specs"]))
    assert "LP-PACK-003" in ids(findings_of("SFT", ["dataset.enable_offline_packing=false"]))
    assert "LP-PACK-001" in ids(findings_of("SFT", ["dataset.enable_in_batch_packing=true"]))
    assert "LP-PACK-007" in ids(findings_of("SFT", ["dataset.offline_packing_specs.pad_cu_seqlens=true"]))


PTML = "dataset.dataset_kwargs.pad_to_max_length=true"


@pytest.mark.parametrize("scope", ["[]", "[attn]", "[attn,mlp]"])
def test_te_graphs_capturing_attention_need_pad_cu_seqlens(scope: str) -> None:
    found = findings_of(
        "SFT", ["model.cuda_graph_impl=transformer_engine", f"model.cuda_graph_scope={scope}", PTML]
    )
    assert ids(found) == {"LP-CG-002"}


def test_te_graph_mlp_scope() -> None:
    mlp = ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[mlp]"]
    assert ids(findings_of("SFT", [*mlp, PTML])) == set()
    assert ids(findings_of("SFT", mlp)) == {"LP-CG-001"}


def test_full_iteration_graph_without_pad_cu_seqlens() -> None:
    found = findings_of(
        "SFT",
        ["model.cuda_graph_impl=full_iteration", PTML, "rerun_state_machine.check_for_nan_in_loss=false"],
    )
    assert ids(found) == {"LP-CG-002"}


# --- CP sequence length and loss settings ------------------------------------------------------------------


@pytest.mark.parametrize(("seq", "cp", "fires"), [(512, 2, False), (510, 2, True), (256, 3, True)])
def test_cp_sequence_length(seq: int, cp: int, fires: bool) -> None:
    s = setup_of(
        "PRETRAIN",
        [
            f"model.seq_length={seq}",
            f"dataset.seq_length={seq}",
            f"model.context_parallel_size={cp}",
            "longpack.world_size=12",
        ],
    )
    assert ("LP-CP-001" in ids(run_rules(s))) is fires


@pytest.mark.parametrize("kind", ["sft", "direct_hf", "energon", "mock_vlm"])
def test_cp2_finetuning_loss_settings(kind: str) -> None:
    base = [
        "model.context_parallel_size=2",
        f"longpack.dataset_kind={kind}",
        "train.micro_batch_size=2",
        "train.global_batch_size=16",
    ]
    base += ["dataset.enable_offline_packing=false", "~dataset.offline_packing_specs"]
    assert "LP-CP-002" in ids(findings_of("SFT", [*base, "model.calculate_per_token_loss=false"]))
    assert "LP-CP-003" in ids(findings_of("SFT", [*base, "ddp.average_in_collective=true"]))
    found = ids(findings_of("SFT", base))
    assert not found & {"LP-CP-002", "LP-CP-003"}


@pytest.mark.parametrize("cp", [1, 2])
def test_pretraining_skips_cp_loss_checks(cp: int) -> None:
    found = findings_of(
        "PRETRAIN",
        [
            f"model.context_parallel_size={cp}",
            "model.calculate_per_token_loss=false",
            "ddp.average_in_collective=true",
        ],
    )
    assert not ids(found) & {"LP-CP-002", "LP-CP-003"}


# --- the three long-context recipes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "deepseek_v3_128k_256xh100.yaml",
        "deepseek_v3_256k_512xh100.yaml",
        "qwen3_235b_128k_sft_128xgb200.yaml",
    ],
)
def test_long_context_recipes_have_no_errors(name: str) -> None:
    loaded = load_setup(EXAMPLES / name)
    findings = run_rules(loaded.setup)
    assert ids(findings) == set()
    assert ids(findings, "warning") == set()


def test_recipes_from_layouts_without_a_file() -> None:
    dsv3 = find_family("deepseek_v3")
    s = TrainingSetup.from_layout(
        ParallelLayout(world_size=256, tp=1, cp=32, pp=8, vpp=4, ep=32, etp=1),
        seq_length=131072,
        family=dsv3,
        pipeline_model_parallel_layout="Et|(tt|)*30mL",
        global_batch_size=64,
        dataset=DatasetSettings(kind=DatasetKind.PRETRAINING, seq_length=131072),
    )
    assert ids(run_rules(s)) == set()
    # Without a layout 61 layers do not divide by PP*VPP = 32: the rule says so and suggests one.
    bare = replace(s, model=replace(s.model, pipeline_model_parallel_layout=None))
    (f,) = [x for x in run_rules(bare) if x.rule_id == "LP-PP-001"]
    assert "num_layers=61" in f.message and "Et|(tt|)*30mL" in f.fix


def test_qwen3_235b_needs_etp1_when_etp_defaults_to_tp() -> None:
    s = load_setup(
        EXAMPLES / "qwen3_235b_128k_sft_128xgb200.yaml", ["model.expert_tensor_parallel_size=null"]
    ).setup
    (f,) = [x for x in run_rules(s) if x.rule_id == "LP-TOPO-002"]
    assert "EP*ETP = 32*4 = 128" in f.message and "expert_tensor_parallel_size=1" in f.fix


def test_from_layout_dataset_kind_shortcut() -> None:
    s = TrainingSetup.from_layout(
        ParallelLayout(world_size=128, tp=4, cp=4, pp=4, vpp=12, ep=32, etp=1, sp=True),
        seq_length=131072,
        family=find_family("qwen3_235b_a22b"),
        global_batch_size=16,
        dataset_kind="pretraining",
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    assert s.dataset.kind is DatasetKind.PRETRAINING and run_rules(s) == []


def test_hybrid_cp_example_passes_fails_and_warns_by_version() -> None:
    from longpack.rules.versions import UpstreamVersions

    def check(overrides: tuple[str, ...] = (), mcore: str = "main") -> list[tuple[str, str]]:
        loaded = load_setup(EXAMPLES / "llama3_8b_sft_hybrid_cp.yaml", overrides)
        versions = UpstreamVersions.resolve(bridge="main", mcore=mcore)
        return [(f.rule_id, f.severity.value) for f in run_rules(loaded.setup, versions=versions)]

    assert check() == [("LP-HCP-009", "warning")]  # pass (Bridge itself would not run the scheduler)
    # no hybrid CP yet (its two keys), and Bridge main's THD CP split needs Core 0.18
    assert sorted(check(mcore="0.15.3")) == [
        ("LP-CP-009", "error"),
        ("LP-HCP-009", "warning"),
        ("LP-VER-001", "error"),
        ("LP-VER-001", "error"),
    ]
    assert sorted(check(("model.max_seqlen_per_dp_cp_rank=8192",))) == [  # warn
        ("LP-HCP-007", "warning"),
        ("LP-HCP-009", "warning"),
    ]
    assert ("LP-HCP-001", "error") in check(("model.pipeline_model_parallel_size=2",))  # fail
    assert ("LP-HCP-008", "error") in check(("model.max_seqlen_per_dp_cp_rank=2048",))  # 4 ranks: 8 chunks
