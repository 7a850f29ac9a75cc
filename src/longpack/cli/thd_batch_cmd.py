"""``longpack thd-batch``: read packed Parquet rows, collate them into a THD batch and show what each CP rank gets."""

from __future__ import annotations

import json
from typing import Any

import typer

#: CP and TP sizes at most (a million GPUs).
MAX_PARALLEL = 2**20


def register(app: typer.Typer) -> None:
    @app.command("thd-batch")
    def thd_batch(
        path: str = typer.Argument(
            ..., help="Output folder of `longpack pack`, or a packed Parquet file or glob of shards."
        ),
        split: str | None = typer.Option(
            None,
            "--split",
            help="[training|validation] Split of a folder that holds both (default training).",
        ),
        index: int = typer.Option(
            0, "--index", help="First row (negative = padding row, as the sampler pads)."
        ),
        batch_size: int = typer.Option(
            1, "--batch-size", help="Rows per collate call (GBS/DP in Megatron-Bridge)."
        ),
        pack_size: int | None = typer.Option(
            None,
            "--pack-size",
            help="packed_sequence_size (the collate's max_seq_length); default: the one the data records.",
        ),
        max_seq_length: int | None = typer.Option(None, "--max-seq-length", hidden=True),
        eos_id: int | None = typer.Option(
            None,
            "--eos-id",
            help="The tokenizer's EOS id (pads tokens and labels); default: the one manifest.json records.",
        ),
        pad_seq_to_mult: int | None = typer.Option(
            None,
            "--pad-seq-to-mult",
            help="Per-sequence alignment of the packs; default: the recorded one (manifest.json), else 1.",
        ),
        pad_to_max_length: bool = typer.Option(False, "--pad-to-max-length/--no-pad-to-max-length"),
        metadata: str | None = typer.Option(
            None, "--metadata", help="Pack metadata JSON (enables pad_cu_seqlens)."
        ),
        cp: int = typer.Option(1, "--cp", help="Also split row 0 of the batch over this many CP ranks."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel size (checked with --sp)."),
        sp: bool = typer.Option(
            False, "--sp/--no-sp", help="Sequence parallelism: CP shards must split over TP."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        no_manifest_ok: bool = typer.Option(
            False,
            "--no-manifest-ok",
            help="Read a folder without manifest.json (as Megatron-Bridge's prepare step writes it).",
        ),
    ) -> None:
        """Collate packed rows exactly as Megatron-Bridge does and print the batch metadata.

        With --cp > 1, shows the zigzag shard of each CP rank: tokens held, real (non-padding) tokens,
        supervised tokens. A batch that cannot be split names the sequence and the multiple it needs.
        """
        from longpack.errors import PackedDataError
        from longpack.packed.folder import PackedFolder
        from longpack.runtime.collate import CollateError, collate_packed
        from longpack.runtime.context_parallel import (
            ContextParallelError,
            check_thd_alignment,
            physical_cu_seqlens,
            shard_batch,
        )
        from longpack.runtime.dataset import PackedDataset

        if max_seq_length is not None:
            typer.echo("warning: --max-seq-length is deprecated; use --pack-size", err=True)
            pack_size = pack_size if pack_size is not None else max_seq_length
        from longpack.validate import optional_positive_int, positive_int

        positive_int(batch_size, "batch_size")
        for name, value in (("cp", cp), ("tp", tp)):  # (torch holds the offsets in int64)
            positive_int(value, name, at_most=MAX_PARALLEL, why="no cluster is larger")
        optional_positive_int(pack_size, "pack_size")
        optional_positive_int(pad_seq_to_mult, "pad_seq_to_mult")
        try:
            folder = PackedFolder.open(path, split=split, allow_no_manifest=no_manifest_ok)
            if split is None and folder.kind == "folder" and len(folder.split_names) > 1:
                split = "training"
            # The alignment travels with the data: typed values must agree with what it records.
            recorded = folder.alignment(pack_size=pack_size, pad_seq_to_mult=pad_seq_to_mult, eos_id=eos_id)
            pack_size, eos_id, pad_seq_to_mult = recorded.pack_size, recorded.eos_id, recorded.pad_seq_to_mult
            ds = PackedDataset(folder, split=split)
            rows = [ds[i] for i in range(index, index + batch_size)]
            batch = collate_packed(
                rows,
                max_seq_length=pack_size,
                eos_id=eos_id,
                pad_seq_to_mult=pad_seq_to_mult,
                pad_to_max_length=pad_to_max_length or metadata is not None,
                pad_cu_seqlens=metadata is not None,
                pack_metadata=metadata,
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
        except (PackedDataError, CollateError, ContextParallelError, IndexError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        if as_json:
            typer.echo(json.dumps(info, indent=2))
            return
        for key, value in info.items():
            if key == "cp_ranks":
                continue
            if isinstance(value, dict):
                shown = f"{value['dtype']} {value['shape']}"
                if "value" in value:
                    shown += f" {value['value']}"
                typer.echo(f"{key:>22}: {shown}")
            else:
                typer.echo(f"{key:>22}: {value}")
        for entry in ranks:
            typer.echo(
                f"{'cp rank ' + str(entry['cp_rank']):>22}: {entry['tokens']} tokens, {entry['real_tokens']} real, "
                f"{entry['supervised_tokens']} supervised"
            )
