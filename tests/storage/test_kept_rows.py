"""Kept rows of data files: bounded in rows and bytes, the oldest file dropped first."""

from __future__ import annotations

import pyarrow as pa

from dbsp_pipeline.storage.kept_rows import KeptRows


def rows(n: int) -> pa.Table:
    return pa.table({"k": list(range(n))})


def test_the_oldest_files_go_first_and_a_file_over_the_bound_is_not_kept():
    kept = KeptRows()
    kept.keep("a", rows(3), limit=5)
    kept.keep("b", rows(2), limit=5)
    assert "a" in kept and "b" in kept and len(kept) == 2
    kept.keep("c", rows(2), limit=5)  # 7 rows: "a" goes
    assert kept.get("a") is None and len(kept) == 2
    assert kept.get("c") is not None and kept.get("c").equals(rows(2))
    kept.keep("d", rows(6), limit=5)  # bigger than the bound on its own
    assert "d" not in kept and len(kept) == 2
    kept.keep("e", rows(5), limit=5)  # exactly the bound: all others go
    assert len(kept) == 1 and "e" in kept


def test_a_bound_in_bytes_drops_the_oldest_files_too():
    size = rows(100).get_total_buffer_size()
    kept = KeptRows()
    kept.keep("a", rows(100), limit=1_000, limit_bytes=2 * size)
    kept.keep("b", rows(100), limit=1_000, limit_bytes=2 * size)
    assert "a" in kept and "b" in kept
    kept.keep("c", rows(100), limit=1_000, limit_bytes=2 * size)  # 3 x size: "a" goes
    assert "a" not in kept and "b" in kept and "c" in kept
    kept.keep("d", rows(300), limit=1_000, limit_bytes=2 * size)  # over the bytes alone
    assert "d" not in kept and len(kept) == 2
    kept.keep("b", rows(50), limit=1_000, limit_bytes=2 * size)  # kept again: counted once
    kept.keep("e", rows(100), limit=1_000, limit_bytes=2 * size)
    assert "b" in kept and "c" not in kept and "e" in kept
