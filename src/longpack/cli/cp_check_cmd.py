"""``longpack cp-check``: prove on this machine that CP-sharded THD attention equals unsharded attention."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

#: CP sizes at most: every rank is a real process on this machine.
MAX_CP = 64

# Repeatable options (lists) as module-level singletons: list defaults may not be built per call.
_CP_OPTION = typer.Option(None, "--cp", help="CP sizes to check, one gloo process per rank [2, 4].")
_DTYPE_OPTION = typer.Option(None, "--dtype", help="float64 and/or float32 [both].")


def register(app: typer.Typer) -> None:
    @app.command("cp-check")
    def cp_check(
        cp: list[int] | None = _CP_OPTION,
        dtype: list[str] | None = _DTYPE_OPTION,
        seed: int = typer.Option(0, "--seed"),
        spawn: bool = typer.Option(False, "--spawn", help="Start ranks with spawn instead of forkserver."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Ring and all-gather CP attention over real gloo processes vs unsharded varlen attention.

        Builds packed batches (offline collate at a fixed width, in-batch packing of very different lengths,
        in-batch at a fixed width), shards them with the THD zigzag split and reports the largest
        differences, the per-token loss summed over ranks vs unsharded, and a cross-sequence leak check.
        Exit status 1 if any case fails.
        """
        from longpack.validate import positive_int
        from longpack.validate import seed as seed_value

        cp = cp or [2, 4]
        dtype = dtype or ["float64", "float32"]
        for size in cp:  # before torch is imported
            positive_int(
                size, "cp", at_most=MAX_CP, why="cp-check starts one process per rank on this machine"
            )
        seed_value(seed)
        from longpack.runtime.cp_check import run_cp_check

        cases = []
        for size in cp:
            try:
                cases += run_cp_check(
                    size, seed=seed, dtypes=tuple(dtype), start_method="spawn" if spawn else "forkserver"
                )
            except ValueError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from exc
        if as_json:
            typer.echo(json.dumps([asdict(c) | {"ok": c.ok} for c in cases], indent=2))
        else:
            header = f"{'case':<22}{'cp':>3} {'dtype':<8}{'tokens':>7}{'seqs':>5}{'ring diff':>11}{'gather diff':>12}{'loss diff':>11}{'leak':>6}  ok"
            typer.echo(header)
            for c in cases:
                typer.echo(
                    f"{c.case:<22}{c.cp_size:>3} {c.dtype:<8}{c.tokens:>7}{c.sequences:>5}"
                    f"{c.ring_max_abs_diff:>11.1e}{c.allgather_max_abs_diff:>12.1e}{c.loss_abs_diff:>11.1e}"
                    f"{'no' if c.isolation_max_change_outside == 0 else 'YES':>6}  {'yes' if c.ok else 'NO'}"
                )
        if not all(c.ok for c in cases):
            raise typer.Exit(1)
