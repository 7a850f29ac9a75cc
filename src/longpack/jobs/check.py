"""The check job: every configuration rule of ``longpack.rules`` on a training config (``longpack check``).

A thin typed entry point over ``longpack.rules.load_setup`` / ``setup_from_mapping`` and ``run_rules``:
:class:`CheckConfig` names the config file, the Hydra-style overrides, the GPU count, the model and an
optional packed folder; :meth:`~CheckConfig.run` returns a :class:`CheckResult`.

>>> r = CheckConfig(overrides=("model.context_parallel_size=2", "model.seq_length=4097"), gpus=8).run()
>>> r.ok, sorted({f.rule_id for f in r.findings if f.severity.value == "error"})[:1]
(False, ['LP-CP-001'])
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longpack import choices
from longpack.errors import ConfigError
from longpack.jobs.options import bridge_version_option, gpus_option, megatron_core_version_option
from longpack.option import option
from longpack.validate import optional_positive_int

__all__ = [
    "EXIT_ERRORS",
    "EXIT_OK",
    "CheckConfig",
    "CheckResult",
    "explain_rule",
    "family_table",
    "rule_table",
]

EXIT_OK, EXIT_ERRORS = 0, 1

if TYPE_CHECKING:
    from longpack.rules.config import LoadedSetup
    from longpack.rules.packed_data import PackedDataSummary
    from longpack.rules.registry import Finding, Rule
    from longpack.rules.versions import UpstreamVersions


@dataclass(frozen=True, kw_only=True)
class CheckConfig:
    """What to check: ``config`` (a YAML/JSON file, Megatron-Bridge dumps welcome; ``None`` for overrides
    only), ``overrides`` (``model.context_parallel_size=8``, ``+key=value``, ``~key``), ``gpus`` (world
    size), ``model`` (a catalog model id), ``dataset_kind`` (default: inferred) and ``packed`` (a packed
    output folder to check against the config; ``packed_no_manifest_ok`` reads a folder without
    ``manifest.json``, as Megatron-Bridge's prepare step writes it).

    ``bridge_version`` / ``megatron_core_version`` (``0.6.0``, ``0.19.0``, ``main``) choose the rules: a
    rule whose version range leaves them out is not applied. Default: ``$LONGPACK_BRIDGE_VERSION`` /
    ``$LONGPACK_MEGATRON_CORE_VERSION``, else the installed packages' versions, else the newest the
    catalog knows (``main``); the result says which and why."""

    command_help = (
        "Check a Megatron-Bridge training config (plus overrides, GPU count and packed data) against every "
        "packing, context-parallel, batch, CUDA-graph, Energon, MoE and pipeline rule."
    )

    config: str | Path | None = None  # on the command line: the first argument that is not KEY=VALUE
    overrides: Sequence[str] = option(
        (),
        help="A YAML/JSON config (Megatron-Bridge dumps welcome), then Hydra-style overrides "
        "(model.context_parallel_size=8, +key=value, ~key).",
        positional=True,
        metavar="[CONFIG] [KEY=VALUE ...]",
        cli_type=list[str] | None,
    )
    gpus: int | None = gpus_option()
    model: str | None = option(None, help="Model: a catalog id (see --list-families) for the model rules.")
    dataset_kind: str | None = option(
        None, help="Megatron-Bridge dataset config (default: inferred).", choices=choices.DATASET_KINDS
    )
    packed: str | Path | None = option(
        None,
        help="Packed output folder to check against the config (metadata + Parquet).",
        cli_type=Path | None,
    )
    packed_no_manifest_ok: bool = option(
        False,
        help="With --packed: read a folder without manifest.json (Megatron-Bridge's prepare step writes none).",
        flag="--no-manifest-ok",
    )
    bridge_version: str | None = bridge_version_option()
    megatron_core_version: str | None = megatron_core_version_option()

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        if isinstance(self.overrides, str):
            object.__setattr__(self, "overrides", (self.overrides,))
        elif isinstance(self.overrides, list | tuple):
            object.__setattr__(self, "overrides", tuple(self.overrides))
        else:
            raise ConfigError(
                f"overrides must be a list of 'key=value' strings, got {self.overrides!r}", fields="overrides"
            )
        object.__setattr__(self, "gpus", optional_positive_int(self.gpus, "gpus"))
        if not all(isinstance(o, str) for o in self.overrides):
            raise ConfigError(
                f"overrides must be strings such as 'model.context_parallel_size=8', got {self.overrides!r}",
                fields="overrides",
            )
        for name in ("config", "packed"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str | os.PathLike):
                raise ConfigError(f"{name} must be a path, got {value!r}", fields=name)
        for name in ("model", "dataset_kind"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name} must be a name (a string), got {value!r}", fields=name)
        self.versions()  # a version that does not parse is refused here, before any work

    def versions(self, config_keys: Any = None, setup: Any = None) -> Any:
        """The :class:`~longpack.rules.versions.UpstreamVersions` the rules run for: given, from the
        environment, an installed megatron-bridge, the range the config's keys (``config_keys``) bound, or
        the newest known."""
        from longpack.rules.checks.upstream import versions_for

        return versions_for(
            config_keys or (), bridge=self.bridge_version, mcore=self.megatron_core_version, setup=setup
        )

    def run(self) -> CheckResult:
        """Load the setup, inspect ``packed`` (if given) and run every rule.

        A config that cannot be read, or a packed folder that cannot be inspected, raises a
        ``longpack.errors.LongpackError`` (``ConfigError``, ``PackedDataError``).
        """
        from longpack.rules import inspect_packed_dir, load_setup, run_rules, setup_from_mapping
        from longpack.rules.runner import rules_outside

        common: dict[str, Any] = {
            "world_size": self.gpus,
            "dataset_kind": self.dataset_kind,
            "model_family": self.model,
        }
        try:
            if self.config is not None:
                loaded = load_setup(self.config, self.overrides, **common)
            else:
                loaded = setup_from_mapping({}, overrides=self.overrides, **common)
        except ConfigError:
            raise
        except ValueError as exc:  # e.g. an unknown dataset kind
            raise ConfigError(str(exc), fields="dataset_kind") from exc
        setup = loaded.setup
        packed = None
        if self.packed is not None:
            pss = setup.dataset.offline_packing_specs
            packed = inspect_packed_dir(
                self.packed,
                multiple=(setup.required_cp_multiple, setup.required_pad_seq_to_mult),
                pack_size_hint=None if pss is None else pss.packed_sequence_size,
                allow_no_manifest=self.packed_no_manifest_ok,
            )
        versions = self.versions(setup.given_keys, setup)
        findings = run_rules(setup, packed, versions=versions)
        return CheckResult(
            config=None if self.config is None else str(self.config),
            overrides=tuple(self.overrides),
            loaded=loaded,
            packed=packed,
            findings=tuple(findings),
            versions=versions,
            not_applied=tuple(rules_outside(versions)),
        )


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """The findings (errors first) of every rule, the setup they were run on (``loaded.setup``, with the
    loader's ``notes`` and ``ignored_keys``) and the packed-folder summary, if one was checked."""

    config: str | None
    overrides: tuple[str, ...]
    loaded: LoadedSetup
    findings: tuple[Finding, ...] = ()
    packed: PackedDataSummary | None = None
    versions: UpstreamVersions | None = None
    #: Rules whose version ranges leave the checked versions out (not applied).
    not_applied: tuple[Rule, ...] = ()

    @property
    def setup(self) -> Any:
        return self.loaded.setup

    @property
    def ok(self) -> bool:
        """No error-severity finding."""
        from longpack.rules import has_errors

        return not has_errors(self.findings)

    @property
    def exit_code(self) -> int:
        """``longpack check``'s exit code: 0 no errors, 1 at least one error."""
        return EXIT_OK if self.ok else EXIT_ERRORS

    @property
    def counts(self) -> dict[str, int]:
        return {
            s: sum(1 for f in self.findings if f.severity.value == s) for s in ("error", "warning", "info")
        }

    def summary(self) -> dict[str, Any]:
        """The parallel layout and batch the rules saw."""
        setup = self.setup
        m = setup.model
        return {
            "world_size": setup.world_size,
            "tp": setup.tp,
            "cp": setup.cp,
            "pp": setup.pp,
            "vpp": m.virtual_pipeline_model_parallel_size,
            "ep": setup.ep,
            "etp": setup.etp,
            "sp": setup.sp,
            "dp": setup.dp,
            "edp": None if setup.layout is None else setup.layout.edp,
            "pad_seq_to_mult_required": setup.required_pad_seq_to_mult,
            "dataset_kind": setup.dataset.kind.value,
            "model_family": None if setup.family is None else setup.family.name,
            "seq_length": setup.model_seq_length,
            "packed_width": setup.packed_width,
            "micro_batch_size": setup.micro_batch_size,
            "global_batch_size": setup.global_batch_size,
        }

    def to_dict(self) -> dict[str, Any]:
        """What ``longpack check --json`` prints."""
        out: dict[str, Any] = {
            "config": self.config,
            "overrides": list(self.overrides),
            "ok": self.ok,
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "counts": self.counts,
            "findings": [f.to_dict() for f in self.findings],
            "versions": None if self.versions is None else self.versions.to_dict(),
            "rules_not_applied": [
                {"id": r.id, "title": r.title, "versions": r.provenance.ranges_text()}
                for r in self.not_applied
            ],
            "notes": list(self.loaded.notes),
            "ignored_keys": list(self.loaded.ignored_keys),
        }
        p = self.packed
        if p is not None:
            out["packed"] = {
                "path": p.path,
                "pack_size": p.pack_size,
                "metadata": p.metadata_path,
                "parquet_files": len(p.parquet_files),
                "rows": p.rows,
                "sequences": p.segments,
                "misaligned_sequences": p.misaligned_segments,
                "manifest": p.manifest is not None,
            }
        return out


def rule_table() -> list[dict[str, Any]]:
    """Every configuration rule: ``id``, ``severity``, ``title``, ``source``, ``scope``, ``versions`` (the
    Megatron-Bridge / Megatron-Core ranges it applies to) and ``sources`` (``repo``, ``path``, ``commit``,
    ``relaxes``: the upstream files it was read from) (``--list-rules``).

    >>> row = next(r for r in rule_table() if r["id"] == "LP-HCP-001")
    >>> row["versions"], row["sources"][0]["commit"]
    ('Megatron-Core >= 0.16.0, < dev', '98d8c56dbd')
    """
    from longpack.rules import RULES

    return [
        {
            "id": r.id,
            "severity": r.severity.value,
            "title": r.title,
            "source": r.source,
            "scope": r.scope,
            "versions": r.provenance.ranges_text(),
            "sources": [
                {"repo": s.repo, "path": s.path, "commit": s.commit, "relaxes": s.relaxes}
                for s in r.provenance.sources
            ],
        }
        for r in RULES.values()
    ]


def family_table() -> list[dict[str, Any]]:
    """Every model family the rules know, with its shape and which packing it supports (``--list-families``)."""
    from longpack.rules import FAMILIES

    return [
        {
            "name": f.name,
            "display_name": f.display_name,
            "num_layers": f.num_layers,
            "num_attention_heads": f.num_attention_heads,
            "num_query_groups": f.num_query_groups,
            "num_moe_experts": f.num_moe_experts,
            "mtp_num_layers": f.mtp_num_layers,
            "offline_packing": f.offline_packing and f.any_packing,
            "in_batch_packing": f.in_batch_packing and f.any_packing,
        }
        for f in FAMILIES
    ]


def explain_rule(rule_id: str) -> dict[str, Any]:
    """``longpack check --explain RULE``: :func:`longpack.rules.recipes.explain_rule` (the rule, its sources,
    versions and the Bridge recipes that exercise it)."""
    from longpack.rules.recipes import explain_rule as explain

    return explain(rule_id)
