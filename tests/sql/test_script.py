"""SQL scripts and views declared on circuits: ``Circuit.from_sql`` and ``circuit.view``."""

from __future__ import annotations

from collections import Counter

import pytest

from dbsp_pipeline import Circuit, CircuitError, Pipeline
from dbsp_pipeline.sql import SqlError
from tests.sql.oracle import view_rows


def test_from_sql_declares_tables_as_inputs_and_views_as_outputs():
    c = Circuit.from_sql("""
        CREATE TABLE orders (order_id BIGINT NOT NULL, amount DECIMAL(10, 2), day DATE);
        CREATE MATERIALIZED VIEW big AS SELECT order_id, amount FROM orders WHERE amount > 10;
        CREATE VIEW big_ids AS SELECT order_id FROM big;
    """, name="shop")
    assert c.name == "shop"
    assert c.input_schemas == {
        "orders": "`order_id` BIGINT NOT NULL, `amount` DECIMAL(10, 2), `day` DATE"}
    assert list(c.outputs) == ["big", "big_ids"]
    assert c.sql_views == {"big": ("order_id", "amount"), "big_ids": ("order_id",)}
    assert c.inputs_of("big_ids") == ["orders"]


def test_view_on_a_circuit_built_in_python_runs_on_the_driver(spark, tmp_path):
    c = Circuit("py")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("all_orders", orders)
    c.view("per_customer", "SELECT customer_id, sum(amount) AS total, count(*) AS n "
           "FROM orders GROUP BY customer_id")
    rich = c.view("rich", "SELECT customer_id FROM per_customer WHERE total > 10")
    assert rich.node_id == c.outputs["rich"]
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        p.push("orders", [(1, 7, 8.0), (2, 7, 4.5), (3, 8, 1.0), (4, None, 20.0)])
        assert p.step().on_driver
        assert view_rows(p.view_arrow("per_customer")) == Counter(
            {(7, 12.5, 2): 1, (8, 1.0, 1): 1, (None, 20.0, 1): 1})
        assert view_rows(p.view_arrow("rich")) == Counter({(7,): 1, (None,): 1})
        p.push("orders", [(2, 7, 4.5)], weight=-1)
        p.step()
        assert view_rows(p.view_arrow("rich")) == Counter({(None,): 1})


def test_a_failing_view_declares_nothing_and_a_name_is_declared_once():
    c = Circuit.from_sql("CREATE TABLE t (a BIGINT)")
    nodes = len(c.nodes)
    with pytest.raises(SqlError, match="view 'v'"):
        c.view("v", "SELECT a, count(*) AS n FROM t GROUP BY a ORDER BY a")
    assert "v" not in c.outputs and "v" not in c.sql_views and len(c.nodes) == nodes
    c.view("v", "SELECT a FROM t")
    assert len(c.nodes) > nodes
    with pytest.raises(CircuitError, match="output 'v' is declared twice"):
        c.view("v", "SELECT a FROM t")
    with pytest.raises(CircuitError, match="input 't' is declared twice"):
        Circuit.from_sql("CREATE TABLE t (a BIGINT); CREATE TABLE t (b BIGINT)")


def test_char_and_varchar_columns_are_strings(spark, tmp_path):
    """A database's DDL has CHAR(n) and VARCHAR(n): both open as STRING columns (Spark's plans
    refuse them in DataFrames), in SQL and in the Python API alike; lengths are not checked."""
    c = Circuit.from_sql("""
        CREATE TABLE t (id BIGINT, name VARCHAR(4), code CHAR(2));
        CREATE VIEW v AS SELECT id, upper(name) AS u FROM t WHERE code = 'ab';
    """, name="chars")
    c.output("raw", c.input("more", "id BIGINT, tags ARRAY<VARCHAR(3)>"))
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        assert [f.dataType.simpleString() for f in p.input_schema("t").fields] == [
            "bigint", "string", "string"]
        assert p.input_schema("more")["tags"].dataType.simpleString() == "array<string>"
        p.push("t", [(1, "anna", "ab"), (2, "bob", "cd"), (3, "a longer name", "ab")])
        p.push("more", [(1, ["x", "yz"])])
        p.step()
        assert view_rows(p.view_arrow("v")) == Counter({(1, "ANNA"): 1, (3, "A LONGER NAME"): 1})


@pytest.mark.parametrize("ddl", ["id BIGINT NOT NULL PRIMARY KEY, v INT", "id BIGINT UNIQUE",
                                 "id BIGINT, v INT, PRIMARY KEY (id)",
                                 "id BIGINT, CONSTRAINT pk PRIMARY KEY (id)"])
def test_a_key_constraint_is_refused_not_ignored(ddl):
    """A key a user declares would not be enforced (a push of a key present adds a second
    row): refused, saying so, rather than kept silently as if it were."""
    with pytest.raises(SqlError, match="PRIMARY KEY and UNIQUE are not enforced: .* adds a "
                                       "second row"):
        Circuit.from_sql(f"CREATE TABLE t ({ddl}); CREATE VIEW v AS SELECT id FROM t")


@pytest.mark.parametrize("ddl", ["id BIGINT CHECK (id > 0)", "id BIGINT DEFAULT 5"])
def test_a_check_or_default_is_refused_not_ignored(ddl):
    with pytest.raises(SqlError, match="CHECK and DEFAULT are not supported"):
        Circuit.from_sql(f"CREATE TABLE t ({ddl}); CREATE VIEW v AS SELECT id FROM t")


def test_group_by_with_rollup_is_refused():
    with pytest.raises(SqlError, match="ROLLUP, CUBE and GROUPING SETS are not supported"):
        Circuit.from_sql("CREATE TABLE t (a INT); CREATE VIEW v AS SELECT a, count(*) AS n "
                         "FROM t GROUP BY a WITH ROLLUP")
