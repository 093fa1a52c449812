"""The aggregate's (and the join's) per-step work on the driver gives the same views whether
its phases run in pyarrow (small steps) or as DuckDB queries, bit for bit: random inserts and
deletes over small domains (NULL keys, several key columns of string, decimal, timestamp and
double type, groups emptying out, extremes deleted), two pipelines in lockstep."""

from __future__ import annotations

import datetime
import decimal
import math
import random
import struct
from collections.abc import Callable

import pytest
from pyspark.sql import functions as F

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.driver import sql as local_sql
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.errors import StepFailedError
from dbsp_pipeline.operators.aggregate import Aggregate

FACTS = "k STRING, d DECIMAL(10,2), t TIMESTAMP, f DOUBLE, x DOUBLE, i BIGINT, c BIGINT"
DIMS = "c BIGINT, region STRING"


def _circuit() -> Circuit:
    c = Circuit("fast")
    facts, dims = c.input("facts", FACTS), c.input("dims", DIMS)
    c.output("multi", facts.group_by("k", "d", "t", "f").agg(
        n="count(*)", nx="count(x)", s="sum(x)", a="avg(x)", lo="min(x)", hi="max(x)",
        si="sum(i)", ai="avg(i)", first="min(k)", last="max(t)"))
    c.output("money", facts.group_by("k").agg(sd="sum(d)", ad="avg(d)", nd="count(d)"))
    c.output("joined", facts.join(dims, "c").group_by("region").agg(
        n="count(*)", s="sum(x)", lo="min(i)", hi="max(x)"))
    return c


def _fact(rng: random.Random) -> tuple:
    def maybe(values: list) -> object:
        return None if rng.random() < 0.15 else rng.choice(values)
    return (maybe(["a", "b", ""]), maybe([decimal.Decimal("1.10"), decimal.Decimal("-2.00")]),
            maybe([datetime.datetime(2026, 1, 1), datetime.datetime(2026, 1, 2, 3)]),
            maybe([0.5, 0.0, 2.0]), maybe([1.25, -3.5, 0.0, 1e300, 7.0]),
            maybe([-5, 0, 9, 2**40]), maybe([1, 2, 3]))


def _bits(value: object) -> object:
    """A float as its IEEE bits (tells -0.0 from 0.0, NaN from all numbers)."""
    return struct.pack(">d", value).hex() if isinstance(value, float) else value


def _view(p: Pipeline, name: str) -> list[str]:
    return sorted(repr([(k, _bits(v)) for k, v in sorted(r.items())])
                  for r in p.view_arrow(name).to_pylist())


def _step(p: Pipeline, fast_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", fast_rows)
    p.step()


@pytest.mark.parametrize("fast_rows", [4096, 8], ids=["small-changes", "big-changes"])
def test_fast_path_and_duckdb_give_identical_views(spark, tmp_path, monkeypatch, fast_rows):
    """Every phase in pyarrow (changes within ``FAST_PATH_ROWS``) or, with a limit of 8 rows,
    only the phase 1 of the aggregates that sum doubles exactly (which groups a change of any
    size in pyarrow), beside DuckDB for all: the same views, bit for bit."""
    rng = random.Random(2026)
    fast = Pipeline(_circuit(), str(tmp_path / "fast"), spark, driver_step_rows=10**9)
    slow = Pipeline(_circuit(), str(tmp_path / "slow"), spark, driver_step_rows=10**9)
    live: list[tuple] = []
    with fast, slow:
        for p in (fast, slow):
            p.push("dims", [(1, "north"), (2, None), (3, "south")])
        for step in range(14):
            inserts = [_fact(rng) for _ in range(rng.randint(1, 25))]
            deletes = rng.sample(live, min(len(live), rng.randint(0, 12)))
            if step == 9:  # a NaN and a -0.0 beside the others: those steps take DuckDB
                inserts += [("a", None, None, -0.0, math.nan, 1, 1)]
            for p in (fast, slow):
                p.push("facts", inserts)
                if deletes:
                    p.push("facts", deletes, weight=-1)
            live = [r for r in live if r not in deletes or deletes.remove(r)] + inserts
            _step(fast, fast_rows, monkeypatch)
            _step(slow, 0, monkeypatch)
            for name in ("multi", "joined", "money"):
                assert _view(fast, name) == _view(slow, name), (step, name)
        assert len(_view(fast, "multi")) > 5


def test_a_big_change_in_few_groups_keeps_its_exact_sums_out_of_duckdb(spark, tmp_path,
                                                                      monkeypatch):
    """A change of more values than ``FAST_PATH_ROWS`` in fewer groups: each min/max's
    extremes per group come from its rows numbered by hash (numbers and times:
    ``_extremes_by_rows``) or else DuckDB's query, the rest of phase 4 runs in pyarrow (the
    groups' lists of exact-sum pairs stay out of DuckDB), and the views equal the all-DuckDB
    pipeline's, bit for bit, through steps that delete the groups' extremes."""
    rng = random.Random(7)
    fast = Pipeline(_circuit(), str(tmp_path / "fast"), spark, driver_step_rows=10**9)
    slow = Pipeline(_circuit(), str(tmp_path / "slow"), spark, driver_step_rows=10**9)
    whole_phase_in_duckdb = []
    original = Aggregate._new_state_sql

    def spied(self: Aggregate, *args: object) -> object:
        whole_phase_in_duckdb.append(self)
        return original(self, *args)

    live: list[tuple] = []
    with fast, slow:
        for p in (fast, slow):
            p.push("dims", [(1, "north"), (2, "south"), (3, None)])
        for step in range(6):
            inserts = [("a", None, None, 1.0, rng.choice([0.1, 2.5, 1e17, -3.25]) * j,
                        j, j % 3 + 1) for j in range(rng.randint(40, 60))]
            deletes = sorted(live, key=lambda r: -r[4])[:rng.randint(0, 5)]  # the maxima
            for p in (fast, slow):
                p.push("facts", inserts)
                if deletes:
                    p.push("facts", deletes, weight=-1)
            live = [r for r in live if r not in deletes] + inserts
            monkeypatch.setattr(Aggregate, "_new_state_sql", spied)
            _step(fast, 16, monkeypatch)
            monkeypatch.setattr(Aggregate, "_new_state_sql", original)
            _step(slow, 0, monkeypatch)
            for name in ("multi", "joined"):
                assert _view(fast, name) == _view(slow, name), (step, name)
    assert whole_phase_in_duckdb == []


def test_a_small_step_runs_no_duckdb_query(spark, tmp_path, monkeypatch):
    """The point of the fast path: a 100-row step of join + aggregate costs no query."""
    queries = []
    original = LocalSQL.query

    def counted(self: LocalSQL, sql: str, **tables: object) -> object:
        queries.append(sql)
        return original(self, sql, **tables)

    with Pipeline(_circuit(), str(tmp_path / "root"), spark, driver_step_rows=10**9) as p:
        p.push("dims", [(1, "north"), (2, "south")])
        p.push("facts", [("a", None, None, 1.0, float(j), j, j % 2 + 1) for j in range(100)])
        p.step()
        monkeypatch.setattr(LocalSQL, "query", counted)
        p.push("facts", [("b", decimal.Decimal(j).scaleb(-2), None, 2.0, float(j), -j, 1)
                         for j in range(100)])
        p.push("facts", [("a", None, None, 1.0, 99.0, 99, 2)], weight=-1)  # the max goes
        p.step()
        assert p.view_arrow("money").sort_by("k").column("sd").to_pylist() == [
            None, decimal.Decimal("49.50")]
    assert queries == []


def test_join_weight_overflow_names_the_join(spark, tmp_path):
    c = Circuit("overflow")
    a, b, d = (c.input(n, f"k BIGINT, {n}v BIGINT") for n in ("a", "b", "d"))
    c.output("abd", a.join(b, "k").join(d, "k"))
    w = 2**31 - 1
    with Pipeline(c, str(tmp_path / "root"), spark, driver_step_rows=10**9) as p:
        for name in ("a", "b", "d"):
            p.push(name, [(1, 1)], weight=w)
        with pytest.raises(StepFailedError, match=r"join '.*': the weight of a joined row "
                                                  r"overflows 64 bits: 4611686014132420609 x "
                                                  r"2147483647"):
            p.step()


def test_min_max_re_reads_through_ordered_runs_equal_a_recompute(spark, tmp_path, monkeypatch):
    """Steps that delete groups' current extremes re-read only a few values a file
    (``Trace.lookup_extreme_rows``), deeper where later files deleted the top ones: the views
    equal min/max recomputed from scratch over the live rows (NaN above every number, NULLs
    skipped, strings in byte order), and the re-reads read less than the values trace."""
    import duckdb
    import pyarrow as pa

    from dbsp_pipeline.storage import keyed_runs
    from dbsp_pipeline.storage import trace as trace_module

    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 64)  # most files get an ordered run
    monkeypatch.setattr(trace_module, "EXTREME_ROWS", 1)
    rounds: list[tuple[int, int]] = []  # (rows taken per file and key, hashes cut)
    beyond = trace_module.Trace._beyond_cuts

    def spy(self, sql, wanted, count, largest, *bounds):
        rows, cut = beyond(self, sql, wanted, count, largest, *bounds)
        rounds.append((count, len(cut)))
        return rows, cut

    monkeypatch.setattr(trace_module.Trace, "_beyond_cuts", spy)
    c = Circuit("extremes")
    t = c.input("t", "id BIGINT, g BIGINT, v DOUBLE, s STRING")
    c.output("ext", t.group_by("g").agg(hi="max(v)", lo="min(v)", hs="max(s)", n="count(*)"))
    rng = random.Random(5)
    live: dict[int, tuple] = {}
    values = [math.nan, math.inf, -math.inf, -1.5, 0.0, 3.0, 8.25, None]
    words = ["", "a", "ab", "b", "z", "ä", None]

    def row(i: int) -> tuple:
        v = rng.choice(values) if rng.random() < 0.3 else float(rng.randint(-20, 20))
        return (i, None if rng.random() < 0.05 else rng.randint(0, 30), v, rng.choice(words))

    def rank(v: float | None) -> tuple:
        return (v is not None, v is not None and math.isnan(v), v if v is not None else 0.0)

    query = ("SELECT g, max(v) AS hi, min(v) AS lo, max(s) AS hs, count(*) AS n, 1 AS _weight "
             "FROM t "
             "GROUP BY g")
    with Pipeline(c, str(tmp_path / "p"), spark) as p:
        next_id = 0
        for step in range(10):
            inserts = [row(next_id + j) for j in range(2_000 if step == 0 else 60)]
            next_id += len(inserts)
            deletes = []
            for g in rng.sample(range(31), 12) if step else []:
                mine = [r for r in live.values() if r[1] == g]
                if mine:  # the current largest and smallest value, and the largest string
                    deletes += {max(mine, key=lambda r: rank(r[2]))[0]: 1,
                                min(mine, key=lambda r: rank(r[2]))[0]: 1,
                                max(mine, key=lambda r: (r[3] is not None,
                                                         (r[3] or "").encode()))[0]: 1}
            p.push("t", inserts)
            p.push("t", [live.pop(i) for i in deletes], weight=-1)
            live.update({r[0]: r for r in inserts})
            p.step()
            if step == 0:
                keyed_runs.wait_for_writes()
            table = pa.table({k: [r[j] for r in live.values()]
                              for j, k in enumerate(["id", "g", "v", "s"])},
                             schema=pa.schema([("id", pa.int64()), ("g", pa.int64()),
                                               ("v", pa.float64()), ("s", pa.string())]))
            con = duckdb.connect()
            con.register("t", table)
            expected = sorted(repr([(k, _bits(v)) for k, v in sorted(r.items())])
                              for r in con.sql(query).to_arrow_table().to_pylist())
            con.close()
            assert _view(p, "ext") == expected, step
        values_trace = next(t for t in p.engine.plan.state_traces() if "_values" in t.name)
        assert values_trace.runs.order_by == "_v"
        assert any(values_trace.runs.covers(f) for f in values_trace.files())
    assert any(cut for _, cut in rounds)  # files had more rows of a key than were taken
    assert any(count > 1 for count, _ in rounds)  # and some keys were read again, deeper


@pytest.mark.parametrize("fast_rows", [4096, 0], ids=["pyarrow", "duckdb"])
def test_a_deleted_extreme_re_read_up_to_it_and_a_better_insert_of_the_step(
        spark, tmp_path, monkeypatch, fast_rows):
    """A group whose extreme a step deletes is re-read up to that old extreme only (the values
    beyond it were all deleted before: ``Trace.lookup_extreme_rows``'s bound), and the step's
    best insert, which may lie beyond it, is weighed beside what the re-read found: steps that
    delete every group's extremes while inserting values beyond them, at them, short of them or
    none, for integers, timestamps, dates and doubles, in pyarrow and as DuckDB queries; the views
    equal min/max recomputed from scratch after every step."""
    import duckdb
    import pyarrow as pa

    from dbsp_pipeline.storage import keyed_runs

    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 64)  # the values' files get ordered runs
    monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", fast_rows)
    c = Circuit("bounded")
    t = c.input("t", "id BIGINT, g BIGINT, i BIGINT, ts TIMESTAMP, d DOUBLE, day DATE")
    c.output("ext", t.group_by("g").agg(hi="max(i)", lo="min(i)", last="max(ts)",
                                        dlo="min(d)", first="min(day)", n="count(*)"))
    rng = random.Random(17)
    epoch = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    live: dict[int, tuple] = {}

    def row(i: int, g: int, value: int) -> tuple:
        return (i, g, value, epoch + datetime.timedelta(seconds=value), value / 4,
                (epoch + datetime.timedelta(days=value)).date())

    with Pipeline(c, str(tmp_path / "p"), spark) as p:
        next_id = 0
        inserts = [row(j, j % 8, rng.randint(-500, 500)) for j in range(800)]
        next_id = len(inserts)
        for step in range(12):
            deletes: set[int] = set()
            if step:
                inserts = []
                for g in range(8):
                    mine = [r for r in live.values() if r[1] == g]
                    if not mine:
                        continue
                    top = max(mine, key=lambda r: r[2])
                    bottom = min(mine, key=lambda r: r[2])
                    deletes |= {top[0], bottom[0]}
                    how = (step + g) % 4  # beyond the extreme, at it, short of it, none
                    for value in ([top[2] + 3, bottom[2] - 3], [top[2], bottom[2]],
                                  [top[2] - 1, bottom[2] + 1], [])[how]:
                        inserts.append(row(next_id, g, value))
                        next_id += 1
            p.push("t", inserts)
            p.push("t", [live.pop(i) for i in deletes], weight=-1)
            live.update({r[0]: r for r in inserts})
            p.step()
            keyed_runs.wait_for_writes()
            table = pa.table({k: [r[j] for r in live.values()]
                              for j, k in enumerate(["id", "g", "i", "ts", "d", "day"])},
                             schema=pa.schema([("id", pa.int64()), ("g", pa.int64()),
                                               ("i", pa.int64()), ("ts", pa.timestamp("us", "UTC")),
                                               ("d", pa.float64()), ("day", pa.date32())]))
            con = duckdb.connect()
            con.register("t", table)
            expected = con.sql(
                "SELECT g, max(i) AS hi, min(i) AS lo, max(ts) AS last, min(d) AS dlo, "
                "min(day) AS first, count(*) AS n, 1 AS _weight FROM t GROUP BY g"
            ).to_arrow_table()
            con.close()

            def rows(table: pa.Table) -> list[str]:  # (instants compared as instants)
                return sorted(repr([(k, v.timestamp() if isinstance(v, datetime.datetime)
                                     else _bits(v)) for k, v in sorted(r.items())])
                              for r in table.to_pylist())
            assert rows(p.view_arrow("ext")) == rows(expected), step
        traces = [t for t in p.engine.plan.state_traces() if "_values" in t.name]
        assert len(traces) == 5 and all(t.runs.order_by == "_v" for t in traces)
        assert all(any(t.runs.covers(f) for f in t.files()) for t in traces)  # runs read


@pytest.mark.parametrize("mode", ["compared", "compared-duckdb", "consolidated"])
def test_a_group_whose_state_or_row_stays_emits_nothing(spark, tmp_path, monkeypatch, mode):
    """Phase 5 records and emits changed groups only (``Aggregate._emit_local``): a change that
    cancels within a group (one row in for another with the same value) appends nothing to
    the group's state; one that changes the state but not the visible row (a NULL in
    ``count(x)``'s column) appends the state and emits no view change; a group emptied out is
    retracted, a NULL key is a group like any other. The same with every phase as a DuckDB
    query, and where the old and new states are consolidated, not compared (a state column of
    a nested type)."""
    if mode == "compared-duckdb":
        monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 0)
    if mode == "consolidated":
        monkeypatch.setattr(local_sql, "equal_as_grouped", lambda *args: None)
    c = Circuit("stays")
    facts = c.input("facts", "k STRING, x BIGINT, tag STRING")
    c.output("v", facts.group_by("k").agg(nx="count(x)", s="sum(x)"))
    with Pipeline(c, str(tmp_path / "root"), spark, driver_step_rows=10**9) as p:
        (groups,) = [t for t in p.engine.plan.state_traces() if "_groups" in t.name]
        p.push("facts", [("a", 1, "p"), ("a", None, "p"), ("b", 2, "p"), (None, 3, "p")])
        p.step()
        files = len(groups.files())
        p.push("facts", [("a", None, "q"), (None, None, "q")])
        r = p.step()
        assert not r.outputs["v"] and len(groups.files()) == files + 1
        p.push("facts", [("a", 1, "z"), (None, 3, "z")])
        p.push("facts", [("a", 1, "p"), (None, 3, "p")], weight=-1)
        r = p.step()
        assert not r.outputs["v"] and len(groups.files()) == files + 1
        p.push("facts", [("a", 4, "y"), ("b", 2, "p")], weight=1)
        p.push("facts", [("b", 2, "p")], weight=-1)
        r = p.step()
        assert r.outputs["v"] == 2  # -(a, 1, 1) +(a, 2, 5); b stays
        p.push("facts", [("b", 2, "p")], weight=-1)  # b empties out
        p.push("facts", [(None, 5, "w")])
        r = p.step()
        assert r.outputs["v"] == 3  # -(b, 1, 2) -(NULL, 1, 3) +(NULL, 2, 8)
        assert sorted((row["k"] or "", row["nx"], row["s"])
                      for row in p.view_arrow("v").to_pylist()) == [("", 2, 8), ("a", 2, 5)]


MONEY = "k STRING, m DECIMAL(15,2), r DECIMAL(12,4), z DECIMAL(38,0)"


def _money_circuit() -> Circuit:
    c = Circuit("money")
    c.output("totals", c.input("t", MONEY).group_by("k").agg(
        n="count(*)", nm="count(m)", sm="sum(m)", am="avg(m)", sr="sum(r)", ar="avg(r)",
        sz="sum(z)", az="avg(z)", top="max(m)"))
    return c


def _money(rng: random.Random) -> tuple:
    def maybe(value: object) -> object:
        return None if rng.random() < 0.1 else value
    return (maybe(rng.choice(["a", "b", "c", ""])),
            maybe(decimal.Decimal(rng.randint(-10**13, 10**13)).scaleb(-2)),
            maybe(decimal.Decimal(rng.choice([1, -1, 3, 7, 10**7]) * rng.randint(1, 999))
                  .scaleb(-4)),
            maybe(decimal.Decimal(rng.choice([1, -1]) * rng.randint(0, 10**24))))


def _exact_view(p: Pipeline) -> list[tuple]:
    return sorted((tuple((k, v) for k, v in sorted(r.items())) for r in
                   p.view_arrow("totals").to_pylist()), key=repr)


def _three_paths(circuit: Callable[[], Circuit], spark, tmp_path) -> tuple[Pipeline, ...]:
    """Three pipelines of one circuit: every step on the driver, as Spark jobs, and as Spark
    tasks per owner (rescale the last to W=2 once open)."""
    driver = Pipeline(circuit(), str(tmp_path / "driver"), spark, driver_step_rows=10**9)
    jobs = Pipeline(circuit(), str(tmp_path / "jobs"), spark, driver_step_rows=0)
    tasks = Pipeline(circuit(), str(tmp_path / "tasks"), spark, driver_step_rows=0)
    jobs.spark_per_owner = False
    return driver, jobs, tasks


def test_decimal_sums_and_averages_on_the_driver_equal_sparks_to_the_last_digit(spark,
                                                                                tmp_path):
    """Sums and averages of DECIMAL(15,2), (12,4) and (38,0) run on the driver (Spark keeps
    their scales: ``spark_decimal.keeps_scale``), and equal, digit for digit and type for type,
    the same circuit run as Spark jobs (each aggregate's own Spark arithmetic) and as Spark
    tasks per owner (W=2), step after step of random inserts and deletes with NULLs, groups
    emptying out and coming back; the sums equal the exact sum of the rows present."""
    rng = random.Random(15)
    driver, jobs, tasks = _three_paths(_money_circuit, spark, tmp_path)
    live: list[tuple] = []
    with driver, jobs, tasks:
        tasks.rescale(2)
        for step in range(7):
            inserts = [_money(rng) for _ in range(rng.randint(1, 30))]
            deletes = rng.sample(live, min(len(live), rng.randint(0, 20 if step % 3 else 60)))
            for p in (driver, jobs, tasks):
                p.push("t", inserts)
                if deletes:
                    p.push("t", deletes, weight=-1)
            for r in deletes:
                live.remove(r)
            live += inserts
            results = [p.step() for p in (driver, jobs, tasks)]
            assert [r.on_driver for r in results] == [True, False, False], results
            views = [_exact_view(p) for p in (driver, jobs, tasks)]
            assert views[0] == views[1] == views[2], step
            schema = driver.view_arrow("totals").schema
            assert schema == jobs.view_arrow("totals").schema
            assert str(schema.field("am").type) == "decimal128(19, 6)"
            for row in driver.view_arrow("totals").to_pylist():
                mine = [r for r in live if r[0] == row["k"]]
                ms = [r[1] for r in mine if r[1] is not None]
                assert row["n"] == len(mine) and row["nm"] == len(ms)
                assert row["sm"] == (sum(ms) if ms else None), (step, row)
                zs = [r[3] for r in mine if r[3] is not None]
                assert row["sz"] == (sum(zs) if zs else None), (step, row)
        assert len(views[0]) >= 3
        assert any(row["am"] is not None and row["am"] != round(row["am"], 2)
                   for row in driver.view_arrow("totals").to_pylist())  # digits of its own


WIDE = "k STRING, q DECIMAL(38,18), e DECIMAL(30,10), m DECIMAL(15,3)"


def _wide_circuit() -> Circuit:
    c = Circuit("wide")
    c.output("totals", c.input("t", WIDE).group_by("k").agg(
        n="count(*)", sq="sum(q)", aq="avg(q)", se="sum(e)", am="avg(m)", sm="sum(m)"))
    return c


def _wide(rng: random.Random) -> tuple:
    def digits(integer: int, scale: int) -> object:
        if rng.random() < 0.1:
            return None
        return decimal.Decimal(rng.randint(-10**(integer + scale), 10**(integer + scale))
                               ).scaleb(-scale)
    # (an average's state has the average's type: DECIMAL(38,22) for q, 16 integer digits)
    return rng.choice(["a", "b", "c"]), digits(13, 18), digits(18, 10), digits(11, 3)


def test_wide_decimal_sums_are_exact_on_every_path_and_equal_sparks_from_scratch(spark,
                                                                                tmp_path):
    """Sums whose state has a scale above 6 in a wide type (a DECIMAL(38,18) column; a
    DECIMAL(30,10) one, a DECIMAL(38,10) sum), which Spark's own ``*`` and ``+`` round to 6
    fractional digits, and averages of them (whose quotient Spark's ``/`` would round to 18
    digits, not the average's 22): on the driver, as
    Spark jobs (the product and the state's sum in pyarrow) and as tasks per owner (W=2) every
    step's view is the same, digit for digit, and equals Spark's ``SUM``/``AVG`` from scratch
    over the rows present, under inserts of weight 1 and 3 and deletes of one copy."""
    rng = random.Random(38)
    driver, jobs, tasks = _three_paths(_wide_circuit, spark, tmp_path)
    live: list[tuple] = []
    with driver, jobs, tasks:
        tasks.rescale(2)
        for step in range(5):
            ones = [_wide(rng) for _ in range(rng.randint(1, 20))]
            threes = [_wide(rng) for _ in range(rng.randint(0, 5))]
            deletes = rng.sample(live, min(len(live), rng.randint(0, 15)))
            for p in (driver, jobs, tasks):
                p.push("t", ones)
                if threes:
                    p.push("t", threes, weight=3)
                if deletes:
                    p.push("t", deletes, weight=-1)
            live += ones + threes * 3
            for r in deletes:
                live.remove(r)
            results = [p.step() for p in (driver, jobs, tasks)]
            assert [r.on_driver for r in results] == [True, False, False], results
            views = [_exact_view(p) for p in (driver, jobs, tasks)]
            assert views[0] == views[1] == views[2], step
            assert driver.view_arrow("totals").schema == jobs.view_arrow("totals").schema
            scratch = spark.createDataFrame(live, WIDE).groupBy("k").agg(
                F.count("*").alias("n"), F.sum("q").alias("sq"), F.avg("q").alias("aq"),
                F.sum("e").alias("se"), F.avg("m").alias("am"), F.sum("m").alias("sm"))
            expected = sorted((tuple(sorted(r.asDict().items())) for r in scratch.collect()),
                              key=repr)
            assert [tuple(c for c in row if c[0] != "_weight") for row in views[0]] == expected
            for row in driver.view_arrow("totals").to_pylist():  # exact, not only Spark's
                qs = [r[1] for r in live if r[0] == row["k"] and r[1] is not None]
                with decimal.localcontext(prec=80):  # (the default 28 digits would round)
                    assert row["sq"] == (sum(qs) if qs else None)
        sq = [r["sq"] for r in driver.view_arrow("totals").to_pylist() if r["sq"] is not None]
        assert any(v != round(v, 6) for v in sq)  # digits beyond Spark's rounding


def test_a_decimal_average_keeps_its_sum_in_sparks_type_and_overflows_only_where_spark_does(
        spark, tmp_path):
    """An average of DECIMAL(15,2) keeps its sum as Spark's ``AVG`` does, in DECIMAL(25,2) (not
    in the average's DECIMAL(19,6), 10 digits fewer): sums of 14 to 16 integer digits step on
    every path and the averages equal Spark's ``AVG`` from scratch; a sum beyond 23 integer
    digits fails the step on the driver and on Spark, as Spark's ``AVG`` does."""
    schema = "k BIGINT, m DECIMAL(15,2)"

    def circuit() -> Circuit:
        c = Circuit("avg")
        c.output("totals", c.input("t", schema).group_by("k").agg(a="avg(m)", s="sum(m)"))
        return c

    top = decimal.Decimal("9999999999999.99")
    rows = [(1, top)] * 3 + [(1, decimal.Decimal("0.01"))] + [(2, top)] * 700 + [(3, -top)] * 2
    driver, jobs, tasks = _three_paths(circuit, spark, tmp_path)
    with driver, jobs, tasks:
        tasks.rescale(2)
        for p in (driver, jobs, tasks):
            p.push("t", rows)
            p.step()
            (groups,) = [t for t in p.engine.plan.state_traces() if "_groups" in t.name]
            assert groups.name.endswith("_groups_wide")
            assert str(groups.table.arrow_schema.field("_s0").type) == "decimal128(25, 2)"
        views = [_exact_view(p) for p in (driver, jobs, tasks)]
        assert views[0] == views[1] == views[2]
        scratch = spark.createDataFrame(rows, schema).groupBy("k").agg(
            F.avg("m").alias("a"), F.sum("m").alias("s"))
        assert [tuple(c for c in row if c[0] != "_weight") for row in views[0]] == sorted(
            (tuple(sorted(r.asDict().items())) for r in scratch.collect()), key=repr)
        assert str(driver.view_arrow("totals").schema.field("a").type) == "decimal128(19, 6)"

    def average_only() -> Circuit:  # (no sum of the same type to overflow first)
        c = Circuit("avg")
        c.output("totals", c.input("t", schema).group_by("k").agg(a="avg(m)"))
        return c
    for path, rows_on_driver in (("driver", 10**9), ("jobs", 0)):
        with Pipeline(average_only(), str(tmp_path / f"beyond-{path}"), spark,
                      driver_step_rows=rows_on_driver) as p:
            p.push("t", [(1, top)] * 3, weight=2**31 - 1)
            p.step()  # 6.4e22: 23 integer digits
            assert p.view_arrow("totals").column("a").to_pylist() == [top]
            p.push("t", [(1, top)] * 2, weight=2**31 - 1)  # 1.07e23
            with pytest.raises(StepFailedError, match="(?i)overflow|out of range|precision"):
                p.step()


def test_an_integer_sum_past_64_bits_names_the_sum_its_type_and_a_remedy(spark, tmp_path):
    """As Spark's ANSI sum, the step fails (a row's value times its multiplicity here, a
    group's total in the second step), naming the aggregate, not DuckDB's internals alone."""
    c = Circuit("overflow")
    c.output("s", c.input("t", "k BIGINT, v BIGINT").group_by("k").agg(
        n="count(*)", total="sum(v)"))
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        p.push("t", [(1, 2**62), (1, 2**62)])
        with pytest.raises(StepFailedError, match=r"total = sum\(v\) as BIGINT: a row's value "
                           r"times its multiplicity, or a group's total, is beyond what the "
                           r"type holds .*CAST\(\.\.\. AS DECIMAL\(38, 0\)\)"):
            p.step()
        p.quarantine_step(p.next_step)
        p.push("t", [(2, 2**62 + 1)])
        p.step()
        p.push("t", [(2, 2**62)])
        p.push("t", [(3, 1)])
        with pytest.raises(StepFailedError, match=r"total = sum\(v\) as BIGINT"):
            p.step()


def test_a_decimal_sum_that_leaves_its_type_fails_the_step_and_keeps_the_root(spark, tmp_path):
    """A sum beyond DECIMAL(38,0)'s 38 digits: the step fails on the driver, as Spark's ANSI
    mode fails it; nothing of it stays, the root opens again, and once the step's input is
    quarantined the pipeline goes on."""
    c = Circuit("overflow")
    c.output("s", c.input("t", "k BIGINT, z DECIMAL(38,0)").group_by("k").agg(s="sum(z)"))
    big = decimal.Decimal(10**38 - 1)
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        p.push("t", [(1, big)])
        assert p.step().on_driver
        p.push("t", [(1, big)])
        with pytest.raises(StepFailedError, match="(?i)overflow|out of range") as failed:
            p.step()
        assert "DECIMAL(38)" in str(failed.value)
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        assert p.view_arrow("s").select(["k", "s"]).to_pylist() == [{"k": 1, "s": big}]
        with pytest.raises(StepFailedError):
            p.step()  # the same input, the same failure
        assert p.quarantine_step(p.next_step).moved == {"t": 1}
        p.push("t", [(1, decimal.Decimal(1 - 10**38))])
        p.step()
        assert p.view_arrow("s").select(["k", "s"]).to_pylist() == [{"k": 1, "s": 0}]


@pytest.mark.parametrize("rows_on_driver", [10**9, 0], ids=["driver", "spark"])
def test_a_narrow_decimal_sum_past_its_type_fails_where_spark_fails(spark, tmp_path,
                                                                    rows_on_driver):
    """A DECIMAL(5,2) sums as DECIMAL(15,2): a step's partial past 13 integer digits, and a
    group's total past them in a later step, fail the step on the driver (whose sums of
    unscaled int64 values still fit: the check is the type's, not 64 bits') as on Spark."""
    c = Circuit("narrow")
    c.output("s", c.input("t", "k BIGINT, m DECIMAL(5,2)").group_by("k").agg(s="sum(m)"))
    top, weight = decimal.Decimal("999.99"), 2**31 - 1
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=rows_on_driver) as p:
        p.push("t", [(1, top)] * 4, weight=weight)
        p.push("t", [(2, top)] * 5, weight=weight)  # 1.07e13: the partial leaves the type
        with pytest.raises(StepFailedError, match="(?i)overflow|out of range|precision"):
            p.step()
        p.quarantine_step(p.next_step)
        p.push("t", [(1, top)] * 4, weight=weight)
        p.step()
        assert p.view_arrow("s").column("s").to_pylist() == [top * 4 * weight]
        p.push("t", [(1, top)], weight=weight)  # the group's total leaves the type
        with pytest.raises(StepFailedError, match="(?i)overflow|out of range|precision"):
            p.step()
