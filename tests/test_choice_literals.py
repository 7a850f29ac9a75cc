"""A value of a choice list is written once, in ``longpack.choices``: a static walk (ast) of src/longpack, in the
style of ``test_import_graph.py``, fails on a string literal that spells a value of an enforced list anywhere
else (docstrings, so doctests, excepted; ``__all__`` entries are names of functions, not values).

Values that are also ordinary words (``drop``, ``local``, ``npy``, ...) count only where they stand for the
setting: compared with, assigned to, passed as or defaulted into a name of that setting (``overlength``,
``output_format``, ``backend``, ...), a dict key included (``settings["output_format"] == "npy"``). Values no
other meaning spells (``first_fit_shuffle``) count everywhere.

Lists not enforced yet are listed in ``NOT_YET`` with the reason; moving one to ``ENFORCED`` is a follow-up.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from longpack import choices

SRC = Path(__file__).resolve().parents[1] / "src" / "longpack"

#: list name in longpack.choices -> names of the setting it is the choices of (config fields, arguments,
#: manifest keys)
ENFORCED: dict[str, tuple[str, ...]] = {
    "ALGORITHMS": ("algorithm", "packing_algorithm"),
    "MEGATRON_ALGORITHMS": ("algorithm", "packing_algorithm"),
    "OVERLENGTH_POLICIES": ("overlength",),
    "ONLINE_OVERLENGTH_POLICIES": ("overlength",),
    "OUTPUT_FORMATS": ("output_format",),
    "IDS_DTYPES": ("ids_dtype",),
    "COMPAT_MODES": ("compat",),
    "BACKENDS": ("backend",),
    "EXECUTOR_CAPABILITIES": ("capability",),
    "WORKLOADS": ("workload",),
    "SCHEDULES": ("schedule",),
    "SAMPLERS": ("sampler",),
    "DEFERRED_VLM_ENCODERS": ("task_encoder", "target"),
    "ROLLOUT_DISTRIBUTIONS": ("distribution",),
    "ROLLOUT_FILLS": ("fill",),
    "TEXT_FORMATS": ("format", "fmt"),
    "PROMPT_COMPLETION_LOSSES": ("prompt_completion_loss",),
    "CHAT_LOSSES": ("chat_loss",),
    "VERIFY_BACKENDS": ("backend",),
}
#: Single values beside the lists (defaults, the balanced packer's name), with the settings they belong to.
ENFORCED_VALUES: dict[str, tuple[str, ...]] = {
    "DEFAULT_ALGORITHM": ENFORCED["ALGORITHMS"],
    "MEGATRON_ALGORITHM": ENFORCED["ALGORITHMS"],
    "BALANCED_ALGORITHM": ENFORCED["ALGORITHMS"],
    "DEFAULT_ROLLOUT_DISTRIBUTION": ENFORCED["ROLLOUT_DISTRIBUTIONS"],
    "DEFAULT_ROLLOUT_FILL": ENFORCED["ROLLOUT_FILLS"],
}
#: Lists whose literals are still spelled out elsewhere, and why they are not enforced yet.
NOT_YET: dict[str, str] = {
    name: "its values are spelled in the text, planner, vlm, rules and verify layers, which other work of "
    "this round edits; enforcing it is the next step of issue 41"
    for name in (
        "VLM_FAMILIES",
        "PRECISIONS",
        "BALANCE_PRECISIONS",
        "DISPATCHERS",
        "CP_COMM_TYPES",
        "OPTIMIZERS",
        "DATASET_KINDS",
    )
}
NOT_YET["SPLITS"] = (
    "split names are also the packed folder's file and folder names (training_<N>.idx.parquet, validation/), "
    "spelled in paths across packed, runtime and rules"
)


def _is_identifier_like(value: str) -> bool:
    """A value no ordinary word spells (``first_fit_shuffle``): flagged everywhere (``megatron-bridge`` is also
    a package's name, so it counts beside ``compat`` only)."""
    return "_" in value


def _values() -> dict[str, tuple[str, ...]]:
    """value -> the setting names it is a choice of."""
    out: dict[str, set[str]] = {}
    for name, settings in (*ENFORCED.items(), *ENFORCED_VALUES.items()):
        value = getattr(choices, name)
        for v in value if isinstance(value, tuple) else (value,):
            out.setdefault(v, set()).update(settings)
    return {v: tuple(sorted(s)) for v, s in out.items()}


def _name_of(node: ast.AST | None) -> str | None:
    """The setting name an expression reads: ``x``, ``a.x``, ``a["x"]``, ``a.get("x")``, ``getattr(a, "x")``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and _callee(node) in ("get", "getattr", "pop", "setdefault") and node.args:
        key = node.args[1] if _callee(node) == "getattr" and len(node.args) > 1 else node.args[0]
        return str(key.value) if isinstance(key, ast.Constant) else None
    return None


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            out.add(id(node.value))  # docstrings and attribute docstrings
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            out.update(id(n) for n in ast.walk(node.value))
    return out


def _settings_near(tree: ast.AST) -> dict[int, set[str]]:
    """Literal node id -> the setting names it stands beside (compared, assigned, passed, defaulted, keyed)."""
    near: dict[int, set[str]] = {}

    def mark(values: list[ast.expr], name: str | None) -> None:
        if name is None:
            return
        for v in values:
            for n in ast.walk(v):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    near.setdefault(id(n), set()).add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for a in operands:
                mark([b for b in operands if b is not a], _name_of(a))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None:
                for t in targets:
                    mark([node.value], _name_of(t))
        elif isinstance(node, ast.keyword):
            mark([node.value], node.arg)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    mark([v], k.value)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            for arg, default in zip(
                positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
            ):
                mark([default], arg.arg)
            for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if default is not None:
                    mark([default], arg.arg)
        elif isinstance(node, ast.Call) and _callee(node) in ("get", "pop") and len(node.args) == 2:
            mark([node.args[1]], _name_of(node))  # settings.get("output_format", "parquet")
        elif (
            isinstance(node, ast.Call)
            and _callee(node) in ("setattr", "set_")
            and len(node.args) == 3
            and isinstance(node.args[1], ast.Constant)
        ):
            mark([node.args[2]], str(node.args[1].value))
    for node in ast.walk(tree):  # a key read (``settings["text"]``) is a name, not a value beside a setting
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            near.pop(id(node.slice), None)
    return near


def choice_literals(src: Path = SRC) -> Iterator[str]:
    values = _values()
    for path in sorted(src.rglob("*.py")):
        if path.name == "choices.py" and path.parent == src:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _docstrings(tree)
        near = _settings_near(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
                continue
            settings = values.get(node.value)
            if settings is None:
                continue
            if _is_identifier_like(node.value) or near.get(id(node), set()) & set(settings):
                where = f"{path.relative_to(src.parent)}:{node.lineno}"
                yield f"{where}: {node.value!r} (a value of the {'/'.join(settings)} choices; import it from longpack.choices)"


def test_choice_values_are_written_only_in_choices() -> None:
    found = list(choice_literals())
    assert not found, "\n".join(found)


def test_every_choice_list_is_enforced_or_listed_with_a_reason() -> None:
    lists = {n for n, v in vars(choices).items() if n.isupper() and isinstance(v, tuple)}
    assert lists - set(ENFORCED) - set(NOT_YET) == set()
    assert set(NOT_YET) - lists == set()


def test_the_walk_finds_a_literal(tmp_path: Path) -> None:
    """The check can fail: a default, a comparison, a keyword argument, a ``.get`` and an identifier-like value
    are found; a docstring and an unrelated use of the same word (``"kind": "npy"``) are not."""
    (tmp_path / "longpack").mkdir()
    (tmp_path / "longpack" / "m.py").write_text(
        'def f(config, output_format="npy"):\n'
        '    """output_format npy"""\n'
        '    if config.output_format == "npy":\n'
        '        g(overlength="drop")\n'
        '    return h(x or "first_fit_shuffle"), {"kind": "npy"}, config.get("backend") != "local"\n'
        'x = settings.get("output_format", "parquet"), settings.get("kind", "parquet")\n'
    )
    found = sorted(f.split(" (", 1)[0].split(":", 1)[1] for f in choice_literals(tmp_path / "longpack"))
    assert found == [
        "1: 'npy'",
        "3: 'npy'",
        "4: 'drop'",
        "5: 'first_fit_shuffle'",
        "5: 'local'",
        "6: 'parquet'",
    ]
