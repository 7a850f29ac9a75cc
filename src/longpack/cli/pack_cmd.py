"""``longpack pack``: SFT data -> Megatron-Bridge packed Parquet or ``.npy`` (parse -> ``PackConfig`` -> run -> print)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from longpack.cli import options as opt

SHOWN = 10
OutputFormat = Literal["parquet", "npy"]
Compat = Literal["megatron-bridge"]


def text_config(
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
    tools_key: str = "tools",
) -> Any:
    """The ``TextConfig`` of the text options ``pack`` and ``sweep`` share (``\\n``-style escapes in the
    prompt template and separator read as a user means them: :func:`longpack.cli.options.unescape`)."""
    from longpack.text import TextConfig

    return TextConfig(
        format=fmt,
        prompt_key=prompt_key,
        completion_key=completion_key,
        prompt_template=opt.unescape(prompt_template),
        separator=opt.unescape(separator),
        tools_key=tools_key,
        prompt_completion_loss=prompt_completion_loss,
        chat_loss=chat_loss,
        messages_key=messages_key,
        skip_malformed=skip_malformed,
    )


def register(app: typer.Typer) -> None:
    @app.command("pack")
    def pack(
        out: Annotated[
            Path, typer.Option("--out", help="Output folder (must not exist unless --overwrite).")
        ],
        inputs: Annotated[
            list[str] | None,
            typer.Argument(metavar="[INPUT]...", help="JSONL / Parquet files, folders or globs."),
        ] = None,
        tokenizer: opt.Tokenizer = None,
        seq_length: int | None = typer.Option(
            None, "--seq-length", help="Max runtime length of one sample (Megatron seq_length)."
        ),
        pack_size: int | None = typer.Option(
            None, "--pack-size", help="packed_sequence_size in runtime tokens (default: --seq-length)."
        ),
        pad_seq_to_mult: opt.PadSeqToMult = None,
        tp: opt.Tp = None,
        cp: opt.Cp = None,
        sp: opt.Sp = False,
        algorithm: opt.AlgorithmOpt = "best_fit_decreasing",
        balance: str | None = typer.Option(
            None,
            "--balance",
            help="Workload-balanced packing for a training topology: dp=D,gbs=B[,pp=P,vpp=V,mbs=M],"
            "model=M,gpu=G (planner catalog) or linear=..,quadratic=.. ; rows are written in training order.",
        ),
        seed: Annotated[
            int | None,
            typer.Option(
                "--seed",
                help="Seed of every random step (Megatron: dataset.seed). Default 0; 1234 with --compat.",
            ),
        ] = None,
        overlength: Annotated[
            opt.Overlength | None,
            typer.Option(
                "--overlength",
                help="Samples longer than --seq-length (default drop; --compat: Bridge's rule).",
            ),
        ] = None,
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
        tools_key: opt.ToolsKey = "tools",
        skip_malformed: opt.SkipMalformed = False,
        mix: Annotated[
            list[str] | None,
            typer.Option(
                "--mix",
                help="Weighted sources instead of inputs: PATH=WEIGHT (repeatable; more PATH=WEIGHT may follow "
                "as arguments) or one YAML mix file. Weights are shares of the mix, met by up/down-sampling.",
            ),
        ] = None,
        rows_per_shard: int | None = typer.Option(
            None, "--rows-per-shard", help="Rows per Parquet shard (default: ~2**27 tokens per shard)."
        ),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output folder."),
        backend: Annotated[
            opt.Backend,
            typer.Option("--backend", help="local: this machine; ray: tokenize and write on a Ray cluster."),
        ] = "local",
        ray_address: str | None = typer.Option(
            None,
            "--ray-address",
            help="Ray cluster to join ('auto', 'ray://host:10001'); default: start one.",
        ),
        ids_dtype: Annotated[
            opt.IdsDtype,
            typer.Option(
                "--ids-dtype",
                help="Parquet type of input_ids: int64 (as Megatron-Bridge writes) or int32 (opt-in, smaller "
                "and faster to write; Megatron-Bridge reads any integer type; needs a vocab that fits).",
            ),
        ] = "int64",
        output_format: Annotated[
            OutputFormat,
            typer.Option(
                "--output-format",
                help="parquet: packed Parquet for Megatron-Bridge v0.4.0+ and main; npy: one .npy per split "
                "for Megatron-Bridge <= 0.3.x (the PyPI release) and NeMo 2.",
            ),
        ] = "parquet",
        row_group_size: int | None = typer.Option(
            None,
            "--row-group-size",
            help="Parquet rows per row group (default: about 256k tokens per group, at most 500; Bridge's "
            "reader decodes a whole group per random access).",
        ),
        compat: Annotated[
            Compat | None,
            typer.Option(
                "--compat",
                help="megatron-bridge: Bridge's prepare step exactly (first_fit_shuffle, seed 1234, its over-length "
                "and one-token rules, its Parquet writer): byte-identical files on the same tokenized samples.",
            ),
        ] = None,
        pad_to_max_length: bool = typer.Option(
            False,
            "--pad-to-max-length",
            help="Write dataset_kwargs.pad_to_max_length: true into bridge_config.yaml (fixed-width rows).",
        ),
        pad_cu_seqlens: bool = typer.Option(
            False,
            "--pad-cu-seqlens",
            help="Write pad_cu_seqlens: true (and pad_to_max_length) into bridge_config.yaml (CUDA graphs).",
        ),
        memory_budget: str | None = typer.Option(
            None,
            "--memory-budget",
            help="Token data held in memory (e.g. 8G; default: half of this machine's memory). Past it, "
            "tokens go to a scratch folder next to --out and the rows are filled from there in a second "
            "pass: the same output, flat memory.",
        ),
        chat_template: Annotated[
            Path | None,
            typer.Option(
                "--chat-template",
                help="A jinja chat template file (a model's chat_template.jinja) for chat rows, instead "
                "of the tokenizer's own.",
            ),
        ] = None,
        as_json: opt.Json = False,
        demo: bool = typer.Option(
            False,
            "--demo",
            help="Pack the built-in demo SFT data (defaults: --tokenizer qwen3 --seq-length 4096).",
        ),
    ) -> None:
        """Tokenize SFT data and write Megatron-Bridge packed Parquet, metadata and a manifest."""
        from longpack.errors import ConfigError
        from longpack.jobs.pack import PackConfig

        if ray_address is not None and backend != "ray":
            raise ConfigError("ray_address needs backend ray", fields=("ray_address", "backend"))
        positional = list(inputs or [])
        if mix:
            # `--mix a.jsonl=0.7 b/=0.3`: the entries after the first arrive as arguments
            mix = [*mix, *[p for p in positional if "=" in p]]
            positional = [p for p in positional if "=" not in p]
        executor: Any = backend
        if backend == "ray":
            from longpack.cluster.ray_pack import RayExecutor

            executor = RayExecutor(address=ray_address, workers=workers)
        config = PackConfig(
            inputs=positional,
            mix=mix or None,
            out=out,
            tokenizer=tokenizer,
            seq_length=seq_length,
            pack_size=pack_size,
            pad_seq_to_mult=pad_seq_to_mult,
            tp=tp,
            cp=cp,
            sp=sp,
            algorithm=algorithm,
            balance=balance,
            seed=seed,
            overlength=overlength,
            val_fraction=val_fraction,
            val_inputs=list(val_input or []),
            text=text_config(
                fmt=fmt,
                prompt_key=prompt_key,
                completion_key=completion_key,
                prompt_template=prompt_template,
                separator=separator,
                prompt_completion_loss=prompt_completion_loss,
                chat_loss=chat_loss,
                messages_key=messages_key,
                skip_malformed=skip_malformed,
                tools_key=tools_key,
            ),
            rows_per_shard=rows_per_shard,
            overwrite=overwrite,
            ids_dtype=ids_dtype,
            output_format=output_format,
            row_group_size=row_group_size,
            compat=compat,
            pad_to_max_length=pad_to_max_length,
            pad_cu_seqlens=pad_cu_seqlens,
            backend=executor,
            workers=None if backend == "ray" else workers,
            demo=demo,
            progress=not as_json and sys.stderr.isatty(),
            memory_budget=memory_budget,
            chat_template=chat_template,
        )
        result = config.run()
        summary = result.summary()
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
            return
        print_summary(summary, result.manifest.to_dict())
        if result.backend is not None and "out_of_core" in result.backend:
            spilled = result.backend["out_of_core"]["spilled_tokens"]
            typer.echo(
                f"  two passes: {spilled} tokens went through the scratch folder (past --memory-budget)"
            )
        if result.backend is not None and result.backend.get("name") == "ray":
            mem = result.backend
            workers_mib = [round(v / 2**20) for v in mem["worker_peak_rss_bytes"].values()]
            typer.echo(
                f"ray: peak RSS driver {mem['driver_peak_rss_bytes'] / 2**20:.0f} MiB, "
                f"{len(workers_mib)} worker processes, max {max(workers_mib, default=0)} MiB"
            )


def listed_note(listed: int, total: int) -> str:
    """How much of a capped manifest list is there.

    >>> listed_note(3, 3), listed_note(100000, 100250)
    ('all listed in manifest.json', 'the first 100000 listed in manifest.json, 250 not listed')
    """
    if listed >= total:
        return "all listed in manifest.json"
    return f"the first {listed} listed in manifest.json, {total - listed} not listed"


def print_summary(summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The human-readable account of a finished pack (``summary``: ``PackResult.summary()``)."""
    c = summary["counts"]
    echo = typer.echo
    echo(f"packed -> {summary['out']}")
    echo(
        f"  format: {summary['format']}   tokenizer: {summary['tokenizer'].get('name', summary['tokenizer'])}"
    )
    echo(
        f"  pad_seq_to_mult: {summary['pad_seq_to_mult']}  ({opt.cli_message(summary['pad_seq_to_mult_source'], opt.MULT_FIELDS)})"
    )
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
            total = split[kind + "_count"]
            echo(f"  {name}: {total} {kind} ({listed_note(len(entries), total)}):")
            for e in entries[:SHOWN]:
                detail = f"kept {e['kept_tokens']} tokens" if kind == "truncated" else e["reason"]
                echo(f"    {e['source']}: {e['stored_length']} tokens, {detail}")
            if total > SHOWN:
                echo(f"    ... {total - SHOWN} more")
    if manifest["malformed"]:
        echo(
            f"  malformed rows skipped: {c['malformed']} ({listed_note(len(manifest['malformed']), c['malformed'])}; "
            f"first: {manifest['malformed'][0]['source']})"
        )
    for info in manifest.get("inputs", [])[:SHOWN]:
        cols = info.get("columns")
        if cols is None:
            continue
        ignored = ", ".join(f"{k} ({n})" for k, n in cols["ignored"].items()) or "none"
        echo(
            f"  {info['path']}: {info['rows']} rows; columns used: {', '.join(cols['used']) or '-'}; ignored: {ignored}"
        )
    if len(manifest.get("inputs", [])) > SHOWN:
        echo(f"  ... {len(manifest['inputs']) - SHOWN} more inputs (columns of each in manifest.json)")
    mix = manifest.get("mix")
    if mix:
        echo(f"  mix: {mix['samples']} samples, seed {mix['seed']}")
        for src in mix["sources"]:
            echo(
                f"    {src['name']}: weight {src['weight']} ({src['share']:.1%}), rows read {src['rows_read']}, "
                f"malformed {src['malformed']}, samples {src['samples']}, drawn {src['drawn']} "
                f"({src['epochs']:g} epochs: {src['unused']} unused, {src['repeated']} repeats), "
                f"packed {src['packed']}, truncated {src['truncated']}, dropped {src['dropped']}"
            )
    for warning in manifest.get("warnings", []):
        echo(f"  warning: {warning}")
    for note in summary.get("notes", []):
        echo(f"  note: {opt.cli_message(note, ('separator', 'prompt_template'))}")
    handoff = summary["bridge_config"]
    echo(f"Megatron-Bridge config ({handoff['api']} API): {handoff['path']}")
    echo("  as Hydra overrides (paste after the launcher, e.g. run_recipe.py --recipe ...):")
    overrides = handoff["overrides"]
    for i, item in enumerate(overrides):
        echo(f"    {item}" + (" \\" if i + 1 < len(overrides) else ""))
    echo("  in a recipe (Python):")
    for line in handoff["python"].splitlines():
        echo(f"    {line}" if line else "")
    echo(f"  check it: longpack check {handoff['path']} --packed {summary['out']}")
