"""Extract the layouts of Megatron-Bridge's recipe library into ``src/longpack/data/bridge_recipe_layouts.yaml``.

Reads every ``*_pretrain_*_config()`` function of ``src/megatron/bridge/perf_recipes/`` and
``src/megatron/bridge/recipes/`` in a Megatron-Bridge git directory (a clone or a bare mirror) at one
commit, without importing it: the function bodies are read with :mod:`ast`, and the straight-line
assignments ``cfg.model.<field> = <literal>`` (and those of the helpers they call, from the family's
``common.py`` and ``perf_recipes/_common.py``) are replayed in order. A branch (``if``) is not followed; a
field the recipe does not set is left out (the planner uses Megatron's default for it). Each entry names
its source as ``NVIDIA-NeMo/Megatron-Bridge@<commit>:<path>::<function>``.

Usage::

    python scripts/bridge_recipe_layouts.py /path/to/Megatron-Bridge[.git] [--commit REV] [--out FILE]

Only recipes of models and GPUs in longpack's catalogs are kept (``MODEL_IDS``, ``GPU_IDS`` below).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

#: Megatron-Bridge recipe name prefix -> longpack catalog model id (the nearest catalog entry: Llama 3 and
#: 3.1 share the architecture the planner models).
MODEL_IDS = {
    "deepseek_v3": "deepseek_v3",
    "kimi_k2": "kimi_k2",
    "llama31_405b": "llama3_1_405b",
    "llama3_70b": "llama3_1_70b",
    "llama31_70b": "llama3_1_70b",
    "llama3_8b": "llama3_1_8b",
    "llama31_8b": "llama3_1_8b",
    "qwen3_235b_a22b": "qwen3_235b_a22b",
    "qwen3_30b_a3b": "qwen3_30b_a3b",
    "qwen3_next_80b_a3b": "qwen3_next_80b_a3b",
    "qwen3_8b": "qwen3_8b",
    "glm45_355b": "glm_4_5",
}
#: recipe folder -> longpack GPU id
GPU_IDS = {
    "h100": "H100_SXM",
    "h200": "H200",
    "b200": "B200",
    "b300": "B300",
    "gb200": "GB200",
    "gb300": "GB300",
}
ROOTS = ("src/megatron/bridge/perf_recipes", "src/megatron/bridge/recipes")
NAME = re.compile(
    r"^(?P<model>[a-z0-9_]+?)_pretrain_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)_(?P<rest>.*)_config$"
)
FIELDS = {
    "tensor_model_parallel_size": "tp",
    "context_parallel_size": "cp",
    "pipeline_model_parallel_size": "pp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "sequence_parallel": "sp",
    "micro_batch_size": "mbs",
    "global_batch_size": "gbs",
    "seq_length": "seq_length",
    "recompute_granularity": "recompute_granularity",
    "recompute_modules": "recompute_modules",
    "moe_token_dispatcher_type": "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend": "moe_flex_dispatcher_backend",
    "overlap_moe_expert_parallel_comm": "ep_overlap",
    "cp_comm_type": "cp_comm_type",
    "tp_comm_overlap": "tp_comm_overlap",
    "cuda_graph_impl": "cuda_graph_impl",
    "pipeline_model_parallel_layout": "pipeline_layout",
}
PRECISIONS = {
    "bf16": "bf16",
    "fp8cs": "fp8",
    "fp8mx": "mxfp8",
    "fp8sc": "fp8",
    "fp8": "fp8",
    "nvfp4": "nvfp4",
}


class Source:
    """Files of a Megatron-Bridge git directory at one commit."""

    def __init__(self, repo: Path, commit: str) -> None:
        self.repo = repo
        self.commit = subprocess.run(
            ["git", "--git-dir", str(self._git_dir()), "rev-parse", commit],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def _git_dir(self) -> Path:
        return self.repo / ".git" if (self.repo / ".git").exists() else self.repo

    def files(self, root: str) -> list[str]:
        out = subprocess.run(
            ["git", "--git-dir", str(self._git_dir()), "ls-tree", "-r", "--name-only", self.commit, root],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        return [f for f in out if f.endswith(".py")]

    def read(self, path: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(self._git_dir()), "show", f"{self.commit}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _constants(tree: ast.Module) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in tree.body:
        target = (
            n.targets[0] if isinstance(n, ast.Assign) and len(n.targets) == 1 else getattr(n, "target", None)
        )
        value = getattr(n, "value", None)
        if isinstance(n, ast.Assign | ast.AnnAssign) and isinstance(target, ast.Name) and value is not None:
            with contextlib.suppress(ValueError, SyntaxError, TypeError):
                out[target.id] = ast.literal_eval(value)
    return out


def _value(node: ast.expr, constants: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        if node.id in constants:
            return constants[node.id]
        m = re.fullmatch(r"SEQUENCE_LENGTH_(\d+)K", node.id)
        if m:
            return int(m.group(1)) * 1024
        raise ValueError(node.id)
    return ast.literal_eval(node)


def _target(node: ast.expr) -> str | None:
    """``cfg.model.tensor_model_parallel_size`` -> ``tensor_model_parallel_size``; ``cfg.train.x`` -> ``x``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in ("cfg", "model_cfg", "config") and parts:
        return parts[0]
    return None


class Replayer:
    """Replays the straight-line settings of recipe functions and the helpers they call."""

    def __init__(self, helpers: dict[str, tuple[ast.FunctionDef, dict[str, Any]]]) -> None:
        self.helpers = helpers

    def run(self, fn: ast.FunctionDef, constants: dict[str, Any], depth: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if depth > 4:
            return out
        for stmt in fn.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                tgt = stmt.targets[0]
                if isinstance(tgt, ast.Name) and tgt.id == "cfg" and isinstance(stmt.value, ast.Call):
                    name = getattr(stmt.value.func, "id", None)
                    if name in self.helpers:  # cfg = another_recipe_config()
                        helper, consts = self.helpers[name]
                        out.update(self.run(helper, consts, depth + 1))
                    continue
                field = _target(tgt)
                if field == "mixed_precision" and isinstance(stmt.value, ast.Call) and stmt.value.args:
                    with contextlib.suppress(ValueError):
                        out["precision_recipe"] = ast.literal_eval(stmt.value.args[0])
                    continue
                if field in FIELDS:
                    with contextlib.suppress(ValueError, SyntaxError, TypeError):
                        out[FIELDS[field]] = _value(stmt.value, constants)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                name = getattr(stmt.value.func, "id", None)
                if name and "pipeline_model_parallel_layout" in name:
                    if len(stmt.value.args) > 1:
                        with contextlib.suppress(ValueError):
                            out["pipeline_layout"] = ast.literal_eval(stmt.value.args[1])
                    continue
                if name in self.helpers:
                    helper, consts = self.helpers[name]
                    out.update(self.run(helper, consts, depth + 1))
        return out


def _recompute(s: dict[str, Any]) -> list[str]:
    gran = str(s.get("recompute_granularity") or "").lower()
    if gran == "full":
        return ["full"]
    if gran != "selective":
        return []
    mods = s.get("recompute_modules")
    if mods is None:
        return ["core_attn"]  # Megatron's default selective module list
    return sorted(str(m) for m in mods)


def _dispatcher(s: dict[str, Any]) -> str:
    if str(s.get("moe_token_dispatcher_type") or "").lower() == "flex":
        return str(s.get("moe_flex_dispatcher_backend") or "deepep").lower()
    return str(s.get("moe_token_dispatcher_type") or "alltoall").lower()


def extract(src: Source) -> list[dict[str, Any]]:
    """Every catalog-covered pretraining recipe with its layout and settings."""
    entries: list[dict[str, Any]] = []
    parsed: dict[str, ast.Module] = {}
    for root in ROOTS:
        for path in src.files(root):
            try:
                parsed[path] = ast.parse(src.read(path))
            except SyntaxError:
                continue
    # every recipe function by name (a recipe may start from another module's: cfg = other_config())
    everywhere: dict[str, tuple[ast.FunctionDef, dict[str, Any]]] = {}
    for _path, tree in sorted(parsed.items()):
        consts = _constants(tree)
        for k, v in _functions(tree).items():
            if k.endswith("_config"):
                everywhere.setdefault(k, (v, consts))
    for path, tree in sorted(parsed.items()):
        parts = path.split("/")
        if len(parts) < 3 or parts[-2] not in GPU_IDS:
            continue
        family_dir = "/".join(parts[:-2])
        helpers: dict[str, tuple[ast.FunctionDef, dict[str, Any]]] = dict(everywhere)
        for extra in (f"{ROOTS[0]}/_common.py", f"{ROOTS[1]}/common.py", f"{family_dir}/common.py", path):
            if extra in parsed:
                consts = _constants(parsed[extra])
                helpers.update({k: (v, consts) for k, v in _functions(parsed[extra]).items()})
        rep = Replayer(helpers)
        constants = _constants(tree)
        for name, fn in _functions(tree).items():
            m = NAME.match(name)
            if not m or m.group("model") not in MODEL_IDS or m.group("gpu") not in GPU_IDS:
                continue
            rest = m.group("rest")
            if any(w in rest for w in ("deterministic", "functional", "mock", "lora", "peft")):
                continue
            s = rep.run(fn, constants)
            if "tp" not in s or "pp" not in s:
                continue  # the layout is set somewhere this reader does not follow
            prec_word = rest.split("_")[0]
            seq = s.get("seq_length")
            mlen = re.search(r"(?:^|_)(\d+)k(?:_|$)", rest)
            if mlen:
                seq = int(mlen.group(1)) * 1024
            entry: dict[str, Any] = {
                "id": name,
                "model": MODEL_IDS[m.group("model")],
                "recipe_model": m.group("model"),
                "gpu": GPU_IDS[m.group("gpu")],
                "num_gpus": int(m.group("gpus")),
                "seq_length": int(seq) if isinstance(seq, int) else 4096,
                "seq_length_stated": isinstance(seq, int),
                "precision": PRECISIONS.get(prec_word, "bf16"),
                "tp": int(s.get("tp") or 1),
                "cp": int(s.get("cp") or 1),
                "pp": int(s.get("pp") or 1),
                "vpp": int(s["vpp"]) if isinstance(s.get("vpp"), int) and s["vpp"] > 1 else None,
                "ep": int(s.get("ep") or 1),
                "etp": int(s["etp"]) if isinstance(s.get("etp"), int) else None,
                "mbs": int(s.get("mbs") or 1),
                "gbs": int(s["gbs"]) if isinstance(s.get("gbs"), int) else None,
                "recompute": _recompute(s),
                "dispatcher": _dispatcher(s),
                "ep_overlap": bool(s.get("ep_overlap", False)),
                "cp_comm_type": str(s.get("cp_comm_type") or "p2p"),
                "tp_comm_overlap": s.get("tp_comm_overlap")
                if isinstance(s.get("tp_comm_overlap"), bool)
                else None,
                "pipeline_layout": s.get("pipeline_layout")
                if isinstance(s.get("pipeline_layout"), str)
                else None,
                "source": f"NVIDIA-NeMo/Megatron-Bridge@{src.commit[:12]}:{path}::{name}",
            }
            entries.append(entry)
    entries.sort(key=lambda e: (e["model"], e["gpu"], e["seq_length"], e["num_gpus"], e["id"]))
    return entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path, help="a Megatron-Bridge clone or bare git directory")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1]
        / "src"
        / "longpack"
        / "data"
        / "bridge_recipe_layouts.yaml",
    )
    args = ap.parse_args(argv)
    src = Source(args.repo, args.commit)
    entries = extract(src)
    doc = {
        "schema_version": 1,
        "what": (
            "layouts of Megatron-Bridge's pretraining recipes (perf_recipes/ and recipes/), read statically; "
            "the planner's reference when no published run of the same model, GPU and length exists"
        ),
        "repo": "NVIDIA-NeMo/Megatron-Bridge",
        "commit": src.commit,
        "regenerate": "python scripts/bridge_recipe_layouts.py <Megatron-Bridge checkout> --commit <rev>",
        "recipes": entries,
    }
    text = yaml.safe_dump(doc, sort_keys=False, width=140)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {len(entries)} recipes from {src.commit[:12]} to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
