"""Where a step runs (``runtime/path_choice.py``): the decision's rules, the estimate on a real
plan, and a load that runs where the decision says with the same output on both paths."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.runtime.path_choice import (
    DRIVER_OVERHEAD,
    Budget,
    WorkEstimate,
    available_memory,
    budget,
    choose,
    choose_spark_execution,
    estimate,
    merge_rows_on_driver,
    row_bytes_of_trace,
    task_budget,
)

GIB = 1 << 30


def work(input_rows: int, change_bytes: int) -> WorkEstimate:
    return WorkEstimate(input_rows=input_rows, change_rows=input_rows, change_bytes=change_bytes,
                        lookup_rows=0, lookup_bytes=0, scan_rows=0)


# -- the decision --------------------------------------------------------------------------
def test_auto_runs_a_change_that_fits_the_budget_on_the_driver():
    # a 1M-row load of about 300 MB, against 8 GiB: the driver, however many rows
    choice = choose(work(1_000_000, 300 << 20), driver_step_rows=None, spark_only=None,
                    budget=Budget(8 * GIB, "test"))
    assert choice.on_driver
    assert choice.reason.startswith("driver: 1,000,000 input rows") and "within" in choice.reason


def test_auto_runs_a_change_over_the_budget_on_spark():
    small = work(10, 1_000)
    assert choose(small, driver_step_rows=None, spark_only=None,
                  budget=Budget(10**6, "test")).on_driver
    big = work(5_000, 10**6)  # 2 MB with the driver's copies, against 1 MB
    choice = choose(big, driver_step_rows=None, spark_only=None, budget=Budget(10**6, "test"))
    assert not choice.on_driver
    assert choice.reason.startswith("Spark: 5,000 input rows")
    assert "over the budget" in choice.reason
    assert big.driver_bytes == 10**6 * DRIVER_OVERHEAD


def test_an_explicit_driver_step_rows_is_the_threshold_whatever_the_estimate():
    huge_budget, no_budget = Budget(100 * GIB, "test"), Budget(0, "test")
    at = choose(work(500, 10**9), driver_step_rows=500, spark_only=None, budget=no_budget)
    assert at == (True, "driver: 500 input rows, at most driver_step_rows=500", False)
    over = choose(work(501, 10), driver_step_rows=500, spark_only=None, budget=huge_budget)
    assert over == (False, "Spark: 501 input rows, more than driver_step_rows=500", False)


def test_driver_step_rows_zero_runs_every_step_on_spark():
    choice = choose(work(1, 10), driver_step_rows=0, spark_only=None,
                    budget=Budget(100 * GIB, "test"))
    assert choice == (False, "Spark: driver_step_rows=0 runs every step on Spark", False)


def test_an_operator_with_only_a_spark_implementation_forces_spark():
    for rows in (None, 10**9):
        choice = choose(work(1, 10), driver_step_rows=rows, spark_only="operator #2 aggregate",
                        budget=Budget(100 * GIB, "test"))
        assert choice == (False, "Spark: operator #2 aggregate has no driver implementation", False)


def test_the_budget_is_half_the_available_memory_capped_by_driver_memory(monkeypatch):
    from dbsp_pipeline.runtime import path_choice

    monkeypatch.setattr(path_choice, "_reading", None)  # (no reading of another test's)
    available = available_memory()
    assert available is not None and available > 0  # Linux: /proc/meminfo
    machine = budget(None)
    assert 0 < machine.bytes <= available and "available" in machine.source
    assert budget(12_345) == Budget(12_345, "driver_memory=12,345")
    assert "available" in budget(10**18).source  # a cap above the machine's budget: no effect


def test_the_available_memory_is_read_at_most_once_a_second(monkeypatch):
    """Steps in quick succession share a reading (five files, ~2 ms); an older one is read
    again."""
    from dbsp_pipeline.runtime import path_choice

    readings = iter([8 * GIB, 2 * GIB])
    monkeypatch.setattr(path_choice, "available_memory", lambda: next(readings))
    monkeypatch.setattr(path_choice, "_reading", None)
    assert budget(None).bytes == budget(None).bytes == 4 * GIB
    monkeypatch.setattr(path_choice, "MEMORY_READING_SECONDS", 0.0)
    assert budget(None).bytes == GIB


def test_a_background_merge_runs_on_the_driver_as_far_as_its_memory_fits(tmp_path):
    """``merge_rows_on_driver``: the rows whose estimated memory fits half the driver budget
    (``driver_memory`` caps it as it caps a step), never fewer than ``DRIVER_MERGE_ROWS``."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from dbsp_pipeline.runtime.path_choice import MERGE_OVERHEAD
    from dbsp_pipeline.spark_session import LazySession
    from dbsp_pipeline.storage.state_db import StateDatabase
    from dbsp_pipeline.storage.trace import DRIVER_MERGE_ROWS, Trace

    db = StateDatabase(LazySession(), str(tmp_path), "merge-rows")  # never starts Spark
    db.open()
    trace = Trace(db, "t", StructType([StructField("k", LongType()),
                                       StructField("v", StringType())]), ["k"])
    per_row = row_bytes_of_trace(trace) * MERGE_OVERHEAD
    # a cap well below half of what is available here: the budget is the cap, not a figure
    # of the moment
    assert budget(2 * GIB).bytes == 2 * GIB
    assert merge_rows_on_driver(trace, 2 * GIB) == int(GIB / per_row) > DRIVER_MERGE_ROWS
    assert merge_rows_on_driver(trace, 1_000) == DRIVER_MERGE_ROWS  # a tiny cap: the floor
    assert merge_rows_on_driver(trace, None) >= merge_rows_on_driver(trace, 4 * GIB)


# -- on a real plan ------------------------------------------------------------------------
def _join_circuit() -> Circuit:
    c = Circuit("orders_customers")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    customers = c.input("customers", "customer_id BIGINT, region STRING")
    c.output("joined", orders.join(customers, on="customer_id"))
    return c


def _change_files(p: Pipeline, since: dict[str, int]) -> dict[str, list]:
    logs = p.engine.inputs
    return {n: logs[n].files_between(since[n], logs[n].version()) for n in logs}


def test_the_estimate_looks_up_the_rows_of_the_changed_keys_where_spark_scans(spark, tmp_path):
    """Moving 2 of 5,000 customers (4 change rows) in a join with 50,000 orders: the estimate
    looks up about their 20 orders (rows per key from the two traces' sizes), while the Spark
    path would scan the whole orders trace."""
    with Pipeline(_join_circuit(), root=str(tmp_path), spark=spark) as p:
        ids = np.arange(50_000)
        p.push("orders", pa.table({"order_id": ids, "customer_id": ids % 5_000,
                                   "amount": np.full(50_000, 20.0)}))
        p.push("customers", [(c, "eu") for c in range(5_000)])
        assert p.step().on_driver
        since = {n: p.engine.inputs[n].version() for n in p.engine.inputs}
        p.push("customers", [(1, "eu"), (2, "eu")], weight=-1)
        p.push("customers", [(1, "us"), (2, "us")])
        w = estimate(p.engine.plan, _change_files(p, since))
        assert w.input_rows == 4
        assert 20 <= w.lookup_rows <= 80 and w.scan_rows == 50_000
        r = p.step()
        assert r.on_driver and r.outputs["joined"] == 40
        assert "4 input rows" in r.path_reason and "Spark would scan 50,000" in r.path_reason


@pytest.mark.parametrize("column,aggregate", [
    ("DECIMAL(30,10)", "sum(v)"),  # a DECIMAL(38,10) state: Spark's `+` would round it
    ("DECIMAL(15,3)", "avg(v)"),  # an average's state has its type: DECIMAL(19,7)
    ("DECIMAL(15,2)", "avg(v)"),  # DECIMAL(19,6)
    ("DECIMAL(10,6)", "sum(v)"),  # DECIMAL(20,6)
])
def test_a_decimal_sum_of_any_type_steps_on_the_driver(spark, tmp_path, column, aggregate):
    """Sums and averages of decimals have a driver path whatever their scale (DuckDB's
    decimals are exact, and so is the Spark path's arithmetic, in pyarrow where Spark's own
    would round: ``tests/operators/test_aggregate.py``)."""
    c = Circuit("decimal_sums")
    c.output("sums", c.input("t", f"k BIGINT, v {column}").group_by("k").agg(s=aggregate))
    with Pipeline(c, root=str(tmp_path), spark=spark, driver_step_rows=10**9) as p:
        p.push("t", [(1, 1), (1, 2)])
        assert p.engine.choose_path(_change_files(p, {"t": 0})).on_driver
        assert p.step().outputs["sums"] == 1


@pytest.mark.parametrize("value", [-1, 0, "auto", 1.5])
def test_driver_memory_must_be_a_positive_number_of_bytes(tmp_path, value):
    with pytest.raises(UsageError, match="driver_memory must be an integer of at least 1"):
        Pipeline(_join_circuit(), root=str(tmp_path), driver_memory=value)


# -- end to end ----------------------------------------------------------------------------
ORDERS = 200_000


def _load(p: Pipeline) -> dict[str, list]:
    """Push the load (200k orders of 1,000 customers) and return the files of its change."""
    since = {n: p.engine.inputs[n].version() for n in p.engine.inputs}
    ids = np.arange(ORDERS, dtype=np.int64)
    p.push("orders", pa.table({"order_id": ids, "customer_id": ids * 7919 % 1_000,
                               "amount": (ids * 104729 % 19997) / 100.0}))
    p.push("customers", [(c, f"region-{c % 7}") for c in range(1_000)])
    return _change_files(p, since)


def test_a_load_runs_where_its_estimate_fits_and_gives_the_same_view_on_both_paths(
        spark, tmp_path):
    """By default (auto) a 201,000-row load runs on the driver when its estimated memory fits
    the budget, and on Spark when the budget (lowered through ``driver_memory``) is one byte
    short of it; the view is the same either way."""
    views, reasons = {}, {}
    for path in ("driver", "spark"):
        with Pipeline(shop_circuit(extra_views=False), root=str(tmp_path / path),
                      spark=spark) as p:
            assert p.driver_step_rows is None  # the default: auto
            needed = estimate(p.engine.plan, _load(p)).driver_bytes
            p.driver_memory = needed if path == "driver" else needed - 1
            r = p.step()
            assert r.on_driver == (path == "driver"), r.path_reason
            assert r.inputs == {"orders": ORDERS, "customers": 1_000}
            reasons[path] = r.path_reason
            views[path] = p.view_arrow("revenue_by_region").sort_by("region").to_pylist()
    assert reasons["driver"].startswith("driver: 201,000 input rows")
    assert reasons["spark"].startswith("Spark: 201,000 input rows")
    assert "over the budget" in reasons["spark"] and "driver_memory=" in reasons["spark"]
    assert len(views["driver"]) == 7 and views["driver"] == views["spark"]


# -- Spark steps: per owner or DataFrame jobs ------------------------------------------------
def test_a_spark_step_runs_per_owner_when_a_task_share_fits_its_budget(spark, tmp_path):
    """A Spark step of a join runs its stateful operator as one task per owner by default,
    when the step's estimated driver memory over W fits a task's budget; one byte over, or with
    ``spark_per_owner`` off, it runs as DataFrame jobs. The reason says which, with W."""
    with Pipeline(_join_circuit(), root=str(tmp_path), spark=spark) as p:
        assert p.spark_per_owner  # the default
        p.rescale(2)
        ids = np.arange(2_000)
        p.push("orders", pa.table({"order_id": ids, "customer_id": ids % 100,
                                   "amount": np.full(2_000, 2.5)}))
        p.push("customers", [(c, "eu") for c in range(100)])
        files = _change_files(p, {"orders": 0, "customers": 0})
        per_task = estimate(p.engine.plan, files).driver_bytes / 2
        spark_step = choose(work(2_100, 0), driver_step_rows=0, spark_only=None,
                            budget=Budget(0, "not used"))

        def choice(limit: int, per_owner: bool = True):
            return choose_spark_execution(spark_step, p.engine.plan, files, per_owner=per_owner,
                                          workers=2, task_budget=lambda: Budget(limit, "test"))

        fits = choice(int(per_task))
        assert fits.per_owner and not fits.on_driver
        assert "; per owner (W=2): 1 stateful operator(s) as one task per owner" in fits.reason
        over = choice(int(per_task) - 1)
        assert not over.per_owner and "as DataFrame jobs" in over.reason
        assert "over the task budget of" in over.reason
        assert choice(10**12, per_owner=False) == spark_step  # the setting off: unchanged
        driver = choose(work(10, 0), driver_step_rows=None, spark_only=None,
                        budget=Budget(GIB, "test"))
        assert choose_spark_execution(driver, p.engine.plan, files, per_owner=True, workers=2,
                                      task_budget=lambda: Budget(0, "test")) == driver

        p.driver_step_rows = 0
        r = p.step()  # the real step takes the same path, with the real budget
        assert not r.on_driver and "per owner (W=2)" in r.path_reason, r.path_reason
        assert p.view_arrow("joined").num_rows == 2_000


def test_an_operator_without_keys_is_one_task_s_whole_share(spark, tmp_path):
    """A top-k over one partition (like a global aggregate) runs per owner as one task that
    takes all its change and state: the step's estimate is not divided among the W owners."""
    c = Circuit("top")
    c.output("top", c.input("orders", "order_id BIGINT, amount DOUBLE").top_k(3, ["amount"]))
    with Pipeline(c, root=str(tmp_path), spark=spark) as p:
        p.rescale(2)
        p.push("orders", pa.table({"order_id": np.arange(2_000), "amount": np.full(2_000, 2.5)}))
        files = _change_files(p, {"orders": 0})
        whole = estimate(p.engine.plan, files).driver_bytes
        spark_step = choose(work(2_000, 0), driver_step_rows=0, spark_only=None,
                            budget=Budget(0, "not used"))

        def choice(limit: int):
            return choose_spark_execution(spark_step, p.engine.plan, files, per_owner=True,
                                          workers=2, task_budget=lambda: Budget(limit, "test"))

        assert choice(int(whole)).per_owner
        assert not choice(int(whole) - 1).per_owner  # (half of it would fit two tasks)


def test_the_task_budget_in_local_mode_is_the_driver_budget_over_the_tasks_at_once(spark):
    """Local tasks share this machine: the driver's budget over min(W, cores) tasks, cores
    being the N of the session's ``local[N]``."""
    n = spark.sparkContext.master.removeprefix("local[").removesuffix("]")
    cores = os.cpu_count() if n == "*" else int(n)
    for workers in (1, 2, 8):
        b = task_budget(spark, workers, driver_memory=GIB)
        at_once = min(workers, cores)
        assert b.bytes == min(GIB, budget(None).bytes) // at_once
        assert f"over {at_once} task(s) at once" in b.source
