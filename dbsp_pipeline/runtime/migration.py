"""Hot layout changes: ICADD (``icadd-rescaling.md``) over shards kept in Delta tables.

A cold layout change (``Pipeline.rescale``) stops the steps while it splits the state. A hot one
keeps them running: the state is copied as of a committed version while steps go on under the
old layout, and the steps pause only to hand over what they changed meanwhile.

How ICADD's parts map onto this storage. Every worker reads every file (the state is on storage
they share), so "the state of key K is at worker w" means: K's rows are in files that belong to
w, i.e. whose rows all belong to w. The unit of migration is a shard (the keys are never
materialized, as in ICADD); the "distributor" is the trace writer, which places each step's
change in files of the current layout.

1. **Interrogate** (``ShardMigration.interrogate``, under the pipeline lock, at a committed
   state version V): per trace, the files of V; each old worker's ``whitelist`` is the shards
   it owns under the old layout and not under the new one, for which V holds rows (known from
   the files' ``_shard`` statistics, without reading them).
2. **Collect / Acquire** (``copy``, without the lock: steps keep running): every file of V that
   holds rows of several workers under the new layout is written again as one file per new
   owner, old worker by old worker; when an old worker's files are copied it is ``done``. The
   copy reads only the immutable files of V and commits nothing.
3. **Hold** (``finish``, under the lock, between two steps): the updates steps made during the
   copy (files committed after V; ICADD's held messages) are still in files of the old layout
   (rule 1.1: an updated key's state stays with its old worker, which every step reads, so
   causal order is that of the trace's commits). They are now split by new owner too. This is
   the only pause, and it is bounded by the changes made during the copy, not by the state.
4. **Done**: with every old worker done, one rewrite commit per trace swaps the split files for
   the copies, and the state-database commit that records the new layout makes it the layout
   of every step after it.

Durability: nothing is committed to the state database until step 4's commit, so a crash at
any earlier point reopens the old layout and its files (the copies are orphans, deleted by
garbage collection); a crash after a trace's rewrite commit but before the state commit rolls
that trace back at open (``state_db.py``). Either the old layout or the new, never a mix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from deltalake.transaction import AddAction

from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.delta_table import DataFile
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import SHARD_COUNT


@dataclass
class _TraceMigration:
    trace: Trace
    #: the trace's files at the snapshot (the committed version the copy is taken of)
    snapshot: list[DataFile]
    #: snapshot files holding rows of several workers under the new layout: copied
    to_split: list[DataFile] = field(default_factory=list)
    #: per copied file, its copy (one file per new owner)
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
    pause_seconds: float = 0.0
    #: per old worker, the shards it handed over (its whitelist at the snapshot)
    whitelist: dict[int, list[int]] = field(default_factory=dict)
    #: the old workers that reported Done
    done: set[int] = field(default_factory=set)


class ShardMigration:
    """One hot change from layout ``old`` to ``new`` of ``traces`` (the pipeline's state traces).

    Contract: ``interrogate`` and ``finish`` run under the pipeline lock (no step in between),
    ``copy`` runs without it, concurrently with steps; no compaction may start between
    ``interrogate`` and ``finish`` (it would rewrite the snapshot's files: still correct, since
    ``finish`` copies whatever replaced them, but the pause would grow with the merge).
    """

    def __init__(self, traces: list[Trace], old: Layout, new: Layout) -> None:
        self.old, self.new = old, new
        self.stats = MigrationStats()
        self._traces = [_TraceMigration(t, []) for t in traces]

    def interrogate(self) -> None:
        """Take the snapshot (call at a committed version) and the whitelists (from the
        files' ``_shard`` statistics only: quick, as it runs between two steps)."""
        held = np.zeros(SHARD_COUNT, dtype=bool)  # shards the snapshot may hold rows of
        for tm in self._traces:
            tm.snapshot = tm.trace.files()
            self.stats.rows += sum(f.rows for f in tm.snapshot)
            for f in tm.snapshot:
                if f.shard_min is None or f.shard_max is None:
                    held[:] = True
                else:
                    held[f.shard_min:f.shard_max + 1] = True
        if "modulo" in (self.old.sharding, self.new.sharding):
            return  # any key of any shard may move: no whitelist by shard
        shards = np.arange(SHARD_COUNT)
        old_owner, new_owner = self.old.owners(shards), self.new.owners(shards)
        moving = held & (old_owner != new_owner)
        for w in range(self.old.workers):
            self.stats.whitelist[w] = shards[moving & (old_owner == w)].tolist()

    def copy(self) -> None:
        """Collect and acquire: copy the snapshot's mixed files by new owner, old worker by old
        worker (each then reports Done). Runs while steps go on; commits nothing."""
        started = time.monotonic()
        for tm in self._traces:  # (may read the files' keys: not in interrogate, under the lock)
            tm.to_split = [f for f in tm.snapshot if tm.trace.needs_split(f, self.new)]
        for w in range(self.old.workers):
            for tm in self._traces:
                self._copy(tm, [f for f in tm.to_split if self._file_old_owner(f) == w])
            self.stats.done.add(w)
        for tm in self._traces:  # files of no single old worker (recent appends of all of them)
            self._copy(tm, [f for f in tm.to_split if self._file_old_owner(f) is None])
            tm.moved = {f: tm.trace.moved_rows([f], self.old, self.new) for f in tm.snapshot}
        self.stats.copy_seconds = time.monotonic() - started
        crash_points.hit("rescale.hot.copied")

    def finish(self) -> None:
        """Hold and Done: split what steps changed since the snapshot, then swap every trace's
        split files for their copies (one rewrite commit per trace). The caller commits the
        new layout with the state right after."""
        if self.stats.done != set(range(self.old.workers)):
            raise RuntimeError("a layout change cannot finish before every old worker is done")
        started = time.monotonic()
        for tm in self._traces:
            current = tm.trace.files()
            snapshot = set(tm.snapshot)
            # Copies of snapshot files that a step has since replaced (a memory's one-step
            # trace) are dropped; the files that replaced them are split below if need be.
            present = set(current)
            kept = [f for f in tm.to_split if f in present]
            adds = [a for f in kept for a in tm.copies[f]]
            added = [f for f in current if f not in snapshot]
            changed = [f for f in added if tm.trace.needs_split(f, self.new)]
            adds += tm.trace.split_by_owner(changed, self.new)
            self.stats.caught_up_rows += sum(f.rows for f in changed)
            self.stats.moved_rows += sum(n for f, n in tm.moved.items() if f in present) + \
                tm.trace.moved_rows(added, self.old, self.new)
            tm.trace.swap_files(kept + changed, adds)
        self.stats.pause_seconds = time.monotonic() - started

    def _copy(self, tm: _TraceMigration, files: list[DataFile]) -> None:
        for f in files:
            tm.copies[f] = tm.trace.split_by_owner([f], self.new)
            self.stats.copied_rows += f.rows

    # -- shards ----------------------------------------------------------------------------
    def _file_old_owner(self, f: DataFile) -> int | None:
        """The old worker owning every row of ``f`` (None if several, or unknown)."""
        if self.old.sharding == "modulo" or f.shard_min is None or f.shard_max is None:
            return None
        owners = self.old.owners_of_range(f.shard_min, f.shard_max)
        return next(iter(owners)) if len(owners) == 1 else None
