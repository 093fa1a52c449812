"""``driver.arrow_expressions``: a predicate pyarrow evaluates keeps exactly Spark's rows, and a
projection it evaluates gives Spark's values; anything else is refused (None).

Checked on the edge rows of ``test_expressions`` (NULL, NaN, ±inf, -0.0, integers near the
limits, doubles past 2**53, non-ASCII strings), against Spark itself (one job for all
predicates) and against the DuckDB translation the driver used before.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from dbsp_pipeline.driver.arrow_expressions import arrow_predicate, arrow_projection
from dbsp_pipeline.driver.expressions import translate_predicate
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.operators.base import StepContext
from dbsp_pipeline.operators.linear import Filter, Select
from dbsp_pipeline.zset import WEIGHT
from tests.driver.test_expressions import (
    INF,
    NAN,
    PREDICATES,
    REFUSED,
    ROWS,
    SCHEMA,
    _arrow,
    _doubles_to_round,
    _norm,
    _query,
    _spark,
)

#: predicates pyarrow takes, beyond those of ``test_expressions.PREDICATES`` it takes: doubles
#: against integers and decimals, NaN and infinities against each other and literals, literals
#: on the left, BETWEEN of doubles, NOT of comparisons, IS [NOT] NULL of each column type
ARROW_PREDICATES = [
    # an IN list with a double compares every item as a double, as Spark does
    "l in (9007199254740992, 1e0)", "i in (3, 2.5e0, 7)",
    "d > 1.0", "d >= 1.0", "d < 1.0", "d <= 1.0", "d = 1.0", "d <> 1.0", "d != -1.5",
    "1.0 < d", "1.0 >= d", "-1.5 = d", "100 <= d", "d > i", "d < l", "l >= d", "i = d",
    "d = e", "d <> e", "d < e", "d <= e", "d > e", "d >= e", "e > 1e300", "-1e300 > e",
    "d BETWEEN -1 AND 1", "d NOT BETWEEN e AND 100.0", "i BETWEEN -7 AND 7",
    "NOT (d > 0)", "NOT d <= 0", "d > 0 OR e > 0", "d > 0 AND NOT b", "d IS NULL",
    "d IS NOT NULL", "s IS NULL", "b IS NOT NULL", "l IS NULL", "i > 3000000000",
    "l < -9223372036854775807", "l = 9007199254740993", "l > 9007199254740992.5e0",
    "s = ''", "s <> 'ß'", "'a' < s", "s2 <= s", "b = false", "b <> true", "i = 7 AND s = 'abc '",
    "dt = DATE '2024-02-29'", "dt <> CAST('1999-12-31' AS DATE)", "DATE '2000-01-01' <= dt",
    "dt > DATE '2024-01-31' - INTERVAL '1' MONTH", "dt IN (DATE '2000-01-01', DATE '1970-01-01')",
    "dt NOT IN (DATE '2000-01-01')", "s NOT IN ('a', 'ß')", "d IN (0.0, 1e308, -1.5)",
    f"d IN ({', '.join(f'{k}.0' for k in range(-5, 27))})",
    f"i NOT IN ({', '.join(map(str, range(32)))})",
    "d NOT IN (100, 5)", "i NOT IN (7, 3)", "l IN (5, -1)", "d > 0.06 - 0.01", "b IN (true)",
    # arithmetic of doubles (NaN and infinities propagate; an integer or a decimal literal
    # becomes the double Spark casts it to)
    "d * 2 > e", "-d < e", "d - e IN (0, 1.5)", "d * 2 BETWEEN e AND 3", "d + e IS NULL",
    "d + 9007199254740993 > l", "l - d = 0", "d * (1 - 0.25) >= i", "e - -1 <= d * -0.5",
    # IS [NOT] NULL of every type, pass-through ones included
    "ts IS NULL", "NOT tn IS NULL", "dec IS NOT NULL", "f IS NULL", "bin IS NOT NULL",
    "NOT (dt IS NULL)", "dec IS NULL AND ts IS NOT NULL",
    # timestamps with themselves; decimals of one scale, and with integer or decimal literals
    "ts < ts2", "ts = ts2", "ts <> ts2", "ts >= ts2", "ts2 > ts", "tn <= tn", "tn = tn",
    "dec > 1", "dec = 12.34", "dec < 1.5", "dec >= -99999999.99", "0 <> dec", "dec = dec",
    "dec <= -1", "dec > 9223372036854775807", "dec BETWEEN 0 AND 12.3",
    # CASE (and if) of predicates, of columns and literals; COALESCE
    "CASE WHEN i > 0 THEN b ELSE NOT b END", "coalesce(b, i > 0)", "coalesce(i, l) > 5",
    "CASE i WHEN 7 THEN d WHEN 0 THEN e END > 0", "CASE WHEN b THEN i ELSE l END >= 3",
    "coalesce(d, i, 0) < e", "CASE WHEN s = 'a' THEN s2 WHEN b THEN s END = 'b'",
    "if(b, ts, ts2) > ts", "coalesce(dec, dec) < 1", "CASE WHEN d > 0 THEN dec END = dec",
    "nvl(s, '') = ''", "CASE WHEN false THEN i END IS NULL", "CAST(i AS BIGINT) < l",
]


def _spark_kept(df, predicates: list[str]) -> list[list[int]]:
    """Per predicate, the ``rid`` of the rows Spark's ``WHERE`` keeps (one job)."""
    rows = df.select("rid", *[F.coalesce(F.expr(p), F.lit(False)).alias(f"p{k}")
                              for k, p in enumerate(predicates)]).collect()
    return [sorted(r["rid"] for r in rows if r[f"p{k}"]) for k in range(len(predicates))]


@pytest.fixture(scope="module")
def frames(spark):
    return spark.createDataFrame(ROWS, SCHEMA), _arrow(ROWS, SCHEMA)


def test_arrow_predicates_keep_spark_rows(frames):
    df, table = frames
    candidates = ARROW_PREDICATES + PREDICATES
    taken = [(p, f) for p in candidates if (f := arrow_predicate(p, SCHEMA)) is not None]
    assert [p for p in ARROW_PREDICATES if arrow_predicate(p, SCHEMA) is None] == []
    assert len(taken) > len(ARROW_PREDICATES) + 30  # most of the shared ones too
    want = _spark_kept(df, [p for p, _ in taken])
    for (p, f), spark_rows in zip(taken, want):
        got = sorted(table.filter(f(table)).column("rid").to_pylist())
        assert got == spark_rows, f"{p!r}: Spark keeps {spark_rows}, pyarrow {got}"
        sql = translate_predicate(p, SCHEMA)
        duck = [r[0] for r in _query(
            f'SELECT "rid" FROM t WHERE coalesce(({sql}), FALSE) ORDER BY "rid"', table)]
        assert got == duck, p


@pytest.mark.parametrize("pred", [
    # what pyarrow would compute otherwise than Spark, or not at all: integers against decimals
    # (Spark compares exactly), arithmetic (overflow), IN with a NULL or a non-literal item or
    # too many items, LIKE, functions, NULL-safe equality, a timestamp against a date or a
    # string, decimals against doubles, integer columns, literals past their scale, pass-through
    # types in comparisons, CASE branches Spark widens otherwise, a predicate of no column
    "i = 7.0", "i <= 2.5", "l > 9007199254740992.5", "i + 1 > 5", "-i > 5", "i / 7 > 0.5",
    "i not in (1, NULL)", "l in (9007199254740992.0, 5)", "i IN (j, 1)",
    f"i IN ({', '.join(map(str, range(33)))})", "s LIKE 'a%'", "length(s) > 2", "d <=> e",
    "s2 IS DISTINCT FROM s", "ts < dt", "ts >= '2024-06-01'", "tn = tn + INTERVAL 1 DAY",
    "dec > d", "dec = i", "dec < 1.234", "dec IN (1, 2)", "f > 1", "i = NULL",
    "coalesce(dec, 1) > 0", "CASE WHEN b THEN dec ELSE 1.5 END > 0", "coalesce(i, 1.5) > 0",
    "coalesce(f, 0) > 0", "CASE WHEN b THEN i END = NULL", "coalesce(NULL, NULL) IS NULL",
    "NULL AND b", "NOT NULL", "1 = 1", "1 IN (1, 2)", "DATE '2000-01-01' < DATE '2001-01-01'",
    "true", "i", "dt", "CASE WHEN true THEN 1 END = 1",
    "dec = CAST(3000000000 AS INT)",  # (Spark's ANSI CAST raises)
])
def test_refused_predicates(pred):
    assert arrow_predicate(pred, SCHEMA) is None


@pytest.mark.parametrize("expr", REFUSED)
def test_what_expressions_refuses_arrow_refuses(expr):
    assert arrow_predicate(expr, SCHEMA) is None
    assert arrow_projection([expr], SCHEMA, ["o"]) is None


#: projections pyarrow takes: bare columns of any type, literals, arithmetic of doubles (with
#: integers and decimal literals as Spark casts them), comparisons
ARROW_PROJECTIONS = [
    "i", "`S`", "d AS x", "(l) y", "dec", "f", "bin", "ts", "1", "-2147483648", "3000000000",
    "'x'", "true", "1e3", "-1e-3", "d * 2", "d + e", "d - e", "-d", "-(d)", "d * 1.5", "i + d",
    "l + d", "d - l", "i * 0.5e0", "d * (1 - 0.25)", "d * 1.1 * 1.1", "d * (1 - e)",
    "(d + 1) * (e - 2)", "l - d * d", "2.5 - d", "-d * e", "1 - d", "d > 1.0", "d * 2 >= e",
    "s = 'a'", "i IS NULL", "d - -1", "d * -0.5", "d * -0.0", "1 = 1", "d * 2 IS NULL",
    # IS NULL of any type, timestamp and decimal comparisons
    "ts IS NULL", "dec IS NOT NULL", "NOT bin IS NULL", "tn IS NULL", "ts < ts2", "dec > 1",
    # CASE / if / COALESCE of columns and literals, as the SQL compiler writes them
    "CASE WHEN false THEN dec END", "CASE WHEN false THEN ts END", "CASE WHEN false THEN s END",
    "1 AS row_marker", "CAST(0 AS BIGINT)", "CAST(i AS BIGINT)", "CAST(l AS DOUBLE)", "1L",
    "CASE WHEN i > 0 THEN 'pos' WHEN i < 0 THEN 'neg' ELSE 'zero' END",
    "CASE i WHEN 7 THEN d WHEN 0 THEN e END", "CASE WHEN b THEN i ELSE l END",
    "CASE WHEN b THEN i ELSE d END", "CASE WHEN b THEN NULL ELSE s END",
    "CASE WHEN d > 0 THEN d END", "CASE WHEN d > e THEN dec WHEN b THEN NULL ELSE dec END",
    "CASE WHEN s IS NULL THEN dt ELSE DATE '2000-01-01' END", "if(b, ts, ts2)", "if(b, 1, 0)",
    "CASE WHEN b THEN 1 ELSE 3000000000 END", "CASE WHEN b THEN d ELSE 0.5 END",
    "CASE WHEN dec IS NULL THEN i ELSE 0 END", "CASE WHEN b THEN tn END",
    "coalesce(i, j, 0)", "coalesce(s, s2, 'none')", "coalesce(d, i)", "nvl(b, false)",
    "ifnull(l, j)", "coalesce(NULL, s)", "coalesce(dec, dec)", "coalesce(ts, ts2)",
    "coalesce(dt, DATE '1970-01-01')", "coalesce(e, 1e0, l)", "coalesce(d, -0.5)",
]


def test_arrow_projections_match_spark(frames):
    """Through ``Select`` as a driver step runs it (no query; floats canonical, Spark's output
    types), each projection gives Spark's values on the edge rows."""
    df, table = frames
    exprs = ["rid", *ARROW_PROJECTIONS]
    assert [e for e in exprs if arrow_projection([e], SCHEMA, ["o"]) is None] == []
    spark_frame = df.select(*[F.expr(e).alias(f"c{k}") for k, e in enumerate(exprs)])
    want = sorted(spark_frame.toArrow().to_pylist(), key=lambda r: r["c0"])
    d = table.append_column(WEIGHT, pa.array([1] * table.num_rows, pa.int64()))
    got = Select(exprs, SCHEMA, spark_frame.schema).step_local(
        StepContext(None, 0, sql=_NoQueries()), [d])
    assert [f.name for f in got.schema][:-1] == spark_frame.schema.fieldNames()
    assert got.schema.remove(got.schema.get_field_index(WEIGHT)) == spark_frame.toArrow().schema
    rows = sorted(got.drop_columns([WEIGHT]).to_pylist(), key=lambda r: r["c0"])
    for k, e in enumerate(exprs):
        column = f"c{k}"
        assert [_norm(r[column]) for r in rows] == [_norm(r[column]) for r in want], e


@pytest.mark.parametrize("expr", [
    # integer arithmetic (ANSI Spark raises on overflow), division, literals alone, floats,
    # decimals (Spark's decimal types), NULL, CASE/COALESCE of types Spark widens otherwise
    # (or of no type), CASTs of doubles to integers, round of decimals, floats, integers to a
    # negative scale, bround, a scale not a literal or out of range
    "i + 1", "-i", "i * j", "l - 1", "d / 2", "i / 7", "1e0 * 2e0", "f * 2", "f + d",
    "dec * d", "100.00", "d + NULL", "abs(d)", "d * dec", "CASE WHEN b THEN NULL END",
    "CASE WHEN b THEN dec ELSE 1 END", "coalesce(dec, 1.5)", "coalesce(1.5, 2.5)",
    "CASE WHEN b THEN 1.5 ELSE 2 END", "coalesce(f, 1)", "coalesce(bin, bin)",
    "CASE WHEN b THEN f END", "coalesce(ts, dt)", "CAST(d AS BIGINT)", "CAST(s AS INT)",
    "CAST(dec AS DOUBLE)", "round(dec, 1)", "round(f, 1)", "round(l, -1)", "bround(d, 1)",
    "round(d, i)", "round(d, 16)", "round(1.5e0, 1)",
])
def test_refused_projections(expr):
    assert arrow_projection([expr], SCHEMA, ["o"]) is None


def test_projection_of_bare_columns():
    picked = arrow_projection(["i", "`S`", "d AS x", "(l) y", "dec", "f"], SCHEMA,
                              ["i", "S", "x", "y", "dec", "f"])
    assert picked is not None
    table = _arrow(ROWS, SCHEMA)
    for column, name in zip(picked, ["i", "s", "d", "l", "dec", "f"], strict=True):
        assert ([_norm(v) for v in column(table).to_pylist()]
                == [_norm(v) for v in table.column(name).to_pylist()]), name
    assert arrow_projection(["i", "i + 1"], SCHEMA, ["i", "o"]) is None
    assert arrow_projection(["i"], SCHEMA, ["i", "j"]) is None


def test_decimals_of_one_scale_and_literals_compare_as_spark(spark):
    """Decimals of one scale and different precisions, up to 38 digits, against each other and
    against integer and decimal literals at their limits; other scales refused."""
    from decimal import Decimal

    schema = StructType([StructField("rid", IntegerType()), StructField("a", DecimalType(12, 2)),
                         StructField("b", DecimalType(38, 2)),
                         StructField("c", DecimalType(38, 18))])
    big = Decimal("9" * 36 + ".99")
    rows = [(0, None, None, None), (1, Decimal("0.00"), Decimal("-0.00"), Decimal(0)),
            (2, Decimal("9999999999.99"), big, Decimal("1.000000000000000001")),
            (3, Decimal("-9999999999.99"), Decimal(f"-{big}"),
             Decimal("-99999999999999999999.999999999999")),
            (4, Decimal("1.50"), Decimal("1.50"), Decimal("0.000000000000000001")),
            (5, Decimal("-0.01"), None, Decimal("1"))]
    predicates = ["a < b", "a = b", "b >= a", "a <> b", "a > 9999999999.98", "b < -1",
                  "b > 9223372036854775807", "b < 1.5", "c > 1", "c = 0.5", "c < 0.000000000000001",
                  "c <= -9223372036854775808", "coalesce(a, a) = 1.5", "a IS NULL OR b > a"]
    table = _arrow(rows, schema)
    want = _spark_kept(spark.createDataFrame(rows, schema), predicates)
    for p, spark_rows in zip(predicates, want, strict=True):
        f = arrow_predicate(p, schema)
        assert f is not None, p
        assert sorted(table.filter(f(table)).column("rid").to_pylist()) == spark_rows, p
    for p in ["a = c", "b < c", "c > 1.0000000000000000001", "a = 1e0", "coalesce(a, b) > 0"]:
        assert arrow_predicate(p, schema) is None, p


def test_round_of_a_double_is_sparks_bit_for_bit(spark):
    """``round`` of a double (the formula of ``expressions._rounded``) gives Spark's bits (-0.0
    against 0.0 included) over ties and their neighbours at scales -2 to 6, NaN, infinities and
    NULL passing; past the formula's bound it raises, as the DuckDB translation does."""
    import math
    import random
    import struct

    values = _doubles_to_round(random.Random(5), 1500) + [NAN, INF, -INF, None]
    schema = StructType([StructField("rid", IntegerType()), StructField("x", DoubleType())])
    rows = list(enumerate(values))
    exprs = ["round(x)", "round(x * 3)", *[f"round(x, {scale})" for scale in (1, 2, 3, 6, -1, -2)]]
    columns = [arrow_projection([e], schema, ["o"]) for e in exprs]
    want = _spark(spark.createDataFrame(rows, schema), exprs)
    table = _arrow(rows, schema)

    def bits(v):
        return v if v is None else struct.pack("<d", v) if not math.isnan(v) else "NaN"

    for k, (e, column) in enumerate(zip(exprs, columns, strict=True)):
        assert column is not None, e
        got = column[0](table).to_pylist()
        diffs = [(values[w[0]], w[k + 1], g) for w, g in zip(want, got, strict=True)
                 if bits(w[k + 1]) != bits(g)]
        assert diffs == [], f"{e}: (x, Spark, pyarrow) {diffs[:5]}"
    large = arrow_projection(["round(x, 2)"], schema, ["o"])
    assert large is not None
    with pytest.raises(pa.ArrowInvalid):
        large[0](_arrow([(0, 1e14)], schema))


class _NoQueries:
    """A driver SQL engine that fails any query: the operator must not need one."""

    def query(self, *args, **kwargs):
        raise AssertionError("a DuckDB query ran")

    def consolidated_subset(self, subset, table):
        pass


def test_filter_and_select_run_without_a_query():
    schema = StructType([StructField("k", IntegerType()), StructField("amount", DoubleType()),
                         StructField("name", StringType())])
    d = pa.table({"k": pa.array([1, 2, 3, None], pa.int32()),
                  "amount": [5.0, float("nan"), -0.0, 20.0], "name": ["a", "b", None, "d"],
                  WEIGHT: pa.array([1, -1, 2, 1], pa.int64())})
    ctx = StepContext(None, 0, sql=_NoQueries())
    kept = Filter("amount > 10 OR k = 1", schema).step_local(ctx, [d])
    assert kept.column("k").to_pylist() == [1, 2, None]  # NaN is above 10, as in Spark
    assert kept.column(WEIGHT).to_pylist() == [1, -1, 1]
    out_schema = StructType([StructField("n", StringType()), StructField("v", DoubleType())])
    picked = Select(["name AS n", "amount v"], schema, out_schema).step_local(ctx, [d])
    assert picked.column_names == ["n", "v", WEIGHT]
    assert picked.column("v").to_pylist()[2] == 0.0  # -0.0 made 0.0, as on every path
    assert str(picked.column("v").to_pylist()[2]) == "0.0"


def test_a_filter_of_a_consolidated_change_is_not_consolidated_again():
    schema = StructType([StructField("k", IntegerType()), StructField("amount", DoubleType())])
    sql = LocalSQL(1)
    d = sql.consolidate(pa.table({"k": pa.array([1, 2, 2, 3], pa.int32()),
                                  "amount": [5.0, 20.0, 20.0, 30.0],
                                  WEIGHT: pa.array([1, 1, 1, -1], pa.int64())}), ["k", "amount"])
    kept = Filter("amount > 10", schema).step_local(StepContext(None, 0, sql=sql), [d])
    assert sorted(kept.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 2, "amount": 20.0, WEIGHT: 2}, {"k": 3, "amount": 30.0, WEIGHT: -1}]
    assert sql.consolidate(kept, ["k", "amount"]) is kept
    sql.close()
