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
  ``build_visual_thd_batch``, with the released tokenizer's pad id 0 and with a pad id of 3;
- ``qwen2_vl``, ``qwen3_vl``: ``models/qwen_vl/data/collate_fn.py`` ``build_qwen_vl_packed_batch`` (what
  ``qwen2_5_collate_fn`` in-batch and the Qwen3-VL native Energon encoder's ``batch`` call) on longpack's
  prepared sequences vs ``build_visual_thd_batch``;
- Qwen-VL Energon grouping (native packing, #5285): ``data/packing/algorithms.py`` ``first_fit_decreasing``
  (what ``QwenVLTaskEncoder.select_samples_to_pack`` calls on the aligned lengths) vs
  ``longpack.binpack.megatron.first_fit_decreasing`` (what longpack's Energon encoder calls), on the Qwen3-VL
  prepared sequences' aligned lengths and on random buffers;
- ``glm4v``: the in-batch branch of ``models/glm_vl/data/collate_fn.py`` ``glm4v_collate_fn`` after its
  processor call (``data/packing/in_batch.py`` ``build_mcore_thd_sequence_batch_from_rows`` with
  ``mm_token_type_ids``, ``GenericVisualInputs``) vs ``build_glm4v_thd_batch`` on GLM rows;
- ``kimi_vl``: ``models/kimi_vl/data/collate_fn.py`` ``kimi_k25_vl_collate_fn(enable_in_batch_packing=True)``
  itself from its processor call on (a stand-in processor returns precomputed outputs; the chat-template loss
  mask helpers are replaced by the precomputed mask) vs ``build_kimi_thd_batch``;
- ``nemotron_vl``: ``models/nemotron_vl/nemotron_vl_utils.py`` ``adjust_image_tokens`` (imported) vs
  ``collapse_image_tokens`` per row, and ``training/llava_step.py``
  ``_expand_packed_metadata_for_visual_embeddings`` vs ``expand_packed_boundaries`` on random packed rows.
  ``llava_step`` imports Megatron-LM's ``megatron.training`` (not installed), so that one function is taken
  out of the file with ``ast`` and run with ``torch`` and megatron-core's ``unwrap_model`` as its globals, on a
  stand-in model object carrying ``image_token_index``, ``img_seq_len`` and ``_language_max_sequence_length``;
  and ``models/nemotron_vl/data/collate_fn.py`` ``nemotron_nano_v2_vl_collate_fn`` per sample (a stand-in
  processor: tests/vlm_helpers.py's Nemotron-shaped tokenizer and template, 256 ``<image>`` per tile,
  longpack's pixel tiles) vs ``NemotronVLPreparer.prepare``;
- generic HF-encoder Energon packing: ``data/energon/hf_task_encoder.py`` ``HFTaskEncoder(
  enable_in_batch_packing=True)`` ``batch`` + ``encode_batch`` with a Gemma3 processor vs
  ``VisualInBatchEncoder.batch``;
- MegatronMIMO: ``data/megatron_mimo/sequence_pack.py`` ``pack_language_shard`` with the lengths
  ``megatron_mimo_step.forward_step`` derives vs ``pack_mimo_language_shard``.

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
        ["git", f"--git-dir={gitdir}", "archive", "HEAD", "src/megatron/bridge"],
        capture_output=True,
        check=True,
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
        "kimi": importlib.import_module("megatron.bridge.models.kimi_vl.data.collate_fn"),
        "nemotron": importlib.import_module("megatron.bridge.models.nemotron_vl.nemotron_vl_utils"),
        "nemotron_collate": importlib.import_module("megatron.bridge.models.nemotron_vl.data.collate_fn"),
        "algorithms": importlib.import_module("megatron.bridge.data.packing.algorithms"),
        "in_batch": importlib.import_module("megatron.bridge.data.packing.in_batch"),
        "visual": importlib.import_module("megatron.bridge.data.collators.visual"),
        "visual_inputs": importlib.import_module("megatron.bridge.training.utils.visual_inputs"),
        "hf_encoder": importlib.import_module("megatron.bridge.data.energon.hf_task_encoder"),
        "mimo": importlib.import_module("megatron.bridge.data.megatron_mimo.sequence_pack"),
        "expand": extract_function(
            bridge / "training" / "llava_step.py", "_expand_packed_metadata_for_visual_embeddings"
        ),
    }


def extract_function(path: Path, name: str) -> Any:
    """Function ``name`` of ``path`` compiled alone (its module's imports are not run)."""
    import ast
    from typing import Any as AnyType

    import torch
    from megatron.core.utils import unwrap_model

    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, Any] = {
        "torch": torch,
        "Any": AnyType,
        "GPTModel": object,
        "unwrap_model": unwrap_model,
    }
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def run_grouping(mods: dict[str, Any], prepared: list[int], buffers: int = 300) -> dict[str, dict[str, str]]:
    """Bridge's Energon first-fit-decreasing groups vs longpack's, members and order."""
    import numpy as np

    from longpack.binpack.megatron import first_fit_decreasing

    rng = np.random.default_rng(1)
    fails = []
    for case in range(buffers + 1):
        multiple = int(rng.choice([1, 8, 64]))
        lengths = prepared if case == 0 else rng.integers(1, 3000, int(rng.integers(1, 65))).tolist()
        aligned = [-(-n // multiple) * multiple for n in lengths]
        capacity = max(max(aligned), int(rng.integers(1, 8193)) // multiple * multiple or multiple)
        items = [f"s{i}" for i in range(len(aligned))]
        theirs = mods["algorithms"].first_fit_decreasing(items, capacity, item_lengths=aligned)
        if theirs != first_fit_decreasing(items, capacity, item_lengths=aligned):
            fails.append(case)
    return {
        "qwen_vl energon grouping": {
            f"groups ({buffers + 1} buffers)": "pass" if not fails else f"FAIL: {fails[:5]}"
        }
    }


def run_nemotron(mods: dict[str, Any], seed: int = 0, rows: int = 200) -> dict[str, dict[str, str]]:
    """Random rows and packs through Bridge's two Nemotron-VL functions and longpack's."""
    import numpy as np
    import torch

    from longpack.vlm.families.nemotron_vl import (
        IMAGE_TOKEN_ID,
        IMG_END_TOKEN_ID,
        IMG_START_TOKEN_ID,
        collapse_image_tokens,
        expand_packed_boundaries,
    )

    rng = np.random.default_rng(seed)
    collapse_fail, expand_fail = [], []
    for case in range(rows):
        # A processor-style row: text with images as <img> + 256 x tiles media tokens + </img>.
        ids, tiles = [], []
        for _ in range(int(rng.integers(0, 4))):
            ids += rng.integers(10, 1000, int(rng.integers(0, 6))).tolist()
            n = int(rng.integers(1, 14))
            tiles.append(n)
            ids += [IMG_START_TOKEN_ID, *[IMAGE_TOKEN_ID] * (256 * n), IMG_END_TOKEN_ID]
        ids += rng.integers(10, 1000, int(rng.integers(1, 6))).tolist()
        theirs = mods["nemotron"].adjust_image_tokens(
            torch.tensor([ids]), tiles, IMG_START_TOKEN_ID, IMG_END_TOKEN_ID
        )[0]
        ours = torch.from_numpy(collapse_image_tokens(ids, tiles))
        if not torch.equal(theirs, ours):
            collapse_fail.append(case)
        # A packed row of collapsed sequences, with alignment gaps and a language-model length.
        lengths, spans, row = [], [], []
        padded = bool(rng.integers(0, 2))
        for _ in range(int(rng.integers(1, 6))):
            n = int(rng.integers(1, 30))
            k = int(rng.integers(0, min(n, 4) + 1))
            gap = int(rng.integers(0, 4)) if padded else 0
            row += [IMAGE_TOKEN_ID] * k + [7] * (n - k) + [0] * gap
            lengths.append(n)
            spans.append(n + gap)
        cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
        cu_padded = torch.tensor([0, *np.cumsum(spans).tolist()], dtype=torch.int32) if padded else None
        limit = None if rng.integers(0, 2) else int(rng.integers(1, 4000))
        model = types.SimpleNamespace(
            image_token_index=IMAGE_TOKEN_ID, img_seq_len=256, _language_max_sequence_length=limit
        )
        meta: dict[str, Any] = {"cu_seqlens_q": cu.clone(), "cu_seqlens_kv": cu.clone()}
        if padded:
            meta["cu_seqlens_q_padded"] = meta["cu_seqlens_kv_padded"] = cu_padded
        input_ids = torch.tensor([row])
        mods["expand"](meta, input_ids, model)
        mine = expand_packed_boundaries(cu, cu_padded, input_ids, language_max_sequence_length=limit)
        for key, value in meta.items():
            other = mine.get(key)
            equal = (
                torch.equal(value, other) and value.dtype == other.dtype
                if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor)
                else value == other
            )
            if not equal:
                expand_fail.append((case, key))
    return {
        "nemotron_vl collapse": {
            f"input_ids ({rows} rows)": "pass" if not collapse_fail else f"FAIL: rows {collapse_fail[:5]}"
        },
        "nemotron_vl expand": {
            f"cu_seqlens*/max_seqlen* ({rows} packs)": "pass"
            if not expand_fail
            else f"FAIL: {expand_fail[:5]}"
        },
    }


def run_hf_encoder(
    mods: dict[str, Any], processor: Any, examples: list[dict[str, Any]], prepared: list[Any]
) -> dict[str, dict[str, str]]:
    """Bridge's generic HF-encoder Energon task encoder (``HFTaskEncoder(enable_in_batch_packing=True)``, the
    ``HFEnergonTaskEncoderConfig`` path) with a Gemma3 processor: its ``batch`` on micro-batches of 4 examples
    then ``encode_batch`` (Bridge runs the processor through ``gemma3_vl_collate_fn``) vs
    ``VisualInBatchEncoder.batch`` on the same samples prepared by longpack's ``Gemma3Preparer``."""
    from longpack.online.vlm import VisualInBatchEncoder, VLMTaskSample
    from longpack.vlm.families import Gemma3Family

    hf = mods["hf_encoder"]
    results = {}
    for multiple in (1, 8):
        theirs_encoder = hf.HFTaskEncoder(
            processor=processor,
            seq_length=4096,
            enable_in_batch_packing=True,
            in_batch_packing_pad_to_multiple_of=multiple,
        )
        prep = Gemma3Family().preparer(processor=processor, max_images=None, max_visual_tokens=None)
        ours_encoder = VisualInBatchEncoder(prep, seq_length=4096, pad_to_multiple_of=multiple)
        for start in range(0, len(examples), 4):
            chunk = range(start, min(start + 4, len(examples)))
            theirs = theirs_encoder.encode_batch(
                theirs_encoder.batch(
                    [
                        hf.HFEnergonSample(__key__=f"k{i}", __subflavors__={}, example=examples[i])
                        for i in chunk
                    ]
                )
            )
            members = [
                VLMTaskSample(
                    __key__=f"k{i}",
                    __restore_key__=(),
                    __subflavors__={},
                    prepared=prepared[i],
                    rejected=None,
                    length=prepared[i].sequence_length,
                )
                for i in chunk
            ]
            ours = ours_encoder.batch(members)
            results[f"hf_encoder gemma3 m={multiple} batch {start // 4}"] = compare(theirs, ours)
    return results


class _NemotronProcessor:
    """A stand-in for Nemotron Nano V2 VL's processor (the checkpoint's remote code): the tokenizer's own chat
    template renders the conversation, each ``<image>`` becomes ``<img>`` + 256 ``<image>`` per tile +
    ``</img>`` (the processor's text, which Bridge's collate collapses), ``num_patches`` the tiles per image
    and ``pixel_values`` longpack's tiles (so pixels are not checked against the remote code here). Calls
    other than the collate's batch call go to the tokenizer, as a processor's would for text."""

    def __init__(self, prep: Any) -> None:
        self.prep = prep
        self.tokenizer = prep.tokenizer
        self.chat_template = prep.tokenizer.chat_template

    def apply_chat_template(self, conversations: Any, **kwargs: Any) -> Any:
        """A processor's ``apply_chat_template``: text when ``tokenize`` is false, else the processor call on
        the rendered text (images expanded), one conversation or a batch."""
        import torch

        from longpack.vlm.families.nemotron_vl import IMG_CONTEXT, IMG_END, IMG_START

        single = bool(conversations) and isinstance(conversations[0], dict)
        batch = [conversations] if single else list(conversations)
        if not kwargs.get("tokenize"):
            texts = [self.tokenizer.apply_chat_template(c, tokenize=False) for c in batch]
            return texts[0] if single else texts
        rows, tiles, pixels = [], [], []
        for conversation in batch:
            text = self.tokenizer.apply_chat_template(conversation, tokenize=False)
            images = [
                p["image"] for turn in conversation for p in turn["content"] if p.get("type") == "image"
            ]
            pieces = text.split(IMG_CONTEXT)
            out = [pieces[0]]
            for image, rest in zip(images, pieces[1:], strict=True):
                n = self.prep.family.tiles(*image.size)
                tiles.append(n)
                pixels.append(self.prep.pixel_tiles(image))
                out += [IMG_START + IMG_CONTEXT * (256 * n) + IMG_END, rest]
            rows.append(self.tokenizer("".join(out), add_special_tokens=False)["input_ids"])
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        result = {
            "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        }
        if tiles:
            result["num_patches"] = torch.tensor(tiles)
            result["pixel_values"] = torch.cat(pixels)
        return result


def run_nemotron_preparer(mods: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Nemotron-VL: Bridge's own ``nemotron_nano_v2_vl_collate_fn`` (one example per call: Bridge refuses
    in-batch packing for it; its loss mask from the ``<SPECIAL_11>Assistant\\n`` / ``<SPECIAL_12>`` markers,
    ``adjust_image_tokens``, ``num_patches`` per tile, labels, bfloat16 pixels) with a stand-in processor over
    tests/vlm_helpers.py's Nemotron-shaped tokenizer, vs ``NemotronVLPreparer.prepare`` of the same sample."""
    import tempfile

    from longpack.vlm.families.nemotron_vl import NemotronVLPreparer
    from longpack.vlm.vision import decode_image
    from vlm_helpers import nemotron_vl_checkpoint

    with tempfile.TemporaryDirectory() as folder:
        prep = NemotronVLPreparer.from_checkpoint(
            nemotron_vl_checkpoint(folder), max_images=None, max_visual_tokens=None
        )
    processor = _NemotronProcessor(prep)
    results = {}
    for sample in samples:
        seq = prep.prepare(sample)
        messages, images = prep._conversation(sample, seq.key)
        if not images:  # Bridge's collate reads the processor's pixel_values and num_patches unconditionally
            continue
        it = iter(decode_image(i) for i in images)
        conversation = [
            {
                "role": m["role"],
                "content": [
                    {"type": "image", "image": next(it)}
                    if p["type"] == "image"
                    else {"type": "text", "text": p["text"]}
                    for p in m["content"]
                ],
            }
            for m in messages
        ]
        theirs = mods["nemotron_collate"].nemotron_nano_v2_vl_collate_fn(
            [{"conversation": conversation}], processor, pad_to_multiple_of=1
        )
        ours: dict[str, Any] = {k: v[None] for k, v in seq.row.items()}
        if seq.visual_values:
            ours["pixel_values"] = seq.visual_values["pixel_values"]
            ours["num_patches"] = seq.visual_values["num_patches"]
            ours["visual_inputs"] = {"pixel_values": seq.visual_values["pixel_values"]}
        results[f"nemotron_vl prepare {seq.key}"] = compare(theirs, ours)
    return results


def run_mimo(mods: dict[str, Any], shards: int = 200) -> dict[str, dict[str, str]]:
    """MegatronMIMO: Bridge's ``pack_language_shard`` with the lengths ``megatron_mimo_step.forward_step``
    derives (``attention_mask.to(bool).sum(1)``) vs ``pack_mimo_language_shard``, on random right-padded
    shards of tests/vlm/test_vlm_mimo.py (2-D and MRoPE positions, with and without ``input_ids``)."""
    import torch

    from longpack.runtime.in_batch import pack_mimo_language_shard

    sys.path.insert(0, str(ROOT / "tests" / "vlm"))
    from test_vlm_mimo import mimo_shard

    fails: dict[str, list[int]] = {}
    for case in range(shards):
        batch = mimo_shard(case, mrope=case % 3 == 0, with_tokens=case % 4 != 1)
        lengths = batch["attention_mask"].to(torch.bool).sum(dim=1).to(torch.long)
        theirs, their_kwargs = mods["mimo"].pack_language_shard(dict(batch), lengths=lengths)
        ours, our_kwargs = pack_mimo_language_shard(batch)
        for key, verdict in {**compare(theirs, ours), **compare(their_kwargs, our_kwargs)}.items():
            if verdict != "pass":
                fails.setdefault(key, []).append(case)
        if set(ours) != set(theirs):
            fails.setdefault("keys", []).append(case)
    keys = ["input_ids", "labels", "loss_mask", "position_ids", "attention_mask", "modality_inputs"]
    keys += [f"cu_seqlens_{a}{b}" for a in ("q", "kv") for b in ("", "_padded")] + [
        "max_seqlen_q",
        "max_seqlen_kv",
    ]
    return {
        f"mimo ({shards} shards)": {
            key: "pass" if key not in fails else f"FAIL: shards {fails[key][:5]}" for key in [*keys, "keys"]
        }
    }


def run_glm4v(mods: dict[str, Any]) -> dict[str, dict[str, str]]:
    """GLM-4V: the in-batch branch of Bridge's ``glm4v_collate_fn`` after its processor call (Bridge's
    ``build_mcore_thd_sequence_batch_from_rows`` with ``mm_token_type_ids`` padded with 0, the THW-grid keys
    concatenated, all in ``GenericVisualInputs``) vs ``build_glm4v_thd_batch``, on the rows of
    tests/vlm/test_vlm_glm4v.py (the processor call and the chat-template loss mask are not run here)."""
    import torch

    from longpack.runtime.in_batch import build_glm4v_thd_batch

    sys.path.insert(0, str(ROOT / "tests" / "vlm"))
    from test_vlm_glm4v import glm_row

    pairs = [glm_row(seed, 5 + 7 * seed) for seed in range(8)]
    rows, visuals = [p[0] for p in pairs], [p[1] for p in pairs]
    results = {}
    for multiple in (1, 8):
        theirs = mods["in_batch"].build_mcore_thd_sequence_batch_from_rows(
            rows,
            sequence_length=4096,
            pad_token_id=0,
            ignore_index=-100,
            pad_to_multiple_of=multiple,
            sequence_tensor_pad_values={"mm_token_type_ids": 0},
        )
        kwargs = {
            key: torch.cat([v[key] for v in visuals if key in v], dim=0)
            for key in mods["visual"].THW_GRID_VISUAL_KEYS
            if any(key in v for v in visuals)
        }
        kwargs["mm_token_type_ids"] = theirs.pop("mm_token_type_ids")
        theirs["visual_inputs"] = mods["visual_inputs"].GenericVisualInputs(**kwargs)
        ours = build_glm4v_thd_batch(rows, visuals, sequence_length=4096, pad_to_multiple_of=multiple)
        results[f"glm4v m={multiple}"] = compare(theirs, ours)
    return results


class _KimiProcessorOutputs:
    """A stand-in for Kimi K2.5's processor (the checkpoint's remote code): ``apply_chat_template`` returns
    the example's index, the call returns that example's precomputed processor output (batch of one)."""

    media_placeholder_token_id = 163605

    def __init__(self, outputs: list[dict[str, Any]], pad_token_id: int) -> None:
        self.outputs = outputs
        self.tokenizer = types.SimpleNamespace(pad_token_id=pad_token_id)

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        return str(conversation[0]["index"])

    def __call__(self, text: str, medias: Any, return_tensors: str) -> dict[str, Any]:
        out = self.outputs[int(text)]
        batch = {k: out[k][None] for k in ("input_ids", "attention_mask")}
        batch.update({k: out[k] for k in ("grid_thws", "pixel_values") if k in out})
        return batch


def run_kimi(mods: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Kimi K2.5: Bridge's own ``kimi_k25_vl_collate_fn(enable_in_batch_packing=True)`` from the processor call
    on (``_expand_image_tokens_and_aligned_mask``, the rows, ``build_mcore_thd_sequence_batch_from_rows``,
    ``GenericVisualInputs``) vs ``build_kimi_thd_batch``, on tests/vlm/test_vlm_kimi_vl.py's processor outputs.
    The processor is the checkpoint's remote code, so a stand-in returns each example's output, and the
    chat-template loss mask is the example's (Bridge's ``build_assistant_loss_mask`` and its chat-template
    helpers are replaced in the module's namespace by functions returning it)."""
    from longpack.runtime.in_batch import build_kimi_thd_batch

    sys.path.insert(0, str(ROOT / "tests" / "vlm"))
    from test_vlm_kimi_vl import kimi_sample

    kimi = mods["kimi"]
    outputs = [kimi_sample(seed) for seed in range(10)]
    kimi.build_assistant_loss_mask = lambda example, *a, **k: outputs[example["index"]]["loss_mask"]
    kimi._kimi_assistant_mask_boundary_config = lambda processor: None
    kimi.chat_template_kwargs_from_example = lambda example: {}
    kimi.resolve_chat_template_kwargs = lambda processor, kwargs: kwargs
    examples = [
        {"index": i, "conversation": [{"index": i, "role": "user", "content": "x"}]} for i in range(10)
    ]
    results = {}
    for multiple, length, pad_id in ((1, None, 0), (8, 4096, 163838)):
        processor = _KimiProcessorOutputs(outputs, pad_id)
        theirs = kimi.kimi_k25_vl_collate_fn(
            examples,
            processor,
            sequence_length=length,
            enable_in_batch_packing=True,
            in_batch_packing_pad_to_multiple_of=multiple,
        )
        ours = build_kimi_thd_batch(
            outputs, sequence_length=length, pad_token_id=pad_id, pad_to_multiple_of=multiple
        )
        results[f"kimi_vl m={multiple} pad={pad_id}"] = compare(theirs, ours)
    return results


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
        from vlm_helpers import make_image

        samples.append(  # a system turn (Gemma folds it into the first user turn) and three exchanges
            {
                "__key__": "system3",
                "messages": [
                    {"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": "<image> What is this?"},
                    {"role": "assistant", "content": "A cube."},
                    {"role": "user", "content": "Colour?"},
                    {"role": "assistant", "content": "Red."},
                    {"role": "user", "content": "<image> And this one?"},
                    {"role": "assistant", "content": "A blue sky over a mat."},
                ],
                "images": [make_image(120, 80, 1), make_image(64, 200, 2)],
            }
        )
        cases = [(None, 1, False), (4096, 8, False), (4096, 8, True)]
        # Gemma3-VL: Bridge runs the processor on the raw examples.
        processor = gemma3_processor()
        prep = Gemma3Family().preparer(processor=processor, max_images=None, max_visual_tokens=None)
        seqs = [prep.prepare(s) for s in samples]
        examples = [
            {
                "conversation": prep._hf_conversation(
                    m := prep._conversation(s, "h")[0],
                    [decode_image(i) for i in prep._conversation(s, "h")[1]],
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
        # a tokenizer whose pad id is 3, not 0: Bridge pads the gaps with it
        padded = gemma3_processor(pad_last=True)
        pprep = Gemma3Family().preparer(processor=padded, max_images=None, max_visual_tokens=None)
        theirs = mods["gemma"].gemma3_vl_collate_fn(
            examples,
            padded,
            sequence_length=4096,
            enable_in_batch_packing=True,
            in_batch_packing_pad_to_multiple_of=8,
        )
        ours = build_visual_thd_batch(
            [pprep.prepare(s) for s in samples], sequence_length=4096, pad_to_multiple_of=8
        )
        results["gemma3 m=8 pad=3"] = compare(theirs, ours)
        results.update(run_hf_encoder(mods, processor, examples, seqs))
        # Qwen-VL: Bridge packs prepared sequences (longpack's carry Bridge's row and visual_values).
        for name in ("qwen2_vl", "qwen3_vl"):
            import transformers

            family = vlm_family(name)
            v = family.vision
            qprep = family.preparer(
                image_processor=transformers.Qwen2VLImageProcessor(
                    patch_size=v.patch_size, merge_size=v.merge_size
                )
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
        results.update(run_grouping(mods, [s.sequence_length for s in qseqs]))
        results.update(run_nemotron(mods))
        results.update(run_nemotron_preparer(mods, samples))
        results.update(run_glm4v(mods))
        results.update(run_kimi(mods))
        results.update(run_mimo(mods))
    return results


def main(argv: list[str] | None = None) -> int:
    from longpack.outputs import atomic_write_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bridge", type=Path, required=True, help="Megatron-Bridge work tree or bare git dir"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    try:
        results = run(args.bridge)
    except subprocess.CalledProcessError as exc:  # git or tar on something that is not a Bridge checkout
        err = exc.stderr or ""  # text from rev-parse, bytes from archive
        detail = (err.decode(errors="replace") if isinstance(err, bytes) else err).strip().splitlines()
        parser.error(
            f"--bridge {args.bridge}: not a Megatron-Bridge work tree or bare git dir with src/megatron/bridge "
            f"at HEAD ({detail[-1] if detail else f'exit {exc.returncode}'}); clone "
            "https://github.com/NVIDIA-NeMo/Megatron-Bridge and give its folder"
        )
    failed = 0
    print(f"Megatron-Bridge {results['bridge_commit']}; stubbed: {results['stubbed']}")
    for case, keys in results.items():
        if case in ("bridge_commit", "stubbed"):
            continue
        for key, verdict in keys.items():
            failed += verdict != "pass"
            print(f"{case:28s} {key:28s} {verdict}")
    if args.json:  # whole or not at all (longpack's one set of atomic writes)
        atomic_write_bytes(args.json, (json.dumps(results, indent=1, sort_keys=True) + "\n").encode())
    print("all keys equal" if not failed else f"{failed} key(s) differ")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
