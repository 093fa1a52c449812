"""Upgrade benchmark: change one view of five in a running pipeline, against rebuilding it.

A pipeline of five views over ``--orders`` orders (default 4M) and 100k customers (revenue and
orders per region through a join, three aggregates per customer, one of them over a filter) is
loaded in one step. Then the filter of one view changes (``amount > 90`` to ``amount > 95``),
and the same change is made three ways, each timed:

* ``upgrade``: ``Pipeline(new_circuit, root, upgrade=True)`` on the loaded root: the four
  unchanged views keep their state, the changed one is computed from the input logs, and its
  change is written (``runtime/circuit_upgrade.py``);
* ``rebuild``: a new root with the new circuit, fed the inputs integrated (one push each, read
  from the old root's logs) and stepped once: what a user does without upgrades;
* ``duckdb``: the five views recomputed from scratch by DuckDB over the same data in memory
  (no durability), the floor of any recomputation.

Prints one JSON line per way and a table.

    python benchmarks/upgrade_bench.py [--orders 4000000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa

from dbsp_pipeline import Circuit, Pipeline

CUSTOMERS = 100_000


def circuit(threshold: int) -> Circuit:
    """Five views; ``big_per_customer`` filters ``amount > threshold``."""
    c = Circuit("sales")
    cu = c.input("customers", "customer_id BIGINT, region STRING")
    o = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("per_region", o.join(cu, on="customer_id").group_by("region").agg(
        revenue="sum(amount)", orders="count(*)"))
    c.output("per_customer", o.group_by("customer_id").agg(n="count(*)", total="sum(amount)"))
    c.output("big_per_customer", o.filter(f"amount > {threshold}").group_by("customer_id").agg(
        n="count(*)"))
    c.output("max_per_customer", o.group_by("customer_id").agg(top="max(amount)"))
    c.output("mid_per_region", o.filter("amount > 50").join(cu, on="customer_id")
             .group_by("region").agg(n="count(*)"))
    return c


DUCKDB_VIEWS = {
    "per_region": "SELECT region, sum(amount), count(*) FROM orders JOIN customers "
                  "USING (customer_id) GROUP BY region",
    "per_customer": "SELECT customer_id, count(*), sum(amount) FROM orders GROUP BY 1",
    "big_per_customer": "SELECT customer_id, count(*) FROM orders WHERE amount > 95 GROUP BY 1",
    "max_per_customer": "SELECT customer_id, max(amount) FROM orders GROUP BY 1",
    "mid_per_region": "SELECT region, count(*) FROM orders JOIN customers USING (customer_id) "
                      "WHERE amount > 50 GROUP BY region",
}


def data(n: int) -> tuple[pa.Table, pa.Table]:
    ids = np.arange(1, n + 1, dtype=np.int64)
    orders = pa.table({"order_id": ids, "customer_id": ids * 7919 % CUSTOMERS + 1,
                       "amount": (ids * 104729 % 19997) / 200.0})
    c = np.arange(1, CUSTOMERS + 1, dtype=np.int64)
    customers = pa.table({"customer_id": c,
                          "region": pa.array([f"region-{i % 10}" for i in c])})
    return orders, customers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=4_000_000)
    args = parser.parse_args()
    orders, customers = data(args.orders)
    rows = []
    work = tempfile.mkdtemp(prefix="dbsp-upgrade-bench-")
    try:
        root = f"{work}/upgraded"
        with Pipeline(circuit(90), root) as p:
            p.push("customers", customers)
            p.push("orders", orders)
            started = time.monotonic()
            p.step()
            load = time.monotonic() - started
            inputs = {n: p.input_view_arrow(n) for n in ("customers", "orders")}

        started = time.monotonic()
        with Pipeline(circuit(95), root, upgrade=True) as p:
            change = p.circuit_change
            assert change is not None
            upgrade = time.monotonic() - started
            upgraded = {v: p.view_arrow(v).num_rows for v in p.circuit.outputs}
        rows.append({"way": "upgrade", "seconds": round(upgrade, 3),
                     "views_changed": change.views_changed, "kept": len(change.kept),
                     "backfilled": change.backfilled, "on_driver": change.on_driver,
                     "changed_rows": change.outputs["big_per_customer"]})

        started = time.monotonic()
        with Pipeline(circuit(95), f"{work}/rebuilt") as p:
            for name, table in inputs.items():
                p.push_zset(name, table)
            r = p.step()
            rebuild = time.monotonic() - started
            rebuilt = {v: p.view_arrow(v).num_rows for v in p.circuit.outputs}
        assert rebuilt == upgraded, (rebuilt, upgraded)
        rows.append({"way": "rebuild", "seconds": round(rebuild, 3), "views_changed": None,
                     "kept": 0, "backfilled": None, "on_driver": r.on_driver,
                     "changed_rows": None})

        con = duckdb.connect()
        con.register("orders", orders)
        con.register("customers", customers)
        started = time.monotonic()
        for query in DUCKDB_VIEWS.values():
            con.sql(query).to_arrow_table()
        rows.append({"way": "duckdb", "seconds": round(time.monotonic() - started, 3),
                     "views_changed": None, "kept": 0, "backfilled": None, "on_driver": True,
                     "changed_rows": None})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        print(json.dumps({"orders": args.orders, "customers": CUSTOMERS,
                          "load_seconds": round(load, 3), **row}))
    print(f"\none view of five changes, {args.orders:,} orders, {CUSTOMERS:,} customers "
          f"(loaded in {load:.2f} s)")
    print(f"{'way':<10}{'seconds':>10}")
    for row in rows:
        print(f"{row['way']:<10}{row['seconds']:>10.2f}")


if __name__ == "__main__":
    main()
