"""The pyarrow fast path of ``LocalSQL.consolidate`` gives DuckDB's table, bit for bit, or does
not run: random small Z-sets over several key columns (NULLs, strings, decimals, timestamps,
doubles with zeros, -0.0 and NaN), zero-sum rows, and weights near the int64 limit."""

from __future__ import annotations

import datetime
import decimal
import math
import random

import numpy as np
import pyarrow as pa
import pytest

from dbsp_pipeline.driver import sql as local_sql
from dbsp_pipeline.driver.sql import LocalSQL, consolidate_arrow, fast_path

SCHEMA = pa.schema([("s", pa.string()), ("i", pa.int32()), ("d", pa.decimal128(10, 2)),
                    ("t", pa.timestamp("us", tz="UTC")), ("f", pa.float64()),
                    ("_weight", pa.int64())])
COLUMNS = ["s", "i", "d", "t", "f"]


def _value(rng: random.Random, column: str, odd_floats: bool) -> object:
    if rng.random() < 0.2:
        return None
    if column == "s":
        return rng.choice(["", "a", "b", "é"])
    if column == "i":
        return rng.choice([-1, 0, 7])
    if column == "d":
        return decimal.Decimal(rng.choice(["0.00", "1.10", "-2.50"]))
    if column == "t":
        return datetime.datetime(2026, 1, rng.choice([1, 2]), tzinfo=datetime.UTC)
    return rng.choice([1.5, 0.0, 2.25] + ([-0.0, math.nan] if odd_floats else []))


def random_zset(rng: random.Random, rows: int, odd_floats: bool = False) -> pa.Table:
    """``rows`` rows over small domains (so rows repeat and cancel), weights in [-3, 3]."""
    records = [{**{c: _value(rng, c, odd_floats) for c in COLUMNS},
                "_weight": rng.choice([-3, -1, 1, 1, 2])} for _ in range(rows)]
    return pa.Table.from_pylist(records, schema=SCHEMA)


def _bits(table: pa.Table) -> list[str]:
    """The rows as sortable text that tells -0.0 from 0.0 (``repr``) and keeps NaN."""
    return sorted(repr(sorted(r.items())) for r in table.to_pylist())


def test_fast_consolidation_equals_duckdb_bit_for_bit(monkeypatch):
    sql, rng = LocalSQL(), random.Random(14)
    ran_fast = 0
    for case in range(300):
        table = random_zset(rng, rng.randint(0, 60), odd_floats=case % 10 == 0)
        columns = rng.sample(COLUMNS, rng.randint(1, len(COLUMNS)))
        monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 0)  # DuckDB
        expected = sql.consolidate(table, columns)
        monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 4096)
        ran_fast += fast_path(table, columns)
        got = sql.consolidate(table, columns)  # fast, or DuckDB where it must
        assert _bits(got) == _bits(expected.cast(got.schema)), (case, columns)
        if fast_path(table, columns):
            assert got.schema == table.select([*columns, "_weight"]).schema
    assert ran_fast > 250  # only tables with -0.0 / NaN keys were left to DuckDB


def test_negative_zero_and_nan_keys_go_to_duckdb():
    """pyarrow groups floats by their bits: -0.0 and 0.0, or NaNs, would not meet."""
    for odd in (-0.0, math.nan):
        table = pa.table({"f": [0.0, odd, 1.0], "_weight": [1, 1, 1]})
        assert not fast_path(table, ["f"])
        assert fast_path(table, [])  # no key: nothing to compare
    for odd in (-0.0, math.nan):  # in a later chunk of a float32 column, beside a NULL
        column = pa.chunked_array([[1.0, None], [odd, 2.0]], pa.float32())
        assert not fast_path(pa.table({"f": column, "_weight": [1, 1, 1, 1]}), ["f"])
    table = pa.table({"f": [0.0, 0.0, None], "_weight": [1, -1, 2]})
    assert fast_path(table, ["f"])
    assert consolidate_arrow(table, ["f"]).to_pylist() == [{"f": None, "_weight": 2}]


def test_weight_sums_that_could_wrap_go_to_duckdb_and_raise_there():
    """pyarrow's sum wraps around silently; DuckDB's raises, as consolidation always did."""
    big = pa.table({"k": [1, 1], "_weight": pa.array([2**62, 2**62], pa.int64())})
    assert not fast_path(big, ["k"])
    with pytest.raises(Exception, match="out of range"):
        LocalSQL().consolidate(big, ["k"])
    fits = pa.table({"k": [1, 1], "_weight": pa.array([2**61, 2**61], pa.int64())})
    assert fast_path(fits, ["k"])
    assert consolidate_arrow(fits, ["k"]).to_pylist() == [{"k": 1, "_weight": 2**62}]


def test_big_tables_go_to_duckdb(monkeypatch):
    table = random_zset(random.Random(1), 50)
    monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 49)
    assert not fast_path(table, ["s"])


@pytest.mark.parametrize("fast_rows", [0, local_sql.FAST_PATH_ROWS], ids=["duckdb", "pyarrow"])
def test_a_table_consolidate_returned_is_not_consolidated_again(monkeypatch, fast_rows):
    monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", fast_rows)
    sql = LocalSQL(1)
    table = pa.table({"k": [1, 1, 2, 3], "_weight": pa.array([1, 1, 1, -1], pa.int64())})
    once = sql.consolidate(table, ["k"])
    assert once.sort_by("k").to_pylist() == [{"k": 1, "_weight": 2}, {"k": 2, "_weight": 1},
                                             {"k": 3, "_weight": -1}]
    assert sql.consolidate(once, ["k"]) is once  # remembered, over the same columns
    # the same rows in another table, or over other columns, are consolidated again
    copy = pa.table({"k": [1, 1], "_weight": pa.array([1, 1], pa.int64())})
    assert sql.consolidate(copy, ["k"]).to_pylist() == [{"k": 1, "_weight": 2}]
    assert sql.consolidate(once, []).to_pylist() == [{"_weight": 2}]
    remembered = len(sql._consolidated)
    del once  # a table that is gone is forgotten (the memo holds no memory)
    assert len(sql._consolidated) == remembered - 1
    sql.close()


def test_rows_of_a_consolidated_table_are_taken_as_consolidated():
    sql = LocalSQL(1)
    table = pa.table({"k": [1, 1, 2, 3], "_weight": pa.array([1, 1, 1, -1], pa.int64())})
    once = sql.consolidate(table, ["k"])
    some = once.filter(pa.array([True, False, True]))
    sql.consolidated_subset(some, once)
    assert sql.consolidate(some, ["k"]) is some
    assert sql.consolidate(some, []) is not some  # over other columns it is not
    # rows of a table consolidate did not return are consolidated when asked
    other = table.filter(pa.array([True, True, False, False]))
    sql.consolidated_subset(other, table)
    assert sql.consolidate(other, ["k"]).to_pylist() == [{"k": 1, "_weight": 2}]
    sql.close()


@pytest.mark.parametrize("columns", [["s"], ["i"], ["s", "i", "d"], COLUMNS[:4]])
def test_match_distinct_pairs_rows_as_a_null_safe_left_join(columns):
    """For random tables (NULL keys, repeated keys on the left), the index ``match_distinct``
    gives each left row is the right row DuckDB's ``LEFT JOIN ... IS NOT DISTINCT FROM`` pairs
    it with; with a right key repeated it declines."""
    rng = random.Random(7)
    sql = LocalSQL()
    declined = 0
    for _ in range(60):
        left = random_zset(rng, rng.randint(0, 30)).select(columns)
        right = random_zset(rng, rng.randint(0, 12)).select(columns)
        right = right.append_column("_r", pa.array(range(right.num_rows), pa.int64()))
        left = left.append_column("_l", pa.array(range(left.num_rows), pa.int64()))
        on = " AND ".join(f'l."{c}" IS NOT DISTINCT FROM r."{c}"' for c in columns)
        pairs = sql.query(f"SELECT l._l, r._r FROM l LEFT JOIN r ON {on} ORDER BY l._l, r._r",
                          l=left, r=right)
        distinct = sql.query(f"SELECT count(*) AS n FROM (SELECT DISTINCT {', '.join(columns)} "
                             "FROM r)", r=right).column("n")[0].as_py()
        matched = local_sql.match_distinct(left, right, columns)
        if distinct < right.num_rows:
            assert matched is None
            declined += 1
            continue
        assert matched is not None and len(matched) == left.num_rows
        assert pa.chunked_array([matched]).combine_chunks().cast(pa.int64()).to_pylist() \
            == pairs.column("_r").to_pylist()
    assert 0 < declined < 50


def test_equal_as_grouped_is_what_consolidation_cancels(monkeypatch):
    """Row i of one table and row i of another are equal (``equal_as_grouped``) exactly when
    DuckDB's consolidation of the two, one retracted and one inserted, leaves nothing: NULL
    equals NULL, -0.0 equals 0.0, a NaN equals a NaN."""
    monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 0)
    rng = random.Random(7)
    sql = LocalSQL()
    a = random_zset(rng, 300, odd_floats=True)
    # half the pairs repeat a's row but for one column, so most columns agree
    rows = a.to_pylist()
    twins = []
    for r in rows:
        twin = dict(r)
        if rng.random() < 0.5:
            column = rng.choice(COLUMNS)
            twin[column] = _value(rng, column, odd_floats=True)
        twins.append(twin)
    b = pa.Table.from_pylist(twins, schema=SCHEMA)
    same = local_sql.equal_as_grouped(a, b, COLUMNS)
    assert same is not None and same.any() and not same.all()
    for i in range(a.num_rows):
        pair = pa.concat_tables([a.slice(i, 1).set_column(5, "_weight", pa.array([-1])),
                                 b.slice(i, 1).set_column(5, "_weight", pa.array([1]))])
        assert (sql.consolidate(pair, COLUMNS).num_rows == 0) == bool(same[i]), (rows[i],
                                                                                twins[i])


#: per type it compares, value pairs: equal or not as DuckDB groups them (checked below)
_TYPED_PAIRS = [
    (pa.float64(), [(-0.0, 0.0), (math.nan, -math.nan), (math.nan, 1.0), (None, 0.0),
                    (None, None), (1.5, 1.5000000000000002)]),
    (pa.float32(), [(-0.0, 0.0), (math.nan, math.nan), (1.0, 2.0), (None, None)]),
    (pa.int8(), [(1, 1), (1, -1), (None, 0)]),
    (pa.int32(), [(7, 7), (7, 8)]),
    (pa.bool_(), [(True, True), (True, False), (None, False)]),
    (pa.binary(), [(b"a\x00", b"a\x00"), (b"a\x00", b"a")]),
    (pa.string(), [("ß", "ss"), ("a", "A"), ("", None), ("é", "é")]),
    (pa.date32(), [(datetime.date(2026, 1, 1), datetime.date(2026, 1, 1)),
                   (datetime.date(2026, 1, 1), datetime.date(2026, 1, 2))]),
    (pa.time64("us"), [(datetime.time(1, 2, 3), datetime.time(1, 2, 3)),
                       (datetime.time(1, 2, 3), datetime.time(1, 2, 4))]),
    (pa.duration("us"), [(datetime.timedelta(days=30), datetime.timedelta(days=30)),
                         (datetime.timedelta(days=30), datetime.timedelta(days=31)),
                         (datetime.timedelta(seconds=-1), datetime.timedelta(seconds=1))]),
    (pa.timestamp("us", tz="UTC"), [(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
                                     datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)),
                                    (datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
                                     datetime.datetime(2026, 1, 1, 0, 0, 1,
                                                       tzinfo=datetime.UTC))]),
    (pa.decimal128(38, 2), [(decimal.Decimal("1.10"), decimal.Decimal("1.10")),
                            (decimal.Decimal("1.10"), decimal.Decimal("-1.10"))]),
]


@pytest.mark.parametrize("kind,pairs", _TYPED_PAIRS, ids=[str(k) for k, _ in _TYPED_PAIRS])
def test_equal_as_grouped_is_duckdbs_grouping_for_each_type(monkeypatch, kind, pairs):
    """For every type it compares, ``equal_as_grouped`` says equal exactly where DuckDB's
    consolidation of the pair (one retracted, one inserted) leaves nothing."""
    monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 0)
    sql = LocalSQL()
    a = pa.table({"v": pa.array([x for x, _ in pairs], kind)})
    b = pa.table({"v": pa.array([y for _, y in pairs], kind)})
    same = local_sql.equal_as_grouped(a, b, ["v"])
    assert same is not None
    for i, (x, y) in enumerate(pairs):
        pair = pa.table({"v": pa.array([x, y], kind), "_weight": pa.array([-1, 1], pa.int64())})
        assert (sql.consolidate(pair, ["v"]).num_rows == 0) == bool(same[i]), (x, y)


def test_equal_as_grouped_takes_no_nested_or_mismatched_columns():
    lists = pa.table({"l": pa.array([[1], [2]])})
    assert local_sql.equal_as_grouped(lists, lists, ["l"]) is None
    halves = pa.table({"h": pa.array([1, 2], pa.float16())})
    assert local_sql.equal_as_grouped(halves, halves, ["h"]) is None
    dates = pa.table({"d": pa.array([0, 86_400_000], pa.date64())})
    assert local_sql.equal_as_grouped(dates, dates, ["d"]) is None
    assert local_sql.equal_as_grouped(pa.table({"x": pa.array([1, 2], pa.int32())}),
                                      pa.table({"x": pa.array([1, 2], pa.int64())}), ["x"]) is None


def test_filtered_returns_the_table_itself_when_the_mask_keeps_every_row():
    table = pa.table({"k": [1, 2, 3], "_weight": [1, -1, 2]})
    for keep_all in (pa.array([True, True, True]), pa.chunked_array([[True], [True, True]]),
                     np.ones(3, dtype=bool)):
        assert local_sql.filtered(table, keep_all) is table
    for some in (pa.array([True, False, True]), pa.chunked_array([[True], [False, True]]),
                 np.array([True, False, True])):
        out = local_sql.filtered(table, some)
        assert out.to_pydict() == {"k": [1, 3], "_weight": [1, 2]}
    assert local_sql.filtered(table, np.zeros(3, dtype=bool)).num_rows == 0
    kept = local_sql.filtered(table, pa.array([True, None, True]))  # NULL drops, as in filter
    assert kept.to_pydict() == {"k": [1, 3], "_weight": [1, 2]}


def test_a_zset_schema_follows_its_spark_schema_changed_in_place():
    """``zset_arrow_schema`` remembers a schema's Arrow form, but not past ``StructType.add``
    (which appends in place) or a new object at a dead one's address."""
    from pyspark.sql.types import LongType, StructField, StructType

    from dbsp_pipeline.driver.sql import zset_arrow_schema

    schema = StructType([StructField("a", LongType())])
    assert zset_arrow_schema(schema).names == ["a", "_weight"]
    assert zset_arrow_schema(schema) is zset_arrow_schema(schema)
    schema.add("b", LongType())
    assert zset_arrow_schema(schema).names == ["a", "b", "_weight"]
    schema.fields[0].name = "z"
    assert zset_arrow_schema(schema).names == ["z", "b", "_weight"]
