"""Kept rows of data files: bounded in rows, the oldest file dropped first."""

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
