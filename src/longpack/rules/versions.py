"""Which Megatron-Bridge / Megatron-Core versions the rules are checked against.

Upstream changes its rules from release to release, so every rule carries the range of versions it
applies to (:class:`VersionRange`, recorded in :mod:`longpack.rules.provenance`) and a check runs for one
pair of versions (:class:`UpstreamVersions`): the ones the user names, else the installed packages',
else the one paired with the other product's, else the newest this catalog knows (``main``).

The catalog is the release tags of the two repositories (tag commit and date, read from their git
history), the ``main`` snapshots the newest rules were read from, and for each Megatron-Bridge release
the Megatron-Core release of its ``3rdparty/Megatron-LM`` submodule.

>>> VersionRange(since="0.4.0").contains("0.6.0"), VersionRange(since="0.4.0").contains("0.3.1")
(True, False)
>>> VersionRange(since="0.4.0", until="0.6.0").text
'>= 0.4.0, < 0.6.0'
>>> version_key("main", BRIDGE) > version_key("0.6.0", BRIDGE) > version_key("0.6.0rc1", BRIDGE)
True
>>> v = UpstreamVersions.resolve(bridge="0.5.1", mcore="0.18.0")
>>> v.bridge, v.mcore, v.bridge_origin
('0.5.1', '0.18.0', 'given')
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Literal

from longpack.errors import ConfigError

__all__ = [
    "BRIDGE",
    "ENV_VARS",
    "MCORE",
    "PRODUCTS",
    "Product",
    "Release",
    "UpstreamVersions",
    "VersionRange",
    "installed_version",
    "version_key",
]

Product = Literal["bridge", "mcore"]
BRIDGE: Product = "bridge"
MCORE: Product = "mcore"


@dataclass(frozen=True)
class Release:
    """A release (or the ``main`` snapshot) of one upstream project: tag commit and date; for a
    Megatron-Bridge release, ``mcore`` is the Megatron-Core release its ``3rdparty/Megatron-LM`` submodule
    commit belongs to (the first ``core_v*`` tag containing it)."""

    version: str
    commit: str
    date: str
    mcore: str | None = None


@dataclass(frozen=True)
class _ProductInfo:
    name: str
    repo: str
    distribution: str
    #: The version ``main`` carries in its package_info.py (unreleased).
    main_version: str
    releases: tuple[Release, ...]


PRODUCTS: dict[Product, _ProductInfo] = {
    BRIDGE: _ProductInfo(
        name="Megatron-Bridge",
        repo="NVIDIA-NeMo/Megatron-Bridge",
        distribution="megatron-bridge",
        main_version="0.7.0",
        releases=(
            Release("0.2.0", "7af9601c9", "2025-11-26"),
            Release("0.2.1", "1c43b3928", "2025-12-09"),
            Release("0.2.2", "046518960", "2026-01-09"),
            Release("0.3.0", "21b02e0cf", "2026-02-26"),
            Release("0.3.1", "9c9dd8489", "2026-03-20", mcore="0.16.1"),
            Release("0.4.0", "0fbfe7d3e", "2026-04-16", mcore="0.17.0"),
            Release("0.4.1", "f9b6319e5", "2026-05-06"),
            Release("0.4.2", "c81012934", "2026-05-28", mcore="0.17.1"),
            Release("0.5.0", "fcbb60311", "2026-06-16", mcore="0.18.0"),
            Release("0.5.1", "5cb3444c4", "2026-07-20", mcore="0.18.2"),
            Release("0.6.0", "51885cf13", "2026-08-19", mcore="0.19.0"),
            Release("main", "067f987df", "2026-08-22", mcore="main"),
        ),
    ),
    MCORE: _ProductInfo(
        name="Megatron-Core",
        repo="NVIDIA/Megatron-LM",
        distribution="megatron-core",
        main_version="0.20.0",
        releases=(
            Release("0.14.0", "23e00ed096", "2025-10-08"),
            Release("0.15.0", "0d7e02bd26", "2025-12-05"),
            Release("0.15.3", "309ffca6a4", "2026-02-06"),
            Release("0.16.0", "3bec9aa97d", "2026-02-26"),
            Release("0.16.1", "55ac708251", "2026-03-16"),
            Release("0.17.0", "9539a12e1b", "2026-04-14"),
            Release("0.17.1", "266f1c97dc", "2026-05-25"),
            Release("0.18.0", "ba7b5ebce1", "2026-06-22"),
            Release("0.18.2", "571370c829", "2026-07-20"),
            Release("0.19.0", "5be9626709", "2026-08-19"),
            Release("main", "d98e8a64dd", "2026-08-22"),
        ),
    ),
}

#: Environment variables that set the default versions (a container pinned to one release sets them once).
ENV_VARS: dict[Product, str] = {BRIDGE: "LONGPACK_BRIDGE_VERSION", MCORE: "LONGPACK_MEGATRON_CORE_VERSION"}

_VERSION = re.compile(
    r"^(?:core_)?v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(dev|a|b|rc|alpha|beta)\.?(\d*))?(?:\.post\d+)?(?:\+[\w.]+)?$"
)
_STAGE = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "rc": 3}
#: The config field (``CheckConfig``, ``PlanConfig``, ``SweepConfig``) that names each product's version.
_FIELDS: dict[Product, str] = {BRIDGE: "bridge_version", MCORE: "megatron_core_version"}
_MAIN_NAMES = ("main", "dev", "head", "latest")


@functools.lru_cache(maxsize=1024)
def version_key(text: str, product: Product) -> tuple[int, int, int, int, int]:
    """A sortable key for a version string: ``0.6.0``, ``v0.6.0``, ``core_v0.16.1``, ``0.6.0rc1``,
    ``0.20.0.dev0+abc``, or ``main`` (the unreleased version ``main`` carries, before its final release).

    >>> version_key("0.16.1", MCORE) < version_key("main", MCORE) < version_key("0.20.0", MCORE)
    True
    >>> version_key("26.04", BRIDGE)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: Megatron-Bridge version '26.04' is not a version such as 0.6.0 or main (releases this catalog knows: 0.2.0 ... 0.6.0, main)
    """
    info = PRODUCTS[product]
    raw = text.strip().lower()
    if raw in _MAIN_NAMES:
        major, minor, patch = (int(p) for p in info.main_version.split("."))
        return (major, minor, patch, _STAGE["dev"], 0)
    m = _VERSION.match(raw)
    if m is None or int(m.group(1)) > 1:  # container tags such as 26.04 are not package versions
        known = [r.version for r in info.releases]
        raise ConfigError(
            f"{info.name} version {text!r} is not a version such as {known[-2]} or main "
            f"(releases this catalog knows: {known[0]} ... {', '.join(known[-2:])})",
            fields=_FIELDS[product],
        )
    stage = 4 if m.group(4) is None else _STAGE[m.group(4)]
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), stage, int(m.group(5) or 0))


@dataclass(frozen=True)
class VersionRange:
    """``since <= version < until`` (either end open when ``None``); ``since="main"`` means only the
    unreleased ``main`` (the rule landed after the last release)."""

    since: str | None = None
    until: str | None = None

    def contains(self, version: str, product: Product = BRIDGE) -> bool:
        if self.since is None and self.until is None:
            return True
        key = version_key(version, product)
        if self.since is not None and key < version_key(self.since, product):
            return False
        return not (self.until is not None and key >= version_key(self.until, product))

    @property
    def everywhere(self) -> bool:
        return self.since is None and self.until is None

    @property
    def text(self) -> str:
        """``>= 0.4.0, < 0.6.0``; ``all`` when both ends are open."""
        parts = ([f">= {self.since}"] if self.since else []) + ([f"< {self.until}"] if self.until else [])
        return ", ".join(parts) or "all"


@functools.cache
def paired_version(version: str, product: Product) -> str | None:
    """The version of the *other* product that goes with ``version``: a Megatron-Bridge release's
    submodule Megatron-Core, or the newest Megatron-Bridge release built on a Megatron-Core at most
    ``version`` (``None`` when the catalog pairs nothing that old).

    >>> paired_version("0.5.1", BRIDGE), paired_version("0.5.2", BRIDGE), paired_version("0.18.2", MCORE)
    ('0.18.2', '0.18.2', '0.5.1')
    >>> paired_version("0.16.1", MCORE), paired_version("0.15.3", MCORE), paired_version("main", MCORE)
    ('0.3.1', None, 'main')
    """
    key = version_key(version, product)
    pairs = [(r.version, r.mcore) for r in PRODUCTS[BRIDGE].releases if r.mcore is not None]
    if product == BRIDGE:
        older = [m for b, m in pairs if version_key(b, BRIDGE) <= key]
        return older[-1] if older else None
    fitting = [b for b, m in pairs if version_key(m, MCORE) <= key]
    return fitting[-1] if fitting else None


@functools.cache
def installed_version(product: Product) -> str | None:
    """The installed distribution's version (package metadata only: nothing is imported; read once per
    process)."""
    from importlib import metadata

    try:
        return metadata.version(PRODUCTS[product].distribution)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True, kw_only=True)
class UpstreamVersions:
    """The Megatron-Bridge and Megatron-Core versions a check is for, and where each came from
    (``given``, ``installed`` or ``newest known``)."""

    bridge: str
    mcore: str
    bridge_origin: str = "given"
    mcore_origin: str = "given"

    @classmethod
    def resolve(cls, *, bridge: str | None = None, mcore: str | None = None) -> UpstreamVersions:
        """The versions given, else ``$LONGPACK_BRIDGE_VERSION`` / ``$LONGPACK_MEGATRON_CORE_VERSION``,
        else the installed packages', else the one paired with the other product's (a Megatron-Bridge
        release and the Megatron-Core of its submodule), else the newest the catalog knows (``main``).

        A version that does not parse is a :class:`~longpack.errors.ConfigError`.

        >>> v = UpstreamVersions.resolve(bridge="0.5.1", mcore="0.18.2")
        >>> (v.bridge, v.bridge_origin), (v.mcore, v.mcore_origin)
        (('0.5.1', 'given'), ('0.18.2', 'given'))
        """
        found: dict[Product, tuple[str, str]] = {}
        for product, given in ((BRIDGE, bridge), (MCORE, mcore)):
            if given is not None:
                if not isinstance(given, str):
                    raise ConfigError(
                        f"{PRODUCTS[product].name} version must be a string such as '0.6.0', got {given!r}",
                        fields=_FIELDS[product],
                    )
                version_key(given, product)
                found[product] = (given.strip(), "given")
                continue
            from_env = os.environ.get(ENV_VARS[product], "").strip()
            if from_env:
                version_key(from_env, product)
                found[product] = (from_env, f"${ENV_VARS[product]}")
                continue
            installed = installed_version(product)
            if installed is not None:
                found[product] = (installed, "installed")
        known = dict(found)  # pair only with a version the user or the environment gave
        for product, other in ((BRIDGE, MCORE), (MCORE, BRIDGE)):
            if product in found:
                continue
            paired = paired_version(known[other][0], other) if other in known else None
            if paired is not None:
                found[product] = (paired, f"paired with {PRODUCTS[other].name} {found[other][0]}")
            else:
                found[product] = ("main", "newest known")
        return cls(
            bridge=found[BRIDGE][0],
            mcore=found[MCORE][0],
            bridge_origin=found[BRIDGE][1],
            mcore_origin=found[MCORE][1],
        )

    def of(self, product: Product) -> str:
        return self.bridge if product == BRIDGE else self.mcore

    def describe(self, product: Product) -> str:
        """``Megatron-Bridge main (067f987df, 2026-08-22; newest known)``."""
        info = PRODUCTS[product]
        version = self.of(product)
        origin = self.bridge_origin if product == BRIDGE else self.mcore_origin
        detail = [origin]
        for r in info.releases:
            if r.version == version.strip().lower().removeprefix("v"):
                detail.insert(0, f"{r.commit}, {r.date}")
        return f"{info.name} {version} ({'; '.join(detail)})"

    def to_dict(self) -> dict[str, str]:
        return {
            "megatron_bridge": self.bridge,
            "megatron_bridge_from": self.bridge_origin,
            "megatron_core": self.mcore,
            "megatron_core_from": self.mcore_origin,
        }
