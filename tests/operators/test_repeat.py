"""``Collection.repeat``: each row as many times as its count column says, after every step of
inserts and deletes, on both engine paths; NULL and non-positive counts drop the row; and the
declaration's checks."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.errors import CircuitError
from tests.conftest import view_rows

ENGINES = pytest.mark.parametrize("driver_step_rows", [0, 10**9], ids=["spark", "driver"])


def expected(bag: Counter) -> Counter:
    out: Counter = Counter()
    for (k, n), m in bag.items():
        if n is not None and n > 0:
            out[(k,)] += m * n
    return out


@ENGINES
def test_repeat_multiplies_each_rows_multiplicity_by_its_count(spark, tmp_path,
                                                               driver_step_rows):
    c = Circuit("rep")
    c.output("repeated", c.input("rows", "k STRING, n INT").repeat("n"))
    steps = [([("a", 3), ("b", None), ("c", 0), ("d", -2), ("a", 3), ("e", 1)], []),
             ([("b", 2)], [("a", 3)]),
             ([], [("a", 3), ("e", 1), ("d", -2)])]
    bag: Counter = Counter()
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=driver_step_rows) as p:
        for inserts, deletes in steps:
            if inserts:
                p.push("rows", inserts)
            if deletes:
                p.push("rows", deletes, weight=-1)
            bag.update(inserts)
            bag.subtract(deletes)
            assert p.step().on_driver == bool(driver_step_rows)
            assert view_rows(p, "repeated") == expected(+bag)
        assert view_rows(p, "repeated") == Counter({("b",): 2})


def test_repeat_needs_an_integer_count_column(spark, tmp_path):
    c = Circuit("c")
    rows = c.input("rows", "k STRING, n DOUBLE")
    with pytest.raises(CircuitError, match="count must name"):
        rows.repeat("")
    c.output("bad", rows.repeat("n"))
    with pytest.raises(CircuitError, match="column 'n' is double, not an integer count"):
        Pipeline(c, str(tmp_path / "a"), spark)
    d = Circuit("d")
    d.output("bad", d.input("rows", "k STRING").repeat("nope"))
    with pytest.raises(CircuitError, match="column 'nope' not in"):
        Pipeline(d, str(tmp_path / "b"), spark)


rows = st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.integers(-2, 3)))
#: per step, rows to insert and indexes of live rows to delete
steps = st.lists(st.tuples(st.lists(rows, max_size=6), st.lists(st.integers(0, 30), max_size=4)),
                 min_size=1, max_size=4)


@settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(steps)
def test_repeat_on_the_driver_equals_a_repetition_from_scratch(spark, tmp_path_factory,
                                                               workload):
    c = Circuit("rep")
    c.output("repeated", c.input("rows", "k STRING, n BIGINT").repeat("n"))
    bag: Counter = Counter()
    with Pipeline(c, str(tmp_path_factory.mktemp("rep")), spark) as p:
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
            assert view_rows(p, "repeated") == expected(bag)
