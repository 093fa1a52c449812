"""``Pipeline``: the handle on a circuit running over state kept under one root folder.

``Pipeline`` opens (or creates) the root, holds the lock that lets one push, step or commit run
at a time, fences a process that lost a race on the root's tables, knows whether it is closed,
and drives ``run``/``pause``/``stop``/``resume``. Everything else it delegates, with the
engine's shared state (``engine_state.EngineState``), to one module per concern:

* ``step_protocol.py``: the step protocol (divide, evaluate, write, advance), replay at open,
  failed steps and quarantine. Read it for the contract of a step and of recovery.
* ``inputs.py``: checked, idempotent pushes.
* ``checkpoints.py``: the retained checkpoints and ``restore``.
* ``rescaling.py``: cold and hot layout changes.
* ``upkeep.py``: garbage collection, background merges and history compaction after commits.
* ``readers.py``: leased readers of the views.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import Circuit
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.errors import (
    CircuitChangedError,
    ConcurrentWriterError,
    PipelineClosedError,
    PipelineFencedError,
    UsageError,
)
from dbsp_pipeline.runtime import (
    checkpoints,
    circuit_upgrade,
    dead_letters,
    exchange,
    inputs,
    rescaling,
    step_protocol,
    upkeep,
)
from dbsp_pipeline.runtime import upgrade as engine_upgrade
from dbsp_pipeline.runtime.compactor import BackgroundCompactor
from dbsp_pipeline.runtime.division_log import CARRIED_RECORDS_KEY, DivisionLog
from dbsp_pipeline.runtime.engine_state import EngineState, compile_plan, read_layout
from dbsp_pipeline.runtime.input_log import InputLog, WrittenPush
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.runtime.output_log import OutputLog
from dbsp_pipeline.runtime.plan import Plan, SparkOperator
from dbsp_pipeline.runtime.readers import (
    DEFAULT_LEASE_SECONDS,
    LeaseRegistry,
    Reader,
    open_reader,
)
from dbsp_pipeline.runtime.results import (
    Checkpoint,
    CircuitChange,
    FailedStep,
    QuarantineResult,
    RescaleResult,
    StepInfo,
    StepResult,
)
from dbsp_pipeline.spark_session import LazySession, as_session, configure
from dbsp_pipeline.storage import keyed_runs
from dbsp_pipeline.storage.garbage import ORPHAN_GRACE_SECONDS
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import COMPACT_FILE_THRESHOLD
from dbsp_pipeline.storage.verify import VerifyReport, prepare_open, verify_root

#: Default of ``Pipeline(driver_step_rows=...)``: None, each step runs where its estimated work
#: fits (``runtime/path_choice.py``).
DRIVER_STEP_ROWS: int | None = None

__all__ = ["DRIVER_STEP_ROWS", "Checkpoint", "CircuitChange", "FailedStep", "Pipeline",
           "QuarantineResult", "RescaleResult", "StepInfo", "StepResult"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class _EngineSetting(Generic[T]):
    """A setting of the pipeline kept in its ``EngineState`` (where the engine reads it):
    reading or assigning ``pipeline.<name>`` reads or assigns ``pipeline.engine.<name>``, after
    ``check`` (which raises ``UsageError`` for a value the engine cannot run with)."""

    def __init__(self, check: Callable[[str, T], None] | None = None) -> None:
        self.check = check

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, pipeline: Pipeline | None, owner: type | None = None) -> T:
        if pipeline is None:
            return self  # type: ignore[return-value]  # the class attribute itself
        value: T = getattr(pipeline.engine, self.name)
        return value

    def __set__(self, pipeline: Pipeline, value: T) -> None:
        if self.check is not None:
            self.check(self.name, value)
        setattr(pipeline.engine, self.name, value)


def _at_least(low: int) -> Callable[[str, int | None], None]:
    """A setting's check: an integer of at least ``low`` (None allowed: no limit)."""
    def check(name: str, value: int | None) -> None:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < low):
            raise UsageError(f"{name} must be an integer of at least {low}, got {value!r}")
    return check


def _boolean(name: str, value: bool) -> None:
    """A setting's check: True or False."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, got {value!r}")


#: How many times opening reads the root again after losing the division log's fence to an
#: opener it had fenced out of the manifest (each attempt is a full open).
_OPEN_ATTEMPTS = 5


def _settle(old_circuit: Circuit, root: str, spark: SparkSession | LazySession,
            **settings: Any) -> tuple[dict[str, StructType], int]:
    """Open ``root`` with the circuit it ran, ``old_circuit`` (which executes again the steps
    divided after its newest checkpoint), commit every step and fold every output log
    (``circuit_upgrade.settle``); returns its views' columns and the next step, which the
    upgrade opens at (else another process ran the root meanwhile). Step 1 of an upgrade."""
    with Pipeline(old_circuit, root, spark, **settings) as before:
        with before._exclusive():
            circuit_upgrade.settle(before.engine)
        return {v: before.view_schema(v) for v in old_circuit.outputs}, before.next_step


@contextlib.contextmanager
def _fenced_at_open(circuit: Circuit, root: str) -> Iterator[None]:
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
            ``CircuitChangedError``, unless ``upgrade``.
        root: a local folder (created if missing), or an object-store location
            (``s3://bucket/prefix``; see README, 'Where a root can live').
        spark: the session to use; ``None`` (or a ``LazySession``) means the process's local
            session, started only when something needs Spark (a large step, a read as a
            DataFrame, the first compilation of the circuit at this root).
        checkpoint_every: commit the state database after this many steps (1: every step).
        driver_step_rows: None (the default) runs each step on the driver (Arrow + DuckDB,
            no Spark job) when the memory its estimated work takes there fits the driver's
            budget, and as Spark jobs otherwise (``runtime/path_choice.py``;
            ``StepResult.path_reason`` says why); a number N instead runs a step whose inputs
            changed by at most N rows on the driver and a bigger one on Spark; 0 runs every
            step on Spark.
        driver_memory: the most memory (bytes) one step on the driver may take, when
            ``driver_step_rows`` is None; the budget is the lesser of it and half the memory
            available when the step starts (None: that half alone).
        compact_threshold: a trace with more sorted runs than this is merged in the background.
        retain_steps: keep the exact history of the last this many steps of every output log
            (``view(as_of=...)``, ``changes(since=...)``) and collapse older history at each
            checkpoint, never past what a live reader's ``since`` needs; ``None`` keeps all.
        retain_checkpoints: of how many steps the state versions (checkpoints) stay readable
            (with those committed at the same step: a close does not push the previous step's
            checkpoint out; ``state_db.retains`` bounds them); older files
            are deleted by ``collect_garbage`` (run after 16 to 64 commits, as their steps'
            rows call for: ``upkeep.collection_due``, and at close). At least 2: the
            two-version database (``docs/recovery.md``, section 5).
        checkpoint: open this retained checkpoint instead of the newest, as ``restore`` does
            (the way back when the newest state is damaged).
        upgrade: when the root was built by another circuit, change its views to
            ``circuit``'s instead of refusing it (``runtime/circuit_upgrade.py``): operators
            that did not change keep their state, new ones are computed from the input logs,
            and the upgrade step's output takes every changed view from its old contents to
            its new ones; ``circuit_change`` then says what happened. Does nothing when the
            circuit did not change.

    Opening checks what it reads first (``storage/verify.py``): damaged storage is
    ``CorruptStateError``, naming the table, version and file, and an intact older checkpoint
    to pass as ``checkpoint`` if there is one. Opening then executes again the steps divided
    after the opened checkpoint (``recovered_steps``; ``step_protocol.py``).
    """

    #: commit the state database after this many steps
    checkpoint_every: _EngineSetting[int] = _EngineSetting(_at_least(1))
    #: a step whose input changed by at most this many rows runs on the driver (0: none;
    #: None: each step where its estimated work fits)
    driver_step_rows: _EngineSetting[int | None] = _EngineSetting(_at_least(0))
    #: the most memory (bytes) one step on the driver may take (None: half the available)
    driver_memory: _EngineSetting[int | None] = _EngineSetting(_at_least(1))
    #: the steps of exact history every output log keeps (None: all)
    retain_steps: _EngineSetting[int | None] = _EngineSetting(_at_least(0))
    #: how many state versions (checkpoints) stay readable
    retain_checkpoints: _EngineSetting[int] = _EngineSetting(_at_least(2))
    #: a Spark step runs Join, Aggregate, Distinct and TopK as one task per owner (W tasks at
    #: most) when a task's share of the step fits its budget (on by default;
    #: ``runtime/path_choice.py``)
    spark_per_owner: _EngineSetting[bool] = _EngineSetting(_boolean)
    #: a per-owner Spark step runs a chain of owner stages, each reading the one before, as one
    #: job (its W tasks start together and meet between the stages) in local mode with W task
    #: slots or more (on by default; ``owner_exec.gang_stages``); off: a job per stage
    spark_gang_stages: _EngineSetting[bool] = _EngineSetting(_boolean)

    def __init__(self, circuit: Circuit, root: str,
                 spark: SparkSession | LazySession | None = None, *,
                 checkpoint_every: int = 1,
                 driver_step_rows: int | None = DRIVER_STEP_ROWS,
                 driver_memory: int | None = None,
                 compact_threshold: int = COMPACT_FILE_THRESHOLD,
                 retain_steps: int | None = None,
                 retain_checkpoints: int = 2,
                 checkpoint: int | None = None,
                 upgrade: bool = False) -> None:
        if not circuit.outputs:
            raise UsageError(f"circuit '{circuit.name}' declares no output")
        if checkpoint_every < 1:
            raise UsageError("checkpoint_every must be at least 1")
        if retain_steps is not None and retain_steps < 0:
            raise UsageError("retain_steps must be at least 0")
        if retain_checkpoints < 2:
            raise UsageError("retain_checkpoints must be at least 2 (the current state version "
                             "and the one before it)")
        _at_least(0)("driver_step_rows", driver_step_rows)
        _at_least(1)("driver_memory", driver_memory)
        self.root = root
        self.spark: SparkSession | LazySession = (
            spark if isinstance(spark, LazySession) else
            LazySession() if spark is None else configure(spark))
        if upgrade and checkpoint is not None:
            raise UsageError("an upgrade opens the newest checkpoint: checkpoint and upgrade "
                             "cannot be given together")
        sql = LocalSQL()
        session = as_session(self.spark)
        #: the circuit as planned (``eager_aggregation``): what the root records and runs
        self.circuit = circuit = circuit_upgrade.planned_circuit(session, root, circuit,
                                                                 upgrade)
        if checkpoint is not None:  # opening it discards the newer entries, and what they carry
            with _fenced_at_open(circuit, root):
                checkpoints.fold_carried_records(session, root)
        prepare_open(root, checkpoint, retain_checkpoints)  # damage: CorruptStateError
        circuit_upgrade.record_description(root, circuit)
        old_circuit = circuit_upgrade.circuit_to_upgrade(session, root, circuit) \
            if upgrade else None
        old_columns: dict[str, StructType] = {}
        settled_step = 0
        if old_circuit is not None:  # 1. settle the old circuit: every step committed
            old_columns, settled_step = _settle(
                old_circuit, root, self.spark, driver_step_rows=driver_step_rows,
                driver_memory=driver_memory, compact_threshold=compact_threshold,
                retain_checkpoints=retain_checkpoints)
        planned = None
        for attempt in range(_OPEN_ATTEMPTS):
            db = StateDatabase(session, root, circuit.fingerprint())
            # read before opening: no checkpoint below its compacted_below can be opened
            divisions = DivisionLog(session, root_layout.divisions(root))
            with _fenced_at_open(circuit, root):  # opening rolls back and may commit: a race
                divisions.load_pending(db.newest_meta(CARRIED_RECORDS_KEY))
                db.open(checkpoint, retained=retain_checkpoints,
                        from_step=divisions.compacted_below, circuit_change=upgrade)
                #: what opening did about engine and state-format versions
                #: (``runtime/upgrade.py``)
                self.upgrade_info = engine_upgrade.migrate(db)
                if self.upgrade_info.migrations:
                    db.commit()  # the migrated state, as a checkpoint in the current format
                # an older engine's manifest gets the engine's Delta properties before the
                # fence, so the fence's entry follows it (``runtime/upgrade.py``)
                manifest_upgraded = db.set_manifest_properties(
                    engine_upgrade.engine_table_properties())
                # This process owns the root from here: a commit to either table a step
                # records in, by a process that opened the root before, fails (it is fenced).
                # Both tables were read before either fence, and each fence commits at the
                # version after the one read: of two openers, the one whose fences both land
                # is the later on both tables (``docs/recovery.md`` §8).
                db.fence()  # first: of two processes opening at once, the loser stops here
                try:
                    divisions.fence()
                except ConcurrentWriterError:
                    # An opener that read the manifest before this one's fence fenced the
                    # division log first (and may have recorded steps since): this one has
                    # fenced it out of the manifest already, so it reads both tables again and
                    # fences both again, to own both (else both would be fenced).
                    if attempt + 1 < _OPEN_ATTEMPTS:
                        continue
                    raise
                layout = read_layout(db)
                if db.recorded_fingerprint not in (None, circuit.fingerprint()):
                    if old_circuit is None or db.recorded_fingerprint != \
                            old_circuit.fingerprint() or db.get_step() != settled_step or \
                            divisions.get(settled_step) is not None:
                        raise CircuitChangedError(
                            f"the pipeline at {root} was changed by another process while it "
                            "was being upgraded (a step, or another upgrade): stop it and "
                            "upgrade again")
                    # 2. compare; the plan is compiled with the new state names
                    planned = circuit_upgrade.plan_change(db, circuit, old_circuit, old_columns)
                    circuit_upgrade.install_names(db, planned)
                plan = compile_plan(circuit, session, db)
                if planned is None:  # (an upgrade settled the old circuit, which copied them)
                    # state format 6's copy, which needs the plan (``runtime/upgrade.py``)
                    self.upgrade_info.widened = engine_upgrade.widen_decimal_average_sums(
                        db, plan, sql)
                    if self.upgrade_info.widened:
                        db.wait_for_writes()
                        db.commit()  # the copies, as a checkpoint of the same step
            break
        self._engine = EngineState(
            circuit=circuit, root=root, spark=session, sql=sql, db=db, layout=layout,
            plan=plan,
            inputs={name: InputLog(session, root, name, plan.input_schema(name))
                    for name in circuit.inputs},
            outputs={name: OutputLog(session, root, name, plan.output_schema(name))
                     for name in circuit.outputs},
            divisions=divisions,
            leases=LeaseRegistry(db.root),
            compactor=BackgroundCompactor(compact_threshold), checkpoint_every=checkpoint_every,
            driver_step_rows=driver_step_rows, driver_memory=driver_memory,
            retain_steps=retain_steps,
            retain_checkpoints=retain_checkpoints)
        _warn_of_spark_operators(plan)
        # tables an older engine created get the engine's Delta properties (once)
        with _fenced_at_open(circuit, root):
            manifest = [engine_upgrade.manifest_path(root)] if manifest_upgraded else []
            # (not before an upgrade's step: it commits the state; opening the old circuit to
            # settle it set them)
            self.upgrade_info.table_properties = manifest + (
                engine_upgrade.set_table_properties(self._engine) if planned is None else [])
            self.upgrade_info.relaxed = engine_upgrade.relax_view_columns(self._engine)
        self._lock = threading.RLock()  # one push, step or commit at a time
        self._control = threading.Condition()  # run() and pause/stop/resume
        self._running = False
        self._halt_at: int | None = None  # run() starts no step >= this (-1: none at all)
        self._closed = False
        with self._lock, self._fenced():
            exchange.remove_all(root)  # what a Spark step that crashed handed between stages
            step_protocol.load_pending(self._engine)
            #: the steps executed again at open: divided before a crash, not yet committed
            self.recovered_steps: list[StepResult] = step_protocol.recover(self._engine)
            #: what ``upgrade`` changed (None: the root's circuit was this one)
            self.circuit_change: CircuitChange | None = None
            if planned is not None:  # 3. the upgrade step, and its commit
                self.circuit_change = circuit_upgrade.execute(self._engine, planned)
            else:
                circuit_upgrade.mark_views(self._engine)

    # -- state -----------------------------------------------------------------------------
    @property
    def engine(self) -> EngineState:
        """The engine's open handles and shared state (traces, logs, state database): for
        tests and tools that inspect the root's storage. Changing it is not supported."""
        return self._engine

    @property
    def pipeline_id(self) -> str:
        """The id of this pipeline's state (its manifest table's Delta metadata id, as
        ``read_status(root, ...).pipeline_id`` reports it): a root deleted and created again
        is another pipeline, with another id."""
        return self._engine.db.state_id

    @property
    def layout(self) -> Layout:
        """The assignment of shards to workers, recorded with every checkpoint."""
        return self._engine.layout

    @property
    def failed_step(self) -> FailedStep | None:
        """The next step, if its execution failed (``step_protocol.py``); None when it did not."""
        return self._engine.failed_step

    @property
    def next_step(self) -> int:
        return self._engine.db.get_step()

    @property
    def uncommitted_steps(self) -> int:
        """Steps executed since the last commit (a crash now would replay them)."""
        return self._engine.uncommitted_steps

    @property
    def state_version(self) -> int:
        return self._engine.db.version

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Commit any executed steps and close. Pushed but unprocessed input stays in the logs."""
        if self._is_closed():
            return
        engine = self._engine
        if (engine.compactor.apply_finished(wait=True) or engine.uncommitted_steps
                or engine.db.dirty):  # a foreground compaction's swaps are staged
            self.commit(compact=False)
        self.collect_garbage()
        for log in engine.inputs.values():  # consumed input being consolidated: finish it
            log.apply_consolidated(wait=True)
        engine.compactor.close()
        keyed_runs.wait_for_writes()  # the runs of this pipeline's files in hand
        engine.sql.close()
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
            return inputs.push_rows(self._engine.input(name), rows, weight, producer, seq)

    def push_zset(self, name: str, table: pa.Table, *, producer: str | None = None,
                  seq: int | None = None, rejected: int = 0) -> int:
        """``push`` a Z-set: an Arrow table of the input's columns plus ``_weight`` (a nonzero
        integer per row: its multiplicity, negative to delete). Same checks, durability and
        idempotence as ``push``; returns how many rows were appended. ``rejected``: how many
        records of the source batch were invalid and left out (recorded with the push, and
        reported in the result of the step that consumes it)."""
        self._require_open()
        with self._lock:
            return inputs.push_zset(self._engine.input(name), table, producer, seq, rejected)

    def input_schema(self, name: str) -> StructType:
        """The columns of input ``name`` (without ``_weight``)."""
        return self._engine.input(name).schema

    def spark_operators(self) -> list[SparkOperator]:
        """The operators that run a Spark job over their change at every driver step (their
        expressions are outside the driver's translation, ``driver/expressions.py``): each
        costs a job a step (tens of milliseconds) and the JVM's start in a new process (seconds).
        Each with its label (as ``StepResult.operator_seconds`` and ``spark_jobs`` name it), the
        views it feeds and the expressions; also logged as a warning at open."""
        return self._engine.plan.spark_operators()

    def input_arrow_schema(self, name: str) -> pa.Schema:
        """The Arrow schema of input ``name``'s log: its columns and ``_weight``."""
        return self._engine.input(name).arrow_schema

    def track_producers(self, name: str, producers: list[str]) -> None:
        """Record, with every step's division from now on, the newest sequence number of each
        of ``producers`` on input ``name`` (``step_info`` then tells the offsets a step
        consumed). A source whose sequence numbers are its offsets (Kafka) calls this."""
        self._engine.input(name)  # an unknown input is an error
        self._engine.tracked.setdefault(name, set()).update(producers)

    def pushed(self, name: str, producer: str) -> int | None:
        """The newest sequence number ``producer`` pushed to input ``name`` (None if none)."""
        self._require_open()
        return self._engine.input(name).pushed(producer)

    # -- steps -----------------------------------------------------------------------------
    def step(self, changes: Mapping[str, pa.Table] | None = None, *,
             producer: str | None = None, seq: int | None = None) -> StepResult:
        """Execute one step over the input pushed since the previous one
        (``step_protocol.py``), and over ``changes`` if given.

        ``changes``: per input, a Z-set (an Arrow table of its columns plus ``_weight``, as
        ``push_zset`` takes) that the step carries: ``step(changes)`` is ``push_zset`` of each,
        then ``step()``, with the pushes committed while the step computes rather than before
        it (one durable commit's wait less). Bad input raises ``InputError`` before anything is
        written. When the step returns, its pushes are durable with it; when it raises, each
        push is durable or not, as a ``push`` that raised (``producer``/``seq``, recorded with
        each input's push, make a repeat of the call exactly-once). A step that was divided
        before (a failed step, retried) executes as it was, and its carried pushes belong to
        the next step.

        Raises ``PipelineFencedError`` (and closes this object) when another process running the
        same root recorded the step's division first, or wrote the state since this one opened.
        Raises ``StepFailedError`` when the step's computation failed: nothing of it is
        committed, it stays the next step (``failed_step``), and the next ``step`` tries it
        again; ``quarantine_step`` executes it without its input instead.
        """
        with self._exclusive():
            started = time.monotonic()
            engine = self._engine
            checked = {name: inputs.checked_zset(engine.input(name), table, producer, seq)
                       for name, table in (changes or {}).items()}  # all, before any write
            carried = {name: [engine.input(name).write_push(zset, producer, seq)]
                       for name, zset in checked.items() if zset is not None}
            pushed = time.monotonic() - started
            result = step_protocol.execute_step(engine, carried)
            if changes:
                result.phase_seconds = {"push": pushed, **result.phase_seconds}
                result.seconds += pushed
            return result

    def write_push(self, name: str, table: pa.Table, *, producer: str | None = None,
                   seq: int | None = None, rejected: int = 0) -> WrittenPush | None:
        """``push_zset`` up to its commit: the Z-set checked (``InputError``) and its file
        written, for a step to carry (``step_carrying``); None when there is nothing to commit
        (the producer's batch was recorded already, or no rows and no producer). Nothing is
        durable until the step that carries it lands it; a push never carried is garbage."""
        self._require_open()
        with self._lock:
            log_ = self._engine.input(name)
            zset = inputs.checked_zset(log_, table, producer, seq)
            return None if zset is None else log_.write_push(zset, producer, seq, rejected)

    def step_carrying(self, pushes: Sequence[tuple[str, WrittenPush]]) -> StepResult:
        """``step`` carrying written pushes (``write_push``), ``(input, push)`` in the order
        they land (a producer's in its order): each is committed while the step computes, at
        the next version of its log. Same contract as ``step(changes)``; a runner reading
        several Kafka partitions carries one push per partition batch."""
        carried: dict[str, list[WrittenPush]] = {}
        for name, push in pushes:
            carried.setdefault(name, []).append(push)
        with self._exclusive():
            return step_protocol.execute_step(self._engine, carried)

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
        with self._exclusive():
            return step_protocol.quarantine(self._engine, step)

    def errors(self) -> pa.Table:
        """The errors table (``_errors``: records a source rejected, and the records of
        quarantined steps) with each row's error ``id`` and whether it is ``resolved``
        (re-injected); ``runtime/dead_letters.py``."""
        self._require_open()
        return dead_letters.errors(self._engine)

    def reinject(self, fixes: dict[str, Any]) -> dict[str, int]:
        """Push corrected records in place of rejected ones: ``fixes`` maps an error id (see
        ``errors``) to its corrected row or rows (dicts or tuples of the input's columns; a dict
        may carry ``_weight``). Each id's rows are pushed exactly once, as the producer
        ``reinject/<id>``, and that push marks the error resolved in the same commit; a second
        re-injection of an id appends nothing. The rows belong to the next step, so the views
        change by exactly their effect. Returns, per id, the rows appended (0: re-injected
        before). Unknown ids are refused before anything is pushed
        (``runtime/dead_letters.py``)."""
        self._require_open()
        with self._lock:
            return dead_letters.reinject(self._engine, fixes)

    def input_pending(self) -> bool:
        """Whether the next step has input: a recorded division to replay, or pushes since."""
        self._require_open()
        return step_protocol.input_pending(self._engine)

    def step_info(self, step: int) -> StepInfo:
        """Which input step ``step`` consumed: per input, the log versions ``(lower, upper]``.

        Every executed (or divided) step can be mapped back to its input this way.
        """
        self._require_open()
        return step_protocol.step_info(self._engine, step)

    def commit(self, compact: bool = True) -> int:
        """Commit the state database (a checkpoint); returns the new state version. Then, with
        ``compact``, start merging the traces that are due in the background. With nothing to
        record (no step executed and no merge finished since the last checkpoint), no
        checkpoint is written and the current version is returned (the merges that are due
        start all the same): an idle pipeline committed on a schedule does not push its steps'
        checkpoints out of the retained ones."""
        with self._exclusive():
            engine = self._engine
            engine.compactor.apply_finished()
            if not step_protocol.records_anything(engine):
                if compact:  # merges that are due start all the same
                    upkeep.after_commit(engine)
                return engine.db.version
            return step_protocol.commit(engine, compact)

    # -- run control -----------------------------------------------------------------------
    def run(self, max_steps: int | None = None, max_seconds: float | None = None,
            checkpoint_every: int | None = None, idle_seconds: float = 0.0) -> list[StepResult]:
        """Execute steps while input is available (a coordinator iteration), then commit.

        Stops when no input is pending (after waiting up to ``idle_seconds`` for some; the
        output logs' Delta tables are brought up to date whenever it waits), after
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
                    self._fold_when_idle()
                if not self._wait_for_input(started, idle_seconds, max_seconds):
                    break
        finally:
            self.checkpoint_every = saved
            with self._lock:
                if self._engine.uncommitted_steps and not self._is_closed():
                    committed = self.commit()
                    if results:
                        results[-1].committed_version = committed
            with self._control:
                self._running = False
                self._control.notify_all()
        return results

    def _fold_when_idle(self) -> None:
        """With no input pending, fold the output logs' pending steps into their Delta tables,
        so that a reader of those tables (not through this object) is not left up to
        ``FOLD_STEPS`` steps behind while the pipeline waits."""
        if any(log.pending_steps for log in self._engine.outputs.values()):
            with self._fenced():
                upkeep.fold(self._engine)

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
        return halt is not None and (halt < 0 or self._engine.db.get_step() >= halt)

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

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoints(self) -> list[Checkpoint]:
        """The retained checkpoints, newest first: those of the ``retain_checkpoints`` newest
        steps (a checkpoint with no step since the one below it, as ``close`` or ``commit``
        makes after a merge, keeps the previous step's; ``state_db.retains``)."""
        self._require_open()
        return checkpoints.retained(self._engine)

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
        with self._exclusive():
            return checkpoints.restore(self._engine, version)

    def verify(self) -> VerifyReport:
        """Check every table of this pipeline's root and its retained checkpoints, as opening
        checks what it reads (``storage/verify.py``); reads only. See ``VerifyReport``."""
        self._require_open()
        with self._lock:
            return verify_root(self.root, self._engine.retain_checkpoints)

    # -- layout changes --------------------------------------------------------------------
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
        is handed over and the layout committed. See ``runtime/rescaling.py``.
        """
        self._require_open()
        if hot:
            return rescaling.rescale_hot(self._engine, workers, sharding, self._exclusive)
        with self._exclusive():
            return rescaling.rescale_cold(self._engine, workers, sharding)

    # -- upkeep ----------------------------------------------------------------------------
    def collect_garbage(self, grace_seconds: float = ORPHAN_GRACE_SECONDS) -> int:
        """Delete the data files no retained state version (``retain_checkpoints``) and no
        newer commit refers to, in the state tables and the output and input logs (files
        younger than ``grace_seconds`` are kept, their write may still commit, unless this
        process committed them: ``storage/garbage.py``); input that every retained state
        version has consumed is consolidated in the input logs first. Applies a finished
        background merge; waits for a running one only when it may have written files older than
        ``grace_seconds`` (``upkeep.collect_garbage``). Returns how many files were deleted."""
        with self._exclusive():  # their rewrites race other processes' commits too
            return upkeep.collect_garbage(self._engine, grace_seconds)

    def compact_history(self) -> dict[str, int]:
        """Collapse each output log's history older than ``retain_steps`` steps, but never past
        the ``since`` of a live reader; returns, per view, the step history is collapsed through.
        The output logs' pending steps are folded first (history is collapsed in the Delta
        tables)."""
        with self._exclusive():  # their rewrites race other processes' commits too
            upkeep.fold(self._engine)
            return upkeep.compact_history(self._engine)

    def compact(self, threshold: int = COMPACT_FILE_THRESHOLD) -> int:
        """Compact now, in the foreground, every trace with more than ``threshold`` sorted runs
        (after the background merge, if one runs); returns how many traces were compacted."""
        with self._exclusive():  # their rewrites race other processes' commits too
            return upkeep.compact(self._engine, threshold)

    # -- reading ---------------------------------------------------------------------------
    def reader(self, view: str, since: int | None = None,
               lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Reader:
        """A leased reader of ``view`` holding history from step ``since`` on (default: the
        newest written step). See ``runtime/readers.py``."""
        log = self._output(view)
        return open_reader(self, self._engine.leases, view, since=since,
                           compacted_through=log.compacted_through(), last=log.last(),
                           lease_seconds=lease_seconds)

    def view(self, name: str, as_of: int | None = None) -> DataFrame:
        """The current value of output ``name`` (or after step ``as_of``): payload + ``_weight``."""
        return self._output(name).view(as_of)

    def view_schema(self, name: str) -> StructType:
        """The columns of output view ``name`` (without ``_weight``), as the circuit's analysis
        typed them."""
        return self._output(name).schema

    def view_arrow(self, name: str) -> pa.Table:
        """``view(name)`` (the newest value) read on the driver, as Arrow: no Spark needed."""
        return self._output(name).view_arrow(self._engine.sql)

    def view_rows(self, name: str) -> int:
        """How many rows view ``name`` holds as a bag: the sum of its weights (a row of weight
        2 counts twice; what ``count(*)`` over the view's rows each repeated by its weight
        gives), read from the log's file statistics and the weights of its changes with
        retractions: it does not read the view's rows (``OutputLog.view_rows``)."""
        return self._output(name).view_rows()

    def changes(self, name: str, since: int = 0) -> DataFrame:
        """Every change of output ``name`` from step ``since`` on: payload + ``_step`` +
        ``_weight``."""
        return self._output(name).changes(since)

    def step_changes_arrow(self, name: str, step: int) -> pa.Table:
        """The change of output ``name`` in step ``step`` (payload + ``_weight``), as Arrow."""
        return self._output(name).step_arrow(step)

    def output_last(self, name: str) -> int:
        """The next step output ``name``'s log will append (every step before it is written)."""
        return self._output(name).last()

    def input_view(self, name: str) -> DataFrame:
        """Input ``name`` integrated through the newest executed step (what the views are
        computed from; pushes not yet stepped are not in it): payload + ``_weight``."""
        log = self._engine.input(name)
        files = log.integrated_files(step_protocol.consumed_upto(self._engine, name))
        return log.change(files) or self._engine.spark.createDataFrame([], log.table.schema)

    def input_view_arrow(self, name: str) -> pa.Table:
        """``input_view`` read on the driver, as Arrow."""
        log = self._engine.input(name)
        files = log.integrated_files(step_protocol.consumed_upto(self._engine, name))
        return log.change_arrow(self._engine.sql, files) or log.arrow_schema.empty_table()

    # -- the handle's own state ------------------------------------------------------------
    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the lock with the pipeline open, and turn a lost race on the pipeline's tables
        into the fencing error."""
        with self._lock, self._fenced():
            self._require_open()
            yield

    @contextlib.contextmanager
    def _fenced(self) -> Iterator[None]:
        """Turn a lost compare-and-append on the pipeline's own tables into the fencing error."""
        try:
            yield
        except ConcurrentWriterError as e:
            self._closed = True  # no commit: the state belongs to the other process now
            self._engine.compactor.close()
            raise PipelineFencedError(
                f"pipeline '{self.circuit.name}' at {self.root} is being run by another process "
                f"({e}); this pipeline object is closed") from e

    def _is_closed(self) -> bool:
        """Closed by ``close``, fenced, or the engine abandoned its state (half a step)."""
        return self._closed or self._engine.abandoned

    def _require_open(self) -> None:
        if self._is_closed():
            raise PipelineClosedError(f"pipeline '{self.circuit.name}' at {self.root} is closed")

    def _output(self, name: str) -> OutputLog:
        self._require_open()
        return self._engine.output(name)


def _warn_of_spark_operators(plan: Plan) -> None:
    """Log, once at open, the operators whose expressions only Spark evaluates
    (``Pipeline.spark_operators``), naming the views and the expressions."""
    slow = plan.spark_operators()
    if slow:
        log.warning(
            "%d operator(s) run a Spark job at every driver step (their expressions are outside "
            "the driver's translation; each costs a job a step, and the JVM's start in a new "
            "process): %s", len(slow), "; ".join(
                f"{op.label} (view{'s' if len(op.views) > 1 else ''} "
                f"{', '.join(op.views) or '-'}): {', '.join(op.expressions)}" for op in slow))
