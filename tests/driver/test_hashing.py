"""The driver-side xxhash64 / shard equal Spark's, bit for bit (Spark is the oracle)."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dbsp_pipeline.driver.hashing import shard_arrow, spark_hash_int, supports, xxhash64_arrow
from dbsp_pipeline.zset import shard_of

UTC = dt.UTC
LONG_ASCII = "the quick brown fox jumps over the lazy dog, twice over!"   # > 32 bytes
LONG_UTF8 = "größere Zeichenketten — 日本語のテキスト — 🎉🎉 " * 3  # > 64 bytes

# Values per column (cycled to the longest list). Every list contains a NULL.
COLUMNS: dict[str, tuple[T.DataType, list]] = {
    "b": (T.BooleanType(), [True, False, None]),
    "i8": (T.ByteType(), [0, 1, -1, -128, 127, None]),
    "i16": (T.ShortType(), [0, 1, -1, -32768, 32767, None]),
    "i32": (T.IntegerType(), [0, 1, -1, -2**31, 2**31 - 1, 123456789, None]),
    "i64": (T.LongType(), [0, 1, -1, -2**63, 2**63 - 1, 2**32, -2**31 - 1, None]),
    "f32": (T.FloatType(), [0.0, -0.0, math.nan, math.inf, -math.inf, 1.5, -2.25,
                            1e-45, 3.4028234663852886e38, None]),
    "f64": (T.DoubleType(), [0.0, -0.0, math.nan, math.inf, -math.inf, 1.5, -1e-300,
                             5e-324, 1.7976931348623157e308, 0.1, None]),
    "dec_small": (T.DecimalType(5, 2), [Decimal("0.00"), Decimal("-1.50"), Decimal("999.99"),
                                        Decimal("-999.99"), None]),
    "dec18": (T.DecimalType(18, 0), [Decimal(0), Decimal(10**18 - 1), Decimal(-(10**18 - 1)),
                                     Decimal(-1), None]),
    "dec19": (T.DecimalType(19, 0), [Decimal(0), Decimal(1), Decimal(-1), Decimal(127),
                                     Decimal(128), Decimal(-128), Decimal(-129), Decimal(255),
                                     Decimal(-256), Decimal(10**19 - 1), None]),
    "dec38": (T.DecimalType(38, 6), [Decimal("0"), Decimal("-0.000001"), Decimal("0.000001"),
                                     Decimal("12345678901234567890123456789012.123456"),
                                     Decimal("-12345678901234567890123456789012.123456"),
                                     Decimal("99999999999999999999999999999999.999999"),
                                     Decimal("-99999999999999999999999999999999.999999"),
                                     Decimal("-1.5"), None]),
    "s": (T.StringType(), ["", "a", "é", "日本語", "🎉", "x" * 31, "y" * 32, "z" * 33,
                           "w" * 64, LONG_ASCII, LONG_UTF8, "nul\x00byte", None]),
    "bin": (T.BinaryType(), [b"", b"\x00", b"\xff" * 7, bytes(range(256)), None]),
    "date": (T.DateType(), [dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(1, 1, 1),
                            dt.date(9999, 12, 31), dt.date(2024, 2, 29), None]),
    "ts": (T.TimestampType(), [dt.datetime(1970, 1, 1, tzinfo=UTC),
                               dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                               dt.datetime(1900, 1, 1, 12, 0, 0, 1, tzinfo=UTC),
                               dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC),
                               dt.datetime(2024, 6, 30, 8, 7, 6, 543210, tzinfo=UTC), None]),
    "ts_ntz": (T.TimestampNTZType(), [dt.datetime(1970, 1, 1),
                                      dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                                      dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59),
                                      dt.datetime(2024, 6, 30, 8, 7, 6, 543210), None]),
}
NAMES = list(COLUMNS)
N_ROWS = max(len(v) for _, v in COLUMNS.values()) + 3

# Multi-column keys: NULLs land in the middle of these for several rows.
_rng = random.Random(7)
COMBOS = [
    ["i64", "s"], ["s", "i64"], ["i32", "f64", "s"], ["b", "dec38", "date"],
    ["ts", "bin", "dec18", "f32"], ["dec19", "ts_ntz", "i8", "i16"], ["n", "i64", "n", "s"],
    NAMES,
] + [_rng.sample(NAMES, k) for k in (2, 3, 3, 5, 7)]


def _cycled(values: list, i: int):
    return values[i % len(values)]


@pytest.fixture(scope="module")
def oracle(spark):
    """Every column, plus Spark's xxhash64 and shard of every column and every combo."""
    schema = T.StructType([T.StructField(c, t, True) for c, (t, _) in COLUMNS.items()])
    rows = [tuple(_cycled(v, i + k) for k, (_, v) in enumerate(COLUMNS.values()))
            for i in range(N_ROWS)]
    df = spark.createDataFrame(rows, schema).withColumn("n", F.lit(None))   # NullType column
    keys = [[c] for c in [*NAMES, "n"]] + COMBOS
    exprs = []
    for j, key in enumerate(keys):
        exprs.append(F.xxhash64(*[F.col(c) for c in key]).alias(f"_h{j}"))
        exprs.append(shard_of(key).alias(f"_s{j}"))
    table = df.select("*", *exprs).toArrow()
    return table, keys


def _check(table: pa.Table, keys: list[list[str]]) -> None:
    for j, key in enumerate(keys):
        expected = table.column(f"_h{j}").to_numpy()
        got = xxhash64_arrow(table, key)
        assert got.dtype == np.int64
        assert got.tolist() == expected.tolist(), key
        shards = shard_arrow(table, key)
        assert shards.type == pa.int32()
        assert shards.to_pylist() == table.column(f"_s{j}").to_pylist(), key


def test_types_match_what_spark_hands_us(oracle):
    table, _ = oracle
    types = {f.name: f.type for f in table.schema}
    assert types["dec19"] == pa.decimal128(19, 0) and types["dec18"] == pa.decimal128(18, 0)
    assert pa.types.is_timestamp(types["ts"]) and types["ts"].tz is not None
    assert types["ts_ntz"] == pa.timestamp("us") and types["date"] == pa.date32()
    assert types["f32"] == pa.float32() and types["i8"] == pa.int8()


def test_single_and_multi_column_hashes_equal_spark(oracle):
    table, keys = oracle
    _check(table, keys)


def test_sliced_and_chunked_input(oracle):
    """Arrow offsets (slices) and several chunks give the same answers."""
    table, keys = oracle
    _check(table.slice(3), keys)
    _check(table.slice(1, N_ROWS - 4), keys)
    chunked = pa.Table.from_batches(table.slice(0, 5).to_batches() + table.slice(5).to_batches())
    assert chunked.column(0).num_chunks >= 2
    _check(chunked, keys)


def test_empty_and_edge_inputs(oracle):
    table, keys = oracle
    empty = table.slice(0, 0)
    for key in keys:
        assert xxhash64_arrow(empty, key).shape == (0,)
        assert len(shard_arrow(empty, key)) == 0
    assert shard_arrow(table, []).to_pylist() == [0] * N_ROWS
    assert shard_arrow(table, []).type == pa.int32()
    all_null = pa.table({"x": pa.array([None, None], pa.int64()), "y": pa.array([None, None])})
    assert xxhash64_arrow(all_null, ["x", "y"]).tolist() == [42, 42]
    with pytest.raises(TypeError):
        xxhash64_arrow(pa.table({"l": pa.array([[1]])}), ["l"])
    with pytest.raises(KeyError):
        xxhash64_arrow(table, ["no_such_column"])


def test_nan_payloads_hash_like_canonical_nan():
    """Spark uses floatToIntBits / doubleToLongBits: every NaN hashes as the canonical NaN."""
    d = np.array([0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000001],
                 dtype=np.uint64).view(np.float64)
    f = np.array([0x7FC00000, 0xFFC00001, 0x7F800001], dtype=np.uint32).view(np.float32)
    t = pa.table({"d": d, "f": f})
    for c in ("d", "f"):
        assert len(set(xxhash64_arrow(t, [c]).tolist())) == 1


def test_string_types_agree(oracle):
    """large_string / string_view / dictionary / large_binary hash like string / binary."""
    table, _ = oracle
    s, b = table.column("s"), table.column("bin")
    alt = pa.table({"s": s, "ls": s.cast(pa.large_string()), "vs": s.cast(pa.string_view()),
                    "ds": s.dictionary_encode(), "b": b, "lb": b.cast(pa.large_binary())})
    for c in ("ls", "vs", "ds"):
        assert xxhash64_arrow(alt, [c]).tolist() == xxhash64_arrow(alt, ["s"]).tolist(), c
    assert xxhash64_arrow(alt, ["lb"]).tolist() == xxhash64_arrow(alt, ["b"]).tolist()


def test_supports():
    for t, _ in COLUMNS.values():
        assert supports(t), t
    assert supports(T.DecimalType(38, 0)) and supports(T.NullType())
    for t in (T.ArrayType(T.LongType()), T.MapType(T.StringType(), T.LongType()),
              T.StructType([T.StructField("a", T.LongType())]), T.CalendarIntervalType(),
              T.DayTimeIntervalType(), T.VariantType(), T.StringType("UTF8_LCASE")):
        assert not supports(t), t


_ROW = st.tuples(
    st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
    st.one_of(st.none(), st.text(max_size=40)),
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
)


@settings(max_examples=10, deadline=None)
@given(rows=st.lists(_ROW, max_size=25))
def test_random_rows_match_spark(spark, rows):
    df = spark.createDataFrame(rows, "l long, s string, d double")
    keys = [list(k) for r in (1, 2, 3) for k in itertools.permutations(["l", "s", "d"], r)]
    exprs = []
    for j, key in enumerate(keys):
        exprs.append(F.xxhash64(*key).alias(f"_h{j}"))
        exprs.append(shard_of(key).alias(f"_s{j}"))
    _check(df.select("*", *exprs).toArrow(), keys)


def test_spark_hash_int_equals_sparks_hash(spark):
    """What Spark's hash partitioning puts a row by: ``hash()`` of an INT."""
    values = [0, 1, -1, 2, 7, 1023, 2**31 - 1, -(2**31), *random.Random(3).sample(
        range(-(2**31), 2**31), 200)]
    df = spark.createDataFrame([(v,) for v in values], "v INT")
    got = {r["v"]: r["h"] for r in df.select("v", F.hash("v").alias("h")).collect()}
    assert {v: spark_hash_int(v) for v in values} == got


def test_repeated_text_values_hash_as_spark_hashes_them(spark):
    """A big change whose text key has few distinct values (a region) is hashed once per
    distinct (value, running hash) pair; the hashes still equal Spark's, with NULLs, after a
    column of few values (running hashes repeat) and after a unique one (they do not: each
    row is hashed), sliced, and for a text column of many distinct values."""
    rng = random.Random(11)
    regions = ["ASIA", "EUROPE", "AFRICA", "AMERICA", "MIDDLE EAST", "", LONG_UTF8, None]
    rows = [(i, rng.randrange(3), rng.choice(regions), f"customer-{rng.randrange(20_000)}")
            for i in range(9_000)]
    df = spark.createDataFrame(rows, "i long, few int, region string, name string")
    keys = [["region"], ["few", "region"], ["region", "few"], ["i", "region"], ["name"],
            ["region", "name"]]
    exprs = []
    for j, key in enumerate(keys):
        exprs.append(F.xxhash64(*key).alias(f"_h{j}"))
        exprs.append(shard_of(key).alias(f"_s{j}"))
    table = df.select("*", *exprs).orderBy("i").toArrow()
    _check(table, keys)
    _check(table.slice(1_234, 6_000), keys)
    large = table.set_column(table.schema.get_field_index("region"), "region",
                             table.column("region").cast(pa.large_string()))
    _check(large, keys)
