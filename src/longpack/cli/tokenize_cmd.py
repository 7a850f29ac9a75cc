"""``longpack tokenize``: inputs -> a token store to pack again and again (parse -> ``TokenizeConfig`` -> run ->
print)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from longpack.cli import options as opt


def register(app: typer.Typer) -> None:
    @app.command("tokenize")
    def tokenize(
        inputs: Annotated[
            list[str], typer.Argument(metavar="INPUT...", help="JSONL / Parquet files, folders or globs.")
        ],
        out: Annotated[
            Path, typer.Option("--out", help="Store folder to write (must not exist unless --overwrite).")
        ],
        tokenizer: opt.Tokenizer = None,
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
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing store."),
        as_json: opt.Json = False,
    ) -> None:
        """Tokenize once into a store; `longpack pack --store STORE` then packs it at any size, mult,
        algorithm, split, seed or format without tokenizing again."""
        from longpack.cli.pack_cmd import text_config
        from longpack.jobs.tokenize import TokenizeConfig

        config = TokenizeConfig(
            inputs=inputs,
            out=out,
            tokenizer=tokenizer,
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
            workers=workers,
            overwrite=overwrite,
            progress=not as_json and sys.stderr.isatty(),
        )
        summary = config.run().summary()
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
            return
        typer.echo(
            f"token store -> {summary['store']}: {summary['samples']} samples, {summary['tokens']} tokens from "
            f"{summary['inputs']} input file(s), tokenizer {summary['tokenizer']}, format {summary['format']}"
        )
        typer.echo(f"  pack it: longpack pack --store {summary['store']} --seq-length N --out OUT")
