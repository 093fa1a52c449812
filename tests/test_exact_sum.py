"""Exact sums: the value is ``math.fsum`` of the multiset present, after any sequence of inserts
and deletes, in any order, and the encoding is canonical (equal sums, equal text)."""

from __future__ import annotations

import math
import random
import struct

import pyarrow as pa
import pytest
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


_PAIR = pa.struct([("_v", pa.float64()), ("_w", pa.int64())])
_SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308,
            2.225073858507201e-308, 1.7976931348623157e308, -1.7976931348623157e308, 1e308,
            1e-300, 0.1, 1e17, -1e17, 1.0, 2.0 ** 52 + 1, None]


def _random_value(rnd: random.Random) -> float | None:
    kind = rnd.random()
    if kind < 0.25:
        return rnd.choice(_SPECIAL)
    if kind < 0.45:  # any bit pattern: every exponent, subnormals, NaN payloads
        return struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]
    if kind < 0.7:  # money-like, so that groups cancel and carry
        return round(rnd.uniform(-1000, 1000), 2)
    return rnd.uniform(-1, 1) * 2.0 ** rnd.randint(-1074, 1023)


def _random_weight(rnd: random.Random) -> int | None:
    kind = rnd.random()
    if kind < 0.8:
        return rnd.choice([1, -1, 2, -2, 1, -1, 0])
    if kind < 0.97:
        return rnd.randint(-(1 << 28), 1 << 28)
    return rnd.choice([1 << 29, -(1 << 29), (1 << 63) - 1, -(1 << 63), rnd.getrandbits(62)])


def _random_batch(rnd: random.Random, rows: int) -> pa.RecordBatch:
    olds, pairs, counts = [], [], []
    for _ in range(rows):
        old = None
        if rnd.random() < 0.7:
            old = encode(of_pairs([_random_value(rnd) for _ in range(rnd.randint(1, 3))],
                                  [rnd.choice([1, 2, -1]) for _ in range(3)]))
        olds.append(old)
        if rnd.random() < 0.1:
            pairs.append(None)
        else:
            n = rnd.choice([0, 1, 1, 2, 3, 5, rnd.randint(0, 60)])
            pairs.append([{"_v": _random_value(rnd), "_w": _random_weight(rnd)}
                          for _ in range(n)])
        counts.append(rnd.choice([None, 0, -1, 1, 3, 7, (1 << 53) + 1]))
    return pa.RecordBatch.from_pydict({
        "old": pa.array(olds, pa.string()), "pairs": pa.array(pairs, pa.list_(_PAIR)),
        "count": pa.array(counts, pa.int64())})


def _bits(values: list[float | None]) -> list[bytes | None]:
    return [None if v is None else struct.pack("<d", v) for v in values]


@pytest.mark.parametrize("vector_rows", [1, exact_sum._VECTOR_ROWS])
def test_the_vectorized_fold_equals_the_per_row_fold_bit_for_bit(monkeypatch, vector_rows):
    """The numpy fold (``fold_arrow``) against the definition (``fold_arrow_reference``) on seeded
    random batches: NaN (any payload), infinities, -0.0, subnormals, the largest doubles,
    cancellation, zero/big/NULL-free weights, NULL values and lists, sliced batches; folded
    whole columns at a time (``vector_rows`` 1) and as ``fold_arrow`` chooses."""
    monkeypatch.setattr(exact_sum, "_VECTOR_ROWS", vector_rows)
    specs = [FoldSpec(old="old", pairs="pairs", count="count", state="s", result="r", mean=False),
             FoldSpec(old="old", pairs="pairs", count="count", state="s2", result="m", mean=True)]
    rnd = random.Random(20261123)
    for round_ in range(60):
        batch = _random_batch(rnd, rnd.choice([1, 2, 7, 40, 200]))
        if round_ % 3 == 0 and batch.num_rows > 2:
            batch = batch.slice(1, batch.num_rows - 2)
        got, want = exact_sum.fold_arrow(batch, specs), exact_sum.fold_arrow_reference(batch, specs)
        for name in ("s", "s2"):
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), round_
        for name in ("r", "m"):
            assert _bits(got.column(name).to_pylist()) == _bits(want.column(name).to_pylist())


def _edge_value(rnd: random.Random) -> float:
    """A double whose sums with others land on the column fold's edges: mantissas of 53 bits
    that sum to 54, 64 or 65 bits (ties and the sticky bit), values at the top of the range
    (sums that round to or beyond the largest double), subnormals, and money."""
    kind = rnd.random()
    if kind < 0.3:
        return rnd.choice([1.0, 2.0 ** 53, 2.0 ** 53 + 2, 2.0 ** 64, 2.0 ** 11, 3 * 2.0 ** 10,
                           2.0 ** -53, 2.0 ** 63 + 2.0 ** 11, 1.7976931348623157e308,
                           2.0 ** 970, 2.0 ** 969, 5e-324, 2.2250738585072014e-308, 0.0])
    if kind < 0.5:
        return round(rnd.uniform(-1000, 1000), 2)
    if kind < 0.7:  # a random mantissa at an exponent near 2**0 or 2**60 (sums of 54-70 bits)
        return rnd.choice([-1, 1]) * (rnd.getrandbits(53) | 1) * 2.0 ** rnd.choice(
            [-52, -40, -11, 0, 8, 11])
    return rnd.uniform(-1, 1) * 2.0 ** rnd.randint(-1074, 1023)


def test_the_column_fold_equals_the_per_row_fold_on_its_edges(monkeypatch):
    """``_fold_column`` (whole columns; most rows taken by it, not by its per-row fallback)
    against ``fold_arrow_reference``, bit for bit, on sums rounding to even at a tie, with the
    sticky bit beyond 64 bits, at the top of the double range (rounding up to infinity), in
    the subnormals, cancelling to zero or to a negative, longer than ``_LONG_BITS``, old
    states longer than ``_LONG_DIGITS`` or with NaN, empty old texts; sliced, large_string,
    in blocks of a few rows."""
    monkeypatch.setattr(exact_sum, "_VECTOR_ROWS", 1)
    rnd = random.Random(20261127)
    spec = [FoldSpec(old="old", pairs="pairs", count="count", state="s", result="r", mean=False),
            FoldSpec(old="old", pairs="pairs", count="count", state="s2", result="m", mean=True)]
    long_old = encode(of_pairs([1e200, 1e-200, 3.0], [1, 1, 1]))
    assert len(long_old.split("p")[0]) > exact_sum._LONG_DIGITS
    for round_ in range(40):
        olds, pairs = [], []
        for _ in range(rnd.choice([3, 50, 500])):
            kind = rnd.random()
            if kind < 0.2:
                olds.append(None)
            elif kind < 0.23:
                olds.append(rnd.choice(["", long_old, encode(of_pairs([math.nan, 1.5], [1, 1])),
                                        encode(of_pairs([1.7976931348623157e308] * 2, [1, 1]))]))
            else:
                olds.append(encode(of_pairs([_edge_value(rnd) for _ in range(rnd.randint(1, 3))],
                                            [rnd.choice([1, -1, 2]) for _ in range(3)])))
            if rnd.random() < 0.05:
                pairs.append(None)
            else:
                pairs.append([{"_v": _edge_value(rnd), "_w": rnd.choice([1, -1, 1, 2, -3])}
                              for _ in range(rnd.choice([0, 1, 1, 2, 4]))])
        string = pa.large_string() if round_ % 5 == 0 else pa.string()
        batch = pa.RecordBatch.from_pydict({
            "old": pa.array(olds, string), "pairs": pa.array(pairs, pa.list_(_PAIR)),
            "count": pa.array([rnd.choice([1, 2, 3, 0]) for _ in olds], pa.int64())})
        if round_ % 4 == 1:
            batch = batch.slice(1, batch.num_rows - 1)
        # blocks of a few rows each (``_limb_blocks``), or one
        monkeypatch.setattr(exact_sum, "_CHUNK_CELLS", 200 if round_ % 2 else 1 << 21)
        got = exact_sum.fold_arrow(batch, spec)
        want = exact_sum.fold_arrow_reference(batch, spec)
        assert got.schema == want.schema
        for name in ("s", "s2"):
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), round_
        for name in ("r", "m"):
            assert _bits(got.column(name).to_pylist()) == _bits(want.column(name).to_pylist())


def test_the_column_fold_rounds_ties_to_even_and_overflows_as_python_does(monkeypatch):
    """Known roundings of the column fold: a 54-bit tie rounds to even (down, then up), a tie
    in the top 64 bits of a longer sum rounds up (the bits below are not zero), the largest
    double plus half its unit in the last place rounds to infinity, and cancelling leaves
    ``0``."""
    monkeypatch.setattr(exact_sum, "_VECTOR_ROWS", 1)
    cases = [([2.0 ** 53, 1.0], 2.0 ** 53), ([2.0 ** 53 + 2, 1.0], 2.0 ** 53 + 4),
             ([2.0 ** 63, 2.0 ** 10, 2.0 ** -60], 2.0 ** 63 + 2.0 ** 11),
             ([2.0 ** 64, 2.0 ** 11, 1.0], 2.0 ** 64 + 2.0 ** 12),  # 65 bits: the sticky bit
             ([2.0 ** 64, 2.0 ** 11], 2.0 ** 64),  # a tie, to even
             ([1.7976931348623157e308, 2.0 ** 970], math.inf),
             ([-1.7976931348623157e308, -(2.0 ** 970)], -math.inf),
             ([1.7976931348623157e308, 2.0 ** 969], 1.7976931348623157e308),
             ([0.1, -0.1], 0.0), ([5e-324, 5e-324], 1e-323), ([-3.5, 1.25], -2.25)]
    batch = pa.RecordBatch.from_pydict({
        "old": pa.array([None] * len(cases), pa.string()),
        "pairs": pa.array([[{"_v": v, "_w": 1} for v in values] for values, _ in cases],
                          pa.list_(_PAIR)),
        "count": pa.array([1] * len(cases), pa.int64())})
    spec = [FoldSpec(old="old", pairs="pairs", count="count", state="s", result="r", mean=False)]
    got = exact_sum.fold_arrow(batch, spec)
    assert got.column("r").to_pylist() == [want for _, want in cases]
    assert got.column("s").to_pylist()[8] == "0"  # (0.1 - 0.1)
    assert got.column("s").to_pylist() == exact_sum.fold_arrow_reference(
        batch, spec).column("s").to_pylist()


def test_the_vectorized_fold_sums_wide_groups_exactly():
    """One group of many pairs spanning the whole exponent range (many limbs, carries) and
    money-like groups that cancel to exactly zero."""
    rnd = random.Random(7)
    wide = [rnd.uniform(-1, 1) * 2.0 ** rnd.randint(-1074, 1023) for _ in range(5_000)]
    money = [round(rnd.uniform(0, 500), 2) for _ in range(5_000)]
    ones = 4 - 2.0 ** -51  # all 53 mantissa bits set, at the top of a limb: the biggest terms
    pairs = [[{"_v": v, "_w": 1} for v in wide],
             [{"_v": v, "_w": 1} for v in money] + [{"_v": v, "_w": -1} for v in money],
             [{"_v": v, "_w": 3} for v in money],
             [{"_v": ones, "_w": (1 << 28) - 1}] * 64]  # would overflow an int64 limb
    batch = pa.RecordBatch.from_pydict({
        "old": pa.array([None, encode(of_pairs([0.1], [1])), None, None], pa.string()),
        "pairs": pa.array(pairs, pa.list_(_PAIR)), "count": pa.array([1, 1, 1, 1], pa.int64())})
    spec = [FoldSpec(old="old", pairs="pairs", count="count", state="s", result="r", mean=False)]
    got = exact_sum.fold_arrow(batch, spec)
    assert got.column("s").to_pylist() == exact_sum.fold_arrow_reference(
        batch, spec).column("s").to_pylist()
    assert got.column("r").to_pylist() == [math.fsum(wide), 0.1, math.fsum(money * 3),
                                           of_pairs([ones], [((1 << 28) - 1) * 64]).value()]


def _few_rows_of_many_pairs(rnd: random.Random) -> pa.Array:
    """A pairs column of 1-5 rows of 100-3,000 pairs each over a narrow range of exponents
    (the shape ``_finite_sums`` sums per cell): somewhere in the double range, at its bottom
    (subnormals, whose exponent field 0 and 1 share a scale) or top; with zeros, -0.0,
    money-like values that cancel, and now and then NaN, infinities, NULL values, a NULL list
    and weights up to the bound of the vectorized sums."""
    base = rnd.choice([0, 1, rnd.randint(2, 2040), 2040])
    rows = []
    for _ in range(rnd.randint(1, 5)):
        if rnd.random() < 0.1:
            rows.append(None)
            continue
        n = rnd.randint(100, 3_000)
        bound = (1 << 29) // n - 1
        pairs = []
        for _ in range(n):
            kind = rnd.random()
            if kind < 0.05:
                v = rnd.choice([0.0, -0.0])
            elif kind < 0.06 and base % 3 == 0:
                v = rnd.choice([math.nan, math.inf, -math.inf, None])
            else:
                e = min(2046, base + rnd.randint(0, 4))
                bits = (rnd.getrandbits(1) << 63) | (e << 52) | rnd.getrandbits(52)
                v = struct.unpack("<d", struct.pack("<Q", bits))[0]
            w = rnd.choice([1, -1, 2]) if rnd.random() < 0.9 else rnd.randint(-bound, bound)
            pairs.append({"_v": v, "_w": w})
        rows.append(pairs)
    return pa.array(rows, pa.list_(_PAIR))


def test_few_rows_of_many_pairs_sum_exactly_per_cell():
    """The per-cell sums (``_cell_sums``, chosen for a few rows of many pairs) give the integers
    of ``of_pairs``, as the limb sums do, on seeded random columns of that shape (sliced too)."""
    rnd = random.Random(20261127)
    for round_ in range(40):
        pairs = _few_rows_of_many_pairs(rnd)
        if round_ % 4 == 0 and len(pairs) > 2:
            pairs = pairs.slice(1, len(pairs) - 1)
        want = [of_pairs([p["_v"] for p in row], [p["_w"] for p in row]) if row else ExactSum()
                for row in pairs.to_pylist()]
        assert exact_sum.pair_sums(pairs) == want, round_


def test_the_cell_sums_equal_the_limb_sums():
    """Both ways of ``_finite_sums`` give the same integers, at the largest pieces and weights
    they take (every mantissa bit set, a row's weights summing to just below the bound)."""
    import numpy as np

    rnd = random.Random(11)
    for _ in range(30):
        rows = rnd.randint(1, 4)
        n = rnd.randint(1, 4_000)
        pair_row = np.sort(np.array([rnd.randrange(rows) for _ in range(n)], dtype=np.int64))
        low = rnd.choice([0, 1, rnd.randint(2, 2040)])
        span = rnd.randint(1, 6)
        exponent = np.array([min(2046, low + rnd.randrange(span)) for _ in range(n)],
                            dtype=np.int64)
        full = rnd.random() < 0.3
        fraction = np.array([(1 << 52) - 1 if full else rnd.getrandbits(52) for _ in range(n)],
                            dtype=np.uint64)
        bound = (1 << 29) // n - 1
        weight = np.array([rnd.choice([bound, -bound, 1, -1]) for _ in range(n)],
                          dtype=np.int64)
        span = int(exponent.max()) - int(exponent.min()) + 1
        cells = exact_sum._cell_sums(rows, pair_row, exponent, fraction, weight,
                                     int(exponent.min()), span)
        assert cells == exact_sum._limb_sums(rows, pair_row, exponent, fraction, weight)


def test_a_table_of_many_small_chunks_is_folded_as_one_batch(monkeypatch):
    """``fold_table`` folds a table of many chunks whole (in ``_fold_column``), with the same
    result as the definition on the same rows."""
    calls = []
    original = exact_sum._fold_column
    monkeypatch.setattr(exact_sum, "_fold_column",
                        lambda *a: calls.append(len(a[0])) or original(*a))
    rnd = random.Random(5)
    batch = _random_batch(rnd, 1000)
    table = pa.Table.from_batches([batch.slice(i, 50) for i in range(0, 1000, 50)])
    spec = [FoldSpec(old="old", pairs="pairs", count="count", state="s", result="r", mean=False)]
    got = exact_sum.fold_table(table, spec)
    want = exact_sum.fold_arrow_reference(batch, spec)
    assert calls == [1000]
    assert got.column("s").to_pylist() == want.column("s").to_pylist()
    assert _bits(got.column("r").to_pylist()) == _bits(want.column("r").to_pylist())


_STATE_PAIRS = pa.list_(pa.struct([("_v", pa.string()), ("_w", pa.int64())]))


@pytest.mark.parametrize("rows", [5, 600], ids=["per-row", "vectorized"])
def test_a_fold_of_partial_sums_is_the_exact_sum_of_their_values(rows):
    """``merge``: the pairs are encoded sums with weights (eager aggregation's partial sums,
    ``sum_of_states``). The fold equals its definition (each state times its weight, added in
    Python integers) bit for bit, with NULL lists and states, zero states, NaN and infinity
    counts, and sums from the subnormals to the top of the double range."""
    rng = random.Random(rows)

    def a_sum() -> ExactSum:
        values = [rng.choice([round(rng.uniform(1, 200), 2),
                              rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300),
                              1e308, -1e308, 5e-324, 0.0, math.nan, math.inf, -math.inf])
                  for _ in range(rng.randint(0, 5))]
        return of_pairs(values, [rng.choice([1, -1, 2]) for _ in values])

    lists, olds, counts = [], [], []
    for _ in range(rows):
        lists.append(None if rng.random() < 0.1 else [
            {"_v": encode(a_sum()) if rng.random() > 0.1 else None, "_w": rng.choice([1, -1, 3])}
            for _ in range(rng.randint(0, 4))])
        olds.append(encode(a_sum()) if rng.random() > 0.3 else None)
        counts.append(rng.choice([0, 1, 2]))
    batch = pa.record_batch({"o": pa.array(olds, pa.string()), "p": pa.array(lists, _STATE_PAIRS),
                             "c": pa.array(counts, pa.int64())})
    spec = FoldSpec(old="o", pairs="p", count="c", state="s", result="r", mean=False, merge=True)
    got, want = exact_sum.fold_arrow(batch, [spec]), exact_sum.fold_arrow_reference(batch, [spec])
    assert got.column("s").to_pylist() == want.column("s").to_pylist()
    assert [struct.pack("<d", v) if v is not None else None for v in got.column("r").to_pylist()
            ] == [struct.pack("<d", v) if v is not None else None
                  for v in want.column("r").to_pylist()]


@pytest.mark.parametrize("vector_rows", [1, exact_sum._VECTOR_ROWS], ids=["compiled", "per-row"])
def test_partial_sums_beyond_the_double_range_and_big_weights_merge_exactly(monkeypatch,
                                                                          vector_rows):
    """A partial sum above the largest double, partial sums with NaN and infinity counts, and
    weights whose magnitudes (or their sum) leave what the compiled fold's limbs take (2**62
    twice, -2**63, 2**63 - 1 and 2) merge exactly, as the definition does, on either path (the
    compiled fold sends those rows to Python integers; weights reach 2**62 where a join's
    weights multiply)."""
    monkeypatch.setattr(exact_sum, "_VECTOR_ROWS", vector_rows)
    big = encode(ExactSum(3 << (1030 + exact_sum.SCALE_BITS)))  # 3 * 2**1030
    beyond = encode(ExactSum(1 << (1100 + exact_sum.SCALE_BITS)))
    lists = [[{"_v": big, "_w": 1}, {"_v": big, "_w": -1}, {"_v": big, "_w": 2}],
             [{"_v": "-ffp-1074;1;0;2", "_w": -2}],
             [{"_v": beyond, "_w": 1}],
             [{"_v": "1p0", "_w": 1 << 62}, {"_v": "1p0", "_w": 1 << 62}],
             [{"_v": "3p0", "_w": -(1 << 63)}],
             [{"_v": "1p0", "_w": (1 << 63) - 1}, {"_v": "1p0", "_w": 2}],
             [{"_v": "1p0", "_w": 1 << 28}, {"_v": "1p0", "_w": (1 << 28) - 2}]]
    batch = pa.record_batch({"o": pa.array([None, "1p0", None, None, None, None, None]),
                             "p": pa.array(lists, _STATE_PAIRS),
                             "c": pa.array([1] * len(lists), pa.int64())})
    spec = [FoldSpec(old="o", pairs="p", count="c", state="s", result="r", mean=False,
                     merge=True)]
    got, want = exact_sum.fold_arrow(batch, spec), exact_sum.fold_arrow_reference(batch, spec)
    assert got.column("s").to_pylist() == want.column("s").to_pylist()
    assert _bits(got.column("r").to_pylist()) == _bits(want.column("r").to_pylist())
    assert decode(got.column("s")[0].as_py()) == ExactSum(2 * (3 << (1030 + exact_sum.SCALE_BITS)))
    assert got.column("s").to_pylist()[3:6] == ["1p63", "-3p63", "8000000000000001p0"]


def test_the_compiled_fold_of_partial_sums_equals_the_definition_on_its_edges(monkeypatch):
    """``merge`` folded whole columns (``exact_sum_kernel``): partial sums at the column fold's
    edges (ties, the sticky bit, the top of the range and past it, subnormals, cancelling),
    longer than ``_LONG_DIGITS``, with NaN or infinity counts, empty or NULL, weighted by small
    and by big weights (rows whose weights reach the limbs' bound go through Python integers);
    old states of the same kinds; sliced and large_string columns. Bit for bit the definition."""
    monkeypatch.setattr(exact_sum, "_VECTOR_ROWS", 1)
    rnd = random.Random(20261201)
    long_state = encode(of_pairs([1e200, 1e-200, 3.0], [1, 1, 1]))
    past_top = encode(ExactSum(3 << (1030 + exact_sum.SCALE_BITS)))

    def a_state() -> str | None:
        kind = rnd.random()
        if kind < 0.08:
            return rnd.choice([None, "", "0", long_state, past_top,
                               encode(of_pairs([math.nan, 2.5], [1, 1])),
                               encode(of_pairs([math.inf, -1.0], [2, 1]))])
        return encode(of_pairs([_edge_value(rnd) for _ in range(rnd.randint(1, 3))],
                               [rnd.choice([1, -1, 2]) for _ in range(3)]))

    spec = [FoldSpec(old="o", pairs="p", count="c", state="s", result="r", mean=False,
                     merge=True),
            FoldSpec(old="o", pairs="p", count="c", state="s2", result="m", mean=True,
                     merge=True)]
    for round_ in range(30):
        rows = rnd.choice([2, 40, 300])
        lists = [None if rnd.random() < 0.05 else [
            {"_v": a_state(), "_w": rnd.choice([1, -1, 1, 2, -3, 0, 1 << 27, -(1 << 28)])}
            for _ in range(rnd.choice([0, 1, 2, 2, 5]))] for _ in range(rows)]
        string = pa.large_string() if round_ % 3 == 0 else pa.string()
        batch = pa.record_batch({
            "o": pa.array([a_state() for _ in range(rows)], string),
            "p": pa.array(lists, pa.list_(pa.struct([("_v", string), ("_w", pa.int64())]))),
            "c": pa.array([rnd.choice([0, 1, 3]) for _ in range(rows)], pa.int64())})
        if round_ % 4 == 1:
            batch = batch.slice(1, batch.num_rows - 1)
        got = exact_sum.fold_arrow(batch, spec)
        want = exact_sum.fold_arrow_reference(batch, spec)
        for name in ("s", "s2"):
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), round_
        for name in ("r", "m"):
            assert _bits(got.column(name).to_pylist()) == _bits(want.column(name).to_pylist())


def test_old_states_of_any_string_encoding_fold_alike(monkeypatch):
    """The old state column as pyarrow may hand it over (NULL-typed for a step of new groups
    only, dictionary-encoded, a string view, large strings) folds as a string column does."""
    monkeypatch.setattr(exact_sum, "_VECTOR_ROWS", 1)
    pairs = pa.array([[{"_v": 1.5, "_w": 1}], [{"_v": 2.25, "_w": -1}]], pa.list_(_PAIR))
    spec = [FoldSpec(old="old", pairs="pairs", count="count", state="s", result="r", mean=False)]
    want = None
    for old in (pa.array(["1p0", None]), pa.array([None, None], pa.null()),
                pa.array(["1p0", None]).dictionary_encode(),
                pa.array(["1p0", None], pa.string_view()),
                pa.array(["1p0", None], pa.large_string())):
        batch = pa.record_batch({"old": old, "pairs": pairs,
                                 "count": pa.array([1, 1], pa.int64())})
        got = exact_sum.fold_arrow(batch, spec)
        ref = exact_sum.fold_arrow_reference(batch, spec)
        assert got.column("s").to_pylist() == ref.column("s").to_pylist()
        assert _bits(got.column("r").to_pylist()) == _bits(ref.column("r").to_pylist())
        if old.type != pa.null():
            want = want or got.column("s").to_pylist()
            assert got.column("s").to_pylist() == want == ["5p-1", "-9p-2"]
