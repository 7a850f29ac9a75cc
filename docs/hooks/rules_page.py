"""mkdocs hook: the rules reference page (``reference/rules.md``), generated from the rule registry.

Nothing is written to ``docs/``: :func:`on_files` adds the page to the build in memory, so the page
always lists exactly the rules of the code being documented. :func:`render` is plain Python (no mkdocs)
so a test can check the page without building the site.

The generator reads only these attributes of each record in ``longpack.rules.RULES``: ``id``,
``severity`` (an enum with ``.value`` or a string), ``title``, ``source`` (upstream names, shown with
identifiers as code) and ``scope``; ``fix``, ``description`` and ``provenance`` (the versions the rule
applies to and its upstream files and commits) are shown when a record has them.
"""

from __future__ import annotations

import re
from typing import Any

PAGE = "reference/rules.md"

# Rule families by id prefix, in the order a reader meets them; an unknown prefix gets its own section.
FAMILIES = {
    "CFG": "Basic input",
    "TOPO": "Topology",
    "SP": "Sequence parallelism",
    "PP": "Pipeline parallelism",
    "VER": "Settings of the Megatron version checked for",
    "CP": "Context parallelism",
    "HCP": "Hybrid context parallelism",
    "SCHED": "Sequence-packing schedulers",
    "SEQ": "Sequence lengths",
    "BATCH": "Batch sizes",
    "PACK": "Packing",
    "MTP": "Multi-token prediction",
    "CG": "CUDA graphs",
    "EN": "Megatron-Energon packing",
    "MOE": "Mixture of Experts",
    "MODEL": "Model families",
    "DATA": "Packed data (`--packed`)",
}

# A rule's ``source`` names upstream code or documents, several joined by "; " (``Bridge
# ConfigContainer.validate; Bridge docs (recommended settings)``). On the page, identifiers are shown as
# code: dotted or snake_case names and CamelCase class names; product names are not identifiers.
_IDENTIFIER = re.compile(
    r"(?<![\w`-])([A-Za-z][\w]*(?:[._][\w]+)+|[A-Z][A-Za-z0-9]*[a-z][A-Z][A-Za-z0-9]*)(?![\w`-])"
)
PRODUCTS = frozenset({"TransformerEngine", "DeepSeek", "HybridEP", "DeepEP"})


def source_text(source: str) -> str:
    """The ``source`` of a rule as Markdown: its parts in order (repeats dropped), identifiers as code.

    >>> source_text("Bridge ConfigContainer.validate; Bridge docs (recommended settings)")
    'Bridge `ConfigContainer.validate`; Bridge docs (recommended settings)'
    >>> source_text("Bridge gpt_step CP split; TransformerEngine thd_get_partitioned_indices")
    'Bridge `gpt_step` CP split; TransformerEngine `thd_get_partitioned_indices`'
    >>> source_text("MCore TransformerConfig; MCore TransformerConfig"), source_text("Megatron-LM arguments")
    ('MCore `TransformerConfig`', 'Megatron-LM arguments')
    """
    parts: list[str] = []
    for part in (p.strip() for p in source.split(";")):
        text = _IDENTIFIER.sub(lambda m: m.group(1) if m.group(1) in PRODUCTS else f"`{m.group(1)}`", part)
        if text and text not in parts:
            parts.append(text)
    return "; ".join(parts)


def _family(rule_id: str) -> str:
    parts = rule_id.split("-")
    return parts[1] if len(parts) > 2 else rule_id


def _cell(text: Any) -> str:
    # Titles hold products such as TP*CP*PP, which Markdown would read as emphasis.
    return str(text).replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


def versions_text(record: Any) -> str:
    """The Megatron-Bridge / Megatron-Core ranges a rule applies to (``all`` without a provenance)."""
    provenance = getattr(record, "provenance", None)
    return "all" if provenance is None else provenance.ranges_text().replace("all versions", "all")


def upstream_text(record: Any) -> str:
    """The rule's upstream files, each with the commit it was read from (a link), as Markdown.

    >>> from types import SimpleNamespace as NS
    >>> src = NS(repo="NVIDIA/Megatron-LM", path="megatron/training/arguments.py", commit="98d8c56dbd", relaxes=False)
    >>> upstream_text(NS(provenance=NS(sources=(src,))))
    'Megatron-LM `megatron/training/arguments.py` @ [98d8c56dbd](https://github.com/NVIDIA/Megatron-LM/commit/98d8c56dbd)'
    """
    provenance = getattr(record, "provenance", None)
    parts = []
    for src in getattr(provenance, "sources", ()):
        if src.repo == "longpack" or not src.path:
            continue
        text = f"{src.repo.split('/')[-1]} `{src.path}`"
        if src.commit:
            text += f" @ [{src.commit}](https://github.com/{src.repo}/commit/{src.commit})"
        text += " (relaxed the rule)" if src.relaxes else ""
        if text not in parts:  # two probes of one file and commit are one source on the page
            parts.append(text)
    return "<br>".join(parts)


def render(rules: Any = None) -> str:
    """The Markdown of the rules page (``rules``: the registry mapping; default ``longpack.rules.RULES``)."""
    if rules is None:
        from longpack.rules import RULES as rules
    records = list(rules.values())
    by_family: dict[str, list[Any]] = {}
    for record in records:
        by_family.setdefault(_family(record.id), []).append(record)
    order = [f for f in FAMILIES if f in by_family] + [f for f in by_family if f not in FAMILIES]
    show_fix = any(getattr(r, "fix", None) for r in records)
    severities = [getattr(r.severity, "value", r.severity) for r in records]

    out = [
        "# Rules",
        "",
        f"`longpack check` knows {len(records)} rules: {severities.count('error')} errors, "
        f"{severities.count('warning')} warnings and {severities.count('info')} infos. This page is generated "
        "from the rule registry (`longpack.rules.RULES`) when the site is built; `longpack check --list-rules` "
        "prints the same list (`--json` for machines). Rule ids are stable and never reused.",
        "",
        "An **error** makes `longpack check` exit with code 1 (Megatron would refuse the config or fail at "
        "run time); a **warning** is a likely problem; an **info** is advice. Rules marked *packed data* run "
        "only with `--packed DIR`. Each finding also carries a message quoting the values involved, the "
        "config keys with the `file:line` or override they came from, and a concrete fix.",
        "",
        "The **versions** column gives the Megatron-Bridge and Megatron-Core releases a rule applies to "
        "(`main` is the unreleased development branch; `all` means every release longpack knows). "
        "`longpack check` applies a rule only when both versions it checks for are in range; see "
        "[check](../guide/check.md#versions) for how the versions are chosen. The **source** column names "
        "the upstream file and the commit each rule was read from; a commit marked *relaxed the rule* is the "
        "upstream change after which the rule no longer holds.",
        "",
    ]
    for family in order:
        out += [f"## {FAMILIES.get(family, family)} {{#family-{family.lower()}}}", ""]
        header = ["id", "severity", "what it checks", "applies to", "versions", "source"] + (
            ["fix"] if show_fix else []
        )
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in by_family[family]:
            title = getattr(r, "description", None) or r.title
            cells = [
                f'<a id="{r.id.lower()}"></a>`{r.id}`',
                getattr(r.severity, "value", r.severity),
                _cell(title),
                "packed data" if getattr(r, "scope", "config") == "packed" else "config",
                _cell(versions_text(r)),
                _cell(source_text(getattr(r, "source", "")))
                + (f"<br>{upstream}" if (upstream := upstream_text(r)) else ""),
            ]
            if show_fix:
                cells.append(_cell(getattr(r, "fix", "") or ""))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "## Sources {#sources}",
        "",
        "The source column names the upstream code or document a rule restates (Megatron-Bridge is *Bridge*, "
        "Megatron-Core is *MCore*).",
        "",
        "- **Bridge `ConfigContainer.validate`**, **`EnergonDatasetConfig.validate`**, "
        "**`GPTSFTDatasetConfig.validate`**: checks Megatron-Bridge runs when a training starts; longpack runs "
        "them before any GPU is allocated. **Bridge batch sampler** and **MCore microbatch calculator**: the "
        "batch-size checks that fail later, when the data loader or the schedule is built.",
        "- **Bridge docs (recommended settings)**, **Bridge performance guide**: requirements Megatron-Bridge's "
        "documentation states but its code does not check (GBS vs DP, `pad_seq_to_mult` vs the topology, equal "
        "lengths, HybridEP widths, CUDA graphs with variable shapes, no MTP with packed SFT).",
        "- **Bridge recipes**: model families whose recipes turn packing off.",
        "- **Bridge `PackedSequenceSpecs`**, **offline packing output files**, **`fill_packing_strategy`**, "
        "**`build_gpt_sft_split`**, **packed `collate_fn`**, **`gpt_step`**, **`get_packed_seq_params`**, "
        "**TransformerEngine `thd_get_partitioned_indices`**: what the offline packing config, the files and "
        "the runtime need of the packed data (see [packed format](packed-format.md) and "
        "[THD batches](thd-batch.md)).",
        "- **MCore**: Megatron-Core's own configuration checks (`TransformerConfig`, `ModelParallelConfig`, "
        "`parallel_state`, pipeline layouts, sequence parallelism, `cp_comm_type`).",
        "- **Megatron-LM arguments**, **MCore `BalancedCPScheduler`**, **`wrap_data_iterator`**: the hybrid "
        "context-parallel and sequence-packing scheduler checks of Megatron-LM's training loop and of "
        "Megatron-Core's data schedulers.",
        "- **Megatron-Bridge and Megatron-Core release history**: settings that only some versions have.",
        "- **longpack**: advice about what the check itself could not see.",
        "",
    ]
    return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs event: add the generated page to the build."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
