"""Top-k (``Collection.top_k``) against a from-scratch ranking in Python, after every step of
random inserts and deletes (NULLs in order keys and partitions, rows of multiplicity above one,
ties broken by all columns, or sharing a place as RANK and DENSE_RANK), on both engine paths; and
the declaration's checks."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dbsp_pipeline import Circuit, Pipeline, check_views
from dbsp_pipeline.errors import CircuitError
from tests.conftest import view_rows

ENGINES = pytest.mark.parametrize("driver_step_rows", [0, 10**9], ids=["spark", "driver"])
SCHEMA = "g BIGINT, id BIGINT, v DOUBLE, s STRING"


def _asc_nulls_first(value: object) -> tuple:
    return (value is not None, value if value is not None else 0)


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

    groups: dict[object, list[tuple]] = {}
    for row, m in bag.items():
        groups.setdefault(row[0] if partition else None, []).extend([row] * m)
    out: Counter = Counter()
    for rows in groups.values():
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


@ENGINES
def test_top_k_equals_a_ranking_from_scratch_after_every_step(spark, tmp_path, driver_step_rows):
    rng = random.Random(4)
    bag: Counter = Counter()
    with Pipeline(_circuit(), str(tmp_path), spark, driver_step_rows=driver_step_rows) as p:
        for step in range(5):
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
            assert p.step().on_driver == bool(driver_step_rows)
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


@settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(steps)
def test_top_k_on_the_driver_equals_a_ranking_from_scratch(spark, tmp_path_factory, workload):
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
