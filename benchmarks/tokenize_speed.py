"""Tokenization throughput: ``tokenize_inputs`` vs the tokenizer's own batch encode, on the same text.

(Not named ``tokenize.py``: a script of that name shadows the standard library's ``tokenize`` module.)

The data is the built-in demo set (real text from the standard library), repeated to make a few tens of MB.
The reference is tiktoken's threaded ``encode_batch`` (what ``qwen3`` wraps) over exactly the strings
``tokenize_inputs`` must encode: prompt and completion texts, and rendered chat templates. It does no file
reading, no JSON parsing and no loss masks. A bare single-thread ``encode`` loop divided by the worker count is
printed too: the ideal that no parallel pipeline reaches. ``tokenize_inputs`` is timed end to end
(read, parse, tokenize, masks, flat buffers, process pool start-up). Target (issue 3): within 20 % on 2 cores.

    PYTHONPATH=src python benchmarks/tokenize_speed.py [--repeat 4] [--workers 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from longpack.text import TextConfig, load_tokenizer, tokenize_inputs, write_demo_dataset
from longpack.text.rows import chat_messages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=4, help="copies of the 12,000-record demo set")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    tok = load_tokenizer("qwen3")
    with tempfile.TemporaryDirectory() as tmp:
        demo = write_demo_dataset(Path(tmp) / "demo", n=12000, seed=0)
        data = Path(tmp) / "data"
        data.mkdir()
        for name in ("chat.jsonl", "prompt_completion.jsonl"):
            text = (demo / name).read_text()
            (data / name).write_text(text * args.repeat)
        # The strings tokenize_inputs has to encode, prepared outside the timing.
        texts: list[str] = []
        for line in (data / "prompt_completion.jsonl").read_text().splitlines():
            row = json.loads(line)
            texts += [row["prompt"].strip(" "), row["completion"].strip(" ")]
        for line in (data / "chat.jsonl").read_text().splitlines():
            pieces = tok.render_chat(chat_messages(json.loads(line), "chat", TextConfig()))
            texts.append("".join(t for t, _ in pieces))
        mb = sum((data / n).stat().st_size for n in ("chat.jsonl", "prompt_completion.jsonl")) / 1e6

        ref_times, ours_times, loop_times, loop_cpu, ours1_cpu = [], [], [], [], []
        n_tokens = 0
        for _ in range(args.runs):
            t0 = time.perf_counter()
            out = tok.encode_batch(texts, num_threads=args.workers)  # type: ignore[attr-defined]
            ref_times.append(time.perf_counter() - t0)
            n_ref = sum(map(len, out))
            t0, c0 = time.perf_counter(), time.process_time()
            for t in texts:
                tok.encode(t)
            loop_times.append(time.perf_counter() - t0)
            loop_cpu.append(time.process_time() - c0)
            c0 = time.process_time()  # one worker runs inline: its CPU time is this process's
            tokenize_inputs([str(data)], tokenizer="qwen3", config=TextConfig(), workers=1)
            ours1_cpu.append(time.process_time() - c0)
            t0 = time.perf_counter()
            res = tokenize_inputs([str(data)], tokenizer="qwen3", config=TextConfig(), workers=args.workers)
            ours_times.append(time.perf_counter() - t0)
            n_tokens = len(res.samples.tokens)
        ref, ours = statistics.median(ref_times), statistics.median(ours_times)
        ideal = statistics.median(loop_times) / args.workers  # perfect scaling of a bare encode loop
        rows = len(res.samples)
        print(
            f"data: {rows} rows, {mb:.1f} MB JSONL, {n_tokens / 1e6:.2f} M tokens ({n_ref / 1e6:.2f} M in the reference)"
        )
        print(f"{'method':<44} {'median s':>9} {'M tok/s':>8} {'ratio':>6}")
        print(
            f"{'tiktoken encode_batch (' + str(args.workers) + ' threads, strings in memory)':<44} {ref:9.2f} {n_ref / ref / 1e6:8.2f} {1.0:6.2f}"
        )
        print(
            f"{'tokenize_inputs (' + str(args.workers) + ' workers, files -> buffers)':<44} {ours:9.2f} {n_tokens / ours / 1e6:8.2f} {ours / ref:6.2f}"
        )
        print(
            f"{'bare encode loop, 1 thread, / ' + str(args.workers) + ' (ideal scaling)':<44} {ideal:9.2f} "
            f"{n_ref / ideal / 1e6:8.2f} {ideal / ref:6.2f}"
        )
        lc, oc = statistics.median(loop_cpu), statistics.median(ours1_cpu)
        print(f"CPU seconds, one process (robust on a loaded machine): bare encode loop {lc:.2f}, ")
        print(
            f"  tokenize_inputs(workers=1) {oc:.2f} -> overhead x{oc / lc:.2f} (reading, JSON, chat template, masks)"
        )
        print(f"runs: ref {[round(t, 2) for t in ref_times]}, ours {[round(t, 2) for t in ours_times]}")


if __name__ == "__main__":
    main()
