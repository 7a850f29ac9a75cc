"""Cost models and targets for ``longpack.balance``, built from the planner's catalogs and time model.

The planner knows models, GPUs and how fast a GPU runs a model; the balanced packer only needs a
``PackCostModel`` and a ``BalanceTarget``. This module turns the first into the second (planner ->
balance; ``longpack.balance`` never imports the planner):

* ``pack_cost_model(model=..., gpu=..., precision=..., tp=..., cp=...)``: seconds per pack.
* ``parse_balance_spec("dp=8,pp=4,gbs=128,model=M,gpu=G")``: the ``longpack pack --balance`` text as a
  ``BalanceTarget`` (the text is kept on ``BalanceTarget.spec`` for the manifest).

>>> t = parse_balance_spec("dp=2,gbs=4,linear=1.0,quadratic=0.001")
>>> t.dp, t.pp, t.gbs, t.cost_model.quadratic, t.spec
(2, 1, 4, 0.001, 'dp=2,gbs=4,linear=1.0,quadratic=0.001')
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from longpack import choices
from longpack.balance.cost import PackCostModel
from longpack.balance.target import BalanceTarget
from longpack.choices import BALANCE_PRECISIONS
from longpack.errors import ConfigError
from longpack.topology import align_up

__all__ = [
    "DEFAULT_COST_SEQ_LENGTH",
    "MIN_COST_SEQ_LENGTH",
    "microbatch_seconds",
    "pack_cost_model",
    "parse_balance_spec",
]

_INT_KEYS = ("dp", "pp", "vpp", "gbs", "mbs", "tp", "cp", "seq_length")
_FLOAT_KEYS = ("linear", "quadratic", "per_sequence", "per_pack")
_STR_KEYS = ("model", "gpu", "precision", "schedule", "sampler")


#: Row width (pack length) the cost model assumes when the balance spec gives none.
DEFAULT_COST_SEQ_LENGTH = 8192
#: The shortest row width the cost model takes: its attention fit samples sequence lengths from this one
#: up to the row width.
MIN_COST_SEQ_LENGTH = 16


def _cost_width(value: object, name: str, fields: str | tuple[str, ...]) -> int:
    """``value`` as a row width for the cost model, or a ``ConfigError`` naming ``name`` and the minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < MIN_COST_SEQ_LENGTH:
        raise ConfigError(
            f"{name} must be an integer >= {MIN_COST_SEQ_LENGTH} for the planner's cost model (it fits "
            f"attention on sequence lengths from {MIN_COST_SEQ_LENGTH} tokens up to the row width), got {value!r}",
            fields=fields,
        )
    return int(value)


def pack_cost_model(
    *,
    model: str,
    gpu: str,
    precision: str = "bf16",
    tp: int = 1,
    cp: int = 1,
    seq_length: int = DEFAULT_COST_SEQ_LENGTH,
    seq_length_field: str = "seq_length",
) -> PackCostModel:
    """Cost in seconds of one pack from the planner's one step-time model
    (:func:`longpack.planner.timing.estimate_time`), on the ``tp·cp`` GPUs that run one pack.

    A packed row of ``seq_length`` tokens costs what the planner says one micro-batch of it costs: the
    row part (every GEMM on the full row, padding included; norms, launch overhead, TP comm) is
    ``per_pack``; core attention is a sum over the row's sequences, and the planner's attention time of
    one sequence of length ``L`` (fused-kernel curves at its per-CP-rank chunk lengths, plus exposed CP
    comm) is fitted as ``per_sequence + linear·L + quadratic·L²`` on lengths from 16 to ``seq_length``.
    So cost ratios between packs are the planner's (to the fit's error: ``r2``, and a test bounds the
    ratios). ``model`` is a catalog name or an HF ``config.json``. A ``seq_length`` below
    ``MIN_COST_SEQ_LENGTH`` is a ``ConfigError`` naming ``seq_length_field`` (the caller's name for it).

    >>> m = pack_cost_model(model="qwen3_30b_a3b", gpu="h100", seq_length=32768)
    >>> round(m.pack_cost([32768]) / m.pack_cost([1024] * 32), 2)  # one 32K doc vs 32 x 1K
    2.81
    >>> pack_cost_model(model="qwen3_8b", gpu="h100", seq_length=8, seq_length_field="bin_size")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: bin_size must be an integer >= 16 for the planner's cost model (it fits attention on sequence lengths from 16 tokens up to the row width), got 8
    """
    from longpack.planner.catalog import load_gpu, load_model
    from longpack.planner.options import PlanError, PlanLayout, TrainingOptions
    from longpack.planner.timing import RowWork, estimate_time
    from longpack.topology import ParallelLayout, TopologyError

    if precision not in BALANCE_PRECISIONS:
        raise ConfigError(
            f"precision {precision!r} is unknown; choose one of {', '.join(BALANCE_PRECISIONS)}"
        )
    width = _cost_width(seq_length, seq_length_field, seq_length_field)
    spec, device = load_model(model), load_gpu(gpu)
    try:
        plan = PlanLayout(layout=ParallelLayout(world_size=tp * cp, tp=tp, cp=cp, sp=tp > 1), mbs=1)
        options = TrainingOptions(precision=precision, tp_comm_overlap=tp > 1)
    except (PlanError, TopologyError, ValueError) as exc:
        raise ConfigError(f"balance cost model: {exc}") from None

    def row_seconds(sequences: tuple[tuple[int, float], ...]) -> float:
        rows = RowWork(row_length=width, sequences=sequences)
        return estimate_time(
            spec, device, plan, seq_length=width, gbs=1, options=options, rows=rows
        ).microbatch

    base = row_seconds(((1, 1.0),))  # the row without attention work (one 1-token sequence)
    lengths = sorted(
        {max(1, round(MIN_COST_SEQ_LENGTH * (width / MIN_COST_SEQ_LENGTH) ** (i / 23))) for i in range(24)}
        | {width}
    )
    seconds = [row_seconds(((n, 1.0),)) - base for n in lengths]
    attention = PackCostModel.fit(
        [[n] for n in lengths], seconds, terms=("per_sequence", "linear", "quadratic")
    )
    return replace(attention, per_pack=base)


def microbatch_seconds(
    *, model: Any, gpu: Any, precision: str = "bf16", tp: int = 1
) -> Callable[[Sequence[int], int], float]:
    """``seconds(lengths, ranks)``: the planner's one step-time model
    (:func:`longpack.planner.timing.estimate_time`) for one micro-batch holding sequences of ``lengths``
    (runtime tokens, one varlen row, each sequence padded to the layout's ``pad_seq_to_mult``) on ``ranks`` CP
    ranks of ``tp`` GPUs each (results cached per distinct micro-batch; ``model`` / ``gpu``: catalog names
    or loaded specs) — the callable
    ``longpack.balance.cp_modes.compare_cp_modes`` and the hybrid-CP schedules take, so they time CP
    modes with the same model as ``plan``, ``sweep`` and ``pack --balance``.

    >>> seconds = microbatch_seconds(model="llama3_1_8b", gpu="h100")
    >>> one, split = seconds([32768], 1), seconds([32768], 4)
    >>> 2.5 < one / split < 4.0, seconds([8192] * 4, 1) < one
    (True, True)
    """
    from longpack.planner.catalog import load_gpu, load_model
    from longpack.planner.options import PlanLayout, TrainingOptions
    from longpack.planner.timing import RowWork, estimate_time
    from longpack.topology import ParallelLayout

    if precision not in BALANCE_PRECISIONS:
        raise ConfigError(
            f"precision {precision!r} is unknown; choose one of {', '.join(BALANCE_PRECISIONS)}"
        )
    # a catalog name / config.json path, or the spec already loaded (sweep's planner holds specs)
    spec = load_model(model) if isinstance(model, str) else model
    device = load_gpu(gpu) if isinstance(gpu, str) else gpu
    options = TrainingOptions(precision=precision, tp_comm_overlap=tp > 1)

    @functools.cache
    def timed(sequences: tuple[tuple[int, float], ...], ranks: int) -> float:
        layout = ParallelLayout(world_size=tp * ranks, tp=tp, cp=ranks, sp=tp > 1)
        # THD under CP (and SP) pads every sequence to pad_seq_to_mult: the GEMMs run on the padded row
        mult = layout.pad_seq_to_mult
        width = int(sum(align_up(n, mult) * c for n, c in sequences))
        rows = RowWork(row_length=width, sequences=sequences)
        plan = PlanLayout(layout=layout, mbs=1)
        return estimate_time(
            spec, device, plan, seq_length=width, gbs=1, options=options, rows=rows
        ).microbatch

    def seconds(lengths: Sequence[int], ranks: int) -> float:
        counts: dict[int, float] = {}
        for n in lengths:
            counts[int(n)] = counts.get(int(n), 0.0) + 1.0
        return timed(tuple(sorted(counts.items())), int(ranks))

    return seconds


def parse_balance_spec(spec: str) -> BalanceTarget:
    """Read ``key=value,...``: ``dp``, ``gbs`` (required), ``pp``, ``vpp``, ``mbs``, ``schedule``,
    ``sampler``, and the cost model: either ``model=M,gpu=G`` (planner catalog names; optional
    ``precision``, ``tp``/``cp`` for the group that runs one pack and ``seq_length`` for the row width,
    default 8192; see ``pack_cost_model``) or
    explicit coefficients ``linear=..,quadratic=..[,per_sequence=..,per_pack=..]``. ``schedule``
    defaults to ``interleaved`` when ``vpp > 1``, else ``1f1b``. Raises ``ConfigError`` naming the item.

    >>> parse_balance_spec("dp=8,pp=4,gbs=128,model=llama3_1_8b,gpu=h100").cost_model.quadratic > 0
    True
    >>> parse_balance_spec("dp=8")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: balance spec 'dp=8' needs gbs=...: the global batch size (packs per optimizer step)
    """
    if not isinstance(spec, str):
        raise ConfigError(f"balance spec must be a string like 'dp=8,gbs=128,model=M,gpu=G', got {spec!r}")
    what = f"balance spec {spec!r}"
    values: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in (*_INT_KEYS, *_FLOAT_KEYS, *_STR_KEYS):
            known = ", ".join((*_INT_KEYS, *_FLOAT_KEYS, *_STR_KEYS))
            raise ConfigError(f"{what}: item {part!r} is not key=value with a known key ({known})")
        values[key] = value.strip()
    ints: dict[str, int] = {}
    for key in _INT_KEYS:
        if key in values:
            try:
                ints[key] = int(values[key])
            except ValueError:
                raise ConfigError(f"{what}: {key}={values[key]!r} is not an integer") from None
    for key, meaning in (
        ("dp", "data-parallel size"),
        ("gbs", "global batch size (packs per optimizer step)"),
    ):
        if key not in ints:
            raise ConfigError(f"{what} needs {key}=...: the {meaning}")
    floats: dict[str, float] = {}
    for key in _FLOAT_KEYS:
        if key in values:
            try:
                floats[key] = float(values[key])
            except ValueError:
                raise ConfigError(f"{what}: {key}={values[key]!r} is not a number") from None
    if "model" in values or "gpu" in values:
        if floats:
            raise ConfigError(f"{what} takes either model=/gpu= or explicit coefficients, not both")
        if "model" not in values or "gpu" not in values:
            raise ConfigError(f"{what} needs both model=M and gpu=G to derive the cost model")
        if "seq_length" in ints:
            _cost_width(ints["seq_length"], f"{what}: seq_length", ())
        cost = pack_cost_model(
            model=values["model"],
            gpu=values["gpu"],
            precision=values.get("precision", "bf16"),
            tp=ints.get("tp", 1),
            cp=ints.get("cp", 1),
            seq_length=ints.get("seq_length", DEFAULT_COST_SEQ_LENGTH),
        )
    elif "linear" in floats and "quadratic" in floats:
        try:
            cost = PackCostModel(**floats)
        except ValueError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    else:
        raise ConfigError(
            f"{what} needs a cost model: model=M,gpu=G (planner catalog) or linear=..,quadratic=.."
        )
    return BalanceTarget(
        cost_model=cost,
        dp=ints["dp"],
        gbs=ints["gbs"],
        pp=ints.get("pp", 1),
        vpp=ints.get("vpp", 1),
        micro_batch_size=ints.get("mbs", 1),
        schedule=values.get(
            "schedule", choices.SCHEDULE_INTERLEAVED if ints.get("vpp", 1) > 1 else choices.SCHEDULE_1F1B
        ),
        sampler=values.get("sampler", choices.BATCH_SAMPLER),
        spec=spec,
    )
