"""What keeps a pipeline root small after its commits: garbage collection, trace merges and
history compaction.

After a commit (``after_commit``; none while a hot layout change is in progress or about to
begin): when due (``collection_due``) the garbage is collected (``collect_garbage``), the
traces with many files start merging in the background (``compactor.py``; a finished merge is
applied before the next step), and with ``retain_steps`` the output logs' older history is
collapsed (``compact_history``).

None of these changes what a reader of the pipeline sees: they delete only files no retained
state version and no newer commit refers to, rewrite traces and input logs into fewer files
with the same rows, and collapse output history only before ``retain_steps`` and before every
live reader's ``since``. Every function here is called by the holder of the pipeline's lock.
"""

from __future__ import annotations

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.runtime import path_choice
from dbsp_pipeline.runtime.engine_state import EngineState
from dbsp_pipeline.runtime.output_log import FOLD_STEPS
from dbsp_pipeline.storage import garbage, keyed_runs

#: Garbage is collected once this many commits were made since the last collection, if their
#: steps changed ``GC_ROWS`` input rows or more or numbered ``GC_MAX_STEPS``; after
#: ``GC_MAX_COMMITS`` commits in any case (and at close). A collection costs about the same
#: whatever it finds (its own commits, the logs listed: 70 ms here), while what it deletes grows
#: with the rows written, and the division log holds a file a step until it runs: small steps
#: (100 rows, a commit each) spent 12% of their time collecting every 16 commits (21.8 steps/s
#: against 25.2 so paced, alternating in one pipeline), big ones leave much garbage, and with
#: ``checkpoint_every`` 10 sixteen commits are 160 steps, the most division files opening reads.
GC_EVERY_COMMITS = 16
GC_MAX_COMMITS = 64
GC_ROWS = 1_000_000
GC_MAX_STEPS = 160


def after_commit(state: EngineState) -> None:
    """The upkeep due after a commit (see the module docstring)."""
    if state.migration is not None or state.holding_merges:
        return
    for log in state.inputs.values():
        log.apply_consolidated()  # a background consolidation of consumed input, if done
    state.commits_since_collection += 1
    if collection_due(state):
        collect_garbage(state, garbage.ORPHAN_GRACE_SECONDS)
    state.compactor.start(state.plan.traces(), state.layout, state.driver_memory)
    if state.retain_steps is not None:
        compact_history(state)


def collection_due(state: EngineState) -> bool:
    """Whether the commits since the last collection call for one (``GC_EVERY_COMMITS``,
    ``GC_ROWS``, ``GC_MAX_STEPS``, ``GC_MAX_COMMITS``)."""
    commits = state.commits_since_collection
    return commits >= GC_MAX_COMMITS or (commits >= GC_EVERY_COMMITS and (
        state.rows_since_collection >= GC_ROWS
        or state.steps_since_collection >= GC_MAX_STEPS))


def collect_garbage(state: EngineState, grace_seconds: float) -> int:
    """Delete the data files no retained state version and no newer commit refers to, in the
    state tables and the output and input logs (files younger than ``grace_seconds`` are kept,
    their write may still commit, unless this process committed them: ``storage/garbage.py``);
    input that every retained state version has consumed is consolidated in the input logs
    first. Does nothing during a hot layout change (it copies files). Returns how many files
    were deleted.

    Consumed input is consolidated in the background when the grace is the usual hour or more
    (``InputLog.consolidate_consumed``; a later commit applies it), in the foreground otherwise.
    A background merge that finished is applied first. One still running is waited for only
    when it may have written files older than ``grace_seconds`` (an explicit collection with a
    short grace): its files, which no commit refers to yet, are younger than the grace
    otherwise, so the collection leaves them alone and the step that triggered it does not wait
    for the merge.
    The keyed runs of data files the traces no longer hold are deleted only while no merge is
    running (the running merge's new files are not in the traces yet)."""
    if state.migration is not None:
        return 0  # a hot layout change is copying files; the next collection will do
    state.commits_since_collection = state.rows_since_collection = 0
    state.steps_since_collection = 0
    running = state.compactor.running_for()
    state.compactor.apply_finished(wait=running is not None and running >= grace_seconds / 2)
    merging = state.compactor.running_for() is not None
    fold(state)  # the division records about to be compacted hold unfolded output
    # Input that every retained state version has consumed is no longer needed.
    # A checkpoint below the division log's compacted_below is garbage, whatever the retention.
    floor = state.divisions.compacted_below
    retained = state.db.retained_entries(state.retain_checkpoints, floor)
    oldest_step = min(int(entry.get("step", 0)) for _, entry in retained)
    consumed = state.divisions.get(oldest_step - 1) if oldest_step > 0 else None
    # Consumed input is consolidated in the background (its files younger than the grace),
    # unless this collection's grace is shorter than the hour of the usual one.
    background = grace_seconds >= garbage.ORPHAN_GRACE_SECONDS
    for name, log in state.inputs.items():
        running = log.consolidation_running_for()
        if running is not None and running >= grace_seconds / 2:
            log.apply_consolidated(wait=True)
        log.consolidate_consumed(
            (consumed or {}).get(name, 0), state.sql, background=background,
            driver_rows=path_choice.rows_on_driver(log.arrow_schema, state.driver_memory))
    # A live reader (a Kafka sink re-sending steps not yet sent asks their step_info) keeps the
    # divisions from its ``since`` on, as it keeps the output history.
    held = [s for s in (state.leases.since(v) for v in state.outputs) if s is not None]
    state.divisions.compact_below(min([oldest_step, *held]))  # crash-safe, bounded
    for out in state.outputs.values():
        out.clean_log_before(oldest_step)
    deleted = state.db.collect_garbage(state.retain_checkpoints, grace_seconds,
                                       state.divisions.compacted_below)
    if not merging:
        for trace in state.plan.state_traces():
            trace.collect_runs()  # local copies of deleted trace files (keyed_runs.py)
    keyed_runs.remove_other_traces(root_layout.keyed_runs(state.db.root),
                                   [t.name for t in state.plan.state_traces()])
    tables = [*(log_.table for log_ in state.outputs.values()),
              *(log_.table for log_ in state.inputs.values()), state.divisions.table]
    pending = set().union(*(log_.pending_paths() for log_ in state.outputs.values()))
    for table in tables:  # (pending writes were just folded; kept whatever happens)
        deleted += garbage.collect(table, table.version(), grace_seconds,
                                   also_referenced=pending)
    return deleted


def fold(state: EngineState) -> None:
    """Fold the output logs' pending writes into their Delta tables and the step records the
    entries carry into the division log. Order: the records first (every record the outputs
    are folded from is then in the division log, whatever entry comes next), then the
    outputs. Not a commit of the state: until the next entry, the newest one still carries the
    records, which opening reads as the ones the division log holds."""
    state.divisions.fold()
    for out in state.outputs.values():
        out.fold()


def fold_if_due(state: EngineState) -> None:
    """``fold`` once an output log holds ``FOLD_STEPS`` pending steps."""
    if max((o.pending_steps for o in state.outputs.values()), default=0) >= FOLD_STEPS:
        fold(state)


def compact_history(state: EngineState) -> dict[str, int]:
    """Collapse each output log's history older than ``retain_steps`` steps (all of it but the
    newest step when None), never past the ``since`` of a live reader; returns, per view, the
    step history is collapsed through."""
    keep = state.retain_steps if state.retain_steps is not None else 0
    out = {}
    for name, log in state.outputs.items():
        through = log.last() - 1 - keep
        held = state.leases.since(name)
        if held is not None:
            through = min(through, held)
        if through >= 0:
            log.compact_history(through, state.sql)
        out[name] = log.compacted_through()
    return out


def compact(state: EngineState, threshold: int) -> int:
    """Merge now, in the foreground, every trace with more than ``threshold`` sorted runs (after the
    background merge, if one runs); returns how many traces were merged."""
    done = state.compactor.apply_finished(wait=True)
    return done + sum(t.compact(threshold, state.sql) for t in state.plan.traces())
