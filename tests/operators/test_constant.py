"""Constant collections (``Circuit.constant``) and the global aggregate built on one
(``Collection.agg``): a constant's change is its rows at step 0 only, so its value is the rows at
every step, also after a reopen or a recomputation; a global aggregate has exactly one row at
every step, the empty values (count 0, the others NULL) while its input is empty, on both
engine paths."""

from __future__ import annotations

import pytest

from dbsp_pipeline import Circuit, Pipeline, check_views
from dbsp_pipeline.errors import CircuitError
from tests.conftest import view_rows

ENGINES = pytest.mark.parametrize("driver_step_rows", [0, 10**9], ids=["spark", "driver"])
EMPTY = (0, 0, None, None, None, None)


def _circuit() -> Circuit:
    c = Circuit("constants")
    orders = c.input("orders", "id BIGINT, amount DOUBLE")
    c.output("codes", c.constant("code INT, label STRING", [[1, "one"], [2, None]]))
    c.output("totals", orders.agg(n="count(*)", na="count(amount)", s="sum(amount)",
                                  a="avg(amount)", lo="min(amount)", hi="max(amount)"))
    c.output("big", orders.filter("amount > 100").agg(n="count(*)", s="sum(amount)"))
    return c


@ENGINES
def test_a_constant_holds_its_rows_and_a_global_aggregate_one_row_at_every_step(
        spark, tmp_path, driver_step_rows):
    with Pipeline(_circuit(), str(tmp_path), spark, driver_step_rows=driver_step_rows) as p:
        assert p.step().on_driver == bool(driver_step_rows)  # nothing pushed yet
        assert view_rows(p, "codes") == {(1, "one"): 1, (2, None): 1}
        assert view_rows(p, "totals") == {EMPTY: 1}
        assert view_rows(p, "big") == {(0, None): 1}
        p.push("orders", [(1, 2.5), (2, None), (3, 7.5)])
        p.step()
        assert view_rows(p, "totals") == {(3, 2, 10.0, 5.0, 2.5, 7.5): 1}
        assert view_rows(p, "big") == {(0, None): 1}
        p.push("orders", [(1, 2.5), (2, None), (3, 7.5)], weight=-1)  # empty again
        p.push("orders", [(4, 200.0)])
        p.step()
        assert view_rows(p, "totals") == {(1, 1, 200.0, 200.0, 200.0, 200.0): 1}
        assert view_rows(p, "big") == {(1, 200.0): 1}
        p.push("orders", [(4, 200.0)], weight=-1)
        p.step()
        assert view_rows(p, "totals") == {EMPTY: 1}
        assert view_rows(p, "big") == {(0, None): 1}
        assert view_rows(p, "codes") == {(1, "one"): 1, (2, None): 1}
        assert all(c.equal and c.nonpositive == 0 for c in check_views(p).values())
    with Pipeline(_circuit(), str(tmp_path), spark, driver_step_rows=driver_step_rows) as p:
        p.push("orders", [(5, 1.0)])
        p.step()  # a step after reopening emits no constant rows again
        assert view_rows(p, "codes") == {(1, "one"): 1, (2, None): 1}
        assert view_rows(p, "totals") == {(1, 1, 1.0, 1.0, 1.0, 1.0): 1}


def test_the_first_step_may_already_carry_input(spark, tmp_path):
    with Pipeline(_circuit(), str(tmp_path), spark) as p:
        p.push("orders", [(1, 150.0)])
        p.step()
        assert view_rows(p, "totals") == {(1, 1, 150.0, 150.0, 150.0, 150.0): 1}
        assert view_rows(p, "big") == {(1, 150.0): 1}


def test_constant_rows_that_do_not_fit_the_schema_are_refused_when_the_circuit_opens(
        spark, tmp_path):
    c = Circuit("bad")
    c.output("v", c.constant("code INT", [["not a number"]]))
    with pytest.raises(CircuitError, match=r"constant.*rows do not fit"):
        Pipeline(c, str(tmp_path / "a"), spark)
    c = Circuit("short")
    c.output("v", c.constant("code INT, label STRING", [[1]]))
    with pytest.raises(CircuitError, match="1 values for 2 columns"):
        Pipeline(c, str(tmp_path / "b"), spark)


def test_declaring_a_constant_or_a_global_aggregate_checks_its_arguments():
    c = Circuit("c")
    with pytest.raises(CircuitError, match="list of lists"):
        c.constant("x INT", [1, 2])  # type: ignore[list-item]
    with pytest.raises(CircuitError, match="is not a number"):
        c.constant("x INT", [[object()]])
    orders = c.input("orders", "id BIGINT, global_key DOUBLE")
    with pytest.raises(CircuitError, match="at least one aggregate"):
        orders.agg()
    with pytest.raises(CircuitError, match="is not one of"):
        orders.agg(n="median(id)")
    # a column named like the internal group key does not clash with it
    assert orders.agg(s="sum(global_key)").circuit is c
