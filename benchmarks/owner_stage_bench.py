"""Owner-stage benchmark: a Spark step as DataFrame jobs against the same step as one task per
owner (``Pipeline.spark_per_owner``), at W workers.

``--orders`` orders and ``--orders // 10`` customers are loaded on the driver; then each of
``--steps`` steps pushes ``--change`` changed orders (10% deletes) and runs on Spark
(``driver_step_rows=0``): once with every operator as DataFrame jobs, once with the join, the
aggregate and the distinct as owner stages. Prints one JSON line per mode (median step seconds,
rows read from state) and whether both modes' views are equal.

    python benchmarks/owner_stage_bench.py [--orders 200000] [--change 100000] [--steps 2]
        [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter

import numpy as np
import pyarrow as pa

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.spark_session import local_session


def circuit() -> Circuit:
    c = Circuit("owner_bench")
    o = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    cu = c.input("customers", "customer_id BIGINT, region STRING")
    c.output("by_customer", o.join(cu, "customer_id").group_by("customer_id").agg(
        n="count(*)", s="sum(amount)", hi="max(amount)"))
    c.output("regions", cu.select("region").distinct())
    return c


def orders(rng: np.random.Generator, ids: np.ndarray, customers: int) -> pa.Table:
    return pa.table({"order_id": ids, "customer_id": rng.integers(0, customers, len(ids)),
                     "amount": rng.integers(1, 10_000, len(ids)) / 100})


def run(per_owner: bool, args: argparse.Namespace) -> tuple[dict[str, object], Counter]:
    spark = local_session("owner-bench", cores=2, shuffle_partitions=2)
    rng = np.random.default_rng(1)
    customers = max(1, args.orders // 10)
    with tempfile.TemporaryDirectory() as root, Pipeline(circuit(), root, spark) as p:
        p.rescale(args.workers)
        base = orders(rng, np.arange(args.orders), customers)
        p.push_zset("orders", base.append_column("_weight", pa.array([1] * base.num_rows)))
        p.push("customers", [(i, f"r{i % 50}") for i in range(customers)])
        p.step()  # the load, on the driver
        p.driver_step_rows = 0
        p.spark_per_owner = per_owner
        seconds, rows_read, reasons = [], [], []
        next_id = args.orders
        for s in range(args.steps):
            deletes = base.slice(s * args.change // 10, args.change // 10)
            inserts = orders(rng, np.arange(next_id, next_id + args.change - deletes.num_rows),
                             customers)
            next_id += inserts.num_rows
            change = pa.concat_tables([
                inserts.append_column("_weight", pa.array([1] * inserts.num_rows)),
                deletes.append_column("_weight", pa.array([-1] * deletes.num_rows))])
            start = time.monotonic()
            p.push_zset("orders", change)
            result = p.step()
            seconds.append(time.monotonic() - start)
            rows_read.append(result.state_rows_read)
            reasons.append(result.path_reason)
        view = Counter(tuple(r.values()) for r in p.view_arrow("by_customer").to_pylist())
    return ({"mode": "per_owner" if per_owner else "dataframe", "workers": args.workers,
             "orders": args.orders, "change": args.change,
             "median_step_s": round(statistics.median(seconds), 2),
             "steps_s": [round(x, 2) for x in seconds], "state_rows_read": rows_read,
             "path_reason": reasons[-1]}, view)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--change", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    views = []
    for per_owner in (False, True):
        figures, view = run(per_owner, args)
        views.append(view)
        print(json.dumps(figures), flush=True)
    print(json.dumps({"views_equal": views[0] == views[1]}))


if __name__ == "__main__":
    main()
