"""The ``.npy`` packed format of released Megatron-Bridge (<= 0.3.x) and NeMo 2: save and a safe load.

A file is ``np.save`` of a list of row dicts ``{"input_ids": [...], "loss_mask": [...], "seq_start_id":
[...]}`` of Python ints: a pickled 1-D object array (Bridge 0.3.1 ``GPTSFTPackedDataset._load_dataset``:
``np.load(path, allow_pickle=True)``; Bridge main still reads it, through a restricted unpickler, with a
``DeprecationWarning``). The rows carry exactly the Parquet format's columns and meaning: ``loss_mask`` is
label-aligned, ``seq_start_id`` holds each sample's stored start.

Loading never runs ``np.load(allow_pickle=True)`` on a file: :func:`load_rows` unpickles with an allow list
(numpy's array reconstruction and plain containers), so a crafted file cannot run code.

>>> import tempfile
>>> p = Path(tempfile.mkdtemp()) / "training_8.npy"
>>> save_rows(p, [{"input_ids": [5, 6, 2], "loss_mask": [1, 0, 0], "seq_start_id": [0]}])
>>> load_rows(p)[0]["input_ids"]
[5, 6, 2]
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longpack.errors import DamagedDataError, PackedDataError
from longpack.outputs import ArrayWriter

__all__ = ["load_rows", "save_rows"]

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("builtins", "list"),
    ("builtins", "dict"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}: not part of a packed .npy file")


def save_rows(path: str | Path, rows: Sequence[dict[str, list[int]]]) -> None:
    """``np.save`` of the rows as a 1-D object array (what Bridge's prepare step writes for ``.npy``)."""
    array = np.empty(len(rows), dtype=object)
    array[:] = list(rows)
    with open(path, "wb") as fh:
        np.save(ArrayWriter(fh), array, allow_pickle=True)  # fh.write: a full disk keeps its errno


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """The row dicts of a packed ``.npy`` file, unpickled with an allow list; a :class:`PackedDataError` for
    anything that is not a 1-D object array of dicts with the three lists."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise PackedDataError(f"{p}: unsupported .npy format version {version}")
            if dtype != np.dtype(object) or len(shape) != 1:
                raise PackedDataError(
                    f"{p}: a packed .npy holds a 1-D object array of row dicts, got dtype {dtype} shape {shape}"
                )
            array = _RestrictedUnpickler(io.BufferedReader(fh)).load()
    except FileNotFoundError as exc:
        raise PackedDataError(f"{p}: no such file") from exc
    except PackedDataError:
        raise
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, AttributeError, TypeError) as exc:
        raise DamagedDataError(
            f"{p}: cannot read as a packed .npy file ({' '.join(str(exc).split())}); the file is damaged or "
            "incompletely copied: copy it again, or pack again"
        ) from exc
    rows = array.tolist() if isinstance(array, np.ndarray) else array
    if not isinstance(rows, list):
        raise PackedDataError(f"{p}: expected an array of row dicts, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), list) for k in ("input_ids", "loss_mask", "seq_start_id")
        ):
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise PackedDataError(
                f"{p}: row {i} must be a dict with list values 'input_ids', 'loss_mask', 'seq_start_id' (got {got})"
            )
    return rows
