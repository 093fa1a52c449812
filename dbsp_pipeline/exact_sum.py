"""Exact, order-independent sums of floating-point values, for ``sum`` and ``avg`` state.

A step's result must be a function of the multiset it aggregates, bit for bit, or a replay, a
restore, a rescale or the other engine path yields other bits and a later retraction removes a
row that was never written (a phantom that never goes away). Floating-point addition is not
associative, so no order of ``+`` is safe. Instead each group's state keeps the sum *exactly*:

* ``finite``: the exact sum of the finite values (times their weights) as an integer count of
  ``2**-1074`` (the smallest subnormal double), so every double is an integer there and every
  sum of them is exact, whatever the order and however many inserts and deletes;
* ``nan``, ``pos_inf``, ``neg_inf``: the weighted counts of NaN, +inf and -inf values.

The SQL value is rounded once, on output (:meth:`ExactSum.value`): NaN if a NaN is present or
both infinities are, else the infinity present, else the finite sum correctly rounded to the
nearest double (ties to even; what ``math.fsum`` of the values present returns), or ±inf when it
is beyond the double range (what Spark's ``sum`` gives on overflow). ``avg`` is that value divided
by the count, as Spark defines it.

State is stored as a canonical string (:func:`encode`): equal sums have equal encodings, so state
rows consolidate by equality. Both engine paths call the same functions (:func:`fold_arrow`), on
the driver over DuckDB's Arrow output and on Spark inside ``mapInArrow``, so they agree bit for
bit by construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

#: every finite double is an integer multiple of 2**-SCALE_BITS
SCALE_BITS = 1074
_ONE = 1 << SCALE_BITS


@dataclass(frozen=True)
class ExactSum:
    """The exact sum of a multiset of doubles (see the module docstring)."""

    finite: int = 0
    nan: int = 0
    pos_inf: int = 0
    neg_inf: int = 0

    def __add__(self, other: ExactSum) -> ExactSum:
        return ExactSum(self.finite + other.finite, self.nan + other.nan,
                        self.pos_inf + other.pos_inf, self.neg_inf + other.neg_inf)

    def value(self) -> float:
        """The sum rounded once to the nearest double, with SQL's NaN and infinity rules."""
        return _value(self.finite, self.nan, self.pos_inf, self.neg_inf)

    def mean(self, count: int) -> float:
        """``avg``: the rounded sum divided by the count (Spark's ``sum / count``)."""
        return self.value() / count


def _value(finite: int, nan: int, pos_inf: int, neg_inf: int) -> float:
    """:meth:`ExactSum.value` of the four parts of a sum."""
    if nan > 0 or (pos_inf > 0 and neg_inf > 0):
        return math.nan
    if pos_inf > 0:
        return math.inf
    if neg_inf > 0:
        return -math.inf
    return _rounded(finite)


def _rounded(finite: int) -> float:
    """The finite part of a sum rounded once to the nearest double (±inf beyond the range)."""
    try:
        return finite / _ONE  # int / int rounds correctly
    except OverflowError:
        return math.inf if finite > 0 else -math.inf


def of_pairs(values: Sequence[float | None], weights: Sequence[int]) -> ExactSum:
    """The exact sum of ``value * weight`` over the pairs (NULL values are skipped)."""
    finite = nan = pos_inf = neg_inf = 0
    for v, w in zip(values, weights):
        if v is None:
            continue
        if v != v:
            nan += w
        elif v == math.inf:
            pos_inf += w
        elif v == -math.inf:
            neg_inf += w
        elif v:
            n, d = v.as_integer_ratio()  # d is a power of two, at most 2**1074
            finite += (n * w) << (SCALE_BITS + 1 - d.bit_length())
    return ExactSum(finite, nan, pos_inf, neg_inf)


def encode(s: ExactSum) -> str:
    """The canonical text of ``s``: ``<hex mantissa>p<binary exponent>`` of the finite sum with
    an odd mantissa (``0`` for zero), then ``;nan;+inf;-inf`` counts when any is non-zero."""
    return _encode(s.finite, s.nan, s.pos_inf, s.neg_inf)


def _encode(finite: int, nan: int, pos_inf: int, neg_inf: int) -> str:
    """:func:`encode` of the four parts of a sum."""
    text = _finite_text(finite)
    if nan or pos_inf or neg_inf:
        text += f";{nan};{pos_inf};{neg_inf}"
    return text


def _finite_text(finite: int) -> str:
    """The text of the finite part of a sum: ``<hex odd mantissa>p<exponent>``, ``0`` for 0."""
    if finite == 0:
        return "0"
    shift = (finite & -finite).bit_length() - 1  # trailing zero bits
    return f"{finite >> shift:x}p{shift - SCALE_BITS}"


def decode(text: str | None) -> ExactSum:
    """The inverse of :func:`encode`; ``None`` (no state yet) is the empty sum."""
    return ExactSum(*_decode(text)) if text else ExactSum()


def _decode(text: str) -> tuple[int, int, int, int]:
    """:func:`decode` of a non-empty text, as the four parts of the sum."""
    finite_text, *counts = text.split(";")
    finite = _finite_of(finite_text)
    if not counts:
        return finite, 0, 0, 0
    nan, pos_inf, neg_inf = (int(c) for c in counts)
    return finite, nan, pos_inf, neg_inf


def _finite_of(text: str) -> int:
    """The inverse of :func:`_finite_text`."""
    if text == "0":
        return 0
    mantissa, exponent = text.split("p")
    return int(mantissa, 16) << (int(exponent) + SCALE_BITS)


@dataclass(frozen=True)
class FoldSpec:
    """One exact aggregate to fold in a table of touched groups (:func:`fold_arrow`).

    Reads ``old`` (the encoded old state, NULL for a new group), ``pairs`` (the step's
    ``list<struct<_v double, _w int64>>`` of the group's changed values, NULL for none) and
    ``count`` (the new non-NULL count); writes ``state`` (the new encoded sum) and ``result``
    (the SQL value: the sum or, with ``mean``, the average; NULL when the count is 0).

    With ``merge``, ``pairs`` holds ``list<struct<_v string, _w int64>>``: encoded sums
    (:func:`encode`, NULL for none) with weights, each standing for its sum times its weight
    (an aggregate of partial sums, ``sum_of_states``): the result is the exact sum of the
    values the partial sums summed.
    """

    old: str
    pairs: str
    count: str
    state: str
    result: str
    mean: bool
    merge: bool = False


def fold_arrow(batch: pa.RecordBatch, specs: Sequence[FoldSpec]) -> pa.RecordBatch:
    """Add each spec's ``state`` and ``result`` columns to ``batch`` (per row: old state plus
    the step's pairs). A pure function of each row, so the same on any engine path or batching.

    From ``_VECTOR_ROWS`` rows or pairs on, whole columns at a time (:func:`_fold_column`: a
    compiled pass per row, ``exact_sum_kernel``); a few rows of a few pairs, and the rows with
    NaN or infinities or beyond the kernel's ranges, one at a time in Python integers
    (:func:`_fold_rows`). Bit for bit the same as :func:`fold_arrow_reference`
    (``tests/test_exact_sum.py`` compares them)."""
    columns, names = list(batch.columns), list(batch.schema.names)
    for spec in specs:
        olds, pairs = batch.column(spec.old), batch.column(spec.pairs)
        if batch.num_rows >= _VECTOR_ROWS or _entries(pairs) >= _VECTOR_ROWS:
            states, values = _fold_column(olds, pairs, spec.merge)
        else:
            parts = _merged_parts(pairs) if spec.merge else _pair_parts(pairs)
            texts, floats = _fold_rows(olds.to_pylist(), parts)
            states, values = pa.array(texts, pa.string()), np.array(floats, dtype=np.float64)
        counts = batch.column(spec.count).fill_null(0).to_numpy(zero_copy_only=False)
        counted = counts > 0
        with np.errstate(divide="ignore", invalid="ignore"):  # (no result where not counted)
            results = values / counts.astype(np.float64) if spec.mean else values
        columns += [states.cast(_string_type(batch, spec)),
                    pa.array(results, pa.float64(), mask=~counted)]
        names += [spec.state, spec.result]
    return pa.RecordBatch.from_arrays(columns, names=names)


def _entries(pairs: pa.Array) -> int:
    """How many pairs a list column holds over its rows (NULL lists' included)."""
    if len(pairs) == 0:
        return 0
    offsets = pairs.offsets
    return int(offsets[len(offsets) - 1].as_py()) - int(offsets[0].as_py())


def _fold_rows(olds: list[str | None], parts: tuple[list[int], list[int], list[int], list[int]]
               ) -> tuple[list[str], list[float]]:
    """Per row, the new state's text and the rounded sum of an old state (its text, or None)
    plus the exact sum of the step's pairs (the parts of :func:`_pair_parts`), in Python
    integers. A state without NaN or infinities goes through its finite part alone
    (``_finite_of``/``_finite_text``/``_rounded``)."""
    states: list[str] = []
    values: list[float] = []
    for old, f, n, p, m in zip(olds, *parts):
        if old and ";" not in old:  # a state without NaN or infinities: its finite part
            f += _finite_of(old)
        elif old:
            of, on, op, om = _decode(old)
            f, n, p, m = f + of, n + on, p + op, m + om
        if n or p or m:
            states.append(_encode(f, n, p, m))
            values.append(_value(f, n, p, m))
        else:  # the finite part alone
            states.append(_finite_text(f))
            values.append(_rounded(f))
    return states, values


#: :func:`fold_arrow` folds whole columns from this many rows on
_VECTOR_ROWS = 400
#: old states with longer mantissas (in hex digits), and new states with more significant bits,
#: are folded one row at a time in Python integers (``exact_sum_kernel.LONG_DIGITS``): rare (a
#: sum spanning ~400 binary orders of magnitude)
_LONG_DIGITS = 104


def _fold_column(olds: pa.Array, pairs: pa.Array, merge: bool) -> tuple[pa.Array, np.ndarray]:
    """:func:`_fold_rows` of whole columns (old states; the step's pairs, or with ``merge``
    its encoded partial sums with weights), in one compiled pass per row
    (``exact_sum_kernel.fold_rows``: the same integers, in 32-bit limbs).
    The rows the kernel does not take go through :func:`_fold_rows`: pairs with NaN,
    infinities or :func:`_pair_arrays`' fallback, states with NaN or infinities or a mantissa
    beyond ``_LONG_DIGITS`` hex digits (or near the top of the double range), results of more
    than ``_LONG_BITS`` significant bits (see the kernel's module)."""
    from dbsp_pipeline import exact_sum_kernel  # (compiled or loaded from its cache at first use)

    rows = len(olds)
    if isinstance(pairs, pa.ChunkedArray):
        pairs = pairs.combine_chunks()
    if isinstance(olds, pa.ChunkedArray):
        olds = olds.combine_chunks()
    texts, text_row, text_weight = olds, np.arange(rows, dtype=np.int64), np.ones(rows, np.int64)
    no_pairs = np.zeros(0, dtype=np.int64)
    pair_row, exponent, weight = no_pairs, no_pairs, no_pairs
    fraction = no_pairs
    if merge:  # the partial sums are texts too, each of its row, times its weight
        slow = np.zeros(rows, dtype=bool)
        offsets = pairs.offsets.to_numpy().astype(np.int64)
        lo, hi = int(offsets[0]), int(offsets[-1])
        child = pairs.values.slice(lo, hi - lo)
        parent = np.repeat(np.arange(rows, dtype=np.int64), np.diff(offsets))
        weights = child.field("_w").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        if pairs.null_count:  # (a NULL list's entries count for nothing)
            weights = np.where(pairs.is_valid().to_numpy(zero_copy_only=False)[parent],
                               weights, 0)
        states = child.field("_v")
        if not pa.types.is_string(states.type):
            states = states.cast(pa.string())
        order = np.argsort(np.concatenate([text_row, parent]), kind="stable")
        texts = pa.concat_arrays([olds.cast(pa.string()), states]).take(pa.array(order))
        text_row = np.concatenate([text_row, parent])[order]
        text_weight = np.concatenate([text_weight, weights])[order]
    else:
        a = _pair_arrays(pairs)
        slow = a.fallback | (a.nan != 0) | (a.pos_inf != 0) | (a.neg_inf != 0)
        pair_row, exponent, weight = a.pair_row, a.exponent, a.weight
        fraction = a.fraction.astype(np.int64)  # (below 2**52)
    text_offsets, text_data, text_valid = _string_buffers(texts)
    data, offsets_out, values = exact_sum_kernel.fold_rows(
        rows, text_offsets, text_data, text_valid, text_row, text_weight, pair_row, exponent,
        fraction, weight, slow)
    state = pa.StringArray.from_buffers(rows, pa.py_buffer(offsets_out), pa.py_buffer(data))
    slow_rows = np.flatnonzero(slow)
    if len(slow_rows):
        taken = pa.array(slow_rows)
        slow_pairs = pairs.take(taken)
        parts = _merged_parts(slow_pairs) if merge else _pair_parts(slow_pairs)
        slow_texts, floats = _fold_rows(olds.take(taken).to_pylist(), parts)
        values[slow_rows] = floats
        index = np.arange(rows)
        index[slow_rows] = rows + np.arange(len(slow_rows))
        state = pa.concat_arrays([state, pa.array(slow_texts, pa.string())]).take(
            pa.array(index))
    return state, values


def _string_buffers(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A string array's offsets (int64, from its first row), bytes and validity, as numpy."""
    if not pa.types.is_string(texts.type):  # (large, view, dictionary or null: as strings)
        texts = texts.cast(pa.string())
    n = len(texts)
    _, offset_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int32)[texts.offset:texts.offset + n + 1]
    data = (np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None
            else np.zeros(0, dtype=np.uint8))
    valid = texts.is_valid().to_numpy(zero_copy_only=False) if texts.null_count else np.ones(
        n, dtype=bool)
    return offsets.astype(np.int64), data, valid


def fold_arrow_reference(batch: pa.RecordBatch, specs: Sequence[FoldSpec]) -> pa.RecordBatch:
    """:func:`fold_arrow` computed row by row and pair by pair with :func:`of_pairs`: the
    definition the vectorized path must equal bit for bit (kept for tests and as the fallback
    for pairs whose weights are too big for :func:`pair_sums`' 64-bit limbs)."""
    columns, names = list(batch.columns), list(batch.schema.names)
    for spec in specs:
        olds = batch.column(spec.old).to_pylist()
        counts = batch.column(spec.count).to_pylist()
        pairs = batch.column(spec.pairs)
        offsets = pairs.offsets.to_pylist()
        present = pairs.is_valid().to_pylist()
        values = pairs.values.field("_v").to_pylist()
        weights = pairs.values.field("_w").to_pylist()
        states: list[str] = []
        results: list[float | None] = []
        for row, (old, count) in enumerate(zip(olds, counts)):
            total = decode(old)
            if present[row]:
                lo, hi = offsets[row], offsets[row + 1]
                if spec.merge:  # each state times its weight, in Python integers
                    for text, w in zip(values[lo:hi], weights[lo:hi]):
                        if text is not None:
                            f, n, p, m = _decode(text) if text else (0, 0, 0, 0)
                            total = total + ExactSum(f * w, n * w, p * w, m * w)
                else:
                    total = total + of_pairs(values[lo:hi], weights[lo:hi])
            states.append(encode(total))
            if not count or count <= 0:
                results.append(None)
            else:
                results.append(total.mean(count) if spec.mean else total.value())
        columns += [pa.array(states, _string_type(batch, spec)), pa.array(results, pa.float64())]
        names += [spec.state, spec.result]
    return pa.RecordBatch.from_arrays(columns, names=names)


def _merged_parts(pairs: pa.Array) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per row of ``pairs`` (a ``list<struct<_v string, _w int64>>`` column of encoded sums
    with weights, NULL for none), the parts (finite, nan, pos_inf, neg_inf) of the sum of its
    states times their weights, in Python integers (a NULL state, or a NULL weight, adds
    nothing): the definition of a merge (``fold_arrow_reference``), for the rows the compiled
    fold does not take and for a few rows of a few partial sums."""
    rows = len(pairs)
    parts: tuple[list[int], list[int], list[int], list[int]] = (
        [0] * rows, [0] * rows, [0] * rows, [0] * rows)
    if rows == 0:
        return parts
    offsets = pairs.offsets.to_pylist()
    present = pairs.is_valid().to_pylist()
    texts = pairs.values.field("_v").to_pylist()
    weights = pairs.values.field("_w").to_pylist()
    for row in range(rows):
        if not present[row]:
            continue
        f = n = p = m = 0
        for text, w in zip(texts[offsets[row]:offsets[row + 1]],
                           weights[offsets[row]:offsets[row + 1]]):
            if text:  # (read even at weight 0: a text that is no sum raises)
                tf, tn, tp, tm = _decode(text)
                w = w or 0
                f, n, p, m = f + tf * w, n + tn * w, p + tp * w, m + tm * w
        parts[0][row], parts[1][row], parts[2][row], parts[3][row] = f, n, p, m
    return parts


def _string_type(batch: pa.RecordBatch, spec: FoldSpec) -> pa.DataType:
    string_type = batch.schema.field(spec.old).type
    if not pa.types.is_string(string_type) and not pa.types.is_large_string(string_type):
        string_type = pa.string()
    return string_type


#: bits per limb of :func:`pair_sums`' accumulators
_LIMB = 32
_LIMB_MASK = np.uint64((1 << _LIMB) - 1)
#: a row's pairs go through the limbs only if the sum of their weights' magnitudes is below
#: this: every limb term is below 2**33, so no int64 sum of terms can overflow (2**33 * 2**29)
_WEIGHT_BOUND = 1 << 29
#: accumulator cells (rows x limbs) per chunk of rows, to bound memory for wide exponent ranges
_CHUNK_CELLS = 1 << 21


def pair_sums(pairs: pa.Array) -> list[ExactSum]:
    """Per row of ``pairs``, the exact sum :func:`of_pairs` of its pairs (see
    :func:`_pair_parts`)."""
    return [ExactSum(*parts) for parts in zip(*_pair_parts(pairs))]


@dataclass(frozen=True)
class _PairArrays:
    """A pairs column taken apart by :func:`_pair_arrays`, as numpy arrays.

    ``pair_row``, ``exponent``, ``fraction`` and ``weight`` describe the finite pairs to sum
    with :func:`_finite_sums` (the row of each, sorted; its IEEE exponent and fraction fields;
    its weight with the value's sign); ``nan``, ``pos_inf`` and ``neg_inf`` are each row's
    weighted counts of those values; ``fallback`` marks the rows whose pairs must be summed by
    :func:`of_pairs` instead (a NULL weight, or weights too big for the limbs): none of their
    pairs is among the finite ones. ``offsets`` are the column's list offsets from ``lo``."""

    rows: int
    lo: int
    offsets: np.ndarray
    pair_row: np.ndarray
    exponent: np.ndarray
    fraction: np.ndarray
    weight: np.ndarray
    nan: np.ndarray
    pos_inf: np.ndarray
    neg_inf: np.ndarray
    fallback: np.ndarray


def _pair_arrays(pairs: pa.Array) -> _PairArrays:
    """Take a ``list<struct<_v double, _w int64>>`` column (NULL for none) apart for the
    vectorized sums. Each finite double is split from its IEEE bits into its exponent and
    fraction fields (:func:`_finite_sums` turns them into an integer mantissa ``m`` < 2**53 and
    a scale ``s`` with ``value * 2**1074 == m * 2**s``). NaN and infinities become weighted
    counts, NULL values are skipped, as in :func:`of_pairs`; a row with a NULL weight, or
    whose weights' magnitudes sum to ``_WEIGHT_BOUND`` or more, is marked ``fallback``. The
    common case (no NULLs, no NaN or infinity, small weights) takes no masks or copies."""
    rows = len(pairs)
    offsets = pairs.offsets.to_numpy().astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    offsets = offsets - lo
    counts = np.diff(offsets)
    pair_row = np.repeat(np.arange(rows, dtype=np.int64), counts)
    v_arr = pairs.values.field("_v").slice(lo, hi - lo)
    w_arr = pairs.values.field("_w").slice(lo, hi - lo)
    # None: every pair counts (no NULL list and no NULL value)
    active: np.ndarray | None = None
    if pairs.null_count or v_arr.null_count:
        present = pairs.is_valid().to_numpy(zero_copy_only=False)
        active = present[pair_row] & v_arr.is_valid().to_numpy(zero_copy_only=False)
        v_arr = v_arr.fill_null(0.0)
    bits = np.asarray(v_arr.to_numpy(zero_copy_only=False), dtype=np.float64).view(np.uint64)
    w = np.asarray(w_arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)

    # Rows the limbs cannot take: a NULL weight (of_pairs fails on it as before) or big weights.
    fallback = np.zeros(rows, dtype=bool)
    longest = int(counts.max()) if rows else 0
    biggest = max(int(w.max()), -int(w.min())) if len(w) else 0
    if w_arr.null_count or biggest >= _WEIGHT_BOUND or biggest * longest >= _WEIGHT_BOUND:
        live = np.ones(len(w), dtype=bool) if active is None else active
        w_null = ~w_arr.is_valid().to_numpy(zero_copy_only=False)
        small = (w > -_WEIGHT_BOUND) & (w < _WEIGHT_BOUND)
        np.logical_or.at(fallback, pair_row[live & (w_null | ~small)], True)
        magnitude = np.where(live & small, np.abs(w), 0)
        row_magnitude = np.zeros(rows, dtype=np.int64)
        np.add.at(row_magnitude, pair_row, magnitude)
        fallback |= row_magnitude >= _WEIGHT_BOUND
        active = live & ~fallback[pair_row]

    exponent = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    fraction = bits & np.uint64((1 << 52) - 1)
    special = exponent == 0x7FF
    nan = pos_inf = neg_inf = np.zeros(rows, dtype=np.int64)
    negative = bits >> np.uint64(63) != 0
    signed = np.where(negative, -w, w)
    if special.any() or active is not None:
        live = np.ones(len(w), dtype=bool) if active is None else active
        is_nan = live & special & (fraction != 0)
        is_inf = live & special & (fraction == 0)

        def weighted_count(mask: np.ndarray) -> np.ndarray:
            out = np.zeros(rows, dtype=np.int64)
            np.add.at(out, pair_row[mask], w[mask])
            return out

        nan = weighted_count(is_nan)
        pos_inf = weighted_count(is_inf & ~negative)
        neg_inf = weighted_count(is_inf & negative)
        finite = live & ~special
        pair_row, exponent, fraction, signed = (
            pair_row[finite], exponent[finite], fraction[finite], signed[finite])
    return _PairArrays(rows, lo, offsets, pair_row, exponent, fraction, signed, nan, pos_inf,
                       neg_inf, fallback)


def _pair_parts(pairs: pa.Array) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per row of ``pairs`` (a ``list<struct<_v double, _w int64>>`` column, NULL for none), the
    parts (finite, nan, pos_inf, neg_inf) of the exact sum :func:`of_pairs` of its pairs,
    computed with numpy (:func:`_pair_arrays`, :func:`_finite_sums`).

    Exact by construction: ``m * w`` is summed per row in pieces small enough that no partial
    sum can be rounded or overflow, then read back as one Python integer; the ``fallback``
    rows are summed by :func:`of_pairs`."""
    if len(pairs) == 0:
        return [], [], [], []
    a = _pair_arrays(pairs)
    finite_sums = _finite_sums(a.rows, a.pair_row, a.exponent, a.fraction, a.weight)
    parts = (finite_sums, a.nan.tolist(), a.pos_inf.tolist(), a.neg_inf.tolist())
    if a.fallback.any():
        values = pairs.values.field("_v").to_pylist()
        weights = pairs.values.field("_w").to_pylist()
        for row in np.flatnonzero(a.fallback).tolist():
            lo, hi = a.lo + int(a.offsets[row]), a.lo + int(a.offsets[row + 1])
            exact = of_pairs(values[lo:hi], weights[lo:hi])
            for column, part in zip(parts, (exact.finite, exact.nan, exact.pos_inf,
                                            exact.neg_inf)):
                column[row] = part
    return parts


#: :func:`_finite_sums` sums per (row, exponent) cell when there are at most this many cells
#: and the pairs outnumber them several times over (a few groups of many values)
_DENSE_CELLS = 1 << 12
#: bits per piece of a mantissa in the per-cell sums: a piece times a weight summed over a row
#: stays below 2**(18 + 29) (the row's weights sum below ``_WEIGHT_BOUND``), exact in a double
_PIECE = 18


def _finite_sums(rows: int, pair_row: np.ndarray, exponent: np.ndarray, fraction: np.ndarray,
                 weight: np.ndarray) -> list[int]:
    """The exact integer sum per row of ``mantissa * weight * 2**scale`` over the given finite
    doubles (their IEEE exponent and fraction fields, and signed weights whose magnitudes sum
    below ``_WEIGHT_BOUND`` per row), in units of ``2**-SCALE_BITS``; ``pair_row`` is sorted.
    Zeros (an exponent and a fraction of 0) add nothing and widen no range. A few rows of many
    values, over a narrow range of exponents, are summed per cell (:func:`_cell_sums`), the
    others in limbs (:func:`_limb_sums`): the same integers."""
    zero = (exponent == 0) & (fraction == 0)
    if zero.all():  # (also no pairs)
        return [0] * rows
    if zero.any():  # a zero adds nothing: given the exponent of another value and no weight,
        exponent = np.where(zero, exponent[~zero][0], exponent)  # it widens no range
        weight = np.where(zero, 0, weight)
    low, high = int(exponent.min()), int(exponent.max())
    cells = rows * (high - low + 1)
    if cells <= _DENSE_CELLS and 3 * cells * 8 <= len(pair_row):
        return _cell_sums(rows, pair_row, exponent, fraction, weight, low, high - low + 1)
    return _limb_sums(rows, pair_row, exponent, fraction, weight)


def _cell_sums(rows: int, pair_row: np.ndarray, exponent: np.ndarray, fraction: np.ndarray,
               weight: np.ndarray, low: int, span: int) -> list[int]:
    """:func:`_finite_sums` per (row, exponent) cell: each mantissa is cut into three pieces
    of ``_PIECE`` bits, and each piece times its weight is summed per cell with
    ``np.bincount`` in doubles, exactly (every partial sum is an integer below 2**47); then
    each row adds its cells' sums, shifted to their scales, as Python integers."""
    mantissa = np.where(exponent == 0, fraction, fraction | np.uint64(1 << 52))
    cell = pair_row * span + (exponent - low)
    signed = weight.astype(np.float64)
    mask = np.uint64((1 << _PIECE) - 1)
    pieces = [np.bincount(cell, weights=((mantissa >> np.uint64(_PIECE * j)) & mask).astype(
        np.float64) * signed, minlength=rows * span).reshape(rows, span) for j in range(3)]
    sums = [0] * rows
    for j, piece in enumerate(pieces):
        for row, k in zip(*np.nonzero(piece)):
            e = low + int(k)
            sums[int(row)] += int(piece[row, k]) << (max(e - 1, 0) + _PIECE * j)
    return sums


def _limb_sums(rows: int, pair_row: np.ndarray, exponent: np.ndarray, fraction: np.ndarray,
               weight: np.ndarray) -> list[int]:
    """:func:`_finite_sums` in 32-bit limbs (:func:`_limb_blocks`), each row's limbs read back
    as one Python integer."""
    sums = [0] * rows
    for row0, acc, first in _limb_blocks(rows, pair_row, exponent, fraction, weight):
        width = acc.shape[1]
        low_bytes = acc[:, :-1].astype("<u4").tobytes()
        stride = 4 * (width - 1)
        top = acc[:, -1].tolist()
        base = _LIMB * first
        top_shift = _LIMB * (width - 1)
        for i in np.flatnonzero(acc.any(axis=1)).tolist():
            value = int.from_bytes(low_bytes[i * stride:(i + 1) * stride], "little")
            sums[row0 + i] = (value + (top[i] << top_shift)) << base
    return sums


def _limb_blocks(rows: int, pair_row: np.ndarray, exponent: np.ndarray, fraction: np.ndarray,
                 weight: np.ndarray) -> Iterator[tuple[int, np.ndarray, int]]:
    """:func:`_finite_sums` in 32-bit limbs, by blocks of consecutive rows: ``m * w`` is added
    into the limbs of the row's sum at bit ``s`` with int64 arithmetic that cannot overflow,
    and the limbs are then carried.

    Yields nothing without pairs, else ``(row0, acc, first)`` for blocks of all rows in order
    (at most ``_CHUNK_CELLS`` limbs a block; rows without pairs are zeros): row ``row0 + i``'s
    sum is ``sum(acc[i, k] << 32 * (first + k))``, every limb but the top one is in
    ``[0, 2**32)`` and the top one is 0 or -1, the sign. (A row's sum is below ``2**(53 + 30)``
    times ``2**s`` of its largest term, which the limbs up to three above that term's hold;
    weights summing below ``2**30`` keep every int64 sum of terms below ``2**63``.)"""
    if len(pair_row) == 0:
        return
    mantissa = np.where(exponent == 0, fraction, fraction | np.uint64(1 << 52))
    scale = np.maximum(exponent - 1, 0)  # value * 2**1074 == mantissa * 2**scale
    limb = scale >> 5
    shift = (scale & 31).astype(np.uint64)
    low = (mantissa & _LIMB_MASK) << shift  # < 2**63
    high = (mantissa >> np.uint64(_LIMB)) << shift  # < 2**52
    terms = [(low & _LIMB_MASK).astype(np.int64),
             ((low >> np.uint64(_LIMB)) + (high & _LIMB_MASK)).astype(np.int64),
             (high >> np.uint64(_LIMB)).astype(np.int64)]  # each < 2**33
    first = int(limb.min())
    width = int(limb.max()) - first + 5
    limb = limb - first
    chunk_rows = max(1, _CHUNK_CELLS // width)
    starts = np.searchsorted(pair_row, np.arange(0, rows + chunk_rows, chunk_rows))
    for c, row0 in enumerate(range(0, rows, chunk_rows)):
        n = min(chunk_rows, rows - row0)
        flat = np.zeros(n * width, dtype=np.int64)
        a, b = int(starts[c]), int(starts[c + 1])
        if a < b:
            cell = (pair_row[a:b] - row0) * width + limb[a:b]
            for j, term in enumerate(terms):
                np.add.at(flat, cell + j, term[a:b] * weight[a:b])
        acc = flat.reshape(n, width)
        _carry(acc)
        yield row0, acc, first


def _carry(acc: np.ndarray) -> None:
    """Carry the limbs of each row of ``acc`` in place: every limb but the top one into
    ``[0, 2**32)``, the same sum."""
    for k in range(acc.shape[1] - 1):
        acc[:, k + 1] += acc[:, k] >> _LIMB
        acc[:, k] &= (1 << _LIMB) - 1


def fold_table(table: pa.Table, specs: Sequence[FoldSpec]) -> pa.Table:
    """:func:`fold_arrow` over a whole table (the driver path), in one batch when it is in
    several (a table of many small chunks would be folded one row at a time)."""
    if table.num_rows >= _VECTOR_ROWS and len(table.to_batches()) > 1:
        table = table.combine_chunks()
    batches = [fold_arrow(b, specs) for b in table.to_batches()]
    if not batches:
        return pa.Table.from_batches([fold_arrow(
            pa.RecordBatch.from_pylist([], schema=table.schema), specs)])
    return pa.Table.from_batches(batches)


def fold_batches(batches: Iterator[pa.RecordBatch],
                 specs: Sequence[FoldSpec]) -> Iterator[pa.RecordBatch]:
    """:func:`fold_arrow` over a stream of batches (Spark's ``mapInArrow``)."""
    for batch in batches:
        yield fold_arrow(batch, specs)
