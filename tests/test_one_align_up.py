"""Rounding up to a multiple (a sequence padded to ``pad_seq_to_mult``) is written once,
``longpack.topology.align_up``: a static walk (ast) of src/longpack fails on ``-(-n // m) * m`` and
``(n + m - 1) // m * m`` written out anywhere else (issue 41)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "longpack"


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _ceil_div_by(node: ast.AST) -> ast.expr | None:
    """The divisor ``m`` of ``-(-n // m)`` or ``(n + m - 1) // m``, else ``None``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        if (
            isinstance(inner, ast.BinOp)
            and isinstance(inner.op, ast.FloorDiv)
            and isinstance(inner.left, ast.UnaryOp)
            and isinstance(inner.left.op, ast.USub)
        ):
            return inner.right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
        top = node.left
        if (
            isinstance(top, ast.BinOp)
            and isinstance(top.op, ast.Sub)
            and isinstance(top.right, ast.Constant)
            and top.right.value == 1
            and isinstance(top.left, ast.BinOp)
            and isinstance(top.left.op, ast.Add)
            and _same(top.left.right, node.right)
        ):
            return node.right
    return None


def round_ups(src: Path = SRC) -> Iterator[str]:
    for path in sorted(src.rglob("*.py")):
        if path.name == "topology.py" and path.parent == src:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                for a, b in ((node.left, node.right), (node.right, node.left)):
                    m = _ceil_div_by(a)
                    if m is not None and _same(m, b):
                        yield f"{path.relative_to(src.parent)}:{node.lineno}: use longpack.topology.align_up"


def test_rounding_up_to_a_multiple_is_written_once() -> None:
    found = list(round_ups())
    assert not found, "\n".join(found)


def test_the_walk_finds_both_spellings(tmp_path: Path) -> None:
    (tmp_path / "longpack").mkdir()
    (tmp_path / "longpack" / "m.py").write_text(
        "a = -(-n // m) * m\nb = ((n + k - 1) // k) * k\nc = -(-n // m) * 2\nd = -(-n // dp)\n"
    )
    found = [f.split(": ")[0] for f in round_ups(tmp_path / "longpack")]
    assert found == ["longpack/m.py:1", "longpack/m.py:2"]
