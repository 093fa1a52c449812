"""Consolidation by row hashes (``driver/row_groups.py``) gives DuckDB's consolidation, row for
row and in the input's types, or declines (None): random Z-sets over every type it groups, in
chunks and slices, with NULLs, repeats and cancellations; hashes that collide; sums past
int64."""

from __future__ import annotations

import datetime
import decimal
import math
import random

import numpy as np
import pyarrow as pa
import pytest

from dbsp_pipeline.driver import row_groups
from dbsp_pipeline.driver import sql as local_sql
from dbsp_pipeline.driver.sql import LocalSQL
from tests.driver.test_sql import COLUMNS, _bits, random_zset

#: per column type, a few values (so rows repeat and cancel)
_VALUES: dict[str, tuple[pa.DataType, list[object]]] = {
    "i8": (pa.int8(), [-128, 0, 127]),
    "u64": (pa.uint64(), [0, 2**64 - 1, 5]),
    "i64": (pa.int64(), [-(2**63), 1, 2**63 - 1]),
    "f32": (pa.float32(), [1.5, 0.0, -2.25]),
    "f64": (pa.float64(), [1e300, 0.0, -1.0]),
    "b": (pa.bool_(), [True, False]),
    "s": (pa.string(), ["", "a", "ß", "long enough to pass thirty-two bytes, the block size"]),
    "ls": (pa.large_string(), ["x", "y"]),
    "bin": (pa.binary(), [b"", b"\x00", b"\x00\x00"]),
    "d38": (pa.decimal128(38, 2), [decimal.Decimal("1.10"), decimal.Decimal("-1.10"),
                                   decimal.Decimal("123456789012345678901234567890123456.78")]),
    "d76": (pa.decimal256(76, 0), [decimal.Decimal(10**75), decimal.Decimal(-1)]),
    "dt": (pa.date32(), [datetime.date(2026, 1, 1), datetime.date(1969, 12, 31)]),
    "tm": (pa.time64("us"), [datetime.time(1, 2, 3), datetime.time(0)]),
    "ts": (pa.timestamp("us", tz="UTC"), [datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)]),
    "du": (pa.duration("us"), [datetime.timedelta(seconds=-1), datetime.timedelta(days=1)]),
}


def _table(rng: random.Random, rows: int, names: list[str]) -> pa.Table:
    columns = {}
    for name in names:
        kind, values = _VALUES[name]
        columns[name] = pa.array([None if rng.random() < 0.15 else rng.choice(values)
                                  for _ in range(rows)], kind)
    columns["_weight"] = pa.array([rng.choice([-2, -1, 1, 1, 3]) for _ in range(rows)],
                                  pa.int64())
    return pa.table(columns)


def _chunked(rng: random.Random, table: pa.Table) -> pa.Table:
    """``table`` as several chunks, some of them slices (arrays with an offset)."""
    if table.num_rows < 3:
        return table
    cut = sorted(rng.sample(range(1, table.num_rows), 2))
    padded = pa.concat_tables([table.slice(0, 1), table])  # sliced again below: offset 1
    return pa.concat_tables([table.slice(0, cut[0]),
                             padded.slice(cut[0] + 1, cut[1] - cut[0]),
                             table.slice(cut[1])])


def _duckdb(sql: LocalSQL, table: pa.Table, columns: list[str],
            monkeypatch: pytest.MonkeyPatch) -> pa.Table:
    with monkeypatch.context() as m:
        m.setattr(local_sql, "FAST_PATH_ROWS", 0)  # DuckDB
        return sql.consolidate(table, columns)


def _by_definition(table: pa.Table, columns: list[str]) -> list[str]:
    """The consolidation of ``table`` summed in Python over its rows' values (no -0.0 or NaN
    among them: equal values are equal rows), as ``_bits`` gives it."""
    sums: dict[tuple, int] = {}
    for row in table.to_pylist():
        key = tuple(row[c] for c in columns)
        sums[key] = sums.get(key, 0) + row["_weight"]
    return _bits(pa.Table.from_pylist(
        [{**dict(zip(columns, key)), "_weight": w} for key, w in sums.items() if w],
        schema=table.select([*columns, "_weight"]).schema))


def test_consolidation_by_row_hashes_is_the_definition():
    rng = random.Random(3)
    declined = 0
    for case in range(400):
        names = rng.sample(sorted(_VALUES), rng.randint(1, 4))
        table = _table(rng, rng.choice([0, 1, 2, 5, 40, 300]), names)
        if case % 2:
            table = _chunked(rng, table)
        got = row_groups.consolidated(table, names)
        if got is None:
            declined += 1
            continue
        assert got.schema == table.select([*names, "_weight"]).schema, case
        assert _bits(got) == _by_definition(table, names), (case, names)
    assert declined < 80  # (empty tables only)


def test_the_shared_random_zsets_too(monkeypatch):
    """Against DuckDB, over ``test_sql``'s Z-sets (-0.0 and NaN among the floats in every
    tenth: declined)."""
    sql, rng = LocalSQL(1), random.Random(9)
    for case in range(200):
        table = random_zset(rng, rng.randint(1, 80), odd_floats=case % 10 == 0)
        columns = rng.sample(COLUMNS, rng.randint(1, len(COLUMNS)))
        got = row_groups.consolidated(table, columns)
        if got is None:
            assert not local_sql.arrow_groups_like_duckdb(table, columns)
            continue
        expected = _duckdb(sql, table, columns, monkeypatch)
        assert _bits(got) == _bits(expected.cast(got.schema)), (case, columns)


def test_distinct_rows_are_returned_as_they_are():
    table = pa.table({"k": [3, 1, 2], "x": ["a", "b", "c"], "_weight": pa.array([1, -1, 2])})
    got = row_groups.consolidated(table, ["x", "k"])
    assert got is not None and got.column_names == ["x", "k", "_weight"]
    assert got.column("k").chunk(0).buffers()[1].address \
        == table.column("k").chunk(0).buffers()[1].address  # (no copy)
    zeros = pa.table({"k": [3, 1, 2], "_weight": pa.array([1, 0, 2])})
    assert row_groups.consolidated(zeros, ["k"]).to_pylist() == [{"k": 3, "_weight": 1},
                                                                  {"k": 2, "_weight": 2}]


def test_rows_first_occurrence_order_and_sums():
    table = pa.table({"k": [2, 1, 2, 3, 1, 3], "_weight": pa.array([1, 1, 4, 1, -1, -1])})
    assert row_groups.consolidated(table, ["k"]).to_pylist() == [{"k": 2, "_weight": 5}]


def test_nulls_hash_apart_from_values_in_any_column():
    """``(NULL, 5)`` and ``(5, NULL)`` are two rows, and hash apart (no check needed)."""
    table = pa.table({"a": pa.array([None, 5], pa.int64()), "b": pa.array([5, None], pa.int64()),
                      "_weight": pa.array([1, -1])})
    hashes = row_groups.row_hashes(table, ["a", "b"])
    assert hashes[0] != hashes[1]
    assert row_groups.consolidated(table, ["a", "b"]).num_rows == 2


def test_colliding_hashes_are_checked(monkeypatch):
    """Rows that share a hash are compared: unequal ones (a collision) decline, equal ones
    are summed."""
    monkeypatch.setattr(row_groups, "_hashes",
                        lambda columns, rows: np.zeros(rows, dtype=np.uint64))
    unequal = pa.table({"k": ["a", "b", "a"], "_weight": pa.array([1, 1, 1])})
    assert row_groups.consolidated(unequal, ["k"]) is None
    with monkeypatch.context() as m:  # LocalSQL.consolidate falls back on its other paths
        m.setattr(local_sql, "FAST_PATH_ROWS", 2)
        assert sorted(LocalSQL(1).consolidate(unequal, ["k"]).to_pylist(),
                      key=lambda r: r["k"]) == [{"k": "a", "_weight": 2},
                                                {"k": "b", "_weight": 1}]
    equal = pa.table({"k": ["a", "a", "a"], "_weight": pa.array([1, 1, -2])})
    assert row_groups.consolidated(equal, ["k"]).num_rows == 0


def test_sums_beyond_int64_decline_and_duckdb_raises():
    big = pa.table({"k": [1, 1], "_weight": pa.array([2**62, 2**62], pa.int64())})
    assert row_groups.consolidated(big, ["k"]) is None
    with pytest.raises(Exception, match="out of range"):
        LocalSQL(1).consolidate(big, ["k"])
    down = pa.table({"k": [1, 1], "_weight": pa.array([-(2**63), -1], pa.int64())})
    assert row_groups.consolidated(down, ["k"]) is None
    edge = pa.table({"k": [1, 1, 2], "_weight": pa.array([2**62, 2**62 - 1, -(2**63)])})
    assert row_groups.consolidated(edge, ["k"]).to_pylist() == [
        {"k": 1, "_weight": 2**63 - 1}, {"k": 2, "_weight": -(2**63)}]


@pytest.mark.parametrize("odd", [-0.0, math.nan], ids=["negative zero", "nan"])
def test_floats_duckdb_groups_by_value_decline(odd):
    """-0.0 and 0.0, or two NaNs of other bits, are one row to DuckDB: declined, they cancel
    there."""
    twin = 0.0 if odd == 0 else -odd
    table = pa.table({"f": [twin, odd], "_weight": pa.array([1, -1])})
    assert row_groups.consolidated(table, ["f"]) is None
    assert LocalSQL(1).consolidate(table, ["f"]).num_rows == 0


def test_types_it_does_not_group_decline():
    for column in (pa.array([[1], [1]]), pa.array([1, 1], pa.float16()),
                   pa.array([0, 0], pa.date64()),
                   pa.array(["a", "a"]).dictionary_encode(),
                   pa.array(["a", "a"], pa.string_view())):
        table = pa.table({"c": column, "_weight": pa.array([1, 1])})
        assert row_groups.consolidated(table, ["c"]) is None, column.type
    assert row_groups.consolidated(pa.table({"_weight": pa.array([1])}), []) is None


def test_fields_are_made_as_the_other_paths_make_them():
    """Nullable and without metadata, whatever the input's fields say (a table of the other
    paths' output is concatenated with this one's)."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False, metadata={"a": "b"}),
                        pa.field("_weight", pa.int32(), nullable=False)])
    for weights in ([1, 2], [1, -1]):
        table = pa.table({"k": [1, 1 if weights[1] < 0 else 2], "_weight": weights},
                         schema=schema)
        assert row_groups.consolidated(table, ["k"]).schema == pa.schema(
            [("k", pa.int64()), ("_weight", pa.int64())])


def test_grouped_numbers_rows_as_group_by_does():
    rng = random.Random(5)
    for case in range(200):
        names = rng.sample(sorted(_VALUES), rng.randint(1, 3))
        table = _table(rng, rng.choice([1, 3, 50, 200]), names)
        if case % 2:
            table = _chunked(rng, table)
        rows = row_groups.grouped(table, names)
        assert rows is not None, case
        group, firsts = rows
        keys = [tuple(r[c] for c in names) for r in table.to_pylist()]
        seen: dict[tuple, int] = {}
        for i, key in enumerate(keys):  # numbered in order of first occurrence
            assert group[i] == seen.setdefault(key, len(seen)), (case, i)
        assert [keys[i] for i in firsts] == list(seen)


def test_best_row_of_each_group_is_the_extreme():
    from dbsp_pipeline.driver.row_groups_kernel import best_by_group

    rng = random.Random(8)
    for case in range(100):
        kind = rng.choice([pa.int32(), pa.int64(), pa.float64(), pa.float32(), pa.date32(),
                           pa.timestamp("us"), pa.uint8(), pa.duration("ms")])
        n = rng.randint(1, 60)
        raw = [rng.choice([0, 3, 120, 5] + ([] if kind == pa.uint8() else [-7]))
               for _ in range(n)]
        storage = {pa.date32(): pa.int32(), pa.timestamp("us"): pa.int64(),
                   pa.duration("ms"): pa.int64()}.get(kind)
        value = pa.chunked_array([pa.array(raw, storage).view(kind) if storage is not None
                                  else pa.array(raw, pa.int64()).cast(kind)])
        ordered = row_groups.ordered_values(value)
        assert ordered is not None and ordered.tolist() == raw
        group = np.array([rng.randint(0, 4) for _ in range(n)], dtype=np.int64)
        weights = np.array([rng.choice([-2, -1, 1, 3]) for _ in range(n)], dtype=np.int64)
        for smallest in (True, False):
            inserted, deleted = best_by_group(group, ordered, weights, 5, smallest)
            for g in range(5):
                for best, sign in ((inserted, 1), (deleted, -1)):
                    members = [ordered[i] for i in range(n)
                               if group[i] == g and weights[i] * sign > 0]
                    if not members:
                        assert best[g] == -1
                    else:
                        assert ordered[best[g]] == (min if smallest else max)(members), case


def test_ordered_values_take_only_what_orders_as_numbers():
    assert row_groups.ordered_values(pa.chunked_array([pa.array([1, None])])) is None
    assert row_groups.ordered_values(pa.chunked_array([pa.array([2**64 - 1], pa.uint64())])) \
        is None
    assert row_groups.ordered_values(pa.chunked_array([pa.array(["a"])])) is None
    assert row_groups.ordered_values(pa.chunked_array([pa.array([1.5], pa.float16())])) is None
    sliced = pa.chunked_array([pa.array([9, -4, 2], pa.int16()).slice(1),
                               pa.array([7], pa.int16())])
    assert row_groups.ordered_values(sliced).tolist() == [-4, 2, 7]
