"""Owner stages: a stateful operator's Spark step run as one task per owner, each task running
the operator's unchanged driver-path ``step_local`` over its owner's part of the state.

On the Spark path, an operator that can run per owner (``Operator.owner_keys`` is not None and
the driver hashes its key types: ``Plan.owner_capable``) becomes one *owner stage*
(``owner_stage``, on the driver):

1. the tasks get their owner's rows of each input change one of two ways. When every changed
   input comes as exchange files split by this operator's keys (an ``OwnedChange``: the
   output of an owner stage or a scatter stage, ``runtime/exchange.py``,
   ``runtime/scatter.py``), or as pushed files its tasks split themselves (a
   ``scatter.ScatterInReaders``), a *file stage* runs one task per owner that got rows
   (``run_file_task``; one plain RDD job, ``spark_session.run_tasks``), each reading its own
   rows: no shuffle. Otherwise each change (a
   DataFrame) gets ``_owner``, the layout's owner of the row's key (``Layout.owner_column``),
   its columns cross under positional names (``_c0``..: PySpark's Arrow UDFs look columns up
   by unquoted name, and names may hold dots or backticks), and it is hash-partitioned into W
   partitions and grouped by ``_owner``, a key of the row's owner chosen so that owner w's rows
   are partition w (``owner_partition_keys``: the W tasks run side by side), ``cogroup`` for a
   join's two sides when both changed; each group is one call of ``run_owner_task``: only
   owners with rows form groups, so the work follows the change, in at most W tasks;
2. a task rebuilds the operator against a ``TaskStateDb`` (``storage/task_table.py``) whose
   traces see only the owner's files, runs ``step_local`` with the worker's DuckDB
   (``task_sql``), writes its trace files under fresh names, writes its output change as
   exchange files (split by the owners of the readers' keys when only owner stages read it,
   ``Plan.exchange_keys``; else one file), and returns one JSON record: its staged actions and
   its exchange files;
3. the driver collects the records in one job (which runs every task), checks there is at most
   one per owner, all of this step and layout, and stages the actions on its
   ``StagedTable``s. The output change is the exchange files: handed to the next owner stage
   as they are, read on the driver for a view's small change (not consolidated again there
   when the operator's tasks' outputs together are: ``Operator.owner_outputs_consolidated``,
   ``StepContext.consolidated_changes``), or read by Spark (``OwnedChange.to_frame``) for a
   Spark operator or a big view. A view's change whose tasks' outputs together are
   consolidated (an aggregate's, a distinct's, a top-k's) is written by the tasks instead, as
   the view log's data files, each part with its digest (``output_log.write_part``,
   ``StepContext.view_files``): the driver reads none of it, sums the digests, and the step's
   record commits the files.

An owner stage whose change only one owner stage reads (``Plan.gang_reader``: a join whose
change is aggregated), and a chain of such, runs as one job where the W tasks can start together
(``gang_stages``: local mode, W task slots or more; ``Pipeline.spark_gang_stages``) and no other
input of the later stages changed: each task runs the first stage for its owner, posts its
record in the step's scratch, waits for every task's (``runtime/rendezvous.py``) and runs the
next stage over the exchange files they name, and so on. A job's fixed cost here (its launch
and its end, about 0.1 s) is paid once instead of once a stage.

Determinism: a task's output is a function of its owner's change rows and its owner's trace rows
for those keys; each key's rows are in exactly one task; the code is the driver path's. So the
output and the traces' values equal the driver path's for any W and any task order (files
differ, values do not).

Durability: tasks make no durable action. Their files (trace and view files) are orphans until
the driver stages the actions it *collected*, and those become state only when the step's
record or checkpoint commits them (``storage/staged_table.py``), as on the other paths. Files
of failed or retried attempts and speculative copies are never staged; garbage collection
deletes them (their exchange files go with the step's exchange folder). A stage that fails
raises out of the step (a failed step, rolled back).
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dbsp_pipeline.circuit import Node
from dbsp_pipeline.driver.hashing import spark_hash_int
from dbsp_pipeline.driver.sql import LocalSQL, conform, zset_arrow_schema
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.runtime import exchange, rendezvous
from dbsp_pipeline.runtime.exchange import NeedsSpark, OwnedChange, positional
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.runtime.output_log import PreparedWrite, ViewFiles, joined_parts, write_part
from dbsp_pipeline.spark_session import (
    conf_value,
    gang_slots,
    run_gang_tasks,
    run_tasks,
    task_slots,
)
from dbsp_pipeline.storage import keyed_runs
from dbsp_pipeline.storage.data_files import new_sorted_run
from dbsp_pipeline.storage.staged_table import add_from_record
from dbsp_pipeline.storage.task_table import TaskStateDb, TaskTableSpec, owner_files
from dbsp_pipeline.zset import WEIGHT, quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from dbsp_pipeline.runtime.plan import Plan
    from dbsp_pipeline.runtime.scatter import ScatterInReaders

#: the environment variable (read by the driver when a stage starts) naming the tasks that fail
#: on purpose after writing their files, ``"<node>:<owner>:<attempt>"`` with ``*`` for any: the
#: crash tests' way to make orphan files and failed stages
FAIL_OWNER_TASK = "DBSP_FAIL_OWNER_TASK"
#: the grouping column of an owner stage: the partition key of the owner of the row's key
#: (``owner_partition_keys``)
OWNER = "_owner"
#: a view's change of at most this many rows (the tasks count them) is collected and written on
#: the driver, like a driver step's; a bigger one is written by Spark tasks. The driver reads a
#: view's written change back whole anyway (the step's digest, ``output_log.prepare``), so the
#: bound is the driver's memory, not the rows: a Spark write job costs 0.6-0.7 s here (a 200k-row
#: change took 0.74 s to write through Spark; the (c) step on Spark at 4M orders went from 1.3 s
#: to 0.35-0.54 s with it written on the driver)
VIEW_ROWS_ON_DRIVER = 1_048_576
#: the column of a task's result: its record (JSON): staged actions and exchange files
ACTION = "_action"
#: the key of a file task's record when its input's rows need Spark (``exchange.NeedsSpark``)
NEEDS_SPARK = "needs_spark"


@functools.cache
def owner_partition_keys(workers: int) -> tuple[int, ...]:
    """For each owner ``w`` of ``workers``, the smallest INT (from 0) whose Spark hash lands in
    partition ``w`` of ``workers``. An owner stage groups a change by this key of the row's
    owner, hash-partitioned into W partitions, so each owner's rows are a task of their own,
    and W tasks run side by side. (Grouped by the owner itself, Spark's hash put owners 0 and
    1 in one partition at W=2, and one task ran both, one after the other.)"""
    keys: dict[int, int] = {}
    value = 0
    while len(keys) < workers:
        keys.setdefault(spark_hash_int(value) % workers, value)  # Python's % is Spark's pmod
        value += 1
    return tuple(keys[w] for w in range(workers))


@dataclass(frozen=True)
class OwnerTaskSpec:
    """What every task of one owner stage gets (pickled into the UDF's closure): the step,
    the state's ``root`` and ``layout``, the ``node`` with the analysed ``schemas`` of it and its
    inputs, each trace's table (``tables``, by trace name), and the memory one task's DuckDB
    may take (``task_memory``, DuckDB's spelling; None: DuckDB's default). Holds no session,
    connection, Delta handle or credentials."""

    step: int
    root: str
    layout: Layout
    node: Node
    schemas: Mapping[int, StructType]
    tables: Mapping[str, TaskTableSpec]
    task_memory: str | None = None
    #: the name of the node's tables (``Plan.state_names``; None: positional)
    state_name: str | None = None
    #: the node's inputs whose change the tasks consolidate (circuit inputs read as pushed)
    consolidate: frozenset[int] = frozenset()
    #: tests only: ``"<node>:<owner>:<attempt>"`` (``*`` matches any) makes the matching task
    #: fail after writing its files (``FAIL_OWNER_TASK``)
    fault: str | None = None
    #: the stage's exchange folder, where tasks write their output change
    #: (``runtime/exchange.py``)
    exchange_folder: str = ""
    #: when only owner stages read the node's change (``Plan.exchange_keys``): the columns
    #: whose owner splits the output into exchange files (None: a file per task)
    exchange_keys: tuple[str, ...] | None = None
    #: of those, when its readers read fewer than all its columns (``Plan.exchange_columns``):
    #: the columns the exchange files hold (the others arrive NULL)
    exchange_columns: tuple[str, ...] | None = None
    #: when the node's change is only a view's and its tasks' outputs together are
    #: consolidated: the view's log, where each task writes its part of the change itself
    #: (``output_log.write_part``) instead of an exchange file
    view: ViewFiles | None = None


# -- the task (in a Python worker) -------------------------------------------------------------
_SQL: tuple[int, LocalSQL] | None = None


def task_sql(memory: str | None) -> LocalSQL:
    """The DuckDB of this Python worker process: one per process (workers are reused across
    tasks, and a forked worker gets a connection of its own), with as many threads as the task
    has cores, a memory limit of ``memory`` (the first task's: ``task_memory``) and a spill
    folder under ``$DBSP_LOCAL_DIR`` (or the temporary folder)."""
    global _SQL
    if _SQL is None or _SQL[0] != os.getpid():
        from pyspark import TaskContext

        context = TaskContext.get()
        threads = max(1, context.cpus()) if context is not None else 1
        base = os.environ.get("DBSP_LOCAL_DIR") or tempfile.gettempdir()
        _SQL = (os.getpid(), LocalSQL(threads, memory_limit=memory,
                                      temp_directory=os.path.join(
                                          base, f"dbsp-duckdb-{os.getpid()}")))
    return _SQL[1]


def task_operator(node: Node, schemas: Mapping[int, StructType], db: TaskStateDb,
                  state_name: str | None = None) -> Operator:
    """The operator of ``node`` (its tables named ``state_name``) over one owner's state ``db``;
    its traces read a data file whose keyed run is missing instead of building the run (a task
    never builds one), and take the runs an earlier task of this worker opened and checked
    (``keyed_runs._CheckedRuns``; those whose files changed since are forgotten first). They
    keep no in-memory replica (``storage/trace_replica.py``): a task's traces live one step."""
    from dbsp_pipeline.runtime.plan import make_operator

    keyed_runs.forget_changed_runs()
    op = make_operator(node, schemas, db, state_name)
    for trace in op.state_traces():
        trace.runs.build_on_miss = False
        trace.runs.share_checked = True
        trace.replicated = False
    return op


def run_owner_task(spec: OwnerTaskSpec, key: tuple[pa.Scalar, ...],
                   *sides: pa.Table) -> pa.Table:
    """One owner's part of a shuffled stage: ``key`` holds the owner's partition key, ``sides``
    the owner's rows of each input's change (positional columns, ``_weight``, ``_owner``; an
    empty table for an input that did not change). Returns ``run_for_owner``'s record as the
    one row of a ``result_schema`` table."""
    owner = owner_partition_keys(spec.layout.workers).index(int(key[0].as_py()))
    changes: list[LocalDelta] = []
    for side, input_id in zip(sides, spec.node.inputs):
        schema = spec.schemas[input_id]
        if side.num_rows == 0:
            changes.append(None)
            continue
        names = schema.fieldNames()
        renamed = pa.Table.from_arrays(
            [side.column(positional(i)) for i in range(len(names))] + [side.column(WEIGHT)],
            names=[*names, WEIGHT])
        change = conform(renamed, schema)
        if input_id in spec.consolidate:  # an input's rows as pushed (Plan.read_by_owner_stages)
            change = task_sql(spec.task_memory).consolidate(change, names)
        changes.append(change if change.num_rows else None)
    return pa.table({ACTION: [run_for_owner(spec, owner, changes)]})


def run_file_task(spec: OwnerTaskSpec, owner: int,
                  inputs: Sequence[OwnedChange | ScatterInReaders | None]) -> str:
    """The task of owner ``owner`` of a stage whose inputs are exchange files
    (``runtime/exchange.py``) or pushed files the task splits itself (``ScatterInReaders``):
    reads the owner's rows of each input (None: the input did not change), consolidating rows
    as pushed, and returns ``run_for_owner``'s record (JSON); or, before touching any state,
    a record saying the rows need Spark (``NEEDS_SPARK``)."""
    changes: list[LocalDelta] = []
    for change in inputs:
        try:
            rows = change.read(owner) if change is not None else None
        except NeedsSpark as e:
            return json.dumps({"owner": owner, NEEDS_SPARK: str(e)})
        if change is not None and rows is not None and not change.consolidated:
            rows = task_sql(spec.task_memory).consolidate(rows, change.schema.fieldNames())
        changes.append(rows if rows is not None and rows.num_rows else None)
    return run_for_owner(spec, owner, changes)


def run_for_owner(spec: OwnerTaskSpec, owner: int, changes: Sequence[LocalDelta]) -> str:
    """Owner ``owner``'s part of the stage, given its rows of each input's change: runs the
    operator's ``step_local`` over the owner's state and writes the output change as exchange
    files (split by the owners of ``spec.exchange_keys``, else one file). Returns the task's
    record (JSON): its staged actions and files."""
    db = TaskStateDb(spec.root, spec.tables, owner, spec.layout)
    op = task_operator(spec.node, spec.schemas, db, spec.state_name)
    ctx = StepContext(None, spec.step, sql=task_sql(spec.task_memory), layout=spec.layout,
                      owner=owner)
    out = op.step_local(ctx, list(changes))
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    schema = spec.schemas[spec.node.id]
    view_part = None
    handed: dict[int, list[str]] = {}
    if spec.view is not None:
        view_part = write_part(spec.view, spec.step, out, f"owner{owner}")
    else:
        handed = exchange.write_by_owner(
            out if out is not None else zset_arrow_schema(schema).empty_table(), schema,
            spec.exchange_keys, spec.layout, spec.exchange_folder, owner,
            columns=spec.exchange_columns)
    if spec.fault is not None and _fault_matches(spec.fault, spec.node.id, owner, attempt):
        raise RuntimeError(f"injected fault ({FAIL_OWNER_TASK}={spec.fault}): task of owner "
                           f"{owner} of operator #{spec.node.id}, attempt {attempt}, after "
                           "writing its files")
    action: dict[str, Any] = {
        "step": spec.step, "owner": owner, "layout_version": spec.layout.version,
        "attempt": attempt, "rows": 0 if out is None else out.num_rows,
        "traces": {t.name: {**db.opened[t.name].record(), "rows_read": t.rows_read,
                            "retraction_reads": t.retraction_reads}
                   for t in op.state_traces()},
        "exchange": {str(w): paths for w, paths in handed.items()}}
    if view_part is not None:
        action["view"] = view_part
    return json.dumps(action)


def _fault_matches(fault: str, node: int, owner: int, attempt: int) -> bool:
    parts = fault.split(":")
    return len(parts) == 3 and all(p == "*" or p == str(v)
                                   for p, v in zip(parts, (node, owner, attempt)))


def _grouped_task(spec: OwnerTaskSpec, key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
    return run_owner_task(spec, key, table)


def _cogrouped_task(spec: OwnerTaskSpec, key: tuple[pa.Scalar, ...], left: pa.Table,
                    right: pa.Table) -> pa.Table:
    return run_owner_task(spec, key, left, right)


def _one_side_task(spec: OwnerTaskSpec, changed: int, key: tuple[pa.Scalar, ...],
                   table: pa.Table) -> pa.Table:
    """A two-input operator's task when only input ``changed`` (0 or 1) has rows."""
    empty = pa.table({})
    return run_owner_task(spec, key, *((table, empty) if changed == 0 else (empty, table)))


def result_schema() -> StructType:
    """The schema of an owner stage's result: one record per task."""
    return StructType([StructField(ACTION, StringType(), True)])


# -- the stage (on the driver) -----------------------------------------------------------------
def owner_stage(ctx: StepContext, plan: Plan, node: Node,
                inputs: Sequence[Delta | OwnedChange | ScatterInReaders]
                ) -> Delta | pa.Table | OwnedChange | PreparedWrite:
    """Run operator ``node`` of ``plan`` for this step as one task per owner of its change
    (see the module docstring); returns its output change, or None when no input changed: an
    ``OwnedChange`` when only owner stages read it (``Plan.exchange_keys``); when the node is
    only a view's, the view's write its tasks made (``output_log.joined_parts``) if the
    operator's task outputs together are consolidated and the view's log asked for it
    (``StepContext.view_files``), else an Arrow table when the tasks' output is at most
    ``VIEW_ROWS_ON_DRIVER`` rows (the view writes it on the driver), else a DataFrame over the
    tasks' exchange files (read before the step ends: ``StepContext.release`` removes them).
    Stages the tasks' trace actions on the driver's tables. Raises ``AssertionError`` (a failed
    step: rolled back, retried) when the tasks' records do not fit this step.

    An input that comes as pushed files to split (``scatter.ScatterInReaders``) is split by
    this stage's tasks when it runs as a file stage; else the scatter stage runs for it first
    (``scatter.materialize``). When a task finds the rows need Spark, the stage runs again over
    the input evaluated by Spark (what the tasks wrote is never staged)."""
    from dbsp_pipeline.runtime import scatter

    if all(d is None for d in inputs):
        return None
    op = plan.operators[node.id]
    spec = _stage_spec(ctx, plan, node, inputs)
    layout, keys = spec.layout, cast("list[list[str]]", op.owner_keys())
    owned = _file_stage_inputs(inputs, keys)
    if owned is None and any(isinstance(d, scatter.ScatterInReaders) for d in inputs):
        return owner_stage(ctx, plan, node, [
            scatter.materialize(ctx, plan, d) if isinstance(d, scatter.ScatterInReaders) else d
            for d in inputs])
    if owned is not None:
        owners = sorted({w for d in owned if d is not None for w in d.owners()})
        if not owners:
            return None
        # one job, a task per owner with rows
        records = [json.loads(r) for r in run_tasks(
            ctx.session, len(owners), lambda i: run_file_task(spec, owners[i], owned))]
        if any(NEEDS_SPARK in r for r in records) \
                and any(isinstance(d, scatter.ScatterInReaders) for d in inputs):
            return owner_stage(ctx, plan, node, [
                scatter.materialize(ctx, plan, d, in_spark=True)
                if isinstance(d, scatter.ScatterInReaders) else d for d in inputs])
    else:
        result = _shuffled_stage(spec, layout, plan, node, [  # (none is to split: see above)
            d.to_frame(ctx.session) if isinstance(d, OwnedChange) else cast("Delta", d)
            for d in inputs], keys, result_schema())
        # one job: the records are the whole result (the change is in the exchange files)
        records = [json.loads(r[ACTION]) for r in result.collect()]
    stage_records(op, records, ctx.step, layout)
    return _stage_output(ctx, plan, spec, records)


def _stage_spec(ctx: StepContext, plan: Plan, node: Node,
                inputs: Sequence[Delta | OwnedChange | ScatterInReaders]) -> OwnerTaskSpec:
    """What the tasks of ``node``'s owner stage of this step get (a fresh exchange folder of
    the step's scratch; the view's log when its tasks write the view's change). Raises
    ``AssertionError`` when the node cannot run per owner or an input's exchange files are of
    another layout."""
    op = plan.operators[node.id]
    layout = ctx.layout
    if op.owner_keys() is None or layout is None:
        raise AssertionError(f"operator #{node.id} {node.op} cannot run per owner")
    for d in inputs:
        if isinstance(d, OwnedChange) and d.layout_version != layout.version:
            raise AssertionError(f"owner stage of step {ctx.step}: an input's exchange files "
                                 f"are of layout version {d.layout_version}, not "
                                 f"{layout.version}")
    only_a_view = node.id in plan.circuit.outputs.values() and not plan.readers[node.id]
    spark = ctx.session
    return OwnerTaskSpec(
        step=ctx.step, root=plan.root, layout=layout, node=node,
        schemas={i: plan.schemas[i] for i in (node.id, *node.inputs)},
        tables={t.name: TaskTableSpec(t.name, t.table.uri, t.table.arrow_schema, tuple(t.key),
                                      owner_files(t.files(), layout), new_sorted_run())
                for t in op.state_traces()},
        task_memory=task_memory(spark), state_name=plan.state_names.get(node.id),
        consolidate=frozenset(i for i in node.inputs if plan.circuit.nodes[i].op == "input"),
        fault=os.environ.get(FAIL_OWNER_TASK) or None,
        exchange_folder=ctx.scratch_folder(exchange.new_folder(plan.root, ctx.step)),
        exchange_keys=plan.exchange_keys.get(node.id),
        exchange_columns=plan.exchange_columns.get(node.id),
        # the tasks write the view's change themselves when their outputs together are
        # consolidated
        view=ctx.view_files.get(node.id) if only_a_view and op.owner_outputs_consolidated
        else None)


def _file_stage_inputs(inputs: Sequence[Delta | OwnedChange | ScatterInReaders],
                       keys: Sequence[Sequence[str]]
                       ) -> list[OwnedChange | ScatterInReaders | None] | None:
    """``inputs`` as a file stage's tasks read them (None for an input that did not change),
    when every changed input is exchange files or pushed files split by the stage's own keys;
    else None (the stage shuffles DataFrames)."""
    from dbsp_pipeline.runtime import scatter

    handed = (OwnedChange, scatter.ScatterInReaders)
    if not any(isinstance(d, handed) for d in inputs) or not all(
            d is None or (isinstance(d, handed) and d.keys is not None
                          and list(d.keys) == list(side))
            for d, side in zip(inputs, keys)):
        return None
    return [d if isinstance(d, handed) else None for d in inputs]


def _stage_output(ctx: StepContext, plan: Plan, spec: OwnerTaskSpec,
                  records: Sequence[Mapping[str, Any]]
                  ) -> pa.Table | OwnedChange | PreparedWrite | DataFrame | None:
    """An owner stage's output change from its tasks' (staged) ``records``, as ``owner_stage``
    returns it."""
    node = spec.node
    op = plan.operators[node.id]
    if spec.view is not None:  # the view's change, written by the tasks
        return joined_parts(ctx.step, [r["view"] for r in sorted(records,
                                                                  key=lambda r: int(r["owner"]))])
    change = _owned_change(plan.schemas[node.id], spec.exchange_keys, spec.layout,
                           spec.exchange_folder, records)
    if change is None or spec.exchange_keys is not None:
        return change
    only_a_view = node.id in plan.circuit.outputs.values() and not plan.readers[node.id]
    if only_a_view and change.rows <= VIEW_ROWS_ON_DRIVER:
        if op.owner_outputs_consolidated:  # each task's output is, and their keys differ
            ctx.consolidated_changes.add(node.id)
        return change.read_all()  # written on the driver (no Spark write job)
    return change.to_frame(ctx.session)


# -- a chain of stages as one job --------------------------------------------------------------
def gang_stages(ctx: StepContext, plan: Plan, chain: Sequence[Node],
                inputs: Sequence[Delta | OwnedChange | ScatterInReaders]
                ) -> list[Any] | None:
    """The owner stages of ``chain`` (``Plan.gang_chain``: each stage after the first reads
    the one before it, whose change only it reads, split by its keys, and no other input
    changed this step) as one Spark job instead of one each: each of the W tasks
    (``run_gang_task``, all started together: ``spark_session.run_gang_tasks``) runs the first
    stage for its owner over ``inputs``, posts its record, waits for every task's
    (``runtime/rendezvous.py``), runs the next stage for its owner over the exchange files
    those records name, and so on. Returns each stage's change as ``owner_stage`` would (the
    tasks' records staged in stage order); None, having staged nothing, when this step cannot:
    the first stage is not a file stage, the layout has more workers than the tasks that can
    start together, or the first stage's rows need Spark (``NEEDS_SPARK``) - the caller then
    runs the stages one by one. Saves a job's fixed cost (its launch and its end: about 0.1 s
    here) per stage after the first; each task waits at each meeting for the slowest task.

    Determinism: each task computes a stage's input from all of the stage before's records
    exactly as the driver does from the records it collects (the same records: a task returns
    what it posted), so every stage's output equals the stages run one by one. A task that
    fails fails the job (Spark kills the other tasks and does not run a barrier job's tasks
    again), so the step fails and nothing of it is staged, as when any owner stage fails."""
    layout = ctx.layout
    if all(d is None for d in inputs):
        return [None] * len(chain)
    first_op = plan.operators[chain[0].id]
    owned = _file_stage_inputs(inputs, cast("list[list[str]]", first_op.owner_keys()))
    if layout is None or owned is None or layout.workers > gang_slots(ctx.session):
        return None
    owners = sorted({w for d in owned if d is not None for w in d.owners()})
    if not owners:
        return [None] * len(chain)
    specs = [_stage_spec(ctx, plan, chain[0], inputs)] + [
        _stage_spec(ctx, plan, node, []) for node in chain[1:]]
    results = [json.loads(r)["records"] for r in run_gang_tasks(
        ctx.session, layout.workers,
        lambda w: run_gang_task(specs, owned, frozenset(owners), w))]
    changes: list[Any] = []
    handed: OwnedChange | None = None
    for k, (node, spec) in enumerate(zip(chain, specs)):
        records = [json.loads(r[k]) for r in results if len(r) > k and r[k]]
        if k == 0 and any(NEEDS_SPARK in r for r in records):
            return None
        if k > 0 and sorted(int(r["owner"]) for r in records) != (
                handed.owners() if handed is not None else []):
            raise AssertionError(f"step {ctx.step}: the tasks of operator #{node.id} ran for "
                                 f"owners {[r['owner'] for r in records]}, not for the owners "
                                 f"of operator #{chain[k - 1].id}'s change")
        if k > 0 and handed is None:
            changes.append(None)
            continue
        stage_records(plan.operators[node.id], records, ctx.step, layout)
        changes.append(_stage_output(ctx, plan, spec, records))
        if k < len(chain) - 1:
            handed = changes[-1]
            assert handed is None or isinstance(handed, OwnedChange)  # (read by the next)
    return changes


def run_gang_task(specs: Sequence[OwnerTaskSpec],
                  inputs: Sequence[OwnedChange | ScatterInReaders | None],
                  owners: frozenset[int], owner: int) -> str:
    """Owner ``owner``'s task of ``gang_stages``: the first stage's task when the owner got
    rows of ``inputs`` (``owners``), its record posted in the stage's meeting folder (under
    its exchange folder), then, once every task posted, the next stage's task over the
    owner's rows of that stage's change (the stage's other inputs did not change), and so on,
    until a stage hands no rows on or the first stage needs Spark. Returns the records it
    made, by stage (JSON; ``""`` for a stage it did not run for its owner)."""
    records: list[str] = []
    for k, spec in enumerate(specs):
        records.append(run_file_task(spec, owner, inputs) if owner in owners else "")
        if k == len(specs) - 1:
            break
        meet = f"{spec.exchange_folder}/_meet"
        rendezvous.post(meet, owner, records[-1])
        posted = [json.loads(r) for r in rendezvous.gather(meet, spec.layout.workers) if r]
        if any(NEEDS_SPARK in r for r in posted):
            break
        handed = _owned_change(spec.schemas[spec.node.id], spec.exchange_keys, spec.layout,
                               spec.exchange_folder, posted)
        if handed is None:
            break
        following = specs[k + 1].node
        inputs = [handed if i == spec.node.id else None for i in following.inputs]
        owners = frozenset(handed.owners())
    return json.dumps({"records": records})


def _shuffled_stage(spec: OwnerTaskSpec, layout: Layout, plan: Plan, node: Node,
                    inputs: Sequence[Delta], keys: Sequence[Sequence[str]],
                    out_type: StructType) -> DataFrame:
    """The stage's result frame when its inputs are DataFrames: each change hash-partitioned
    by its rows' owners into W partitions and grouped by owner (``cogroup`` when both sides
    of a join changed), one ``run_owner_task`` per group."""
    workers = layout.workers
    owner_keys = F.expr(f"array({', '.join(str(k) for k in owner_partition_keys(workers))})")
    grouped = []
    for d, input_id, side_keys in zip(inputs, node.inputs, keys):
        if d is None:  # no rows: the task gets an empty table for this side
            continue
        schema = plan.schemas[input_id]
        owner = layout.owner_column(side_keys)
        grouped.append(d.select(
            *[F.col(quote(n)).alias(positional(i)) for i, n in enumerate(schema.fieldNames())],
            F.col(WEIGHT), F.element_at(owner_keys, owner + 1).alias(OWNER)
        ).repartition(workers, OWNER).groupBy(OWNER))
    if len(node.inputs) == 1:
        # A lambda: PySpark infers the UDF's form from type hints, and fails on a partial.
        return grouped[0].applyInArrow(lambda key, t: _grouped_task(spec, key, t), out_type)
    if len(node.inputs) == 2 and len(grouped) == 2:
        return grouped[0].cogroup(grouped[1]).applyInArrow(
            lambda key, left, right: _cogrouped_task(spec, key, left, right), out_type)
    if len(node.inputs) == 2:  # one side changed: only its owners run
        changed = 0 if inputs[0] is not None else 1
        return grouped[0].applyInArrow(
            lambda key, t: _one_side_task(spec, changed, key, t), out_type)
    raise AssertionError(  # pragma: no cover - owner_keys names one or two inputs
        f"operator #{node.id} {node.op}: {len(node.inputs)} inputs")


def _owned_change(schema: StructType, keys: Sequence[str] | None, layout: Layout, folder: str,
                  records: Sequence[Mapping[str, Any]]) -> OwnedChange | None:
    """The change a stage's tasks wrote as exchange files, from their (checked) records; None
    when they wrote no rows."""
    files: dict[int, list[str]] = {}
    for record in sorted(records, key=lambda r: int(r["owner"])):
        for w, paths in record.get("exchange", {}).items():
            files.setdefault(int(w), []).extend(str(p) for p in paths)
    rows = sum(int(r.get("rows", 0)) for r in records)
    if not rows:
        return None
    return OwnedChange(schema, None if keys is None else tuple(keys), layout.version, folder,
                       {w: tuple(paths) for w, paths in sorted(files.items())}, rows)


def stage_records(op: Operator, records: Sequence[Mapping[str, Any]], step: int,
                  layout: Layout) -> None:
    """Stage the trace actions of one owner stage's task ``records`` on the driver's tables, in
    owner order. ``AssertionError`` naming the record when an owner has two records, or a
    record is of another step, layout or trace."""
    traces = {t.name: t for t in op.state_traces()}
    seen: set[int] = set()
    for record in sorted(records, key=lambda r: int(r["owner"])):
        owner = int(record["owner"])
        if owner in seen or not 0 <= owner < layout.workers:
            raise AssertionError(f"owner stage of step {step}: owner {owner} reported twice or "
                                 f"is not one of {layout.workers} workers: {record}")
        seen.add(owner)
        if record["step"] != step or record["layout_version"] != layout.version:
            raise AssertionError(f"owner stage of step {step} (layout version "
                                 f"{layout.version}): a task reported {record}")
        if set(record["traces"]) != set(traces):
            raise AssertionError(f"owner stage of step {step}: task of owner {owner} reported "
                                 f"traces {sorted(record['traces'])}, not {sorted(traces)}")
    for record in sorted(records, key=lambda r: int(r["owner"])):
        for name, actions in record["traces"].items():
            trace = traces[name]
            adds = [add_from_record(a) for a in actions.get("adds", [])]
            removes = [trace.table.store.path(str(p)) for p in actions.get("removes", [])]
            if adds or removes:
                trace.table.stage(adds, removes)
                trace.reset_cache()
            trace.rows_read += int(actions.get("rows_read", 0))
            trace.retraction_reads += int(actions.get("retraction_reads", 0))


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_bytes(text: str) -> int | None:
    """Bytes of a JVM-style memory size (``4g``, ``512m``, ``1024``); None if unreadable."""
    m = _MEMORY.match(text)
    return None if m is None else int(float(m[1]) * _UNITS[m[2].lower()])


def task_memory(spark: SparkSession) -> str | None:
    """The memory one task's DuckDB may take, in DuckDB's spelling: half the executor's memory
    over its cores (in local mode, the driver's memory over the local cores). None when Spark's
    configuration does not say."""
    if conf_value(spark, "spark.master", "").startswith("local"):
        total = memory_bytes(conf_value(spark, "spark.driver.memory", "1g"))
        cores = task_slots(spark)
    else:
        total = memory_bytes(conf_value(spark, "spark.executor.memory", "1g"))
        cores = int(conf_value(spark, "spark.executor.cores", "1"))
    if total is None:
        return None
    return f"{max(64, total // 2 // max(1, cores) >> 20)}MB"
