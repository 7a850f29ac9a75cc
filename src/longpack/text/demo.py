"""A real-text demo SFT data set built at run time from the Python standard library on this machine.

Nothing is shipped or downloaded: ``write_demo_dataset`` parses the standard library's sources with ``ast``
(modules in sorted path order; nothing is imported, so no module side effects) and turns docstrings,
signatures and source code into prompt/completion and chat records. The length distribution has a long tail:
most records are docstrings (tens to hundreds of tokens), some are function sources, and a few are whole
classes of several thousand tokens. The same Python version, ``n`` and ``seed`` give byte-identical files.

Files written into the folder:

- ``prompt_completion.jsonl``: ``{"prompt", "completion"}`` rows (about 60 %);
- ``chat.jsonl``: ``{"messages": [{"role", "content"}, ...]}`` rows, one or two user/assistant exchanges,
  some with a system message (about 40 %).

``demo_folder()`` is what ``longpack pack --demo`` (and ``sweep --demo``) reads: the data is generated once
into a cache folder and read from there afterwards (``demo_inputs()``: its file paths).
"""

from __future__ import annotations

import ast
import json
import os
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack.outputs import atomic_write_bytes

DEMO_VERSION = 1
DEMO_FILES = ("chat.jsonl", "prompt_completion.jsonl")
_SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "lib2to3",
        "turtledemo",
        "ensurepip",
        "idlelib",
        "encodings",
    }
)
_MAX_SOURCE_CHARS = 60_000
_SYSTEM_PROMPTS = (
    "You are a helpful assistant who knows the Python standard library well.",
    "You are a senior Python developer. Answer precisely.",
)


@dataclass(frozen=True)
class _Item:
    module: str
    qualname: str
    kind: str  # "function" | "class" | "module"
    signature: str
    doc: str | None
    source: str


def _stdlib_files() -> Iterator[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(("config-", "lib-dynload", "."))
        )
        if rel.parts and rel.parts[0] in _SKIP_DIRS:
            continue
        for name in sorted(filenames):
            if name.endswith(".py"):
                parts = [*rel.parts, name[:-3]]
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                yield ".".join(parts) or name[:-3], Path(dirpath) / name


def _items() -> Iterator[_Item]:
    """Module, class and function items of the standard library, in a fixed order."""
    for module, path in _stdlib_files():
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        doc = ast.get_docstring(tree)
        if doc and len(doc) > 80:
            yield _Item(module, module, "module", "", doc, "")

        def walk(
            nodes: list[ast.stmt], prefix: str, module: str = module, lines: list[str] = lines
        ) -> Iterator[_Item]:
            for node in nodes:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                end = node.end_lineno or node.lineno
                text = textwrap.dedent("\n".join(lines[start - 1 : end]))
                if len(text) > _MAX_SOURCE_CHARS:
                    continue
                qual = prefix + node.name
                if isinstance(node, ast.ClassDef):
                    bases = ", ".join(ast.unparse(b) for b in node.bases)
                    yield _Item(
                        module, qual, "class", f"({bases})" if bases else "", ast.get_docstring(node), text
                    )
                    yield from walk(node.body, qual + ".")
                else:
                    sig = f"({ast.unparse(node.args)})"
                    yield _Item(module, qual, "function", sig, ast.get_docstring(node), text)

        yield from walk(tree.body, "")


def _records(item: _Item, rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """``(file, row)`` records made from one item (zero, one or two)."""
    m, q, sig = item.module, item.qualname, item.signature
    code = f"```python\n{item.source}\n```" if item.source else ""
    out: list[tuple[str, dict[str, Any]]] = []
    r = float(rng.random())
    if item.kind == "module":
        prompt = ("Summarize the purpose of the `{m}` module.", "What is the Python module `{m}` for?")[
            int(rng.integers(2))
        ]
        out.append(("prompt_completion.jsonl", {"prompt": prompt.format(m=m), "completion": item.doc}))
    elif item.doc and r < 0.40:
        prompt = (
            "Explain what `{q}` in the `{m}` module does.",
            "What does `{m}.{q}{sig}` do?",
            "Write the docstring for `{m}.{q}{sig}`.",
        )[int(rng.integers(3))]
        out.append(
            ("prompt_completion.jsonl", {"prompt": prompt.format(m=m, q=q, sig=sig), "completion": item.doc})
        )
    elif item.doc and r < 0.65:
        prompt = f"Implement `{q}{sig}` for the `{m}` module. It should do this:\n\n{item.doc}"
        out.append(("prompt_completion.jsonl", {"prompt": prompt, "completion": code}))
    elif item.doc:
        messages: list[dict[str, str]] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": _SYSTEM_PROMPTS[int(rng.integers(2))]})
        messages += [
            {"role": "user", "content": f"What does `{m}.{q}` do?"},
            {"role": "assistant", "content": item.doc},
        ]
        if rng.random() < 0.6:
            messages += [
                {"role": "user", "content": "Show me how it is implemented."},
                {"role": "assistant", "content": f"Here is the source of `{q}` from `{m}`:\n\n{code}"},
            ]
        out.append(("chat.jsonl", {"messages": messages}))
    elif r < 0.5:
        out.append(
            (
                "prompt_completion.jsonl",
                {"prompt": f"Write `{q}{sig}` as in Python's `{m}` module.", "completion": code},
            )
        )
    else:
        messages = [
            {"role": "user", "content": f"Can you show me the code of `{q}` in `{m}`?"},
            {"role": "assistant", "content": code},
        ]
        out.append(("chat.jsonl", {"messages": messages}))
    return out


def write_demo_dataset(path: Path, *, n: int = 12000, seed: int = 0) -> Path:
    """Write ``n`` demo records into the folder ``path`` (created if needed) and return the folder.

    Deterministic for a given Python version, ``n`` and ``seed``; takes a few seconds for 12,000 records.
    Raises ``ValueError`` if the standard library holds too little text for ``n`` (it holds ~30,000).

        >>> import tempfile
        >>> d = write_demo_dataset(Path(tempfile.mkdtemp()) / "demo", n=20, seed=1)
        >>> sorted(p.name for p in d.iterdir())
        ['chat.jsonl', 'prompt_completion.jsonl']
        >>> sum(len(p.read_text().splitlines()) for p in d.iterdir())
        20
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    rng = np.random.default_rng(seed)
    by_file: dict[str, list[str]] = {name: [] for name in DEMO_FILES}
    count = 0
    for item in _items():
        for file, row in _records(item, rng):
            by_file[file].append(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
        if count >= n:
            break
    if count < n:
        raise ValueError(f"the standard library gave only {count} demo records; ask for n <= {count}")
    # One item may give the n-th record plus one more; drop from the end of the last file written.
    while count > n:
        longest = max(by_file, key=lambda k: len(by_file[k]))
        by_file[longest].pop()
        count -= 1
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, lines in by_file.items():
        atomic_write_bytes(path / name, "".join(lines).encode("utf-8"))
    return path


def demo_folder(cache_dir: Path | None = None, *, n: int = 12000, seed: int = 0) -> Path:
    """The cached folder ``.../longpack-demo`` holding the demo data set, generated on first use (what
    ``longpack pack --demo`` reads: the data is the same on every run, so it is made once per machine).

    The cache lives in ``cache_dir`` (default ``$LONGPACK_CACHE`` or ``~/.cache/longpack``) under a folder
    named by the generator version, Python version, ``n`` and ``seed``; ``OSError`` if it cannot be written.

        >>> import tempfile
        >>> folder = demo_folder(Path(tempfile.mkdtemp()), n=30)
        >>> folder.name, sorted(p.name for p in folder.iterdir())
        ('longpack-demo', ['chat.jsonl', 'prompt_completion.jsonl'])
    """
    base = cache_dir or Path(os.environ.get("LONGPACK_CACHE", "~/.cache/longpack")).expanduser()
    root = Path(base) / f"demo-v{DEMO_VERSION}-py{sys.version_info[0]}{sys.version_info[1]}-n{n}-seed{seed}"
    folder = root / "longpack-demo"
    done = root / "COMPLETE"
    if not (done.is_file() and all((folder / name).is_file() for name in DEMO_FILES)):
        write_demo_dataset(folder, n=n, seed=seed)
        atomic_write_bytes(done, f"{n} records, seed {seed}\n".encode())
    return folder


def demo_inputs(cache_dir: Path | None = None, *, n: int = 12000, seed: int = 0) -> list[str]:
    """Paths of the demo data set's files in the cache of :func:`demo_folder`, generated on first use.

    >>> import tempfile
    >>> files = demo_inputs(Path(tempfile.mkdtemp()), n=30)
    >>> [Path(f).name for f in files]
    ['chat.jsonl', 'prompt_completion.jsonl']
    """
    folder = demo_folder(cache_dir, n=n, seed=seed)
    return [str(folder / name) for name in DEMO_FILES]
