"""The preview job: a few samples decoded, with what they train on marked, before packing anything.

>>> import tempfile, pathlib, json
>>> src = pathlib.Path(tempfile.mkdtemp()) / "chat.jsonl"
>>> row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
>>> _ = src.write_text(json.dumps(row) + "\\n")
>>> r = PreviewConfig(inputs=[str(src)], tokenizer="bytes").run()
>>> s = r.samples[0]
>>> s.source.endswith("chat.jsonl:1"), s.tokens, s.supervised
(True, 25, 3)
>>> print(r.text(color=False).splitlines()[1])
<|im_start|>user
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longpack.errors import ConfigError
from longpack.jobs.options import inputs_option, seed_option, tokenizer_option
from longpack.option import option, refuse_unknown_settings
from longpack.text.rows import TextConfig

__all__ = ["PreviewConfig", "PreviewResult"]

if TYPE_CHECKING:
    from longpack.text.preview import PreviewSample


@dataclass(frozen=True, kw_only=True)
class PreviewConfig:
    """Which rows to show and how they are tokenized; validated on construction, run with :meth:`run`.

    - ``inputs``, ``tokenizer``, ``text``: as for :class:`~longpack.jobs.PackConfig`.
    - Selection (combinable): ``index`` (0-based positions over all rows of the inputs, in input order),
      ``at`` (``"FILE:ROW"``, the way reports name rows; ``FILE`` may be just the file's name), ``random``
      (that many rows drawn with ``seed``). None given: the first ``limit`` rows.
    """

    command_help = (
        "Show samples decoded, supervised tokens highlighted (colours on a terminal, [[ ]] when piped)."
    )

    inputs: Sequence[str | Path] | str | Path = inputs_option(
        "Files, folders, globs or hf:org/name.", metavar="INPUT...", required=True
    )
    tokenizer: Any = tokenizer_option()
    index: Sequence[int] = option(
        (), help="Row position over all inputs, 0-based (repeatable).", cli_type=list[int] | None
    )
    at: Sequence[str] = option(
        (), help="Row as reports name it, FILE:ROW (repeatable).", cli_type=list[str] | None
    )
    random: int | None = option(None, help="Show this many rows drawn with --seed.")
    seed: int = seed_option()
    limit: int = option(3, help="Rows shown when nothing is selected (the first ones).")
    #: Also write the samples as a self-contained HTML page here (:meth:`PreviewResult.html`).
    html: str | Path | None = option(
        None, help="Also write the samples as an HTML page here.", cli_type=Path | None
    )
    # malformed rows are always shown as such (never an error), so skip_malformed is not offered
    text: TextConfig = option(
        default_factory=TextConfig, help="How rows become samples.", nested_except=("skip_malformed",)
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        set_ = object.__setattr__
        inputs = [self.inputs] if isinstance(self.inputs, str | Path) else list(self.inputs)
        if not inputs:
            raise ConfigError("no inputs: give at least one file, folder, glob or hub id", fields="inputs")
        set_(self, "inputs", tuple(str(p) for p in inputs))
        if self.tokenizer is None:
            raise ConfigError(
                "tokenizer is required ('qwen3', 'bytes', a tokenizer.json or a model folder)",
                fields="tokenizer",
            )
        if not isinstance(self.text, TextConfig):
            raise ConfigError(
                f"text must be a longpack.text.TextConfig, got {type(self.text).__name__}", fields="text"
            )
        index = tuple(self.index)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in index):
            raise ConfigError(f"index must hold row positions >= 0, got {list(index)}", fields="index")
        set_(self, "index", index)
        at = tuple(self.at)
        for spec in at:
            name, sep, row = str(spec).rpartition(":")
            if not sep or not name or not row.isdigit():
                raise ConfigError(f"at {spec!r} must be FILE:ROW (e.g. data.jsonl:17)", fields="at")
        set_(self, "at", at)
        self._check_counts()

    def _check_counts(self) -> None:
        if self.random is not None and (
            isinstance(self.random, bool) or not isinstance(self.random, int) or self.random < 1
        ):
            raise ConfigError(
                f"random must be a positive number of rows, got {self.random!r}", fields="random"
            )
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ConfigError(f"limit must be a positive integer, got {self.limit!r}", fields="limit")

    def _sample(self, row: Any, error: str | None, fmt: str, tok: Any, label: str) -> PreviewSample:
        """One selected row decoded, or the reason it could not be read or made a sample."""
        from longpack.text.preview import PreviewSample, preview_sample
        from longpack.text.rows import RowError, sample_from_row

        if error is not None:
            return PreviewSample(source=label, error=error)
        try:
            ids, mask = sample_from_row(row, fmt, self.text, tok)
        except RowError as e:
            return PreviewSample(source=label, error=str(e))
        return preview_sample(ids, list(mask), tok, source=label)

    def _wanted_index(self, sources: Any) -> tuple[set[int], int | None]:
        """The row positions asked for (``index``, plus ``random`` of them, seeded) and, when ``random``
        needed it, the rows in all."""
        import numpy as np

        from longpack.text.pipeline import count_rows

        wanted = set(self.index)
        if self.random is None:
            return wanted, None
        total = sum(count_rows(s) for s in sources)
        k = min(self.random, total)
        wanted |= {int(i) for i in np.random.default_rng(self.seed).choice(total, size=k, replace=False)}
        return wanted, total

    def run(self) -> PreviewResult:
        """Read the inputs up to the selected rows, tokenize just those, and decode them."""
        from longpack.text.inputs import find_inputs
        from longpack.text.pipeline import _file_format, read_rows
        from longpack.text.tokenizers import as_tokenizer

        tok = as_tokenizer(self.tokenizer)
        sources = find_inputs([str(p) for p in self.inputs]).files  # type: ignore[union-attr]
        wanted_index, total = self._wanted_index(sources)
        wanted_at: dict[tuple[str, int], str] = {}
        for spec in self.at:
            name, _, row = spec.rpartition(":")
            wanted_at[(name, int(row))] = spec
        first_only = not wanted_index and not wanted_at
        picked: dict[int, PreviewSample] = {}
        found_at: set[str] = set()
        position = 0
        last_wanted = max(wanted_index, default=-1)
        for source in sources:
            fmt = _file_format(source, source.kind, self.text)
            if fmt is None:
                continue
            for row_no, row, error in read_rows(source, fmt):
                label = f"{source.label}:{row_no}"
                at_specs = _at_specs(wanted_at, source, row_no)
                found_at |= at_specs
                hit = position < self.limit if first_only else position in wanted_index or bool(at_specs)
                if hit:
                    picked[position] = self._sample(row, error, fmt, tok, label)
                position += 1
                done_first = first_only and position >= self.limit
                done_sel = not first_only and position > last_wanted and len(found_at) == len(wanted_at)
                if done_first or done_sel:
                    break
            else:
                continue
            break
        _check_found(set(wanted_at.values()) - found_at, wanted_index, position)
        result = PreviewResult(
            samples=tuple(picked[k] for k in sorted(picked)),
            tokenizer=tok.name,
            rows_seen=position,
            rows_total=total,
            html_path=None if self.html is None else str(self.html),
        )
        if self.html is not None:
            from longpack.outputs import atomic_write_bytes

            atomic_write_bytes(Path(self.html), result.html().encode("utf-8"))
        return result


def _at_specs(wanted_at: dict[tuple[str, int], str], source: Any, row_no: int) -> set[str]:
    """The ``at`` specs naming this row: by the input's label, file name or path."""
    names = (source.label, source.path.name, str(source.path))
    return {spec for name in names if (spec := wanted_at.get((name, row_no))) is not None}


def _check_found(missing_at: set[str], wanted_index: set[int], rows: int) -> None:
    """Refuse an ``at`` row the inputs do not have, or an ``index`` past their ``rows``."""
    if missing_at:
        raise ConfigError(
            f"at: no row {', '.join(sorted(missing_at))} in the inputs; rows are named FILE:ROW as in reports",
            fields="at",
        )
    beyond = sorted(i for i in wanted_index if i >= rows)
    if beyond:
        raise ConfigError(f"index {beyond[0]} is past the last row ({rows} rows)", fields="index")


@dataclass(frozen=True, kw_only=True)
class PreviewResult:
    """The selected samples (``longpack.text.preview.PreviewSample``) and how to show them."""

    samples: tuple[PreviewSample, ...]
    tokenizer: str
    rows_seen: int
    rows_total: int | None = None
    #: Where the HTML page was written (``PreviewConfig.html``), or ``None``.
    html_path: str | None = None

    def text(self, *, color: bool) -> str:
        """Every sample as text (rich markup with ``color``, ``[[ ]]`` markers without)."""
        from longpack.text.preview import render_text

        return "\n\n".join(render_text(s, color=color) for s in self.samples)

    def html(self) -> str:
        """A self-contained HTML page of the samples."""
        from longpack.text.preview import render_html

        return render_html(self.samples, title=f"longpack preview ({self.tokenizer})")

    def to_dict(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer, "samples": [s.to_dict() for s in self.samples]}


# A setting of a nested config given at the top (PackConfig(skip_malformed=True)) names where it belongs.
refuse_unknown_settings(PreviewConfig)
