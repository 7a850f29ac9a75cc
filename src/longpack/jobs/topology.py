"""The topology job: what a parallel layout implies (DP, expert DP, the THD alignment ``pad_seq_to_mult``).

>>> r = TopologyConfig(gpus=16, tp=2, cp=2, sp=True).run()
>>> r.to_dict()["dp"], r.to_dict()["pad_seq_to_mult"]
(4, 4)
>>> TopologyConfig(gpus=16, tp=2, cp=2, sp=True, fp8_recipe="mxfp8").run().to_dict()["kernel_pad_multiple"]
128
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longpack.jobs.options import fp8_recipe_option, gpus_option, hybridep_option
from longpack.option import option

__all__ = ["TopologyConfig", "TopologyResult"]


@dataclass(frozen=True, kw_only=True)
class TopologyConfig:
    """A layout of ``gpus`` GPUs; validated by :class:`longpack.topology.ParallelLayout` when run."""

    command_help = "Print DP, expert DP and the THD alignment (pad_seq_to_mult) of a layout."

    gpus: int = gpus_option(required=True)
    tp: int = option(1, help="Tensor parallel size.")
    cp: int = option(1, help="Context parallel size.")
    pp: int = option(1, help="Pipeline parallel size.")
    vpp: int | None = option(None, help="Virtual pipeline stages per rank.")
    ep: int = option(1, help="Expert parallel size.")
    etp: int | None = option(None, help="Expert tensor parallel size (default: --tp).")
    sp: bool = option(False, help="Sequence parallelism.", negative="--no-sp")
    fp8_recipe: str | None = fp8_recipe_option()
    hybridep: bool = hybridep_option()

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)

    def run(self) -> TopologyResult:
        from longpack.topology import ParallelLayout, kernel_pad_multiple

        layout = ParallelLayout(
            world_size=self.gpus,
            tp=self.tp,
            cp=self.cp,
            pp=self.pp,
            vpp=self.vpp,
            ep=self.ep,
            etp=self.etp,
            sp=self.sp,
        )
        result = TopologyResult(
            values={
                "world_size": layout.world_size,
                "tp": layout.tp,
                "cp": layout.cp,
                "pp": layout.pp,
                "vpp": layout.vpp,
                "ep": layout.ep,
                "etp": layout.expert_tp,
                "sp": layout.sp,
                "dp": layout.dp,
                "edp": layout.edp,
                "pad_seq_to_mult": layout.pad_seq_to_mult,
            }
        )
        if self.fp8_recipe is not None or self.hybridep:
            # the row multiple the kernels need as well: pad_seq_to_mult to this (and the pack size)
            result.values["kernel_pad_multiple"] = kernel_pad_multiple(
                tp=layout.tp, cp=layout.cp, sp=layout.sp, fp8_recipe=self.fp8_recipe, hybridep=self.hybridep
            )
        return result


@dataclass(frozen=True, kw_only=True)
class TopologyResult:
    values: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.values)
