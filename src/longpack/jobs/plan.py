"""The plan job: rank every parallel layout that fits by estimated step time (``longpack plan``).

A thin typed entry point over ``longpack.planner.search``: :class:`PlanConfig` gathers the request, its
:meth:`~PlanConfig.run` returns a :class:`PlanResult` (the ranked candidates, each with its
Megatron-Bridge overrides).

>>> r = PlanConfig(model="llama3_1_8b", gpu="H100_SXM", gpus=8, seq_length=8192, top=2).run()
>>> r.ok, len(r.candidates) <= 2, r.to_dict()["request"]["gpus"]
(True, True, 8)
"""

from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longpack import choices
from longpack.errors import ConfigError, InputError
from longpack.jobs.options import (
    bridge_version_option,
    gpus_option,
    megatron_core_version_option,
    tokenizer_option,
)
from longpack.option import option
from longpack.planner.catalog import list_gpus, list_models

__all__ = [
    "PlanConfig",
    "PlanResult",
    "candidate_dict",
    "candidate_overrides",
    "parse_layout",
    "rejection_lines",
]

if TYPE_CHECKING:
    from longpack.planner.reference import Comparison, Reference
    from longpack.planner.search import Candidate as PlannerCandidate
    from longpack.planner.search import SearchRequest, SearchResult


def parse_layout(text: str, *, world_size: int) -> tuple[Any, dict[str, int]]:
    """``"tp=1,cp=32,ep=32,pp=8,vpp=4"`` -> ``(PlanLayout, values)`` (SP on when TP > 1; ETP defaults to
    1 for MoE).

    >>> plan, values = parse_layout("tp=2,pp=2", world_size=8)
    >>> plan.layout.dp, plan.layout.sp, values
    (2, True, {'tp': 2, 'pp': 2})
    """
    from longpack.planner.options import PlanError, PlanLayout
    from longpack.topology import ParallelLayout

    values: dict[str, int] = {}
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        key, sep, raw = part.partition("=")
        if not sep or key not in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "dp"):
            raise PlanError(
                f"layout part {part!r} is not key=value with key in tp,cp,ep,etp,pp,vpp,mbs,dp",
                fields="layout",
            )
        try:
            number = int(raw)
        except ValueError as exc:
            raise PlanError(f"layout {key}={raw!r} is not an integer", fields="layout") from exc
        if number < 1:  # a size: 0 is never "unset" (mbs=0 divided by zero in the memory model)
            raise PlanError(f"layout {key}={raw} must be a positive integer (e.g. {key}=1)", fields="layout")
        values[key] = number
    tp = values.get("tp", 1)
    lay = ParallelLayout(
        world_size=world_size,
        tp=tp,
        cp=values.get("cp", 1),
        pp=values.get("pp", 1),
        vpp=values["vpp"] if values.get("vpp", 1) > 1 else None,
        ep=values.get("ep", 1),
        etp=values.get("etp", 1),
        sp=tp > 1,
    )
    if "dp" in values and values["dp"] != lay.dp:
        raise PlanError(
            f"layout dp={values['dp']} but {world_size} GPUs with this layout give DP {lay.dp}",
            fields="layout",
        )
    return PlanLayout(layout=lay, mbs=values.get("mbs", 1)), values


def candidate_overrides(cand: Any, req: Any) -> list[str]:
    """The Megatron-Bridge ``key=value`` overrides of one planner candidate (Hydra grammar)."""
    from longpack.planner.attention import hierarchical_sizes
    from longpack.planner.overrides import to_overrides

    lay = cand.plan.layout
    sizes = None
    if lay.cp > 1 and cand.options.cp_comm_type == "a2a+p2p":
        sizes = hierarchical_sizes(req.model, req.gpu, t=lay.tp, c=lay.cp)
    return to_overrides(
        cand.plan,
        cand.options,
        seq_length=req.seq_length,
        gbs=req.global_batch,
        pipeline_layout=cand.pipeline_layout,
        hopper=not req.gpu.is_blackwell,
        moe=req.model.moe is not None,
        hierarchical_cp=sizes,
    )


def candidate_dict(cand: Any, req: Any) -> dict[str, Any]:
    """One planner candidate as ``longpack plan --json`` prints it: layout, options, memory (with the
    pipeline rank it describes), time, reasons and the Megatron-Bridge overrides in every form
    (``overrides``: ``key=value`` lines; ``overrides_shell``: the same shell-quoted; ``overrides_yaml``:
    nested YAML; ``overrides_python``: assignments on ``cfg``)."""
    from longpack.planner.overrides import to_python_snippet, to_shell, to_yaml
    from longpack.planner.uncertainty import error_band

    lay = cand.plan.layout
    lines = candidate_overrides(cand, req)
    band = error_band(req.model, req.gpu, req.seq_length)
    time = {**cand.time.as_dict(), "error_band": round(band.width, 4), "error_band_basis": band.as_dict()}
    return {
        "layout": {
            "tp": lay.tp,
            "cp": lay.cp,
            "ep": lay.ep,
            "etp": lay.expert_tp,
            "pp": lay.pp,
            "vpp": cand.plan.vpp,
            "dp": lay.dp,
            "edp": lay.edp,
            "mbs": cand.plan.mbs,
            "sp": lay.sp,
            "pipeline_layout": cand.pipeline_layout,
            "label": cand.plan.label,
        },
        "options": {
            "precision": cand.options.precision,
            "recompute": list(cand.options.recompute),
            "optimizer_offload": cand.options.optimizer_offload,
            "dispatcher": cand.options.dispatcher,
            "ep_overlap": cand.options.ep_overlap,
            "cp_comm_type": cand.options.cp_comm_type,
            "tp_comm_overlap": cand.options.tp_comm_overlap and lay.tp > 1,
            "cuda_graphs": cand.options.cuda_graphs,
            "imbalance": cand.options.imbalance,
        },
        "memory": cand.memory.as_dict(),
        "time": time,
        "unmeasured": list(cand.unmeasured),
        "reasons": list(cand.reasons),
        "overrides": lines,
        "overrides_shell": to_shell(lines),
        "overrides_yaml": to_yaml(lines),
        "overrides_python": to_python_snippet(lines),
    }


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """A layout search: ``model`` (catalog id or ``config.json``), ``gpu`` type, ``gpus``, ``seq_length``
    and optional ``gbs`` (default 4M tokens per step, ``longpack.planner.search.DEFAULT_TOKENS_PER_STEP``),
    ``precision``, memory ``headroom``,
    ``dispatcher``, ``recompute`` (pinned modules), ``offload`` (allow optimizer CPU offload),
    ``optimizer``, routing ``imbalance``, pins ``tp`` / ``cp`` / ``pp`` / ``ep`` / ``mbs``, ``top`` (how
    many candidates to keep) and ``explore`` (also rank settings no calibration point constrains, labelled
    ``unmeasured``; off, the search chooses among measured settings). The catalog entries are loaded and
    checked on construction. The result carries the reference layout (published, else the seed's rules)
    and the pick's comparison with it.
    """

    command_help = "Rank every layout that fits by estimated step time and print Megatron-Bridge overrides."

    model: str | None = option(
        None, help=f"Model: a catalog id ({', '.join(list_models())}) or a config.json path."
    )
    gpu: str | None = option(None, help=f"GPU type ({', '.join(list_gpus())}).")
    gpus: int | None = gpus_option()
    seq_length: int | None = option(None, help="Sequence length (tokens per packed row).")
    gbs: int | None = option(
        None, help="Global batch size in sequences (default: 4M tokens per step, a power of two)."
    )
    precision: str = option(
        "bf16", help="Training precision (fp8: Hopper blockwise).", choices=choices.PRECISIONS
    )
    top: int = option(10, help="Show the best K layouts.")
    headroom: float = option(0.95, help="Fraction of usable GPU memory a layout may use.")
    dispatcher: str | None = option(
        None, help="MoE token dispatcher (default by GPU).", choices=choices.DISPATCHERS
    )
    recompute: str | None = option(None, help="Pin recompute modules, e.g. 'moe_act,layernorm' or 'full'.")
    offload: bool = option(True, help="Allow optimizer CPU offload.", negative="--no-offload")
    optimizer: str = option(
        "adam", help="adam_bf16_states: precision-aware Adam.", choices=choices.OPTIMIZERS
    )
    imbalance: float = option(1.0, help="Routing imbalance on the hot expert rank (1.0 = balanced).")
    tp: int | None = option(None, help="Pin TP.")
    cp: int | None = option(None, help="Pin CP.")
    pp: int | None = option(None, help="Pin PP.")
    ep: int | None = option(None, help="Pin EP.")
    mbs: int | None = option(None, help="Pin the micro-batch size.")
    #: A PNG of TFLOP/s and memory of the best layout vs sequence length, written by :meth:`run`.
    plot: str | Path | None = option(
        None, help="Write a PNG of TFLOP/s and memory vs sequence length.", cli_type=Path | None
    )
    explore: bool = option(
        False, help="Also rank settings no calibration point constrains (labelled unmeasured)."
    )
    data: str | Path | None = option(
        None,
        help=(
            "Plan from the data: a packed folder, or inputs (file, folder or glob; with --tokenizer) packed at "
            "--seq-length. Compares static CP, hybrid CP, the DP-balanced packing scheduler and dynamic CP on "
            "its packs for the best PP 1 layout."
        ),
        cli_type=str | None,
    )
    tokenizer: Any = tokenizer_option()
    max_seqlen_per_dp_cp_rank: int | None = option(
        None,
        help="With --data: the hybrid / DP-balanced / dynamic-CP cap to compare (default: pack / CP, half, quarter).",
    )
    #: Versions the rules check candidates for (as ``CheckConfig``'s; default: check's default).
    bridge_version: str | None = bridge_version_option()
    megatron_core_version: str | None = megatron_core_version_option()

    def __post_init__(self) -> None:
        from longpack.validate import flag, optional_positive_int, plain_fields, positive_int

        plain_fields(self)
        object.__setattr__(
            self,
            "max_seqlen_per_dp_cp_rank",
            optional_positive_int(self.max_seqlen_per_dp_cp_rank, "max_seqlen_per_dp_cp_rank"),
        )
        if self.data is not None and (
            not isinstance(self.data, str | os.PathLike) or not str(self.data).strip()
        ):
            raise ConfigError(
                f"data must be one path, folder or glob (a packed folder, a token store or inputs), got "
                f"{self.data!r}",
                fields="data",
            )
        if self.data is None and self.tokenizer is not None:
            raise ConfigError(
                "tokenizer is read with data (inputs tokenized for the plan); give data too, or drop tokenizer",
                fields=("tokenizer", "data"),
            )
        if self.max_seqlen_per_dp_cp_rank is not None and self.data is None:
            raise ConfigError(
                "max_seqlen_per_dp_cp_rank is compared on data: give data (a packed folder or inputs) too",
                fields=("max_seqlen_per_dp_cp_rank", "data"),
            )
        cap, width = self.max_seqlen_per_dp_cp_rank, self.seq_length
        if cap is not None and isinstance(width, int) and not isinstance(width, bool) and cap > width:
            # no sequence is longer than a row: a larger cap only sizes each rank for tokens it never holds
            raise ConfigError(
                f"max_seqlen_per_dp_cp_rank={cap} is above seq_length={width}: no sequence is longer than a "
                f"packed row, so a larger cap changes no schedule; use at most {width} (about seq_length / CP is "
                "what each rank's memory was sized for)",
                fields=("max_seqlen_per_dp_cp_rank", "seq_length"),
            )

        missing = [n for n in ("model", "gpu", "gpus", "seq_length") if getattr(self, n) is None]
        if missing:
            raise ConfigError(
                f"missing {', '.join(missing)}; e.g. longpack plan --model deepseek_v3 --gpu H100 --gpus 256 "
                "--seq-length 131072",
                fields=tuple(missing),
            )
        positive_int(self.top, "top")
        flag(self.explore, "explore")
        for name in ("model", "gpu", "precision", "optimizer", "dispatcher", "recompute"):
            value = getattr(self, name)
            if not isinstance(value, str) and (value is not None or name in ("model", "gpu", "precision")):
                raise ConfigError(f"{name} must be a name (a string), got {value!r}", fields=name)
        flag(self.offload, "offload")
        self.request  # noqa: B018 - the request is built (and checked) now, on construction

    def request_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the planner's ``SearchRequest`` (catalog entries loaded)."""
        from longpack.planner.catalog import load_gpu, load_model
        from longpack.planner.options import normalize_recompute
        from longpack.rules.versions import UpstreamVersions

        assert self.model is not None and self.gpu is not None  # required: checked on construction
        return {
            "model": load_model(self.model),
            "gpu": load_gpu(self.gpu),
            "num_gpus": self.gpus,
            "seq_length": self.seq_length,
            "gbs": self.gbs,
            "precision": self.precision.lower(),
            "headroom": self.headroom,
            "dispatcher": self.dispatcher,
            "recompute": normalize_recompute(self.recompute) if self.recompute is not None else None,
            "allow_offload": self.offload,
            "optimizer": self.optimizer,
            "imbalance": self.imbalance,
            "tp": self.tp,
            "cp": self.cp,
            "pp": self.pp,
            "ep": self.ep,
            "mbs": self.mbs,
            "explore": self.explore,
            "rule_versions": UpstreamVersions.resolve(
                bridge=self.bridge_version, mcore=self.megatron_core_version
            ),
        }

    def resolve(self) -> SearchRequest:
        """The planner's ``SearchRequest`` for these fields (a new object; no field is written)."""
        from longpack.planner.options import TrainingOptions
        from longpack.planner.search import SearchRequest

        req = SearchRequest(**self.request_kwargs())
        # Checks precision / optimizer / dispatcher names now, with the options' own messages.
        TrainingOptions(
            precision=req.precision, optimizer=self.optimizer, dispatcher=self.dispatcher or "alltoall"
        )
        return req

    @functools.cached_property
    def request(self) -> SearchRequest:
        """The planner's ``SearchRequest`` (:meth:`resolve`'s, built once, on construction)."""
        return self.resolve()

    def run(self) -> PlanResult:
        from longpack.planner.reference import recommend, reference_for
        from longpack.planner.search import search
        from longpack.planner.uncertainty import error_band

        if self.plot is not None:
            from longpack.outputs import check_output_file

            check_output_file(Path(self.plot), field="plot")  # before the search
        req = self.request
        found = search(req, top_k=self.top)
        reference = reference_for(req)
        comparison = None
        if reference is not None and found.candidates:
            band = error_band(req.model, req.gpu, req.seq_length)
            comparison = recommend(req, found, reference, band.width)
        result = PlanResult(request=req, search=found, reference=reference, comparison=comparison)
        # no layout fits at all: the plan says why (exit 1); there is no layout to compare the CP modes on
        if self.data is not None and found.candidates:
            from dataclasses import replace as _replace

            result = _replace(result, cp_modes=self._cp_modes(found))
        if self.plot is None:
            return result
        from dataclasses import replace

        from longpack.jobs.plots import plan_png

        assert self.seq_length is not None
        points = plan_png(self.request_kwargs(), self.seq_length, Path(self.plot))
        return replace(result, plot={"path": str(self.plot), "points": points})

    def _cp_modes(self, found: Any) -> Any:
        """The CP modes on the data's packs for the best layout without pipeline parallelism (hybrid CP
        refuses PP), searched again with ``pp=1`` pinned when the ranking holds none."""
        from longpack.jobs.plan_data import corpus_packs
        from longpack.planner.cp_modes import plan_cp_modes
        from longpack.planner.search import SearchRequest, search

        assert self.model is not None and self.gpu is not None and self.gpus is not None
        assert self.seq_length is not None and self.data is not None
        pick = next((c for c in found.candidates if c.plan.layout.pp == 1), None)
        if pick is None:
            again = search(SearchRequest(**{**self.request_kwargs(), "pp": 1}), top_k=1)
            pick = again.candidates[0] if again.candidates else None
        if pick is None:  # the plan above stands; the comparison says why it is absent
            return CPModesOfData(
                layout=None,
                source=None,
                samples=0,
                plan=None,
                not_compared=(
                    "no layout without pipeline parallelism fits, and hybrid CP and the DP-balanced scheduler "
                    "refuse PP; compare the CP modes with more GPUs"
                ),
            )
        layout = pick.plan.layout
        data = str(self.data)
        specs = sorted(glob.glob(data)) if glob.has_magic(data) else [data]
        if not specs:
            raise InputError(
                f"data {data!r} matched no file or folder; check the pattern (quote it in the shell)",
                fields="data",
            )
        corpus = corpus_packs(
            specs,
            seq_length=self.seq_length,
            pad_seq_to_mult=layout.pad_seq_to_mult,
            tokenizer=self.tokenizer,
        )
        plan = plan_cp_modes(
            corpus.packs,
            model=self.model,
            gpu=self.gpu,
            gpus=self.gpus,
            tp=layout.tp,
            cp=layout.cp,
            gbs=self.request.global_batch,
            pack_size=self.seq_length,
            precision=self.precision.lower(),
            caps=None if self.max_seqlen_per_dp_cp_rank is None else [self.max_seqlen_per_dp_cp_rank],
        )
        return CPModesOfData(
            layout=pick.plan.label,
            source=corpus.source,
            samples=corpus.samples,
            dropped=corpus.dropped,
            plan=plan,
            check=mode_check(pick, self.request, plan, gpus=self.gpus),
        )


@dataclass(frozen=True, kw_only=True)
class ModeCheck:
    """``longpack check`` run on the recommended mode's overrides (the layout's plus the mode's keys), in
    the same run as the plan: the command to rerun it, and what it found."""

    overrides: tuple[str, ...]
    command: str
    findings: tuple[dict[str, Any], ...]
    #: Set when the user's Megatron-Bridge / Megatron-Core lacks the mode's keys (``LP-VER-001``): what it
    #: lacks; ``command`` and ``findings`` are then for the newest versions, which have them.
    versions_note: str = ""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [f for f in self.findings if f["severity"] == "error"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "overrides": list(self.overrides),
            "command": self.command,
            "findings": list(self.findings),
            "ok": not self.errors,
            **({"versions_note": self.versions_note} if self.versions_note else {}),
        }


def mode_check(pick: Any, req: Any, plan: Any, *, gpus: int) -> ModeCheck | None:
    """The Megatron-Bridge overrides of a recommended hybrid-CP / DP-balanced mode on the planner's layout,
    checked by ``longpack check`` (the ``LP-HCP`` / ``LP-SCHED`` rules with every other) for the rule
    versions the plan ran with; ``None`` when static CP is recommended (nothing to add to the layout).
    ``command`` is the check command line that gives the same findings (versions pinned: the default
    follows the installed packages). Where the user's versions lack the mode's keys (``LP-VER-001`` on
    them), the check is run again for the versions those keys call for (``check``'s key evidence,
    ``longpack.rules.versions.key_evidence``) and ``versions_note`` says what the user's versions lack."""
    import shlex

    from longpack.jobs.check import CheckConfig
    from longpack.planner.cp_modes import mode_overrides

    if plan.recommended == "static":
        return None
    merged: dict[str, str] = {}  # by key: the mode's setting wins over the layout's (one line per key)
    for line in [
        *candidate_overrides(pick, req),
        *mode_overrides(plan.recommended, plan.recommended_cap)["bridge"],
    ]:
        merged[line.split("=", 1)[0]] = line
    lines = list(merged.values())
    versions = req.rule_versions
    bridge, mcore = (None, None) if versions is None else (versions.bridge, versions.mcore)
    result = CheckConfig(
        overrides=tuple(lines), gpus=gpus, bridge_version=bridge, megatron_core_version=mcore
    ).run()
    mode_keys = {
        line.split("=", 1)[0] for line in mode_overrides(plan.recommended, plan.recommended_cap)["bridge"]
    }
    lacking = [f for f in result.findings if f.rule_id == "LP-VER-001" and set(f.keys) & mode_keys]
    note = ""
    if lacking:
        note = (
            "the versions checked for lack this mode's keys ("
            + "; ".join(f.message for f in lacking)
            + "): checked again for the versions the mode's keys call for"
        )
        from longpack.rules.checks.upstream import KEYS_BY_VERSION
        from longpack.rules.versions import BRIDGE, MCORE, key_evidence

        evidence = key_evidence(mode_keys, KEYS_BY_VERSION)
        if evidence[BRIDGE].keys:
            bridge = evidence[BRIDGE].pick()[0]
        if evidence[MCORE].keys:
            mcore = evidence[MCORE].pick()[0]
        result = CheckConfig(
            overrides=tuple(lines), gpus=gpus, bridge_version=bridge, megatron_core_version=mcore
        ).run()
    pinned = "".join(
        f" {flag} {shlex.quote(v)}"
        for flag, v in (("--bridge-version", bridge), ("--megatron-core-version", mcore))
        if v is not None
    )
    command = f"longpack check --gpus {gpus}{pinned} " + " ".join(shlex.quote(x) for x in lines)
    return ModeCheck(
        overrides=tuple(lines),
        command=command,
        findings=tuple(f.to_dict() for f in result.findings),
        versions_note=note,
    )


@dataclass(frozen=True, kw_only=True)
class CPModesOfData:
    """``plan --data``: the layout the CP modes were compared on, where the packs came from, the comparison."""

    layout: str | None
    source: str | None
    samples: int
    plan: Any
    #: Samples of the data left out of its packs (longer than the plan's seq_length, or empty).
    dropped: int = 0
    #: ``longpack check`` on the recommended mode's overrides (``None`` when static CP is recommended).
    check: ModeCheck | None = None
    #: Why no comparison was made (``plan`` is then ``None``), e.g. every fitting layout needs PP.
    not_compared: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.plan is None:
            return {"layout": None, "not_compared": self.not_compared}
        plan = self.plan.to_dict()
        return {
            "layout": self.layout,
            "sizes": plan.pop("layout"),
            "data": self.source,
            "samples": self.samples,
            "samples_dropped": self.dropped,
            **plan,
            "check": None if self.check is None else self.check.to_dict(),
        }


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """The planner's answer: ``request`` (``SearchRequest``) and ``search`` (``SearchResult``: ranked
    ``candidates``, ``layouts_considered``, ``layouts_feasible``, ``rejected`` counts by reason)."""

    request: SearchRequest
    search: SearchResult
    reference: Reference | None = None
    comparison: Comparison | None = None
    #: ``{"path", "points"}`` when ``PlanConfig.plot`` wrote a figure (best layout per sequence length).
    plot: dict[str, Any] | None = None
    #: ``plan --data``: static CP, hybrid CP and the DP-balanced scheduler on the data (``CPModesOfData``).
    cp_modes: CPModesOfData | None = None

    @property
    def candidates(self) -> list[Any]:
        return list(self.search.candidates)

    @property
    def recommended(self) -> Any:
        """The layout to run: the pick when it beats the reference within measured territory (or with
        ``explore``), else the reference's; the fastest ranked layout when there is no reference."""
        cmp_ = self.comparison
        if cmp_ is not None and cmp_.pick is not None:
            return cmp_.pick
        if self.reference is not None and cmp_ is not None and self.reference.fits:
            return self.reference.candidate
        return self.search.candidates[0] if self.search.candidates else None

    @property
    def exit_code(self) -> int:
        """1 when no layout fits."""
        return 0 if self.ok else 1

    @property
    def ok(self) -> bool:
        """Whether at least one layout fits (``longpack plan`` exits 1 otherwise)."""
        return bool(self.search.candidates)

    def to_dict(self) -> dict[str, Any]:
        """What ``longpack plan --json`` prints."""
        req, result = self.request, self.search
        rule = result.rule_of_thumb
        doc: dict[str, Any] = {
            "request": {
                "model": req.model.name,
                "gpu": req.gpu.name,
                "gpus": req.num_gpus,
                "seq_length": req.seq_length,
                "gbs": req.global_batch,
                "gbs_default": req.gbs_is_default,
                "tokens_per_step": req.global_batch * req.seq_length,
                "precision": req.precision,
                "memory_budget_gib": round(req.memory_budget_gib, 3),
                "memory_band": round(req.memory_margin, 4),
            },
            "notes": plan_notes(req),
            "layouts_considered": result.layouts_considered,
            "layouts_feasible": result.layouts_feasible,
            "rejected": result.rejected,
            "why_nothing_fits": [] if result.candidates else rejection_lines(result),
            "rule_of_thumb": None
            if rule is None
            else {
                "cp": rule.cp,
                "layout": rule.candidate.plan.label if rule.candidate is not None else None,
                "step_time": round(rule.candidate.time.step_time, 6) if rule.candidate is not None else None,
                "memory_gib": round(rule.candidate.memory.total_gib, 3)
                if rule.candidate is not None
                else None,
                "slower": round(rule.slower, 6) if rule.slower is not None else None,
                "why_not": list(rule.why_not),
            },
            "candidates": [candidate_dict(c, req) for c in result.candidates],
            "reference": reference_dict(self.reference, self.comparison, req),
            "recommended": None if self.recommended is None else candidate_dict(self.recommended, req),
        }
        if self.plot is not None:
            doc["plot"] = self.plot
        if self.cp_modes is not None:
            doc["cp_modes"] = self.cp_modes.to_dict()
        return doc


def cp_mode_lines(cp_modes: Any) -> list[str]:
    """``plan --data``'s text: a line per cap and mode, then the recommendation with its reason."""
    from longpack.planner.cp_modes import bridge_note

    d = cp_modes.to_dict()
    if d.get("not_compared"):
        return [f"CP modes not compared: {d['not_compared']}"]
    dropped = (
        f", {d['samples_dropped']} of them dropped as longer than the sequence length"
        if d["samples_dropped"]
        else ""
    )
    lines = [
        f"CP modes on the data ({d['samples']} sample{'' if d['samples'] == 1 else 's'} from {d['data']}{dropped}; "
        f"{d['steps_simulated']} of {d['steps_total']} step{'' if d['steps_total'] == 1 else 's'} simulated) for "
        f"{d['layout']}:"
    ]
    band = d["recommended"]["error_band"]
    # (mode, Megatron's refusal) -> the caps it is refused at: one line per distinct reason
    why_infeasible: dict[tuple[str, str], list[str]] = {}
    for c in d["comparisons"]:
        for mode, why in c.get("infeasible", {}).items():
            why_infeasible.setdefault((mode, why), []).append(str(c["max_seqlen_per_dp_cp_rank"]))
        cells = []
        for mode, t in c["step_time_s"].items():
            imbalance = c["rank_imbalance"][mode]
            cells.append(
                f"{mode} "
                + (
                    "infeasible"
                    if t is None
                    else f"{t:.3f} s ± {100 * band:.0f} % (rank imbalance {imbalance:.2f})"
                )
            )
        lines.append(f"  max_seqlen_per_dp_cp_rank {c['max_seqlen_per_dp_cp_rank']}: " + ", ".join(cells))
    for (mode, why), caps in why_infeasible.items():
        lines.append(f"  {mode} infeasible at max_seqlen_per_dp_cp_rank {', '.join(caps)}: {why}")
    rec = d["recommended"]
    lines.append(f"Recommended: {rec['mode']} — {rec['reason']}")
    for what, items in rec["overrides"].items():
        if items:
            lines.append(f"  {what}: {' '.join(items)}")
    for item in rec["constraints"]:
        lines.append(f"  needs: {item}")
    check = d["check"]
    if check is not None:
        lines.append("  Megatron-Bridge overrides for the layout with this mode, checked by longpack check:")
        lines.append(f"    {' '.join(check['overrides'])}")
        if check.get("versions_note"):
            lines.append(f"    note: {check['versions_note']}")
        for f in check["findings"]:
            lines.append(f"    {f['id']} ({f['severity']}): {f['message']}; fix: {f['fix']}")
        lines.append(f"    rerun: {check['command']}")
    note = bridge_note(rec["mode"], rec["max_seqlen_per_dp_cp_rank"])
    if note is not None:
        lines.append(f"  {note}")
    for item in d["not_modelled"]:
        lines.append(f"  not modelled: {item}")
    return lines


def step_band(req: Any) -> float:
    """The relative 80 % error band of the request's step-time estimates (``longpack.planner.uncertainty``)."""
    from longpack.planner.uncertainty import error_band

    return error_band(req.model, req.gpu, req.seq_length).width


def format_band(width: float) -> str:
    """``"± 9 %"`` (see ``longpack.planner.uncertainty.format_band``)."""
    from longpack.planner import uncertainty

    return uncertainty.format_band(width)


def format_with_band(seconds: float, width: float) -> str:
    """``"0.84 s ± 9 %"`` (see ``longpack.planner.uncertainty.format_with_band``)."""
    from longpack.planner import uncertainty

    return uncertainty.format_with_band(seconds, width)


def _level(req: Any) -> Any:
    from longpack.planner.level import level_for

    return level_for(req.model.name, req.gpu.name, seq_length=req.seq_length, precision=req.precision)


def _level_dict(req: Any, cand: Any) -> dict[str, Any] | None:
    """The published run of the same model and GPU the estimate could be anchored on (``applied``: false,
    the step times are the model's), and the reference's step time anchored on it."""
    level = _level(req)
    if level is None:
        return None
    return {
        **level.as_dict(),
        "applied": False,
        "anchored_step_time": round(level.apply(cand.time.step_time), 6),
    }


def reference_dict(reference: Any, comparison: Any, req: Any) -> dict[str, Any] | None:
    """The ``reference`` of ``longpack plan --json``: ``layout`` (as a candidate's), ``source``, ``kind``
    (``published`` / ``seed rules``), ``estimate`` (step time with its error band, TFLOP/s/GPU, memory,
    fits), ``notes`` and ``comparison`` with the pick (``changes``, ``predicted_gain``, ``error_band``,
    ``outside_band``, ``verdict``: ``pick`` or ``reference``, ``why``)."""
    if reference is None:
        return None
    cand = candidate_dict(reference.candidate, req)
    time = cand["time"]
    return {
        "kind": reference.kind,
        "source": reference.source,
        "layout": cand["layout"],
        "options": cand["options"],
        "estimate": {
            "step_time": time["step_time"],
            "error_band": time["error_band"],
            "tflops_per_gpu": time["tflops_per_gpu"],
            "memory_gib": cand["memory"]["total_gib"],
            "fits": reference.fits,
        },
        "unmeasured": list(reference.candidate.unmeasured),
        "notes": list(reference.notes),
        "level": _level_dict(req, reference.candidate),
        "overrides": cand["overrides"],
        "comparison": None
        if comparison is None
        else {
            "changes": list(comparison.changes),
            "predicted_gain": round(comparison.gain, 4),
            "error_band": round(comparison.band, 4),
            "outside_band": comparison.outside_band,
            "verdict": comparison.verdict,
            "why": comparison.why,
            "pick": None if comparison.pick is None else comparison.pick.plan.label,
            "exploratory": None
            if comparison.exploratory is None
            else {
                "layout": comparison.exploratory.plan.label,
                "predicted_gain": round(comparison.exploratory_gain or 0.0, 4),
                "unmeasured": list(comparison.exploratory_unmeasured),
            },
        },
        "rank": None if comparison is None else comparison.reference_rank,
        "ranked_of": None if comparison is None else comparison.ranked_of,
    }


def reference_lines(result: PlanResult) -> list[str]:
    """The reference and the verdict as ``longpack plan`` prints them under the table."""
    from longpack.planner.search import versus
    from longpack.planner.uncertainty import error_band, format_band, format_with_band

    ref, cmp_ = result.reference, result.comparison
    if ref is None:
        return ["Reference: none (no published layout and no layout by the seed's rules fits)"]
    req = result.request
    band = error_band(req.model, req.gpu, req.seq_length)
    c = ref.candidate
    fits = (
        ""
        if ref.fits
        else f"; does NOT fit with the memory band: {versus(c.memory.total_gib, req.fit_budget_gib)} allowed"
    )
    lines = [
        f"Reference ({ref.kind}): {c.plan.label}, recompute {','.join(c.options.recompute) or 'none'}, "
        f"{format_with_band(c.time.step_time, band.width)} per step, {c.time.tflops_per_gpu:.0f} TFLOP/s/GPU, "
        f"{c.memory.total_gib:.1f} GiB{fits}",
        f"  source: {ref.source}",
    ]
    lines += [f"  note: {n}" for n in ref.notes]
    if c.unmeasured:
        lines.append(f"  unmeasured: {'; '.join(c.unmeasured)}")
    if cmp_ is not None:
        if cmp_.reference_rank is not None:
            lines.insert(
                1,
                f"  ranks {cmp_.reference_rank:,} of {cmp_.ranked_of:,} feasible layouts by predicted step time",
            )
        if cmp_.pick is not None:
            p = cmp_.pick
            lines.append(
                f"Pick: {p.plan.label}, {format_with_band(p.time.step_time, band.width)} per step, "
                f"{p.time.tflops_per_gpu:.0f} TFLOP/s/GPU, {p.memory.total_gib:.1f} GiB"
            )
            if cmp_.changes:
                lines.append(f"  the pick changes: {', '.join(cmp_.changes)}")
        verdict = f"the pick {cmp_.pick.plan.label}" if cmp_.pick is not None else "the reference"
        lines.append(f"Recommended: {verdict} ({cmp_.why})")
        if cmp_.exploratory is not None:
            e = cmp_.exploratory
            lines.append(
                f"Exploratory (not recommended): {e.plan.label}, {format_with_band(e.time.step_time, band.width)} "
                f"per step, predicted {cmp_.exploratory_gain:+.0%} vs the reference"
            )
            for what in cmp_.exploratory_unmeasured:
                lines.append(f"  unmeasured: {what}")
            if not cmp_.exploratory_unmeasured:
                lines.append(f"  its gain is inside the {format_band(band.width)} band")
    lines.append(f"  error band: {band.describe()}")
    level = _level(req)
    if level is not None:
        rec = result.recommended if result.recommended is not None else c
        lines.append(
            f"  level: published run {level.describe()}; anchored on it the recommended layout takes "
            f"{level.apply(rec.time.step_time):.2f} s per step. Not applied (the table is the model's): "
            "anchoring on another publication's run raised the leave-one-source-out error"
        )
    return lines


def plan_notes(req: Any) -> list[str]:
    """What the request assumed without being told (the default GBS, balanced routing).

    >>> cfg = PlanConfig(model="llama3_1_8b", gpu="H100", gpus=8, seq_length=131072)
    >>> plan_notes(cfg.request)[0]
    'GBS 32 sequences = 4,194,304 tokens per step: the default of 4M tokens per step (no --gbs given)'
    """
    out = []
    if req.gbs_is_default:
        out.append(
            f"GBS {req.global_batch} sequences = {req.global_batch * req.seq_length:,} tokens per step: "
            "the default of 4M tokens per step (no --gbs given)"
        )
    return out


def rejection_lines(result: Any) -> list[str]:
    """Why no layout fits, one line per group of rejected layouts (largest group first).

    >>> from longpack.planner.search import SearchResult
    >>> r = SearchResult(request=None, candidates=(), layouts_considered=3, layouts_feasible=0,
    ...                  rejected={"does not fit even with full recompute and offload": 3})
    >>> rejection_lines(r)
    ['3 layouts: does not fit even with full recompute and offload']
    """
    lines = []
    for reason, count in sorted(result.rejected.items(), key=lambda kv: (-kv[1], kv[0])):
        what = "choices" if reason.startswith("not enumerated") else "layouts"
        lines.append(f"{count} {what if count != 1 else what[:-1]}: {reason}")
    if not lines:
        lines.append(
            f"no layout could be built for {result.layouts_considered} candidates; check the pinned sizes"
        )
    return lines


@dataclass(frozen=True, kw_only=True)
class EstimateConfig:
    """Memory and time of one given ``layout`` (``"tp=1,cp=32,ep=32,pp=8,vpp=4,mbs=1"``) of ``model`` on
    ``gpus`` GPUs of type ``gpu`` (``longpack plan estimate``).

    >>> r = EstimateConfig(model="llama3_1_8b", gpu="H100_SXM", gpus=8, seq_length=8192, layout="tp=2").run()
    >>> r.to_dict()["fits"], r.candidate.plan.label.startswith("TP2")
    (True, True)
    """

    command_help = "Memory and time of one given layout."

    model: str = option(help="Model: a catalog id or a config.json path.", cli_type=str)
    gpu: str = option(help="GPU type.", cli_type=str)
    gpus: int = gpus_option(required=True)
    seq_length: int = option(help="Sequence length (tokens per packed row).", cli_type=int)
    layout: str = option(help="e.g. 'tp=1,cp=32,ep=32,pp=8,vpp=4,mbs=1'", cli_type=str)
    gbs: int | None = option(None, help="Global batch size in sequences.")
    precision: str = option("bf16", help="Training precision.", choices=choices.PRECISIONS)
    recompute: str = option("", help="e.g. 'mla_up_proj,layernorm,moe,mlp' or 'full'.")
    offload: float = option(0.0, help="Optimizer CPU offload fraction 0..1.")
    dispatcher: str | None = option(
        None, help="MoE token dispatcher (default by GPU).", choices=choices.DISPATCHERS
    )
    optimizer: str = option("adam", help="Optimizer.", choices=choices.OPTIMIZERS)
    cp_comm_type: str = option(
        "auto",
        help="CP communication (auto: the fastest one a calibration point measured, as plan picks).",
        choices=choices.CP_COMM_TYPES,
    )
    tp_comm_overlap: bool = option(
        True, help="TP communication overlapped with GEMMs.", negative="--no-tp-comm-overlap"
    )
    ep_overlap: bool | None = option(None, help="Default: on where allowed.", negative="--no-ep-overlap")
    imbalance: float = option(1.0, help="Routing imbalance on the hot expert rank.")
    headroom: float = option(0.95, help="Fraction of usable GPU memory a layout may use.")

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        from longpack.option import check_choices

        check_choices(self)

    def run(self) -> EstimateResult:
        from longpack.planner.catalog import load_gpu, load_model
        from longpack.planner.evidence import measured_cp_comm_types
        from longpack.planner.options import TrainingOptions, normalize_recompute
        from longpack.planner.search import SearchRequest, default_dispatcher, evaluate_layout
        from longpack.planner.timing import best_cp_comm_type

        m, g = load_model(self.model), load_gpu(self.gpu)
        plan_layout, _ = parse_layout(self.layout, world_size=self.gpus)
        req = SearchRequest(
            model=m,
            gpu=g,
            num_gpus=self.gpus,
            seq_length=self.seq_length,
            gbs=self.gbs,
            precision=self.precision.lower(),
            headroom=self.headroom,
        )
        rec = normalize_recompute(self.recompute)
        lay = plan_layout.layout
        overlap_ok = (
            m.moe is not None
            and lay.ep > 1
            and (lay.pp == 1 or plan_layout.vpp > 1)
            and "moe" not in rec
            and rec != ("full",)
        )
        opts = TrainingOptions(
            precision=self.precision.lower(),
            recompute=rec,
            optimizer_offload=self.offload,
            dispatcher=self.dispatcher or default_dispatcher(g, lay.ep * lay.expert_tp),
            optimizer=self.optimizer,
            ep_overlap=overlap_ok if self.ep_overlap is None else self.ep_overlap,
            cp_comm_type=best_cp_comm_type(
                m, g, plan_layout, seq_length=self.seq_length, among=tuple(sorted(measured_cp_comm_types()))
            )
            if self.cp_comm_type == "auto"
            else self.cp_comm_type,
            imbalance=self.imbalance,
            tp_comm_overlap=self.tp_comm_overlap and lay.tp > 1,
        )
        cand = evaluate_layout(req, plan_layout, opts)
        doc = candidate_dict(cand, req)
        doc["fits"] = cand.memory.total_gib <= req.fit_budget_gib
        doc["memory_budget_gib"] = round(req.memory_budget_gib, 3)
        return EstimateResult(request=req, candidate=cand, doc=doc)


@dataclass(frozen=True, kw_only=True)
class EstimateResult:
    """The planner's ``SearchRequest``, the evaluated ``Candidate`` and its account (``to_dict()``: memory
    and time terms, ``fits``, the Megatron-Bridge overrides)."""

    request: SearchRequest
    candidate: PlannerCandidate
    doc: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.doc
