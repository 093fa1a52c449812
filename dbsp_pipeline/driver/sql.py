"""DuckDB over Arrow: the relational engine of driver-side steps.

A step whose change is small runs on the driver instead of as Spark jobs (a Spark job costs about
0.1 s of scheduling here, a DuckDB query over a few thousand Arrow rows about 1 ms). Changes are
Arrow tables (payload + ``_weight``); operators express their work as DuckDB SQL over them.

Contract: ``query`` returns a new Arrow table and keeps no reference to its inputs. Results are
*not* typed like Spark's (DuckDB widens some types, e.g. ``sum(BIGINT)`` is ``HUGEINT``), so
every operator casts its output to its Spark-analysed schema with ``conform``.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline.zset import WEIGHT, spark_to_arrow_schema


def ident(name: str) -> str:
    """``name`` as a DuckDB identifier: in double quotes, a double quote inside doubled. Every
    column name the driver path writes into DuckDB SQL goes through here (the Spark counterpart
    is ``dbsp_pipeline.zset.quote``)."""
    return '"' + name.replace('"', '""') + '"'


def idents(names: Sequence[str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}{ident(n)}" for n in names)


def null_safe_on(left: str, right: str, columns: Sequence[str],
                 right_columns: Sequence[str] | None = None) -> str:
    """``left.c IS NOT DISTINCT FROM right.c`` for every column (NULL equals NULL); TRUE for
    none."""
    rcols = list(right_columns) if right_columns is not None else list(columns)
    terms = [f"{left}.{ident(c)} IS NOT DISTINCT FROM {right}.{ident(r)}"
             for c, r in zip(columns, rcols)]
    return " AND ".join(terms) if terms else "TRUE"


class LocalSQL:
    """One DuckDB connection, used by one pipeline's driver-side steps (not thread-safe)."""

    def __init__(self, threads: int = 2, memory_limit: str | None = None,
                 temp_directory: str | None = None) -> None:
        """``memory_limit`` (DuckDB's, e.g. ``"2GB"``) and ``temp_directory`` (where DuckDB
        spills beyond it) default to DuckDB's own; a Spark task sets both
        (``runtime/owner_exec.py``)."""
        config: dict[str, str | bool | int | float | list[str]] = {"threads": threads}
        if memory_limit is not None:
            config["memory_limit"] = memory_limit
        if temp_directory is not None:
            config["temp_directory"] = temp_directory
        self._con = duckdb.connect(config=config)

    def query(self, sql: str, **tables: pa.Table) -> pa.Table:
        """Run ``sql``, in which each Arrow table passed as ``name=table`` is the table ``name``."""
        registered = []
        try:
            for name, table in tables.items():
                self._con.register(name, table)
                registered.append(name)
            return self._con.sql(sql).to_arrow_table()
        finally:
            for name in registered:
                self._con.unregister(name)

    def consolidate(self, table: pa.Table, columns: Sequence[str]) -> pa.Table:
        """Sum the weights of equal rows over ``columns`` and drop zero weights (NULLs group)."""
        cols = idents(columns)
        group = f"GROUP BY {cols}" if columns else ""
        return self.query(
            f"SELECT {cols + ', ' if columns else ''}CAST(sum({ident(WEIGHT)}) AS BIGINT) AS "
            f"{ident(WEIGHT)} FROM t {group} HAVING sum({ident(WEIGHT)}) <> 0", t=table)

    def close(self) -> None:
        self._con.close()


def zset_arrow_schema(schema: StructType, extra: Sequence[StructField] = ()) -> pa.Schema:
    """The Arrow schema of a Z-set with payload ``schema`` (+ ``extra`` columns) and ``_weight``."""
    return spark_to_arrow_schema(StructType([*schema.fields, *extra,
                                             StructField(WEIGHT, LongType(), False)]))


def conform(table: pa.Table, schema: StructType, extra: Sequence[StructField] = ()) -> pa.Table:
    """``table``'s payload (by name, in ``schema``'s order) and ``_weight``, cast to Spark's
    types."""
    target = zset_arrow_schema(schema, extra)
    columns = [table.column(f.name).cast(f.type) for f in target]
    return pa.Table.from_arrays(columns, schema=target)


def negate(table: pa.Table) -> pa.Table:
    """The Z-set ``table`` with every weight negated."""
    i = table.schema.get_field_index(WEIGHT)
    return table.set_column(i, table.schema.field(i), pc.negate(table.column(i)))


def empty_zset(schema: StructType) -> pa.Table:
    """A Z-set with payload ``schema`` and no rows."""
    return zset_arrow_schema(schema).empty_table()
