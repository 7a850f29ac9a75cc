"""The Megatron-Bridge config of a packed output, in the three forms a Bridge user pastes.

One :class:`BridgeHandoff` describes what a training run needs to read an output folder: the paths, the
pack size, ``seq_length`` for model and dataset, ``micro_batch_size: 1``, the packing specs, the seed,
``do_validation: false`` when there is no validation split, the fixed-width options when asked, and for
CP > 1 the loss settings Bridge asserts for finetuning with context parallelism
(``calculate_per_token_loss: true``, ``ddp.average_in_collective: false``). It renders as

- :meth:`BridgeHandoff.to_yaml`: nested YAML, written to ``<out>/bridge_config.yaml`` (Bridge merges a YAML
  file into its ``ConfigContainer``; ``longpack check <out>/bridge_config.yaml --packed <out>`` checks it);
- :meth:`BridgeHandoff.overrides`: Hydra-style ``key=value`` overrides, shell-quoted so a shell passes
  them to Hydra intact (strings in Hydra double quotes, ``null`` for nothing, ``++`` where a recipe may
  leave the section out or ``null``);
- :meth:`BridgeHandoff.python`: a Python snippet for a recipe function (``PackedSequenceSpecs(...)``).

Two generations of Bridge's config are written (``api``):

- ``"main"`` (Megatron-Bridge v0.6.0 and main, packed Parquet): ``dataset.enable_offline_packing`` with
  ``dataset.offline_packing_specs`` (``megatron.bridge.data.packing.config.PackedSequenceSpecs``);
- ``"legacy"`` (Megatron-Bridge <= 0.5.1; the ``.npy`` files of 0.3.x and NeMo 2): ``dataset.packed_sequence_specs``
  (``megatron.bridge.data.datasets.packed_sequence.PackedSequenceSpecs``; packing is on when
  ``packed_sequence_size > 0``), without ``max_single_sequence_length``, which that class does not have.

The specs mapping carries ``_target_``: Bridge instantiates a mapping with ``_target_`` when it applies
a YAML file or overrides to its config, so the specs become a ``PackedSequenceSpecs`` also where the
recipe had none.

>>> h = BridgeHandoff(out=Path("/data/packed"), pack_size=4096, seq_length=4096, pad_seq_to_mult=1,
...                   seed=1234, train_path="training_4096.idx.parquet", metadata_path="4096_metadata.jsonl")
>>> h.to_mapping()["dataset"]["offline_packing_specs"]["packed_train_data_path"]
'/data/packed/training_4096.idx.parquet'
>>> [o for o in h.overrides() if "do_validation" in o or "train_data" in o]
['dataset.do_validation=false', '\\'++dataset.offline_packing_specs.packed_train_data_path="/data/packed/training_4096.idx.parquet"\\'']
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longpack.errors import ConfigError, PackedDataError
from longpack.packed.formats import output_format
from longpack.packed.manifest import MANIFEST_NAME, PackManifest
from longpack.validate import one_of

__all__ = [
    "BRIDGE_APIS",
    "BRIDGE_CONFIG_NAME",
    "BRIDGE_CONFIG_VERSION",
    "HANDOFF_OPTIONS",
    "LEGACY_BRIDGE_VERSION",
    "SPECS_CLASS",
    "BridgeHandoff",
    "balance_topology",
    "format_override_value",
    "handoff_from_manifest",
]

BRIDGE_CONFIG_NAME = "bridge_config.yaml"
#: What only ``bridge_config.yaml`` needs, not the packed files: the topology the data was aligned for and
#: the fixed-width switches (:class:`BridgeHandoff`'s fields; the manifest records them as
#: ``bridge_config.options``, and :func:`handoff_from_manifest` takes them back).
HANDOFF_OPTIONS = ("tp", "cp", "sp", "pad_to_max_length", "pad_cu_seqlens")
#: The Megatron-Bridge release whose config keys ``bridge_config.yaml`` (main API) uses; earlier releases
#: that read packed Parquet (v0.4.0 - v0.5.1) name the specs ``packed_sequence_specs`` (docs: bridge.md).
BRIDGE_CONFIG_VERSION = "v0.6.0"
#: The newest Megatron-Bridge release the ``legacy`` form (``dataset.packed_sequence_specs``) is written for:
#: ``longpack check`` runs its version-aware rules for it (Bridge main renamed the key, #4685).
LEGACY_BRIDGE_VERSION = "0.5.1"
BRIDGE_APIS = ("main", "legacy")
#: Import path of ``PackedSequenceSpecs`` and the dataset key holding it, per config generation.
SPECS_CLASS = {
    "main": "megatron.bridge.data.packing.config.PackedSequenceSpecs",
    "legacy": "megatron.bridge.data.datasets.packed_sequence.PackedSequenceSpecs",
}
SPECS_KEY = {"main": "offline_packing_specs", "legacy": "packed_sequence_specs"}
#: Where ``from ... import PackedSequenceSpecs`` comes from in the Python snippet.
SPECS_IMPORT = {
    "main": "megatron.bridge.data.packing",
    "legacy": "megatron.bridge.data.datasets.packed_sequence",
}
#: Config subtrees a recipe may leave out (or set to ``null``): overrides add them with ``++``.
_FORCE_ADD = ("dataset.offline_packing_specs.", "dataset.packed_sequence_specs.", "dataset.dataset_kwargs.")


@dataclass(frozen=True, kw_only=True)
class BridgeHandoff:
    """What a Megatron-Bridge run needs to read one packed output folder (see the module docstring).

    Paths (``train_path``, ``val_path``, ``metadata_path``) are relative to ``out`` as the manifest
    records them; the rendered forms use absolute paths. ``tp``/``cp``/``sp`` are the topology the data
    was aligned for (``None``: not given, not written).
    """

    out: Path
    pack_size: int
    seq_length: int
    pad_seq_to_mult: int
    seed: int
    train_path: str
    metadata_path: str
    val_path: str | None = None
    api: str = "main"
    tp: int | None = None
    cp: int | None = None
    sp: bool = False
    pad_to_max_length: bool = False
    pad_cu_seqlens: bool = False
    #: The topology a ``--balance`` pack was ordered for (``balance_topology``): its GBS, MBS and PP are
    #: pinned in the config, since the order is balanced for exactly them.
    balanced_for: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        one_of(self.api, BRIDGE_APIS, "api")
        if self.pad_cu_seqlens and not self.pad_to_max_length:
            raise ConfigError(
                "pad_cu_seqlens needs pad_to_max_length (Bridge: \"'pad_to_max_length=True' is required when "
                'pad_cu_seqlens is enabled"); set both',
                fields=("pad_cu_seqlens", "pad_to_max_length"),
            )
        if self.seq_length > self.pack_size:
            raise ConfigError(
                f"seq_length ({self.seq_length}) must not exceed pack_size ({self.pack_size})",
                fields=("seq_length", "pack_size"),
            )

    @property
    def options(self) -> dict[str, Any]:
        """The :data:`HANDOFF_OPTIONS` of this config, as the manifest records them.

        >>> BridgeHandoff(out=Path("/o"), pack_size=8, seq_length=8, pad_seq_to_mult=1, seed=0,
        ...               train_path="t.parquet", metadata_path="m.jsonl", cp=2).options
        {'tp': None, 'cp': 2, 'sp': False, 'pad_to_max_length': False, 'pad_cu_seqlens': False}
        """
        return {name: getattr(self, name) for name in HANDOFF_OPTIONS}

    def _abs(self, rel: str) -> str:
        return str(Path(self.out).absolute() / rel)

    def specs(self) -> dict[str, Any]:
        """The ``PackedSequenceSpecs`` fields (absolute paths), without ``_target_``."""
        specs: dict[str, Any] = {"packed_sequence_size": self.pack_size}
        if self.api == "main" and self.seq_length != self.pack_size:
            specs["max_single_sequence_length"] = self.seq_length
        specs["pad_seq_to_mult"] = self.pad_seq_to_mult
        specs["pad_cu_seqlens"] = self.pad_cu_seqlens
        specs["packed_train_data_path"] = self._abs(self.train_path)
        if self.val_path is not None:
            specs["packed_val_data_path"] = self._abs(self.val_path)
        specs["packed_metadata_path"] = self._abs(self.metadata_path)
        return specs

    def to_mapping(self) -> dict[str, Any]:
        """The config as nested sections (``model``, ``train``, ``ddp``, ``dataset``) of a ``ConfigContainer``."""
        model: dict[str, Any] = {"seq_length": self.pack_size}
        if self.tp is not None:
            model["tensor_model_parallel_size"] = self.tp
        if self.cp is not None:
            model["context_parallel_size"] = self.cp
        if self.tp is not None or self.cp is not None or self.sp:
            model["sequence_parallel"] = self.sp
        cp_loss = (self.cp or 1) > 1
        if cp_loss:
            model["calculate_per_token_loss"] = True
        dataset: dict[str, Any] = {
            "dataset_root": str(Path(self.out).absolute()),
            "seq_length": self.pack_size,
            "seed": self.seed,
            "do_validation": self.val_path is not None,
            "do_test": False,
        }
        if self.api == "main":
            dataset["enable_offline_packing"] = True
        if self.pad_to_max_length:
            dataset["dataset_kwargs"] = {"pad_to_max_length": True}
        dataset[SPECS_KEY[self.api]] = {"_target_": SPECS_CLASS[self.api], **self.specs()}
        train: dict[str, Any] = {"micro_batch_size": 1}
        if self.balanced_for:
            b = self.balanced_for
            model["pipeline_model_parallel_size"] = b.get("pp", 1)
            if b.get("vpp", 1) > 1:
                model["virtual_pipeline_model_parallel_size"] = b["vpp"]
            train = {"micro_batch_size": b.get("mbs", 1), "global_batch_size": b["gbs"]}
        out: dict[str, Any] = {"model": model, "train": train}
        if cp_loss:
            out["ddp"] = {"average_in_collective": False}
        out["dataset"] = dataset
        return out

    def check_command(self) -> str:
        """The ``longpack check`` command line for this config and its folder (shell-quoted; the legacy form
        is checked for :data:`LEGACY_BRIDGE_VERSION`, the main form for :data:`BRIDGE_CONFIG_VERSION`: the Bridge
        each is written for)."""
        out = Path(self.out).absolute()
        # pinned: the rules' default version follows the installed packages, which need not be this Bridge
        version = BRIDGE_CONFIG_VERSION.removeprefix("v") if self.api == "main" else LEGACY_BRIDGE_VERSION
        version = f" --bridge-version {version}"
        return (
            f"longpack check {shlex.quote(str(out / BRIDGE_CONFIG_NAME))} --packed {shlex.quote(str(out))}"
            + version
        )

    def to_yaml(self) -> str:
        """``bridge_config.yaml``: a comment naming the Bridge versions, then the nested mapping."""
        import yaml

        served = (
            f"Megatron-Bridge {BRIDGE_CONFIG_VERSION} and main (packed Parquet)"
            if self.api == "main"
            else "Megatron-Bridge <= 0.5.1 (dataset.packed_sequence_specs; .npy for 0.3.x and NeMo 2)"
        )
        head = (
            f"# Written by longpack for {served}.\n"
            f"# Merge it into a recipe's ConfigContainer (a YAML config file), or check it:\n"
            f"#   {self.check_command()}\n"
        )
        if self.balanced_for:
            b = self.balanced_for
            head += (
                f"# The packs are in workload-balanced order for DP={b.get('dp')}, PP={b.get('pp', 1)}, "
                f"GBS={b.get('gbs')}, MBS={b.get('mbs', 1)}:\n# train on exactly that topology (DP = GPUs / "
                "(TP*CP*PP)); `longpack check --gpus N` compares it.\n"
            )
        return head + yaml.safe_dump(self.to_mapping(), sort_keys=False, default_flow_style=False)

    def flat(self) -> dict[str, Any]:
        """Every leaf as ``dotted.key -> value``, in the YAML's order."""
        out: dict[str, Any] = {}

        def walk(node: Mapping[str, Any], prefix: str) -> None:
            for key, value in node.items():
                path = f"{prefix}{key}"
                if isinstance(value, Mapping):
                    walk(value, path + ".")
                else:
                    out[path] = value

        walk(self.to_mapping(), "")
        return out

    def overrides(self) -> list[str]:
        """Hydra-style overrides, each one shell-quoted (paste them after a launcher such as
        ``run_recipe.py``): ``key=value``, or ``++key=value`` for the specs and ``dataset_kwargs``, which a
        recipe may not have."""
        items = []
        for key, value in self.flat().items():
            prefix = "++" if key.startswith(_FORCE_ADD) else ""
            items.append(shlex.quote(f"{prefix}{key}={format_override_value(value)}"))
        return items

    def python(self) -> str:
        """A Python snippet that sets the same values on a recipe's config object ``cfg``."""
        m = self.to_mapping()
        lines = [f"from {SPECS_IMPORT[self.api]} import PackedSequenceSpecs", ""]
        for section in ("model", "train", "ddp"):
            for key, value in m.get(section, {}).items():
                lines.append(f"cfg.{section}.{key} = {value!r}")
        specs_key = SPECS_KEY[self.api]
        for key, value in m["dataset"].items():
            if key in (specs_key, "dataset_kwargs"):
                continue
            lines.append(f"cfg.dataset.{key} = {value!r}")
        if self.pad_to_max_length:
            lines.append(
                'cfg.dataset.dataset_kwargs = {**(cfg.dataset.dataset_kwargs or {}), "pad_to_max_length": True}'
            )
        lines.append(f"cfg.dataset.{specs_key} = PackedSequenceSpecs(")
        for key, value in self.specs().items():
            lines.append(f"    {key}={value!r},")
        lines.append(")")
        return "\n".join(lines) + "\n"


def format_override_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back: ``true``/``false``, ``null``, numbers as they are,
    strings in double quotes (``\\`` before a quote and the quote itself escaped).

    >>> [format_override_value(v) for v in (True, None, 8, "/a b/c,d=1")]
    ['true', 'null', '8', '"/a b/c,d=1"']
    >>> format_override_value('say "hi"')
    '"say \\\\"hi\\\\""'
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if "${" in text:
        raise ConfigError(
            f"{text!r}: a value holding '${{' would be read as an interpolation by Hydra; choose another path"
        )
    out, backslashes = [], 0
    for ch in text:
        if ch == "\\":
            backslashes += 1
            continue
        if ch == '"':
            out.append("\\" * (2 * backslashes) + '\\"')
        else:
            out.append("\\" * backslashes + ch)
        backslashes = 0
    out.append("\\" * (2 * backslashes))  # backslashes before the closing quote
    return '"' + "".join(out) + '"'


def handoff_from_manifest(
    out: Path,
    manifest: PackManifest | Mapping[str, Any],
    *,
    tp: int | None = None,
    cp: int | None = None,
    sp: bool = False,
    pad_to_max_length: bool = False,
    pad_cu_seqlens: bool = False,
) -> BridgeHandoff:
    """The hand-off of a packed output from its manifest's ``settings`` and ``megatron_bridge`` records
    (a :class:`~longpack.packed.manifest.PackManifest`, or the dict ``manifest.json`` holds).

    >>> m = {"settings": {"pack_size": 8, "seq_length": 6, "pad_seq_to_mult": 2, "seed": 0},
    ...      "megatron_bridge": {"packed_train_data_path": "training_8.idx.parquet",
    ...                          "packed_metadata_path": "8_metadata.jsonl"}}
    >>> handoff_from_manifest(Path("/o"), m).specs()["max_single_sequence_length"]
    6
    """
    record = manifest if isinstance(manifest, PackManifest) else PackManifest.from_dict(manifest)
    settings, mb = record.settings, record.megatron_bridge
    pack_size, seq_length, multiple, seed = (
        settings.pack_size,
        settings.seq_length,
        settings.pad_seq_to_mult,
        settings.seed,
    )
    if pack_size is None or seq_length is None or multiple is None or seed is None:
        names = ("pack_size", "seq_length", "pad_seq_to_mult", "seed")
        missing = [
            n for n, v in zip(names, (pack_size, seq_length, multiple, seed), strict=True) if v is None
        ]
        raise PackedDataError(
            f"{MANIFEST_NAME}: settings lack {', '.join(missing)}: not a Megatron-Bridge packed-SFT output; "
            "pack the folder again"
        )
    return BridgeHandoff(
        out=out,
        pack_size=pack_size,
        seq_length=seq_length,
        pad_seq_to_mult=multiple,
        seed=seed,
        train_path=mb["packed_train_data_path"],
        val_path=mb.get("packed_val_data_path"),
        metadata_path=mb["packed_metadata_path"],
        api=output_format(settings.output_format).bridge_api or "main",
        tp=tp,
        cp=cp,
        sp=sp,
        pad_to_max_length=pad_to_max_length,
        pad_cu_seqlens=pad_cu_seqlens,
        balanced_for=balance_topology(settings.extra.get("balance")),
    )


#: Topology keys of a ``--balance`` spec (``dp=8,pp=4,gbs=128,...``) that the order depends on.
BALANCE_TOPOLOGY_KEYS = ("dp", "pp", "vpp", "gbs", "mbs")


def balance_topology(spec: Any) -> dict[str, int] | None:
    """The topology of a ``--balance`` spec as the manifest records it (``settings.balance``), or ``None``.

    >>> balance_topology("dp=8,pp=4,gbs=128,model=qwen3_8b,gpu=H100")
    {'dp': 8, 'pp': 4, 'gbs': 128}
    >>> balance_topology(None) is None, balance_topology("nonsense") is None
    (True, True)
    """
    if not isinstance(spec, str):
        return None
    out: dict[str, int] = {}
    for part in spec.replace(" ", "").split(","):
        key, _, value = part.partition("=")
        if key in BALANCE_TOPOLOGY_KEYS and value.isdigit():
            out[key] = int(value)
    return out if "gbs" in out and "dp" in out else None
