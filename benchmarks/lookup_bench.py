"""Lookup benchmark: steps that look up a big trace by many keys, against recomputing the view.

The shop query (filter, join with customers, group by region with sum/count/max) over ``orders``
of each size and 100k customers, loaded on the driver. Each step moves ``--moved`` customers to
another region (a delete and an insert per customer), so the join must find every order of
those customers: a lookup of the orders trace by ``--moved`` keys. In the same run the same view
is recomputed from scratch by DuckDB, in memory, over the same integrated orders and customers
(what a user would run instead). Prints one JSON line per figure and a table.

    python benchmarks/lookup_bench.py [--sizes 1000000 4000000] [--steps 5] [--moved 1000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit

CUSTOMERS = 100_000
REGIONS = 10
QUERY = """SELECT region, sum(amount) AS total, count(*) AS n, max(amount) AS top
           FROM orders JOIN customers USING (customer_id) WHERE amount > 10 GROUP BY region"""


def orders_table(size: int) -> pa.Table:
    ids = np.arange(size, dtype=np.int64)
    return pa.table({"order_id": ids, "customer_id": ids * 7919 % CUSTOMERS + 1,
                     "amount": (ids * 104729 % 20000) / 100.0})


def region(customer: int, shift: int) -> str:
    return f"region-{(customer + shift) % REGIONS}"


def run_size(size: int, steps: int, moved: int, emit: Any) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix=f"dbsp-lookup-{size}-")
    rng = np.random.default_rng(size)
    shift = {c: 0 for c in range(1, CUSTOMERS + 1)}
    try:
        with Pipeline(shop_circuit(extra_views=False), root=root,
                      driver_step_rows=10**9) as p:
            p.push("customers", [(c, region(c, 0)) for c in range(1, CUSTOMERS + 1)])
            orders = orders_table(size)
            p.push("orders", orders)
            t = time.perf_counter()
            p.step()
            emit({"size": size, "figure": "initial_load_step_seconds",
                  "value": round(time.perf_counter() - t, 3)})
            durations = []
            for _ in range(steps):
                chosen = rng.choice(np.arange(1, CUSTOMERS + 1), moved, replace=False).tolist()
                p.push("customers", [(c, region(c, shift[c])) for c in chosen], weight=-1)
                for c in chosen:
                    shift[c] += 1
                p.push("customers", [(c, region(c, shift[c])) for c in chosen])
                t = time.perf_counter()
                r = p.step()
                seconds = time.perf_counter() - t
                durations.append(seconds)
                emit({"size": size, "figure": "step_seconds", "step": r.step,
                      "value": round(seconds, 4), "on_driver": r.on_driver})
            view = sorted((r["region"], r["total"], r["n"], r["top"])
                          for r in p.view_arrow("revenue_by_region").to_pylist())
        customers = pa.table({"customer_id": np.arange(1, CUSTOMERS + 1, dtype=np.int64),
                              "region": [region(c, shift[c]) for c in range(1, CUSTOMERS + 1)]})
        con = duckdb.connect()
        con.register("orders", orders)
        con.register("customers", customers)
        times = []
        for _ in range(4):
            t = time.perf_counter()
            expected = sorted(con.execute(QUERY).fetchall())
            times.append(time.perf_counter() - t)
        step_median, duck_median = statistics.median(durations), statistics.median(times[1:])
        summary = {"size": size, "figure": "summary", "moved_customers": moved,
                   "step_median_seconds": round(step_median, 4),
                   "duckdb_recompute_seconds": round(duck_median, 4),
                   "step_over_duckdb": round(step_median / duck_median, 3),
                   "view_equals_recompute": _same(view, expected)}
        emit(summary)
        return summary
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _same(view: list[tuple[Any, ...]], expected: list[tuple[Any, ...]]) -> bool:
    """Equal groups, counts and maxima; sums equal to DuckDB's (a float sum in another order)
    within 1e-9 relative."""
    return len(view) == len(expected) and all(
        a[0] == b[0] and a[2] == b[2] and a[3] == b[3]
        and abs(float(a[1]) - b[1]) <= 1e-9 * max(1.0, abs(b[1]))
        for a, b in zip(view, expected))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--moved", type=int, default=1_000)
    args = ap.parse_args()

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    rows = [run_size(size, args.steps, args.moved, emit) for size in args.sizes]
    print()
    print(f"{'orders':>10} {'moved':>6} {'step s':>8} {'DuckDB recompute s':>19} {'ratio':>6}")
    for r in rows:
        print(f"{r['size']:>10} {r['moved_customers']:>6} {r['step_median_seconds']:>8.4f} "
              f"{r['duckdb_recompute_seconds']:>19.4f} {r['step_over_duckdb']:>6.2f}")


if __name__ == "__main__":
    main()
