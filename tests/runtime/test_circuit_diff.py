"""``circuit_diff``: which operators of a new circuit keep a recorded circuit's state, which
are new, which retire, and how each output changes; whatever the declaration order. No Spark
(descriptions only)."""

from __future__ import annotations

import pytest

from dbsp_pipeline import Circuit
from dbsp_pipeline.errors import CircuitChangedError
from dbsp_pipeline.runtime.circuit_diff import (
    diff,
    node_fingerprints,
    positional_state_names,
    state_names,
)

ORDERS = "order_id BIGINT, customer_id BIGINT, amount DOUBLE"
CUSTOMERS = "customer_id BIGINT, region STRING"


def shop(*, big: str = "amount > 10", extra_view: bool = False, drop_totals: bool = False,
         first: str = "customers", orders_schema: str = ORDERS) -> Circuit:
    """The oracle's shape: a filter, a join, an aggregate over the join, a left join."""
    c = Circuit("shop")
    if first == "customers":
        cu = c.input("customers", CUSTOMERS)
        o = c.input("orders", orders_schema)
    else:
        o = c.input("orders", orders_schema)
        cu = c.input("customers", CUSTOMERS)
    if extra_view:
        c.output("per_customer", o.group_by("customer_id").agg(n="count(*)"))
    big_orders = o.filter(big)
    c.output("big", big_orders)
    joined = big_orders.join(cu, on="customer_id")
    if not drop_totals:
        c.output("totals", joined.group_by("region").agg(s="sum(amount)"))
    c.output("with_region", o.left_join(cu, on="customer_id"))
    return c


def ops(circuit: Circuit, ids: list[int]) -> list[str]:
    return [circuit.node(i).op for i in ids]


def test_the_same_circuit_keeps_every_operator():
    d = diff(shop().describe(), shop().describe())
    assert d.unchanged and not d.added and not d.retired
    assert d.kept == {i: i for i in range(len(shop().nodes))}
    assert d.outputs_unchanged == ["big", "totals", "with_region"]


def test_declaration_order_does_not_matter():
    """Inputs declared the other way round shift every id; every operator is still kept."""
    old, new = shop(), shop(first="orders")
    d = diff(old.describe(), new.describe())
    assert d.unchanged
    assert d.kept != {i: i for i in range(len(new.nodes))}
    for new_id, old_id in d.kept.items():
        assert new.node(new_id).op == old.node(old_id).op


def test_an_added_view_adds_only_its_operators_and_keeps_the_rest():
    old, new = shop(), shop(extra_view=True)
    d = diff(old.describe(), new.describe())
    assert ops(new, d.added) == ["aggregate"]
    assert d.retired == []
    assert d.outputs_added == ["per_customer"]
    assert d.outputs_changed == [] and d.outputs_unchanged == ["big", "totals", "with_region"]


def test_a_changed_filter_changes_what_reads_it_and_nothing_else():
    old, new = shop(), shop(big="amount > 20")
    d = diff(old.describe(), new.describe())
    # the filter, the join and the aggregate over it are new; the left join keeps its state
    assert sorted(ops(new, d.added)) == ["aggregate", "filter", "join"]
    assert sorted(ops(old, d.retired)) == ["aggregate", "filter", "join"]
    assert d.outputs_changed == ["big", "totals"]
    assert d.outputs_unchanged == ["with_region"]
    left_join_nodes = [i for i, n in enumerate(new.nodes) if n.op in ("join", "distinct")
                       and i not in d.added]
    assert left_join_nodes and all(i in d.kept for i in left_join_nodes)


def test_a_removed_view_retires_its_operators():
    old, new = shop(), shop(drop_totals=True)
    d = diff(old.describe(), new.describe())
    assert ops(old, d.retired) == ["aggregate"]
    assert d.added == []
    assert d.outputs_removed == ["totals"]
    assert not d.unchanged


def test_equal_operators_pair_in_declaration_order():
    c = Circuit("twice")
    x = c.input("x", "k BIGINT")
    c.output("a", x.distinct())
    c.output("b", x.distinct())
    d = diff(c.describe(), c.describe())
    assert d.kept == {0: 0, 1: 1, 2: 2} and d.unchanged


def test_a_conform_reference_is_fingerprinted_by_what_it_names():
    """``left_join`` conforms its unmatched rows to the inner join's node: a reference by id,
    which must not make an unchanged left join look new when ids shift."""
    old, new = shop(), shop(first="orders", extra_view=True)
    d = diff(old.describe(), new.describe())
    conform = [i for i, n in enumerate(new.nodes) if n.op == "conform"]
    assert conform and all(i in d.kept for i in conform)
    prints = node_fingerprints(new.describe())
    assert len(set(prints.values())) == len(prints)


def test_sql_views_added_in_the_middle_keep_the_others():
    tables = ("CREATE TABLE orders (order_id BIGINT, customer_id BIGINT, amount DOUBLE);\n"
              "CREATE TABLE customers (customer_id BIGINT, region STRING);\n")
    a = "CREATE VIEW a AS SELECT customer_id, sum(amount) AS s FROM orders GROUP BY customer_id;\n"
    b = ("CREATE VIEW b AS SELECT c.region, count(*) AS n FROM orders o JOIN customers c "
         "ON o.customer_id = c.customer_id GROUP BY c.region;\n")
    mid = "CREATE VIEW mid AS SELECT DISTINCT region FROM customers;\n"
    old = Circuit.from_sql(tables + a + b)
    new = Circuit.from_sql(tables + a + mid + b)
    d = diff(old.describe(), new.describe())
    assert d.outputs_added == ["mid"] and d.outputs_unchanged == ["a", "b"]
    assert d.retired == []
    assert "distinct" in ops(new, d.added)


def test_an_input_schema_change_is_refused_and_layout_is_not_a_change():
    with pytest.raises(CircuitChangedError, match=r"input 'orders' changes its schema"):
        diff(shop().describe(), shop(orders_schema=ORDERS + ", qty BIGINT").describe())
    d = diff(shop().describe(),
             shop(orders_schema="order_id BIGINT,customer_id BIGINT,  amount DOUBLE").describe())
    assert d.unchanged


def test_the_summary_is_json_ready():
    import json

    d = diff(shop().describe(), shop(big="amount > 20", extra_view=True).describe())
    summary = json.loads(json.dumps(d.describe()))
    assert summary["outputs"]["added"] == ["per_customer"]
    assert summary["outputs"]["changed"] == ["big", "totals"]


def test_state_names_are_positional_until_a_circuit_changes():
    c = shop()
    d = c.describe()
    names = positional_state_names(d)
    assert names == {n.id: f"n{n.id}_{n.op}" for n in map(c.node, range(len(d["nodes"])))
                     if n.op != "input"}
    assert state_names(diff(d, d), d, names) == names


def test_kept_operators_keep_their_names_when_a_view_added_first_shifts_the_ids():
    old, new = shop(), shop(extra_view=True)
    d = diff(old.describe(), new.describe())
    before = positional_state_names(old.describe())
    names = state_names(d, new.describe(), before)
    for new_id, old_id in d.kept.items():
        if new_id in names:
            assert names[new_id] == before[old_id]
    fresh = [names[i] for i in d.added]
    assert ops(new, d.added) == ["aggregate"] and len(fresh) == 1
    assert fresh[0] not in before.values()  # n<id>_aggregate of an id the old circuit used
    assert len(set(names.values())) == len(names)


def test_a_new_operator_never_takes_a_retired_operators_name():
    """Dropping ``totals`` retires its aggregate; a changed view's new aggregate declared at the
    same position would be ``n<id>_aggregate`` too: it gets ``_u1``, since the retired tables
    still hold the old circuit's state until the upgrade commits."""
    def circuit(agg: str) -> Circuit:
        c = Circuit("one")
        x = c.input("x", "k BIGINT, v DOUBLE")
        c.output("g", x.group_by("k").agg(s=agg))
        return c

    old, new = circuit("sum(v)"), circuit("max(v)")
    d = diff(old.describe(), new.describe())
    before = positional_state_names(old.describe())
    assert d.retired == d.added == [1] and before == {1: "n1_aggregate"}
    assert state_names(d, new.describe(), before) == {1: "n1_aggregate_u1"}
    # changing it back: the first circuit's tables exist still (a retained checkpoint refers
    # to them), so the new aggregate keeps clear of them too
    again = diff(new.describe(), old.describe())
    assert state_names(again, old.describe(), {1: "n1_aggregate_u1"},
                       in_use=["n1_aggregate_groups"]) == {1: "n1_aggregate_u2"}
    assert state_names(again, old.describe(), {1: "n1_aggregate_u1"},
                       in_use=["n1_aggregate_u1_groups", "n1_aggregate_values0"]
                       ) == {1: "n1_aggregate_u2"}
    assert state_names(again, old.describe(), {1: "n1_aggregate_u1"}) == {1: "n1_aggregate"}
