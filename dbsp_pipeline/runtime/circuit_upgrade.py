"""Upgrading a running pipeline to a changed circuit: its views change without starting over.

``Pipeline(new_circuit, root, upgrade=True)`` (Dagster: the upgrade job with
``allow_circuit_change: true``) runs this protocol when the root's newest checkpoint was
recorded by another circuit. Top to bottom:

0. Every open records its circuit's description in ``_circuits/<fingerprint>.json``
   (``record_description``): what a later upgrade compares a new circuit with.
1. Settle the old circuit (``circuit_to_upgrade``, then ``settle`` on the root opened with it,
   ``Circuit.from_description``): opening executes again the steps divided after its newest
   checkpoint; every step is then committed and every output log folded, so the upgrade
   starts at a committed step and a removed view's log is closed holding all its steps. A
   failed step refuses the upgrade (step it again, or quarantine it, first).
2. Compare (``plan_change``): ``circuit_diff.diff`` of the recorded circuit and the new one,
   and the state names (``circuit_diff.state_names``): a kept operator keeps its tables, any
   other gets tables of its own. Refused there: an input whose schema changes, and a changed
   view that reads an operator depending on the order input arrived in (``integrate``,
   ``differentiate``, ``delay``: the integrated input does not determine it).
3. The upgrade step ``s``, the next step, which consumes no input (``execute``):

   a. a view whose columns change is refused (its log holds the old ones: add the view under
      a new name and remove the old one);
   b. backfill: the part of the new circuit that the new operators and the changed and added
      views read from is evaluated once, from scratch, over every input integrated through
      step ``s - 1`` (on the driver or on Spark, as the path choice decides for that input).
      The new operators stage their traces in their own tables. A kept stateful operator on
      that path runs over throwaway state (``_upgrade_scratch``), so its own tables are not
      touched. Nothing off that path runs;
   c. every view's change at step ``s``: for a changed or added view its new contents minus
      its log's integral, so a consumer that applies the changes ends at the new contents
      without being cleared (an added view starts with its full contents); nothing for the
      others. Written as any step's output;
   d. one commit, the atomic point: the state database's entry carries step ``s``'s record
      (its division: no input; these changes), the new fingerprint and state names, no
      longer the retired operators' tables, and the change (``CircuitChange``, which
      ``Pipeline.checkpoints`` lists). It folds no table, so a kept operator's tables stay at
      the very Delta versions and staged actions they had. A crash before it leaves the old
      circuit (the files written are garbage, and the next upgrade starts again at 1); after
      it, the new one.
4. After the commit, every removed view's log is marked retired in its table properties
   (``OutputLog.mark_retired``), and a view added again is no longer marked. The checkpoint's
   metadata lists the retired views (``RETIRED_VIEWS_KEY``), and every open marks what a crash
   after the commit left unmarked (``mark_views``).

Kept operators do not run in the upgrade step: to them it does not exist (the step after it
follows the one before it). That matters only to the operators that count steps, ``integrate``,
``delay`` and ``differentiate``: the upgrade step is not one of the steps a view over a kept one
counts.

A checkpoint from before the upgrade belongs to the old circuit: restoring it with the new one
is ``CircuitChangedError``. The way back to the old views is an upgrade to the old circuit.

A root upgraded before its first step (step 0) takes the new circuit without an upgrade step:
no view has contents yet, and step 0 is where constants emit their rows.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import deltalake
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from dbsp_pipeline import eager_aggregation
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import STATEFUL_OPS, STREAM_OPS, Circuit
from dbsp_pipeline.driver.sql import LocalSQL, empty_zset, negate
from dbsp_pipeline.errors import CircuitChangedError, UsageError
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.operators.constant import FIRST_STEP
from dbsp_pipeline.runtime import step_protocol, upkeep
from dbsp_pipeline.runtime.circuit_diff import (
    STATE_NAMES_KEY,
    CircuitDiff,
    diff,
    names_from_json,
    names_to_json,
    state_names,
)
from dbsp_pipeline.runtime.engine_state import EngineState
from dbsp_pipeline.runtime.output_log import OutputLog, PreparedWrite
from dbsp_pipeline.runtime.path_choice import choose_for_step
from dbsp_pipeline.runtime.plan import make_operator
from dbsp_pipeline.runtime.results import CircuitChange
from dbsp_pipeline.storage.small_files import (
    exists,
    list_folders,
    make_folder,
    read_text,
    remove_folder,
    write_atomically,
)
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.table_store import DataFile
from dbsp_pipeline.zset import WEIGHT, quote

#: checkpoint metadata: the views an upgrade removed, ``{name: {"step": s, "columns": json}}``
#: (the step from which the view is no longer computed, and its log's payload columns)
RETIRED_VIEWS_KEY = "retired_views"


# -- 0. the recorded circuits ------------------------------------------------------------------
def record_description(root: str, circuit: Circuit) -> None:
    """Record ``circuit``'s description at ``root`` unless it is there (one file per
    fingerprint, written whole or not at all): what a later upgrade compares with."""
    path = root_layout.circuit_description(root, circuit.fingerprint())
    if exists(path):
        return
    make_folder(os.path.dirname(path))
    write_atomically(path, json.dumps(circuit.describe(), sort_keys=True))


def recorded_circuit(root: str, fingerprint: str) -> Circuit:
    """The circuit whose fingerprint is ``fingerprint``, from its description at ``root``;
    ``CircuitChangedError`` when there is none (a root last opened by an engine that recorded
    no description) or it is damaged."""
    path = root_layout.circuit_description(root, fingerprint)
    text = read_text(path)
    if text is None:
        raise CircuitChangedError(
            f"the pipeline at {root} records no description of the circuit that ran it "
            f"(fingerprint {fingerprint[:12]}; an engine before upgrades wrote it): open it "
            "once with that circuit, then upgrade")
    try:
        circuit = Circuit.from_description(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        raise CircuitChangedError(f"the circuit description {path} is damaged ({e})") from None
    if circuit.fingerprint() != fingerprint:
        raise CircuitChangedError(f"the circuit description {path} is damaged (it describes "
                                  f"the circuit {circuit.fingerprint()[:12]})")
    return circuit


def planned_circuit(spark: SparkSession, root: str, circuit: Circuit,
                    upgrade: bool = False) -> Circuit:
    """The circuit a pipeline at ``root`` runs for ``circuit``: ``circuit`` as declared or as
    planned with eager aggregation (``eager_aggregation.planned``). A root whose newest
    checkpoint was recorded by one of the two keeps it (its state is that plan's); a new root,
    an upgrade or a changed circuit takes the one ``circuit.eager_aggregation`` asks for."""
    planned = eager_aggregation.planned(circuit)
    if planned is circuit:
        return circuit
    wanted = planned if circuit.eager_aggregation else circuit
    if upgrade:
        return wanted
    recorded = StateDatabase(spark, root, circuit.fingerprint()).newest_fingerprint()
    return {circuit.fingerprint(): circuit, planned.fingerprint(): planned}.get(
        recorded or "", wanted)


# -- 1. settle the old circuit -----------------------------------------------------------------
def circuit_to_upgrade(spark: SparkSession, root: str, circuit: Circuit) -> Circuit | None:
    """The circuit the newest checkpoint at ``root`` was recorded by, when it is not
    ``circuit`` (None: a new root, or the same circuit: nothing to upgrade)."""
    recorded = StateDatabase(spark, root, circuit.fingerprint()).newest_fingerprint()
    if recorded is None or recorded == circuit.fingerprint():
        return None
    return recorded_circuit(root, recorded)


def settle(state: EngineState) -> None:
    """On the root opened with the old circuit (which replayed the steps divided after its
    newest checkpoint): commit every executed step and fold every output log, so the upgrade
    starts at a committed step with every view's log complete. ``UsageError`` when the next
    step failed: its input is divided for the old circuit."""
    if state.failed_step is not None:
        raise UsageError(
            f"step {state.failed_step.step} of pipeline '{state.circuit.name}' failed "
            f"({state.failed_step.error}): step it again or quarantine its input before "
            "changing the circuit")
    state.require_no_migration("upgrade")
    if state.uncommitted_steps or state.db.dirty:
        step_protocol.commit(state, compact=False)
    upkeep.fold(state)


# -- 2. compare ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedChange:
    """What an upgrade will do (``plan_change``): the old circuit and its views' columns (Spark
    JSON, by view), the comparison, the state name of every node of the new circuit and of the
    old one."""

    old: Circuit
    old_columns: dict[str, str]
    diff: CircuitDiff
    names: dict[int, str]
    old_names: dict[int, str]
    #: the views whose contents change (changed and added)
    views: list[str]
    #: the nodes the backfill evaluates: the new ones, the changed and added views', and every
    #: node they read from
    needed: set[int]


def plan_change(db: StateDatabase, circuit: Circuit, old: Circuit,
                old_columns: Mapping[str, StructType]) -> PlannedChange:
    """Compare ``circuit`` with ``old``, the circuit of the open state version ``db`` (step 2
    of the module docstring), whose views have the columns ``old_columns``;
    ``CircuitChangedError`` for what an upgrade cannot do."""
    old_description, new_description = old.describe(), circuit.describe()
    change = diff(old_description, new_description)  # refuses a changed input schema
    views = [*change.outputs_changed, *change.outputs_added]
    needed = _upstream(circuit, [*change.added, *(circuit.outputs[v] for v in views)])
    order_dependent = [f"{n.op} (node {n.id})" for n in circuit.nodes
                       if n.id in needed and n.op in STREAM_OPS]
    if order_dependent:
        raise CircuitChangedError(
            f"circuit '{circuit.name}': the changed views read {', '.join(order_dependent)}, "
            "which depend on the order input arrived in; the input logs' integral does not "
            "keep it, so an upgrade cannot compute them: use a new root for this circuit")
    old_names = names_from_json(db.get(STATE_NAMES_KEY), old_description)
    names = state_names(change, new_description, old_names,
                        in_use=list_folders(root_layout.state_tables(db.root)))
    return PlannedChange(old, {v: c.json() for v, c in old_columns.items()}, change, names,
                         old_names, views, needed)


def install_names(db: StateDatabase, planned: PlannedChange) -> None:
    """Make ``planned``'s state names those the new circuit's plan is compiled with
    (``engine_state.compile_plan`` reads them); durable with the upgrade's commit."""
    db.put(STATE_NAMES_KEY, names_to_json(planned.names))


# -- 3. the upgrade step -------------------------------------------------------------------------
def execute(state: EngineState, planned: PlannedChange) -> CircuitChange:
    """Execute the upgrade step and commit it (3 and 4 of the module docstring); the caller
    holds the pipeline's lock, with ``state`` opened on the new circuit (``plan_change``,
    ``install_names``) at a settled root. Durable when it returns. A failure before the commit
    abandons ``state`` (the root is the old circuit's: open it again)."""
    started = time.monotonic()
    circuit, change = state.circuit, planned.diff
    s = state.db.get_step()
    views, needed = planned.views, planned.needed
    scratch = _Scratch(state)
    writes: dict[str, PreparedWrite] = {}
    on_driver, reason = True, "before the first step: no view has contents, nothing to compute"
    try:
        _refuse_changed_columns(state, views)
        if s > FIRST_STEP:
            files = {name: log.integrated_files(step_protocol.consumed_upto(state, name))
                     for name, log in state.inputs.items() if circuit.inputs[name] in needed}
            choice = choose_for_step(state.plan, files, state.driver_step_rows,
                                     state.driver_memory)
            on_driver, reason = choice.on_driver, choice.reason
            sql = state.sql if choice.on_driver else None
            # a from-scratch evaluation is one step 0 (constants emit their rows)
            ctx = StepContext(state.spark, FIRST_STEP, sql=sql, layout=state.layout)
            try:
                contents = _backfill(state, ctx, needed, planned, files, scratch)
                for name, node_id in circuit.outputs.items():
                    log = state.outputs[name]
                    if name in change.outputs_added:
                        log.start_at(s)
                    difference = (_difference(contents.get(node_id), log, sql)
                                  if name in views else None)
                    write = log.prepare(s, difference, sql)
                    assert write is not None, "the upgrade step is written once"
                    writes[name] = write
            finally:
                ctx.release()
        retired_tables = sorted(set(state.db.recorded_traces()) - set(state.db.open_tables()))
        state.db.retire_tables(retired_tables)
        retired_views = dict(state.db.get(RETIRED_VIEWS_KEY) or {})
        for name in change.outputs_removed:
            retired_views[name] = {"step": s, "columns": planned.old_columns[name]}
        for name in circuit.outputs:
            retired_views.pop(name, None)
        state.db.put(RETIRED_VIEWS_KEY, dict(sorted(retired_views.items())))
        result = CircuitChange(
            old_fingerprint=planned.old.fingerprint(), new_fingerprint=circuit.fingerprint(),
            step=s, state_version=state.db.version + 1,
            kept=_stateful_names(circuit, planned.names, change.kept),
            backfilled=_stateful_names(circuit, planned.names, change.added),
            retired=_stateful_names(planned.old, planned.old_names, change.retired),
            views_unchanged=change.outputs_unchanged, views_changed=change.outputs_changed,
            views_added=change.outputs_added, views_removed=change.outputs_removed,
            outputs={name: w.rows for name, w in writes.items()},
            on_driver=on_driver, path_reason=reason, seconds=0.0)
        if s > FIRST_STEP:  # the record: step s consumed no input, and wrote these changes
            state.db.set_step(s + 1)
            state.uncommitted_steps += 1
            state.divisions.stage(s, state.divisions.lower(s, list(state.inputs)),
                                  state.divisions.offsets(s - 1),
                                  {name: w.record() for name, w in writes.items()})
        version = step_protocol.commit(state, compact=False,
                                       circuit_change=result.describe())
    except BaseException:
        state.abandon()  # the root is the old circuit's (or, after the commit, the new one's)
        raise
    for name, write in writes.items():
        state.outputs[name].stage(write)
    scratch.remove()
    mark_views(state)
    assert version == result.state_version
    return replace(result, seconds=time.monotonic() - started)


def mark_views(state: EngineState) -> None:
    """Mark every view the checkpoint lists as retired in its log's table properties, and
    unmark the circuit's views (step 4 of the module docstring; at every open, so that a
    crash after an upgrade's commit is made good). Idempotent: a log marked as it should be
    is not committed to."""
    for log in state.outputs.values():
        if log.retired_at() is not None:
            log.mark_retired(None)
    for name, retired in (state.db.get(RETIRED_VIEWS_KEY) or {}).items():
        log = OutputLog(state.spark, state.root, name,
                        StructType.fromJson(json.loads(retired["columns"])))
        if log.retired_at() != retired["step"]:
            log.mark_retired(int(retired["step"]))


# -- the parts of the upgrade step ----------------------------------------------------------------
class _Scratch:
    """The throwaway state of the kept stateful operators a backfill runs: a state database
    under ``_upgrade_scratch``, made on first use, removed after the commit (and by the next
    upgrade, after a crash)."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.folder = root_layout.upgrade_scratch(state.root)
        remove_folder(self.folder)  # what an upgrade that crashed left
        self._db: StateDatabase | None = None

    def db(self) -> StateDatabase:
        if self._db is None:
            self._db = StateDatabase(
                self.state.spark, root_layout.upgrade_scratch(self.state.root,
                                                              uuid.uuid4().hex),
                self.state.circuit.fingerprint())
            self._db.open()
        return self._db

    def remove(self) -> None:
        remove_folder(self.folder)


def _refuse_changed_columns(state: EngineState, views: Iterable[str]) -> None:
    """``CircuitChangedError`` for a view whose log holds other columns than its new ones."""
    for name in views:
        log = state.outputs[name]
        stored, now = log.stored_columns(), log.table.arrow_schema
        if _columns(stored) != _columns(now):
            raise CircuitChangedError(
                f"view '{name}' changes its columns from ({_ddl(stored)}) to ({_ddl(now)}): "
                "its output log holds the old columns; declare the view under a new name and "
                "remove the old one instead")


def _columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """A log's columns as Delta types them (what its metadata holds)."""
    return [(f.name, str(f.type)) for f in deltalake.Schema.from_arrow(schema).fields]


def _ddl(schema: pa.Schema) -> str:
    """A log's payload columns as Spark SQL names their types (``order_id BIGINT``)."""
    fields = from_arrow_schema(schema).fields
    return ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in fields
                     if f.name not in ("_step", WEIGHT))


def _upstream(circuit: Circuit, nodes: Iterable[int]) -> set[int]:
    """``nodes`` and every node they read from, transitively."""
    seen: set[int] = set()
    todo = list(nodes)
    while todo:
        node_id = todo.pop()
        if node_id not in seen:
            seen.add(node_id)
            todo.extend(circuit.node(node_id).inputs)
    return seen


def _backfill(state: EngineState, ctx: StepContext, needed: set[int], planned: PlannedChange,
              files: Mapping[str, list[DataFile]], scratch: _Scratch
              ) -> dict[int, Delta | LocalDelta]:
    """Evaluate the ``needed`` nodes once over the integrated inputs (``files``): each node's
    full contents. A new operator steps over its own (empty) tables, a kept stateful one over
    scratch state, a stateless one as it is."""
    contents: dict[int, Delta | LocalDelta] = {}
    for node in state.circuit.nodes:
        if node.id not in needed:
            continue
        if node.op == "input":
            log = state.inputs[node.params["name"]]
            contents[node.id] = (log.change_arrow(ctx.local, files[log.name]) if ctx.on_driver
                                 else log.change(files[log.name]))
            continue
        op: Operator = state.plan.operators[node.id]
        if node.op in STATEFUL_OPS and node.id not in planned.diff.added:
            op = make_operator(node, state.plan.schemas, scratch.db(),
                               planned.names[node.id])
        inputs = [contents[i] for i in node.inputs]
        contents[node.id] = (op.step_local(ctx, inputs) if ctx.on_driver
                             else op.step(ctx, inputs))
    return contents


def _difference(new: Delta | LocalDelta, log: OutputLog, sql: LocalSQL | None
                ) -> Delta | LocalDelta:
    """The change that takes ``log``'s integral to ``new`` (a view's full contents)."""
    columns = [*log.schema.fieldNames(), WEIGHT]
    if sql is not None:
        old = log.view_arrow(sql)
        new_rows = empty_zset(log.schema) if new is None else new
        assert isinstance(new_rows, pa.Table)
        return pa.concat_tables([new_rows.select(columns).cast(old.schema), negate(old)])
    quoted = [quote(c) for c in columns]
    old_df: DataFrame = log.view().select(*quoted)
    retract = old_df.withColumn(WEIGHT, -F.col(WEIGHT))
    if new is None:
        return retract
    assert isinstance(new, DataFrame)
    return new.select(*quoted).unionByName(retract)


def _stateful_names(circuit: Circuit, names: Mapping[int, str],
                    nodes: Iterable[int] | Mapping[int, int]) -> list[str]:
    """The state names of the stateful nodes among ``nodes`` (ids of ``circuit``)."""
    return sorted(names[i] for i in nodes if circuit.node(i).op in STATEFUL_OPS and i in names)


