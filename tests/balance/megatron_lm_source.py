"""Megatron-LM's own scheduler functions, lifted unmodified from a Megatron-LM git checkout at test time.

The installed megatron-core (0.16) predates ``DpBalancedScheduler`` and dynamic CP, and importing the newer
modules needs torch and modules 0.16 lacks. The pure-Python pieces the equality tests need are therefore
read from a Megatron-LM git directory named by ``LONGPACK_MEGATRON_LM`` (``git show <commit>:<path>``), and
only the named top-level definitions are executed, from the source text as it is. Without the variable (or
the commit) the live tests skip and the equality tests fall back on the golden outputs in ``data/``, which
``regen_golden`` wrote from the same lifted code.
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import typing
from functools import lru_cache
from pathlib import Path

#: Megatron-LM dev, 2026-08-21 ("Replace DP balance all-to-all rerouting with all-gather (#6378)"): holds
#: DpBalancedScheduler, DefaultDynamicCPScheduler and next_hdp_group_packing_aware.
DEV_COMMIT = "d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1"
#: Megatron-LM main, 2026-08-22: create_hybrid_dp_cp_groups and DpBalancedScheduler (PR #6684).
MAIN_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


def git_dir() -> Path | None:
    value = os.environ.get("LONGPACK_MEGATRON_LM")
    return Path(value) if value and Path(value).exists() else None


def source(commit: str, path: str) -> str | None:
    repo = git_dir()
    if repo is None:
        return None
    run = subprocess.run(
        [
            "git",
            f"--git-dir={repo / '.git' if (repo / '.git').exists() else repo}",
            "show",
            f"{commit}:{path}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return run.stdout if run.returncode == 0 else None


def lift(commit: str, path: str, names: typing.Sequence[str], extra: dict | None = None) -> dict | None:
    """Execute the top-level definitions ``names`` of ``path`` at ``commit`` in a namespace holding the
    standard-library names they use (and ``extra``); ``None`` when the checkout is not found."""
    text = source(commit, path)
    if text is None:
        return None
    tree = ast.parse(text)
    wanted = []
    for node in tree.body:
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = next((t.id for t in targets if isinstance(t, ast.Name)), None)
        if name in names:
            wanted.append(node)
    missing = (
        set(names)
        - {getattr(n, "name", None) for n in wanted}
        - {t.id for n in wanted if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    )
    assert not missing, f"{path}@{commit[:10]} has no {sorted(missing)}"
    namespace: dict = {
        **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Tuple", "Type", "Union")},
        "ceil": math.ceil,
        "log2": math.log2,
        "lru_cache": lru_cache,
        **(extra or {}),
    }
    module = ast.Module(body=wanted, type_ignores=[])
    exec(compile(module, f"{path}@{commit[:10]}", "exec"), namespace)  # upstream code under test
    return namespace


@lru_cache(maxsize=1)
def dynamic_cp() -> dict | None:
    """DefaultDynamicCPScheduler (and DpBalancedScheduler) from Megatron-LM dev, with the helpers they call."""
    utils = lift(
        DEV_COMMIT,
        "megatron/core/datasets/data_schedule_utils.py",
        [
            "_DYNAMIC_CP_WORKLOAD_CAP_DELTA",
            "dcp_gpus_needed",
            "next_hdp_group_packing_aware",
            "align_sample_id_groups",
        ],
    )
    if utils is None:
        return None
    return lift(
        DEV_COMMIT,
        "megatron/core/datasets/data_schedule.py",
        ["BasePackingScheduler", "DpBalancedScheduler", "DefaultDynamicCPScheduler"],
        extra={
            "next_hdp_group_packing_aware": utils["next_hdp_group_packing_aware"],
            "align_sample_id_groups": utils["align_sample_id_groups"],
        },
    )


@lru_cache(maxsize=1)
def dp_balanced_main() -> dict | None:
    """DpBalancedScheduler from Megatron-LM main."""
    return lift(
        MAIN_COMMIT,
        "megatron/core/datasets/data_schedule.py",
        ["BasePackingScheduler", "DpBalancedScheduler"],
    )


@lru_cache(maxsize=1)
def group_builders() -> dict | None:
    """create_hybrid_dp_cp_groups (main) and create_dynamic_dp_cp_groups (dev), with ``create_group``
    recording the rank lists it is given instead of building NCCL groups."""
    made: list[tuple[str, list[int]]] = []

    def create_group(ranks, pg_options=None, group_desc=None, **_):
        made.append((group_desc, list(ranks)))
        return tuple(ranks)

    hybrid = lift(
        MAIN_COMMIT,
        "megatron/core/parallel_state.py",
        ["create_hybrid_dp_cp_groups"],
        {"create_group": create_group},
    )
    dynamic = lift(
        DEV_COMMIT,
        "megatron/core/parallel_state.py",
        ["create_dynamic_dp_cp_groups"],
        {"create_group": create_group},
    )
    if hybrid is None or dynamic is None:
        return None
    return {
        "hybrid": hybrid["create_hybrid_dp_cp_groups"],
        "dynamic": dynamic["create_dynamic_dp_cp_groups"],
        "made": made,
    }
