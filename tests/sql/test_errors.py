"""What the SQL compiler refuses: each error names the view, the line and column of the SQL,
what is not supported, and a hint. No Spark needed (compiling is pure declaration)."""

from __future__ import annotations

import pytest

from dbsp_pipeline import Circuit, CircuitError
from dbsp_pipeline.sql import SqlError

TABLES = """CREATE TABLE orders (order_id BIGINT NOT NULL, customer_id BIGINT, amount DOUBLE);
CREATE TABLE customers (id BIGINT NOT NULL, region STRING);
"""


def refused(query: str) -> SqlError:
    with pytest.raises(SqlError) as info:
        Circuit.from_sql(TABLES + f"CREATE VIEW v AS\n{query}")
    assert isinstance(info.value, CircuitError)
    assert info.value.view == "v"
    return info.value


@pytest.mark.parametrize("query, line, column, problem, hint", [
    ("SELECT customer_id, count(DISTINCT amount, order_id) AS n\nFROM orders GROUP BY "
     "customer_id", 4, 21, "count(DISTINCT ...) of 2 expressions is not supported",
     "DISTINCT a, b"),
    ("SELECT o.order_id FROM orders o, customers c\nRIGHT JOIN orders p ON p.order_id = c.id",
     5, 12, "RIGHT JOIN after a comma join is not supported", "JOIN ... ON"),
    ("SELECT order_id FROM orders\nORDER BY amount DESC LIMIT 3", 5, 10,
     "ORDER BY of a top-k orders by the view's columns only", "SELECT list"),
    ("SELECT order_id FROM orders\nLIMIT 3", 5, 7, "LIMIT without ORDER BY", "ORDER BY"),
    ("SELECT order_id FROM orders\nORDER BY order_id", 5, 10, "ORDER BY is not supported",
     "top-k"),
    ("SELECT order_id, ntile(2) OVER (PARTITION BY customer_id ORDER BY amount) AS r "
     "FROM orders", 4, 18, "only ROW_NUMBER(), RANK() and DENSE_RANK() OVER", "top-k"),
    ("SELECT order_id, sum(amount) OVER (PARTITION BY customer_id ORDER BY amount) AS r "
     "FROM orders", 4, 18, "only ROW_NUMBER(), RANK() and DENSE_RANK() OVER", "top-k"),
    ("SELECT order_id FROM orders QUALIFY rank() OVER (ORDER BY amount) = 1\n"
     "AND row_number() OVER (ORDER BY order_id) = 1", 5, 5,
     "one window function per QUALIFY is supported", "name it in QUALIFY"),
    ("SELECT order_id FROM orders QUALIFY rn <= 2", 4, 37, "unknown column 'rn'", "have"),
    ("SELECT order_id FROM orders WHERE customer_id IN (SELECT id FROM customers\n"
     "QUALIFY row_number() OVER (ORDER BY id) <= 1)", 5, 9,
     "QUALIFY in an IN, EXISTS or scalar subquery is not supported", "in FROM or a CTE"),
    ("SELECT o.order_id AS id, c.region FROM orders o JOIN customers c\n"
     "ON o.customer_id = c.id ORDER BY c.id LIMIT 1", 5, 34,
     "ORDER BY c.id of a top-k names no column", "select that column"),
    ("SELECT order_id, rank() OVER (PARTITION BY customer_id) AS r FROM orders", 4, 18,
     "RANK() needs ORDER BY in its OVER clause", "arbitrary"),
    ("SELECT DISTINCT customer_id, row_number() OVER (ORDER BY amount) AS r FROM orders",
     4, 30, "ROW_NUMBER() in a SELECT with GROUP BY, aggregates or DISTINCT",
     "subquery or CTE"),
    ("SELECT customer_id, rank() OVER (ORDER BY amount) AS r FROM orders\n"
     "GROUP BY customer_id", 4, 43, "'amount' is neither grouped nor aggregated",
     "GROUP BY"),
    ("SELECT order_id, row_number() OVER (ORDER BY amount) AS _r FROM orders", 4, 18,
     "the ROW_NUMBER() column '_r' starts with '_'", "belong to the engine"),
    ("SELECT order_id, row_number() OVER (PARTITION BY customer_id) AS r FROM orders", 4, 18,
     "ROW_NUMBER() needs ORDER BY", "arbitrary"),
    ("SELECT order_id FROM orders\nWHERE customer_id NOT IN (SELECT id FROM customers)", 5, 7,
     "NOT IN (subquery) over columns that may be NULL", "NOT EXISTS"),
    ("SELECT id FROM customers c WHERE EXISTS (SELECT 1 FROM orders o\n"
     "WHERE o.customer_id < c.id)", 5, 7, "correlated condition other than an equality",
     "correlated equality"),
    ("SELECT o.order_id FROM orders o LEFT JOIN customers c\n"
     "ON o.amount > c.id", 5, 4, "a LEFT JOIN needs at least one equality", "cross join"),
    ("SELECT o.order_id, c.region FROM orders o\nLEFT SEMI JOIN customers c "
     "ON o.customer_id = c.id", 4, 20, "unknown column 'c.region'", "o.order_id"),
    ("SELECT o.order_id, c.region FROM orders o, customers c", 4, 44,
     "cross join is not supported", "a.k = b.k"),
    ("SELECT order_id, amount * 2 FROM orders", 4, 18, "a computed column needs a name",
     "AS name"),
    ("SELECT order_id, nope FROM orders", 4, 18, "unknown column 'nope'", "order_id"),
    ("SELECT order_id FROM nowhere", 4, 22, "unknown table or view 'nowhere'", "orders"),
    ("SELECT customer_id, amount, count(*) AS n FROM orders GROUP BY customer_id", 4, 21,
     "neither grouped nor aggregated", "GROUP BY"),
    ("SELECT id FROM customers, orders WHERE id = customer_id AND order_id = "
     "(SELECT id FROM customers)", 4, 80,
     "a scalar subquery's value must be an aggregate", "no row or many"),
    ("SELECT id FROM customers c WHERE id < (SELECT count(*) FROM orders o\n"
     "WHERE o.customer_id = c.id)", 4, 47,
     "this correlated scalar subquery's value is not supported", "count"),
    ("SELECT customer_id, sum(amount) AS s FROM orders o GROUP BY customer_id\n"
     "HAVING sum(amount) > (SELECT avg(amount) FROM orders p WHERE p.customer_id = "
     "o.customer_id)", 5, 78, "a correlated subquery in HAVING is not supported", "WHERE"),
    ("SELECT customer_id, sum(amount) AS s FROM orders GROUP BY customer_id\n"
     "HAVING customer_id IN (SELECT id FROM customers)", 5, 8,
     "this subquery in HAVING is not supported", "scalar subquery"),
    ("SELECT id FROM customers c WHERE id IN (SELECT customer_id FROM orders)\n"
     "OR region = 'x'", 4, 34, "this subquery is not supported", "IN (SELECT"),
    ("SELECT o.order_id FROM orders o JOIN customers c USING (id)", 4, 57,
     "USING column 'id' is in no table on the left of the join", "ON a.k = b.k"),
    ("SELECT id FROM customers c JOIN customers d ON c.id = d.id\nJOIN orders USING (id)",
     5, 20, "USING column 'id' is in several tables on the left of the join", "ON a.k = b.k"),
    ("SELECT region FROM customers JOIN orders USING (region)", 4, 49,
     "USING column 'region' is not a column of 'orders'", "ON a.k = b.k"),
    ("SELECT * FROM (SELECT region, id FROM customers)\nPIVOT (count(id) FOR region IN "
     "('north', 'south'))", 5, 8, "PIVOT is not supported", "conditional aggregate"),
    ("SELECT * FROM customers UNPIVOT (v FOR k IN (id))", 4, 34, "UNPIVOT is not supported",
     "UNION ALL"),
    ("SELECT id, t FROM customers LATERAL VIEW explode(array(1, 2)) x AS t", 4, 42,
     "LATERAL VIEW and LATERAL subqueries are not supported", "one input row per element"),
    # (not "neither grouped nor aggregated", nor a view that compiles and fails at open)
    ("SELECT region, count(*) AS n FROM customers GROUP BY ROLLUP(region)", 4, 61,
     "ROLLUP, CUBE and GROUPING SETS are not supported", "one view per grouping"),
    ("SELECT count(*) AS n FROM customers GROUP BY CUBE(region, id)", 4, 51,
     "ROLLUP, CUBE and GROUPING SETS are not supported", "one view per grouping"),
    ("SELECT count(*) AS n FROM customers\nGROUP BY GROUPING SETS ((region), (id))", 5, 26,
     "ROLLUP, CUBE and GROUPING SETS are not supported", "one view per grouping"),
])
def test_unsupported_sql_is_refused_with_view_position_problem_and_hint(
        query, line, column, problem, hint):
    error = refused(query)
    assert problem in str(error) and hint in error.hint, str(error)
    assert (error.line, error.column) == (line, column), str(error)
    assert f"view 'v' at line {line}, column {column}: " in str(error)


def test_ambiguous_column_names_the_tables():
    error = refused("SELECT order_id FROM orders o JOIN orders p ON o.customer_id = p.order_id")
    assert "column 'order_id' is ambiguous" in str(error) and "['o', 'p']" in str(error)


def test_not_in_compiles_when_both_sides_are_declared_not_null():
    c = Circuit.from_sql(TABLES + "CREATE VIEW v AS SELECT order_id FROM orders "
                         "WHERE order_id NOT IN (SELECT id FROM customers)")
    assert "v" in c.outputs


def test_a_statement_that_is_not_create_is_refused():
    with pytest.raises(SqlError, match="INSERT statement is not supported"):
        Circuit.from_sql(TABLES + "INSERT INTO orders VALUES (1, 2, 3.0)")


def test_sql_that_does_not_parse_names_the_line_and_column():
    with pytest.raises(SqlError, match=r"view 'v'.*does not parse at line 1, column \d+"):
        Circuit("c").view("v", "SELECT FROM WHERE )")


def test_using_keeps_the_users_sql_and_the_keys_spelling():
    circuit = Circuit.from_sql(
        "CREATE TABLE t1 (Id BIGINT, x STRING);\nCREATE TABLE t2 (ID BIGINT, y STRING);\n"
        "CREATE VIEW v AS SELECT * FROM t1 JOIN t2 USING (id) ORDER BY t1.Id LIMIT 2;")
    assert circuit.sql_views["v"] == ("Id", "x", "y")  # Spark: the left side's spelling
    assert "USING" in circuit.sql_texts["v"]  # what the console shows is what was written


def test_a_script_that_does_not_parse_names_the_view_and_the_incomplete_clause():
    with pytest.raises(SqlError, match=r"view 'v': the SQL does not parse at line 4, column \d+"
                                       r": WHERE is incomplete \(something is missing after "
                                       r"it\), near 'WHERE'"):
        Circuit.from_sql(TABLES + "CREATE VIEW v AS\nSELECT order_id FROM orders WHERE;")
    with pytest.raises(SqlError, match=r": > is incomplete"):
        Circuit.from_sql(TABLES + "CREATE VIEW v AS SELECT order_id FROM orders WHERE id >;")


def test_a_misspelled_keyword_names_the_view_and_sqlglot_warns_nothing(caplog):
    with pytest.raises(SqlError, match=r"view 'v': the SQL does not parse as a statement \(a "
                                       r"misspelled keyword\?\)"):
        Circuit.from_sql(TABLES + "CREATE VIEW v AS SELEC order_id FROM orders;")
    assert not [r for r in caplog.records if "Falling back" in r.getMessage()]


def test_an_unsupported_aggregate_is_named_as_written():
    error = refused("SELECT customer_id, percentile_approx(amount, 0.5) AS p FROM orders\n"
                    "GROUP BY customer_id")
    assert "aggregate percentile_approx() is not supported" in str(error), str(error)
    error = refused("SELECT customer_id, collect_list(amount) AS p FROM orders GROUP BY 1")
    assert "aggregate collect_list() is not supported" in str(error), str(error)


@pytest.mark.parametrize("query", [
    # the subquery's column is NOT NULL in its table but padded with NULLs by an outer join
    "SELECT id FROM customers WHERE id NOT IN (SELECT o.order_id FROM customers c2 "
    "LEFT JOIN orders o ON c2.id = o.order_id)",
    "SELECT id FROM customers WHERE id NOT IN (SELECT o.order_id FROM orders o "
    "RIGHT JOIN customers c2 ON c2.id = o.order_id)",
    "WITH s AS (SELECT o.order_id AS z FROM customers c2 FULL JOIN orders o "
    "ON c2.id = o.order_id) SELECT id FROM customers WHERE id NOT IN (SELECT z FROM s)",
    # the outer query's column, padded the same way
    "SELECT o.order_id, c.id FROM orders o LEFT JOIN customers c ON o.customer_id = c.id "
    "WHERE c.id NOT IN (SELECT order_id FROM orders)",
])
def test_not_in_over_a_column_an_outer_join_pads_is_refused(query):
    """``x NOT IN (subquery)`` is no rows as soon as either side holds a NULL, which an anti
    join does not give: it compiles only where neither side can be NULL, and an outer join's
    padding makes a NOT NULL column nullable."""
    error = refused(query)
    assert "NOT IN" in str(error) and "NOT EXISTS" in str(error), str(error)


def test_an_aggregate_filter_clause_is_refused_as_such():
    error = refused("SELECT customer_id, count(*) FILTER (WHERE amount > 0) AS n FROM orders\n"
                    "GROUP BY customer_id")
    assert "an aggregate's FILTER (WHERE ...) is not supported" in str(error), str(error)
    assert "count(CASE WHEN" in error.hint
