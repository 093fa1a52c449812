"""Hot layout changes: ICADD (``docs/rescaling.md``, section 5) over shards kept in Delta tables.

A cold layout change (``Pipeline.rescale``) stops the steps while it splits the state. A hot one
keeps them running: the state is copied as of a committed version while steps go on under the
old layout, and the steps pause only to hand over what they changed meanwhile.

How ICADD's parts map onto this storage. Every worker reads every file (the state is on storage
they share), so "the state of key K is at worker w" means: K's rows are in files that belong to
w, i.e. whose rows all belong to w. The unit of migration is a shard (the keys are never
materialized, as in ICADD); the "distributor" is the trace writer, which places each step's
change in files of the current layout.

1. **Interrogate** (``ShardMigration.interrogate``, under the pipeline lock, at a committed
   state version V): per trace, the files of V. ICADD's whitelists (the keys each old worker
   holds state of and gives up) are implied by them: the rows of V's files that hold rows of
   several workers under the new layout, found in the copy.
2. **Collect / Acquire** (``copy``, without the lock: steps keep running): every file of V that
   holds rows of several workers under the new layout is written again as one file per new
   owner (a file owned whole by one new worker moves without a copy: every worker reads it).
   The copy reads only the immutable files of V and commits nothing.
3. **Hold** (``finish``, under the lock, between two steps): the updates steps made during the
   copy (files committed after V; ICADD's held messages) are still in files of the old layout
   (rule 1.1: an updated key's state stays with its old worker, which every step reads, so
   causal order is that of the trace's commits). They are now split by new owner too. This is
   the only pause, and it is bounded by the changes made during the copy, not by the state.
4. **Done**: every old worker has handed over its state when ``finish`` has run; one staged
   swap per trace replaces the split files by the copies, and the state-database commit that
   records the new layout (folding every trace into its Delta log first) makes it the layout
   of every step after it.

Durability: nothing is committed to the state database until step 4's commit, so a crash at
any earlier point reopens the old layout and its files (the copies are orphans, deleted by
garbage collection); a crash after a trace's fold but before the state commit rolls that trace
back at open (``state_db.py``). Either the old layout or the new, never a mix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from deltalake.transaction import AddAction

from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.delta_table import DataFile
from dbsp_pipeline.storage.trace import Trace


@dataclass
class _TraceMigration:
    trace: Trace
    #: the trace's files at the snapshot (the committed version the copy is taken of)
    snapshot: list[DataFile]
    #: per snapshot file holding rows of several workers under the new layout, its copy
    #: (one file per new owner)
    copies: dict[DataFile, list[AddAction]] = field(default_factory=dict)
    #: per snapshot file, its rows whose owner changes
    moved: dict[DataFile, int] = field(default_factory=dict)


@dataclass
class MigrationStats:
    """What a hot layout change did, for ``RescaleResult``."""

    rows: int = 0
    moved_rows: int = 0
    #: rows rewritten by the copy (steps running) and by the hand-over (steps paused)
    copied_rows: int = 0
    caught_up_rows: int = 0
    copy_seconds: float = 0.0


class ShardMigration:
    """One hot change from layout ``old`` to ``new`` of ``traces`` (the pipeline's state traces).

    Contract: ``interrogate``, ``copy`` and ``finish`` are called in this order;
    ``interrogate`` and ``finish`` run under the pipeline lock (no step in between), ``copy``
    runs without it, concurrently with steps; no compaction may start between
    ``interrogate`` and ``finish`` (it would rewrite the snapshot's files: still correct, since
    ``finish`` copies whatever replaced them, but the pause would grow with the merge).
    """

    def __init__(self, traces: list[Trace], old: Layout, new: Layout) -> None:
        self.old, self.new = old, new
        self.stats = MigrationStats()
        self._traces = [_TraceMigration(t, []) for t in traces]
        self._aborted: str | None = None

    def abort(self, reason: str) -> None:
        """Give the change up (the pipeline rolled its state back while the copy ran: the
        traces being copied are no longer the state): ``finish`` refuses, nothing is committed,
        the copies are garbage."""
        self._aborted = reason

    def interrogate(self) -> None:
        """Take the snapshot: each trace's files at the committed version (file lists only:
        quick, as it runs between two steps)."""
        for tm in self._traces:
            tm.snapshot = tm.trace.files()
            self.stats.rows += sum(f.rows for f in tm.snapshot)

    def copy(self) -> None:
        """Collect and acquire: copy the snapshot's files that hold rows of several new owners,
        one file per new owner, trace by trace. Runs while steps go on; commits nothing."""
        started = time.monotonic()
        for tm in self._traces:
            self._copy(tm)
        self.stats.copy_seconds = time.monotonic() - started
        crash_points.hit("rescale.hot.copied")

    def finish(self) -> None:
        """Hold and Done: split what steps changed since the snapshot, then swap every trace's
        split files for their copies (one staged swap per trace). The caller commits the
        new layout with the state right after."""
        if self._aborted is not None:
            raise UsageError(f"the layout change to {self.new.workers} workers was abandoned: "
                             f"{self._aborted}; the layout is unchanged, rescale again")
        for tm in self._traces:
            current = tm.trace.files()
            snapshot = set(tm.snapshot)
            # Copies of snapshot files that a step has since replaced (a memory's one-step
            # trace) are dropped; the files that replaced them are split below if need be.
            present = set(current)
            kept = [f for f in tm.copies if f in present]
            adds = [a for f in kept for a in tm.copies[f]]
            added = [f for f in current if f not in snapshot]
            changed = [f for f in added if tm.trace.needs_split(f, self.new)]
            adds += tm.trace.split_by_owner(changed, self.new)
            self.stats.caught_up_rows += sum(f.rows for f in changed)
            self.stats.moved_rows += sum(n for f, n in tm.moved.items() if f in present) + \
                tm.trace.moved_rows(added, self.old, self.new)
            tm.trace.swap_files(kept + changed, adds)

    def _copy(self, tm: _TraceMigration) -> None:
        """Copy one trace's part of the snapshot (and count its rows that change owner)."""
        for f in tm.snapshot:
            if not tm.trace.needs_split(f, self.new):
                continue
            tm.copies[f] = tm.trace.split_by_owner([f], self.new)
            self.stats.copied_rows += f.rows
        tm.moved = {f: tm.trace.moved_rows([f], self.old, self.new) for f in tm.snapshot}
