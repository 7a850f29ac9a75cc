"""The rollouts job: how one step's RL rollouts would pack (``longpack.balance.pack_rollouts``) under each
way of giving bins to DP ranks, and what each costs under the planner's step-time model.

>>> RolloutsConfig(lengths_file="l.txt", bin_size=100, dp=2, cp=2, sp=True, tp=3)
Traceback (most recent call last):
...
longpack.errors.ConfigError: bin_size 100 is not a multiple of seq_length_multiple 12 (lcm(2*CP=4, CP*TP=6)); use a bin size such as 108
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longpack import choices
from longpack.errors import ConfigError
from longpack.jobs.options import fp8_recipe_option, gpu_option, model_option
from longpack.option import option
from longpack.topology import align_up
from longpack.validate import positive_int

__all__ = ["RolloutsConfig", "RolloutsResult"]


@dataclass(frozen=True, kw_only=True)
class RolloutsConfig:
    """A step's rollout lengths, the bin size, the DP / TP / CP layout and (optionally) a model and GPU for
    the planner's cost; validated on construction."""

    command_help = (
        "How one step's RL rollouts pack into THD bins per DP rank (Megatron-LM's orders vs cost-balanced)."
    )

    lengths_file: str | Path = option(
        help="Rollout lengths (prompt + generation tokens): .npy or text with one integer per line.",
        positional=True,
        cli_type=Path,
    )
    bin_size: int = option(help="Tokens per bin (one micro-batch, THD).", cli_type=int)
    dp: int = option(1, help="Data-parallel ranks the bins are given to.")
    tp: int = option(1, help="Tensor parallel size (alignment with --sp, and the cost's GPUs).")
    cp: int = option(1, help="Context parallel size (alignment 2*CP, and the cost's GPUs).")
    sp: bool = option(False, help="Sequence parallelism on (alignment CP*TP).")
    max_sequences_per_bin: int = option(16, help="Rollouts per bin at most (Megatron-LM's default 16).")
    seq_length_multiple: int | None = option(
        None, help="Slot alignment (default: pad_seq_to_mult of --tp/--cp/--sp; Megatron-LM's RL uses 2*CP)."
    )
    fp8_recipe: str | None = fp8_recipe_option()
    model: str | None = model_option()
    gpu: str | None = gpu_option()

    def __post_init__(self) -> None:
        from longpack.topology import pad_seq_to_mult, pad_seq_to_mult_terms
        from longpack.validate import plain_fields

        plain_fields(self)
        for name in ("bin_size", "dp", "tp", "cp", "max_sequences_per_bin"):
            positive_int(getattr(self, name), name)
        if self.seq_length_multiple is not None:
            positive_int(self.seq_length_multiple, "seq_length_multiple")
        if (self.model is None) != (self.gpu is None):
            raise ConfigError(
                "give both model and gpu for the planner's step-time cost, or neither (a token-and-pair count)",
                fields=("model", "gpu"),
            )
        multiple = self.multiple
        if self.bin_size % multiple:
            source = (
                "given"
                if self.seq_length_multiple is not None
                else pad_seq_to_mult_terms(tp=self.tp, cp=self.cp, sp=self.sp)
            )
            raise ConfigError(
                f"bin_size {self.bin_size} is not a multiple of seq_length_multiple {multiple} ({source}); use a "
                f"bin size such as {align_up(self.bin_size, multiple)}",
                fields="bin_size",
            )
        assert multiple == (self.seq_length_multiple or pad_seq_to_mult(tp=self.tp, cp=self.cp, sp=self.sp))
        if self.fp8_recipe is not None:
            from longpack.balance.rollouts import RolloutPackingError, check_fp8_bin_size

            try:
                check_fp8_bin_size(
                    self.bin_size, tp=self.tp, cp=self.cp, sp=self.sp, fp8_recipe=self.fp8_recipe
                )
            except RolloutPackingError as exc:
                raise ConfigError(str(exc), fields=("bin_size", "fp8_recipe")) from exc

    @property
    def multiple(self) -> int:
        """The slot alignment the packer uses."""
        from longpack.topology import pad_seq_to_mult

        if self.seq_length_multiple is not None:
            return self.seq_length_multiple
        return pad_seq_to_mult(tp=self.tp, cp=self.cp, sp=self.sp)

    def run(self) -> RolloutsResult:
        import itertools

        import numpy as np

        from longpack.balance.rollouts import pack_rollouts
        from longpack.jobs.balance import read_lengths

        lengths = read_lengths(Path(self.lengths_file))
        too_long = int(np.count_nonzero(align_up(lengths, self.multiple) > self.bin_size))
        if too_long:
            raise ConfigError(
                f"{too_long} of {lengths.size} rollouts in {self.lengths_file} do not fit a bin of {self.bin_size} "
                f"tokens (aligned to {self.multiple}); the longest is {int(lengths.max())}: raise bin_size or cap "
                "the generation length",
                fields="bin_size",
            )
        cost_model = None
        unit = "work"
        if self.model is not None and self.gpu is not None:
            from longpack.planner.balance_costs import pack_cost_model

            cost_model = pack_cost_model(
                model=self.model,
                gpu=self.gpu,
                tp=self.tp,
                cp=self.cp,
                seq_length=self.bin_size,
                seq_length_field="bin_size",
            )
            unit = "s"
        # token ids do not change where a rollout goes: lengths alone decide the packing
        rollouts = [np.zeros(int(n), dtype=np.int32) for n in lengths]
        rows = []
        for fill, distribution in itertools.product(choices.ROLLOUT_FILLS, choices.ROLLOUT_DISTRIBUTIONS):
            packing = pack_rollouts(
                rollouts,
                bin_size=self.bin_size,
                dp=self.dp,
                max_sequences_per_bin=self.max_sequences_per_bin,
                seq_length_multiple=self.multiple,
                distribution=distribution,
                fill=fill,
                cost_model=cost_model,
            )
            rows.append(
                {
                    "fill_algorithm": fill,
                    "distribution": distribution,
                    "bins_per_rank": packing.ranks[0].num_bins,
                    "fill": round(packing.efficiency, 6),
                    "busiest_rank": round(max(packing.rank_costs), 6),
                    "mean_rank": round(sum(packing.rank_costs) / len(packing.rank_costs), 6),
                    "imbalance": round(packing.imbalance, 6),
                }
            )
        return RolloutsResult(
            rollouts=int(lengths.size),
            tokens=int(lengths.sum()),
            seq_length_multiple=self.multiple,
            cost_unit=unit,
            rows=tuple(rows),
        )


@dataclass(frozen=True, kw_only=True)
class RolloutsResult:
    """Per fill algorithm and distribution: bins per rank, fill, the busiest and the mean rank's cost, their ratio.

    ``cost_unit`` is ``"s"`` (the planner's seconds for the model and GPU) or ``"work"`` (one unit per token
    plus one per causal pair of a 4,096-token sequence).
    """

    rollouts: int
    tokens: int
    seq_length_multiple: int
    cost_unit: str
    rows: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            "tokens": self.tokens,
            "seq_length_multiple": self.seq_length_multiple,
            "cost_unit": self.cost_unit,
            "rows": list(self.rows),
        }
