"""Durability benchmark: checkpoint cost against state size, recovery time against the number
of uncommitted steps, and steps per second for small changes.

The shop query (as in ``engine_bench.py``). For each state size (default 1M and 4M orders,
customers 100k): the median seconds of a checkpoint (``Pipeline.commit`` after a 10k-row step);
then, at the smaller size, the seconds to reopen after a crash that left 1, 5 and 20 steps
divided but not committed (the reopen re-executes them); and the steps per second of a loop of
100-row changes. Prints one JSON line per figure and a table.

    python benchmarks/recovery_bench.py [--sizes 1000000 4000000] [--uncommitted 1 5 20]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

from engine_bench import CUSTOMERS, REGIONS, amount_of, customer_of, orders_frame
from pyspark.sql import functions as F

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.spark_session import local_session
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash


class Loader:
    """Loads the shop state and pushes deterministic changes (10% deletes)."""

    def __init__(self, spark, p: Pipeline, size: int) -> None:
        self.p, self.next_id, self.deleted = p, size, 0
        customers = spark.range(1, CUSTOMERS + 1).select(
            F.col("id").alias("customer_id"),
            F.concat(F.lit("region-"), (F.col("id") % REGIONS).cast("string")).alias("region"))
        p.push("customers", customers)
        p.push("orders", orders_frame(spark, 0, size))
        p.step()

    def push(self, rows: int) -> None:
        n_del = rows // 10
        ins = [(i, customer_of(i), amount_of(i))
               for i in range(self.next_id, self.next_id + rows - n_del)]
        dels = [(i, customer_of(i), amount_of(i))
                for i in range(self.deleted, self.deleted + n_del)]
        self.next_id += rows - n_del
        self.deleted += n_del
        self.p.push("orders", ins)
        if dels:
            self.p.push("orders", dels, weight=-1)


def checkpoint_seconds(spark, size: int, emit) -> float:
    root = tempfile.mkdtemp(prefix="dbsp-ckpt-")
    try:
        with Pipeline(shop_circuit(extra_views=False), root, spark, checkpoint_every=10**9) as p:
            loader = Loader(spark, p, size)
            times = []
            for _ in range(5):
                loader.push(10_000)
                p.step()
                t = time.monotonic()
                p.commit(compact=False)
                times.append(time.monotonic() - t)
        value = statistics.median(times)
        emit({"figure": "checkpoint_seconds", "state_orders": size, "value": round(value, 4)})
        return value
    finally:
        shutil.rmtree(root, ignore_errors=True)


def recovery_seconds(spark, size: int, uncommitted: int, emit) -> float:
    root = tempfile.mkdtemp(prefix="dbsp-recover-")
    try:
        p = Pipeline(shop_circuit(extra_views=False), root, spark, checkpoint_every=10**9)
        loader = Loader(spark, p, size)
        p.commit()
        for _ in range(uncommitted):
            loader.push(10_000)
            p.step()
        crash_points.reset()
        crash_points.arm("manifest.commit.before")
        try:
            p.commit()
        except InjectedCrash:
            pass  # the process "dies": the steps are divided and written, not committed
        crash_points.reset()
        t = time.monotonic()
        q = Pipeline(shop_circuit(extra_views=False), root, spark)
        value = time.monotonic() - t
        assert len(q.recovered_steps) == uncommitted
        q.close()
        emit({"figure": "recovery_seconds", "state_orders": size, "uncommitted_steps": uncommitted,
              "value": round(value, 3)})
        return value
    finally:
        shutil.rmtree(root, ignore_errors=True)


def small_steps_per_second(spark, size: int, emit) -> float:
    root = tempfile.mkdtemp(prefix="dbsp-small-")
    try:
        with Pipeline(shop_circuit(extra_views=False), root, spark) as p:
            loader = Loader(spark, p, size)
            t = time.monotonic()
            steps = 50
            for _ in range(steps):
                loader.push(100)
                p.step()
            value = steps / (time.monotonic() - t)
        emit({"figure": "small_steps_per_second", "state_orders": size, "change_rows": 100,
              "value": round(value, 2), "note": "push + step + checkpoint each step"})
        return value
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--uncommitted", type=int, nargs="+", default=[1, 5, 20])
    args = parser.parse_args()
    spark = local_session("dbsp-recovery-bench", shuffle_partitions=4)

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)

    ckpt = {s: checkpoint_seconds(spark, s, emit) for s in args.sizes}
    small = args.sizes[0]
    recovery = {k: recovery_seconds(spark, small, k, emit) for k in args.uncommitted}
    rate = small_steps_per_second(spark, small, emit)
    print()
    print(f"{'state orders':>12} | {'checkpoint s':>12}")
    for s, v in ckpt.items():
        print(f"{s:>12} | {v:>12.4f}")
    print(f"\n{'uncommitted steps':>17} | {'recovery s':>10}   (state {small} orders)")
    for k, v in recovery.items():
        print(f"{k:>17} | {v:>10.3f}")
    print(f"\nsmall steps (100 rows, each committed): {rate:.1f} steps/s")


if __name__ == "__main__":
    main()
