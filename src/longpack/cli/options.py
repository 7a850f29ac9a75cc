"""Typer options shared by ``pack`` and ``sweep`` (one definition, so their flags and help never drift)."""

from __future__ import annotations

from typing import Annotated

import typer

Workers = Annotated[int | None, typer.Option("--workers", help="Tokenizer processes (default: all cores).")]
Format = Annotated[
    str, typer.Option("--format", help="auto | prompt_completion | chat | sharegpt | pretokenized.")
]
PromptKey = Annotated[str, typer.Option("--prompt-key")]
CompletionKey = Annotated[str, typer.Option("--completion-key")]
PromptTemplate = Annotated[str, typer.Option("--prompt-template")]
Separator = Annotated[str, typer.Option("--separator")]
PromptCompletionLoss = Annotated[str, typer.Option("--prompt-completion-loss", help="completion | full.")]
ChatLoss = Annotated[str, typer.Option("--chat-loss", help="assistant | last_turn | full.")]
MessagesKey = Annotated[str, typer.Option("--messages-key")]
SkipMalformed = Annotated[bool, typer.Option("--skip-malformed", help="Skip and count malformed rows.")]
