"""Exact sums: the value is ``math.fsum`` of the multiset present, after any sequence of inserts
and deletes, in any order, and the encoding is canonical (equal sums, equal text)."""

from __future__ import annotations

import math
import random

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from dbsp_pipeline import exact_sum
from dbsp_pipeline.exact_sum import ExactSum, FoldSpec, decode, encode, of_pairs
from tests.conftest import sql_sum

finite = st.floats(allow_nan=False, allow_infinity=False)
any_float = st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0,
                                               5e-324, 1e308, -1e308, 0.1, 1e17]))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@given(st.lists(any_float, max_size=30), st.lists(any_float, max_size=30), st.randoms())
def test_value_is_fsum_of_what_is_present_after_inserts_and_deletes(kept, removed, rnd):
    ops = [(v, 1) for v in kept + removed] + [(v, -1) for v in removed]
    rnd.shuffle(ops)
    total = ExactSum()
    for v, w in ops:  # one at a time, through the encoding, as steps would
        total = decode(encode(total + of_pairs([v], [w])))
    expected = sql_sum(kept) if kept else 0.0
    if not (math.isinf(expected) and not any(math.isinf(v) for v in kept)):
        assert _same(total.value(), expected), (kept, total, expected)


@given(st.lists(st.tuples(finite, st.integers(-5, 5)), max_size=40))
def test_the_encoding_is_canonical_and_independent_of_order(pairs):
    values, weights = [v for v, _ in pairs], [w for _, w in pairs]
    forward = of_pairs(values, weights)
    shuffled = list(pairs)
    random.Random(len(pairs)).shuffle(shuffled)
    backward = ExactSum()
    for v, w in shuffled:
        backward = backward + of_pairs([v], [w])
    assert encode(forward) == encode(backward)
    assert decode(encode(forward)) == forward


def test_known_values():
    assert encode(ExactSum()) == "0"
    assert of_pairs([0.1, 0.2], [1, 1]).value() == math.fsum([0.1, 0.2]) == 0.30000000000000004
    cents = [346.59, 0.01, 12.3, 1e-2]
    assert of_pairs(cents, [1] * 4).value() == math.fsum(cents)
    assert of_pairs([1e17, 13.0, -1e17], [1, 1, 1]).value() == 13.0
    assert math.isnan(of_pairs([math.inf, -math.inf], [1, 1]).value())
    assert of_pairs([math.nan, 1.0], [1, 1]) + of_pairs([math.nan], [-1]) == of_pairs([1.0], [1])
    assert of_pairs([1e308, 1e308], [1, 1]).value() == math.inf
    assert of_pairs([1.5], [1]).mean(2) == 0.75
    assert of_pairs([None, 2.0], [1, 1]).value() == 2.0


def test_fold_adds_the_steps_pairs_to_the_old_state():
    pair = pa.struct([("_v", pa.float64()), ("_w", pa.int64())])
    batch = pa.RecordBatch.from_pydict({
        "old": pa.array([None, encode(of_pairs([0.1], [1])), encode(of_pairs([2.0], [1]))],
                        pa.string()),
        "pairs": pa.array([[{"_v": 0.5, "_w": 2}], [{"_v": 0.2, "_w": 1}], None],
                          pa.list_(pair)),
        "count": pa.array([2, 2, 0], pa.int64()),
    })
    spec = FoldSpec(old="old", pairs="pairs", count="count", state="s", result="r", mean=True)
    out = exact_sum.fold_arrow(batch, [spec])
    assert out.column("r").to_pylist() == [0.5, math.fsum([0.1, 0.2]) / 2, None]
    assert [decode(t).value() for t in out.column("s").to_pylist()] == [
        1.0, math.fsum([0.1, 0.2]), 2.0]
    sliced = exact_sum.fold_arrow(batch.slice(1, 2), [spec])  # offsets of a sliced list column
    assert sliced.column("r").to_pylist() == out.column("r").to_pylist()[1:]
