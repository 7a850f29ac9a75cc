"""``longpack balance``: compare first-fit-shuffle, best-fit and workload-balanced packing of a length list."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from longpack.cli import options as opt
from longpack.outputs import temp_file_beside

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

    where: list[str] = []
    try:
        if path.suffix == ".npy":
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
        rule = "at least 1" if lengths[i] < 1 else f"at most --pack-size {pack_size}"
        raise InputError(
            f"{at}: length {int(lengths[i])} must be {rule} ({bad.size} of {lengths.size} lengths are outside "
            f"1..{limit}); truncate, split or drop those samples first"
        )
    return lengths


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
    """Write ``array`` to ``path`` (its folder must exist) through a temp file, fsync and rename."""
    fd, tmp = temp_file_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, array, allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_LENGTHS_ARG = typer.Argument(..., help="Runtime lengths: .npy, or text with one integer per line.")
_OUT_OPT = typer.Option(None, "--out", help="Write the balanced bin_of_item (.npy); bin id = read order.")


def register(app: typer.Typer) -> None:
    @app.command("balance")
    def balance(
        lengths_file: Path = _LENGTHS_ARG,
        pack_size: int | None = typer.Option(None, "--pack-size", help="Pack size in tokens (required)."),
        capacity: int | None = typer.Option(None, "--capacity", hidden=True),
        dp: int = typer.Option(..., "--dp", help="Data-parallel size."),
        pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size."),
        gbs: int = typer.Option(..., "--gbs", help="Global batch size in packs."),
        mbs: int = typer.Option(1, "--mbs", help="Micro-batch size in packs."),
        schedule: Annotated[opt.Schedule, typer.Option("--schedule", help="Pipeline schedule.")] = "1f1b",
        vpp: int = typer.Option(1, "--vpp", help="Virtual pipeline stages (interleaved schedule)."),
        sampler: Annotated[
            opt.Sampler,
            typer.Option("--sampler", help="batch (Megatron-Bridge SFT) or single (Megatron-LM)."),
        ] = "batch",
        model_shape: str = typer.Option(
            "hidden=4096,layers=32,heads=32,kv_heads=8,ffn=14336,vocab=128256",
            "--model-shape",
            help="Dense model shape for the Megatron FLOP formula (default: Llama-3-8B).",
        ),
        tflops: float = typer.Option(
            400.0, "--tflops", help="Effective TFLOP/s of one pack's TP x CP group."
        ),
        seed: opt.Seed = 0,
        out: Path | None = _OUT_OPT,
        as_json: opt.Json = False,
    ) -> None:
        """Simulate a training pass (DP x PP) for three packers and optionally save the balanced packing.

        Columns (explained again under the table): packs, fill %, time s (simulated pass), /ideal (time
        over a perfectly balanced pass), rank imb (slowest over mean DP rank per step), corr (step index vs
        the step's mean sample length).
        """
        from longpack.balance import PackCostModel
        from longpack.balance.report import compare_packings
        from longpack.errors import ConfigError
        from longpack.outputs import check_output_file
        from longpack.validate import finite_float, positive_int
        from longpack.validate import seed as seed_value

        if capacity is not None:
            typer.echo("warning: --capacity is deprecated; use --pack-size", err=True)
            pack_size = pack_size if pack_size is not None else capacity
        if pack_size is None:
            raise ConfigError("pack_size is required (the pack size in tokens)", fields="pack_size")
        for name, value in (("pack_size", pack_size), ("dp", dp), ("pp", pp), ("gbs", gbs), ("mbs", mbs)):
            positive_int(value, name)
        positive_int(vpp, "vpp")
        seed_value(seed)
        finite_float(tflops, "tflops", lo=0.0, lo_open=True)
        if out is not None:
            check_output_file(out, field="out")  # before the simulation
        if pp * vpp > MAX_STAGES:
            raise ConfigError(
                f"PP*VPP = {pp}*{vpp} pipeline stages: at most {MAX_STAGES} (each stage holds at least one "
                "layer); lower pp or vpp",
                fields=("pp", "vpp"),
            )
        lengths = read_lengths(lengths_file, pack_size=pack_size)
        if gbs > len(lengths):  # every pack holds a sample: not one full step, only empty packs simulated
            raise ConfigError(
                f"gbs {gbs} is more packs than {lengths_file} has samples ({len(lengths)}): not one optimizer "
                "step; lower gbs or give more lengths",
                fields="gbs",
            )
        try:
            cost_model = PackCostModel.from_dense_model(
                flops_per_second=tflops * 1e12, **parse_model_shape(model_shape)
            )
            reports = compare_packings(
                lengths,
                pack_size,
                cost_model=cost_model,
                dp=dp,
                pp=pp,
                gbs=gbs,
                micro_batch_size=mbs,
                schedule=schedule,
                vpp=vpp,
                sampler=sampler,
                seed=seed,
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
        if out is not None:
            write_npy_atomic(out, next(r for r in reports if r.name == "balanced").bin_of_item)
        if as_json:
            typer.echo(json.dumps({"ideal_time_s": ideal, "packings": rows}, indent=2))
            return
        typer.echo(
            f"{'packing':<18} {'packs':>7} {'fill %':>7} {'time s':>12} {'/ideal':>7} {'rank imb':>8} {'corr':>6}"
        )
        for row in rows:
            typer.echo(
                f"{row['packing']:<18} {row['packs']:>7} {100 * row['fill']:>7.2f} {row['time_s']:>12.3f} "
                f"{row['vs_ideal']:>7.3f} {row['rank_imbalance']:>8.3f} {row['step_length_correlation']:>+6.2f}"
            )
        typer.echo(f"{'ideal':<18} {'':>7} {'':>7} {ideal:>12.3f} {1.0:>7.3f}")
        from longpack.balance.report import COLUMNS

        for name, meaning in COLUMNS.items():
            typer.echo(f"  {name}: {meaning}")
        if out is not None:
            typer.echo(f"balanced bin_of_item written to {out} (bin k is the k-th pack read)")
