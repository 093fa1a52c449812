"""Top-k (``Collection.top_k``) against a from-scratch ranking in Python, after every step of
random inserts and deletes (NULLs in order keys and partitions, rows of multiplicity above one,
ties broken by all columns, or sharing a place as RANK and DENSE_RANK), on both engine paths; and
the declaration's checks."""

from __future__ import annotations

import datetime
import decimal
import math
import random
from collections import Counter

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from dbsp_pipeline import Circuit, Pipeline, check_views
from dbsp_pipeline.errors import CircuitError
from tests.conftest import view_rows

SCHEMA = "g BIGINT, id BIGINT, v DOUBLE, s STRING"


def _asc_nulls_first(value: object) -> tuple:
    return (value is not None, value if value is not None else 0)


def _partitions(bag: Counter, partition: bool) -> list[list[tuple]]:
    """The rows of ``bag``, each as many times as its multiplicity, per ``g`` when
    ``partition`` (else all in one)."""
    groups: dict[object, list[tuple]] = {}
    for row, m in bag.items():
        groups.setdefault(row[0] if partition else None, []).extend([row] * m)
    return list(groups.values())


def expected(bag: Counter, k: int, partition: bool, descending: bool,
             nulls_first: bool, ranked: bool = False, numbering: str = "row_number") -> Counter:
    """The top ``k`` rows of ``bag`` by ``v`` (then every column ascending, NULLs first), per
    ``g`` when ``partition``; with ``ranked``, each with its place (1 to k) last. With
    ``numbering`` "rank" or "dense_rank", rows that tie on ``v`` share a place (as SQL's RANK
    and DENSE_RANK) and every copy placed at most k is kept."""
    def order(row: tuple) -> tuple:
        v = row[2]
        if v is None:
            return (0,) if nulls_first else (2,)
        return (1, -v if descending else v)

    def key(row: tuple) -> tuple:
        return (order(row), *[_asc_nulls_first(c) for c in row])

    out: Counter = Counter()
    for rows in _partitions(bag, partition):
        rows.sort(key=key)
        for i, row in enumerate(rows):
            if numbering == "row_number":
                place = i + 1
            elif numbering == "rank":
                place = 1 + sum(1 for r in rows if order(r) < order(row))
            else:
                place = 1 + len({order(r) for r in rows if order(r) < order(row)})
            if place <= k:
                out[(*row, place) if ranked else row] += 1
    return out


def _circuit() -> Circuit:
    c = Circuit("top")
    rows = c.input("rows", SCHEMA)
    c.output("top3", rows.top_k(3, ["v DESC"]))                      # NULLs last
    c.output("low2_by_g", rows.top_k(2, ["v"], partition_by=["g"]))  # NULLs first
    c.output("top2_nulls_first", rows.top_k(2, ["`v` DESC NULLS FIRST"]))
    c.output("top3_ranked", rows.top_k(3, ["v DESC"], rank="place"))
    c.output("low2_by_g_ranked", rows.top_k(2, ["v"], partition_by=["g"], rank="place"))
    c.output("top2_rank", rows.top_k(2, ["v DESC"], rank="place", numbering="rank"))
    c.output("low1_by_g_dense", rows.top_k(1, ["v"], partition_by=["g"], rank="place",
                                           numbering="dense_rank"))
    return c


#: per view: k, partitioned by g, descending, NULLs first, with a rank column[, numbering]
VIEWS = {"top3": (3, False, True, False, False), "low2_by_g": (2, True, False, True, False),
         "top2_nulls_first": (2, False, True, True, False),
         "top3_ranked": (3, False, True, False, True),
         "low2_by_g_ranked": (2, True, False, True, True),
         "top2_rank": (2, False, True, False, True, "rank"),
         "low1_by_g_dense": (1, True, False, True, True, "dense_rank")}


@pytest.mark.parametrize(("driver_step_rows", "workers", "per_owner", "steps"),
                         [(0, 2, True, 5), (0, 1, False, 2), (10**9, 1, False, 5)],
                         ids=["spark-per-owner-W2", "spark-jobs", "driver"])
def test_top_k_equals_a_ranking_from_scratch_after_every_step(spark, tmp_path, driver_step_rows,
                                                              workers, per_owner, steps):
    """On the driver, on Spark as one task per owner (``step_local`` over each owner's
    partitions; a top-k over one partition in one task) and on Spark as DataFrame jobs (what
    a step takes with ``spark_per_owner`` off: two steps, the second with deletes, for each
    of those steps is a dozen seconds of Spark jobs)."""
    rng = random.Random(4)
    bag: Counter = Counter()
    with Pipeline(_circuit(), str(tmp_path), spark, driver_step_rows=driver_step_rows) as p:
        p.rescale(workers)
        p.spark_per_owner = per_owner
        for step in range(steps):
            inserts = [(rng.choice([None, 1, 2]), rng.randint(1, 4),
                        rng.choice([None, 1.0, 2.0, 3.0, -0.5]), rng.choice(["a", "b", None]))
                       for _ in range(10)]
            live = sorted(bag.elements(), key=repr)
            deletes = rng.sample(live, min(len(live), 5)) if step else []
            p.push("rows", inserts)
            if deletes:
                p.push("rows", deletes, weight=-1)
            bag.update(inserts)
            bag.subtract(deletes)
            bag = +bag
            result = p.step()
            assert result.on_driver == bool(driver_step_rows)
            assert ("per owner" in result.path_reason) == per_owner, result.path_reason
            for name, spec in VIEWS.items():
                want = expected(bag, *spec)
                assert view_rows(p, name) == want, (step, name)
        assert all(c.equal and c.nonpositive == 0 for c in check_views(p).values())


row = st.tuples(st.one_of(st.none(), st.integers(1, 2)), st.integers(1, 3),
                st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 2.5, 7.0])),
                st.one_of(st.none(), st.sampled_from(["a", "b"])))
#: per step, rows to insert and indexes of live rows to delete
steps = st.lists(st.tuples(st.lists(row, max_size=8), st.lists(st.integers(0, 40), max_size=5)),
                 min_size=1, max_size=4)


@pytest.mark.parametrize("candidates_from", [None, 0], ids=["as-set", "change-always-cut"])
@settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(steps)
def test_top_k_on_the_driver_equals_a_ranking_from_scratch(spark, tmp_path_factory, monkeypatch,
                                                           candidates_from, workload):
    """With a change to a top-k over one partition cut to its candidate rows
    (``TopK._candidates``) only when it is big, as set, and at every step."""
    from dbsp_pipeline.operators import top_k

    if candidates_from is not None:
        monkeypatch.setattr(top_k, "CANDIDATES_FROM", candidates_from)
    bag: Counter = Counter()
    root = str(tmp_path_factory.mktemp("top"))
    with Pipeline(_circuit(), root, spark) as p:
        for inserts, picks in workload:
            live = sorted(bag.elements(), key=repr)
            deletes = [live.pop(i % len(live)) for i in picks if live]
            if inserts:
                p.push("rows", inserts)
            if deletes:
                p.push("rows", deletes, weight=-1)
            bag.update(inserts)
            bag.subtract(deletes)
            bag = +bag
            assert p.step().on_driver
            for name, spec in VIEWS.items():
                want = expected(bag, *spec)
                assert view_rows(p, name) == want, name


def test_declaring_a_top_k_checks_its_arguments(spark, tmp_path):
    c = Circuit("c")
    rows = c.input("rows", SCHEMA)
    for k in (0, -1, 2.5, True):
        with pytest.raises(CircuitError, match="positive integer"):
            rows.top_k(k, ["v"])  # type: ignore[arg-type]
    with pytest.raises(CircuitError, match="one or more columns"):
        rows.top_k(3, [])
    with pytest.raises(CircuitError, match="is not 'column"):
        rows.top_k(3, ["v + 1"])
    with pytest.raises(CircuitError, match="rank must name a new column"):
        rows.top_k(3, ["v"], rank="_place")
    with pytest.raises(CircuitError, match="numbering must be"):
        rows.top_k(3, ["v"], numbering="ntile")
    c.output("bad", rows.top_k(3, ["nope DESC"]))
    with pytest.raises(CircuitError, match=r"\['nope'\] not in"):
        Pipeline(c, str(tmp_path), spark)
    clash = Circuit("clash")
    clash.output("ranked", clash.input("rows", SCHEMA).top_k(3, ["v"], rank="ID"))
    with pytest.raises(CircuitError, match="rank column 'ID' is already a column"):
        Pipeline(clash, str(tmp_path / "clash"), spark)


NAN = "NaN"  # a NaN as the test's rows hold it (a float NaN is not equal to itself)
ABSENT = (None, 0, NAN, None)  # deleted before it is inserted; first of the largest values


def _canon(row: tuple) -> tuple:
    return tuple(NAN if isinstance(x, float) and math.isnan(x) else x for x in row)


def _value_key(x: object) -> tuple:
    """Spark's order of a non-NULL value: NaN above every number, strings by their bytes."""
    if x == NAN:
        return (1, 0.0)
    return (0, x.encode() if isinstance(x, str) else x)


def _leading(bag: Counter, k: int, column: int, descending: bool, nulls_first: bool,
             partition: bool, numbering: str = "row_number") -> Counter:
    """The top ``k`` rows of ``bag`` (canonical rows) by column ``column`` (then every column
    ascending, NULLs first), per ``g`` when ``partition``, each with its place last."""
    present = sorted({_value_key(r[column]) for r in bag if r[column] is not None})
    index = {v: i for i, v in enumerate(present)}

    def order(row: tuple) -> tuple:
        v = row[column]
        if v is None:
            return (0,) if nulls_first else (2,)
        i = index[_value_key(v)]
        return (1, -i if descending else i)

    def key(row: tuple) -> tuple:
        return (order(row), *[(c is not None, _value_key(c) if c is not None else 0)
                              for c in row])

    out: Counter = Counter()
    for rows in _partitions(bag, partition):
        rows.sort(key=key)
        first = 0  # RANK: the place of the first row of the current tie group, less one
        for i, row in enumerate(rows):
            if i and order(rows[i - 1]) != order(row):
                first = i
            place = i + 1 if numbering == "row_number" else first + 1
            if place <= k:
                out[(*row, place)] += 1
    return out


@pytest.mark.parametrize("first_rows", [None, 1], ids=["k-and-a-few", "one-row-a-file"])
def test_top_k_reads_a_few_leading_rows_a_file(spark, tmp_path, monkeypatch, first_rows):
    """With keyed runs sorted by the first order key (``Trace.lookup_leading_rows``), a step
    reads about k rows a file of each touched partition, deeper where the rows read do not
    decide the old and the new top k (deletes of the leading rows, by the step or by later
    files): after every step of inserts and of deletes of the current leaders, on one worker
    and on two, each view equals a ranking from scratch (NULLs first and last, NaN and
    infinities, strings, ties of many rows, RANK, a row of weight below zero), and the steps
    read less than the trace. With one row a file at first, nearly every partition is read
    again deeper (``TopK._unsettled`` decides each round)."""
    from dbsp_pipeline.operators import top_k
    from dbsp_pipeline.storage import keyed_runs
    from dbsp_pipeline.storage import trace as trace_module

    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 64)  # most files get an ordered run
    monkeypatch.setattr(top_k, "EXTREME_ROWS", 1)
    monkeypatch.setattr(top_k, "CANDIDATES_FROM", 0)  # every change cut (ABSENT: weight -1)
    if first_rows is not None:
        monkeypatch.setattr(top_k.TopK, "_rows_a_file", lambda self, change: first_rows)
    rounds: list[int] = []  # per lookup, its rounds (1: no partition read again, deeper)
    beyond, leading = trace_module.Trace._beyond_cuts, trace_module.Trace.lookup_leading_rows

    def spy_round(self, *args):
        rounds[-1] += 1
        return beyond(self, *args)

    def spy_lookup(self, *args, **kwargs):
        rounds.append(0)
        return leading(self, *args, **kwargs)

    monkeypatch.setattr(trace_module.Trace, "_beyond_cuts", spy_round)
    monkeypatch.setattr(trace_module.Trace, "lookup_leading_rows", spy_lookup)
    c = Circuit("leading")
    rows = c.input("rows", SCHEMA)
    #: name: (k, order column, descending, NULLs first, partitioned, numbering)
    views = {"top5": (5, 2, True, False, False, "row_number"),
             "low4_nulls_first": (4, 2, False, True, False, "row_number"),
             "top3_by_g_nulls_first": (3, 2, True, True, True, "row_number"),
             "top4_rank": (4, 2, True, False, False, "rank"),
             "top3_s": (3, 3, True, False, False, "row_number"),
             "top4_id": (4, 1, True, False, False, "row_number"),  # (few ties)
             "low2_id_by_g_rank": (2, 1, False, False, True, "rank")}
    for name, (k, col, desc, nulls_first, part, numbering) in views.items():
        key = f"{['g', 'id', 'v', 's'][col]}{' DESC' if desc else ''}" + (
            " NULLS FIRST" if nulls_first else " NULLS LAST")
        c.output(name, rows.top_k(k, [key], partition_by=["g"] if part else None,
                                  rank="place", numbering=numbering))
    rng = random.Random(7)
    values = [math.nan, math.inf, -math.inf, None, 2.5, 7.0]
    words = ["", "a", "ab", "b", "z", "ä", None]
    weights: Counter = Counter()  # the input's rows and weights (one below zero for a while)
    bag: Counter = Counter()  # the rows of weight above zero

    def row() -> tuple:
        v = rng.choice(values) if rng.random() < 0.2 else float(rng.randint(-30, 30))
        return (rng.choice([None, 1, 2, 3]), rng.randint(1, 10**6), v, rng.choice(words))

    read: list[int] = []  # state rows read a step
    whole: list[int] = []  # rows of the views' traces before each step
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        for step in range(12):
            if step == 6:
                p.rescale(2)
            inserts = [row() for _ in range(1_500 if step == 0 else rng.choice([10, 80]))]
            deletes: list[tuple] = []
            if step:  # the current leaders of some views, and some random rows
                for name in rng.sample(sorted(views), 3):
                    want = _leading(bag, *views[name])
                    deletes += [r[:-1] for r in rng.sample(sorted(want, key=repr),
                                                           min(len(want), 4))]
                deletes += rng.sample(sorted(bag.elements(), key=repr), 5)
                deletes = [r for r in dict.fromkeys(deletes) if bag[r] > 0]
            if step in (8, 10):  # (a row whose weight was below zero: none, then one)
                inserts.append(ABSENT)
            if step == 3:  # the delete of a row not there, leading every value: weight -1
                deletes.append(ABSENT)
            p.push("rows", [tuple(math.nan if x == NAN else x for x in r) for r in inserts])
            if deletes:
                p.push("rows", [tuple(math.nan if x == NAN else x for x in r)
                                for r in deletes], weight=-1)
            weights.update(_canon(r) for r in inserts)
            weights.subtract(deletes)
            bag = +weights
            whole.append(sum(f.rows for t in p.engine.plan.state_traces() for f in t.files()))
            result = p.step()
            assert result.on_driver
            if step == 0:
                keyed_runs.wait_for_writes()
            for name, spec in views.items():
                got = Counter({_canon(r): m for r, m in view_rows(p, name).items()})
                assert got == _leading(bag, *spec), (step, name)
            if step:
                read.append(result.state_rows_read)
        traces = [t for t in p.engine.plan.state_traces() if t.runs.order_by is not None]
        assert len(traces) == len(views)
        assert all(any(t.runs.covers(f) for f in t.files()) for t in traces)
    assert any(n > 1 for n in rounds)  # some partitions were read again, deeper
    # reading every touched partition whole read every trace whole (every g is touched)
    assert sum(read) < sum(whole[1:]) / 2, (read, whole)


def _settled_by_duckdb(con: duckdb.DuckDBPyConnection, rows: pa.Table, change: pa.Table,
                       k: int, descending: bool, nulls_first: bool) -> bool:
    """``TopK._settled``'s definition in SQL, as DuckDB orders (NaN above every number)."""
    worst = (f"x {'ASC' if descending else 'DESC'} NULLS "
             f"{'LAST' if nulls_first else 'FIRST'}")
    at_or_before = f"n.x {'>=' if descending else '<='} v.x"
    if nulls_first:
        at_or_before = f"(n.x IS NULL OR (v.x IS NOT NULL AND {at_or_before}))"
    else:
        at_or_before = f"(n.x IS NOT NULL AND (v.x IS NULL OR {at_or_before}))"
    con.register("old", rows)
    con.register("n", change)
    ((ok,),) = con.sql(f"""
        WITH v AS (SELECT x FROM old WHERE _weight > 0 ORDER BY {worst} LIMIT 1)
        SELECT coalesce((SELECT sum(greatest(_weight, 0)) FROM old), 0) >= {k}
           AND coalesce((SELECT sum(_weight) FROM old), 0)
               + coalesce((SELECT sum(_weight) FROM n, v WHERE {at_or_before}), 0) >= {k}
        """).fetchall()
    return bool(ok)


DOUBLES = [None, math.nan, math.inf, -math.inf, -0.0, 0.0, 1.5, -2.0, 3.0]
#: per first order key type: its values (with NULL) and its Arrow type
SETTLED_KINDS = {
    "double": (DOUBLES, pa.float64()),
    "float": (DOUBLES, pa.float32()),
    "string": ([None, "", "a", "ab", "b", "ä"], pa.string()),
    "decimal": ([None, *(decimal.Decimal(v) for v in ("-1.50", "0.00", "2.25", "10.00"))],
                pa.decimal128(15, 2)),
    "timestamp": ([None, *(datetime.datetime(2026, 1, d, tzinfo=datetime.UTC)
                           for d in (1, 2, 9))], pa.timestamp("us", tz="UTC")),
    "boolean": ([None, False, True], pa.bool_())}


@pytest.mark.parametrize("kind", sorted(SETTLED_KINDS))
def test_settled_in_arrow_equals_its_definition_in_sql(kind):
    """``TopK._settled`` (Arrow) against the query it replaced, on random rows with NULLs,
    NaN, infinities, -0.0, weights below zero, both directions and both NULL placements, for
    each kind of first order key it meets."""
    from dbsp_pipeline.operators.top_k import OrderKey, TopK

    rng = random.Random(11)
    values, arrow_type = SETTLED_KINDS[kind]
    differ: Counter = Counter()
    con = duckdb.connect()
    for _ in range(300):
        descending, nulls_first = rng.random() < 0.5, rng.random() < 0.5
        k = rng.randint(1, 4)

        def table(n: int, low: int) -> pa.Table:
            return pa.table({"x": pa.array([rng.choice(values) for _ in range(n)], arrow_type),
                             "_weight": pa.array([rng.randint(low, 3) or 1 for _ in range(n)],
                                                 pa.int64())})
        rows, change = table(rng.randint(0, 6), -1), table(rng.randint(0, 6), -2)
        op = object.__new__(TopK)  # (only its order and k: no trace)
        op.order = [OrderKey("x", descending, nulls_first)]
        op.k = k
        want = _settled_by_duckdb(con, rows, change, k, descending, nulls_first)
        assert op._settled(change, rows) == want, (rows.to_pylist(), change.to_pylist(), k,
                                                   descending, nulls_first)
        differ[want] += 1
    assert differ[True] > 30 and differ[False] > 30  # both answers, many times


def test_a_cut_change_ranks_by_the_weights_after_the_step(spark, tmp_path, monkeypatch):
    """``TopK._candidates`` keeps every changed row the trace holds (whatever its weight) and
    the first k of the others: an insert that cancels a row held with a weight below zero (a
    delete that came before its insert) is not live after the step, so it does not take one
    of the k places the cut keeps (the top 1 here is B, not the row behind it)."""
    from dbsp_pipeline.operators import top_k

    monkeypatch.setattr(top_k, "CANDIDATES_FROM", 0)
    c = Circuit("cut")
    c.output("low1", c.input("rows", SCHEMA).top_k(1, ["v"]))
    a, b, x = (1, 1, 1.0, "a"), (1, 2, 2.0, "b"), (1, 3, 5.0, "x")
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        p.push("rows", [x])
        p.push("rows", [a], weight=-1)  # deleted before it is inserted: weight -1
        p.step()
        assert view_rows(p, "low1") == Counter({x: 1})
        p.push("rows", [a, b])
        p.step()
        assert view_rows(p, "low1") == Counter({b: 1})
        p.push("rows", [a])
        p.step()
        assert view_rows(p, "low1") == Counter({a: 1})


#: per kind of the first order key: its values, Arrow type and Spark type
RANKED_KINDS = {
    "double": (DOUBLES, pa.float64(), T.DoubleType()),
    "float": (DOUBLES, pa.float32(), T.FloatType()),
    "string": ([None, "", "a", "ab", "b", "ä"], pa.string(), T.StringType()),
    "decimal": (SETTLED_KINDS["decimal"][0], pa.decimal128(15, 2), T.DecimalType(15, 2)),
    "timestamp": (SETTLED_KINDS["timestamp"][0], pa.timestamp("us", tz="UTC"),
                  T.TimestampType()),
    "boolean": ([None, False, True], pa.bool_(), T.BooleanType()),
    "date": ([None, *(datetime.date(2026, 1, d) for d in (1, 2, 9))], pa.date32(),
             T.DateType()),
    "binary": ([None, b"", b"a", b"\x00", b"\xff"], pa.binary(), T.BinaryType())}


def _nan_safe(rows: list[dict]) -> Counter:
    return Counter(tuple("NaN" if isinstance(v, float) and math.isnan(v) else v
                         for v in r.values()) for r in rows)


@pytest.mark.parametrize("kind", sorted(RANKED_KINDS))
def test_a_top_k_ranked_in_arrow_equals_its_duckdb_query(kind):
    """``TopK._change_in_arrow`` against the DuckDB query it stands for
    (``_change_in_duckdb``) on random old rows and changes (NULLs, NaN, infinities, zeros,
    weights above one, below zero and of 2**60 and 2**62, timestamps beside a NaN only a
    change brings), one or two order keys, both directions and NULL
    placements, with and without a rank column, for every kind of column it ranks by."""
    from dbsp_pipeline.driver.sql import LocalSQL
    from dbsp_pipeline.operators.base import StepContext
    from dbsp_pipeline.operators.top_k import OrderKey, TopK, ranked_schema
    from dbsp_pipeline.zset import canonical_floats_arrow

    rng = random.Random(7)
    values, arrow_type, spark_type = RANKED_KINDS[kind]
    schema = T.StructType([T.StructField("x", spark_type), T.StructField("id", T.LongType()),
                           T.StructField("s", T.StringType()), T.StructField("d", T.DoubleType()),
                           T.StructField("t", T.TimestampType())])
    ctx = StepContext(spark=None, step=0, sql=LocalSQL(threads=1))
    outputs: Counter = Counter()
    for _ in range(120):
        def table(n: int, low: int) -> pa.Table:  # (floats canonical, as every operator's)
            return canonical_floats_arrow(pa.table({
                "x": pa.array([rng.choice(values) for _ in range(n)], arrow_type),
                "id": pa.array([rng.choice([None, 1, 2, 3]) for _ in range(n)], pa.int64()),
                "s": pa.array([rng.choice([None, "p", "q"]) for _ in range(n)], pa.string()),
                # (a NaN only some changes bring: then one consolidation runs in DuckDB, whose
                # timestamps name their time zone otherwise)
                "d": pa.array([rng.choice([None, 1.0, 1.0, 1.0, math.nan]) for _ in range(n)],
                              pa.float64()),
                "t": pa.array([rng.choice([None, *SETTLED_KINDS["timestamp"][0][1:]])
                               for _ in range(n)], pa.timestamp("us", tz="UTC")),
                "_weight": pa.array([2**60 if rng.random() < 0.05 else rng.randint(low, 3) or 1
                                     for _ in range(n)], pa.int64())}))
        old, change = table(rng.randint(0, 12), -1), table(rng.randint(0, 8), -2)
        op = object.__new__(TopK)  # (its ranking only: no trace)
        op.order = [OrderKey(c, rng.random() < 0.5, rng.choice([None, True, False]))
                    for c in (["x", "s"] if rng.random() < 0.4 else ["x"])]
        op.k, op.partition, op.numbering = rng.randint(1, 5), [], "row_number"
        op.rank = "place" if rng.random() < 0.4 else None
        op.schema = ranked_schema(schema, op.rank)
        op.columns, op.out_columns = schema.fieldNames(), op.schema.fieldNames()
        want = op._change_in_duckdb(ctx, old, change)
        got = op._change_in_arrow(ctx, old, change)
        assert got.schema == want.schema
        assert _nan_safe(got.to_pylist()) == _nan_safe(want.to_pylist()), (
            old.to_pylist(), change.to_pylist(), op.order, op.k, op.rank)
        outputs[want.num_rows > 0] += 1
    assert outputs[True] > 40  # (most steps change the top k)
    # distinct rows of weights whose running sum leaves int64 (DuckDB's window sum does not)
    big = table(3, 1)
    big = big.set_column(big.schema.get_field_index("_weight"), "_weight",
                         pa.array([2**62] * 3, pa.int64()))
    big = big.set_column(big.schema.get_field_index("id"), "id", pa.array([1, 2, 3], pa.int64()))
    change = big.slice(1)  # two deleted: the third row of the old ranking was kept, wrapped
    change = change.set_column(change.schema.get_field_index("_weight"), "_weight",
                               pa.array([-2**62] * 2, pa.int64()))
    op.rank, op.k = None, 5
    op.schema, op.out_columns = schema, schema.fieldNames()
    assert _nan_safe(op._change_in_arrow(ctx, big, change).to_pylist()) == _nan_safe(
        op._change_in_duckdb(ctx, big, change).to_pylist())
