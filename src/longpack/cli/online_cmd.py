"""``longpack online-sim``: fill of the online (candidate-buffer) packer against offline packing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from longpack.cli import options as opt

#: Synthetic samples at most: the simulation runs every buffer size over them in Python.
MAX_SAMPLES = 1_000_000


def _read_lengths(path: Path) -> list[int]:
    from longpack.errors import InputError
    from longpack.store import is_store, store_lengths

    if is_store(path):  # a token store (longpack tokenize): its samples' runtime lengths
        return store_lengths(path).tolist()  # type: ignore[no-any-return]

    try:
        text_lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})", fields="lengths") from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text at byte {exc.start}; give one runtime length per line", fields="lengths"
        ) from None
    out = []
    for lineno, line in enumerate(text_lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            value = int(text)
        except ValueError:
            raise ValueError(
                f"{path}:{lineno}: expected one runtime length (an integer) per line, got {text!r}"
            ) from None
        if value < 1:
            raise ValueError(f"{path}:{lineno}: runtime length {value} < 1; remove empty samples")
        if value >= 2**62:
            raise ValueError(f"{path}:{lineno}: runtime length {text[:30]} is not a token count")
        out.append(value)
    if not out:
        raise ValueError(f"{path}: no lengths found (one runtime length per line)")
    return out


def register(app: typer.Typer) -> None:
    @app.command("online-sim")
    def online_sim(
        pack_size: int | None = typer.Option(
            None, "--pack-size", help="Pack size in runtime tokens (seq_length; required)."
        ),
        capacity: int | None = typer.Option(None, "--capacity", hidden=True),
        buffer_sizes: str = typer.Option("8,16,64,256,1024,4096", "--buffer-sizes", help="Comma-separated."),
        workload: Annotated[
            opt.Workload, typer.Option("--workload", help="Synthetic workload of sample lengths.")
        ] = "lognormal",
        lengths_file: Path | None = typer.Option(  # noqa: B008
            None,
            "--lengths",
            help="Text file with one runtime length per line, or a token store (instead of --workload).",
        ),
        samples: int = typer.Option(20000, "--samples", help="Number of synthetic samples."),
        pad_seq_to_mult: int = typer.Option(
            1, "--pad-seq-to-mult", help="Per-sample alignment multiple (2*CP ...)."
        ),
        pad_to_multiple_of: int | None = typer.Option(None, "--pad-to-multiple-of", hidden=True),
        algorithm: Annotated[
            opt.Algorithm | None,
            typer.Option(
                "--algorithm",
                help="Bin packing (default: best_fit_decreasing; with --vlm first_fit_decreasing, Bridge's).",
            ),
        ] = None,
        seed: opt.Seed = 0,
        vlm_file: Path | None = typer.Option(  # noqa: B008
            None,
            "--vlm",
            help="JSONL of VLM samples (messages + images or image_sizes): also report the buffer's host memory.",
        ),
        tokenizer: str = typer.Option("qwen3", "--tokenizer", help="With --vlm: tokenizer spec or folder."),
        loader_workers: int = typer.Option(
            1, "--loader-workers", help="With --vlm: Energon loader workers per rank (one buffer each)."
        ),
        patch_size: int = typer.Option(14, "--patch-size", help="With --vlm: vision patch (Qwen3-VL: 16)."),
        merge_size: int = typer.Option(2, "--merge-size", help="With --vlm: spatial merge size."),
        min_pixels: int = typer.Option(200704, "--min-pixels", help="With --vlm: processor min_pixels."),
        max_pixels: int = typer.Option(1003520, "--max-pixels", help="With --vlm: processor max_pixels."),
        max_images: int | None = typer.Option(
            10, "--max-images", help="With --vlm: images per sample limit."
        ),
        max_visual_tokens: int | None = typer.Option(
            16384, "--max-visual-tokens", help="With --vlm: visual tokens per sample limit."
        ),
        write_lengths: Path | None = typer.Option(  # noqa: B008
            None,
            "--write-lengths",
            help="With --vlm: also write each accepted sample's tokens, one per line (a --lengths file).",
        ),
        as_json: opt.Json = False,
    ) -> None:
        """Simulate Energon-style online packing for several buffer sizes; compare with offline best fit.

        With --vlm, the samples' lengths come from their image sizes (headers only, no pixel decoded) and each
        row also reports the packing buffer's host memory (prepared pixel tensors), per worker and per rank.
        """
        from longpack.errors import ConfigError, LongpackError
        from longpack.online.simulate import simulate, smallest_buffer_within, synthetic_lengths

        if capacity is not None:
            typer.echo("warning: --capacity is deprecated; use --pack-size", err=True)
            pack_size = pack_size if pack_size is not None else capacity
        if pad_to_multiple_of is not None:
            typer.echo("warning: --pad-to-multiple-of is deprecated; use --pad-seq-to-mult", err=True)
            pad_seq_to_mult = pad_to_multiple_of
        if pack_size is None:
            raise ConfigError("pack_size is required (pack size in runtime tokens)", fields="pack_size")
        from longpack.validate import positive_int
        from longpack.validate import seed as seed_value

        capacity = positive_int(pack_size, "pack_size")
        positive_int(pad_seq_to_mult, "pad_seq_to_mult")
        positive_int(samples, "samples", at_most=MAX_SAMPLES, why="the simulation is pure Python")
        seed_value(seed)
        if vlm_file is not None:
            _vlm_sim(
                vlm_file,
                capacity,
                buffer_sizes,
                as_json=as_json,
                tokenizer=tokenizer,
                workers=loader_workers,
                vision={
                    "patch_size": patch_size,
                    "merge_size": merge_size,
                    "min_pixels": min_pixels,
                    "max_pixels": max_pixels,
                },
                max_images=max_images,
                max_visual_tokens=max_visual_tokens,
                pad_seq_to_mult=pad_seq_to_mult,
                algorithm=algorithm or "first_fit_decreasing",
                seed=seed,
                write_lengths=write_lengths,
            )
            return
        algorithm = algorithm or "best_fit_decreasing"
        try:
            sizes = [int(x) for x in buffer_sizes.split(",") if x.strip()]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            raise ConfigError(
                f"buffer_sizes must be comma-separated positive integers (e.g. 8,64,512), got {buffer_sizes!r}",
                fields="buffer_sizes",
            )
        try:
            if lengths_file is not None:
                lengths = _read_lengths(lengths_file)
                source = str(lengths_file)
            else:
                lengths = synthetic_lengths(workload, samples, capacity, seed=seed).tolist()
                source = f"{workload} x {samples} (seed {seed})"
            rows = simulate(
                lengths,
                capacity,
                sizes,
                pad_to_multiple_of=pad_seq_to_mult,
                algorithm=algorithm,
                seed=seed,
            )
        except (ValueError, OSError) as exc:
            if isinstance(exc, LongpackError):
                raise
            raise ConfigError(str(exc)) from exc
        best = smallest_buffer_within(rows)
        if as_json:
            report = {
                "source": source,
                "capacity": capacity,
                "rows": rows,
                "smallest_buffer_within_1pct": best,
            }
            typer.echo(json.dumps(report, indent=2))
            return
        typer.echo(
            f"{source}, pack size {capacity}, pad_seq_to_mult {pad_seq_to_mult}, algorithm {algorithm}"
        )
        typer.echo(
            f"{'buffer':>7} {'online fill':>11} {'packs':>7} {'offline fill':>12} {'packs':>7} {'ratio':>7}"
        )
        for r in rows:
            typer.echo(
                f"{r['buffer_size']:>7} {r['online_fill']:>11.4f} {r['online_packs']:>7} "
                f"{r['offline_fill']:>12.4f} {r['offline_packs']:>7} {r['fill_ratio']:>7.4f}"
            )
        typer.echo(
            "smallest buffer within 1% of offline fill: "
            + (str(best) if best is not None else "none of these")
        )


def _vlm_sim(
    path: Path,
    capacity: int,
    buffer_sizes: str,
    *,
    as_json: bool,
    vision: dict[str, int],
    pad_seq_to_mult: int,
    write_lengths: Path | None,
    **kwargs: Any,
) -> None:
    from longpack.errors import ConfigError
    from longpack.online.simulate import vlm_report
    from longpack.vlm.vision import VisionConfig

    try:
        sizes = [int(x) for x in buffer_sizes.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ConfigError(
            f"--buffer-sizes must be positive integers, got {buffer_sizes!r}", fields="buffer_sizes"
        )
    for name in ("max_images", "max_visual_tokens"):
        if kwargs[name] is not None and kwargs[name] < 1:
            raise ConfigError(f"{name} must be >= 1, got {kwargs[name]}", fields=name)
    if kwargs["workers"] < 1:
        raise ConfigError(f"loader_workers must be >= 1, got {kwargs['workers']}", fields="loader_workers")
    report = vlm_report(
        str(path),
        capacity,
        sizes,
        vision=VisionConfig(
            patch_size=vision["patch_size"],
            merge_size=vision["merge_size"],
            min_pixels=vision["min_pixels"],
            max_pixels=vision["max_pixels"],
        ),
        pad_to_multiple_of=pad_seq_to_mult,
        **kwargs,
    )
    if write_lengths is not None:
        from longpack.online.packer import write_text_atomic

        write_text_atomic(write_lengths, "".join(f"{n}\n" for n in report.pop("lengths")))
    else:
        report.pop("lengths")
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    s = report["samples"]
    rejected = ", ".join(f"{k} {v}" for k, v in s["rejected"].items() if v) or "none"
    typer.echo(
        f"{report['source']}: {s['samples']} samples (refused: {rejected}); tokens p50 {s['tokens_p50']}, "
        f"p95 {s['tokens_p95']}, max {s['tokens_max']}; prepared MiB/sample mean {s['prepared_mib_mean']}, "
        f"p95 {s['prepared_mib_p95']}, max {s['prepared_mib_max']}"
    )
    typer.echo(
        f"pack size {capacity}, pad_seq_to_mult {pad_seq_to_mult}, algorithm {report['algorithm']}, "
        f"{report['workers']} loader worker(s) per rank"
    )
    typer.echo(
        f"{'buffer':>7} {'online fill':>11} {'packs':>7} {'offline fill':>12} {'ratio':>7} "
        f"{'peak MiB/worker':>15} {'mean MiB/worker':>15} {'peak MiB/rank':>13}"
    )
    for r in report["rows"]:
        typer.echo(
            f"{r['buffer_size']:>7} {r['online_fill']:>11.4f} {r['online_packs']:>7} {r['offline_fill']:>12.4f} "
            f"{r['fill_ratio']:>7.4f} {r['buffer_peak_mib_worker']:>15.1f} {r['buffer_mean_mib_worker']:>15.1f} "
            f"{r['buffer_peak_mib_rank']:>13.1f}"
        )
    best = report["smallest_buffer_within_1pct"]
    typer.echo(
        "smallest buffer within 1% of offline fill: " + (str(best) if best is not None else "none of these")
    )
