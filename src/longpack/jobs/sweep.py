"""Choose the pack length: every candidate at equal token slots per optimizer step.

Megatron-Bridge's guidance for offline packed SFT (docs/guide/sweep.md#compare) is to compare pack
lengths at equal ``token_slots = packed_sequence_size * global_batch_size`` (2K/GBS32, 4K/GBS16 and 8K/GBS8
all give 65,536) and keep the largest configuration that fits. This module answers that before any GPU is
used, from samples tokenized once:

- per candidate pack length ``L`` (``seq_length = packed_sequence_size = L``): the alignment and over-long
  policy of ``longpack.packed.align``, the rows of ``longpack.packed.plan`` (the very rows ``longpack pack``
  would write), kept / truncated / dropped counts with the tokens lost, fill, ``GBS = token_slots / L``,
  optimizer steps per epoch, attention work ``Σ Lᵢ²`` next to linear work ``Σ Lᵢ`` per step, and the batch
  rules ``LP-BATCH-001`` / ``LP-BATCH-002`` of ``longpack.rules`` (GBS divisible by DP and ≥ DP, MBS 1);
- with a model, a GPU type and a GPU count: the planner's layout, memory per GPU and step time (attention
  at the packed context ``Σ Lᵢ² / Σ Lᵢ``), the throughput in *real* (non-padding) tokens per second, and a
  recommendation: the highest real tokens/s among the candidates that fit.

:func:`sweep` is pure (no I/O); :class:`SweepConfig` is the job: it tokenizes the inputs once and sweeps
(``longpack sweep`` parses its flags into one and prints the result).

>>> import numpy as np
>>> from longpack.samples import TokenizedSamples
>>> lens = np.array([3000, 1500, 700, 700, 5000])  # stored lengths
>>> offsets = np.concatenate([[0], np.cumsum(lens)])
>>> s = TokenizedSamples(tokens=np.ones(offsets[-1], np.int32), loss_mask=np.ones(offsets[-1], np.uint8),
...     offsets=offsets, source_file=np.zeros(5, np.int32), source_row=np.arange(1, 6), files=("a.jsonl",))
>>> r = sweep(s, SweepSettings(pack_lengths=(2048, 4096, 8192), token_slots=8192, overlength="truncate"),
...           eos_id=2)
>>> [(c.pack_length, c.gbs, c.kept, c.truncated, c.packs) for c in r.candidates]
[(2048, 4, 3, 2, 4), (4096, 2, 4, 1, 3), (8192, 1, 5, 0, 2)]
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from longpack import choices
from longpack.balance.cp_modes import CP_MODE_NAMES
from longpack.choices import DEFAULT_ALGORITHM, OVERLENGTH_POLICIES
from longpack.errors import ConfigError, InputError
from longpack.jobs.options import (
    algorithm_option,
    bridge_version_option,
    cp_option,
    demo_option,
    gpu_option,
    gpus_option,
    inputs_option,
    megatron_core_version_option,
    model_option,
    pad_seq_to_mult_option,
    seed_option,
    sp_option,
    tokenizer_option,
    tp_option,
    workers_option,
)
from longpack.option import check_choices, option, refuse_unknown_settings
from longpack.planner.catalog import GPUSpec, ModelSpec
from longpack.planner.options import PlanError, PlanLayout
from longpack.rules import TrainingSetup, run_rules
from longpack.rules.versions import UpstreamVersions
from longpack.samples import TokenizedSamples
from longpack.text.rows import TextConfig
from longpack.topology import ParallelLayout, TopologyError
from longpack.validate import finite_float, flag, one_of, optional_positive_int, positive_int
from longpack.validate import seed as seed_value

DEFAULT_PACK_LENGTHS = (2048, 4096, 8192, 16384)
DEFAULT_TOKEN_SLOTS = 65536
BATCH_RULES = frozenset({"LP-BATCH-001", "LP-BATCH-002"})
PACK_LENGTH_WARNING = (
    "changing the pack length changes which samples are truncated or dropped and which samples share a "
    "pack (and so the loss per step): rerun the loss and stability checks after switching "
    "(Megatron-Bridge packed-sequence guidance)"
)


class SweepError(ConfigError):
    """A sweep setting that cannot work (the message names the field, the value and the fix)."""


def parse_pack_lengths(text: str) -> tuple[int, ...]:
    """``"2048,4096,8k"`` -> ``(2048, 4096, 8192)`` (ascending; ``k`` = 1024).

    >>> parse_pack_lengths("8192, 2k,4096")
    (2048, 4096, 8192)
    >>> parse_pack_lengths("2048,x")
    Traceback (most recent call last):
    ...
    longpack.jobs.sweep.SweepError: pack_lengths: 'x' is not a positive integer (e.g. pack_lengths 2048,4096,8192)
    """
    values: list[int] = []
    for raw in text.split(","):
        part = raw.strip().lower()
        if not part:
            continue
        scale = 1024 if part.endswith("k") else 1
        digits = part[:-1] if scale > 1 else part
        if not digits.isdigit() or int(digits) < 1:
            raise SweepError(
                f"pack_lengths: {raw.strip()!r} is not a positive integer (e.g. pack_lengths 2048,4096,8192)",
                fields="pack_lengths",
            )
        values.append(int(digits) * scale)
    if not values:
        raise SweepError(
            "pack_lengths is empty; give a comma-separated list such as 2048,4096,8192,16384",
            fields="pack_lengths",
        )
    dupes = sorted({v for v in values if values.count(v) > 1})
    if dupes:
        raise SweepError(
            f"pack_lengths lists {', '.join(map(str, dupes))} more than once; give each once",
            fields="pack_lengths",
        )
    return tuple(sorted(values))


@dataclass(frozen=True, kw_only=True)
class SweepSettings:
    """The candidates and the packing settings shared by all of them (as in ``longpack pack``).

    >>> SweepSettings(pack_lengths=(2048, 4096), token_slots=65536).gbs(4096)
    16
    >>> SweepSettings(pack_lengths=(3000,), token_slots=65536)
    Traceback (most recent call last):
    ...
    longpack.jobs.sweep.SweepError: token_slots 65536 is not divisible by pack length 3000 (GBS = token slots / pack length must be a whole number); use pack lengths that divide 65536 or token_slots 3000*GBS, e.g. 66000
    """

    pack_lengths: tuple[int, ...]
    token_slots: int = DEFAULT_TOKEN_SLOTS
    pad_seq_to_mult: int = 1
    algorithm: str = DEFAULT_ALGORITHM
    seed: int = 0
    overlength: str = choices.OVERLENGTH_DROP

    def __post_init__(self) -> None:
        if not self.pack_lengths:
            raise SweepError(
                "give at least one pack length (pack_lengths 2048,4096,8192,16384)", fields="pack_lengths"
            )
        if self.token_slots < 1:
            raise SweepError(
                f"token_slots must be a positive integer, got {self.token_slots}", fields="token_slots"
            )
        if self.pad_seq_to_mult < 1:
            raise SweepError(
                f"pad_seq_to_mult must be a positive integer, got {self.pad_seq_to_mult}",
                fields="pad_seq_to_mult",
            )
        one_of(self.overlength, OVERLENGTH_POLICIES, "overlength", error=SweepError)
        for length in self.pack_lengths:
            if length < 2:
                raise SweepError(
                    f"pack length {length} is too short; use at least 2 tokens", fields="pack_lengths"
                )
            if self.token_slots % length:
                gbs_up = -(-self.token_slots // length)
                raise SweepError(
                    f"token_slots {self.token_slots} is not divisible by pack length {length} (GBS = token "
                    f"slots / pack length must be a whole number); use pack lengths that divide "
                    f"{self.token_slots} or token_slots {length}*GBS, e.g. {length * gbs_up}",
                    fields=("token_slots", "pack_lengths"),
                )
            if self.pad_seq_to_mult > length:
                raise SweepError(
                    f"pack length {length} is shorter than pad_seq_to_mult {self.pad_seq_to_mult}; drop it "
                    "from pack_lengths or lower TP/CP",
                    fields=("pack_lengths", "pad_seq_to_mult"),
                )

    def gbs(self, pack_length: int) -> int:
        """Global batch size (packs per optimizer step) at this pack length."""
        return self.token_slots // pack_length


@dataclass(frozen=True, kw_only=True)
class PlannerSetup:
    """What the planner needs: model, GPU type and count; ``pins`` fixes :class:`SearchRequest` fields
    (``tp``, ``cp``, ``pp``, ``vpp``, ``ep``, ``etp``). TP and CP default to 1 (pinned): the packed data is
    aligned for one topology, so the search does not wander to another. MBS is always 1 (offline packing,
    ``LP-PACK-005``). ``recompute`` pins the recompute modules (``()`` = none; ``None`` = the cheapest
    that fits) and ``allow_offload`` allows optimizer CPU offload, as in ``longpack plan``."""

    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int
    pins: Mapping[str, int] = field(default_factory=dict)
    precision: str = "bf16"
    headroom: float = 0.95
    recompute: tuple[str, ...] | None = None
    allow_offload: bool = True

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise SweepError(f"gpus must be a positive integer, got {self.num_gpus}", fields="gpus")
        bad = sorted(set(self.pins) - {"tp", "cp", "pp", "vpp", "ep", "etp"})
        if bad:
            raise SweepError(f"cannot pin {', '.join(bad)}; pin only tp, cp, pp, vpp, ep, etp")


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """The planner's view of one candidate. ``fits`` is False when no layout fits (``reason`` says why)."""

    fits: bool
    reason: str
    layout: str | None = None
    dp: int | None = None
    memory_gib: float | None = None
    memory_budget_gib: float = 0.0
    recompute: tuple[str, ...] = ()
    optimizer_offload: float = 0.0
    step_time_s: float | None = None
    #: relative 80 % error band of the step time (``longpack.planner.uncertainty``)
    error_band: float | None = None
    real_tokens_per_s: float | None = None
    real_tokens_per_s_per_gpu: float | None = None
    notes: tuple[str, ...] = ()
    plan: PlanLayout | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "reason": self.reason,
            "layout": self.layout,
            "dp": self.dp,
            "memory_gib": _round(self.memory_gib, 3),
            "memory_budget_gib": round(self.memory_budget_gib, 3),
            "recompute": list(self.recompute),
            "optimizer_offload": self.optimizer_offload,
            "step_time_s": _round(self.step_time_s, 6),
            "step_time_error_band": _round(self.error_band, 4),
            "real_tokens_per_s": _round(self.real_tokens_per_s, 1),
            "real_tokens_per_s_per_gpu": _round(self.real_tokens_per_s_per_gpu, 1),
            "notes": list(self.notes),
        }


@dataclass(frozen=True, kw_only=True)
class ModeCell:
    """One CP mode at one pack length: the step time (``None`` where the mode cannot run, ``note`` says
    why), its speed-up over static CP, the rank imbalance (busiest rank over the mean rank, 1.0 = no rank
    waits) and the real (non-padding) tokens per second, at the cap ``max_seqlen_per_dp_cp_rank`` where
    the mode is fastest (``None`` for static CP)."""

    mode: str
    max_seqlen_per_dp_cp_rank: int | None
    step_time_s: float | None
    speedup: float | None
    rank_imbalance: float | None
    real_tokens_per_s: float | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "max_seqlen_per_dp_cp_rank": self.max_seqlen_per_dp_cp_rank,
            "step_time_s": _round(self.step_time_s, 6),
            "speedup_over_static": _round(self.speedup, 4),
            "rank_imbalance": _round(self.rank_imbalance, 4),
            "real_tokens_per_s": _round(self.real_tokens_per_s, 1),
            "note": self.note,
        }


@dataclass(frozen=True, kw_only=True)
class CandidateCPModes:
    """Static CP, hybrid CP and the DP-balanced scheduler at one pack length, for the candidate's layout
    (``longpack.planner.cp_modes.plan_cp_modes`` on its packs), and the mode recommended: another mode
    than static CP only when its gain is outside the step time's error band (a tie stays static)."""

    cells: tuple[ModeCell, ...]
    recommended: str
    max_seqlen_per_dp_cp_rank: int | None
    gain: float
    error_band: float | None
    reason: str
    steps_simulated: int = 0
    steps_total: int = 0

    def cell(self, mode: str) -> ModeCell:
        return next(c for c in self.cells if c.mode == mode)

    @property
    def real_tokens_per_s(self) -> float | None:
        """Real tokens/s of the recommended mode."""
        return self.cell(self.recommended).real_tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        from longpack.planner.cp_modes import CONSTRAINTS, mode_overrides

        return {
            "modes": [c.to_dict() for c in self.cells],
            "recommended": {
                "mode": self.recommended,
                "max_seqlen_per_dp_cp_rank": self.max_seqlen_per_dp_cp_rank,
                "gain_over_static": round(self.gain, 4),
                "error_band": _round(self.error_band, 4),
                "reason": self.reason,
                "overrides": mode_overrides(self.recommended, self.max_seqlen_per_dp_cp_rank),
                "constraints": list(CONSTRAINTS[self.recommended]),
            },
            "steps_simulated": self.steps_simulated,
            "steps_total": self.steps_total,
        }


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One pack length, packed. Token counts are runtime tokens (stored - 1 per sample).

    ``kept + truncated + dropped == read``. ``fill`` is Megatron-Bridge's ``packing_efficiency`` / 100 (pack
    tokens including alignment padding); ``real_fill`` counts only the samples' own tokens. Work per step
    is the mean over all packs times GBS. ``batch_rules`` holds the findings of ``LP-BATCH-001/002`` (empty
    = they pass), ``None`` when DP is unknown (no GPU count given).
    """

    pack_length: int
    gbs: int
    pad_seq_to_mult: int
    cap: int
    read: int
    kept: int
    truncated: int
    truncated_tokens_lost: int
    dropped: int
    dropped_tokens: int
    packs: int
    fill: float
    real_fill: float
    real_tokens: int
    steps_per_epoch: int
    leftover_packs: int
    attention_work_per_step: float
    linear_work_per_step: float
    dp: int | None = None
    batch_rules: tuple[dict[str, Any], ...] | None = None
    estimate: Estimate | None = None
    #: With ``cp_modes``: static CP, hybrid CP and the DP-balanced scheduler on this candidate's packs.
    cp_modes: CandidateCPModes | None = None
    sub_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False, compare=False)
    #: the packs in reading order: sample indices into ``sub_lengths``, pack ``j`` is
    #: ``pack_order[pack_offsets[j]:pack_offsets[j + 1]]``
    pack_order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False, compare=False)
    pack_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64), repr=False, compare=False)

    def pack_rows(self) -> list[list[int]]:
        """The runtime lengths of every pack, in the order training reads them."""
        in_order = np.asarray(self.sub_lengths, dtype=np.int64)[self.pack_order].tolist()
        return [in_order[s:e] for s, e in itertools.pairwise(self.pack_offsets.tolist())]

    @property
    def problems(self) -> tuple[str, ...]:
        """Why this candidate cannot run (empty when it can, as far as is known)."""
        out: list[str] = []
        if self.packs == 0:
            out.append("no sample is left to pack")
        elif self.steps_per_epoch == 0:
            packs = "1 pack" if self.packs == 1 else f"{self.packs} packs"
            out.append(f"only {packs}, fewer than GBS {self.gbs}: not one full optimizer step")
        for f in self.batch_rules or ():
            out.append(f"{f['id']}: {f['message']}")
        if self.estimate is not None and not self.estimate.fits and self.packs:  # no packs: said above
            out.append(self.estimate.reason)
        return tuple(out)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "pack_length": self.pack_length,
            "gbs": self.gbs,
            "pad_seq_to_mult": self.pad_seq_to_mult,
            "runtime_cap": self.cap,
            "samples": {
                "read": self.read,
                "kept": self.kept,
                "truncated": self.truncated,
                "dropped": self.dropped,
            },
            "truncated_tokens_lost": self.truncated_tokens_lost,
            "dropped_tokens": self.dropped_tokens,
            "packs": self.packs,
            "fill": round(self.fill, 6),
            "real_fill": round(self.real_fill, 6),
            "real_tokens": self.real_tokens,
            "steps_per_epoch": self.steps_per_epoch,
            "leftover_packs": self.leftover_packs,
            "attention_work_per_step": round(self.attention_work_per_step, 1),
            "linear_work_per_step": round(self.linear_work_per_step, 1),
            "dp": self.dp,
            "batch_rules": None if self.batch_rules is None else list(self.batch_rules),
            "estimate": None if self.estimate is None else self.estimate.to_dict(),
            **({} if self.cp_modes is None else {"cp_modes": self.cp_modes.to_dict()}),
            "ok": self.ok,
            "problems": list(self.problems),
        }


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The pack length (and GBS) recommended; with ``cp_modes``, the CP mode at it and its cap."""

    pack_length: int
    gbs: int
    reason: str
    cp_mode: str | None = None
    max_seqlen_per_dp_cp_rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"pack_length": self.pack_length, "gbs": self.gbs, "reason": self.reason}
        if self.cp_mode is not None:
            doc["cp_mode"] = self.cp_mode
            doc["max_seqlen_per_dp_cp_rank"] = self.max_seqlen_per_dp_cp_rank
        return doc

    def bridge_overrides(self) -> list[str]:
        """Megatron-Bridge overrides for this pack length (MBS 1) and, with ``cp_mode``, the mode's keys."""
        from longpack.planner.cp_modes import mode_overrides

        lines = [
            f"dataset.offline_packing_specs.packed_sequence_size={self.pack_length}",
            f"model.seq_length={self.pack_length}",
            f"dataset.seq_length={self.pack_length}",
            f"train.global_batch_size={self.gbs}",
            "train.micro_batch_size=1",
        ]
        if self.cp_mode is not None:
            lines += mode_overrides(self.cp_mode, self.max_seqlen_per_dp_cp_rank)["bridge"]
        return lines

    def mode_advice(self) -> list[str]:
        """What a recommended hybrid-CP / DP-balanced mode asks of the run: ``LP-HCP-009`` (Megatron-Bridge
        does not schedule it; Megatron-LM's flags) and the mode's constraints. Empty for static CP."""
        from longpack.planner.cp_modes import CONSTRAINTS, bridge_note

        note = None if self.cp_mode is None else bridge_note(self.cp_mode, self.max_seqlen_per_dp_cp_rank)
        if note is None or self.cp_mode is None:
            return []
        lines = [note]
        return lines + [f"needs: {item}" for item in CONSTRAINTS[self.cp_mode]]


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """Every candidate, packed (and estimated), and the recommendation. The sweep job fills in where the
    samples came from (``input``), where ``pad_seq_to_mult`` came from, and the planner's model / GPU."""

    settings: SweepSettings
    read: int
    candidates: tuple[Candidate, ...]
    recommendation: Recommendation | None
    warning: str = PACK_LENGTH_WARNING
    #: ``demo``, ``format``, ``tokenizer``, ``rows_read``, ``malformed`` (set by :class:`SweepConfig`).
    input: dict[str, Any] | None = None
    pad_seq_to_mult_source: str | None = None
    gpus: int | None = None
    model: str | None = None
    gpu: str | None = None
    #: The PNG written (``SweepConfig.plot``), or ``None``.
    plot: str | None = None

    @property
    def title(self) -> str:
        """``pack-length sweep at 65,536 token slots per step, llama3_1_8b on 8xH100_SXM`` (table, figure)."""
        where = f", {self.model} on {self.gpus}x{self.gpu}" if self.model else ""
        return f"pack-length sweep at {self.settings.token_slots:,} token slots per step{where}"

    @property
    def notes(self) -> tuple[str, ...]:
        """What the figures rest on that a user did not choose: the default ``token_slots`` giving batches
        smaller than the GPUs (GBS = token slots / pack length; DP is at most GBS, so the planner trades DP
        for PP), with the token slots that give the GBS one trains with. Empty otherwise.

        >>> s = SweepSettings(pack_lengths=(2048, 16384))
        >>> SweepResult(settings=s, read=0, candidates=(), recommendation=None, gpus=64).notes  # no candidate
        ()
        """
        s = self.settings
        if self.gpus is None or s.token_slots != DEFAULT_TOKEN_SLOTS or not self.candidates:
            return ()
        gbs = sorted({c.gbs for c in self.candidates})
        if gbs[0] >= self.gpus:
            return ()

        def shown(scale: int) -> str:
            lo, hi = gbs[0] * scale, gbs[-1] * scale
            return f"GBS {lo}" if lo == hi else f"GBS {lo} to {hi}"

        scale = 1 << max(
            0, math.ceil(math.log2(self.gpus / gbs[0]))
        )  # a power of 2: every length still divides
        return (
            f"token_slots is the default {DEFAULT_TOKEN_SLOTS:,}: GBS = token slots / pack length gives "
            f"{shown(1)} on {self.gpus} GPUs, fewer packs per step than GPUs (DP is at most GBS, so layouts trade "
            f"DP for PP); pass the token slots of the batch you train with (pack length x GBS), e.g. token_slots "
            f"{DEFAULT_TOKEN_SLOTS * scale} for {shown(scale)}",
        )

    @property
    def exit_code(self) -> int:
        """1 when the planner ran and no candidate can be recommended (none fits in memory, or those that
        fit cannot run: the command found a problem), else 0."""
        return 1 if self.model is not None and self.recommendation is None else 0

    def to_dict(self) -> dict[str, Any]:
        """What ``longpack sweep --json`` prints."""
        s = self.settings
        doc: dict[str, Any] = {
            "input": self.input,
            "pad_seq_to_mult_source": self.pad_seq_to_mult_source,
            "gpus": self.gpus,
            "model": self.model,
            "gpu": self.gpu,
            "settings": {
                "pack_lengths": list(s.pack_lengths),
                "token_slots": s.token_slots,
                "pad_seq_to_mult": s.pad_seq_to_mult,
                "algorithm": s.algorithm,
                "seed": s.seed,
                "overlength": s.overlength,
            },
            "samples_read": self.read,
            "candidates": [c.to_dict() for c in self.candidates],
            "recommendation": None if self.recommendation is None else self.recommendation.to_dict(),
            "warning": self.warning,
            "notes": list(self.notes),
        }
        if self.plot is not None:
            doc["plot"] = self.plot
        return doc


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(float(x), digits)


def batch_rule_findings(
    layout: ParallelLayout, *, pack_length: int, gbs: int, versions: UpstreamVersions | None = None
) -> tuple[dict[str, Any], ...]:
    """Findings of the batch rules (``LP-BATCH-001`` GBS % (MBS*DP) == 0, ``LP-BATCH-002`` GBS ≥ MBS*DP) for
    this layout with MBS 1, as ``longpack check --json`` prints them.

    >>> [f["id"] for f in batch_rule_findings(ParallelLayout(world_size=16), pack_length=16384, gbs=4)]
    ['LP-BATCH-002']
    >>> batch_rule_findings(ParallelLayout(world_size=16, tp=2, cp=2), pack_length=16384, gbs=4)
    ()
    """
    setup = TrainingSetup.from_layout(
        layout, seq_length=pack_length, micro_batch_size=1, global_batch_size=gbs, versions=versions
    )
    return tuple(f.to_dict() for f in run_rules(setup, select=set(BATCH_RULES)))


def _check_alignment(settings: SweepSettings, layout: ParallelLayout) -> None:
    if settings.pad_seq_to_mult % layout.pad_seq_to_mult:
        raise SweepError(
            f"pad_seq_to_mult {settings.pad_seq_to_mult} is not a multiple of {layout.pad_seq_to_mult}, what "
            f"TP={layout.tp} CP={layout.cp} SP={layout.sp} need; use pad_seq_to_mult "
            f"{layout.pad_seq_to_mult} or derive it from tp/cp/sp",
            fields="pad_seq_to_mult",
        )


def pack_candidate(
    samples: TokenizedSamples, settings: SweepSettings, pack_length: int, *, eos_id: int
) -> Candidate:
    """Align and pack ``samples`` at one pack length, as the pack job with ``seq_length=L`` would.

    >>> lens = np.array([9, 5, 5, 3])
    >>> offsets = np.concatenate([[0], np.cumsum(lens)])
    >>> s = TokenizedSamples(tokens=np.ones(offsets[-1], np.int32), loss_mask=np.ones(offsets[-1], np.uint8),
    ...     offsets=offsets, source_file=np.zeros(4, np.int32), source_row=np.arange(1, 5), files=("a",))
    >>> c = pack_candidate(s, SweepSettings(pack_lengths=(4, 8), token_slots=8), 4, eos_id=2)
    >>> c.kept, c.dropped, c.dropped_tokens, c.packs, c.gbs, c.attention_work_per_step
    (3, 1, 8, 3, 2, 24.0)
    """
    from longpack.packed.align import OverlengthError, runtime_cap
    from longpack.packed.pipeline import PackSettings, plan_split

    gbs = settings.gbs(pack_length)
    pack = PackSettings(
        seq_length=pack_length,
        pad_seq_to_mult=settings.pad_seq_to_mult,
        algorithm=settings.algorithm,
        seed=settings.seed,
        overlength=settings.overlength,
    )
    try:
        aligned = pack.align(samples, eos_id=eos_id)
    except OverlengthError as exc:
        raise OverlengthError(f"pack length {pack_length}: {exc}", fields=exc.fields) from exc
    runtime_in = samples.runtime_lengths()
    read = len(samples)
    truncated = len(aligned.truncated)
    lost = int((runtime_in[aligned.truncated] - aligned.cap).sum()) if truncated else 0
    dropped_tokens = int(runtime_in[aligned.dropped].sum()) if len(aligned.dropped) else 0
    lengths = aligned.runtime_lengths()
    real_tokens = int(np.maximum(aligned.kept - 1, 0).sum())
    order, offsets = np.zeros(0, np.int64), np.zeros(1, np.int64)
    if len(aligned) == 0:
        packs, fill = 0, 0.0
    else:
        split = plan_split("training", samples, pack, eos_id=eos_id, aligned=aligned)
        packs = split.plan.num_rows
        order = np.asarray(split.plan.order, dtype=np.int64)
        offsets = np.asarray(split.plan.row_offsets, dtype=np.int64)
        # Megatron-Bridge's packing_efficiency, unrounded (its metadata keeps two decimals of a percent)
        fill = float(lengths.sum()) / (packs * pack_length)
    slots = packs * pack_length
    squares = float(np.square(lengths, dtype=np.float64).sum())
    return Candidate(
        pack_length=pack_length,
        gbs=gbs,
        pad_seq_to_mult=settings.pad_seq_to_mult,
        cap=runtime_cap(pack_length, settings.pad_seq_to_mult),
        read=read,
        kept=len(aligned) - truncated,
        truncated=truncated,
        truncated_tokens_lost=lost,
        dropped=len(aligned.dropped),
        dropped_tokens=dropped_tokens,
        packs=packs,
        fill=fill,
        real_fill=real_tokens / slots if slots else 0.0,
        real_tokens=real_tokens,
        steps_per_epoch=packs // gbs,
        leftover_packs=packs % gbs,
        attention_work_per_step=gbs * squares / packs if packs else 0.0,
        linear_work_per_step=gbs * float(lengths.sum()) / packs if packs else 0.0,
        sub_lengths=lengths,
        pack_order=order,
        pack_offsets=offsets,
    )


def estimate_candidate(candidate: Candidate, planner: PlannerSetup) -> Estimate:
    """The planner's layout, memory and step time for one packed candidate (MBS 1, GBS = ``candidate.gbs``).

    The layout search ranks layouts at a full-length context; the chosen layout's step time is then
    re-estimated by the planner's one step-time model (:func:`longpack.planner.timing.estimate_time`)
    on the candidate's mean packed row (:class:`~longpack.planner.timing.RowWork`: each sequence's
    attention with its own per-CP-rank chunks, GEMMs on the full ``L``-token row, padding included). A
    pack that is one full-length sample therefore gets exactly ``longpack plan estimate``'s step time,
    and packed shorter samples never more. Real tokens/s = real tokens per step
    (``GBS * real_tokens / packs``) / step time.
    """
    from longpack.planner.search import SearchRequest, enumerate_layouts, search
    from longpack.planner.timing import RowWork, estimate_time
    from longpack.planner.uncertainty import error_band

    if candidate.packs == 0:
        return Estimate(fits=False, reason="no sample left to pack")
    pins = {"tp": 1, "cp": 1, **dict(planner.pins)}
    try:
        req = SearchRequest(
            model=planner.model,
            gpu=planner.gpu,
            num_gpus=planner.num_gpus,
            seq_length=candidate.pack_length,
            gbs=candidate.gbs,
            precision=planner.precision,
            headroom=planner.headroom,
            recompute=planner.recompute,
            allow_offload=planner.allow_offload,
            mbs=1,
            tp=pins["tp"],
            cp=pins["cp"],
            pp=pins.get("pp"),
            vpp=pins.get("vpp"),
            ep=pins.get("ep"),
            etp=pins.get("etp"),
        )
        result = search(req, top_k=1)
    except (PlanError, TopologyError) as exc:
        return Estimate(fits=False, reason=f"planner: {exc}")
    budget = req.memory_budget_gib
    if not result.candidates:
        if not enumerate_layouts(req):
            pinned = ", ".join(f"{k.upper()}={v}" for k, v in sorted(pins.items()))
            reason = (
                f"no layout of {planner.num_gpus} GPUs{' with ' + pinned if pinned else ''} has a DP that "
                f"divides GBS {candidate.gbs} (GBS must be divisible by DP and >= DP)"
            )
        else:
            needed = least_memory_gib(req)
            saving = "the most memory-saving recompute" + (
                " and optimizer offload" if req.allow_offload else ""
            )
            if req.recompute is not None:
                saving = f"recompute {','.join(req.recompute) or 'none'}" + (
                    " and optimizer offload" if req.allow_offload else ", no offload"
                )
            if needed is not None and round(needed, 1) > round(budget, 1):
                reason = (
                    f"no layout fits {budget:.1f} GiB per GPU: the lightest of {result.layouts_considered} "
                    f"layout(s) needs {needed:.1f} GiB with {saving}"
                )
            else:
                reason = f"no layout fits {budget:.1f} GiB per GPU ({dict(result.rejected)})"
            return Estimate(fits=False, reason=reason, memory_budget_gib=budget, memory_gib=needed)
        return Estimate(fits=False, reason=reason, memory_budget_gib=budget)
    best = result.candidates[0]
    time = estimate_time(
        planner.model,
        planner.gpu,
        best.plan,
        seq_length=candidate.pack_length,
        gbs=candidate.gbs,
        options=best.options,
        stage_counts=best.stage_counts,
        rows=RowWork.from_packs(
            candidate.sub_lengths.tolist(), packs=candidate.packs, row_length=candidate.pack_length
        ),
    )
    real_per_step = candidate.gbs * candidate.real_tokens / candidate.packs
    real_rate = real_per_step / time.step_time
    return Estimate(
        fits=True,
        reason=f"fits: {best.memory.total_gib:.1f} of {budget:.1f} GiB per GPU with {best.plan.label}",
        layout=best.plan.label,
        dp=best.plan.layout.dp,
        memory_gib=best.memory.total_gib,
        memory_budget_gib=budget,
        recompute=tuple(best.options.recompute),
        optimizer_offload=best.options.optimizer_offload,
        step_time_s=time.step_time,
        error_band=error_band(planner.model, planner.gpu, candidate.pack_length).width,
        real_tokens_per_s=real_rate,
        real_tokens_per_s_per_gpu=real_rate / planner.num_gpus,
        notes=tuple(best.reasons),
        plan=best.plan,
    )


def candidate_cp_modes(candidate: Candidate, planner: PlannerSetup) -> CandidateCPModes | None:
    """Static CP, hybrid CP and the DP-balanced scheduler on one candidate's packs, for the layout its
    estimate chose (``None`` when no layout fits).

    The one step-time model, as in ``longpack plan --data``: :func:`longpack.planner.cp_modes.plan_cp_modes`
    runs Megatron's schedulers (re-stated exactly) on the candidate's global batches and times every
    micro-batch with the planner's model; static CP's cell *is* the candidate's step time
    (:func:`estimate_candidate`), and each other mode's is that step time over its simulated speed-up at
    the cap where it is fastest (:meth:`~longpack.planner.cp_modes.CPModePlan.step_times`). The
    recommendation is ``plan_cp_modes``'s: a gain inside the error band is a tie, and a tie stays static.
    A layout with pipeline parallelism gets the static cell only: Megatron-LM refuses hybrid CP with PP,
    and neither scheduler is modelled under a pipeline.
    """
    from longpack.planner.cp_modes import CP_MODES, plan_cp_modes

    est = candidate.estimate
    if est is None or not est.fits or est.plan is None or est.step_time_s is None:
        return None
    lay = est.plan.layout
    real_per_step = candidate.gbs * candidate.real_tokens / candidate.packs
    why_not = ""
    if lay.pp > 1:
        why_not = (
            f"PP {lay.pp}: Megatron-LM runs hybrid CP only without pipeline parallelism (pin pp=1 to compare)"
        )
    plan = None
    if not why_not:
        try:
            plan = plan_cp_modes(
                candidate.pack_rows(),
                model=planner.model,
                gpu=planner.gpu,
                gpus=planner.num_gpus,
                tp=lay.tp,
                cp=lay.cp,
                gbs=candidate.gbs,
                pack_size=candidate.pack_length,
                precision=planner.precision,
            )
        except ConfigError as exc:
            why_not = str(exc)
    if plan is None:
        static = ModeCell(
            mode="static",
            max_seqlen_per_dp_cp_rank=None,
            step_time_s=est.step_time_s,
            speedup=1.0,
            rank_imbalance=None,
            real_tokens_per_s=est.real_tokens_per_s,
        )
        others = tuple(
            ModeCell(
                mode=mode,
                max_seqlen_per_dp_cp_rank=None,
                step_time_s=None,
                speedup=None,
                rank_imbalance=None,
                real_tokens_per_s=None,
                note=why_not,
            )
            for mode in CP_MODES[1:]
        )
        return CandidateCPModes(
            cells=(static, *others),
            recommended="static",
            max_seqlen_per_dp_cp_rank=None,
            gain=1.0,
            error_band=est.error_band,
            reason=f"only static CP is compared: {why_not}",
        )
    cells = []
    for mode, (seconds, cap) in plan.step_times(est.step_time_s).items():
        at = plan.best(mode)
        feasible = math.isfinite(seconds)
        cells.append(
            ModeCell(
                mode=mode,
                # no cap for a mode Megatron's scheduler refuses at every cap (nothing was timed at it)
                max_seqlen_per_dp_cp_rank=cap if feasible else None,
                step_time_s=seconds if feasible else None,
                speedup=at.speedup(mode) if feasible else None,
                rank_imbalance=at.imbalance[mode] if feasible else None,
                real_tokens_per_s=real_per_step / seconds if feasible else None,
                note="" if feasible else f"Megatron refuses this mode here: {at.infeasible.get(mode, '')}",
            )
        )
    chosen = next(c for c in cells if c.mode == plan.recommended)
    return CandidateCPModes(
        cells=tuple(cells),
        recommended=plan.recommended,
        max_seqlen_per_dp_cp_rank=plan.recommended_cap,
        gain=chosen.speedup or 1.0,
        error_band=plan.error_band,
        reason=plan.reason,
        steps_simulated=plan.steps_simulated,
        steps_total=plan.steps_total,
    )


def least_memory_gib(req: Any) -> float | None:
    """Least memory per GPU (GiB) any layout of a planner ``SearchRequest`` needs with the most
    memory-saving options it allows (pinned recompute or full, offload 100 % if allowed); ``None`` when no
    layout can be evaluated. Shows how far an infeasible candidate is from its budget."""
    from longpack.planner.memory import estimate_memory
    from longpack.planner.options import TrainingOptions
    from longpack.planner.search import default_dispatcher, enumerate_layouts

    recompute = req.recompute if req.recompute is not None else ("full",)
    best: float | None = None
    for plan in enumerate_layouts(req):
        lay = plan.layout
        try:
            options = TrainingOptions(
                precision=req.precision,
                recompute=recompute,
                optimizer_offload=1.0 if req.allow_offload else 0.0,
                dispatcher=req.dispatcher or default_dispatcher(req.gpu, lay.ep * lay.expert_tp),
                optimizer=req.optimizer,
                imbalance=req.imbalance,
            )
            mem = estimate_memory(
                req.model, plan, seq_length=req.seq_length, gbs=req.global_batch, options=options
            ).total_gib
        except PlanError:
            continue
        best = mem if best is None else min(best, mem)
    return best


def recommend(candidates: tuple[Candidate, ...] | list[Candidate]) -> Recommendation | None:
    """The candidate with the highest real tokens/s among those that fit, with the reason; ``None`` when
    no candidate has an estimate that fits.

    >>> def cand(length, rate, fits=True):
    ...     est = Estimate(fits=fits, reason="fits" if fits else "does not fit 75.0 GiB per GPU",
    ...                    real_tokens_per_s=rate if fits else None, memory_gib=60.0 if fits else None)
    ...     return Candidate(pack_length=length, gbs=65536 // length, pad_seq_to_mult=1, cap=length, read=10,
    ...         kept=10, truncated=0, truncated_tokens_lost=0, dropped=0, dropped_tokens=0, packs=64, fill=0.9,
    ...         real_fill=0.9, real_tokens=1000, steps_per_epoch=2, leftover_packs=0,
    ...         attention_work_per_step=0.0, linear_work_per_step=0.0, estimate=est)
    >>> recommend([cand(4096, 1e5), cand(8192, 1.2e5), cand(16384, None, fits=False)]).pack_length
    8192
    """
    usable = [c for c in candidates if c.ok and c.estimate is not None and c.estimate.fits]
    if not usable:
        return None
    ranked = sorted(usable, key=lambda c: (-real_rate(c), -c.pack_length))
    best = ranked[0]
    rate = real_rate(best)
    modes = best.cp_modes
    mode_text = "" if modes is None else f" and {MODE_NAMES[modes.recommended]}"
    parts = [
        f"pack length {best.pack_length} with GBS {best.gbs}{mode_text} has the highest estimated real "
        f"(non-padding) throughput of the candidates that fit: {rate:,.0f} tokens/s "
        f"({best.estimate.memory_gib:.1f} GiB per GPU)"  # type: ignore[union-attr]
    ]
    if len(ranked) > 1:
        runner = ranked[1]
        other = real_rate(runner)
        margin = f"{rate / other:.2f}x the next best, {runner.pack_length} ({other:,.0f} tokens/s)"
        band = best.estimate.error_band  # type: ignore[union-attr]
        if band is not None and rate / other - 1 <= band:
            margin += (
                f", inside the ± {band * 100:.0f} % error band of the estimates (the data-side figures above "
                "decide)"
            )
        parts.append(margin)
    excluded = [c for c in candidates if c not in usable]
    for c in excluded:
        if c.pack_length > best.pack_length:
            parts.append(f"{c.pack_length} is out: {c.problems[0] if c.problems else 'no estimate'}")
    if best.truncated or best.dropped:
        parts.append(
            f"at {best.pack_length}, {best.truncated} samples are truncated ({best.truncated_tokens_lost:,} "
            f"tokens lost) and {best.dropped} dropped"
        )
    if modes is not None:
        parts.append(f"CP mode: {modes.reason}")
    return Recommendation(
        pack_length=best.pack_length,
        gbs=best.gbs,
        reason="; ".join(parts),
        cp_mode=None if modes is None else modes.recommended,
        max_seqlen_per_dp_cp_rank=None if modes is None else modes.max_seqlen_per_dp_cp_rank,
    )


#: How the CP modes are named in text and tables (one definition, beside ``CP_MODES``).
MODE_NAMES = CP_MODE_NAMES


def real_rate(candidate: Candidate) -> float:
    """Real tokens/s of a candidate that fits: of its recommended CP mode when the modes were compared
    (static CP unless another mode's gain is outside the band), else of its estimate."""
    if candidate.cp_modes is not None:
        return candidate.cp_modes.real_tokens_per_s or 0.0
    return (candidate.estimate.real_tokens_per_s if candidate.estimate else None) or 0.0


def sweep(
    samples: TokenizedSamples,
    settings: SweepSettings,
    *,
    eos_id: int,
    layout: ParallelLayout | None = None,
    planner: PlannerSetup | None = None,
    versions: UpstreamVersions | None = None,
    cp_modes: bool = False,
) -> SweepResult:
    """Pack ``samples`` at every candidate length; check the batch rules against the layout the planner
    picks (with ``planner``), else against ``layout`` (its DP); recommend (planner only). With a planner,
    give ``layout`` only when the planner's layout is pinned to it. ``cp_modes`` (planner only): also
    compare static CP, hybrid CP and the DP-balanced scheduler per pack length
    (:func:`candidate_cp_modes`); the recommendation then weighs each length by its recommended mode.

    The packing work runs once per candidate on the tokenized samples; nothing is tokenized here.
    """
    if layout is not None:
        _check_alignment(settings, layout)
    out: list[Candidate] = []
    for length in settings.pack_lengths:
        cand = pack_candidate(samples, settings, length, eos_id=eos_id)
        if planner is not None:
            est = estimate_candidate(cand, planner)
            chosen = est.plan.layout if est.plan is not None else layout
            rules = None
            if chosen is not None:
                _check_alignment(settings, chosen)
                rules = batch_rule_findings(chosen, pack_length=length, gbs=cand.gbs, versions=versions)
            cand = replace(cand, estimate=est, dp=None if chosen is None else chosen.dp, batch_rules=rules)
            if cp_modes:
                cand = replace(cand, cp_modes=candidate_cp_modes(cand, planner))
        elif layout is not None:
            cand = replace(
                cand,
                dp=layout.dp,
                batch_rules=batch_rule_findings(layout, pack_length=length, gbs=cand.gbs, versions=versions),
            )
        out.append(cand)
    candidates = tuple(out)
    return SweepResult(
        settings=settings,
        read=len(samples),
        candidates=candidates,
        recommendation=recommend(candidates) if planner is not None else None,
    )


def nice_int(x: float) -> str:
    """``1234567`` -> ``'1.23M'`` (tables).

    >>> nice_int(1234567), nice_int(98765), nice_int(12)
    ('1.23M', '98.8K', '12')
    """
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.0f}" if math.isfinite(x) else str(x)


@dataclass(frozen=True, kw_only=True)
class ResolvedSweep:
    """What a :class:`SweepConfig` runs with (:meth:`SweepConfig.resolve`), beside its fields: the tokenizer
    (the demo's by default) and text options (a store's own), the candidates' settings, the planner's setup
    (``None`` without ``model``), the layout (``None`` without ``gpus``) and where ``pad_seq_to_mult`` came
    from."""

    tokenizer: Any
    text: TextConfig
    settings: SweepSettings
    planner: PlannerSetup | None
    cluster: ParallelLayout | None
    pad_seq_to_mult_source: str


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """Everything ``longpack sweep`` takes; validated on construction, run with :meth:`run`.

    Data and packing as in :class:`~longpack.jobs.PackConfig` (``inputs`` or ``demo``, ``tokenizer``,
    ``text``, ``pad_seq_to_mult`` or ``tp``/``cp``/``sp``, ``algorithm``, ``seed``, ``overlength``,
    ``workers``); the candidates: ``pack_lengths`` (ints, or a ``"2048,4096,8k"`` string) at ``token_slots``
    per step. With ``gpus`` the batch rules get a DP; with ``model``, ``gpu`` and ``gpus`` the planner
    estimates memory and real tokens/s and a pack length is recommended. ``layout`` (``"tp=2,pp=2"``)
    pins the planner's layout and derives ``pad_seq_to_mult`` from it. ``cp_modes`` adds the CP mode as a
    dimension: static CP, hybrid CP and the DP-balanced scheduler per pack length
    (:func:`candidate_cp_modes`).

    >>> SweepConfig(demo=True, model="llama3_1_8b", gpu="H100_SXM")
    Traceback (most recent call last):
    ...
    longpack.jobs.sweep.SweepError: model, gpu and gpus go together (e.g. model llama3_1_8b, gpu H100, gpus 8)
    """

    command_help = (
        "Pack at every candidate size with equal token slots per step; compare counts, fill, batch rules and "
        "(with --model/--gpu/--gpus) memory and real tokens/s; recommend a pack size."
    )

    inputs: Sequence[str | Path] | str | Path = inputs_option()
    pack_lengths: Sequence[int] | str = option(
        DEFAULT_PACK_LENGTHS,
        help="Candidate pack sizes (packed_sequence_size = seq_length), comma-separated; 8k = 8192.",
        flag="--pack-size",
        aliases=("--pack-lengths",),
        cli_type=str,
    )
    token_slots: int = option(
        DEFAULT_TOKEN_SLOTS,
        help="packed_sequence_size x global_batch_size, equal for every candidate (GBS = slots / size).",
    )
    tokenizer: Any = tokenizer_option()
    pad_seq_to_mult: int | None = pad_seq_to_mult_option()
    tp: int | None = tp_option()
    cp: int | None = cp_option()
    sp: bool = sp_option()
    algorithm: str = algorithm_option()
    seed: int = seed_option()
    overlength: str = option(
        choices.DEFAULT_OVERLENGTH, help="Samples longer than a pack.", choices=choices.OVERLENGTH_POLICIES
    )
    workers: int | None = workers_option()
    text: TextConfig = option(default_factory=TextConfig, help="How rows become samples.", nested_except=())
    model: str | None = model_option()
    gpu: str | None = gpu_option()
    gpus: int | None = gpus_option()
    layout: str | None = option(None, help="Pin the layout, e.g. 'tp=2,cp=1,pp=2,ep=8' (SP on when TP > 1).")
    precision: str = option("bf16", help="Training precision.", choices=choices.PRECISIONS)
    headroom: float = option(0.95, help="Fraction of usable GPU memory a layout may use.")
    recompute: str | Sequence[str] | None = option(
        None,
        help="Pin recompute modules ('none', 'layernorm,mlp', 'full'; default: cheapest that fits).",
        cli_type=str | None,
    )
    offload: bool = option(True, help="Allow optimizer CPU offload.", negative="--no-offload")
    cp_modes: bool = option(
        False,
        help=(
            "With --model/--gpu/--gpus: also compare the CP modes per pack size on the same global batches "
            "(static CP; hybrid CP, the DP-balanced scheduler and dynamic CP at their best max_seqlen_per_dp_cp_rank)."
        ),
    )
    #: A PNG of real tokens/s, memory and truncation vs pack size, written by :meth:`run` (needs matplotlib).
    plot: str | Path | None = option(
        None, help="Write a PNG: real tokens/s, memory and truncation vs pack size.", cli_type=Path | None
    )
    demo: bool = demo_option("Sweep")
    progress: bool = False
    #: A token store (``longpack tokenize``) to sweep instead of tokenizing ``inputs``.
    store: str | Path | None = option(
        None,
        help="Sweep a token store (longpack tokenize) instead of tokenizing INPUTs.",
        cli_type=Path | None,
    )
    #: Versions the batch rules check candidates for (as ``CheckConfig``'s; default: check's default).
    bridge_version: str | None = bridge_version_option()
    megatron_core_version: str | None = megatron_core_version_option()

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        from longpack.jobs.pack import _paths

        set_ = object.__setattr__
        set_(self, "inputs", _paths(self.inputs, "inputs"))
        self._check_values()
        check_choices(self, error=SweepError)
        if self.plot is not None:  # as plan's and inspect's: a folder, a missing parent, a bad name
            from longpack.outputs import check_output_file

            check_output_file(self.plot, field="plot")
        resolved = self.resolved  # every other check runs now, on construction
        set_(self, "pack_lengths", resolved.settings.pack_lengths)  # canonical: a sorted tuple

    @functools.cached_property
    def resolved(self) -> ResolvedSweep:
        """:meth:`resolve`'s result, computed once (on construction)."""
        return self.resolve()

    def resolve(self) -> ResolvedSweep:
        """What this job runs with, derived from the fields (a new object; no field is written): the
        tokenizer and text options of the data source, the candidates' settings, the planner's setup and
        the layout."""
        from longpack.jobs.pack import settle_data_source

        tokenizer, text = settle_data_source(
            self,
            self.text,
            verb="sweeps",
            store_clash="store replaces inputs; give one of them" if self.inputs else None,
            error=SweepError,
        )
        self._check_together()
        lengths = self._pack_lengths()
        mult, source, pins, cluster = self._layout()
        # algorithm: a choice of choices.ALGORITHMS, checked with the others by check_choices above
        settings = SweepSettings(
            pack_lengths=lengths,
            token_slots=self.token_slots,
            pad_seq_to_mult=mult,
            algorithm=self.algorithm,
            seed=self.seed,
            overlength=self.overlength,
        )
        return ResolvedSweep(
            tokenizer=tokenizer,
            text=text,
            settings=settings,
            planner=self._planner(pins),
            cluster=cluster,
            pad_seq_to_mult_source=source,
        )

    def _check_together(self) -> None:
        """The fields that go together (model, gpu and gpus; cp_modes and model; layout and gpus)."""
        if (self.model is None) != (self.gpu is None) or (self.model is not None and self.gpus is None):
            raise SweepError(
                "model, gpu and gpus go together (e.g. model llama3_1_8b, gpu H100, gpus 8)",
                fields=("model", "gpu", "gpus"),
            )
        if self.cp_modes and self.model is None:
            raise SweepError(
                "cp_modes times the CP modes with the planner: give model, gpu and gpus too",
                fields=("cp_modes", "model", "gpu", "gpus"),
            )
        if self.layout is not None and self.gpus is None:
            raise SweepError(
                "layout needs gpus (the layout's DP follows from the GPU count)", fields=("layout", "gpus")
            )
        if self.layout is not None and (self.tp is not None or self.cp is not None or self.sp):
            raise SweepError(
                "give either layout or tp, cp and sp, not both", fields=("layout", "tp", "cp", "sp")
            )

    def _pack_lengths(self) -> tuple[int, ...]:
        """The candidate pack lengths, sorted (a ``"2048,4096"`` text read), each one the packer supports."""
        if isinstance(self.pack_lengths, str):
            lengths = parse_pack_lengths(self.pack_lengths)
        elif not isinstance(self.pack_lengths, list | tuple | range):
            raise SweepError(
                f"pack_lengths must be a list of pack sizes or a '2048,4096' string, got {self.pack_lengths!r}",
                fields="pack_lengths",
            )
        else:
            try:
                lengths = tuple(sorted(positive_int(x, "pack_lengths") for x in self.pack_lengths))
            except ConfigError as exc:
                raise SweepError(str(exc), fields=exc.fields) from None
        from longpack.binpack import MAX_CAPACITY

        if lengths and max(lengths) > MAX_CAPACITY:
            raise SweepError(
                f"pack length {max(lengths)} is above the {MAX_CAPACITY} tokens the bin packer supports (its "
                "working memory grows with the pack length); drop it from pack_lengths",
                fields="pack_lengths",
            )
        return lengths

    def _layout(self) -> tuple[int, str, dict[str, int], ParallelLayout | None]:
        """``pad_seq_to_mult`` and where it came from, the planner's pins and the layout (``None`` without
        ``gpus``): from ``layout``, or from tp, cp and sp."""
        from longpack.jobs.pack import resolve_pad_seq_to_mult

        pins: dict[str, int] = {}
        cluster: ParallelLayout | None = None
        if self.layout is not None:
            from longpack.jobs.plan import parse_layout

            assert self.gpus is not None
            plan_layout, _ = parse_layout(self.layout, world_size=self.gpus)
            if plan_layout.mbs != 1:
                raise SweepError(
                    f"layout mbs={plan_layout.mbs}: offline packed data needs micro_batch_size 1 "
                    "(LP-PACK-005); drop mbs from layout",
                    fields="layout",
                )
            cluster = plan_layout.layout
            mult = self.pad_seq_to_mult or cluster.pad_seq_to_mult
            source = (
                f"given: pad_seq_to_mult {mult}"
                if self.pad_seq_to_mult
                else f"from layout ({cluster.pad_seq_to_mult})"
            )
            pins = {
                "tp": cluster.tp,
                "cp": cluster.cp,
                "pp": cluster.pp,
                "vpp": cluster.vpp or 1,
                "ep": cluster.ep,
                "etp": cluster.expert_tp,
            }
        else:
            if self.model is not None and (self.tp or 1) > 1 and not self.sp and self.pad_seq_to_mult is None:
                raise SweepError(
                    f"tp {self.tp} with model: the planner runs TP > 1 with sequence parallelism; set sp so "
                    "the data is aligned for it",
                    fields=("tp", "sp"),
                )
            mult, source = resolve_pad_seq_to_mult(self.pad_seq_to_mult, self.tp, self.cp, self.sp)
            pins = {"tp": self.tp or 1, "cp": self.cp or 1}
            if self.gpus is not None:
                try:
                    cluster = ParallelLayout(
                        world_size=self.gpus, tp=self.tp or 1, cp=self.cp or 1, sp=self.sp
                    )
                except TopologyError as exc:
                    raise SweepError(str(exc), fields=("gpus", "tp", "cp")) from exc
        return mult, source, pins, cluster

    def _planner(self, pins: dict[str, int]) -> PlannerSetup | None:
        """Model, GPU, pins and options for the planner (``None`` without ``model``)."""
        if self.model is None:
            return None
        from longpack.planner.catalog import load_gpu, load_model
        from longpack.planner.options import normalize_recompute

        assert self.gpu is not None and self.gpus is not None
        recompute = self.recompute
        if recompute is not None and not isinstance(recompute, str):
            recompute = ",".join(recompute) or "none"
        return PlannerSetup(
            recompute=None if recompute is None else normalize_recompute(recompute),
            allow_offload=self.offload,
            model=load_model(self.model),
            gpu=load_gpu(self.gpu),
            num_gpus=self.gpus,
            pins=pins,
            precision=self.precision.lower(),
            headroom=self.headroom,
        )

    def _check_values(self) -> None:
        """Sizes are positive integers (0 is an error, never "unset"), switches booleans, headroom finite."""
        set_ = object.__setattr__
        # a version that does not parse is refused before any tokenizing
        UpstreamVersions.resolve(bridge=self.bridge_version, mcore=self.megatron_core_version)
        try:
            for name in ("pad_seq_to_mult", "tp", "cp", "workers", "gpus"):
                set_(self, name, optional_positive_int(getattr(self, name), name))
            set_(self, "token_slots", positive_int(self.token_slots, "token_slots"))
            set_(self, "seed", seed_value(self.seed))
            set_(self, "headroom", finite_float(self.headroom, "headroom", lo=0.0, hi=1.0, lo_open=True))
            for name in ("demo", "sp", "offload", "progress", "cp_modes"):
                flag(getattr(self, name), name)
        except ConfigError as exc:
            raise SweepError(str(exc), fields=exc.fields) from None

    @property
    def settings(self) -> SweepSettings:
        """The candidates and the packing settings every candidate shares."""
        return self.resolved.settings

    @property
    def planner(self) -> PlannerSetup | None:
        """Model, GPU and pins for the planner (``None`` without ``model``)."""
        return self.resolved.planner

    def run(self) -> SweepResult:
        """Tokenize the inputs once, then pack (and estimate) every candidate."""
        import contextlib

        from longpack.jobs.pack import _demo_folder
        from longpack.text import tokenize_inputs
        from longpack.text.tokenizers import as_tokenizer

        resolved = self.resolved
        tokenizer = as_tokenizer(resolved.tokenizer) if resolved.tokenizer is not None else None
        with contextlib.ExitStack() as stack:
            inputs = list(cast(tuple[str, ...], self.inputs))  # normalized in __post_init__
            if self.demo:
                inputs = [str(_demo_folder(stack))]  # the cached demo data (made once)
            from longpack.jobs.executors import input_read_errors
            from longpack.jobs.stores import open_store

            with input_read_errors():
                tokenized = (
                    open_store(self.store, tokenizer=resolved.tokenizer, text=resolved.text)[0]
                    if self.store is not None
                    else tokenize_inputs(
                        inputs,
                        tokenizer=tokenizer,
                        config=resolved.text,
                        workers=self.workers,
                        progress=self.progress,
                    )
                )
        eos_id = tokenized.tokenizer.get("eos_id")
        if eos_id is None:
            raise InputError(
                f"tokenizer {tokenized.tokenizer.get('name')!r} has no EOS id; packing pads with EOS",
                fields="tokenizer",
            )
        planner = self.planner
        cluster = resolved.cluster
        # with the planner, a layout fixes DP only when ``layout`` pins it (else the planner picks PP)
        fixed = cluster if planner is None or self.layout is not None else None
        versions = UpstreamVersions.resolve(bridge=self.bridge_version, mcore=self.megatron_core_version)
        result = sweep(
            tokenized.samples,
            self.settings,
            eos_id=int(eos_id),
            layout=fixed,
            planner=planner,
            versions=versions,
            cp_modes=self.cp_modes,
        )
        result = replace(
            result,
            input={
                "demo": self.demo,
                "format": tokenized.format,
                "tokenizer": tokenized.tokenizer.get("name", getattr(tokenizer, "name", None)),
                "rows_read": tokenized.rows_read,
                "malformed": len(tokenized.malformed),
            },
            pad_seq_to_mult_source=resolved.pad_seq_to_mult_source,
            gpus=self.gpus,
            model=None if planner is None else planner.model.name,
            gpu=None if planner is None else planner.gpu.name,
        )
        if self.plot is not None:
            from longpack.jobs.plots import sweep_png

            sweep_png(result, Path(self.plot))
            result = replace(result, plot=str(self.plot))
        return result


# A setting of a nested config given at the top (PackConfig(skip_malformed=True)) names where it belongs.
refuse_unknown_settings(SweepConfig)
