"""``longpack verify``: prove that a model sees what was packed (packed = unpacked, per row, CP rank and PP stage)."""

from __future__ import annotations

import json

import typer

_CP_OPTION = typer.Option(None, "--cp", help="CP sizes to check (gloo processes), where the alignment allows [2, 4].")
_PP_OPTION = typer.Option(None, "--pp", help="PP sizes to check (one process per stage) [2].")


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        packed: str = typer.Argument(..., help="Packed output folder (Parquet or .npy)."),
        model: str = typer.Option(..., "--model", help="HF config.json (or its folder), cached hub id, or catalog model."),
        split: str | None = typer.Option(None, "--split", help="training or validation [every split]."),
        backend: str = typer.Option("hf", "--backend", help="hf (transformers, CPU, float64) or megatron (CUDA)."),
        time_budget: float = typer.Option(60.0, "--time-budget", help="Seconds for the row checks; 0 = every row."),
        max_rows: int | None = typer.Option(None, "--max-rows", help="At most this many rows per split."),
        cp: list[int] | None = _CP_OPTION,
        pp: list[int] | None = _PP_OPTION,
        dist_rows: int = typer.Option(2, "--dist-rows", help="Rows checked under CP and PP."),
        fault: str | None = typer.Option(None, "--inject-fault", help="Inject a fault; the verdict must fail."),
        seed: int = typer.Option(0, "--seed"),
        thorough: bool = typer.Option(False, "--thorough", help="Isolation check both ways on every row."),
        certificate: str | None = typer.Option(None, "--certificate", help="Write the JSON certificate here."),
        no_manifest_ok: bool = typer.Option(False, "--no-manifest-ok", help="Read a folder without manifest.json."),
        as_json: bool = typer.Option(False, "--json", help="Print the certificate as JSON."),
    ) -> None:
        """Check with a tiny float64 model of the family that packed = unpacked: per-sample loss, gradients, no
        attention across samples, no loss on padding, positions, in-batch packing, CP ranks and PP stages.

        Prints a one-line verdict; exit status 1 names the failing row, sample and rank.
        """
        from longpack.jobs.verify import VerifyConfig

        result = VerifyConfig(
            packed=packed,
            model=model,
            split=split,
            backend=backend,
            time_budget=None if time_budget == 0 else time_budget,
            max_rows=max_rows,
            cp=tuple(cp) if cp else (2, 4),
            pp=tuple(pp) if pp else (2,),
            dist_rows=dist_rows,
            fault=fault,
            seed=seed,
            certificate=certificate,
            allow_no_manifest=no_manifest_ok,
            thorough=thorough,
        ).run()
        if as_json:
            typer.echo(json.dumps(result.certificate, indent=2))
        else:
            typer.echo(result.verdict)
            for note in result.notes:
                typer.echo(f"  note: {note}")
            for failure in result.failures[1:10]:
                sample = "" if failure.get("sample") is None else f" sample {failure['sample']}"
                typer.echo(
                    f"  {failure['check']}: {failure['split']} {failure['file']} row {failure['row']}{sample} "
                    f"({failure['rank']}): {failure['detail']}"
                )
        if not result.ok:
            raise typer.Exit(result.exit_code)
