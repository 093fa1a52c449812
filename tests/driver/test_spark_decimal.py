"""Spark's decimal arithmetic on the driver (``driver/spark_decimal.py``) against Spark's own:
the result types of ``*``, ``+`` and ``/``, and averages to the last digit, at every magnitude
up to the 38-digit limit, with the quotient's roundings half up."""

from __future__ import annotations

import random
from decimal import Decimal

import pyarrow as pa
import pytest

from dbsp_pipeline.driver import spark_decimal

TYPES = [(38, 2), (25, 2), (19, 4), (15, 2), (12, 0), (30, 6), (17, 9), (38, 0), (22, 5)]


def test_result_types_are_sparks(spark):
    pairs = [((p, s), (q, t)) for p, s in TYPES for q, t in [(20, 0), (p, s), (12, 3)]]
    selects = []
    for (p, s), (q, t) in pairs:
        a, b = f"CAST(1 AS DECIMAL({p},{s}))", f"CAST(1 AS DECIMAL({q},{t}))"
        selects += [f"typeof({a} * {b})", f"typeof({a} + {b})", f"typeof({a} / {b})"]
    got = spark.sql("SELECT " + ", ".join(selects)).collect()[0]
    expected = []
    for (p, s), (q, t) in pairs:
        expected += [spark_decimal.multiply_type(p, s, q, t), spark_decimal.add_type(p, s, q, t),
                     spark_decimal.divide_type(p, s, q, t)]
    assert [str(g) for g in got] == [f"decimal({p},{s})" for p, s in expected]


def test_keeps_scale_where_a_weighted_sum_is_exact_integer_arithmetic():
    assert spark_decimal.keeps_scale(38, 2) and spark_decimal.keeps_scale(25, 6)
    assert spark_decimal.keeps_scale(17, 9)  # narrow: no adjustment at all
    assert not spark_decimal.keeps_scale(38, 10) and not spark_decimal.keeps_scale(30, 8)


def _random_sum(rng: random.Random, precision: int, scale: int) -> Decimal:
    digits = rng.choice([rng.randint(1, min(precision, 14)), rng.randint(1, precision)])
    unscaled = rng.randint(10 ** (digits - 1), 10 ** digits - 1) * rng.choice([1, -1])
    return Decimal(unscaled).scaleb(-scale)


@pytest.mark.parametrize("sum_type,avg_type", [((38, 2), (19, 6)), ((25, 2), (19, 6)),
                                               ((38, 0), (38, 4)), ((28, 1), (20, 5)),
                                               ((30, 6), (30, 10)), ((38, 4), (38, 8))])
def test_averages_equal_sparks_to_the_last_digit(spark, sum_type, avg_type):
    rng = random.Random(hash(sum_type + avg_type) & 0xFFFF)
    p, s = sum_type
    rows = []
    for _ in range(400):
        total = _random_sum(rng, p, s)
        count = rng.choice([1, 2, 3, 6, 7, 9, 11, 13, 10 ** rng.randint(1, 18) + rng.randint(
            0, 99), rng.randint(1, 2 ** 62)])
        rows.append((total, count))
    # ties: a quotient exactly half way at the last kept digit
    rows += [(Decimal(5).scaleb(-s), 10 ** k) for k in range(1, 9)]
    rows += [(Decimal(-5).scaleb(-s), 10 ** k) for k in range(1, 9)]
    frame = spark.createDataFrame(pa.table({
        "t": pa.array([t for t, _ in rows], pa.decimal128(p, s)),
        "c": pa.array([c for _, c in rows], pa.int64())}))
    frame.createOrReplaceTempView("avg_inputs")
    try:
        # (try_: a NULL where ANSI mode raises, as the aggregate's ``t / c`` would)
        got = spark.sql(f"SELECT try_cast(try_divide(t, c) AS DECIMAL{avg_type}) AS v "
                        f"FROM avg_inputs").collect()
    finally:
        spark.catalog.dropTempView("avg_inputs")
    checked = 0
    for (total, count), row in zip(rows, got):
        try:
            mine = spark_decimal.average(total, count, sum_type, avg_type)
        except ArithmeticError:
            assert row.v is None, (total, count, row)
            continue
        assert row.v == mine and mine.as_tuple().exponent == -avg_type[1], (total, count,
                                                                            row.v, mine)
        checked += 1
    assert checked > 250
