"""Python rows to Arrow: the quick path for plain rows builds exactly the table the checked,
record-by-record path builds, and leaves every row it cannot vouch for to that path."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dbsp_pipeline.errors import InputError
from dbsp_pipeline.runtime import records
from dbsp_pipeline.zset import spark_to_arrow_schema

SCHEMA = StructType([
    StructField("i", IntegerType()),
    StructField("n", LongType(), nullable=False),
    StructField("x", DoubleType()),
    StructField("d", DecimalType(10, 2)),
    StructField("s", StringType()),
    StructField("b", BooleanType()),
    StructField("t", TimestampType()),
    StructField("day", DateType()),
    StructField("raw", BinaryType(), nullable=False),
])
ARROW = spark_to_arrow_schema(SCHEMA)


class Count(int):
    """An int subclass: a value the quick path leaves to the checked one."""


#: per column, values of its plain types, then values only the checked path may judge
PLAIN = {
    "i": [0, 7, -2**31, 2**31 - 1, None], "n": [0, 1, -2**63, 2**63 - 1],
    "x": [0.5, -1.0, 3, float("inf"), None], "d": [decimal.Decimal("1.25"), 12, None],
    "s": ["", "north", "é", None], "b": [True, False, None],
    "t": [dt.datetime(2026, 11, 29, 17, 0, 1, 5), None], "day": [dt.date(2026, 1, 1), None],
    "raw": [b"", b"\x00ab"],
}
ODD = [True, 1.5, "1", None, 2**40, 2**70, np.int64(3), Count(4), decimal.Decimal("1.005"),
       dt.datetime(2026, 1, 1), dt.date(2026, 1, 2), b"x", 10**9]


def _row(draw: st.DrawFn, odd: str | None) -> tuple[object, ...]:
    """A row whose column ``odd`` (if any) may hold any of ``ODD``."""
    return tuple(draw(st.sampled_from(PLAIN[f.name] + (ODD if f.name == odd else [])))
                 for f in SCHEMA.fields)


@st.composite
def batches(draw: st.DrawFn) -> list[object]:
    odd = draw(st.sampled_from([None, *SCHEMA.fieldNames()]))
    rows: list[object] = [_row(draw, odd) for _ in range(draw(st.integers(0, 6)))]
    shape = draw(st.sampled_from(["tuple", "list", "dict", "mixed", "lists and tuples",
                                  "short", "long", "extra key", "missing key"]))
    names = SCHEMA.fieldNames()
    if shape == "list":
        rows = [list(r) for r in rows]  # type: ignore[arg-type]
    elif shape in ("dict", "extra key", "missing key"):
        rows = [dict(zip(names, r)) for r in rows]  # type: ignore[arg-type]
    if rows and shape != "tuple":
        i = draw(st.integers(0, len(rows) - 1))
        row = rows[i]
        if shape == "mixed":
            rows[i] = dict(zip(names, row))  # type: ignore[arg-type]
        elif shape == "lists and tuples":
            rows[i] = list(row)  # type: ignore[arg-type]
        elif shape == "short":
            rows[i] = tuple(row)[:-1]  # type: ignore[arg-type]
        elif shape == "long":
            rows[i] = (*tuple(row), 1)  # type: ignore[arg-type]
        elif shape == "extra key":
            rows[i] = {**row, "other": 1}  # type: ignore[dict-item]
        elif shape == "missing key":
            rows[i] = {k: v for k, v in row.items() if k != "s"}  # type: ignore[union-attr]
    return rows


@settings(max_examples=400, deadline=None)
@given(batches())
def test_plain_rows_build_the_table_the_checked_path_builds(rows):
    quick = records._plain_rows(rows, SCHEMA.fieldNames(), ARROW)
    try:
        checked = records._checked_rows("t", rows, SCHEMA, ARROW)
    except InputError:
        assert quick is None  # the checked path names the bad record
        return
    if quick is not None:
        assert quick.equals(checked) and quick.schema == checked.schema


def test_a_batch_of_plain_tuples_or_dicts_takes_the_quick_path():
    rows = [tuple(PLAIN[f.name][k % len(PLAIN[f.name])] for f in SCHEMA.fields)
            for k in range(1000)]
    for batch in (rows, [dict(zip(SCHEMA.fieldNames(), r)) for r in rows]):
        quick = records._plain_rows(batch, SCHEMA.fieldNames(), ARROW)
        assert quick is not None and quick.num_rows == 1000
        assert quick.equals(records._checked_rows("t", batch, SCHEMA, ARROW))
    # one odd value anywhere sends the batch to the checked path, which names it: a bool in
    # a BIGINT column, a NULL in a NOT NULL column of a type whose values are not checked
    for row, column, value, problem in ((617, 1, True, "is bool"), (3, -1, None, "NOT NULL")):
        bad = list(rows)
        values = list(bad[row])
        values[column] = value
        bad[row] = tuple(values)
        assert records._plain_rows(bad, SCHEMA.fieldNames(), ARROW) is None
        with pytest.raises(InputError, match=problem) as e:
            records.to_arrow("orders", bad, SCHEMA, ARROW, 1)
        assert e.value.record_index == row and f"column '{SCHEMA.fieldNames()[column]}'" in str(
            e.value)
    table = records.to_arrow("orders", rows, SCHEMA, ARROW, -1)
    assert table.column("_weight").to_pylist() == [-1] * 1000
    assert pa.types.is_int64(table.schema.field("n").type)


@pytest.mark.parametrize("value, problem", [
    (decimal.Decimal("123456789.00"),
     "value 123456789.00 has 9 digits before the point; DECIMAL(10,2) holds 8"),
    (decimal.Decimal("1.005"), "value 1.005 has 3 digits after the point; DECIMAL(10,2) holds "
                               "2 (a value is never rounded)"),
    (123456789, "value 123456789 has 9 digits before the point"),
    (decimal.Decimal("NaN"), "value NaN is not a number a DECIMAL holds"),
])
def test_a_decimal_that_does_not_fit_says_which_digits(value, problem):
    schema = StructType([StructField("id", LongType()), StructField("m", DecimalType(10, 2))])
    with pytest.raises(InputError, match=r"record 1 .*column 'm': ") as info:
        records.to_arrow("pay", [(1, decimal.Decimal("1.50")), (2, value)], schema,
                         spark_to_arrow_schema(schema), 1)
    assert problem in str(info.value), str(info.value)
    fits = records.to_arrow("pay", [(1, decimal.Decimal("99999999.990")), (2, 7)], schema,
                            spark_to_arrow_schema(schema), 1)
    assert fits.column("m").to_pylist() == [decimal.Decimal("99999999.99"), decimal.Decimal(7)]


@pytest.mark.parametrize("column, spark_type, value, problem", [
    ("i", IntegerType(), 2**40, "value 1099511627776 is out of the range of INT "
                                "(-2147483648 to 2147483647)"),
    ("s", ShortType(), -40000, "value -40000 is out of the range of SMALLINT (-32768 to 32767)"),
    ("l", LongType(), 2**63, "value 9223372036854775808 is out of the range of BIGINT"),
])
def test_an_integer_out_of_its_columns_range_says_the_range(column, spark_type, value, problem):
    schema = StructType([StructField("id", LongType()), StructField(column, spark_type)])
    with pytest.raises(InputError, match=rf"record 1 .*column '{column}': ") as info:
        records.to_arrow("pay", [(1, 1), (2, value)], schema, spark_to_arrow_schema(schema), 1)
    assert problem in str(info.value), str(info.value)


def test_a_wide_decimal_is_judged_by_its_digits_not_rounded_first():
    """Values wider than decimal's default 28-digit context are judged by their digits."""
    schema = StructType([StructField("m", DecimalType(38, 12))])
    wide = decimal.Decimal("12345678901234567890.12345678900")  # 12 decimals, trailing zeros
    table = records.to_arrow("pay", [(wide,)], schema, spark_to_arrow_schema(schema), 1)
    assert table.column("m").to_pylist() == [wide]
    too_fine = decimal.Decimal("12345678901234567890.1234567890123")
    with pytest.raises(InputError, match=r"has 13 digits after the point; DECIMAL\(38,12\) "
                                         r"holds 12"):
        records.to_arrow("pay", [(too_fine,)], schema, spark_to_arrow_schema(schema), 1)


def test_an_arrow_column_of_another_kind_is_refused_as_a_python_value_is():
    """Text for a number and a number for a boolean are refused from Arrow as from Python
    (``push`` and ``push_zset`` check alike); a dictionary of text is text; a CSV record's text
    fields convert (``text_converts``, the Kafka CSV codec)."""
    schema = StructType([StructField("x", DoubleType()), StructField("b", BooleanType()),
                         StructField("t", StringType())])
    arrow = spark_to_arrow_schema(schema)

    def zset(**columns):
        return pa.table({**columns, "_weight": pa.array([1, 1], pa.int64())})

    with pytest.raises(InputError, match=r"record 0, column 'x': value '1' is string, "
                                         r"expected double"):
        records.zset_to_arrow("in", zset(x=["1", "2.5"], b=[True, False], t=["a", "b"]),
                              schema, spark_to_arrow_schema(schema).append(
                                  pa.field("_weight", pa.int64())))
    with pytest.raises(InputError, match=r"record 0, column 'b': value 5 is int64, expected "
                                         r"bool"):
        records.to_arrow("in", pa.table({"x": [1.0, 2.5], "b": [5, 0], "t": ["a", "b"]}),
                         schema, arrow, 1)
    fine = records.to_arrow("in", pa.table({"x": [1, 2], "b": [True, None],
                                            "t": pa.array(["a", "b"]).dictionary_encode()}),
                            schema, arrow, 1)
    assert fine.column("x").to_pylist() == [1.0, 2.0] and fine.column("t").to_pylist() == [
        "a", "b"]
    text = records.to_arrow("in", pa.table({"x": ["1", "2.5"], "b": ["true", "false"],
                                            "t": ["a", "b"]}), schema, arrow, 1,
                            text_converts=True)
    assert text.column("x").to_pylist() == [1.0, 2.5]


def test_money_pushed_from_arrow_or_pandas_is_refused_where_it_would_round():
    """A DECIMAL column takes what a push of Python values takes, from Arrow and pandas alike:
    floating-point values are refused, not rounded (Arrow's own cast makes 12.345 a 12.35);
    integers are taken (Arrow refuses an int64 column for a DECIMAL(10,2) whatever its values)
    where they fit, else the error says which digits; a pandas column pyarrow does not convert
    is judged as the Arrow column it is, naming the record."""
    import pandas as pd

    schema = StructType([StructField("d", DecimalType(10, 2)), StructField("t", TimestampType())])
    arrow = spark_to_arrow_schema(schema)
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    floats = r"value 12.345 is double, expected decimal128\(10, 2\) \(a floating-point value"
    with pytest.raises(InputError, match=r"record 0, column 'd': " + floats):
        records.to_arrow("pay", pa.table({"d": [12.345], "t": [when]}), schema, arrow, 1)
    with pytest.raises(InputError, match=r"record 1 \{'d': 12.5, .*\}, column 'd': value 12.5 "
                                         r"is double"):
        records.to_arrow("pay", pd.DataFrame({"d": [None, 12.5], "t": [when, when]}), schema,
                         arrow, 1)
    for ints in (pa.table({"d": [12, -5], "t": [when, when]}),
                 pd.DataFrame({"d": [12, -5], "t": [when, when]})):
        table = records.to_arrow("pay", ints, schema, arrow, 1)
        assert table.column("d").to_pylist() == [decimal.Decimal("12.00"),
                                                 decimal.Decimal("-5.00")]
    with pytest.raises(InputError, match=r"record 1, column 'd': value 1000000000 has 10 digits "
                                         r"before the point; DECIMAL\(10,2\) holds 8"):
        records.to_arrow("pay", pa.table({"d": [1, 10**9], "t": [when, when]}), schema, arrow,
                         1)
    with pytest.raises(InputError, match=r"record 0 .*, column 'd': value 1.234 has 3 digits "
                                         r"after the point"):
        records.to_arrow("pay", pd.DataFrame({"d": [decimal.Decimal("1.234")], "t": [when]}),
                         schema, arrow, 1)
    with pytest.raises(InputError, match=r"record 0 .*, column 't': value '2026-11-01 10:00'"):
        records.to_arrow("pay", pd.DataFrame({"d": [None], "t": ["2026-11-01 10:00"]}), schema,
                         arrow, 1)


@pytest.mark.parametrize("given, wanted, widens", [
    (IntegerType(), LongType(), True), (LongType(), ShortType(), True),  # ANSI: out of range
    (LongType(), DecimalType(10, 2), True), (IntegerType(), DoubleType(), True),  # raises
    (DecimalType(10, 2), DecimalType(12, 3), True), (DecimalType(15, 2), DoubleType(), True),
    (DecimalType(10, 3), DecimalType(12, 2), False), (DoubleType(), DecimalType(10, 2), False),
    (DoubleType(), LongType(), False), (DecimalType(10, 2), LongType(), False),
    (StringType(), LongType(), False), (DoubleType(), IntegerType(), False),
    (LongType(), DoubleType(), False), (DecimalType(38, 0), DoubleType(), False),  # 2**53 + 1
    (IntegerType(), FloatType(), False), (ShortType(), FloatType(), True),  # 16777217
])
def test_a_spark_frame_s_numbers_are_cast_only_where_no_value_rounds(given, wanted, widens):
    assert records._widens(given, wanted) is widens


def test_a_pandas_or_arrow_push_never_cuts_or_rounds_a_value():
    """An object column of floats and Decimals for an integer column, a decimal of 20 digits for
    a DOUBLE, a timestamp for a DATE: refused from pandas and Arrow alike, naming the record
    (pyarrow's own conversion to the type would cut 2.5 to 2, round the decimal, drop the time
    of day); the same columns holding whole values, 15-digit decimals and dates are taken."""
    import pandas as pd

    schema = StructType([StructField("q", IntegerType()), StructField("x", DoubleType()),
                         StructField("day", DateType())])
    arrow = spark_to_arrow_schema(schema)
    day = dt.date(2026, 1, 1)

    def frame(**changed):
        columns = {"q": [1, 2], "x": [1.5, 2.5], "day": [day, day], **changed}
        return pd.DataFrame({k: pd.Series(v, dtype=object) for k, v in columns.items()})

    for rows, problem in [
            (frame(q=[2, 2.5]), r"record 1 .*column 'q': value 2.5 .*does not convert"),
            (frame(q=[decimal.Decimal("7.9"), 1]), r"record 0 .*column 'q'"),
            (frame(x=[decimal.Decimal("12345678901234567891"), 1.0]),
             r"record 0 .*column 'x'"),
            (frame(day=[dt.datetime(2026, 1, 1, 10), day]), r"record 0 .*column 'day'")]:
        with pytest.raises(InputError, match=problem):
            records.to_arrow("in", rows, schema, arrow, 1)
    wide = pa.table({"q": [1, 2], "x": pa.array([decimal.Decimal(10**19)] * 2,
                                                 pa.decimal128(20, 0)), "day": [day, day]})
    with pytest.raises(InputError, match=r"record 0, column 'x': .*more than 15 digits"):
        records.to_arrow("in", wide, schema, arrow, 1)
    stamps = pa.table({"q": [1, 2], "x": [1.0, 2.0],
                       "day": pa.array([dt.datetime(2026, 1, 1)] * 2, pa.timestamp("us"))})
    with pytest.raises(InputError, match=r"record 0, column 'day': .*another kind"):
        records.to_arrow("in", stamps, schema, arrow, 1)
    fine = records.to_arrow("in", frame(q=[2.0, 3], x=[decimal.Decimal("1.25"), 2]), schema,
                            arrow, 1)
    assert fine.column("q").to_pylist() == [2, 3] and fine.column("x").to_pylist() == [1.25, 2.0]
