"""Record formats: a changed row is one record whatever its weight, and an envelope's
``weight`` is read back within the input weight range; DECIMAL, DATE and TIMESTAMP values are
read exactly (or refused with the column and the problem) and written back the same."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from pyspark.sql.types import (
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from dbsp_pipeline.connectors.codec import Batch, DecodeError, decode, encode_change
from dbsp_pipeline.driver.sql import zset_arrow_schema

COLUMNS = ["k", "v"]


@pytest.mark.parametrize("weight", [1, -1, 7, -(2**62)])
def test_a_changed_row_is_one_record_and_reads_back(weight):
    record = encode_change({"k": 1, "v": "x"}, weight)
    kind = "insert" if weight > 0 else "delete"
    assert json.loads(record) == ({kind: {"k": 1, "v": "x"}} if abs(weight) == 1 else
                                  {kind: {"k": 1, "v": "x"}, "weight": abs(weight)})
    if abs(weight) < 2**31:
        assert decode(record, COLUMNS) == ({"k": 1, "v": "x"}, weight)


@pytest.mark.parametrize("copies", [0, -2, 2**31, 1.5, True, "3"])
def test_an_envelope_weight_out_of_range_is_a_clear_problem(copies):
    value = json.dumps({"insert": {"k": 1, "v": "x"}, "weight": copies}).encode()
    with pytest.raises(DecodeError, match="'weight' must be an integer from 1 to 2147483647"):
        decode(value, COLUMNS)


def test_a_column_named_weight_is_a_plain_row():
    assert decode(b'{"k": 1, "weight": 5}', ["k", "weight"]) == ({"k": 1, "weight": 5}, 1)
    assert decode(b'{"insert": {"k": 1, "weight": 5}}', ["k", "weight"]) == (
        {"k": 1, "weight": 5}, 1)


@pytest.mark.parametrize("line, problem", [
    (b"1,x," + str(2**70).encode(), "weight field must be a non-zero integer of absolute value"),
    (b"1,x,0", "weight field must be a non-zero integer"),
])
def test_csv_weights_are_range_checked(line, problem):
    with pytest.raises(DecodeError, match=problem):
        decode(line, COLUMNS, "csv")


# -- DECIMAL, DATE and TIMESTAMP values ----------------------------------------------------
TYPED = StructType([StructField("id", LongType()), StructField("amount", DecimalType(10, 2)),
                    StructField("day", DateType()), StructField("at", TimestampType()),
                    StructField("local", TimestampNTZType()), StructField("x", DoubleType())])
UTC = dt.UTC


def typed_batch(fmt: str, *records: bytes) -> tuple[list[dict], list[tuple]]:
    batch = Batch("t", TYPED.fieldNames(), fmt)
    for i, r in enumerate(records):
        batch.add(i, r)
    table = batch.to_zset(TYPED, zset_arrow_schema(TYPED))
    return table.drop_columns(["_weight"]).to_pylist(), batch.bad


def test_decimals_dates_and_timestamps_are_read_exactly_from_json_and_csv():
    rows, bad = typed_batch(
        "json",
        b'{"id": 1, "amount": 12.34, "day": "2024-01-31", "at": "2024-01-31T10:00:00", '
        b'"local": "2024-01-31 10:00:00", "x": 0.1}',
        b'{"id": 2, "amount": "0.10", "day": "2024-02-29", '
        b'"at": "2024-01-31 10:00:00.123456+02:00", "local": null, "x": 3}',
        b'{"id": 3, "amount": 99999999.99, "day": null, "at": "2024-01-31T10:00:00Z", '
        b'"local": null, "x": 1e-7}')
    assert bad == []
    assert rows == [
        {"id": 1, "amount": Decimal("12.34"), "day": dt.date(2024, 1, 31),
         "at": dt.datetime(2024, 1, 31, 10, tzinfo=UTC), "local": dt.datetime(2024, 1, 31, 10),
         "x": 0.1},
        {"id": 2, "amount": Decimal("0.10"), "day": dt.date(2024, 2, 29),
         "at": dt.datetime(2024, 1, 31, 8, 0, 0, 123456, tzinfo=UTC), "local": None, "x": 3.0},
        {"id": 3, "amount": Decimal("99999999.99"), "day": None,
         "at": dt.datetime(2024, 1, 31, 10, tzinfo=UTC), "local": None, "x": 1e-7}]
    csv_rows, bad = typed_batch("csv", b"1,12.34,2024-01-31,2024-01-31T10:00:00,"
                                       b"2024-01-31 10:00:00,0.1",
                                b"4,,,,,")
    assert bad == [] and csv_rows[0] == rows[0]
    assert csv_rows[1] == {c: (4 if c == "id" else None) for c in TYPED.fieldNames()}


@pytest.mark.parametrize("fmt, record, problem", [
    ("json", b'{"id": 1, "amount": 1.005, "day": null, "at": null, "local": null, "x": 1}',
     "column 'amount': value 1.005 has 3 digits after the point; the column decimal(10,2) "
     "holds 2 (it is not rounded)"),
    ("csv", b"1,1.005,,,,", "column 'amount': value 1.005 has 3 digits after the point"),
    ("json", b'{"id": 1, "amount": 123456789, "day": null, "at": null, "local": null, "x": 1}',
     "column 'amount': value 123456789 does not fit decimal(10,2)"),
    ("json", b'{"id": 1, "amount": "NaN", "day": null, "at": null, "local": null, "x": 1}',
     "column 'amount': value 'NaN' is not a finite decimal number"),
    ("json", b'{"id": 1, "amount": "1,5", "day": null, "at": null, "local": null, "x": 1}',
     "column 'amount': value '1,5' is not a decimal number"),
    ("json", b'{"id": 1, "amount": null, "day": "2024-02-30", "at": null, "local": null, '
             b'"x": 1}', "column 'day': value '2024-02-30' is not a date (YYYY-MM-DD)"),
    ("csv", b"1,,31/01/2024,,,", "column 'day': value '31/01/2024' is not a date"),
    ("json", b'{"id": 1, "amount": null, "day": null, "at": "yesterday", "local": null, '
             b'"x": 1}', "column 'at': value 'yesterday' is not an ISO 8601 timestamp"),
    ("json", b'{"id": 1, "amount": null, "day": null, "at": 1700000000, "local": null, '
             b'"x": 1}', "column 'at': value 1700000000 is int, expected a datetime"),
    ("json", b'{"id": 1, "amount": null, "day": null, "at": null, '
             b'"local": "2024-01-31T10:00:00Z", "x": 1}',
     "column 'local': value '2024-01-31T10:00:00Z' has a time zone offset"),
    ("json", b'{"id": 1.0, "amount": null, "day": null, "at": null, "local": null, "x": 1}',
     "column 'id': value 1.0 is float, expected a whole number"),
])
def test_a_value_that_is_not_of_its_columns_type_is_a_clear_problem(fmt, record, problem):
    good = (b'{"id": 9, "amount": 1, "day": null, "at": null, "local": null, "x": 1}'
            if fmt == "json" else b"9,1,,,,1")
    rows, bad = typed_batch(fmt, good, record)
    assert [r["id"] for r in rows] == [9]  # the good record is kept
    assert len(bad) == 1 and bad[0][0] == 1 and bad[0][1].startswith(problem), bad


def test_a_typed_change_is_written_exactly_and_reads_back():
    row = {"id": 1, "amount": Decimal("12.30"), "day": dt.date(2024, 1, 31),
           "at": dt.datetime(2024, 1, 31, 8, 0, 0, 5, tzinfo=UTC),
           "local": dt.datetime(2024, 1, 31, 10), "x": 0.1}
    record = encode_change(row, -2)
    assert json.loads(record) == {"delete": {
        "id": 1, "amount": "12.30", "day": "2024-01-31", "at": "2024-01-31T08:00:00.000005+00:00",
        "local": "2024-01-31T10:00:00", "x": 0.1}, "weight": 2}
    rows, bad = typed_batch("json", record)
    assert bad == [] and rows == [row]


def test_wide_decimals_and_timestamps_at_the_range_ends_are_read_or_refused_cleanly():
    schema = StructType([StructField("big", DecimalType(38, 0)),
                         StructField("fine", DecimalType(38, 10)),
                         StructField("at", TimestampType())])
    batch = Batch("t", schema.fieldNames())
    batch.add(0, b'{"big": 99999999999999999999999999999999999999, "fine": 1.5, "at": null}')
    batch.add(1, b'{"big": 1, "fine": 1234567890123456789012.12345678901, "at": null}')
    batch.add(2, b'{"big": 1, "fine": 1, "at": "0001-01-01T00:00:00+01:00"}')
    rows = batch.to_zset(schema, zset_arrow_schema(schema)).to_pylist()
    assert [r["big"] for r in rows] == [Decimal("99999999999999999999999999999999999999")]
    assert [(i, p.split(":")[0]) for i, p in batch.bad] == [(1, "column 'fine'"),
                                                            (2, "column 'at'")]
    assert "11 digits after the point" in batch.bad[0][1]
    assert "out of the timestamp range" in batch.bad[1][1]
    assert json.loads(encode_change({"v": Decimal("0E-8")}, 1)) == {
        "insert": {"v": "0.00000000"}}
