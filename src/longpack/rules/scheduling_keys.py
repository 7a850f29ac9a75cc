"""The config keys of dynamic context parallelism, the sequence-packing schedulers and global-batch
packing: names, aliases and the versions that have them, defined once.

Upstream sources (read for this table):

- Megatron-LM ``dev`` @ ``d48bd6be0a`` ``megatron/core/model_parallel_config.py``: ``dynamic_context_parallel``
  (added by ``cde56a4692``, #3405, which renamed hybrid CP to dynamic CP), ``min_dynamic_context_parallel_size``
  (``2d6e946bab``, #2000, must be ``>= 1``), ``hybrid_context_parallel`` kept as a deprecated alias (setting it
  sets ``dynamic_context_parallel``; setting both is a ``ValueError``), ``sequence_packing_scheduler`` in
  ``('dp_balanced', 'default_dynamic_cp')`` (dynamic CP needs ``default_dynamic_cp`` and defaults to it),
  ``pad_packed_seq_alignment`` and ``thd_max_packed_sequences`` (``7f9175207d``, #4359: ``'max'`` or a
  positive integer at most ``max_seqlen_per_dp_cp_rank``, which must then be set; THD CUDA graphs need
  both, ``3ae5e6d9a6``, #5724).
- Megatron-LM ``main`` @ ``d98e8a64dd``: ``hybrid_context_parallel`` and ``max_seqlen_per_dp_cp_rank``
  (since 0.16.0, ``98d8c56dbd``, #2282) and ``sequence_packing_scheduler`` with ``dp_balanced`` only
  (``a9381be598``, #6684; no release has it yet); none of the dynamic-CP keys.
- Megatron-Bridge PR #6127 (open on 2026-09-16, not in ``main`` @ ``067f987df``):
  ``dataset.enable_global_batch_packing`` drives ``model.sequence_packing_scheduler``
  (``default_dynamic_cp`` with ``model.dynamic_context_parallel``, else ``dp_balanced``) and refuses the model
  field without the dataset switch. longpack assumes it lands in the release after ``main`` (0.7.0).

``dev`` is Megatron-Core's development branch (Bridge's ``scripts/switch_mcore.sh dev``): it orders after
``main`` (it merges ``main`` regularly), so a key ``since="dev"`` is in no release and not in ``main``.

>>> DCP_ALIASES[K_HCP]
'model.dynamic_context_parallel'
>>> [name for name, _ in PACKING_SCHEDULERS]
['dp_balanced', 'default_dynamic_cp']
>>> scheduler_range("default_dynamic_cp").text
'>= dev'
"""

from __future__ import annotations

from dataclasses import dataclass

from longpack.rules.versions import BRIDGE, MCORE, PRODUCTS, Product, VersionRange

__all__ = [
    "DCP_ALIASES",
    "GLOBAL_BATCH_PACKING_SINCE",
    "GPT_SFT_IN_BATCH_SINCE",
    "K_CAP",
    "K_CP_PARTITION",
    "K_DCP",
    "K_GBP",
    "K_HCP",
    "K_IDM",
    "K_MIN_DCP",
    "K_PAD_ALIGN",
    "K_SCHED",
    "K_THD_MAX",
    "PACKING_SCHEDULERS",
    "SCHEDULING_KEYS",
    "SchedulingKey",
    "dynamic_cp_keys",
    "scheduler_range",
]

K_DCP = "model.dynamic_context_parallel"
K_HCP = "model.hybrid_context_parallel"
K_MIN_DCP = "model.min_dynamic_context_parallel_size"
K_CAP = "model.max_seqlen_per_dp_cp_rank"
K_SCHED = "model.sequence_packing_scheduler"
K_PAD_ALIGN = "model.pad_packed_seq_alignment"
K_CP_PARTITION = "model.cp_partition_mode"
K_THD_MAX = "model.thd_max_packed_sequences"
K_GBP = "dataset.enable_global_batch_packing"
K_IDM = "dataset.inter_document_masking"

#: The first Megatron-Bridge version assumed to have global-batch packing (PR #6127 is open; ``main``
#: @ 067f987df lacks it): the release after ``main``.
GLOBAL_BATCH_PACKING_SINCE = PRODUCTS[BRIDGE].main_version

#: The first Megatron-Bridge version assumed to have GPT-SFT in-batch packing (PR #5493, its branch at
#: 84275f53b adds ``enable_in_batch_packing`` to ``GPTSFTDatasetConfig``; ``main`` @ 067f987df has it only on
#: the direct-HF and VLM datasets): the release after ``main``.
GPT_SFT_IN_BATCH_SINCE = PRODUCTS[BRIDGE].main_version

#: Old spelling -> new spelling (Megatron-Core dev: ``hybrid_context_parallel`` is a deprecated alias).
DCP_ALIASES: dict[str, str] = {K_HCP: K_DCP}

#: ``sequence_packing_scheduler`` values and the Megatron-Core versions that register them.
PACKING_SCHEDULERS: tuple[tuple[str, VersionRange], ...] = (
    ("dp_balanced", VersionRange(since="main")),
    ("default_dynamic_cp", VersionRange(since="dev")),
)


def scheduler_range(name: str) -> VersionRange | None:
    """The Megatron-Core versions that have scheduler ``name`` (``None``: no known version).

    >>> scheduler_range("dp_balanced").text, scheduler_range("balanced")
    ('>= main', None)
    """
    return dict(PACKING_SCHEDULERS).get(name.lower())


@dataclass(frozen=True)
class SchedulingKey:
    """A key, the product whose config class defines it, the versions that have it and why."""

    key: str
    product: Product
    has: VersionRange
    why: str


SCHEDULING_KEYS: tuple[SchedulingKey, ...] = (
    SchedulingKey(K_HCP, MCORE, VersionRange(since="0.16.0"), "hybrid CP (#2282)"),
    SchedulingKey(K_CAP, MCORE, VersionRange(since="0.16.0"), "hybrid CP (#2282)"),
    SchedulingKey(K_SCHED, MCORE, VersionRange(since="main"), "DP-balanced scheduler (#6684)"),
    SchedulingKey(K_DCP, MCORE, VersionRange(since="dev"), "dynamic CP (#3405, Megatron-Core dev)"),
    SchedulingKey(
        K_MIN_DCP, MCORE, VersionRange(since="dev"), "dynamic CP part 2 (#2000, Megatron-Core dev)"
    ),
    SchedulingKey(
        K_PAD_ALIGN, MCORE, VersionRange(since="dev"), "THD packed padding (#4359, Megatron-Core dev)"
    ),
    SchedulingKey(
        K_THD_MAX, MCORE, VersionRange(since="dev"), "THD packed padding (#4359, Megatron-Core dev)"
    ),
    SchedulingKey(
        K_CP_PARTITION, MCORE, VersionRange(since="dev"), "CP partition mode (#5087, Megatron-Core dev)"
    ),
    SchedulingKey(K_IDM, MCORE, VersionRange(since="0.19.0"), "inter-document masking (#5298)"),
    SchedulingKey(
        K_GBP,
        BRIDGE,
        VersionRange(since=GLOBAL_BATCH_PACKING_SINCE),
        "global-batch packing (PR #6127, open; not in main 067f987df)",
    ),
)


def dynamic_cp_keys(*, max_seqlen_per_dp_cp_rank: int, min_size: int = 1) -> dict[str, object]:
    """The Bridge keys that turn on global-batch packing with dynamic CP, in the spelling of the newest
    versions (paste them into a config checked for Megatron-Bridge >= 0.7.0 with Megatron-Core dev).

    >>> dynamic_cp_keys(max_seqlen_per_dp_cp_rank=8192)  # doctest: +NORMALIZE_WHITESPACE
    {'dataset.enable_global_batch_packing': True, 'model.dynamic_context_parallel': True,
     'model.sequence_packing_scheduler': 'default_dynamic_cp', 'model.max_seqlen_per_dp_cp_rank': 8192,
     'model.min_dynamic_context_parallel_size': 1, 'model.calculate_per_token_loss': True}
    """
    return {
        K_GBP: True,
        K_DCP: True,
        K_SCHED: "default_dynamic_cp",
        K_CAP: max_seqlen_per_dp_cp_rank,
        K_MIN_DCP: min_size,
        "model.calculate_per_token_loss": True,
    }
