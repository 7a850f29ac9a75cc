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
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from longpack.errors import ConfigError

__all__ = [
    "BRIDGE",
    "ENV_VARS",
    "MCORE",
    "PRODUCTS",
    "KeyEvidence",
    "Product",
    "Release",
    "UpstreamVersions",
    "VersionRange",
    "installed_version",
    "key_evidence",
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
    #: A development branch beside ``main`` that the catalog read (Megatron-Core ``dev``, which Bridge's
    #: ``scripts/switch_mcore.sh dev`` selects); it orders after ``main``, whose changes it merges.
    dev: Release | None = None


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
        dev=Release("dev", "d48bd6be0a", "2026-08-21"),
    ),
}

#: Environment variables that set the default versions (a container pinned to one release sets them once).
ENV_VARS: dict[Product, str] = {BRIDGE: "LONGPACK_BRIDGE_VERSION", MCORE: "LONGPACK_MEGATRON_CORE_VERSION"}

_VERSION = re.compile(
    r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(dev|a|b|rc|alpha|beta)\.?(\d*))?(?:\.post\d+)?(?:\+[\w.]+)?$"
)
_STAGE = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "rc": 3}
#: The config field (``CheckConfig``, ``PlanConfig``, ``SweepConfig``) that names each product's version.
_FIELDS: dict[Product, str] = {BRIDGE: "bridge_version", MCORE: "megatron_core_version"}
_MAIN_NAMES = ("main", "head", "latest")
#: A git tag prefix where a version belongs (Megatron-LM tags its releases ``core_v0.19.0``).
_TAG_PREFIX = re.compile(r"^(core_r?|r)v?(?=\d)")


@functools.lru_cache(maxsize=1024)
def version_key(text: str, product: Product) -> tuple[int, int, int, int, int]:
    """A sortable key for a version string: ``0.6.0``, ``v0.6.0``, ``0.6.0rc1``, ``0.20.0.dev0+abc``,
    ``main`` (the unreleased version ``main`` carries, before its final release) or, for Megatron-Core,
    ``dev`` (its development branch: after ``main``). A git tag such as ``core_v0.19.0`` is refused with
    the version to give instead.

    >>> version_key("0.16.1", MCORE) < version_key("main", MCORE) < version_key("dev", MCORE) < version_key("0.20.0", MCORE)
    True
    >>> version_key("core_v0.19.0", MCORE)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: Megatron-Core version 'core_v0.19.0' is a git tag, not a version: give 0.19.0
    >>> version_key("26.04", BRIDGE)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: Megatron-Bridge version '26.04' is not a version such as 0.6.0 or main (releases this catalog knows: 0.2.0 ... 0.6.0, main)
    """
    info = PRODUCTS[product]
    raw = text.strip().lower()
    if raw in _MAIN_NAMES or (raw == "dev" and info.dev is None):
        major, minor, patch = (int(p) for p in info.main_version.split("."))
        return (major, minor, patch, _STAGE["dev"], 0)
    if raw == "dev":
        major, minor, patch = (int(p) for p in info.main_version.split("."))
        return (major, minor, patch, _STAGE["dev"], 1)
    tag = _TAG_PREFIX.match(raw)
    if tag is not None:
        raise ConfigError(
            f"{info.name} version {text!r} is a git tag, not a version: give {raw[tag.end() :]}",
            fields=_FIELDS[product],
        )
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
    #: Whether Megatron-Core ``dev`` is inside, where it differs from its place after ``main``: ``dev``
    #: is a branch, and some ``main`` changes are not on it (``None``: by its order).
    dev: bool | None = None

    def contains(self, version: str, product: Product = BRIDGE) -> bool:
        if self.dev is not None and product == MCORE and version.strip().lower() == "dev":
            return self.dev
        if self.since is None and self.until is None:
            return True
        key = version_key(version, product)
        if self.since is not None and key < version_key(self.since, product):
            return False
        return not (self.until is not None and key >= version_key(self.until, product))

    @property
    def everywhere(self) -> bool:
        return self.since is None and self.until is None and self.dev is None

    @property
    def text(self) -> str:
        """``>= 0.4.0, < 0.6.0``; ``all`` when both ends are open; ``(not dev)`` / ``(and dev)`` where
        Megatron-Core dev is an exception to the order."""
        parts = ([f">= {self.since}"] if self.since else []) + ([f"< {self.until}"] if self.until else [])
        text = ", ".join(parts) or "all"
        if self.dev is not None:
            text += " (and dev)" if self.dev else " (not dev)"
        return text


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


def known_versions(product: Product) -> tuple[str, ...]:
    """Every version the catalog knows for ``product``, oldest first (releases, ``main``, ``dev``)."""
    info = PRODUCTS[product]
    return tuple(r.version for r in info.releases) + (("dev",) if info.dev else ())


@dataclass(frozen=True)
class KeyEvidence:
    """What the config's own keys say about one product's version: the keys that only some versions have
    (``(key, range, why)``) and the range they leave (``since`` the latest start, ``until`` the earliest
    end; ``conflict`` when no version has them all)."""

    product: Product
    keys: tuple[tuple[str, VersionRange, str], ...] = ()

    @property
    def range(self) -> VersionRange:
        sinces = [r.since for _, r, _ in self.keys if r.since is not None]
        untils = [r.until for _, r, _ in self.keys if r.until is not None]
        since = max(sinces, key=lambda v: version_key(v, self.product)) if sinces else None
        until = min(untils, key=lambda v: version_key(v, self.product)) if untils else None
        return VersionRange(since=since, until=until)

    @property
    def conflict(self) -> bool:
        r = self.range
        return (
            r.since is not None
            and r.until is not None
            and version_key(r.since, self.product) >= version_key(r.until, self.product)
        )

    def pick(self) -> tuple[str, str]:
        """``(version, origin)``: the newest known version in the range (or the range's start when it
        begins after every version known), and a sentence that says which keys bound it."""
        named = ", ".join(f"{k} ({r.text})" for k, r, _ in self.keys[:3])
        more = f" and {len(self.keys) - 3} more" if len(self.keys) > 3 else ""
        if self.conflict:
            return ("main", f"newest known; the config's keys {named}{more} fit no single version")
        r = self.range
        inside = [v for v in known_versions(self.product) if r.contains(v, self.product)]
        if inside:
            version = inside[-1]
            how = "the newest known in that range"
        else:
            version = r.since or "main"
            how = "newer than every version known, its first"
        return (version, f"inferred from the config's keys {named}{more}: {r.text}, {how}")


class _VersionedKey(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def product(self) -> Product: ...
    @property
    def has(self) -> VersionRange: ...
    @property
    def why(self) -> str: ...


def key_evidence(config_keys: Collection[str], table: Iterable[_VersionedKey]) -> dict[Product, KeyEvidence]:
    """The version bounds of the keys in ``config_keys`` that only some versions have, by ``table``
    (:data:`longpack.rules.checks.upstream.KEYS_BY_VERSION`, whose ``versions_for`` calls this).

    >>> from longpack.rules.checks.upstream import KEYS_BY_VERSION
    >>> ev = key_evidence({"dataset.enable_offline_packing", "model.seq_length"}, KEYS_BY_VERSION)
    >>> ev[BRIDGE].range.text, ev[MCORE].keys
    ('>= 0.6.0', ())
    """
    given = set(config_keys)
    hits: dict[Product, list[tuple[str, VersionRange, str]]] = {BRIDGE: [], MCORE: []}
    for vk in table:
        if vk.key in given or any(k.startswith(vk.key + ".") for k in given):
            hits[vk.product].append((vk.key, vk.has, vk.why))
    return {p: KeyEvidence(p, tuple(h)) for p, h in hits.items()}


@dataclass(frozen=True, kw_only=True)
class UpstreamVersions:
    """The Megatron-Bridge and Megatron-Core versions a check is for, and where each came from
    (``given``, ``installed`` or ``newest known``)."""

    bridge: str
    mcore: str
    bridge_origin: str = "given"
    mcore_origin: str = "given"

    @classmethod
    def resolve(
        cls,
        *,
        bridge: str | None = None,
        mcore: str | None = None,
        evidence: Mapping[Product, KeyEvidence] | None = None,
        environment: bool = True,
    ) -> UpstreamVersions:
        """The versions from the evidence, strongest first.

        Megatron-Bridge: the version given, else ``$LONGPACK_BRIDGE_VERSION``, else an installed
        megatron-bridge, else the range the config's own keys bound (``evidence``, from :func:`key_evidence`:
        a key that exists only from version X on, or was removed in Y; the newest known release in the
        range), else the
        newest the catalog knows (``main``). It is never inferred from Megatron-Core alone: the checking
        environment (a laptop, a login node, longpack's own venv with ``megatron-core`` from its extras)
        is rarely the training container.

        Megatron-Core: given, else ``$LONGPACK_MEGATRON_CORE_VERSION``, else an installed megatron-core
        when megatron-bridge is installed beside it (a Bridge environment), else the one paired with the
        Megatron-Bridge version (its ``3rdparty/Megatron-LM`` submodule), moved into the range the
        config's Megatron-Core keys bound where it falls outside, else ``main``.

        ``environment=False`` leaves the environment variables and the installed packages out (a config
        judged by its own keys alone: the recipe checks). A version that does not parse is a
        :class:`~longpack.errors.ConfigError`.

        >>> v = UpstreamVersions.resolve(bridge="0.5.1", mcore="0.18.2")
        >>> (v.bridge, v.bridge_origin), (v.mcore, v.mcore_origin)
        (('0.5.1', 'given'), ('0.18.2', 'given'))
        >>> v = UpstreamVersions.resolve(bridge="0.6.0", environment=False)
        >>> (v.mcore, v.mcore_origin)
        ('0.19.0', 'paired with Megatron-Bridge 0.6.0')
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
            from_env = os.environ.get(ENV_VARS[product], "").strip() if environment else ""
            if from_env:
                version_key(from_env, product)
                found[product] = (from_env, f"${ENV_VARS[product]}")
        bridge_installed = installed_version(BRIDGE) if environment else None
        if BRIDGE not in found and bridge_installed is not None:
            found[BRIDGE] = (bridge_installed, "installed")
        if MCORE not in found and bridge_installed is not None:
            # megatron-core beside megatron-bridge is the Core that Bridge runs on; alone it proves nothing
            mcore_installed = installed_version(MCORE)
            if mcore_installed is not None:
                found[MCORE] = (mcore_installed, "installed, beside megatron-bridge")
        evidence = evidence or {BRIDGE: KeyEvidence(BRIDGE), MCORE: KeyEvidence(MCORE)}
        if BRIDGE not in found:
            found[BRIDGE] = evidence[BRIDGE].pick() if evidence[BRIDGE].keys else ("main", "newest known")
        if MCORE not in found:
            paired = paired_version(found[BRIDGE][0], BRIDGE)
            ev = evidence[MCORE]
            if paired is not None and (not ev.keys or ev.range.contains(paired, MCORE)):
                found[MCORE] = (paired, f"paired with {PRODUCTS[BRIDGE].name} {found[BRIDGE][0]}")
            elif ev.keys:
                found[MCORE] = ev.pick()
            else:
                found[MCORE] = ("main", "newest known")
        return cls(
            bridge=found[BRIDGE][0],
            mcore=found[MCORE][0],
            bridge_origin=found[BRIDGE][1],
            mcore_origin=found[MCORE][1],
        )

    def of(self, product: Product) -> str:
        return self.bridge if product == BRIDGE else self.mcore

    def origin(self, product: Product) -> str:
        """Where the version came from, short (``given``, ``installed``, ``inferred from the config's
        keys``, ``paired with Megatron-Bridge 0.6.0``, ``newest known``); :meth:`describe` says it whole.

        >>> UpstreamVersions(bridge="main", mcore="main", bridge_origin="inferred from the config's keys a (>= 0.6.0): >= 0.6.0, x").origin(BRIDGE)
        "inferred from the config's keys (>= 0.6.0)"
        """
        text = self.bridge_origin if product == BRIDGE else self.mcore_origin
        if text.startswith("inferred from the config's keys") and ": " in text:
            bound = text.split(": ", 1)[1].split(", ")
            return f"inferred from the config's keys ({', '.join(b for b in bound if b[:1] in '<>')})"
        return text

    def describe(self, product: Product) -> str:
        """``Megatron-Bridge main (067f987df, 2026-08-22; newest known)``."""
        info = PRODUCTS[product]
        version = self.of(product)
        origin = self.bridge_origin if product == BRIDGE else self.mcore_origin
        detail = [origin]
        for r in (*info.releases, *((info.dev,) if info.dev else ())):
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
