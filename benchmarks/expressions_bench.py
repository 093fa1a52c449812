"""Expressions benchmark: what a view's Spark SQL functions cost a small driver step, evaluated in
DuckDB (``driver/expressions.py`` translates them exactly) against the same step with that
translation withheld, where the select runs as a Spark job over the step's change (what a
function outside the translation costs).

Per expression, one pipeline (one input of orders; a view grouping a select of the expression,
``sum(amount)`` and ``count(*)`` by it) takes 100-row steps on the driver; the median push+step
seconds of ``--steps`` steps after two of warm-up, translated and not, the JVM already up for
both. Prints one JSON line per expression and a table.

    python benchmarks/expressions_bench.py [--steps 12] [--json PATH] [--expressions E ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
from typing import Any

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.operators.linear import Select
from dbsp_pipeline.spark_session import local_session

EXPRESSIONS = ["region", "upper(region)", "date_trunc('MONTH', ts)",
               "year(ts) * 100 + month(ts)", "concat(region, '-', cast(id % 7 AS STRING))",
               "if(amount > 50, 'big', 'small')", "datediff(to_date(ts), DATE '2026-01-01')",
               "round(amount * 1.07, 1)"]
REGIONS = ["north", "south", "east", "west"]


def circuit(expr: str) -> Circuit:
    c = Circuit("expressions_bench")
    orders = c.input("orders", "id BIGINT, region STRING, amount DOUBLE, ts TIMESTAMP")
    c.output("v", orders.select(f"{expr} AS k", "amount").group_by("k").agg(
        total="sum(amount)", n="count(*)"))
    return c


def rows(step: int, count: int = 100) -> list[tuple]:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [(step * count + j, REGIONS[j % 4], float((step * 31 + j * 7) % 100),
             base + dt.timedelta(hours=step * 7 + j * 13)) for j in range(count)]


def median_step(expr: str, steps: int, translated: bool, spark: Any) -> tuple[float, bool]:
    with Pipeline(circuit(expr), tempfile.mkdtemp(prefix="dbsp-expr-"), spark,
                  driver_step_rows=10**9) as p:
        select = next(op for op in p._engine.plan.operators.values() if isinstance(op, Select))
        if not translated:  # as a function outside the translation: a Spark job a step
            select.local_sql, select.arrow_columns = None, None
        seconds = []
        for step in range(steps + 2):
            batch = rows(step)
            start = time.perf_counter()
            p.push("orders", batch)
            result = p.step()
            seconds.append(time.perf_counter() - start)
        runs_in_duckdb = select.local_sql is not None or select.arrow_columns is not None
        return statistics.median(seconds[2:]), runs_in_duckdb and result.on_driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", default="", help="also write the JSON lines to this file")
    parser.add_argument("--expressions", nargs="*", default=EXPRESSIONS,
                        help="only these (Spark SQL over id, region, amount, ts)")
    args = parser.parse_args()
    spark = local_session()
    out = []
    for expr in args.expressions:
        fast, on_driver = median_step(expr, args.steps, True, spark)
        slow, _ = median_step(expr, args.steps, False, spark)
        row = {"expression": expr, "translated": on_driver, "step_s": round(fast, 4),
               "spark_job_step_s": round(slow, 4), "speedup": round(slow / fast, 1)}
        out.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in out)
    print()
    print(f"{'expression':<48} {'in DuckDB':>9} {'step s':>8} {'Spark job s':>12} {'x':>6}")
    for r in out:
        print(f"{r['expression']:<48} {str(r['translated']):>9} {r['step_s']:>8.4f} "
              f"{r['spark_job_step_s']:>12.4f} {r['speedup']:>6.1f}")


if __name__ == "__main__":
    main()
