"""TPC-H benchmark: per query, what an incremental refresh costs against recomputing the query.

Data from ``tpchgen-cli`` at ``--scale`` (default 1). Per query that compiles
(``dbsp_pipeline/examples/tpch.py``: all 22), one pipeline on the driver path with DOUBLE money
columns (``--money decimal``: DECIMAL(15,2), as TPC-H declares them) holds the query as its one
view: the tables minus a held-back slice of orders are its initial load (timed, reported apart),
then rounds each of RF1 (insert 0.1% of the orders with their lineitems, ``--fraction``) and RF2
(delete as many loaded orders and their lineitems), one step each. The refresh seconds are RF1's
step plus RF2's, each step carrying its change (``p.step(changes)``: its pushes commit while it
computes; each change built before the clock starts, as a user holds its rows when it pushes them),
the first round's apart (``first_refresh_seconds``: it builds what a
running pipeline has, the in-memory replicas of the traces it looks up and the keyed runs of the
loaded files), then, once the background work it left is done, the median over ``--rounds`` more. In
the same run, over the same data after the refreshes: DuckDB running the query from scratch (in
memory, over Arrow tables, transpiled by sqlglot), and Spark running it from scratch over Parquet
copies of the tables (one shared local session; skip with ``--no-spark``). The view is compared with
DuckDB's result (floats to 1e-9 relative; top-k ties are broken differently by SQL, so the
comparison there is of multisets; decimals are compared as floats, to 1e-6 absolute: Spark rounds a
decimal average or quotient to 6 fractional digits). Prints one JSON line per query and a table at
the end.

    python benchmarks/tpch_bench.py [--scale 1] [--queries 1 3 6 ...] [--rounds 3]
        [--fraction 0.001] [--money double|decimal] [--no-spark] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from decimal import Decimal
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlglot

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.examples.tpch import QUERIES, Refreshes, generate, schema_sql
from dbsp_pipeline.spark_session import local_session
from dbsp_pipeline.sql import SqlError
from dbsp_pipeline.storage import keyed_runs

#: the type of the money columns, per ``--money``
MONEY = {"double": "DOUBLE", "decimal": "DECIMAL(15, 2)"}


def compiled_queries() -> list[int]:
    out = []
    for n, text in QUERIES.items():
        try:
            Circuit.from_sql(schema_sql()).view(f"q{n}", text)
            out.append(n)
        except SqlError:
            pass
    return out


def rows_of(table: pa.Table) -> list[tuple]:
    names = [c for c in table.column_names if not c.startswith("_")]
    weights = table.column("_weight").to_pylist() if "_weight" in table.column_names else None
    out = []
    for i, row in enumerate(table.select(names).to_pylist()):
        values = tuple(float(v) if isinstance(v, Decimal) else v for v in row.values())
        out += [values] * (weights[i] if weights else 1)
    return sorted(out, key=lambda r: tuple((v is None, f"{v:.6g}" if isinstance(v, float)
                                            else str(v)) for v in r))


def same(got: list[tuple], expected: list[tuple], abs_tol: float = 1e-9) -> bool:
    """Equal multisets of rows, floats to 1e-9 relative or ``abs_tol``."""
    if len(got) != len(expected):
        return False
    for a, b in zip(got, expected):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) or isinstance(y, float):
                if x is None or y is None or not math.isclose(x, y, rel_tol=1e-9,
                                                              abs_tol=abs_tol):
                    return False
            elif x != y:
                return False
    return True


def typed(p: Pipeline, name: str, table: pa.Table) -> pa.Table:
    schema = p.input_arrow_schema(name)
    return table.cast(pa.schema([schema.field(c) for c in table.column_names]))


def zset(table: pa.Table, weight: int) -> pa.Table:
    """``table``'s rows, each of weight ``weight``: a Z-set ``Pipeline.step`` carries."""
    return table.append_column("_weight", pa.array([weight] * table.num_rows, pa.int64()))


def run_query(n: int, tables: dict[str, pa.Table], args: argparse.Namespace, root: str,
              spark_dir: str | None, spark: Any) -> dict[str, Any]:
    refreshes = Refreshes(tables, fraction=args.fraction, seed=n, rounds=args.rounds + 1)
    current = dict(refreshes.initial)
    circuit = Circuit.from_sql(schema_sql(MONEY[args.money])
                               + f"CREATE VIEW q{n} AS {QUERIES[n]};\n")
    used = set(circuit.inputs_of(f"q{n}"))
    folder = os.path.join(root, f"q{n}")
    record: dict[str, Any] = {"query": n, "scale": args.scale, "money": args.money}
    with Pipeline(circuit, folder, spark, driver_step_rows=10**12) as p:
        t0 = time.perf_counter()
        for name, table in current.items():
            if name in used:
                p.push(name, typed(p, name, table))
        p.step()
        record["initial_load_seconds"] = round(time.perf_counter() - t0, 3)
        refresh_seconds = []
        for round_ in range(args.rounds + 1):
            if round_ == 1:  # after the first refresh: the background work it left is done
                p.engine.compactor.wait()
                keyed_runs.wait_for_writes()
            seconds = 0.0
            for kind in ("rf1", "rf2"):
                batch = refreshes.rf1() if kind == "rf1" else refreshes.rf2()
                weight = 1 if kind == "rf1" else -1
                changes = {name: zset(typed(p, name, table), weight)
                           for name, table in batch.items() if name in used}
                t0 = time.perf_counter()
                result = p.step(changes)
                seconds += time.perf_counter() - t0
                record.setdefault("on_driver", result.on_driver)
                for name, table in batch.items():
                    column = "o_orderkey" if name == "orders" else "l_orderkey"
                    if weight > 0:
                        current[name] = pa.concat_tables([current[name], table])
                    else:
                        current[name] = current[name].filter(pc.invert(pc.is_in(
                            current[name].column(column), table.column(column))))
            refresh_seconds.append(seconds)
        record["first_refresh_seconds"] = round(refresh_seconds.pop(0), 4)
        record["refresh_seconds"] = round(statistics.median(refresh_seconds), 4)
        view = rows_of(p.view_arrow(f"q{n}"))
    record["change_rows"] = sum(t.num_rows for t in batch.values())

    con = duckdb.connect()
    for name, table in current.items():
        con.register(name, table)
    sql = sqlglot.transpile(QUERIES[n], read="spark", write="duckdb")[0]
    t0 = time.perf_counter()
    expected = con.sql(sql).to_arrow_table()
    record["duckdb_seconds"] = round(time.perf_counter() - t0, 4)
    con.close()
    # Spark's decimal averages and quotients keep 6 fractional digits (DuckDB's are doubles)
    record["view_equals_duckdb"] = same(view, rows_of(expected),
                                        abs_tol=1e-6 if args.money == "decimal" else 1e-9)
    record["view_rows"] = len(view)

    if spark_dir is not None:
        for name, table in current.items():
            path = os.path.join(spark_dir, f"{name}.parquet")
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            pq.write_table(table, os.path.join(path, "part-0.parquet"))
            spark.read.parquet(path).createOrReplaceTempView(name)
        t0 = time.perf_counter()
        spark.sql(QUERIES[n]).collect()
        record["spark_seconds"] = round(time.perf_counter() - t0, 3)
    record["refresh_over_duckdb"] = round(record["refresh_seconds"] / record["duckdb_seconds"], 3)
    if "spark_seconds" in record:
        record["refresh_over_spark"] = round(record["refresh_seconds"] / record["spark_seconds"],
                                             3)
    return record


def table(rows: list[dict[str, Any]]) -> None:
    print()
    print(f"{'query':>5} {'load s':>8} {'first s':>8} {'refresh s':>10} {'DuckDB s':>9} "
          f"{'Spark s':>8} {'/DuckDB':>8} {'/Spark':>7} {'rows':>6} equal")
    for r in rows:
        spark = f"{r['spark_seconds']:.3f}" if "spark_seconds" in r else "-"
        over_spark = f"{r['refresh_over_spark']:.3f}" if "refresh_over_spark" in r else "-"
        print(f"{r['query']:>5} {r['initial_load_seconds']:>8.2f} "
              f"{r['first_refresh_seconds']:>8.3f} {r['refresh_seconds']:>10.4f} "
              f"{r['duckdb_seconds']:>9.4f} {spark:>8} {r['refresh_over_duckdb']:>8.3f} "
              f"{over_spark:>7} {r['view_rows']:>6} {r['view_equals_duckdb']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--queries", type=int, nargs="*")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed RF1+RF2 rounds, after a first one timed apart")
    parser.add_argument("--fraction", type=float, default=0.001)
    parser.add_argument("--money", choices=sorted(MONEY), default="double",
                        help="the type of the money columns (default: double)")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--root", help="a folder for the data and the pipelines (default: a "
                                       "temporary one, removed at the end)")
    args = parser.parse_args()
    compiled = compiled_queries()
    queries = args.queries or compiled
    missing = sorted(set(queries) - set(compiled))
    if missing:
        parser.error(f"queries {missing} do not compile")
    root = args.root or tempfile.mkdtemp(prefix="tpch-bench-")
    try:
        t0 = time.perf_counter()
        tables = generate(os.path.join(root, "data"), args.scale)
        print(json.dumps({"figure": "generate_seconds", "scale": args.scale,
                          "value": round(time.perf_counter() - t0, 2),
                          "lineitems": tables["lineitem"].num_rows}), flush=True)
        spark = local_session("tpch-bench")
        spark_dir = None if args.no_spark else os.path.join(root, "spark")
        rows = []
        for n in queries:
            record = run_query(n, tables, args, os.path.join(root, "pipelines"), spark_dir,
                               spark)
            print(json.dumps(record), flush=True)
            rows.append(record)
            shutil.rmtree(os.path.join(root, "pipelines", f"q{n}"), ignore_errors=True)
        table(rows)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
