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

Two ways to find the garbage, with the same result:

* **A listing** lists every file under the table's data folder and keeps those that
  ``keep_version`` or a later commit refers to. It finds orphans, but costs what the table
  holds: an output log keeps a file per folded batch of steps for as long as its history.
* **The removes since the last collection.** A file a commit removed at version ``r`` (and no
  later commit added again, as a restore does) is in no version from ``r`` on, so once
  ``r <= keep_version`` only its age keeps it. A collection after a listing reads the commits
  since the previous collection (``TableStore.file_changes``) and looks at the files they
  removed, plus those the listing left for their age: its cost follows the commits since, not
  the table's size.

The first collection of a table in a process lists it, and so does every
``LISTING_EVERY``-th collection after (orphans), one whose ``keep_version`` is below the one the
last listing kept (what is known covers the versions from there on), and one that cannot read a
commit of the range (its log file was cleaned up) or finds the table older than it was seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field

from dbsp_pipeline.storage.delta_table import SparkDeltaTable

#: files younger than this are never deleted: their write may still be going to commit
ORPHAN_GRACE_SECONDS = 3600.0
#: files this process committed are kept this long at least (at most the grace asked for)
COMMITTED_GRACE_SECONDS = 60.0
#: a table's data folder is listed at least every this many collections (orphans are found
#: only by listing); the collections in between look at the files commits removed
LISTING_EVERY = 16
#: the removal version of a file a listing found unreferenced (younger than its grace):
#: no version from the listing's ``keep_version`` on refers to it
UNREFERENCED = -1


@dataclass
class RemovedFiles:
    """What a table's collections know between listings (one per table and process, in
    ``SparkDeltaTable.garbage``): the files that may become garbage, each with the version
    that removed it, and how far the log was read."""

    #: commits up to this version have been read into ``removed``
    read_through: int
    #: the ``keep_version`` of the last listing: ``removed`` is complete for the versions from
    #: here on (a collection keeping an older version lists again)
    complete_from: int
    #: path -> the version whose commit removed it (``UNREFERENCED``: found by the listing)
    removed: dict[str, int] = field(default_factory=dict)
    #: path -> its modification time, of the files of ``removed`` statted or listed already: a
    #: data file is never written again (fresh names), so a file too young to delete is not
    #: statted again until its age says it may be deleted
    modified: dict[str, float] = field(default_factory=dict)
    #: collections since the last listing
    collections: int = 0


def collect(table: SparkDeltaTable, keep_version: int,
            grace_seconds: float = ORPHAN_GRACE_SECONDS, *,
            also_referenced: Set[str] = frozenset(), listing: bool = False) -> int:
    """Delete the data files of ``table`` that no version from ``keep_version`` on refers to,
    other than ``also_referenced`` (absolute paths: files a retained state version stages, see
    ``staged_table.py``), and that are older than ``grace_seconds``, or than
    ``COMMITTED_GRACE_SECONDS`` if this process committed them; returns how many were deleted.
    Lists the table's data folder when ``listing`` or when due (see the module docstring);
    otherwise looks only at the files the commits since the last collection removed."""
    current = table.version()
    keep_version = max(0, min(keep_version, current))
    known = table.garbage
    if not listing and known is not None and known.collections + 1 < LISTING_EVERY \
            and known.complete_from <= keep_version and known.read_through <= current:
        changes = table.store.file_changes(known.read_through, current)
        if changes is not None:
            for change in changes:
                for path in change.removed:
                    known.removed[path] = change.version
                for path in change.added:
                    known.removed.pop(path, None)
                    known.modified.pop(path, None)
            known.read_through = current
            known.collections += 1
            return _delete_removed(table, known, keep_version, grace_seconds, also_referenced)
    return _delete_listed(table, keep_version, current, grace_seconds, also_referenced)


def note_never_committed(table: SparkDeltaTable, paths: Iterable[str]) -> None:
    """Tell the collections of ``table`` that the files at ``paths`` (absolute) were written
    for it and will never be added by a commit of this process (a staged add that was unstaged,
    ``staged_table.py``): garbage once no retained state version stages them
    (``also_referenced``) and old enough. Without this, only a listing would find them."""
    if table.garbage is not None:
        table.garbage.removed.update(dict.fromkeys(paths, UNREFERENCED))


def _delete_listed(table: SparkDeltaTable, keep_version: int, current: int,
                   grace_seconds: float, also_referenced: Set[str]) -> int:
    """Collect by listing the data folder; leaves ``table.garbage`` holding the files no
    version from ``keep_version`` on refers to that were kept (for their age, or as
    ``also_referenced``), to be read on from ``keep_version``."""
    referenced = {f.path for f in table.files(keep_version)}
    referenced |= {f.path for f in table.added_files(keep_version, current)}
    unreferenced = [f for f in table.store.stored_data_files() if f.path not in referenced]
    old_enough = _old_enough(table, grace_seconds)
    garbage = [f.path for f in unreferenced
               if f.path not in also_referenced and old_enough(f.path, f.modified)]
    table.store.delete_data_files(garbage)
    table.committed_files.difference_update(garbage)
    deleted = set(garbage)
    # The commits after keep_version are read again by the next collection: the files they
    # removed are referenced by a version from keep_version on, so none is listed here.
    kept = [f for f in unreferenced if f.path not in deleted]
    table.garbage = RemovedFiles(keep_version, keep_version,
                                 {f.path: UNREFERENCED for f in kept},
                                 {f.path: f.modified for f in kept})
    return len(garbage)


def _delete_removed(table: SparkDeltaTable, known: RemovedFiles, keep_version: int,
                    grace_seconds: float, also_referenced: Set[str]) -> int:
    """Collect among the files ``known`` holds: those removed at or before ``keep_version``.
    A file whose modification time is known and says it is still too young is not statted
    (the files of the grace period would be statted at every collection: at 35 small steps a
    second, some 13,000 of them, 2.4 ms a step); the others are, for their age and to skip
    those deleted by someone else meanwhile."""
    old_enough = _old_enough(table, grace_seconds)
    due = [path for path, version in known.removed.items()
           if version <= keep_version and path not in also_referenced
           and (path not in known.modified or old_enough(path, known.modified[path]))]
    stored = table.store.stat_data_files(due)
    for gone in set(due) - {f.path for f in stored}:  # deleted by someone else meanwhile
        del known.removed[gone]
        known.modified.pop(gone, None)
    known.modified.update((f.path, f.modified) for f in stored)
    garbage = [f.path for f in stored if old_enough(f.path, f.modified)]
    table.store.delete_data_files(garbage)
    table.committed_files.difference_update(garbage)
    for path in garbage:
        del known.removed[path]
        known.modified.pop(path, None)
    return len(garbage)


def _old_enough(table: SparkDeltaTable, grace_seconds: float) -> Callable[[str, float], bool]:
    """Whether an unreferenced file (its path and modification time) is old enough to delete,
    now: older than the grace, or than ``COMMITTED_GRACE_SECONDS`` if this process committed
    it."""
    now = time.time()
    cutoff = now - grace_seconds
    done, done_cutoff = table.committed_files, now - min(grace_seconds, COMMITTED_GRACE_SECONDS)
    return lambda path, modified: modified <= cutoff or (path in done and modified <= done_cutoff)
