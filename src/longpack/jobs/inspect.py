"""The inspect job: summary, histograms and (``verify``) a check of every row of a packed output folder
(``longpack.packed.inspect_output``, the one reader)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longpack.option import option

__all__ = ["InspectConfig", "InspectResult"]


@dataclass(frozen=True, kw_only=True)
class InspectConfig:
    """Which folder and what to check; ``plot`` is checked before the (long) verification."""

    command_help = (
        "Summarize a packed output folder or a Megatron .bin/.idx prefix; exit 1 if it is unfinished or a "
        "check fails."
    )

    folder: str | Path = option(
        help="Output folder of `longpack pack`, or a token store.", positional=True, cli_type=Path
    )
    verify: bool = option(
        False,
        help="Check every row (Megatron-Bridge validate_row, alignment, pack size) and the manifest "
        "against the files (hashes, counts, metadata).",
    )
    plot: str | Path | None = option(
        None, help="Save length and fill histograms as a PNG.", cli_type=Path | None
    )
    no_manifest_ok: bool = option(
        False,
        help="A folder without manifest.json is Megatron-Bridge's (its prepare step writes none), not "
        "unfinished.",
    )
    # A Megatron indexed dataset (a .bin/.idx prefix, or a folder of `pack --output-format indexed`): what
    # GPTDataset makes of it (longpack.packed.indexed.inspect_indexed).
    seq_length: int | None = option(
        None, help="Indexed data: GPTDataset's sequence length (default: the manifest's)."
    )
    seed: int | None = option(None, help="Indexed data: Megatron's --seed (default 1234).")
    split: str = option("1,0,0", help="Indexed data: Megatron's --split; the train part is shown.")
    num_samples: int | None = option(
        None, help="Indexed data: samples GPTDataset draws (train_iters * GBS; default one epoch)."
    )
    sample: int | None = option(None, help="Indexed data: show this sample's documents and cu_seqlens.")
    eod_id: int | None = option(
        None,
        help="Indexed data: the EOD id where positions restart (default: the manifest's; a bare prefix: "
        "every document end).",
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)

    def run(self) -> InspectResult:
        from longpack.outputs import check_output_file
        from longpack.packed import inspect_output, plot_output
        from longpack.packed.indexed import inspect_indexed, is_indexed
        from longpack.store import TokenStore, is_store

        if is_indexed(Path(self.folder)):
            return InspectResult(
                report=inspect_indexed(
                    self.folder,
                    seq_length=self.seq_length,
                    seed=self.seed,
                    split=self.split,
                    num_samples=self.num_samples,
                    sample=self.sample,
                    eod_id=self.eod_id,
                )
            )

        if is_store(self.folder):  # a token store (longpack tokenize): what it holds, whether it is current
            return InspectResult(report=TokenStore.open(self.folder, join=False).report(verify=self.verify))
        if self.plot is not None:
            check_output_file(Path(self.plot), field="plot")  # before the (long) verification
        report = inspect_output(Path(self.folder), verify=self.verify, no_manifest_ok=self.no_manifest_ok)
        if self.plot is not None:
            plot_output(Path(self.folder), Path(self.plot))
            report["plot"] = str(self.plot)
        return InspectResult(report=report)


@dataclass(frozen=True, kw_only=True)
class InspectResult:
    """``longpack.packed.inspect_output``'s report (``ok``, ``finished``, ``splits``, ``problems``, ...)."""

    report: dict[str, Any]

    @property
    def exit_code(self) -> int:
        """1 when the folder is unfinished or a check failed."""
        return 0 if self.report["ok"] else 1

    def to_dict(self) -> dict[str, Any]:
        return self.report
