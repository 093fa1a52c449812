"""Engine benchmark: incremental steps vs recomputing the query from scratch in Spark.

The shop query (filter, join with customers, group by region with sum/count/max) over ``orders``
of each size (default 1M and 4M rows) and 100k customers. After loading, each step pushes
``--change`` changed order rows (10% deletes of existing orders) and runs one step. In the same
run, the same query is recomputed from scratch by Spark over the same integrated orders (a Parquet
copy, as a batch job would read it). Prints one JSON line per figure and a table.

    python benchmarks/engine_bench.py [--sizes 1000000 4000000] [--steps 5] [--spark-steps 3]
                                      [--change 10000]

Small steps run on the driver (the default); ``--spark-steps`` further steps are then forced onto
Spark jobs (``driver_step_rows=0``) to show what the driver path saves.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

from pyspark.sql import functions as F

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.spark_session import local_session

CUSTOMERS = 100_000
REGIONS = 10


def customer_of(order_id: int) -> int:
    return (order_id * 7919) % CUSTOMERS + 1


def amount_of(order_id: int) -> float:
    return ((order_id * 104729) % 20000) / 100.0


def orders_frame(spark, start: int, end: int):
    ids = spark.range(start, end)
    return ids.select(F.col("id").alias("order_id"),
                      ((F.col("id") * 7919) % CUSTOMERS + 1).alias("customer_id"),
                      (((F.col("id") * 104729) % 20000) / 100.0).alias("amount"))


def recompute(spark, orders_path: str, customers_path: str):
    orders = spark.read.parquet(orders_path)
    customers = spark.read.parquet(customers_path)
    return (orders.where("amount > 10").join(customers, "customer_id").groupBy("region")
            .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n"),
                 F.max("amount").alias("top")).collect())


def run_size(spark, size: int, steps: int, spark_steps: int, change: int, emit) -> dict:
    root = tempfile.mkdtemp(prefix=f"dbsp-bench-{size}-")
    try:
        circuit = shop_circuit(extra_views=False)
        with Pipeline(circuit, root=root, spark=spark) as p:
            customers = spark.range(1, CUSTOMERS + 1).select(
                F.col("id").alias("customer_id"),
                F.concat(F.lit("region-"), (F.col("id") % REGIONS).cast("string")).alias("region"))
            p.push("customers", customers)
            p.push("orders", orders_frame(spark, 0, size))
            t = time.monotonic()
            load = p.step()
            emit({"size": size, "figure": "initial_load_step_seconds",
                  "value": round(time.monotonic() - t, 3), "rows_in": load.inputs})
            next_id = size
            deleted = 0

            def one_step(figure: str) -> float:
                nonlocal next_id, deleted
                n_del = change // 10
                inserts = [(i, customer_of(i), amount_of(i))
                           for i in range(next_id, next_id + change - n_del)]
                deletes = [(i, customer_of(i), amount_of(i))
                           for i in range(deleted, deleted + n_del)]
                next_id += change - n_del
                deleted += n_del
                p.push("orders", inserts)
                p.push("orders", deletes, weight=-1)
                t = time.monotonic()
                r = p.step()
                seconds = time.monotonic() - t
                emit({"size": size, "figure": figure, "step": r.step, "value": round(seconds, 3),
                      "on_driver": r.on_driver, "outputs": r.outputs})
                return seconds

            durations = [one_step("step_seconds") for _ in range(steps)]
            # The same steps with every operator as Spark jobs (driver_step_rows=0).
            p.driver_step_rows = 0
            spark_durations = [one_step("spark_step_seconds") for _ in range(spark_steps)]
            step_median = statistics.median(durations)
            view = sorted(tuple(r) for r in p.view("revenue_by_region").collect())

        # The alternative: the same query from scratch over the same integrated orders.
        data = tempfile.mkdtemp(prefix="dbsp-bench-batch-")
        orders_now = orders_frame(spark, deleted, next_id)
        orders_now.write.parquet(f"{data}/orders")
        customers.write.parquet(f"{data}/customers")
        recompute(spark, f"{data}/orders", f"{data}/customers")  # warm-up
        times = []
        for _ in range(3):
            t = time.monotonic()
            result = recompute(spark, f"{data}/orders", f"{data}/customers")
            times.append(time.monotonic() - t)
        shutil.rmtree(data, ignore_errors=True)
        expected = sorted((r["region"], r["total"], r["n"], r["top"], 1) for r in result)
        same = view == expected or _close(view, expected)
        recompute_median = statistics.median(times)
        summary = {"size": size, "figure": "summary", "step_median_seconds": round(step_median, 3),
                   "spark_step_median_seconds": (round(statistics.median(spark_durations), 3)
                                                 if spark_durations else None),
                   "recompute_median_seconds": round(recompute_median, 3),
                   "step_over_recompute": round(step_median / recompute_median, 3),
                   "view_equals_recompute": same, "change_rows": change, "steps": steps}
        emit(summary)
        return summary
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _close(view, expected) -> bool:
    if len(view) != len(expected):
        return False
    for a, b in zip(view, expected):
        if (a[0] != b[0] or a[2] != b[2] or a[3] != b[3]
                or abs(a[1] - b[1]) > 1e-6 * max(1, abs(b[1]))):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--spark-steps", type=int, default=3,
                        help="further steps forced onto Spark jobs, for comparison")
    parser.add_argument("--change", type=int, default=10_000)
    args = parser.parse_args()
    spark = local_session("dbsp-bench", shuffle_partitions=4)

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)

    summaries = [run_size(spark, s, args.steps, args.spark_steps, args.change, emit)
                 for s in args.sizes]
    print()
    print(f"{'orders':>10} | {'step median s':>13} | {'spark step s':>12} | {'recompute s':>11} "
          f"| {'step/recompute':>14} | equal")
    print("-" * 86)
    for s in summaries:
        spark_step = s["spark_step_median_seconds"]
        print(f"{s['size']:>10} | {s['step_median_seconds']:>13.3f} | "
              f"{'-' if spark_step is None else f'{spark_step:.3f}':>12} | "
              f"{s['recompute_median_seconds']:>11.3f} | {s['step_over_recompute']:>14.3f} | "
              f"{s['view_equals_recompute']}")
    if len(summaries) >= 2:
        growth = summaries[-1]["step_median_seconds"] / summaries[0]["step_median_seconds"]
        print(f"\nstep growth {summaries[0]['size']} -> {summaries[-1]['size']}: {growth:.2f}x")
        print(json.dumps({"figure": "step_growth", "from": summaries[0]["size"],
                          "to": summaries[-1]["size"], "value": round(growth, 3)}))


if __name__ == "__main__":
    main()
