"""The manifest's ``settings`` are typed once, when the manifest is read (issue 41): readers ask
``manifest.settings.seed``, never a dict, and a manifest read back writes the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longpack.errors import PackedDataError
from longpack.jobs import PackConfig
from longpack.packed.manifest import MANIFEST_NAME, ManifestSettings, PackManifest


@pytest.mark.parametrize("output_format", ["parquet", "npy", "indexed"])
def test_a_written_manifest_reads_back_typed_and_writes_the_same_bytes(
    tmp_path: Path, output_format: str
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "q" * n}) + "\n" for n in range(2, 60)))
    out = tmp_path / "out"
    result = PackConfig(
        inputs=[str(src)], out=out, tokenizer="bytes", seq_length=64, output_format=output_format
    ).run()
    written = (out / MANIFEST_NAME).read_bytes()
    manifest = PackManifest.read(out)
    assert manifest.to_json_bytes() == written
    raw = json.loads(written)["settings"]
    s = manifest.settings
    assert (s.output_format, s.seq_length, s.seed) == (output_format, raw["seq_length"], raw["seed"])
    assert s.text == raw["text"] and isinstance(s.text, dict)
    assert s.to_dict() == raw and list(s.to_dict()) == list(raw)  # sorted, as the file holds them
    assert result.settings == s


def test_a_typed_key_recorded_as_null_stays_null() -> None:
    s = ManifestSettings.from_dict({"compat": None, "rows_per_shard": None, "seed": 0})
    assert s.compat is None and s.rows_per_shard is None and s.seed == 0
    assert s.to_dict() == {"compat": None, "rows_per_shard": None, "seed": 0}


@pytest.mark.parametrize(
    ("key", "value"),
    [("seed", "0"), ("pack_size", True), ("seq_length", 1.5), ("text", []), ("keep_single_token", 1)],
)
def test_a_typed_key_of_the_wrong_type_is_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(PackedDataError, match=f"settings: {key} must be"):
        PackManifest.from_dict({"settings": {key: value}, "splits": {}})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from([*ManifestSettings._KINDS, "balance", "val_fraction", "future"]),
        st.none() | st.integers(0, 9) | st.booleans() | st.text(max_size=3),
    )
)
def test_from_dict_then_to_dict_is_the_identity_or_a_refusal(data: dict[str, object]) -> None:
    try:
        s = ManifestSettings.from_dict(data)
    except PackedDataError:
        return
    assert s.to_dict() == data
    assert ManifestSettings.from_dict(s.to_dict()) == s


def test_the_handoff_reads_the_typed_manifest_and_names_a_missing_setting() -> None:
    from longpack.packed.bridge_config import handoff_from_manifest

    record = {
        "settings": {"pack_size": 8, "seq_length": 6, "pad_seq_to_mult": 2, "seed": 0},
        "megatron_bridge": {
            "packed_train_data_path": "training_8.idx.parquet",
            "packed_metadata_path": "8_metadata.jsonl",
        },
        "splits": {},
    }
    typed = PackManifest.from_dict(record)
    assert handoff_from_manifest(Path("/o"), typed) == handoff_from_manifest(Path("/o"), record)
    del record["settings"]["seq_length"]  # type: ignore[attr-defined]
    with pytest.raises(PackedDataError, match="settings lack seq_length"):
        handoff_from_manifest(Path("/o"), record)
