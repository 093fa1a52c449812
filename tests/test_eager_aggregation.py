"""Eager aggregation (``dbsp_pipeline/eager_aggregation.py``): which aggregates are planned as
partial aggregates joined and merged, and that the planned views equal the views as declared,
bit for bit, on the driver, on Spark and per owner, under deletes, NULLs, NaN and infinities,
and customers moving between regions."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.eager_aggregation import MERGES_PARTIALS, planned
from dbsp_pipeline.examples.shop import shop_circuit
from tests.conftest import sql_sum

ORDERS = "order_id BIGINT, customer_id BIGINT, amount DOUBLE, qty INT"
CUSTOMERS = "customer_id BIGINT, region STRING"
AGGS = dict(n="count(*)", na="count(amount)", s="sum(amount)", a="avg(amount)",
            q="sum(qty)", aq="avg(qty)", lo="min(amount)", hi="max(amount)")


def _circuit(eager: bool = True) -> Circuit:
    c = Circuit("eager", eager_aggregation=eager)
    o = c.input("orders", ORDERS)
    cu = c.input("customers", CUSTOMERS)
    c.output("by_region", o.join(cu, on="customer_id").group_by("region").agg(**AGGS))
    # the group column on the side the aggregates read: planned the other way round
    c.output("by_customer", cu.join(o.select("customer_id", "amount"), on="customer_id")
             .group_by("region", "customer_id").agg(s="sum(amount)", hi="max(amount)"))
    return c


def _ops(node: Any) -> str:
    return node.op + ("*" if node.params.get(MERGES_PARTIALS) else "")


# -- the plan ----------------------------------------------------------------------------------
def test_an_aggregate_over_a_join_is_planned_as_partials_joined_and_merged():
    c = shop_circuit()
    p = planned(c)
    assert [_ops(n) for n in p.nodes[:6]] == [
        "input", "input", "filter", "aggregate", "join", "aggregate*"]
    partial, join, merge = p.nodes[3:6]
    assert partial.inputs == (2,) and partial.params["keys"] == ["customer_id"]
    assert [(a["fn"], a["arg"]) for a in partial.params["aggregates"]] == [
        ("count", None), ("sum_state", "amount"), ("max", "amount")]
    assert join.inputs == (3, 1) and merge.params["keys"] == ["region"]
    assert [(a["name"], a["fn"]) for a in merge.params["aggregates"]] == [
        ("total", "sum_of_states"), ("n", "sum"), ("top", "max")]
    assert p.outputs["revenue_by_region"] == merge.id
    assert set(p.outputs) == set(c.outputs) and p.inputs == c.inputs
    # planning is a fixpoint, and the declared circuit is untouched
    assert planned(p) is p
    assert len(c.nodes) == len(p.nodes) - 1


def test_avg_is_the_merged_sum_over_the_merged_count_and_partials_are_shared():
    p = planned(_circuit())
    (partial,) = [n for n in p.nodes if n.op == "aggregate" and n.params["keys"] == [
        "customer_id"] and n.inputs == (0,)]
    calls = [(a["fn"], a["arg"]) for a in partial.params["aggregates"]]
    assert len(calls) == len(set(calls))  # sum(amount) and avg(amount) share one partial sum
    view = p.nodes[p.outputs["by_region"]]
    assert view.op == "select" and any("/ CAST(" in e for e in view.params["exprs"])


def _join_read_twice(c: Circuit, o: Any, cu: Any) -> None:
    j = o.join(cu, on="customer_id")
    c.output("j", j)
    c.output("v", j.group_by("region").agg(n="count(*)"))


@pytest.mark.parametrize("declare", [
    # the join is read by another view too
    _join_read_twice,
    # group columns from both sides
    lambda c, o, cu: c.output("v", o.join(cu, on="customer_id").group_by("region", "order_id")
                              .agg(s="sum(amount)")),
    # aggregates over both sides
    lambda c, o, cu: c.output("v", o.join(cu, on="customer_id").group_by("customer_id")
                              .agg(s="sum(amount)", r="max(region)")),
    # a sum of decimals (its type would change), of an input's declared DECIMAL column
    lambda c, o, cu: c.output("v", c.input("prices", "customer_id BIGINT, d DECIMAL(10,2)")
                              .join(cu, on="customer_id").group_by("region").agg(s="sum(d)")),
    # a column a select computes: its type is not known without Spark
    lambda c, o, cu: c.output("v", o.select("customer_id", "amount * 2 AS a2")
                              .join(cu, on="customer_id").group_by("region").agg(s="sum(a2)")),
], ids=["join-read-twice", "keys-both-sides", "args-both-sides", "decimal-sum", "computed"])
def test_aggregates_it_cannot_plan_stay_as_declared(declare):
    c = Circuit("kept")
    o = c.input("orders", ORDERS)
    cu = c.input("customers", CUSTOMERS)
    declare(c, o, cu)
    assert planned(c) is c


def test_a_computed_column_can_still_be_an_extreme():
    c = Circuit("computed")
    o = c.input("orders", ORDERS)
    cu = c.input("customers", CUSTOMERS)
    c.output("v", o.select("customer_id", "amount * 2 AS a2").join(cu, on="customer_id")
             .group_by("region").agg(hi="max(a2)", n="count(a2)"))
    assert any(n.params.get(MERGES_PARTIALS) for n in planned(c).nodes)


# -- the views ---------------------------------------------------------------------------------
def _expected(orders: Counter, customers: dict[int, str]) -> dict[str, dict[str, Any]]:
    """``by_region`` from scratch (SQL semantics, exact sums)."""
    groups: dict[str, list[tuple]] = {}
    for (_, cid, amount, qty), m in orders.items():
        if cid is not None and cid in customers:
            groups.setdefault(customers[cid], []).extend([(amount, qty)] * m)
    out = {}
    for region, rows in groups.items():
        amounts = [0.0 if a == 0 else a for a, _ in rows if a is not None]  # (-0.0 is 0.0)
        qtys = [q for _, q in rows if q is not None]
        s = sql_sum(amounts) if amounts else None
        out[region] = dict(
            n=len(rows), na=len(amounts), s=s, a=None if s is None else s / len(amounts),
            q=sum(qtys) if qtys else None,
            aq=sql_sum([float(q) for q in qtys]) / len(qtys) if qtys else None,
            lo=_extreme(min, amounts), hi=_extreme(max, amounts))
    return out


def _extreme(pick: Any, values: list[float]) -> float | None:
    """Spark's min/max: NaN above every number."""
    if not values:
        return None
    nan = [v for v in values if math.isnan(v)]
    numbers = [v for v in values if not math.isnan(v)]
    if pick is max:
        return math.nan if nan else max(numbers)
    return min(numbers) if numbers else math.nan


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b and type(a) is type(b)


def _rows(p: Pipeline, view: str, keys: list[str]) -> dict[tuple, dict[str, Any]]:
    rows = p.view_arrow(view).to_pylist()
    assert all(r.pop("_weight") == 1 for r in rows)
    return {tuple(r[k] for k in keys): r for r in rows}


MODES = pytest.mark.parametrize("mode", ["driver", "spark", "per-owner"])


@MODES
def test_planned_views_equal_the_declared_ones_bit_for_bit(spark, tmp_path, mode):
    """Random steps of new, deleted and changed orders (NULL amounts and customers, NaN, ±inf,
    huge and tiny amounts) and customers moving between regions, joining and leaving: after
    every step both views equal the circuit as declared, float for float, and ``by_region``
    equals its recomputation."""
    rng = random.Random(7)
    orders: Counter = Counter()
    customers: dict[int, str] = {}
    # (the declared plan on the driver: the oracle suite shows it equal on every path)
    with Pipeline(_circuit(), str(tmp_path / "eager"), spark,
                  driver_step_rows=10**9 if mode == "driver" else 0) as eager, \
            Pipeline(_circuit(eager=False), str(tmp_path / "declared"), spark,
                     driver_step_rows=10**9) as declared:
        assert any(n.params.get(MERGES_PARTIALS) for n in eager.circuit.nodes)
        assert not any(n.params.get(MERGES_PARTIALS) for n in declared.circuit.nodes)
        if mode != "driver":
            eager.spark_per_owner = mode == "per-owner"
            if mode == "per-owner":
                eager.rescale(2)
        next_id = 0
        for step in range(2 if mode == "spark" else 5):  # (Spark jobs per operator: slow)
            order_rows, order_weights, customer_rows, customer_weights = [], [], [], []
            for _ in range(40):
                if orders and rng.random() < 0.3:
                    row = rng.choice(sorted(orders, key=str))
                    order_rows.append(row)
                    order_weights.append(-1)
                    orders[row] -= 1
                    orders = +orders
                    continue
                amount = rng.choice([round(rng.uniform(0, 200), 2)] * 6 + [
                    None, math.nan, math.inf, -math.inf, 1e17, 5e-324, -0.0])
                row = (next_id, rng.choice([None, *range(1, 13)]), amount,
                       rng.choice([None, rng.randint(-5, 50)]))
                next_id += 1
                order_rows.append(row)
                order_weights.append(1)
                orders[row] += 1
            for cid in rng.sample(range(1, 13), 4):
                if cid in customers:
                    customer_rows.append((cid, customers.pop(cid)))
                    customer_weights.append(-1)
                if step == 0 or rng.random() < 0.8:
                    customers[cid] = rng.choice(["north", "south", "east"])
                    customer_rows.append((cid, customers[cid]))
                    customer_weights.append(1)
            for p in (eager, declared):
                for name, rows, weights in (("orders", order_rows, order_weights),
                                            ("customers", customer_rows, customer_weights)):
                    for weight in (-1, 1):
                        batch = [r for r, w in zip(rows, weights) if w == weight]
                        if batch:
                            p.push(name, batch, weight=weight)
                assert p.step().on_driver == (p is declared or mode == "driver")
            for view, keys in (("by_region", ["region"]),
                               ("by_customer", ["region", "customer_id"])):
                got, want = _rows(eager, view, keys), _rows(declared, view, keys)
                assert set(got) == set(want), (step, view)
                for k, row in want.items():
                    assert all(_same(got[k][c], v) for c, v in row.items()), (step, k, got[k], row)
            expected = _expected(orders, customers)
            got = _rows(eager, "by_region", ["region"])
            assert set(got) == {(r,) for r in expected}, step
            for region, row in expected.items():
                for c, v in row.items():
                    assert _same(got[(region,)][c], v), (step, region, c, got[(region,)][c], v)


def test_a_root_keeps_the_plan_it_was_created_with_until_an_upgrade(spark, tmp_path):
    """A root whose state was recorded by the circuit as declared (an engine before eager
    aggregation, or the setting off) is opened with that plan whatever the circuit's setting
    now, and the other way round: its state is that plan's. An upgrade takes the plan the
    circuit asks for, and the views stay what they were."""
    root, other = str(tmp_path / "root"), str(tmp_path / "other")
    declared, eager = _circuit(eager=False).fingerprint(), planned(_circuit()).fingerprint()
    assert declared != eager
    for path, circuit in ((root, _circuit(eager=False)), (other, _circuit())):
        with Pipeline(circuit, path, spark) as p:
            p.push("customers", [(1, "north")])
            p.push("orders", [(1, 1, 2.5, 3), (2, 1, 4.0, None)])
            p.step()
    with Pipeline(_circuit(), root, spark) as p:
        assert p.circuit.fingerprint() == declared
        p.push("customers", [(1, "north")], weight=-1)
        p.push("customers", [(1, "south")])
        p.step()
        assert _rows(p, "by_region", ["region"])[("south",)]["s"] == 6.5
    with Pipeline(_circuit(eager=False), other, spark) as p:
        assert p.circuit.fingerprint() == eager
    with Pipeline(_circuit(), root, spark, upgrade=True) as p:
        assert p.circuit.fingerprint() == eager
        before = _rows(p, "by_region", ["region"])
        p.push("orders", [(3, 1, 1.25, 7)])
        p.step()
        after = _rows(p, "by_region", ["region"])
        assert before[("south",)]["n"] == 2 and after[("south",)]["n"] == 3
        assert after[("south",)]["s"] == 7.75 and after[("south",)]["q"] == 10
    with Pipeline(_circuit(), root, spark) as p:
        assert p.circuit.fingerprint() == eager
