"""Scatter stages on real Spark: an input read only by owner stages, directly or through
row-wise operators, is split by owner from its pushed files in tasks (a scatter stage's, or the
reading stage's own); every view equals a driver-path pipeline's over steps that insert and
delete, whether the pushed files are more or fewer than the tasks; a chain a task cannot
evaluate without Spark falls back to Spark's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dbsp_pipeline.circuit import Circuit
from dbsp_pipeline.runtime import scatter
from dbsp_pipeline.runtime.exchange import OwnedChange
from dbsp_pipeline.runtime.pipeline import Pipeline
from dbsp_pipeline.zset import WEIGHT


def circuit() -> Circuit:
    c = Circuit("scatter")
    orders = c.input("orders", "k INT, amount DOUBLE, x DOUBLE, d DOUBLE")
    customers = c.input("customers", "k INT, name STRING")
    big = orders.filter("amount > 1").select("k", "amount", "x / d AS q")
    joined = big.join(customers, on="k")
    c.output("by_name", joined.group_by("name").agg(n="count(*)", s="sum(amount)",
                                                    hi="max(amount)"))
    c.output("joined", joined)
    return c


def counter(table: pa.Table) -> Counter[tuple[Any, ...]]:
    names = [n for n in table.column_names if n != WEIGHT]
    out: Counter[tuple[Any, ...]] = Counter()
    for row in table.to_pylist():
        out[tuple(row[n] for n in names)] += row[WEIGHT]
    return Counter({k: v for k, v in out.items() if v})


def orders(lo: int, hi: int) -> list[tuple[Any, ...]]:
    return [(i % 23, float(i % 7), float(i), 2.0) for i in range(lo, hi)]


@pytest.mark.parametrize("rows_per_task, fused_rows", [
    (scatter.ROWS_PER_TASK, 0), (7, 0), (scatter.ROWS_PER_TASK, scatter.FUSED_READ_ROWS)],
    ids=["one-task", "two-tasks", "in-readers"])
def test_an_input_read_by_owner_stages_is_scattered_from_its_files(
        spark, tmp_path: Path, monkeypatch, rows_per_task: int, fused_rows: int) -> None:
    monkeypatch.setattr(scatter, "ROWS_PER_TASK", rows_per_task)
    monkeypatch.setattr(scatter, "FUSED_READ_ROWS", fused_rows)
    handed: list[object] = []
    split_in_readers: list[object] = []
    in_spark: list[object] = []
    stage, in_readers, materialize = (scatter.scatter_stage, scatter.in_readers,
                                      scatter.materialize)

    def recording(*args: Any) -> object:
        result = stage(*args)
        handed.append(result)
        return result

    def recording_in_readers(*args: Any) -> object:
        result = in_readers(*args)
        if result is not None:
            split_in_readers.append(result)
        return result

    def recording_materialize(*args: Any, **kwargs: Any) -> object:
        result = materialize(*args, **kwargs)
        if kwargs.get("in_spark"):
            in_spark.append(result)
        return result

    monkeypatch.setattr(scatter, "scatter_stage", recording)
    monkeypatch.setattr(scatter, "in_readers", recording_in_readers)
    monkeypatch.setattr(scatter, "materialize", recording_materialize)
    ref = Pipeline(circuit(), str(tmp_path / "ref"), spark)
    with Pipeline(circuit(), str(tmp_path / "p"), spark, driver_step_rows=0) as p:
        plan = p.engine.plan
        nodes = plan.circuit.nodes
        orders_id, customers_id = plan.circuit.inputs["orders"], plan.circuit.inputs["customers"]
        join = next(n.id for n in nodes if n.op == "join")
        filter_id, select_id = (next(n.id for n in nodes if n.op == op)
                                for op in ("filter", "select"))
        assert plan.scatter_chains == {orders_id: ((filter_id, select_id), ("k",)),
                                       customers_id: ((), ("k",))}
        assert join not in plan.exchange_keys  # read by a view too
        p.rescale(2)
        p.spark_per_owner = True
        pushes = [  # per step: (orders inserted, orders deleted, customers)
            ([(0, 40)], [], [(k, f"c{k % 5}") for k in range(20)]),
            ([(40, 50), (50, 61), (61, 70)], [(0, 9)], [(21, f"c{1}")]),  # 3 files
            ([(70, 75)], [(40, 50)], []),
        ]
        for step, (inserted, deleted, customers) in enumerate(pushes):
            for q in (ref, p):
                for lo, hi in inserted:
                    q.push("orders", orders(lo, hi))
                for lo, hi in deleted:
                    q.push("orders", orders(lo, hi), weight=-1)
                if customers:
                    q.push("customers", customers)
                assert q.step().on_driver is (q is ref)
            for name in ("by_name", "joined"):
                assert counter(p.view_arrow(name)) == counter(ref.view_arrow(name)), (step, name)
        # customers unchanged in the last step
        if fused_rows:  # each join task read the pushed rows and kept its owner's
            assert handed == [] and len(split_in_readers) == 2 * len(pushes) - 1
            assert all(isinstance(h, scatter.ScatterInReaders) and not h.consolidated
                       for h in split_in_readers)
        else:
            assert len(handed) == 2 * len(pushes) - 1 and split_in_readers == []
            assert all(isinstance(h, OwnedChange) and h.owners() for h in handed)
            assert {h.consolidated for h in handed if isinstance(h, OwnedChange)} == {False}

        # x / d with x NULL and d = 0: Spark gives NULL, DuckDB raises; the task cannot ask
        # Spark, so the step evaluates the chain in Spark
        handed.clear()
        for q in (ref, p):
            q.push("orders", [(3, 5.0, None, 0.0), (4, 6.0, 1.0, 2.0)])
            q.step()
        if fused_rows:  # the join's tasks found the chain needs Spark: the join ran again
            assert handed == [] and len(in_spark) == 1 and in_spark[0] is not None
        else:
            assert handed == [scatter.FALLBACK] and in_spark == []
        for name in ("by_name", "joined"):
            assert counter(p.view_arrow(name)) == counter(ref.view_arrow(name)), name
        assert p.verify().ok
    ref.close()


def test_each_task_reads_its_share_of_the_rows_and_no_more(tmp_path: Path, monkeypatch) -> None:
    """The shares of 1..5 tasks partition the pushed rows in order, whatever the files' and
    row groups' sizes; a task reads only the row groups its share overlaps."""
    import pyarrow.parquet as pq

    from dbsp_pipeline.storage.data_files import DataFiles

    schema = pa.schema([("v", pa.int64()), (WEIGHT, pa.int64())])
    files = DataFiles.for_uri(str(tmp_path), schema)
    paths, start = [], 0
    for n, group in [(10, 3), (1, 1), (0, 1), (25, 7)]:  # rows, rows per row group
        path = str(tmp_path / f"f{len(paths)}.parquet")
        pq.write_table(pa.table({"v": list(range(start, start + n)), WEIGHT: [1] * n},
                                schema=schema), path, row_group_size=group)
        paths.append(path)
        start += n
    for tasks in range(1, 6):
        shares = [scatter.share_of_rows(files, paths, i, tasks) for i in range(tasks)]
        assert [v for s in shares for v in s.column("v").to_pylist()] == list(range(36))
        assert max(s.num_rows for s in shares) - min(s.num_rows for s in shares) <= 1
    read: list[int] = []
    original = pq.ParquetFile.read_row_group

    def counting(self: pq.ParquetFile, i: int, *args: Any, **kwargs: Any) -> pa.Table:
        read.append(i)
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    assert scatter.share_of_rows(files, paths, 0, 4).column("v").to_pylist() == list(range(9))
    assert read == [0, 1, 2]  # rows 0-8: three of the first file's four row groups


def test_a_reader_that_cannot_split_the_change_itself_gets_a_scatter_stage(
        spark, tmp_path: Path, monkeypatch) -> None:
    """The join's other side comes from a union (a Spark frame): the join cannot run as a file
    stage, so the orders' change is scattered for it first; in a step where only orders
    change, the join's tasks split it themselves, W=4 tasks for rows of two keys (owners with
    no rows run empty). Every view equals the driver path's."""
    c = Circuit("split_or_scatter")
    orders = c.input("orders", "k INT, amount DOUBLE")
    customers = c.input("customers", "k INT, name STRING")
    vips = c.input("vips", "k INT, name STRING")
    joined = orders.filter("amount > 1").join(customers.union(vips), on="k")
    c.output("by_name", joined.group_by("name").agg(n="count(*)", s="sum(amount)"))
    made: list[object] = []
    stages: list[object] = []
    materialize, stage = scatter.materialize, scatter.scatter_stage

    def recording_materialize(*args: Any, **kwargs: Any) -> object:
        made.append(materialize(*args, **kwargs))
        return made[-1]

    def recording_stage(*args: Any) -> object:
        stages.append(stage(*args))
        return stages[-1]

    monkeypatch.setattr(scatter, "materialize", recording_materialize)
    monkeypatch.setattr(scatter, "scatter_stage", recording_stage)
    ref = Pipeline(c, str(tmp_path / "ref"), spark)
    with Pipeline(c, str(tmp_path / "p"), spark, driver_step_rows=0) as p:
        p.rescale(4)
        p.spark_per_owner = True
        steps = [  # per step: orders (k, amount, weight), customers, vips
            ([(k % 2, float(k % 5), 1) for k in range(30)], [(0, "a"), (1, "b")], [(1, "v")]),
            ([(0, 4.0, 1), (1, 4.0, -1), (1, 9.0, 1)], [], []),
        ]
        for number, (changes, customers_rows, vips_rows) in enumerate(steps):
            for q in (ref, p):
                for k, amount, weight in changes:
                    q.push("orders", [(k, amount)], weight=weight)
                if customers_rows:
                    q.push("customers", customers_rows)
                if vips_rows:
                    q.push("vips", vips_rows)
                assert q.step().on_driver is (q is ref)
            assert counter(p.view_arrow("by_name")) == counter(ref.view_arrow("by_name")), number
            if number == 0:  # the union's frame on the other side: scattered first
                assert len(made) == 1 and made == stages and isinstance(made[0], OwnedChange)
            else:  # only orders changed: split in the join's own tasks
                assert len(made) == 1 and len(stages) == 1
        assert p.verify().ok
    ref.close()
