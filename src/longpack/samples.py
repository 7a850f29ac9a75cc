"""Tokenized samples in flat buffers: the contract between ``longpack.text`` and ``longpack.packed``.

Pure numpy; no I/O, no torch. One Python object per sample would cost ~100 bytes of overhead each and
make 10M-sample runs impossible, so every sample lives as a slice of three flat arrays.

Example (two stored samples, ``[5, 6, 2]`` and ``[7, 2]``, EOS id 2)::

    >>> import numpy as np
    >>> s = TokenizedSamples(
    ...     tokens=np.array([5, 6, 2, 7, 2], dtype=np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1], dtype=np.uint8),
    ...     offsets=np.array([0, 3, 5], dtype=np.int64),
    ...     source_file=np.array([0, 0], dtype=np.int32),
    ...     source_row=np.array([1, 2], dtype=np.int64),
    ...     files=("data.jsonl",),
    ... )
    >>> len(s), s.stored_lengths().tolist(), s.runtime_lengths().tolist()
    (2, [3, 2], [2, 1])
    >>> s.sample(0)[0].tolist(), s.provenance(1)
    ([5, 6, 2], 'data.jsonl:2')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True)
class TokenizedSamples:
    """N stored samples, as Megatron-Bridge's tokenization step produces them.

    - ``tokens``: int32 (or int64 for vocabularies past 2**31), all samples' ``input_ids`` concatenated. A
      stored sample of ``S`` tokens trains on ``S - 1`` runtime positions (input = ids[:-1], labels = ids[1:]).
    - ``loss_mask``: uint8, same length as ``tokens``, **unshifted** (aligned with ``input_ids``: 1 where the
      token is a supervised target). The packer shifts it left by one when it fills packs.
    - ``offsets``: int64 ``[N + 1]``, sample ``i`` is ``tokens[offsets[i]:offsets[i+1]]``; ``offsets[0] == 0``.
    - ``source_file`` (int32 index into ``files``) and ``source_row`` (int64; 1-based line for JSONL, 0-based
      row for Parquet): where each sample came from, for reports.
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    source_file: np.ndarray
    source_row: np.ndarray
    files: tuple[str, ...]

    def __post_init__(self) -> None:
        n = len(self.offsets) - 1
        if n < 0 or (len(self.offsets) and int(self.offsets[0]) != 0):
            raise ValueError("offsets must have N+1 entries starting at 0")
        if int(self.offsets[-1]) != len(self.tokens):
            raise ValueError(f"offsets[-1]={int(self.offsets[-1])} != len(tokens)={len(self.tokens)}")
        if len(self.loss_mask) != len(self.tokens):
            raise ValueError(f"len(loss_mask)={len(self.loss_mask)} != len(tokens)={len(self.tokens)}")
        if len(self.source_file) != n or len(self.source_row) != n:
            raise ValueError("source_file and source_row need one entry per sample")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def stored_lengths(self) -> np.ndarray:
        """Stored length of every sample (int64)."""
        return np.diff(self.offsets)

    def runtime_lengths(self) -> np.ndarray:
        """Runtime (trained-on) length of every sample: stored length - 1, floored at 0 (int64)."""
        return np.maximum(self.stored_lengths() - 1, 0)

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, loss_mask)`` views of sample ``i``."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[lo:hi], self.loss_mask[lo:hi]

    def provenance(self, i: int) -> str:
        """``file:row`` of sample ``i``."""
        return f"{self.files[int(self.source_file[i])]}:{int(self.source_row[i])}"

    def take(self, indices: np.ndarray) -> TokenizedSamples:
        """The samples at ``indices`` (repeats allowed), in that order, as new flat buffers.

        >>> s = TokenizedSamples(tokens=np.array([5, 2, 6, 7, 2], np.int32), loss_mask=np.ones(5, np.uint8),
        ...     offsets=np.array([0, 2, 5]), source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]),
        ...     files=("a.jsonl",))
        >>> t = s.take(np.array([1, 0, 1]))
        >>> t.tokens.tolist(), t.offsets.tolist(), t.source_row.tolist()
        ([6, 7, 2, 5, 2, 6, 7, 2], [0, 3, 5, 8], [2, 1, 2])
        """
        indices = np.asarray(indices, dtype=np.int64)
        lengths = self.stored_lengths()[indices]
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[:-1][indices]
        # Position of every output token in the source buffers: its sample's start plus its rank within it.
        positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
        return TokenizedSamples(
            tokens=self.tokens[positions],
            loss_mask=self.loss_mask[positions],
            offsets=offsets,
            source_file=self.source_file[indices],
            source_row=self.source_row[indices],
            files=self.files,
        )

    @staticmethod
    def concatenate(parts: list[TokenizedSamples]) -> TokenizedSamples:
        """Join several batches of samples in order (file indices are remapped onto one ``files`` tuple)."""
        files: list[str] = []
        index: dict[str, int] = {}
        remapped = []
        for part in parts:
            mapping = np.array([index.setdefault(f, len(index)) for f in part.files] or [0], dtype=np.int32)
            for f in part.files:
                if f not in files:
                    files.append(f)
            remapped.append(mapping[part.source_file] if len(part.source_file) else part.source_file)
        lengths = np.concatenate([p.stored_lengths() for p in parts]) if parts else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        dtype = np.result_type(*[p.tokens.dtype for p in parts]) if parts else np.dtype(np.int32)
        return TokenizedSamples(
            tokens=np.concatenate([p.tokens for p in parts]).astype(dtype, copy=False)
            if parts
            else np.zeros(0, np.int32),
            loss_mask=np.concatenate([p.loss_mask for p in parts]) if parts else np.zeros(0, np.uint8),
            offsets=offsets,
            source_file=np.concatenate(remapped).astype(np.int32) if parts else np.zeros(0, np.int32),
            source_row=np.concatenate([p.source_row for p in parts]) if parts else np.zeros(0, np.int64),
            files=tuple(files),
        )
