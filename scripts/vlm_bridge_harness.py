"""Run Megatron-Bridge's own VLM packing functions from a Bridge checkout on the samples longpack packs, and
compare every key of the packed batches (maintainer script; the committed tests restate these functions).

    python scripts/vlm_bridge_harness.py --bridge /path/to/Megatron-Bridge [--json out.json]

``--bridge`` is a work tree or a bare git dir; its ``HEAD`` is exported to a temporary folder with
``git archive`` and the modules are loaded from there. Package ``__init__`` files are not run (they import
the whole of Bridge, with GPU-only dependencies); one module is replaced: ``megatron.bridge.utils.common_utils``
(its import of ``megatron.core._rank_utils.safe_get_world_size`` is missing from megatron-core 0.16.1), by a
``get_local_rank_preinit() -> 0`` stand-in, which only ``data/datasets/utils.py`` imports.

Families and Bridge functions:

- ``gemma3``: ``models/gemma_vl/data/collate_fn.py`` ``gemma3_vl_collate_fn(enable_in_batch_packing=True)``
  on the raw examples (Bridge runs the processor itself) vs longpack's ``Gemma3Preparer`` +
  ``build_visual_thd_batch``;
- ``qwen2_vl``, ``qwen3_vl``: ``models/qwen_vl/data/collate_fn.py`` ``build_qwen_vl_packed_batch`` (what
  ``qwen2_5_collate_fn`` in-batch and the Qwen3-VL native Energon encoder's ``batch`` call) on longpack's
  prepared sequences vs ``build_visual_thd_batch``.

Prints one line per family, alignment and key: ``pass`` / ``FAIL`` with the difference.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
STUBBED = {"megatron.bridge.utils.common_utils": "get_local_rank_preinit() -> 0"}


def _git_dir(path: Path) -> Path:
    return path / ".git" if (path / ".git").exists() else path


def export_bridge(checkout: Path, into: Path) -> str:
    """Export ``HEAD:src/megatron/bridge`` into ``into``; the commit."""
    gitdir = _git_dir(checkout)
    commit = subprocess.run(
        ["git", f"--git-dir={gitdir}", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", f"--git-dir={gitdir}", "archive", "HEAD", "src/megatron/bridge"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def load_bridge(root: Path) -> dict[str, Any]:
    """Bridge's packing modules from an exported tree (packages as bare namespaces, see the docstring)."""
    import megatron  # megatron-core's namespace package

    bridge = root / "src" / "megatron" / "bridge"
    for folder in [bridge, *(p for p in bridge.rglob("*") if p.is_dir())]:
        name = "megatron." + ".".join(folder.relative_to(bridge.parent).parts)
        module = types.ModuleType(name)
        module.__path__ = [str(folder)]
        sys.modules[name] = module
    megatron.bridge = sys.modules["megatron.bridge"]  # type: ignore[attr-defined]
    common = types.ModuleType("megatron.bridge.utils.common_utils")
    common.get_local_rank_preinit = lambda: 0  # type: ignore[attr-defined]
    sys.modules[common.__name__] = common
    return {
        "gemma": importlib.import_module("megatron.bridge.models.gemma_vl.data.collate_fn"),
        "qwen": importlib.import_module("megatron.bridge.models.qwen_vl.data.collate_fn"),
    }


def compare(bridge_batch: dict[str, Any], ours: dict[str, Any]) -> dict[str, str]:
    """``{key: "pass" | "FAIL: why"}`` for every key of Bridge's batch (visual inputs per field)."""
    import torch

    def same(a: Any, b: Any) -> str:
        if a is None or b is None:
            return "pass" if a is None and b is None else f"FAIL: {a!r} vs {b!r}"
        if isinstance(a, torch.Tensor):
            if not isinstance(b, torch.Tensor):
                return f"FAIL: tensor vs {type(b).__name__}"
            if a.dtype != b.dtype or a.shape != b.shape:
                return f"FAIL: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
            return "pass" if torch.equal(a, b) else "FAIL: values differ"
        return "pass" if a == b else f"FAIL: {a!r} vs {b!r}"

    out = {}
    for key, value in bridge_batch.items():
        if key == "visual_inputs":
            fields = {k: v for k, v in vars(value).items() if v is not None} if value is not None else {}
            mine = ours.get("visual_inputs") or {}
            for name in sorted(set(fields) | set(mine)):
                out[f"visual_inputs.{name}"] = same(fields.get(name), mine.get(name))
        else:
            out[key] = "FAIL: missing in longpack" if key not in ours else same(value, ours[key])
    return out


def run(checkout: Path) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    from longpack.runtime.in_batch import build_visual_thd_batch
    from longpack.vlm.families import Gemma3Family, vlm_family
    from longpack.vlm.vision import decode_image
    from vlm_helpers import gemma3_processor, random_samples

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        commit = export_bridge(checkout, Path(tmp))
        mods = load_bridge(Path(tmp))
        results["bridge_commit"] = commit
        results["stubbed"] = STUBBED
        samples = random_samples(8, seed=11, max_images=2, max_side=300)
        cases = [(None, 1, False), (4096, 8, False), (4096, 8, True)]
        # Gemma3-VL: Bridge runs the processor on the raw examples.
        processor = gemma3_processor()
        prep = Gemma3Family().preparer(processor=processor, max_images=None, max_visual_tokens=None)
        seqs = [prep.prepare(s) for s in samples]
        examples = [
            {
                "conversation": prep._hf_conversation(
                    m := prep._conversation(s, "h")[0], [decode_image(i) for i in prep._conversation(s, "h")[1]]
                )
            }
            for s in samples
        ]
        del m
        for length, multiple, _ in cases[:2]:
            theirs = mods["gemma"].gemma3_vl_collate_fn(
                examples,
                processor,
                sequence_length=length,
                enable_in_batch_packing=True,
                in_batch_packing_pad_to_multiple_of=multiple,
            )
            ours = build_visual_thd_batch(seqs, sequence_length=length, pad_to_multiple_of=multiple)
            results[f"gemma3 m={multiple}"] = compare(theirs, ours)
        # Qwen-VL: Bridge packs prepared sequences (longpack's carry Bridge's row and visual_values).
        for name in ("qwen2_vl", "qwen3_vl"):
            import transformers

            family = vlm_family(name)
            v = family.vision
            qprep = family.preparer(
                image_processor=transformers.Qwen2VLImageProcessor(patch_size=v.patch_size, merge_size=v.merge_size)
            )
            qseqs = [qprep.prepare(s) for s in samples]
            for length, multiple, fixed in cases:
                theirs = mods["qwen"].build_qwen_vl_packed_batch(
                    qseqs, sequence_length=length, pad_to_multiple_of=multiple, pad_to_max_length=fixed
                )
                ours = build_visual_thd_batch(
                    qseqs, sequence_length=length, pad_to_multiple_of=multiple, pad_to_max_length=fixed
                )
                results[f"{name} m={multiple} fixed={fixed}"] = compare(theirs, ours)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bridge", type=Path, required=True, help="Megatron-Bridge work tree or bare git dir")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results = run(args.bridge)
    failed = 0
    print(f"Megatron-Bridge {results['bridge_commit']}; stubbed: {results['stubbed']}")
    for case, keys in results.items():
        if case in ("bridge_commit", "stubbed"):
            continue
        for key, verdict in keys.items():
            failed += verdict != "pass"
            print(f"{case:28s} {key:28s} {verdict}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print("all keys equal" if not failed else f"{failed} key(s) differ")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
