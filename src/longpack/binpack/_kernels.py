"""Compiled (numba) kernels behind ``longpack.binpack``.

Every kernel takes and returns flat numpy arrays; the Python wrappers in ``_pack.py`` and
``megatron.py`` validate inputs and shape results. These are the reference implementation and the fallback:
an installed longpack runs the same functions from the C extension ``_native.c`` (built with the wheel;
see ``_dispatch.py``). ``cache=True`` keeps compiled code on disk (``__pycache__``), so only the first call
on a machine pays the compile time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from longpack._optional import require

njit = require("numba", "pack", purpose="packing (longpack's compiled kernels)").njit
trailing_zeros = require("numba.cpython.unsafe.numbers", "pack").trailing_zeros

# ----------------------------------------------------------------------------------------------
# First fit (Megatron semantics): lowest-index open bin whose remaining capacity is >= the length.
# ----------------------------------------------------------------------------------------------


@njit(cache=True)
def first_fit_bins(seqlens: np.ndarray, pack_size: int, unopened: Any) -> tuple[np.ndarray, int]:
    """Bin of each item (in the given order) under first fit, and the number of bins.

    A 16-ary max tree over the remaining capacity of each bin (leaves in bin-opening order) finds the
    leftmost bin with room: log16(N) levels, each one cache line when the tree is int32 (the tree has
    one leaf per item, 4.3 B/item, so it never needs to grow). The tree's
    dtype is that of ``unopened``, the leaf value of bins not opened yet (the dtype's minimum: below the
    remaining capacity of any open bin, so a query never matches it).
    An item longer than ``pack_size`` opens a bin whose remaining capacity is negative: no later item,
    not even a zero-length one, goes there (the same as Megatron's linear scan).
    """
    n = seqlens.shape[0]
    bin_of = np.empty(n, dtype=np.int64)
    # level sizes (multiples of 16), leaves first; the last level is a single node of 16 entries
    sizes = np.empty(32, dtype=np.int64)
    nlev = 0
    size = max(n, 1)
    while True:
        padded = (size + 15) // 16 * 16
        sizes[nlev] = padded
        nlev += 1
        if padded == 16:
            break
        size = padded // 16
    offs = np.zeros(nlev + 1, dtype=np.int64)
    for lev in range(nlev):
        offs[lev + 1] = offs[lev] + sizes[lev]
    tree = np.full(offs[nlev], unopened)
    root = offs[nlev - 1]
    nbins = 0
    for k in range(n):
        need = seqlens[k]
        j = -1
        for c in range(16):
            if tree[root + c] >= need:
                j = c
                break
        if j >= 0:
            idx = j
            for lev in range(nlev - 2, -1, -1):
                base = offs[lev] + idx * 16
                c = 0
                while tree[base + c] < need:
                    c += 1
                idx = idx * 16 + c
            b = idx
            old = tree[b]
            tree[b] = old - need
            # a decrease changes a parent only if the old value was the parent's max
            i = b
            for lev in range(nlev - 1):
                p = i // 16
                pidx = offs[lev + 1] + p
                if tree[pidx] != old:
                    break
                base = offs[lev] + p * 16
                m = tree[base]
                for c in range(1, 16):
                    v = tree[base + c]
                    if v > m:
                        m = v
                if m == old:
                    break
                tree[pidx] = m
                i = p
        else:
            b = nbins
            nbins += 1
            new = pack_size - need
            tree[b] = new
            i = b
            for lev in range(nlev - 1):
                p = i // 16
                pidx = offs[lev + 1] + p
                if tree[pidx] >= new:
                    break
                tree[pidx] = new
                i = p
        bin_of[k] = b
    return bin_of, nbins


@njit(cache=True)
def group_by_bin(
    seqlens: np.ndarray, bin_of: np.ndarray, nbins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat lengths in bin order (within a bin: the order items were added), bin offsets [B+1], and
    the flat position of each input item."""
    n = seqlens.shape[0]
    offsets = np.zeros(nbins + 1, dtype=np.int64)
    for k in range(n):
        offsets[bin_of[k] + 1] += 1
    for b in range(nbins):
        offsets[b + 1] += offsets[b]
    fill = offsets[:-1].copy()
    flat = np.empty(n, dtype=np.int64)
    position = np.empty(n, dtype=np.int64)
    for k in range(n):
        b = bin_of[k]
        p = fill[b]
        fill[b] = p + 1
        flat[p] = seqlens[k]
        position[k] = p
    return flat, offsets, position


@njit(cache=True)
def assign_items_by_length(
    lengths: np.ndarray, flat: np.ndarray, offsets: np.ndarray, max_length: int
) -> np.ndarray:
    """Bin of each item, given a packing of lengths only (flat lengths in bin order + offsets).

    Rule: among items of equal length, the one with the lower index takes the earlier occurrence of that
    length in bin order (bin 0 first; inside a bin, left to right).
    """
    n = lengths.shape[0]
    nbins = offsets.shape[0] - 1
    start = np.zeros(max_length + 2, dtype=np.int64)
    for p in range(n):
        start[flat[p] + 1] += 1
    for v in range(max_length + 1):
        start[v + 1] += start[v]
    # bin of each occurrence, grouped by length (occurrences of one length in bin order)
    occ_bin = np.empty(n, dtype=np.int64)
    for b in range(nbins):
        for p in range(offsets[b], offsets[b + 1]):
            v = flat[p]
            occ_bin[start[v]] = b
            start[v] += 1
    # start[v] now points one past the occurrences of v; rewind to the first one
    for v in range(max_length, 0, -1):
        start[v] = start[v - 1]
    start[0] = 0
    bin_of_item = np.empty(n, dtype=np.int64)
    for i in range(n):
        v = lengths[i]
        bin_of_item[i] = occ_bin[start[v]]
        start[v] += 1
    return bin_of_item


@njit(cache=True)
def fill_items_by_length(
    lengths: np.ndarray, flat: np.ndarray, perms: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    """Item of every slot of ``flat`` (lengths in bin order), as Megatron-Bridge's fill step picks it.

    ``starts`` is the cumulative histogram of ``lengths`` ([V+1]); ``perms[starts[v]:starts[v+1]]`` is
    the permutation drawn for length ``v``. Items of a length in input order, permuted, are popped from
    the end: the ``k``-th slot of length ``v`` gets item ``group_v[perm_v[count_v - 1 - k]]``.
    """
    n = lengths.shape[0]
    nv = starts.shape[0] - 1
    by_length = np.empty(n, dtype=np.int64)
    cursor = starts[:-1].copy()
    for i in range(n):
        v = lengths[i]
        by_length[cursor[v]] = i
        cursor[v] += 1
    used = np.zeros(nv, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    for p in range(n):
        v = flat[p]
        k = used[v]
        used[v] = k + 1
        order[p] = by_length[starts[v] + perms[starts[v + 1] - 1 - k]]
    return order


# ----------------------------------------------------------------------------------------------
# Best fit decreasing: bins indexed by remaining capacity; a 64-ary bitset finds the tightest fit.
# ----------------------------------------------------------------------------------------------


@njit(cache=True)
def _bitset_levels(universe: int) -> np.ndarray:
    """Word offsets of each level of a 64-ary bitset over ``universe`` keys (level 0 = leaves)."""
    starts = [0]
    words = (universe + 63) >> 6
    total = 0
    while True:
        total += words
        starts.append(total)
        if words == 1:
            break
        words = (words + 63) >> 6
    return np.array(starts, dtype=np.int64)


@njit(cache=True)
def _bitset_set(bits: np.ndarray, levels: np.ndarray, key: int) -> None:
    nlev = levels.shape[0] - 1
    for lev in range(nlev):
        w = levels[lev] + (key >> 6)
        old = bits[w]
        bits[w] = old | (np.uint64(1) << np.uint64(key & 63))
        if old != 0:
            return
        key >>= 6


@njit(cache=True)
def _bitset_clear(bits: np.ndarray, levels: np.ndarray, key: int) -> None:
    nlev = levels.shape[0] - 1
    for lev in range(nlev):
        w = levels[lev] + (key >> 6)
        new = bits[w] & ~(np.uint64(1) << np.uint64(key & 63))
        bits[w] = new
        if new != 0:
            return
        key >>= 6


@njit(cache=True)
def _bitset_successor(bits: np.ndarray, levels: np.ndarray, key: int) -> int:
    """Smallest set key >= ``key``, or -1."""
    nlev = levels.shape[0] - 1
    lev = 0
    found = False
    while lev < nlev:
        w = key >> 6
        if w >= levels[lev + 1] - levels[lev]:
            return -1
        word = bits[levels[lev] + w] & (np.uint64(0xFFFFFFFFFFFFFFFF) << np.uint64(key & 63))
        if word != 0:
            key = (w << 6) + int(trailing_zeros(word))  # type: ignore[call-arg]
            found = True
            break
        key = w + 1
        lev += 1
    if not found:
        return -1
    while lev > 0:
        lev -= 1
        word = bits[levels[lev] + key]
        key = (key << 6) + int(trailing_zeros(word))  # type: ignore[call-arg]
    return key


@njit(cache=True)
def _push(
    head: np.ndarray, next_bin: np.ndarray, bits: np.ndarray, levels: np.ndarray, left: int, b: int
) -> None:
    top = head[left]
    next_bin[b] = top
    head[left] = b
    if top < 0:
        _bitset_set(bits, levels, left)


@njit(cache=True)
def best_fit_decreasing_bins(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """Bin of each item under best fit decreasing, and the number of bins (bins in opening order).

    Items are taken longest first (equal lengths in index order); each goes to the open bin with the
    least remaining capacity that still fits it, else to a new bin. Open bins with the same remaining
    capacity ``r`` sit on a stack ``head[r]``/``next_bin``; a 64-ary bitset over ``r`` finds the smallest
    ``r >= length`` in a few word operations. Lengths must lie in 1..capacity (checked by the caller).

    Items of one length move in groups, which gives exactly the item-by-item result: once the tightest
    room ``r`` for length ``L`` is known, (a) if ``r < 2L`` every bin on stack ``r`` takes one item and
    drops to ``r - L < L``, so the next items take the next bins of the stack with no new search; (b) if
    ``r >= 2L`` the bin keeps being the tightest fit, so it takes ``min(count, r // L)`` items at once;
    (c) with no room anywhere, each new bin takes ``capacity // L`` items.
    Memory: the result (8 B/item) plus 8 B per item for the processing-order buffer and 8 B per bin.
    """
    n = lengths.shape[0]
    count = np.zeros(capacity + 2, dtype=np.int64)
    for i in range(n):
        count[lengths[i]] += 1
    levels = _bitset_levels(capacity + 1)
    bits = np.zeros(levels[-1], dtype=np.uint64)
    head = np.full(capacity + 1, -1, dtype=np.int64)
    next_bin = np.empty(max(16, n // 8), dtype=np.int64)
    slot_bin = np.empty(n, dtype=np.int64)
    nbins = 0
    k = 0
    for length in range(capacity, 0, -1):
        c = count[length]
        while c > 0:
            r = _bitset_successor(bits, levels, length)
            if r < 0:
                per_bin = capacity // length
                while c > 0:
                    t = per_bin if per_bin < c else c
                    b = nbins
                    nbins += 1
                    if nbins > next_bin.shape[0]:
                        grown = np.empty(next_bin.shape[0] * 2, dtype=np.int64)
                        grown[: next_bin.shape[0]] = next_bin
                        next_bin = grown
                    for _ in range(t):
                        slot_bin[k] = b
                        k += 1
                    c -= t
                    left = capacity - t * length
                    if left > 0:
                        _push(head, next_bin, bits, levels, left, b)
            elif 2 * length > r:
                left = r - length
                b = head[r]
                if left > 0:
                    top = head[left]
                    was_empty = top < 0
                    while c > 0 and b >= 0:
                        nb = next_bin[b]
                        slot_bin[k] = b
                        k += 1
                        c -= 1
                        next_bin[b] = top
                        top = b
                        b = nb
                    head[left] = top
                    if was_empty:
                        _bitset_set(bits, levels, left)
                else:
                    while c > 0 and b >= 0:
                        slot_bin[k] = b
                        k += 1
                        c -= 1
                        b = next_bin[b]
                head[r] = b
                if b < 0:
                    _bitset_clear(bits, levels, r)
            else:
                b = head[r]
                nb = next_bin[b]
                head[r] = nb
                if nb < 0:
                    _bitset_clear(bits, levels, r)
                t = r // length
                if t > c:
                    t = c
                for _ in range(t):
                    slot_bin[k] = b
                    k += 1
                c -= t
                left = r - t * length
                if left > 0:
                    _push(head, next_bin, bits, levels, left, b)
    start = np.zeros(capacity + 2, dtype=np.int64)
    acc = 0
    for length in range(capacity, 0, -1):
        start[length] = acc
        acc += count[length]
    bin_of = np.empty(n, dtype=np.int64)
    for i in range(n):
        v = lengths[i]
        s = start[v]
        bin_of[i] = slot_bin[s]
        start[v] = s + 1
    return bin_of, nbins


@njit(cache=True)
def relabel_in_place(bin_of: np.ndarray, new_id: np.ndarray) -> None:
    """``bin_of[i] = new_id[bin_of[i]]`` without a temporary array."""
    for i in range(bin_of.shape[0]):
        bin_of[i] = new_id[bin_of[i]]


@njit(cache=True)
def count_invalid(lengths: np.ndarray, low: int, high: int) -> tuple[int, int]:
    """Number of items outside ``low..high`` and the index of the first (-1 if none)."""
    bad = 0
    first = -1
    for i in range(lengths.shape[0]):
        v = lengths[i]
        if v < low or v > high:
            if first < 0:
                first = i
            bad += 1
    return bad, first


# ----------------------------------------------------------------------------------------------
# The balanced packer's fill (longpack.balance.packer.cost_balanced_bins).
# ----------------------------------------------------------------------------------------------


@njit(cache=True)
def lowest_cost_fit(
    order: np.ndarray, lengths: np.ndarray, item_cost: np.ndarray, capacity: int, initial_bins: int
) -> tuple[np.ndarray, int]:
    """The balanced packer's first stage (``longpack.balance.packer``): each item (in ``order``) into the
    open bin of lowest cost with room; a new bin if none has."""
    n = order.shape[0]
    max_bins = initial_bins + n
    room = np.full(max_bins, capacity, dtype=np.int64)
    cost = np.zeros(max_bins, dtype=np.float64)
    out = np.empty(lengths.shape[0], dtype=np.int64)
    nbins = initial_bins
    for t in range(n):
        i = order[t]
        length = lengths[i]
        best = -1
        best_cost = np.inf
        for b in range(nbins):
            if room[b] >= length and cost[b] < best_cost:
                best_cost = cost[b]
                best = b
        if best < 0:
            best = nbins
            nbins += 1
        room[best] -= length
        cost[best] += item_cost[i]
        out[i] = best
    return out, nbins
