"""Garbage collection of data files: delete what no retained version refers to.

A Delta table keeps every file a retained version can read; the rest are garbage: files removed
by commits (compaction merges, rollbacks) before the oldest version that must stay readable,
and orphans, written by a write that never committed (a crash, a dropped merge). A file is
deleted when no version from ``keep_version`` on refers to it and either it is older than a
grace period, so a file being written right now (whose commit is still to come) is never
touched, or this process committed it (``SparkDeltaTable.committed_files``) and it is older
than ``COMMITTED_GRACE_SECONDS``: its write is over, and a reader in another process that
loaded a version referring to it a moment ago (a status read) still finds it. Without that
second case, every file a step writes and a merge or fold soon replaces would stay for the
grace period (an hour): at 15 small steps a second, some 400,000 files, which every collection
lists.

Which version must stay readable is the caller's rule: for a trace, the Delta version recorded
by the oldest retained state version; for logs, their newest version.
"""

from __future__ import annotations

import time
from collections.abc import Set

from dbsp_pipeline.storage.delta_table import SparkDeltaTable

#: files younger than this are never deleted: their write may still be going to commit
ORPHAN_GRACE_SECONDS = 3600.0
#: files this process committed are kept this long at least (at most the grace asked for)
COMMITTED_GRACE_SECONDS = 60.0


def collect(table: SparkDeltaTable, keep_version: int,
            grace_seconds: float = ORPHAN_GRACE_SECONDS, *,
            also_referenced: Set[str] = frozenset()) -> int:
    """Delete the data files of ``table`` that no version from ``keep_version`` on refers to,
    other than ``also_referenced`` (absolute paths: files a retained state version stages, see
    ``staged_table.py``), and that are older than ``grace_seconds``, or than
    ``COMMITTED_GRACE_SECONDS`` if this process committed them; returns how many were deleted."""
    current = table.version()
    keep_version = max(0, min(keep_version, current))
    referenced = {f.path for f in table.files(keep_version)} | set(also_referenced)
    referenced |= {f.path for f in table.added_files(keep_version, current)}
    now = time.time()
    cutoff = now - grace_seconds
    done, done_cutoff = table.committed_files, now - min(grace_seconds, COMMITTED_GRACE_SECONDS)
    garbage = [f.path for f in table.store.stored_data_files()
               if f.path not in referenced and (f.modified <= cutoff or (
                   f.path in done and f.modified <= done_cutoff))]
    table.store.delete_data_files(garbage)
    done.difference_update(garbage)
    return len(garbage)
