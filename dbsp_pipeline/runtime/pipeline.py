"""``Pipeline``: a circuit running over state kept under one root folder.

Layout of a pipeline root::

    _manifest/        the state database's manifest (one entry per state version)
    _divisions/       the division of input into steps
    inputs/<name>/    the durable log of each input (one Delta version per push)
    state/<trace>/    the traces of the stateful operators
    outputs/<name>/   the change log of each output view (``_step`` and ``_weight`` columns)

The step protocol (``step``), top to bottom:

1. ``s = get_step()``: the next step to execute.
2. Fix the division of input for step ``s``: the newest version of every input log, recorded
   durably in the division log *before* any output of ``s`` exists. If ``s`` was already divided
   (a crash after the division, before the state commit), the recorded division is re-used.
3. Read each input's change: the log files appended in versions ``(lower, upper]``.
4. Evaluate every operator once; stateful operators append to their traces. A step whose input
   change is small (``driver_step_rows``) runs on the driver (Arrow + DuckDB), a larger one as
   Spark jobs; both compute the same change and read and write the same traces.
5. Write every output's change under the output write rules (a step already written is
   discarded, so replay after a crash duplicates nothing).
6. ``set_step(s + 1)``; every ``checkpoint_every`` steps, commit the state database: the manifest
   commit is the atomic point that makes the traces of steps ``..s`` the recovery base. After a
   commit, traces with many files are merged in the background (``compactor.py``); a finished
   merge is applied before the next step starts.

Reopening a root after a crash opens the newest committed state version and at once executes
again the steps divided after it, from their recorded divisions (``recovered_steps``); their
outputs were already written and are discarded by the write rules, so a consumer of the output
logs sees every step exactly once.

A step that fails in 4-5 (an overflow, an expression error, a failed task) commits nothing:
every view's change is computed and its files written before any output log commits it, and
the state goes back to the newest checkpoint and executes again the steps before the failed
one. The division stays recorded, so the step is the next one whatever happens: ``step`` tries
it again (a transient cause heals), opening the root reports it (``failed_step``) instead of
failing, and an operator can quarantine its input (``quarantine_step``: the records go to the
errors table and the step executes with no input).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import Circuit
from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.errors import (
    ConcurrentWriterError,
    NonDeterminismError,
    PipelineClosedError,
    PipelineFencedError,
    StepFailedError,
    UnknownNameError,
    UsageError,
)
from dbsp_pipeline.operators.base import StepContext
from dbsp_pipeline.runtime import records, upgrade
from dbsp_pipeline.runtime.compactor import BackgroundCompactor
from dbsp_pipeline.runtime.division_log import DivisionLog
from dbsp_pipeline.runtime.input_log import InputLog
from dbsp_pipeline.runtime.layout import LAYOUT_KEY, Layout
from dbsp_pipeline.runtime.migration import ShardMigration
from dbsp_pipeline.runtime.output_log import OutputLog, PreparedWrite
from dbsp_pipeline.runtime.plan import SCHEMA_CACHE_FILE, Plan
from dbsp_pipeline.runtime.readers import DEFAULT_LEASE_SECONDS, LeaseRegistry, Reader
from dbsp_pipeline.spark_session import LazySession, configure
from dbsp_pipeline.storage import crash_points, garbage
from dbsp_pipeline.storage.delta_table import DataFile
from dbsp_pipeline.storage.garbage import ORPHAN_GRACE_SECONDS
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import COMPACT_FILE_THRESHOLD
from dbsp_pipeline.storage.verify import VerifyReport, prepare_open, verify_root


#: The file in a pipeline root caching the schemas Spark analysed for its circuit.
PLAN_SCHEMAS_FILE = SCHEMA_CACHE_FILE
#: Garbage is collected after every this many commits (and at close).
GC_EVERY_COMMITS = 16
#: Default of ``Pipeline(driver_step_rows=...)``.
DRIVER_STEP_ROWS = 200_000
#: The errors-sink producer of a quarantined step's records of one input: ``quarantine/<input>``
QUARANTINE_PRODUCER = "quarantine/"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInfo:
    """The input a step consumed: per input, the log versions ``(lower, upper]`` (the step
    read the pushes committed as versions ``lower+1 .. upper`` of ``inputs/<name>``)."""

    step: int
    inputs: dict[str, tuple[int, int]]
    #: per input, per tracked producer (``track_producers``), the sequence numbers (offsets)
    #: ``(after, upto]`` the step consumed; ``after`` is None when the step before did not track
    #: it (then everything up to ``upto`` not consumed before)
    offsets: dict[str, dict[str, tuple[int | None, int | None]]] = field(default_factory=dict)


@dataclass
class StepResult:
    """What one step did."""

    step: int
    #: raw rows read from each input's log for this step
    inputs: dict[str, int] = field(default_factory=dict)
    #: rows of each output's change (after consolidation); None when a replayed step was discarded
    outputs: dict[str, int | None] = field(default_factory=dict)
    seconds: float = 0.0
    #: the state version committed after this step, if the step ended with a commit
    committed_version: int | None = None
    #: whether the step ran on the driver (small change) rather than as Spark jobs
    on_driver: bool = False
    #: per input fed by a tracked source, invalid records left out of the step's pushes (they
    #: are in the errors sink); empty for inputs fed by ``push`` alone
    rejected: dict[str, int] = field(default_factory=dict)
    #: why the step's input was quarantined (``quarantine_step``): it executed with no input
    quarantined: str | None = None


@dataclass(frozen=True)
class FailedStep:
    """The next step, divided, whose execution failed: ``error`` says how (the exception's
    type and message)."""

    step: int
    error: str


@dataclass
class QuarantineResult:
    """What ``quarantine_step`` did: the reason recorded, per input the records moved to the
    errors table, and the step's execution with no input."""

    step: int
    reason: str
    moved: dict[str, int]
    result: StepResult


@dataclass
class RescaleResult:
    """What a layout change did: the layouts, the step the pipeline stopped at, the state rows,
    the rows whose owner changed, the rows rewritten, and the seconds it took."""

    old: Layout
    new: Layout
    step: int
    rows: int = 0
    moved_rows: int = 0
    rewritten_rows: int = 0
    seconds: float = 0.0
    state_version: int | None = None
    #: a hot change (``rescale(hot=True)``): steps ran while the state was copied
    hot: bool = False
    #: hot: seconds copying (steps running), seconds steps were paused for the hand-over of
    #: what they changed meanwhile, steps executed during the copy, rows handed over
    copy_seconds: float = 0.0
    pause_seconds: float = 0.0
    steps_during_copy: int = 0
    caught_up_rows: int = 0


@dataclass(frozen=True)
class Checkpoint:
    """A retained, consistent state version: what ``restore`` can go back to."""

    version: int
    #: the next step to execute from this checkpoint (steps ``..step-1`` are in its state)
    step: int
    layout: Layout
    fingerprint: str | None
    engine_version: str | None
    state_format: int | None


@contextlib.contextmanager
def _fenced_at_open(circuit: Circuit, root: str):
    """Opening rolls state tables back to the newest checkpoint: if another process writes
    them meanwhile, this one lost the race (the fencing error), like a lost commit later."""
    try:
        yield
    except ConcurrentWriterError as e:
        raise PipelineFencedError(
            f"pipeline '{circuit.name}' at {root} is being run by another process ({e})") from e


class Pipeline:
    """Creates, or reopens and recovers, the pipeline of ``circuit`` at ``root``.

    Args:
        circuit: the declared circuit. Reopening a root built by a different circuit fails with
            ``CircuitChangedError``.
        root: a local folder (created if missing).
        spark: the session to use; ``None`` (or a ``LazySession``) means the process's local
            session, started only when something needs Spark (a large step, a read as a
            DataFrame, the first compilation of the circuit at this root).
        checkpoint_every: commit the state database after this many steps (1: every step).
        driver_step_rows: a step whose inputs changed by at most this many rows runs on the
            driver (Arrow + DuckDB) instead of as Spark jobs, which saves Spark's fixed cost of
            about 0.1 s per job; 0 runs every step on Spark.
        compact_threshold: a trace with more files than this is merged in the background.
        retain_steps: keep the exact history of the last this many steps of every output log
            (``view(as_of=...)``, ``changes(since=...)``) and collapse older history at each
            checkpoint, never past what a live reader's ``since`` needs; ``None`` keeps all.
        retain_checkpoints: how many state versions (checkpoints) stay readable; older files
            are deleted by ``collect_garbage`` (run every ``GC_EVERY_COMMITS`` commits and at
            close). At least 2: the two-version database (``docs/recovery.md``, section 5).
        checkpoint: open this retained checkpoint instead of the newest, as ``restore`` does
            (the way back when the newest state is damaged).

    Opening checks what it reads first (``storage/verify.py``): damaged storage is
    ``CorruptStateError``, naming the table, version and file, and an intact older checkpoint
    to pass as ``checkpoint`` if there is one.
    """

    def __init__(self, circuit: Circuit, root: str, spark: SparkSession | LazySession | None = None, *,
                 checkpoint_every: int = 1,
                 driver_step_rows: int = DRIVER_STEP_ROWS,
                 compact_threshold: int = COMPACT_FILE_THRESHOLD,
                 retain_steps: int | None = None,
                 retain_checkpoints: int = 2,
                 checkpoint: int | None = None) -> None:
        if not circuit.outputs:
            raise UsageError(f"circuit '{circuit.name}' declares no output")
        if checkpoint_every < 1:
            raise UsageError("checkpoint_every must be at least 1")
        self.circuit = circuit
        self.root = root
        if spark is None:
            spark = LazySession()
        self.spark = spark if isinstance(spark, LazySession) else configure(spark)
        self.checkpoint_every = checkpoint_every
        self.driver_step_rows = driver_step_rows
        self._sql = LocalSQL()
        prepare_open(root, checkpoint, retain_checkpoints)  # damage: CorruptStateError
        self._db = StateDatabase(self.spark, root, circuit.fingerprint())
        with _fenced_at_open(circuit, root):  # opening rolls back and may commit: a race too
            self._db.open(checkpoint, retained=retain_checkpoints)
            #: what opening did about engine and state-format versions (``runtime/upgrade.py``)
            self.upgrade_info = upgrade.migrate(self._db)
            if self.upgrade_info.migrations:
                self._db.commit()  # the migrated state, as a checkpoint in the current format
            #: the assignment of shards to workers, recorded with every checkpoint
            self.layout = Layout.from_json(self._db.get(LAYOUT_KEY))
            self._db.put(LAYOUT_KEY, self.layout.to_json())
            self._plan = self._compile()
        self._inputs = {name: InputLog(self.spark, root, name, self._plan.input_schema(name))
                        for name in circuit.inputs}
        self._outputs = {name: OutputLog(self.spark, root, name, self._plan.output_schema(name))
                         for name in circuit.outputs}
        self._divisions = DivisionLog(self.spark, root_layout.divisions(root))
        if retain_steps is not None and retain_steps < 0:
            raise UsageError("retain_steps must be at least 0")
        self.retain_steps = retain_steps
        if retain_checkpoints < 2:
            raise UsageError("retain_checkpoints must be at least 2 (the current state version "
                             "and the one before it)")
        self.retain_checkpoints = retain_checkpoints
        self._commits = 0
        self._leases = LeaseRegistry(self._db.root)
        self._compactor = BackgroundCompactor(compact_threshold)
        self._lock = threading.RLock()  # one push, step or commit at a time
        self._control = threading.Condition()  # run() and pause/stop/resume
        self._running = False
        self._halt_at: int | None = None  # run() starts no step >= this (-1: none at all)
        self._uncommitted_steps = 0
        self._closed = False
        self._tracked: dict[str, set[str]] = {}  # input -> producers whose offsets divisions record
        self._migration: ShardMigration | None = None  # a hot layout change in progress
        self._holding_merges = False  # no merge starts (a hot layout change is about to begin)
        #: the next step, if its execution failed (see the module doc); None when it did not
        self.failed_step: FailedStep | None = None
        self._rolling_back = False  # a failed step's roll-back is executing steps again
        #: the steps executed again at open: divided before a crash, not yet committed
        self.recovered_steps: list[StepResult] = self._recover()

    def _compile(self) -> Plan:
        return Plan(self.circuit, self.spark, self._db,
                    schema_cache=os.path.join(self._db.root, PLAN_SCHEMAS_FILE))

    def _recover(self) -> list[StepResult]:
        """Re-execute the steps whose division was recorded after the opened state version
        (a crash came before their commit): each reads exactly its recorded input, and its
        output, already written, is discarded by the output logs' write rules. A step that
        fails stops the recovery there: it is ``failed_step``, and the root stays usable."""
        replayed = []
        while self._divisions.get(self._db.get_step()) is not None:
            try:
                replayed.append(self.step())
            except StepFailedError as e:
                log.error("%s", e)
                break
        return replayed

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Commit any executed steps and close. Pushed but unprocessed input stays in the logs."""
        if self._closed:
            return
        if self._compactor.apply_finished(wait=True) or self._uncommitted_steps:
            self.commit(compact=False)
        self.collect_garbage()
        self._compactor.close()
        self._sql.close()
        self._closed = True

    # -- input -----------------------------------------------------------------------------
    def push(self, name: str, rows: Any, weight: int = 1, *, producer: str | None = None,
             seq: int | None = None) -> int:
        """Durably append rows to input ``name`` (``weight=-1`` deletes); returns how many.

        ``rows``: a list of dicts or tuples, a pandas or Spark DataFrame, or a pyarrow Table.
        The batch is checked first and recorded whole or not at all; once ``push`` returns it is
        durable and belongs to the next step.

        Idempotent pushes: with ``producer`` (a name) and ``seq`` (its batch number, increasing)
        the batch is recorded together with its number, atomically. A batch whose ``seq`` is not
        above the producer's newest recorded number (``pushed``) was already recorded: nothing is
        appended and 0 is returned. So a producer that does not know whether a push went through
        (a crash, a timeout) pushes the same batch again, or asks ``pushed`` where to resume.
        """
        self._require_open()
        with self._lock:
            return self._push(name, rows, weight, producer, seq)

    def _push(self, name: str, rows: Any, weight: int, producer: str | None,
              seq: int | None) -> int:
        log = self._input(name)
        weight = records.check_weight(name, weight)
        if self._already_pushed(log, producer, seq):
            return 0
        if isinstance(rows, DataFrame):
            df = records.check_spark(name, rows, log.schema, weight)
            return log.append_spark(df, producer, seq)
        table = records.to_arrow(name, rows, log.schema, log.arrow_schema, weight)
        if table.num_rows or producer is not None:
            log.append_arrow(table, producer, seq)
        return table.num_rows

    def push_zset(self, name: str, table: pa.Table, *, producer: str | None = None,
                  seq: int | None = None, rejected: int = 0) -> int:
        """``push`` a Z-set: an Arrow table of the input's columns plus ``_weight`` (a nonzero
        integer per row: its multiplicity, negative to delete). Same checks, durability and
        idempotence as ``push``; returns how many rows were appended. ``rejected``: how many
        records of the source batch were invalid and left out (recorded with the push, and
        reported in the result of the step that consumes it)."""
        self._require_open()
        with self._lock:
            log = self._input(name)
            if self._already_pushed(log, producer, seq):
                return 0
            zset = records.zset_to_arrow(name, table, log.schema, log.arrow_schema)
            if zset.num_rows or producer is not None:
                log.append_arrow(zset, producer, seq, rejected)
            return zset.num_rows

    @staticmethod
    def _already_pushed(log: InputLog, producer: str | None, seq: int | None) -> bool:
        """Check a push's producer and sequence number; whether that batch was recorded."""
        name = log.name
        if (producer is None) != (seq is None):
            raise UsageError(f"input '{name}': give both producer and seq, or neither")
        if producer is None:
            return False
        if not isinstance(producer, str) or not producer:
            raise UsageError(f"input '{name}': producer must be a non-empty string, "
                             f"got {producer!r}")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise UsageError(f"input '{name}': seq must be an integer >= 0, got {seq!r}")
        last = log.pushed(producer)
        return last is not None and seq <= last

    def input_schema(self, name: str) -> StructType:
        """The columns of input ``name`` (without ``_weight``)."""
        return self._input(name).schema

    def input_arrow_schema(self, name: str) -> pa.Schema:
        """The Arrow schema of input ``name``'s log: its columns and ``_weight``."""
        return self._input(name).arrow_schema

    def track_producers(self, name: str, producers: list[str]) -> None:
        """Record, with every step's division from now on, the newest sequence number of each
        of ``producers`` on input ``name`` (``step_info`` then tells the offsets a step
        consumed). A source whose sequence numbers are its offsets (Kafka) calls this."""
        self._input(name)
        self._tracked.setdefault(name, set()).update(producers)

    def pushed(self, name: str, producer: str) -> int | None:
        """The newest sequence number ``producer`` pushed to input ``name`` (None if none)."""
        self._require_open()
        return self._input(name).pushed(producer)

    # -- steps -----------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Execute one step over the input pushed since the previous one. See the module doc.

        Raises ``PipelineFencedError`` (and closes this object) when another process running the
        same root recorded the step's division first, or wrote the state since this one opened.
        Raises ``StepFailedError`` when the step's computation failed: nothing of it is
        committed, it stays the next step (``failed_step``), and the next ``step`` tries it
        again; ``quarantine_step`` executes it without its input instead.
        """
        self._require_open()
        with self._lock, self._fenced():
            return self._step()

    def quarantine_step(self, step: int) -> QuarantineResult:
        """Quarantine the input of ``step``, the next step, whose execution failed
        (``failed_step``; e.g. its records overflow a weight): every record the step's division
        covers is moved to the errors table (``_errors``, with the failure as reason), and the
        step executes with no input. Exactly-once holds for every other record: the steps after
        it read what they would have read, and a Kafka source resumes after the offsets the
        step covered. Returns what moved and the step's result.

        Refused for a step that is not the failed one, or whose output was written (it
        succeeded once: retry it). Crash-safe: (1) a second record of the step's division marks
        it quarantined (``division_log.py``): the atomic point; a crash before it leaves the
        step failed as it was. Then, whenever the quarantined step executes (now, at reopen
        after a crash, after a restore): (2) its records are written to the errors table, once
        per input; (3) they are taken out of the input logs; (4) it executes with no input. If
        it fails even with no input (the cause is in the state), it stays the failed step.
        """
        self._require_open()
        with self._lock, self._fenced():
            self._no_migration("quarantine a step of")
            failed = self.failed_step
            if failed is None or failed.step != step:
                raise UsageError(
                    f"step {step} of pipeline '{self.circuit.name}' has not failed (next step: "
                    f"{self._db.get_step()}, failed step: "
                    f"{'none' if failed is None else failed.step}); only the input of a "
                    "failed step can be quarantined")
            written = [n for n, o in self._outputs.items() if o.last() > step]
            if written:
                raise UsageError(
                    f"step {step} of pipeline '{self.circuit.name}' succeeded once (its output "
                    f"to {written} is written): it is not quarantined; step again to retry it")
            reason = f"step {step} failed: {failed.error}"
            self._divisions.quarantine(step, reason)
            return QuarantineResult(step, reason, self._input_rows(step), self._step())

    def _division_files(self, step: int) -> dict[str, list[DataFile]]:
        """Per input, the log files the division of ``step`` covers (its pushes)."""
        uppers = self._divisions.get(step) or {}
        lowers = self._divisions.lower(step, list(self._inputs))
        return {n: log_.files_between(lowers[n], uppers.get(n, lowers[n]))
                for n, log_ in self._inputs.items()}

    def _input_rows(self, step: int) -> dict[str, int]:
        """Per input, the records of ``step``'s division (from the log's file statistics)."""
        return {n: sum(f.rows for f in files) for n, files in self._division_files(step).items()}

    def _complete_quarantine(self, step: int, reason: str) -> None:
        """Before a quarantined step executes (the first time, or again after a crash or a
        restore): its records are in the errors table and out of the input logs. Both parts
        are idempotent, so whatever a crash interrupted is completed here."""
        files = self._division_files(step)
        self._move_input_to_errors(step, reason, files)
        for name, log_ in self._inputs.items():
            log_.remove(files[name])

    def _move_input_to_errors(self, step: int, reason: str,
                              files: dict[str, list[DataFile]]) -> None:
        """Write the records of ``step``'s input (``files``, per input) to the errors table,
        whole (payload and ``_weight`` as one JSON object each), once: one commit per input,
        recorded as the app transaction ``errors/quarantine/<input>`` at version ``step``."""
        sink = ErrorsSink(self.spark, self.root)
        for name, log_ in self._inputs.items():
            producer = QUARANTINE_PRODUCER + name
            done = sink.recorded_upto(producer)
            if done is not None and done >= step:
                continue
            sink.record_tables(producer, step, (
                sink.rows(name, f"step {step}", reason,
                          [json.dumps(r, sort_keys=True, default=str) for r in
                           log_.table.read_arrow([f]).to_pylist()])
                for f in files[name]))

    def _step(self) -> StepResult:
        started = time.monotonic()
        self._compactor.apply_finished()
        s = self._db.get_step()
        names = list(self._inputs)

        # 1-2. The division of input for step s: recorded before any output of s exists.
        uppers = self._divisions.get(s)
        if uppers is None:
            offsets = {n: {producer: self._inputs[n].pushed(producer) for producer in sorted(ps)}
                       for n, ps in self._tracked.items()}
            uppers = self._divisions.record(s, {n: self._inputs[n].version() for n in names},
                                            offsets)
        lowers = self._divisions.lower(s, names)
        result = StepResult(step=s, quarantined=self._divisions.quarantined(s))
        result.rejected = {n: self._inputs[n].rejected_between(lowers[n], uppers.get(n, 0))
                           for n in self._tracked}

        if result.quarantined is not None:
            self._complete_quarantine(s, result.quarantined)

        # 3-5. Read the input, evaluate the circuit, write every view's change as files, then
        # commit them. Nothing of a step that fails here stays: the state goes back to the
        # newest checkpoint (module doc); a failure of the computation is StepFailedError.
        computed = False
        try:
            prepared = self._compute(s, lowers, uppers, result)
            computed = True
            for name, write in prepared.items():
                result.outputs[name] = (None if write is None
                                        else self._outputs[name].commit(write))
        except ConcurrentWriterError:
            raise  # fenced: this object is closed
        except Exception as e:  # noqa: BLE001 (any failure of the step)
            if self._rolling_back:
                raise
            self._roll_back(until=s)
            if computed or isinstance(e, (NonDeterminismError, UsageError)):
                raise  # not the computation's fault: the step is retried as it is
            error = f"{type(e).__name__}: {e}".strip()
            self.failed_step = FailedStep(s, error)
            raise StepFailedError(self.circuit.name, s, error) from e
        except BaseException:
            self._abandon()  # interrupted half-way: reopen the root
            raise
        self.failed_step = None

        # 6. Advance, and commit every checkpoint_every steps.
        self._db.set_step(s + 1)
        self._uncommitted_steps += 1
        if self._uncommitted_steps >= self.checkpoint_every:
            result.committed_version = self.commit()
        result.seconds = time.monotonic() - started
        return result

    def _compute(self, s: int, lowers: dict[str, int], uppers: dict[str, int],
                 result: StepResult) -> dict[str, PreparedWrite | None]:
        """Steps 3-5 of step ``s`` up to the commits: each input's change (none if the step is
        quarantined; a small change is read on the driver), the circuit's evaluation (stateful
        operators append to their traces), and every view's change written as data files."""
        names = list(self._inputs)
        files = {n: [] if result.quarantined is not None else
                 self._inputs[n].files_between(lowers[n], uppers.get(n, 0)) for n in names}
        result.inputs = {n: sum(f.rows for f in fs) for n, fs in files.items()}
        result.on_driver = (0 < self.driver_step_rows
                            and sum(result.inputs.values()) <= self.driver_step_rows
                            and self._plan.runs_on_driver)
        sql = self._sql if result.on_driver else None
        if sql is not None:
            changes = {n: self._inputs[n].change_arrow(sql, files[n]) for n in names}
        else:
            changes = {n: self._inputs[n].change(files[n]) for n in names}
        ctx = StepContext(self.spark, s, sql=sql)
        try:
            node_changes = self._plan.evaluate(ctx, changes)
            return {name: self._outputs[name].prepare(s, node_changes[node_id], sql)
                    for name, node_id in self.circuit.outputs.items()}
        finally:
            ctx.release()

    def _roll_back(self, until: int) -> None:
        """After a failed step: reopen the newest checkpoint (discarding what the step and the
        uncommitted steps before it appended to the traces) and execute again the steps from
        there up to ``until`` (they succeeded before; their outputs are verified, not written
        twice). If that fails too, this object is closed: reopen the root."""
        self._rolling_back = True
        if self._migration is not None:  # its copy is of traces about to be rolled back
            self._migration.abort(f"step {until} failed while the state was being copied")
        try:
            self._compactor.apply_finished(wait=True)
            self._db.open(self._db.version, retained=self.retain_checkpoints)
            self.layout = Layout.from_json(self._db.get(LAYOUT_KEY))
            self._db.put(LAYOUT_KEY, self.layout.to_json())
            self._plan = self._compile()
            self._uncommitted_steps = 0
            while self._db.get_step() < until:
                self._step()
        except BaseException:
            self._abandon()
            raise
        finally:
            self._rolling_back = False

    def _abandon(self) -> None:
        """Close this object without committing (its state may hold half a step), as a dead
        process would: reopening the root recovers from the newest checkpoint."""
        self._closed = True
        self._compactor.close()

    def run(self, max_steps: int | None = None, max_seconds: float | None = None,
            checkpoint_every: int | None = None, idle_seconds: float = 0.0) -> list[StepResult]:
        """Execute steps while input is available (a coordinator iteration), then commit.

        Stops when no input is pending (after waiting up to ``idle_seconds`` for some), after
        ``max_steps`` steps, once ``max_seconds`` have passed (the step running then completes),
        or when ``pause``/``stop`` say so. ``checkpoint_every`` overrides the pipeline's for this
        run. Other threads may ``push`` meanwhile. Returns the results of the executed steps.
        """
        self._require_open()
        if checkpoint_every is not None and checkpoint_every < 1:
            raise UsageError("checkpoint_every must be at least 1")
        saved, started = self.checkpoint_every, time.monotonic()
        if checkpoint_every is not None:
            self.checkpoint_every = checkpoint_every
        results: list[StepResult] = []
        with self._control:
            self._running = True
        try:
            while not self._halted():
                if max_steps is not None and len(results) >= max_steps:
                    break
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
                with self._lock:
                    if self.input_pending():
                        results.append(self.step())
                        continue
                if not self._wait_for_input(started, idle_seconds, max_seconds):
                    break
        finally:
            self.checkpoint_every = saved
            with self._lock:
                if self._uncommitted_steps and not self._closed:
                    committed = self.commit()
                    if results:
                        results[-1].committed_version = committed
            with self._control:
                self._running = False
                self._control.notify_all()
        return results

    def pause(self, timeout: float | None = 600.0) -> int:
        """Stop ``run`` (in another thread) after the step it is executing, and keep it from
        starting steps until ``resume``; returns the step the pipeline stopped at (the next
        step to execute; every step before it is done and committed)."""
        with self._control:
            self._halt_at = -1
            self._control.notify_all()
            self._control.wait_for(lambda: not self._running, timeout)
        return self.next_step

    def stop(self, step: int) -> None:
        """Let ``run`` execute the steps before ``step`` only: it stops there, so that every
        worker stops at the same step (e.g. before a layout change). ``resume`` lifts it."""
        with self._control:
            self._halt_at = step
            self._control.notify_all()

    def resume(self) -> None:
        """Lift ``pause`` or ``stop``."""
        with self._control:
            self._halt_at = None
            self._control.notify_all()

    def _halted(self) -> bool:
        halt = self._halt_at
        return halt is not None and (halt < 0 or self._db.get_step() >= halt)

    def _wait_for_input(self, started: float, idle_seconds: float,
                        max_seconds: float | None) -> bool:
        """Wait up to ``idle_seconds`` for pending input; returns whether there is some."""
        deadline = time.monotonic() + idle_seconds
        if max_seconds is not None:
            deadline = min(deadline, started + max_seconds)
        while time.monotonic() < deadline:
            with self._control:
                self._control.wait(0.01)
            if self._halted():
                return False
            with self._lock:
                if self.input_pending():
                    return True
        return False

    def input_pending(self) -> bool:
        """Whether the next step has input: a recorded division to replay, or pushes since."""
        self._require_open()
        s = self._db.get_step()
        if self._divisions.get(s) is not None:
            return True
        lowers = self._divisions.lower(s, list(self._inputs))
        return any(log.files_between(lowers[n], log.version())
                   for n, log in self._inputs.items())

    def step_info(self, step: int) -> StepInfo:
        """Which input step ``step`` consumed: per input, the log versions ``(lower, upper]``.

        Every executed (or divided) step can be mapped back to its input this way.
        """
        self._require_open()
        if step < self._divisions.compacted_below:
            raise UsageError(f"the division of step {step} of pipeline '{self.circuit.name}' "
                             f"was compacted: divisions are kept from step "
                             f"{self._divisions.compacted_below} on (the oldest retained "
                             "checkpoint's step)")
        uppers = self._divisions.get(step)
        if uppers is None:
            raise UsageError(f"step {step} of pipeline '{self.circuit.name}' has not been "
                             f"executed (next step: {self._db.get_step()})")
        names = list(self._inputs)
        lowers = self._divisions.lower(step, names)
        before = self._divisions.offsets(step - 1) if step > 0 else {}
        offsets = {n: {producer: ((before.get(n) or {}).get(producer), upto)
                       for producer, upto in ps.items()}
                   for n, ps in self._divisions.offsets(step).items()}
        return StepInfo(step, {n: (lowers[n], uppers.get(n, lowers[n])) for n in names}, offsets)

    def commit(self, compact: bool = True) -> int:
        """Commit the state database (a checkpoint); returns the new state version. Then, with
        ``compact``, start merging the traces that are due in the background."""
        self._require_open()
        with self._lock, self._fenced():
            version = self._db.commit()
        self._uncommitted_steps = 0
        self._commits += 1
        if compact and self._migration is None and not self._holding_merges:
            if self._commits % GC_EVERY_COMMITS == 0:
                self.collect_garbage()
            self._compactor.start(self._plan.traces())
            if self.retain_steps is not None:
                self.compact_history()
        return version

    def checkpoints(self) -> list[Checkpoint]:
        """The retained checkpoints (``retain_checkpoints`` of them at most), newest first."""
        self._require_open()
        return [Checkpoint(version=int(e["version"]), step=int(e.get("step", 0)),
                           layout=Layout.from_json(e.get("meta", {}).get(LAYOUT_KEY)),
                           fingerprint=e.get("fingerprint"),
                           engine_version=e.get("engine_version"),
                           state_format=e.get("state_format"))
                for e in self._db.checkpoints(self.retain_checkpoints)]

    def restore(self, version: int) -> list[StepResult]:
        """Go back to the retained checkpoint ``version`` (see ``checkpoints``): the state is
        rolled back to it, newer state versions are discarded, and the steps divided since are
        executed again from their recorded divisions. Their output was written before; the
        output logs verify it (``NonDeterminismError`` on a difference) and discard it, so
        consumers see nothing change. Returns the steps executed again.

        Use it when the newest state is suspect (a bug, a bad deploy, damaged storage): the
        input divisions and output logs are the source of truth, the state is rebuilt from
        them. Damaged commits after ``version`` in the state tables are set aside
        (``storage/set_aside.py``); a damaged ``version`` itself is ``CorruptStateError``.
        """
        self._require_open()
        with self._lock, self._fenced():
            self._no_migration("restore")
            if self._uncommitted_steps:
                self.commit(compact=False)  # so the outputs of executed steps are verified too
            self._compactor.apply_finished(wait=True)
            if prepare_open(self.root, version, self.retain_checkpoints):  # set damage aside
                self._db = StateDatabase(self.spark, self.root, self.circuit.fingerprint())
            self._db.open(version, retained=self.retain_checkpoints)
            self.layout = Layout.from_json(self._db.get(LAYOUT_KEY))
            self._db.put(LAYOUT_KEY, self.layout.to_json())
            self._plan = self._compile()  # operators over the rolled-back traces
            replayed = self._recover()
            if self._uncommitted_steps:
                self.commit(compact=False)
            return replayed

    def verify(self) -> VerifyReport:
        """Check every table of this pipeline's root and its retained checkpoints, as opening
        checks what it reads (``storage/verify.py``); reads only. See ``VerifyReport``."""
        self._require_open()
        with self._lock:
            return verify_root(self.root, self.retain_checkpoints)

    def rescale(self, workers: int, sharding: str | None = None, *,
                hot: bool = False) -> RescaleResult:
        """Change the layout to ``workers`` workers (and, if given, another sharding function;
        see ``runtime/layout.py``): every state file whose rows now belong to several workers
        is split by owner, and the new layout is committed with the state in one
        state-database commit. A crash before that commit reopens the old layout and its
        files, after it the new one; never a mix. No input is read again. Returns what moved.

        Cold (default): stops at a committed step (executed steps are committed first) and
        runs no step until done. Hot (``hot=True``, ``runtime/migration.py``): the state is
        copied as of a committed version while other threads keep executing steps (``run``)
        under the old layout; steps then pause only while what they changed during the copy
        is handed over and the layout committed.
        """
        self._require_open()
        if hot:
            return self._rescale_hot(workers, sharding)
        started = time.monotonic()
        with self._lock, self._fenced():
            old, new = self._begin_layout_change(workers, sharding)
            result = RescaleResult(old, new, self._db.get_step())
            for trace in self._plan.state_traces():
                stats = trace.relayout(old, new)
                result.rows += stats.rows
                result.moved_rows += stats.moved
                result.rewritten_rows += stats.rewritten
            result.state_version = self._commit_layout(new)
        result.seconds = time.monotonic() - started
        return result

    def _rescale_hot(self, workers: int, sharding: str | None) -> RescaleResult:
        """The hot layout change, in ICADD's phases (``ShardMigration``)."""
        started = time.monotonic()
        # No merge may run during the migration: let the running one finish while steps go on.
        self._holding_merges = True
        try:
            self._compactor.wait()
            # Interrogate, at a committed version, between two steps.
            with self._lock, self._fenced():
                old, new = self._begin_layout_change(workers, sharding)
                migration = ShardMigration(self._plan.state_traces(), old, new)
                migration.interrogate()
                first_step = self._db.get_step()
                self._migration = migration
        finally:
            self._holding_merges = False
        try:
            # Collect and acquire: copy the snapshot while steps go on.
            migration.copy()
            # Hold and done: between two steps, hand over the changes made during the copy,
            # then commit the new layout with the state.
            with self._lock, self._fenced():
                self._require_open()
                paused = time.monotonic()
                migration.finish()
                version = self._commit_layout(new)  # with the steps run during the copy
                pause = time.monotonic() - paused
                last_step = self._db.get_step()
        finally:
            self._migration = None
        stats = migration.stats
        return RescaleResult(old, new, last_step, rows=stats.rows, moved_rows=stats.moved_rows,
                             rewritten_rows=stats.copied_rows + stats.caught_up_rows,
                             seconds=time.monotonic() - started, state_version=version, hot=True,
                             copy_seconds=stats.copy_seconds, pause_seconds=pause,
                             steps_during_copy=last_step - first_step,
                             caught_up_rows=stats.caught_up_rows)

    def _begin_layout_change(self, workers: int,
                             sharding: str | None) -> tuple[Layout, Layout]:
        """At a committed step with no merge pending: the current layout and the next one."""
        self._no_migration("rescale")
        if self._uncommitted_steps:
            self.commit(compact=False)
        self._compactor.apply_finished(wait=True)
        old = self.layout
        if sharding in (None, old.sharding):
            return old, old.rescaled(workers)
        return old, replace(Layout.initial(workers, sharding, inaccuracy=old.inaccuracy),
                            version=old.version + 1)

    def _commit_layout(self, new: Layout) -> int:
        """Commit layout ``new`` with the state (and any executed steps): the atomic point of a
        layout change. Returns the state version."""
        crash_points.hit("rescale.before_commit")
        self._db.put(LAYOUT_KEY, new.to_json())
        version = self._db.commit()
        self._uncommitted_steps = 0
        self.layout = new
        return version

    def _no_migration(self, what: str) -> None:
        if self._migration is not None:
            raise UsageError(f"cannot {what} pipeline '{self.circuit.name}' while a hot layout "
                             f"change is in progress")

    def collect_garbage(self, grace_seconds: float = ORPHAN_GRACE_SECONDS) -> int:
        """Delete the data files no retained state version (``retain_checkpoints``) and no
        newer commit refers to, in the state tables and the output and input logs (files
        younger than ``grace_seconds`` are kept: their write may still commit); input that
        every retained state version has consumed is consolidated in the input logs first. Waits
        for a background merge to finish. Returns how many files were deleted."""
        self._require_open()
        with self._lock:
            if self._migration is not None:
                return 0  # a hot layout change is copying files; the next collection will do
            self._compactor.apply_finished(wait=True)
            # Input that every retained state version has consumed is no longer needed.
            retained = self._db.retained_entries(self.retain_checkpoints)
            oldest_step = min(int(entry.get("step", 0)) for _, entry in retained)
            consumed = self._divisions.get(oldest_step - 1) if oldest_step > 0 else None
            for name, log in self._inputs.items():
                log.consolidate_consumed((consumed or {}).get(name, 0), self._sql)
            self._divisions.compact_below(oldest_step)  # division_log.py: crash-safe, bounded
            for out in self._outputs.values():
                out.clean_log_before(oldest_step)
            deleted = self._db.collect_garbage(self.retain_checkpoints, grace_seconds)
            for log in [*self._outputs.values(), *self._inputs.values(), self._divisions]:
                deleted += garbage.collect(log.table, log.table.version(), grace_seconds)
            return deleted

    def compact_history(self) -> dict[str, int]:
        """Collapse each output log's history older than ``retain_steps`` steps, but never past
        the ``since`` of a live reader; returns, per view, the step history is collapsed through.
        """
        self._require_open()
        keep = self.retain_steps if self.retain_steps is not None else 0
        out = {}
        for name, log in self._outputs.items():
            through = log.last() - 1 - keep
            held = self._leases.since(name)
            if held is not None:
                through = min(through, held)
            if through >= 0:
                log.compact_history(through, self._sql)
            out[name] = log.compacted_through()
        return out

    def reader(self, view: str, since: int | None = None,
               lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Reader:
        """A leased reader of ``view`` holding history from step ``since`` on (default: the
        newest written step). See ``runtime/readers.py``."""
        log = self._output(view)
        oldest = max(log.compacted_through(), 0)
        since = max(log.last() - 1, oldest) if since is None else since
        if since < log.compacted_through():
            raise UsageError(f"output '{view}': history before step {log.compacted_through()} "
                             f"was compacted; a reader cannot start at step {since}")
        return Reader(self, view, since, lease_seconds)

    def compact(self, threshold: int = COMPACT_FILE_THRESHOLD) -> int:
        """Compact now, in the foreground, every trace with more than ``threshold`` files (after
        the background merge, if one runs); returns how many traces were compacted."""
        self._require_open()
        done = self._compactor.apply_finished(wait=True)
        return done + sum(t.compact(threshold, self._sql) for t in self._plan.traces())

    # -- reading ---------------------------------------------------------------------------
    def view(self, name: str, as_of: int | None = None) -> DataFrame:
        """The current value of output ``name`` (or after step ``as_of``): payload + ``_weight``."""
        return self._output(name).view(as_of)

    def input_view(self, name: str) -> DataFrame:
        """Input ``name`` integrated through the newest executed step (what the views are
        computed from; pushes not yet stepped are not in it): payload + ``_weight``."""
        log = self._input(name)
        return log.change(log.integrated_files(self._consumed_upper(name))) or \
            self.spark.createDataFrame([], log.table.schema)

    def input_view_arrow(self, name: str) -> pa.Table:
        """``input_view`` read on the driver, as Arrow."""
        log = self._input(name)
        return log.change_arrow(self._sql, log.integrated_files(self._consumed_upper(name))) or \
            log.arrow_schema.empty_table()

    def _consumed_upper(self, name: str) -> int:
        step = self._db.get_step() - 1
        division = self._divisions.get(step) if step >= 0 else None
        return (division or {}).get(name, 0)

    def step_changes_arrow(self, name: str, step: int) -> pa.Table:
        """The change of output ``name`` in step ``step`` (payload + ``_weight``), as Arrow."""
        return self._output(name).step_arrow(step)

    def output_last(self, name: str) -> int:
        """The next step output ``name``'s log will append (every step before it is written)."""
        return self._output(name).last()

    def view_arrow(self, name: str) -> pa.Table:
        """``view(name)`` (the newest value) read on the driver, as Arrow: no Spark needed."""
        return self._output(name).view_arrow(self._sql)

    def changes(self, name: str, since: int = 0) -> DataFrame:
        """Every change of output ``name`` from step ``since`` on: payload + ``_step`` + ``_weight``."""
        return self._output(name).changes(since)

    @property
    def pipeline_id(self) -> str:
        """The id of this pipeline's state (``root.read_pipeline_id``): a root deleted and
        created again is another pipeline."""
        return root_layout.read_pipeline_id(self.root)

    @property
    def next_step(self) -> int:
        return self._db.get_step()

    @property
    def uncommitted_steps(self) -> int:
        """Steps executed since the last commit (a crash now would replay them)."""
        return self._uncommitted_steps

    @property
    def state_version(self) -> int:
        return self._db.version

    # -- helpers ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _fenced(self):
        """Turn a lost compare-and-append on the pipeline's own tables into the fencing error."""
        try:
            yield
        except ConcurrentWriterError as e:
            self._closed = True  # no commit: the state belongs to the other process now
            self._compactor.close()
            raise PipelineFencedError(
                f"pipeline '{self.circuit.name}' at {self.root} is being run by another process "
                f"({e}); this pipeline object is closed") from e

    def _require_open(self) -> None:
        if self._closed:
            raise PipelineClosedError(f"pipeline '{self.circuit.name}' at {self.root} is closed")

    def _input(self, name: str) -> InputLog:
        if name not in self._inputs:
            raise UnknownNameError(f"unknown input '{name}'; circuit '{self.circuit.name}' has "
                                   f"inputs {sorted(self._inputs)}")
        return self._inputs[name]

    def _output(self, name: str) -> OutputLog:
        self._require_open()
        if name not in self._outputs:
            raise UnknownNameError(f"unknown output '{name}'; circuit '{self.circuit.name}' has "
                                   f"outputs {sorted(self._outputs)}")
        return self._outputs[name]

