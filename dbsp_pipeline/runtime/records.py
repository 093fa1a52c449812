"""Turning what a user pushes into a checked Arrow table (or Spark DataFrame) of an input's schema.

Accepted: a list of dicts (keys = the input's columns, exactly), a list of tuples/lists (in column
order), a pandas DataFrame, a pyarrow Table, or a Spark DataFrame. Every problem is an
``InputError`` that names the input, the record (its index in the batch, and the record itself)
and the column; a rejected batch is not recorded at all, so nothing is half-accepted.
"""

from __future__ import annotations

import datetime as dt
import decimal
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame as SparkDataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NumericType,
    ShortType,
    StructType,
)

from dbsp_pipeline.errors import InputError
from dbsp_pipeline.zset import MAX_WEIGHT, WEIGHT, quote

#: what a weight must be, said in errors
WEIGHT_RULE = f"a non-zero integer of absolute value at most {MAX_WEIGHT} (2**31 - 1)"


def check_weight(input_name: str, weight: object) -> int:
    """A push's weight: a non-zero integer with ``abs(weight) <= MAX_WEIGHT``."""
    if isinstance(weight, bool) or not isinstance(weight, numbers.Integral) or int(weight) == 0 \
            or abs(int(weight)) > MAX_WEIGHT:
        raise InputError(input_name, f"weight must be {WEIGHT_RULE}, got {weight!r}")
    return int(weight)


def to_arrow(input_name: str, rows: Any, schema: StructType, arrow_schema: pa.Schema,
             weight: int, *, text_converts: bool = False) -> pa.Table:
    """Python rows, pandas or Arrow → an Arrow table of ``arrow_schema`` (payload + ``_weight``).
    ``text_converts``: an Arrow column of text may hold the values of a column of another type
    (a CSV record's fields, which Arrow then parses); else it is refused, as a Python string
    is for a number."""
    payload_schema = pa.schema([arrow_schema.field(f.name) for f in schema.fields])
    if isinstance(rows, pa.Table):
        table = _from_arrow(input_name, rows, payload_schema, text_converts)
    elif _is_pandas(rows):
        table = _from_pandas(input_name, rows, payload_schema)
    elif isinstance(rows, (list, tuple)):
        table = _from_python(input_name, list(rows), schema, payload_schema)
    else:
        raise InputError(input_name, "rows must be a list of dicts or tuples, a pandas or Spark "
                         f"DataFrame, or a pyarrow Table; got {type(rows).__name__}")
    weights = pa.array(np.full(table.num_rows, weight, np.int64))  # (a list: 26 ms a 1M rows)
    return table.append_column(pa.field(WEIGHT, pa.int64(), nullable=False), weights)


def zset_to_arrow(input_name: str, table: pa.Table, schema: StructType,
                  arrow_schema: pa.Schema) -> pa.Table:
    """An Arrow Z-set (the input's columns + ``_weight``, nonzero integers) → ``arrow_schema``."""
    if not isinstance(table, pa.Table) or WEIGHT not in table.column_names:
        raise InputError(input_name, f"a Z-set is a pyarrow Table with a '{WEIGHT}' column")
    weights = table.column(WEIGHT)
    if not pa.types.is_integer(weights.type):
        raise InputError(input_name, f"'{WEIGHT}' is {weights.type}, expected an integer type",
                         column=WEIGHT)
    if not _weights_valid(weights):
        magnitude = pc.abs(weights.cast(pa.float64(), safe=False))  # exact up to 2**53: enough
        invalid = pc.or_kleene(pc.equal(magnitude, 0),
                               pc.greater(magnitude, MAX_WEIGHT)).fill_null(True)
        bad = pc.index(invalid, True).as_py()
        raise InputError(input_name, f"weight must be {WEIGHT_RULE}, got "
                         f"{weights[bad].as_py()!r}", record_index=bad, column=WEIGHT,
                         record=table.slice(bad, 1).to_pylist()[0])
    weights = weights.cast(pa.int64())
    payload = _from_arrow(input_name, table.drop_columns([WEIGHT]), pa.schema(
        [arrow_schema.field(f.name) for f in schema.fields]))
    return payload.append_column(arrow_schema.field(WEIGHT), weights)


def _weights_valid(weights: pa.ChunkedArray) -> bool:
    """Whether every weight is a non-zero integer of magnitude at most ``MAX_WEIGHT`` (the
    common case, in two passes over the column and no copy)."""
    if weights.null_count or len(weights) == 0:
        return bool(weights.null_count == 0)
    bounds = pc.min_max(weights)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low < -MAX_WEIGHT or high > MAX_WEIGHT:
        return False
    return bool(low > 0 or high < 0 or not pc.any(pc.equal(weights, 0)).as_py())


def check_spark(input_name: str, df: SparkDataFrame, schema: StructType,
                weight: int) -> SparkDataFrame:
    """A pushed Spark DataFrame → columns and types of the input: a column of the input's type,
    or a number of a type that holds the input's values without rounding them (``_widens``;
    a narrower integer is cast, and Spark's ANSI cast raises on a value out of its range)."""
    given = {f.name: f.dataType for f in df.schema.fields}
    _check_names(input_name, list(given), schema.fieldNames())
    cols = []
    for f in schema.fields:
        t = given[f.name]
        if t != f.dataType and not _widens(t, f.dataType):
            rounds = isinstance(t, NumericType) and isinstance(f.dataType, NumericType)
            raise InputError(input_name, f"column is {t.simpleString()}, expected "
                             f"{f.dataType.simpleString()}"
                             + (" (a cast would round its values: cast it yourself)"
                                if rounds else ""), column=f.name)
        cols.append(F.col(quote(f.name)).cast(f.dataType).alias(f.name))
    return df.select(*cols, F.lit(weight).cast("long").alias(WEIGHT))


def _widens(given: DataType, wanted: DataType) -> bool:
    """Whether Spark's cast of a column of ``given`` to ``wanted`` keeps every value (its ANSI
    cast raises where a value is out of the type's range): integers to integers or decimals;
    to a DOUBLE the integers it holds exactly (INT and narrower; a BIGINT past 2**53 would be
    rounded), to a FLOAT those of up to 16 bits; a float to a double; a decimal to a decimal of
    as many fractional digits, or of at most 15 digits to a DOUBLE. Not a floating-point or
    decimal value to an integer, a double to a DECIMAL, nor a decimal to one of fewer
    fractional digits: those round."""
    integral = (ByteType, ShortType, IntegerType, LongType)
    if isinstance(given, integral):
        if isinstance(wanted, DoubleType):
            return not isinstance(given, LongType)
        if isinstance(wanted, FloatType):
            return isinstance(given, (ByteType, ShortType))
        return isinstance(wanted, (*integral, DecimalType))
    if isinstance(given, FloatType):
        return isinstance(wanted, DoubleType)
    if isinstance(given, DecimalType):
        if isinstance(wanted, DoubleType):
            return given.precision <= 15
        return isinstance(wanted, DecimalType) and wanted.scale >= given.scale
    return False


# -- python rows ---------------------------------------------------------------------------
def _from_python(input_name: str, rows: list[Any], schema: StructType,
                 arrow: pa.Schema) -> pa.Table:
    """``rows`` as a table of ``arrow``: at C speed where every row is a plain tuple, list or
    dict of the input's columns and every value of a column has one of its plain Python types
    (``_plain_rows``); else record by record, naming the first bad one (``_checked_rows``).
    Both accept and build exactly the same tables."""
    table = _plain_rows(rows, schema.fieldNames(), arrow)
    return table if table is not None else _checked_rows(input_name, rows, schema, arrow)


def _plain_types(t: pa.DataType) -> frozenset[type] | None:
    """The Python types whose every value ``_value_problem`` accepts in a column of ``t``,
    exactly (``type(v) is T``: no subclass, so no ``bool`` for an integer); None: it checks
    no type for ``t``."""
    if pa.types.is_integer(t):
        return frozenset({int})
    if pa.types.is_floating(t):
        return frozenset({float, int})
    if pa.types.is_decimal(t):
        return frozenset({decimal.Decimal, int})
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return frozenset({str})
    if pa.types.is_boolean(t):
        return frozenset({bool})
    if pa.types.is_timestamp(t):
        return frozenset({dt.datetime})
    if pa.types.is_date(t):
        return frozenset({dt.date})
    return None


def _plain_rows(rows: list[Any], names: list[str], arrow: pa.Schema) -> pa.Table | None:
    """The table of ``rows`` when they are plain (every row a ``tuple``/``list`` of
    ``len(names)`` values, or every row a ``dict`` with exactly ``names`` as keys; every value's
    type among its column's ``_plain_types``, NULL only where the column is nullable) and Arrow
    converts every column; None otherwise, for ``_checked_rows`` to find the problem (a value
    these checks pass, ``_value_problem`` passes too, and the conversion is the same call)."""
    row_types = set(map(type, rows))
    if row_types <= {tuple, list}:
        if set(map(len, rows)) - {len(names)}:
            return None
        columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in names]
    elif row_types == {dict}:
        keys = set(names)
        if not all(r.keys() == keys for r in rows):
            return None
        columns = [[r[n] for r in rows] for n in names]
    else:
        return None
    arrays = []
    for j, values in enumerate(columns):
        field = arrow.field(j)
        value_types = set(map(type, values))
        if type(None) in value_types:
            if not field.nullable:
                return None
            value_types.discard(type(None))
        plain = _plain_types(field.type)
        if plain is not None and not value_types <= plain:
            return None
        try:
            arrays.append(pa.array(values, field.type))
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            return None
    return pa.Table.from_arrays(arrays, schema=arrow)


def _checked_rows(input_name: str, rows: list[Any], schema: StructType,
                  arrow: pa.Schema) -> pa.Table:
    names = schema.fieldNames()
    columns: list[list[Any]] = [[] for _ in names]
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            keys = list(row.keys())
            unknown = [k for k in keys if k not in names]
            if unknown:
                raise InputError(input_name, f"unknown column(s) {unknown}; the input has "
                                 f"({', '.join(names)})", record_index=i, record=row)
            missing = [n for n in names if n not in row]
            if missing:
                raise InputError(input_name, f"missing column(s) {missing}", record_index=i,
                                 record=row)
            values = [row[n] for n in names]
        elif isinstance(row, Sequence) and not isinstance(row, (str, bytes)):
            if len(row) != len(names):
                raise InputError(input_name, f"has {len(row)} values, the input has "
                                 f"{len(names)} columns ({', '.join(names)})", record_index=i,
                                 record=row)
            values = list(row)
        else:
            raise InputError(input_name, f"a record must be a dict or a tuple, got "
                             f"{type(row).__name__}", record_index=i, record=row)
        for j, v in enumerate(values):
            field = arrow.field(j)
            problem = _value_problem(v, field)
            if problem:
                raise InputError(input_name, problem, record_index=i, column=names[j], record=row)
            columns[j].append(v)
    arrays = []
    for j, values in enumerate(columns):
        try:
            arrays.append(pa.array(values, arrow.field(j).type))
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
            bad = _first_bad(values, arrow.field(j).type)
            raise InputError(input_name, f"{e}", record_index=bad, column=names[j],
                             record=rows[bad] if bad is not None else None) from None
    return pa.Table.from_arrays(arrays, schema=arrow)


#: Spark's names of the integer types, by width
_INTEGER_NAMES = {8: "TINYINT", 16: "SMALLINT", 32: "INT", 64: "BIGINT"}


def _value_problem(v: object, field: pa.Field) -> str | None:
    t = field.type
    if v is None:
        return None if field.nullable else "is NULL but the column is NOT NULL"
    if pa.types.is_integer(t):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            return f"value {v!r} is {type(v).__name__}, expected a whole number ({t})"
        bits = t.bit_width - 1
        if not -(1 << bits) <= int(v) < (1 << bits):
            return (f"value {v} is out of the range of {_INTEGER_NAMES.get(t.bit_width, t)} "
                    f"({-(1 << bits)} to {(1 << bits) - 1})")
    elif pa.types.is_floating(t):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            return f"value {v!r} is {type(v).__name__}, expected a number ({t})"
    elif pa.types.is_decimal(t):
        if isinstance(v, bool) or not isinstance(v, (numbers.Integral, decimal.Decimal)):
            return f"value {v!r} is {type(v).__name__}, expected a decimal ({t})"
        return _decimal_problem(v if isinstance(v, decimal.Decimal) else decimal.Decimal(int(v)), t)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        if not isinstance(v, str):
            return f"value {v!r} is {type(v).__name__}, expected a string"
    elif pa.types.is_boolean(t):
        if not isinstance(v, bool):
            return f"value {v!r} is {type(v).__name__}, expected a boolean"
    elif pa.types.is_timestamp(t):
        if not isinstance(v, dt.datetime):
            return f"value {v!r} is {type(v).__name__}, expected a datetime"
    elif pa.types.is_date(t):
        if not isinstance(v, dt.date) or isinstance(v, dt.datetime):
            return f"value {v!r} is {type(v).__name__}, expected a date"
    return None


def _decimal_problem(v: decimal.Decimal, t: pa.Decimal128Type) -> str | None:
    """Why the decimal ``v`` does not fit ``t`` exactly (too many digits before the point, or
    after it: a value is never rounded), or None."""
    if not v.is_finite():
        return f"value {v} is not a number a DECIMAL holds"
    ddl = f"DECIMAL({t.precision},{t.scale})"
    # the digits as written, trailing zeros after the point left out (no arithmetic: a
    # context's precision would round a wide value)
    _, digits, exponent = v.as_tuple()
    kept = list(digits)
    power = int(exponent)
    while power < 0 and len(kept) > 1 and kept[-1] == 0:
        kept.pop()
        power += 1
    after = max(0, -power)
    if after > t.scale:
        return (f"value {v} has {after} digits after the point; {ddl} holds {t.scale} "
                "(a value is never rounded)")
    whole = max(0, len(kept) + power) if any(kept) else 0
    if whole > t.precision - t.scale:
        return (f"value {v} has {whole} digits before the point; {ddl} holds "
                f"{t.precision - t.scale}")
    return None


def _first_bad(values: list[Any], t: pa.DataType) -> int | None:
    for i, v in enumerate(values):
        try:
            pa.array([v], t)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            return i
    return None


# -- pandas / arrow ------------------------------------------------------------------------
def _is_pandas(obj: object) -> bool:
    return type(obj).__module__.startswith("pandas") and type(obj).__name__ == "DataFrame"


def _from_pandas(input_name: str, df: Any, arrow: pa.Schema) -> pa.Table:
    """A pandas DataFrame's columns as ``arrow``'s, each judged as the Arrow column pyarrow makes
    of it (``_column_as``: the conversions an Arrow push allows, none that changes a value; a
    float64 column for a DECIMAL or an INT is refused where a value would be rounded or cut),
    or, for a column of mixed objects pyarrow does not convert, value by value as a push of
    Python values is; the error names the record."""
    _check_names(input_name, [str(c) for c in df.columns], arrow.names)
    arrays = []
    for field in arrow:
        series = df[field.name]
        try:
            own = pa.Array.from_pandas(series)
        except (pa.ArrowException, TypeError, ValueError):
            own = None  # (mixed objects)
        try:
            arrays.append(_column_as(input_name, field, own) if own is not None
                          else _python_column(input_name, field, series.tolist()))
        except InputError as refused:
            i = refused.record_index
            raise InputError(input_name, refused.problem, column=field.name, record_index=i,
                             record=None if i is None else df.iloc[i].to_dict()) from None
    return _with_nullability(input_name, pa.Table.from_arrays(arrays, schema=arrow))


def _python_column(input_name: str, field: pa.Field, values: list[Any]) -> pa.Array:
    """A column of Python values as ``field``'s type, each value checked as a push of Python
    rows checks it (``_value_problem``)."""
    for i, v in enumerate(values):
        problem = _value_problem(v, field)
        if problem is not None:
            raise InputError(input_name, problem, column=field.name, record_index=i)
    return pa.array(values, type=field.type)


def _from_arrow(input_name: str, table: pa.Table, arrow: pa.Schema,
                text_converts: bool = False) -> pa.Table:
    """``table`` as the columns of ``arrow``: each column cast safely (no value changes), where
    the cast is one a push of Python values allows too (``_converts``)."""
    _check_names(input_name, table.column_names, arrow.names)
    table = table.select(arrow.names)
    columns = [_column_as(input_name, field, col, text_converts)
               for field, col in zip(arrow, table.columns)]
    return _with_nullability(input_name, pa.Table.from_arrays(columns, schema=arrow))


def _column_as(input_name: str, field: pa.Field, col: pa.ChunkedArray | pa.Array,
               text_converts: bool = False) -> pa.ChunkedArray | pa.Array:
    """The pushed column ``col`` as ``field``'s type, by a safe cast (no value changes) where
    the cast is one a push of Python values allows too (``_converts``); else ``InputError``
    naming the first record whose value does not convert."""
    if not _converts(col.type, field.type, text_converts) and len(col) - col.null_count:
        try:  # a value that would not convert anyway is the one to name
            _cast(col, field.type)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise _cast_error(input_name, field, col, e) from None
        bad = next(i for i, v in enumerate(col.to_pylist()) if v is not None)
        why = ("a floating-point value is not converted to a DECIMAL, which would round it: "
               "push Decimal values or a decimal column"
               if pa.types.is_decimal(field.type) and pa.types.is_floating(col.type) else
               "a DECIMAL of more than 15 digits is not converted to a floating-point number, "
               "which would round it" if pa.types.is_decimal(col.type) else
               "a column of another kind is not converted")
        raise InputError(input_name, f"value {col[bad].as_py()!r} is {col.type}, expected "
                         f"{field.type} ({why})", column=field.name, record_index=bad)
    try:
        return _cast(col, field.type)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise _cast_error(input_name, field, col, e) from None


def _cast(col: pa.ChunkedArray | pa.Array, to: pa.DataType) -> pa.ChunkedArray | pa.Array:
    """``col.cast(to, safe=True)``, but integers become a DECIMAL through ``DECIMAL(38, 0)``:
    Arrow refuses an int64 column for a DECIMAL(10, 2) whatever its values (its type could
    hold 19 digits), where a push of Python integers takes each that fits."""
    if pa.types.is_integer(col.type) and pa.types.is_decimal(to):
        col = col.cast(pa.decimal128(38, 0))
    return col.cast(to, safe=True)


def _converts(given: pa.DataType, wanted: pa.DataType, text_converts: bool) -> bool:
    """Whether an Arrow column of type ``given`` may become one of ``wanted`` by a safe cast
    (which still refuses a value that would change: a fraction of a float for an integer, a
    digit of a decimal, an integer past 2**53 for a double): not text to another type, nor a
    number to a boolean or back, nor a date to a timestamp or back, nor a floating-point number
    to a DECIMAL (Arrow's cast rounds 12.345 to 12.35, where its safe cast checks nothing),
    nor a DECIMAL of more than 15 digits to a DOUBLE (6 to a FLOAT) (rounded unchecked too),
    all of which a push of Python values refuses (``_value_problem``); text to anything with
    ``text_converts``. Other casts are Arrow's to judge."""
    if pa.types.is_dictionary(given):
        given = given.value_type
    if given == wanted or pa.types.is_null(given):
        return True
    if _is_text(given):
        return text_converts or _is_text(wanted)
    if pa.types.is_floating(given) and pa.types.is_decimal(wanted):
        return False  # a push of Python floats for a DECIMAL is refused: Arrow would round
    if pa.types.is_decimal(given) and pa.types.is_floating(wanted):
        return bool(given.precision <= (15 if pa.types.is_float64(wanted) else 6))
    if pa.types.is_temporal(given) and pa.types.is_temporal(wanted) \
            and pa.types.is_date(given) != pa.types.is_date(wanted):
        return False  # (a timestamp's time of day would go)
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
    return not ((pa.types.is_boolean(given) and any(k(wanted) for k in numeric))
                or (pa.types.is_boolean(wanted) and any(k(given) for k in numeric)))


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_string_view(t))


def _cast_error(input_name: str, field: pa.Field, col: pa.ChunkedArray | pa.Array,
                error: Exception) -> InputError:
    """The error for a column that does not convert: the first record whose value does not."""
    for i, value in enumerate(col.to_pylist()):
        try:
            _cast(pa.array([value], col.type), field.type)
        except (pa.ArrowException, TypeError, ValueError):
            why = None
            if pa.types.is_decimal(field.type) and isinstance(value, (int, decimal.Decimal)):
                why = _decimal_problem(decimal.Decimal(value), field.type)
            return InputError(input_name, why or f"value {value!r} ({col.type}) does not "
                              f"convert to {field.type}", column=field.name, record_index=i)
    return InputError(input_name, f"is {col.type}, which does not convert to {field.type}: "
                      f"{error}", column=field.name)


def _with_nullability(input_name: str, table: pa.Table) -> pa.Table:
    for field, col in zip(table.schema, table.columns):
        if not field.nullable and col.null_count:
            bad = next(i for i, v in enumerate(col.to_pylist()) if v is None)
            raise InputError(input_name, "is NULL but the column is NOT NULL", column=field.name,
                             record_index=bad)
    return table


def _check_names(input_name: str, given: list[str], names: list[str]) -> None:
    unknown = [c for c in given if c not in names]
    missing = [c for c in names if c not in given]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown column(s) {unknown}")
        if missing:
            parts.append(f"missing column(s) {missing}")
        raise InputError(input_name, "; ".join(parts) + f"; the input has ({', '.join(names)})")
