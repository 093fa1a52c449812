"""Spark's decimal arithmetic, reproduced on the driver where an aggregate's sum or average of
decimals needs it (``operators/aggregate.py``), so that a circuit summing money kept as
``DECIMAL(p, s)`` runs its small steps on the driver, with Spark's results to the last digit.
Its typing rules (``add_type``, ``multiply_type``, ``divide_type``) also type the decimal
arithmetic ``driver/expressions.py`` translates to DuckDB, and its exact pyarrow sums
(``exact_products``, ``exact_sums``) run inside the aggregate's Spark path as Arrow UDFs.

What the aggregate's Spark path computes (``Aggregate.step``), and so what the driver must:

* a change's partial sum ``sum(CAST(x AS sum_type) * CAST(weight AS BIGINT))`` cast to
  ``sum_type``, and the new state ``old + partial`` cast to ``sum_type``. Spark types a
  ``DECIMAL(p, s) * BIGINT`` product as ``DECIMAL(p + 21, s)`` and a sum of two as
  ``DECIMAL(p + 1, s)``, and where that exceeds 38 digits it gives up fractional digits
  (``adjust_precision_scale``, ``spark.sql.decimalOperations.allowPrecisionLoss``, on by
  default): a product or sum rounded to fewer digits than ``s``. Where it keeps ``s``
  (``keeps_scale``: ``s`` at most 6, or a narrow ``sum_type``) every step is exact integer
  arithmetic on the unscaled values, as Spark's ``SUM`` from scratch is, and as DuckDB's
  decimals on the driver are. Where it would not (a ``DECIMAL(38, 18)`` column, say), the
  Spark path multiplies and adds in pyarrow instead (``exact_products``, ``exact_sums``, as
  Arrow UDFs), exactly, so both paths and a ``SUM`` from scratch agree to the last digit.
* an average as Spark's ``AVG`` evaluates it (``average``): the sum (kept in ``AVG``'s sum
  type ``DECIMAL(min(38, p + 10), s)``) divided by the count, cut (rounded down) to 39
  fractional digits (Spark 4's ``Decimal./``: ``BigDecimal.divide(that, MAX_SCALE + 1,
  DOWN)``), then rounded half up to the average's type, once. Both paths compute it with
  ``averages`` (on Spark, as an Arrow UDF): Spark's own ``sum / count`` would round to the
  quotient type's scale first (``divide_type``), which may be fewer digits than the
  average's.

Overflow: Spark (ANSI mode, its default) raises where a value leaves its type; so does the
driver, where it checks: the partial sum and the new state against the state's type at each
step (DuckDB's decimal arithmetic and casts raise), the average in ``averages``
(``ArithmeticError``), not with Spark's message. (Spark's aggregation buffer also raises for a
step's running sum past 38 digits that comes back in range by the step's end; DuckDB sums in
128 bits and does not.) ``tests/driver/test_spark_decimal.py`` compares these functions with
Spark's own arithmetic.
"""

from __future__ import annotations

import decimal
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Spark's ``DecimalType.MAX_PRECISION`` and ``MINIMUM_ADJUSTED_SCALE``
MAX_PRECISION = 38
MINIMUM_ADJUSTED_SCALE = 6
#: the fractional digits Spark's ``Decimal./`` keeps (``DecimalType.MAX_SCALE + 1``), rounding
#: down
DIVISION_SCALE = MAX_PRECISION + 1
#: exact, for rescaling to a scale (``quantize`` keeps every digit it is asked for)
_WIDE_CONTEXT = decimal.Context(prec=200, rounding=ROUND_HALF_UP, Emin=-999999, Emax=999999)
#: the ``DECIMAL`` a ``BIGINT`` is taken as in decimal arithmetic (``DecimalType.LongDecimal``)
LONG_DECIMAL = (20, 0)


def adjust_precision_scale(precision: int, scale: int) -> tuple[int, int]:
    """Spark's ``DecimalType.adjustPrecisionScale`` (for a scale of 0 or more): a type wider
    than 38 digits keeps its integer digits and gives up fractional ones, down to at least
    ``min(scale, 6)``."""
    if precision <= MAX_PRECISION:
        return precision, scale
    int_digits = precision - scale
    return MAX_PRECISION, max(MAX_PRECISION - int_digits, min(scale, MINIMUM_ADJUSTED_SCALE))


def multiply_type(p1: int, s1: int, p2: int, s2: int) -> tuple[int, int]:
    """The type of ``DECIMAL(p1, s1) * DECIMAL(p2, s2)`` in Spark."""
    return adjust_precision_scale(p1 + p2 + 1, s1 + s2)


def add_type(p1: int, s1: int, p2: int, s2: int) -> tuple[int, int]:
    """The type of ``DECIMAL(p1, s1) + DECIMAL(p2, s2)`` in Spark."""
    scale = max(s1, s2)
    return adjust_precision_scale(max(p1 - s1, p2 - s2) + scale + 1, scale)


def divide_type(p1: int, s1: int, p2: int, s2: int) -> tuple[int, int]:
    """The type of ``DECIMAL(p1, s1) / DECIMAL(p2, s2)`` in Spark."""
    scale = max(MINIMUM_ADJUSTED_SCALE, s1 + p2 + 1)
    return adjust_precision_scale(p1 - s1 + s2 + scale, scale)


def keeps_scale(precision: int, scale: int) -> bool:
    """Whether a sum of type ``DECIMAL(precision, scale)`` times a ``BIGINT`` weight, and the
    sum of two such, keep the scale in Spark: then the aggregate's decimal arithmetic is exact
    on the unscaled integers, as DuckDB's is."""
    return (multiply_type(precision, scale, *LONG_DECIMAL)[1] == scale
            and add_type(precision, scale, precision, scale)[1] == scale)


def _fits(value: Decimal, precision: int, scale: int) -> bool:
    """Whether ``value`` (already at ``scale``) has at most ``precision`` digits."""
    return value.copy_abs() < Decimal(10) ** (precision - scale)  # (abs() would round)


def _rounded(value: Decimal, scale: int) -> Decimal:
    """``value`` rounded half up to ``scale`` fractional digits (Spark's ``changePrecision``)."""
    return value.quantize(Decimal(1).scaleb(-scale), context=_WIDE_CONTEXT)


def average(total: Decimal, count: int, avg_type: tuple[int, int]) -> Decimal:
    """Spark 4's ``AVG`` of a group whose sum is ``total`` and whose count of values is the
    positive ``count``: ``Average``'s ``DecimalDivideWithOverflowCheck(sum, CAST(count AS
    DECIMAL(20, 0)), avg_type)``, which divides with ``Decimal./`` (the exact quotient cut,
    rounding down, to 39 fractional digits) and rounds that once, half up, to the average's
    scale (no quotient type in between, as a ``CAST(sum / count AS avg_type)`` would have).
    ``ArithmeticError`` where the average leaves ``avg_type`` (Spark's ANSI mode raises)."""
    # the exact quotient cut to DIVISION_SCALE digits (integers: no rounding but the cut)
    scaled = int(total.scaleb(DIVISION_SCALE, context=_WIDE_CONTEXT))  # exact: total has
    cut = abs(scaled) // count                                         # at most 38 digits
    value = _rounded(Decimal(-cut if scaled < 0 else cut).scaleb(
        -DIVISION_SCALE, context=_WIDE_CONTEXT), avg_type[1])
    if not _fits(value, *avg_type):
        raise ArithmeticError(f"the average {value} of {total} / {count} does not fit "
                              f"DECIMAL{avg_type}")
    return value.copy_abs() if not value else value  # (a decimal has no -0)


def averages(totals: pa.Array | pa.ChunkedArray, counts: pa.Array | pa.ChunkedArray,
             avg_type: pa.Decimal128Type) -> pa.Array:
    """Per row, ``average`` of a decimal sum (``totals``, NULL for none) and its count (NULL
    where the count is NULL or not positive, or the sum NULL), as ``avg_type``; an average
    that leaves ``avg_type`` is ``ArithmeticError`` (naming one such average).

    On the unscaled integers, without a ``Decimal``: a half-up rounding of the exact quotient
    to ``S`` digits (``average``'s cut to 39 digits first never changes it: for ``S < 39``,
    ``floor((floor(a) + h) / D) == floor((a + h) / D)``) is ``(|T| * 10**(S + 1 - s) + 5 * c)
    // (10 * c)`` for a sum ``T`` of scale ``s <= S``, with ``T``'s sign: in numpy's int64
    where that fits (sums up to about 9e13 units a row: money), in Python's integers else."""
    totals, counts = _one_chunk(totals), _one_chunk(counts).cast(pa.int64())
    t_type = totals.type
    if not pa.types.is_decimal128(t_type) or t_type.scale > avg_type.scale:
        out_type = (avg_type.precision, avg_type.scale)  # (not a sum's and average's types)
        return pa.array([None if t is None or c is None or c <= 0 else average(t, c, out_type)
                         for t, c in zip(totals.to_pylist(), counts.to_pylist())], avg_type)
    n = len(totals)
    shift = 10 ** (avg_type.scale + 1 - t_type.scale)  # at most 10**39
    count = counts.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    valid = (count > 0) & totals.is_valid().to_numpy(zero_copy_only=False)
    words = np.frombuffer(totals.buffers()[1], dtype=np.int64,
                          count=2 * (totals.offset + n))[2 * totals.offset:].reshape(n, 2)
    low, high = words[:, 0], words[:, 1]
    largest = np.iinfo(np.int64).max
    # the unscaled sum fits 64 bits (not -2**63, whose magnitude does not), 10 * count does
    small = valid & (high == (low >> 63)) & (low != -largest - 1) & (count <= largest // 10)
    magnitude = np.abs(np.where(small, low, 0))
    # ... and so does |T| * shift + 5 * count: those rows are computed here
    fast = (small & (magnitude <= (largest - 5 * np.where(small, count, 0)) // shift)
            if shift <= 10 ** 18 else np.zeros(n, dtype=bool))
    magnitude, fast_count = np.where(fast, magnitude, 0), np.where(fast, count, 1)
    result = (magnitude * np.int64(shift if shift <= 10 ** 18 else 1) + 5 * fast_count) \
        // (10 * fast_count)
    result = np.where(fast, np.where(low < 0, -result, result), 0)
    out = np.zeros((n, 2), dtype=np.int64)
    out[:, 0], out[:, 1] = result, result >> 63
    limit = 10 ** avg_type.precision
    if avg_type.precision <= 18 and np.any(fast & (np.abs(result) >= limit)):
        row = int(np.argmax(fast & (np.abs(result) >= limit)))
        _overflow(int(result[row]), int(count[row]), avg_type)
    for row in np.flatnonzero(valid & ~fast):  # wide sums, one at a time
        unscaled = (int(high[row]) << 64) | (int(low[row]) & ((1 << 64) - 1))
        c = int(count[row])
        value = (abs(unscaled) * shift + 5 * c) // (10 * c)
        value = -value if unscaled < 0 else value
        if abs(value) >= limit:
            _overflow(value, c, avg_type)
        low_word = value & ((1 << 64) - 1)  # two's complement, as two 64-bit words
        out[row, 0] = low_word - (1 << 64) if low_word >> 63 else low_word
        out[row, 1] = value >> 64
    validity = pa.array(valid).buffers()[1] if not valid.all() else None
    return pa.Array.from_buffers(avg_type, n, [validity, pa.py_buffer(out.tobytes())],
                                 null_count=int(n - valid.sum()))


def _one_chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _overflow(unscaled: int, count: int, avg_type: pa.Decimal128Type) -> None:
    value = Decimal(unscaled).scaleb(-avg_type.scale, context=_WIDE_CONTEXT)
    raise ArithmeticError(f"the average {value} of {count} values does not fit "
                          f"DECIMAL({avg_type.precision}, {avg_type.scale})")


def exact_products(values: pa.Array, weights: pa.Array) -> pa.Array:
    """Per row, ``value * weight`` exactly, as a ``DECIMAL(38, s)`` of the values' scale ``s``
    (NULL where either is): Spark's product would be rounded to 6 fractional digits where
    ``keeps_scale`` fails. ``ArithmeticError`` where a product leaves 38 digits (Spark's
    ANSI mode raises for a product beyond its type too)."""
    t = values.type
    wide = pc.multiply(values.cast(pa.decimal256(t.precision, t.scale)),
                       weights.cast(pa.decimal256(19, 0)))  # every BIGINT has 19 digits
    return _narrowed(wide, pa.decimal128(MAX_PRECISION, t.scale), "a product value * weight")


def exact_sums(left: pa.Array, right: pa.Array, precision: int, scale: int) -> pa.Array:
    """Per row, ``left + right`` (two decimals of scale ``scale``) exactly, as
    ``DECIMAL(precision, scale)``; NULL where either is. ``ArithmeticError`` where a sum
    leaves the type, as Spark's cast of the new state to its type raises."""
    wide = pc.add(left.cast(pa.decimal256(left.type.precision, left.type.scale)),
                  right.cast(pa.decimal256(right.type.precision, right.type.scale)))
    return _narrowed(wide, pa.decimal128(precision, scale), "a sum")


def _narrowed(wide: pa.Array, to: pa.Decimal128Type, what: str) -> pa.Array:
    try:
        return wide.cast(to)  # a safe cast: it raises rather than lose a digit
    except pa.ArrowInvalid as e:
        raise ArithmeticError(f"{what} does not fit DECIMAL({to.precision}, {to.scale}) "
                              f"(overflow): {e}") from e


def unscaled_int64(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
    """The unscaled values of a ``decimal128`` array as int64 (0 where NULL) and its validity
    mask, read from its 16-byte words; None where a value does not fit 64 bits. (The driver's
    aggregate sums decimals whose values fit 64 bits so, of any type, as the integers they
    are.)"""
    array = _one_chunk(values)
    n = len(array)
    valid = (np.ones(n, dtype=bool) if array.null_count == 0
             else np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    if n == 0:
        return np.zeros(0, dtype=np.int64), valid
    words = np.frombuffer(array.buffers()[1], dtype=np.int64)[
        2 * array.offset: 2 * (array.offset + n)].reshape(n, 2)
    low, high = words[:, 0], words[:, 1]
    if not np.all((high == (low >> 63)) | ~valid):
        return None
    return np.where(valid, low, 0), valid


def from_unscaled_int64(unscaled: np.ndarray, valid: np.ndarray,
                        to: pa.Decimal128Type) -> pa.Array | None:
    """The ``decimal128`` array of type ``to`` whose unscaled values are ``unscaled`` (NULL
    where ``valid`` is not), or None where a value has more digits than ``to.precision``."""
    if to.precision < 19:
        limit = 10 ** to.precision
        if np.any(((unscaled >= limit) | (unscaled <= -limit)) & valid):
            return None
    n = len(unscaled)
    words = np.empty((n, 2), dtype=np.int64)
    words[:, 0] = unscaled
    words[:, 1] = unscaled >> 63
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(to, n, [validity, pa.py_buffer(words.tobytes())],
                                 null_count=int(n - valid.sum()))
