"""``driver/hashing_kernel.py`` against the ``xxhash`` library: XXH64 of 4 and 8 little-endian
bytes and of byte strings of every length class of the algorithm (below 4, 4-7, 8-31, 32 and
more, with tails of each size), each row with its own seed; NULL rows keep their seed. (Against
Spark itself: ``test_hashing.py``.)"""

from __future__ import annotations

import random

import numpy as np
import xxhash

from dbsp_pipeline.driver import hashing_kernel


def test_the_compiled_xxh64_equals_the_library() -> None:
    rnd = random.Random(20261201)
    n = 3000
    values = [rnd.randbytes(rnd.choice([0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 31, 32, 33, 40, 63, 64,
                                        65, 100, rnd.randint(0, 300)])) for _ in range(n)]
    seeds = np.array([rnd.getrandbits(64) for _ in range(n)], dtype=np.uint64)
    valid = np.array([rnd.random() > 0.1 for _ in range(n)])
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(v) for v in values])
    data = np.frombuffer(b"".join(values), dtype=np.uint8)
    got = hashing_kernel.hash_bytes(offsets, data, seeds, valid)
    assert got.tolist() == [xxhash.xxh64_intdigest(v, int(s)) if ok else int(s)
                            for v, s, ok in zip(values, seeds, valid)]

    words = np.array([rnd.getrandbits(64) for _ in range(n)], dtype=np.uint64)
    got = hashing_kernel.hash_longs(words, seeds, valid)
    assert got.tolist() == [xxhash.xxh64_intdigest(int(w).to_bytes(8, "little"), int(s))
                            if ok else int(s) for w, s, ok in zip(words, seeds, valid)]
    halves = words & np.uint64(0xFFFFFFFF)
    got = hashing_kernel.hash_ints(halves, seeds, valid)
    assert got.tolist() == [xxhash.xxh64_intdigest(int(w).to_bytes(4, "little"), int(s))
                            if ok else int(s) for w, s, ok in zip(halves, seeds, valid)]
