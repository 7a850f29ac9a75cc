"""``longpack check``: exit codes, JSON output, rule listing, and --packed against real Parquet files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.rules import RULES
from longpack.rules.packed_data import PackedDataError, inspect_packed_dir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "check"
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["check", *args])
    return result.exit_code, result.output


def test_good_example_exits_0() -> None:
    code, out = run(str(EXAMPLES / "llama3_8b_sft_cp4_good.yaml"))
    assert code == 0, out
    assert "OK: 0 errors, 0 warnings, 0 infos" in out


def test_broken_example_exits_1_with_rule_ids_in_table() -> None:
    code, out = run(str(EXAMPLES / "llama3_8b_sft_cp4_broken.yaml"))
    assert code == 1
    for rule_id in ("LP-PACK-005", "LP-PACK-008", "LP-CP-002", "LP-CP-003", "LP-CG-001", "LP-BATCH-001"):
        assert rule_id in out
    assert (
        "model.cuda_graph_scope=[mlp]" in out.replace("\n", "").replace("│", "").replace(" ", "")
        or "[mlp]" in out
    )


def test_json_output_and_overrides() -> None:
    code, out = run(
        str(EXAMPLES / "llama3_8b_sft_cp4_broken.yaml"),
        "train.micro_batch_size=1",
        "train.global_batch_size=8",
        "--json",
    )
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and data["ok"] is False
    found = {f["id"] for f in data["findings"]}
    assert "LP-PACK-005" not in found and "LP-BATCH-001" not in found and "LP-PACK-008" in found
    f = next(f for f in data["findings"] if f["id"] == "LP-PACK-008")
    assert set(f) == {"id", "severity", "title", "message", "fix", "keys", "where", "applies_to"}
    assert f["severity"] == "error" and "pad_seq_to_mult=1" in f["message"]
    assert any("llama3_8b_sft_cp4_broken.yaml:" in w for w in f["where"])
    assert data["summary"]["dp"] == 2 and data["summary"]["pad_seq_to_mult_required"] == 8
    assert data["counts"]["error"] == len([x for x in data["findings"] if x["severity"] == "error"])


def test_fixing_overrides_make_broken_example_pass() -> None:
    code, out = run(
        str(EXAMPLES / "llama3_8b_sft_cp4_broken.yaml"),
        "train.micro_batch_size=1",
        "train.global_batch_size=8",
        "dataset.offline_packing_specs.pad_seq_to_mult=8",
        "dataset.offline_packing_specs.packed_sequence_size=32768",
        "model.calculate_per_token_loss=true",
        "ddp.average_in_collective=false",
        "model.cuda_graph_impl=none",
        "--json",
    )
    assert code == 0, out
    assert json.loads(out)["findings"] == []


def test_no_config_file_only_overrides_and_gpus() -> None:
    code, out = run(
        "model.context_parallel_size=2",
        "model.seq_length=4094",
        "--gpus",
        "8",
        "--dataset-kind",
        "pretraining",
        "--json",
    )
    assert code == 1
    assert [f["id"] for f in json.loads(out)["findings"] if f["severity"] == "error"] == ["LP-CP-001"]


@pytest.mark.parametrize(
    "args",
    [
        ("/nonexistent/config.yaml",),
        (str(EXAMPLES / "llama3_8b_sft_cp4_good.yaml"), "train.micro_batch_size=two"),
        (str(EXAMPLES / "llama3_8b_sft_cp4_good.yaml"), "model.seq_length"),
        (str(EXAMPLES / "llama3_8b_sft_cp4_good.yaml"), "--model", "gpt5"),
        (str(EXAMPLES / "llama3_8b_sft_cp4_good.yaml"), "--packed", "/nonexistent/packed"),
    ],
)
def test_unreadable_input_exits_2_with_reason(args: tuple[str, ...]) -> None:
    code, out = run(*args)
    assert code == 2
    assert "error:" in out
    code, out = run(*args, "--json")
    assert code == 2 and json.loads(out)["input_error"]


def test_unknown_dataset_kind_is_refused_by_its_choices() -> None:
    code, out = run(str(EXAMPLES / "llama3_8b_sft_cp4_good.yaml"), "--dataset-kind", "web")
    assert code == 2 and "'web' is not one of" in out and "'energon'" in out


def test_list_rules() -> None:
    code, out = run("--list-rules", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["id"] for r in rows] == RULES.ids()
    assert {r["severity"] for r in rows} == {"error", "warning", "info"}
    code, out = run("--list-rules")
    assert code == 0
    assert "LP-CP-001" in out


def test_list_families() -> None:
    code, out = run("--list-families", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["qwen3_next_80b_a3b"]["offline_packing"] is False
    assert rows["deepseek_v3"]["mtp_num_layers"] == 1


# --- packed folders ----------------------------------------------------------------------------------------


def write_packed(
    folder: Path, rows: list[list[int]], pack_size: int, *, metadata: bool = True, name: str = "training"
) -> Path:
    """Write a Megatron-Bridge packed folder: rows given as stored segment lengths."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, starts, masks = [], [], []
    for segs in rows:
        row_ids: list[int] = []
        row_starts = []
        row_mask: list[int] = []
        for length in segs:
            row_starts.append(len(row_ids))
            row_ids.extend([7] * (length - 1) + [2])
            row_mask.extend([1] * (length - 1) + [0])  # label-shifted: a sample's last position is 0
        ids.append(row_ids)
        starts.append(row_starts)
        masks.append(row_mask)
    table = pa.table(
        {
            "input_ids": pa.array(ids, type=pa.list_(pa.int64())),
            "loss_mask": pa.array(masks, type=pa.list_(pa.int8())),
            "seq_start_id": pa.array(starts, type=pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, folder / f"{name}_{pack_size}.idx.parquet", row_group_size=2)
    if metadata:  # what the rows give (check --packed verifies it, as inspect --verify does)
        import numpy as np

        from longpack.packed.plan import PackPlan, pack_metadata

        runtime = np.array([n - 1 for segs in rows for n in segs])
        offsets = np.cumsum([0, *(len(segs) for segs in rows)])
        plan = PackPlan(order=np.arange(len(runtime)), row_offsets=offsets)
        meta = [pack_metadata(runtime, plan, pack_size)]
        (folder / f"{pack_size}_metadata.jsonl").write_text(json.dumps(meta))
    return folder


def named(folder: Path) -> str:
    """Megatron-Bridge writes no manifest.json: its files are checked by naming them (a glob)."""
    return str(folder / "*.idx.parquet")


SMALL = [
    "longpack.world_size=16",
    "longpack.model_family=llama3_1_8b",
    "model.tensor_model_parallel_size=2",
    "model.context_parallel_size=2",
    "model.sequence_parallel=true",
    "model.calculate_per_token_loss=true",
    "model.seq_length=128",
    "dataset.seq_length=128",
    "dataset.enable_offline_packing=true",
    "dataset.offline_packing_specs.packed_sequence_size=128",
    "dataset.offline_packing_specs.pad_seq_to_mult=4",
    "train.global_batch_size=8",
    "longpack.dataset_kind=sft",
]


def test_packed_folder_aligned_passes(tmp_path: Path) -> None:
    # Stored lengths 4k+1 -> runtime lengths multiples of 4.
    folder = write_packed(
        tmp_path / "tok_pad_seq_to_mult4_sft_abcdefabcdef", [[33, 65, 17], [129], [9, 9, 9]], 128
    )
    code, out = run(*SMALL, "--packed", named(folder), "--json")
    data = json.loads(out)
    assert code == 0, out
    assert (
        data["packed"]["rows"] == 3
        and data["packed"]["sequences"] == 7
        and data["packed"]["misaligned_sequences"] == 0
    )


def test_packed_folder_misaligned_and_wrong_size_fail(tmp_path: Path) -> None:
    folder = write_packed(tmp_path / "p", [[33, 66], [10, 9]], 256)
    code, out = run(*SMALL, "--packed", named(folder), "--json")
    assert code == 1
    found = {f["id"]: f for f in json.loads(out)["findings"]}
    assert "LP-DATA-002" in found and "N=256" in found["LP-DATA-002"]["message"]
    assert "2 of 4 packed sequences" in found["LP-DATA-004"]["message"]
    assert "row 0 sequence 1 has 65 tokens" in found["LP-DATA-004"]["message"]


def test_packed_folder_without_metadata_with_pad_cu_seqlens(tmp_path: Path) -> None:
    folder = write_packed(tmp_path / "p", [[33, 65]], 128, metadata=False)
    extra = [
        "dataset.offline_packing_specs.pad_cu_seqlens=true",
        "dataset.dataset_kwargs.pad_to_max_length=true",
    ]
    code, out = run(*SMALL, *extra, "--packed", named(folder), "--json")
    assert code == 1
    assert "LP-DATA-001" in {f["id"] for f in json.loads(out)["findings"]}
    # Without pad_cu_seqlens a missing metadata file is fine; named files need no manifest.
    code, _ = run(*SMALL, "--packed", named(folder))
    assert code == 0
    # The folder itself has no manifest.json: an unfinished `longpack pack` output, refused.
    code, out = run(*SMALL, "--packed", str(folder))
    assert code == 2 and "unfinished" in out


def test_inspect_packed_dir_reads_manifest_and_over_capacity(tmp_path: Path) -> None:
    folder = write_packed(tmp_path / "p", [[65, 57, 9], [33]], 128)
    files = [{"name": "training_128.idx.parquet"}]
    manifest = {"settings": {"pad_seq_to_mult": 8}, "splits": {"training": {"files": files}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    summary = inspect_packed_dir(folder, multiple=8)
    assert summary.recorded_pad_seq_to_mult == 8
    assert summary.rows_over_pack_size == 0 and summary.max_row_runtime_tokens == 64 + 56 + 8
    assert summary.segment_length_gcd == 8 and summary.misaligned_segments == 0
    folder2 = write_packed(tmp_path / "q", [[129, 9]], 128)
    assert inspect_packed_dir(named(folder2), multiple=8).rows_over_pack_size == 1


def test_inspect_packed_dir_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackedDataError, match=r"no \*\.parquet / \*\.npy files"):
        inspect_packed_dir(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2]])}), bad / "training_8.idx.parquet")
    with pytest.raises(PackedDataError, match="missing required columns"):
        inspect_packed_dir(bad / "training_8.idx.parquet")


def test_list_rules_markdown_has_every_rule() -> None:
    # The rule table moved from README.md to the docs site (generated there; see tests/test_docs.py).
    code, out = run("--list-rules", "--markdown")
    assert code == 0
    for rule_id, r in RULES.items():
        assert f"| `{rule_id}` | {r.severity.value} |" in out, rule_id


def test_packed_sp_alignment_is_a_warning_when_2cp_holds(tmp_path: Path) -> None:
    # TP4 CP2 SP: THD needs 2*CP = 4 per sequence (hard), the docs ask for lcm(4, 8) = 8.
    folder = write_packed(tmp_path / "p", [[5, 13, 9], [129]], 128)
    code, out = run(*SMALL, "model.tensor_model_parallel_size=4", "--packed", named(folder), "--json")
    data = json.loads(out)
    assert code == 0, out
    warned = {f["id"]: f for f in data["findings"] if f["severity"] == "warning"}
    assert set(warned) == {"LP-PACK-016", "LP-DATA-010"}
    assert "2 of 4 packed sequences are not a multiple of 8" in warned["LP-DATA-010"]["message"]
    code, out = run(
        *SMALL,
        "model.tensor_model_parallel_size=4",
        "model.context_parallel_size=4",
        "--packed",
        named(folder),
        "--json",
    )
    errors = {f["id"] for f in json.loads(out)["findings"] if f["severity"] == "error"}
    assert code == 1 and {"LP-DATA-004", "LP-PACK-008"} <= errors
