"""What a sample trains on, for people: decoded text with the supervised tokens marked, special tokens
shown, and per-sample counts.

A sample's loss mask is unshifted (1 on each token that is a target); the packer shifts it, so the first
token of a sample is never trained on and ``trained`` counts ``loss_mask[1:]``.

Example::

    >>> from longpack.text.tokenizers import load_tokenizer
    >>> tok = load_tokenizer("bytes")
    >>> s = preview_sample(tok.encode("Hi<|im_end|>yo<|im_end|>"), [0, 0, 0, 1, 1, 1], tok, source="a.jsonl:3")
    >>> render_text(s, color=False)
    'a.jsonl:3  6 tokens, 3 supervised (3 trained targets)\\nHi<|im_end|>[[yo<|im_end|>]]'
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from longpack.text.tokenizers import Tokenizer

OPEN, CLOSE = "[[", "]]"  # supervised-span markers when colours are off (pipes, files)


@dataclass(frozen=True)
class Segment:
    """A run of tokens decoded together: all supervised or not, and a special token on its own."""

    text: str
    supervised: bool
    special: bool


@dataclass(frozen=True)
class PreviewSample:
    """One sample as a person reads it (``error``: why the row gave no sample)."""

    source: str
    input_ids: tuple[int, ...] = ()
    loss_mask: tuple[int, ...] = ()
    segments: tuple[Segment, ...] = ()
    error: str | None = None

    @property
    def tokens(self) -> int:
        return len(self.input_ids)

    @property
    def supervised(self) -> int:
        """Tokens whose loss mask is 1."""
        return sum(self.loss_mask)

    @property
    def trained(self) -> int:
        """Targets the model is trained on (the mask after the next-token shift: ``loss_mask[1:]``)."""
        return sum(self.loss_mask[1:])

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "tokens": self.tokens,
            "supervised": self.supervised,
            "trained": self.trained,
            "input_ids": list(self.input_ids),
            "loss_mask": list(self.loss_mask),
            "segments": [
                {"text": s.text, "supervised": s.supervised, "special": s.special} for s in self.segments
            ],
            "error": self.error,
        }


def preview_sample(
    ids: Sequence[int], mask: Sequence[int], tokenizer: Tokenizer, *, source: str = ""
) -> PreviewSample:
    """Cut a sample into segments: runs of equal supervision, each special token alone, decoded."""
    specials = set(tokenizer.special_tokens.values())
    segments: list[Segment] = []
    run: list[int] = []
    run_mask = None
    for t, m in zip(ids, mask, strict=True):
        special = int(t) in specials
        if run and (special or bool(m) != run_mask):
            segments.append(Segment(tokenizer.decode(run), bool(run_mask), False))
            run = []
        if special:
            segments.append(Segment(tokenizer.decode([int(t)]), bool(m), True))
            continue
        run.append(int(t))
        run_mask = bool(m)
    if run:
        segments.append(Segment(tokenizer.decode(run), bool(run_mask), False))
    return PreviewSample(
        source=source,
        input_ids=tuple(int(i) for i in ids),
        loss_mask=tuple(int(m) for m in mask),
        segments=tuple(segments),
    )


def _header(s: PreviewSample) -> str:
    if s.error is not None:
        return f"{s.source}  malformed: {s.error}"
    return f"{s.source}  {s.tokens} tokens, {s.supervised} supervised ({s.trained} trained targets)"


def render_text(sample: PreviewSample, *, color: bool) -> str:
    """The sample as text: with ``color``, rich markup (supervised green, others dim, special tokens
    magenta); without, supervised spans between ``[[`` and ``]]`` (what goes to a pipe or a file)."""
    if sample.error is not None:
        return _header(sample)
    parts = []
    if color:
        from rich.markup import escape

        for seg in sample.segments:
            style = "bold magenta" if seg.special else ("green" if seg.supervised else "dim")
            if seg.special and seg.supervised:
                style = "bold magenta on dark_green"
            parts.append(f"[{style}]{escape(seg.text)}[/]")
        return f"[bold]{escape(_header(sample))}[/]\n" + "".join(parts)
    inside = False
    for seg in sample.segments:
        if seg.supervised != inside:
            parts.append(OPEN if seg.supervised else CLOSE)
            inside = seg.supervised
        parts.append(seg.text)
    if inside:
        parts.append(CLOSE)
    return _header(sample) + "\n" + "".join(parts)


_CSS = """
body { font-family: ui-sans-serif, system-ui, sans-serif; margin: 2em; }
.sample { margin-bottom: 2em; }
.head { font-weight: bold; margin-bottom: .3em; }
pre { white-space: pre-wrap; word-break: break-word; background: #fafafa; border: 1px solid #ddd;
      padding: .8em; font-family: ui-monospace, monospace; }
.sup { background: #c8f7c5; color: #064e03; }
.ctx { color: #777; }
.special { font-weight: bold; color: #a0148c; }
.sup.special { background: #9be7a0; }
.legend span { padding: 0 .4em; margin-right: 1em; }
.error { color: #b00020; }
"""


def render_html(samples: Sequence[PreviewSample], *, title: str = "longpack preview") -> str:
    """A self-contained HTML page of the samples (supervised tokens on green, special tokens bold)."""
    body = [
        f"<h1>{html.escape(title)}</h1>",
        '<p class="legend"><span class="sup">supervised (trained on)</span><span class="ctx">context (not '
        'trained on)</span><span class="special">special token</span></p>',
    ]
    for s in samples:
        body.append('<div class="sample">')
        body.append(f'<div class="head{" error" if s.error else ""}">{html.escape(_header(s))}</div>')
        if s.error is None:
            spans = []
            for seg in s.segments:
                cls = ("sup" if seg.supervised else "ctx") + (" special" if seg.special else "")
                spans.append(f'<span class="{cls}">{html.escape(seg.text)}</span>')
            body.append("<pre>" + "".join(spans) + "</pre>")
        body.append("</div>")
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>'
        + html.escape(title)
        + "</title><style>"
        + _CSS
        + "</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
