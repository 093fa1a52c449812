"""Sensor-to-view latency of the operator's console, with and without a long-lived Spark.

For each configuration a fresh ``dagster dev`` (and, for ``connect``, a Spark Connect server)
is started on 127.0.0.1; a first batch of the shop feed warms the pipeline up (its first
compilation), then ``--batches`` batches are dropped into the inbox one at a time, and the
seconds from the drop until the view's materialization is recorded (sensor tick + run launch +
ingest + step + commit). Configurations:

* ``local / driver steps``: the default: small steps run on the driver, no JVM in the run.
* ``local / spark steps``: every step as Spark jobs in the run process (a JVM start per run).
* ``connect / spark steps``: every step as Spark jobs on the long-lived Connect server.

Prints one JSON line per measurement and a table; also the resident memory of the stack.

    make bench-console            # or: python benchmarks/console_latency.py --batches 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infra.console import Console  # noqa: E402

#: (deployment, steps, the deployment's driver_step_rows: None for the default)
CONFIGS = [
    ("local", "driver steps", None),
    ("local", "spark steps", 0),
    ("connect", "spark steps", 0),
]


def measure(mode: str, steps: str, driver_step_rows: int | None, batches: int,
            orders: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="dbsp-console-") as var:
        with Console(var, spark_mode=mode, driver_step_rows=driver_step_rows) as console:
            dropped = console.drop_batch(orders)
            mat = console.wait_for_view_update("revenue_by_region", 1, timeout=600)
            first = int(mat["timestamp"]) / 1000 - dropped
            latencies, step_seconds = [], []
            for i in range(batches):
                dropped = console.drop_batch(orders)
                mat = console.wait_for_view_update("revenue_by_region", i + 2, timeout=600)
                latencies.append(int(mat["timestamp"]) / 1000 - dropped)
                step_seconds.append(mat["metadata"]["seconds_per_step"])
            memory = console.stack_rss_mib()
    return {"figure": "sensor_to_view_seconds", "spark": mode, "steps": steps,
            "first_batch": round(first, 2), "median": round(statistics.median(latencies), 2),
            "all": [round(x, 2) for x in latencies],
            "step_seconds_median": round(statistics.median(step_seconds), 3),
            "rss_mib": {k: round(v) for k, v in memory.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--orders", type=int, default=200, help="order changes per batch")
    args = parser.parse_args()
    rows = []
    for mode, steps, driver_step_rows in CONFIGS:
        row = measure(mode, steps, driver_step_rows, args.batches, args.orders)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n{'spark':>8} | {'steps':>12} | {'first batch s':>13} | {'median s':>8} | "
          f"{'step s':>6} | memory MiB")
    for r in rows:
        mem = ", ".join(f"{k} {v}" for k, v in r["rss_mib"].items())
        print(f"{r['spark']:>8} | {r['steps']:>12} | {r['first_batch']:>13.2f} | "
              f"{r['median']:>8.2f} | {r['step_seconds_median']:>6.3f} | {mem}")


if __name__ == "__main__":
    main()
