"""The thd-batch job: packed rows -> a THD batch exactly as Megatron-Bridge collates it, and what each CP
rank gets of it (``longpack.runtime``; needs torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longpack.errors import ConfigError
from longpack.option import option
from longpack.validate import optional_positive_int, positive_int

__all__ = ["MAX_PARALLEL", "ThdBatchConfig", "ThdBatchResult"]

#: CP and TP sizes at most (a million GPUs).
MAX_PARALLEL = 2**20


@dataclass(frozen=True, kw_only=True)
class ThdBatchConfig:
    """Which rows to collate and how; the alignment defaults to what the data records."""

    command_help = (
        "Collate packed rows exactly as Megatron-Bridge does and print the batch metadata.\n\n"
        "With --cp > 1, shows the zigzag shard of each CP rank: tokens held, real (non-padding) tokens, "
        "supervised tokens. A batch that cannot be split names the sequence and the multiple it needs."
    )

    path: str = option(
        help="Output folder of `longpack pack`, or a packed Parquet file or glob of shards.", positional=True
    )
    split: str | None = option(
        None, help="[training|validation] Split of a folder that holds both (default training)."
    )
    index: int = option(0, help="First row (negative = padding row, as the sampler pads).")
    batch_size: int = option(1, help="Rows per collate call (GBS/DP in Megatron-Bridge).")
    pack_size: int | None = option(
        None,
        help="packed_sequence_size (the collate's max_seq_length); default: the one the data records.",
        aliases=("--max-seq-length",),
    )
    eos_id: int | None = option(
        None, help="The tokenizer's EOS id (pads tokens and labels); default: the one manifest.json records."
    )
    pad_seq_to_mult: int | None = option(
        None, help="Per-sequence alignment of the packs; default: the recorded one (manifest.json), else 1."
    )
    pad_to_max_length: bool = option(
        False, help="Pad every row to the pack size.", negative="--no-pad-to-max-length"
    )
    metadata: str | None = option(None, help="Pack metadata JSON (enables pad_cu_seqlens).")
    cp: int = option(1, help="Also split row 0 of the batch over this many CP ranks.")
    tp: int = option(1, help="Tensor-parallel size (checked with --sp).")
    sp: bool = option(False, help="Sequence parallelism: CP shards must split over TP.", negative="--no-sp")
    no_manifest_ok: bool = option(
        False, help="Read a folder without manifest.json (as Megatron-Bridge's prepare step writes it)."
    )

    def __post_init__(self) -> None:
        positive_int(self.batch_size, "batch_size")
        for name in ("cp", "tp"):  # (torch holds the offsets in int64)
            positive_int(getattr(self, name), name, at_most=MAX_PARALLEL, why="no cluster is larger")
        optional_positive_int(self.pack_size, "pack_size")
        optional_positive_int(self.pad_seq_to_mult, "pad_seq_to_mult")

    def run(self) -> ThdBatchResult:
        from longpack.packed.folder import PackedFolder
        from longpack.runtime.collate import collate_packed
        from longpack.runtime.context_parallel import check_thd_alignment, physical_cu_seqlens, shard_batch
        from longpack.runtime.dataset import PackedDataset

        split, cp, tp, sp = self.split, self.cp, self.tp, self.sp
        folder = PackedFolder.open(self.path, split=split, allow_no_manifest=self.no_manifest_ok)
        if split is None and folder.kind == "folder" and len(folder.split_names) > 1:
            split = "training"
        # The alignment travels with the data: typed values must agree with what it records.
        recorded = folder.alignment(
            pack_size=self.pack_size, pad_seq_to_mult=self.pad_seq_to_mult, eos_id=self.eos_id
        )
        pack_size, eos_id, pad_seq_to_mult = recorded.pack_size, recorded.eos_id, recorded.pad_seq_to_mult
        ds = PackedDataset(folder, split=split)
        try:
            rows = [ds[i] for i in range(self.index, self.index + self.batch_size)]
        except IndexError as exc:
            raise ConfigError(f"index {self.index}: {exc}", fields=("index", "batch_size")) from exc
        batch = collate_packed(
            rows,
            max_seq_length=pack_size,
            eos_id=eos_id,
            pad_seq_to_mult=pad_seq_to_mult,
            pad_to_max_length=self.pad_to_max_length or self.metadata is not None,
            pad_cu_seqlens=self.metadata is not None,
            pack_metadata=self.metadata,
        )
        info: dict[str, Any] = {"rows": len(ds), "files": list(ds.files)}
        for key, value in batch.items():
            if hasattr(value, "shape"):
                info[key] = {"dtype": str(value.dtype).replace("torch.", ""), "shape": list(value.shape)}
                if key.startswith(("cu_seqlens", "max_seqlen")):
                    info[key]["value"] = value.tolist()
            else:
                info[key] = value
        ranks = []
        # CP slicing is per micro-batch of one packed row (MBS 1).
        row0 = {k: (v[:1] if v is not None else None) for k, v in batch.items()}
        if cp > 1 or (sp and tp > 1):
            physical = physical_cu_seqlens(row0)
            assert physical is not None
            info["required_multiple"] = check_thd_alignment(
                physical, int(batch["tokens"].shape[1]), cp_size=cp, tp_size=tp, sequence_parallel=sp
            )
        if cp > 1:
            for rank in range(cp):
                shard = shard_batch(row0, cp, rank)
                ranks.append(
                    {
                        "cp_rank": rank,
                        "tokens": int(shard["tokens"].shape[1]),
                        "real_tokens": int((~shard["padding_mask"]).sum()),
                        "supervised_tokens": int(shard["loss_mask"].sum()),
                    }
                )
            info["cp_ranks"] = ranks
        return ThdBatchResult(info=info)


@dataclass(frozen=True, kw_only=True)
class ThdBatchResult:
    """Rows and files read, each batch tensor's dtype and shape (``cu_seqlens*`` / ``max_seqlen*`` with
    values), ``required_multiple`` and ``cp_ranks`` (tokens, real and supervised tokens per CP rank)."""

    info: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.info
