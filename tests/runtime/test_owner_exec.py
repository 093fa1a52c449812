"""Owner stages on real Spark (local mode): Join, Aggregate (count, an exact double sum, a min
whose minimum is deleted) and Distinct run as one task per owner give the driver path's output
and, consolidated, its traces, at W in {1, 2, 4} under each sharding; every file a task appends
holds one owner's rows; column names hold dots, backticks and other characters to quote."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dbsp_pipeline.circuit import Circuit
from dbsp_pipeline.driver.sql import LocalSQL, zset_arrow_schema
from dbsp_pipeline.operators.base import StepContext
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.runtime.owner_exec import (
    OWNER,
    memory_bytes,
    owner_partition_keys,
    result_schema,
)
from dbsp_pipeline.runtime.plan import Plan
from dbsp_pipeline.storage.data_files import sorted_run_of
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.zset import SHARD, WEIGHT

ODD = 'a.b`c"d e'
K, A, N = "k " + ODD, "amount " + ODD, "name " + ODD


def _bt(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def circuit() -> Circuit:
    c = Circuit("owners")
    orders = c.input("orders", f"{_bt(K)} INT, {_bt(A)} DOUBLE")
    customers = c.input("customers", f"{_bt(K)} INT, {_bt(N)} STRING")
    c.output("joined", orders.join(customers, on=K))
    c.output("totals", orders.group_by(K).agg(n="count(*)", s=f"sum({_bt(A)})",
                                              lo=f"min({_bt(A)})"))
    c.output("names", customers.distinct())
    return c


def changes(plan: Plan, seed: int, rows: int, retract: dict[str, pa.Table] | None = None
            ) -> dict[str, pa.Table]:
    """Random changes of both inputs (NULL keys, repeats); with ``retract``, also the
    deletion of some of those rows (a group's minimum among them)."""
    rng = np.random.default_rng(seed)
    keys = [None if i % 53 == 0 else int(v) for i, v in enumerate(rng.integers(-400, 400, rows))]
    amounts = [float(v) for v in rng.integers(-1000, 1000, rows) / 8]
    names = [f"n{v}" for v in rng.integers(0, 300, rows)]
    out = {"orders": pa.table({K: pa.array(keys, pa.int32()), A: amounts, WEIGHT: [1] * rows}),
           "customers": pa.table({K: pa.array(keys[::-1], pa.int32()), N: names,
                                  WEIGHT: [1] * rows})}
    if retract:
        for name, base in retract.items():
            gone = base.slice(0, rows // 3)
            out[name] = pa.concat_tables([out[name], gone.set_column(
                2, WEIGHT, pa.array([-1] * gone.num_rows, pa.int64()))])
    return {n: t.cast(zset_arrow_schema(plan.input_schema(n))) for n, t in out.items()}


def counter(table: pa.Table | None) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    if table is not None:
        names = [n for n in table.column_names if n not in (WEIGHT, SHARD)]
        for row in table.to_pylist():
            out[tuple(row[n] for n in names)] += row[WEIGHT]
    return Counter({k: v for k, v in out.items() if v != 0})


def open_plan(spark: Any, root: Path) -> Plan:
    db = StateDatabase(spark, str(root), "owner-exec-test")
    db.open()
    return Plan(circuit(), spark, db)


@pytest.mark.parametrize("layout", [Layout.initial(1), Layout.initial(2, "modulo"),
                                    Layout.initial(4, "dynamic")],
                         ids=["W1-fixed", "W2-modulo", "W4-dynamic"])
def test_owner_stages_equal_the_driver_path(spark, tmp_path: Path, layout: Layout) -> None:
    sql = LocalSQL()
    ref, plan = open_plan(spark, tmp_path / "ref"), open_plan(spark, tmp_path / "owners")
    c = plan.circuit
    assert plan.owner_capable == {c.outputs["joined"], c.outputs["totals"],
                                  c.outputs["names"]}
    base = changes(plan, seed=1, rows=3000)
    for p in (ref, plan):  # step 1 on the driver: files straddling every owner
        p.evaluate(StepContext(spark, 1, sql=sql), dict(base))
    step2 = changes(plan, seed=2, rows=400, retract=base)
    expected = ref.evaluate(StepContext(spark, 2, sql=sql), dict(step2))

    before = {t.name: set(t.files()) for t in plan.state_traces()}
    ctx = StepContext(spark, 2, layout=layout, per_owner=True)
    try:
        got = plan.evaluate(ctx, {n: spark.createDataFrame(t) for n, t in step2.items()})
        for name, node_id in c.outputs.items():
            frame = got[node_id]
            # a view's small change comes collected, to be written on the driver
            assert isinstance(frame, pa.Table), name
            assert frame.column_names == [*plan.output_schema(name).fieldNames(), WEIGHT]
            assert counter(frame) == counter(expected[node_id]), name
        # the aggregate's and the distinct's changes are marked consolidated (their tasks'
        # outputs are, and their keys differ), and are: consolidating again changes nothing
        assert ctx.consolidated_changes == {c.outputs["totals"], c.outputs["names"]}
        for name in ("totals", "names"):
            change = got[c.outputs[name]]
            again = LocalSQL().consolidate(change, plan.output_schema(name).fieldNames())
            assert again.num_rows == change.num_rows > 0, name
    finally:
        ctx.release()

    for mine, theirs in zip(plan.state_traces(), ref.state_traces()):
        assert counter(sql.consolidate(mine.read_arrow(), mine.payload)) == counter(
            sql.consolidate(theirs.read_arrow(), theirs.payload)), mine.name
        new = [f for f in mine.files() if f not in before[mine.name]]
        assert new, mine.name
        for f in new:  # a task's file: one owner's rows
            assert len(set(mine.owners(layout, mine.read_arrow([f])).tolist())) == 1, mine.name
        # the files every owner's task appended are one sorted run, as a driver append is
        assert len({sorted_run_of(f.path) for f in new}) == 1, mine.name
        assert mine.rows_read > 0 or mine.name.endswith("_right")  # the tasks' reads count


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7, 16, 1024])
def test_each_owner_is_a_spark_partition_of_its_own(spark, workers: int) -> None:
    """Rows keyed by ``owner_partition_keys`` and hash-partitioned into W partitions: owner
    w's rows are partition w, so the W tasks of a stage run side by side."""
    from pyspark.sql import functions as F

    keys = owner_partition_keys(workers)
    assert len(set(keys)) == workers
    owners = [w for w in range(workers) for _ in range(2)]
    df = spark.createDataFrame([(w, keys[w]) for w in owners], f"owner INT, {OWNER} INT")
    placed = df.repartition(workers, OWNER).select("owner", F.spark_partition_id().alias("p"))
    assert sorted((r["owner"], r["p"]) for r in placed.collect()) == [(w, w) for w in owners]


def test_exchange_files_hold_changes_under_positional_names() -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    from dbsp_pipeline.runtime.exchange import file_schema

    assert file_schema(StructType([StructField(ODD, StringType(), False)])).names == [
        "_c0", WEIGHT]
    assert result_schema().fieldNames() == ["_action"]  # a task's result: its record
    assert (memory_bytes("4g"), memory_bytes("512m"), memory_bytes("12"),
            memory_bytes("lots")) == (4 << 30, 512 << 20, 12, None)


@pytest.mark.parametrize("view_rows_on_driver", [65_536, 0], ids=["driver-writes", "spark-writes"])
def test_a_pipeline_runs_its_spark_steps_per_owner(spark, tmp_path: Path, monkeypatch,
                                                    view_rows_on_driver: int) -> None:
    """``Pipeline.spark_per_owner`` at W=2: Spark steps run the owner stages; the views equal a
    driver-path pipeline's, the staged task files are recorded by the step's commit (reopening
    gives the same state, ``verify`` is clean), and a later driver step continues on them. An
    aggregate's and a distinct's tasks write their parts of the view's change themselves (the
    step's record: their files, rows and summed digest, equal to the driver path's); a join's
    small change is collected and written on the driver (``VIEW_ROWS_ON_DRIVER``), a bigger
    one by Spark."""
    from dbsp_pipeline.runtime import owner_exec
    from dbsp_pipeline.runtime.pipeline import Pipeline

    monkeypatch.setattr(owner_exec, "VIEW_ROWS_ON_DRIVER", view_rows_on_driver)

    ref = Pipeline(circuit(), str(tmp_path / "ref"), spark)
    p = Pipeline(circuit(), str(tmp_path / "p"), spark, driver_step_rows=0)
    with pytest.raises(Exception, match="spark_per_owner must be True or False"):
        p.spark_per_owner = 1  # type: ignore[assignment]
    p.rescale(2)
    p.spark_per_owner = True
    rounds = [([(1, 2.0), (1, 3.0), (2, 5.0), (None, 1.0)], [(1, "n"), (4, "s"), (1, "n")]),
              ([(1, 2.0), (3, 1.0)], [(4, "s")])]
    for i, (orders, customers) in enumerate(rounds):
        before = {t.name: set(t.files()) for t in p.engine.plan.state_traces()}
        for q in (ref, p):
            q.push("orders", orders, weight=1 if i == 0 else -1)
            q.push("customers", customers, weight=1 if i == 0 else -1)
            q.push("orders", [(3, 7.0)])
            result = q.step()
            assert result.on_driver is (q is ref)
            assert ("per owner" in result.path_reason and "(W=2)" in result.path_reason) \
                is (q is p)
        for name in ("joined", "totals", "names"):
            assert counter(p.view_arrow(name)) == counter(ref.view_arrow(name)), (i, name)
            written = p.engine.outputs[name]._files()[-1].path  # this step's: by whom?
            by_tasks = os.path.basename(written).startswith("owner")
            by_driver = os.path.dirname(written).endswith(f"{os.sep}data") and not by_tasks
            assert by_tasks is (name in ("totals", "names")), (i, name, written)
            assert by_driver is (view_rows_on_driver > 0 and not by_tasks), (i, name, written)
            # the record of the step: rows and digest as the driver path wrote them
            step = p.engine.outputs[name].last() - 1
            mine, theirs = (q.engine.divisions.outputs(step)[name] for q in (p, ref))
            assert (mine["rows"], mine["digest"]) == (theirs["rows"], theirs["digest"]), name
        for t in p.engine.plan.state_traces():  # the step's files: one owner's rows each
            for f in set(t.files()) - before[t.name]:
                owners = t.owners(p.engine.layout, t.read_arrow([f]))
                assert len(set(owners.tolist())) == 1, (i, t.name)
    p.close()
    with Pipeline(circuit(), str(tmp_path / "p"), spark) as again:  # driver steps from here
        assert again.verify().ok
        for name in ("joined", "totals", "names"):
            assert counter(again.view_arrow(name)) == counter(ref.view_arrow(name)), name
        for q in (ref, again):
            q.push("orders", [(1, 3.0)], weight=-1)
            q.push("customers", [(1, "n")])
            q.step()
        for name in ("joined", "totals", "names"):
            assert counter(again.view_arrow(name)) == counter(ref.view_arrow(name)), name
    ref.close()


def test_a_failing_owner_task_fails_the_step_and_leaves_only_orphans(spark, tmp_path: Path,
                                                                    monkeypatch) -> None:
    """A task that fails (on every attempt) after writing its files fails the step
    (``StepFailedError``: nothing staged, the step stays next); the retry gives the driver
    path's views, and garbage collection deletes exactly the failed attempt's files."""
    from dbsp_pipeline import StepFailedError
    from dbsp_pipeline.runtime.owner_exec import FAIL_OWNER_TASK
    from dbsp_pipeline.runtime.pipeline import Pipeline

    ref = Pipeline(circuit(), str(tmp_path / "ref"), spark)
    with Pipeline(circuit(), str(tmp_path / "p"), spark, driver_step_rows=0) as p:
        p.rescale(2)
        p.spark_per_owner = True
        join = p.circuit.outputs["joined"]
        traces = p.engine.plan.state_traces()

        def stored() -> set[str]:
            return {f.path for t in traces for f in t.table.store.stored_data_files()}

        for q in (ref, p):
            q.push("orders", [(1, 2.0), (2, 5.0), (5, 1.0)])
            q.push("customers", [(1, "n"), (2, "s"), (5, "e")])
            q.step()
        before = stored()
        monkeypatch.setenv(FAIL_OWNER_TASK, f"{join}:*:*")
        for q in (ref, p):
            q.push("orders", [(1, 3.0), (2, 4.0), (5, 6.0)])
            q.push("customers", [(2, "t")])
        with pytest.raises(StepFailedError, match="injected fault"):
            p.step()
        orphans = stored() - before
        assert orphans  # the failed tasks wrote files
        monkeypatch.delenv(FAIL_OWNER_TASK)
        p.step()
        ref.step()
        for name in ("joined", "totals", "names"):
            assert counter(p.view_arrow(name)) == counter(ref.view_arrow(name)), name
        live = {f.path for t in traces for f in t.files()}
        assert not orphans & live
        p.collect_garbage(0)
        assert not orphans & stored() and live <= stored()
        assert p.verify().ok
        for name in ("joined", "totals", "names"):
            assert counter(p.view_arrow(name)) == counter(ref.view_arrow(name)), name
    ref.close()


def test_a_failing_aggregate_task_leaves_its_view_files_as_orphans(spark, tmp_path: Path,
                                                                    monkeypatch) -> None:
    """An aggregate's tasks write the view's change themselves: a task that fails after
    writing leaves its view file an orphan (the step fails, nothing of it is recorded); the
    retry's view equals the driver path's, and garbage collection deletes the orphan, not
    the files the step's record names."""
    from dbsp_pipeline import StepFailedError
    from dbsp_pipeline.runtime.owner_exec import FAIL_OWNER_TASK
    from dbsp_pipeline.runtime.pipeline import Pipeline

    ref = Pipeline(circuit(), str(tmp_path / "ref"), spark)
    with Pipeline(circuit(), str(tmp_path / "p"), spark, driver_step_rows=0) as p:
        p.rescale(2)
        p.spark_per_owner = True
        log = p.engine.outputs["totals"]

        def stored() -> set[str]:
            return {f.path for f in log.table.store.stored_data_files()}

        before = stored()
        monkeypatch.setenv(FAIL_OWNER_TASK, f"{p.circuit.outputs['totals']}:*:*")
        for q in (ref, p):
            q.push("orders", [(1, 2.0), (2, 5.0), (5, 1.0), (5, 0.5)])
        with pytest.raises(StepFailedError, match="injected fault"):
            p.step()
        orphans = stored() - before
        assert orphans and all(os.path.basename(f).startswith("owner") for f in orphans)
        monkeypatch.delenv(FAIL_OWNER_TASK)
        p.step()
        ref.step()
        assert counter(p.view_arrow("totals")) == counter(ref.view_arrow("totals"))
        written = {f.path for f in log._files()}
        assert written and not orphans & written
        p.collect_garbage(0)
        assert not orphans & stored() and written <= stored()
        assert p.verify().ok
        assert counter(p.view_arrow("totals")) == counter(ref.view_arrow("totals"))
    ref.close()


def chained_circuit() -> Circuit:
    """Owner stages that read owner stages: a join's change aggregated (handed on as exchange
    files), a join of two distincts (both sides files), and a join of a distinct with an input
    (one side files, read by Spark)."""
    c = Circuit("chained")
    orders = c.input("orders", f"{_bt(K)} INT, {_bt(A)} DOUBLE")
    customers = c.input("customers", f"{_bt(K)} INT, {_bt(N)} STRING")
    c.output("by_name", orders.join(customers, on=K).group_by(N).agg(
        n="count(*)", s=f"sum({_bt(A)})", lo=f"min({_bt(A)})"))
    distinct_orders = orders.distinct()
    c.output("both_files", distinct_orders.join(customers.distinct(), on=K))
    c.output("one_side_files", distinct_orders.join(customers, on=K))
    return c


@pytest.mark.parametrize("layout", [Layout.initial(1), Layout.initial(2, "modulo"),
                                    Layout.initial(3, "dynamic")],
                         ids=["W1-fixed", "W2-modulo", "W3-dynamic"])
def test_owner_stages_hand_changes_on_as_files(spark, tmp_path: Path, layout: Layout) -> None:
    """A node whose change only owner stages read, grouped by the same columns, hands it on
    as exchange files split by those columns' owners (``Plan.exchange_keys``): every view
    equals the driver path's, over steps that insert and retract; each file holds one owner's
    rows; the step's exchange folders are gone once the step is released."""
    from dbsp_pipeline import root as root_layout
    from dbsp_pipeline.runtime.exchange import OwnedChange, owners_of

    sql = LocalSQL()

    def plan_at(folder: Path) -> Plan:
        db = StateDatabase(spark, str(folder), "owner-exchange-test")
        db.open()
        return Plan(chained_circuit(), spark, db)

    ref, plan = plan_at(tmp_path / "ref"), plan_at(tmp_path / "owners")
    nodes = plan.circuit.nodes
    joins = {n.id for n in nodes if n.op == "join"}
    distincts = {n.id for n in nodes if n.op == "distinct"}
    first_join = min(joins)
    assert plan.exchange_keys == {first_join: (N,), **{d: (K,) for d in distincts}}
    # the aggregate reads the join's names and amounts only: its files hold those two
    assert plan.exchange_columns == {first_join: (A, N)}
    base = changes(plan, seed=3, rows=2000)
    steps = [base, changes(plan, seed=4, rows=300, retract=base)]
    for step, change in enumerate(steps, start=1):
        expected = ref.evaluate(StepContext(spark, step, sql=sql), dict(change))
        ctx = StepContext(spark, step, layout=layout, per_owner=True)
        try:
            got = plan.evaluate(ctx, {n: spark.createDataFrame(t) for n, t in change.items()})
            handed = {i: c for i, c in got.items() if isinstance(c, OwnedChange)}
            assert set(handed) == set(plan.exchange_keys), step
            for node_id, c in handed.items():
                assert c.rows == sum(c.read(w).num_rows for w in c.owners())
                held = 2 if node_id == first_join else len(plan.schemas[node_id].fields)
                assert all(len(pa.ipc.open_file(f).schema) == held + 1
                           for paths in c.files.values() for f in paths), node_id
                for w in c.owners():
                    rows = c.read(w)
                    assert set(owners_of(layout, rows, c.keys).tolist()) == {w}
            for name, node_id in plan.circuit.outputs.items():
                frame = got[node_id]
                if not isinstance(frame, pa.Table):
                    frame = frame.toArrow()
                assert counter(frame) == counter(expected[node_id]), (step, name)
            assert os.listdir(root_layout.exchange(str(tmp_path / "owners")))
        finally:
            ctx.release()
        assert not os.listdir(root_layout.exchange(str(tmp_path / "owners")))
    for mine, theirs in zip(plan.state_traces(), ref.state_traces()):
        assert counter(sql.consolidate(mine.read_arrow(), mine.payload)) == counter(
            sql.consolidate(theirs.read_arrow(), theirs.payload)), mine.name


def test_opening_a_root_removes_what_a_crashed_step_handed_on(spark, tmp_path: Path) -> None:
    """Exchange folders are a step's scratch: one a crash left is removed when the root is
    opened again, and the state is untouched."""
    from dbsp_pipeline import root as root_layout
    from dbsp_pipeline.runtime.pipeline import Pipeline

    with Pipeline(circuit(), str(tmp_path), spark) as p:
        p.push("orders", [(1, 2.0)])
        p.step()
    left = Path(root_layout.exchange(str(tmp_path), "7-crashed")) / "data"
    left.mkdir(parents=True)
    (left / "x.parquet").write_bytes(b"not yet read")
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        assert not os.path.exists(root_layout.exchange(str(tmp_path)))
        assert counter(p.view_arrow("totals")) == Counter({(1, 1, 2.0, 2.0): 1})


def gang_circuit(eager: bool = False) -> Circuit:
    """A join whose change only an aggregate reads (``Plan.gang_reader``); planned eagerly,
    an aggregate per customer whose change only the join reads, whose change only the merging
    aggregate reads. Its orders come through a filter that a task cannot always evaluate
    (``x / d`` with ``x`` NULL and ``d`` 0: Spark gives NULL, the driver's translation
    raises)."""
    c = Circuit("gang", eager_aggregation=eager)
    orders = c.input("orders", "k INT, amount DOUBLE, x DOUBLE, d DOUBLE")
    customers = c.input("customers", "k INT, name STRING")
    big = orders.filter("amount > 1 AND NOT (x / d < 0)").select("k", "amount")
    c.output("by_name", big.join(customers, on="k").group_by("name").agg(
        n="count(*)", s="sum(amount)", hi="max(amount)"))
    return c


def gang_orders(lo: int, hi: int) -> list[tuple[Any, ...]]:
    return [(i % 23, float(i % 7), float(i), 2.0) for i in range(lo, hi)]


def spy_jobs(monkeypatch) -> Counter[str]:
    """Count the driver's task jobs: gang jobs (``run_gang_tasks``) and one-stage ones."""
    from dbsp_pipeline.runtime import owner_exec, scatter

    jobs: Counter[str] = Counter()
    gang, tasks = owner_exec.run_gang_tasks, owner_exec.run_tasks

    def counting_gang(*args: Any) -> Any:
        jobs["gang"] += 1
        return gang(*args)

    def counting_tasks(*args: Any) -> Any:
        jobs["stage"] += 1
        return tasks(*args)

    monkeypatch.setattr(owner_exec, "run_gang_tasks", counting_gang)
    monkeypatch.setattr(owner_exec, "run_tasks", counting_tasks)
    monkeypatch.setattr(scatter, "run_tasks", counting_tasks)
    return jobs


@pytest.mark.parametrize("workers, eager", [(1, False), (2, False), (4, False), (2, True)],
                         ids=["W1", "W2", "W4", "W2-eager"])
def test_owner_stages_run_as_one_job(spark, tmp_path: Path, monkeypatch, workers: int,
                                     eager: bool) -> None:
    """A join whose change only an aggregate reads runs with it as one gang job when its W
    tasks can start together (W <= the 2 local slots); planned eagerly, the aggregate per
    customer, the join and the merge run as one job when no customer changed, else the first
    alone and the other two as one. Every view and trace equals the driver path's over steps
    that insert, delete and move customers, with no other job; at W=4 the stages run as a job
    each, as they do with ``spark_gang_stages`` off. When the first stage's tasks find its
    input needs Spark, nothing of the gang job is kept: that stage runs the Spark way."""
    from dbsp_pipeline.runtime.pipeline import Pipeline

    jobs = spy_jobs(monkeypatch)
    ref = Pipeline(gang_circuit(eager), str(tmp_path / "ref"), spark)
    with Pipeline(gang_circuit(eager), str(tmp_path / "p"), spark, driver_step_rows=0) as p:
        plan = p.engine.plan
        join = next(n.id for n in plan.circuit.nodes if n.op == "join")
        aggregates = [n.id for n in plan.circuit.nodes if n.op == "aggregate"]
        assert plan.gang_reader == ({aggregates[0]: join, join: aggregates[1]} if eager else
                                    {join: aggregates[0]})
        assert p.spark_gang_stages  # the default
        p.rescale(workers)
        gang = workers <= 2
        stages = 3 if eager else 2
        # per step: a gang job of every stage, or (customers changed) of all but the first
        expected = [Counter(stage=stages * step) if not gang else
                    Counter(gang=step, stage=min(step, 2)) if eager else Counter(gang=step)
                    for step in (1, 2, 3)]
        pushes = [  # per step: (orders inserted, orders deleted, customers)
            ([(0, 60)], [], [(k, f"c{k % 5}") for k in range(20)]),
            ([(60, 90)], [(0, 12)], [(21, "c1")]),
            ([(90, 95)], [(60, 70)], []),
        ]
        for step, (inserted, deleted, customers) in enumerate(pushes, start=1):
            for q in (ref, p):
                for lo, hi in inserted:
                    q.push("orders", gang_orders(lo, hi))
                for lo, hi in deleted:
                    q.push("orders", gang_orders(lo, hi), weight=-1)
                if customers:
                    q.push("customers", customers)
                assert q.step().on_driver is (q is ref)
            assert counter(p.view_arrow("by_name")) == counter(ref.view_arrow("by_name"))
            assert jobs == expected[step - 1], step
        p.spark_gang_stages = False
        jobs.clear()
        for q in (ref, p):
            q.push("orders", gang_orders(95, 99))
            q.step()
        assert jobs == Counter(stage=stages)
        assert counter(p.view_arrow("by_name")) == counter(ref.view_arrow("by_name"))
        p.spark_gang_stages = True
        jobs.clear()
        for q in (ref, p):  # the join's tasks cannot evaluate x / d: Spark evaluates the chain
            q.push("orders", [(3, 5.0, None, 0.0), (4, 6.0, 1.0, 2.0)])
            q.step()
        # (eager: the join and the merge still meet as one job after the first stage)
        assert jobs["gang"] == ((2 if eager else 1) if gang else 0)
        assert counter(p.view_arrow("by_name")) == counter(ref.view_arrow("by_name"))
        sql = LocalSQL()
        for mine, theirs in zip(plan.state_traces(), ref.engine.plan.state_traces()):
            assert counter(sql.consolidate(mine.read_arrow(), mine.payload)) == counter(
                sql.consolidate(theirs.read_arrow(), theirs.payload)), mine.name
        assert p.verify().ok
    ref.close()


def test_a_failing_task_of_a_gang_job_fails_the_step(spark, tmp_path: Path,
                                                      monkeypatch) -> None:
    """A task of a gang job that fails after writing the second stage's files fails the job
    (Spark kills the other task and does not run the job again): the step fails, nothing of
    it is staged; the retry equals the driver path, and garbage collection deletes exactly
    the failed job's files."""
    from dbsp_pipeline import StepFailedError
    from dbsp_pipeline.runtime.owner_exec import FAIL_OWNER_TASK
    from dbsp_pipeline.runtime.pipeline import Pipeline

    jobs = spy_jobs(monkeypatch)
    ref = Pipeline(gang_circuit(), str(tmp_path / "ref"), spark)
    with Pipeline(gang_circuit(), str(tmp_path / "p"), spark, driver_step_rows=0) as p:
        p.rescale(2)
        traces = p.engine.plan.state_traces()
        log = p.engine.outputs["by_name"]

        def stored() -> set[str]:
            return {f.path for t in [*traces, log] for f in t.table.store.stored_data_files()}

        for q in (ref, p):
            q.push("customers", [(k, f"c{k % 5}") for k in range(23)])
            q.push("orders", gang_orders(0, 40))
            q.step()
        before = stored()
        monkeypatch.setenv(FAIL_OWNER_TASK, f"{p.circuit.outputs['by_name']}:1:*")
        for q in (ref, p):
            q.push("orders", gang_orders(40, 80))
            q.push("orders", gang_orders(0, 10), weight=-1)
        jobs.clear()
        with pytest.raises(StepFailedError, match="injected fault"):
            p.step()
        assert jobs == Counter(gang=1)
        orphans = stored() - before
        assert orphans  # the tasks wrote trace and view files
        monkeypatch.delenv(FAIL_OWNER_TASK)
        p.step()
        ref.step()
        assert counter(p.view_arrow("by_name")) == counter(ref.view_arrow("by_name"))
        live = {f.path for t in traces for f in t.files()} | {f.path for f in log._files()}
        assert not orphans & live
        p.collect_garbage(0)
        assert not orphans & stored() and live <= stored()
        assert p.verify().ok
        assert counter(p.view_arrow("by_name")) == counter(ref.view_arrow("by_name"))
    ref.close()
