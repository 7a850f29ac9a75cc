"""The balance job: simulate a training pass (DP x PP) of a length list for three packers (Megatron-Bridge's
first-fit-shuffle, best-fit, workload-balanced) and optionally save the balanced packing.

>>> BalanceConfig(lengths_file="l.txt", pack_size=64, dp=2, gbs=4, pp=2000)
Traceback (most recent call last):
...
longpack.errors.ConfigError: PP*VPP = 2000*1 pipeline stages: at most 1024 (each stage holds at least one layer); lower pp or vpp
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack import choices
from longpack.balance.report import COLUMNS
from longpack.errors import ConfigError
from longpack.jobs.options import seed_option
from longpack.option import check_choices, option
from longpack.outputs import ArrayWriter, atomic_write
from longpack.validate import finite_float, positive_int
from longpack.validate import seed as seed_value

__all__ = [
    "COLUMNS",
    "BalanceConfig",
    "BalanceResult",
    "apply_overlength",
    "parse_model_shape",
    "read_lengths",
]

_MODEL_KEYS = ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab")
#: Pipeline stages (PP*VPP) at most: each holds at least one layer, and no model has a thousand.
MAX_STAGES = 1024


def read_lengths(path: Path, *, pack_size: int | None = None) -> np.ndarray:
    """Lengths from ``.npy`` (1-D integers) or a text file with one integer per line (``#`` comments).

    Every failure is an ``InputError`` naming the file (and the line, or the index in a ``.npy``): a file
    that cannot be read or decoded, a value that is not an integer, no lengths at all, a length < 1 or
    (given ``pack_size``) longer than a pack.
    """
    from longpack.errors import InputError
    from longpack.store import is_store, store_lengths

    where: list[str] = []
    try:
        if is_store(path):  # a token store (longpack tokenize): its samples' runtime lengths
            lengths = store_lengths(path)
        elif path.suffix == ".npy":
            try:
                arr = np.load(path, allow_pickle=False)
            except ValueError as exc:  # pickled or not an array file
                raise InputError(f"{path}: not a .npy array of lengths ({exc})") from None
            if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in "iu":
                shape = getattr(arr, "shape", "?")
                raise InputError(
                    f"{path}: expected a 1-D integer array, got dtype {getattr(arr, 'dtype', '?')} shape {shape}"
                )
            lengths = arr.astype(np.int64)
        else:
            values: list[int] = []
            with path.open(encoding="utf-8") as fh:
                for number, line in enumerate(fh, start=1):
                    text = line.split("#", 1)[0].strip()
                    if not text:
                        continue
                    try:
                        value = int(text)
                    except ValueError:
                        raise InputError(f"{path}:{number}: {text!r} is not an integer length") from None
                    if not 0 < value < 2**62:
                        raise InputError(
                            f"{path}:{number}: length {text[:30]} must be a positive token count"
                        )
                    values.append(value)
                    where.append(f"{path}:{number}")
            lengths = np.asarray(values, dtype=np.int64)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text at byte {exc.start}; give a text file with one integer per line or a .npy"
        ) from None
    if lengths.size == 0:
        raise InputError(f"{path}: no lengths found (one runtime length per line, or a 1-D .npy array)")
    limit = np.iinfo(np.int64).max if pack_size is None else pack_size
    bad = np.flatnonzero((lengths < 1) | (lengths > limit))
    if bad.size:
        i = int(bad[0])
        at = where[i] if where else f"{path}: index {i}"
        rule = "at least 1" if lengths[i] < 1 else f"at most pack_size {pack_size}"
        fix = "drop those lengths first" if lengths[i] < 1 else "pass overlength drop, truncate or fragment"
        raise InputError(
            f"{at}: length {int(lengths[i])} must be {rule} ({bad.size} of {lengths.size} lengths are outside "
            f"1..{limit}); {fix}",
            fields=() if lengths[i] < 1 else ("pack_size", "overlength"),
        )
    return lengths


def apply_overlength(lengths: np.ndarray, pack_size: int, overlength: str) -> tuple[np.ndarray, str | None]:
    """Runtime ``lengths`` with those longer than ``pack_size`` handled as ``longpack pack`` handles an
    over-long sample (``error`` refuses, ``drop``, ``truncate`` to the pack size, ``fragment``: pieces cut by
    :func:`longpack.packed.align.fragment_cuts`), and the note saying what was done (``None``: nothing over).

    >>> lengths, note = apply_overlength(np.array([3, 9, 4]), 4, "fragment")
    >>> lengths.tolist(), note
    ([3, 4, 4, 4], '1 of 3 lengths are longer than the pack size (4): cut into 2 pack-size pieces (overlength fragment)')
    >>> apply_overlength(np.array([3, 9, 4]), 4, "drop")[0].tolist()
    [3, 4]
    """
    from longpack.packed.align import fragment_cuts

    over = lengths > pack_size
    if not over.any():
        return lengths, None
    head = f"{int(over.sum())} of {lengths.size} lengths are longer than the pack size ({pack_size})"
    if overlength == choices.OVERLENGTH_ERROR:
        first = np.flatnonzero(over)[0]
        raise ConfigError(
            f"{head} (the first, index {int(first)}, is {int(lengths[first])}); "
            "pass overlength drop, truncate or fragment, or raise pack_size",
            fields=("overlength", "pack_size"),
        )
    if overlength == choices.OVERLENGTH_DROP:
        kept = lengths[~over]
        if kept.size == 0:
            raise ConfigError(
                f"{head}, all of them: dropping them leaves none; raise pack_size", fields="pack_size"
            )
        return kept, f"{head}: dropped (overlength drop)"
    if overlength == choices.OVERLENGTH_TRUNCATE:
        return np.minimum(lengths, pack_size), f"{head}: truncated to it (overlength truncate)"
    # fragment: a runtime length r is r + 1 stored tokens, cut as the pack job cuts them
    which, _start, stored = fragment_cuts(lengths + 1, pack_size)
    pieces = stored - 1
    order = np.argsort(which, kind="stable")
    cut = np.split(pieces[order], np.cumsum(np.bincount(which, minlength=lengths.size))[:-1])
    out = np.concatenate([c if over[i] else lengths[i : i + 1] for i, c in enumerate(cut)])
    out = out[out > 0]
    made = int(sum(len(c) for i, c in enumerate(cut) if over[i]))
    return out.astype(np.int64), f"{head}: cut into {made} pack-size pieces (overlength fragment)"


def parse_model_shape(spec: str) -> dict[str, Any]:
    """``hidden=4096,layers=32,heads=32,kv_heads=8,ffn=14336,vocab=128256`` -> dict (kv_heads optional).

    >>> parse_model_shape("hidden=8,layers=2,heads=2,ffn=16,vocab=100")["ffn"]
    16
    >>> parse_model_shape("hidden=8")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: model_shape is missing layers, heads, ffn, vocab (e.g. hidden=4096,...)
    """
    from longpack.errors import ConfigError

    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in _MODEL_KEYS:
            raise ConfigError(
                f"model_shape: {part!r} is not KEY=VALUE with KEY one of {', '.join(_MODEL_KEYS)}",
                fields="model_shape",
            )
        try:
            out[key] = int(value)
        except ValueError:
            raise ConfigError(
                f"model_shape: {key}={value!r} is not an integer", fields="model_shape"
            ) from None
    missing = [k for k in _MODEL_KEYS if k not in out and k != "kv_heads"]
    if missing:
        raise ConfigError(
            f"model_shape is missing {', '.join(missing)} (e.g. {_MODEL_KEYS[0]}=4096,...)",
            fields="model_shape",
        )
    return out


def write_npy_atomic(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` (its folder must exist) atomically, as a ``.npy``."""
    atomic_write(path, lambda fh: np.save(ArrayWriter(fh), array, allow_pickle=False))


@dataclass(frozen=True, kw_only=True)
class BalanceConfig:
    """A length list, a training topology and a cost model; validated on construction."""

    command_help = (
        "Simulate a training pass (DP x PP) for three packers and optionally save the balanced packing."
    )

    lengths_file: str | Path = option(
        help="Runtime lengths: .npy, text with one integer per line, or a token store (longpack tokenize).",
        positional=True,
        cli_type=Path,
    )
    pack_size: int | None = option(
        None, help="Pack size in tokens (required).", aliases=("--capacity",), cli_type=int | None
    )
    dp: int = option(help="Data-parallel size.", cli_type=int)
    pp: int = option(1, help="Pipeline-parallel size.")
    gbs: int = option(help="Global batch size in packs.", cli_type=int)
    mbs: int = option(1, help="Micro-batch size in packs.")
    schedule: str = option(choices.SCHEDULE_1F1B, help="Pipeline schedule.", choices=choices.SCHEDULES)
    vpp: int = option(1, help="Virtual pipeline stages (interleaved schedule).")
    sampler: str = option(
        choices.BATCH_SAMPLER,
        help="batch (Megatron-Bridge SFT) or single (Megatron-LM).",
        choices=choices.SAMPLERS,
    )
    model_shape: str = option(
        "hidden=4096,layers=32,heads=32,kv_heads=8,ffn=14336,vocab=128256",
        help="Dense model shape for the Megatron FLOP formula, with --tflops (default: Llama-3-8B).",
    )
    tflops: float | None = option(
        None,
        help=(
            "Cost packs at this constant TFLOP/s of one pack's TP x CP group (Megatron FLOP formula on "
            "--model-shape) instead of the planner's step-time model."
        ),
        cli_type=float | None,
    )
    #: The planner's step-time model (the default cost model): the catalog model, GPU, precision and the
    #: TP x CP group that runs one pack, so absolute times agree with ``longpack plan`` and ``sweep``.
    model: str = option("llama3_1_8b", help="Catalog model (or config.json) the planner costs packs for.")
    gpu: str = option("H100", help="GPU type the planner costs packs on.")
    precision: str = option(
        "bf16", help="Precision the planner costs packs in.", choices=choices.BALANCE_PRECISIONS
    )
    tp: int = option(1, help="TP size of the group that runs one pack (planner cost model).")
    cp: int = option(1, help="CP size of the group that runs one pack (planner cost model).")
    seed: int = seed_option()
    overlength: str = option(
        choices.OVERLENGTH_ERROR,
        help="Lengths longer than --pack-size: error (refuse them), drop, truncate or fragment (pack-size "
        "pieces), as longpack pack handles over-long samples.",
        choices=choices.OVERLENGTH_POLICIES,
    )
    out: str | Path | None = option(
        None, help="Write the balanced bin_of_item (.npy); bin id = read order.", cli_type=Path | None
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        if self.pack_size is None:
            raise ConfigError("pack_size is required (the pack size in tokens)", fields="pack_size")
        for name in ("pack_size", "dp", "pp", "gbs", "mbs", "vpp"):
            positive_int(getattr(self, name), name)
        seed_value(self.seed)
        if self.tflops is not None:
            finite_float(self.tflops, "tflops", lo=0.0, lo_open=True)
        for name in ("tp", "cp"):
            positive_int(getattr(self, name), name)
        check_choices(self)
        if self.out is not None and self.overlength in (choices.OVERLENGTH_DROP, choices.OVERLENGTH_FRAGMENT):
            raise ConfigError(
                f"out writes one bin per length read, but overlength {self.overlength} changes how many lengths "
                "there are; use overlength truncate (or error) with out",
                fields=("out", "overlength"),
            )
        if self.pp * self.vpp > MAX_STAGES:
            raise ConfigError(
                f"PP*VPP = {self.pp}*{self.vpp} pipeline stages: at most {MAX_STAGES} (each stage holds at least "
                "one layer); lower pp or vpp",
                fields=("pp", "vpp"),
            )

    def cost_model(self) -> Any:
        """The ``PackCostModel``: the planner's step-time model (``longpack.planner.balance_costs``) for
        ``model`` / ``gpu`` / ``precision`` / ``tp`` / ``cp`` at ``pack_size``, or with ``tflops`` the
        constant-FLOP-rate model of ``model_shape``."""
        from longpack.balance import PackCostModel

        if self.tflops is not None:
            return PackCostModel.from_dense_model(
                flops_per_second=self.tflops * 1e12, **parse_model_shape(self.model_shape)
            )
        from longpack.planner.balance_costs import pack_cost_model

        assert self.pack_size is not None
        return pack_cost_model(
            model=self.model,
            gpu=self.gpu,
            precision=self.precision,
            tp=self.tp,
            cp=self.cp,
            seq_length=self.pack_size,
            seq_length_field="pack_size",
        )

    def run(self) -> BalanceResult:
        from longpack.balance.report import compare_packings
        from longpack.outputs import check_output_file

        if self.out is not None:
            check_output_file(Path(self.out), field="out")  # before the simulation
        from longpack.errors import warn_all

        assert self.pack_size is not None  # required: checked on construction
        strict = self.overlength == choices.OVERLENGTH_ERROR
        lengths = read_lengths(Path(self.lengths_file), pack_size=self.pack_size if strict else None)
        lengths, note = apply_overlength(lengths, self.pack_size, self.overlength)
        warnings = (note,) if note else ()
        warn_all(warnings)
        if self.gbs > len(
            lengths
        ):  # every pack holds a sample: not one full step, only empty packs simulated
            raise ConfigError(
                f"gbs {self.gbs} is more packs than {self.lengths_file} has samples ({len(lengths)}): not one optimizer "
                "step; lower gbs or give more lengths",
                fields="gbs",
            )
        try:
            cost_model = self.cost_model()
            reports = compare_packings(
                lengths,
                self.pack_size,
                cost_model=cost_model,
                dp=self.dp,
                pp=self.pp,
                gbs=self.gbs,
                micro_batch_size=self.mbs,
                schedule=self.schedule,
                vpp=self.vpp,
                sampler=self.sampler,
                seed=self.seed,
            )
        except ValueError as exc:  # the balance layer's own messages (capacity, dp, gbs, ...)
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(str(exc)) from exc
        ideal = next(r for r in reports if r.name == "best_fit").ideal_time
        rows: list[dict[str, Any]] = [
            {
                "packing": r.name,
                "packs": r.num_packs,
                "fill": round(r.fill, 6),
                "time_s": round(r.total_time, 6),
                "vs_ideal": round(r.total_time / ideal, 6) if ideal > 0 else 1.0,
                "rank_imbalance": round(r.rank_imbalance, 6),
                "step_length_correlation": round(r.step_length_correlation, 6),
            }
            for r in reports
        ]
        if self.out is not None:
            write_npy_atomic(Path(self.out), next(r for r in reports if r.name == "balanced").bin_of_item)
        return BalanceResult(
            ideal_time_s=ideal,
            packings=tuple(rows),
            out=None if self.out is None else str(self.out),
            warnings=warnings,
        )


@dataclass(frozen=True, kw_only=True)
class BalanceResult:
    """Per packing: packs, fill, simulated time (and vs the ideal), rank imbalance, step-length correlation."""

    ideal_time_s: float
    packings: tuple[dict[str, Any], ...]
    #: Where the balanced ``bin_of_item`` was written, or ``None``.
    out: str | None = None
    #: What was done to lengths longer than the pack size (``overlength``), as the CLI prints it.
    warnings: tuple[str, ...] = ()

    def notes(self) -> list[str]:
        """The warnings, as the CLI prints them (``warning: ...``)."""
        return [f"warning: {w}" for w in self.warnings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ideal_time_s": self.ideal_time_s,
            "packings": list(self.packings),
            "warnings": list(self.warnings),
        }
