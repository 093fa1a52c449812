"""Layout changes: giving the state to another number of workers (or another sharding).

Both kinds start at a committed step with no merge pending (``begin_layout_change``) and end
with one state-database commit of the new layout together with the state
(``commit_layout``): that commit is the atomic point. A crash before it reopens the old layout
and its files, after it the new one; never a mix. No input is read again.

* Cold (``rescale_cold``): every state file whose rows now belong to several workers is split
  by owner while no step runs (the caller holds the pipeline's lock throughout).
* Hot (``rescale_hot``, ``migration.py``): ICADD's phases. Interrogate at a committed version
  (under the lock), copy the snapshot while other threads keep executing steps under the old
  layout (lock released), then hold steps only while what they changed during the copy is
  handed over and the layout committed (under the lock). A step that fails during the copy
  aborts the change (``step_protocol``'s roll-back); no merge and no garbage collection runs
  during it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace

from dbsp_pipeline.runtime import step_protocol
from dbsp_pipeline.runtime.engine_state import EngineState
from dbsp_pipeline.runtime.layout import LAYOUT_KEY, Layout
from dbsp_pipeline.runtime.migration import ShardMigration
from dbsp_pipeline.runtime.results import RescaleResult
from dbsp_pipeline.storage import crash_points


def rescale_cold(state: EngineState, workers: int, sharding: str | None) -> RescaleResult:
    """The cold layout change; the caller holds the pipeline's lock. Durable when it returns
    (``RescaleResult.state_version``)."""
    started = time.monotonic()
    old, new = begin_layout_change(state, workers, sharding)
    result = RescaleResult(old, new, state.db.get_step())
    for trace in state.plan.state_traces():
        stats = trace.relayout(old, new)
        result.rows += stats.rows
        result.moved_rows += stats.moved
        result.rewritten_rows += stats.rewritten
    result.state_version = commit_layout(state, new)
    result.seconds = time.monotonic() - started
    return result


def rescale_hot(state: EngineState, workers: int, sharding: str | None,
                exclusive: Callable[[], AbstractContextManager[None]]) -> RescaleResult:
    """The hot layout change, in ICADD's phases (``ShardMigration``). The caller does not hold
    the pipeline's lock: ``exclusive()`` takes it (with the pipeline open and fenced) for the
    phases that must run between two steps. Durable when it returns."""
    started = time.monotonic()
    # No merge may run during the migration: let the running one finish while steps go on.
    state.holding_merges = True
    try:
        state.compactor.wait()
        # Interrogate, at a committed version, between two steps.
        with exclusive():
            old, new = begin_layout_change(state, workers, sharding)
            migration = ShardMigration(state.plan.state_traces(), old, new)
            migration.interrogate()
            first_step = state.db.get_step()
            state.migration = migration
    finally:
        state.holding_merges = False
    try:
        # Collect and acquire: copy the snapshot while steps go on.
        migration.copy()
        # Hold and done: between two steps, hand over the changes made during the copy,
        # then commit the new layout with the state.
        with exclusive():
            paused = time.monotonic()
            migration.finish()
            version = commit_layout(state, new)  # with the steps run during the copy
            pause = time.monotonic() - paused
            last_step = state.db.get_step()
    finally:
        state.migration = None
    stats = migration.stats
    return RescaleResult(old, new, last_step, rows=stats.rows, moved_rows=stats.moved_rows,
                         rewritten_rows=stats.copied_rows + stats.caught_up_rows,
                         seconds=time.monotonic() - started, state_version=version, hot=True,
                         copy_seconds=stats.copy_seconds, pause_seconds=pause,
                         steps_during_copy=last_step - first_step,
                         caught_up_rows=stats.caught_up_rows)


def begin_layout_change(state: EngineState, workers: int,
                        sharding: str | None) -> tuple[Layout, Layout]:
    """At a committed step with no merge pending (executed steps are committed first): the
    current layout and the next one."""
    state.require_no_migration("rescale")
    if state.uncommitted_steps:
        step_protocol.commit(state, compact=False)
    state.compactor.apply_finished(wait=True)
    old = state.layout
    if sharding in (None, old.sharding):
        return old, old.rescaled(workers)
    return old, replace(Layout.initial(workers, sharding, inaccuracy=old.inaccuracy),
                        version=old.version + 1)


def commit_layout(state: EngineState, new: Layout) -> int:
    """Commit layout ``new`` with the state (and any executed steps): the atomic point of a
    layout change. Returns the state version."""
    crash_points.hit("rescale.before_commit")
    state.db.put(LAYOUT_KEY, new.to_json())
    version = state.db.commit(fold_all=True)  # the traces' Delta logs in the new layout
    state.uncommitted_steps = 0
    state.layout = new
    return version
