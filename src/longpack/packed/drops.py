"""Drops are never quiet: how much of the input a pack loses to dropping and truncation, and a warning that
says what pack size would keep it.

A pack whose over-long policy drops (or truncates) a large share of the data is almost always a wrong
``seq_length``, not a wish. :func:`drop_report` measures the loss over every split of a planned pack, in
samples and in runtime tokens; past :data:`WARN_FRACTION` of either it carries a warning with the length
percentiles of the input and the smallest pack size that keeps 99 % of the samples. ``max_drop_fraction``
(``longpack pack --max-drop-fraction F``) turns the warning into :class:`DropLimitError` (exit code 1)
before anything is written.

>>> lens = np.array([3, 3, 9, 9])
>>> offsets = np.concatenate([[0], np.cumsum(lens)])
>>> s = TokenizedSamples(tokens=np.zeros(offsets[-1], np.int32), loss_mask=np.ones(offsets[-1], np.uint8),
...     offsets=offsets, source_file=np.zeros(4, np.int32), source_row=np.arange(1, 5), files=("a.jsonl",))
>>> from longpack.packed.pipeline import PackSettings, plan_splits
>>> r = drop_report(plan_splits(s, PackSettings(seq_length=4), eos_id=0))
>>> r.lost_samples, r.sample_fraction, r.lost_tokens, r.token_fraction, r.keep_99_pack_size
(2, 0.5, 16, 0.8, 8)
>>> print(r.warning())  # doctest: +NORMALIZE_WHITESPACE
2 of 4 samples (50.0 %) and 16 of 20 runtime tokens (80.0 %) were dropped or truncated (2 dropped,
0 truncated): sample lengths in runtime tokens p50 2, p90 8, p99 8, max 8; a larger pack size keeps them:
seq_length 8 keeps every sample; or keep every token with overlength fragment
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack.errors import InputError
from longpack.samples import TokenizedSamples
from longpack.topology import align_up

__all__ = ["WARN_FRACTION", "DropLimitError", "DropReport", "check_drop_limit", "drop_report"]

#: Share of samples or runtime tokens lost past which a pack warns.
WARN_FRACTION = 0.05
#: Share of samples the suggested pack size keeps.
KEEP_FRACTION = 0.99


class DropLimitError(InputError):
    """More than ``max_drop_fraction`` of the samples or tokens would be dropped or truncated. The command
    ran and found a problem in the data: the CLI exits with code 1 (not 2), nothing is written."""

    exit_code = 1


@dataclass(frozen=True, kw_only=True)
class DropReport:
    """Samples and runtime tokens in, how many of them a pack loses, and what pack size would keep them.

    ``lost_samples`` = dropped + truncated samples; ``lost_tokens`` = the runtime tokens of dropped samples
    plus the tokens truncation cut off. ``percentiles``: runtime length at p50 / p90 / p99 / max of every
    sample read. ``keep_99_pack_size``: the smallest runtime length (a multiple of ``pad_seq_to_mult``) that
    99 % of the samples fit in.
    """

    samples: int
    tokens: int
    dropped: int
    truncated: int
    lost_tokens: int
    percentiles: dict[str, int]
    keep_99_pack_size: int
    #: The pack's ``seq_length`` (0: not known), so the advice never names a smaller one as a fix.
    seq_length: int = 0
    #: The smallest (aligned) pack size that keeps every sample.
    keep_all_pack_size: int = 0

    @property
    def lost_samples(self) -> int:
        return self.dropped + self.truncated

    @property
    def sample_fraction(self) -> float:
        return round(self.lost_samples / self.samples, 6) if self.samples else 0.0

    @property
    def token_fraction(self) -> float:
        return round(self.lost_tokens / self.tokens, 6) if self.tokens else 0.0

    @property
    def fraction(self) -> float:
        """The larger of the two fractions (what ``max_drop_fraction`` is compared with)."""
        return max(self.sample_fraction, self.token_fraction)

    def warning(self, threshold: float = WARN_FRACTION) -> str | None:
        """The warning text when more than ``threshold`` of the samples or tokens are lost, else ``None``."""
        if self.fraction <= threshold:
            return None
        p = self.percentiles
        return (
            f"{self.lost_samples} of {self.samples} samples ({100 * self.sample_fraction:.1f} %) and "
            f"{self.lost_tokens} of {self.tokens} runtime tokens ({100 * self.token_fraction:.1f} %) were "
            f"dropped or truncated ({self.dropped} dropped, {self.truncated} truncated): sample lengths in "
            f"runtime tokens p50 {p['p50']}, p90 {p['p90']}, p99 {p['p99']}, max {p['max']}; {self._advice()}"
        )

    def _advice(self) -> str:
        """What pack size would keep the data: never one at or below the pack's own ``seq_length`` (a 16K
        pack that drops its longest samples is not fixed by the 1760 that holds 99 % of them)."""
        every = self.keep_all_pack_size or self.percentiles["max"]
        fragment = "or keep every token with overlength fragment"
        if self.keep_99_pack_size > self.seq_length:
            if self.keep_99_pack_size >= every:
                return f"a larger pack size keeps them: seq_length {every} keeps every sample; {fragment}"
            return (
                f"a larger pack size keeps them: seq_length {self.keep_99_pack_size} keeps 99 % of the samples, "
                f"seq_length {every} every sample; {fragment}"
            )
        return (
            f"99 % of the samples already fit in seq_length {self.seq_length}: the loss is in the longest "
            f"samples (up to {self.percentiles['max']} tokens); seq_length {every} keeps every sample; {fragment}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "runtime_tokens": self.tokens,
            "dropped": self.dropped,
            "truncated": self.truncated,
            "lost_tokens": self.lost_tokens,
            "sample_fraction": self.sample_fraction,
            "token_fraction": self.token_fraction,
            "length_percentiles": dict(self.percentiles),
            "keep_99_pack_size": self.keep_99_pack_size,
            "keep_all_pack_size": self.keep_all_pack_size,
        }


def _percentile(sorted_lengths: np.ndarray, q: float) -> int:
    """The smallest length that at least ``q`` of the samples do not exceed (nearest rank)."""
    if not len(sorted_lengths):
        return 0
    rank = max(1, int(np.ceil(q * len(sorted_lengths))))
    return int(sorted_lengths[rank - 1])


def drop_report(splits: Sequence[Any]) -> DropReport:
    """The :class:`DropReport` of planned splits (``longpack.packed.pipeline.SplitPlan``); samples shared by
    two splits (``val_fraction``) count once."""
    seen: dict[int, TokenizedSamples] = {}
    dropped = truncated = lost = 0
    mult = seq_length = 1
    for split in splits:
        a = split.aligned
        mult, seq_length = a.pad_seq_to_mult, a.max_seq_length
        seen.setdefault(id(a.samples), a.samples)
        runtime = a.samples.runtime_lengths()
        dropped += len(a.dropped)
        truncated += len(a.truncated)
        lost += int(runtime[a.dropped].sum()) + int((runtime[a.truncated] - a.cap).clip(min=0).sum())
    lengths = (
        np.sort(np.concatenate([s.runtime_lengths() for s in seen.values()]))
        if seen
        else np.zeros(0, np.int64)
    )
    keep = _percentile(lengths, KEEP_FRACTION)
    keep = align_up(max(keep, 1), mult)
    return DropReport(
        samples=len(lengths),
        tokens=int(lengths.sum()),
        dropped=dropped,
        truncated=truncated,
        lost_tokens=lost,
        percentiles={
            "p50": _percentile(lengths, 0.5),
            "p90": _percentile(lengths, 0.9),
            "p99": _percentile(lengths, 0.99),
            "max": int(lengths[-1]) if len(lengths) else 0,
        },
        keep_99_pack_size=keep,
        seq_length=int(seq_length),
        keep_all_pack_size=align_up(max(int(lengths[-1]) if len(lengths) else 1, 1), mult),
    )


def check_drop_limit(report: DropReport, max_drop_fraction: float | None) -> None:
    """Raise :class:`DropLimitError` when ``report`` loses more than ``max_drop_fraction`` (``None``: no
    limit) of the samples or runtime tokens.

    >>> r = DropReport(samples=10, tokens=100, dropped=1, truncated=0, lost_tokens=30,
    ...     percentiles={"p50": 8, "p90": 20, "p99": 30, "max": 30}, keep_99_pack_size=30, seq_length=24,
    ...     keep_all_pack_size=30)
    >>> check_drop_limit(r, 0.5)
    >>> check_drop_limit(r, 0.2)
    Traceback (most recent call last):
    ...
    longpack.packed.drops.DropLimitError: max_drop_fraction 0.2 exceeded, no packed rows written: 1 of 10 samples (10.0 %) and 30 of 100 runtime tokens (30.0 %) were dropped or truncated (1 dropped, 0 truncated): sample lengths in runtime tokens p50 8, p90 20, p99 30, max 30; a larger pack size keeps them: seq_length 30 keeps every sample; or keep every token with overlength fragment

    A 16K pack whose longest samples carry the loss is not told to shrink to the 99th percentile:

    >>> r = DropReport(samples=1000, tokens=2_000_000, dropped=3, truncated=0, lost_tokens=210_000,
    ...     percentiles={"p50": 900, "p90": 1500, "p99": 1760, "max": 90_000}, keep_99_pack_size=1760,
    ...     seq_length=16384, keep_all_pack_size=90_000)
    >>> r.warning().split("; ", 1)[1]
    '99 % of the samples already fit in seq_length 16384: the loss is in the longest samples (up to 90000 tokens); seq_length 90000 keeps every sample; or keep every token with overlength fragment'
    """
    if max_drop_fraction is None or report.fraction <= max_drop_fraction:
        return
    raise DropLimitError(
        f"max_drop_fraction {max_drop_fraction:g} exceeded, no packed rows written: {report.warning(0.0)}",
        fields=("max_drop_fraction", "seq_length", "overlength"),
    )
