"""Declaring circuits: names and aggregate syntax are checked as they are declared (no Spark)."""

import pytest

from dbsp_pipeline import Circuit, CircuitError


def test_declaration_builds_a_dag_with_composites_expanded():
    c = Circuit("shop")
    o = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    cu = c.input("customers", "customer_id BIGINT, region STRING")
    c.output("lj", o.left_join(cu, on="customer_id"))
    ops = [n.op for n in c.nodes]
    assert ops.count("join") == 2 and "conform" in ops and "negate" in ops and "distinct" in ops
    assert all(i < n.id for n in c.nodes for i in n.inputs)


@pytest.mark.parametrize("declare, message", [
    (lambda c: c.input("_hidden", "a INT"), "reserved"),
    (lambda c: c.output("_out", c.input("x", "a INT")), "reserved"),
    (lambda c: c.input("bad name", "a INT"), "letters"),
    (lambda c: c.input("ok\n", "a INT"), "letters"),  # `$` would match before the newline
    (lambda c: c.output("ok\n", c.input("x", "a INT")), "letters"),
    (lambda c: c.input("x", "a INT").group_by("a").agg(**{"n\n": "count(*)"}), "letters"),
    (lambda c: c.input("x", "a INT").group_by("a").agg(s="sum(`a`b`)"), "is not one of"),
    (lambda c: (c.input("x", "a INT"), c.input("x", "a INT")), "declared twice"),
    (lambda c: c.input("x", "a INT").group_by("a").agg(m="median(a)"), "median"),
    (lambda c: c.input("x", "a INT").group_by("a").agg(s="sum(*)"), "only count"),
    (lambda c: c.input("x", "a INT").group_by().agg(n="count(*)"), "at least one key"),
    (lambda c: c.input("x", "a INT").group_by("a").agg(a="count(*)"), "group_by key"),
    (lambda c: c.input("x", "a INT").join(c.input("y", "a INT"), on=[]), "key columns"),
    (lambda c: c.input("x", "a INT").select(), "expression"),
])
def test_bad_declarations_are_rejected_with_a_clear_error(declare, message):
    with pytest.raises(CircuitError, match=message):
        declare(Circuit("c"))


def test_circuit_names_end_at_the_end_of_the_text():
    with pytest.raises(CircuitError, match="letters"):
        Circuit("c\n")


def test_aggregate_columns_are_backticked_as_in_spark_sql():
    c = Circuit("c")
    x = c.input("x", "k INT, `a``b c` INT")
    g = x.group_by("k").agg(s="sum(`a``b c`)", n=" count( v_1 ) ")
    assert c.node(g.node_id).params["aggregates"] == [
        {"name": "s", "fn": "sum", "arg": "a`b c"}, {"name": "n", "fn": "count", "arg": "v_1"}]


def test_collections_of_another_circuit_are_rejected():
    a, b = Circuit("a"), Circuit("b")
    x, y = a.input("x", "k INT"), b.input("y", "k INT")
    with pytest.raises(CircuitError, match="belongs to circuit 'b'"):
        x.join(y, on="k")


def test_fingerprint_changes_with_the_computation():
    def build(pred):
        c = Circuit("c")
        c.output("o", c.input("x", "k INT").filter(pred))
        return c.fingerprint()
    assert build("k > 1") == build("k > 1")
    assert build("k > 1") != build("k > 2")
