"""One owner's view of the state (``TaskStateDb``/``TaskTable``), on the driver, without Spark:
the unchanged ``step_local`` of Join, Aggregate and Distinct run once per owner over the owners'
views gives the driver path's rows; the tasks' records, staged on the driver and committed,
round-trip into the same trace values; a task reads only its owner's rows of a file that
straddles owners, and never builds a keyed run."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import Node
from dbsp_pipeline.driver import hashing
from dbsp_pipeline.driver.sql import LocalSQL, zset_arrow_schema
from dbsp_pipeline.operators.base import Operator, StepContext
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.runtime.owner_exec import stage_records, task_operator
from dbsp_pipeline.runtime.plan import make_operator
from dbsp_pipeline.spark_session import LazySession
from dbsp_pipeline.storage import keyed_runs
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.task_table import TaskStateDb, TaskTableSpec, owner_files
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import SHARD, WEIGHT


def schema(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(n, t()) for n, t in fields])


LEFT = schema(("k", IntegerType), ("a", StringType))
RIGHT = schema(("k", IntegerType), ("b", LongType))
JOINED = schema(("k", IntegerType), ("a", StringType), ("b", LongType))
VALUES = schema(("g", StringType), ("v", DoubleType))
GROUPED = schema(("g", StringType), ("n", LongType), ("s", DoubleType), ("lo", DoubleType))
TOTAL = schema(("n", LongType), ("s", DoubleType))
AGGS = [{"name": "n", "fn": "count", "arg": None}, {"name": "s", "fn": "sum", "arg": "v"},
        {"name": "lo", "fn": "min", "arg": "v"}]

CASES: dict[str, tuple[Node, dict[int, StructType]]] = {
    "join": (Node(2, "join", (0, 1), {"on": ["k"]}), {0: LEFT, 1: RIGHT, 2: JOINED}),
    "aggregate": (Node(1, "aggregate", (0,), {"keys": ["g"], "aggregates": AGGS}),
                  {0: VALUES, 1: GROUPED}),
    "keyless": (Node(1, "aggregate", (0,), {"keys": [], "aggregates": AGGS[:2]}),
                {0: VALUES, 1: TOTAL}),
    "distinct": (Node(1, "distinct", (0,), {}), {0: VALUES, 1: VALUES}),
}


def change(schema: StructType, rows: int, seed: int) -> pa.Table:
    """A Z-set of ``rows`` random rows (NULLs, negative keys, repeats, some retractions)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, Any] = {}
    for f in schema.fields:
        kind = f.dataType.simpleString()
        if kind == "int":
            cols[f.name] = [None if i % 97 == 0 else int(v)
                            for i, v in enumerate(rng.integers(-3000, 3000, rows))]
        elif kind == "string":
            cols[f.name] = [None if i % 89 == 0 else f"g{v}"
                            for i, v in enumerate(rng.integers(0, 2000, rows))]
        elif kind == "bigint":
            cols[f.name] = [int(v) for v in rng.integers(-10**12, 10**12, rows)]
        else:
            cols[f.name] = [float(v) for v in rng.integers(-50, 50, rows) / 4]
    cols[WEIGHT] = [int(w) for w in rng.choice([1, 1, 1, 2, -1], rows)]
    return pa.Table.from_pydict(cols, schema=zset_arrow_schema(schema))


def counter(table: pa.Table | None) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    if table is None:
        return out
    names = [n for n in table.column_names if n not in (WEIGHT, SHARD)]
    for row in table.to_pylist():
        out[tuple(row[n] for n in names)] += row[WEIGHT]
    return Counter({k: v for k, v in out.items() if v != 0})


def owners_of(rows: pa.Table, key: list[str], layout: Layout) -> np.ndarray:
    """What ``Trace.owners`` computes, for a change (no ``_shard`` column yet)."""
    shards = hashing.shard_arrow(rows, key).to_numpy()
    return layout.owners(shards, hashing.xxhash64_arrow(rows, key).astype(np.uint64))


def open_db(root: Path) -> StateDatabase:
    db = StateDatabase(LazySession(), str(root), "task-table-test")  # never starts Spark
    db.open()
    return db


def run_per_owner(op: Operator, db: StateDatabase, node: Node, schemas: dict[int, StructType],
                  changes: list[pa.Table], layout: Layout, sql: LocalSQL, step: int
                  ) -> tuple[list[pa.Table], list[dict[str, Any]], list[Trace]]:
    """``step_local`` once per owner over the owners' views; the records as JSON crossed."""
    keys = op.owner_keys()
    assert keys is not None
    tables = {t.name: TaskTableSpec(t.name, t.table.uri, t.table.arrow_schema, tuple(t.key),
                                    owner_files(t.files(), layout))
              for t in op.state_traces()}
    outs, records, task_traces = [], [], []
    split = [owners_of(c, k, layout) for c, k in zip(changes, keys)]
    for w in range(layout.workers):
        mine = [c.filter(pa.array(o == w)) for c, o in zip(changes, split)]
        if not any(m.num_rows for m in mine):
            continue
        tdb = TaskStateDb(db.root, tables, w, layout)
        top = task_operator(node, schemas, tdb)
        ctx = StepContext(None, step, sql=sql, layout=layout, owner=w)
        out = top.step_local(ctx, [m if m.num_rows else None for m in mine])
        if out is not None:
            outs.append(out)
        records.append(json.loads(json.dumps({
            "step": step, "owner": w, "layout_version": layout.version,
            "traces": {t.name: {**tdb.opened[t.name].record(), "rows_read": t.rows_read}
                       for t in top.state_traces()}})))
        task_traces += top.state_traces()
    return outs, records, task_traces


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", [Layout.initial(2, "fixed"), Layout.initial(3, "modulo"),
                                    Layout.initial(2, "dynamic").rescaled(3)],
                         ids=["fixed2", "modulo3", "dynamic3"])
def test_step_local_per_owner_equals_the_driver_path(tmp_path: Path, case: str,
                                                     layout: Layout) -> None:
    node, schemas = CASES[case]
    sql = LocalSQL()
    inputs = [schemas[i] for i in node.inputs]
    # Step 1 on the driver in both roots: one big file per trace, straddling every owner.
    base = [change(s, 20_000, seed=i) for i, s in enumerate(inputs)]
    step2 = [change(s, 700, seed=10 + i) for i, s in enumerate(inputs)]
    ref_db, db = open_db(tmp_path / "ref"), open_db(tmp_path / "tasks")
    ref = make_operator(node, schemas, ref_db)
    op = make_operator(node, schemas, db)
    for o in (ref, op):
        o.step_local(StepContext(None, 1, sql=sql), base)
    keyed_runs.wait_for_writes()
    expected = ref.step_local(StepContext(None, 2, sql=sql), step2)

    # No keyed runs on this host: a task reads its owner's rows of the file, builds none on
    # its path; the runs of the files it read are built in the background, for the next steps.
    shutil.rmtree(root_layout.keyed_runs(db.root), ignore_errors=True)
    outs, records, task_traces = run_per_owner(op, db, node, schemas, step2, layout, sql, 2)
    assert sum(t.runs.built for t in task_traces) == 0
    # nor an in-memory replica (a task's traces live one step: ``storage/trace_replica.py``)
    assert all(not t.replicated and t._replica is None for t in task_traces)
    keyed_runs.wait_for_writes()
    written = {os.path.join(folder, name) for folder, _, names in
               os.walk(root_layout.keyed_runs(db.root)) for name in names}
    assert written <= {t.runs.run_path(f) for t in task_traces for f in t.files()}
    assert counter(pa.concat_tables(outs) if outs else None) == counter(expected)
    assert len(records) >= min(2, layout.workers) or case == "keyless"

    # The records, staged on the driver and committed, give the driver path's trace values;
    # every file a task wrote holds rows of its owner only.
    stage_records(op, records, 2, layout)
    db.commit()
    reopened = open_db(tmp_path / "tasks")
    again = make_operator(node, schemas, reopened)
    for mine, theirs, record_trace in zip(again.state_traces(), ref.state_traces(),
                                          op.state_traces()):
        assert counter(sql.consolidate(mine.read_arrow(), mine.payload)) == counter(
            sql.consolidate(theirs.read_arrow(), theirs.payload)), mine.name
        by_path = {f.path: f for f in mine.files()}
        for record in records:
            for add in record["traces"][record_trace.name]["adds"]:
                f = by_path[mine.table.store.path(add["path"])]
                owners = mine.owners(layout, mine.read_arrow([f]))
                assert set(owners.tolist()) == {record["owner"]}


def test_a_straddling_file_is_read_as_its_owners_part(tmp_path: Path) -> None:
    db = open_db(tmp_path / "root")
    node, schemas = CASES["distinct"]
    op = make_operator(node, schemas, db)
    op.step_local(StepContext(None, 1, sql=LocalSQL()), [change(VALUES, 3000, seed=5)])
    (trace,) = op.state_traces()
    (whole,) = trace.files()
    rows = trace.read_arrow()
    for layout in (Layout.initial(3, "fixed"), Layout.initial(4, "modulo")):
        spec = TaskTableSpec(trace.name, trace.table.uri, trace.table.arrow_schema,
                             tuple(trace.key), owner_files([whole], layout))
        owners = trace.owners(layout, rows)
        parts = []
        for w in range(layout.workers):
            part = TaskStateDb(db.root, {trace.name: spec}, w, layout).table(
                trace.name, StructType([*VALUES.fields, *trace_fields(trace)])).read_arrow(
                    [whole], columns=["g", WEIGHT])
            assert part.num_rows == int((owners == w).sum())
            parts.append(part)
        assert counter(pa.concat_tables(parts)) == counter(rows.select(["g", WEIGHT]))


def trace_fields(trace: Trace) -> list[Any]:
    return [StructField(WEIGHT, LongType(), False), StructField(SHARD, IntegerType(), False)]


def test_a_table_the_driver_did_not_send_is_named(tmp_path: Path) -> None:
    from dbsp_pipeline.errors import StorageError

    db = TaskStateDb(str(tmp_path), {}, 1, Layout.initial(2))
    with pytest.raises(StorageError, match="owner 1: the operator asks for state table 'n1_x'"):
        db.table("n1_x", VALUES)
