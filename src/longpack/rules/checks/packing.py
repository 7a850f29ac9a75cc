"""Offline and in-batch packing: the packing switches, pack sizes and the per-sequence padding multiple."""

from __future__ import annotations

import math
from collections.abc import Iterator

from longpack.rules.checks.common import (
    INFO,
    K_CP,
    K_DSEQ,
    K_EP,
    K_IBP,
    K_MBS,
    K_MTP,
    K_OFF,
    K_PCU,
    K_PP,
    K_PSM,
    K_PSS,
    K_PTML,
    K_SP,
    K_SPECS,
    K_TP,
    E,
    V,
    W,
    fixed_effective,
    fixed_width,
    multiple_text,
    packed_size,
    pad_cu,
)
from longpack.rules.config import DatasetKind, TrainingSetup, equivalent_offline_config
from longpack.rules.registry import RuleFamily, Violation
from longpack.topology import kernel_pad_multiple

FAMILY = RuleFamily("packing", "Offline and in-batch packing")


@FAMILY.rule(
    "LP-PACK-001",
    E,
    "offline and in-batch packing are mutually exclusive",
    "Bridge ConfigContainer.validate",
    fix="keep one of dataset.enable_offline_packing and dataset.enable_in_batch_packing",
)
def pack_exclusive(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge refuses both packing paths at once: offline packs are already THD rows."""
    if s.dataset.enable_offline_packing and s.dataset.enable_in_batch_packing:
        yield V(
            "enable_offline_packing=True and enable_in_batch_packing=True (Bridge: 'mutually exclusive')",
            "keep one: offline packing (packed Parquet written ahead of time), or runtime in-batch packing "
            "(direct-HF and VLM collates; GPT-SFT datasets too from Bridge PR #5493, after main 067f987df, "
            "with train.micro_batch_size > 1)",
            K_OFF,
            K_IBP,
        )


@FAMILY.rule(
    "LP-PACK-002",
    E,
    "enable_offline_packing needs offline_packing_specs",
    "Bridge ConfigContainer.validate",
    fix="set dataset.offline_packing_specs.packed_sequence_size (and pad_seq_to_mult)",
)
def pack_specs_missing(s: TrainingSetup) -> Iterator[Violation]:
    """Offline packing reads its pack size and padding from ``offline_packing_specs``; Megatron-Bridge
    refuses the flag without them."""
    if s.dataset.enable_offline_packing and s.dataset.offline_packing_specs is None:
        yield V(
            "enable_offline_packing=True but offline_packing_specs is not set",
            f"set {K_PSS}=<pack size, e.g. the seq_length> (and {K_PSM})",
            K_OFF,
            K_SPECS,
        )


@FAMILY.rule(
    "LP-PACK-003",
    E,
    "offline_packing_specs needs enable_offline_packing=True",
    "Bridge ConfigContainer.validate",
    fix="set dataset.enable_offline_packing=true, or remove dataset.offline_packing_specs",
)
def pack_flag_missing(s: TrainingSetup) -> Iterator[Violation]:
    """Megatron-Bridge refuses packing specs without the switch that turns offline packing on."""
    if s.dataset.offline_packing_specs is not None and not s.dataset.enable_offline_packing:
        yield V(
            "offline_packing_specs is set but enable_offline_packing=False",
            f"set {K_OFF}=true, or remove offline_packing_specs (~{K_SPECS})",
            K_OFF,
            K_SPECS,
        )


@FAMILY.rule(
    "LP-PACK-004",
    E,
    "packed_sequence_size > 0 with offline packing",
    "Bridge PackedSequenceSpecs; Bridge ConfigContainer.validate",
    fix="set dataset.offline_packing_specs.packed_sequence_size to the pack size (= seq_length)",
)
def pack_size_positive(s: TrainingSetup) -> Iterator[Violation]:
    """``packed_sequence_size`` is the token budget of one packed row; Megatron-Bridge requires it > 0."""
    pss = packed_size(s)
    if s.dataset.offline_packing and pss is not None and pss <= 0:
        yield V(
            f"offline packing with packed_sequence_size={pss}",
            f"set {K_PSS} to the pack size (the docs recommend = seq_length)",
            K_PSS,
        )


@FAMILY.rule(
    "LP-PACK-005",
    E,
    "offline packing needs micro_batch_size=1",
    "Bridge ConfigContainer.validate; Bridge get_packed_seq_params (MBS 1)",
    fix="use MBS 1 with GBS/MBS and a packed_sequence_size MBS times larger",
)
def pack_mbs_one(s: TrainingSetup) -> Iterator[Violation]:
    """A THD batch holds one packed row per micro-batch; Megatron-Bridge refuses MBS > 1 with offline
    packing and suggests the equivalent MBS=1 config."""
    pss = packed_size(s)
    if s.dataset.offline_packing and s.micro_batch_size > 1 and pss and pss > 0:
        yield V(
            f"offline packing with micro_batch_size={s.micro_batch_size} (THD batches hold one packed row "
            "per microbatch)",
            "use the equivalent " + equivalent_offline_config(s.micro_batch_size, s.global_batch_size, pss),
            K_MBS,
            K_PSS,
        )


@FAMILY.rule(
    "LP-PACK-006",
    E,
    "in-batch packing needs micro_batch_size > 1",
    "Bridge ConfigContainer.validate",
    fix="set train.micro_batch_size >= 2 (or use offline packing with MBS=1)",
)
def inbatch_mbs(s: TrainingSetup) -> Iterator[Violation]:
    """In-batch packing concatenates the sequences of one micro-batch, so it needs at least two."""
    if s.dataset.enable_in_batch_packing and s.micro_batch_size == 1:
        yield V(
            "enable_in_batch_packing=True with micro_batch_size=1: in-batch packing concatenates the "
            "sequences of one microbatch, so it needs at least 2",
            "set train.micro_batch_size >= 2 (or use offline packing with MBS=1)",
            K_MBS,
            K_IBP,
        )


@FAMILY.rule(
    "LP-PACK-007",
    E,
    "pad_cu_seqlens needs pad_to_max_length",
    "Bridge ConfigContainer.validate",
    fix="set dataset.dataset_kwargs.pad_to_max_length=true",
)
def pad_cu_needs_fixed(s: TrainingSetup) -> Iterator[Violation]:
    """Padded ``cu_seqlens`` have a fixed length only when every row has the fixed width; Megatron-Bridge
    requires ``pad_to_max_length`` with ``pad_cu_seqlens``."""
    if pad_cu(s) and not fixed_width(s):
        yield V(
            "offline_packing_specs.pad_cu_seqlens=True but pad_to_max_length is not True",
            f"set {K_PTML}=true",
            K_PCU,
            K_PTML,
        )


@FAMILY.rule(
    "LP-PACK-008",
    E,
    "pad_seq_to_mult splits every sequence into 2*CP equal chunks",
    "Bridge PackedSequenceSpecs; Bridge gpt_step CP split; TransformerEngine thd_get_partitioned_indices",
    fix="set dataset.offline_packing_specs.pad_seq_to_mult to lcm(2*CP, CP*TP with SP) and repack",
)
def pack_pad_mult(s: TrainingSetup) -> Iterator[Violation]:
    """THD context parallelism splits every packed sequence into ``2*CP`` equal chunks; offline packing
    pads each sequence to ``pad_seq_to_mult``, which Bridge neither derives nor checks."""
    specs = s.dataset.offline_packing_specs
    if not s.dataset.offline_packing or specs is None:
        return
    m, c = s.required_pad_seq_to_mult, s.required_cp_multiple
    p = specs.pad_seq_to_mult
    if p is None:
        yield V(
            "pad_seq_to_mult=None breaks the runtime packed dataset (None > 1 raises TypeError)",
            f"set {K_PSM}={m}",
            K_PSM,
        )
    elif p >= 1 and p % c:
        yield V(
            f"pad_seq_to_mult={p} but with CP={s.cp} every packed sequence must split into 2*CP = {c} equal "
            "chunks (THD zigzag); Bridge never derives or checks this for offline packing, and the CP split "
            "fails at run time",
            f"set {K_PSM}={m} (= {multiple_text(s)}) and rebuild the packed data into a fresh folder",
            K_PSM,
            K_CP,
        )


@FAMILY.rule(
    "LP-PACK-016",
    W,
    "pad_seq_to_mult equals the documented lcm(2*CP, CP*TP with SP)",
    "Bridge docs (recommended settings)",
    fix="set dataset.offline_packing_specs.pad_seq_to_mult to lcm(2*CP, CP*TP with SP) and repack",
)
def pack_pad_mult_docs(s: TrainingSetup) -> Iterator[Violation]:
    """The Megatron-Bridge docs ask for ``pad_seq_to_mult = lcm(2*CP, CP*TP)`` with sequence parallelism;
    a multiple of only ``2*CP`` works while every row width is a multiple of the larger value."""
    specs = s.dataset.offline_packing_specs
    if not s.dataset.offline_packing or specs is None or specs.pad_seq_to_mult is None:
        return
    m, c, p = s.required_pad_seq_to_mult, s.required_cp_multiple, specs.pad_seq_to_mult
    if p >= 1 and p % c == 0 and p % m:
        yield V(
            f"pad_seq_to_mult={p} is not a multiple of {multiple_text(s)}: with sequence parallelism each row's "
            f"CP-local tokens must split over TP={s.tp}, which then holds only while every row width is a "
            "multiple of that (LP-PACK-012/013)",
            f"set {K_PSM}={m} as the docs recommend, and rebuild into a fresh folder",
            K_PSM,
            K_TP,
            K_SP,
        )


@FAMILY.rule(
    "LP-PACK-009",
    INFO,
    "pad_seq_to_mult no larger than needed",
    "Bridge docs (recommended settings)",
    fix="set dataset.offline_packing_specs.pad_seq_to_mult to the multiple the topology needs",
)
def pack_pad_mult_wasteful(s: TrainingSetup) -> Iterator[Violation]:
    """Every sequence is padded to ``pad_seq_to_mult``; more than the topology needs only adds padding
    (and, at 1 needed, selects Transformer Engine's slower padded-offset kernel)."""
    specs = s.dataset.offline_packing_specs
    if not s.dataset.offline_packing or specs is None or specs.pad_seq_to_mult is None:
        return
    m, p = s.required_pad_seq_to_mult, specs.pad_seq_to_mult
    pss = packed_size(s)
    if pss and p > pss:
        return  # LP-PACK-017: an error, not waste
    if p > m and p % m == 0:
        extra = " and selects TE's slower padded-offset kernel" if m == 1 else ""
        yield V(
            f"pad_seq_to_mult={p} is more than the {m} this topology needs: it adds padding{extra}",
            f"set {K_PSM}={m} unless you keep one packed build for several topologies",
            K_PSM,
        )


@FAMILY.rule(
    "LP-PACK-017",
    E,
    "pad_seq_to_mult no larger than the pack",
    "Bridge packed_sequence (every sequence is padded up to a multiple of pad_seq_to_mult)",
    fix="set dataset.offline_packing_specs.pad_seq_to_mult to the multiple the topology needs",
)
def pack_pad_mult_over_pack(s: TrainingSetup) -> Iterator[Violation]:
    """A sequence padded up to a multiple larger than the pack fits in no pack: every sample is longer
    than ``packed_sequence_size`` once padded, so nothing can be packed."""
    specs = s.dataset.offline_packing_specs
    pss = packed_size(s)
    if not s.dataset.offline_packing or specs is None or specs.pad_seq_to_mult is None or not pss:
        return
    p = specs.pad_seq_to_mult
    if p > pss:
        yield V(
            f"pad_seq_to_mult={p} is more than packed_sequence_size={pss}: every sequence is padded to at "
            f"least {p} tokens and fits in no pack",
            f"set {K_PSM}={s.required_pad_seq_to_mult} (the multiple this topology needs)",
            K_PSM,
            K_PSS,
        )


@FAMILY.rule(
    "LP-PACK-010",
    W,
    "packed_sequence_size equals seq_length",
    "Bridge ConfigContainer.validate; Bridge docs (recommended settings)",
    fix="set packed_sequence_size and model/dataset.seq_length to the same value and repack",
)
def pack_size_equals_seq(s: TrainingSetup) -> Iterator[Violation]:
    """Bridge does not cross-check the pack size with the sequence length; the docs keep the model,
    dataset and packed lengths equal."""
    pss = packed_size(s)
    seq = s.dataset.seq_length if s.dataset.seq_length is not None else s.model.seq_length
    if s.dataset.offline_packing and pss and pss > 0 and seq and pss != seq:
        yield V(
            f"packed_sequence_size={pss} differs from seq_length={seq}; Bridge does not cross-check them, "
            "the docs say keep model, dataset and packed lengths equal",
            f"set {K_PSS}={seq} (or model/dataset.seq_length={pss}) and rebuild into a fresh folder",
            K_PSS,
            K_DSEQ,
        )


@FAMILY.rule(
    "LP-PACK-011",
    E,
    "max_single_sequence_length <= packed_sequence_size",
    "Bridge PackedSequenceSpecs; Bridge fill_packing_strategy",
    fix="set dataset.offline_packing_specs.max_single_sequence_length <= packed_sequence_size",
)
def pack_max_single(s: TrainingSetup) -> Iterator[Violation]:
    """A sequence longer than the pack size fits no pack."""
    specs = s.dataset.offline_packing_specs
    if specs is None or specs.packed_sequence_size <= 0 or specs.max_single_sequence_length is None:
        return
    if specs.max_single_sequence_length > specs.packed_sequence_size:
        yield V(
            f"max_single_sequence_length={specs.max_single_sequence_length} > packed_sequence_size="
            f"{specs.packed_sequence_size}: an over-size sequence can never be placed",
            f"set max_single_sequence_length <= {specs.packed_sequence_size}",
            "dataset.offline_packing_specs.max_single_sequence_length",
            K_PSS,
        )


@FAMILY.rule(
    "LP-PACK-012",
    E,
    "packed width divisible by the topology multiple (trailing pad segment)",
    "Bridge packed collate_fn; Bridge gpt_step CP split",
    fix="use a packed_sequence_size (and seq_length) that is a multiple of lcm(2*CP, CP*TP with SP)",
)
def pack_width_multiple(s: TrainingSetup) -> Iterator[Violation]:
    """The collate pads each row up to the pack size with a trailing padding segment, which the CP split
    must be able to cut like any other sequence."""
    pss, m = packed_size(s), s.required_pad_seq_to_mult
    if s.dataset.offline_packing and pss and pss > 0 and m > 1 and pss % m:
        yield V(
            f"packed_sequence_size={pss} is not a multiple of {multiple_text(s)}: the trailing padding segment "
            f"up to the row width {pss} breaks the THD CP split",
            f"use a packed_sequence_size (and seq_length) that is a multiple of {m}",
            K_PSS,
            K_CP,
        )


@FAMILY.rule(
    "LP-PACK-013",
    E,
    "dynamic-width rounding (pad_seq_length_to_mult) a multiple of the topology multiple",
    "Bridge build_gpt_sft_split; Bridge packed collate_fn; Bridge gpt_step CP split",
    fix="set dataset.dataset_kwargs.pad_seq_length_to_mult to a multiple of the topology multiple, "
    "or pad_to_max_length=true",
)
def pack_dynamic_width(s: TrainingSetup) -> Iterator[Violation]:
    """Without ``pad_to_max_length`` the packed collate rounds each row to ``pad_seq_length_to_mult``
    (default 16); the trailing padding segment it adds must split for CP like any sequence.

    The packer pads every sequence's runtime length to ``pad_seq_to_mult`` p, so a row holds a multiple
    S of p and the collate adds ``ceil(S, q) - S`` tokens, q = ``pad_seq_length_to_mult``: a multiple of
    g = gcd(p, q) below q, and none at all when q divides p (Megatron-Bridge@067f987df:
    src/megatron/bridge/data/packing/offline.py pads runtime segments to the multiple;
    src/megatron/bridge/data/packing/gpt_sft.py ``collate_fn`` rounds the row). It fails only when some
    such segment does not split, g < q and g not a multiple of the topology multiple: q=16 with
    p=32 (GLM-5.2's recipes, CP=16) adds nothing."""
    m = s.required_pad_seq_to_mult
    if not s.dataset.offline_packing or fixed_width(s) or m <= 1:
        return
    q = s.dataset.dataset_kwargs.get("pad_seq_length_to_mult", 16)
    specs = s.dataset.offline_packing_specs
    p = specs.pad_seq_to_mult if specs is not None else None
    g = math.gcd(p if isinstance(p, int) and p > 1 else 1, q) if isinstance(q, int) else 0
    if isinstance(q, int) and q > 0 and q % m and g < q and g % m:
        yield V(
            f"without pad_to_max_length the collate rounds each row to a multiple of pad_seq_length_to_mult="
            f"{q}, not of {multiple_text(s)}; a trailing padding segment of the wrong size breaks the CP split",
            f"set dataset.dataset_kwargs.pad_seq_length_to_mult={math.lcm(q, m)} or {K_PTML}=true",
            "dataset.dataset_kwargs.pad_seq_length_to_mult",
            K_CP,
        )


@FAMILY.rule(
    "LP-PACK-014",
    INFO,
    "pad_to_max_length is forced on with PP > 1 or EP > 1",
    "Bridge ConfigContainer.validate",
    fix="set dataset.pad_to_max_length=true explicitly",
)
def pack_forced_fixed(s: TrainingSetup) -> Iterator[Violation]:
    """DirectHF, Energon and MockVLM configs get ``pad_to_max_length`` forced on with PP > 1 or EP > 1, so
    every row is ``seq_length`` wide whatever the config says."""
    if (
        s.dataset.kind.has_pad_to_max_length_attr
        and not s.dataset.pad_to_max_length
        and (s.pp > 1 or s.ep > 1)
    ):
        yield V(
            f"{s.dataset.kind} dataset with pad_to_max_length unset and PP={s.pp}, EP={s.ep}: Bridge turns it on, "
            f"so every row is {s.dataset.seq_length or s.model.seq_length} tokens wide",
            "set dataset.pad_to_max_length=true explicitly so the config says what runs",
            "dataset.pad_to_max_length",
            K_PP,
            K_EP,
        )


@FAMILY.rule(
    "LP-PACK-019",
    E,
    "in-batch packing on a GPT-SFT dataset needs a Megatron-Bridge with GPT-SFT in-batch packing",
    "Bridge GPTSFTDatasetConfig (no enable_in_batch_packing before PR #5493)",
    fix="use offline packing (dataset.enable_offline_packing), a direct-HF dataset for in-batch packing, or a "
    "Megatron-Bridge with PR #5493 (then pass --bridge-version 0.7.0)",
)
def inbatch_gpt_sft(s: TrainingSetup) -> Iterator[Violation]:
    """Up to ``main`` only the direct-HF and VLM dataset configs have ``enable_in_batch_packing``;
    ``GPTSFTDatasetConfig`` is a keyword-only dataclass without it, so the config does not load. Bridge
    PR #5493 adds it (runtime in-batch packing of GPT-SFT JSONL)."""
    if s.dataset.kind is DatasetKind.SFT and s.dataset.enable_in_batch_packing:
        yield V(
            "enable_in_batch_packing=True on a GPT-SFT dataset (GPTSFTDatasetConfig): this Megatron-Bridge "
            "has the field only on the direct-HF and VLM datasets (GPT-SFT in-batch packing is PR #5493)",
            "use offline packing, a direct-HF dataset (DirectHFSFTDatasetConfig) for in-batch packing, or a "
            "Megatron-Bridge with PR #5493 (--bridge-version 0.7.0)",
            K_IBP,
        )


@FAMILY.rule(
    "LP-PACK-015",
    E,
    "GPT SFT in-batch packing cannot use dataloader_type='batch'",
    "Bridge GPTSFTDatasetConfig.validate (GPT-SFT in-batch packing, PR #5493)",
    fix="set dataset.dataloader_type=single (or cyclic)",
)
def inbatch_dataloader(s: TrainingSetup) -> Iterator[Violation]:
    """``GPTSFTDatasetConfig.validate`` refuses in-batch packing with the ``batch`` dataloader."""
    if (
        s.dataset.kind is DatasetKind.SFT
        and s.dataset.enable_in_batch_packing
        and s.dataset.dataloader_type == "batch"
    ):
        yield V(
            "enable_in_batch_packing=True with dataloader_type='batch' (Bridge: 'does not support "
            "dataloader_type='batch'')",
            "set dataset.dataloader_type=single (or cyclic)",
            "dataset.dataloader_type",
            K_IBP,
        )


@FAMILY.rule(
    "LP-MTP-001",
    W,
    "MTP with packed SFT: unsupported per the docs before Bridge main",
    "Bridge docs (MTP, not enforced by code); relaxed by Bridge main's verified GLM-5.2 packed SFT",
    fix="set model.mtp_num_layers=null for packed SFT, or run Megatron-Bridge main (its GLM-5.2 recipe packs with MTP)",
)
def mtp_packed(s: TrainingSetup) -> Iterator[Violation]:
    """The Megatron-Bridge docs list sequence packing for fine-tuning as not supported with multi-token
    prediction, and no code checks it. Bridge ``main`` verifies exactly that combination (GLM-5.2 128K
    packed SFT, e4cb868dc: offline packing with ``mtp_num_layers=1``), so the rule stops at ``main``; in
    the releases before, it stays a warning (nothing refuses the config)."""
    mtp = s.model.mtp_num_layers or 0
    if s.dataset.offline_packing and mtp > 0:
        version = "" if s.versions is None else f" (Megatron-Bridge {s.versions.bridge})"
        yield V(
            f"offline packing with mtp_num_layers={mtp}: the docs of this Bridge{version} list sequence packing "
            "for fine-tuning as not supported with MTP (Bridge does not check it; main verifies it)",
            f"set {K_MTP}=null (or 0) for packed SFT, disable packing (~{K_SPECS} {K_OFF}=false), or run "
            "Megatron-Bridge main",
            K_MTP,
            K_OFF,
        )


@FAMILY.rule(
    "LP-PACK-018",
    E,
    "MXFP8 with packing: each rank's tokens a multiple of the 32-token MXFP8 block",
    "Megatron-LM fp8_utils.get_fp8_align_size (mxfp8: 32); TransformerEngine MXFP8 quantizer",
    fix="set pad_seq_to_mult (and the pack size) to a multiple of 32 * CP (* TP with SP) and re-pack",
)
def mxfp8_alignment(s: TrainingSetup) -> Iterator[Violation]:
    """An MXFP8 GEMM scales blocks of 32 tokens; TransformerEngine asserts that the tokens a rank holds
    (the row / CP, / TP under sequence parallelism) are a multiple of 32. Fixed-width rows need the pack
    size to be such a multiple; variable-width rows get there when every sequence is padded to it."""
    recipe = (s.model.fp8_recipe or "").lower()
    specs = s.dataset.offline_packing_specs
    if recipe != "mxfp8" or not s.model.fp8 or not s.dataset.offline_packing or specs is None:
        return
    need = kernel_pad_multiple(tp=s.tp, cp=s.cp, sp=s.sp, fp8_recipe=recipe)
    how = f"32 * CP={s.cp}{f' * TP={s.tp} (SP)' if s.sp and s.tp > 1 else ''}"
    if fixed_effective(s):
        size = specs.packed_sequence_size
        if size % need:
            yield V(
                f"MXFP8 with fixed-width packed rows of {size} tokens: each rank's share must be a multiple "
                f"of 32, so the width a multiple of {need} (= lcm with {how})",
                f"set {K_PSS}={math.ceil(size / need) * need} (or {math.floor(size / need) * need}) and re-pack",
                K_PSS,
                "model.fp8_recipe",
            )
        return
    mult = specs.pad_seq_to_mult or 1
    if mult % need:
        yield V(
            f"MXFP8 with variable-width packed rows and pad_seq_to_mult={mult}: a row's tokens per rank are a "
            f"multiple of 32 only when every sequence is padded to {need} (= lcm with {how})",
            f"set {K_PSM}={math.lcm(mult, need)} and re-pack, or fixed-width rows ({K_PTML}=true) of a "
            f"multiple of {need}",
            K_PSM,
            "model.fp8_recipe",
        )
