"""Start Megatron-Bridge's own readers on a ``longpack pack`` output, as a Bridge user would: two checks.

Run from the repository root (not in CI: they need Bridge's source):

    # Bridge main: build the datasets from the written bridge_config.yaml (and from the printed overrides)
    PYTHONPATH=src python benchmarks/bridge_handoff.py config OUT \\
        --harness /path/to/mb_reader_harness.py --bridge-git /path/to/Megatron-Bridge(.git)

    # released Bridge 0.3.x: read an --output-format npy output with its GPTSFTPackedDataset
    PYTHONPATH=src python benchmarks/bridge_handoff.py npy OUT --bridge-src /path/to/megatron_bridge-0.3.1

``config``: Bridge main's modules are loaded by the reader harness (``load_bridge``: Bridge's files executed
unmodified from git, heavy imports stubbed). ``OUT/bridge_config.yaml`` is read with OmegaConf; its
``dataset`` section becomes ``GPTSFTDatasetConfig(**dataset)`` with the specs instantiated from their
``_target_``, exactly the objects Bridge's ``ConfigContainer`` holds after merging the file; the printed
overrides are also parsed by Hydra's own override parser (after a real shell has passed them) and must give
the same mapping. Then ``GPTSFTDatasetBuilder(config, tokenizer).build()`` runs (Bridge's prepare step sees
the files and skips), and every row of every split goes through the dataset's ``__getitem__``,
``collate_fn`` and ``validate_row`` and is compared with the rows longpack reads.

``npy``: released Bridge's ``megatron/bridge/data/datasets/sft.py`` is imported from an unpacked wheel,
unmodified (HF ``datasets`` and Bridge's tokenizer class are stubbed: a packed dataset never calls them);
``create_sft_dataset(path, ..., pack_metadata_file_path=..., pad_seq_to_mult=...)``, called as 0.3.1's
``FinetuningDatasetBuilder`` calls it, picks ``GPTSFTPackedDataset`` for the ``.npy`` path and loads it
(``np.load(allow_pickle=True)``); every row is compared with longpack's reading and collated by its
``collate_fn``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from longpack.packed.folder import PackedFolder


def _longpack_rows(out: Path, split: str) -> list[dict[str, list[int]]]:
    folder = PackedFolder.open(out, split=split)
    rows = []
    for source in folder.sources(split):
        for g in range(len(source.group_rows)):
            cols = source.read_group(g)
            ids, mask, starts = cols["input_ids"], cols["loss_mask"], cols["seq_start_id"]
            for r in range(len(ids.offsets) - 1):
                rows.append(
                    {
                        "input_ids": ids.values[ids.offsets[r] : ids.offsets[r + 1]].tolist(),
                        "loss_mask": mask.values[mask.offsets[r] : mask.offsets[r + 1]].tolist(),
                        "seq_start_id": starts.values[starts.offsets[r] : starts.offsets[r + 1]].tolist(),
                    }
                )
    return rows


def _overrides_mapping(out: Path) -> dict[str, Any]:
    """The printed overrides, passed through bash and parsed by Hydra, applied to an empty config."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from longpack.packed.bridge_config import handoff_from_manifest

    manifest = json.loads((out / "manifest.json").read_text())
    handoff = handoff_from_manifest(out, manifest, **manifest["bridge_config"]["options"])
    argv = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + " ".join(handoff.overrides())],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    cfg = OmegaConf.create({"model": {}, "train": {}, "ddp": {}, "dataset": {}})
    OmegaConf.set_struct(cfg, False)
    parsed = OverridesParser.create().parse_overrides(overrides=argv)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    return {k: v for k, v in OmegaConf.to_container(cfg).items() if v}  # type: ignore[union-attr]


def check_config(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    spec = importlib.util.spec_from_file_location("mb_reader_harness", args.harness)
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    loaded = harness.load_bridge(args.bridge_git, None)
    mods = loaded["mods"]
    out = args.out.resolve()
    yaml_cfg = OmegaConf.to_container(OmegaConf.load(out / "bridge_config.yaml"))
    assert isinstance(yaml_cfg, dict)
    from_overrides = _overrides_mapping(out)
    same = from_overrides == yaml_cfg
    print(f"overrides through bash + Hydra's parser == bridge_config.yaml: {same}")
    dataset = dict(yaml_cfg["dataset"])
    specs = dict(dataset.pop("offline_packing_specs"))
    target = specs.pop("_target_")
    module, name = target.rsplit(".", 1)
    specs_cls = getattr(mods[module], name)
    config_cls = mods["megatron.bridge.data.builders.gpt_sft"].GPTSFTDatasetConfig
    config = config_cls(**dataset, offline_packing_specs=specs_cls(**specs))
    config.finalize()
    manifest = json.loads((out / "manifest.json").read_text())
    tok = harness.make_tokenizer(
        manifest["alignment"]["eos_id"], manifest["tokenizer"].get("vocab_size", 1 << 31)
    )
    builder = mods["megatron.bridge.data.builders.gpt_sft"].GPTSFTDatasetBuilder(config=config, tokenizer=tok)
    train, val, test = builder.build()
    validate = mods["megatron.bridge.data.packing.parquet"].GPTSFTPackedParquetDataset.validate_row
    errors = 0
    for split, ds in (("training", train), ("validation", val)):
        if split not in manifest["splits"]:
            print(f"{split}: not packed; Bridge built {type(ds).__name__ if ds is not None else None}")
            errors += ds is not None
            continue
        ours = _longpack_rows(out, split)
        bad = 0
        for i in range(len(ds)):
            item = ds[i]
            row = ours[i]
            if item["input_ids"] != row["input_ids"] or item["seq_boundaries"] != [
                *row["seq_start_id"],
                len(row["input_ids"]),
            ]:
                bad += 1
            validate(i, item["input_ids"], item["loss_mask"], item["seq_boundaries"][:-1])
            batch = ds.collate_fn([item])
            assert int(batch["tokens"].shape[1]) <= config.offline_packing_specs.packed_sequence_size
        for j in range(0, len(ds) - 3, max(1, len(ds) // 8)):
            ds.collate_fn([ds[k] for k in range(j, j + 4)])
        errors += bad + (len(ds) != len(ours))
        print(
            f"{split}: {type(ds).__name__} from bridge_config.yaml, {len(ds)} rows (longpack reads {len(ours)}), "
            f"{bad} rows differ; every row through __getitem__, validate_row and collate_fn"
        )
    print(
        f"test split: {test}; bridge {loaded['bridge_commit'][:12]}; print_rank_0: {harness.PRINT_RANK_0[:3]}"
    )
    result = "PASS" if errors == 0 and same else "FAIL"
    print(f"-> {result}")
    return 0 if result == "PASS" else 1


def _load_031(src: Path) -> types.ModuleType:
    root = src / "megatron" / "bridge"

    def package(name: str, path: Path | None) -> None:
        module = types.ModuleType(name)
        module.__path__ = [str(path)] if path is not None else []
        sys.modules[name] = module

    import megatron.core.msc_utils  # noqa: F401

    package("megatron.bridge", root)
    package("megatron.bridge.data", root / "data")
    package("megatron.bridge.data.datasets", root / "data" / "datasets")
    package("megatron.bridge.utils", root / "utils")
    package("megatron.bridge.training", None)
    package("megatron.bridge.training.tokenizers", None)

    class MegatronTokenizer:
        pass

    stub = types.ModuleType("megatron.bridge.training.tokenizers.tokenizer")
    stub.MegatronTokenizer = MegatronTokenizer  # type: ignore[attr-defined]
    sys.modules[stub.__name__] = stub
    if "datasets" not in sys.modules:  # HF datasets: only the unpacked JSONL path calls it

        def refuse(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("stub datasets.load_dataset called")

        sys.modules["datasets"] = types.SimpleNamespace(  # type: ignore[assignment]
            load_dataset=refuse, builder=types.SimpleNamespace()
        )
    return importlib.import_module("megatron.bridge.data.datasets.sft")


def check_npy(args: argparse.Namespace) -> int:
    sft = _load_031(args.bridge_src)
    out = args.out.resolve()
    manifest = json.loads((out / "manifest.json").read_text())
    align = manifest["alignment"]
    tok = types.SimpleNamespace(
        eos_id=align["eos_id"], eod=align["eos_id"], bos_id=None, pad_id=align["eos_id"]
    )
    meta = out / manifest["megatron_bridge"]["packed_metadata_path"]
    errors = 0
    for split, key in (("training", "packed_train_data_path"), ("validation", "packed_val_data_path")):
        if key not in manifest["megatron_bridge"]:
            continue
        path = out / manifest["megatron_bridge"][key]
        # As FinetuningDatasetBuilder._create_dataset calls it for a packed split.
        ds = sft.create_sft_dataset(
            path,
            tokenizer=tok,
            seq_length=align["pack_size"],
            memmap_workers=1,
            seed=1234,
            is_test=split == "validation",
            pack_metadata_file_path=meta,
            pad_cu_seqlens=False,
            pad_seq_to_mult=align["pad_seq_to_mult"],
        )
        ours = _longpack_rows(out, split)
        bad = sum(
            1
            for i in range(len(ds))
            if ds[i]["input_ids"] != ours[i]["input_ids"]
            or ds[i]["loss_mask"] != ours[i]["loss_mask"]
            or ds[i]["seq_boundaries"] != [*ours[i]["seq_start_id"], len(ours[i]["input_ids"])]
        )
        for i in range(len(ds)):
            ds.collate_fn([ds[i]])
        errors += bad + (len(ds) != len(ours))
        print(
            f"{split}: Bridge 0.3.1 {type(ds).__name__}({path.name}): {len(ds)} rows (longpack reads {len(ours)}), "
            f"{bad} rows differ; every row collated"
        )
    print(f"-> {'PASS' if errors == 0 else 'FAIL'}")
    return 0 if errors == 0 else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config")
    c.add_argument("out", type=Path)
    c.add_argument("--harness", type=Path, required=True)
    c.add_argument("--bridge-git", required=True)
    n = sub.add_parser("npy")
    n.add_argument("out", type=Path)
    n.add_argument("--bridge-src", type=Path, required=True)
    args = ap.parse_args()
    sys.exit(check_config(args) if args.cmd == "config" else check_npy(args))


if __name__ == "__main__":
    main()
