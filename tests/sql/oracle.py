"""DuckDB as the oracle of SQL views: the same script (transpiled from Spark SQL by sqlglot)
run from scratch over the integrated inputs."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal

import duckdb
import pyarrow as pa
import sqlglot


def normalize(value: object) -> object:
    """Floats to 12 significant digits (the engine sums exactly, DuckDB does not); NaN kept."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.12g}") + 0.0
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def view_rows(table: pa.Table) -> Counter:
    """A view read as Arrow (payload + ``_weight``) as ``Counter{row: multiplicity}``."""
    cols = [c for c in table.column_names if not c.startswith("_")]
    out: Counter = Counter()
    for row in table.to_pylist():
        out[tuple(normalize(row[c]) for c in cols)] += row["_weight"]
    return Counter({k: v for k, v in out.items() if v})


class DuckDbOracle:
    """Runs ``script`` (CREATE TABLE / CREATE VIEW, Spark SQL) in a fresh DuckDB database over
    the given table contents."""

    def __init__(self, script: str) -> None:
        self.statements = [s for s in sqlglot.transpile(script, read="spark", write="duckdb")
                           if s.strip()]

    def views(self, tables: dict[str, Counter], names: list[str]) -> dict[str, Counter]:
        con = duckdb.connect()
        try:
            for statement in self.statements:
                con.execute(statement)
            for name, bag in tables.items():
                rows = [row for row, m in bag.items() for _ in range(m)]
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
            return {n: Counter(tuple(normalize(v) for v in row)
                               for row in con.execute(f"SELECT * FROM {n}").fetchall())
                    for n in names}
        finally:
            con.close()
