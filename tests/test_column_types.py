"""Column types read from a circuit's description, and the type join keys of different numeric
types are compared as (``dbsp_pipeline/column_types.py``)."""

from __future__ import annotations

import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.column_types import join_key_type, known_columns
from dbsp_pipeline.errors import CircuitError


@pytest.mark.parametrize("left, right, wide", [
    ("int", "bigint", "bigint"), ("tinyint", "smallint", "smallint"), ("int", "int", None),
    ("int", "double", "double"), ("float", "double", "double"), ("bigint", "double", None),
    ("decimal(10,2)", "decimal(12,0)", "decimal(14,2)"), ("int", "decimal(5,2)", "decimal(12,2)"),
    ("bigint", "decimal(38,0)", "decimal(38,0)"), ("bigint", "decimal(38,2)", "decimal(38,2)"),
    ("bigint", "decimal(38,20)", None),
    ("decimal", "decimal(5)", "decimal(10,0)"), ("string", "int", None),
    ("double", "decimal(10,2)", None), ("float", "int", None)])
def test_the_type_keys_are_compared_as_holds_every_value_of_both(left, right, wide):
    assert join_key_type(left, right) == wide
    assert join_key_type(right, left) == wide


def test_known_columns_follow_inputs_plain_selects_and_joins():
    c = Circuit("t")
    a = c.input("a", "k INT, x DOUBLE")
    b = c.input("b", "k BIGINT, y STRING")
    picked = a.select("k", "x * 2 AS x2")
    joined = picked.join(b, on="k")
    columns = known_columns(c)
    assert columns[picked.node_id] == [("k", "int"), ("x2", None)]
    # the INT side's key was cast to BIGINT before the join: its type is no longer read
    assert [n for n, _ in columns[joined.node_id]] == ["k", "x2", "y"]


def test_a_python_join_widens_its_keys_and_a_semijoin_keeps_its_sides_types(spark, tmp_path):
    c = Circuit("t")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    customers = c.input("customers", "customer_id INT, region STRING")
    c.output("joined", orders.join(customers, on="customer_id"))
    c.output("known", customers.semijoin(orders, on="customer_id"))
    c.output("unknown", customers.antijoin(orders, on="customer_id"))
    c.output("padded", customers.left_join(orders, on="customer_id"))
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        p.push("customers", [(7, "north"), (8, "south"), (9, "east")])
        p.push("orders", [(1, 7, 2.5), (2, 7, 1.0), (3, 8, 4.0), (4, 2**40, 9.0)])
        p.step()
        assert sorted(p.view_arrow("joined").drop_columns(["_weight"]).to_pylist(),
                      key=lambda r: r["order_id"]) == [
            {"customer_id": 7, "order_id": 1, "amount": 2.5, "region": "north"},
            {"customer_id": 7, "order_id": 2, "amount": 1.0, "region": "north"},
            {"customer_id": 8, "order_id": 3, "amount": 4.0, "region": "south"}]
        assert sorted(p.view_arrow("known").column("customer_id").to_pylist()) == [7, 8]
        assert p.view_arrow("unknown").column("region").to_pylist() == ["east"]
        assert p.view_arrow("padded").num_rows == 4
        assert p.view_schema("joined")["customer_id"].dataType.simpleString() == "bigint"
        assert p.view_schema("known")["customer_id"].dataType.simpleString() == "int"
        assert p.view_schema("padded")["customer_id"].dataType.simpleString() == "bigint"


def test_keys_of_a_computed_column_of_another_type_are_refused_with_a_cast_hint(spark,
                                                                                tmp_path):
    c = Circuit("t")
    a = c.input("a", "k BIGINT")
    b = c.input("b", "j INT").select("j + 1 AS k")  # INT, not known without Spark
    c.output("v", a.join(b, on="k"))
    with pytest.raises(CircuitError, match="key 'k' is bigint on the left and int on the "
                       "right; cast one side"):
        Pipeline(c, str(tmp_path), spark)


def test_a_union_of_different_types_is_not_known_so_its_join_is_not_widened(spark, tmp_path):
    """INT unioned with DOUBLE is a DOUBLE column (Spark's union widens it): casting it to the
    other side's BIGINT would truncate 1.5 to 1; the join is refused, asking for a cast."""
    c = Circuit.from_sql("""CREATE TABLE a (k INT); CREATE TABLE x (k DOUBLE);
        CREATE TABLE d (k BIGINT, v STRING);
        CREATE VIEW v AS SELECT u.k, d.v FROM (SELECT k FROM a UNION ALL SELECT k FROM x) u
        JOIN d ON u.k = d.k;""")
    with pytest.raises(CircuitError, match="is double on the left and bigint on the right"):
        Pipeline(c, str(tmp_path), spark)


def test_a_failed_view_leaves_no_known_columns_behind():
    """A SQL view that fails removes the nodes it added; the types of the nodes declared in
    their place are their own."""
    c = Circuit.from_sql("CREATE TABLE a (k INT, x INT); CREATE TABLE b (k BIGINT, y STRING);")
    with pytest.raises(CircuitError):
        c.view("bad", "SELECT nosuch FROM a JOIN b ON a.k = b.k")
    c.input("pad", "z INT")
    w = c.input("w", "k DOUBLE")
    assert known_columns(c)[w.node_id] == [("k", "double")]
    assert [n.op for n in c.nodes] == ["input"] * 4
