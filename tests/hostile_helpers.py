"""What the hostile tests (tests/hostile/) share: running a command with a deadline, the verdict on its
output, the accounting identity of a finished pack, and a corpus of hand-made bad files.

Every command must answer hostile input with exit code 0 (ok), 1 (it ran and found a problem) or 2 (the
input or a setting is wrong, with a message): never 3 (an internal error), never a Python traceback, never
a hang. Commands run in-process through typer's ``CliRunner`` (fast: no interpreter start-up); the few
cases that need a real process (a file-size limit, a signal) use :func:`run_subprocess`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from longpack.cli.app import app

#: Seconds one case may run before it counts as a hang (the hangs this suite guards against ran for
#: minutes; a loaded 2-core CI machine runs every case here in well under a second or two).
CASE_DEADLINE_S = 60
OK_CODES = frozenset({0, 1, 2})


def examples(n: int) -> int:
    """Hypothesis examples per case: ``n`` in CI; ``HOSTILE_SCALE=20`` runs twenty times as many (a longer
    campaign on a workstation)."""
    return max(1, round(n * float(os.environ.get("HOSTILE_SCALE", "1"))))


RUNNER = CliRunner()


class Hang(BaseException):
    """A case ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds: float = CASE_DEADLINE_S) -> Iterator[None]:
    """Raise :class:`Hang` in this (main) thread if the block runs longer than ``seconds``."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Outcome:
    argv: tuple[str, ...]
    exit_code: int
    output: str

    def __str__(self) -> str:
        return f"longpack {' '.join(self.argv)!r} -> exit {self.exit_code}:\n{self.output[-3000:]}"


def invoke(argv: Sequence[str], *, seconds: float = CASE_DEADLINE_S) -> Outcome:
    """Run ``longpack ARGV`` in-process (stdout and stderr together) under a deadline."""
    argv = tuple(str(a) for a in argv)
    try:
        with deadline(seconds):
            result = RUNNER.invoke(app, list(argv))
    except Hang as exc:
        raise Hang(f"longpack {' '.join(argv)!r}: {exc}") from None
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # an exception that escaped the CLI's own handling: a traceback in a real shell
        import traceback

        output += "\nTraceback (escaped the CLI):\n" + "".join(
            traceback.format_exception(
                type(result.exception), result.exception, result.exception.__traceback__
            )
        )
    return Outcome(argv, result.exit_code, output)


def assert_clean(outcome: Outcome, allowed: frozenset[int] = OK_CODES) -> Outcome:
    """Exit code 0, 1 or 2 (or as ``allowed``), no traceback, no internal-error report; an exit 2 says
    ``error: ...``."""
    assert outcome.exit_code in allowed, str(outcome)
    assert "Traceback" not in outcome.output, str(outcome)
    assert "internal error" not in outcome.output, str(outcome)
    if outcome.exit_code == 2:
        assert "error" in outcome.output.lower() or "usage" in outcome.output.lower(), str(outcome)
    return outcome


def run_subprocess(
    argv: Sequence[str], *, timeout: float = 2 * CASE_DEADLINE_S, preexec: Any = None, cwd: Path | None = None
) -> Outcome:
    """Run ``python -m longpack.cli.app ARGV`` in a fresh interpreter with this checkout's code."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "longpack.cli.app", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=preexec,
        cwd=cwd,
    )
    return Outcome(tuple(map(str, argv)), proc.returncode, proc.stdout + proc.stderr)


def assert_accounting(manifest: dict[str, Any]) -> None:
    """Every row read is packed whole, packed truncated, dropped or malformed: nothing vanishes."""
    c = manifest["counts"]
    kept = c["packed"] - c["truncated"]
    assert kept + c["truncated"] + c["dropped"] + c["malformed"] == c["rows_read"], c
    assert c["packed"] + c["dropped"] == c["samples_read"], c
    splits = manifest["splits"].values()
    assert sum(s["samples_packed"] for s in splits) == c["packed"], c
    for s in splits:  # listed entries never exceed the counts, and the listing says how many it holds
        for kind in ("truncated", "dropped"):
            assert len(s[kind]) == s[f"{kind}_listed"] <= s[f"{kind}_count"], s
            assert s[f"{kind}_listed"] + s[f"{kind}_unlisted"] == s[f"{kind}_count"], s
    assert len(manifest["malformed"]) == manifest["malformed_listed"]
    assert manifest["malformed_listed"] + manifest["malformed_unlisted"] == c["malformed"]
    inputs = [i for i in manifest["inputs"] if "packed" in i]  # per input file, where recorded
    for info in inputs:
        assert info["packed"] + info["dropped"] + info["malformed"] == info["rows"], info
    if inputs and len(inputs) == len(manifest["inputs"]) and "mix" not in manifest:
        for key, total in (("rows", "rows_read"), ("malformed", "malformed"), ("packed", "packed")):
            assert sum(i[key] for i in inputs) == c[total], (key, inputs, c)


# -- a corpus of hand-made bad input files ----------------------------------------------------------------


def good_jsonl(path: Path, rows: int = 40) -> Path:
    path.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "completion": "a" * (i % 50 + 1)}) + "\n" for i in range(rows))
    )
    return path


def bad_input_files(root: Path) -> dict[str, Path]:
    """Input files every reader must refuse (or count as malformed) with a message, by name."""
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {
        "empty.jsonl": b"",
        "blank_lines.jsonl": b"\n\n   \n",
        "not_json.jsonl": b"this is not json\n",
        "truncated_json.jsonl": b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", "compl',
        "array_rows.jsonl": b"[1, 2, 3]\n[4]\n",
        "wrong_types.jsonl": b'{"prompt": 5, "completion": ["x"]}\n{"prompt": null, "completion": {}}\n',
        "missing_key.jsonl": b'{"prompt": "a"}\n',
        "non_utf8.jsonl": b'{"prompt": "\xff\xfe", "completion": "b"}\n',
        "nul_bytes.jsonl": b'{"prompt": "a\x00", "completion": "b"}\n\x00\x00\x00\n',
        "huge_number.jsonl": b'{"input_ids": [' + b"9" * 400 + b"]}\n",
        "negative_ids.jsonl": b'{"input_ids": [-1, -2, 3]}\n',
        "float_ids.jsonl": b'{"input_ids": [1.5, 2.0]}\n',
        "bad_mask.jsonl": b'{"input_ids": [1, 2, 3], "loss_mask": [0, 1]}\n',
        "chat_bad_roles.jsonl": b'{"messages": [{"role": "wizard", "content": "x"}]}\n{"messages": "hi"}\n',
        "chat_empty.jsonl": b'{"messages": []}\n',
        "deep_nesting.jsonl": b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b', "completion": "x"}\n',
        "long_line.jsonl": b'{"prompt": "' + b"a" * 2_000_000 + b'", "completion": "b"}\n',
        "bom.jsonl": b'\xef\xbb\xbf{"prompt": "a", "completion": "b"}\n',
        "crlf.jsonl": b'{"prompt": "a", "completion": "b"}\r\n{"prompt": "c", "completion": "d"}\r\n',
        "garbage.parquet": b"PAR1" + os.urandom(200) + b"PAR1",
        "tiny.parquet": b"PAR1",
        "text_as.parquet": b'{"prompt": "a", "completion": "b"}\n',
        "bad.jsonl.gz": gzip.compress(b'{"prompt": "a", "completion": "b"}\n' * 50)[:40],
        "unknown.suffix": b'{"prompt": "a", "completion": "b"}\n',
    }
    out = {}
    for name, data in files.items():
        (root / name).write_bytes(data)
        out[name] = root / name
    return out


def bad_length_files(root: Path) -> dict[str, Path]:
    """Length lists (``balance``, ``online-sim --lengths``) that must be refused with the file named."""
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    texts = {
        "empty.txt": b"",
        "comments_only.txt": b"# nothing\n\n",
        "words.txt": b"1\n2\nthree\n",
        "floats.txt": b"1.5\n2\n",
        "zero.txt": b"5\n0\n",
        "negative.txt": b"5\n-3\n",
        "too_long.txt": b"5\n100000000\n",
        "huge.txt": b"9" * 30 + b"\n",
        "non_utf8.txt": b"\xff\xfe1\n",
        "nul.txt": b"1\x002\n",
    }
    out = {}
    for name, data in texts.items():
        (root / name).write_bytes(data)
        out[name] = root / name
    arrays = {
        "empty.npy": np.zeros(0, np.int64),
        "floats.npy": np.array([1.5, 2.0]),
        "matrix.npy": np.ones((2, 2), np.int64),
        "zeros.npy": np.zeros(3, np.int64),
    }
    for name, array in arrays.items():
        np.save(root / name, array)
        out[name] = root / name
    (root / "pickled.npy").write_bytes(b"\x93NUMPY garbage")
    out["pickled.npy"] = root / "pickled.npy"
    (root / "a_folder.txt").mkdir()
    out["a_folder.txt"] = root / "a_folder.txt"
    return out


def bad_config_files(root: Path) -> dict[str, Path]:
    """Config files (``check``) that must be refused or checked, never crash."""
    root.mkdir(parents=True, exist_ok=True)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    texts: dict[str, bytes] = {
        "empty.yaml": b"",
        "list.yaml": b"- 1\n- 2\n",
        "scalar.yaml": b"5\n",
        "bad_syntax.yaml": b"model: [1, 2\n",
        "non_utf8.yaml": b"model:\n  seq_length: 4096\n\xff\xfe\n",
        "alias_bomb.yaml": bomb.encode(),
        "recursive_alias.yaml": b"a: &a\n  b: *a\n",
        "deep.yaml": b"a: " + b"[" * 600 + b"]" * 600 + b"\n",
        "wrong_shapes.yaml": b"model:\n  context_parallel_size: {a: 1}\ntrain: 5\n",
        "zero_sizes.yaml": b"model:\n  tensor_model_parallel_size: 0\n  context_parallel_size: 0\n"
        b"  pipeline_model_parallel_size: 0\ntrain:\n  global_batch_size: 0\n  micro_batch_size: 0\n",
        "negative_sizes.yaml": b"model:\n  context_parallel_size: -4\n",
        "nan_sizes.yaml": b"model:\n  seq_length: .nan\n  context_parallel_size: .inf\n",
        "bool_sizes.yaml": b"model:\n  context_parallel_size: true\n",
        "huge_sizes.yaml": b"model:\n  context_parallel_size: 99999999999999999999999\n",
        "layout_bomb.yaml": b"model:\n  pipeline_model_parallel_size: 2\n  pipeline_model_parallel_layout: "
        b"'Et*99999999999|L'\n",
        "layout_nested.yaml": b"model:\n  pipeline_model_parallel_layout: '"
        + b"(" * 200
        + b"t"
        + b")*9" * 200
        + b"'\n",
        "python_tags.yaml": b"model:\n  params_dtype: !!python/name:torch.bfloat16 ''\n",
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "bad.json": b'{"model": ',
        "tabs.yaml": b"model:\n\tseq_length: 1\n",
    }
    out = {}
    for name, data in texts.items():
        (root / name).write_bytes(data)
        out[name] = root / name
    return out
