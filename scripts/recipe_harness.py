"""Run ``longpack check`` on every packed-sequence, long-context and VLM recipe of a Megatron-Bridge
checkout (maintainer script; ``tests/rules/test_bridge_recipes.py`` checks the values it writes).

    python scripts/recipe_harness.py --bridge /path/to/Megatron-Bridge [--rev main] [--json out.json]
        [--write-data src/longpack/data/bridge_recipes.json]

``--bridge`` is a work tree or a bare git dir. The recipes are *read*, not run (instantiating them needs
Hugging Face model downloads and GPU-only imports): every ``*_config`` function under
``src/megatron/bridge/recipes`` is parsed with ``ast`` and its straight-line assignments to
``cfg.<section>.<key>`` are evaluated where the value is a literal, a local bound to one, arithmetic over
those, or a read of a key already set (``2 * cfg.model.context_parallel_size``). A call assigned to
``cfg.dataset`` (``default_tulu3_config(seq_length=..., enable_offline_packing=True, pad_seq_to_mult=...)``)
contributes its keyword arguments (the packing ones go to ``dataset.offline_packing_specs``, whose
``packed_sequence_size`` Bridge's dataset helpers set to ``seq_length``); a ``PackedSequenceSpecs(...)`` call
contributes its keywords. What a recipe inherits from a common helper (``_sft_common()``) and what cannot be
evaluated is left out (the check then skips the rules that need it, as for any partial config). The GPU
count comes from the name (``..._192gpu_...``).

A recipe is checked when it packs (any packing key), is long-context (``seq_length >= 16384`` or CP > 1) or
is a VLM / omni recipe. Each is checked for the versions its keys imply (``longpack check``'s default). The
script prints one line per recipe and the totals: recipes checked, errors, warnings by rule.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

RECIPES = "src/megatron/bridge/recipes"
SPEC_KEYS = {"packed_sequence_size", "pad_seq_to_mult", "pad_cu_seqlens", "max_single_sequence_length"}
SECTIONS = {"model", "dataset", "train", "ddp", "dist", "validation", "comm_overlap", "mixed_precision"}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
_SKIP = object()
#: A function's module-level constants (``SEQ_LENGTH = 4096``, and those it imports from other recipe files).
_GLOBALS: dict[ast.FunctionDef, dict[str, Any]] = {}


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout


def _git_dir(path: Path) -> str:
    return str(path / ".git" if (path / ".git").exists() else path)


def _chain(node: ast.AST) -> list[str] | None:
    """``cfg.model.seq_length`` -> ``["cfg", "model", "seq_length"]``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


class _Recipe:
    def __init__(self, functions: dict[str, ast.FunctionDef], depth: int = 0) -> None:
        self.flat: dict[str, Any] = {}
        self.local: dict[str, Any] = {}
        self.functions = functions
        self.depth = depth
        self.cfg_name = "cfg"
        self.from_hf_model = False
        self.calls: dict[str, ast.Call] = {}  # locals bound to a call (a section built before the container)
        self.attrs: dict[str, dict[str, Any]] = {}  # what is then set on them (model_cfg.seq_length = ...)

    def run(self, fn: ast.FunctionDef, args: dict[str, Any]) -> None:
        """Evaluate ``fn``'s body with its module's constants and its parameters bound (defaults, then
        ``args``)."""
        self.local.update(_GLOBALS.get(fn, {}))
        params = fn.args.args[-len(fn.args.defaults) :] if fn.args.defaults else []
        for p, d in zip(params, fn.args.defaults, strict=True):
            v = self.value(d)
            if v is not _SKIP:
                self.local[p.arg] = v
        for kp, kd in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
            kv = _SKIP if kd is None else self.value(kd)
            if kv is not _SKIP:
                self.local[kp.arg] = kv
        self.local.update(args)
        for st in fn.body:
            if isinstance(st, ast.Return) and isinstance(st.value, ast.Call):
                self.container(st.value)
            else:
                self.statement(st)

    def container(self, node: ast.Call) -> bool:
        """``ConfigContainer(model=..., dataset=...)`` or a call of a recipe / helper function: its keys."""
        name = _chain(node.func)
        fname = name[-1] if name else ""
        if fname == "ConfigContainer":
            for kw in node.keywords:
                value = kw.value
                if isinstance(
                    value, ast.Name
                ):  # dataset = WanDatasetConfig(...); ConfigContainer(dataset=dataset)
                    value = self.calls.get(value.id, value)
                if kw.arg in SECTIONS and isinstance(value, ast.Call):
                    self.call(kw.arg, value)
                    if isinstance(kw.value, ast.Name):  # model_cfg.context_parallel_size = 8 before it
                        for k, v in self.attrs.get(kw.value.id, {}).items():
                            self.flat[f"{kw.arg}.{k}"] = v
            return True
        fn = self.functions.get(fname)
        if fn is None or self.depth > 8:
            return False
        inner = _Recipe(self.functions, self.depth + 1)
        inner.run(fn, self.arguments(fn, node))
        self.flat.update(inner.flat)
        self.from_hf_model |= inner.from_hf_model
        return True

    def arguments(self, fn: ast.FunctionDef, node: ast.Call, skip: int | None = None) -> dict[str, Any]:
        """The values a call passes to ``fn``'s parameters (positional ones by place; ``skip``: the place of
        the config itself), those that can be evaluated."""
        names = [a.arg for a in fn.args.args]
        args = {names[i]: self.value(a) for i, a in enumerate(node.args) if i < len(names) and i != skip}
        args |= {kw.arg: self.value(kw.value) for kw in node.keywords if kw.arg}
        return {k: v for k, v in args.items() if v is not _SKIP}

    def value(self, node: ast.AST) -> Any:
        try:
            return ast.literal_eval(node)
        except (ValueError, SyntaxError, TypeError):
            pass
        if isinstance(node, ast.Name):
            return self.local.get(node.id, _SKIP)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = self.value(node.left), self.value(node.right)
            if (
                isinstance(a, int)
                and isinstance(b, int)
                and not isinstance(a, bool)
                and not isinstance(b, bool)
            ):
                return _OPS[type(node.op)](a, b)
            return _SKIP
        chain = _chain(node)
        if chain and len(chain) >= 3:
            return self.flat.get(".".join(chain[1:]), _SKIP)
        return _SKIP

    def call(self, section: str, node: ast.Call) -> None:
        name = _chain(node.func)
        fname = name[-1] if name else ""
        if section == "model":
            self.from_hf_model = True  # a provider: its architecture comes from the HF config, not the file
        kwargs = {kw.arg: self.value(kw.value) for kw in node.keywords if kw.arg}
        kwargs = {k: v for k, v in kwargs.items() if v is not _SKIP}
        if section == "model" and fname.endswith("Provider"):  # WanModelProvider(seq_length=1024, ...)
            for k, v in kwargs.items():
                self.flat[f"model.{k}"] = v
            return
        if section in ("train", "ddp", "validation", "dist") and fname.endswith("Config"):
            for k, v in kwargs.items():
                self.flat[f"{section}.{k}"] = v
            return
        if section == "dataset":
            if fname[:1].isupper() and fname.endswith("Config"):  # the dataset class decides its kind
                self.flat["dataset._target_"] = fname
            helper = fname.startswith(
                "default_"
            )  # Bridge's dataset helpers build the specs only when packing
            for k, v in kwargs.items():
                if k in SPEC_KEYS and helper and not kwargs.get("enable_offline_packing"):
                    continue
                key = f"dataset.offline_packing_specs.{k}" if k in SPEC_KEYS else f"dataset.{k}"
                self.flat[key] = v
            if kwargs.get("enable_offline_packing") and "seq_length" in kwargs:
                self.flat.setdefault(
                    "dataset.offline_packing_specs.packed_sequence_size", kwargs["seq_length"]
                )
        elif fname == "PackedSequenceSpecs":
            for k, v in kwargs.items():
                self.flat[f"{section}.{k}"] = v

    def mutate(self, node: ast.Call) -> None:
        """``_apply_common(cfg)``: a helper that sets keys on the config it is given."""
        name = _chain(node.func)
        fn = self.functions.get(name[-1] if name else "")
        if fn is None or self.depth > 8 or not fn.args.args:
            return
        at = [i for i, a in enumerate(node.args) if isinstance(a, ast.Name) and a.id == self.cfg_name]
        if not at or at[0] >= len(fn.args.args):
            return
        inner = _Recipe(self.functions, self.depth + 1)
        inner.flat = self.flat  # the same config, under the helper's parameter name
        inner.cfg_name = fn.args.args[at[0]].arg
        inner.run(fn, self.arguments(fn, node, skip=at[0]))
        self.from_hf_model |= inner.from_hf_model

    def statement(self, st: ast.stmt) -> None:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            self.mutate(st.value)
            return
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            target, value = st.targets[0], st.value
        elif isinstance(st, ast.AnnAssign) and st.value is not None:
            target, value = st.target, st.value
        else:
            return
        if isinstance(target, ast.Name):
            if isinstance(value, ast.Call) and target.id == self.cfg_name and self.container(value):
                return
            if isinstance(value, ast.Call):
                self.calls[target.id] = value
            v = self.value(value)
            if v is not _SKIP:
                self.local[target.id] = v
            return
        chain = _chain(target)
        if chain and len(chain) == 2 and chain[0] in self.calls:
            v = self.value(value)
            if v is not _SKIP:
                self.attrs.setdefault(chain[0], {})[chain[1]] = v
            return
        if not chain or len(chain) < 2 or chain[0] != self.cfg_name or chain[1] not in SECTIONS:
            return
        key = ".".join(chain[1:])
        if key == "model":  # a provider object: its architecture is not written in the recipe file
            self.from_hf_model = True
        if isinstance(value, ast.Call):
            if len(chain) == 2:  # a whole section replaced: what it held before is gone
                self.flat = {k: v for k, v in self.flat.items() if not k.startswith(key + ".")}
            self.call(key, value)
            return
        v = self.value(value)
        if v is not _SKIP and len(chain) >= 3:
            self.flat[key] = v


def _constants(tree: ast.Module) -> dict[str, Any]:
    """A module's ``NAME = <literal>`` assignments (and arithmetic over earlier ones)."""
    r = _Recipe({})
    for st in tree.body:
        if isinstance(st, ast.Assign | ast.AnnAssign) and isinstance(
            st.targets[0] if isinstance(st, ast.Assign) else st.target, ast.Name
        ):
            r.statement(st)
    return r.local


def read_recipes(git_dir: str, rev: str) -> list[dict[str, Any]]:
    """Every ``*_config`` function under the recipes folder with the keys it sets."""
    files = [
        p for p in _git(git_dir, "ls-tree", "-r", "--name-only", rev, RECIPES).split() if p.endswith(".py")
    ]
    trees = {path: ast.parse(_git(git_dir, "show", f"{rev}:{path}")) for path in files}
    shared = {  # helpers every recipe file imports (recipes/common.py, recipes/utils/*)
        fn.name: fn
        for path, tree in trees.items()
        if path.endswith("/common.py") or "/utils/" in path
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef)
    }
    everywhere = {
        fn.name: fn for tree in trees.values() for fn in tree.body if isinstance(fn, ast.FunctionDef)
    }
    modules = {path.removeprefix("src/").removesuffix(".py").replace("/", "."): path for path in trees}
    constants = {path: _constants(tree) for path, tree in trees.items()}
    imported: dict[str, dict[str, Any]] = {}  # path -> name it imports as -> function or constant
    for path, tree in trees.items():
        names: dict[str, Any] = {}
        for st in tree.body:
            if isinstance(st, ast.ImportFrom) and st.module in modules:
                src = modules[st.module]
                defs = {fn.name: fn for fn in trees[src].body if isinstance(fn, ast.FunctionDef)}
                for alias in st.names:
                    if alias.name in defs or alias.name in constants[src]:
                        names[alias.asname or alias.name] = defs.get(
                            alias.name, constants[src].get(alias.name)
                        )
        imported[path] = names
    for path, tree in trees.items():
        bound = {k: v for k, v in imported[path].items() if not isinstance(v, ast.FunctionDef)}
        bound |= constants[path]
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef):
                _GLOBALS[fn] = bound
    out: list[dict[str, Any]] = []
    for path, tree in trees.items():
        local = {fn.name: fn for fn in tree.body if isinstance(fn, ast.FunctionDef)}
        aliases = {k: v for k, v in imported[path].items() if isinstance(v, ast.FunctionDef)}
        functions = {**everywhere, **shared, **aliases, **local}
        for fn in tree.body:
            if (
                not isinstance(fn, ast.FunctionDef)
                or not fn.name.endswith("_config")
                or fn.name.startswith("_")
            ):
                continue
            if "/utils/" in path or path.endswith("/common.py"):
                continue
            r = _Recipe(functions)
            r.run(fn, {})
            gpus = re.search(r"_(\d+)gpu", fn.name)
            out.append(
                {
                    "recipe": fn.name,
                    "file": path.removeprefix("src/megatron/bridge/recipes/"),
                    "gpus": int(gpus.group(1)) if gpus else None,
                    "model_from_hf": r.from_hf_model,
                    "keys": dict(sorted(r.flat.items())),
                }
            )
    return out


def selected(recipe: dict[str, Any]) -> str | None:
    """Why a recipe is checked (``packed``, ``long-context``, ``vlm``), or ``None``."""
    keys = recipe["keys"]
    if any("packing" in k or "packed" in k for k in keys if keys[k] not in (False, None)):
        return "packed"
    seq = keys.get("model.seq_length") or keys.get("dataset.seq_length") or 0
    if (isinstance(seq, int) and seq >= 16384) or (keys.get("model.context_parallel_size") or 1) > 1:
        return "long-context"
    if re.search(r"(_vl|vl/|omni|audio)", recipe["file"]):
        return "vlm"
    return None


#: Configs Bridge's docs and examples show, and recipes of a Bridge branch not in the checkout (global-batch
#: packing, PR #6127), restated as keys.
DOC_EXAMPLES: list[dict[str, Any]] = [
    {
        # examples/training_features/long_context/README.md (d1067cede): the knobs of a real DCP run, on
        # the Megatron-Core dev the example switches to; Bridge main does not schedule by them (LP-HCP-009)
        "recipe": "example:dynamic_context_parallel",
        "file": "examples/training_features/long_context/README.md",
        "why": "long-context",
        "gpus": 4,
        "model_from_hf": True,
        "keys": {
            "model.context_parallel_size": 2,
            "model.dynamic_context_parallel": True,
            "model.sequence_packing_scheduler": "default_dynamic_cp",
            "model.max_seqlen_per_dp_cp_rank": 64,
            "model.min_dynamic_context_parallel_size": 1,
            "model.calculate_per_token_loss": True,
            "train.micro_batch_size": 1,
        },
    },
    # skills/nemo-mbridge-perf-sequence-packing/SKILL.md (067f987df), the packing settings Bridge documents,
    # on the smallest layout they fit (8 GPUs; what the snippet leaves to the recipe is left out)
    {
        # offline packed SFT, 8192-token packs, CP=2 with the snippet's lcm(2*CP, CP*TP if SP) = 4
        "recipe": "docs:sequence_packing_skill_offline_sft_cp2",
        "file": "skills/nemo-mbridge-perf-sequence-packing/SKILL.md",
        "why": "packed",
        "gpus": 8,
        "model_from_hf": True,
        "keys": {
            "train.micro_batch_size": 1,
            "train.global_batch_size": 8,
            "model.seq_length": 8192,
            "dataset.seq_length": 8192,
            "dataset.enable_offline_packing": True,
            "dataset.offline_packing_specs.packed_sequence_size": 8192,
            "dataset.offline_packing_specs.pad_seq_to_mult": 4,
            "model.tensor_model_parallel_size": 1,
            "model.sequence_parallel": False,
            "model.context_parallel_size": 2,
            "model.calculate_per_token_loss": True,
            "ddp.average_in_collective": False,
        },
    },
    {
        # collate-time in-batch packing for VLM finetuning (MBS 2)
        "recipe": "docs:sequence_packing_skill_in_batch_vlm",
        "file": "skills/nemo-mbridge-perf-sequence-packing/SKILL.md",
        "why": "packed",
        "gpus": 8,
        "model_from_hf": True,
        "keys": {
            "dataset.enable_in_batch_packing": True,
            "train.micro_batch_size": 2,
            "train.global_batch_size": 16,
            "model.seq_length": 4096,
            "dataset.seq_length": 4096,
        },
    },
    {
        # Energon online packing for Qwen-VL (a 16-sample candidate buffer per worker)
        "recipe": "docs:sequence_packing_skill_energon_qwen_vl",
        "file": "skills/nemo-mbridge-perf-sequence-packing/SKILL.md",
        "why": "packed",
        "gpus": 8,
        "model_from_hf": True,
        "keys": {
            "dataset.packing_buffer_size": 16,
            "dataset.micro_batch_size": 1,
            "train.micro_batch_size": 1,
            "train.global_batch_size": 8,
            "model.seq_length": 4096,
            "dataset.seq_length": 4096,
            "model.calculate_per_token_loss": True,
            "ddp.average_in_collective": False,
        },
    },
    {
        # src/megatron/bridge/recipes/qwen/gb200/qwen35.py @ 7bdc5ef4ba (the global-batch packing branch of
        # PR #6127, not in main): Bridge's reference recipe for global-batch packing with dynamic CP, its
        # values restated (the architecture comes from the Hugging Face config); docs at 85b0c3de37,
        # docs/training/dynamic-context-parallel.md, name it the reference recipe
        "recipe": "pr6127:qwen35_text_35b_a3b_sft_8gpu_gb200_bf16_dynamic_cp_config",
        "file": "qwen/gb200/qwen35.py",
        "why": "long-context",
        "gpus": 8,
        "model_from_hf": True,
        "keys": {
            "model.seq_length": 32768,
            "dataset.seq_length": 32768,
            "dataset.enable_global_batch_packing": True,
            "dataset.dataloader_type": "single",
            "model.tensor_model_parallel_size": 1,
            "model.pipeline_model_parallel_size": 1,
            "model.virtual_pipeline_model_parallel_size": None,
            "model.context_parallel_size": 4,
            "model.expert_model_parallel_size": 8,
            "model.expert_tensor_parallel_size": 1,
            "model.sequence_parallel": False,
            "model.dynamic_context_parallel": True,
            "model.min_dynamic_context_parallel_size": 1,
            "model.max_seqlen_per_dp_cp_rank": 8192,
            "model.calculate_per_token_loss": True,
            "ddp.average_in_collective": False,
            "train.micro_batch_size": 1,
            "train.global_batch_size": 64,
            "model.cuda_graph_impl": "none",
        },
    },
]


def kept(keys: dict[str, Any]) -> dict[str, Any]:
    """The keys a rule reads, and every ``dataset.*`` key (they decide the dataset kind)."""
    from longpack.rules.checks.upstream import known_keys

    known = known_keys()
    return {k: v for k, v in keys.items() if k in known or k.startswith("dataset.")}


def check(recipe: dict[str, Any]) -> list[Any]:
    from longpack.rules.recipes import check_recipe

    return check_recipe(recipe)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bridge", type=Path, required=True)
    ap.add_argument("--rev", default="main")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--write-data", type=Path)
    args = ap.parse_args(argv)
    git_dir = _git_dir(args.bridge)
    commit = _git(git_dir, "rev-parse", "--short=9", args.rev).strip()
    recipes = [dict(r, why=why) for r in read_recipes(git_dir, args.rev) if (why := selected(r))]
    recipes += DOC_EXAMPLES
    recipes = [dict(r, keys=kept(r["keys"])) for r in recipes]
    errors, warnings = Counter[str](), Counter[str]()
    rows = []
    for r in recipes:
        found = check(r)
        errs = sorted(f.rule_id for f in found if f.severity.value == "error")
        warns = sorted(f.rule_id for f in found if f.severity.value == "warning")
        errors.update(errs)
        warnings.update(warns)
        rows.append(dict(r, errors=errs, warnings=warns))
        print(
            f"{r['recipe']:<60} {r['why']:<13} errors={','.join(errs) or '-'} warnings={','.join(warns) or '-'}"
        )
    from longpack.rules.recipes import totals

    print(totals(rows, args.rev, commit))
    if args.json:
        args.json.write_text(json.dumps({"commit": commit, "recipes": rows}, indent=1))
    if args.write_data:
        data = {
            "source": f"NVIDIA-NeMo/Megatron-Bridge@{commit}:{RECIPES} (values read by scripts/recipe_harness.py)",
            "recipes": [
                {k: r[k] for k in ("recipe", "file", "why", "gpus", "model_from_hf", "keys")}
                | {"errors": r["errors"], "warnings": r["warnings"]}
                for r in rows
            ],
        }
        lines = ",\n".join(json.dumps(r, sort_keys=False) for r in data["recipes"])
        args.write_data.write_text(f'{{"source": {json.dumps(data["source"])},\n"recipes": [\n{lines}\n]}}\n')
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
