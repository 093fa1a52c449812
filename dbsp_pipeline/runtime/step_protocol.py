"""The step protocol: how one step turns pushed input into output changes and state, and how
it is recovered. This module is the contract; ``Pipeline`` runs it under its lock and turns a
lost race on its tables into the fencing error.

Layout of a pipeline root::

    _manifest/        the state database's manifest (one entry per state version)
    _divisions/       the step records: the division of input into steps, and their output
    inputs/<name>/    the durable log of each input (one Delta version per push)
    state/<trace>/    the traces of the stateful operators
    outputs/<name>/   the change log of each output view (``_step`` and ``_weight`` columns)

A step (``execute_step``), top to bottom:

1. ``s = get_step()``: the next step to execute.
2. Divide: the division of input for step ``s``: the newest version of every input log. If
   ``s`` was divided before (a crash after its record, before the checkpoint that follows it;
   or it failed), the recorded division is re-used.
   A step may carry its own pushes (``Pipeline.step(changes)``: their files written, not
   committed): each is committed in the background at the version after its log's newest,
   and the division takes that version in, so the step computes while they land (2b).
3. Read each input's change: the log files appended in versions ``(lower, upper]``.
4. Evaluate every operator once; stateful operators stage their trace changes
   (``storage/staged_table.py``). A step whose estimated work fits the driver's memory runs
   there (Arrow + DuckDB), a larger one as Spark jobs (``path_choice.py``); both compute the
   same change and read and write the same traces.
5. Write every output's change as data files (``OutputLog.prepare``), under the output write
   rules: a step already written is verified and discarded, so a replay duplicates nothing.
   Then every trace file written behind the computation has been written
   (``storage/write_behind.py``): a failed write fails the step here.
5b. Every carried push has landed at its version (the record names it). One that lost its
   version to another writer's push undoes the step (back to the newest checkpoint); it is
   pushed as a plain push, and the step executes again over the logs as they are.
6. Record: the step's ONE durable commit, its *record*: its division together with every
   view's change (files, rows, digest). A step that ends a checkpoint (every
   ``checkpoint_every`` steps) stages its record and commits the state database: the manifest
   entry carries the record, the traces' staged changes and the next step, so the checkpoint
   and the step are one atomic commit. Any other step commits its record to the division log.
   After the commit the output logs hold the change *pending* and fold it into their Delta
   tables every ``output_log.FOLD_STEPS`` steps; the records staged in entries are folded
   into the division log at the same time (``upkeep.fold``). What runs after a commit (garbage
   collection, background merges, history compaction) is ``upkeep.py``.

Durability: when ``execute_step`` returns, the step's division and every view's change are
durable, in one commit (a consumer reading through ``Pipeline`` sees the step; a reader of
an output's Delta table sees it once folded); its state is durable with the checkpoint
(``StepResult.committed_version``). A crash before the record's commit loses the whole step
(its files are garbage, and the next step divides the input again); after it, replay rebuilds
whatever state was not checkpointed. A carried push is a push: durable once it landed, with or
without the step (a crash after it leaves it to the next step, as a push before a crashed step).

Replay at open (``recover``): reopening a root after a crash opens the newest committed state
version and at once executes again the steps recorded after it, from their recorded divisions
(``recovered_steps``); their outputs were already written and are verified against the record
and discarded by the write rules, so a consumer of the output logs sees every step exactly once.

Failed steps: a step that fails in 3-5 (an overflow, an expression error, a failed task)
commits its division alone (so that it stays the next step, with the same input) and no
output: every view's change is computed and its files written before the record, and the state
goes back to the newest checkpoint and executes again the steps before the failed one (roll
back). Stepping tries the step again (a transient cause heals), opening the root reports it
(``failed_step``) instead of failing, and an operator can quarantine its input (``quarantine``:
the records go to the errors table and the step executes with no input). If the roll-back
itself fails, or the step is interrupted half-way (``BaseException``), the state is abandoned:
nothing more runs on it, and reopening the root recovers.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any

import pyarrow as pa

from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.errors import (
    ConcurrentWriterError,
    NonDeterminismError,
    StepFailedError,
    StorageError,
    UsageError,
)
from dbsp_pipeline.operators.base import StepContext
from dbsp_pipeline.runtime import upkeep
from dbsp_pipeline.runtime.division_log import CARRIED_RECORDS_KEY
from dbsp_pipeline.runtime.engine_state import EngineState
from dbsp_pipeline.runtime.input_log import LandingPush, WrittenPush
from dbsp_pipeline.runtime.output_log import PreparedWrite
from dbsp_pipeline.runtime.results import (
    FailedStep,
    QuarantineResult,
    StepInfo,
    StepResult,
    add_seconds,
)
from dbsp_pipeline.spark_session import quiet_query_context_logs
from dbsp_pipeline.storage.delta_table import DataFile

#: The errors-sink producer of a quarantined step's records of one input: ``quarantine/<input>``
QUARANTINE_PRODUCER = "quarantine/"

log = logging.getLogger(__name__)


# -- one step ------------------------------------------------------------------------------
def execute_step(state: EngineState,
                 carried: Mapping[str, Sequence[WrittenPush]] | None = None) -> StepResult:
    """Execute the next step (1-6 of the module docstring). Raises ``StepFailedError`` when the
    computation failed (nothing of it is committed; it stays the next step, ``failed_step``),
    ``ConcurrentWriterError`` when another process wrote this root's tables first.

    ``carried``: pushes whose files are written and not committed, per input in order (the
    step's own input, ``Pipeline.step_carrying``): each is committed in the background at the
    next log version, which the division takes in, while the step computes; the record waits
    for them (2b, 5b). A step divided before (a replay, a failed step) leaves them to
    the next step, pushed first as they are; a push that loses its version to another writer
    undoes the step, which then executes again over the pushes as they landed."""
    started = time.monotonic()
    state.compactor.apply_finished()
    s = state.db.get_step()
    names = list(state.inputs)

    # 1-2. Divide: the division of input for step s (recorded with its output, in step 6).
    uppers = state.divisions.get(s)
    divided = uppers is not None
    if divided and carried:  # the recorded division is the step's: the pushes are the next's
        for name, pushes in carried.items():
            for push in pushes:
                state.inputs[name].append_written(push)
        carried = None
    if uppers is None:
        offsets = {n: {producer: state.inputs[n].pushed(producer) for producer in sorted(ps)}
                   for n, ps in state.tracked.items()}
        uppers = {n: state.inputs[n].version() for n in names}
    else:
        offsets = state.divisions.offsets(s)
    lowers = state.divisions.lower(s, names)
    result = StepResult(step=s, quarantined=state.divisions.quarantined(s))
    result.rejected = {n: state.inputs[n].rejected_between(lowers[n], uppers.get(n, 0))
                       for n in state.tracked}
    for trace in state.plan.state_traces():
        trace.reset_rows_read()

    if result.quarantined is not None:
        complete_quarantine(state, s, result.quarantined)
    files = {n: [] if result.quarantined is not None else
             state.inputs[n].files_between(lowers[n], uppers.get(n, 0)) for n in names}

    # 2b. The carried pushes start landing, each at the next version of its log: the division
    # takes them in. Nothing else reads or writes their logs until they have landed (5b).
    landing = []
    for name, pushes in (carried or {}).items():
        for push in pushes:
            landing.append(state.inputs[name].land_in_background(push, uppers[name] + 1))
            uppers[name] += 1
            files[name] = files[name] + landing[-1].files
            if name in result.rejected:
                result.rejected[name] += push.rejected
            if push.producer is not None and push.producer in offsets.get(name, {}):
                offsets[name][push.producer] = push.seq

    add_seconds(result.phase_seconds, "divide", started)

    # 3-5. Evaluate and write the files of every view's change. Nothing of a step that fails
    # here stays but its division: the state goes back to the newest checkpoint; a failure of
    # the computation is StepFailedError.
    computed = False
    try:
        prepared = _compute(state, s, files, result)
        computed = True
    except ConcurrentWriterError:
        _settle(landing)
        raise  # fenced: the pipeline closes
    except Exception as e:  # noqa: BLE001 (any failure of the step)
        if state.rolling_back:
            raise
        if landing and not _landed(state, landing):  # 5b (below)
            return _again_as_pushed(state, s, landing)
        if not divided:  # the step stays the next one, with the same input
            try:
                state.divisions.record(s, uppers, offsets)
            except BaseException:
                state.abandon()  # the record may or may not be there: reopen the root
                raise
        _roll_back(state, until=s)
        if computed or isinstance(e, (NonDeterminismError, UsageError)):
            raise  # not the computation's fault: the step is retried as it is
        error = f"{type(e).__name__}: {e}".strip()
        state.failed_step = FailedStep(s, error)
        raise StepFailedError(state.circuit.name, s, error) from e
    except BaseException:
        _settle(landing)
        state.abandon()  # interrupted half-way: reopen the root
        raise
    # 5b. The record names the carried pushes' versions: every one has landed there, or the
    # step is undone and executes again over the pushes as they landed.
    committing = time.monotonic()
    if landing and not _landed(state, landing):
        return _again_as_pushed(state, s, landing)
    state.failed_step = None
    result.state_rows_read = sum(t.rows_read for t in state.plan.state_traces())
    state.steps_since_collection += 1
    state.rows_since_collection += sum(result.inputs.values())

    # 6. Record: the step's one commit (with the checkpoint, every checkpoint_every steps).
    state.db.set_step(s + 1)
    state.uncommitted_steps += 1
    writes = {name: w for name, w in prepared.items() if w is not None}
    record = ({name: w.record() for name, w in writes.items()}
              if state.divisions.outputs(s) is None else None)  # None: a replay
    try:
        if state.uncommitted_steps >= state.checkpoint_every:
            if record is not None:
                state.divisions.stage(s, uppers, offsets, record)
            result.committed_version = commit(state, compact=False)
        elif record is not None:
            state.divisions.record(s, uppers, offsets, record)
    except ConcurrentWriterError:
        state.abandon()  # fenced: another process recorded the step first
        raise
    except StorageError as e:
        if not e.definitely_failed or state.rolling_back:
            state.abandon()  # the commit may have happened: reopen the root
            raise
        state.divisions.unstage(s)  # nothing of the step was committed
        _roll_back(state, until=s)
        raise
    except BaseException:
        state.abandon()  # the record's commit may or may not have happened: reopen the root
        raise
    for name, write in writes.items():
        state.outputs[name].stage(write)
        result.outputs[name] = write.rows
    for name in prepared:
        result.outputs.setdefault(name, None)
    upkeep_started = add_seconds(result.phase_seconds, "commit", committing)
    try:
        upkeep.fold_if_due(state)
    except ConcurrentWriterError:
        raise  # fenced
    except StorageError as e:  # the step is durable; the fold is tried again later
        log.warning("folding the output logs of pipeline '%s' after step %d failed: %s",
                    state.circuit.name, s, e)
    if result.committed_version is not None:
        upkeep.after_commit(state)
    add_seconds(result.phase_seconds, "upkeep", upkeep_started)
    result.seconds = time.monotonic() - started
    return result


def _landed(state: EngineState, landing: list[LandingPush]) -> bool:
    """Wait for every carried push of ``landing``; whether all landed at their versions. False
    when one lost its version to another writer, or its commit definitely failed (nothing of
    it is committed). A commit of unknown outcome, or a crash in one, abandons the state."""
    landed = True
    failure: BaseException | None = None
    for push in landing:
        try:
            push.wait()
        except ConcurrentWriterError:
            landed = False
        except StorageError as e:
            if not e.definitely_failed:
                failure = failure or e
            landed = False
        except BaseException as e:  # noqa: BLE001 (a crash in the lander: raised below)
            failure = failure or e
    if failure is not None:
        state.abandon()  # a push may or may not be committed: reopen the root
        raise failure
    return landed


def _settle(landing: list[LandingPush]) -> None:
    """Wait for every carried push of ``landing`` to land or fail (a step interrupted or fenced:
    what they did is left as it is, for whoever reopens the root)."""
    futures.wait([push.future for push in landing])


def _again_as_pushed(state: EngineState, s: int, landing: list[LandingPush]) -> StepResult:
    """A carried push of step ``s`` did not land at its version: undo the step (back to the
    newest checkpoint), push those that did not land as plain pushes (a producer's batch
    recorded meanwhile is not pushed twice), and execute the step again over the logs."""
    _roll_back(state, until=s)
    for push in landing:
        if push.future.exception() is not None:
            state.inputs[push.input].append_written(push.push)
    return execute_step(state)


def _compute(state: EngineState, s: int, files: dict[str, list[DataFile]],
             result: StepResult) -> dict[str, PreparedWrite | None]:
    """Steps 3-5 of step ``s`` up to the record: each input's change (``files``: its
    division's pushes; none if the step is quarantined; a small change is read on the driver),
    the circuit's evaluation (stateful operators stage their trace changes), and every view's
    change written as data files (or, for a step written before, verified against its record:
    None)."""
    started = time.monotonic()
    names = list(state.inputs)
    result.inputs = {n: sum(f.rows for f in fs) for n, fs in files.items()}
    result.on_driver, result.path_reason, per_owner = state.choose_path(files)
    sql = state.sql if result.on_driver else None
    if sql is not None:
        changes = {n: state.inputs[n].change_arrow(sql, files[n]) for n in names}
    else:
        # an input only owner stages read is consolidated by their tasks (no Spark shuffle);
        # one they read through row-wise operators is split by owner from its files in tasks
        raw = state.plan.read_by_owner_stages if per_owner else set()
        scattered = {n for n, i in state.circuit.inputs.items()
                     if i in state.plan.scatter_chains} if per_owner else set()
        changes = {n: state.inputs[n].pushed_files(files[n], consolidated=n not in raw)
                   if n in scattered else
                   state.inputs[n].change(files[n], consolidated=n not in raw)
                   for n in names}
    ctx = StepContext(state.spark, s, sql=sql, layout=state.layout,
                      per_owner=per_owner, gang_stages=state.spark_gang_stages)
    if per_owner:  # a view's owner stage may have its tasks write the view's change
        named = Counter(state.circuit.outputs.values())
        ctx.view_files = {node_id: target for name, node_id in state.circuit.outputs.items()
                          if named[node_id] == 1
                          and (target := state.outputs[name].files_for_tasks(s)) is not None}
    recorded = state.divisions.outputs(s) or {}
    try:
        with quiet_query_context_logs():  # (a failure is raised named: PySpark's log dropped)
            evaluating = add_seconds(result.phase_seconds, "read", started)
            node_changes = state.plan.evaluate(ctx, changes)
            writing = add_seconds(result.phase_seconds, "operators", evaluating)
            result.operator_seconds = dict(ctx.operator_seconds)
            result.spark_jobs = list(ctx.spark_jobs)
            # (a Spark step's view change the owner stage collected is written on the driver,
            # not consolidated again when its tasks' outputs together are)
            for node_id in ctx.consolidated_changes:
                state.sql.assume_consolidated(node_changes[node_id],
                                              state.plan.schemas[node_id].fieldNames())
            prepared = {name: state.outputs[name].prepare(
                            s, node_changes[node_id],
                            state.sql if isinstance(node_changes[node_id], pa.Table) else sql,
                            recorded.get(name))
                        for name, node_id in state.circuit.outputs.items()}
            # the trace files written behind the computation are all written before anything of
            # the step is recorded; a failed one fails the step (``storage/write_behind.py``)
            state.db.wait_for_writes()
    finally:
        ctx.release()  # (the step's scratch folders: a Spark step's exchange files)
    add_seconds(result.phase_seconds, "outputs", writing)
    return prepared


def commit(state: EngineState, compact: bool = True,
           circuit_change: dict[str, Any] | None = None) -> int:
    """Commit the state database (a checkpoint; durable when this returns), its entry carrying
    the step records staged since the last fold, and return the new state version; then, with
    ``compact``, the upkeep after a commit (``upkeep.after_commit``). ``circuit_change``: the
    commit is an upgrade's (``circuit_upgrade.py``), which its entry records."""
    state.db.put(CARRIED_RECORDS_KEY, state.divisions.pending_records())
    version = state.db.commit(circuit_change=circuit_change)
    state.uncommitted_steps = 0
    state.commits += 1
    if compact:
        upkeep.after_commit(state)
    return version


def records_anything(state: EngineState) -> bool:
    """Whether ``commit`` now would record anything the newest checkpoint does not: an
    executed step, a state table staged or loaded at another version (a merge applied), other
    metadata, or the step records it would carry."""
    return bool(state.uncommitted_steps) or state.db.changed(
        {CARRIED_RECORDS_KEY: state.divisions.pending_records()})


def load_pending(state: EngineState) -> None:
    """After opening a state version: the step records its entry carries, and the output logs'
    pending writes (the recorded steps their Delta tables do not hold)."""
    state.divisions.load_pending(state.db.get(CARRIED_RECORDS_KEY))
    for name, out in state.outputs.items():
        out.load_pending({s: outputs[name] for s in state.divisions.steps_with_outputs(0)
                          if (outputs := state.divisions.outputs(s)) is not None
                          and name in outputs})


# -- recovery ------------------------------------------------------------------------------
def recover(state: EngineState) -> list[StepResult]:
    """Re-execute the steps whose division was recorded after the opened state version (a
    crash came before their commit): each reads exactly its recorded input, and its output,
    already written, is discarded by the output logs' write rules. A step that fails stops the
    recovery there: it is ``failed_step``, and the root stays usable."""
    replayed = []
    while state.divisions.get(state.db.get_step()) is not None:
        try:
            replayed.append(execute_step(state))
        except StepFailedError as e:
            log.error("%s", e)
            break
    return replayed


def _roll_back(state: EngineState, until: int) -> None:
    """After a failed step: reopen the newest checkpoint (discarding what the step and the
    uncommitted steps before it appended to the traces) and execute again the steps from there
    up to ``until`` (they succeeded before; their outputs are verified, not written twice). If
    that fails too, the state is abandoned: reopen the root."""
    state.rolling_back = True
    if state.migration is not None:  # its copy is of traces about to be rolled back
        state.migration.abort(f"step {until} failed while the state was being copied")
    try:
        state.compactor.apply_finished(wait=True)
        state.db.open(state.db.version, retained=state.retain_checkpoints,
                      from_step=state.divisions.compacted_below)
        state.load_opened()
        load_pending(state)
        while state.db.get_step() < until:
            execute_step(state)
    except BaseException:
        state.abandon()
        raise
    finally:
        state.rolling_back = False


# -- quarantine ----------------------------------------------------------------------------
def quarantine(state: EngineState, step: int) -> QuarantineResult:
    """Quarantine the input of ``step``, the failed next step, and execute it with no input
    (``Pipeline.quarantine_step`` states the contract). The atomic point is the quarantine
    record in the division log; ``complete_quarantine`` finishes the rest whenever the step
    executes."""
    state.require_no_migration("quarantine a step of")
    failed = state.failed_step
    if failed is None or failed.step != step:
        raise UsageError(
            f"step {step} of pipeline '{state.circuit.name}' has not failed (next step: "
            f"{state.db.get_step()}, failed step: "
            f"{'none' if failed is None else failed.step}); only the input of a "
            "failed step can be quarantined")
    written = [n for n, o in state.outputs.items()
               if o.last() > step or state.divisions.outputs(step) is not None]
    if written:
        raise UsageError(
            f"step {step} of pipeline '{state.circuit.name}' succeeded once (its output "
            f"to {written} is written): it is not quarantined; step again to retry it")
    reason = f"step {step} failed: {failed.error}"
    state.divisions.quarantine(step, reason)
    return QuarantineResult(step, reason, input_rows(state, step), execute_step(state))


def division_files(state: EngineState, step: int) -> dict[str, list[DataFile]]:
    """Per input, the log files the division of ``step`` covers (its pushes)."""
    uppers = state.divisions.get(step) or {}
    lowers = state.divisions.lower(step, list(state.inputs))
    return {n: log_.files_between(lowers[n], uppers.get(n, lowers[n]))
            for n, log_ in state.inputs.items()}


def input_rows(state: EngineState, step: int) -> dict[str, int]:
    """Per input, the records of ``step``'s division (from the log's file statistics)."""
    return {n: sum(f.rows for f in files) for n, files in division_files(state, step).items()}


def complete_quarantine(state: EngineState, step: int, reason: str) -> None:
    """Before a quarantined step executes (the first time, or again after a crash or a
    restore): its records are in the errors table and out of the input logs. Both parts are
    idempotent, so whatever a crash interrupted is completed here."""
    files = division_files(state, step)
    _move_input_to_errors(state, step, reason, files)
    for name, log_ in state.inputs.items():
        log_.remove(files[name])


def _move_input_to_errors(state: EngineState, step: int, reason: str,
                          files: dict[str, list[DataFile]]) -> None:
    """Write the records of ``step``'s input (``files``, per input) to the errors table, whole
    (payload and ``_weight`` as one JSON object each), once: one commit per input, recorded as
    the app transaction ``errors/quarantine/<input>`` at version ``step``."""
    sink = ErrorsSink(state.spark, state.root)
    for name, log_ in state.inputs.items():
        producer = QUARANTINE_PRODUCER + name
        done = sink.recorded_upto(producer)
        if done is not None and done >= step:
            continue
        sink.record_tables(producer, step, _quarantined(
            sink, name, step, reason, (log_.table.read_arrow([f]) for f in files[name])))


def _quarantined(sink: ErrorsSink, name: str, step: int, reason: str,
                 parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """Errors-table rows of ``step``'s records of input ``name`` (``parts``, in order), each
    record a JSON object, numbered by its place in the step's input (its error id's offset)."""
    offset = 0
    for part in parts:
        rows = [json.dumps(r, sort_keys=True, default=str) for r in part.to_pylist()]
        yield sink.rows(name, f"step {step}", reason, rows, offset)
        offset += len(rows)


# -- what the divisions tell ---------------------------------------------------------------
def input_pending(state: EngineState) -> bool:
    """Whether the next step has input: a recorded division to replay, or pushes since."""
    s = state.db.get_step()
    if state.divisions.get(s) is not None:
        return True
    lowers = state.divisions.lower(s, list(state.inputs))
    return any(log_.files_between(lowers[n], log_.version())
               for n, log_ in state.inputs.items())


def step_info(state: EngineState, step: int) -> StepInfo:
    """Which input step ``step`` consumed: per input, the log versions ``(lower, upper]``, and
    the tracked producers' offsets; ``UsageError`` for a step not divided, or whose division
    was compacted (below the oldest retained checkpoint's step)."""
    if step < state.divisions.compacted_below:
        raise UsageError(f"the division of step {step} of pipeline '{state.circuit.name}' "
                         f"was compacted: divisions are kept from step "
                         f"{state.divisions.compacted_below} on (the oldest retained "
                         "checkpoint's step)")
    uppers = state.divisions.get(step)
    if uppers is None:
        raise UsageError(f"step {step} of pipeline '{state.circuit.name}' has not been "
                         f"executed (next step: {state.db.get_step()})")
    names = list(state.inputs)
    lowers = state.divisions.lower(step, names)
    before = state.divisions.offsets(step - 1) if step > 0 else {}
    offsets = {n: {producer: ((before.get(n) or {}).get(producer), upto)
                   for producer, upto in ps.items()}
               for n, ps in state.divisions.offsets(step).items()}
    return StepInfo(step, {n: (lowers[n], uppers.get(n, lowers[n])) for n in names}, offsets)


def consumed_upto(state: EngineState, name: str) -> int:
    """The version of input ``name``'s log the newest executed step read up to (0: none)."""
    step = state.db.get_step() - 1
    division = state.divisions.get(step) if step >= 0 else None
    return (division or {}).get(name, 0)
