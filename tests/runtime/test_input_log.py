"""The input log: what a step reads of a push is what the push's file holds."""

from __future__ import annotations

import datetime
import decimal
import math

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.runtime import input_log
from dbsp_pipeline.runtime.input_log import InputLog
from dbsp_pipeline.spark_session import LazySession

SCHEMA = StructType([
    StructField("i", IntegerType()), StructField("b", LongType()), StructField("d", DoubleType()),
    StructField("s", StringType()), StructField("t", TimestampType()),
    StructField("n", TimestampNTZType()), StructField("day", DateType()),
    StructField("m", DecimalType(12, 2)), StructField("f", BooleanType()),
    StructField("raw", BinaryType())])


def rows(weights: list[int]) -> pa.Table:
    n = len(weights)
    when = datetime.datetime(2026, 11, 26, 9, 30, 1, 123456)
    return pa.table({
        "i": pa.array([7, None, -2**31, 2**31 - 1][:n], pa.int32()),
        "b": pa.array([2**63 - 1, 0, None, -1][:n], pa.int64()),
        "d": pa.array([math.nan, -0.0, None, 1e-310][:n], pa.float64()),
        "s": pa.array(["ü", "", None, "a\x00b"][:n], pa.string()),
        "t": pa.array([when, None, when, when][:n], pa.timestamp("us", tz="UTC")),
        "n": pa.array([when, when, None, when][:n], pa.timestamp("us")),
        "day": pa.array([when.date(), None, when.date(), when.date()][:n], pa.date32()),
        "m": pa.array([decimal.Decimal("1234567890.12"), None, decimal.Decimal("-0.01"),
                       decimal.Decimal("0")][:n], pa.decimal128(12, 2)),
        "f": pa.array([True, None, False, True][:n], pa.bool_()),
        "raw": pa.array([b"\xff\x00", None, b"", b"x"][:n], pa.binary()),
        "_weight": pa.array(weights, pa.int64()),
    })


def same_bits(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values, a double compared by its bits (NaN with NaN, -0.0 apart from
    0.0), which ``Table.equals`` does not."""
    def bits(t: pa.Table) -> pa.Table:
        return pa.table({f.name: (t.column(f.name).combine_chunks().view(pa.int64())
                                  if pa.types.is_floating(f.type) else t.column(f.name))
                         for f in t.schema})
    return a.schema == b.schema and bits(a).equals(bits(b))


def ordered(t: pa.Table) -> pa.Table:
    """A change's rows in one order (consolidation does not promise one)."""
    return t.sort_by([("_weight", "ascending"), ("i", "ascending")])


def test_a_step_reads_the_kept_rows_of_a_push_exactly_as_its_file(tmp_path, monkeypatch):
    """The rows a push keeps in memory equal its file's content bit for bit (NaN, negative
    zero, NULLs, time zones, decimals), so a step's change is the same whether it was pushed by
    this process (kept) or by another (read from the file); pushes beyond the memory bound are
    read from their files."""
    sql = LocalSQL()
    log = InputLog(LazySession(), str(tmp_path), "x", SCHEMA)  # never starts Spark
    assert log.append_arrow(rows([1, 1, 2, -1])) == 4
    [pushed] = log.table.files()
    kept = log._pushed.get(pushed.path)
    assert kept is not None
    from_file = log.table.read_arrow([pushed])
    assert same_bits(kept, from_file)
    other = InputLog(LazySession(), str(tmp_path), "x", SCHEMA)  # another process: no rows
    assert len(other._pushed) == 0
    assert same_bits(ordered(log.change_arrow(sql, [pushed])),
                     ordered(other.change_arrow(sql, [pushed])))

    monkeypatch.setattr(input_log, "PUSHED_ROWS_KEPT", 5)
    log.append_arrow(rows([1, 1, 1]))
    log.append_arrow(rows([3, 3, 3]))  # the oldest kept push goes: 3 + 3 rows > 5
    assert pushed.path not in log._pushed and len(log._pushed) == 1
    files = log.table.files()
    assert same_bits(ordered(log.change_arrow(sql, files)), ordered(other.change_arrow(sql, files)))
