"""Rescale: the fraction of state rows that change owner and that are rewritten, per sharding
function, next to the ideal; the seconds a cold and a hot rescale take, and the longest step
pause each causes while a stream of steps runs.

The shop query's state (``recovery_bench.Loader``: N orders, 100k customers, one Spark step).
For each sharding function the pipeline is first laid out on 4 workers (not measured), then
rescaled from 4 to 5 (W to W+1), to 3 (W to W-1) and to 8 (W to 2W) workers, going back to 4
between them (not measured). Ideal: a key changes owner only if it must, ``|W'-W| / max(W, W')``
of the state (1/(W+1) for W to W+1). "Moved" counts rows whose owner changes; "rewritten" the
rows of the files split because they now hold rows of several workers (a file owned by one
worker, even a new one, is not copied: the state is on storage every worker reads).

Cold vs hot (fixed sharding, 4 to 5 workers and back to 4, cold then hot): a thread pushes 1,000
order changes and executes a step, again and again (each step's latency: from the push to the
step's end, so a step held back by the rescale counts its wait); meanwhile the main thread
rescales.
"longest step" is the worst such latency during the rescale, next to the median step before it.
A cold rescale holds every step for its whole duration; a hot one only for the hand-over
("pause": what steps changed during the copy, and the commit).

    make bench-rescale                    # or: python benchmarks/rescale_bench.py --sizes 1000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time

from recovery_bench import Loader

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.runtime.layout import SHARDINGS
from dbsp_pipeline.spark_session import local_session

START = 4
TARGETS = [("W to W+1", 5), ("W to W-1", 3), ("W to 2W", 8)]


def measure(spark, size: int, emit) -> list[dict]:
    rows = []
    root = tempfile.mkdtemp(prefix="dbsp-rescale-")
    try:
        with Pipeline(shop_circuit(extra_views=False), root, spark) as p:
            Loader(spark, p, size)
            p.compact(threshold=0)
            for sharding in SHARDINGS:
                p.rescale(START, sharding)
                for label, target in TARGETS:
                    r = p.rescale(target)
                    row = {"figure": "rescale", "state_orders": size, "state_rows": r.rows,
                           "sharding": sharding, "change": label, "from": START, "to": target,
                           "moved_fraction": round(r.moved_rows / r.rows, 4),
                           "rewritten_fraction": round(r.rewritten_rows / r.rows, 4),
                           "ideal": round(abs(target - START) / max(target, START), 4),
                           "seconds": round(r.seconds, 3)}
                    emit(row)
                    rows.append(row)
                    p.rescale(START)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


class StepStream:
    """A thread pushing ``rows`` order changes and executing a step, over and over; records
    each iteration's (start, end) on the monotonic clock."""

    def __init__(self, p: Pipeline, loader: Loader, rows: int = 1_000) -> None:
        self.p, self.loader, self.rows = p, loader, rows
        self.spans: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-steps")

    def __enter__(self) -> StepStream:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            self.loader.push(self.rows)
            self.p.step()
            self.spans.append((t, time.monotonic()))

    def wait_steps(self, n: int) -> None:
        goal = len(self.spans) + n
        while len(self.spans) < goal:
            time.sleep(0.01)

    def latencies(self, since: float, until: float) -> list[float]:
        """Latencies of the iterations that ended within ``[since, until]`` or ran across it."""
        return [e - s for s, e in self.spans if e >= since and s <= until]


def measure_cold_vs_hot(spark, size: int, emit) -> list[dict]:
    rows = []
    root = tempfile.mkdtemp(prefix="dbsp-hot-rescale-")
    try:
        with Pipeline(shop_circuit(extra_views=False), root, spark) as p:
            loader = Loader(spark, p, size)
            p.compact(threshold=0)
            p.rescale(START, "fixed")
            with StepStream(p, loader) as stream:
                stream.wait_steps(5)
                for mode, target in (("cold", 5), ("cold", START), ("hot", 5), ("hot", START)):
                    stream.wait_steps(3)
                    before = [e - s for s, e in stream.spans[-5:]]
                    t0 = time.monotonic()
                    r = p.rescale(target, hot=(mode == "hot"))
                    t1 = time.monotonic()
                    stream.wait_steps(2)
                    during = stream.latencies(t0, t1)
                    row = {"figure": "rescale_pause", "state_orders": size, "state_rows": r.rows,
                           "mode": mode, "from": r.old.workers, "to": r.new.workers,
                           "seconds": round(r.seconds, 3),
                           "copy_seconds": round(r.copy_seconds, 3),
                           "pause_seconds": round(r.pause_seconds if r.hot else r.seconds, 3),
                           "steps_during_rescale": r.steps_during_copy,
                           "caught_up_rows": r.caught_up_rows,
                           "rewritten_fraction": round(r.rewritten_rows / r.rows, 4),
                           "median_step_before": round(statistics.median(before), 3),
                           "longest_step_during": round(max(during, default=0.0), 3)}
                    emit(row)
                    rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--pauses-only", action="store_true",
                        help="measure only cold vs hot pauses, not the fractions per sharding")
    args = parser.parse_args()
    spark = local_session("dbsp-rescale-bench", cores=2, shuffle_partitions=4)

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)

    rows = [] if args.pauses_only else [r for size in args.sizes
                                        for r in measure(spark, size, emit)]
    pauses = [r for size in args.sizes for r in measure_cold_vs_hot(spark, size, emit)]
    print(f"\n{'orders':>8} | {'sharding':>8} | {'change':>9} | {'moved':>6} | "
          f"{'rewritten':>9} | {'ideal':>6} | {'seconds':>7}")
    for r in rows:
        print(f"{r['state_orders']:>8} | {r['sharding']:>8} | {r['change']:>9} | "
              f"{r['moved_fraction']:>6.3f} | {r['rewritten_fraction']:>9.3f} | "
              f"{r['ideal']:>6.3f} | {r['seconds']:>7.2f}")

    print(f"\n{'orders':>8} | {'mode':>4} | {'W':>6} | {'seconds':>7} | {'copy s':>6} | "
          f"{'pause s':>7} | {'steps during':>12} | {'median step':>11} | {'longest step':>12}")
    for r in pauses:
        print(f"{r['state_orders']:>8} | {r['mode']:>4} | {r['from']:>2} to {r['to']:<1} | "
              f"{r['seconds']:>7.2f} | {r['copy_seconds']:>6.2f} | {r['pause_seconds']:>7.2f} | "
              f"{r['steps_during_rescale']:>12} | {r['median_step_before']:>11.2f} | "
              f"{r['longest_step_during']:>12.2f}")


if __name__ == "__main__":
    main()

