"""The join on the driver: looked-up rows full of retractions (a dimension whose rows keep
changing) are consolidated before the join, mostly-insert rows are joined as they are, and the
view equals the join from scratch either way."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pyarrow as pa

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.operators import join
from dbsp_pipeline.operators.base import StepContext


def _rows(weights: list[int]) -> pa.Table:
    return pa.table({"c": pa.array([1] * len(weights), pa.int64()),
                     "region": pa.array(["a", "a", "b", "b", "c"][:len(weights)]),
                     "_weight": pa.array(weights, pa.int64()),
                     "_shard": pa.array([0] * len(weights), pa.int32())})


def test_rows_full_of_retractions_are_consolidated_before_the_join():
    sql = LocalSQL()
    ctx = StepContext(None, 1, sql=sql)
    trace = SimpleNamespace(payload=["c", "region"])
    history = _rows([1, -1, 1, -1, 1])  # a customer that moved a -> b -> c
    settled = join._settled(ctx, trace, history)  # type: ignore[arg-type]
    assert settled.select(["c", "region", "_weight"]).to_pylist() == [
        {"c": 1, "region": "c", "_weight": 1}]
    inserts = _rows([1, 1, 1, 1, -1])  # one retraction in five: joined as it is
    assert join._settled(ctx, trace, inserts) is inserts  # type: ignore[arg-type]


def test_a_churning_dimension_joins_to_the_view_from_scratch(spark, tmp_path):
    c = Circuit("churn")
    orders = c.input("orders", "o BIGINT, c BIGINT")
    customers = c.input("customers", "c BIGINT, region STRING")
    c.output("v", orders.join(customers, on="c").group_by("region").agg(n="count(*)"))
    regions = ["a", "b", "c"]
    place = {k: 0 for k in range(20)}
    live_orders: list[tuple[int, int]] = []
    with Pipeline(c, str(tmp_path / "p"), spark) as p:
        p.push("customers", [(k, regions[0]) for k in place])
        p.step()
        for step in range(6):  # every customer moves each step: a history of 2 rows a step
            p.push("customers", [(k, regions[place[k]]) for k in place], weight=-1)
            for k in place:
                place[k] = (place[k] + 1) % len(regions)
            p.push("customers", [(k, regions[place[k]]) for k in place])
            new = [(100 * step + i, i % 20) for i in range(40)]
            p.push("orders", new)
            live_orders += new
            p.step()
            expected = Counter(regions[place[k]] for _, k in live_orders)
            got = {r["region"]: r["n"] for r in p.view_arrow("v").to_pylist()}
            assert got == dict(expected), step
