"""``longpack preview``: decoded samples with what they train on marked (parse -> ``PreviewConfig`` -> run ->
print)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from longpack.cli import options as opt


def register(app: typer.Typer) -> None:
    @app.command("preview")
    def preview(
        inputs: Annotated[
            list[str], typer.Argument(metavar="INPUT...", help="Files, folders, globs or hf:org/name.")
        ],
        tokenizer: opt.Tokenizer = None,
        index: Annotated[
            list[int] | None,
            typer.Option("--index", help="Row position over all inputs, 0-based (repeatable)."),
        ] = None,
        at: Annotated[
            list[str] | None, typer.Option("--at", help="Row as reports name it, FILE:ROW (repeatable).")
        ] = None,
        random: int | None = typer.Option(None, "--random", help="Show this many rows drawn with --seed."),
        seed: opt.Seed = 0,
        limit: int = typer.Option(3, "--limit", help="Rows shown when nothing is selected (the first ones)."),
        html: Annotated[
            Path | None, typer.Option("--html", help="Also write the samples as an HTML page here.")
        ] = None,
        fmt: opt.Format = "auto",
        prompt_key: opt.PromptKey = "prompt",
        completion_key: opt.CompletionKey = "completion",
        prompt_template: opt.PromptTemplate = "{prompt}",
        separator: opt.Separator = "",
        prompt_completion_loss: opt.PromptCompletionLoss = "completion",
        chat_loss: opt.ChatLoss = "assistant",
        messages_key: opt.MessagesKey = "messages",
        tools_key: opt.ToolsKey = "tools",
        text_key: opt.TextKey = "text",
        append_eod: opt.AppendEod = True,
        as_json: opt.Json = False,
    ) -> None:
        """Show samples decoded, supervised tokens highlighted (colours on a terminal, [[ ]] when piped)."""
        from longpack.cli.pack_cmd import text_config
        from longpack.jobs.preview import PreviewConfig

        config = PreviewConfig(
            inputs=inputs,
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
                skip_malformed=True,
                tools_key=tools_key,
                text_key=text_key,
                append_eod=append_eod,
            ),
            index=index or (),
            at=at or (),
            random=random,
            seed=seed,
            limit=limit,
        )
        result = config.run()
        if html is not None:
            from longpack.packed.files import atomic_write_bytes

            atomic_write_bytes(html, result.html().encode("utf-8"))
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
            return
        from rich.console import Console

        console = Console(highlight=False, soft_wrap=True)
        if console.is_terminal and sys.stdout.isatty():
            console.print(result.text(color=True))
        else:
            typer.echo(result.text(color=False))
        if html is not None:
            typer.echo(f"wrote {html}", err=True)
