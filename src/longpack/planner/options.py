"""Training options the planner varies besides the parallel sizes, and the pipeline stage layout.

>>> opts = TrainingOptions(precision="fp8", recompute=("up_proj", "norm"))
>>> opts.recompute
('layernorm', 'mla_up_proj')
>>> stage_layer_counts(61, pp=8, vpp=4, first_extra=0.0, last_extra=1.6)
(1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from longpack import choices
from longpack.errors import PlanError as _PlanError
from longpack.topology import ParallelLayout

PRECISIONS = choices.PRECISIONS
DISPATCHERS = choices.DISPATCHERS
OPTIMIZERS = choices.OPTIMIZERS
RECOMPUTE_MODULES = (
    "core_attn",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "moe_act",
    "shared_experts",
    "gdn_norm_out",
)
# User-facing aliases (Megatron-Bridge docs and recipes use both spellings).
_RECOMPUTE_ALIASES = {"norm": "layernorm", "up_proj": "mla_up_proj", "attn": "core_attn"}
CP_COMM_TYPES = choices.CP_COMM_TYPES
CUDA_GRAPH_MODES = ("none", "partial", "full")


#: An option or layout the planner cannot evaluate: ``longpack.errors.PlanError`` (one class per name).
PlanError = _PlanError


def normalize_recompute(modules: tuple[str, ...] | list[str] | str | None) -> tuple[str, ...]:
    """Canonical, sorted recompute module names; ``"full"`` stands alone.

    >>> normalize_recompute("moe_act,norm"), normalize_recompute(["full"]), normalize_recompute(None)
    (('layernorm', 'moe_act'), ('full',), ())
    """
    if modules is None:
        return ()
    if isinstance(modules, str):
        modules = [m for m in modules.replace(" ", "").split(",") if m]
    out: set[str] = set()
    for raw in modules:
        name = _RECOMPUTE_ALIASES.get(raw.strip().lower(), raw.strip().lower())
        if name in ("", "none"):
            continue
        if name != "full" and name not in RECOMPUTE_MODULES:
            raise PlanError(
                f"recompute module {raw!r} is unknown; use 'full' or some of {', '.join(RECOMPUTE_MODULES)} "
                "(aliases: norm, up_proj)"
            )
        out.add(name)
    if "full" in out and len(out) > 1:
        raise PlanError(f"recompute 'full' cannot be combined with modules {sorted(out - {'full'})}")
    return tuple(sorted(out))


@dataclass(frozen=True, kw_only=True)
class TrainingOptions:
    """Everything besides the parallel sizes that changes memory or time.

    ``optimizer_offload`` is the fraction φ of optimizer state moved to the host (needs the distributed
    optimizer). ``imbalance`` multiplies routed-expert activations and A2A volume on the hot rank (1.0 =
    force-balanced benchmarks). ``cuda_graphs`` is ``"none"``, ``"partial"`` (TE-scoped) or ``"full"``.
    ``tp_comm_overlap``: TP all-gathers / reduce-scatters overlapped with the GEMMs (userbuffers);
    ``fp8_attention``: the fused-attention kernels run in FP8 (only with an FP8 recipe).
    """

    precision: str = "bf16"
    recompute: tuple[str, ...] = ()
    optimizer_offload: float = 0.0
    dispatcher: str = "alltoall"
    optimizer: str = "adam"
    main_grads_fp32: bool = False
    distributed_optimizer: bool = True
    ep_overlap: bool = False
    cp_comm_type: str = "p2p"
    cuda_graphs: str = "none"
    imbalance: float = 1.0
    fused_cross_entropy: bool = True
    fsdp: bool = False
    tp_comm_overlap: bool = True
    fp8_attention: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        precision = self.precision.lower()
        if precision not in PRECISIONS:
            raise PlanError(f"precision {self.precision!r} is unknown; use one of {', '.join(PRECISIONS)}")
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "recompute", normalize_recompute(self.recompute))
        if not 0.0 <= self.optimizer_offload <= 1.0:
            raise PlanError(f"optimizer_offload must be a fraction in [0, 1], got {self.optimizer_offload!r}")
        if self.optimizer_offload > 0 and not self.distributed_optimizer:
            raise PlanError("optimizer_offload needs the distributed optimizer (distributed_optimizer=True)")
        if self.dispatcher not in DISPATCHERS:
            raise PlanError(f"dispatcher {self.dispatcher!r} is unknown; use one of {', '.join(DISPATCHERS)}")
        if self.optimizer not in OPTIMIZERS:
            raise PlanError(f"optimizer {self.optimizer!r} is unknown; use one of {', '.join(OPTIMIZERS)}")
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise PlanError(
                f"cp_comm_type {self.cp_comm_type!r} is unknown; use one of {', '.join(CP_COMM_TYPES)}"
            )
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise PlanError(f"cuda_graphs must be 'none', 'partial' or 'full', got {self.cuda_graphs!r}")
        if (
            not (isinstance(self.imbalance, int | float) and math.isfinite(self.imbalance))
            or self.imbalance < 1.0
        ):
            raise PlanError(
                f"imbalance must be a finite number >= 1.0 (1.0 = perfectly balanced routing), got {self.imbalance}",
                fields="imbalance",
            )
        if self.fp8_attention and self.precision == "bf16":
            raise PlanError("fp8_attention needs an FP8 recipe (precision fp8, mxfp8 or nvfp4), not bf16")

    @property
    def full_recompute(self) -> bool:
        """Whether whole layers are recomputed."""
        return self.recompute == ("full",)

    def recomputes(self, module: str) -> bool:
        """Whether ``module`` is recomputed (full recompute counts as every module)."""
        return self.full_recompute or module in self.recompute


@dataclass(frozen=True, kw_only=True)
class PlanLayout:
    """A parallel layout plus micro-batch size: what the search enumerates.

    >>> PlanLayout(layout=ParallelLayout(world_size=64, tp=1, cp=4, ep=8, pp=2), mbs=1).label
    'TP1 CP4 EP8 ETP1 PP2 DP8 EDP4 MBS1'
    >>> PlanLayout(layout=ParallelLayout(world_size=16, tp=2, sp=True), dense=True).label
    'TP2 CP1 PP1 DP8 MBS1'

    ``dense``: the model has no experts, so the label (and every text) leaves EP / ETP / EDP out.
    """

    layout: ParallelLayout
    mbs: int = 1
    dense: bool = False

    @property
    def vpp(self) -> int:
        """Virtual stages per pipeline rank (1 without interleaving)."""
        return self.layout.vpp or 1

    @property
    def label(self) -> str:
        """Compact human label."""
        lay = self.layout
        vpp = f" VPP{lay.vpp}" if lay.vpp and lay.vpp > 1 else ""
        if self.dense:
            return f"TP{lay.tp} CP{lay.cp} PP{lay.pp}{vpp} DP{lay.dp} MBS{self.mbs}"
        return (
            f"TP{lay.tp} CP{lay.cp} EP{lay.ep} ETP{lay.expert_tp} PP{lay.pp}{vpp} DP{lay.dp} "
            f"EDP{lay.edp} MBS{self.mbs}"
        )


def stage_layer_counts(
    num_layers: int, *, pp: int, vpp: int = 1, first_extra: float = 0.0, last_extra: float = 0.0
) -> tuple[int, ...]:
    """Decoder layers per virtual pipeline stage (``pp·vpp`` stages, chunk-major order).

    Balances ``layers + extra`` per stage, where the first stage also carries the embedding and the
    last the output layer, loss and MTP (``*_extra`` in layer-equivalents) — what Megatron's custom
    ``pipeline_model_parallel_layout`` is for. Water-filling: the smallest level ``T`` with
    ``Σ max(0, floor(T − extraᵢ)) ≥ L``; leftovers go to the middle stages.

    >>> stage_layer_counts(8, pp=4), stage_layer_counts(10, pp=4, last_extra=1.0)
    ((2, 2, 2, 2), (2, 3, 3, 2))
    """
    stages = pp * vpp
    if stages > num_layers + 2 and stages > 1:  # embedding and loss may take a stage each
        raise PlanError(f"{stages} pipeline stages (pp*vpp) exceed {num_layers} layers")
    extras = [0.0] * stages
    extras[0] += first_extra
    extras[-1] += last_extra
    lo, hi = 0.0, float(num_layers) + max(extras) + 1
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(max(0, math.floor(mid - e + 1e-9)) for e in extras) >= num_layers:
            hi = mid
        else:
            lo = mid
    counts = [max(0, math.floor(hi - e + 1e-9)) for e in extras]
    surplus = sum(counts) - num_layers
    # remove surplus from the stages with the most load first, preferring the pipeline edges' neighbours
    order = sorted(range(stages), key=lambda i: (-(counts[i] + extras[i]), i))
    idx = 0
    while surplus > 0:
        i = order[idx % stages]
        if counts[i] > 0:
            counts[i] -= 1
            surplus -= 1
        idx += 1
    return tuple(counts)


def layout_string(counts: tuple[int, ...], *, mtp_layers: int = 0) -> str:
    """Megatron ``pipeline_model_parallel_layout`` for per-stage layer counts (``E`` embedding,
    ``t`` layer, ``m`` MTP, ``L`` loss, ``|`` stage boundary, ``(...)*n`` repetition, as in the
    DeepSeek-V3 recipes' ``"Et|(tt|)*30mL"``).

    >>> layout_string((1, 2, 2, 0), mtp_layers=1)
    'Et|tt|tt|mL'
    >>> layout_string((1,) + (2,) * 30 + (0,), mtp_layers=1)
    'Et|(tt|)*30mL'
    """
    parts = []
    for i, n in enumerate(counts):
        body = "t" * n if n <= 4 else f"t*{n}"
        if i == 0:
            body = "E" + body
        if i == len(counts) - 1:
            body = body + "m" * mtp_layers + "L"
        parts.append(body)
    out = parts[0]
    i = 1
    while i < len(parts):
        j = i
        while j < len(parts) - 1 and parts[j] == parts[i]:
            j += 1
        run = j - i
        if run >= 3 and i < len(parts) - 1:
            out += f"|({parts[i]}|)*{run}" + parts[j]
            i = j + 1
        else:
            out += "|" + parts[i]
            i += 1
    return out
