"""Lookup benchmark: does a step cost what its change costs, on every access pattern?

Orders of each ``--sizes`` (default 1M, 4M, 16M) and 100k customers, loaded on the driver. Four
access patterns, each a circuit built with the public ``Circuit`` API:

(a) ``moves``: the shop query (filter, join with customers, sum/count/max per region); each step
    moves 1,000 customers to another region, so the join looks up all their orders;
(b) ``orders``: the same query; each step pushes 10k order changes (10% deletes), as
    ``engine_bench.py`` does;
(c) ``max``: max(amount) and count per customer; each step deletes the current maximum order of
    100 customers, so the aggregate must re-read those customers' orders;
(d) ``lines``: orders joined with ``lines`` (4 rows per order), sum(qty) and count per customer;
    each step pushes 10k line changes (10% deletes);
(e) ``top``: the 10 orders of the largest amounts (``ORDER BY amount DESC LIMIT 10``: a top-k
    over the whole input, one partition); each step pushes 10k order changes (10% deletes of the
    oldest) and deletes the 10 current leaders, so the top 10 is read past them;
(a) and (b) again as ``moves_eager`` and ``orders_eager``: the shop circuit declared with
    ``eager_aggregation=True`` (partial aggregates per customer, joined and merged per region:
    ``dbsp_pipeline/eager_aggregation.py``), the plan a user picks when dimensions change.

For each pattern and size: the median push+step seconds (``--steps`` steps after a warm-up step,
each a ``Pipeline.step(changes)`` that carries its change: the push is committed while the step
computes; a pattern's pipelines of every size are loaded first and step in blocks, half the steps
with the sizes in order, half in reverse order, so that a drift of the machine's speed weighs on
every size alike (``timed_steps``); the change's tables are built before the clock starts, as a user
has them in hand when they push: the workload's own work (finding each customer's maximum) is not
the engine's; the timed steps start once the keyed runs of the loaded files are written, as in a
running pipeline, and the seconds that took after the load are reported), the rows the step read
from state (``StepResult.state_rows_read``), the same view recomputed from scratch by DuckDB (in
memory, over Arrow tables of the same integrated data) and by Spark (over Parquet copies, as a batch
job reads them; one shared session), their ratios, and whether the view equals the recomputation
(counts and maxima exactly, float sums within 1e-9 relative). In the same run (each can be skipped):
each pattern again with big steps forced onto Spark (``driver_step_rows=0``, at ``--spark-workers``
W, default 2, after a rescale) against Spark's recompute: (a) moves of as many customers as have
``--spark-change`` (1M) of the live orders between them (run before (b)'s, which add 0.8M orders a
step), (b) ``--spark-change`` order changes, (c) deletes of the maximum order of every customer
(100k: the most (c) can change at once), (d) ``--spark-change`` line changes, (e)
``--spark-change`` order changes and the 10 leaders; and 100-row steps with a commit each
(steps/s). The shop workload at 1M orders with 10k changes per step is pattern (b) at
1M. Prints one JSON line per figure (also written to ``--json``, default
``docs/bench/lookup.jsonl``, which a whole run replaces), a table at the end, and writes a plot
(``--plot``, default ``docs/bench/lookup.png``); its progress (``# ...`` lines) goes to stderr.
Creating an empty file is timed at the start and the end (``file_creation_ms``): a driver step
creates about seven files, and on a machine where that cost drifts, so do the step seconds.

    python benchmarks/lookup_bench.py [--sizes 1000000 4000000 16000000] [--steps 15]
        [--patterns moves orders max lines moves_eager orders_eager top]
        [--spark-change 1000000] [--spark-steps 5]
        [--spark-workers 2] [--no-spark-steps] [--no-small-steps]
        [--no-spark-recompute]
        [--plot PATH] [--json PATH]
    python benchmarks/lookup_bench.py --from-json docs/bench/lookup.jsonl   # table + plot again
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.runtime.results import STEP_PHASES
from dbsp_pipeline.spark_session import local_session
from dbsp_pipeline.storage import keyed_runs

CUSTOMERS = 100_000
REGIONS = 10
LINES_PER_ORDER = 4
Emit = Callable[[dict[str, Any]], None]
#: a step's change: called before the clock starts, it builds the change's Z-sets, per input,
#: which the timed step carries (``Pipeline.step(changes)``: push and step in one call)
Change = Callable[[], dict[str, pa.Table]]

SHOP_QUERY = """SELECT region, sum(amount) AS total, count(*) AS n, max(amount) AS top
  FROM orders JOIN customers USING (customer_id) WHERE amount > 10 GROUP BY region"""
MAX_QUERY = "SELECT customer_id, max(amount) AS top, count(*) AS n FROM orders GROUP BY customer_id"
#: (ties in amount broken by every column ascending, as ``top_k`` breaks them)
TOP_QUERY = ("SELECT order_id, customer_id, amount FROM orders "
             "ORDER BY amount DESC, order_id, customer_id LIMIT 10")
LINES_QUERY = """SELECT customer_id, sum(qty) AS qty, count(*) AS n
  FROM orders JOIN lines USING (order_id) GROUP BY customer_id"""


# -- data --------------------------------------------------------------------------------------
def orders_of(ids: np.ndarray) -> pa.Table:
    """Orders ``ids``: order i is of customer ``i * 7919 % CUSTOMERS + 1``; its amount (0 to
    199.96) varies among a customer's orders (the modulus 19997 is prime to ``CUSTOMERS``), so
    a customer's maximum is one order of many."""
    ids = ids.astype(np.int64)
    return pa.table({"order_id": ids, "customer_id": ids * 7919 % CUSTOMERS + 1,
                     "amount": (ids * 104729 % 19997) / 100.0})


def customers_of(shift: np.ndarray, ids: np.ndarray | None = None) -> pa.Table:
    """Customers ``ids`` (default: 1..CUSTOMERS); customer c is in region
    ``(c + shift[c]) % REGIONS``."""
    c = np.arange(1, CUSTOMERS + 1, dtype=np.int64) if ids is None else ids.astype(np.int64)
    names = np.array([f"region-{r}" for r in range(REGIONS)], dtype=object)
    return pa.table({"customer_id": c, "region": pa.array(names[(c + shift[c]) % REGIONS],
                                                          pa.string())})


def lines_of(order_id: np.ndarray, line_no: np.ndarray) -> pa.Table:
    return pa.table({"order_id": order_id.astype(np.int64), "line_no": line_no.astype(np.int64),
                     "qty": (order_id * 31 + line_no * 7) % 50 + 1})


def file_creation_ms(files: int = 200) -> float:
    """The median milliseconds to create an empty file in a fresh folder where the pipelines'
    roots are (the temporary folder): a cost a driver step pays about seven times (its trace,
    view, push and manifest files and its commit files), which on some machines varies tenfold
    from minute to minute, so a run's step seconds are read beside it."""
    folder = tempfile.mkdtemp(prefix="dbsp-bench-files-")
    try:
        seconds = []
        for i in range(files):
            t = time.perf_counter()
            with open(os.path.join(folder, f"f{i}"), "wb"):
                pass
            seconds.append(time.perf_counter() - t)
        return round(1000 * statistics.median(seconds), 3)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- circuits -----------------------------------------------------------------------------------
def zset(inserts: pa.Table, deletes: pa.Table) -> pa.Table:
    """A step's inserts and deletes as a user with a mixed change pushes them: one Z-set
    (``_weight`` +1 and -1), so one durable commit, not two."""
    weights = pa.array([1] * inserts.num_rows + [-1] * deletes.num_rows, pa.int64())
    return (pa.concat_tables([inserts, deletes.select(inserts.column_names)])
            .append_column("_weight", weights))


def max_circuit() -> Circuit:
    c = Circuit("max_per_customer")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("view", orders.group_by("customer_id").agg(top="max(amount)", n="count(*)"))
    return c


def lines_circuit() -> Circuit:
    c = Circuit("order_lines")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    lines = c.input("lines", "order_id BIGINT, line_no BIGINT, qty BIGINT")
    c.output("view", orders.join(lines, on="order_id").group_by("customer_id")
             .agg(qty="sum(qty)", n="count(*)"))
    return c


def top_circuit() -> Circuit:
    c = Circuit("top_orders")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("view", orders.top_k(10, ["amount DESC"]))
    return c


# -- recomputation and comparison ---------------------------------------------------------------
class Recompute:
    """The same view from scratch: DuckDB over Arrow tables, Spark over Parquet copies."""

    def __init__(self, spark: Any, spark_runs: int) -> None:
        self.spark = spark
        self.spark_runs = spark_runs

    def duckdb(self, query: str, tables: dict[str, pa.Table]) -> tuple[float, list[tuple]]:
        con = duckdb.connect()
        for name, table in tables.items():
            con.register(name, table)
        times, result = [], []
        for _ in range(4):  # a warm-up, then the median of 3
            t = time.perf_counter()
            result = con.execute(query).fetchall()
            times.append(time.perf_counter() - t)
        con.close()
        return statistics.median(times[1:]), sorted(result)

    def spark_sql(self, query: str, tables: dict[str, pa.Table]) -> tuple[float, list[tuple]]:
        if self.spark_runs == 0:
            return float("nan"), []
        folder = tempfile.mkdtemp(prefix="dbsp-lookup-parquet-")
        try:
            for name, table in tables.items():
                pq.write_table(table, f"{folder}/{name}.parquet")
            times, result = [], []
            for _ in range(self.spark_runs + 1):  # a warm-up, then the median
                t = time.perf_counter()
                for name in tables:
                    self.spark.read.parquet(f"{folder}/{name}.parquet").createOrReplaceTempView(
                        name)
                result = [tuple(r) for r in self.spark.sql(query).collect()]
                times.append(time.perf_counter() - t)
            return statistics.median(times[1:]), sorted(result)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def same(view: list[tuple], expected: list[tuple], float_columns: set[int]) -> bool:
    """Equal rows; float columns (sums) within 1e-9 relative, the rest exactly."""
    if len(view) != len(expected):
        return False
    for a, b in zip(view, expected):
        for i, (x, y) in enumerate(zip(a, b)):
            if i in float_columns:
                if abs(float(x) - float(y)) > 1e-9 * max(1.0, abs(float(y))):
                    return False
            elif x != y:
                return False
    return True


def view_rows(p: Pipeline, name: str, columns: list[str]) -> list[tuple]:
    table = p.view_arrow(name)
    return sorted(zip(*(table.column(c).to_pylist() for c in columns)))


# -- workloads ----------------------------------------------------------------------------------
class Shop:
    """The shop query's data at ``size`` orders as the steps change it: the live orders are the
    ids ``[first, next)``; customer c is in region ``(c + shift[c]) % REGIONS``."""

    query, view = SHOP_QUERY, "revenue_by_region"
    columns = ["region", "total", "n", "top"]
    float_columns: set[int] = {1}  # (the sum, compared within 1e-9)

    def __init__(self, size: int) -> None:
        self.rng = np.random.default_rng(size)
        self.shift = np.zeros(CUSTOMERS + 1, dtype=np.int64)
        self.first, self.next = 0, size

    def tables(self) -> dict[str, pa.Table]:
        return {"customers": customers_of(self.shift),
                "orders": orders_of(np.arange(self.first, self.next))}

    def order_changes(self, n: int) -> Change:
        """(b): ``n`` order changes a step, 10% deletes of the oldest live orders."""
        def change() -> dict[str, pa.Table]:
            n_del = n // 10
            orders = zset(orders_of(np.arange(self.next, self.next + n - n_del)),
                          orders_of(np.arange(self.first, self.first + n_del)))
            self.next += n - n_del
            self.first += n_del
            return {"orders": orders}
        return change

    def mover(self, n: int) -> Change:
        """(a): ``n`` customers a step, each to the next region."""
        def change() -> dict[str, pa.Table]:
            chosen = self.rng.choice(np.arange(1, CUSTOMERS + 1), n, replace=False)
            before = customers_of(self.shift, chosen)
            self.shift[chosen] += 1
            return {"customers": zset(customers_of(self.shift, chosen), before)}
        return change

    def live_orders(self) -> int:
        return self.next - self.first


class MaxDeletes:
    """(c)'s data at ``size`` orders: each step deletes the current maximum order of some
    customers (``alive``: the orders not deleted yet)."""

    query, view, columns = MAX_QUERY, "view", ["customer_id", "top", "n"]
    float_columns: set[int] = set()

    def __init__(self, size: int) -> None:
        self.rng = np.random.default_rng(size + 1)
        self.orders = orders_of(np.arange(size))
        self.amount = self.orders.column("amount").to_numpy()
        customer = self.orders.column("customer_id").to_numpy()
        self.by_customer = np.argsort(customer, kind="stable")  # order ids grouped by customer
        self.starts = np.searchsorted(customer[self.by_customer], np.arange(1, CUSTOMERS + 2))
        self.alive = np.ones(size, dtype=bool)

    def tables(self) -> dict[str, pa.Table]:
        return {"orders": self.orders if self.alive.all()
                else self.orders.filter(pa.array(self.alive))}

    def delete_maxima(self, n: int) -> Change:
        def change() -> dict[str, pa.Table]:
            gone = []
            for c in self.rng.choice(np.arange(1, CUSTOMERS + 1), n, replace=False):
                ids = self.by_customer[self.starts[c - 1]:self.starts[c]]
                ids = ids[self.alive[ids]]
                if len(ids):
                    gone.append(ids[np.argmax(self.amount[ids])])
            self.alive[gone] = False
            deletes = orders_of(np.array(gone))
            return {"orders": zset(deletes.schema.empty_table(), deletes)}
        return change


class Lines:
    """(d)'s data at ``size`` orders: 4 lines an order loaded (``first``); each step deletes
    the oldest of those and adds lines of random orders (``added``)."""

    query, view, columns = LINES_QUERY, "view", ["customer_id", "qty", "n"]
    float_columns: set[int] = set()

    def __init__(self, size: int) -> None:
        self.size = size
        self.orders = orders_of(np.arange(size))
        self.first = lines_of(np.repeat(np.arange(size), LINES_PER_ORDER),
                              np.tile(np.arange(LINES_PER_ORDER), size))
        self.deleted = self.added = 0

    def _added(self, lo: int, hi: int) -> pa.Table:
        g = np.arange(lo, hi, dtype=np.int64)
        return lines_of(g * 2654435761 % self.size, LINES_PER_ORDER + g)

    def tables(self) -> dict[str, pa.Table]:
        return {"orders": self.orders, "lines": pa.concat_tables(
            [self.first.slice(self.deleted), self._added(0, self.added)])}

    def changes(self, n: int) -> Change:
        def change() -> dict[str, pa.Table]:
            n_del = n // 10
            lines = zset(self._added(self.added, self.added + n - n_del),
                         self.first.slice(self.deleted, n_del))
            self.deleted += n_del
            self.added += n - n_del
            return {"lines": lines}
        return change


class TopDeletes:
    """(e)'s data at ``size`` orders: the orders ``alive`` among ids ``[0, next)``; each step
    deletes the oldest live ones and the current leaders, and adds new ones."""

    query, view, columns = TOP_QUERY, "view", ["order_id", "customer_id", "amount"]
    float_columns: set[int] = set()

    def __init__(self, size: int) -> None:
        self.alive = np.ones(size, dtype=bool)
        self.first = 0  # every id below is dead

    def tables(self) -> dict[str, pa.Table]:
        return {"orders": orders_of(np.flatnonzero(self.alive))}

    def leaders(self, n: int) -> np.ndarray:
        """The ``n`` live orders of the largest amounts, ties by the smallest id."""
        ids = np.arange(len(self.alive), dtype=np.int64)
        # amount = code / 100: the largest code first, then the smallest id
        key = np.where(self.alive, (ids * 104729 % 19997) * (1 << 40) - ids, np.iinfo(np.int64).min)
        top = np.argpartition(key, len(key) - n)[len(key) - n:]
        return top[self.alive[top]]

    def changes(self, n: int, leaders: int = 10) -> Change:
        def change() -> dict[str, pa.Table]:
            n_del = n // 10
            live = np.flatnonzero(self.alive[self.first:self.first + 2 * n_del]) + self.first
            oldest = live[:n_del]
            self.alive[oldest] = False
            self.first = int(oldest[-1]) + 1 if len(oldest) else self.first
            gone = self.leaders(leaders)
            self.alive[gone] = False
            new = np.arange(len(self.alive), len(self.alive) + n - n_del)
            self.alive = np.concatenate([self.alive, np.ones(len(new), dtype=bool)])
            return {"orders": zset(orders_of(new), orders_of(np.concatenate([oldest, gone])))}
        return change


Workload = Shop | MaxDeletes | Lines | TopDeletes


def check(p: Pipeline, w: Workload, record: dict[str, Any], medians: dict[str, Any],
          rc: Recompute, emit: Emit, duckdb_too: bool = True) -> dict[str, Any]:
    """``p``'s view against the same query recomputed over ``w``'s data now, and the summary."""
    tables = w.tables()
    view = view_rows(p, w.view, w.columns)
    duck = rc.duckdb(w.query, tables) if duckdb_too else (float("nan"), [])
    return summarize(record, medians, duck, rc.spark_sql(w.query, tables), view,
                     w.float_columns, emit)


# -- running steps ------------------------------------------------------------------------------
#: a pipeline, the change its timed steps carry, and the record their figures go under
Run = tuple[Pipeline, Change, dict[str, Any]]


def timed_steps(runs: list[Run], steps: int, emit: Emit) -> list[dict[str, Any]]:
    """``steps`` steps of each run after a warm-up step, each ``p.step(changes)`` timed (the
    change built before; the step pushes it and executes, one call); each run's medians.

    Several runs (a pattern's sizes) step in blocks, half their steps in order, half in reverse
    order (1M, 4M, 16M, 16M, 4M, 1M), each block after the background work of every run is done
    (merges, keyed runs) and a warm-up step of its own: within a block a run steps as a lone
    pipeline does, its own merges behind its own steps, and a drift of the machine's speed that
    is steady over the blocks weighs on every size alike (one size after another, the 16M
    steps came minutes after the 1M ones, and this machine's speed drifts by a third in that
    time: README.md). Steps taken in turn, one at each size, would let one size's background
    merges run beside another's steps."""
    seconds: list[list[float]] = [[] for _ in runs]
    rows_read: list[list[int]] = [[] for _ in runs]
    phases: list[list[dict[str, float]]] = [[] for _ in runs]
    operators: list[list[dict[str, float]]] = [[] for _ in runs]
    order = list(range(len(runs)))
    blocks = ([(j, steps) for j in order] if len(runs) == 1 else
              [(j, steps // 2) for j in order] + [(j, steps - steps // 2) for j in order[::-1]])
    for j, count in blocks:
        p, change, record = runs[j]
        if len(runs) > 1:
            settle([other for other, _, _ in runs])
        for i in range(count + 1):
            changes = change()
            t = time.perf_counter()
            r = p.step(changes)
            s = time.perf_counter() - t
            emit({**record, "figure": "step_seconds", "step": r.step, "warm_up": i == 0,
                  "value": round(s, 4), "on_driver": r.on_driver,
                  "state_rows_read": r.state_rows_read,
                  "phase_ms": {k: round(v * 1000, 2) for k, v in r.phase_seconds.items()},
                  "operator_ms": {k: round(v * 1000, 2) for k, v in r.operator_seconds.items()}})
            if i:
                seconds[j].append(s)
                rows_read[j].append(r.state_rows_read)
                phases[j].append(r.phase_seconds)
                operators[j].append(r.operator_seconds)
    return [{"step": statistics.median(s), "rows_read": statistics.median(n),
             "phases": _medians(phase_steps, [phase for phase in STEP_PHASES
                                              if any(phase in step for step in phase_steps)]),
             "operators": _medians(operator_steps,
                                   sorted({name for step in operator_steps for name in step}))}
            for s, n, phase_steps, operator_steps in zip(seconds, rows_read, phases, operators)]


def _medians(steps: list[dict[str, float]], names: list[str]) -> dict[str, float]:
    """Per name, the median over ``steps`` of its seconds (0 in a step without it)."""
    return {name: statistics.median(step.get(name, 0.0) for step in steps) for name in names}


def settle(pipelines: list[Pipeline]) -> None:
    """Wait until the background work of ``pipelines`` is done (their merges, the keyed runs
    of their files), so that the steps timed next are not timed beside it."""
    for p in pipelines:
        p.engine.compactor.wait()
    keyed_runs.wait_for_writes()


def load(p: Pipeline, tables: dict[str, pa.Table], emit: Emit, record: dict[str, Any]) -> None:
    """Push and step the initial data; then wait until the keyed runs of the loaded trace files
    are written (in the background, ``storage/keyed_runs.py``), so the timed steps measure a
    running pipeline, and report that wait: until then a lookup reads the data file instead."""
    t = time.perf_counter()
    for name, table in tables.items():
        p.push(name, table)
    r = p.step()
    loaded = time.perf_counter()
    emit({**record, "figure": "initial_load_seconds", "value": round(loaded - t, 3),
          "on_driver": r.on_driver})
    keyed_runs.wait_for_writes()
    emit({**record, "figure": "keyed_runs_written_seconds_after_load",
          "value": round(time.perf_counter() - loaded, 3)})


def loaded(stack: contextlib.ExitStack[bool | None], spark: Any, sizes: list[int], name: str,
           circuit: Callable[[], Circuit], workload: Callable[[int], Workload], emit: Emit
           ) -> list[tuple[int, Workload, Pipeline]]:
    """A pipeline of ``circuit()`` per size, each in a new root (removed when ``stack``
    closes), loaded with its workload's data, all open at once."""
    opened = []
    for size in sizes:
        w = workload(size)
        root = tempfile.mkdtemp(prefix=f"dbsp-lookup-{name}-{size}-")
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        p = stack.enter_context(Pipeline(circuit(), root=root, spark=spark,
                                         driver_step_rows=10**9))
        load(p, w.tables(), emit, {"pattern": name, "size": size})
        opened.append((size, w, p))
    return opened


def driver_steps(opened: list[tuple[int, Workload, Pipeline]], pattern: str, change: int,
                 make: Callable[[Any], Change], args: argparse.Namespace, rc: Recompute,
                 emit: Emit) -> list[dict[str, Any]]:
    """Pattern ``pattern``'s driver steps at every size, in blocks (``timed_steps``), each of
    ``make(workload)``'s change; then each size's view checked and summarized."""
    records = [{"pattern": pattern, "size": size, "change": change} for size, _, _ in opened]
    medians = timed_steps([(p, make(w), record) for (_, w, p), record in zip(opened, records)],
                          args.steps, emit)
    return [check(p, w, record, m, rc, emit)
            for (_, w, p), record, m in zip(opened, records, medians)]


def spark_steps(p: Pipeline, w: Workload, record: dict[str, Any], change: Change,
                args: argparse.Namespace, rc: Recompute, emit: Emit) -> dict[str, Any]:
    """``--spark-steps`` steps of ``change`` forced onto Spark at ``--spark-workers`` W, checked
    against Spark's recompute."""
    if args.spark_workers != p.layout.workers:
        t = time.perf_counter()
        p.rescale(args.spark_workers)
        emit({**record, "figure": "rescale_seconds", "value": round(time.perf_counter() - t, 3)})
    p.driver_step_rows = 0
    (medians,) = timed_steps([(p, change, record)], args.spark_steps, emit)
    return check(p, w, record, medians, rc, emit, duckdb_too=False)


def summarize(record: dict[str, Any], medians: dict[str, Any], duck: tuple[float, list],
              spark: tuple[float, list], view: list[tuple], float_columns: set[int],
              emit: Emit) -> dict[str, Any]:
    step = medians["step"]
    summary = {**record, "figure": "summary", "step_median_seconds": round(step, 4),
               "state_rows_read_per_step": int(medians["rows_read"]),
               # each phase's median over the steps (``StepResult.phase_seconds``): they need
               # not sum to the step's median
               "phase_median_ms": {k: round(v * 1000, 2)
                                   for k, v in medians.get("phases", {}).items()},
               "operator_median_ms": {k: round(v * 1000, 2)
                                      for k, v in medians.get("operators", {}).items()},
               "duckdb_recompute_seconds": round(duck[0], 4) if duck[1] else None,
               "spark_recompute_seconds": round(spark[0], 4) if spark[1] else None,
               "step_over_duckdb": round(step / duck[0], 3) if duck[1] else None,
               "step_over_spark": round(step / spark[0], 3) if spark[1] else None,
               "view_equals_duckdb": same(view, duck[1], float_columns) if duck[1] else None,
               "view_equals_spark": same(view, spark[1], float_columns) if spark[1] else None}
    emit(summary)
    return summary


def run_shop(spark: Any, sizes: list[int], args: argparse.Namespace, rc: Recompute,
             emit: Emit, eager: bool = False) -> list[dict[str, Any]]:
    """Patterns (a) and (b) on a loaded shop pipeline per size, their driver steps in blocks
    across the sizes; (at the first size, as declared) 100-row steps; then (with
    ``--spark-steps``) at each size steps of ``--spark-change`` orders forced onto Spark.
    ``eager``: the circuit planned with eager aggregation (``Circuit(...,
    eager_aggregation=True)``); its patterns are named ``moves_eager`` and ``orders_eager``."""
    moves, orders = ("moves_eager", "orders_eager") if eager else ("moves", "orders")

    def circuit() -> Circuit:
        c = shop_circuit(extra_views=False)
        c.eager_aggregation = eager
        return c

    out = []
    with contextlib.ExitStack() as stack:
        opened = loaded(stack, spark, sizes, "shop", circuit, Shop, emit)
        if moves in args.patterns:
            print(f"# (a) moves, in blocks at {', '.join(f'{s:,}' for s in sizes)} orders",
                  file=sys.stderr, flush=True)
            out += driver_steps(opened, moves, args.moved,
                                lambda w: cast(Shop, w).mover(args.moved), args, rc, emit)
        if orders in args.patterns:
            print(f"# (b) order changes, in blocks at {', '.join(f'{s:,}' for s in sizes)} orders",
                  file=sys.stderr, flush=True)
            out += driver_steps(opened, orders, args.change,
                                lambda w: cast(Shop, w).order_changes(args.change), args, rc,
                                emit)
        if args.small_steps and not eager:
            size, w, p = opened[0]
            settle([p for _, _, p in opened])
            print(f"# 100-row steps, a commit each, at {size:,} orders", file=sys.stderr,
                  flush=True)
            p.checkpoint_every = 1
            change = cast(Shop, w).order_changes(100)
            t = time.perf_counter()
            for _ in range(args.small_steps):
                r = p.step(change())
                assert r.committed_version is not None
            seconds = time.perf_counter() - t
            emit({"pattern": "small_steps", "size": size, "figure": "steps_per_second",
                  "rows_per_step": 100, "steps": args.small_steps,
                  "value": round(args.small_steps / seconds, 2)})
            out.append({"pattern": "small_steps", "size": size,
                        "steps_per_second": round(args.small_steps / seconds, 2)})
        for size, w, p in opened if args.spark_steps else []:
            settle([p for _, _, p in opened])
            shop = cast(Shop, w)
            if moves in args.patterns:
                # (before (b)'s big steps, which add 0.8M orders each): as many customers as
                # have --spark-change orders between them
                moved = min(CUSTOMERS, -(-args.spark_change * CUSTOMERS // shop.live_orders()))
                changed = moved * shop.live_orders() // CUSTOMERS
                record = {"pattern": f"{moves}_on_spark", "size": size, "change": changed,
                          "customers_moved": moved, "workers": args.spark_workers}
                print(f"# (a) moves of {moved:,} customers ({changed:,} orders) forced onto "
                      f"Spark at {size:,} orders, W={args.spark_workers}", file=sys.stderr,
                      flush=True)
                out.append(spark_steps(p, w, record, shop.mover(moved), args, rc, emit))
            if orders in args.patterns:
                record = {"pattern": f"{orders}_on_spark", "size": size,
                          "change": args.spark_change, "workers": args.spark_workers}
                print(f"# (b) {args.spark_change:,} order changes forced onto Spark at "
                      f"{size:,} orders, W={args.spark_workers}", file=sys.stderr,
                      flush=True)
                out.append(spark_steps(p, w, record, shop.order_changes(args.spark_change),
                                       args, rc, emit))
    return out


@dataclass(frozen=True)
class Pattern:
    """A pattern of a circuit of its own: its name, what the printed lines call its steps, its
    circuit and workload, and the rows and change (of a workload) of its driver steps and of
    its steps forced onto Spark."""

    name: str
    title: str
    spark_title: str
    circuit: Callable[[], Circuit]
    workload: Callable[[int], Workload]
    rows: int
    change: Callable[[Any], Change]
    spark_rows: int
    spark_change: Callable[[Any], Change]


def max_pattern(args: argparse.Namespace) -> Pattern:
    """(c): each step deletes the current maximum order of ``--max-customers``; on Spark, of
    every customer (100k deletes, each group's maximum re-read: the most (c) can change at
    once)."""
    return Pattern("max", "(c) max deletes",
                   f"(c) max deletes of all {CUSTOMERS:,} customers", max_circuit, MaxDeletes,
                   args.max_customers,
                   lambda w: cast(MaxDeletes, w).delete_maxima(args.max_customers),
                   CUSTOMERS, lambda w: cast(MaxDeletes, w).delete_maxima(CUSTOMERS))


def lines_pattern(args: argparse.Namespace) -> Pattern:
    """(d): orders joined with 4 lines per order; each step changes ``--change`` lines (10%
    deletes of the first lines loaded, the rest new lines of random orders); on Spark,
    ``--spark-change``."""
    return Pattern("lines", "(d) line changes", f"(d) {args.spark_change:,} line changes",
                   lines_circuit, Lines, args.change,
                   lambda w: cast(Lines, w).changes(args.change), args.spark_change,
                   lambda w: cast(Lines, w).changes(args.spark_change))


def top_pattern(args: argparse.Namespace) -> Pattern:
    """(e): the top 10 orders by amount; each step changes ``--change`` orders and deletes the
    10 leaders; on Spark, ``--spark-change`` orders and the leaders (the top-k runs as one
    task: one partition, one owner)."""
    return Pattern("top", "(e) top 10 under order changes and deletes of the leaders",
                   f"(e) top 10 under {args.spark_change:,} order changes", top_circuit,
                   TopDeletes, args.change, lambda w: cast(TopDeletes, w).changes(args.change),
                   args.spark_change, lambda w: cast(TopDeletes, w).changes(args.spark_change))


def run_pattern(spark: Any, sizes: list[int], pattern: Pattern, args: argparse.Namespace,
                rc: Recompute, emit: Emit) -> list[dict[str, Any]]:
    """``pattern``'s driver steps in blocks across the sizes; then (with ``--spark-steps``) at
    each size its steps forced onto Spark."""
    out = []
    with contextlib.ExitStack() as stack:
        opened = loaded(stack, spark, sizes, pattern.name, pattern.circuit, pattern.workload,
                        emit)
        print(f"# {pattern.title}, in blocks at {', '.join(f'{s:,}' for s in sizes)} orders",
              file=sys.stderr, flush=True)
        out += driver_steps(opened, pattern.name, pattern.rows, pattern.change, args, rc, emit)
        for size, w, p in opened if args.spark_steps else []:
            settle([p for _, _, p in opened])
            record = {"pattern": f"{pattern.name}_on_spark", "size": size,
                      "change": pattern.spark_rows, "workers": args.spark_workers}
            print(f"# {pattern.spark_title} forced onto Spark at {size:,} orders, "
                  f"W={args.spark_workers}", file=sys.stderr, flush=True)
            out.append(spark_steps(p, w, record, pattern.spark_change(w), args, rc, emit))
    return out


# -- report ---------------------------------------------------------------------------------------
#: the letter of each pattern in issue 14 and README.md, before its name in the tables
LETTERS = {"moves": "a", "orders": "b", "max": "c", "lines": "d", "top": "e"}


def label(pattern: str) -> str:
    """A pattern's name in the tables: its letter first (``(b) orders_eager_on_spark``)."""
    base = pattern.removesuffix("_on_spark").removesuffix("_eager")
    return f"({LETTERS[base]}) {pattern}" if base in LETTERS else pattern


def table(rows: list[dict[str, Any]]) -> None:
    print()
    print(f"{'pattern':>26} {'orders':>10} {'change':>8} {'step s':>8} {'rows read':>10} "
          f"{'DuckDB s':>9} {'Spark s':>8} {'/DuckDB':>8} {'/Spark':>7} equal")
    for r in rows:
        if r["pattern"] == "small_steps":
            print(f"{'small_steps':>26} {r['size']:>10} {100:>8} "
                  f"{r['steps_per_second']:>8.2f} steps/s (100-row steps, a commit each)")
            continue
        equal = r["view_equals_spark"] if r["view_equals_duckdb"] is None else (
            r["view_equals_duckdb"] and r["view_equals_spark"] is not False)
        print(f"{label(r['pattern']):>26} {r['size']:>10} {r['change']:>8} "
              f"{r['step_median_seconds']:>8.3f} {r['state_rows_read_per_step']:>10} "
              f"{_ratio(r['duckdb_recompute_seconds']):>9} "
              f"{_ratio(r['spark_recompute_seconds']):>8} "
              f"{_ratio(r['step_over_duckdb']):>8} {_ratio(r['step_over_spark']):>7} {equal}")
    timed = [r for r in rows if r.get("phase_median_ms")]
    if timed:  # where a step's time goes: each phase's median (StepResult.phase_seconds)
        print()
        print(f"{'step phases (ms)':>26} {'orders':>10} "
              + " ".join(f"{phase:>9}" for phase in STEP_PHASES))
        for r in timed:
            print(f"{label(r['pattern']):>26} {r['size']:>10} " + " ".join(
                f"{r['phase_median_ms'].get(phase, 0.0):>9.2f}" for phase in STEP_PHASES))
            spent = sorted(r.get("operator_median_ms", {}).items(), key=lambda kv: -kv[1])
            if spent:  # the operators phase by operator, the three that took longest
                print(f"{'':>37} operators: " + ", ".join(f"{k} {v:.2f}" for k, v in spent[:3]))
    print()


def growths(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pattern run at two sizes or more: its step at the biggest over its step at the
    smallest (``step_growth``)."""
    out = []
    for pattern in sorted({r["pattern"] for r in rows} - {"small_steps"}):
        mine = sorted((r for r in rows if r["pattern"] == pattern), key=lambda r: r["size"])
        if len(mine) >= 2:
            growth = mine[-1]["step_median_seconds"] / mine[0]["step_median_seconds"]
            out.append({"pattern": pattern, "figure": "step_growth", "from": mine[0]["size"],
                        "to": mine[-1]["size"], "value": round(growth, 3)})
    return out


def _ratio(value: float | None) -> str:
    return "-" if _missing(value) else f"{value:.3f}"


def _missing(value: float | None) -> bool:
    return value is None or value != value  # None, or NaN (not measured)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    patterns = [p for p in ("moves", "moves_eager", "orders", "orders_eager", "max", "lines",
                            "top", "moves_on_spark", "moves_eager_on_spark", "orders_on_spark",
                            "orders_eager_on_spark", "max_on_spark", "lines_on_spark",
                            "top_on_spark")
                if any(r["pattern"] == p for r in rows)]
    titles = {"moves": "(a) move {:,} customers", "orders": "(b) {:,} order changes",
              "max": "(c) delete the max of {:,} customers", "lines": "(d) {:,} line changes",
              "top": "(e) top 10: {:,} order changes", "top_on_spark":
              "(e) on Spark: top 10, {:,} order changes",
              "moves_on_spark": "(a) on Spark: moves changing {:,} orders",
              "orders_on_spark": "(b) on Spark: {:,} order changes",
              "max_on_spark": "(c) on Spark: delete the max of {:,} customers",
              "lines_on_spark": "(d) on Spark: {:,} line changes",
              "moves_eager": "(a) eager aggregation: move {:,} customers",
              "orders_eager": "(b) eager aggregation: {:,} order changes",
              "moves_eager_on_spark": "(a) eager, on Spark: moves changing {:,} orders",
              "orders_eager_on_spark": "(b) eager, on Spark: {:,} order changes"}
    columns = min(4, len(patterns))
    grid = (len(patterns) + columns - 1) // columns
    fig, axes = plt.subplots(grid, columns, figsize=(4.4 * columns, 3.6 * grid), squeeze=False)
    for ax in axes.flat[len(patterns):]:
        ax.set_visible(False)
    for ax, pattern in zip(axes.flat, patterns):
        mine = sorted((r for r in rows if r["pattern"] == pattern), key=lambda r: r["size"])
        sizes = [r["size"] for r in mine]
        ax.plot(sizes, [r["step_median_seconds"] for r in mine], "o-C0", label="step (push+step)")
        for column, style, label in (("duckdb_recompute_seconds", "s--C1", "DuckDB recompute"),
                                     ("spark_recompute_seconds", "^:C2", "Spark recompute")):
            measured = [r for r in mine if not _missing(r[column])]
            if measured:
                ax.plot([r["size"] for r in measured], [r[column] for r in measured], style,
                        label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_title(titles[pattern].format(mine[0]["change"]), fontsize=9)
        ax.set_xlabel("orders")
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def _summaries(path: str) -> list[dict[str, Any]]:
    """The summary rows of an earlier run's output (its JSON lines)."""
    rows = []
    with open(path) as fh:
        for line in fh:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("figure") == "summary":
                rows.append(r)
            elif r.get("figure") == "steps_per_second":
                rows.append({"pattern": "small_steps", "size": r["size"],
                             "steps_per_second": r["value"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    every = ["moves", "orders", "max", "lines", "moves_eager", "orders_eager", "top"]
    ap.add_argument("--patterns", nargs="+", default=every, choices=every)
    ap.add_argument("--steps", type=int, default=30,
                    help="timed driver steps after a warm-up step")
    ap.add_argument("--moved", type=int, default=1_000, help="(a): customers moved per step")
    ap.add_argument("--change", type=int, default=10_000, help="(b), (d): rows per step")
    ap.add_argument("--max-customers", type=int, default=100,
                    help="(c): customers whose maximum order is deleted per step")
    ap.add_argument("--spark-change", type=int, default=1_000_000,
                    help="changed orders per step forced onto Spark")
    ap.add_argument("--spark-steps", type=int, default=5,
                    help="timed Spark steps after a warm-up (0: none)")
    ap.add_argument("--no-spark-steps", dest="spark_steps", action="store_const", const=0)
    ap.add_argument("--spark-workers", type=int, default=2,
                    help="W of the Spark steps (the pipeline is rescaled to it before them): "
                         "each stateful operator runs as one task per owner")
    ap.add_argument("--small-steps", type=int, default=200,
                    help="100-row steps with a commit each, at the first size (0: none)")
    ap.add_argument("--no-small-steps", dest="small_steps", action="store_const", const=0)
    ap.add_argument("--spark-recompute-runs", type=int, default=2,
                    help="timed Spark recomputations after a warm-up (0: none)")
    ap.add_argument("--no-spark-recompute", dest="spark_recompute_runs", action="store_const",
                    const=0)
    ap.add_argument("--plot", default="docs/bench/lookup.png")
    ap.add_argument("--json", default="docs/bench/lookup.jsonl", metavar="PATH",
                    help="also write the JSON lines to PATH ('' for none)")
    ap.add_argument("--from-json", metavar="FILE",
                    help="print the table and plot from the JSON lines of an earlier run "
                         "(its output) instead of running")
    args = ap.parse_args()
    if args.from_json:
        rows = _summaries(args.from_json)
        table(rows)
        for record in growths(rows):
            print(json.dumps(record))
        if args.plot:
            plot(rows, args.plot)
        return
    spark = local_session("dbsp-lookup-bench", shuffle_partitions=4)
    rc = Recompute(spark, args.spark_recompute_runs)
    started = time.perf_counter()

    # the JSON lines go to a file beside ``--json`` that replaces it when the run ends: a run
    # that stops part-way leaves the last whole run's lines where they were
    partial = f"{args.json}.partial" if args.json else None
    lines = open(partial, "w") if partial else None  # noqa: SIM115 (open for the run)

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        if lines is not None:
            lines.write(line + "\n")
            lines.flush()

    creation = {"start": file_creation_ms()}
    emit({"figure": "file_creation_ms", "when": "start", "value": creation["start"]})
    rows: list[dict[str, Any]] = []
    sizes = sorted(args.sizes)
    for patterns, run in (({"moves", "orders"}, lambda: run_shop(spark, sizes, args, rc, emit)),
                          ({"moves_eager", "orders_eager"},
                           lambda: run_shop(spark, sizes, args, rc, emit, eager=True)),
                          ({"max"}, lambda: run_pattern(spark, sizes, max_pattern(args), args,
                                                        rc, emit)),
                          ({"lines"}, lambda: run_pattern(spark, sizes, lines_pattern(args),
                                                          args, rc, emit)),
                          ({"top"}, lambda: run_pattern(spark, sizes, top_pattern(args), args,
                                                        rc, emit))):
        if patterns & set(args.patterns):
            rows += run()
            print(f"# {', '.join(sorted(patterns & set(args.patterns)))} done, "
                  f"{time.perf_counter() - started:.0f} s so far", file=sys.stderr,
                  flush=True)
    creation["end"] = file_creation_ms()
    emit({"figure": "file_creation_ms", "when": "end", "value": creation["end"]})
    for record in growths(rows):
        emit(record)
    if lines is not None:  # every figure is in: the run's lines stand
        lines.close()
        os.replace(lines.name, args.json)
    table(rows)
    print(f"\ncreating an empty file here took {creation['start']:.3f} ms at the start and "
          f"{creation['end']:.3f} ms at the end (a driver step creates about seven files)")
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
