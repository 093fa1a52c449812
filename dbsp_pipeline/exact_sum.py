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

import pyarrow as pa

#: every finite double is an integer multiple of 2**-SCALE_BITS
SCALE_BITS = 1074


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
        if self.nan > 0 or (self.pos_inf > 0 and self.neg_inf > 0):
            return math.nan
        if self.pos_inf > 0:
            return math.inf
        if self.neg_inf > 0:
            return -math.inf
        try:
            return self.finite / (1 << SCALE_BITS)  # int / int rounds correctly
        except OverflowError:
            return math.inf if self.finite > 0 else -math.inf

    def mean(self, count: int) -> float:
        """``avg``: the rounded sum divided by the count (Spark's ``sum / count``)."""
        return self.value() / count


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
    if s.finite == 0:
        text = "0"
    else:
        shift = (s.finite & -s.finite).bit_length() - 1  # trailing zero bits
        text = f"{s.finite >> shift:x}p{shift - SCALE_BITS}"
    if s.nan or s.pos_inf or s.neg_inf:
        text += f";{s.nan};{s.pos_inf};{s.neg_inf}"
    return text


def decode(text: str | None) -> ExactSum:
    """The inverse of :func:`encode`; ``None`` (no state yet) is the empty sum."""
    if not text:
        return ExactSum()
    finite_text, *counts = text.split(";")
    finite = 0
    if finite_text != "0":
        mantissa, exponent = finite_text.split("p")
        finite = int(mantissa, 16) << (int(exponent) + SCALE_BITS)
    nan, pos_inf, neg_inf = (int(c) for c in counts) if counts else (0, 0, 0)
    return ExactSum(finite, nan, pos_inf, neg_inf)


@dataclass(frozen=True)
class FoldSpec:
    """One exact aggregate to fold in a table of touched groups (:func:`fold_arrow`).

    Reads ``old`` (the encoded old state, NULL for a new group), ``pairs`` (the step's
    ``list<struct<_v double, _w int64>>`` of the group's changed values, NULL for none) and
    ``count`` (the new non-NULL count); writes ``state`` (the new encoded sum) and ``result``
    (the SQL value: the sum or, with ``mean``, the average; NULL when the count is 0).
    """

    old: str
    pairs: str
    count: str
    state: str
    result: str
    mean: bool


def fold_arrow(batch: pa.RecordBatch, specs: Sequence[FoldSpec]) -> pa.RecordBatch:
    """Add each spec's ``state`` and ``result`` columns to ``batch`` (row by row: old state plus
    the step's pairs). A pure function of each row, so the same on any engine path or batching."""
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
                total = total + of_pairs(values[lo:hi], weights[lo:hi])
            states.append(encode(total))
            if not count or count <= 0:
                results.append(None)
            else:
                results.append(total.mean(count) if spec.mean else total.value())
        string_type = batch.schema.field(spec.old).type
        if not pa.types.is_string(string_type) and not pa.types.is_large_string(string_type):
            string_type = pa.string()
        columns += [pa.array(states, string_type), pa.array(results, pa.float64())]
        names += [spec.state, spec.result]
    return pa.RecordBatch.from_arrays(columns, names=names)


def fold_table(table: pa.Table, specs: Sequence[FoldSpec]) -> pa.Table:
    """:func:`fold_arrow` over a whole table (the driver path)."""
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
