"""Fill packed rows (as Megatron-Bridge's ``fill_packing_strategy``), vectorized: flat token / mask /
start arrays plus per-row offsets.

A row is the concatenation of its samples' stored tokens. ``loss_mask`` is label-aligned: position ``j`` of
a sample is trained iff token ``j + 1`` is a supervised target, so the unshifted mask moves left by one and
every sample's last position gets 0. ``seq_start_id`` holds each sample's stored start offset in the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from longpack import choices
from longpack.choices import DEFAULT_IDS_DTYPE
from longpack.packed.align import AlignedSamples
from longpack.packed.plan import PackPlan

ARROW_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int64())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("seq_start_id", pa.list_(pa.int64())),
    ]
)


def arrow_schema(ids_dtype: str = DEFAULT_IDS_DTYPE) -> pa.Schema:
    """The packed-file schema with ``input_ids`` as ``list<ids_dtype>`` (``int64`` is :data:`ARROW_SCHEMA`).

    >>> str(arrow_schema("int32").field("input_ids").type)
    'list<item: int32>'
    """
    if ids_dtype == choices.INT64_IDS:
        return ARROW_SCHEMA
    return ARROW_SCHEMA.set(0, pa.field("input_ids", pa.list_(pa.from_numpy_dtype(np.dtype(ids_dtype)))))


@dataclass(frozen=True, kw_only=True)
class PackedRows:
    """Rows ``lo..hi`` of a plan as flat arrays.

    ``input_ids`` int64 (or int32, as asked) and ``loss_mask`` int8 share ``row_offsets`` (int64 ``[R+1]``); ``seq_start_id``
    int64 uses ``start_offsets`` (int64 ``[R+1]``).
    """

    input_ids: np.ndarray
    loss_mask: np.ndarray
    row_offsets: np.ndarray
    seq_start_id: np.ndarray
    start_offsets: np.ndarray

    def to_arrow(self) -> pa.Table:
        """The rows as a table with Megatron-Bridge's three columns and types."""

        def flat(values: np.ndarray, typ: pa.DataType) -> pa.Array:
            # Zero-copy views of the numpy buffers. Not pa.array(ndarray): that imports pandas (when it is
            # installed) to test for a Series, ~0.4 s of every short `longpack pack`.
            values = np.ascontiguousarray(values, dtype=typ.to_pandas_dtype())
            return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])

        def lists(offsets: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
            return pa.ListArray.from_arrays(
                flat(offsets.astype(np.int32), pa.int32()), flat(values, typ), type=pa.list_(typ)
            )

        ids_type = pa.from_numpy_dtype(self.input_ids.dtype)
        return pa.Table.from_arrays(
            [
                lists(self.row_offsets, self.input_ids, ids_type),
                lists(self.row_offsets, self.loss_mask, pa.int8()),
                lists(self.start_offsets, self.seq_start_id, pa.int64()),
            ],
            schema=arrow_schema(str(self.input_ids.dtype)),
        )


def fill_rows(
    aligned: AlignedSamples,
    plan: PackPlan,
    lo: int = 0,
    hi: int | None = None,
    *,
    compiled: bool = True,
    ids_dtype: str = DEFAULT_IDS_DTYPE,
) -> PackedRows:
    """Materialize rows ``lo:hi`` of ``plan`` (all rows by default); ``input_ids`` of type ``ids_dtype``.

    ``compiled=False`` uses the pure-numpy formulation (same output; the tests compare both).

    Two samples ``[5, 6, 2]`` (mask ``[0, 1, 1]``) and ``[7, 2]`` (mask ``[1, 1]``) in one row, EOS 2, ``m=2``:
    the second is padded to stored length 3 and each mask moves left by one.

    >>> from longpack.samples import TokenizedSamples
    >>> from longpack.packed.align import align_samples
    >>> s = TokenizedSamples(tokens=np.array([5, 6, 2, 7, 2], np.int32),
    ...     loss_mask=np.array([0, 1, 1, 1, 1], np.uint8), offsets=np.array([0, 3, 5]),
    ...     source_file=np.zeros(2, np.int32), source_row=np.array([1, 2]), files=("a",))
    >>> a = align_samples(s, max_seq_length=8, pad_seq_to_mult=2, eos_id=2)
    >>> rows = fill_rows(a, PackPlan(order=np.array([0, 1]), row_offsets=np.array([0, 2])))
    >>> rows.input_ids.tolist(), rows.loss_mask.tolist(), rows.seq_start_id.tolist()
    ([5, 6, 2, 7, 2, 2], [1, 1, 0, 1, 0, 0], [0, 3])
    """
    hi = plan.num_rows if hi is None else hi
    first, last = int(plan.row_offsets[lo]), int(plan.row_offsets[hi])
    items = plan.order[first:last]
    stored = aligned.stored[items]
    kept = aligned.kept[items]
    src_start = aligned.samples.offsets[aligned.index[items]]
    if aligned.start is not None:  # fragments of over-long samples start inside them
        src_start = src_start + aligned.start[items]
    item_ends = np.cumsum(stored)
    item_starts = item_ends - stored
    if compiled:
        from longpack.packed._kernels import fill_tokens_and_mask

        input_ids = np.empty(int(item_ends[-1]) if len(items) else 0, dtype=ids_dtype)
        rolled = np.empty(len(input_ids), dtype=np.int8)
        fill_tokens_and_mask(
            aligned.samples.tokens,
            aligned.samples.loss_mask,
            src_start,
            kept,
            stored,
            aligned.eos_id,
            input_ids,
            rolled,
        )
    else:
        input_ids, rolled = _fill_numpy(aligned, src_start, kept, stored, item_starts, item_ends)
        input_ids = input_ids.astype(ids_dtype, copy=False)

    # Row offsets (in tokens) and per-row sample starts.
    items_per_row = np.diff(plan.row_offsets[lo : hi + 1])
    row_ends_items = np.cumsum(items_per_row)
    row_offsets = np.zeros(hi - lo + 1, dtype=np.int64)
    nonempty = row_ends_items > 0
    row_offsets[1:][nonempty] = item_ends[row_ends_items[nonempty] - 1]
    row_of_item = np.repeat(np.arange(hi - lo), items_per_row)
    seq_start_id = item_starts - row_offsets[row_of_item]
    start_offsets = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(items_per_row, out=start_offsets[1:])
    return PackedRows(
        input_ids=input_ids,
        loss_mask=rolled,
        row_offsets=row_offsets,
        seq_start_id=seq_start_id.astype(np.int64),
        start_offsets=start_offsets,
    )


def _fill_numpy(
    aligned: AlignedSamples,
    src_start: np.ndarray,
    kept: np.ndarray,
    stored: np.ndarray,
    item_starts: np.ndarray,
    item_ends: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    total = int(stored.sum())
    # Position of every output token inside its sample, and the sample's source start.
    within = np.arange(total, dtype=np.int64) - np.repeat(item_starts, stored)
    is_pad = within >= np.repeat(kept, stored)
    src = np.repeat(src_start, stored) + within
    src[is_pad] = 0
    input_ids = aligned.samples.tokens[src].astype(np.int64)
    input_ids[is_pad] = aligned.eos_id
    mask = aligned.samples.loss_mask[src].astype(np.int8)
    mask[is_pad] = 0
    rolled = np.empty_like(mask)
    rolled[:-1] = mask[1:]
    if total:
        rolled[item_ends - 1] = 0
    return input_ids, rolled
