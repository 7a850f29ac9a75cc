"""``longpack pack --output-format dpo``: preference pairs (prompt, chosen, rejected) tokenized as NeMo-Aligner's
``DPOModelDataset`` tokenizes a string prompt, packed whole into NeMo-Aligner's packed DPO ``.npy``.

One row of input: ``prompt`` (a string) and the two responses, ``chosen_response`` / ``rejected_response``
(NeMo-Aligner's keys) or ``chosen`` / ``rejected`` (TRL's), optionally ``chosen_reward`` / ``rejected_reward``
(NeMo-Aligner's defaults: 1.0 and 0.0). As ``DPOModelDataset.__getitem__`` does for a string prompt
(NVIDIA/NeMo-Aligner@af2b3bd96ad78190f6ebfb552b9e599e313ce027, ``nemo_aligner/data/nlp/datasets.py``), the prompt
and ``prompt + response`` are tokenized on their own, the response's tokens are what follows the prompt's, and
the prompt is masked (``-100``) in the labels; a tokenizer that merges tokens across the prompt/response seam
(NeMo-Aligner asserts) makes the row malformed, named by ``file:line``. Pairs longer than ``pack_size`` are
dropped and listed by ``file:line`` (NeMo-Aligner keeps them with no loss; longpack never packs them).

The folder holds ``packed_{pack_size}_seed{seed}.npy`` (NeMo-Aligner's name for
``prepare_packed_dpo_dataset.py``'s output) and, last, ``manifest.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from longpack import choices
from longpack.errors import InputError

if TYPE_CHECKING:
    from longpack.packed.manifest import PackManifest
    from longpack.text.tokenizers import Tokenizer

__all__ = ["DPO_FILE", "RESPONSE_KEYS", "pack_preference_folder"]

#: NeMo-Aligner's name of a packed DPO file (``prepare_packed_dpo_dataset.py``'s ``output_path``).
DPO_FILE = "packed_{pack_size}_seed{seed}.npy"
#: The keys of each response, NeMo-Aligner's first, then TRL's.
RESPONSE_KEYS = {"chosen": ("chosen_response", "chosen"), "rejected": ("rejected_response", "rejected")}
#: NeMo-Aligner's ``data.default_chosen_reward`` / ``default_rejected_reward`` (``DPOModelDataset``).
DEFAULT_REWARDS = {"chosen": 1.0, "rejected": 0.0}
MAX_LISTED = 1000


def _pair(row: Any, tokenizer: Tokenizer) -> tuple[Any, str | None]:
    """The row's :class:`~longpack.packed.preference.PreferencePair`, or ``(None, why it is malformed)``."""
    from longpack.packed.preference import PreferencePair

    if not isinstance(row, dict):
        return None, f"a {type(row).__name__}, not an object with prompt, chosen and rejected"
    prompt = row.get("prompt")
    if not isinstance(prompt, str):
        kind = "missing" if prompt is None else f"a {type(prompt).__name__}"
        return None, (
            f"prompt is {kind}; output_format dpo reads a string prompt (NeMo-Aligner's chat-message prompts "
            "need its chat_prompt_tokens: render the conversation into the prompt string first)"
        )
    texts: dict[str, str] = {}
    for side, keys in RESPONSE_KEYS.items():
        value = next((row[k] for k in keys if k in row), None)
        if not isinstance(value, str):
            kind = "missing" if value is None else f"a {type(value).__name__}"
            return None, f"{' / '.join(keys)} is {kind}; give the {side} response as a string"
        texts[side] = value
    rewards = {}
    for side, default in DEFAULT_REWARDS.items():
        value = row.get(f"{side}_reward", default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, f"{side}_reward is {value!r}, not a number"
        rewards[side] = float(value)
    prompt_ids = tokenizer.encode(prompt)
    responses = {}
    for side, text in texts.items():
        full = tokenizer.encode(prompt + text)
        if full[: len(prompt_ids)] != prompt_ids:
            return None, (
                f"the tokenizer merges tokens across the prompt / {side} response seam (NeMo-Aligner's "
                "DPOModelDataset refuses such a pair); end the prompt on a token boundary (e.g. a newline)"
            )
        responses[side] = full[len(prompt_ids) :]
    for side, ids in responses.items():
        if len(prompt_ids) + len(ids) < 2:  # after the next-token shift it would train on nothing
            return (
                None,
                f"the {side} sequence (prompt + response) has {len(prompt_ids) + len(ids)} token(s); it needs 2",
            )
    pair = PreferencePair(
        prompt=prompt_ids,
        chosen=responses["chosen"],
        rejected=responses["rejected"],
        chosen_reward=rewards["chosen"],
        rejected_reward=rewards["rejected"],
    )
    return pair, None


def pack_preference_folder(
    *,
    inputs: tuple[str, ...],
    out: Path,
    tokenizer: Tokenizer | None,
    pack_size: int,
    algorithm: str,
    seed: int,
    overwrite: bool,
) -> PackManifest:
    """Read, tokenize and pack ``inputs`` as preference pairs into ``out`` (held under its lock, by the pack
    job); return the manifest written last."""
    from longpack._version import __version__
    from longpack.outputs import atomic_write_bytes
    from longpack.packed.manifest import MANIFEST_NAME, PackManifest
    from longpack.packed.pipeline import prepare_out_dir
    from longpack.packed.preference import pack_preference_pairs, write_packed_dpo
    from longpack.text.inputs import find_inputs
    from longpack.text.pipeline import read_rows

    if tokenizer is None:
        raise InputError(
            "output_format dpo tokenizes its rows: give tokenizer, not a store", fields="tokenizer"
        )
    listing = find_inputs(list(inputs))
    pairs: list[Any] = []
    where: list[str] = []
    malformed: list[dict[str, Any]] = []
    read: list[dict[str, Any]] = []
    rows_read = 0
    for source in listing.files:
        count = 0
        for number, row, error in read_rows(source, None):
            rows_read += 1
            count += 1
            label = f"{source.path}:{number}"
            pair, why = (None, error) if error is not None else _pair(row, tokenizer)
            if pair is None:
                malformed.append({"source": label, "reason": why})
                continue
            pairs.append(pair)
            where.append(label)
        read.append({"path": str(source.path), "kind": source.kind, "rows": count})
    if not pairs:
        first = f"; first: {malformed[0]['source']}: {malformed[0]['reason']}" if malformed else ""
        raise InputError(
            f"no preference pair in {rows_read} row(s) ({len(malformed)} malformed{first})", fields="inputs"
        )
    packing = pack_preference_pairs(pairs, pack_size, algorithm=algorithm, seed=seed)
    name = DPO_FILE.format(pack_size=pack_size, seed=seed)
    prepare_out_dir(out, overwrite)
    write_packed_dpo(packing, out / name)
    warnings = []
    if malformed:
        warnings.append(
            f"{len(malformed)} malformed row(s) not packed (first: {malformed[0]['source']}: "
            f"{malformed[0]['reason']})"
        )
    if packing.dropped:
        warnings.append(
            f"{len(packing.dropped)} pair(s) longer than pack_size={pack_size} dropped (first: "
            f"{where[packing.dropped[0]]})"
        )
    tokens = sum(len(r["input_ids"]) for r in packing.rows)
    manifest = PackManifest.from_dict(
        {
            "versions": {"longpack": __version__},
            "settings": {
                "output_format": choices.DPO,
                "pack_size": pack_size,
                "algorithm": algorithm,
                "seed": seed,
                "text": {"detected_format": "preference"},
            },
            "inputs": read,
            "tokenizer": tokenizer.identity(),
            "counts": {
                "rows_read": rows_read,
                "malformed": len(malformed),
                "pairs_read": len(pairs),
                "packed": len(pairs) - len(packing.dropped),
                "dropped": len(packing.dropped),
                "rows": len(packing.rows),
            },
            "malformed": malformed[:MAX_LISTED],
            "splits": {},
            "preference": {
                "file": name,
                "layout": "NeMo-Aligner packed DPO (DPOPackedDataset), NVIDIA/NeMo-Aligner@af2b3bd9",
                "tokens": tokens,
                "fill_mean": tokens / (len(packing.rows) * pack_size) if packing.rows else 0.0,
                "dropped": [where[i] for i in packing.dropped[:MAX_LISTED]],
                "row_sources": {str(i): [where[k] for k in r["pair_ids"]] for i, r in enumerate(packing.rows)}
                if len(packing.rows) <= MAX_LISTED
                else {},
            },
            "warnings": warnings,
        }
    )
    atomic_write_bytes(out / MANIFEST_NAME, manifest.to_json_bytes())
    return manifest
