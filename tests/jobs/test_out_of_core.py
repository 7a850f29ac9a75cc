"""Out-of-core packing (``memory_budget``): tokens spilled to a scratch folder and packed in a second pass
give byte-identical output files to the in-memory run, for every input path and split option; the scratch
folder is gone afterwards; pages of the spill are handed back while writing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.errors import ConfigError
from longpack.jobs import PackConfig
from longpack.jobs import out_of_core as ooc


def _inputs(tmp_path: Path) -> dict[str, list[str]]:
    rng = np.random.default_rng(0)
    text = tmp_path / "text.jsonl"
    text.write_text(
        "".join(
            json.dumps(
                {"prompt": "q" * int(rng.integers(1, 40)), "completion": "a" * int(rng.integers(1, 90))}
            )
            + "\n"
            for _ in range(300)
        )
    )
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": "hi " * k}, {"role": "assistant", "content": "yo"}]}
            )
            + "\n"
            for k in range(1, 120)
        )
    )
    pre = tmp_path / "pre.jsonl"
    rows = [{"input_ids": rng.integers(0, 259, int(rng.integers(2, 70))).tolist()} for _ in range(400)]
    pre.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "pre.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    return {"text": [str(text), str(chat)], "pretokenized": [str(pre)], "parquet": [str(parquet)]}


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


CASES = {
    "text, worker processes": dict(inputs="text", workers=2),
    "text, validation fraction": dict(inputs="text", workers=1, val_fraction=0.2),
    "pre-tokenized JSON Lines, scanner": dict(inputs="pretokenized", workers=2),
    "parquet, first_fit_shuffle": dict(inputs="parquet", algorithm="first_fit_shuffle"),
    "validation inputs": dict(inputs="text", val_inputs="pretokenized"),
    "mix": dict(mix=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("budget", [1, 6000])  # everything spilled / spilled part way through
def test_out_of_core_output_is_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, budget: int
) -> None:
    spec: dict[str, Any] = dict(CASES[case])
    if spec.get("workers") == 2:  # chunks small enough that the worker processes really run
        monkeypatch.setattr("longpack.text.inputs.JSONL_CHUNK_BYTES", 4096)
        monkeypatch.setattr("longpack.text.pipeline.INLINE_BYTES", 0)
    data = _inputs(tmp_path)
    kwargs: dict[str, Any] = dict(tokenizer="bytes", seq_length=256, overwrite=True)
    if spec.pop("mix", False):
        kwargs["mix"] = [f"{data['text'][0]}=0.6", f"{data['pretokenized'][0]}=0.4"]
    else:
        kwargs["inputs"] = data[spec.pop("inputs")]
    if "val_inputs" in spec:
        kwargs["val_inputs"] = data[spec.pop("val_inputs")]
    kwargs.update(spec)
    out = tmp_path / "out"
    in_memory = PackConfig(out=out, **kwargs).run()
    assert in_memory.backend is None  # everything fit
    expected = _files(out)
    two_pass = PackConfig(out=out, memory_budget=budget, **kwargs).run()
    assert two_pass.backend is not None and two_pass.backend["out_of_core"]["spilled_tokens"] > 0
    assert _files(out) == expected
    assert not [p for p in tmp_path.iterdir() if ".spill-" in p.name]  # the scratch folder is removed


def test_spilled_pages_are_handed_back_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[ooc.PageTrimmer] = []
    real = ooc.PageTrimmer

    def recording(*args: Any, **kwargs: Any) -> ooc.PageTrimmer:
        kwargs["every"] = 1  # after every row group
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ooc, "PageTrimmer", recording)
    data = _inputs(tmp_path)
    out = tmp_path / "out"
    cfg: dict[str, Any] = dict(
        inputs=data["pretokenized"], tokenizer="bytes", seq_length=128, row_group_size=8, overwrite=True
    )
    PackConfig(out=out, **cfg).run()
    expected = _files(out)
    PackConfig(out=out, memory_budget=1, **cfg).run()
    assert made and len(made[0].maps) == 2 and made[0].trims > 3
    assert _files(out) == expected  # the data read after each trim comes back from the page cache intact


def test_in_memory_buffers_are_never_trimmed() -> None:
    from longpack.text.pipeline import _plain_pages

    anonymous = _plain_pages(1000, np.int32)
    anonymous[:] = 7
    trimmer = ooc.PageTrimmer([anonymous, np.ones(10, np.uint8)], bytes_per_row=10**9)
    trimmer.rows(1)
    assert trimmer.maps == [] and int(anonymous.sum()) == 7000  # MADV_DONTNEED would have zeroed them


def test_scratch_folder_is_removed_when_the_job_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2, 3]}\n' * 50 + "not json\n")
    with pytest.raises(Exception, match=r"bad\.jsonl:51"):
        PackConfig(
            inputs=[str(bad)], out=tmp_path / "o", tokenizer="bytes", seq_length=64, memory_budget=1
        ).run()
    assert not [p for p in tmp_path.iterdir() if ".spill-" in p.name]


def test_memory_budget_settings() -> None:
    assert ooc.parse_memory_budget("1.5G") == 3 * 2**29 and ooc.parse_memory_budget("64KiB") == 65536
    for bad in ("0", "-1", "8X", True):
        with pytest.raises(ConfigError, match="memory_budget"):
            PackConfig(inputs=["a.jsonl"], out="o", tokenizer="bytes", seq_length=8, memory_budget=bad)
    with pytest.raises(ConfigError, match="local backend"):
        PackConfig(
            inputs=["a.jsonl"], out="o", tokenizer="bytes", seq_length=8, memory_budget="1G", backend="ray"
        )


def test_cli_memory_budget_says_it_packed_in_two_passes(tmp_path: Path) -> None:
    data = _inputs(tmp_path)
    args = ["pack", *data["pretokenized"], "--out", str(tmp_path / "o"), "--tokenizer", "bytes"]
    done = CliRunner().invoke(app, [*args, "--seq-length", "128", "--memory-budget", "1K"])
    assert done.exit_code == 0, done.output
    assert "two passes: " in done.output and "tokens went through the scratch folder" in done.output


def test_a_scratch_folder_that_cannot_be_written_is_an_output_error(tmp_path: Path) -> None:
    from longpack.errors import OutputError
    from longpack.text.pipeline import _TokenStore

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    store = _TokenStore(np.int32, None, budget=1, spill_dir=not_a_folder / "scratch")
    with pytest.raises(OutputError, match=r"scratch copy of the tokens .*--memory-budget"):
        store.extend(np.arange(4), np.ones(4, np.uint8))
