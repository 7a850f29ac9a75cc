"""Plan from the data: static CP, hybrid CP, the DP-balanced packing scheduler or dynamic CP for *this* corpus.

``compare_cp_modes`` (``longpack.balance.cp_modes``) runs Megatron's own schedulers, re-stated exactly,
on the corpus's packs; this module supplies the time of every micro-batch from the planner's one
step-time model (:func:`longpack.planner.timing.estimate_time`: GEMMs on the micro-batch's tokens, core
attention per sequence at its per-CP-rank zigzag chunk lengths, exposed CP communication) and turns
the comparison into a recommendation:

* every mode is timed on the same global batches (the sequences of ``gbs`` consecutive packs);
* hybrid CP, the DP-balanced scheduler and dynamic CP are tried at several ``max_seqlen_per_dp_cp_rank`` caps:
  Megatron's own starting point, the pack length over CP (a rank then holds no more tokens than under
  static CP, so the memory the layout was sized for still holds), and its half and quarter;
* a mode is recommended over static CP (Megatron's default, the reference) only when its predicted
  gain is larger than the estimate's error band; otherwise the result is a tie and static CP stays;
* a mode Megatron-Core cannot run at a cap (its scheduler fails, or a sub-sample lands on ranks with no
  process group: :mod:`longpack.balance.cp_groups`) is infeasible there, with the reason, and never
  recommended at that cap.

What the model leaves out is said in :data:`NOT_MODELLED`. Sequence times are computed on a grid of
lengths per rank count and interpolated (:data:`GRID_POINTS`), and at most ``max_steps`` global batches,
evenly spaced, are simulated, so a million-sample corpus plans in seconds.

>>> packs = [[131072], *[[1024] * 128] * 3] * 2  # full-length documents among packs of 1K chats
>>> plan = plan_cp_modes(packs, model="llama3_1_8b", gpu="h100", gpus=64, tp=1, cp=16, gbs=4, pack_size=131072)
>>> plan.recommended, plan.recommended_cap, [c.max_seqlen_per_rank for c in plan.comparisons]
('hybrid', 4096, [2048, 4096, 8192])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack.balance.cp_modes import CP_MODES, CPModeComparison, compare_cp_modes
from longpack.errors import ConfigError
from longpack.topology import ranks_needed

__all__ = ["GRID_POINTS", "NOT_MODELLED", "CPModePlan", "bridge_note", "mode_overrides", "plan_cp_modes"]

#: Lengths per rank count at which single-sequence micro-batch times are computed (geometric grid,
#: linear interpolation between points).
GRID_POINTS = 48

#: What the comparison does not charge, in either direction.
NOT_MODELLED = (
    "hybrid CP's all-to-all that moves sub-samples to their ranks and its barrier per group",
    "the DP-balanced and dynamic-CP schedulers' all-gather that moves sub-samples to their ranks",
    "padding by pad_packed_seq_alignment (off by default; 'max' pads every rank to max_seqlen_per_dp_cp_rank)",
    "pipeline parallelism (hybrid CP refuses it; every mode is compared at PP 1)",
    "memory: hybrid CP runs one sub-sample per forward, so peak activations follow max_seqlen_per_dp_cp_rank",
)

#: What each mode asks of the run, from Megatron-LM's own asserts (``megatron/training/arguments.py``,
#: ``megatron/core/datasets/data_schedule.py``).
CONSTRAINTS = {
    "static": (),
    "hybrid": (
        "no pipeline parallelism (PP 1)",
        "no CUDA graphs",
        "no Megatron FSDP",
        "dataloader_type single",
        "per-token loss (calculate_per_token_loss)",
    ),
    "dp_balanced": (
        "Megatron-LM dev (its training loop wraps the data iterator when --sequence-packing-scheduler is set: "
        "megatron/training/training.py @d48bd6be0a); main has the class (PR #6684) but no flag, "
        "megatron-core 0.16 neither",
        "a global batch must fill at least DP packs",
    ),
    "dynamic_cp": (
        "Megatron-LM dev (dynamic CP: @2d6e946bab, @c3dbea746b, @d2e7ec5b88; not on main or in megatron-core 0.16)",
        "an even DP x CP (Megatron-Core asserts it)",
        "no CUDA graphs unless pad_packed_seq_alignment and thd_max_packed_sequences are set; no Megatron FSDP",
        "dataloader_type single",
        "per-token loss (calculate_per_token_loss)",
    ),
}


@dataclass(frozen=True, kw_only=True)
class CPModePlan:
    """The comparison at each cap, the recommendation and why."""

    comparisons: tuple[CPModeComparison, ...]
    recommended: str
    recommended_cap: int | None
    gain: float
    error_band: float
    reason: str
    layout: dict[str, int]
    steps_simulated: int
    steps_total: int

    def best(self, mode: str) -> CPModeComparison:
        """The comparison (cap) at which ``mode`` is fastest; where Megatron's scheduler refuses the data at
        every cap, the largest cap (its reason is the one left when the cap is no longer the obstacle)."""
        if not any(math.isfinite(c.times[mode]) for c in self.comparisons):
            return max(self.comparisons, key=lambda c: c.max_seqlen_per_rank)
        return min(self.comparisons, key=lambda c: c.times[mode])

    def step_times(self, static_step_time: float) -> dict[str, tuple[float, int | None]]:
        """Each mode's step time and the cap it is fastest at (``None`` for static CP), given static CP's step
        time for this layout from the one step-time model (``sweep``'s, on the mean packed row): static
        CP's time scaled by the simulated schedules' ratio (:meth:`CPModeComparison.speedup`), so the
        speed-ups are the ones the recommendation was made on. ``inf`` where Megatron's scheduler refuses
        the data at every cap.

        >>> from longpack.balance.cp_modes import CP_MODES, CPModeComparison
        >>> c = CPModeComparison(times={"static": 8.0, "hybrid": 4.0, "dp_balanced": 10.0, "dynamic_cp": 2.0},
        ...     steps=2, tokens=1, hybrid_groups=1.0, hybrid_balance=1.0, dp_balanced_micro_batches=1.0,
        ...     max_seqlen_per_rank=512, infeasible={}, imbalance=dict.fromkeys(CP_MODES, 1.0))
        >>> plan = CPModePlan(comparisons=(c,), recommended="static", recommended_cap=None, gain=1.0,
        ...     error_band=0.1, reason="", layout={}, steps_simulated=2, steps_total=2)
        >>> plan.step_times(0.5)
        {'static': (0.5, None), 'hybrid': (0.25, 512), 'dp_balanced': (0.625, 512), 'dynamic_cp': (0.125, 512)}
        """
        out: dict[str, tuple[float, int | None]] = {"static": (float(static_step_time), None)}
        for mode in CP_MODES[1:]:
            c = self.best(mode)
            speedup = c.speedup(mode)
            out[mode] = (static_step_time / speedup if speedup > 0 else math.inf, c.max_seqlen_per_rank)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly mapping (``longpack plan --data --json``)."""
        return {
            "layout": self.layout,
            "recommended": {
                "mode": self.recommended,
                "max_seqlen_per_dp_cp_rank": self.recommended_cap,
                "gain_over_static": round(self.gain, 4),
                "error_band": round(self.error_band, 4),
                "reason": self.reason,
                "overrides": mode_overrides(self.recommended, self.recommended_cap),
                "constraints": list(CONSTRAINTS[self.recommended]),
            },
            "comparisons": [
                {
                    "max_seqlen_per_dp_cp_rank": c.max_seqlen_per_rank,
                    "step_time_s": {m: _finite(c.times[m] / c.steps, 6) for m in CP_MODES},
                    # a mode Megatron's scheduler refuses has no throughput and no speed-up (null, not 0)
                    "tokens_per_s": {
                        m: None if m in c.infeasible else _finite(c.tokens / c.times[m], 1) for m in CP_MODES
                    },
                    "speedup_over_static": {
                        m: None if m in c.infeasible else _finite(c.speedup(m), 4) for m in CP_MODES
                    },
                    "rank_imbalance": {m: _finite(c.imbalance[m], 4) for m in CP_MODES},
                    "infeasible": dict(c.infeasible),
                    "hybrid_groups_per_step": round(c.hybrid_groups, 2),
                    "hybrid_balance": round(c.hybrid_balance, 4),
                    "dp_balanced_micro_batches": round(c.dp_balanced_micro_batches, 2),
                    "dynamic_cp_micro_batches": round(c.dynamic_cp_micro_batches, 2),
                }
                for c in self.comparisons
            ],
            "steps_simulated": self.steps_simulated,
            "steps_total": self.steps_total,
            "not_modelled": list(NOT_MODELLED),
        }


def bridge_note(mode: str, cap: int | None) -> str | None:
    """What a Megatron-Bridge user must do to get ``mode`` (``longpack check``'s ``LP-HCP-009``): Bridge runs
    neither scheduler. ``None`` for static CP.

    >>> bridge_note("hybrid", 4096)[:60]
    'LP-HCP-009: Megatron-Bridge builds the hybrid-CP groups but '
    """
    if mode == "hybrid":
        flags = " ".join(mode_overrides(mode, cap)["megatron_lm"])
        return (
            "LP-HCP-009: Megatron-Bridge builds the hybrid-CP groups but never schedules batches by them, so a "
            f"Bridge run trains with static CP: train with Megatron-LM's pretrain_gpt.py ({flags}) to get this mode"
        )
    if mode in ("dp_balanced", "dynamic_cp"):
        flags = " ".join(mode_overrides(mode, cap)["megatron_lm"])
        bridge = (
            "Megatron-Bridge runs it only with global-batch packing (dataset.enable_global_batch_packing, PR "
            "#6127, open: not in Bridge main @067f987df0, which never wraps its data iterator with Megatron-Core's "
            "wrap_data_iterator)"
            if mode == "dynamic_cp"
            else "Megatron-Bridge main (@067f987df0) never wraps its data iterator with Megatron-Core's "
            "wrap_data_iterator, so a Bridge run trains on the packs as written"
        )
        return (
            f"LP-HCP-009: {bridge}; until your Bridge does, train with Megatron-LM dev's pretrain_gpt.py "
            f"({flags}) to get this mode"
        )
    return None


def _finite(x: float, digits: int) -> float | None:
    return round(x, digits) if math.isfinite(x) and x != 0 else (None if not math.isfinite(x) else 0.0)


def mode_overrides(mode: str, cap: int | None, *, min_cp_size: int = 1) -> dict[str, list[str]]:
    """Settings that turn ``mode`` on, for Megatron-LM's command line and Megatron-Bridge's overrides
    (Bridge's ``model.*`` keys are Megatron-Core's config fields; the key names and dynamic CP's set,
    global-batch packing included, are :mod:`longpack.rules.scheduling_keys`'s, the ones ``check`` reads).

    >>> mode_overrides("hybrid", 4096)["megatron_lm"]
    ['--hybrid-context-parallel', '--max-seqlen-per-dp-cp-rank 4096', '--calculate-per-token-loss']
    """
    from longpack.rules.checks.common import K_PTL
    from longpack.rules.scheduling_keys import K_CAP, K_HCP, K_SCHED, dynamic_cp_keys

    if mode == "hybrid":
        return {
            "megatron_lm": [
                "--hybrid-context-parallel",
                f"--max-seqlen-per-dp-cp-rank {cap}",
                "--calculate-per-token-loss",
            ],
            "bridge": [f"{K_HCP}=true", f"{K_CAP}={cap}", f"{K_PTL}=true"],
        }
    if mode == "dp_balanced":
        return {
            "megatron_lm": [
                "--sequence-packing-scheduler dp_balanced",
                f"--max-seqlen-per-dp-cp-rank {cap}",
                "--calculate-per-token-loss",
            ],
            "bridge": [f"{K_SCHED}=dp_balanced", f"{K_CAP}={cap}", f"{K_PTL}=true"],
        }
    if mode == "dynamic_cp":
        keys = dynamic_cp_keys(max_seqlen_per_dp_cp_rank=int(cap or 0), min_size=min_cp_size)
        return {
            "megatron_lm": [
                "--dynamic-context-parallel",
                "--sequence-packing-scheduler default_dynamic_cp",
                f"--max-seqlen-per-dp-cp-rank {cap}",
                f"--min-dynamic-context-parallel-size {min_cp_size}",
                "--calculate-per-token-loss",
            ],
            "bridge": [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()],
        }
    return {"megatron_lm": [], "bridge": []}


def _sequence_seconds(model: Any, gpu: Any, *, tp: int, precision: str, max_length: int) -> Any:
    """The planner's ``seconds(lengths, ranks)`` (:func:`longpack.planner.balance_costs.microbatch_seconds`),
    with single sequences (hybrid CP runs every sub-sample as its own micro-batch) interpolated on a
    geometric grid of :data:`GRID_POINTS` lengths per rank count, so a corpus of a million distinct
    lengths costs a few hundred model evaluations."""
    from longpack.planner.balance_costs import microbatch_seconds

    exact = microbatch_seconds(model=model, gpu=gpu, precision=precision, tp=tp)

    @functools.cache
    def grid(ranks: int) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.unique(np.geomspace(16, max(32, max_length), GRID_POINTS).astype(np.int64))
        return lengths.astype(np.float64), np.asarray([exact([int(n)], ranks) for n in lengths])

    def seconds(lengths: Sequence[int], ranks: int) -> float:
        if len(lengths) == 1:
            xs, ys = grid(ranks)
            return float(np.interp(float(lengths[0]), xs, ys))
        return exact(lengths, ranks)

    seconds.single = lambda n, ranks: exact([int(n)], ranks)  # type: ignore[attr-defined]
    return seconds


def _caps(pack_size: int, cp: int, longest: int, dp_cp: int) -> list[int]:
    """Megatron's suggested cap (pack length / CP: a rank holds no more tokens than under static CP, so
    memory stays where it was) and its half and quarter, keeping the ones that hold the longest sequence
    on the DP x CP ranks. A larger cap needs more activation memory than the static layout was sized for."""
    base = max(1, pack_size // cp)
    caps = sorted({max(1, base // 4), max(1, base // 2), base})
    return [c for c in caps if ranks_needed(longest, c) <= dp_cp]


def plan_cp_modes(
    pack_lengths: Sequence[Sequence[int]],
    *,
    model: Any,
    gpu: Any,
    gpus: int,
    tp: int,
    cp: int,
    gbs: int,
    pack_size: int,
    precision: str = "bf16",
    caps: Sequence[int] | None = None,
    max_steps: int = 64,
) -> CPModePlan:
    """Compare the CP modes on ``pack_lengths`` (the runtime lengths of each pack, in reading order) for a
    TP x CP layout of ``gpus`` GPUs (DP = gpus / (TP x CP), PP 1), and recommend one. ``model`` and ``gpu``:
    catalog names (or a ``config.json`` path), or the specs already loaded.

    Raises ``ConfigError`` when the layout does not divide the GPUs, or no cap holds the longest sequence.
    """
    from longpack.planner.catalog import load_gpu, load_model
    from longpack.planner.uncertainty import error_band

    for name, value in (("gpus", gpus), ("tp", tp), ("cp", cp), ("gbs", gbs), ("pack_size", pack_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}", fields=name)
    if gpus % (tp * cp):
        raise ConfigError(f"gpus={gpus} is not a multiple of TP x CP = {tp * cp}", fields="gpus")
    dp = gpus // (tp * cp)
    if gbs % dp:
        raise ConfigError(f"gbs={gbs} is not a multiple of DP = {dp}; choose a multiple", fields="gbs")
    packs = [list(map(int, p)) for p in pack_lengths if len(p)]
    if not packs:
        raise ConfigError("no packs to plan from: the data holds no sequences", fields="data")
    longest = max(max(p) for p in packs)
    chosen = sorted(set(caps)) if caps else _caps(pack_size, cp, longest, dp * cp)
    if not chosen or any(ranks_needed(longest, c) > dp * cp for c in chosen):
        named = ", ".join(map(str, chosen)) or "(none)"
        raise ConfigError(
            f"max_seqlen_per_dp_cp_rank {named}: the longest sequence ({longest} tokens) needs more "
            f"than the {dp * cp} DP x CP ranks; choose a cap of at least {-(-longest // (dp * cp))}",
            fields="max_seqlen_per_dp_cp_rank",
        )
    # Evenly spaced whole global batches, at most max_steps of them.
    total_steps = -(-len(packs) // gbs)
    picked = np.unique(np.linspace(0, total_steps - 1, min(total_steps, max_steps)).round().astype(int))
    sample = [p for s in picked for p in packs[s * gbs : (s + 1) * gbs]]

    spec = load_model(model) if isinstance(model, str) else model
    device = load_gpu(gpu) if isinstance(gpu, str) else gpu
    seconds = _sequence_seconds(model, gpu, tp=tp, precision=precision, max_length=max(longest, pack_size))
    comparisons = tuple(
        compare_cp_modes(sample, dp=dp, cp=cp, gbs=gbs, max_seqlen_per_rank=c, seconds=seconds)
        for c in chosen
    )
    band = error_band(spec, device, pack_size).width
    best_mode, best_cap, best_gain = "static", None, 1.0
    for c in comparisons:
        for mode in CP_MODES[1:]:
            if c.speedup(mode) > best_gain:
                best_mode, best_cap, best_gain = mode, c.max_seqlen_per_rank, c.speedup(mode)
    if best_mode != "static" and best_gain - 1.0 <= band:
        reason = (
            f"{best_mode} is predicted {100 * (best_gain - 1):.1f} % faster, inside the estimate's "
            f"± {100 * band:.0f} % band: a tie, so Megatron's default (static CP) stays"
        )
        best_mode, best_cap, recommended_gain = "static", None, best_gain
    elif best_mode == "static":
        reason = "no mode is predicted faster than static CP on this data"
        recommended_gain = 1.0
    else:
        reason = (
            f"{best_mode} at max_seqlen_per_dp_cp_rank={best_cap} is predicted {100 * (best_gain - 1):.1f} % "
            f"faster than static CP, outside the ± {100 * band:.0f} % band"
        )
        recommended_gain = best_gain
    return CPModePlan(
        comparisons=comparisons,
        recommended=best_mode,
        recommended_cap=best_cap,
        gain=recommended_gain,
        error_band=band,
        reason=reason,
        layout={"gpus": gpus, "tp": tp, "cp": cp, "dp": dp, "gbs": gbs, "pack_size": pack_size},
        steps_simulated=len(picked),
        steps_total=total_steps,
    )
