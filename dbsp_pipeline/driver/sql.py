"""DuckDB over Arrow: the relational engine of driver-side steps.

A step whose change is small runs on the driver instead of as Spark jobs (a Spark job costs about
0.1 s of scheduling here, a DuckDB query over a few thousand Arrow rows about 1 ms). Changes are
Arrow tables (payload + ``_weight``); operators express their work as DuckDB SQL over them.

Contract: ``query`` returns a new Arrow table and keeps no reference to its inputs. Results are
*not* typed like Spark's (DuckDB widens some types, e.g. ``sum(BIGINT)`` is ``HUGEINT``), so
every operator casts its output to its Spark-analysed schema with ``conform``.

Small changes skip DuckDB: below ``FAST_PATH_ROWS`` rows a consolidation (and the aggregate's
and the join's per-step work, ``operators/``) runs with pyarrow compute in-process, which costs
microseconds where a query costs milliseconds of fixed overhead. The fast path gives the same
rows, types and values as the query, bit for bit, or does not run: it runs only where pyarrow's
grouping and joining agree with DuckDB's (``arrow_groups_like_duckdb``: no nested types, no
floating-point key holding -0.0 or a NaN, which pyarrow compares by bits and DuckDB by value)
and where no 64-bit weight sum can wrap (``weights_fit``: pyarrow's sums wrap silently, DuckDB's
raise); otherwise the query runs, with its own errors. A consolidation of any size is first
tried by row hashes (``driver/row_groups.py``: one compiled pass, under the same conditions, its
own check of the rows that share a hash and of the sums' range).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    LongType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from dbsp_pipeline.zset import WEIGHT, spark_to_arrow_schema

#: At most this many input rows take the pyarrow fast path instead of a DuckDB query. Measured
#: (one core, 3-column key): a consolidation costs pyarrow 0.3 ms at 1,000 rows, 0.9 ms at
#: 10,000, 2.4 ms at 30,000, 10 ms at 100,000 rows, DuckDB 1.9, 2.5, 3.7 and 13 ms; the
#: aggregate's and join's phases do more pyarrow calls per row, so the limit stays below
#: 100,000. Read at every call, so tests can set it to 0 (DuckDB always, a consolidation by row
#: hashes too) or raise it.
FAST_PATH_ROWS = 65_536
_INT64_LIMIT = 1 << 63


def arrow_groups_like_duckdb(table: pa.Table, columns: Sequence[str]) -> bool:
    """Whether pyarrow groups and joins the rows of ``table`` on ``columns`` exactly as DuckDB's
    ``GROUP BY`` and ``IS NOT DISTINCT FROM`` do: every column of a primitive type (numbers,
    strings, binaries, decimals, dates, times, timestamps, booleans; NULLs group together in
    both), and no floating-point column holding ``-0.0`` or a NaN (pyarrow tells ``-0.0`` from
    ``0.0`` and NaNs apart by their bits, DuckDB takes them as equal; with neither, equal values
    have equal bits). The same condition makes pyarrow's ``min``/``max`` of such a column agree
    with DuckDB's (which orders NaN above every number)."""
    for name in columns:
        column = table.column(name)
        kind = column.type
        if pa.types.is_floating(kind):
            if column.null_count == len(column):
                continue
            values = pc.fill_null(column, 1.0).to_numpy()  # (a NULL is neither)
            if np.isnan(values).any() or np.signbit(values[values == 0]).any():
                return False
        elif not (pa.types.is_integer(kind) or pa.types.is_boolean(kind)
                  or pa.types.is_string(kind) or pa.types.is_large_string(kind)
                  or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                  or pa.types.is_decimal(kind) or pa.types.is_temporal(kind)):
            return False
    return True


def arrow_orders_like_duckdb(value_type: DataType) -> bool:
    """Whether Arrow sorts values of the Spark type ``value_type`` as DuckDB and Spark order
    them (so a trace's runs may be sorted by such a column: a min/max aggregate's values,
    ``Trace.lookup_extreme_rows``; a top-k's first order key, ``Trace.lookup_leading_rows``):
    numbers (NaN above every number in all three, ``-0.0`` equal to ``0.0``), strings of the
    binary collation and binaries (byte order), booleans, decimals, dates and timestamps; not
    nested types."""
    if isinstance(value_type, StringType):
        return getattr(value_type, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(value_type, (NumericType, BinaryType, BooleanType, DateType,
                                   TimestampType, TimestampNTZType))


def equal_as_grouped(a: pa.Table, b: pa.Table, columns: Sequence[str]) -> np.ndarray | None:
    """Per row i: whether row i of ``a`` and row i of ``b`` (tables of equal length) are equal
    on ``columns`` as ``consolidate`` takes rows to be equal, whichever way it runs (DuckDB's
    ``GROUP BY``; pyarrow's grouping where it agrees): NULL equals NULL, floating-point numbers
    by value with ``-0.0`` equal to ``0.0`` and a NaN equal to a NaN. None where a column is
    of another type in ``a`` than in ``b``, or of a type this does not compare (nested types;
    half floats, which pyarrow does not compare; ``date64``, whose time of day DuckDB drops):
    the caller consolidates instead."""
    same = np.ones(a.num_rows, dtype=bool)
    for name in columns:
        x, y = a.column(name), b.column(name)
        kind = x.type
        if y.type != kind or not (
                pa.types.is_integer(kind) or pa.types.is_float32(kind)
                or pa.types.is_float64(kind) or pa.types.is_boolean(kind)
                or pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_decimal(kind) or pa.types.is_date32(kind)
                or pa.types.is_time(kind) or pa.types.is_timestamp(kind)
                or pa.types.is_duration(kind)):
            return None
        equal = pc.fill_null(pc.equal(x, y), False)
        if pa.types.is_floating(kind):
            equal = pc.or_(equal, pc.fill_null(pc.and_(pc.is_nan(x), pc.is_nan(y)), False))
        equal = pc.or_(equal, pc.and_(pc.is_null(x), pc.is_null(y)))
        same &= np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)
    return same


def weights_fit(weights: pa.ChunkedArray | pa.Array, terms: int | None = None) -> bool:
    """Whether no sum of up to ``terms`` (default: all) of ``weights`` can leave int64: the
    largest magnitude times the number of terms is below 2**63 (pyarrow's ``sum`` wraps around
    silently where DuckDB's raises)."""
    if len(weights) == 0:
        return True
    bounds = pc.min_max(weights).as_py()
    if bounds["min"] is None:
        return True
    largest = max(abs(int(bounds["min"])), abs(int(bounds["max"])))
    return largest * (len(weights) if terms is None else terms) < _INT64_LIMIT


def fast_path(table: pa.Table, columns: Sequence[str]) -> bool:
    """Whether a consolidation of ``table`` over ``columns`` takes the pyarrow fast path."""
    return (table.num_rows <= FAST_PATH_ROWS and arrow_groups_like_duckdb(table, columns)
            and weights_fit(table.column(WEIGHT)))


def filtered(table: pa.Table, mask: pa.ChunkedArray | pa.Array | np.ndarray) -> pa.Table:
    """``table.filter(mask)`` (a boolean mask; NULL drops the row, as there), but ``table``
    itself when the mask keeps every row: a filter copies every column even then, and many of
    the engine's filters nearly always keep all (a lookup's key match, the live rows of a
    re-read, the non-zero weights of a consolidation, the groups a change keeps)."""
    if isinstance(mask, np.ndarray):
        return table if bool(mask.all()) else table.filter(pa.array(mask))
    return table if pc.all(mask, skip_nulls=False).as_py() else table.filter(mask)


def consolidate_arrow(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``LocalSQL.consolidate`` in pyarrow (the caller checked ``fast_path``): ``columns`` in
    their input types and ``_weight`` (int64), one row per distinct ``columns`` (NULLs group),
    zero weights dropped."""
    cols = list(columns)
    if cols:
        grouped = table.select([*cols, WEIGHT]).group_by(cols, use_threads=False).aggregate(
            [(WEIGHT, "sum")])
        weights = grouped.column(f"{WEIGHT}_sum").cast(pa.int64())
        out = pa.Table.from_arrays([*(grouped.column(c) for c in cols), weights],
                                   names=[*cols, WEIGHT])
    else:
        total = pc.sum(table.column(WEIGHT)).as_py()
        out = pa.table({WEIGHT: pa.array([] if total is None else [total], pa.int64())})
    return filtered(out, pc.not_equal(out.column(WEIGHT), 0))


def null_safe_ids(left: pa.Table, right: pa.Table,
                  columns: Sequence[str]) -> tuple[list[pa.Array], list[pa.Array]]:
    """Per column of ``columns``, an int32 id of each value of ``left`` and of ``right``, equal
    exactly where the values are NULL-safe equal (NULL has an id of its own): joining on the ids
    is joining with ``IS NOT DISTINCT FROM``. ``right``'s columns are cast to ``left``'s types;
    the caller checked ``arrow_groups_like_duckdb`` on both."""
    left_ids, right_ids = [], []
    n = left.num_rows
    for name in columns:
        both = pa.chunked_array([*left.column(name).chunks,
                                 *right.column(name).cast(left.column(name).type).chunks],
                                type=left.column(name).type)
        ids = pc.dictionary_encode(both.combine_chunks(), null_encoding="encode").indices
        left_ids.append(ids.slice(0, n))
        right_ids.append(ids.slice(n))
    return left_ids, right_ids


def match_distinct(left: pa.Table, right: pa.Table, columns: Sequence[str]) -> pa.Array | None:
    """For each row of ``left``, the index of the row of ``right`` whose ``columns`` are
    NULL-safe equal to its own (NULL where none), as a left outer join on ``columns`` would pair
    them when no two rows of ``right`` are equal on them; None when two are (or the key is too
    wide to number), so the caller joins. ``right``'s columns are cast to ``left``'s types; the
    caller checked ``arrow_groups_like_duckdb`` on both. One hash lookup per row, where a join
    of row numbers costs a plan, a join and a sort."""
    if not columns:
        return None
    if len(columns) == 1:
        name = columns[0]
        lkey = left.column(name)
        rkey = right.column(name).cast(lkey.type)
    else:  # number each row's key: the column ids in mixed radix
        left_ids, right_ids = null_safe_ids(left, right, columns)
        radix = left.num_rows + right.num_rows + 1
        if radix ** len(columns) >= _INT64_LIMIT:
            return None
        lnum = np.zeros(left.num_rows, dtype=np.int64)
        rnum = np.zeros(right.num_rows, dtype=np.int64)
        for lid, rid in zip(left_ids, right_ids):
            lnum = lnum * radix + lid.to_numpy(zero_copy_only=False)
            rnum = rnum * radix + rid.to_numpy(zero_copy_only=False)
        lkey, rkey = pa.array(lnum), pa.array(rnum)
    if pc.count_distinct(rkey, mode="all").as_py() != len(rkey):
        return None
    return pc.index_in(lkey, value_set=rkey, skip_nulls=False)


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
        #: the tables ``consolidate`` returned that are still alive, by ``id``, with the
        #: columns they were consolidated over (a weak reference each: holds no memory)
        self._consolidated: dict[int, tuple[weakref.ref[pa.Table], tuple[str, ...]]] = {}

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
        """Sum the weights of equal rows over ``columns`` and drop zero weights (NULLs group).
        Consolidated by row hashes where it can be (``driver/row_groups.py``), else a small
        table in pyarrow (``fast_path``), else by DuckDB, all with the same result. A table
        this connection's ``consolidate`` returned over the same ``columns`` is returned as it
        is (a task consolidates its owner's change, then the operator's trace append does)."""
        key = tuple(columns)
        seen = self._consolidated.get(id(table))
        if seen is not None and seen[0]() is table and seen[1] == key:
            return table
        from dbsp_pipeline.driver import row_groups  # (compiled code: loaded at first use)

        hashed = row_groups.consolidated(table, columns) if FAST_PATH_ROWS else None
        if hashed is not None:
            out = hashed
        elif fast_path(table, columns):
            out = consolidate_arrow(table, columns)
        else:
            cols = idents(columns)
            group = f"GROUP BY {cols}" if columns else ""
            out = self.query(
                f"SELECT {cols + ', ' if columns else ''}CAST(sum({ident(WEIGHT)}) AS BIGINT) "
                f"AS {ident(WEIGHT)} FROM t {group} HAVING sum({ident(WEIGHT)}) <> 0", t=table)
        self.assume_consolidated(out, key)
        return out

    def assume_consolidated(self, table: pa.Table, columns: Sequence[str]) -> None:
        """Take ``table`` as consolidated over ``columns`` (its caller knows it is: no two rows
        equal on them, no zero weight), so ``consolidate`` returns it as it is."""
        self._consolidated[id(table)] = (weakref.ref(table, self._forget), tuple(columns))

    def consolidated_subset(self, subset: pa.Table, table: pa.Table) -> None:
        """Take ``subset`` (rows of ``table``, in its columns: a filter's output) as consolidated
        wherever ``table`` is (``consolidate`` returned it): distinct rows stay distinct, and
        none has a zero weight. So ``consolidate`` returns ``subset`` as it is too."""
        if subset.column_names != table.column_names:
            return
        seen = self._consolidated.get(id(table))
        if seen is not None and seen[0]() is table:
            self.assume_consolidated(subset, seen[1])

    def conform(self, table: pa.Table, schema: StructType) -> pa.Table:
        """``conform(table, schema)``, which stays consolidated (for ``consolidate``) where
        ``table`` is and no column changes type (the same rows in a new schema)."""
        out = conform(table, schema)
        if table.column_names == out.column_names and all(
                a.type == b.type for a, b in zip(table.schema, out.schema)):
            self.consolidated_subset(out, table)
        return out

    def _forget(self, ref: weakref.ref[pa.Table]) -> None:
        """A table ``consolidate`` returned is gone: forget its entry (unless its id is
        another's already)."""
        for index, (held, _) in list(self._consolidated.items()):
            if held is ref:
                del self._consolidated[index]

    def close(self) -> None:
        self._con.close()


#: ``zset_arrow_schema`` of a payload schema without extra columns, by the schema's ``id``,
#: with a weak reference to it (an ``id`` reused after it died misses) and its fields as they
#: were (``StructType.add`` appends in place, a field's attributes can be set: then it misses)
_ZSET_SCHEMAS: dict[int, tuple[weakref.ref[StructType], tuple[Any, ...], pa.Schema]] = {}


def _fields_now(schema: StructType) -> tuple[Any, ...]:
    return tuple((id(f), f.name, id(f.dataType), f.nullable) for f in schema.fields)


def zset_arrow_schema(schema: StructType, extra: Sequence[StructField] = ()) -> pa.Schema:
    """The Arrow schema of a Z-set with payload ``schema`` (+ ``extra`` columns) and ``_weight``
    (remembered per ``schema`` object without ``extra``: every operator of every driver step
    asks for its own, and PySpark's conversion takes tens of microseconds a column)."""
    if not extra:
        seen = _ZSET_SCHEMAS.get(id(schema))
        if seen is not None and seen[0]() is schema and seen[1] == _fields_now(schema):
            return seen[2]
    arrow = spark_to_arrow_schema(StructType([*schema.fields, *extra,
                                              StructField(WEIGHT, LongType(), False)]))
    if not extra:
        key = id(schema)

        def forget(_: weakref.ref[StructType]) -> None:
            _ZSET_SCHEMAS.pop(key, None)

        _ZSET_SCHEMAS[key] = (weakref.ref(schema, forget), _fields_now(schema), arrow)
    return arrow


def conform(table: pa.Table, schema: StructType, extra: Sequence[StructField] = ()) -> pa.Table:
    """``table``'s payload (by name, in ``schema``'s order) and ``_weight``, cast to Spark's
    types (``table`` itself where it is that already)."""
    target = zset_arrow_schema(schema, extra)
    if table.schema.equals(target, check_metadata=True):
        return table
    columns = [column if column.type == f.type else column.cast(f.type)
               for f in target for column in (table.column(f.name),)]
    return pa.Table.from_arrays(columns, schema=target)


def negate(table: pa.Table) -> pa.Table:
    """The Z-set ``table`` with every weight negated."""
    i = table.schema.get_field_index(WEIGHT)
    return table.set_column(i, table.schema.field(i), pc.negate(table.column(i)))


def empty_zset(schema: StructType) -> pa.Table:
    """A Z-set with payload ``schema`` and no rows."""
    return zset_arrow_schema(schema).empty_table()
