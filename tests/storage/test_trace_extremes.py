"""``Trace.lookup_extreme_rows``: a min/max re-read takes a few rows a file through ordered
keyed runs, gives them consolidated and live, and the extreme of every key over them is its live
extreme over all its rows, whatever the files (runs, small files, runs not written yet), the
deletes of top values by later files, NULL keys and NaN values, and hash collisions."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from dbsp_pipeline.driver import hashing
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.storage import keyed_runs, run_search
from dbsp_pipeline.storage import trace as trace_module
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace

VALUES = [-math.inf, -3.5, 0.0, 1.0, 2.5, 7.0, 100.0, math.inf, math.nan]


def _extremes(sql: LocalSQL, rows: pa.Table, keys: pa.Table, key: list[str],
              largest: bool) -> list[tuple]:
    """The oracle's rule: per key of ``keys``, the max (min) of the values whose weights sum
    above zero in ``rows``, as DuckDB ranks them (NaN above every number)."""
    best = "max" if largest else "min"
    on = " AND ".join(f'r."{k}" IS NOT DISTINCT FROM k."{k}"' for k in key)
    cols = ", ".join(f'"{k}"' for k in key)
    found = sql.query(
        f"WITH live AS (SELECT {cols}, _v FROM r GROUP BY {cols}, _v HAVING sum(_weight) > 0)"
        f" SELECT {cols}, {best}(_v) AS e FROM (SELECT r.* FROM live r SEMI JOIN k ON {on})"
        f" GROUP BY {cols}", r=rows, k=keys)
    return sorted(repr(r) for r in found.to_pylist())


def _assert_live(sql: LocalSQL, got: pa.Table, key: list[str]) -> None:
    """The rows a lookup gives are live and consolidated: each (key, value) once (NaN equal to
    NaN, NULL to NULL, as DuckDB groups), every weight above zero."""
    cols = ", ".join(f'"{k}"' for k in [*key, "_v"])
    distinct = sql.query(f"SELECT count(*) AS n FROM (SELECT DISTINCT {cols} FROM g)", g=got)
    assert distinct.column("n")[0].as_py() == got.num_rows
    assert all(w > 0 for w in got.column("_weight").to_pylist())


def _batch(rng: np.random.Generator, n: int, groups: int, live: dict,
           values: list[float] = VALUES) -> pa.Table:
    """``n`` changes: inserts of random values, and deletes of the live largest and smallest
    values of random groups (the extremes a re-read must look past)."""
    g, v, w = [], [], []
    for _ in range(n):
        group = None if rng.random() < 0.05 else int(rng.integers(0, groups))
        present = [x for x, c in live.get(group, {}).items() if c > 0]
        if present and rng.random() < 0.4:
            value = max(present, key=lambda x: (math.isnan(x), x)) if rng.random() < 0.7 \
                else min(present, key=lambda x: (math.isnan(x), x))
            g.append(group), v.append(value), w.append(-1)
            live[group][value] -= 1
        else:
            value = values[int(rng.integers(0, len(values)))] if rng.random() < 0.3 \
                else float(rng.integers(-50, 50))
            g.append(group), v.append(value), w.append(1)
            live.setdefault(group, {}).setdefault(value, 0)
            live[group][value] += 1
    return pa.table({"g": pa.array(g, pa.int64()), "_v": pa.array(v, pa.float64()),
                     "_weight": pa.array(w, pa.int64())})


def _values_trace(db: StateDatabase, sql: LocalSQL, groups: int, per_group: int) -> Trace:
    """A min/max values trace in ``db`` (opened here) holding, in one file, the values
    ``0 .. per_group - 1`` of each of ``groups`` groups, once each."""
    db.open()
    schema = StructType([StructField("g", LongType()), StructField("_v", DoubleType())])
    trace = Trace(db, "values", schema, ["g"], order_by="_v")
    g = np.repeat(np.arange(groups), per_group)
    v = np.tile(np.arange(per_group, dtype=np.float64), groups)
    trace.append_arrow(sql, pa.table({"g": g, "_v": v, "_weight": np.ones(len(g), np.int64)}))
    return trace


@pytest.mark.parametrize("collide", [False, True], ids=["hashes", "colliding-hashes"])
@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
@pytest.mark.parametrize("batch_rows", [keyed_runs.BATCH_ROWS, 7], ids=["batch", "7-row-batches"])
@pytest.mark.parametrize("values", [VALUES, VALUES[:-1]], ids=["with-nan", "numbers"])
def test_extreme_rows_decide_every_keys_live_extreme(spark, tmp_path, monkeypatch, largest,
                                                      collide, batch_rows, values):
    """With NaN among the values the cuts are found in Arrow's order (a sort); with numbers
    only, by each hash's most extreme cut value (``_beyond_every_cut``)."""
    monkeypatch.setattr(keyed_runs, "BATCH_ROWS", batch_rows)  # a key's rows straddle batches
    if collide:  # keep the shard bits only: many groups share a hash, as in a collision
        mask = np.uint64(0xFFC0000000000000)
        monkeypatch.setattr(Trace, "_key_hashes", lambda self, rows: hashing.xxhash64_arrow(
            rows, self.key).astype(np.uint64) & mask)
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 300)  # most appends get a run
    monkeypatch.setattr(trace_module, "EXTREME_ROWS", 2)
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql, rng, live = LocalSQL(), np.random.default_rng(11 + collide + 2 * largest), {}
    schema = StructType([StructField("g", LongType()), StructField("_v", DoubleType())])
    trace = Trace(db, "values", schema, ["g"], order_by="_v")
    read_all = 0
    for step in range(8):
        n = 3_000 if step == 0 else int(rng.choice([100, 600]))
        if step == 5:
            with keyed_runs.held_writes():  # a file whose run is not written yet
                trace.append_arrow(sql, _batch(rng, n, 60, live, values))
                keys = pa.table({"g": pa.array([None, *range(-1, 60)], pa.int64())})
                got = trace.lookup_extreme_rows(sql, keys, largest)
                _assert_live(sql, got, ["g"])
                assert _extremes(sql, got, keys, ["g"], largest) == _extremes(
                    sql, trace.read_arrow(), keys, ["g"], largest)
        else:
            trace.append_arrow(sql, _batch(rng, n, 60, live, values))
        keyed_runs.wait_for_writes()
        for _ in range(3):
            picked = rng.choice(np.arange(-1, 60), int(rng.integers(1, 20)), replace=False)
            keys = pa.table({"g": pa.array([*picked.tolist(), None][:len(picked)], pa.int64())})
            trace.reset_rows_read()
            got = trace.lookup_extreme_rows(sql, keys, largest)
            read_extremes = trace.rows_read
            _assert_live(sql, got, ["g"])
            assert _extremes(sql, got, keys, ["g"], largest) == _extremes(
                sql, trace.read_arrow(), keys, ["g"], largest)
            if not collide:
                read_all += 1 if read_extremes < trace.rows_read - read_extremes else 0
    if not collide:
        assert read_all > 0  # the re-reads read less than the whole trace


def test_extreme_rows_of_string_values_and_two_key_columns(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 100)
    monkeypatch.setattr(trace_module, "EXTREME_ROWS", 1)
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql, rng = LocalSQL(), np.random.default_rng(3)
    schema = StructType([StructField("a", LongType()), StructField("b", StringType()),
                         StructField("_v", StringType())])
    trace = Trace(db, "values", schema, ["a", "b"], order_by="_v")
    words = ["", "a", "ab", "b", "ä", "z", "Z", "é"]
    for step in range(5):
        n = 800 if step == 0 else 150
        rows = {"a": pa.array(rng.integers(0, 5, n), pa.int64()),
                "b": pa.array(np.array(["x", "y", None], dtype=object)[rng.integers(0, 3, n)],
                              pa.string()),
                "_v": pa.array(np.array(words, dtype=object)[rng.integers(0, len(words), n)],
                               pa.string()),
                "_weight": pa.array(np.where(rng.random(n) < 0.3 * (step > 0), -1, 1),
                                    pa.int64())}
        trace.append_arrow(sql, pa.table(rows))
        keyed_runs.wait_for_writes()
    keys = pa.table({"a": pa.array([0, 1, 2, 3, 4, 9, 0], pa.int64()),
                     "b": pa.array(["x", "y", None, "x", "y", "x", None], pa.string())})
    for largest in (True, False):
        got = trace.lookup_extreme_rows(sql, keys, largest)
        _assert_live(sql, got, ["a", "b"])
        assert _extremes(sql, got, keys, ["a", "b"], largest) == _extremes(
            sql, trace.read_arrow(), keys, ["a", "b"], largest)


def test_a_trace_without_an_order_has_no_extreme_lookup(spark, tmp_path):
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    trace = Trace(db, "t", StructType([StructField("g", LongType())]), ["g"])
    with pytest.raises(ValueError, match="not ordered"):
        trace.lookup_extreme_rows(LocalSQL(), pa.table({"g": [1]}), True)


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
def test_a_re_read_goes_as_deep_as_the_retractions_found_before(spark, tmp_path, monkeypatch,
                                                                 largest):
    """Under a steady stream of deletes of every group's current extreme, the base run's most
    extreme values are dead, as many per group as the files of deletes after it. Reading the
    files smallest first, a group is read that much deeper in the base: one round, and about
    ``EXTREME_ROWS`` + deletes rows a group, not a deeper round of ``EXTREME_GROWTH`` times as
    many (nor, with a fixed depth, nearly the whole group once the deletes outnumber it)."""
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 500)
    sql, groups, per_group = LocalSQL(), 600, 50
    trace = _values_trace(StateDatabase(spark, str(tmp_path), "fp"), sql, groups, per_group)
    deletes = 2 * trace_module.EXTREME_ROWS + 1  # more than a fixed first depth would see
    for d in range(deletes):  # one file a delete of every group's current extreme: big ones
        value = float(per_group - 1 - d if largest else d)
        trace.append_arrow(sql, pa.table({"g": np.arange(groups), "_v": np.full(groups, value),
                                          "_weight": np.full(groups, -1, np.int64)}))
        keyed_runs.wait_for_writes()  # (runs beyond PENDING_WRITES are built at a lookup)
    assert all(trace.runs.covers(f) for f in trace.files())
    rounds = []
    beyond = Trace._beyond_cuts
    monkeypatch.setattr(Trace, "_beyond_cuts", lambda self, *a: rounds.append(a[2]) or beyond(
        self, *a))
    keys = pa.table({"g": pa.array(range(groups), pa.int64())})
    trace.reset_rows_read()
    got = trace.lookup_extreme_rows(sql, keys, largest)
    read = trace.rows_read
    assert _extremes(sql, got, keys, ["g"], largest) == _extremes(
        sql, trace.read_arrow(), keys, ["g"], largest)
    assert rounds == [trace_module.EXTREME_ROWS]  # one round
    # the deletes, and past them EXTREME_ROWS of the base a group
    assert read == groups * (deletes + deletes + trace_module.EXTREME_ROWS), [
        (f.rows, trace.runs.covers(f)) for f in trace.files()]


def _tied_rows(rng: np.random.Generator, n: int, groups: int, live: dict, kind: pa.DataType,
               values: int) -> pa.Table:
    """``n`` changes of (group, value, id) rows whose values tie many ways (``values`` distinct
    ones): inserts of new ids, and deletes of live rows at a group's largest or smallest value
    (the tied rows a re-read must see all of)."""
    g, v, ids, w = [], [], [], []
    for _ in range(n):
        group = int(rng.integers(0, groups))
        rows = live.setdefault(group, {})
        if rows and rng.random() < 0.45:
            top = (max if rng.random() < 0.5 else min)(rows.values())
            row_id = next(i for i, x in rows.items() if x == top)
            del rows[row_id]
            g.append(group), v.append(top), ids.append(row_id), w.append(-1)
        else:
            row_id, value = len(ids) + 1_000_000 * int(rng.integers(1, 10**6)), \
                int(rng.integers(0, values))
            rows[row_id] = value
            g.append(group), v.append(value), ids.append(row_id), w.append(1)
    value_type = pa.int64() if pa.types.is_date32(kind) or pa.types.is_timestamp(kind) \
        else kind
    values_array = pa.array(v, pa.int64()).cast(value_type)
    if pa.types.is_date32(kind):
        values_array = pa.array(v, pa.int32()).cast(pa.date32())
    elif pa.types.is_timestamp(kind):
        values_array = values_array.cast(kind)
    return pa.table({"g": pa.array(g, pa.int64()), "_v": values_array,
                     "id": pa.array(ids, pa.int64()), "_weight": pa.array(w, pa.int64())})


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
@pytest.mark.parametrize("batch_rows", [keyed_runs.BATCH_ROWS, 256, 7],
                         ids=["batch", "256-row-batches", "7-row-batches"])
@pytest.mark.parametrize("kind", [pa.float64(), pa.int64(), pa.date32(), pa.timestamp("us", "UTC")],
                         ids=["double", "bigint", "date", "timestamp"])
def test_leading_rows_of_values_tied_many_ways_take_every_tie(spark, tmp_path, monkeypatch,
                                                               largest, batch_rows, kind):
    """A trace of whole rows (a top-k's: group, value, id) whose values tie many ways, and
    whose files delete some of the tied rows: a cut takes the rows that tie with it too
    (``run_search.tie_closed_counts``), in runs (one batch, batches of 256 rows whose ranges
    mostly lie inside one, or of 7 that they straddle) and in small files alike, some runs
    left open (as a run whose values hold a NULL is), and each group's rows given are exactly
    its live rows at or beyond the least extreme value given (a cut that kept its ties
    without taking them all would give deleted rows live, or miss live ones)."""
    from pyspark.sql.types import DateType, TimestampType

    monkeypatch.setattr(keyed_runs, "BATCH_ROWS", batch_rows)
    closable = run_search.OpenRun.closable
    monkeypatch.setattr(run_search.OpenRun, "closable",  # about a third of the runs left open
                        lambda self, name: closable(self, name) and int(self.first[0]) % 3 != 0)
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 300)  # most appends get a run
    monkeypatch.setattr(trace_module, "EXTREME_ROWS", 2)
    value_type = {pa.float64(): DoubleType(), pa.int64(): LongType(), pa.date32(): DateType()
                  }.get(kind, TimestampType())
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    schema = StructType([StructField("g", LongType()), StructField("_v", value_type),
                         StructField("id", LongType())])
    trace = Trace(db, "rows", schema, ["g"], order_by="_v")
    sql, rng, live = LocalSQL(), np.random.default_rng(21 + largest), {}
    for step in range(7):
        trace.append_arrow(sql, _tied_rows(rng, 2_000 if step == 0 else 400, 30, live, kind,
                                           values=4))
        keyed_runs.wait_for_writes()
        keys = pa.table({"g": pa.array(range(-1, 30), pa.int64())})
        got = trace.lookup_extreme_rows(sql, keys, largest)
        _assert_live(sql, got, ["g", "id"])
        assert _extremes(sql, got, keys, ["g"], largest) == _extremes(
            sql, trace.read_arrow(), keys, ["g"], largest)
        live_rows = sql.query("SELECT g, _v, id FROM t GROUP BY g, _v, id HAVING sum(_weight) > 0",
                         t=trace.read_arrow())
        for group in range(30):
            given = got.filter(pc.equal(got.column("g"), group))
            if given.num_rows == 0:
                continue
            edge = (pc.min if largest else pc.max)(given.column("_v"))
            rows = live_rows.filter(pc.and_(pc.equal(live_rows.column("g"), group),
                                       (pc.greater_equal if largest else pc.less_equal)(
                                           live_rows.column("_v"), edge)))
            assert sorted(given.column("id").to_pylist()) == sorted(
                rows.column("id").to_pylist()), (step, group)


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
@pytest.mark.parametrize(("rows", "deletes", "rounds"), [(150, 40, [3]), (2_000, 500, [3, 24])],
                         ids=["ties-within-the-cap", "ties-beyond-the-cap"])
def test_a_group_whose_values_all_tie_is_read_in_few_rounds(spark, tmp_path, monkeypatch,
                                                             largest, rows, deletes, rounds):
    """A group whose rows all hold one value, under deletes of some of them: its leading rows
    are its ties, taken whole in the first round while they are at most
    ``TIE_ROWS_PER_COUNT`` (64) times the rows a file was to give (3: 192 rows; read deeper
    round by round, 8x a round, the 150 took three rounds); 2,000 ties are taken whole in the
    second round (24 rows a file, and the deletes' 24 deeper in the base: 3,072), not five."""
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 30)  # both files get runs
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    schema = StructType([StructField("g", LongType()), StructField("_v", DoubleType()),
                         StructField("id", LongType())])
    trace = Trace(db, "rows", schema, ["g"], order_by="_v")
    sql = LocalSQL()
    trace.append_arrow(sql, pa.table({"g": np.zeros(rows, np.int64),
                                      "_v": np.full(rows, 7.0), "id": np.arange(rows),
                                      "_weight": np.ones(rows, np.int64)}))
    gone = np.arange(0, rows, rows // deletes)[:deletes]
    trace.append_arrow(sql, pa.table({"g": np.zeros(deletes, np.int64),
                                      "_v": np.full(deletes, 7.0), "id": gone,
                                      "_weight": np.full(deletes, -1, np.int64)}))
    keyed_runs.wait_for_writes()
    assert all(trace.runs.covers(f) for f in trace.files())
    seen = []
    beyond = Trace._beyond_cuts
    monkeypatch.setattr(Trace, "_beyond_cuts", lambda self, *a: seen.append(a[2]) or beyond(
        self, *a))
    got = trace.lookup_extreme_rows(sql, pa.table({"g": pa.array([0], pa.int64())}), largest)
    assert trace_module.EXTREME_ROWS == 3 and seen == rounds
    assert sorted(got.column("id").to_pylist()) == sorted(set(range(rows)) - set(gone.tolist()))


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
@pytest.mark.parametrize("way", ["searched", "galloped", "mixed"])
@pytest.mark.parametrize("cap", [run_search.TIE_ROWS_PER_COUNT, 2], ids=["cap", "cap-2"])
def test_tie_closed_counts_take_every_tie_of_the_cut(monkeypatch, largest, way, cap):
    """``tie_closed_counts`` against counting by hand: per range, ``count`` rows from its end,
    and then every row that ties with the last of them (NaN ties with NaN and sits above every
    number, -0.0 ties with 0.0), closed; ranges of ``count`` rows or fewer keep ``count``,
    closed (not cut); a range whose closed count would pass ``TIE_ROWS_PER_COUNT`` times its
    count keeps its count, not closed. Found by searching each range's values, by a gallop
    (no slices, or more ranges than ``SEARCHED_RANGES``), or by a gallop where a slice is
    missing."""
    monkeypatch.setattr(run_search, "TIE_ROWS_PER_COUNT", cap)
    rng = np.random.default_rng(8 + largest + 2 * cap)
    for _ in range(200):
        ranges_count = int(rng.integers(1, 6)) if way != "galloped" or rng.random() < 0.5 \
            else run_search.SEARCHED_RANGES + int(rng.integers(1, 10))
        sizes = rng.integers(0, 12, ranges_count)
        pool = np.array([-1.0, 0.0, -0.0, 2.0, 2.5, math.inf, math.nan])
        ranges = [np.sort(rng.choice(pool[: int(rng.integers(1, 8))], size)) for size in sizes]
        values = np.concatenate(ranges) if ranges else np.zeros(0)  # (np.sort: NaN last)
        hi = np.cumsum(sizes)
        lo = hi - sizes
        count = rng.integers(1, 5, len(sizes))
        slices = {"searched": lambda a, b, v=values: v[a:b],
                  "galloped": None,
                  "mixed": lambda a, b, v=values: v[a:b] if a % 2 else None}[way]
        got, closed = run_search.tie_closed_counts(lambda rows, v=values: v[rows], lo, hi,
                                                   count, largest, slices)
        for r, c, n, shut in zip(ranges, count, got, closed):
            if len(r) <= c:
                assert n == c and shut
                continue
            cut = r[len(r) - c] if largest else r[c - 1]
            same = [x == cut or (math.isnan(x) and math.isnan(cut)) for x in r]
            beyond = [x > cut or (math.isnan(x) and not math.isnan(cut)) if largest
                      else x < cut or (math.isnan(cut) and not math.isnan(x)) for x in r]
            ties = sum(same) + sum(beyond)
            assert (n, shut) == ((ties, True) if ties <= cap * c else (c, False)), (r, c, n)


def _beyond(v: float, bound: float, largest: bool) -> bool:
    """Whether ``v`` is strictly beyond ``bound`` as a bounded re-read takes it: above it (NaN
    above every number; nothing above a NaN bound), or below it (NaN below nothing)."""
    if largest:
        return not math.isnan(bound) and (math.isnan(v) or v > bound)
    return not math.isnan(v) and v < bound


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
@pytest.mark.parametrize("batch_rows", [keyed_runs.BATCH_ROWS, 7], ids=["batch", "7-row-batches"])
@pytest.mark.parametrize("values", [VALUES, VALUES[:-1]], ids=["with-nan", "numbers"])
def test_a_bounded_re_read_gives_the_extreme_up_to_each_keys_bound(spark, tmp_path, monkeypatch,
                                                                   largest, batch_rows, values):
    """With a bound per key (``bound``: a column of the keys), the rows strictly beyond it
    are left out of every file alike (runs, small files, files whose run is not written yet),
    and the extreme given is the key's live one over the rest: its oracle is the live extreme
    over the key's rows not beyond its bound, whatever the bounds (NaN among them), with keys
    of another type than the trace's (hashed as the trace's)."""
    monkeypatch.setattr(keyed_runs, "BATCH_ROWS", batch_rows)
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 300)
    monkeypatch.setattr(trace_module, "EXTREME_ROWS", 2)
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql, rng, live = LocalSQL(), np.random.default_rng(23 + 2 * largest), {}
    schema = StructType([StructField("g", LongType()), StructField("_v", DoubleType())])
    trace = Trace(db, "values", schema, ["g"], order_by="_v")
    checked = 0
    for step in range(8):
        n = 3_000 if step == 0 else int(rng.choice([100, 600]))
        with keyed_runs.held_writes() if step == 5 else contextlib.nullcontext():
            trace.append_arrow(sql, _batch(rng, n, 60, live, values))
            for _ in range(3):
                picked = rng.choice(np.arange(-1, 60), int(rng.integers(1, 30)), replace=False)
                bounds = [values[int(rng.integers(0, len(values)))] if rng.random() < 0.3
                          else float(rng.integers(-50, 50)) for _ in picked]
                keys = pa.table({"g": pa.array(picked.tolist(), pa.int32()),  # (cast here)
                                 "b": pa.array(bounds, pa.float64())})
                got = trace.lookup_extreme_rows(sql, keys, largest, bound="b")
                _assert_live(sql, got, ["g"])
                for k, b in zip(picked.tolist(), bounds):  # no key beyond its bound
                    assert not any(_beyond(v, b, largest) for k2, v in zip(
                        got.column("g").to_pylist(), got.column("_v").to_pylist()) if k2 == k)
                rows = trace.read_arrow()
                bound_of = dict(zip(picked.tolist(), bounds))
                kept = [bound_of.get(k) is None or not _beyond(v, bound_of[k], largest)
                        for k, v in zip(rows.column("g").to_pylist(),
                                        rows.column("_v").to_pylist())]
                assert _extremes(sql, got, keys.select(["g"]), ["g"], largest) == _extremes(
                    sql, rows.filter(pa.array(kept)), keys.select(["g"]), ["g"], largest)
                checked += 1
        keyed_runs.wait_for_writes()
    assert checked == 24
    assert any(trace.runs.covers(f) for f in trace.files())


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
def test_a_bounded_re_read_skips_the_values_deleted_before(spark, tmp_path, monkeypatch, largest):
    """Under a steady stream of deletes of every group's current extreme, a re-read bounded by
    the extreme just deleted (an aggregate's old extreme) reads no value deleted before it:
    the last delete's file and ``EXTREME_ROWS`` + 1 rows of the base a group, however many
    deletes came before (unbounded: every delete's file and as many rows deeper in the base,
    ``test_a_re_read_goes_as_deep_as_the_retractions_found_before``)."""
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 500)
    sql, groups, per_group, deletes = LocalSQL(), 600, 50, 9
    trace = _values_trace(StateDatabase(spark, str(tmp_path), "fp"), sql, groups, per_group)
    for d in range(deletes):
        value = float(per_group - 1 - d if largest else d)
        trace.append_arrow(sql, pa.table({"g": np.arange(groups), "_v": np.full(groups, value),
                                          "_weight": np.full(groups, -1, np.int64)}))
        keyed_runs.wait_for_writes()
    assert all(trace.runs.covers(f) for f in trace.files())
    keys = pa.table({"g": pa.array(range(groups), pa.int64()),
                     "old": np.full(groups, value)})  # the extreme the last file deleted
    trace.reset_rows_read()
    got = trace.lookup_extreme_rows(sql, keys, largest, bound="old")
    assert trace.rows_read == groups * (1 + trace_module.EXTREME_ROWS + 1)
    assert _extremes(sql, got, keys.select(["g"]), ["g"], largest) == _extremes(
        sql, trace.read_arrow(), keys.select(["g"]), ["g"], largest)


def test_retractions_far_from_the_extreme_deepen_a_read_only_so_far(spark, tmp_path,
                                                                    monkeypatch):
    """Retractions of values far from the extreme (a max per region while moves retract many
    of its orders) deepen the read of a bigger file by at most ``EXTREME_RETRACTED_ROWS``, not
    by as many rows as they are."""
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 500)
    sql, groups, per_group, retracted = LocalSQL(), 20, 2_000, 1_500
    trace = _values_trace(StateDatabase(spark, str(tmp_path), "fp"), sql, groups, per_group)
    keyed_runs.wait_for_writes()
    low = np.tile(np.arange(retracted, dtype=np.float64), groups)  # the smallest values
    keys = pa.table({"g": pa.array(range(groups), pa.int64())})
    with keyed_runs.held_writes():  # its run not written yet: the file is read whole
        trace.append_arrow(sql, pa.table({"g": np.repeat(np.arange(groups), retracted),
                                          "_v": low, "_weight": np.full(len(low), -1, np.int64)}))
        trace.reset_rows_read()
        got = trace.lookup_extreme_rows(sql, keys, largest=True)
        read = trace.rows_read
    assert _extremes(sql, got, keys, ["g"], True) == [repr({"g": k, "e": float(per_group - 1)})
                                                      for k in sorted(range(groups), key=repr)]
    # the retractions' file whole, then the base at most the cap deeper than EXTREME_ROWS (a
    # few rows, not the 1,500 retractions)
    assert trace_module.EXTREME_RETRACTED_ROWS <= 32
    assert read <= groups * (retracted + trace_module.EXTREME_ROWS
                             + trace_module.EXTREME_RETRACTED_ROWS)


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
@pytest.mark.parametrize("kind", [pa.int64(), pa.float64(), pa.int32(), pa.uint64(), pa.date32(),
                                  pa.timestamp("us", "UTC")])
def test_the_bound_of_every_cut_keeps_what_the_order_keeps(largest, kind):
    """``_beyond_every_cut`` (each hash's most extreme cut value) keeps exactly the rows the
    sorted rule keeps (past the hash's last cut row in (hash, value, cut) order), with ties
    at the cut values, hashes without a cut, several cuts a hash and rows of other hashes."""
    rng = np.random.default_rng(5 + largest)
    for rows in (1, 2, 50, 3_000):
        hashes = rng.integers(0, 40, rows).astype(np.uint64) * np.uint64(2**57)
        values = rng.integers(0, 12, rows)
        is_cut = rng.random(rows) < 0.2
        table = pa.table({trace_module.HASH: pa.array(hashes, pa.uint64()),
                          "_v": pa.array(values.astype(np.int32)).cast(kind)
                          if pa.types.is_date32(kind) else pa.array(values).cast(kind),
                          trace_module.CUT: pa.array(is_cut)})
        cut = trace_module._distinct_hashes(hashes[is_cut])
        fast = trace_module._beyond_every_cut(hashes, table.column("_v"), is_cut, cut, largest)
        slow = trace_module._beyond_every_cut_sorted(table, "_v", largest)
        assert fast is not None and fast.tolist() == slow.tolist()
        expected = [not is_cut[hashes == h].any()
                    or (v > values[(hashes == h) & is_cut].max() if largest
                        else v < values[(hashes == h) & is_cut].min())
                    for h, v in zip(hashes, values)]
        assert fast.tolist() == expected
        # tie-closed cuts: a hash whose cuts are all closed keeps its ties with the bound too
        closed = rng.random(rows) < 0.7
        with_ties = trace_module._beyond_every_cut(hashes, table.column("_v"), is_cut, cut,
                                                   largest, closed)
        bound = {h: (values[(hashes == h) & is_cut].max() if largest
                     else values[(hashes == h) & is_cut].min())
                 for h in set(hashes[is_cut].tolist())}
        all_closed = {h: bool(closed[(hashes == h) & is_cut].all()) for h in bound}
        assert with_ties is not None and with_ties.tolist() == [
            keep or (h in bound and all_closed[h] and v == bound[h])
            for keep, h, v in zip(expected, hashes.tolist(), values)]


def test_the_bound_of_every_cut_leaves_nan_null_and_other_types_to_the_sort():
    hashes = np.zeros(3, dtype=np.uint64)
    is_cut = np.array([False, True, False])
    cut = np.zeros(1, dtype=np.uint64)
    for values in (pa.chunked_array([[1.0, math.nan, 2.0]]), pa.chunked_array([[1, None, 2]]),
                   pa.chunked_array([["a", "b", "c"]])):
        assert trace_module._beyond_every_cut(hashes, values, is_cut, cut, True) is None


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
def test_extreme_rows_of_a_trace_split_by_owner(spark, tmp_path, monkeypatch, largest):
    """After a layout change splits the files by owner (a sorted run cut by shard range, as a
    big trace's base is), each file is searched for the wanted keys of its shard range only,
    and every key still gets its live extreme."""
    from dbsp_pipeline.runtime.layout import Layout

    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 80)
    monkeypatch.setattr(trace_module, "EXTREME_ROWS", 2)
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql, rng, live = LocalSQL(), np.random.default_rng(23 + largest), {}
    schema = StructType([StructField("g", LongType()), StructField("_v", DoubleType())])
    trace = Trace(db, "values", schema, ["g"], order_by="_v")
    for n in (4_000, 600, 600):
        trace.append_arrow(sql, _batch(rng, n, 200, live, VALUES[:-1]))
    files = trace.files()
    trace.swap_files(files, trace.split_by_owner(files, Layout.initial(4)))
    trace.append_arrow(sql, _batch(rng, 600, 200, live, VALUES[:-1]))
    keyed_runs.wait_for_writes()
    split = [f for f in trace.files() if trace.runs.covers(f) and f.shard_max - f.shard_min < 300]
    assert len(split) >= 8
    for _ in range(3):
        picked = rng.choice(np.arange(-1, 200), 60, replace=False)
        keys = pa.table({"g": pa.array(picked.tolist(), pa.int64())})
        got = trace.lookup_extreme_rows(sql, keys, largest)
        _assert_live(sql, got, ["g"])
        assert _extremes(sql, got, keys, ["g"], largest) == _extremes(
            sql, trace.read_arrow(), keys, ["g"], largest)


def test_deleting_the_same_groups_extremes_again_merges_the_trace_whole(tmp_path, monkeypatch):
    """Retractions cancel only in a merge with the rows they delete: while every group loses
    its maximum step after step, each re-read goes deeper past the deleted ones, and the rows
    read only for that (``retraction_reads``) grow at every step. Once they reach the trace's
    rows the trace is due for a merge of all its files, however few runs it has; after it the
    re-reads read little again, and every re-read gives the live extremes."""
    from dbsp_pipeline.spark_session import LazySession

    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 100)  # every append gets a run
    monkeypatch.setattr(trace_module, "AMPLIFIED_MIN_ROWS", 1_000)
    sql, groups, per_group = LocalSQL(), 200, 60
    trace = _values_trace(StateDatabase(LazySession(), str(tmp_path), "deletes"), sql, groups,
                          per_group)  # (a lazy session: never starts Spark)
    keyed_runs.wait_for_writes()
    keys = pa.table({"g": pa.array(np.arange(groups), pa.int64())})
    top = per_group - 1.0
    read, merged_at = [], None
    for step in range(1, 40):
        gone = pa.table({"g": np.arange(groups), "_v": np.full(groups, top),
                         "_weight": np.full(groups, -1, np.int64)})
        trace.append_arrow(sql, gone)
        keyed_runs.wait_for_writes()
        top -= 1
        trace.reset_rows_read()
        got = trace.lookup_extreme_rows(sql, keys, largest=True)
        read.append(trace.rows_read)
        assert _extremes(sql, got, keys, ["g"], True) == sorted(
            repr({"g": k, "e": top}) for k in range(groups)), step
        files = trace.compaction_candidates()
        if files:
            assert len(files) == len(trace.files()) < trace_module.COMPACT_FILE_THRESHOLD
            assert trace.retraction_reads >= sum(f.rows for f in trace.files())
            assert trace.apply_merge(files, trace.merge(files, sql))
            assert trace.retraction_reads == 0
            merged_at = step
            break
    assert merged_at is not None and read[-1] > 2 * read[0]  # reads grew until the merge
    keyed_runs.wait_for_writes()  # (the merged file's keyed run)
    trace.reset_rows_read()
    got = trace.lookup_extreme_rows(sql, keys, largest=True)
    assert trace.rows_read < read[-1] / 2
    assert _extremes(sql, got, keys, ["g"], True) == sorted(
        repr({"g": k, "e": top}) for k in range(groups))


def test_the_small_files_due_for_a_merge_are_re_read_from_memory(tmp_path, monkeypatch):
    """A trace keeps the rows of as many small files as it holds before a merge (each under
    ``keyed_runs.MIN_ROWS``, so without a keyed run): a min/max re-read over them opens no
    Parquet file (with 65,536 rows kept, the bound before, 11 of these 15 files were)."""
    from dbsp_pipeline.spark_session import LazySession
    from dbsp_pipeline.storage import data_files

    db = StateDatabase(LazySession(), str(tmp_path), "fp")
    db.open()
    schema = StructType([StructField("g", LongType()), StructField("_v", DoubleType())])
    trace = Trace(db, "values", schema, ["g"], order_by="_v")
    sql = LocalSQL()
    small = keyed_runs.MIN_ROWS - 1
    every = []
    for step in range(trace_module.COMPACT_FILE_THRESHOLD - 1):
        rows = pa.table({"g": pa.array(np.arange(small) % 500, pa.int64()),
                         "_v": pa.array(np.arange(small) + step * small, pa.float64()),
                         "_weight": pa.array(np.ones(small, dtype=np.int64))})
        trace.append_arrow(sql, rows)
        every.append(rows)
    assert len(trace.files()) == trace_module.COMPACT_FILE_THRESHOLD - 1
    assert not any(trace.runs.covers(f) for f in trace.files())
    opened = []
    real_read = data_files.DataFiles.read_arrow
    monkeypatch.setattr(data_files.DataFiles, "read_arrow",
                        lambda self, paths, *a, **k: opened.append(paths) or real_read(
                            self, paths, *a, **k))
    keys = pa.table({"g": pa.array([3, 77, 499], pa.int64())})
    got = trace.lookup_extreme_rows(sql, keys, largest=True)
    assert opened == []
    found = sorted(repr(r) for r in got.group_by("g").aggregate([("_v", "max")])
                   .rename_columns(["g", "e"]).select(["g", "e"]).to_pylist())
    assert found == _extremes(sql, pa.concat_tables(every), keys, ["g"], largest=True)


def test_keys_a_small_files_shard_range_holds_but_not_its_rows_find_nothing(spark, tmp_path):
    """A small file is a candidate for every key whose shard is within its ``_shard`` range;
    a lookup of new keys only (a top-k's step that touches new partitions) finds no row in
    it, and gives none."""
    db = StateDatabase(spark, str(tmp_path), "fp")
    sql = LocalSQL()
    trace = _values_trace(db, sql, groups=100, per_group=3)  # a small file: 300 rows
    new_keys = pa.table({"g": pa.array(range(1_000, 1_050), pa.int64())})
    assert trace._candidates(trace._wanted(sql, new_keys), None)[2]  # (the file, by its range)
    for largest in (True, False):
        assert trace.lookup_extreme_rows(sql, new_keys, largest).num_rows == 0
        got = trace.lookup_leading_rows(sql, new_keys, largest, lambda rows, cut: cut, count=1)
        assert got.num_rows == 0
