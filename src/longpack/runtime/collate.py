"""Collate offline-packed rows into a THD batch exactly as Megatron-Bridge's ``GPTSFTPackedDataset`` does.

This is Megatron-Bridge's main-branch (v0.6.0+) collate contract, plus the legacy (≤ v0.5.1) key set on
request (docs/reference/thd-batch.md#collate). A row is a dict with ``input_ids`` and ``loss_mask``
(label-aligned, already shifted) and either ``seq_boundaries`` (what the dataset returns: starts plus the
row length) or ``seq_start_id`` (what the Parquet file stores); values may be lists or numpy arrays.

Example (docs/reference/thd-batch.md#collate-examples; EOS id 2, ``W = 8`` fixed)::

    >>> row = {"input_ids": [11, 12, 13, 14, 2, 21, 22, 2], "loss_mask": [0, 1, 1, 1, 0, 1, 1, 0],
    ...        "seq_start_id": [0, 5]}
    >>> batch = collate_packed([row], max_seq_length=8, eos_id=2, pad_to_max_length=True)
    >>> batch["tokens"].tolist(), batch["labels"].tolist()
    ([[11, 12, 13, 14, 21, 22, 2, 2]], [[12, 13, 14, 2, 22, 2, 2, 2]])
    >>> batch["cu_seqlens_q"].tolist(), batch["max_seqlen_q"].tolist(), batch["position_ids"].tolist()
    ([[0, 4, 6, 8]], [[4]], [[0, 1, 2, 3, 0, 1, 0, 0]])
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longpack.errors import BatchError
from longpack.topology import align_up

__all__ = [
    "CollateError",
    "PackMetadataSummary",
    "PackedCollator",
    "collate_packed",
    "load_pack_metadata",
    "row_boundaries",
]


class CollateError(BatchError):
    """A packed row or a collate setting that cannot produce a valid THD batch."""


@dataclass(frozen=True, kw_only=True)
class PackMetadataSummary:
    """The three metadata fields the collate uses, reduced over all entries.

    Which fields and why: docs/reference/thd-batch.md#pad-cu-seqlens.

    >>> PackMetadataSummary.from_entries([{"max_samples_per_bin": 5, "dataset_max_seqlen": 100,
    ...                                    "min_packed_seqlen": 50}])
    PackMetadataSummary(max_samples_per_bin=5, dataset_max_seqlen=100, min_packed_seqlen=50)
    """

    max_samples_per_bin: int
    dataset_max_seqlen: int
    min_packed_seqlen: int

    @classmethod
    def from_entries(
        cls, entries: Sequence[Mapping[str, Any]], source: str = "pack metadata"
    ) -> PackMetadataSummary:
        if isinstance(entries, Mapping):
            entries = [entries]
        if not entries:
            raise CollateError(f"{source}: the metadata list is empty; it needs at least one entry")
        for key in ("max_samples_per_bin", "dataset_max_seqlen", "min_packed_seqlen"):
            for position, entry in enumerate(entries):
                if key not in entry:
                    raise CollateError(
                        f"{source}: entry {position} has no {key!r}; pad_cu_seqlens needs max_samples_per_bin, "
                        "dataset_max_seqlen and min_packed_seqlen in every entry (write them with the packer)"
                    )
        return cls(
            max_samples_per_bin=max(int(e["max_samples_per_bin"]) for e in entries),
            dataset_max_seqlen=max(int(e["dataset_max_seqlen"]) for e in entries),
            min_packed_seqlen=min(int(e["min_packed_seqlen"]) for e in entries),
        )


def load_pack_metadata(path: str | Path) -> PackMetadataSummary:
    """Read a pack metadata file (``<N>_metadata.jsonl``: one JSON array of per-split dicts), or the one of
    a packed output folder, and reduce it (Megatron-Bridge ``GPTSFTPackedDataset``: max / max / min).

    Read through :class:`longpack.packed.PackedFolder`; an unreadable file is a
    :class:`~longpack.errors.PackedDataError` naming it.
    """
    from longpack.packed.folder import PackedFolder, read_metadata_file

    path = Path(path)
    if path.is_dir():
        folder = PackedFolder.open(path)
        if folder.metadata_path is None:
            raise CollateError(f"{path}: no <N>_metadata.jsonl in this folder; pad_cu_seqlens needs it")
        return PackMetadataSummary.from_entries(folder.metadata, source=str(folder.metadata_path))
    return PackMetadataSummary.from_entries(read_metadata_file(path), source=str(path))


def row_boundaries(row: Mapping[str, Any], row_index: int = 0) -> np.ndarray:
    """Segment boundaries ``b[0..k]`` of a packed row: ``seq_boundaries``, or ``seq_start_id + [len]``.

    >>> row_boundaries({"input_ids": [1, 2, 3, 4, 5], "seq_start_id": [0, 3]}).tolist()
    [0, 3, 5]
    """
    n = len(row["input_ids"])
    if "seq_boundaries" in row and row["seq_boundaries"] is not None:
        b = np.asarray(row["seq_boundaries"], dtype=np.int64)
    elif "seq_start_id" in row:
        b = np.append(np.asarray(row["seq_start_id"], dtype=np.int64), n)
    else:
        raise CollateError(
            f"row {row_index}: needs 'seq_boundaries' or 'seq_start_id' (got keys {sorted(row)})"
        )
    if b.ndim != 1 or b.size < 2 or b[0] != 0 or b[-1] != n:
        raise CollateError(
            f"row {row_index}: segment boundaries {b.tolist()} must start with 0 and end at len(input_ids)={n}"
        )
    stored = np.diff(b)
    if (stored < 1).any():
        bad = int(np.argmax(stored < 1))
        raise CollateError(
            f"row {row_index}: segment {bad} is empty (boundaries {b.tolist()}); every packed sample needs at "
            "least one stored token (seq_start_id must be strictly increasing)"
        )
    return b


@dataclass
class _ShiftedRow:
    tokens: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray
    positions: np.ndarray
    cu: list[int]
    cu_padded: list[int] | None
    padding_mask: np.ndarray


def _next_multiple(n: int, multiple: int, power_of_2: bool) -> int:
    if power_of_2:
        return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))
    return align_up(n, multiple)


def collate_packed(
    rows: Sequence[Mapping[str, Any]],
    *,
    max_seq_length: int,
    eos_id: int,
    pad_seq_to_mult: int = 1,
    pad_seq_length_to_mult: int = 16,
    pad_to_max_length: bool = False,
    ceil_to_power_2: bool = False,
    pad_cu_seqlens: bool = False,
    pack_metadata: PackMetadataSummary | Sequence[Mapping[str, Any]] | str | Path | None = None,
    answer_only_loss: bool = True,
    return_cu_seqlen: bool = True,
    legacy_keys: bool = False,
) -> dict[str, Any]:
    """Collate ``B`` offline-packed rows into one THD batch (Megatron-Bridge's main-branch contract).

    - Each segment ``[b[i], b[i+1])`` of stored length ``S_i`` gives ``S_i - 1`` inputs (last token dropped)
      and labels (first token dropped); position ids restart at 0 per segment.
    - Width ``W``: ``max_seq_length`` if ``pad_to_max_length``, else the longest row rounded up to
      ``pad_seq_length_to_mult`` (or a power of two), capped at ``max_seq_length``.
    - ``pad_seq_to_mult == 1``: ``cu_seqlens_q`` = segment offsets, with ``W`` appended as a pure-padding
      pseudo-segment when the row is short. ``> 1``: ``cu_seqlens_q_padded`` holds those physical offsets
      and ``cu_seqlens_q`` the logical ones (each segment up to its last non-EOS input token).
    - Boundary arrays of all rows are equalized (repeat the last value) into ``[B, K]`` int32.
    - ``tokens``/``labels`` are EOS-padded to ``W``; ``loss_mask``/``position_ids`` zero-padded (int64).
    - ``padding_mask`` (bool ``[B, W]``, True = pad) is always present; ``max_seqlen_q`` is the per-row max
      physical length ``[B, 1]``, or with ``pad_cu_seqlens`` the "NaN fix" value for every row ``[B]``.

    ``legacy_keys=True`` returns the ≤ v0.5.1 key set instead: ``cu_seqlens`` (physical, ``-1``
    padded), ``cu_seqlens_argmin``, ``max_seqlen``, optionally ``cu_seqlens_unpadded(_argmin)``; no
    ``padding_mask``; loss zeroed where the input token is EOS.

    Example (the second worked example of the docs: ``pad_seq_to_mult=4``, EOS 2)::

        >>> row = {"input_ids": [10, 11, 12, 2, 2, 20, 21, 2, 2, 2], "loss_mask": [1] * 10,
        ...        "seq_boundaries": [0, 5, 10]}
        >>> b = collate_packed([row], max_seq_length=8, eos_id=2, pad_seq_to_mult=4)
        >>> b["tokens"].tolist(), b["cu_seqlens_q"].tolist(), b["cu_seqlens_q_padded"].tolist()
        ([[10, 11, 12, 2, 20, 21, 2, 2]], [[0, 3, 5]], [[0, 4, 8]])
        >>> b["padding_mask"].int().tolist()
        [[0, 0, 0, 1, 0, 0, 1, 1]]
    """
    if not rows:
        raise CollateError("collate_packed needs at least one row")
    for name, value in (
        ("max_seq_length", max_seq_length),
        ("pad_seq_to_mult", pad_seq_to_mult),
        ("pad_seq_length_to_mult", pad_seq_length_to_mult),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CollateError(f"{name} must be a positive integer, got {value!r}")
    metadata: PackMetadataSummary | None = None
    if pad_cu_seqlens:
        if pack_metadata is None:
            raise CollateError(
                "a metadata json file is required when pad_cu_seqlens is enabled (pass pack_metadata=<path>)"
            )
        if not pad_to_max_length:
            raise CollateError("'pad_to_max_length=True' is required when pad_cu_seqlens is enabled")
    if pad_cu_seqlens and pack_metadata is not None:
        # Megatron-Bridge reads the metadata only for pad_cu_seqlens (docs/reference/thd-batch.md)
        if isinstance(pack_metadata, PackMetadataSummary):
            metadata = pack_metadata
        elif isinstance(pack_metadata, str | Path):
            metadata = load_pack_metadata(pack_metadata)
        else:
            metadata = PackMetadataSummary.from_entries(pack_metadata)

    shifted = [
        _shift_row(row, i, eos_id=eos_id, answer_only_loss=answer_only_loss) for i, row in enumerate(rows)
    ]
    longest = max(s.tokens.size for s in shifted)
    if pad_to_max_length:
        width = max_seq_length
    else:
        width = min(max_seq_length, _next_multiple(longest, pad_seq_length_to_mult, ceil_to_power_2))
    for i, s in enumerate(shifted):
        if s.tokens.size > width:
            raise CollateError(
                f"row {i}: {s.tokens.size} input tokens exceed the batch width {width} "
                f"(max_seq_length={max_seq_length}); the pack is longer than packed_sequence_size - repack "
                "with a smaller pack size or raise max_seq_length"
            )
    for i, s in enumerate(shifted):
        _set_boundaries(s, i, width=width, multiple=pad_seq_to_mult, eos_id=eos_id)
        if pad_cu_seqlens:
            assert metadata is not None
            _pad_cu_seqlens(s, width=width, max_samples_per_bin=metadata.max_samples_per_bin)

    batch_size = len(shifted)
    tokens = np.full((batch_size, width), eos_id, dtype=np.int64)
    labels = np.full((batch_size, width), eos_id, dtype=np.int64)
    loss_mask = np.zeros((batch_size, width), dtype=np.int64)
    positions = np.zeros((batch_size, width), dtype=np.int64)
    padding_mask = np.ones((batch_size, width), dtype=bool)
    for i, s in enumerate(shifted):
        n = s.tokens.size
        tokens[i, :n] = s.tokens
        labels[i, :n] = s.labels
        loss_mask[i, :n] = s.loss_mask
        positions[i, :n] = s.positions
        padding_mask[i] = s.padding_mask
    if legacy_keys:
        loss_mask[tokens == eos_id] = 0
    batch: dict[str, Any] = {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss_mask),
        "position_ids": torch.from_numpy(positions),
        "token_count": [int(s.tokens.size) for s in shifted],
    }
    if not return_cu_seqlen:
        causal = torch.triu(torch.ones(width, width, dtype=torch.bool), diagonal=1)
        batch["attention_mask"] = causal.expand(batch_size, 1, width, width).clone()
        if not legacy_keys:
            batch["padding_mask"] = torch.from_numpy(padding_mask)
        return batch

    safe_max_seqlen = None
    if pad_cu_seqlens:
        assert metadata is not None
        safe_max_seqlen = max(metadata.dataset_max_seqlen, width - metadata.min_packed_seqlen)
    if legacy_keys:
        return _legacy_keys(batch, shifted, safe_max_seqlen)

    has_padded = pad_seq_to_mult > 1
    arrays = [s.cu for s in shifted] + ([s.cu_padded for s in shifted if s.cu_padded is not None])
    k = max(len(a) for a in arrays)
    cu = torch.tensor([_extend_last(s.cu, k) for s in shifted], dtype=torch.int32)
    physical = cu
    batch["attention_mask"] = None
    batch["padding_mask"] = torch.from_numpy(padding_mask)
    batch["cu_seqlens_q"] = cu
    batch["cu_seqlens_kv"] = cu
    if has_padded:
        physical = torch.tensor([_extend_last(s.cu_padded or [], k) for s in shifted], dtype=torch.int32)
    if safe_max_seqlen is not None:
        max_seqlen = torch.full((batch_size,), safe_max_seqlen, dtype=torch.int32)
    else:
        max_seqlen = physical.diff(dim=1).max(dim=1, keepdim=True).values.to(torch.int32)
    batch["max_seqlen_q"] = max_seqlen
    batch["max_seqlen_kv"] = max_seqlen
    if has_padded:
        batch["cu_seqlens_q_padded"] = physical
        batch["cu_seqlens_kv_padded"] = physical
    return batch


def _extend_last(values: list[int], length: int) -> list[int]:
    return values + [values[-1]] * (length - len(values))


def _shift_row(row: Mapping[str, Any], index: int, *, eos_id: int, answer_only_loss: bool) -> _ShiftedRow:
    for key in ("input_ids", "loss_mask"):
        if key not in row:
            raise CollateError(f"row {index}: missing {key!r} (got keys {sorted(row)})")
    ids = np.asarray(row["input_ids"], dtype=np.int64)
    stored_mask = np.asarray(row["loss_mask"])
    if ids.ndim != 1 or stored_mask.shape != ids.shape:
        raise CollateError(
            f"row {index}: loss_mask length {stored_mask.size} != input_ids length {ids.size}; both must be "
            "1-D and label-aligned"
        )
    b = row_boundaries(row, index)
    n = ids.size
    keep_input = np.ones(n, dtype=bool)
    keep_input[b[1:] - 1] = False
    keep_label = np.ones(n, dtype=bool)
    keep_label[b[:-1]] = False
    tokens = ids[keep_input]
    labels = ids[keep_label]
    if answer_only_loss:
        loss = stored_mask[keep_input].astype(np.int64)
    else:
        loss = (tokens != eos_id).astype(np.int64)
    runtime_lengths = np.diff(b) - 1
    cu = np.concatenate([[0], np.cumsum(runtime_lengths)])
    positions = np.arange(tokens.size, dtype=np.int64)
    positions -= np.repeat(cu[:-1], runtime_lengths)  # in place: one fewer large allocation
    return _ShiftedRow(
        tokens=tokens,
        labels=labels,
        loss_mask=loss,
        positions=positions,
        cu=[int(x) for x in cu],
        cu_padded=None,
        padding_mask=np.zeros(0, dtype=bool),
    )


def _set_boundaries(s: _ShiftedRow, index: int, *, width: int, multiple: int, eos_id: int) -> None:
    n = s.tokens.size
    if multiple == 1:
        if s.cu[-1] != width:
            s.cu.append(width)
        s.padding_mask = np.zeros(width, dtype=bool)
        s.padding_mask[n:] = True
        return
    physical = s.cu
    lengths = np.diff(physical)
    off = lengths % multiple != 0
    if off.any():
        bad = int(np.argmax(off))
        raise CollateError(
            f"row {index}: segment {bad} has padded runtime length {int(lengths[bad])}, not a multiple of "
            f"pad_seq_to_mult={multiple}; the file was packed for another layout - repack with "
            f"pad_seq_to_mult={multiple} (runtime length = stored length - 1)"
        )
    # Logical length: up to the last input token that is not EOS (alignment pads are EOS).
    starts = np.asarray(physical[:-1], dtype=np.int64)
    ends = np.asarray(physical[1:], dtype=np.int64)
    real_positions = np.flatnonzero(s.tokens != eos_id)
    last = np.searchsorted(real_positions, ends, side="left") - 1
    last_pos = np.where(last >= 0, real_positions[np.clip(last, 0, None)] if real_positions.size else -1, -1)
    logical = np.where(last_pos >= starts, last_pos - starts + 1, 0)
    cu = [0, *np.cumsum(logical).tolist()]
    padded = list(physical)
    if padded[-1] != width:
        padded.append(width)
        cu.append(cu[-1])
    mask = np.ones(width, dtype=bool)
    for start, length in zip(starts.tolist(), logical.tolist(), strict=True):
        mask[start : start + length] = False
    s.cu = [int(x) for x in cu]
    s.cu_padded = [int(x) for x in padded]
    s.padding_mask = mask


def _pad_cu_seqlens(s: _ShiftedRow, *, width: int, max_samples_per_bin: int) -> None:
    if s.cu_padded is not None:
        pad_num = max_samples_per_bin - len(s.cu_padded) + 2
        s.cu_padded = s.cu_padded + [width] * max(pad_num, 0)
        s.cu = s.cu + [s.cu[-1]] * max(pad_num, 0)
    else:
        pad_num = max_samples_per_bin - len(s.cu) + 2
        s.cu = s.cu + [width] * max(pad_num, 0)


def _legacy_keys(
    batch: dict[str, Any], shifted: list[_ShiftedRow], safe_max_seqlen: int | None
) -> dict[str, Any]:
    physical = [s.cu_padded if s.cu_padded is not None else s.cu for s in shifted]
    unpadded = [s.cu for s in shifted] if shifted[0].cu_padded is not None else None
    longest = max(len(a) for a in physical + (unpadded or []))
    batch["attention_mask"] = None

    def minus_one_padded(arrays: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        cu = torch.tensor([a + [-1] * (longest + 1 - len(a)) for a in arrays], dtype=torch.int32)
        return cu, torch.argmin(cu, dim=1, keepdim=True)

    cu, argmin = minus_one_padded(physical)
    batch["cu_seqlens"] = cu
    batch["cu_seqlens_argmin"] = argmin
    if safe_max_seqlen is not None:
        batch["max_seqlen"] = torch.full((len(shifted),), safe_max_seqlen, dtype=torch.int32)
    else:
        batch["max_seqlen"] = torch.tensor(
            [[max(b - a for a, b in itertools.pairwise(p))] for p in physical], dtype=torch.int32
        )
    if unpadded is not None:
        cu_u, argmin_u = minus_one_padded(unpadded)
        batch["cu_seqlens_unpadded"] = cu_u
        batch["cu_seqlens_unpadded_argmin"] = argmin_u
    return batch


@dataclass(frozen=True, kw_only=True)
class PackedCollator:
    """A picklable ``collate_fn`` for ``torch.utils.data.DataLoader`` that calls :func:`collate_packed`.

    >>> collate = PackedCollator(max_seq_length=8, eos_id=2, pad_to_max_length=True)
    >>> collate([{"input_ids": [5, 6, 2], "loss_mask": [1, 1, 0], "seq_start_id": [0]}])["tokens"].tolist()
    [[5, 6, 2, 2, 2, 2, 2, 2]]
    """

    max_seq_length: int
    eos_id: int
    pad_seq_to_mult: int = 1
    pad_seq_length_to_mult: int = 16
    pad_to_max_length: bool = False
    ceil_to_power_2: bool = False
    pad_cu_seqlens: bool = False
    pack_metadata: PackMetadataSummary | None = None
    answer_only_loss: bool = True
    return_cu_seqlen: bool = True
    legacy_keys: bool = False

    @classmethod
    def for_data(
        cls,
        data: Any,
        *,
        split: str | None = None,
        allow_no_manifest: bool = False,
        max_seq_length: int | None = None,
        eos_id: int | None = None,
        pad_seq_to_mult: int | None = None,
        pad_to_max_length: bool = False,
        pad_cu_seqlens: bool = False,
        **options: Any,
    ) -> PackedCollator:
        """The collator for packed data, with the alignment the data records (``manifest.json``: pack size
        as ``max_seq_length``, ``pad_seq_to_mult``, the EOS id) instead of typed again; a given value that
        contradicts the record is a :class:`CollateError`. ``data``: a folder, file or glob, a
        :class:`~longpack.packed.PackedFolder` or a :class:`~longpack.runtime.dataset.PackedDataset`.
        ``pad_cu_seqlens`` reads the pack metadata of the data (and implies ``pad_to_max_length``, as Bridge
        requires). Other options go to :class:`PackedCollator`.

        >>> import tempfile, numpy as np
        >>> from longpack.packed import PackSettings, Provenance, plan_splits, write_packed_output
        >>> from longpack.samples import TokenizedSamples
        >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2]), loss_mask=np.ones(5, np.uint8),
        ...     offsets=np.array([0, 3, 5]), source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]),
        ...     files=("a",))
        >>> out = Path(tempfile.mkdtemp()) / "p"
        >>> settings = PackSettings(seq_length=4, pad_seq_to_mult=2)
        >>> _ = write_packed_output(out, plan_splits(s, settings, eos_id=2), settings, Provenance())
        >>> c = PackedCollator.for_data(out)
        >>> c.max_seq_length, c.pad_seq_to_mult, c.eos_id
        (4, 2, 2)
        >>> PackedCollator.for_data(out, pad_seq_to_mult=1)
        Traceback (most recent call last):
        ...
        longpack.runtime.collate.CollateError: pad_seq_to_mult 1 given, but the data was packed with pad_seq_to_mult=2 (manifest.json); drop it or pass 2
        """
        from longpack.errors import PackedDataError
        from longpack.packed.folder import PackedFolder

        if hasattr(data, "folder") and isinstance(data.folder, PackedFolder):
            folder = data.folder
        elif isinstance(data, PackedFolder):
            folder = data
        else:
            folder = PackedFolder.open(data, split=split, allow_no_manifest=allow_no_manifest)
        try:
            recorded = folder.alignment(
                pack_size=max_seq_length, pad_seq_to_mult=pad_seq_to_mult, eos_id=eos_id
            )
        except PackedDataError as exc:
            raise CollateError(str(exc), fields=exc.fields) from exc
        metadata = None
        if pad_cu_seqlens:
            if not folder.metadata:
                raise CollateError(
                    f"{folder.spec}: no <N>_metadata.jsonl next to the data; pad_cu_seqlens needs it"
                )
            metadata = PackMetadataSummary.from_entries(folder.metadata, source=str(folder.metadata_path))
        return cls(
            max_seq_length=recorded.pack_size,
            eos_id=recorded.eos_id,
            pad_seq_to_mult=recorded.pad_seq_to_mult,
            pad_to_max_length=pad_to_max_length or pad_cu_seqlens,
            pad_cu_seqlens=pad_cu_seqlens,
            pack_metadata=metadata,
            **options,
        )

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return collate_packed(
            rows,
            max_seq_length=self.max_seq_length,
            eos_id=self.eos_id,
            pad_seq_to_mult=self.pad_seq_to_mult,
            pad_seq_length_to_mult=self.pad_seq_length_to_mult,
            pad_to_max_length=self.pad_to_max_length,
            ceil_to_power_2=self.ceil_to_power_2,
            pad_cu_seqlens=self.pad_cu_seqlens,
            pack_metadata=self.pack_metadata,
            answer_only_loss=self.answer_only_loss,
            return_cu_seqlen=self.return_cu_seqlen,
            legacy_keys=self.legacy_keys,
        )
