"""Initial-load benchmark: where a big first step runs (driver or Spark) and what it costs.

Pushes ``--orders`` orders (default 1M) and 100k customers into the shop circuit (the lookup
benchmark's data) and times the one step that loads them, with the pipeline's default path
choice (``driver_step_rows`` left at its default) unless ``--driver-step-rows`` is given. Prints
one JSON line: the step's seconds, where it ran and why (``StepResult.path_reason``), and the
process's peak resident memory before and after the step.

    python benchmarks/initial_load_bench.py [--orders 1000000] [--driver-step-rows N]
        [--driver-memory BYTES]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time

import numpy as np

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.spark_session import local_session

CUSTOMERS = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--driver-step-rows", type=int, default=None)
    parser.add_argument("--driver-memory", type=int, default=None)
    args = parser.parse_args()
    import pyarrow as pa
    ids = np.arange(1, args.orders + 1, dtype=np.int64)
    orders = pa.table({"order_id": ids, "customer_id": ids * 7919 % CUSTOMERS + 1,
                       "amount": (ids * 104729 % 19997) / 100.0})
    c = np.arange(1, CUSTOMERS + 1, dtype=np.int64)
    customers = pa.table({"customer_id": c,
                          "region": pa.array([f"region-{i % 10}" for i in c])})
    settings: dict[str, int] = {}
    if args.driver_step_rows is not None:
        settings["driver_step_rows"] = args.driver_step_rows
    if args.driver_memory is not None:
        settings["driver_memory"] = args.driver_memory
    spark = local_session()
    with tempfile.TemporaryDirectory(prefix="dbsp-initial-load-") as root, \
            Pipeline(shop_circuit(extra_views=False), root=root, spark=spark, **settings) as p:
        p.push("customers", customers)
        p.push("orders", orders)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        started = time.monotonic()
        r = p.step()
        seconds = time.monotonic() - started
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"orders": args.orders, "customers": CUSTOMERS, **settings,
                          "step_seconds": round(seconds, 3), "on_driver": r.on_driver,
                          "path_reason": getattr(r, "path_reason", None),
                          "peak_rss_before": rss_before, "peak_rss_after": rss_after,
                          "view_rows": p.view_arrow("revenue_by_region").num_rows}))


if __name__ == "__main__":
    main()
