"""``longpack verify`` CPU time: 100 rows of 8K tokens (the issue's target: <= 60 s on a 2-core machine).

Run from the repository root:

    PYTHONPATH=src python benchmarks/verify.py              # 100 rows, 3 repeats
    PYTHONPATH=src python benchmarks/verify.py --rows 20 --repeats 1

Data: the built-in demo (12,000 SFT samples, qwen3 tokenizer) packed at 8,192 tokens (``longpack pack --demo
--pack-size 8192 --seq-length 4096``). Model: a tiny Qwen3 from ``tests/data/hf_configs/qwen3_8b.json``
(float64, full 151,936-token vocabulary). Timed: ``VerifyConfig(..., max_rows=R, time_budget=None, cp=(),
pp=())`` (every single-process check of R rows; CP/PP are timed separately, one process start each), on
``longpack.runtime.verify.THREADS`` intra-op threads, and the same with torch's default thread count on
``--compare-rows`` rows (default 10).
Baseline in the same process: one packed forward + backward of the same rows (what one training step of the
tiny model costs, one thread), so the ratio says what the checks cost on top of it. Medians of ``--repeats``.

``--families R``: instead, CPU seconds per 8K row of every single-process check for each family of
:data:`FAMILIES` side by side on the same first R rows (attention-only Qwen3 beside the MoE Qwen3-30B-A3B and
the hybrid Qwen3-Next: Gated DeltaNet + gated attention, MoE router statistics, MTP):

    PYTHONPATH=src python benchmarks/verify.py --families 3 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "hf_configs" / "qwen3_8b.json"


#: Families of ``--families``: label -> ``--model``.
FAMILIES = {
    "qwen3 (attention only)": str(CONFIG),
    "qwen3_moe (qwen3_30b_a3b: + router statistics)": "qwen3_30b_a3b",
    "qwen3_next (qwen3_next_80b_a3b: GDN + attention, MoE, MTP)": "qwen3_next_80b_a3b",
    "nemotron_h (Nemotron-H-shaped test config: Mamba-2 + attention, MoE)": str(
        ROOT / "tests" / "data" / "hf_configs" / "nemotron_h_shaped.json"
    ),
}


def families(folder: Path, rows: int, repeats: int) -> None:
    """Print CPU seconds per row of each family of :data:`FAMILIES` on the same rows (medians of ``repeats``)."""
    from longpack.jobs.verify import VerifyConfig

    cpu: dict[str, list[float]] = {name: [] for name in FAMILIES}
    checked: dict[str, tuple[int, int]] = {}
    for _ in range(repeats):
        for name, model in FAMILIES.items():
            began = time.process_time()
            result = VerifyConfig(
                packed=folder,
                model=model,
                split="training",
                max_rows=rows,
                time_budget=None,
                cp=(),
                pp=(),
                in_batch_rows=rows,
            ).run()
            cpu[name].append(time.process_time() - began)
            assert result.ok, result.verdict
            checked[name] = (len(result.rows), sum(r.tokens for r in result.rows))
    first = statistics.median(cpu[next(iter(FAMILIES))]) / checked[next(iter(FAMILIES))][0]
    width = max(len(name) for name in FAMILIES) + 2
    print(f"{'family':<{width}}{'rows':>5}{'tokens':>8}{'CPU s/row':>11}{'x qwen3':>9}   runs (CPU s)")
    for name in FAMILIES:
        count, tokens = checked[name]
        per_row = statistics.median(cpu[name]) / count
        runs = [round(t, 1) for t in cpu[name]]
        print(f"{name:<{width}}{count:>5}{tokens:>8}{per_row:>11.2f}{per_row / first:>9.1f}   {runs}")


def baseline(folder: Path, rows: int) -> float:
    """CPU seconds for one packed forward + backward (THD attention) of the same rows, no reference, no checks."""
    from longpack.jobs.verify import load_hf_config
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset
    from longpack.runtime.verify import RowVerifier, batch_layout, run_thd, token_losses
    from longpack.runtime.verify_model import attention_plan, build_model

    model = build_model(load_hf_config(str(CONFIG)))
    ds = PackedDataset(folder, split="training")
    collate = PackedCollator.for_data(ds)
    verifier = RowVerifier(model, collate=collate)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    began = time.process_time()
    for i in range(rows):
        batch = collate([ds[i]])
        width = batch["tokens"].size(1)
        embeds = verifier.embed(batch["tokens"]).detach().requires_grad_(True)
        hidden = run_thd(model, embeds, batch["position_ids"][0], attention_plan(batch_layout(batch, width)))
        loss = token_losses(hidden, batch["labels"][0], batch["loss_mask"][0], verifier.head).sum()
        torch.autograd.grad(loss, [embeds, *verifier.params], allow_unused=True)
    spent = time.process_time() - began
    torch.set_num_threads(threads)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compare-rows",
        type=int,
        default=10,
        help="rows of the run on torch's default thread count (slow on a busy machine)",
    )
    parser.add_argument(
        "--families", type=int, default=0, help="only the per-family table, on this many rows (see above)"
    )
    args = parser.parse_args()
    from longpack.jobs import PackConfig
    from longpack.jobs.verify import VerifyConfig

    with tempfile.TemporaryDirectory(prefix="longpack-verify-bench-") as tmp:
        out = Path(tmp) / "demo8k"
        PackConfig(demo=True, out=out, pack_size=8192, seq_length=4096).run()
        if args.families:
            families(out, args.families, args.repeats)
            return
        import longpack.runtime.verify as verify_module

        default_threads = torch.get_num_threads()
        one = verify_module.THREADS
        runs: dict[str, tuple[list[float], list[float]]] = {"one": ([], []), "default": ([], [])}
        bases: list[float] = []
        result = kept = None
        for _ in range(args.repeats):
            for name, threads, count in (
                ("one", one, args.rows),
                ("default", default_threads, args.compare_rows),
            ):
                verify_module.THREADS = threads
                began, cpu = time.perf_counter(), time.process_time()
                result = VerifyConfig(
                    packed=out,
                    model=str(CONFIG),
                    split="training",
                    max_rows=count,
                    time_budget=None,
                    cp=(),
                    pp=(),
                ).run()
                if name == "one":
                    kept = result
                runs[name][0].append(time.perf_counter() - began)
                runs[name][1].append(time.process_time() - cpu)
                assert result.ok, result.verdict
            verify_module.THREADS = one
            bases.append(baseline(out, args.rows))
        assert kept is not None
        rows = len(kept.rows)
        tokens = sum(r.tokens for r in kept.rows)
        samples = sum(r.samples for r in kept.rows)
        print(
            f"rows {rows}, {tokens} runtime tokens, {samples} samples; torch default threads {default_threads}"
        )
        print(f"{'what':<52}{'median s':>10}{'per row':>9}   runs")
        base_s = statistics.median(bases)
        for name, label, count in (
            ("one", f"{one} thread, {rows} rows", rows),
            ("default", f"{default_threads} threads, {args.compare_rows} rows", args.compare_rows),
        ):
            wall, cpu = (statistics.median(x) for x in runs[name])
            walls = [round(t, 1) for t in runs[name][0]]
            cpus_ = [round(t, 1) for t in runs[name][1]]
            print(f"{'verify, ' + label + ', wall':<52}{wall:>10.1f}{wall / count:>9.2f}   {walls}")
            print(f"{'verify, ' + label + ', CPU':<52}{cpu:>10.1f}{cpu / count:>9.2f}   {cpus_}")
        print(
            f"{'baseline: packed fwd+bwd only, 1 thread, CPU':<52}{base_s:>10.1f}{base_s / rows:>9.2f}   {[round(t, 1) for t in bases]}"
        )
        wall1, cpu1 = (statistics.median(x) for x in runs["one"])
        cpu2 = statistics.median(runs["default"][1])
        print(
            f"ratio verify / baseline (CPU): {cpu1 / base_s:.2f}; default threads / {one} thread (CPU per row): "
            f"{cpu2 / args.compare_rows / (cpu1 / rows):.2f}"
        )
        print(
            f"target: {args.rows} rows of 8K in <= 60 s: wall {'met' if wall1 <= 60 else 'MISSED'} ({wall1:.1f} s), "
            f"CPU {'met' if cpu1 <= 60 else 'MISSED'} ({cpu1:.1f} s)"
        )


if __name__ == "__main__":
    main()
