"""Preference pairs (DPO) packed into NeMo-Aligner's packed DPO layout, and the batch it collates.

numpy only (no torch). The layout is the one NeMo-Aligner's
``examples/nlp/data/dpo/prepare_packed_dpo_dataset.py`` (``fill_packing_strategy``) writes with
``np.save`` and ``nemo_aligner/data/nlp/datasets.py`` (``DPOPackedDataset``) reads
(NVIDIA/NeMo-Aligner@af2b3bd96ad78190f6ebfb552b9e599e313ce027): one dict per packed row with

* ``input_ids``: the row's sequences back to back, each pair's chosen then rejected sequence;
* ``labels``: the same tokens with ``-100`` on prompt tokens (no loss there);
* ``reward``: ``[chosen_reward, rejected_reward]`` per pair, flattened;
* ``lengths``: ``[len(chosen), len(rejected)]`` per pair, flattened;
* ``seq_boundaries``: ``[0, end of chosen 0, end of rejected 0, end of chosen 1, ...]``;
* ``pair_ids`` (longpack's, ignored by NeMo-Aligner's collate): the input index of each pair in the row.

A pair is one bin item of length ``len(chosen) + len(rejected)`` (``longpack.binpack.pack_lengths``), so
chosen and rejected always share a row, adjacent. A pair longer than ``pack_size`` is dropped and
reported by index in :attr:`PreferencePacking.dropped`, never silently.
:func:`collate_packed_dpo` restates ``DPOPackedDataset.global_collate_fn`` (without
``pad_length_to_multiple_of``, which needs a process group) in numpy.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack import binpack
from longpack import choices as _choices
from longpack.errors import InputError
from longpack.outputs import atomic_write
from longpack.topology import align_up

LABELS_PAD_ID = -100  # NeMo-Aligner DPOPackedDataset.LABELS_PAD_ID (no loss on that label)
REWARDS_PAD_ID = -1000  # NeMo-Aligner DPOPackedDataset.REWARDS_PAD_ID
PAD_MULTIPLE = 16  # global_collate_fn pads each batch to a multiple of 16 (FP8), capped at seq_length
#: The DPO beta: NeMo-Aligner's default ``dpo.ref_policy_kl_penalty`` (``examples/nlp/gpt/conf/gpt_dpo.yaml``).
DPO_BETA = 0.2
#: The keys of a packed DPO row that NeMo-Aligner's collate reads (``pair_ids`` is longpack's own).
ROW_KEYS = ("input_ids", "labels", "reward", "lengths", "seq_boundaries")


@dataclass(frozen=True)
class PreferencePair:
    """One tokenized preference example: a shared prompt, the chosen and the rejected response."""

    prompt: Sequence[int]
    chosen: Sequence[int]
    rejected: Sequence[int]
    chosen_reward: float = 0.0
    rejected_reward: float = 0.0

    def sequences(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(chosen_ids, chosen_labels, rejected_ids, rejected_labels)``: prompt + response, prompt masked."""
        prompt = np.asarray(self.prompt, dtype=np.int64).reshape(-1)
        masked = np.full(prompt.size, LABELS_PAD_ID, dtype=np.int64)
        out = []
        for response in (self.chosen, self.rejected):
            resp = np.asarray(response, dtype=np.int64).reshape(-1)
            out += [np.concatenate([prompt, resp]), np.concatenate([masked, resp])]
        return out[0], out[1], out[2], out[3]


@dataclass(frozen=True)
class PreferencePacking:
    """Packed DPO rows (NeMo-Aligner's dicts) and the pairs that did not fit a row (input indices)."""

    rows: list[dict[str, Any]]
    pack_size: int
    dropped: tuple[int, ...]

    def as_array(self) -> np.ndarray:
        """The rows as the 1-D object array ``np.save`` writes for NeMo-Aligner."""
        arr = np.empty(len(self.rows), dtype=object)
        for i, row in enumerate(self.rows):
            arr[i] = row
        return arr


def pack_preference_pairs(
    pairs: Sequence[PreferencePair],
    pack_size: int,
    *,
    algorithm: str = _choices.DEFAULT_ALGORITHM,
    seed: int = 0,
) -> PreferencePacking:
    """Pack ``pairs`` into rows of at most ``pack_size`` tokens, each pair whole (chosen, then rejected).

    >>> p = [PreferencePair([1, 2], [3], [4, 5]), PreferencePair([6], [7], [8]), PreferencePair([9] * 12, [1], [2])]
    >>> out = pack_preference_pairs(p, 12, algorithm="first_fit_decreasing")
    >>> out.dropped, [r["pair_ids"] for r in out.rows], out.rows[0]["seq_boundaries"]
    ((2,), [[0, 1]], [0, 3, 7, 9, 11])
    >>> out.rows[0]["labels"][:4], out.rows[0]["lengths"]
    ([-100, -100, 3, -100], [3, 4, 2, 2])
    """
    if isinstance(pack_size, bool) or not isinstance(pack_size, int | np.integer) or pack_size < 2:
        raise InputError(
            f"pack_size must be an integer >= 2 (a chosen and a rejected token), got {pack_size!r}",
            fields="pack_size",
        )
    seqs = []
    for i, pair in enumerate(pairs):
        c, cl, r, rl = pair.sequences()
        if c.size == 0 or r.size == 0:
            raise InputError(
                f"pairs[{i}]: chosen and rejected sequences (prompt + response) must not be empty; "
                "drop the pair or give it tokens",
                fields="pairs",
            )
        seqs.append((c, cl, r, rl))
    totals = np.array([c.size + r.size for c, _, r, _ in seqs], dtype=np.int64)
    kept = np.flatnonzero(totals <= pack_size)
    dropped = tuple(int(i) for i in np.flatnonzero(totals > pack_size))
    rows: list[dict[str, Any]] = []
    if kept.size:
        bin_of = binpack.pack_lengths(totals[kept], int(pack_size), algorithm=algorithm, seed=seed)
        contents = binpack.BinContents.from_bin_of_item(bin_of)
        for b in range(len(contents.offsets) - 1):
            members = kept[contents.items[contents.offsets[b] : contents.offsets[b + 1]]]
            ids: list[int] = []
            labels: list[int] = []
            reward: list[float] = []
            lengths: list[int] = []
            bounds = [0]
            for k in members:
                c, cl, r, rl = seqs[k]
                ids += c.tolist() + r.tolist()
                labels += cl.tolist() + rl.tolist()
                reward += [float(pairs[k].chosen_reward), float(pairs[k].rejected_reward)]
                lengths += [int(c.size), int(r.size)]
                bounds += [bounds[-1] + int(c.size), bounds[-1] + int(c.size) + int(r.size)]
            rows.append(
                {
                    "input_ids": ids,
                    "labels": labels,
                    "reward": reward,
                    "lengths": lengths,
                    "seq_boundaries": bounds,
                    "pair_ids": [int(k) for k in members],
                }
            )
    return PreferencePacking(rows=rows, pack_size=int(pack_size), dropped=dropped)


def write_packed_dpo(packing: PreferencePacking, path: str | Path) -> Path:
    """Write the rows as NeMo-Aligner's ``packed_{pack_size}_seed{seed}.npy`` (object array), atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    arr = packing.as_array()
    atomic_write(target, lambda fh: np.save(fh, arr, allow_pickle=True))
    return target


def read_packed_dpo(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a packed DPO ``.npy`` (as NeMo-Aligner loads it: ``np.load(..., allow_pickle=True)``).

    A file that is not such an array of row dicts raises :class:`~longpack.errors.InputError` naming the
    file, the row and the key."""
    source = Path(path)
    if not source.is_file():
        raise InputError(f"{source}: no such file", fields="dpo")
    try:
        arr = np.load(source, allow_pickle=True)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{source}: not a readable .npy file ({exc})", fields="dpo") from exc
    if arr.ndim != 1 or arr.dtype != object:
        raise InputError(
            f"{source}: a {arr.dtype} array of shape {arr.shape}, not the 1-D object array of row dicts "
            "NeMo-Aligner's prepare_packed_dpo_dataset.py writes",
            fields="dpo",
        )
    rows = list(arr)
    for i, row in enumerate(rows):
        missing = [k for k in ROW_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise InputError(
                f"{source}: row {i} has no {', '.join(missing)} (a packed DPO row holds {', '.join(ROW_KEYS)})",
                fields="dpo",
            )
        for key in ROW_KEYS:
            values = np.asarray(row[key])
            if (
                values.ndim != 1
                or values.size == 0
                or values.dtype.kind not in ("iu" if key != "reward" else "iuf")
            ):
                raise InputError(
                    f"{source}: row {i} key {key!r} is not a non-empty list of "
                    f"{'numbers' if key == 'reward' else 'integers'} (got {values.dtype} of shape {values.shape})",
                    fields="dpo",
                )
    if not rows:
        raise InputError(f"{source}: no rows", fields="dpo")
    return rows


def collate_packed_dpo(
    rows: Sequence[dict[str, Any]], *, eos_id: int, seq_length: int
) -> dict[str, np.ndarray]:
    """NeMo-Aligner's ``DPOPackedDataset.global_collate_fn`` THD batch of ``rows``, in numpy.

    Per sequence the input drops its last token and the labels its first (next-token targets); rows pad
    to ``min(seq_length, ceil16(longest))`` with ``eos_id`` / ``-100`` / position 0; ``cu_seqlens`` (int32,
    per row, padded with ``-1`` to one more than the most boundaries) ends at that padded length;
    ``lengths`` pad with 0 and ``rewards`` (float32) with ``-1000`` to the most sequences in a row.

    >>> b = collate_packed_dpo([{"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, 3, -100, 5],
    ...     "reward": [1.0, 0.0], "lengths": [3, 2], "seq_boundaries": [0, 3, 5]}], eos_id=0, seq_length=64)
    >>> b["input_ids"][0, :4].tolist(), b["labels"][0, :4].tolist(), b["cu_seqlens"].tolist()
    ([1, 2, 4, 0], [2, 3, 5, -100], [[0, 2, 16, -1]])
    """
    ids, labels, positions, cus = [], [], [], []
    for row in rows:
        bounds = [int(x) for x in row["seq_boundaries"]]
        toks = np.asarray(row["input_ids"], dtype=np.int64)
        labs = np.asarray(row["labels"], dtype=np.int64)
        spans = list(itertools.pairwise(bounds))
        ids.append(np.concatenate([toks[a : b - 1] for a, b in spans]))
        labels.append(np.concatenate([labs[a + 1 : b] for a, b in spans]))
        positions.append(np.concatenate([np.arange(b - a - 1, dtype=np.int64) for a, b in spans]))
        cus.append(np.concatenate([[0], np.cumsum([b - a - 1 for a, b in spans])]).astype(np.int64))
    longest = max(len(x) for x in ids)
    if longest > seq_length:
        raise InputError(
            f"a row holds {longest} input tokens, more than seq_length={seq_length}; pack with "
            f"pack_size <= seq_length + sequences per row, or raise seq_length",
            fields="seq_length",
        )
    max_length = min(seq_length, align_up(longest, PAD_MULTIPLE))
    for cu in cus:
        cu[-1] = max_length

    def pad(items: Sequence[Any], width: int, value: float, dtype: Any) -> np.ndarray:
        out = np.full((len(items), width), value, dtype=dtype)
        for i, x in enumerate(items):
            x = np.asarray(x)
            out[i, : x.size] = x
        return out

    nseq = max(len(row["lengths"]) for row in rows)
    cu_seqlens = pad(cus, max(len(c) for c in cus) + 1, -1, np.int32)
    seqlens = cu_seqlens[:, 1:] - cu_seqlens[:, :-1]
    return {
        "input_ids": pad(ids, max_length, eos_id, np.int64),
        "labels": pad(labels, max_length, LABELS_PAD_ID, np.int64),
        "lengths": pad([row["lengths"] for row in rows], nseq, 0, np.int64),
        "rewards": pad([row["reward"] for row in rows], nseq, REWARDS_PAD_ID, np.float32),
        "position_ids": pad(positions, max_length, 0, np.int64),
        "attention_mask": np.ones(len(rows), dtype=np.int64),
        "cu_seqlens": cu_seqlens,
        "cu_seqlens_argmin": np.argmin(cu_seqlens, axis=1, keepdims=True),
        "max_seqlen": seqlens.max(axis=1, keepdims=True),
    }


def preference_summary(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """What ``longpack pack --json`` prints for a packed DPO folder."""
    pref = manifest["preference"]
    return {
        "out": str(out),
        "finished": True,
        "output_format": _choices.DPO,
        "format": "preference",
        "tokenizer": manifest["tokenizer"],
        "pack_size": manifest["settings"]["pack_size"],
        "algorithm": manifest["settings"]["algorithm"],
        "seed": manifest["settings"]["seed"],
        "counts": manifest["counts"],
        "file": str(out / pref["file"]),
        "fill_mean": pref["fill_mean"],
        "dropped": pref["dropped"],
        "malformed_listed": len(manifest["malformed"]),
        "warnings": manifest.get("warnings", []),
    }


def preference_summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """What ``longpack pack`` prints for a packed DPO (preference pairs) output, from
    :func:`preference_summary`."""
    c = summary["counts"]
    lines: list[str] = []
    lines.append(f"packed DPO pairs -> {summary['file']}")
    lines.append(
        f"  layout: NeMo-Aligner packed DPO   tokenizer: {summary['tokenizer'].get('name', summary['tokenizer'])}"
    )
    lines.append(
        f"  rows read {c['rows_read']}, malformed {c['malformed']}, pairs {c['pairs_read']}, packed {c['packed']}, "
        f"dropped {c['dropped']} (longer than pack_size {summary['pack_size']})"
    )
    lines.append(
        f"  {c['rows']} rows, fill {summary['fill_mean']:.1%} ({summary['algorithm']}, seed {summary['seed']})"
    )
    for w in summary["warnings"]:
        lines.append(f"  warning: {w}")
    lines.append(f"  check: longpack verify --dpo {summary['file']} --model MODEL")
    return lines
