"""Rules drift report: what upstream changed in the checks longpack's rules restate (maintainer script).

Given a git checkout of Megatron-Bridge or Megatron-LM (a work tree or a bare git dir) and two commits (or
dates), list the ``assert`` / ``raise`` sites in the config, dataset, packing, context-parallel, MoE and
CUDA-graph code that appeared, changed or disappeared between them, and which longpack rules cite each
(a rule cites a site when one of its sources, :mod:`longpack.rules.provenance`, names the site's file and
its probe literal occurs in the site's text). A second mode recomputes each rule's version range from its
probes at every release tag the catalog knows, and says where the recorded range disagrees; a third
(``sources``) checks every rule source at its own commit: the file is there and holds the probe.

    python scripts/rules_drift.py sites --repo /path/to/Megatron-LM --from 2026-02-01 --to 2026-08-31
    python scripts/rules_drift.py ranges --bridge /path/to/Megatron-Bridge --mcore /path/to/Megatron-LM
    python scripts/rules_drift.py sources --bridge /path/to/Megatron-Bridge --mcore /path/to/Megatron-LM

A site is identified by file, enclosing function and the text of its message (or, without a message, its
condition); ``changed`` means the same file, function and message with another condition, or the same
condition with another message. Line numbers are reported, never compared.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Files whose checks longpack's rules restate, per repository (fnmatch patterns, ``*`` crosses ``/``).
WATCHED: dict[str, tuple[str, ...]] = {
    "NVIDIA-NeMo/Megatron-Bridge": (
        "src/megatron/bridge/training/config.py",
        "src/megatron/bridge/training/gpt_step.py",
        "src/megatron/bridge/training/vlm_step.py",
        "src/megatron/bridge/training/initialize.py",
        "src/megatron/bridge/training/flex_dispatcher_backend.py",
        "src/megatron/bridge/training/utils/packed_seq_utils.py",
        "src/megatron/bridge/models/transformer_config.py",
        "src/megatron/bridge/utils/cuda_graph.py",
        "src/megatron/bridge/data/*.py",
    ),
    "NVIDIA/Megatron-LM": (
        "megatron/training/arguments.py",
        "megatron/core/model_parallel_config.py",
        "megatron/core/transformer/transformer_config.py",
        "megatron/core/transformer/cuda_graphs.py",
        "megatron/core/transformer/moe/*.py",
        "megatron/core/packed_seq_params.py",
        "megatron/core/parallel_state.py",
        "megatron/core/datasets/data_schedule*.py",
        "megatron/core/utils.py",
        "megatron/training/datasets/sft_dataset.py",
        "pretrain_gpt.py",
    ),
}


def _git(gitdir: Path, *args: str) -> str:
    """Run git on a checkout (work tree or bare dir) and return stdout."""
    base = ["git", f"--git-dir={gitdir / '.git'}" if (gitdir / ".git").exists() else f"--git-dir={gitdir}"]
    # errors="replace": a watched file that is not UTF-8 is still parsed (its odd bytes never match a probe)
    out = subprocess.run([*base, *args], capture_output=True, text=True, errors="replace", check=False)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def resolve(gitdir: Path, ref: str, branch: str = "HEAD") -> str:
    """A commit for ``ref``: a commit-ish, or a date ``YYYY-MM-DD`` (the last commit of ``branch`` before it)."""
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", ref):
        import datetime

        try:
            datetime.date.fromisoformat(ref)
        except ValueError as exc:
            raise SystemExit(f"error: {ref} is not a date ({exc}); give YYYY-MM-DD or a commit") from None
        commit = _git(gitdir, "rev-list", "-1", f"--before={ref}T23:59:59Z", branch).strip()
        if not commit:
            raise SystemExit(f"no commit of {branch} before {ref}")
        return commit
    return _git(gitdir, "rev-parse", f"{ref}^{{commit}}").strip()


def checkout(path: Path | None, option: str) -> Path | None:
    """``path`` if it is a git checkout (a work tree or a bare git dir), else ``SystemExit`` naming the
    option and what ``path`` is instead (missing, a file, a folder that is not a repository)."""
    if path is None:
        return None
    if not path.exists():
        raise SystemExit(f"error: {option} {path}: no such folder; give a git checkout of the repository")
    if not path.is_dir():
        raise SystemExit(
            f"error: {option} {path}: a file, not a folder; give a git checkout of the repository"
        )
    if not ((path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())):
        raise SystemExit(
            f"error: {option} {path}: not a git checkout (no .git, not a bare git dir); clone the repository "
            "and give its folder"
        )
    return path


def check_out(path: Path) -> None:
    """Say before any work why ``--out`` cannot be written (a folder, a missing folder)."""
    if path.is_dir():
        raise SystemExit(f"error: --out {path}: a folder; give a file name (e.g. {path / 'drift.md'})")
    if not path.parent.is_dir():
        raise SystemExit(f"error: --out {path}: the folder {path.parent} does not exist; create it first")


def write_out(path: Path, text: str) -> None:
    """Write the report to ``--out`` or say why it cannot be (a folder, a missing folder, no permission)."""
    check_out(path)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SystemExit(f"error: --out {path}: cannot write ({exc.strerror or exc})") from None


def repo_name(gitdir: Path) -> str:
    """Which watched repository a checkout is (by its files)."""
    names = _git(gitdir, "ls-tree", "--name-only", "HEAD").split()
    return (
        "NVIDIA-NeMo/Megatron-Bridge" if "src" in names and "megatron" not in names else "NVIDIA/Megatron-LM"
    )


def watched_files(gitdir: Path, commit: str, patterns: Sequence[str]) -> list[str]:
    paths = _git(gitdir, "ls-tree", "-r", "--name-only", commit).splitlines()
    return [p for p in paths if p.endswith(".py") and any(fnmatch.fnmatch(p, pat) for pat in patterns)]


@dataclass(frozen=True)
class Site:
    """One ``assert`` / ``raise`` in a file at a commit."""

    path: str
    function: str
    kind: str  # "assert" | "raise"
    condition: str
    message: str
    line: int
    #: The statement's source text (what rules' probes are looked for in; not part of its identity).
    segment: str = field(default="", compare=False)

    @property
    def text(self) -> str:
        return f"{self.condition} {self.message}".strip()


def _message(node: ast.expr | None) -> str:
    """The literal text of a message (f-string parts joined; placeholders as ``{}``)."""
    if node is None:
        return ""
    if isinstance(node, ast.Call) and node.args:  # raise ValueError("...")
        return _message(node.args[0])
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return " ".join(node.value.split())
    if isinstance(node, ast.JoinedStr):
        return " ".join(
            "".join(
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                for v in node.values
            ).split()
        )
    if isinstance(node, ast.BinOp):
        return (_message(node.left) + _message(node.right)).strip()
    return ast.unparse(node)


def sites_in(source: str, path: str) -> list[Site]:
    """Every assert / raise of a Python file, with its enclosing function (``Class.method``).

    >>> [(s.function, s.kind, s.message) for s in sites_in("def f(x):\\n    assert x > 0, 'x positive'\\n", "m.py")]
    [('f', 'assert', 'x positive')]
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[Site] = []
    lines = source.splitlines()

    def walk(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                walk(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Assert):
                found.append(
                    Site(
                        path,
                        ".".join(scope),
                        "assert",
                        ast.unparse(child.test),
                        _message(child.msg),
                        child.lineno,
                        _segment(lines, child),
                    )
                )
            elif isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc
                name = ast.unparse(exc.func if isinstance(exc, ast.Call) else exc)
                found.append(
                    Site(
                        path,
                        ".".join(scope),
                        "raise",
                        name,
                        _message(exc),
                        child.lineno,
                        _segment(lines, child),
                    )
                )
            walk(child, scope)

    walk(tree, ())
    return found


def _segment(lines: list[str], node: ast.stmt) -> str:
    # whole lines (ast.get_source_segment re-splits the file on every call: minutes on Megatron-LM)
    return "\n".join(lines[node.lineno - 1 : node.end_lineno or node.lineno])


def sites_at(gitdir: Path, commit: str, patterns: Sequence[str]) -> list[Site]:
    out: list[Site] = []
    for path in watched_files(gitdir, commit, patterns):
        out.extend(sites_in(_git(gitdir, "show", f"{commit}:{path}"), path))
    return out


@dataclass
class Drift:
    appeared: list[Site] = field(default_factory=list)
    disappeared: list[Site] = field(default_factory=list)
    changed: list[tuple[Site, Site]] = field(default_factory=list)


def compare(old: Iterable[Site], new: Iterable[Site]) -> Drift:
    """Sites that appeared, disappeared or changed (same message, other condition, or the reverse).

    >>> a = sites_in("def f(x):\\n    assert x > 0, 'x positive'\\n", "m.py")
    >>> b = sites_in("def f(x):\\n    assert x >= 0, 'x positive'\\n    raise ValueError('never')\\n", "m.py")
    >>> d = compare(a, b)
    >>> [s.message for s in d.appeared], len(d.changed), d.disappeared
    (['never'], 1, [])
    """

    def by(key: str, sites: list[Site]) -> dict[tuple[str, str, str], list[Site]]:
        index: dict[tuple[str, str, str], list[Site]] = {}
        for s in sites:
            index.setdefault((s.path, s.function, getattr(s, key)), []).append(s)
        return index

    old_l, new_l = list(old), list(new)
    old_exact = {(s.path, s.function, s.condition, s.message) for s in old_l}
    new_exact = {(s.path, s.function, s.condition, s.message) for s in new_l}
    gone = [s for s in old_l if (s.path, s.function, s.condition, s.message) not in new_exact]
    came = [s for s in new_l if (s.path, s.function, s.condition, s.message) not in old_exact]
    drift = Drift()
    used_new: set[int] = set()
    for key in ("message", "condition"):
        came_by = by(key, [s for s in came if id(s) not in used_new])
        for s in list(gone):
            if key == "message" and not s.message:
                continue
            candidates = [
                c for c in came_by.get((s.path, s.function, getattr(s, key)), []) if id(c) not in used_new
            ]
            if candidates:
                drift.changed.append((s, candidates[0]))
                used_new.add(id(candidates[0]))
                gone.remove(s)
    drift.disappeared = gone
    drift.appeared = [s for s in came if id(s) not in used_new]
    return drift


def _probes() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(repo, path) -> [(probe, rule id)] over every rule source with a probe."""
    from longpack.rules import RULES

    index: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for r in RULES:
        for src in r.provenance.sources:
            if src.probe:
                index.setdefault((src.repo, src.path), []).append((src.probe, r.id))
    return index


_PROBES: dict[tuple[str, str], list[tuple[str, str]]] | None = None


def citing_rules(site: Site, repo: str) -> list[str]:
    """The longpack rules whose sources name this site's file and whose probe occurs in its text."""
    global _PROBES
    if _PROBES is None:
        _PROBES = _probes()
    text = f"{site.segment} {site.condition} {site.message}"
    return sorted({rule_id for probe, rule_id in _PROBES.get((repo, site.path), ()) if probe in text})


#: Words that mark a site as about packing, CP, CUDA graphs or MoE dispatch (for the triage list).
TOPICS = re.compile(
    r"pack|cu_seqlens|thd|context.parallel|\bcp\b|cp_size|hybrid|cuda.?graph|cudagraph|hybridep|dispatch|"
    r"micro.batch|seq_length|sequence length|pad_|padding",
    re.IGNORECASE,
)


def report(gitdir: Path, old_ref: str, new_ref: str, patterns: Sequence[str] | None = None) -> str:
    """The drift report between two commits (or dates) of one checkout, as Markdown."""
    repo = repo_name(gitdir)
    pats = tuple(patterns or WATCHED[repo])
    old, new = resolve(gitdir, old_ref), resolve(gitdir, new_ref)
    drift = compare(sites_at(gitdir, old, pats), sites_at(gitdir, new, pats))
    lines = [
        f"# {repo}: assert/raise drift {old_ref} ({old[:10]}) -> {new_ref} ({new[:10]})",
        "",
        f"appeared {len(drift.appeared)}, changed {len(drift.changed)}, disappeared {len(drift.disappeared)}",
    ]
    touched = [*drift.appeared, *drift.disappeared, *(b for _, b in drift.changed)]
    cited = [s for s in touched if citing_rules(s, repo)]
    lines.append(
        f"cited by a longpack rule: {len(cited)}; rules cited: "
        f"{', '.join(sorted({i for s in cited for i in citing_rules(s, repo)})) or 'none'}"
    )
    per_file: dict[str, list[int]] = {}
    for i, group in enumerate((drift.appeared, [b for _, b in drift.changed], drift.disappeared)):
        for s in group:
            per_file.setdefault(s.path, [0, 0, 0])[i] += 1
    lines += ["", "| file | appeared | changed | disappeared |", "|---|---|---|---|"]
    lines += [f"| `{p}` | {a} | {c} | {d} |" for p, (a, c, d) in sorted(per_file.items())]
    triage = [s for s in touched if not citing_rules(s, repo) and TOPICS.search(f"{s.condition} {s.message}")]
    lines += ["", f"## To triage: {len(triage)} uncited sites about packing, CP, CUDA graphs or MoE dispatch"]

    def cite(s: Site) -> str:
        ids = citing_rules(s, repo)
        return f"  [rules: {', '.join(ids)}]" if ids else "  [no longpack rule]"

    def one(s: Site) -> str:
        what = s.message or s.condition
        return f"- `{s.path}:{s.line}` {s.function or '<module>'}: {s.kind} {what[:160]}{cite(s)}"

    lines += [one(s) for s in triage]

    for title, items in (("Appeared", drift.appeared), ("Disappeared", drift.disappeared)):
        lines += ["", f"## {title}", *[one(s) for s in items]]
    lines += ["", "## Changed"]
    for a, b in drift.changed:
        lines.append(one(b))
        if a.condition != b.condition:
            lines.append(f"    condition was: {a.condition[:160]}")
        if a.message != b.message:
            lines.append(f"    message was: {a.message[:160]}")
    return "\n".join(lines) + "\n"


# --- version ranges from probes -------------------------------------------------------------------


def probe_present(gitdir: Path, commit: str, literal: str, pathspec: str) -> bool:
    base = ["git", f"--git-dir={gitdir / '.git'}" if (gitdir / ".git").exists() else f"--git-dir={gitdir}"]
    out = subprocess.run(
        [*base, "grep", "-q", "-F", "-e", literal, commit, "--", pathspec], capture_output=True, check=False
    )
    return out.returncode == 0


def observed_range(gitdir: Path, product: str, literal: str, pathspec: str) -> tuple[str | None, str | None]:
    """``(since, until)`` over the catalog's releases: the first release holding the probe, and the first
    later one that no longer does (``None`` = open end; ``since`` is ``None`` when the oldest release
    known holds it already)."""
    from longpack.rules.versions import PRODUCTS

    info = PRODUCTS[product]  # type: ignore[index]
    releases = info.releases + ((info.dev,) if info.dev is not None else ())  # Megatron-Core dev after main
    tags = {"bridge": "v{}", "mcore": "core_v{}"}[product]
    present = []
    for r in releases:
        commit = r.commit if r.version in ("main", "dev") else tags.format(r.version)
        present.append(probe_present(gitdir, commit, literal, pathspec))
    if not any(present):
        return ("absent", "absent")
    first = present.index(True)
    since = None if first == 0 else releases[first].version
    until = None
    for i in range(first + 1, len(present)):
        if not present[i]:
            until = releases[i].version
            break
    return since, until


def ranges(bridge: Path | None, mcore: Path | None) -> str:
    """For every rule source with a probe: the range its probe shows and the recorded range."""
    from longpack.rules import RULES

    dirs = {"NVIDIA-NeMo/Megatron-Bridge": ("bridge", bridge), "NVIDIA/Megatron-LM": ("mcore", mcore)}
    lines = ["| rule | source | recorded | observed | |", "|---|---|---|---|---|"]
    mismatches = 0
    for r in RULES:
        for src in r.provenance.sources:
            if src.repo not in dirs or not src.probe:
                continue
            product, gitdir = dirs[src.repo]
            if gitdir is None:
                continue
            # the whole package (files move between releases); documentation under its own folder
            top = src.path.split("/")[0]
            pathspec = "src/megatron/bridge" if top == "src" else top
            since, until = observed_range(gitdir, product, src.probe, pathspec)
            recorded = getattr(r.provenance, product)
            # a source that relaxed the rule appears where the rule's range ends
            want = (recorded.until, None) if src.relaxes else (recorded.since, recorded.until)
            if recorded.dev is not None and product == "mcore":  # dev recorded as an exception to the order
                want = (want[0], "dev") if recorded.dev is src.relaxes else want
            ok = (since, until) == want
            mismatches += not ok
            lines.append(
                f"| {r.id} | {src.path} `{src.probe[:40]}` | {recorded.text} | "
                f"{since or '(oldest)'} .. {until or '(open)'} | {'' if ok else 'DIFFERS'} |"
            )
    lines.append(f"\n{mismatches} source(s) whose probe range differs from the recorded range")
    return "\n".join(lines) + "\n"


def source_problem(gitdir: Path, commit: str, path: str, probe: str | None) -> str | None:
    """Why a rule source does not hold in this checkout (``None`` when it does): the commit is not in it,
    the file is not at that commit, or the probe is not in the file there."""
    base = ["git", f"--git-dir={gitdir / '.git'}" if (gitdir / ".git").exists() else f"--git-dir={gitdir}"]

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*base, *args], capture_output=True, check=False)

    if run("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return "commit not in this checkout"
    blob = run("show", f"{commit}:{path}")
    if blob.returncode != 0:
        return "file not at this commit"
    if probe and probe not in blob.stdout.decode("utf-8", errors="replace"):
        return "probe not in the file at this commit"
    return None


def sources(bridge: Path | None, mcore: Path | None) -> tuple[str, int]:
    """Every rule source of the given repositories checked at its own commit (its file there, its probe in
    the file): the report and how many sources do not hold. A commit the checkout lacks (a pull-request
    branch, say) is listed apart: it cannot be checked here, which is not a wrong source."""
    from longpack.rules import RULES

    dirs = {"NVIDIA-NeMo/Megatron-Bridge": bridge, "NVIDIA/Megatron-LM": mcore}
    wrong: list[str] = []
    absent: list[str] = []
    checked = 0
    for r in RULES:
        for src in r.provenance.sources:
            gitdir = dirs.get(src.repo)
            if gitdir is None:
                continue
            checked += 1
            problem = source_problem(gitdir, src.commit, src.path, src.probe)
            if problem is None:
                continue
            line = f"- {r.id}: {src.repo}@{src.commit}:{src.path}" + (f" `{src.probe}`" if src.probe else "")
            (absent if problem.startswith("commit not") else wrong).append(f"{line}: {problem}")
    lines = [
        f"{checked} rule sources checked at their commits; {len(wrong)} do not hold, {len(absent)} not checkable"
    ]
    if wrong:
        lines += ["", "## Do not hold", *wrong]
    if absent:
        lines += ["", "## Commit not in this checkout", *absent]
    return "\n".join(lines) + "\n", len(wrong)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_sites = sub.add_parser("sites", help="assert/raise sites that appeared, changed or disappeared")
    p_sites.add_argument("--repo", type=Path, required=True, help="checkout or bare git dir")
    p_sites.add_argument("--from", dest="old", required=True, help="commit-ish or YYYY-MM-DD")
    p_sites.add_argument("--to", dest="new", required=True, help="commit-ish or YYYY-MM-DD")
    p_sites.add_argument("--paths", nargs="*", help="fnmatch patterns (default: the watched files)")
    p_sites.add_argument("--out", type=Path, help="write the report here as well")
    p_ranges = sub.add_parser("ranges", help="version ranges from the rules' probes vs the recorded ranges")
    p_ranges.add_argument("--bridge", type=Path)
    p_ranges.add_argument("--mcore", type=Path)
    p_sources = sub.add_parser("sources", help="every rule source at its own commit: file and probe there")
    p_sources.add_argument("--bridge", type=Path)
    p_sources.add_argument("--mcore", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "sources":
        if args.bridge is None and args.mcore is None:
            raise SystemExit("error: sources needs --bridge and/or --mcore (git checkouts)")
        text, wrong = sources(checkout(args.bridge, "--bridge"), checkout(args.mcore, "--mcore"))
        sys.stdout.write(text)
        return 1 if wrong else 0
    if args.cmd == "sites":
        checkout(args.repo, "--repo")
        if args.out:
            check_out(args.out)
        text = report(args.repo, args.old, args.new, args.paths)
        if args.out:
            write_out(args.out, text)
    else:
        if args.bridge is None and args.mcore is None:
            raise SystemExit("error: ranges needs --bridge and/or --mcore (git checkouts)")
        text = ranges(checkout(args.bridge, "--bridge"), checkout(args.mcore, "--mcore"))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
