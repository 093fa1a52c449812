"""Cold rescale: the fraction of state rows that change owner and that are rewritten, per
sharding function, next to the ideal; and the seconds a rescale takes.

The shop query's state (``recovery_bench.Loader``: N orders, 100k customers, one Spark step).
For each sharding function the pipeline is first laid out on 4 workers (not measured), then
rescaled from 4 to 5 (W to W+1), to 3 (W to W-1) and to 8 (W to 2W) workers, going back to 4
between them (not measured). Ideal: a key changes owner only if it must, ``|W'-W| / max(W, W')``
of the state (1/(W+1) for W to W+1). "Moved" counts rows whose owner changes; "rewritten" the
rows of the files split because they now hold rows of several workers (a file owned by one
worker, even a new one, is not copied: the state is on storage every worker reads).

    make bench-rescale                    # or: python benchmarks/rescale_bench.py --sizes 1000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.runtime.layout import SHARDINGS
from dbsp_pipeline.spark_session import local_session
from recovery_bench import Loader

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    args = parser.parse_args()
    spark = local_session("dbsp-rescale-bench", cores=2, shuffle_partitions=4)

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)

    rows = [r for size in args.sizes for r in measure(spark, size, emit)]
    print(f"\n{'orders':>8} | {'sharding':>8} | {'change':>9} | {'moved':>6} | "
          f"{'rewritten':>9} | {'ideal':>6} | {'seconds':>7}")
    for r in rows:
        print(f"{r['state_orders']:>8} | {r['sharding']:>8} | {r['change']:>9} | "
              f"{r['moved_fraction']:>6.3f} | {r['rewritten_fraction']:>9.3f} | "
              f"{r['ideal']:>6.3f} | {r['seconds']:>7.2f}")


if __name__ == "__main__":
    main()
