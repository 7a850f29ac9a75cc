"""``manifest.json`` of a packed output folder as typed records (written last; its absence = unfinished).

The manifest is the folder's own account of itself: the settings that shaped the files, where every
sample came from, every truncated / dropped / malformed sample, and the bytes of every file. One
:class:`PackManifest` reads and writes it; :meth:`PackManifest.to_json_bytes` gives exactly the bytes
``longpack pack`` writes (keys sorted, two-space indent, one trailing newline), and a manifest read back
writes the same bytes again. Keys this version does not know are kept (``extra``), never dropped.

>>> m = PackManifest.from_dict({"format": "longpack.packed/1", "settings": {"pack_size": 8,
...     "pad_seq_to_mult": 2}, "tokenizer": {"eos_id": 2}, "splits": {"training": {"rows": 3,
...     "files": [{"name": "training_8.idx.parquet", "rows": 3}]}}, "future_key": 1})
>>> m.pack_size, m.pad_seq_to_mult, m.eos_id, m.split_names, m.splits["training"].file_names
(8, 2, 2, ('training',), ('training_8.idx.parquet',))
>>> PackManifest.from_dict(m.to_dict()) == m, m.extra
(True, {'future_key': 1})
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from longpack import choices
from longpack.errors import DamagedDataError, PackedDataError

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "FileRecord",
    "ManifestSettings",
    "PackManifest",
    "SplitRecord",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "longpack.packed/1"


def _known(data: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    known = {k: data[k] for k in keys if k in data}
    extra = {k: v for k, v in data.items() if k not in keys}
    return known, extra


def _expect(known: dict[str, Any], where: str, kinds: Mapping[str, tuple[type, ...]]) -> None:
    """Refuse a known key whose value has the wrong JSON type (a damaged or hand-edited manifest), so
    readers never meet a list where a count belongs."""
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}
    for key, types in kinds.items():
        if key not in known:
            continue
        value = known[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            want = " or ".join(names.get(t, t.__name__) for t in types if t is not bool)
            raise DamagedDataError(
                f"{MANIFEST_NAME}: {where}{key} must be {want}, got {type(value).__name__} {value!r:.60}; "
                "the manifest is damaged: pack the folder again"
            )


def _records(values: Any, where: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(values, list | tuple) or not all(isinstance(v, Mapping) for v in values):
        raise DamagedDataError(
            f"{MANIFEST_NAME}: {where} must be a list of objects; the manifest is damaged: pack the folder again"
        )
    return tuple(values)


_COUNT = (int,)
_NUMBER = (int, float)


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    """One written data file: name (relative to the folder), rows, stored tokens, size and sha256."""

    name: str
    rows: int = 0
    stored_tokens: int = 0
    size_bytes: int = 0
    sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("name", "rows", "stored_tokens", "size_bytes", "sha256")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileRecord:
        known, extra = _known(data, cls._KEYS)
        _expect(
            known,
            "a file's ",
            {"name": (str,), "rows": _COUNT, "stored_tokens": _COUNT, "size_bytes": _COUNT, "sha256": (str,)},
        )
        name = known.get("name")
        parts = str(name).split("/")
        if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
            raise PackedDataError(
                f"{MANIFEST_NAME}: file name {name!r} is not a path inside the folder; the manifest is "
                "damaged: pack the folder again"
            )
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._KEYS}, **self.extra}


@dataclass(frozen=True, kw_only=True)
class SplitRecord:
    """One split (``training`` / ``validation``): its files, metadata entry, counts and listed samples.

    ``truncated`` / ``dropped`` list samples one by one (``source`` = ``file:line``, ``stored_length``, ...)
    up to the manifest's listing cap; ``truncated_count`` / ``dropped_count`` are always complete.
    """

    name: str
    metadata: dict[str, Any] = field(default_factory=dict)
    files: tuple[FileRecord, ...] = ()
    samples_in: int = 0
    samples_packed: int = 0
    rows: int = 0
    runtime_tokens: int = 0
    stored_tokens: int = 0
    alignment_pad_tokens: int = 0
    fill_mean: float = 0.0
    truncated_count: int = 0
    dropped_count: int = 0
    truncated: tuple[dict[str, Any], ...] = ()
    dropped: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = (
        "metadata",
        "files",
        "samples_in",
        "samples_packed",
        "rows",
        "runtime_tokens",
        "stored_tokens",
        "alignment_pad_tokens",
        "fill_mean",
        "truncated_count",
        "dropped_count",
        "truncated",
        "dropped",
    )

    @property
    def file_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> SplitRecord:
        known, extra = _known(data, cls._KEYS)
        counts = ("samples_in", "samples_packed", "rows", "runtime_tokens", "stored_tokens")
        _expect(
            known,
            f"split {name!r}: ",
            {
                "metadata": (dict,),
                "fill_mean": _NUMBER,
                "truncated_count": _COUNT,
                "dropped_count": _COUNT,
                "alignment_pad_tokens": _COUNT,
                **dict.fromkeys(counts, _COUNT),
            },
        )
        known["files"] = tuple(
            FileRecord.from_dict(f) for f in _records(known.get("files", []), f"split {name!r}: files")
        )
        for key in ("truncated", "dropped"):
            known[key] = _records(known.get(key, []), f"split {name!r}: {key}")
        return cls(name=name, **known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self._KEYS}
        out["files"] = [f.to_dict() for f in self.files]
        out["truncated"] = list(self.truncated)
        out["dropped"] = list(self.dropped)
        return {**out, **self.extra}


@dataclass(frozen=True, kw_only=True)
class ManifestSettings:
    """The manifest's ``settings``: the packing settings that shaped the files, typed and checked once when
    the manifest is read, so no reader parses them again. A key the manifest does not hold is ``None`` here
    and stays absent when written; ``extra`` holds every other key (``balance``, ``val_fraction``,
    ``megatron_exact``, the writer's options, ...) and a typed key recorded as ``null``, each as written.

    >>> s = ManifestSettings.from_dict({"seq_length": 8, "seed": 3, "text": {"format": "chat"}, "compat": None,
    ...     "balance": None})
    >>> s.seq_length, s.seed, s.output_format, s.compat, s.text, s.extra
    (8, 3, None, None, {'format': 'chat'}, {'compat': None, 'balance': None})
    >>> list(s.to_dict())
    ['balance', 'compat', 'seed', 'seq_length', 'text']
    """

    output_format: str | None = None
    seq_length: int | None = None
    pack_size: int | None = None
    pad_seq_to_mult: int | None = None
    algorithm: str | None = None
    seed: int | None = None
    overlength: str | None = None
    ids_dtype: str | None = None
    row_group_size: int | None = None
    keep_single_token: bool | None = None
    compat: str | None = None
    rows_per_shard: int | None = None
    #: How rows became tokens (``longpack.text``'s settings, with the detected formats).
    text: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    #: Each typed key with the JSON types its value may have.
    _KINDS: ClassVar[dict[str, tuple[type, ...]]] = {
        **dict.fromkeys(("output_format", "algorithm", "overlength", "ids_dtype", "compat"), (str,)),
        **dict.fromkeys(
            ("seq_length", "pack_size", "pad_seq_to_mult", "seed", "row_group_size", "rows_per_shard"), _COUNT
        ),
        "keep_single_token": (bool,),
        "text": (dict,),
    }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ManifestSettings:
        # a typed key recorded as null stays in ``extra``, so that the manifest writes the same bytes again
        known, extra = _known({k: v for k, v in data.items() if v is not None}, tuple(cls._KINDS))
        extra.update({k: v for k, v in data.items() if v is None})
        _expect(known, "settings: ", cls._KINDS)
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The keys in sorted order, as ``manifest.json`` holds them (a report prints them in that order)."""
        typed = {k: v for k in self._KINDS if (v := getattr(self, k)) is not None}
        return dict(sorted({**typed, **self.extra}.items()))


@dataclass(frozen=True, kw_only=True)
class PackManifest:
    """The whole ``manifest.json``; see the module docstring for an example."""

    format: str = MANIFEST_FORMAT
    versions: dict[str, Any] = field(default_factory=dict)
    #: Every packing setting (``pack_size``, ``pad_seq_to_mult``, ``seq_length``, ``algorithm``, ``seed``,
    #: ``overlength``, ``ids_dtype``, ...) plus ``text`` (how rows became tokens).
    settings: ManifestSettings = field(default_factory=ManifestSettings)
    inputs: tuple[dict[str, Any], ...] = ()
    tokenizer: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    malformed: tuple[dict[str, Any], ...] = ()
    splits: dict[str, SplitRecord] = field(default_factory=dict)
    metadata_file: dict[str, Any] = field(default_factory=dict)
    megatron_bridge: dict[str, Any] = field(default_factory=dict)
    #: What a reader must collate with: ``pack_size``, ``pad_seq_to_mult``, ``eos_id``.
    alignment: dict[str, Any] = field(default_factory=dict)
    #: The written ``bridge_config.yaml``: ``name``, ``sha256``, ``api``, ``options``.
    bridge_config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = (
        "format",
        "versions",
        "settings",
        "inputs",
        "tokenizer",
        "counts",
        "malformed",
        "splits",
        "metadata_file",
        "megatron_bridge",
        "alignment",
        "bridge_config",
    )

    # -- what readers need most ---------------------------------------------------------------------
    def _recorded(self, key: str, fallback: object) -> int | None:
        value = self.alignment.get(key, fallback)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def pack_size(self) -> int | None:
        return self._recorded("pack_size", self.settings.pack_size)

    @property
    def pad_seq_to_mult(self) -> int | None:
        return self._recorded("pad_seq_to_mult", self.settings.pad_seq_to_mult)

    @property
    def eos_id(self) -> int | None:
        return self._recorded("eos_id", self.tokenizer.get("eos_id"))

    @property
    def output_format(self) -> str:
        """``parquet``, ``npy`` or ``indexed`` (older manifests: ``parquet``)."""
        return self.settings.output_format or choices.DEFAULT_OUTPUT_FORMAT

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(self.splits)

    # -- (de)serialization --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PackManifest:
        if not isinstance(data, Mapping):
            raise PackedDataError(f"{MANIFEST_NAME} must hold a JSON object, got {type(data).__name__}")
        known, extra = _known(data, cls._KEYS)
        splits = known.get("splits", {})
        if not isinstance(splits, Mapping) or not all(isinstance(v, Mapping) for v in splits.values()):
            raise PackedDataError(f"{MANIFEST_NAME}: 'splits' must map split names to objects")
        _expect(
            known,
            "",
            {
                "format": (str,),
                **dict.fromkeys(
                    ("versions", "settings", "tokenizer", "counts", "metadata_file", "megatron_bridge"),
                    (dict,),
                ),
            },
        )
        known["splits"] = {str(name): SplitRecord.from_dict(str(name), rec) for name, rec in splits.items()}
        known["settings"] = ManifestSettings.from_dict(known.get("settings", {}))
        for key in ("inputs", "malformed"):
            known[key] = _records(known.get(key, []), key)
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self._KEYS}
        out["settings"] = self.settings.to_dict()
        out["inputs"] = list(self.inputs)
        out["malformed"] = list(self.malformed)
        out["splits"] = {name: rec.to_dict() for name, rec in self.splits.items()}
        return {**out, **self.extra}

    def to_json_bytes(self) -> bytes:
        """The bytes of ``manifest.json`` (what ``longpack pack`` writes)."""
        return (json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def read(cls, path: str | Path) -> PackManifest:
        """Read a ``manifest.json`` file (or the one in a folder); a clear :class:`PackedDataError` if it
        is missing, not UTF-8 JSON, or not shaped like a manifest."""
        p = Path(path)
        if p.is_dir():
            p = p / MANIFEST_NAME
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise PackedDataError(
                f"{p}: no {MANIFEST_NAME}: the output is unfinished (an interrupted or still-running "
                "`longpack pack`); pack it again"
            ) from exc
        except UnicodeDecodeError as exc:  # damaged bytes: what a verification finds (DamagedDataError)
            raise DamagedDataError(f"{p}: cannot read {MANIFEST_NAME} ({exc})") from exc
        except OSError as exc:
            raise PackedDataError(f"{p}: cannot read {MANIFEST_NAME} ({exc})") from exc
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise DamagedDataError(
                f"{p}: {MANIFEST_NAME} is not valid JSON ({exc}); pack the folder again"
            ) from exc
        try:
            return cls.from_dict(data)
        except DamagedDataError as exc:  # stays damaged data: a failed check of inspect --verify / verify
            raise DamagedDataError(f"{p}: {exc}") from exc
        except PackedDataError as exc:
            raise DamagedDataError(f"{p}: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise DamagedDataError(
                f"{p}: {MANIFEST_NAME} is not shaped like a longpack manifest ({exc})"
            ) from exc
