"""Round four of hostile input (issue 40): one test per class that did not hold.

The silent-wrong classes first: scratch files of an out-of-core pack that a second scratch file truncated
while mapped (SIGBUS in the row fill), and a token store whose arrays were trusted blindly.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

PACK = ["--tokenizer", "bytes", "--seq-length", "64"]


# -- out-of-core scratch files: never truncated while mapped, never mapped short ---------------------------


def test_a_second_spill_never_truncates_a_mapped_one(tmp_path: Path) -> None:
    """Each tokenize call of a pack (training inputs, then validation inputs) spills to its own files. Their
    names came from ``id()`` of a freed object, so the second call's ``open(..., "wb")`` truncated the files
    the first call's memory maps still read: SIGBUS in ``fill_tokens_and_mask`` (or rows silently holding
    the other split's tokens)."""
    from longpack.text.pipeline import _TokenStore

    maps = []
    for value in range(40):
        store = _TokenStore(np.int32, None, budget=1, spill_dir=tmp_path)
        store.extend(np.full(100 + value, value, np.int32), np.ones(100 + value, np.uint8))
        maps.append(store.finish())
        del store
        gc.collect()  # frees the store: its id() is free for the next one
    for value, (tokens, _mask) in enumerate(maps):
        assert len(tokens) == 100 + value and (np.asarray(tokens) == value).all(), value
    assert len(list(tmp_path.iterdir())) == 2 * len(maps)


def test_a_short_scratch_file_is_refused_not_mapped(tmp_path: Path) -> None:
    from longpack.errors import OutputError
    from longpack.outputs import map_scratch, new_scratch_file

    path, fh = new_scratch_file(tmp_path, "tokens")
    np.arange(10, dtype=np.int32).tofile(fh)
    fh.close()
    with pytest.raises(OutputError, match="holds 40 bytes where 44 were written"):
        map_scratch(path, np.int32, 11)
    assert map_scratch(path, np.int32, 10).tolist() == list(range(10))
