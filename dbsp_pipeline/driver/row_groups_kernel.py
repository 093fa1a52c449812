"""Rows grouped by a 64-bit hash, and weights summed per group, compiled (numba): the loops of
``driver/row_groups.py``.

Compiled at first use and cached beside this file (``cache=True``), as ``hashing_kernel.py``.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def group_by_hash(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows numbered by their hash, in order of first occurrence: ``(group, firsts)`` where
    ``group[i]`` is the number of row i's hash (0, 1, ... as hashes first appear) and
    ``firsts[g]`` the first row of hash number g. One pass, an open-addressing table of at
    least twice as many slots as rows (``hashes`` are XXH64 outputs: their low bits are
    uniform, and pick the slot)."""
    n = len(hashes)
    capacity = 16
    while capacity < 2 * n:
        capacity *= 2
    mask = np.uint64(capacity - 1)
    slots = np.full(capacity, -1, dtype=np.int64)
    group = np.empty(n, dtype=np.int64)
    firsts = np.empty(n, dtype=np.int64)
    groups = 0
    for i in range(n):
        h = hashes[i]
        s = h & mask
        while True:
            g = slots[s]
            if g < 0:
                slots[s] = groups
                firsts[groups] = i
                group[i] = groups
                groups += 1
                break
            if hashes[firsts[g]] == h:
                group[i] = g
                break
            s = (s + np.uint64(1)) & mask
    return group, firsts[:groups]


@numba.njit(cache=True, nogil=True)
def sum_by_group(group: np.ndarray, weights: np.ndarray, groups: int
                 ) -> tuple[np.ndarray, bool]:
    """Per group, the sum of its rows' ``weights`` (int64), and whether every partial sum stayed
    in int64 (False: a sum wrapped around, the sums are not to be used)."""
    sums = np.zeros(groups, dtype=np.int64)
    for i in range(len(group)):
        g = group[i]
        a = sums[g]
        b = weights[i]
        s = a + b
        if ((a ^ s) & (b ^ s)) < 0:  # both operands' sign differs from the sum's: wrapped
            return sums, False
        sums[g] = s
    return sums, True


@numba.njit(cache=True, nogil=True)
def bytes_equal(offsets: np.ndarray, data: np.ndarray, a: np.ndarray, b: np.ndarray
                ) -> np.ndarray:
    """Per pair, whether values ``a[i]`` and ``b[i]`` of a string or binary column (value j is
    ``data[offsets[j]:offsets[j + 1]]``) are the same bytes."""
    out = np.empty(len(a), dtype=np.bool_)
    for i in range(len(a)):
        x, y = a[i], b[i]
        start_x, start_y = offsets[x], offsets[y]
        length = offsets[x + 1] - start_x
        same = length == offsets[y + 1] - start_y
        k = 0
        while same and k < length:
            same = data[start_x + k] == data[start_y + k]
            k += 1
        out[i] = same
    return out


@numba.njit(cache=True, nogil=True)
def best_by_group(group: np.ndarray, values: np.ndarray, weights: np.ndarray, groups: int,
                  smallest: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the row of its best value among the rows of positive weight, and among the
    rows of negative weight (best: the smallest, or the largest; the first such row; -1 for
    none). ``values`` are integers or floats without NaN."""
    inserted = np.full(groups, -1, dtype=np.int64)
    deleted = np.full(groups, -1, dtype=np.int64)
    for i in range(len(group)):
        w = weights[i]
        if w == 0:
            continue
        best = inserted if w > 0 else deleted
        g = group[i]
        j = best[g]
        if j < 0 or (values[i] < values[j] if smallest else values[i] > values[j]):
            best[g] = i
    return inserted, deleted
