"""A circuit input's change split by owner straight from its pushed files, for the owner stages
that read it (the first exchange of a per-owner Spark step).

An input whose change reaches only owner stages, directly or through a chain of row-wise
operators (``filter``, a ``select`` DuckDB evaluates, ``conform``, ``negate``;
``Plan.scatter_chains``), is not read into Spark: a *scatter stage* of a few tasks reads the
files this step's pushes wrote (each task a share of them), applies the chain with the driver
path's operator code (``step_local`` on the task's DuckDB), splits the rows by the owner of the
reading stages' keys and writes them as exchange files (``runtime/exchange.py``). The readers
then run as file stages: no Spark shuffle of the change, no consolidation in Spark, no row
crossing the JVM.

When every reading task can afford to read the whole change (its rows times the workers at most
``FUSED_READ_ROWS``), there is no scatter stage: the change goes to the readers as a
``ScatterInReaders``, and each reading owner stage's task reads all the pushed rows, applies
the chain and keeps its owner's (one Spark job less per step). A reader that cannot run as a
file stage (another input came as a DataFrame) has the scatter stage run for it then
(``materialize``).

The rows are as pushed (not consolidated): row-wise operators commute with consolidation, and
the reading stage's task consolidates its owner's rows (equal rows have equal keys, so one
owner), as an owner stage reading a raw input does (``Plan.read_by_owner_stages``).

When a task cannot apply the chain without Spark (DuckDB raised where Spark might not: the
driver path then asks Spark, which a task cannot), the stage reports it and the step evaluates
the chain and its readers the Spark way instead (``scatter_stage`` returns ``FALLBACK``; a
reading task raises ``exchange.NeedsSpark`` and its stage runs again over ``materialize(...,
in_spark=True)``).

Durability: none; the tasks write only exchange files, a step's scratch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import StructType

from dbsp_pipeline.circuit import Node
from dbsp_pipeline.driver.sql import conform, zset_arrow_schema
from dbsp_pipeline.operators.base import LocalDelta, StepContext
from dbsp_pipeline.runtime import exchange
from dbsp_pipeline.runtime.exchange import NeedsSpark, OwnedChange
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.runtime.owner_exec import task_memory, task_sql
from dbsp_pipeline.spark_session import run_tasks, task_slots
from dbsp_pipeline.storage.data_files import CHECKSUMS_READ, DataFiles

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from dbsp_pipeline.runtime.plan import Plan

#: the operators a scatter task applies between an input and the owner stages reading it
ROW_WISE = frozenset({"filter", "select", "conform", "negate"})
#: a scatter stage runs a task per this many pushed rows (at most one per task slot or owner)
ROWS_PER_TASK = 250_000
#: ``scatter_stage``'s answer when a task could not apply the chain (the step goes the Spark way)
FALLBACK = "fallback"
#: an input's change goes to its readers unsplit (``ScatterInReaders``) when its pushed rows
#: times the workers (each reading task reads them all) are at most this many
FUSED_READ_ROWS = 4_000_000


@dataclass(frozen=True)
class PushedChange:
    """An input's change for this step as the files its pushes wrote: the log table's ``uri``
    and file schema, the files' absolute ``paths`` and ``rows``; ``frame`` gives the change as
    Spark reads it (consolidated), for a step that does not scatter it."""

    uri: str
    file_schema: pa.Schema
    paths: tuple[str, ...]
    rows: int
    frame: Callable[[], DataFrame | None]


@dataclass(frozen=True)
class ScatterSpec:
    """What every task of one scatter stage gets (pickled: no session, no Delta handle): the
    ``input`` node and the ``chain`` of row-wise nodes after it, their analysed ``schemas``,
    the pushed files (their table's ``uri`` and ``file_schema``, ``paths``), the owners' ``keys``
    (columns of the chain's last node) and ``layout``, the exchange ``folder``, the number of
    ``tasks``."""

    step: int
    input: Node
    chain: tuple[Node, ...]
    schemas: dict[int, StructType]
    uri: str
    file_schema: pa.Schema
    paths: tuple[str, ...]
    keys: tuple[str, ...]
    layout: Layout
    folder: str
    tasks: int
    task_memory: str | None = None


def share_of_rows(files: DataFiles, paths: Sequence[str], index: int, tasks: int) -> pa.Table:
    """Task ``index`` of ``tasks``' share of the rows of the Parquet files ``paths``: the rows
    ``[n * index / tasks, n * (index + 1) / tasks)`` of their ``n`` rows in file and row-group
    order. Reads the files' footers and only the row groups that overlap the share (so a task
    holds its share and at most two row groups more)."""
    groups: list[tuple[pq.ParquetFile, int, int]] = []  # (file, row group, rows)
    for path in paths:
        parquet = pq.ParquetFile(files.filesystem.open_input_file(files.fs_path(path)),
                                 **CHECKSUMS_READ)
        groups += [(parquet, g, parquet.metadata.row_group(g).num_rows)
                   for g in range(parquet.metadata.num_row_groups)]
    total = sum(rows for _, _, rows in groups)
    lo, hi = total * index // tasks, total * (index + 1) // tasks
    pieces, start = [], 0
    for parquet, group, rows in groups:
        if start < hi and start + rows > lo and rows:
            table = parquet.read_row_group(group)
            pieces.append(table.slice(max(lo - start, 0), min(hi, start + rows) - max(lo, start)))
        start += rows
    return pa.concat_tables(pieces) if pieces else files.schema.empty_table()


def chain_rows(spec: ScatterSpec, index: int, tasks: int) -> LocalDelta:
    """Task ``index`` of ``tasks``' share of the pushed rows through the chain (None: no rows
    left). ``exchange.NeedsSpark`` when an operator of the chain needs Spark."""
    schema = spec.schemas[spec.input.id]
    rows = share_of_rows(DataFiles.for_uri(spec.uri, spec.file_schema), spec.paths, index, tasks)
    current: LocalDelta = conform(rows, schema) if rows.num_rows else None
    if current is None:
        return None
    from dbsp_pipeline.runtime.plan import make_operator

    ctx = StepContext(None, spec.step, sql=task_sql(spec.task_memory), layout=spec.layout)
    for node in spec.chain:
        operator = make_operator(node, spec.schemas, cast(Any, None))  # row-wise: no state
        try:
            current = operator.step_local(ctx, [current])
        except AssertionError as e:  # it asked for Spark (``StepContext.session``)
            raise NeedsSpark(f"operator #{node.id} {node.op}: {e}") from None
        if current is None or current.num_rows == 0:
            return None
    return current


def scatter_task(spec: ScatterSpec, index: int) -> str:
    """Task ``index`` of ``spec.tasks``: reads its share of the pushed rows
    (``share_of_rows``), applies the chain and writes the rows as exchange files by owner.
    Returns one record (JSON): the files per owner and the rows, or ``fallback`` with the
    reason."""
    try:
        current = chain_rows(spec, index, spec.tasks)
    except NeedsSpark as e:
        return json.dumps({"index": index, FALLBACK: str(e)})
    end = spec.chain[-1].id if spec.chain else spec.input.id
    handed = {} if current is None else exchange.write_by_owner(
        current, spec.schemas[end], spec.keys, spec.layout, spec.folder)
    return json.dumps({"index": index, "rows": 0 if current is None else current.num_rows,
                       "exchange": {str(w): paths for w, paths in handed.items()}})


@dataclass(frozen=True)
class ScatterInReaders:
    """An input's change (its pushed files and row-wise ``chain``, ``spec``) that each reading
    owner stage's task splits itself: ``read(owner)`` reads all the pushed rows, applies the
    chain and keeps the rows of ``owner`` by ``keys``. Offers what a file stage asks of an
    ``OwnedChange``; a stage that cannot run as a file stage asks ``materialize`` for the
    scatter stage's ``OwnedChange`` (or Spark's frame) instead."""

    spec: ScatterSpec
    #: the chain's last node's payload schema
    schema: StructType
    keys: tuple[str, ...]
    layout_version: int
    #: the pushed rows (an upper bound of the change's)
    rows: int
    #: on the driver only (not pickled into tasks): the pushed change, and what ``materialize``
    #: made of it, by ``in_spark``
    pushed: PushedChange | None = field(default=None, compare=False)
    made: dict[bool, OwnedChange | DataFrame | None] = field(default_factory=dict,
                                                             compare=False)
    consolidated: bool = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "pushed": None, "made": {}}

    def owners(self) -> list[int]:
        """Every owner (which ones get rows is known only once the chain has run)."""
        return list(range(self.spec.layout.workers))

    def read(self, owner: int) -> pa.Table:
        """Owner ``owner``'s rows through the chain (payload under the schema's names, and
        ``_weight``; as pushed, not consolidated). ``exchange.NeedsSpark`` when the chain
        needs Spark."""
        rows = chain_rows(self.spec, 0, 1)
        if rows is None:
            return zset_arrow_schema(self.schema).empty_table()
        if self.spec.layout.workers == 1:
            return rows
        owners = exchange.owners_of(self.spec.layout, rows, self.keys)
        return rows.filter(pa.array(owners == owner))


def in_readers(ctx: StepContext, plan: Plan, node: Node, change: PushedChange
               ) -> ScatterInReaders | None:
    """Input ``node``'s pushed ``change`` for its readers' tasks to split
    (``ScatterInReaders``), when they can afford to read all of it (``FUSED_READ_ROWS``);
    else None (run ``scatter_stage``)."""
    layout = ctx.layout
    if layout is None or not change.paths \
            or change.rows * layout.workers > FUSED_READ_ROWS:
        return None
    chain_ids, keys = plan.scatter_chains[node.id]
    chain = tuple(plan.circuit.nodes[i] for i in chain_ids)
    end = chain[-1].id if chain else node.id
    spec = ScatterSpec(
        step=ctx.step, input=node, chain=chain,
        schemas={n.id: plan.schemas[n.id] for n in (node, *chain)}, uri=change.uri,
        file_schema=change.file_schema, paths=change.paths, keys=tuple(keys), layout=layout,
        folder="", tasks=1, task_memory=task_memory(ctx.session))
    return ScatterInReaders(spec, plan.schemas[end], tuple(keys), layout.version, change.rows,
                            pushed=change)


def materialize(ctx: StepContext, plan: Plan, change: ScatterInReaders,
                in_spark: bool = False) -> OwnedChange | DataFrame | None:
    """``change`` as a stage that cannot split it in its tasks needs it: the scatter stage's
    ``OwnedChange`` (None: no rows), or, when a task cannot apply the chain (or ``in_spark``),
    the chain evaluated by Spark over the pushed change (a DataFrame). Made once per step and
    ``in_spark``; on the driver."""
    if in_spark in change.made:
        return change.made[in_spark]
    pushed, node = change.pushed, change.spec.input
    if pushed is None:
        raise AssertionError(f"step {ctx.step}: input #{node.id}'s change left the driver")
    made: OwnedChange | DataFrame | str | None = (
        FALLBACK if in_spark else scatter_stage(ctx, plan, node, pushed))
    if made == FALLBACK:
        if True in change.made:
            made = change.made[True]
        else:
            frame = pushed.frame()
            for chained in change.spec.chain:
                frame = plan.operators[chained.id].step(ctx, [frame])
            made = change.made[True] = frame
    assert not isinstance(made, str)
    change.made[in_spark] = made
    return made


def scatter_stage(ctx: StepContext, plan: Plan, node: Node, change: PushedChange
                  ) -> OwnedChange | None | str:
    """Split input ``node``'s pushed ``change`` by owner through its chain
    (``Plan.scatter_chains``) as exchange files: the chain's last node's change as an
    ``OwnedChange`` (None: no rows), or ``FALLBACK`` when a task could not apply the chain."""
    chain_ids, keys = plan.scatter_chains[node.id]
    layout = ctx.layout
    if layout is None:
        raise AssertionError(f"step {ctx.step}: a scatter stage needs the layout")
    if not change.paths:
        return None
    spark = ctx.session
    tasks = max(1, min(max(task_slots(spark), layout.workers),
                       -(-change.rows // ROWS_PER_TASK)))
    chain = tuple(plan.circuit.nodes[i] for i in chain_ids)
    spec = ScatterSpec(
        step=ctx.step, input=node, chain=chain,
        schemas={n.id: plan.schemas[n.id] for n in (node, *chain)}, uri=change.uri,
        file_schema=change.file_schema, paths=change.paths,
        keys=tuple(keys), layout=layout,
        folder=ctx.scratch_folder(exchange.new_folder(plan.root, ctx.step)), tasks=tasks,
        task_memory=task_memory(spark))
    records = [json.loads(r) for r in run_tasks(spark, tasks,
                                                lambda i: scatter_task(spec, i))]
    if sorted(int(r["index"]) for r in records) != list(range(tasks)):
        raise AssertionError(f"scatter stage of step {ctx.step}: records of tasks "
                             f"{sorted(int(r['index']) for r in records)}, not 0..{tasks - 1}")
    if any(FALLBACK in r for r in records):
        return FALLBACK
    rows = sum(int(r["rows"]) for r in records)
    if not rows:
        return None
    files: dict[int, list[str]] = {}
    for record in sorted(records, key=lambda r: int(r["index"])):
        for w, paths in record["exchange"].items():
            files.setdefault(int(w), []).extend(paths)
    end = chain[-1].id if chain else node.id
    return OwnedChange(plan.schemas[end], tuple(keys), layout.version, spec.folder,
                       {w: tuple(p) for w, p in sorted(files.items())}, rows,
                       consolidated=False)


def chain_of(plan: Plan, node: Node) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """The row-wise chain from input ``node`` to a node only owner stages read, all grouping
    by the same columns, and those columns; None when there is none (see the module
    docstring)."""
    from dbsp_pipeline.operators.linear import Filter, Select

    views = set(plan.circuit.outputs.values())
    chain: list[int] = []
    current = node.id
    while True:
        keys = plan.handoff_keys(current)
        if keys is not None:
            return tuple(chain), keys
        readers = plan.readers[current]
        if current in views or len(readers) != 1:
            return None
        reader = plan.circuit.nodes[readers[0]]
        operator = plan.operators[reader.id]
        if reader.op not in ROW_WISE or len(reader.inputs) != 1 or (
                isinstance(operator, (Filter, Select)) and operator.local_sql is None):
            return None
        chain.append(reader.id)
        current = reader.id
