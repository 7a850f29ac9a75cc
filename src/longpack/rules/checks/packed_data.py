"""Packed data against the config (``longpack check --packed DIR``): pack size, metadata, and whether every
packed sequence splits for the topology.

These rules read :attr:`TrainingSetup.packed`, the summary :func:`longpack.rules.packed_data.inspect_packed_dir`
makes of the folder; they run only when it is there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from longpack.rules.checks.common import (
    HYBRIDEP_CHUNK,
    K_CP,
    K_DSEQ,
    K_MBS,
    K_OFF,
    K_PCU,
    K_PSM,
    K_PSS,
    K_SP,
    E,
    V,
    W,
    fixed_width,
    multiple_text,
    packed_size,
    pad_cu,
)
from longpack.rules.config import TrainingSetup
from longpack.rules.packed_data import PackedDataSummary
from longpack.rules.registry import RuleFamily, Violation

FAMILY = RuleFamily("packed_data", "Packed data against the config")


@FAMILY.rule(
    "LP-DATA-001",
    E,
    "metadata file present when pad_cu_seqlens",
    "Bridge build_gpt_sft_split; Bridge GPTSFTPackedDataset metadata",
    fix="re-run the packing step so it writes <N>_metadata.jsonl (or set packed_metadata_path)",
    scope="packed",
)
def data_metadata(s: TrainingSetup) -> Iterator[Violation]:
    """Padded ``cu_seqlens`` take their length from the metadata file; Bridge requires it with
    ``pad_cu_seqlens``."""
    p = s.packed
    if p is None:
        return
    if pad_cu(s) and p.metadata_path is None:
        yield V(
            f"pad_cu_seqlens=True but {p.path} has no <N>_metadata.jsonl (Bridge: 'a metadata json file is "
            "required when pad_cu_seqlens is enabled')",
            "re-run the packing step so it writes the metadata file (or set packed_metadata_path)",
            K_PCU,
        )


@FAMILY.rule(
    "LP-DATA-002",
    E,
    "pack size of the data equals packed_sequence_size",
    "Bridge offline packing output files",
    fix="repack with the config's packed_sequence_size into a fresh folder (or set it to the data's)",
    scope="packed",
)
def data_pack_size(s: TrainingSetup) -> Iterator[Violation]:
    """Bridge finds the packed files by pack size; data packed for another size is another dataset."""
    p = s.packed
    if p is None:
        return
    pss = packed_size(s)
    if p.pack_size is not None and pss and pss > 0 and p.pack_size != pss:
        yield V(
            f"{p.path} was packed for N={p.pack_size} tokens but packed_sequence_size={pss}",
            f"repack with packed_sequence_size={pss} into a fresh folder (or set {K_PSS}={p.pack_size})",
            K_PSS,
        )


@FAMILY.rule(
    "LP-DATA-003",
    W,
    "pack size of the data equals seq_length",
    "Bridge docs (recommended settings)",
    fix="keep model, dataset and packed lengths equal: repack with N = seq_length",
    scope="packed",
)
def data_seq_length(s: TrainingSetup) -> Iterator[Violation]:
    """The docs keep the model, dataset and packed lengths equal."""
    p = s.packed
    if p is None:
        return
    seq = s.dataset.seq_length if s.dataset.seq_length is not None else s.model.seq_length
    pss = packed_size(s)
    if p.pack_size is not None and seq and p.pack_size != seq and (pss is None or pss == p.pack_size):
        yield V(
            f"{p.path} was packed for N={p.pack_size} tokens but seq_length={seq}",
            f"keep model, dataset and packed lengths equal: repack with N={seq}",
            K_DSEQ,
        )


def _misaligned(p: PackedDataSummary, multiple: int) -> tuple[bool, str]:
    """Whether some packed sequence is not a multiple of ``multiple``, and how to say so."""
    count = p.misaligned_count(multiple)
    if count is None:  # not scanned for this multiple: the gcd of all lengths still decides
        return (
            p.segment_length_gcd % multiple != 0,
            f"packed sequence lengths share only the factor {p.segment_length_gcd}",
        )
    ex = p.first_misaligned_by_multiple.get(multiple) or (
        p.first_misaligned if multiple == p.checked_multiple else None
    )
    where = ""
    if ex is not None:
        where = f"; first: {ex.file} row {ex.row} sequence {ex.segment} has {ex.runtime_length} tokens"
    return count > 0, f"{count} of {p.segments} packed sequences are not a multiple of {multiple}{where}"


@FAMILY.rule(
    "LP-DATA-004",
    E,
    "every packed sequence splits into 2*CP equal chunks",
    "Bridge gpt_step CP split; TransformerEngine thd_get_partitioned_indices",
    fix="repack with pad_seq_to_mult = lcm(2*CP, CP*TP with SP) into a fresh folder",
    scope="packed",
)
def data_alignment(s: TrainingSetup) -> Iterator[Violation]:
    """THD context parallelism splits every packed sequence into ``2*CP`` equal chunks; a sequence of
    another length fails the split at run time."""
    p = s.packed
    if p is None:
        return
    c, m = s.required_cp_multiple, s.required_pad_seq_to_mult
    bad, text = _misaligned(p, c)
    if bad:
        yield V(
            f"{text} (2*CP = {c} for CP={s.cp}): the THD context-parallel split fails on them",
            f"repack with pad_seq_to_mult={m} into a fresh folder (longpack pack ... or {K_PSM}={m})",
            K_PSM,
            K_CP,
        )


@FAMILY.rule(
    "LP-DATA-010",
    W,
    "every packed sequence a multiple of the documented lcm(2*CP, CP*TP)",
    "Bridge docs (recommended settings)",
    fix="repack with pad_seq_to_mult = lcm(2*CP, CP*TP with SP) into a fresh folder",
    scope="packed",
)
def data_alignment_docs(s: TrainingSetup) -> Iterator[Violation]:
    """With sequence parallelism the docs pad every sequence to ``lcm(2*CP, CP*TP)``; less works only while
    every row width is a multiple of it."""
    p = s.packed
    if p is None:
        return
    c, m = s.required_cp_multiple, s.required_pad_seq_to_mult
    if m == c or _misaligned(p, c)[0]:
        return
    bad, text = _misaligned(p, m)
    if bad:
        yield V(
            f"{text} (= {multiple_text(s)}): this works only while every row width is a multiple of {m}",
            f"repack with pad_seq_to_mult={m} into a fresh folder",
            K_PSM,
            K_SP,
        )


@FAMILY.rule(
    "LP-DATA-005",
    E,
    "no packed row exceeds the pack size",
    "Bridge fill_packing_strategy; Bridge packed collate_fn",
    fix="repack: the packing step must never exceed the pack size",
    scope="packed",
)
def data_over_capacity(s: TrainingSetup) -> Iterator[Violation]:
    """The packed collate asserts that no row is wider than the pack size."""
    p = s.packed
    if p is None:
        return
    if p.rows_over_pack_size:
        yield V(
            f"{p.rows_over_pack_size} packed rows hold more than N={p.pack_size} runtime tokens (max "
            f"{p.max_row_runtime_tokens}); the collate asserts W <= max_seq_length",
            "repack: the packing step must never exceed the pack size",
            K_PSS,
        )


@FAMILY.rule(
    "LP-DATA-006",
    E,
    "fixed packed width divisible by the multiple (and 128 for HybridEP)",
    "Bridge gpt_step CP split; Bridge docs (recommended settings)",
    fix="repack with a pack size that is a multiple of the topology multiple (and of 128 with HybridEP)",
    scope="packed",
)
def data_fixed_width(s: TrainingSetup) -> Iterator[Violation]:
    """When rows are used at their fixed width (``pad_to_max_length``, CUDA graphs, HybridEP) the pack size
    itself must split for CP/SP (and into HybridEP's 128-token chunks)."""
    p = s.packed
    if p is None:
        return
    n, m = p.pack_size, s.required_pad_seq_to_mult
    if n is None or packed_size(s) == n:  # the config rules LP-PACK-012 / LP-MOE-002 already cover this width
        return
    needs_fixed = fixed_width(s) or s.model.training_cuda_graph or s.model.uses_hybridep
    if not needs_fixed:
        return
    need = math.lcm(m, HYBRIDEP_CHUNK) if s.model.uses_hybridep else m
    if n % need:
        yield V(
            f"{p.path} packs to N={n}, used as a fixed width, which is not a multiple of {need}",
            f"repack with a pack size that is a multiple of {need}",
            K_PSS,
        )


@FAMILY.rule(
    "LP-DATA-007",
    W,
    "packed data used with offline packing enabled",
    "Bridge ConfigContainer.validate",
    fix="set dataset.enable_offline_packing=true and packed_sequence_size to the data's pack size",
    scope="packed",
)
def data_flag(s: TrainingSetup) -> Iterator[Violation]:
    """A packed folder is read only when the config turns offline packing on."""
    p = s.packed
    if p is None:
        return
    if not s.dataset.offline_packing:
        yield V(
            f"--packed {p.path} given but the config does not enable offline packing",
            f"set {K_OFF}=true {K_PSS}={p.pack_size or '<N>'}",
            K_OFF,
        )


@FAMILY.rule(
    "LP-DATA-008",
    E,
    "packed data needs micro_batch_size=1",
    "Bridge get_packed_seq_params (MBS 1)",
    fix="set train.micro_batch_size=1 and raise the pack size instead",
    scope="packed",
)
def data_mbs(s: TrainingSetup) -> Iterator[Violation]:
    """A THD batch takes one packed row per micro-batch."""
    p = s.packed
    if p is None:
        return
    if not s.dataset.offline_packing and s.micro_batch_size > 1:
        yield V(
            f"packed rows with micro_batch_size={s.micro_batch_size}: THD batches take one packed row per microbatch",
            "set train.micro_batch_size=1 and raise the pack size instead",
            K_MBS,
        )


@FAMILY.rule(
    "LP-DATA-009",
    W,
    "recorded pad_seq_to_mult matches the topology",
    "Bridge offline packing output files; Bridge docs (recommended settings)",
    fix="rebuild with the topology's pad_seq_to_mult into a fresh folder",
    scope="packed",
)
def data_recorded_mult(s: TrainingSetup) -> Iterator[Violation]:
    """The folder records the ``pad_seq_to_mult`` it was built with; another topology needs a rebuild."""
    p = s.packed
    if p is None:
        return
    r, m = p.recorded_pad_seq_to_mult, s.required_pad_seq_to_mult
    if r is not None and r % m:
        yield V(
            f"{p.path} records pad_seq_to_mult={r} but this topology needs a multiple of {multiple_text(s)}: it was "
            "built for another topology",
            f"rebuild with pad_seq_to_mult={m} into a fresh folder",
            K_PSM,
        )


@FAMILY.rule(
    "LP-DATA-011",
    E,
    "config pad_seq_to_mult equals the one the data was packed with",
    "Bridge data/packing/gpt_sft.py collate_fn",
    fix="set offline_packing_specs.pad_seq_to_mult to the recorded value (or repack with the config's)",
    scope="packed",
)
def data_config_mult(s: TrainingSetup) -> Iterator[Violation]:
    """Bridge never checks the alignment it is told: it builds ``cu_seqlens_q_padded`` only when the
    config's ``pad_seq_to_mult`` is > 1, so data packed with 8 and read with 1 trains on logical offsets
    that include the alignment padding (and the other way round). The value travels with the data."""
    p = s.packed
    specs = s.dataset.offline_packing_specs
    if p is None or specs is None or p.recorded_pad_seq_to_mult is None:
        return
    given = specs.pad_seq_to_mult if specs.pad_seq_to_mult is not None else 1
    if given != p.recorded_pad_seq_to_mult:
        yield V(
            f"{p.path} was packed with pad_seq_to_mult={p.recorded_pad_seq_to_mult} but the config reads it with "
            f"pad_seq_to_mult={given}; Bridge would collate these rows with the wrong boundaries",
            f"set {K_PSM}={p.recorded_pad_seq_to_mult} (or repack with pad_seq_to_mult={given} into a fresh folder)",
            K_PSM,
        )


#: Problems of the verification quoted in one finding each; the rest are counted.
MAX_QUOTED_PROBLEMS = 10


@FAMILY.rule(
    "LP-DATA-012",
    E,
    "packed data passes verification",
    "Bridge GPTSFTPackedDataset (reads every row as written); longpack inspect --verify",
    fix="repack into a fresh folder (or restore the damaged files); `longpack inspect DIR --verify` lists the same problems",
    scope="packed",
)
def data_verified(s: TrainingSetup) -> Iterator[Violation]:
    """``check --packed`` runs the verification ``inspect --verify`` runs (one code path: structure,
    metadata against the rows, the manifest's sizes and sha256, pack size, split membership, every data
    page), so the two commands give one verdict on one folder."""
    p = s.packed
    if p is None:
        return
    for problem in p.problems[:MAX_QUOTED_PROBLEMS]:
        yield V(f"{p.path}: {problem}", "repack into a fresh folder, or restore the files the manifest lists")
    if len(p.problems) > MAX_QUOTED_PROBLEMS:
        more = len(p.problems) - MAX_QUOTED_PROBLEMS
        yield V(
            f"{p.path}: {more} more problem(s)", f"run longpack inspect {p.path} --verify for all of them"
        )


def _named_files(spec: str) -> list[str]:
    import glob
    import os

    if glob.has_magic(spec):
        return sorted(os.path.realpath(f) for f in glob.glob(spec))
    return [os.path.realpath(spec)] if os.path.exists(spec) else []


@FAMILY.rule(
    "LP-DATA-013",
    E,
    "data paths the config names exist and belong to the packed folder",
    "Bridge GPTSFTPackedDataset (FileNotFoundError for a path that does not exist)",
    fix="point offline_packing_specs.packed_train_data_path / packed_val_data_path / packed_metadata_path "
    "at the packed folder's files (its bridge_config.yaml names them)",
)
def data_paths(s: TrainingSetup) -> Iterator[Violation]:
    """Bridge opens the paths the config names, not the folder ``--packed`` points at: a path that does not
    exist fails the run at start, and one that names other files (another pack, the validation shards in
    the training glob) trains on data ``--packed`` never checked."""
    import os

    specs = s.dataset.offline_packing_specs
    if specs is None or not s.dataset.offline_packing:
        return
    p = s.packed
    named = (
        ("training", "packed_train_data_path", specs.packed_train_data_path),
        ("validation", "packed_val_data_path", specs.packed_val_data_path),
    )
    for split, key, spec in named:
        if not spec:
            continue
        files = _named_files(spec)
        dotted = f"dataset.offline_packing_specs.{key}"
        if not files:
            yield V(
                f"{key}={spec} names no file (Bridge raises FileNotFoundError at start)",
                f"set {dotted} to the files of the packed folder (see its bridge_config.yaml)",
                dotted,
            )
            continue
        if p is None or not p.split_files:
            continue
        held = sorted(p.split_files.get(split, ()))
        if files != held:
            other = sorted(set(files) - set(held))
            missing = sorted(set(held) - set(files))
            parts = []
            if other:
                parts.append(f"{len(other)} file(s) outside the {split} split of {p.path} (e.g. {other[0]})")
            if missing:
                parts.append(f"not {len(missing)} of its {split} file(s) (e.g. {missing[0]})")
            yield V(
                f"{key}={spec} names {' and '.join(parts)}: Bridge would read other data than was checked",
                f"set {dotted} to exactly the {split} files of {p.path} (its bridge_config.yaml names them)",
                dotted,
            )
    meta = specs.packed_metadata_path
    if meta:
        dotted = "dataset.offline_packing_specs.packed_metadata_path"
        if not os.path.isfile(meta):
            yield V(
                f"packed_metadata_path={meta} is not a file (Bridge raises FileNotFoundError at start)",
                f"set {dotted} to the <N>_metadata.jsonl of the packed folder",
                dotted,
            )
        elif (
            p is not None
            and p.metadata_path is not None
            and os.path.realpath(meta) != os.path.realpath(p.metadata_path)
        ):
            yield V(
                f"packed_metadata_path={meta} is not the metadata of {p.path} ({p.metadata_path})",
                f"set {dotted}={p.metadata_path}",
                dotted,
            )


@FAMILY.rule(
    "LP-DATA-014",
    E,
    "a balanced pack's topology matches the config's",
    "longpack pack --balance (packs ordered for one DP, PP, GBS and MBS)",
    fix="train with the topology the pack was balanced for (bridge_config.yaml pins it), or repack with "
    "--balance for this one",
    scope="packed",
)
def data_balanced_topology(s: TrainingSetup) -> Iterator[Violation]:
    """``pack --balance`` orders the packs so that each global batch splits evenly over its DP ranks and
    pipeline micro-batches; with another GBS, MBS, PP or DP the batches cut the order elsewhere and the
    balance (the reason for the order) is gone, silently."""
    p = s.packed
    if p is None or not p.balanced_for:
        return
    b = p.balanced_for
    config = {
        "gbs": ("train.global_batch_size", s.global_batch_size),
        "mbs": ("train.micro_batch_size", s.micro_batch_size),
        "pp": ("model.pipeline_model_parallel_size", s.pp),
        "dp": ("the data-parallel size (GPUs / (TP*CP*PP))", s.dp),
    }
    for key, (name, value) in config.items():
        want = b.get(key, 1 if key in ("mbs", "pp") else None)
        if want is None or value is None:
            continue
        if value != want:
            yield V(
                f"{p.path} was balanced for {key.upper()}={want} but the config has {name}={value}: the "
                "batches would cut the balanced order elsewhere",
                f"set {name}={want}"
                if key != "dp"
                else f"run on DP={want} (or repack with --balance dp={value},...)",
                *([name] if "." in name else []),
            )
