"""``longpack topology``: what a parallel layout implies (DP, EDP, pad_seq_to_mult)."""

from __future__ import annotations

import json

import typer

from longpack.cli import options as opt
from longpack.topology import ParallelLayout


def register(app: typer.Typer) -> None:
    @app.command("topology")
    def topology(
        gpus: int = typer.Option(..., "--gpus", help="World size (number of GPUs)."),
        tp: int = typer.Option(1, "--tp"),
        cp: int = typer.Option(1, "--cp"),
        pp: int = typer.Option(1, "--pp"),
        vpp: int | None = typer.Option(None, "--vpp"),
        ep: int = typer.Option(1, "--ep"),
        etp: int | None = typer.Option(None, "--etp"),
        sp: bool = typer.Option(False, "--sp/--no-sp", help="Sequence parallelism."),
        as_json: opt.Json = False,
    ) -> None:
        """Print DP, expert DP and the THD alignment (pad_seq_to_mult) of a layout."""
        layout = ParallelLayout(world_size=gpus, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=etp, sp=sp)
        info = {
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
        if as_json:
            typer.echo(json.dumps(info, indent=2))
        else:
            for key, value in info.items():
                typer.echo(f"{key:>16}: {value}")
