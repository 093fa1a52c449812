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


def test_exact_products_and_sums_keep_every_digit_and_raise_beyond_their_type(spark):
    """Where Spark's ``*`` rounds (a DECIMAL(38,18) times a BIGINT: DECIMAL(38,6)), the pyarrow
    product keeps all 18 digits; NULLs stay NULL; a product or sum past the type raises."""
    q = [Decimal("12345678901234567890.123456789012345678"), Decimal("-0.000000000000000001"),
         None, Decimal("1.5")]
    w = [-3, 7, 2, None]
    got = spark_decimal.exact_products(pa.array(q, pa.decimal128(38, 18)), pa.array(w))
    assert got.type == pa.decimal128(38, 18)
    assert got.to_pylist() == [Decimal("-37037036703703703670.370370367037037034"),
                               Decimal("-0.000000000000000007"), None, None]
    rounded = spark.sql("SELECT CAST('-0.000000000000000001' AS DECIMAL(38,18)) * "
                        "CAST(7 AS BIGINT) AS p").collect()[0]["p"]
    assert rounded == 0  # what Spark's own product gives
    big = pa.array([Decimal(10**19)], pa.decimal128(38, 18))
    with pytest.raises(ArithmeticError, match=r"DECIMAL\(38, 18\)"):
        spark_decimal.exact_products(big, pa.array([10]))
    sums = spark_decimal.exact_sums(got, pa.array([Decimal("0.000000000000000007"), None,
                                                   Decimal(1), None], pa.decimal128(38, 18)),
                                    38, 18)
    assert sums.to_pylist() == [Decimal("-37037036703703703670.370370367037037027"), None,
                                None, None]
    with pytest.raises(ArithmeticError, match="overflow"):
        spark_decimal.exact_sums(pa.array([Decimal("99.5")], pa.decimal128(10, 1)),
                                 pa.array([Decimal("0.5")], pa.decimal128(10, 1)), 3, 1)


def _random_sum(rng: random.Random, precision: int, scale: int) -> Decimal:
    digits = rng.choice([rng.randint(1, min(precision, 14)), rng.randint(1, precision)])
    unscaled = rng.randint(10 ** (digits - 1), 10 ** digits - 1) * rng.choice([1, -1])
    return Decimal(unscaled).scaleb(-scale)


def _sparks_avg(spark, total: Decimal, count: int, sum_type: tuple[int, int],
                avg_type: tuple[int, int]) -> Decimal | None:
    """What Spark 4's ``AVG`` evaluates for a group of sum ``total`` (of ``sum_type``) and
    ``count`` values: its own ``Average.evaluateExpression``, ``DecimalDivideWithOverflowCheck(
    sum, CAST(count AS DECIMAL(20, 0)), avg_type)``, built and evaluated in the JVM (a group of
    ``count`` rows would do the same, for counts up to 2**62 no DataFrame holds). NULL where
    Spark's ANSI mode raises."""
    jvm = spark._jvm
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    types = jvm.org.apache.spark.sql.types

    def literal(value: Decimal, precision: int, scale: int):
        return expressions.Literal.create(types.Decimal.apply(jvm.java.math.BigDecimal(
            str(value))), types.DecimalType(precision, scale))
    divide = expressions.DecimalDivideWithOverflowCheck(
        literal(total, *sum_type), literal(Decimal(count), 20, 0), types.DecimalType(*avg_type),
        None, True)  # null on overflow
    value = divide.eval(None)
    return None if value is None else Decimal(value.toString())


#: per column type DECIMAL(p, s), AVG's sum type DECIMAL(min(38, p + 10), s) and its result
#: type DECIMAL(min(38, p + 4), min(38, s + 4)) (``operators/aggregate.py``'s state and value)
@pytest.mark.parametrize("column", [(15, 2), (12, 4), (38, 0), (38, 18), (28, 4), (34, 2),
                                    (30, 10), (9, 6)])
def test_averages_equal_sparks_avg_to_the_last_digit(spark, column):
    p, s = column
    sum_type, avg_type = (min(38, p + 10), s), (min(38, p + 4), min(38, s + 4))
    rng = random.Random(hash(column) & 0xFFFF)
    rows = []
    for i in range(300):
        # every third: a quotient of 31 to 34 integer digits, where a rounding to 39
        # significant digits (not Spark's cut to 39 fractional ones) would differ
        sp, ss = sum_type
        total = (_random_sum(rng, sp, ss) if i % 3 or sp - ss < 36 else
                 Decimal(rng.randint(10 ** (sp - ss - 3), 10 ** (sp - ss) - 1)
                         * rng.choice([1, -1])))
        count = rng.choice([1, 2, 3, 6, 7, 9, 11, 13, 10 ** rng.randint(1, 18) + rng.randint(
            0, 99), rng.randint(1, 2 ** 62)])
        rows.append((total, count))
    if sum_type[0] - sum_type[1] >= 34:  # a rounding to 39 significant digits: ...4506
        rows += [(Decimal(6945922362052194395448761159546706), 91),
                 (Decimal(-6945922362052194395448761159546706), 91)]
    # ties: a quotient exactly half way at the last kept digit
    rows += [(Decimal(5).scaleb(-s), 10 ** k) for k in range(1, 9)]
    rows += [(Decimal(-5).scaleb(-s), 10 ** k) for k in range(1, 9)]
    checked = 0
    for total, count in rows:
        spark_avg = _sparks_avg(spark, total, count, sum_type, avg_type)
        try:
            mine = spark_decimal.average(total, count, avg_type)
        except ArithmeticError:
            assert spark_avg is None, (total, count, spark_avg)
            continue
        assert spark_avg == mine and mine.as_tuple().exponent == -avg_type[1], (
            total, count, spark_avg, mine)
        checked += 1
    assert checked > 150


def test_an_average_rounds_once_as_sparks_avg_does_not_through_the_quotient_type():
    """Spark's ``sum / count`` of a DECIMAL(38,18) sum has the quotient type DECIMAL(38,18), so
    ``CAST(sum / count AS DECIMAL(38,22))`` ends in ...0170000; ``AVG`` rounds the 39-digit
    quotient once, to 22 digits: ...0166667."""
    total = Decimal("4449111904239.864479335365005000")
    assert spark_decimal.average(total, 3, (38, 22)) == Decimal(
        "1483037301413.2881597784550016666667")


def test_an_average_cuts_the_quotient_before_it_rounds_as_spark_4_does():
    """Spark 4's ``Decimal./`` keeps 39 fractional digits, rounding down, then rounds half up
    to the average's scale: ...315.45054945... is ...315.4505 (a rounding to 39 significant
    digits first, as ``MathContext(39, HALF_UP)`` would, gives ...315.4506)."""
    total = Decimal(6945922362052194395448761159546706)
    assert (spark_decimal.average(total, 91, (38, 4))
            == Decimal("76328817165408729620316056698315.4505"))
    assert spark_decimal.average(total.copy_negate(), 91, (38, 4)) == Decimal(
        "-76328817165408729620316056698315.4505")


def test_averages_of_a_column_take_nulls_and_counts_of_none():
    totals = pa.chunked_array([pa.array([Decimal("1.00"), None], pa.decimal128(19, 6)),
                               pa.array([Decimal("-0.000005"), Decimal("7")],
                                        pa.decimal128(19, 6))])
    counts = pa.chunked_array([pa.array([3, 2]), pa.array([10, 0])])
    got = spark_decimal.averages(totals, counts, pa.decimal128(19, 6))
    assert got.type == pa.decimal128(19, 6)
    assert got.to_pylist() == [Decimal("0.333333"), None, Decimal("-0.000001"), None]
    empty = spark_decimal.averages(pa.array([], pa.decimal128(19, 6)), pa.array([], pa.int64()),
                                   pa.decimal128(19, 6))
    assert len(empty) == 0


@pytest.mark.parametrize("sum_type,avg_type", [((25, 2), (19, 6)), ((38, 18), (38, 22)),
                                               ((38, 0), (38, 4)), ((22, 4), (16, 8)),
                                               ((19, 6), (13, 10)), ((38, 4), (32, 8))])
def test_averages_of_a_column_equal_the_average_of_each_row(sum_type, avg_type):
    """The vectorized ``averages`` (int64 where the sum fits, Python's integers else) equals
    ``average`` row by row: small and wide sums, negative ones, exact ties, counts up to
    2**62, NULL sums and counts of 0, a sliced chunked column."""
    rng = random.Random(sum(sum_type + avg_type))
    p, s = sum_type
    rows: list[tuple[Decimal | None, int | None]] = []
    for i in range(3000):
        total = (_random_sum(rng, p, s) if i % 4 else
                 Decimal(rng.randint(-10**13, 10**13)).scaleb(-s))
        count = rng.choice([1, 2, 3, 7, 10, 40, 10 ** rng.randint(1, 18), rng.randint(1, 2**62)])
        rows.append((total, count))
    rows += [(Decimal(5).scaleb(-s) * k, 10 ** j) for k in (1, -1, 3) for j in range(1, 9)]
    rows += [(None, 3), (Decimal(1), 0), (Decimal(1), None), (Decimal(0), 5)]
    expected = []
    for total, count in rows:
        if total is None or count is None or count <= 0:
            expected.append(None)
            continue
        try:
            expected.append(spark_decimal.average(total, count, avg_type))
        except ArithmeticError:
            expected.append("overflow")
    keep = [i for i, e in enumerate(expected) if e != "overflow"]
    totals = pa.array([rows[i][0] for i in keep], pa.decimal128(*sum_type))
    counts = pa.array([rows[i][1] for i in keep], pa.int64())
    half = len(keep) // 2
    chunked = (pa.chunked_array([totals.slice(0, half), totals.slice(half)]),
               pa.chunked_array([counts.slice(0, half), counts.slice(half)]))
    for t, c in ((totals, counts), chunked, (totals.slice(5), counts.slice(5))):
        got = spark_decimal.averages(t, c, pa.decimal128(*avg_type))
        offset = 5 if len(t) == len(keep) - 5 else 0
        assert got.type == pa.decimal128(*avg_type)
        assert got.to_pylist() == [expected[i] for i in keep[offset:]]
    for i in [i for i, e in enumerate(expected) if e == "overflow"][:3]:
        with pytest.raises(ArithmeticError, match="does not fit"):
            spark_decimal.averages(pa.array([rows[i][0]], pa.decimal128(*sum_type)),
                                   pa.array([rows[i][1]], pa.int64()), pa.decimal128(*avg_type))


def test_unscaled_int64_reads_the_words_of_a_decimal_and_back():
    """The driver's aggregate sums decimals of up to 64 bits as int64: the unscaled values of
    a sliced, chunked decimal column with NULLs read exactly and build the same column back;
    a value past 64 bits reads as None; a value with more digits than the type builds None."""
    values = [Decimal("1.25"), None, Decimal("-3.50"), Decimal("-0.01"), Decimal("0.00"),
              Decimal("92233720368547758.07"), Decimal("-92233720368547758.08")]
    column = pa.chunked_array([pa.array(values[:3], pa.decimal128(20, 2)),
                               pa.array(values[3:], pa.decimal128(20, 2))]).slice(1)
    read = spark_decimal.unscaled_int64(column)
    assert read is not None
    unscaled, valid = read
    assert unscaled.tolist() == [0, -350, -1, 0, 2**63 - 1, -(2**63)]
    assert valid.tolist() == [False, True, True, True, True, True]
    back = spark_decimal.from_unscaled_int64(unscaled, valid, pa.decimal128(20, 2))
    assert back.to_pylist() == values[1:]
    assert spark_decimal.unscaled_int64(pa.array([Decimal(2**63)], pa.decimal128(38, 0))) \
        is None
    assert spark_decimal.unscaled_int64(pa.array([None, Decimal(-(2**63) - 1), None],
                                                 pa.decimal128(38, 0))) is None
    narrow = pa.decimal128(4, 2)
    assert spark_decimal.from_unscaled_int64(unscaled[1:3], valid[1:3], narrow).to_pylist() \
        == [Decimal("-3.50"), Decimal("-0.01")]
    assert spark_decimal.from_unscaled_int64(unscaled[1:3] * 100, valid[1:3], narrow) is None
