"""XXH64 with one seed per row, compiled (numba): the arithmetic of ``driver/hashing.py``.

Spark's ``xxhash64`` updates a running hash per row with each column's value (``hashInt``,
``hashLong``, ``hashUnsafeBytes``: standard XXH64 of the value's 4 or 8 little-endian bytes, or of
its bytes, seeded with the running hash). These functions compute those updates over whole
columns in one pass, in uint64 arithmetic that wraps modulo 2**64 as XXH64's does; a row not
``valid`` (NULL) keeps its running hash. ``tests/driver/test_hashing.py`` checks the results
against Spark itself and against the ``xxhash`` library.

Compiled at first use and cached beside this file (``cache=True``), as ``exact_sum_kernel.py``.
"""

from __future__ import annotations

import numba
import numpy as np

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@numba.njit(cache=True, nogil=True, inline="always")
def _avalanche(h: np.uint64) -> np.uint64:
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


@numba.njit(cache=True, nogil=True, inline="always")
def _round(acc: np.uint64, lane: np.uint64) -> np.uint64:
    acc += lane * _P2
    return _rotl(acc, 31) * _P1


@numba.njit(cache=True, nogil=True, inline="always")
def _merge_round(acc: np.uint64, lane: np.uint64) -> np.uint64:
    acc ^= _round(np.uint64(0), lane)
    return acc * _P1 + _P4


@numba.njit(cache=True, nogil=True)
def hash_ints(values: np.ndarray, seeds: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row, XXH64 of the 4 little-endian bytes of ``values[i]`` (a uint32 bit pattern held
    in a uint64) seeded with ``seeds[i]``; ``seeds[i]`` itself where not ``valid[i]``."""
    out = np.empty(len(seeds), dtype=np.uint64)
    for i in range(len(seeds)):
        if not valid[i]:
            out[i] = seeds[i]
            continue
        h = seeds[i] + _P5 + np.uint64(4)
        h ^= values[i] * _P1
        h = _rotl(h, 23) * _P2 + _P3
        out[i] = _avalanche(h)
    return out


@numba.njit(cache=True, nogil=True)
def hash_longs(values: np.ndarray, seeds: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row, XXH64 of the 8 little-endian bytes of ``values[i]`` (a uint64 bit pattern)
    seeded with ``seeds[i]``; ``seeds[i]`` itself where not ``valid[i]``."""
    out = np.empty(len(seeds), dtype=np.uint64)
    for i in range(len(seeds)):
        if not valid[i]:
            out[i] = seeds[i]
            continue
        h = seeds[i] + _P5 + np.uint64(8)
        h ^= _round(np.uint64(0), values[i])
        h = _rotl(h, 27) * _P1 + _P4
        out[i] = _avalanche(h)
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _read(data: np.ndarray, at: int, width: int) -> np.uint64:
    """The ``width`` bytes of ``data`` from ``at`` as a little-endian unsigned integer."""
    value = np.uint64(0)
    for k in range(width - 1, -1, -1):
        value = (value << np.uint64(8)) | np.uint64(data[at + k])
    return value


@numba.njit(cache=True, nogil=True)
def hash_bytes(offsets: np.ndarray, data: np.ndarray, seeds: np.ndarray, valid: np.ndarray
               ) -> np.ndarray:
    """Per row, XXH64 of ``data[offsets[i]:offsets[i + 1]]`` (as in an Arrow string or binary
    array) seeded with ``seeds[i]``; ``seeds[i]`` itself where not ``valid[i]``."""
    out = np.empty(len(seeds), dtype=np.uint64)
    for i in range(len(seeds)):
        seed = seeds[i]
        if not valid[i]:
            out[i] = seed
            continue
        p = offsets[i]
        end = offsets[i + 1]
        length = end - p
        if length >= 32:
            v1 = seed + _P1 + _P2
            v2 = seed + _P2
            v3 = seed
            v4 = seed - _P1
            while p + 32 <= end:
                v1 = _round(v1, _read(data, p, 8))
                v2 = _round(v2, _read(data, p + 8, 8))
                v3 = _round(v3, _read(data, p + 16, 8))
                v4 = _round(v4, _read(data, p + 24, 8))
                p += 32
            h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
            h = _merge_round(h, v1)
            h = _merge_round(h, v2)
            h = _merge_round(h, v3)
            h = _merge_round(h, v4)
        else:
            h = seed + _P5
        h += np.uint64(length)
        while p + 8 <= end:
            h ^= _round(np.uint64(0), _read(data, p, 8))
            h = _rotl(h, 27) * _P1 + _P4
            p += 8
        if p + 4 <= end:
            h ^= _read(data, p, 4) * _P1
            h = _rotl(h, 23) * _P2 + _P3
            p += 4
        while p < end:
            h ^= np.uint64(data[p]) * _P5
            h = _rotl(h, 11) * _P1
            p += 1
        out[i] = _avalanche(h)
    return out
