"""Searching a sorted run in memory (``storage/run_search.py``): ``OpenRun``'s searches give
what numpy's binary searches give, whichever way they go. Ranges of rows sorted by value (the
tie-closed cuts) are tested with the traces that read them (``test_trace_extremes.py``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dbsp_pipeline.storage import run_search


@pytest.mark.parametrize("batches", ["batches", "one-batch"])
@pytest.mark.parametrize("stride", [1, 3, 256, "merged"])
def test_a_fenced_search_finds_what_a_binary_search_finds(tmp_path, monkeypatch, stride,
                                                          batches):
    """``OpenRun.ranges`` through fences (every ``stride``-th hash), or by merges of the
    wanted hashes with a batch's (``_merged_positions``: for one wanted a few rows, here every
    search), and with the steps past a hash's rows gives numpy's searchsorted "left" and
    "right", over hashes with one row, a few, and more than ``END_STEPS`` (their ends found as
    the next hash's start, through the fence), for wanted hashes below, between, on and above
    them, and the largest hash there is; in a run of a few batches and of one."""
    merged = stride == "merged"
    stride = 4 if merged else stride
    monkeypatch.setattr(run_search, "FENCE_STRIDE", stride)
    monkeypatch.setattr(run_search, "FENCE_MIN_HASHES", 1)
    monkeypatch.setattr(run_search, "FENCE_ROWS_PER_HASH", 0)
    monkeypatch.setattr(run_search, "MERGE_ROWS_PER_HASH", 10**9 if merged else 0)
    rng = np.random.default_rng(stride)
    top = np.uint64(2**64 - 1)  # the last hash there can be: no next hash ends its rows
    distinct = np.append(np.unique(rng.integers(10, 2**62, 3_000, dtype=np.int64)
                                   ).astype(np.uint64), top)
    repeats = rng.choice([1, 1, 1, 2, 3, run_search.END_STEPS + 3], len(distinct))
    repeats[-1] = run_search.END_STEPS + 3
    column = np.repeat(distinct, repeats)
    path = str(tmp_path / "run.arrow")
    schema = pa.schema([(run_search.HASH, pa.uint64())])
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        step = 1_000 if batches == "batches" else len(column)
        for lo in range(0, len(column), step):  # three batches and a bit, or one
            writer.write_table(pa.table({run_search.HASH: column[lo:lo + step]}))
    run = run_search.OpenRun.of(pa.ipc.open_file(pa.memory_map(path)))
    wanted = np.unique(np.concatenate([
        rng.choice(distinct, 700), rng.integers(0, 2**62, 300, dtype=np.int64).astype(np.uint64),
        np.array([0, distinct[0], distinct[-2], 2**63, top], dtype=np.uint64)]))
    for _ in range(2):  # the second time through the fences kept
        hit, lo, hi = run.ranges(wanted)
        left = np.searchsorted(column, wanted, "left")
        right = np.searchsorted(column, wanted, "right")
        assert (hit == np.flatnonzero(right > left)).all()
        assert (lo == left[hit]).all() and (hi == right[hit]).all()
    assert bool(run.fences) != merged
