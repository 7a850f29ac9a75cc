"""Weighted mixing of several data sources, seeded, by up- and down-sampling whole epochs.

A mix names sources (files, folders, globs or hub ids each) with weights: ``a.jsonl=0.7 b/=0.3`` on the
command line, or a YAML file::

    seed: 0            # optional (default: the pack's seed)
    samples: 100000    # optional: samples in the mix (default: all the sources' samples together)
    sources:
      - path: a.jsonl
        weight: 0.7
      - path: [b/, c/*.parquet]   # several inputs form one source
        weight: 0.3
        name: code                # optional label in the report

Weights are shares of the mix: source ``i`` gets ``n_i = samples * w_i / sum(w)`` samples (rounded so they
add up exactly). A source with ``m_i`` samples contributes ``n_i // m_i`` full copies of itself (up-sampling
by epochs) plus ``n_i % m_i`` samples drawn without replacement with ``np.random.default_rng(seed)``
(down-sampling), in input order. The report per source says how many of its samples were used, left out
or repeated, so every row read is accounted for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from longpack.errors import ConfigError

MIX_FILE_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, kw_only=True)
class MixSource:
    """One source of a mix: its inputs (files, folders, globs, hub ids), its weight and a report label."""

    inputs: tuple[str, ...]
    weight: float
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.inputs, str):
            object.__setattr__(self, "inputs", (self.inputs,))
        object.__setattr__(self, "inputs", tuple(str(p) for p in self.inputs))
        if not self.inputs:
            raise ConfigError("a mix source needs at least one input", fields="mix")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ConfigError(
                f"mix weight of {', '.join(self.inputs)} must be a number > 0, got {w!r}; drop the source "
                "instead of giving it weight 0",
                fields="mix",
            )
        if not self.name:
            object.__setattr__(self, "name", ",".join(self.inputs))


@dataclass(frozen=True, kw_only=True)
class Mix:
    """Sources with weights, and optionally the mix size and seed (``None``: the defaults)."""

    sources: tuple[MixSource, ...]
    samples: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.sources:
            raise ConfigError("a mix needs at least one source", fields="mix")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"mix source names must differ, got {names}", fields="mix")
        if self.samples is not None and (
            isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1
        ):
            raise ConfigError(f"mix samples must be a positive integer, got {self.samples!r}", fields="mix")

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(p for s in self.sources for p in s.inputs)


def parse_mix(specs: Sequence[str] | str | Mix | Sequence[MixSource]) -> Mix:
    """A :class:`Mix` from ``PATH=WEIGHT`` strings, one YAML file, or sources.

    >>> m = parse_mix(["a.jsonl=0.7", "b/=0.3"])
    >>> [(s.inputs, s.weight) for s in m.sources]
    [(('a.jsonl',), 0.7), (('b/',), 0.3)]
    >>> parse_mix(["a.jsonl=0"])
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: mix weight of a.jsonl must be a number > 0, got 0.0; drop the source instead of giving it weight 0
    """
    if isinstance(specs, Mix):
        return specs
    if isinstance(specs, str | Path):
        specs = [str(specs)]
    items = list(specs)
    if items and all(isinstance(s, MixSource) for s in items):
        return Mix(sources=tuple(items))  # type: ignore[arg-type]
    if (
        len(items) == 1
        and isinstance(items[0], str | Path)
        and str(items[0]).lower().endswith(MIX_FILE_SUFFIXES)
    ):
        return load_mix_file(Path(items[0]))
    sources = []
    for spec in items:
        if not isinstance(spec, str):
            raise ConfigError(f"mix entries must be 'PATH=WEIGHT' strings, got {spec!r}", fields="mix")
        path, sep, weight = spec.rpartition("=")
        if not sep or not path:
            raise ConfigError(
                f"mix entry {spec!r} needs a weight: write PATH=WEIGHT (e.g. data/chat.jsonl=0.7), or give "
                "one YAML file",
                fields="mix",
            )
        try:
            value = float(weight)
        except ValueError:
            raise ConfigError(
                f"mix entry {spec!r}: weight {weight!r} is not a number", fields="mix"
            ) from None
        sources.append(MixSource(inputs=(path,), weight=value))
    return Mix(sources=tuple(sources))


def load_mix_file(path: Path) -> Mix:
    """A mix from a YAML file (see the module docstring); errors name the file and the entry."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"mix file {path}: cannot read ({e.strerror or e})", fields="mix") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"mix file {path}: not valid YAML ({e})", fields="mix") from e
    if not isinstance(doc, Mapping) or not isinstance(doc.get("sources"), list):
        raise ConfigError(
            f"mix file {path}: needs a 'sources' list of {{path, weight}} entries", fields="mix"
        )
    unknown = sorted(set(doc) - {"sources", "samples", "seed"})
    if unknown:
        raise ConfigError(
            f"mix file {path}: unknown keys {unknown}; use sources, samples, seed", fields="mix"
        )
    sources = []
    base = path.parent
    for k, entry in enumerate(doc["sources"]):
        if not isinstance(entry, Mapping) or "path" not in entry or "weight" not in entry:
            raise ConfigError(f"mix file {path}: sources[{k}] needs 'path' and 'weight'", fields="mix")
        extra = sorted(set(entry) - {"path", "weight", "name"})
        if extra:
            raise ConfigError(f"mix file {path}: sources[{k}] has unknown keys {extra}", fields="mix")
        paths = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
        # Relative paths are relative to the mix file (hub ids stay as they are).
        resolved = [
            str(p)
            if str(p).startswith("hf:") or Path(str(p)).expanduser().is_absolute()
            else str(base / str(p))
            for p in paths
        ]
        try:
            sources.append(
                MixSource(inputs=tuple(resolved), weight=entry["weight"], name=str(entry.get("name") or ""))
            )
        except ConfigError as e:
            raise ConfigError(f"mix file {path}: sources[{k}]: {e}", fields="mix") from e
    return Mix(sources=tuple(sources), samples=doc.get("samples"), seed=doc.get("seed"))


def mix_counts(weights: Sequence[float], total: int) -> np.ndarray:
    """Samples per source: ``total`` split by weight, rounded by largest remainder (ties: earlier source).

    >>> mix_counts([0.7, 0.3], 10).tolist(), mix_counts([1, 1, 1], 10).tolist()
    ([7, 3], [4, 3, 3])
    """
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:short]] += 1
    return counts


def draw(available: int, wanted: int, rng: np.random.Generator) -> np.ndarray:
    """``wanted`` positions out of ``available``: full epochs in order, then a seeded draw without
    replacement (sorted), so a sample repeats at most once more than any other.

    >>> draw(3, 7, np.random.default_rng(0)).tolist()
    [0, 1, 2, 0, 1, 2, 2]
    """
    if available == 0:
        return np.zeros(0, dtype=np.int64)
    epochs, rest = divmod(wanted, available)
    parts = [np.tile(np.arange(available, dtype=np.int64), epochs)]
    if rest:
        parts.append(np.sort(rng.choice(available, size=rest, replace=False)).astype(np.int64))
    return np.concatenate(parts)


def mix_samples(
    source_of_sample: np.ndarray, mix: Mix, *, seed: int
) -> tuple[np.ndarray, list[dict[str, Any]], int, int]:
    """Indices of the mixed samples (into the tokenized samples) and one report per source.

    ``source_of_sample``: the source index of every tokenized sample. Returns ``(indices, reports, total,
    seed)``; a report holds ``samples`` (tokenized), ``drawn`` (in the mix, repeats included), ``unused``,
    ``repeated``, ``weight``, ``share``, ``epochs``.
    """
    n_sources = len(mix.sources)
    available = np.bincount(source_of_sample, minlength=n_sources)
    for s, m in zip(mix.sources, available.tolist(), strict=True):
        if m == 0:
            raise ConfigError(
                f"mix source {s.name!r} gave no samples (every row malformed or no rows); fix or drop it",
                fields="mix",
            )
    total = int(mix.samples if mix.samples is not None else available.sum())
    use_seed = int(mix.seed if mix.seed is not None else seed)
    counts = mix_counts([s.weight for s in mix.sources], total)
    rng = np.random.default_rng(use_seed)
    picked = []
    reports = []
    wsum = sum(s.weight for s in mix.sources)
    for k, source in enumerate(mix.sources):
        members = np.flatnonzero(source_of_sample == k)
        pos = draw(len(members), int(counts[k]), rng)
        picked.append(members[pos])
        distinct = len(np.unique(pos))
        reports.append(
            {
                "name": source.name,
                "inputs": list(source.inputs),
                "weight": source.weight,
                "share": source.weight / wsum,
                "samples": len(members),
                "drawn": int(counts[k]),
                "epochs": round(int(counts[k]) / len(members), 6),
                "unused": int(len(members) - distinct),
                "repeated": int(counts[k] - distinct),
            }
        )
    return np.concatenate(picked), reports, total, use_seed
