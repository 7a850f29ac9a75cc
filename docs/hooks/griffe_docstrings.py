"""Griffe extension: show longpack's plain-text docstrings well in mkdocstrings.

longpack's docstrings are written for ``help()`` and doctest, not for Markdown: examples are ``>>>``
doctest blocks, literal blocks follow a line ending in ``::`` and names sit in Sphinx roles
(``:func:`name```). Python-Markdown would turn ``>>>`` into nested block quotes and print the roles
verbatim, so this extension rewrites each docstring before it is rendered:

- a doctest block (a ``>>>`` line up to the next blank line) becomes a fenced ``pycon`` block;
- an indented literal block after ``::`` becomes a fenced ``text`` block (or ``pycon`` when it holds
  ``>>>`` lines);
- ``:role:`~a.b.name``` becomes ```name``` and ``:role:`a.b.name``` becomes ```a.b.name```.

Only the rendered page changes; the source and the doctests are untouched.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from griffe import Extension

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    if match.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _fence(lines: list[str], language: str) -> list[str]:
    body = textwrap.dedent("\n".join(lines)).strip("\n").split("\n")
    return [f"```{language}", *body, "```"]


def markdown_docstring(text: str) -> str:
    r"""Rewrite one docstring (see the module docstring).

    >>> out = markdown_docstring("Sum.\n\n>>> 1 + 1\n2\n\nUses :func:`~a.b`.").splitlines()
    >>> out[2:6] == ["```pycon", ">" * 3 + " 1 + 1", "2", "```"], out[-1]
    (True, 'Uses `b`.')
    >>> markdown_docstring("Layout::\n\n    a.parquet\n\nEnd.").splitlines()[:5]
    ['Layout:', '', '```text', 'a.parquet', '```']
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
            out.append(line)
            i += 1
            continue
        if in_fence:
            out.append(line)
            i += 1
            continue
        if stripped.startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            out.extend(_fence(block, "pycon"))
            continue
        if stripped.endswith("::") and not stripped.startswith(".."):
            head = line.rstrip()[:-1]  # "Example::" -> "Example:"
            indent = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            block = []
            while j < len(lines) and (
                not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
            ):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            if block:
                if head.strip() != ":":
                    out.append(_ROLE.sub(_role, head))
                out.append("")
                language = "pycon" if any(b.strip().startswith(">>>") for b in block) else "text"
                out.extend(_fence(block, language))
                out.append("")
                i = j
                continue
        out.append(_ROLE.sub(_role, line))
        i += 1
    return "\n".join(out)


class PlainDocstrings(Extension):
    """Apply :func:`markdown_docstring` to every docstring griffe reads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
