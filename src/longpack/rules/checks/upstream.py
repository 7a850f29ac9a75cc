"""Settings the Megatron-Bridge / Megatron-Core version checked for does not have.

A key that the config sets but the version does not know is not ignored upstream: Bridge's structured
configs and Megatron-Core's dataclasses refuse unknown fields. :data:`KEYS_BY_VERSION` says, for the keys
the packing rules read, the first (``since``) or last-but-one (``until``) version that has them; the
commits are in :mod:`longpack.rules.provenance` (rule ``LP-VER-001``).

>>> [k.key for k in KEYS_BY_VERSION if k.product == "mcore"][:2]
['model.hybrid_context_parallel', 'model.max_seqlen_per_dp_cp_rank']
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from longpack.rules.checks.common import E, V
from longpack.rules.config import DatasetKind, TrainingSetup
from longpack.rules.registry import RuleFamily, Violation
from longpack.rules.scheduling_keys import GPT_SFT_IN_BATCH_SINCE, SCHEDULING_KEYS
from longpack.rules.versions import (
    BRIDGE,
    PRODUCTS,
    KeyEvidence,
    Product,
    UpstreamVersions,
    VersionRange,
    key_evidence,
)

FAMILY = RuleFamily("upstream", "Settings of the Megatron version checked for")


@dataclass(frozen=True)
class VersionedKey:
    """A config key (or section) and the versions of one product that have it."""

    key: str
    product: Product
    has: VersionRange
    why: str


#: The keys of dynamic CP, the packing schedulers and global-batch packing come from
#: :mod:`longpack.rules.scheduling_keys` (defined once there).
KEYS_BY_VERSION: tuple[VersionedKey, ...] = (
    *(VersionedKey(k.key, k.product, k.has, k.why) for k in SCHEDULING_KEYS),
    VersionedKey(
        "model.moe_hybridep_pad_uneven_dispatch_inputs",
        "mcore",
        VersionRange(since="0.19.0", dev=False),
        "HybridEP THD dispatch (#5008)",
    ),
    VersionedKey(
        "dist.eval_context_parallel_size", "bridge", VersionRange(since="0.5.0"), "eval-time CP (#3755)"
    ),
    VersionedKey(
        "dataset.enable_offline_packing",
        "bridge",
        VersionRange(since="0.6.0"),
        "packing config refactor (#4685)",
    ),
    VersionedKey(
        "dataset.offline_packing_specs",
        "bridge",
        VersionRange(since="0.6.0"),
        "packing config refactor (#4685)",
    ),
    VersionedKey(
        "dataset.enable_in_batch_packing",
        "bridge",
        VersionRange(since="0.6.0"),
        "in-batch packing rename (#4307)",
    ),
    VersionedKey(
        "dataset.packed_sequence_specs",
        "bridge",
        VersionRange(until="0.6.0"),
        "renamed offline_packing_specs (#4685)",
    ),
)


def versions_for(
    config_keys: Collection[str] = (),
    *,
    bridge: str | None = None,
    mcore: str | None = None,
    environment: bool = True,
    setup: TrainingSetup | None = None,
) -> UpstreamVersions:
    """:meth:`UpstreamVersions.resolve` with the keys a config sets as evidence (what ``longpack check``
    runs for). ``setup`` adds what a key means on its dataset: ``enable_in_batch_packing`` on a GPT-SFT
    dataset exists only from GPT-SFT in-batch packing on (Bridge PR #5493), on the direct-HF and VLM ones
    from 0.6.0.

    >>> v = versions_for({"dataset.packed_sequence_specs.packed_sequence_size"}, mcore="0.18.2", environment=False)
    >>> v.bridge, v.bridge_origin
    ('0.5.1', "inferred from the config's keys dataset.packed_sequence_specs (< 0.6.0): < 0.6.0, the newest known in that range")
    """
    evidence = key_evidence(config_keys, KEYS_BY_VERSION)
    if setup is not None and setup.dataset.kind is DatasetKind.SFT and setup.dataset.enable_in_batch_packing:
        gpt_sft = (
            K_IBP_GPT_SFT,
            VersionRange(since=GPT_SFT_IN_BATCH_SINCE),
            "GPT-SFT in-batch packing (PR #5493)",
        )
        evidence[BRIDGE] = KeyEvidence(BRIDGE, (*evidence[BRIDGE].keys, gpt_sft))
    return UpstreamVersions.resolve(bridge=bridge, mcore=mcore, evidence=evidence, environment=environment)


#: How the GPT-SFT in-batch packing evidence is named where the version's origin is printed.
K_IBP_GPT_SFT = "dataset.enable_in_batch_packing on a GPT-SFT dataset"


def _set(s: TrainingSetup, key: str) -> bool:
    return any(k == key or k.startswith(key + ".") for k in s.given_keys)


@FAMILY.rule(
    "LP-VER-001",
    E,
    "every key set exists in the Megatron-Bridge / Megatron-Core version checked for",
    "Megatron-Bridge and Megatron-Core release history",
    fix="drop the key, use the spelling of your version, or upgrade (--bridge-version / --megatron-core-version)",
)
def keys_exist(s: TrainingSetup) -> Iterator[Violation]:
    """Keys that only some versions have: set in another version, the config is refused at start-up."""
    if s.versions is None:
        return
    for vk in KEYS_BY_VERSION:
        version = s.versions.of(vk.product)
        if _set(s, vk.key) and not vk.has.contains(version, vk.product):
            name = PRODUCTS[vk.product].name
            yield V(
                f"{vk.key} is set, but {name} {version} ({s.versions.origin(vk.product)}) has no such setting "
                f"({vk.why}: {name} {vk.has.text})",
                f"drop {vk.key}, or run {name} {vk.has.text} (then pass that version to longpack check)",
                vk.key,
            )


def _distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance of ``a`` and ``b``, or ``limit + 1`` once it exceeds ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        if min(cur) > limit:
            return limit + 1
        prev = cur
    return prev[-1]


def known_keys() -> frozenset[str]:
    """Every key some version has, as far as longpack knows: the keys its rules read and
    :data:`KEYS_BY_VERSION`'s."""
    from longpack.rules.config import DECLARED

    return DECLARED.keys | {vk.key for vk in KEYS_BY_VERSION}


def nearest_known_key(key: str) -> str | None:
    """The known key one or two edits away from ``key`` in the same section (a misspelling), else ``None``.

    >>> nearest_known_key("model.dynamic_context_paralel"), nearest_known_key("model.hidden_size")
    ('model.dynamic_context_parallel', None)
    """
    from longpack.rules.config import DECLARED

    known = known_keys()
    if key in known or any(key.startswith(k + ".") for k in DECLARED.leaves):
        return None
    section, _, leaf = key.rpartition(".")
    if len(leaf) < 8:
        return None
    best: tuple[int, str] | None = None
    for k in known:
        ksec, _, kleaf = k.rpartition(".")
        if ksec != section:
            continue
        d = _distance(leaf, kleaf, 2)
        if 0 < d <= 2 and (best is None or (d, k) < best):
            best = (d, k)
    return None if best is None else best[1]


@FAMILY.rule(
    "LP-VER-002",
    E,
    "every key set is one that some Megatron-Bridge / Megatron-Core version has",
    "Megatron-Bridge ConfigContainer and Megatron-Core dataclasses (unknown fields are refused)",
    fix="use the spelling the nearest known key has",
)
def keys_known(s: TrainingSetup) -> Iterator[Violation]:
    """A key one or two letters away from one longpack knows, and known itself to no version, is a
    misspelling: Bridge refuses the unknown field at start-up (and a dropped ``+`` override would set
    nothing)."""
    versions = s.versions
    for key in sorted(s.given_keys):
        near = nearest_known_key(key)
        if near is None:
            continue
        where = (
            ""
            if versions is None
            else f" (checked for Megatron-Bridge {versions.bridge}, Megatron-Core {versions.mcore})"
        )
        yield V(
            f"{key} is a key no known Megatron-Bridge / Megatron-Core version has{where}; the nearest known "
            f"key is {near}",
            f"rename {key} to {near}",
            key,
        )
