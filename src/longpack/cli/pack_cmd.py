"""``longpack pack``: SFT data -> Megatron-Bridge packed Parquet (thin: parse, call, print)."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from longpack.cli import options as opt

DEMO_TOKENIZER = "qwen3"
DEMO_SEQ_LENGTH = 4096
SHOWN = 10


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def text_config_or_exit(
    *,
    fmt: str,
    prompt_key: str,
    completion_key: str,
    prompt_template: str,
    separator: str,
    prompt_completion_loss: str,
    chat_loss: str,
    messages_key: str,
    skip_malformed: bool,
) -> Any:
    """The ``TextConfig`` of the text options ``pack`` and ``sweep`` share; a bad value exits 2."""
    from longpack.text import InputError, TextConfig

    try:
        return TextConfig(
            format=fmt,
            prompt_key=prompt_key,
            completion_key=completion_key,
            prompt_template=prompt_template,
            separator=separator,
            prompt_completion_loss=prompt_completion_loss,
            chat_loss=chat_loss,
            messages_key=messages_key,
            skip_malformed=skip_malformed,
        )
    except (InputError, ValueError) as exc:
        raise _fail(str(exc)) from exc


def _resolve_mult(pad_seq_to_mult: int | None, tp: int | None, cp: int | None, sp: bool) -> tuple[int, str]:
    from longpack.topology import TopologyError
    from longpack.topology import pad_seq_to_mult as derive

    if pad_seq_to_mult is not None:
        if tp is not None or cp is not None or sp:
            raise _fail("give either --pad-seq-to-mult or --tp/--cp/--sp, not both")
        if pad_seq_to_mult < 1:
            raise _fail(f"--pad-seq-to-mult must be a positive integer, got {pad_seq_to_mult}")
        return pad_seq_to_mult, f"--pad-seq-to-mult {pad_seq_to_mult}"
    if tp is None and cp is None and not sp:
        return 1, "default: no --pad-seq-to-mult, --tp, --cp or --sp given"
    try:
        value = derive(tp=tp or 1, cp=cp or 1, sp=sp)
    except TopologyError as exc:
        raise _fail(str(exc)) from exc
    source = f"lcm(2*CP if CP>1 else 1, CP*TP if SP and TP>1 else 1) with TP={tp or 1} CP={cp or 1} SP={sp}"
    return value, source


def resolve_pad_seq_to_mult(
    pad_seq_to_mult: int | None, tp: int | None, cp: int | None, sp: bool
) -> tuple[int, str]:
    """``(pad_seq_to_mult, where it came from)`` from ``--pad-seq-to-mult`` or ``--tp/--cp/--sp`` (shared with
    ``longpack sweep``); raises ``typer.Exit(2)`` with a message on bad input."""
    return _resolve_mult(pad_seq_to_mult, tp, cp, sp)


def _balance_target(spec: str | None) -> Any:
    """The ``--balance`` text as a ``longpack.balance.BalanceTarget`` (imported only when given)."""
    if spec is None:
        return None
    from longpack.planner.balance_costs import parse_balance_spec

    return parse_balance_spec(spec)


def register(app: typer.Typer) -> None:
    @app.command("pack")
    def pack(
        out: Annotated[
            Path, typer.Option("--out", help="Output folder (must not exist unless --overwrite).")
        ],
        inputs: Annotated[
            list[str] | None, typer.Argument(help="JSONL / Parquet files, folders or globs.")
        ] = None,
        tokenizer: str | None = typer.Option(
            None, "--tokenizer", help="tokenizer.json, HF model folder, 'qwen3' or 'bytes'."
        ),
        seq_length: int | None = typer.Option(
            None, "--seq-length", help="Max runtime length of one sample (Megatron seq_length)."
        ),
        pack_size: int | None = typer.Option(
            None, "--pack-size", help="packed_sequence_size in runtime tokens (default: --seq-length)."
        ),
        pad_seq_to_mult: int | None = typer.Option(
            None,
            "--pad-seq-to-mult",
            help="Per-sample alignment multiple (default: from --tp/--cp/--sp, else 1).",
        ),
        tp: int | None = typer.Option(None, "--tp", help="Tensor parallel size (derives pad_seq_to_mult)."),
        cp: int | None = typer.Option(None, "--cp", help="Context parallel size (derives pad_seq_to_mult)."),
        sp: bool = typer.Option(False, "--sp", help="Sequence parallelism on (derives pad_seq_to_mult)."),
        algorithm: str = typer.Option(
            "best_fit_decreasing",
            "--algorithm",
            help="best_fit_decreasing | first_fit_shuffle (Megatron-Bridge's exact rows) | first_fit | "
            "first_fit_decreasing.",
        ),
        balance: str | None = typer.Option(
            None,
            "--balance",
            help="Workload-balanced packing for a training topology: dp=D,gbs=B[,pp=P,vpp=V,mbs=M],"
            "model=M,gpu=G (planner catalog) or linear=..,quadratic=.. ; rows are written in training order.",
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of every random step (Megatron: dataset.seed)."),
        overlength: str = typer.Option(
            "drop", "--overlength", help="Samples longer than --seq-length: drop | truncate | error."
        ),
        val_fraction: float = typer.Option(0.0, "--val-fraction", help="Fraction of samples for validation."),
        val_input: Annotated[
            list[str] | None, typer.Option("--val-input", help="Validation inputs (repeatable).")
        ] = None,
        workers: opt.Workers = None,
        fmt: opt.Format = "auto",
        prompt_key: opt.PromptKey = "prompt",
        completion_key: opt.CompletionKey = "completion",
        prompt_template: opt.PromptTemplate = "{prompt}",
        separator: opt.Separator = "",
        prompt_completion_loss: opt.PromptCompletionLoss = "completion",
        chat_loss: opt.ChatLoss = "assistant",
        messages_key: opt.MessagesKey = "messages",
        skip_malformed: opt.SkipMalformed = False,
        rows_per_shard: int | None = typer.Option(
            None, "--rows-per-shard", help="Rows per Parquet shard (default: ~2**27 tokens per shard)."
        ),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output folder."),
        backend: str = typer.Option(
            "local", "--backend", help="local (this machine) | ray (tokenize and write on a Ray cluster)."
        ),
        ray_address: str | None = typer.Option(
            None,
            "--ray-address",
            help="Ray cluster to join ('auto', 'ray://host:10001'); default: start one.",
        ),
        ids_dtype: str = typer.Option(
            "int64",
            "--ids-dtype",
            help="Parquet type of input_ids: int64 (as Megatron-Bridge writes) or int32 (opt-in, smaller and "
            "faster to write; Megatron-Bridge reads any integer type; needs a vocab that fits in int32).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
        demo: bool = typer.Option(
            False,
            "--demo",
            help="Pack the built-in demo SFT data (defaults: --tokenizer qwen3 --seq-length 4096).",
        ),
    ) -> None:
        """Tokenize SFT data and write Megatron-Bridge packed Parquet, metadata and a manifest."""
        from longpack.packed import OutputExistsError, OverlengthError, PackSettings, Provenance
        from longpack.packed.pipeline import check_ids_dtype, check_out_dir, plan_splits, write_packed_output

        inputs = list(inputs or [])
        val_inputs = list(val_input or [])
        if demo:
            if inputs:
                raise _fail("--demo packs the built-in data set; give no INPUT with it")
            tokenizer = tokenizer or DEMO_TOKENIZER
            seq_length = seq_length or DEMO_SEQ_LENGTH
        if not inputs and not demo:
            raise _fail("give at least one INPUT (file, folder or glob), or --demo")
        if tokenizer is None:
            raise _fail("--tokenizer is required (a tokenizer.json, an HF model folder, 'qwen3' or 'bytes')")
        if seq_length is None:
            raise _fail("--seq-length is required (the longest runtime length of one sample, e.g. 4096)")
        if val_inputs and val_fraction:
            raise _fail("give either --val-input or --val-fraction, not both")
        if backend not in ("local", "ray"):
            raise _fail(f"--backend {backend!r} is unknown; choose local or ray")
        if ray_address is not None and backend != "ray":
            raise _fail("--ray-address needs --backend ray")
        try:
            check_out_dir(out, overwrite)  # before the (long) tokenization, not after
        except OutputExistsError as exc:
            raise _fail(str(exc)) from exc
        mult, mult_source = _resolve_mult(pad_seq_to_mult, tp, cp, sp)
        try:
            from longpack.binpack import ALGORITHMS
            from longpack.packed.plan import BALANCED_ALGORITHM as BALANCED

            if balance is not None:
                if algorithm not in ("best_fit_decreasing", BALANCED):
                    raise ValueError(f"--balance chooses the balanced packer; drop --algorithm {algorithm}")
                algorithm = BALANCED
            elif algorithm == BALANCED:
                raise ValueError("--algorithm balanced needs --balance dp=..,gbs=..,model=..,gpu=..")
            if algorithm not in (*ALGORITHMS, BALANCED):
                raise ValueError(
                    f"--algorithm {algorithm!r} is unknown; choose one of {', '.join(ALGORITHMS)}"
                )
            settings = PackSettings(
                seq_length=seq_length,
                pack_size=pack_size,
                pad_seq_to_mult=mult,
                algorithm=algorithm,
                seed=seed,
                overlength=overlength,
                val_fraction=val_fraction,
                rows_per_shard=rows_per_shard,
                balance=_balance_target(balance),
                ids_dtype=ids_dtype,
            )
        except ValueError as exc:
            raise _fail(str(exc)) from exc

        from longpack.text import InputError, tokenize_inputs, write_demo_dataset

        show_progress = not as_json and sys.stderr.isatty()
        config = text_config_or_exit(
            fmt=fmt,
            prompt_key=prompt_key,
            completion_key=completion_key,
            prompt_template=prompt_template,
            separator=separator,
            prompt_completion_loss=prompt_completion_loss,
            chat_loss=chat_loss,
            messages_key=messages_key,
            skip_malformed=skip_malformed,
        )
        from longpack.cluster.ray_pack import RayBackendError, RayPacker

        ray_packer = None
        if backend == "ray":
            ray_packer = RayPacker(address=ray_address, workers=workers)
            tokenize_inputs = ray_packer.tokenize_inputs  # type: ignore[assignment]
        with (
            contextlib.ExitStack() as stack,
            tempfile.TemporaryDirectory(prefix="longpack-demo-") as demo_dir,
        ):
            if ray_packer is not None:
                try:
                    stack.enter_context(ray_packer)
                except RayBackendError as exc:
                    raise _fail(str(exc)) from exc
            demo_prefix = ""
            if demo:
                inputs = [str(write_demo_dataset(Path(demo_dir) / "longpack-demo"))]
                demo_prefix = demo_dir
            try:
                train = tokenize_inputs(
                    inputs, tokenizer=tokenizer, config=config, workers=workers, progress=show_progress
                )
                val = (
                    tokenize_inputs(
                        val_inputs,
                        tokenizer=tokenizer,
                        config=config,
                        workers=workers,
                        progress=show_progress,
                    )
                    if val_inputs
                    else None
                )
                if demo_prefix:
                    # Temp paths would make every demo output differ; name the built-in data instead.
                    files = tuple(f.replace(demo_prefix, "<longpack-demo>") for f in train.samples.files)
                    train = replace(train, samples=replace(train.samples, files=files))
                eos_id = train.tokenizer.get("eos_id")
                if eos_id is None:
                    raise InputError(f"tokenizer {tokenizer!r} has no EOS id; packing pads with EOS")
                check_ids_dtype(settings.ids_dtype, train.tokenizer.get("vocab_size"))
                splits = plan_splits(
                    train.samples, settings, eos_id=int(eos_id), validation=val.samples if val else None
                )
            except (InputError, OverlengthError, ValueError, RayBackendError) as exc:
                raise _fail(str(exc)) from exc

            malformed = train.malformed + (val.malformed if val else ())
            inputs_info = train.inputs + (val.inputs if val else ())
            if demo_prefix:

                def relabel(text: str) -> str:
                    return text.replace(demo_prefix, "<longpack-demo>")

                inputs_info = tuple({**d, "path": relabel(d["path"])} for d in inputs_info)
                malformed = tuple((relabel(src), reason) for src, reason in malformed)
            provenance = Provenance(
                inputs=inputs_info,
                tokenizer=train.tokenizer,
                text_settings={
                    **{k: getattr(config, k) for k in config.__dataclass_fields__},
                    "detected_format": train.format,
                    "validation_detected_format": val.format if val else None,
                    "demo": demo,
                },
                rows_read=train.rows_read + (val.rows_read if val else 0),
                malformed=malformed,
            )
            try:
                if ray_packer is not None:
                    manifest = ray_packer.write_packed_output(
                        out, splits, settings, provenance, overwrite=overwrite
                    )
                else:
                    manifest = _write(
                        out, splits, settings, provenance, overwrite, show_progress, write_packed_output
                    )
            except (OutputExistsError, RayBackendError, InputError) as exc:
                raise _fail(str(exc)) from exc
        summary = _summary(out, manifest, mult_source)
        if ray_packer is not None:
            summary["backend"] = {"name": "ray", **ray_packer.memory_report()}
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
        else:
            _print_human(summary, manifest)
            if ray_packer is not None:
                mem = ray_packer.memory_report()
                workers_mib = [round(v / 2**20) for v in mem["worker_peak_rss_bytes"].values()]
                typer.echo(
                    f"ray: peak RSS driver {mem['driver_peak_rss_bytes'] / 2**20:.0f} MiB, "
                    f"{len(workers_mib)} worker processes, max {max(workers_mib, default=0)} MiB"
                )


def _write(out, splits, settings, provenance, overwrite, show_progress, write_packed_output):  # type: ignore[no-untyped-def]
    if not show_progress:
        return write_packed_output(out, splits, settings, provenance, overwrite=overwrite)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    total = sum(s.plan.num_rows for s in splits)
    with Progress(
        TextColumn("writing packed rows"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("write", total=total)
        return write_packed_output(
            out,
            splits,
            settings,
            provenance,
            overwrite=overwrite,
            progress=lambda n: progress.advance(task, n),
        )


def _summary(out: Path, manifest: dict[str, Any], mult_source: str) -> dict[str, Any]:
    folder = out.resolve()
    mb = dict(manifest["megatron_bridge"])
    for key in ("packed_train_data_path", "packed_val_data_path", "packed_metadata_path"):
        if key in mb:
            mb[key] = str(folder / mb[key])
    return {
        "out": str(folder),
        "finished": True,
        "format": manifest["settings"]["text"].get("detected_format"),
        "tokenizer": manifest["tokenizer"],
        "pad_seq_to_mult": manifest["settings"]["pad_seq_to_mult"],
        "pad_seq_to_mult_source": mult_source,
        "algorithm": manifest["settings"]["algorithm"],
        "seed": manifest["settings"]["seed"],
        "counts": manifest["counts"],
        "splits": {
            name: {
                "metadata": s["metadata"],
                "rows": s["rows"],
                "samples_packed": s["samples_packed"],
                "fill_mean": s["fill_mean"],
                "files": [f["name"] for f in s["files"]],
                "truncated": s["truncated_count"],
                "dropped": s["dropped_count"],
            }
            for name, s in manifest["splits"].items()
        },
        "megatron_bridge": mb,
    }


def _print_human(summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    c = summary["counts"]
    echo = typer.echo
    echo(f"packed -> {summary['out']}")
    echo(
        f"  format: {summary['format']}   tokenizer: {summary['tokenizer'].get('name', summary['tokenizer'])}"
    )
    echo(f"  pad_seq_to_mult: {summary['pad_seq_to_mult']}  ({summary['pad_seq_to_mult_source']})")
    echo(f"  algorithm: {summary['algorithm']}   seed: {summary['seed']}")
    echo(
        f"  rows read {c['rows_read']}, malformed {c['malformed']}, samples {c['samples_read']}, "
        f"packed {c['packed']}, truncated {c['truncated']}, dropped {c['dropped']}"
    )
    for name, s in summary["splits"].items():
        meta = s["metadata"]
        echo(
            f"  {name}: {s['rows']} rows of <= {meta['pack_size']} tokens, {s['samples_packed']} samples, "
            f"{meta['packing_factor']} samples/row, efficiency {meta['packing_efficiency']}%, "
            f"files: {', '.join(s['files'])}"
        )
    for name, split in manifest["splits"].items():
        for kind in ("truncated", "dropped"):
            entries = split[kind]
            if not entries:
                continue
            echo(f"  {name}: {split[kind + '_count']} {kind} (all listed in manifest.json):")
            for e in entries[:SHOWN]:
                detail = f"kept {e['kept_tokens']} tokens" if kind == "truncated" else e["reason"]
                echo(f"    {e['source']}: {e['stored_length']} tokens, {detail}")
            if split[kind + "_count"] > SHOWN:
                echo(f"    ... {split[kind + '_count'] - SHOWN} more")
    if manifest["malformed"]:
        echo(f"  malformed rows skipped: {c['malformed']} (first: {manifest['malformed'][0]['source']})")
    echo("Megatron-Bridge config:")
    echo("  dataset.enable_offline_packing: true")
    for key, value in summary["megatron_bridge"].items():
        echo(f"  dataset.offline_packing_specs.{key}: {value}")
